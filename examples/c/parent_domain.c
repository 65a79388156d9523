/*
 * parent_domain.c — thread domains and parent domains as libibverbs offers them
 * (ibv_alloc_td, ibv_alloc_parent_domain, ibv_dealloc_td, ibv_dealloc_pd of either):
 *
 *   - a parent domain made on a PD with a thread domain and allocators stands for that PD
 *     wherever a PD is taken: a region registered on it, an extended CQ created with it
 *     (IBV_CQ_INIT_ATTR_MASK_PD), two RC QPs made on it and connected to each other; an RDMA
 *     WRITE between them lands;
 *   - refused: a parent domain of a parent domain, unknown comp_mask bits, allocators asked
 *     for without functions (EINVAL); an extended CQ whose parent_domain is a plain PD
 *     (EINVAL);
 *   - the order of teardown, as mlx5 keeps it: the parent domain while a QP made on it
 *     (or a CQ made with it) exists, the PD while a parent domain made on it exists, the
 *     thread domain while a
 *     parent domain names it: EBUSY; each then goes once what holds it is gone.
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./parent_domain
 * (rxe offers no parent domains: ibv_alloc_td fails there with EOPNOTSUPP). Prints what each
 * step gave and "ok" when every check passes (exit 0).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "parent_domain"
#include "rc_connect.h"

static void *my_alloc(struct ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type)
{
	(void)pd;
	(void)ctx;
	(void)size;
	(void)align;
	(void)type;
	return IBV_ALLOCATOR_USE_DEFAULT;
}

static void my_free(struct ibv_pd *pd, void *ctx, void *ptr, uint64_t type)
{
	(void)pd;
	(void)ctx;
	(void)ptr;
	(void)type;
}

static const char *err_of(void *p)
{
	return p ? "made" : strerror(errno);
}

int main(void)
{
	struct ibv_device **list;
	const char *step;
	union ibv_gid gid;
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_context *ctx = open_first_device(&list, &gid, &step);
	if (!ctx)
		fail(step, errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);
	struct ibv_td_init_attr ta = {.comp_mask = 0};
	struct ibv_td *td = ibv_alloc_td(ctx, &ta);
	printf("ibv_alloc_td: %s\n", err_of(td));
	check(td != NULL, "ibv_alloc_td");
	int token = 0;
	struct ibv_parent_domain_init_attr pa = {
		.pd = pd,
		.td = td,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			     IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
		.alloc = my_alloc,
		.free = my_free,
		.pd_context = &token,
	};
	struct ibv_pd *par = ibv_alloc_parent_domain(ctx, &pa);
	printf("ibv_alloc_parent_domain: %s\n", err_of(par));
	check(par != NULL, "ibv_alloc_parent_domain");

	/* Refusals. */
	struct ibv_parent_domain_init_attr bad = pa;
	bad.pd = par;
	printf("a parent domain of a parent domain: %s\n",
	       err_of(ibv_alloc_parent_domain(ctx, &bad)));
	bad = pa;
	bad.comp_mask |= 1 << 5;
	printf("unknown comp_mask bits: %s\n", err_of(ibv_alloc_parent_domain(ctx, &bad)));
	bad = pa;
	bad.alloc = NULL;
	printf("allocators without a function: %s\n", err_of(ibv_alloc_parent_domain(ctx, &bad)));

	/* The parent domain in use. */
	struct ibv_cq_init_attr_ex ca;
	memset(&ca, 0, sizeof(ca));
	ca.cqe = 16;
	ca.wc_flags = IBV_WC_STANDARD_FLAGS;
	ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	ca.parent_domain = pd;
	printf("ibv_create_cq_ex with a plain PD as parent_domain: %s\n",
	       err_of(ibv_create_cq_ex(ctx, &ca)));
	ca.parent_domain = par;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
	printf("ibv_create_cq_ex with the parent domain: %s\n", err_of(cqx));
	check(cqx != NULL, "ibv_create_cq_ex");
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);

	enum { LEN = 8192 };
	char *src = malloc(LEN), *dst = calloc(1, LEN);
	if (!src || !dst)
		fail("malloc", ENOMEM);
	for (int i = 0; i < LEN; i++)
		src[i] = (char)(i * 5 % 253);
	struct ibv_mr *smr = ibv_reg_mr(par, src, LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(par, dst, LEN,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	printf("ibv_reg_mr on the parent domain: %s\n", err_of(dmr));
	if (!smr || !dmr)
		fail("ibv_reg_mr", errno);
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 4;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	struct ibv_qp *a = ibv_create_qp(par, &qa), *b = ibv_create_qp(par, &qa);
	printf("ibv_create_qp on the parent domain: %s\n", err_of(b));
	if (!a || !b)
		fail("ibv_create_qp", errno);
	int e;
	step = rc_to_rts(a, b->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE, 3, &e);
	if (!step)
		step = rc_to_rts(b, a->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE, 3, &e);
	if (step)
		fail(step, e);
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = LEN, .lkey = smr->lkey};
	struct ibv_send_wr wr, *badwr;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = dmr->rkey;
	if ((e = ibv_post_send(a, &wr, &badwr)))
		fail("ibv_post_send", e);
	struct ibv_wc wc = poll_one_or_exit(cq, PROG);
	printf("WRITE between QPs of the parent domain: %s, %s\n", ibv_wc_status_str(wc.status),
	       memcmp(src, dst, LEN) ? "data differ" : "data identical");
	check(wc.status == IBV_WC_SUCCESS && !memcmp(src, dst, LEN), "WRITE");

	/* Teardown order. */
	printf("ibv_dealloc_pd of the parent domain with QPs on it: %s\n",
	       strerror(ibv_dealloc_pd(par)));
	printf("ibv_dealloc_pd of the PD under a parent domain: %s\n", strerror(ibv_dealloc_pd(pd)));
	printf("ibv_dealloc_td named by a parent domain: %s\n", strerror(ibv_dealloc_td(td)));
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b))
		fail("ibv_destroy_qp", errno);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	printf("ibv_dealloc_pd of the parent domain with a CQ made with it: %s\n",
	       strerror(ibv_dealloc_pd(par)));
	if (ibv_destroy_cq(cq))
		fail("ibv_destroy_cq", errno);
	int r1 = ibv_dealloc_pd(par);
	int r2 = ibv_dealloc_td(td);
	int r3 = ibv_dealloc_pd(pd);
	printf("then: parent domain %d, thread domain %d, PD %d\n", r1, r2, r3);
	check(!r1 && !r2 && !r3, "teardown");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(src);
	free(dst);
	printf("ok\n");
	return 0;
}
