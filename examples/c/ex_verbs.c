/*
 * ex_verbs.c — libibverbs' extended interface, on one device with two RC QPs connected to
 * each other through the device's first GID:
 *
 *  - a CQ from ibv_create_cq_ex, read with ibv_start_poll / ibv_next_poll / ibv_end_poll and
 *    ibv_wc_read_opcode / ibv_wc_read_byte_len / ibv_wc_read_qp_num, with completion
 *    timestamps (ibv_wc_read_completion_ts) checked against ibv_query_rt_values_ex's clock,
 *    whose frequency and mask ibv_query_device_ex reports;
 *  - QPs from ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, posted to through
 *    ibv_qp_to_qp_ex: ibv_wr_start, ibv_wr_rdma_write + ibv_wr_set_sge, ibv_wr_send +
 *    ibv_wr_set_inline_data, ibv_wr_complete;
 *  - RDMA ATOMIC WRITE, through ibv_wr_atomic_write and through ibv_post_send with
 *    IBV_WR_ATOMIC_WRITE: the 8 bytes taken when posted (the program's buffer overwritten
 *    right after), stored at the target, completed as IBV_WC_ATOMIC_WRITE;
 *  - inline data as libibverbs defines it: taken at post time from memory that is not
 *    registered, so the program may overwrite its buffer as soon as the post returns (both
 *    through ibv_wr_set_inline_data and through ibv_post_send with IBV_SEND_INLINE).
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./ex_verbs
 * Prints "ok" and exits 0 when every check passes.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rc_connect.h"

#define N 4096
#define MSG 64

static int fail(const char *what, int e)
{
	fprintf(stderr, "ex_verbs: %s: %s\n", what, strerror(e));
	exit(1);
}

/* The next completion through the extended polling interface. */
struct done {
	uint64_t wr_id;
	int status, opcode;
	uint32_t byte_len, qp_num;
	uint64_t ts;
};

static struct done next_done(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr pa = { 0 };
	for (long i = 0; i < 200000000L; i++) {
		int r = ibv_start_poll(cq, &pa);
		if (r == ENOENT)
			continue;
		if (r)
			fail("ibv_start_poll", r);
		struct done d = {
			.wr_id = cq->wr_id,
			.status = cq->status,
			.opcode = ibv_wc_read_opcode(cq),
			.byte_len = ibv_wc_read_byte_len(cq),
			.qp_num = ibv_wc_read_qp_num(cq),
			.ts = ibv_wc_read_completion_ts(cq),
		};
		ibv_end_poll(cq);
		return d;
	}
	fprintf(stderr, "ex_verbs: no completion\n");
	exit(1);
}

static void to_rts(struct ibv_qp *qp, uint32_t dest_qpn, union ibv_gid *gid)
{
	int e;
	const char *step = rc_to_rts(qp, dest_qpn, gid, IBV_ACCESS_REMOTE_WRITE, 7, &e);
	if (step)
		fail(step, e);
}

int main(void)
{
	struct ibv_device **list;
	union ibv_gid gid;
	const char *step;
	struct ibv_context *ctx = open_first_device(&list, &gid, &step);
	if (!ctx)
		fail(step, errno ? errno : ENODEV);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);

	/* The device's clock: ibv_query_device_ex gives its frequency and the timestamp's mask. */
	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(ctx, NULL, &dx))
		fail("ibv_query_device_ex", errno);
	if (!dx.completion_timestamp_mask || !dx.hca_core_clock || dx.orig_attr.phys_port_cnt != 1)
		fail("ibv_query_device_ex: no timestamp mask, clock or port", EINVAL);
	printf("ibv_query_device_ex: hca_core_clock %llu kHz, timestamp mask 0x%llx\n",
	       (unsigned long long)dx.hca_core_clock,
	       (unsigned long long)dx.completion_timestamp_mask);
	struct ibv_values_ex t0 = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	if (ibv_query_rt_values_ex(ctx, &t0))
		fail("ibv_query_rt_values_ex", errno);
	uint64_t clk0 = (uint64_t)t0.raw_clock.tv_sec * 1000000000ull + t0.raw_clock.tv_nsec;

	/* VLAN tags are not offered: refused, as on a provider without them. */
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 32,
		.wc_flags = IBV_WC_EX_WITH_CVLAN,
	};
	if (ibv_create_cq_ex(ctx, &ca) || errno != EOPNOTSUPP)
		fail("a CQ with VLAN tags was not refused with EOPNOTSUPP", EINVAL);
	ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM |
		      IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &ca);
	if (!cq)
		fail("ibv_create_cq_ex", errno);

	char *src = malloc(N), *dst = calloc(1, N), *rbuf = calloc(1, 4 * MSG);
	for (int i = 0; i < N; i++)
		src[i] = (char)(i * 13 % 251);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, N, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, N, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, 4 * MSG, IBV_ACCESS_LOCAL_WRITE);
	if (!smr || !dmr || !rmr)
		fail("ibv_reg_mr", errno);

	struct ibv_qp_init_attr_ex ia = {
		.send_cq = ibv_cq_ex_to_cq(cq),
		.recv_cq = ibv_cq_ex_to_cq(cq),
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = MSG },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
				  IBV_QP_EX_WITH_ATOMIC_WRITE,
	};
	/* An operation the device does not carry (TSO) is refused when the QP is made, not at
	 * each ibv_wr_complete (rdma-core's tests/test_qpex.py skips on that EOPNOTSUPP); the
	 * creation-flags and TSO-header bits with nothing in them are taken, as the kernel takes
	 * them. */
	struct ibv_qp_init_attr_ex ask = ia;
	ask.send_ops_flags |= IBV_QP_EX_WITH_TSO;
	errno = 0;
	struct ibv_qp *q = ibv_create_qp_ex(ctx, &ask);
	printf("QP with IBV_QP_EX_WITH_TSO: %s %s\n", q ? "made" : "NULL", strerror(errno));
	if (q)
		ibv_destroy_qp(q);
	ask = ia;
	ask.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
	q = ibv_create_qp_ex(ctx, &ask);
	printf("QP with empty creation flags and TSO header: %s\n", q ? "made" : strerror(errno));
	if (q)
		ibv_destroy_qp(q);
	ask.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	errno = 0;
	q = ibv_create_qp_ex(ctx, &ask);
	printf("QP with IBV_QP_CREATE_SCATTER_FCS: %s %s\n", q ? "made" : "NULL", strerror(errno));
	if (q)
		ibv_destroy_qp(q);

	struct ibv_qp *a = ibv_create_qp_ex(ctx, &ia), *b = ibv_create_qp_ex(ctx, &ia);
	if (!a || !b)
		fail("ibv_create_qp_ex", errno);
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
	if (!ax)
		fail("ibv_qp_to_qp_ex", EINVAL);
	to_rts(a, b->qp_num, &gid);
	to_rts(b, a->qp_num, &gid);
	for (int i = 0; i < 2; i++) {
		struct ibv_sge rs = { .addr = (uintptr_t)(rbuf + i * MSG), .length = MSG,
				      .lkey = rmr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 100 + i, .sg_list = &rs, .num_sge = 1 }, *rbad;
		if (ibv_post_recv(b, &rw, &rbad))
			fail("ibv_post_recv", EINVAL);
	}

	/* An RDMA WRITE and an inline SEND in one builder session. The SEND's data is on the
	 * stack, not registered, and overwritten right after ibv_wr_complete returns. */
	char msg[MSG];
	memset(msg, 'I', sizeof(msg));
	memcpy(msg, "inline through ibv_wr_set_inline_data", 37);
	ibv_wr_start(ax);
	ax->wr_id = 1;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(ax, dmr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(ax, smr->lkey, (uintptr_t)src, N);
	ax->wr_id = 2;
	ax->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(ax);
	ibv_wr_set_inline_data(ax, msg, sizeof(msg));
	int r = ibv_wr_complete(ax);
	if (r)
		fail("ibv_wr_complete", r);
	memset(msg, 'X', sizeof(msg));

	/* The same through ibv_post_send with IBV_SEND_INLINE (lkey 0: no MR at all). */
	char msg2[MSG];
	memset(msg2, 'J', sizeof(msg2));
	memcpy(msg2, "inline through ibv_post_send", 28);
	struct ibv_sge is = { .addr = (uintptr_t)msg2, .length = MSG, .lkey = 0 };
	struct ibv_send_wr sw = { .wr_id = 3, .sg_list = &is, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE },
			   *bad;
	r = ibv_post_send(a, &sw, &bad);
	if (r)
		fail("ibv_post_send inline", r);
	memset(msg2, 'Y', sizeof(msg2));

	/* Two ATOMIC WRITEs into the last 16 bytes of dst (8-byte aligned), after the WRITE
	 * above (in order on the QP): one through the builder, its value on the stack and
	 * overwritten after the post; one through ibv_post_send, the value the first entry
	 * names (read when posted, as rdma-core's providers read it). */
	uint64_t v1 = 0x1122334455667788ull, v2 = 0x0102030405060708ull;
	ibv_wr_start(ax);
	ax->wr_id = 4;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(ax, dmr->rkey, (uintptr_t)(dst + N - 16), &v1);
	r = ibv_wr_complete(ax);
	if (r)
		fail("ibv_wr_complete (atomic write)", r);
	v1 = 0;
	struct ibv_sge as = { .addr = (uintptr_t)&v2, .length = 8, .lkey = 0 };
	struct ibv_send_wr aw = { .wr_id = 5, .sg_list = &as, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_WRITE, .send_flags = IBV_SEND_SIGNALED };
	aw.wr.rdma.remote_addr = (uintptr_t)(dst + N - 8);
	aw.wr.rdma.rkey = dmr->rkey;
	r = ibv_post_send(a, &aw, &bad);
	if (r)
		fail("ibv_post_send (IBV_WR_ATOMIC_WRITE)", r);
	v2 = 0;

	int seen_write = 0, seen_send = 0, seen_send2 = 0, recvs = 0, atomic_writes = 0;
	uint64_t last_ts = clk0;
	for (int k = 0; k < 7; k++) {
		struct done d = next_done(cq);
		/* Each completion's timestamp: after the clock reading before the posts, never
		 * earlier than the one before it. */
		if (d.ts < last_ts)
			fail("completion timestamps out of order", EINVAL);
		last_ts = d.ts;
		if (d.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "ex_verbs: wr_id %llu: %s\n", (unsigned long long)d.wr_id,
				ibv_wc_status_str(d.status));
			exit(1);
		}
		if (d.wr_id == 1 && d.opcode == IBV_WC_RDMA_WRITE && d.qp_num == a->qp_num)
			seen_write = 1;
		else if (d.wr_id == 2 && d.opcode == IBV_WC_SEND)
			seen_send = 1;
		else if (d.wr_id == 3 && d.opcode == IBV_WC_SEND)
			seen_send2 = 1;
		else if ((d.wr_id == 4 || d.wr_id == 5) && d.opcode == IBV_WC_ATOMIC_WRITE &&
			 d.qp_num == a->qp_num)
			atomic_writes++;
		else if (d.wr_id >= 100 && d.opcode == IBV_WC_RECV && d.byte_len == MSG &&
			 d.qp_num == b->qp_num)
			recvs++;
		else {
			fprintf(stderr, "ex_verbs: unexpected completion wr_id %llu opcode %d len %u\n",
				(unsigned long long)d.wr_id, d.opcode, d.byte_len);
			exit(1);
		}
	}
	if (!seen_write || !seen_send || !seen_send2 || recvs != 2 || atomic_writes != 2)
		fail("missing completions", EINVAL);
	struct ibv_values_ex t1 = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	if (ibv_query_rt_values_ex(ctx, &t1))
		fail("ibv_query_rt_values_ex", errno);
	uint64_t clk1 = (uint64_t)t1.raw_clock.tv_sec * 1000000000ull + t1.raw_clock.tv_nsec;
	if (last_ts > clk1 || clk1 <= clk0)
		fail("completion timestamps outside the device clock's readings", EINVAL);
	printf("completion timestamps: 7 in order, within the clock's readings (%llu ticks)\n",
	       (unsigned long long)(clk1 - clk0));
	if (memcmp(src, dst, N - 16))
		fail("RDMA WRITE through ibv_wr_*: data differs", EINVAL);
	printf("extended CQ and ibv_wr_*: RDMA WRITE %d bytes, data identical\n", N - 16);
	uint64_t got1, got2;
	memcpy(&got1, dst + N - 16, 8);
	memcpy(&got2, dst + N - 8, 8);
	if (got1 != 0x1122334455667788ull || got2 != 0x0102030405060708ull)
		fail("ATOMIC WRITE: the target does not hold the values posted", EINVAL);
	printf("ATOMIC WRITE: ibv_wr_atomic_write and IBV_WR_ATOMIC_WRITE stored their 8 bytes\n");
	char want[MSG];
	memset(want, 'I', sizeof(want));
	memcpy(want, "inline through ibv_wr_set_inline_data", 37);
	if (memcmp(rbuf, want, MSG))
		fail("inline SEND (ibv_wr_set_inline_data): data differs", EINVAL);
	memset(want, 'J', sizeof(want));
	memcpy(want, "inline through ibv_post_send", 28);
	if (memcmp(rbuf + MSG, want, MSG))
		fail("inline SEND (ibv_post_send): data differs", EINVAL);
	printf("inline data from unregistered memory, overwritten after the post: as posted\n");

	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(ibv_cq_ex_to_cq(cq)))
		fail("destroy", EINVAL);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_dereg_mr(rmr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
