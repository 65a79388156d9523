/*
 * fork_close.c — a child of fork(2) and what it inherited. The parent opens the device,
 * connects two RC QPs and moves an RDMA WRITE (the device's engine running), then forks.
 * The child tries to destroy an inherited QP: refused with EINVAL (on ferroce the parent's
 * device is not the child's to drive: its engine would read the parent's datagrams off the
 * shared socket and answer for the parent's QPs; on rdma-core the call would destroy the
 * parent's QP in the kernel). It closes the inherited context, as a program that forks
 * workers tidies up what it does not use, opens the device anew and moves a WRITE of its own,
 * prints "child closed what it inherited" and exits. A child has none of its parent's
 * threads: a library that stopped the parent's engine there (waiting for its threads) hung
 * the child. The parent waits for the child (10 s at most), then moves a second RDMA WRITE on
 * its QPs and prints "parent's device still works".
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./fork_close
 * Prints "ok" and exits 0 when every check passes.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG "fork_close"
#include "rc_connect.h"

#define N 4096

static void write_and_check(struct rc_pair p, struct ibv_mr *smr, struct ibv_mr *dmr, char seed)
{
	char *src = smr->addr, *dst = dmr->addr;
	for (int i = 0; i < N; i++)
		src[i] = (char)(i * 7 + seed);
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = N, .lkey = smr->lkey };
	struct ibv_send_wr wr = { .wr_id = (uint64_t)seed, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = dmr->rkey;
	if (ibv_post_send(p.a, &wr, &bad))
		fail("ibv_post_send", errno);
	struct ibv_wc wc = poll_one_or_exit(p.cq, PROG);
	check(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)seed, "the WRITE completed");
	check(memcmp(src, dst, N) == 0, "the WRITE's data arrived");
}

/* A device opened now, with a PD, a source and a destination region (remote write) and a
 * connected pair of QPs: what the parent has before the fork and the child makes anew. */
struct world {
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *smr, *dmr;
	struct rc_pair p;
};

static struct world open_world(void)
{
	struct world w;
	union ibv_gid gid;
	w.ctx = open_device_and_pd(&w.list, &gid, &w.pd, PROG);
	char *src = calloc(1, N), *dst = calloc(1, N);
	w.smr = ibv_reg_mr(w.pd, src, N, IBV_ACCESS_LOCAL_WRITE);
	w.dmr = ibv_reg_mr(w.pd, dst, N, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!w.smr || !w.dmr)
		fail("ibv_reg_mr", errno);
	w.p = rc_pair_new(w.ctx, w.pd, &gid, IBV_ACCESS_REMOTE_WRITE, PROG);
	return w;
}

static void close_world(struct world w)
{
	rc_pair_free(w.p);
	ibv_dereg_mr(w.smr);
	ibv_dereg_mr(w.dmr);
	ibv_dealloc_pd(w.pd);
	ibv_close_device(w.ctx);
	ibv_free_device_list(w.list);
}

int main(void)
{
	struct world w = open_world();
	write_and_check(w.p, w.smr, w.dmr, 1);
	printf("parent: RDMA WRITE before the fork\n");
	fflush(stdout);

	pid_t child = fork();
	if (child < 0)
		fail("fork", errno);
	if (child == 0) {
		alarm(10);
		int d = ibv_destroy_qp(w.p.a);
		printf("child: ibv_destroy_qp on the parent's QP: %s\n", d ? strerror(d) : "done");
		int r = ibv_close_device(w.ctx);
		ibv_free_device_list(w.list);
		printf("child closed what it inherited (ibv_close_device %d)\n", r);
		/* A device of its own works. */
		struct world mine = open_world();
		write_and_check(mine.p, mine.smr, mine.dmr, 3);
		printf("child: RDMA WRITE on a device of its own\n");
		close_world(mine);
		fflush(stdout);
		exit(d == EINVAL && r == 0 ? 0 : 1);
	}
	int status = 0;
	for (int i = 0; i < 1000; i++) {
		pid_t x = waitpid(child, &status, WNOHANG);
		if (x == child)
			break;
		if (i == 999) {
			kill(child, SIGKILL);
			waitpid(child, &status, 0);
			fail("the child did not end within 10 s", ETIMEDOUT);
		}
		usleep(10000);
	}
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child exited with status 0");

	write_and_check(w.p, w.smr, w.dmr, 2);
	printf("parent's device still works after the child closed its copy\n");
	close_world(w);
	printf("ok\n");
	return 0;
}
