/*
 * cq_teardown.c — a completion thread waits in ibv_get_cq_event while the main thread destroys
 * the CQ and then the completion channel, reuses the heap and returns, the thread still
 * waiting. With the kernel's channel that thread sleeps in read(2) on a file that stays open
 * under it; ferroce's library must likewise keep what the waiting thread reads alive, and
 * never hand out a CQ destroyed after the thread looked at the channel's list.
 *
 * First, as libibverbs defines it, ibv_destroy_cq returns only once every completion event
 * handed out for the CQ is acknowledged: a completion thread takes an event (a UD QP sends
 * to itself), holds it 300 ms and acknowledges it while the main thread destroys the QP and
 * the CQ.
 *
 *   ferroce run -- ./cq_teardown   prints one line per step and "ok" (exit 0). Meant to run
 *                                  under valgrind too: any read of freed memory shows there.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int waiting, got, acked;

static void die(const char *what, int e)
{
	fprintf(stderr, "cq_teardown: %s: %s\n", what, strerror(e));
	exit(1);
}

/* Takes one event, holds it 300 ms, then acknowledges it. */
static void *one_event(void *arg)
{
	struct ibv_comp_channel *ch = arg;
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx)) {
		fprintf(stderr, "cq_teardown: ibv_get_cq_event: %s\n", strerror(errno));
		exit(1);
	}
	atomic_store(&got, 1);
	usleep(300000);
	if (ctx != (void *)0xca11) {
		fprintf(stderr, "cq_teardown: the event's CQ context is %p\n", ctx);
		exit(1);
	}
	atomic_store(&acked, 1);
	ibv_ack_cq_events(cq, 1);
	return NULL;
}

/* A UD QP sends one message to itself; a thread holds the completion event while the main
 * thread destroys the QP and the CQ. */
static void destroy_cq_waits_for_the_ack(struct ibv_context *c)
{
	struct ibv_pd *pd = ibv_alloc_pd(c);
	static char buf[4096];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
	struct ibv_cq *cq = ch ? ibv_create_cq(c, 8, (void *)0xca11, ch, 0) : NULL;
	if (!mr || !cq)
		die("pd / mr / channel / cq", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp", errno);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qkey = 0x11111111 };
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	a.qp_state = IBV_QPS_RTR;
	r = r ? r : ibv_modify_qp(qp, &a, IBV_QP_STATE);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	r = r ? r : ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	if (r)
		die("ibv_modify_qp", r);
	union ibv_gid gid;
	if (ibv_query_gid(c, 1, 0, &gid))
		die("ibv_query_gid", errno);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = gid, .sgid_index = 0, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		die("ibv_create_ah", errno);
	struct ibv_sge rs = { .addr = (uintptr_t)buf, .length = 2048, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *badr;
	struct ibv_sge ss = { .addr = (uintptr_t)buf + 2048, .length = 16, .lkey = mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.ud = { .ah = ah, .remote_qpn = qp->qp_num,
					     .remote_qkey = 0x11111111 } }, *bads;
	if ((r = ibv_req_notify_cq(cq, 0)) || (r = ibv_post_recv(qp, &rw, &badr)) ||
	    (r = ibv_post_send(qp, &sw, &bads)))
		die("notify / post", r);
	pthread_t t;
	if (pthread_create(&t, NULL, one_event, ch))
		die("pthread_create", errno);
	while (!atomic_load(&got))
		usleep(1000);
	struct ibv_wc wc[4];
	while (ibv_poll_cq(cq, 4, wc) > 0)
		;
	if ((r = ibv_destroy_qp(qp)) || (r = ibv_destroy_cq(cq)))
		die("ibv_destroy_qp / ibv_destroy_cq", r);
	if (!atomic_load(&acked)) {
		fprintf(stderr, "cq_teardown: ibv_destroy_cq returned before the event was "
				"acknowledged\n");
		exit(1);
	}
	printf("ibv_destroy_cq waited for the acknowledgement\n");
	pthread_join(t, NULL);
	if ((r = ibv_destroy_comp_channel(ch)) || (r = ibv_destroy_ah(ah)) ||
	    (r = ibv_dereg_mr(mr)) || (r = ibv_dealloc_pd(pd)))
		die("teardown", r);
}

static void *completions(void *arg)
{
	struct ibv_comp_channel *ch = arg;
	struct ibv_cq *cq;
	void *ctx;
	atomic_store(&waiting, 1);
	/* Nothing completes: this waits until the process exits. */
	if (ibv_get_cq_event(ch, &cq, &ctx) == 0) {
		fprintf(stderr, "cq_teardown: an event of CQ %p (destroyed)\n", (void *)cq);
		exit(1);
	}
	fprintf(stderr, "cq_teardown: ibv_get_cq_event returned: %s\n", strerror(errno));
	exit(1);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die("ibv_get_device_list", ENODEV);
	struct ibv_context *c = ibv_open_device(list[0]);
	if (!c)
		die("ibv_open_device", errno);
	destroy_cq_waits_for_the_ack(c);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
	if (!ch)
		die("ibv_create_comp_channel", errno);
	struct ibv_cq *cq = ibv_create_cq(c, 8, (void *)0x5eed, ch, 0);
	if (!cq)
		die("ibv_create_cq", errno);
	if (ibv_req_notify_cq(cq, 0))
		die("ibv_req_notify_cq", errno);
	pthread_t t;
	if (pthread_create(&t, NULL, completions, ch))
		die("pthread_create", errno);
	while (!atomic_load(&waiting))
		usleep(1000);
	usleep(100000);
	int r = ibv_destroy_comp_channel(ch);
	if (r != EBUSY)
		die("ibv_destroy_comp_channel with a CQ bound (EBUSY expected)", r);
	if ((r = ibv_destroy_cq(cq)))
		die("ibv_destroy_cq", r);
	printf("CQ destroyed while the thread waits\n");
	usleep(50000);
	if ((r = ibv_destroy_comp_channel(ch)))
		die("ibv_destroy_comp_channel", r);
	printf("channel destroyed while the thread waits on it\n");
	fflush(stdout);
	/* Reuse the freed memory: anything still reading it reads garbage. */
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		void *p[64];
		for (int i = 0; i < 64; i++) {
			p[i] = malloc(8 + 8 * i);
			memset(p[i], 0xa5, 8 + 8 * i);
		}
		usleep(1000);
		for (int i = 0; i < 64; i++)
			free(p[i]);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) < 1500000000L);
	printf("ok\n");
	return 0;
}
