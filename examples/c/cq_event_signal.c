/*
 * cq_event_signal.c — what a signal does to a thread blocked in ibv_get_cq_event, as with
 * rdma-core (whose ibv_get_cq_event is a read() of the channel's descriptor):
 *   - a SIGALRM handler installed without SA_RESTART interrupts the wait: -1 with EINTR
 *     (qperf ends its tests this way);
 *   - a handler installed with SA_RESTART does not: the handler runs, the wait goes on and
 *     returns the completion event that comes later (a thread posts a WRITE 300 ms on).
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./cq_event_signal
 * Prints "ok" and exits 0 when every check passes.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "rc_connect.h"

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static int fail(const char *what, int e)
{
	fprintf(stderr, "cq_event_signal: %s: %s\n", what, strerror(e));
	exit(1);
}

static void alarm_in_ms(int ms, int flags)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, NULL))
		fail("sigaction", errno);
	struct itimerval t = { .it_value = { .tv_sec = 0, .tv_usec = ms * 1000 } };
	if (setitimer(ITIMER_REAL, &t, NULL))
		fail("setitimer", errno);
}

static void to_rts(struct ibv_qp *qp, uint32_t dest_qpn, union ibv_gid *gid)
{
	int e;
	const char *step = rc_to_rts(qp, dest_qpn, gid, IBV_ACCESS_REMOTE_WRITE, 7, &e);
	if (step)
		fail(step, e);
}

static struct ibv_qp *qa;
static struct ibv_send_wr wr;

static void *post_later(void *arg)
{
	struct ibv_send_wr *bad;
	(void)arg;
	usleep(300 * 1000);
	int r = ibv_post_send(qa, &wr, &bad);
	if (r)
		fail("ibv_post_send", r);
	return NULL;
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
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
	if (!pd || !cq)
		fail("pd/channel/cq", errno);
	static char src[64], dst[64];
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof(dst),
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !dmr)
		fail("ibv_reg_mr", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qa = ibv_create_qp(pd, &ia);
	struct ibv_qp *qb = ibv_create_qp(pd, &ia);
	if (!qa || !qb)
		fail("ibv_create_qp", errno);
	to_rts(qa, qb->qp_num, &gid);
	to_rts(qb, qa->qp_num, &gid);
	if (ibv_req_notify_cq(cq, 0))
		fail("ibv_req_notify_cq", errno);

	/* Without SA_RESTART: the handler interrupts the wait. */
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	alarm_in_ms(100, 0);
	int r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	if (r != -1 || errno != EINTR || alarms != 1)
		fail("a handler without SA_RESTART did not interrupt ibv_get_cq_event", EINVAL);
	printf("without SA_RESTART: ibv_get_cq_event -1, %s\n", strerror(EINTR));

	/* With SA_RESTART: the handler runs (at 100 ms), the wait goes on to the event (300). */
	static struct ibv_sge sge;
	sge = (struct ibv_sge){ .addr = (uintptr_t)src, .length = sizeof(src), .lkey = smr->lkey };
	wr = (struct ibv_send_wr){
		.wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)dst, .rkey = dmr->rkey },
	};
	pthread_t t;
	if (pthread_create(&t, NULL, post_later, NULL))
		fail("pthread_create", errno);
	alarm_in_ms(100, SA_RESTART);
	r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	if (r != 0 || ev_cq != cq)
		fail("ibv_get_cq_event with an SA_RESTART handler", errno);
	if (alarms != 2)
		fail("the SA_RESTART handler did not run during the wait", EINVAL);
	ibv_ack_cq_events(cq, 1);
	pthread_join(t, NULL);
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != 9)
		fail("the WRITE's completion", EIO);
	printf("with SA_RESTART: the handler ran, the wait returned the completion event\n");

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
