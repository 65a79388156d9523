/* rsocket_hostile: peers that break the rsocket protocol, against an rsocket server.
 *
 *   rsocket_hostile -s           an rsocket server on 127.0.0.1:7472 (rsocket, rbind,
 *                                rlisten, raccept, rrecv)
 *   rsocket_hostile -c 127.0.0.1 the peers, with plain librdmacm and verbs calls:
 *     1. a REQ whose connection data says version 2        -> REJECTED
 *     2. a REQ with 8 bytes of connection data              -> REJECTED
 *     3. a well-formed connection that then claims, in an RDMA WRITE with immediate, a
 *        16 MiB message into the server's 256 KiB ring      -> the server's rrecv fails with
 *        EPROTO (nothing is read from outside the ring), it closes, and this side is
 *        disconnected
 *     4. a well-formed connection that writes "hello" as rsocket data, then disconnects
 *        without the rsocket disconnect message (a DREQ only: what the kernel sends for a
 *        process that died)                                 -> the server's blocking rrecv
 *        returns "hello", then 0 (the end of the stream), not waiting forever
 *     5. a peer that withholds its RTU (an id without a QP: the CM sends it only at
 *        rdma_establish) until the server says it accepted -> the server's non-blocking
 *        raccept hands the socket out before the connection is established (it used to
 *        wait for the RTU, up to 20 s, holding up an event loop's accept); once the peer
 *        establishes and disconnects, the socket reads the end of the stream
 * The server's blocking raccept must pass over the two bad requests and return the third.
 * The server tells the client it accepted the fifth peer over an abstract unix socket (the
 * test's network namespace is its own). Both print "ok" at the end.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define PORT 7472

/* The abstract unix address the client waits on for the server's word. */
static socklen_t word_addr(struct sockaddr_un *u)
{
	static const char name[] = "\0rsocket_hostile-fifth";

	memset(u, 0, sizeof(*u));
	u->sun_family = AF_UNIX;
	memcpy(u->sun_path, name, sizeof(name) - 1);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + sizeof(name) - 1);
}

static void die(const char *what)
{
	fprintf(stderr, "%s: %s\n", what, strerror(errno));
	exit(1);
}

/* A blocking rrecv on `s` reads the end of the stream (0), else says what it got. */
static int at_eof(int s, const char *what)
{
	char c;
	ssize_t k = rrecv(s, &c, 1, 0);

	if (k != 0)
		fprintf(stderr, "rrecv %s: %zd (%s), not 0\n", what, k,
			k < 0 ? strerror(errno) : "data");
	return k == 0;
}

static int server(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	char buf[100];
	int l, s, sz = 128 * 1024;

	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	l = rsocket(AF_INET, SOCK_STREAM, 0);
	if (l < 0)
		die("rsocket");
	/* A 256 KiB receive ring: the liar's 16 MiB claim is far beyond it. */
	if (rsetsockopt(l, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz)))
		die("rsetsockopt");
	if (rbind(l, (struct sockaddr *)&a, sizeof(a)) || rlisten(l, 4))
		die("rbind/rlisten");
	s = raccept(l, NULL, NULL);
	if (s < 0)
		die("raccept");
	printf("accepted the third peer\n");
	ssize_t k = rrecv(s, buf, sizeof(buf), 0);
	if (k != -1 || errno != EPROTO) {
		fprintf(stderr, "rrecv after the 16 MiB claim: %zd (%s), not EPROTO\n", k,
			k < 0 ? strerror(errno) : "data");
		return 1;
	}
	printf("rrecv: EPROTO\n");
	rclose(s);
	s = raccept(l, NULL, NULL);
	if (s < 0)
		die("raccept");
	printf("accepted the fourth peer\n");
	/* Before 2026-12-06 the second rrecv waited forever: the DREQ went unread. */
	alarm(20);
	k = rrecv(s, buf, sizeof(buf), 0);
	if (k != 5 || memcmp(buf, "hello", 5)) {
		fprintf(stderr, "rrecv from the fourth peer: %zd\n", k);
		return 1;
	}
	if (!at_eof(s, "after the fourth peer's DREQ"))
		return 1;
	alarm(0);
	printf("rrecv: hello, then the end of the stream\n");
	rclose(s);

	/* The fifth peer sends no RTU until told: a non-blocking accept does not wait for it. */
	if (rfcntl(l, F_SETFL, O_NONBLOCK))
		die("rfcntl");
	for (;;) {
		struct pollfd f = { .fd = l, .events = POLLIN };
		if (rpoll(&f, 1, 20000) != 1) {
			fprintf(stderr, "no fifth request in 20 s\n");
			return 1;
		}
		s = raccept(l, NULL, NULL);
		if (s >= 0)
			break;
		if (errno != EAGAIN)
			die("raccept (non-blocking)");
	}
	printf("accepted the fifth peer before its RTU\n");
	struct sockaddr_un u;
	socklen_t ul = word_addr(&u);
	int w = socket(AF_UNIX, SOCK_DGRAM, 0);
	if (w < 0 || sendto(w, "accepted", 8, 0, (struct sockaddr *)&u, ul) != 8)
		die("telling the client");
	close(w);
	if (rfcntl(s, F_SETFL, 0))
		die("rfcntl");
	alarm(20);
	if (!at_eof(s, "from the fifth peer"))
		return 1;
	alarm(0);
	printf("rrecv: the fifth peer's end of the stream\n");
	rclose(s);
	rclose(l);
	printf("ok\n");
	return 0;
}

static struct rdma_event_channel *ch;

static struct rdma_cm_event *wait_event(int want)
{
	struct rdma_cm_event *e;

	if (rdma_get_cm_event(ch, &e))
		die("rdma_get_cm_event");
	if ((int)e->event != want) {
		fprintf(stderr, "event %s, %s expected\n", rdma_event_str(e->event),
			rdma_event_str(want));
		exit(1);
	}
	return e;
}

/* The rsocket connection data: version, flags, credits, reserved, iomap size, the target
 * SGL {addr, key, entries} and the first receive buffer {addr, key, length}, big-endian. */
struct conn_data {
	uint8_t version, flags;
	uint16_t credits;
	uint8_t reserved[3], iomap;
	uint64_t sgl_addr;
	uint32_t sgl_key, sgl_len;
	uint64_t buf_addr;
	uint32_t buf_key, buf_len;
} __attribute__((packed));

/* Connects with `len` bytes of `cd` as private data; returns the id (QP made) once the
 * outcome is known: `*established` 1 and the REP's data in `rep`, or 0 when rejected. */
/* A new id with its address and route to the server resolved (its device known). */
static struct rdma_cm_id *resolved(const char *host)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	struct rdma_cm_id *id;

	inet_pton(AF_INET, host, &a.sin_addr);
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(wait_event(RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(wait_event(RDMA_CM_EVENT_ROUTE_RESOLVED));
	return id;
}

static struct rdma_cm_id *connect_with(const char *host, const void *cd, int len,
				       struct ibv_pd **pd, struct ibv_cq **cq,
				       int *established, struct conn_data *rep)
{
	struct rdma_cm_id *id = resolved(host);
	struct rdma_cm_event *e;

	*pd = ibv_alloc_pd(id->verbs);
	*cq = ibv_create_cq(id->verbs, 64, NULL, NULL, 0);
	if (!*pd || !*cq)
		die("pd/cq");
	struct ibv_qp_init_attr qa = {
		.send_cq = *cq, .recv_cq = *cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (rdma_create_qp(id, *pd, &qa))
		die("rdma_create_qp");
	/* Receives for the server's credit messages. */
	for (int i = 0; i < 16; i++) {
		struct ibv_recv_wr r = { .wr_id = i }, *bad;
		if (ibv_post_recv(id->qp, &r, &bad))
			die("ibv_post_recv");
	}
	struct rdma_conn_param p = {
		.private_data = cd, .private_data_len = len, .flow_control = 1,
		.retry_count = 7, .rnr_retry_count = 7,
	};
	if (rdma_connect(id, &p))
		die("rdma_connect");
	if (rdma_get_cm_event(ch, &e))
		die("rdma_get_cm_event");
	*established = e->event == RDMA_CM_EVENT_ESTABLISHED;
	if (!*established && e->event != RDMA_CM_EVENT_REJECTED) {
		fprintf(stderr, "connect: %s\n", rdma_event_str(e->event));
		exit(1);
	}
	if (*established && rep) {
		if (e->param.conn.private_data_len < sizeof(*rep)) {
			fprintf(stderr, "REP: %d bytes of connection data\n", e->param.conn.private_data_len);
			exit(1);
		}
		memcpy(rep, e->param.conn.private_data, sizeof(*rep));
	}
	rdma_ack_cm_event(e);
	return id;
}

static void drop(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq)
{
	rdma_destroy_qp(id);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	rdma_destroy_id(id);
}

/* A well-formed rsocket connection: our target SGL and ring registered for the server to
 * write; returns the id once established, the REP's connection data in `rep`. */
static struct rdma_cm_id *connect_good(const char *host, struct ibv_pd **pdp,
				       struct ibv_cq **cqp, struct conn_data *rep)
{
	static uint8_t sgl[32], ring[4096];
	struct rdma_cm_event *e;
	struct conn_data cd;
	struct ibv_pd *pd;
	struct ibv_cq *cq;

	/* The buffers need a PD before the connection data names their keys: the id resolves
	 * the device first, as connect_with does. */
	struct rdma_cm_id *id = resolved(host);
	pd = ibv_alloc_pd(id->verbs);
	cq = ibv_create_cq(id->verbs, 64, NULL, NULL, 0);
	struct ibv_mr *ms = ibv_reg_mr(pd, sgl, sizeof(sgl),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *mr = ibv_reg_mr(pd, ring, sizeof(ring),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!pd || !cq || !ms || !mr)
		die("pd/cq/mr");
	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	if (rdma_create_qp(id, pd, &qa))
		die("rdma_create_qp");
	for (int i = 0; i < 16; i++) {
		struct ibv_recv_wr r = { .wr_id = i }, *bad;
		if (ibv_post_recv(id->qp, &r, &bad))
			die("ibv_post_recv");
	}
	cd = (struct conn_data){
		.version = 1, .credits = htobe16(16),
		.sgl_addr = htobe64((uintptr_t)sgl), .sgl_key = htobe32(ms->rkey),
		.sgl_len = htobe32(2),
		.buf_addr = htobe64((uintptr_t)ring), .buf_key = htobe32(mr->rkey),
		.buf_len = htobe32(sizeof(ring) / 2),
	};
	struct rdma_conn_param p = {
		.private_data = &cd, .private_data_len = sizeof(cd), .flow_control = 1,
		.retry_count = 7, .rnr_retry_count = 7,
	};
	if (rdma_connect(id, &p))
		die("rdma_connect");
	e = wait_event(RDMA_CM_EVENT_ESTABLISHED);
	memcpy(rep, e->param.conn.private_data, sizeof(*rep));
	rdma_ack_cm_event(e);
	*pdp = pd;
	*cqp = cq;
	return id;
}

/* One RDMA WRITE with immediate of `len` bytes of `data` (registered by the caller, or
 * none) into the server's first buffer; waits for its completion. */
static void write_imm(struct rdma_cm_id *id, struct ibv_cq *cq, const struct conn_data *rep,
		      uint32_t imm, struct ibv_sge *sge)
{
	struct ibv_send_wr w = {
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .imm_data = htobe32(imm),
		.sg_list = sge, .num_sge = sge ? 1 : 0,
		.wr.rdma = { .remote_addr = be64toh(rep->buf_addr), .rkey = be32toh(rep->buf_key) },
	}, *bad;
	if (ibv_post_send(id->qp, &w, &bad))
		die("ibv_post_send");
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 || (n == 1 && wc.opcode != IBV_WC_RDMA_WRITE))
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "write with immediate %#x: %s\n", imm, ibv_wc_status_str(wc.status));
		exit(1);
	}
}

static int client(const char *host)
{
	struct conn_data cd = { .version = 2, .credits = htobe16(16) }, rep;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int est;

	ch = rdma_create_event_channel();
	if (!ch)
		die("rdma_create_event_channel");

	id = connect_with(host, &cd, sizeof(cd), &pd, &cq, &est, NULL);
	if (est) {
		fprintf(stderr, "version 2: accepted\n");
		return 1;
	}
	printf("version 2: rejected\n");
	drop(id, pd, cq);

	cd.version = 1;
	id = connect_with(host, &cd, 8, &pd, &cq, &est, NULL);
	if (est) {
		fprintf(stderr, "8 bytes of connection data: accepted\n");
		return 1;
	}
	printf("8 bytes: rejected\n");
	drop(id, pd, cq);

	/* Well-formed: our target SGL and ring are registered for the server to write. */
	id = connect_good(host, &pd, &cq, &rep);
	if (rep.version != 1 || !rep.buf_len) {
		fprintf(stderr, "REP: version %d, buffer %u bytes\n", rep.version, be32toh(rep.buf_len));
		return 1;
	}
	printf("third peer connected (server ring half: %u bytes)\n", be32toh(rep.buf_len));
	/* 16 MiB claimed, nothing written. */
	write_imm(id, cq, &rep, 16u << 20, NULL);
	printf("claimed 16 MiB\n");
	rdma_ack_cm_event(wait_event(RDMA_CM_EVENT_DISCONNECTED));
	printf("disconnected by the server\n");
	drop(id, pd, cq);

	id = connect_good(host, &pd, &cq, &rep);
	static char hello[] = "hello";
	struct ibv_mr *hm = ibv_reg_mr(pd, hello, 5, 0);
	if (!hm)
		die("ibv_reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)hello, .length = 5, .lkey = hm->lkey };
	/* rsocket data: op 0, the length. */
	write_imm(id, cq, &rep, 5, &sge);
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	printf("fourth peer: wrote hello, disconnected without the rsocket message\n");
	rdma_ack_cm_event(wait_event(RDMA_CM_EVENT_DISCONNECTED));
	drop(id, pd, cq);

	/* Fifth: no QP, so the CM sends the RTU only at rdma_establish; the connection data is
	 * well-formed (the server never writes before we establish and leave). */
	struct sockaddr_un u;
	socklen_t ul = word_addr(&u);
	int w = socket(AF_UNIX, SOCK_DGRAM, 0);
	if (w < 0 || bind(w, (struct sockaddr *)&u, ul))
		die("the unix socket for the server's word");
	id = resolved(host);
	struct conn_data c5 = {
		.version = 1, .credits = htobe16(16),
		.sgl_addr = htobe64(0x10000), .sgl_key = htobe32(0x1234), .sgl_len = htobe32(2),
		.buf_addr = htobe64(0x20000), .buf_key = htobe32(0x5678), .buf_len = htobe32(2048),
	};
	struct rdma_conn_param p = {
		.private_data = &c5, .private_data_len = sizeof(c5), .flow_control = 1,
		.retry_count = 7, .rnr_retry_count = 7, .qp_num = 0x4242,
	};
	if (rdma_connect(id, &p))
		die("rdma_connect");
	rdma_ack_cm_event(wait_event(RDMA_CM_EVENT_CONNECT_RESPONSE));
	printf("fifth peer: REP received, RTU withheld\n");
	struct pollfd f = { .fd = w, .events = POLLIN };
	char word[16];
	if (poll(&f, 1, 25000) != 1 || recv(w, word, sizeof(word), 0) != 8) {
		fprintf(stderr, "no word from the server that it accepted the fifth peer\n");
		return 1;
	}
	close(w);
	if (rdma_establish(id))
		die("rdma_establish");
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	rdma_ack_cm_event(wait_event(RDMA_CM_EVENT_DISCONNECTED));
	rdma_destroy_id(id);
	printf("fifth peer: accepted before its RTU, then established and left\n");
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "-s"))
		return server();
	if (argc >= 3 && !strcmp(argv[1], "-c"))
		return client(argv[2]);
	fprintf(stderr, "usage: rsocket_hostile -s | -c SERVER\n");
	return 2;
}
