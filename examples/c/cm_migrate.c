/*
 * cm_migrate.c — rdma_migrate_id as librdmacm programs use it: moving a CM id's events to
 * another event channel (a thread per channel, say), or making it synchronous.
 *
 *   server: cm_migrate -s            listens on port 7471 on event channel 1; once the
 *           client's CONNECT_REQUEST waits there, moves the listener to channel 2: the
 *           request must come from channel 2 (channel 1, non-blocking, has nothing: EAGAIN),
 *           and so must the accepted id's ESTABLISHED. It then moves the connected id back to
 *           channel 1 and waits there for DISCONNECTED.
 *   client: cm_migrate -c ADDR       resolves on an asynchronous channel, then makes the id
 *           synchronous (rdma_migrate_id with a NULL channel): rdma_connect returns once the
 *           connection is established; then disconnects.
 *
 * Built against the system's <rdma/rdma_cma.h> with -lrdmacm -libverbs; prints one line per
 * check and "ok" when every check passed (exit 0).
 */
#include <rdma/rdma_cma.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
	fprintf(stderr, "cm_migrate: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "cm_migrate: check failed: %s\n", what);
		exit(1);
	}
}

static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		die("rdma_get_cm_event");
	if (e->event != want) {
		fprintf(stderr, "cm_migrate: %s (status %d), %s expected\n", rdma_event_str(e->event),
			e->status, rdma_event_str(want));
		exit(1);
	}
	return e;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	if (rdma_create_qp(id, NULL, &a))
		die("rdma_create_qp");
}

static int server(void)
{
	struct rdma_event_channel *ch1 = rdma_create_event_channel();
	struct rdma_event_channel *ch2 = rdma_create_event_channel();
	struct rdma_cm_id *l, *id;
	struct rdma_cm_event *e;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(7471) };
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	if (!ch1 || !ch2)
		die("rdma_create_event_channel");
	if (rdma_create_id(ch1, &l, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(l, (struct sockaddr *)&sin) || rdma_listen(l, 1))
		die("bind/listen");
	struct pollfd p = { .fd = ch1->fd, .events = POLLIN };
	check(poll(&p, 1, 20000) == 1, "the CONNECT_REQUEST waits on channel 1");
	if (rdma_migrate_id(l, ch2))
		die("rdma_migrate_id(listener, channel 2)");
	check(l->channel == ch2, "the listener's channel is channel 2");
	fcntl(ch1->fd, F_SETFL, fcntl(ch1->fd, F_GETFL) | O_NONBLOCK);
	check(rdma_get_cm_event(ch1, &e) == -1 && errno == EAGAIN, "channel 1 is empty (EAGAIN)");
	printf("waiting CONNECT_REQUEST moved: channel 1 empty\n");
	e = next(ch2, RDMA_CM_EVENT_CONNECT_REQUEST);
	check(e->listen_id == l, "the request names the listener");
	id = e->id;
	rdma_ack_cm_event(e);
	printf("CONNECT_REQUEST on channel 2\n");
	make_qp(id);
	if (rdma_accept(id, &cp))
		die("rdma_accept");
	rdma_ack_cm_event(next(ch2, RDMA_CM_EVENT_ESTABLISHED));
	printf("ESTABLISHED on channel 2\n");
	if (rdma_migrate_id(id, ch1))
		die("rdma_migrate_id(connection, channel 1)");
	check(id->channel == ch1, "the connection's channel is channel 1");
	fcntl(ch1->fd, F_SETFL, fcntl(ch1->fd, F_GETFL) & ~O_NONBLOCK);
	rdma_ack_cm_event(next(ch1, RDMA_CM_EVENT_DISCONNECTED));
	printf("DISCONNECTED on channel 1\n");
	rdma_disconnect(id);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(ch1);
	rdma_destroy_event_channel(ch2);
	return 0;
}

static int client(const char *host)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct addrinfo *ai;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7, .rnr_retry_count = 7 };
	if (!ch)
		die("rdma_create_event_channel");
	if (getaddrinfo(host, "7471", NULL, &ai))
		die("getaddrinfo");
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	if (rdma_migrate_id(id, NULL))
		die("rdma_migrate_id(id, NULL)");
	check(id->channel && id->channel != ch, "the id has a channel of its own");
	printf("synchronous on a channel of its own\n");
	make_qp(id);
	if (rdma_connect(id, &cp))
		die("rdma_connect (synchronous)");
	printf("rdma_connect returned established\n");
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	struct rdma_cm_event *e;
	check(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN, "nothing on the old channel");
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	freeaddrinfo(ai);
	return 0;
}

int main(int argc, char **argv)
{
	int r;
	if (argc == 2 && !strcmp(argv[1], "-s"))
		r = server();
	else if (argc == 3 && !strcmp(argv[1], "-c"))
		r = client(argv[2]);
	else {
		fprintf(stderr, "usage: cm_migrate -s | cm_migrate -c ADDR\n");
		return 2;
	}
	if (!r)
		printf("ok\n");
	return r;
}
