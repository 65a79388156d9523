/*
 * odp.c — on-demand paging (IBV_ACCESS_ON_DEMAND) as libibverbs offers it: regions whose pages
 * need not exist when they are registered, and the implicit region (addr NULL, length
 * SIZE_MAX) that covers the whole address space. Two RC QPs of one device, connected to each
 * other, move bytes between a plain region and on-demand ones:
 *
 *   - ibv_query_device_ex reports ODP (general and implicit) and the operations per transport;
 *   - a region registered on demand over a range with a hole (a page no memory backs, nothing
 *     may access) is accepted (a pinned registration needs every page); a WRITE into its
 *     mapped part lands; a WRITE into the hole
 *     completes with IBV_WC_REM_ACCESS_ERR and nothing crashes; once the page is mapped (after
 *     registration) a WRITE lands there;
 *   - the implicit region: memory malloc'ed after it was registered takes a WRITE and gives a
 *     READ back, named by its own address with the implicit region's R_Key; its L_Key serves
 *     as the local side of a WRITE from a stack buffer; an ATOMIC fetch-and-add works on it;
 *   - a WRITE gathered through the implicit L_Key from a hole completes with
 *     IBV_WC_LOC_PROT_ERR;
 *   - ibv_advise_mr prefetches an on-demand range (0) and refuses a pinned region (ENOENT);
 *   - bad registrations are refused: on demand with addr NULL and any length but SIZE_MAX.
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./odp
 * Prints what each step gave and "ok" when every check passes (exit 0).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PROG "odp"
#include "rc_connect.h"


static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

/* A fresh pair of connected RC QPs (a failed operation leaves its QPs in the error state). */
static struct rc_pair new_pair(void)
{
	return rc_pair_new(ctx, pd, &gid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, PROG);
}

/* Post one signaled operation on QP a of `p` and return its completion's status. */
static enum ibv_wc_status run(struct rc_pair p, enum ibv_wr_opcode op, void *laddr, uint32_t len,
			      uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t add)
{
	struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = add;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	int e = ibv_post_send(p.a, &wr, &bad);
	if (e)
		fail("ibv_post_send", e);
	return poll_one_or_exit(p.cq, PROG).status;
}

int main(void)
{
	struct ibv_device **list;
	const char *step;
	ctx = open_first_device(&list, &gid, &step);
	if (!ctx)
		fail(step, errno);
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);
	long page = sysconf(_SC_PAGESIZE);

	struct ibv_device_attr_ex dx;
	memset(&dx, 0, sizeof(dx));
	if (ibv_query_device_ex(ctx, NULL, &dx))
		fail("ibv_query_device_ex", errno);
	struct ibv_odp_caps *oc = &dx.odp_caps;
	printf("odp caps: general 0x%llx rc 0x%x uc 0x%x ud 0x%x\n",
	       (unsigned long long)oc->general_caps, oc->per_transport_caps.rc_odp_caps,
	       oc->per_transport_caps.uc_odp_caps, oc->per_transport_caps.ud_odp_caps);
	check(oc->general_caps & IBV_ODP_SUPPORT, "IBV_ODP_SUPPORT");
	check(oc->general_caps & IBV_ODP_SUPPORT_IMPLICIT, "IBV_ODP_SUPPORT_IMPLICIT");

	/* The plain (pinned) source region. */
	size_t n = 4 * page;
	char *src = malloc(n);
	if (!src)
		fail("malloc", ENOMEM);
	for (size_t i = 0; i < n; i++)
		src[i] = (char)(i * 7 % 251);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, n, IBV_ACCESS_LOCAL_WRITE);
	if (!smr)
		fail("ibv_reg_mr src", errno);
	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_REMOTE_ATOMIC;

	/* On demand over four pages, the second a hole. */
	char *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (dst == MAP_FAILED)
		fail("mmap", errno);
	/* The hole: a fresh PROT_NONE mapping, which no page backs and nothing may read or write,
	 * as unmapped memory, but which no allocation of the library's threads can take over. */
	char *hole = dst + page;
	if (mmap(hole, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != hole)
		fail("mmap PROT_NONE", errno);
	struct ibv_mr *omr = ibv_reg_mr(pd, dst, n, all | IBV_ACCESS_ON_DEMAND);
	printf("reg_mr ON_DEMAND over an unmapped page: %s\n", omr ? "registered" : strerror(errno));
	check(omr != NULL, "on-demand registration over a hole");

	struct rc_pair p = new_pair();
	enum ibv_wc_status st = run(p, IBV_WR_RDMA_WRITE, src, 3000, smr->lkey,
				    (uintptr_t)(dst + 100), omr->rkey, 0);
	int same = memcmp(dst + 100, src, 3000) == 0;
	printf("WRITE to the mapped part: %s, %s\n", ibv_wc_status_str(st),
	       same ? "data identical" : "data differ");
	check(st == IBV_WC_SUCCESS && same, "WRITE to the mapped part");

	st = run(p, IBV_WR_RDMA_WRITE, src, 100, smr->lkey, (uintptr_t)(hole + 8), omr->rkey, 0);
	printf("WRITE to the unmapped page: %s\n", ibv_wc_status_str(st));
	check(st == IBV_WC_REM_ACCESS_ERR, "WRITE to the hole");
	rc_pair_free(p);

	if (mmap(hole, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
		 0) != hole)
		fail("mmap the hole", errno);
	p = new_pair();
	st = run(p, IBV_WR_RDMA_WRITE, src + 5000, 2000, smr->lkey, (uintptr_t)(hole + 8),
		 omr->rkey, 0);
	same = memcmp(hole + 8, src + 5000, 2000) == 0;
	printf("WRITE to the page mapped after registration: %s, %s\n", ibv_wc_status_str(st),
	       same ? "data identical" : "data differ");
	check(st == IBV_WC_SUCCESS && same, "WRITE to the late page");

	/* Prefetch advice: an on-demand range yes, a pinned region no. */
	struct ibv_sge ps = {.addr = (uintptr_t)dst, .length = (uint32_t)n, .lkey = omr->lkey};
	int r = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			      &ps, 1);
	struct ibv_sge pp = {.addr = (uintptr_t)src, .length = 8, .lkey = smr->lkey};
	int r2 = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &pp, 1);
	printf("ibv_advise_mr: on demand %d, pinned %s\n", r, strerror(r2));
	check(r == 0 && r2 == ENOENT, "ibv_advise_mr");

	/* The implicit region. */
	struct ibv_mr *imr = ibv_reg_mr(pd, NULL, SIZE_MAX, all | IBV_ACCESS_ON_DEMAND);
	printf("reg_mr implicit: %s\n", imr ? "registered" : strerror(errno));
	check(imr != NULL, "implicit registration");
	char *late = malloc(3 * page);
	if (!late)
		fail("malloc", ENOMEM);
	memset(late, 0, 3 * page);
	st = run(p, IBV_WR_RDMA_WRITE, src, (uint32_t)(2 * page + 10), smr->lkey,
		 (uintptr_t)late, imr->rkey, 0);
	same = memcmp(late, src, 2 * page + 10) == 0;
	printf("WRITE through the implicit region into memory malloc'ed after it: %s, %s\n",
	       ibv_wc_status_str(st), same ? "data identical" : "data differ");
	check(st == IBV_WC_SUCCESS && same, "implicit WRITE");
	memset(src, 0, 100);
	st = run(p, IBV_WR_RDMA_READ, src, 100, smr->lkey, (uintptr_t)(late + 40), imr->rkey, 0);
	same = memcmp(src, late + 40, 100) == 0;
	printf("READ through the implicit region: %s, %s\n", ibv_wc_status_str(st),
	       same ? "data identical" : "data differ");
	check(st == IBV_WC_SUCCESS && same, "implicit READ");
	char stack[64];
	for (int i = 0; i < 64; i++)
		stack[i] = (char)(200 - i);
	st = run(p, IBV_WR_RDMA_WRITE, stack, 64, imr->lkey, (uintptr_t)(late + 2 * page + 100),
		 imr->rkey, 0);
	same = memcmp(late + 2 * page + 100, stack, 64) == 0;
	printf("WRITE from a stack buffer by the implicit L_Key: %s, %s\n",
	       ibv_wc_status_str(st), same ? "data identical" : "data differ");
	check(st == IBV_WC_SUCCESS && same, "implicit L_Key");
	uint64_t *cell = (uint64_t *)(late + 2 * page + 512);
	*cell = 40;
	uint64_t *old = (uint64_t *)(src + 1024);
	*old = 0;
	st = run(p, IBV_WR_ATOMIC_FETCH_AND_ADD, old, 8, smr->lkey, (uintptr_t)cell, imr->rkey, 2);
	printf("ATOMIC fetch-and-add through the implicit region: %s, old %llu, now %llu\n",
	       ibv_wc_status_str(st), (unsigned long long)*old, (unsigned long long)*cell);
	check(st == IBV_WC_SUCCESS && *old == 40 && *cell == 42, "implicit ATOMIC");
	rc_pair_free(p);

	/* A local gather from an unmapped address through the implicit L_Key. */
	char *gone = mmap(NULL, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (gone == MAP_FAILED)
		fail("mmap PROT_NONE", errno);
	p = new_pair();
	st = run(p, IBV_WR_RDMA_WRITE, gone, 64, imr->lkey, (uintptr_t)late, imr->rkey, 0);
	printf("WRITE gathered from an unmapped address: %s\n", ibv_wc_status_str(st));
	check(st == IBV_WC_LOC_PROT_ERR, "local gather from a hole");
	rc_pair_free(p);

	/* Refused registrations. */
	errno = 0;
	struct ibv_mr *bad = ibv_reg_mr(pd, NULL, 4096, all | IBV_ACCESS_ON_DEMAND);
	printf("reg_mr ON_DEMAND at NULL for 4096 bytes: %s\n", bad ? "registered" : strerror(errno));
	check(bad == NULL && errno == EINVAL, "NULL without SIZE_MAX");

	check(ibv_dereg_mr(imr) == 0 && ibv_dereg_mr(omr) == 0 && ibv_dereg_mr(smr) == 0,
	      "ibv_dereg_mr");
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(late);
	free(src);
	munmap(dst, n);
	printf("ok\n");
	return 0;
}
