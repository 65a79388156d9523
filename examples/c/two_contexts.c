/*
 * two_contexts.c — one process opens the device twice. Each context has its own PD, CQ and
 * RC QP; the QP of the first is connected to the QP of the second. An RDMA WRITE goes from
 * the first context's memory into the second's, a SEND the other way, each checked. Then a CQ
 * of the first context overruns: the asynchronous event goes to that context only (its
 * async_fd becomes readable and ibv_get_async_event reports IBV_EVENT_CQ_ERR naming the CQ;
 * the second context's async_fd stays unreadable and a non-blocking ibv_get_async_event on it
 * finds nothing), as the kernel's uverbs delivers an event on the file of the context that
 * made the object. A CQ of the second context overruns next: its event is the second
 * context's only. Last, the first context is closed and the second keeps working (a WRITE
 * between two QPs of its own).
 *
 *   ferroce run -- ./two_contexts      prints "ok" and exits 0 when every check passes.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rc_connect.h"

#define N 4096

static int fail(const char *what, int e)
{
	fprintf(stderr, "two_contexts: %s: %s\n", what, strerror(e));
	exit(1);
}

static void to_rts(struct ibv_qp *qp, uint32_t dest_qpn, union ibv_gid *gid)
{
	int e;
	const char *step = rc_to_rts(qp, dest_qpn, gid, IBV_ACCESS_REMOTE_WRITE, 7, &e);
	if (step)
		fail(step, e);
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char *buf;
	struct ibv_mr *mr;
};

static void open_side(struct ibv_device *dev, struct side *s, char fill)
{
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		fail("ibv_open_device", errno);
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
	if (!s->pd || !s->cq)
		fail("pd/cq", errno);
	s->buf = malloc(N);
	memset(s->buf, fill, N);
	s->mr = ibv_reg_mr(s->pd, s->buf, N, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!s->mr)
		fail("ibv_reg_mr", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	s->qp = ibv_create_qp(s->pd, &ia);
	if (!s->qp)
		fail("ibv_create_qp", errno);
}

static void write_to(struct ibv_qp *qp, struct ibv_cq *cq, char *src, uint32_t lkey, char *dst,
		     uint32_t rkey, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = N, .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)dst, .rkey = rkey },
	}, *bad;
	int r = ibv_post_send(qp, &wr, &bad);
	if (r)
		fail("ibv_post_send (WRITE)", r);
	struct ibv_wc wc = poll_one_or_exit(cq, "two_contexts");
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != id)
		fail(ibv_wc_status_str(wc.status), EIO);
	if (memcmp(src, dst, N))
		fail("WRITE: the destination differs", EIO);
}

/* Wait until the context's async_fd is readable, then read its events without blocking until
 * there are none: at least one CQ error naming `cq` (the overrun), and otherwise only QP
 * errors naming `c` or `d` (the QPs that completed into it). */
static void expect_cq_err(struct ibv_context *ctx, struct ibv_cq *cq, struct ibv_qp *c,
			  struct ibv_qp *d, const char *which)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	if (poll(&p, 1, 10000) != 1 || !(p.revents & POLLIN))
		fail(which, ETIMEDOUT);
	int n = 0;
	struct ibv_async_event ev;
	while (ibv_get_async_event(ctx, &ev) == 0) {
		int t = ev.event_type;
		if (t == IBV_EVENT_CQ_ERR && ev.element.cq == cq) {
			n++;
		} else if (t == IBV_EVENT_CQ_ERR ||
			   (ev.element.qp != c && ev.element.qp != d)) {
			fprintf(stderr, "two_contexts: %s: %s about another object\n", which,
				ibv_event_type_str(ev.event_type));
			exit(1);
		}
		ibv_ack_async_event(&ev);
	}
	if (errno != EAGAIN)
		fail("ibv_get_async_event", errno);
	if (n == 0)
		fail(which, ENOENT);
}

/* The context has no event: ibv_get_async_event finds none and, with `fd_too`, its async_fd is
 * not readable. (Without: events queued for an object destroyed since make the descriptor
 * readable and are dropped when read.) */
static void expect_no_event(struct ibv_context *ctx, const char *which, int fd_too)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	if (fd_too && poll(&p, 1, 0) != 0) {
		fprintf(stderr, "two_contexts: %s: async_fd readable\n", which);
		exit(1);
	}
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev) == 0) {
		fprintf(stderr, "two_contexts: %s: event %d (%s)\n", which, ev.event_type,
			ibv_event_type_str(ev.event_type));
		exit(1);
	}
	if (errno != EAGAIN)
		fail("ibv_get_async_event", errno);
}

static void nonblocking(int fd)
{
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
		fail("fcntl", errno);
}

/* A CQ of two entries in `s`'s context and two connected QPs on it; eight signalled WRITEs
 * overrun it. Returns the CQ (the QPs are left in *c and *d). */
static struct ibv_cq *overrun(struct side *s, union ibv_gid *gid, struct ibv_qp **c,
			      struct ibv_qp **d)
{
	struct ibv_cq *small = ibv_create_cq(s->ctx, 2, NULL, NULL, 0);
	if (!small)
		fail("ibv_create_cq(2)", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = small, .recv_cq = small, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	*c = ibv_create_qp(s->pd, &ia);
	*d = ibv_create_qp(s->pd, &ia);
	if (!*c || !*d)
		fail("ibv_create_qp", errno);
	to_rts(*c, (*d)->qp_num, gid);
	to_rts(*d, (*c)->qp_num, gid);
	struct ibv_sge sg = { .addr = (uintptr_t)s->buf, .length = 64, .lkey = s->mr->lkey };
	struct ibv_send_wr ow = { .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)s->buf + 64,
					       .rkey = s->mr->rkey } }, *obad;
	for (int i = 0; i < 8; i++) {
		ow.wr_id = 10 + i;
		int r = ibv_post_send(*c, &ow, &obad);
		if (r)
			fail("ibv_post_send (overrun)", r);
	}
	return small;
}

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num < 1)
		fail("no device", ENODEV);
	struct side a, b;
	open_side(list[0], &a, 'a');
	open_side(list[0], &b, 'b');
	if (a.ctx == b.ctx || a.ctx->async_fd == b.ctx->async_fd)
		fail("the two contexts are not distinct", EINVAL);
	union ibv_gid gid;
	if (ibv_query_gid(b.ctx, 1, 0, &gid))
		fail("ibv_query_gid", errno);
	to_rts(a.qp, b.qp->qp_num, &gid);
	to_rts(b.qp, a.qp->qp_num, &gid);

	/* WRITE: the first context's memory into the second's. */
	write_to(a.qp, a.cq, a.buf, a.mr->lkey, b.buf, b.mr->rkey, 1);
	printf("WRITE context 1 -> context 2: data identical\n");

	/* SEND the other way, received into the first context's buffer. */
	memset(b.buf, 'B', N);
	struct ibv_sge rs = { .addr = (uintptr_t)a.buf, .length = N, .lkey = a.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	if (ibv_post_recv(a.qp, &rw, &rbad))
		fail("ibv_post_recv", errno);
	struct ibv_sge ss = { .addr = (uintptr_t)b.buf, .length = N, .lkey = b.mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 3, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;
	int r = ibv_post_send(b.qp, &sw, &sbad);
	if (r)
		fail("ibv_post_send (SEND)", r);
	struct ibv_wc wc = poll_one_or_exit(b.cq, "two_contexts");
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 3)
		fail("SEND completion", EIO);
	wc = poll_one_or_exit(a.cq, "two_contexts");
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 2 || wc.opcode != IBV_WC_RECV ||
	    wc.byte_len != N || memcmp(a.buf, b.buf, N))
		fail("RECV completion or data", EIO);
	printf("SEND context 2 -> context 1: data identical\n");

	/* A CQ of the first context overruns: its event goes to the first context only. */
	nonblocking(a.ctx->async_fd);
	nonblocking(b.ctx->async_fd);
	struct ibv_qp *c, *d;
	struct ibv_cq *small = overrun(&a, &gid, &c, &d);
	expect_cq_err(a.ctx, small, c, d, "context 1's CQ overrun, on context 1");
	expect_no_event(b.ctx, "context 1's CQ overrun, on context 2", 1);
	printf("CQ overrun in context 1: IBV_EVENT_CQ_ERR on context 1 only\n");

	/* Then one of the second context's: its event goes to the second context only. */
	struct ibv_qp *c2, *d2;
	struct ibv_cq *small2 = overrun(&b, &gid, &c2, &d2);
	expect_cq_err(b.ctx, small2, c2, d2, "context 2's CQ overrun, on context 2");
	printf("CQ overrun in context 2: IBV_EVENT_CQ_ERR on context 2\n");
	ibv_destroy_qp(c2);
	ibv_destroy_qp(d2);
	ibv_destroy_cq(small2);
	ibv_destroy_qp(c);
	ibv_destroy_qp(d);
	ibv_destroy_cq(small);
	/* Nothing of either overrun reached the other context. */
	expect_no_event(a.ctx, "after both overruns, on context 1", 0);
	expect_no_event(b.ctx, "after both overruns, on context 2", 0);

	/* Close the first context; the second still works. */
	ibv_destroy_qp(a.qp);
	ibv_dereg_mr(a.mr);
	ibv_destroy_cq(a.cq);
	ibv_dealloc_pd(a.pd);
	if (ibv_close_device(a.ctx))
		fail("ibv_close_device", errno);
	struct ibv_qp_init_attr ib = {
		.send_cq = b.cq, .recv_cq = b.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *e = ibv_create_qp(b.pd, &ib);
	if (!e)
		fail("ibv_create_qp", errno);
	ibv_destroy_qp(b.qp);
	b.qp = ibv_create_qp(b.pd, &ib);
	if (!b.qp)
		fail("ibv_create_qp", errno);
	to_rts(e, b.qp->qp_num, &gid);
	to_rts(b.qp, e->qp_num, &gid);
	char *dst = calloc(1, N);
	struct ibv_mr *dmr = ibv_reg_mr(b.pd, dst, N, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!dmr)
		fail("ibv_reg_mr", errno);
	memset(b.buf, 'z', N);
	write_to(e, b.cq, b.buf, b.mr->lkey, dst, dmr->rkey, 20);
	printf("context 1 closed: WRITE within context 2: data identical\n");
	ibv_destroy_qp(e);
	ibv_destroy_qp(b.qp);
	ibv_dereg_mr(dmr);
	ibv_dereg_mr(b.mr);
	ibv_destroy_cq(b.cq);
	ibv_dealloc_pd(b.pd);
	ibv_close_device(b.ctx);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
