/*
 * cq_limit.c — ibv_destroy_cq gives the device's CQ back. The program creates CQs until the
 * device refuses one (there must be exactly max_cq of them, ibv_query_device's figure), then:
 * destroying a CQ a QP completes into fails with EBUSY (as rdma-core's providers answer) and
 * leaves it usable; destroying another succeeds and makes room for exactly one more CQ, which
 * works; once the QP is gone its CQ can be destroyed too; after every CQ is destroyed the
 * device gives out max_cq again.
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./cq_limit
 * Prints "ok" and exits 0 when every check passes.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what, int e)
{
	fprintf(stderr, "cq_limit: %s: %s\n", what, strerror(e));
	exit(1);
}

/* CQs until the device refuses one; returns how many, the refusal's errno in *e. */
static int fill(struct ibv_context *ctx, struct ibv_cq **cqs, int room, int *e)
{
	int n = 0;
	while (n < room) {
		errno = 0;
		cqs[n] = ibv_create_cq(ctx, 1, NULL, NULL, 0);
		if (!cqs[n]) {
			*e = errno;
			return n;
		}
		n++;
	}
	*e = 0;
	return n;
}

int main(void)
{
	int ndev;
	struct ibv_device **devs = ibv_get_device_list(&ndev);
	if (!devs || ndev < 1)
		fail("ibv_get_device_list", errno ? errno : ENODEV);
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_device_attr attr;
	int r = ibv_query_device(ctx, &attr);
	if (r)
		fail("ibv_query_device", r);
	int max = attr.max_cq;
	if (max < 4)
		fail("max_cq below 4", EINVAL);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);

	/* A depth past max_cqe and a completion vector the device does not have are EINVAL, as
	 * the kernel checks them (rdma-core's tests/test_cq.py asks for one past each). */
	errno = 0;
	struct ibv_cq *bad = ibv_create_cq(ctx, attr.max_cqe + 1, NULL, NULL, 0);
	printf("CQ of max_cqe + 1 entries: %s %s\n", bad ? "made" : "NULL", strerror(errno));
	errno = 0;
	bad = ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors);
	printf("CQ on completion vector num_comp_vectors (%d): %s %s\n", ctx->num_comp_vectors,
	       bad ? "made" : "NULL", strerror(errno));
	errno = 0;
	bad = ibv_create_cq(ctx, 16, NULL, NULL, -1);
	printf("CQ on completion vector -1: %s %s\n", bad ? "made" : "NULL", strerror(errno));

	/* room for one more than the limit: the last must be refused */
	struct ibv_cq **cqs = calloc((size_t)max + 1, sizeof(*cqs));
	if (!cqs)
		fail("calloc", ENOMEM);
	int e, n = fill(ctx, cqs, max + 1, &e);
	if (n != max) {
		fprintf(stderr, "cq_limit: %d CQs created, max_cq is %d\n", n, max);
		return 1;
	}
	if (e == 0)
		fail("the CQ past max_cq: no errno", EINVAL);
	printf("max_cq %d: %d CQs created, the next refused: %s\n", max, n, strerror(e));

	/* a QP completing into the first CQ */
	struct ibv_qp_init_attr qa = {
		.send_cq = cqs[0],
		.recv_cq = cqs[0],
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	if (!qp)
		fail("ibv_create_qp", errno);
	r = ibv_destroy_cq(cqs[0]);
	if (r != EBUSY) {
		fprintf(stderr, "cq_limit: ibv_destroy_cq of a CQ a QP uses returned %d, expected EBUSY\n", r);
		return 1;
	}
	struct ibv_wc wc;
	if (ibv_poll_cq(cqs[0], 1, &wc) != 0)
		fail("ibv_poll_cq on the CQ refused destruction", EINVAL);
	printf("destroy_cq of a CQ a QP completes into: %s, the CQ still polls\n", strerror(r));

	/* one destroyed at the limit: exactly one more */
	int mid = max / 2;
	r = ibv_destroy_cq(cqs[mid]);
	if (r)
		fail("ibv_destroy_cq at the limit", r);
	int extra = fill(ctx, cqs + mid, 1, &e);
	if (extra != 1)
		fail("ibv_create_cq after a destroy at the limit", e);
	struct ibv_cq *past = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	if (past) {
		fprintf(stderr, "cq_limit: a CQ past max_cq after one destroy and one create\n");
		return 1;
	}
	if (ibv_poll_cq(cqs[mid], 1, &wc) != 0 || ibv_req_notify_cq(cqs[mid], 0) != 0)
		fail("the CQ created again does not work", EINVAL);
	printf("at the limit: destroyed one, created one again (it polls), the next refused\n");

	if ((r = ibv_destroy_qp(qp)))
		fail("ibv_destroy_qp", r);
	for (int i = 0; i < max; i++)
		if ((r = ibv_destroy_cq(cqs[i])))
			fail("ibv_destroy_cq", r);
	n = fill(ctx, cqs, max + 1, &e);
	if (n != max) {
		fprintf(stderr, "cq_limit: after destroying every CQ, %d created again, max_cq is %d\n",
			n, max);
		return 1;
	}
	printf("every CQ destroyed: %d created again\n", n);
	for (int i = 0; i < n; i++)
		if ((r = ibv_destroy_cq(cqs[i])))
			fail("ibv_destroy_cq", r);
	free(cqs);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
	printf("ok\n");
	return 0;
}
