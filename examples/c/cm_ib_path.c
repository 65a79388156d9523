/*
 * cm_ib_path.c — RDMA_OPTION_IB_PATH: a route given as a path record (what ibacm or an SA
 * hands a program) instead of rdma_resolve_route, as the kernel's RDMA-CM takes it: an array
 * of struct ibv_path_data whose primary bidirectional GMP entry becomes the id's route, only
 * once its address is resolved, followed by ROUTE_RESOLVED. Then the id connects over that
 * route to a listener of the same process (traffic class 0x28 from the path: DSCP 10 on the
 * connection's packets, which the test reads in the capture).
 *
 *   cm_ib_path ADDR   prints one line per step and "ok" (exit 0).
 *
 * Built against the system's <rdma/rdma_cma.h> and <infiniband/sa.h> with -lrdmacm -libverbs.
 */
#include <rdma/rdma_cma.h>
#include <infiniband/sa.h>
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct rdma_event_channel *ch;

static void die(const char *what)
{
	fprintf(stderr, "cm_ib_path: %s: %s\n", what, strerror(errno));
	exit(1);
}

static struct rdma_cm_event *expect(enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		die("rdma_get_cm_event");
	if (e->event != want) {
		fprintf(stderr, "cm_ib_path: %s (status %d), %s expected\n",
			rdma_event_str(e->event), e->status, rdma_event_str(want));
		exit(1);
	}
	return e;
}

static void must_fail(struct rdma_cm_id *id, void *p, size_t len, const char *what)
{
	if (rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, p, len) == 0 ||
	    errno != EINVAL) {
		fprintf(stderr, "cm_ib_path: %s: not EINVAL (%s)\n", what, strerror(errno));
		exit(1);
	}
	printf("%s: EINVAL\n", what);
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	if (rdma_create_qp(id, NULL, &a))
		die("rdma_create_qp");
}

int main(int argc, char **argv)
{
	struct rdma_cm_id *id, *listen;
	struct rdma_cm_event *e;
	struct addrinfo *ai;

	if (argc != 2) {
		fprintf(stderr, "usage: cm_ib_path ADDR\n");
		return 2;
	}
	if (getaddrinfo(argv[1], "7481", NULL, &ai))
		die("getaddrinfo");
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) ||
	    rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(listen, ai->ai_addr) || rdma_listen(listen, 4))
		die("rdma_bind_addr / rdma_listen");

	struct ibv_path_data pd[2];
	memset(pd, 0, sizeof pd);
	must_fail(id, pd, sizeof pd[0], "before the address is resolved");
	if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ADDR_RESOLVED));

	/* An alternate path first, then the primary bidirectional one. */
	pd[0].flags = IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_ALTERNATE | IBV_PATH_FLAG_BIDIRECTIONAL;
	struct ibv_path_record *p = &pd[1].path;
	pd[1].flags = IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL;
	p->sgid = id->route.addr.addr.ibaddr.sgid;
	p->dgid = id->route.addr.addr.ibaddr.dgid;
	p->flowlabel_hoplimit = htobe32(0x12345 << 8 | 64);
	p->tclass = 0x28;
	p->reversible_numpath = 0x81;
	p->pkey = htobe16(0xffff);
	p->mtu = 2 << 6 | IBV_MTU_1024;
	must_fail(id, pd, sizeof pd - 1, "a length not a multiple of struct ibv_path_data");
	must_fail(id, pd, sizeof pd[0], "no primary bidirectional path");
	if (rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, pd, sizeof pd))
		die("rdma_set_option(RDMA_OPTION_IB_PATH)");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_sa_path_rec *r = id->route.path_rec;
	if (id->route.num_paths != 1 || !r || r->traffic_class != 0x28 || r->hop_limit != 64 ||
	    be32toh(r->flow_label) != 0x12345 || r->mtu != IBV_MTU_1024) {
		fprintf(stderr, "cm_ib_path: route %d paths, tclass %#x, hop limit %u, flow label "
				"%#x, mtu %u\n",
			id->route.num_paths, r ? r->traffic_class : 0, r ? r->hop_limit : 0,
			r ? be32toh(r->flow_label) : 0, r ? r->mtu : 0);
		return 1;
	}
	printf("ROUTE_RESOLVED with the path's traffic class, hop limit, flow label and MTU\n");
	must_fail(id, pd, sizeof pd, "the route already resolved");

	/* Connect over it to the listener of this process. */
	make_qp(id);
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7, .rnr_retry_count = 7 };
	if (rdma_connect(id, &cp))
		die("rdma_connect");
	e = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *child = e->id;
	rdma_ack_cm_event(e);
	make_qp(child);
	if (rdma_accept(child, &cp))
		die("rdma_accept");
	int est = 0;
	while (est < 2) {
		if (rdma_get_cm_event(ch, &e))
			die("rdma_get_cm_event");
		if (e->event == RDMA_CM_EVENT_ESTABLISHED) {
			est++;
		} else if (e->event != RDMA_CM_EVENT_CONNECT_RESPONSE) {
			fprintf(stderr, "cm_ib_path: %s\n", rdma_event_str(e->event));
			return 1;
		}
		rdma_ack_cm_event(e);
	}
	printf("connected over the given route\n");
	rdma_disconnect(id);
	int disc = 0;
	while (disc < 2) {
		if (rdma_get_cm_event(ch, &e))
			die("rdma_get_cm_event");
		if (e->event == RDMA_CM_EVENT_DISCONNECTED) {
			disc++;
			/* The passive side answers the DREQ (DREP), as with the kernel's CM. */
			if (e->id == child)
				rdma_disconnect(child);
		}
		rdma_ack_cm_event(e);
	}
	rdma_destroy_qp(child);
	rdma_destroy_qp(id);
	rdma_destroy_id(child);
	rdma_destroy_id(id);
	rdma_destroy_id(listen);
	rdma_destroy_event_channel(ch);
	freeaddrinfo(ai);
	printf("ok\n");
	return 0;
}
