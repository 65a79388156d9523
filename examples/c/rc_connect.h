/*
 * rc_connect.h — shared by the examples that connect two RC QPs of one device to each other
 * through its GID: RESET → INIT → RTR → RTS with the usual attributes (path MTU 1024, one
 * READ/atomic each way, retry counts 7).
 */
#ifndef FERROCE_EXAMPLES_RC_CONNECT_H
#define FERROCE_EXAMPLES_RC_CONNECT_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Bring `qp` to RTS towards QP `dest_qpn` at `gid`, with remote `access` rights and `psn` as
 * both its send PSN and the peer's. Returns NULL, or the step that failed with its error in
 * *err.
 */
static inline const char *rc_to_rts(struct ibv_qp *qp, uint32_t dest_qpn,
				    const union ibv_gid *gid, int access, uint32_t psn, int *err)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	*err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS);
	if (*err)
		return "modify to INIT";
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	*err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (*err)
		return "modify to RTR";
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = 1;
	*err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					     IBV_QP_MAX_QP_RD_ATOMIC);
	if (*err)
		return "modify to RTS";
	return NULL;
}

/*
 * Open the first device and read its GID 0 into *gid. Returns the context, or NULL with the
 * step that failed in *step (errno set by libibverbs). *list is to be freed with
 * ibv_free_device_list.
 */
static inline struct ibv_context *open_first_device(struct ibv_device ***list,
						     union ibv_gid *gid, const char **step)
{
	int num;
	*list = ibv_get_device_list(&num);
	if (!*list || num < 1) {
		*step = "no device";
		return NULL;
	}
	struct ibv_context *ctx = ibv_open_device((*list)[0]);
	if (!ctx) {
		*step = "ibv_open_device";
		return NULL;
	}
	if (ibv_query_gid(ctx, 1, 0, gid)) {
		*step = "ibv_query_gid";
		return NULL;
	}
	return ctx;
}

/*
 * open_first_device, then a PD on it in *pd; on failure says so as "PROG: step: error" and
 * exits 1.
 */
static inline struct ibv_context *open_device_and_pd(struct ibv_device ***list,
						       union ibv_gid *gid, struct ibv_pd **pd,
						       const char *prog)
{
	const char *step = NULL;
	struct ibv_context *ctx = open_first_device(list, gid, &step);
	if (ctx && !(*pd = ibv_alloc_pd(ctx)))
		step = "ibv_alloc_pd";
	if (!ctx || !*pd) {
		fprintf(stderr, "%s: %s: %s\n", prog, step, strerror(errno ? errno : ENODEV));
		exit(1);
	}
	return ctx;
}

/*
 * Poll `cq` until one completion comes (busy, at most 2e8 polls) and return it; on an error
 * or when nothing comes, say so as "PROG: what: error" on standard error and exit 1, as the
 * examples' own failures do.
 */
static inline struct ibv_wc poll_one_or_exit(struct ibv_cq *cq, const char *prog)
{
	struct ibv_wc wc;
	for (long i = 0; i < 200000000L; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0) {
			fprintf(stderr, "%s: ibv_poll_cq: %s\n", prog, strerror(-n));
			exit(1);
		}
		if (n == 1)
			return wc;
	}
	fprintf(stderr, "%s: no completion: %s\n", prog, strerror(ETIMEDOUT));
	exit(1);
}

#ifdef PROG
/* The examples' failures: "PROG: what: error" on standard error, exit 1. */
static inline int fail(const char *what, int e)
{
	fprintf(stderr, PROG ": %s: %s\n", what, strerror(e));
	exit(1);
}

/* Exit 1 with "PROG: check failed: what" unless `ok`. */
static inline void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, PROG ": check failed: %s\n", what);
		exit(1);
	}
}
#endif

/* Two RC QPs of `pd` on one fresh CQ of 16 entries (8 requests, 1 scatter/gather entry each
 * way), connected to each other through `gid` with remote `access` rights (PSN 7). A failed
 * operation leaves both in the error state, so each case may take a fresh pair. On failure
 * says so as "PROG: step: error" and exits 1. */
struct rc_pair {
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
};

static inline struct rc_pair rc_pair_new(struct ibv_context *ctx, struct ibv_pd *pd,
					 const union ibv_gid *gid, int access, const char *prog)
{
	struct rc_pair p;
	const char *step = NULL;
	int e = 0;
	p.cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!p.cq) {
		step = "ibv_create_cq";
		e = errno;
		goto out;
	}
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = p.cq;
	qa.recv_cq = p.cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 8;
	qa.cap.max_recv_wr = 8;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	p.a = ibv_create_qp(pd, &qa);
	p.b = ibv_create_qp(pd, &qa);
	if (!p.a || !p.b) {
		step = "ibv_create_qp";
		e = errno;
		goto out;
	}
	step = rc_to_rts(p.a, p.b->qp_num, gid, access, 7, &e);
	if (!step)
		step = rc_to_rts(p.b, p.a->qp_num, gid, access, 7, &e);
out:
	if (step) {
		fprintf(stderr, "%s: %s: %s\n", prog, step, strerror(e));
		exit(1);
	}
	return p;
}

static inline void rc_pair_free(struct rc_pair p)
{
	ibv_destroy_qp(p.a);
	ibv_destroy_qp(p.b);
	ibv_destroy_cq(p.cq);
}

#endif
