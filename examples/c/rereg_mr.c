/*
 * rereg_mr.c — the libibverbs calls of rdma-core 44 that no earlier example used:
 *
 *   rates       ibv_rate_to_mult, mult_to_ibv_rate, ibv_rate_to_mbps, mbps_to_ibv_rate over
 *               every enum value and beyond, one line per value ("./rereg_mr rates": no
 *               device needed, so the same output can come from rdma-core's own library);
 *   (default)   on the first device: ibv_rereg_mr changing the rights, then the translation,
 *               checked with RDMA WRITEs between two RC QPs of the device (a region given
 *               remote write by rereg takes a WRITE; after the translation moved, a WRITE
 *               lands in the new buffer, and one to the old address fails with a remote
 *               access error); the arguments libibverbs itself refuses (IBV_REREG_MR_ERR_INPUT,
 *               EINVAL); ibv_query_gid_table against ibv_query_gid_ex; ibv_is_fork_initialized;
 *               ibv_reg_dmabuf_mr and ibv_import_pd refused with EOPNOTSUPP.
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./rereg_mr
 * Prints "ok" and exits 0 when every check passes.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rc_connect.h"

#define N 4096

static int fail(const char *what, int e)
{
	fprintf(stderr, "rereg_mr: %s: %s\n", what, strerror(e));
	exit(1);
}

static void rates(void)
{
	for (int r = -1; r <= 30; r++)
		printf("rate %d: mult %d mbps %d\n", r, ibv_rate_to_mult((enum ibv_rate)r),
		       ibv_rate_to_mbps((enum ibv_rate)r));
	for (int m = -1; m <= 500; m++)
		printf("mult %d: rate %d\n", m, mult_to_ibv_rate(m));
	static const int mbps[] = { -1, 0, 1, 2500, 5000, 10000, 14062, 14063, 20000, 25000,
				    25781, 28125, 30000, 40000, 53125, 56250, 60000, 80000,
				    100000, 103125, 112500, 120000, 168750, 206250, 309375,
				    425000, 637500, 850000, 1275000, 2000000 };
	for (unsigned i = 0; i < sizeof(mbps) / sizeof(mbps[0]); i++)
		printf("mbps %d: rate %d\n", mbps[i], mbps_to_ibv_rate(mbps[i]));
}

/* A signaled RDMA WRITE of `len` bytes from `src` to `raddr`/`rkey`; its completion status. */
static enum ibv_wc_status write_to(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *smr,
				   void *src, size_t len, void *raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = smr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)raddr, .rkey = rkey },
	}, *bad = NULL;
	int r = ibv_post_send(qp, &wr, &bad);
	if (r)
		fail("ibv_post_send", r);
	return poll_one_or_exit(cq, "rereg_mr").status;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "rates")) {
		rates();
		return 0;
	}
	struct ibv_device **list;
	union ibv_gid gid;
	const char *step;
	struct ibv_context *ctx = open_first_device(&list, &gid, &step);
	if (!ctx)
		fail(step, errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !cq)
		fail("pd/cq", errno);
	char *src = malloc(N), *old = calloc(1, N), *moved = calloc(1, N);
	for (int i = 0; i < N; i++)
		src[i] = (char)(i * 13 % 251);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, N, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mr = ibv_reg_mr(pd, old, N, IBV_ACCESS_LOCAL_WRITE);
	if (!smr || !mr)
		fail("ibv_reg_mr", errno);

	/* What libibverbs refuses before the provider sees it: the region stays as it was. */
	uint32_t rkey0 = mr->rkey;
	errno = 0;
	int r = ibv_rereg_mr(mr, 8, NULL, NULL, 0, 0);
	printf("rereg unknown flag: %d %s\n", r, strerror(errno));
	errno = 0;
	r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, N, 0);
	printf("rereg translation to NULL: %d %s\n", r, strerror(errno));
	errno = 0;
	r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE);
	printf("rereg rights without CHANGE_ACCESS: %d %s\n", r, strerror(errno));
	if (mr->rkey != rkey0 || mr->addr != old)
		fail("a refused rereg changed the region", EINVAL);

	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	if (!a || !b)
		fail("ibv_create_qp", errno);
	int e;
	int acc = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if ((step = rc_to_rts(a, b->qp_num, &gid, acc, 100, &e)) ||
	    (step = rc_to_rts(b, a->qp_num, &gid, acc, 100, &e)))
		fail(step, e);
	printf("ibv_query_qp_data_in_order: %d\n",
	       ibv_query_qp_data_in_order(a, IBV_WR_RDMA_WRITE, 0));

	/* Remote write given by rereg: a WRITE now lands. */
	r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (r)
		fail("ibv_rereg_mr CHANGE_ACCESS", errno);
	enum ibv_wc_status st = write_to(a, cq, smr, src, N, old, mr->rkey);
	printf("WRITE after rereg CHANGE_ACCESS: %s, data %s\n", ibv_wc_status_str(st),
	       memcmp(old, src, N) ? "different" : "identical");

	/* The translation moved to another buffer: a WRITE lands there, and the old range is
	 * no longer the region's (remote access error, which ends the QPs). */
	r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, moved, N, 0);
	if (r)
		fail("ibv_rereg_mr CHANGE_TRANSLATION", errno);
	printf("rereg translation: addr %s, length %zu\n", mr->addr == moved ? "moved" : "NOT moved",
	       mr->length);
	memset(old, 0, N);
	st = write_to(a, cq, smr, src, N, moved, mr->rkey);
	printf("WRITE to the new range: %s, data %s, old buffer %s\n", ibv_wc_status_str(st),
	       memcmp(moved, src, N) ? "different" : "identical",
	       old[0] == 0 && !memcmp(old, old + 1, N - 1) ? "untouched" : "WRITTEN");
	st = write_to(a, cq, smr, src, 64, old, mr->rkey);
	printf("WRITE to the old range: %s\n", ibv_wc_status_str(st));

	/* Keys across a rereg (what rdma-core's tests/test_mr.py takes for granted): a change of
	 * rights keeps them (an R_Key a peer holds stays valid), a change of PD gives new ones. */
	uint32_t lk = mr->lkey, rk = mr->rkey;
	if (ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))
		fail("ibv_rereg_mr CHANGE_ACCESS", errno);
	printf("keys after rereg CHANGE_ACCESS: %s\n",
	       mr->lkey == lk && mr->rkey == rk ? "kept" : "changed");
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	if (!pd2 || ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0))
		fail("ibv_rereg_mr CHANGE_PD", errno);
	printf("keys after rereg CHANGE_PD: %s\n",
	       mr->lkey == lk || mr->rkey == rk ? "kept" : "changed");
	if (ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0))
		fail("ibv_rereg_mr CHANGE_PD back", errno);

	/* A receive posted while its region had local write, reached after a rereg took it away:
	 * protection is checked when the WQE is processed (IBTA), so the receive completes with a
	 * local protection error and its sender learns of it (remote operation error). */
	struct ibv_qp *c = ibv_create_qp(pd, &ia), *d = ibv_create_qp(pd, &ia);
	if (!c || !d)
		fail("ibv_create_qp", errno);
	if ((step = rc_to_rts(c, d->qp_num, &gid, acc, 100, &e)) ||
	    (step = rc_to_rts(d, c->qp_num, &gid, acc, 100, &e)))
		fail(step, e);
	struct ibv_sge rsge = { .addr = (uintptr_t)mr->addr, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	if (ibv_post_recv(d, &rwr, &rbad))
		fail("ibv_post_recv", errno);
	if (ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 0))
		fail("ibv_rereg_mr CHANGE_ACCESS to none", errno);
	struct ibv_sge ssge = { .addr = (uintptr_t)src, .length = 64, .lkey = smr->lkey };
	struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &ssge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;
	if (ibv_post_send(c, &swr, &sbad))
		fail("ibv_post_send", errno);
	enum ibv_wc_status rst = IBV_WC_SUCCESS, sst = IBV_WC_SUCCESS;
	for (int i = 0; i < 2; i++) {
		struct ibv_wc wc = poll_one_or_exit(cq, "rereg_mr");
		if (wc.qp_num == d->qp_num)
			rst = wc.status;
		else
			sst = wc.status;
	}
	printf("receive after its region lost local write: %s; its sender: %s\n",
	       ibv_wc_status_str(rst), ibv_wc_status_str(sst));

	/* The GID table in one call agrees with the entries one by one. */
	struct ibv_port_attr port;
	if (ibv_query_port(ctx, 1, &port))
		fail("ibv_query_port", errno);
	struct ibv_gid_entry table[256];
	ssize_t n = ibv_query_gid_table(ctx, table, 256, 0);
	if (n < 1)
		fail("ibv_query_gid_table", (int)-n);
	int agree = 1, valid = 0;
	for (int i = 0; i < port.gid_tbl_len; i++) {
		struct ibv_gid_entry one;
		if (ibv_query_gid_ex(ctx, 1, i, &one, 0))
			continue;
		if (valid >= n || memcmp(&table[valid], &one, sizeof(one)))
			agree = 0;
		valid++;
	}
	printf("gid table: %zd entries, %s the %d valid of ibv_query_gid_ex\n", n,
	       agree && valid == n ? "equal to" : "NOT equal to", valid);
	if (n > 1)
		printf("gid table too small: %zd\n", ibv_query_gid_table(ctx, table, 1, 0));

	printf("ibv_is_fork_initialized: %d\n", (int)ibv_is_fork_initialized());
	errno = 0;
	struct ibv_mr *dm = ibv_reg_dmabuf_mr(pd, 0, N, 0, 0, IBV_ACCESS_LOCAL_WRITE);
	printf("ibv_reg_dmabuf_mr: %s %s\n", dm ? "made" : "NULL", strerror(errno));
	errno = 0;
	struct ibv_pd *ip = ibv_import_pd(ctx, 1);
	printf("ibv_import_pd: %s %s\n", ip ? "made" : "NULL", strerror(errno));

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_qp(c);
	ibv_destroy_qp(d);
	if (ibv_dereg_mr(mr) || ibv_dereg_mr(smr))
		fail("ibv_dereg_mr", errno);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd2);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
