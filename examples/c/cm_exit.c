/*
 * cm_exit.c — a librdmacm server that exits with its connections in every state the kernel's
 * RDMA-CM cleans up after a process: ucma's close destroys each id, which disconnects an
 * established connection (DREQ) and answers a DREQ that came (DREP). A CM inside the process
 * must do the same before the process is gone, or the peer waits for its DREQ's retries.
 *
 *   server: cm_exit -s      listens on port 7472, accepts two connections (A, then B). Then
 *           it waits for DISCONNECTED on B (the client's DREQ has come) and returns from
 *           main without rdma_disconnect or rdma_destroy_id on either: B's DREQ is
 *           unanswered, A is still established.
 *   server: cm_exit -s -x   the same, but right after both are established it calls
 *           rdma_disconnect(A) and returns at once, while the client's DREQ for B may be
 *           on its way (perftest's teardown: both ends disconnect at the same time, on two
 *           different connections, and the server exits first).
 *   client: cm_exit -c ADDR connects A, then B, disconnects B and waits until both A and B
 *           are DISCONNECTED (B's DREQ answered or crossed by the server's, A's DREQ from
 *           the server's exit), then destroys everything.
 *   server: cm_exit -s -a   accepts one connection, posts a receive, and returns from main
 *           as soon as the client's SEND has completed it: the ACK for that SEND may still be
 *           held back by the library (FERROCE_ACK_DELAY_US) and must leave at exit.
 *   client: cm_exit -c -a ADDR  connects, sends one message and prints the status of its
 *           send completion (success: the server's ACK came), then waits for DISCONNECTED.
 *
 * Built against the system's <rdma/rdma_cma.h> with -lrdmacm -libverbs; prints one line per
 * step and "ok" at the end (exit 0).
 */
#include <rdma/rdma_cma.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
	fprintf(stderr, "cm_exit: %s: %s\n", what, strerror(errno));
	exit(1);
}

static struct rdma_cm_event *get(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		die("rdma_get_cm_event");
	return e;
}

static void expect(struct rdma_event_channel *ch, struct rdma_cm_id *id,
		   enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e = get(ch);
	if (e->event != want || e->id != id) {
		fprintf(stderr, "cm_exit: %s (status %d), %s expected\n", rdma_event_str(e->event),
			e->status, rdma_event_str(want));
		exit(1);
	}
	rdma_ack_cm_event(e);
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

static int server(int at_once)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l, *conn[2] = { NULL, NULL };
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(7472) };
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	int requests = 0, established = 0;
	if (!ch)
		die("rdma_create_event_channel");
	if (rdma_create_id(ch, &l, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(l, (struct sockaddr *)&sin) || rdma_listen(l, 2))
		die("bind/listen");
	while (established < 2) {
		struct rdma_cm_event *e = get(ch);
		if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST && requests < 2) {
			conn[requests++] = e->id;
			make_qp(e->id);
			if (rdma_accept(e->id, &cp))
				die("rdma_accept");
		} else if (e->event == RDMA_CM_EVENT_ESTABLISHED) {
			established++;
		} else {
			fprintf(stderr, "cm_exit: server: %s (status %d)\n", rdma_event_str(e->event),
				e->status);
			exit(1);
		}
		rdma_ack_cm_event(e);
	}
	printf("server: A and B established\n");
	if (at_once) {
		if (rdma_disconnect(conn[0]))
			die("rdma_disconnect(A)");
		printf("server: disconnected A, exiting\n");
		return 0;
	}
	expect(ch, conn[1], RDMA_CM_EVENT_DISCONNECTED);
	printf("server: DISCONNECTED on B, exiting without answering it and with A up\n");
	return 0;
}

static struct rdma_cm_id *connect_to(struct rdma_event_channel *ch, struct addrinfo *ai)
{
	struct rdma_cm_id *id;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7 };
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000))
		die("rdma_resolve_addr");
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	expect(ch, id, RDMA_CM_EVENT_ROUTE_RESOLVED);
	make_qp(id);
	if (rdma_connect(id, &cp))
		die("rdma_connect");
	expect(ch, id, RDMA_CM_EVENT_ESTABLISHED);
	return id;
}

static int server_ack(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l, *id = NULL;
	struct rdma_cm_event *e;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(7472) };
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	static char buf[64];
	struct ibv_mr *mr;
	struct ibv_wc wc;
	int n;
	if (!ch)
		die("rdma_create_event_channel");
	if (rdma_create_id(ch, &l, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(l, (struct sockaddr *)&sin) || rdma_listen(l, 1))
		die("bind/listen");
	e = get(ch);
	if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		die("CONNECT_REQUEST expected");
	id = e->id;
	rdma_ack_cm_event(e);
	make_qp(id);
	mr = ibv_reg_mr(id->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof buf, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(id->qp, &wr, &bad))
		die("ibv_post_recv");
	if (rdma_accept(id, &cp))
		die("rdma_accept");
	expect(ch, id, RDMA_CM_EVENT_ESTABLISHED);
	while ((n = ibv_poll_cq(id->recv_cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "cm_exit: server: receive %d status %d\n", n, n > 0 ? wc.status : 0);
		exit(1);
	}
	printf("server: received \"%s\", exiting with the QP and the connection up\n", buf);
	return 0;
}

static int client_ack(const char *addr)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct addrinfo hints = { .ai_family = AF_INET }, *ai;
	static char msg[64] = "the last message";
	struct rdma_cm_id *id;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	int n;
	if (!ch)
		die("rdma_create_event_channel");
	if (getaddrinfo(addr, "7472", &hints, &ai))
		die("getaddrinfo");
	id = connect_to(ch, ai);
	mr = ibv_reg_mr(id->pd, msg, sizeof msg, 0);
	if (!mr)
		die("ibv_reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)msg, .length = sizeof msg, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (ibv_post_send(id->qp, &wr, &bad))
		die("ibv_post_send");
	while ((n = ibv_poll_cq(id->send_cq, 1, &wc)) == 0)
		;
	if (n < 0)
		die("ibv_poll_cq");
	printf("client: send completion %s\n", ibv_wc_status_str(wc.status));
	expect(ch, id, RDMA_CM_EVENT_DISCONNECTED);
	printf("client: DISCONNECTED\n");
	rdma_destroy_qp(id);
	ibv_dereg_mr(mr);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	freeaddrinfo(ai);
	printf("ok\n");
	return 0;
}

static int client(const char *addr)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct addrinfo hints = { .ai_family = AF_INET }, *ai;
	struct rdma_cm_id *a, *b;
	int down_a = 0, down_b = 0;
	if (!ch)
		die("rdma_create_event_channel");
	if (getaddrinfo(addr, "7472", &hints, &ai))
		die("getaddrinfo");
	a = connect_to(ch, ai);
	b = connect_to(ch, ai);
	printf("client: A and B established\n");
	if (rdma_disconnect(b))
		die("rdma_disconnect(B)");
	while (!down_a || !down_b) {
		struct rdma_cm_event *e = get(ch);
		if (e->event != RDMA_CM_EVENT_DISCONNECTED || (e->id != a && e->id != b)) {
			fprintf(stderr, "cm_exit: client: %s (status %d)\n", rdma_event_str(e->event),
				e->status);
			exit(1);
		}
		if (e->id == a)
			down_a = 1;
		else
			down_b = 1;
		printf("client: DISCONNECTED on %s\n", e->id == a ? "A" : "B");
		rdma_ack_cm_event(e);
	}
	rdma_destroy_qp(a);
	rdma_destroy_qp(b);
	rdma_destroy_id(a);
	rdma_destroy_id(b);
	rdma_destroy_event_channel(ch);
	freeaddrinfo(ai);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	int ack = 0, at_once = 0;
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 2; i < argc; i++) {
		ack |= !strcmp(argv[i], "-a");
		at_once |= !strcmp(argv[i], "-x");
	}
	if (argc >= 2 && !strcmp(argv[1], "-s"))
		return ack ? server_ack() : server(at_once);
	if (argc >= 3 && !strcmp(argv[1], "-c"))
		return ack ? client_ack(argv[argc - 1]) : client(argv[argc - 1]);
	fprintf(stderr, "usage: cm_exit -s [-x | -a] | cm_exit -c [-a] ADDR\n");
	return 2;
}
