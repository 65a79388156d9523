/*
 * cm_teardown.c — the end of a program like rping: a thread of its own reads RDMA-CM events
 * (and handles each before acknowledging it) while the main thread destroys the id and the
 * event channel and returns, the event thread still waiting in rdma_get_cm_event.
 *
 * librdmacm's contract, which rping counts on:
 *   - rdma_destroy_id returns only after every event reported for the id was acknowledged
 *     (the event handler may still use the id and its context until then);
 *   - rdma_destroy_event_channel while another thread waits in rdma_get_cm_event on it
 *     leaves that thread waiting (with the kernel's CM it sleeps in the kernel): nothing it
 *     touches is freed under it, and the process exits normally.
 * Before, ferroce's library freed the channel under the waiting thread, which read it again
 * within 100 ms: rping's client died of SIGSEGV after its last ping when the machine was
 * loaded enough for the process to outlive that 100 ms.
 *
 *   - calls naming an id or an event channel the program already destroyed (perftest's
 *     retry after a REJ does both, then destroys the channel a second time) fail with
 *     EINVAL instead of reading freed memory;
 *   - rdma_get_cm_event never touches a QP the program destroyed itself with ibv_destroy_qp
 *     while the id still names it (rping destroys its QP so, and its CM thread may be
 *     reading DISCONNECTED at that moment).
 *
 *   cm_teardown ADDR   first, on one id: resolves ADDR (an address of the namespace), creates
 *                      its QP, destroys the QP with ibv_destroy_qp and resolves the route
 *                      (an event on an id whose qp the program freed). Then, on another id
 *                      whose events a thread reads, resolves ADDR again; the thread takes ADDR_RESOLVED, holds it 300 ms, then
 *                      acknowledges it and waits for the next event. The main thread calls
 *                      rdma_destroy_id while the event is held, then destroys the channel,
 *                      churns the heap for a second (reusing what was freed) and returns.
 *
 * Built against the system's <rdma/rdma_cma.h> with -lrdmacm -libverbs; prints one line per
 * step and "ok" at the end (exit 0).
 */
#include <rdma/rdma_cma.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct rdma_event_channel *ch;
static atomic_int got, acked, second_call;

static void die(const char *what)
{
	fprintf(stderr, "cm_teardown: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void *events(void *arg)
{
	struct rdma_event_channel *c = arg;
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(c, &e))
		die("rdma_get_cm_event");
	printf("thread: %s\n", rdma_event_str(e->event));
	fflush(stdout);
	atomic_store(&got, 1);
	usleep(300000);
	/* The handler still uses the id: its context must be what the program gave. */
	if (e->id->context != (void *)0x5eed) {
		fprintf(stderr, "cm_teardown: the event's id has context %p\n", e->id->context);
		exit(1);
	}
	atomic_store(&acked, 1);
	rdma_ack_cm_event(e);
	atomic_store(&second_call, 1);
	/* Waits until the process exits (nothing else comes to this channel). */
	if (rdma_get_cm_event(c, &e) == 0) {
		fprintf(stderr, "cm_teardown: an event after the channel was destroyed\n");
		exit(1);
	}
	fprintf(stderr, "cm_teardown: rdma_get_cm_event on a destroyed channel returned: %s\n",
		strerror(errno));
	exit(1);
}

/* The next event, which must be `want` on `id`. */
static void expect(struct rdma_cm_id *id, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		die("rdma_get_cm_event");
	if (e->event != want || e->id != id) {
		fprintf(stderr, "cm_teardown: %s (status %d), %s expected\n", rdma_event_str(e->event),
			e->status, rdma_event_str(want));
		exit(1);
	}
	rdma_ack_cm_event(e);
}

int main(int argc, char **argv)
{
	struct rdma_cm_id *id, *id0;
	struct addrinfo *ai;
	pthread_t t;

	if (argc != 2) {
		fprintf(stderr, "usage: cm_teardown ADDR\n");
		return 2;
	}
	if (getaddrinfo(argv[1], "7479", NULL, &ai))
		die("getaddrinfo");
	ch = rdma_create_event_channel();
	if (!ch)
		die("rdma_create_event_channel");

	if (rdma_create_id(ch, &id0, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id0, NULL, ai->ai_addr, 2000))
		die("rdma_resolve_addr");
	expect(id0, RDMA_CM_EVENT_ADDR_RESOLVED);
	struct ibv_pd *pd = ibv_alloc_pd(id0->verbs);
	struct ibv_cq *cq = pd ? ibv_create_cq(id0->verbs, 4, NULL, NULL, 0) : NULL;
	if (!cq)
		die("ibv_alloc_pd / ibv_create_cq");
	struct ibv_qp_init_attr qa = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	if (rdma_create_qp(id0, pd, &qa))
		die("rdma_create_qp");
	if (ibv_destroy_qp(id0->qp))
		die("ibv_destroy_qp");
	if (rdma_resolve_route(id0, 2000))
		die("rdma_resolve_route");
	expect(id0, RDMA_CM_EVENT_ROUTE_RESOLVED);
	printf("ROUTE_RESOLVED after ibv_destroy_qp of the id's QP\n");
	if (rdma_destroy_id(id0))
		die("rdma_destroy_id");
	/* perftest's retry after a REJ resolves ids it destroyed: an error, never a crash. */
	if (rdma_resolve_addr(id0, NULL, ai->ai_addr, 2000) == 0 || errno != EINVAL ||
	    rdma_destroy_id(id0) == 0 || errno != EINVAL) {
		fprintf(stderr, "cm_teardown: a destroyed id was not refused (%s)\n", strerror(errno));
		return 1;
	}
	printf("a destroyed id: EINVAL\n");
	/* ... and then destroys the event channel that its retry already destroyed: the second
	 * destroy and any use of the channel are refused (errno EINVAL), never followed. */
	{
		struct rdma_event_channel *gone = rdma_create_event_channel();
		struct rdma_cm_event *e = NULL;
		struct rdma_cm_id *nid = NULL;
		if (!gone)
			die("rdma_create_event_channel");
		rdma_destroy_event_channel(gone);
		errno = 0;
		rdma_destroy_event_channel(gone);
		if (errno != EINVAL || rdma_get_cm_event(gone, &e) == 0 || errno != EINVAL ||
		    rdma_create_id(gone, &nid, NULL, RDMA_PS_TCP) == 0 || errno != EINVAL) {
			fprintf(stderr, "cm_teardown: a destroyed channel was not refused (%s)\n",
				strerror(errno));
			return 1;
		}
	}
	printf("a destroyed channel: EINVAL\n");
	if (ibv_destroy_cq(cq) || ibv_dealloc_pd(pd))
		die("ibv_destroy_cq / ibv_dealloc_pd");

	if (rdma_create_id(ch, &id, (void *)0x5eed, RDMA_PS_TCP))
		die("rdma_create_id");
	if (pthread_create(&t, NULL, events, ch))
		die("pthread_create");
	if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000))
		die("rdma_resolve_addr");
	while (!atomic_load(&got))
		usleep(1000);
	if (rdma_destroy_id(id))
		die("rdma_destroy_id");
	if (!atomic_load(&acked)) {
		fprintf(stderr, "cm_teardown: rdma_destroy_id returned before the event was "
				"acknowledged\n");
		return 1;
	}
	printf("rdma_destroy_id waited for the acknowledgement\n");
	while (!atomic_load(&second_call))
		usleep(1000);
	usleep(50000);
	rdma_destroy_event_channel(ch);
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
		for (int i = 0; i < 64; i++)
			free(p[i]);
		for (int i = 0; i < 64; i++) {
			p[i] = malloc(8 + 8 * i);
			memset(p[i], 0xa5, 8 + 8 * i);
		}
		usleep(1000);
		for (int i = 0; i < 64; i++)
			free(p[i]);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) < 1000000000L);
	freeaddrinfo(ai);
	printf("ok\n");
	return 0;
}
