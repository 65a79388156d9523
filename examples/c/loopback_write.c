/*
 * loopback_write.c — a plain libibverbs program: one device, two RC QPs connected to each
 * other through the device's first GID, an RDMA WRITE from one buffer into the other, polled
 * to completion and checked. Then two mistakes, answered as libibverbs specifies: a post on a
 * QP in RESET fails with an errno, a WRITE whose SGE lies outside every MR completes with
 * IBV_WC_LOC_PROT_ERR. The WRITE's completion is also announced on a completion channel whose
 * descriptor the program poll()s, as event-driven programs do; with O_NONBLOCK and nothing
 * pending, ibv_get_cq_event fails with EAGAIN. Last, a CQ of 2 entries given 8 completions
 * overruns: the context's async_fd becomes readable and ibv_get_async_event reports
 * IBV_EVENT_CQ_ERR for it.
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./loopback_write
 * Prints "ok" and exits 0 when every check passes.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rc_connect.h"

#define N 8192

static int fail(const char *what, int e)
{
	fprintf(stderr, "loopback_write: %s: %s\n", what, strerror(e));
	exit(1);
}

static void to_rts(struct ibv_qp *qp, uint32_t dest_qpn, union ibv_gid *gid)
{
	int e;
	const char *step = rc_to_rts(qp, dest_qpn, gid,
				     IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 100, &e);
	if (step)
		fail(step, e);
}

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num < 1)
		fail("no device", ENODEV);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_port_attr port;
	if (ibv_query_port(ctx, 1, &port))
		fail("ibv_query_port", errno);
	if (port.state != IBV_PORT_ACTIVE || port.link_layer != IBV_LINK_LAYER_ETHERNET)
		fail("port not an active RoCE port", EINVAL);
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fail("ibv_query_gid", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	if (!ch)
		fail("ibv_create_comp_channel", errno);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, (void *)0x1234, ch, 0);
	if (!pd || !cq)
		fail("pd/cq", errno);
	char *src = malloc(N), *dst = calloc(1, N);
	for (int i = 0; i < N; i++)
		src[i] = (char)(i * 7 % 251);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, N, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, N, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !dmr)
		fail("ibv_reg_mr", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	if (!a || !b)
		fail("ibv_create_qp", errno);

	/* A post on a QP in RESET is refused with an errno, and nothing completes. */
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = N, .lkey = smr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)dst, .rkey = dmr->rkey },
	}, *bad = NULL;
	int r = ibv_post_send(a, &wr, &bad);
	if (r == 0 || bad != &wr)
		fail("post_send in RESET was accepted", EINVAL);
	printf("post_send in RESET: %s\n", strerror(r));

	to_rts(a, b->qp_num, &gid);
	to_rts(b, a->qp_num, &gid);

	/* Nothing armed, descriptor non-blocking: no event, EAGAIN. */
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) != -1 || errno != EAGAIN)
		fail("ibv_get_cq_event without an event did not fail with EAGAIN", EINVAL);
	if (ibv_req_notify_cq(cq, 0))
		fail("ibv_req_notify_cq", errno);
	r = ibv_post_send(a, &wr, &bad);
	if (r)
		fail("ibv_post_send", r);
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	if (poll(&pfd, 1, 10000) != 1 || !(pfd.revents & POLLIN))
		fail("the completion channel's descriptor did not become readable", ETIMEDOUT);
	if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != cq || ev_ctx != (void *)0x1234)
		fail("ibv_get_cq_event", errno);
	ibv_ack_cq_events(cq, 1);
	printf("completion channel: descriptor readable, event for the CQ\n");
	struct ibv_wc wc = poll_one_or_exit(cq, "loopback_write");
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 1 || wc.opcode != IBV_WC_RDMA_WRITE)
		fail(ibv_wc_status_str(wc.status), EIO);
	if (memcmp(src, dst, N))
		fail("WRITE: the destination buffer differs", EIO);
	printf("RDMA WRITE %d bytes: %s, data identical\n", N, ibv_wc_status_str(wc.status));

	/* An SGE outside every MR: a local protection error completion. */
	struct ibv_sge wild = { .addr = (uintptr_t)src + N, .length = 64, .lkey = smr->lkey };
	wr.wr_id = 2;
	wr.sg_list = &wild;
	r = ibv_post_send(a, &wr, &bad);
	if (r)
		fail("ibv_post_send (bad SGE)", r);
	wc = poll_one_or_exit(cq, "loopback_write");
	if (wc.wr_id != 2 || wc.status != IBV_WC_LOC_PROT_ERR)
		fail("bad SGE did not complete with a local protection error", EIO);
	printf("SGE outside every MR: %s\n", ibv_wc_status_str(wc.status));

	/* CQ overrun: a CQ error event names the CQ. */
	struct ibv_cq *small = ibv_create_cq(ctx, 2, NULL, NULL, 0);
	if (!small)
		fail("ibv_create_cq(2)", errno);
	ia.send_cq = ia.recv_cq = small;
	struct ibv_qp *c = ibv_create_qp(pd, &ia), *d = ibv_create_qp(pd, &ia);
	if (!c || !d)
		fail("ibv_create_qp", errno);
	to_rts(c, d->qp_num, &gid);
	to_rts(d, c->qp_num, &gid);
	sge.length = 64;
	wr.sg_list = &sge;
	for (int i = 0; i < 8; i++) {
		wr.wr_id = 10 + i;
		r = ibv_post_send(c, &wr, &bad);
		if (r)
			fail("ibv_post_send (overrun)", r);
	}
	/* The context's async_fd becomes readable, as event loops that poll() it expect. */
	struct pollfd apfd = { .fd = ctx->async_fd, .events = POLLIN };
	if (poll(&apfd, 1, 10000) != 1 || !(apfd.revents & POLLIN))
		fail("async_fd did not become readable", ETIMEDOUT);
	struct ibv_async_event ev;
	for (;;) {
		if (ibv_get_async_event(ctx, &ev))
			fail("ibv_get_async_event", errno);
		int mine = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small;
		ibv_ack_async_event(&ev);
		if (mine)
			break;
	}
	printf("CQ overrun: async_fd readable, async event %s for the CQ\n",
	       ibv_event_type_str(IBV_EVENT_CQ_ERR));
	ibv_destroy_qp(c);
	ibv_destroy_qp(d);
	ibv_destroy_cq(small);

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_destroy_cq(cq);
	if (ibv_destroy_comp_channel(ch))
		fail("ibv_destroy_comp_channel", errno);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(src);
	free(dst);
	printf("ok\n");
	return 0;
}
