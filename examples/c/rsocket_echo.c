/* rsocket_echo: librdmacm's rsockets as a TCP program uses them (<rdma/rsocket.h>).
 *
 *   rsocket_echo -s              server on 127.0.0.1:7471: echoes what it reads until EOF
 *   rsocket_echo -c 127.0.0.1    client: sends messages of many sizes, checks every echoed
 *                                byte, then half-closes and waits for the server's EOF
 *
 * What it checks: rsocket/rbind/rlisten/raccept/rconnect; rsend/rrecv with sizes from 1 byte
 * to 200 KiB (more than one receive-buffer grant); MSG_PEEK then a normal read of the same
 * bytes; rpoll on an rsocket together with an ordinary pipe (only the rsocket is readable);
 * rgetpeername; rshutdown(SHUT_WR) reaching the server as EOF (rrecv returns 0) while the
 * client can still read; the server's rclose reaching the client as EOF; calls on a closed
 * descriptor failing with EBADF, and a SOCK_SEQPACKET rsocket refused. The client connects
 * non-blocking, as an event loop does: rconnect returns EINPROGRESS, a read meanwhile EAGAIN,
 * rpoll reports POLLOUT once connected and SO_ERROR is 0 (and a connect to a port nobody
 * listens on reports POLLERR with SO_ERROR ECONNREFUSED). Prints "ok" at the end.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PORT 7471
#define MAX (200 * 1024)

static void die(const char *what)
{
	fprintf(stderr, "%s: %s\n", what, strerror(errno));
	exit(1);
}

static unsigned char pattern(size_t i, unsigned seed)
{
	return (unsigned char)((i * 131u + seed * 7u) ^ (i >> 8));
}

static void send_all(int s, const unsigned char *b, size_t n)
{
	while (n) {
		ssize_t k = rsend(s, b, n, 0);
		if (k <= 0)
			die("rsend");
		b += k;
		n -= (size_t)k;
	}
}

static void recv_all(int s, unsigned char *b, size_t n)
{
	while (n) {
		ssize_t k = rrecv(s, b, n, 0);
		if (k < 0)
			die("rrecv");
		if (k == 0) {
			fprintf(stderr, "rrecv: early EOF\n");
			exit(1);
		}
		b += k;
		n -= (size_t)k;
	}
}

static int server(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	struct sockaddr_in peer;
	socklen_t plen = sizeof(peer);
	static unsigned char buf[MAX];
	int l, s, one = 1, p[2];
	size_t total = 0;

	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	l = rsocket(AF_INET, SOCK_STREAM, 0);
	if (l < 0)
		die("rsocket");
	if (rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)))
		die("rsetsockopt");
	if (rbind(l, (struct sockaddr *)&a, sizeof(a)))
		die("rbind");
	if (rlisten(l, 4))
		die("rlisten");
	s = raccept(l, (struct sockaddr *)&peer, &plen);
	if (s < 0)
		die("raccept");
	printf("accepted from %s\n", inet_ntoa(peer.sin_addr));

	/* rpoll: a pipe nobody writes and the rsocket; only the rsocket becomes readable. */
	if (pipe(p))
		die("pipe");
	struct pollfd f[2] = { { .fd = p[0], .events = POLLIN }, { .fd = s, .events = POLLIN } };
	int n = rpoll(f, 2, 10000);
	if (n != 1 || f[0].revents || !(f[1].revents & POLLIN)) {
		fprintf(stderr, "rpoll: %d, pipe %#x, rsocket %#x\n", n, f[0].revents, f[1].revents);
		return 1;
	}
	printf("rpoll: rsocket readable, pipe not\n");

	/* MSG_PEEK leaves the bytes for the next read. */
	unsigned char peek[4], first[4];
	if (rrecv(s, peek, 4, MSG_PEEK) != 4 || rrecv(s, first, 4, MSG_WAITALL) != 4 ||
	    memcmp(peek, first, 4)) {
		fprintf(stderr, "MSG_PEEK: not the bytes read next\n");
		return 1;
	}
	send_all(s, first, 4);
	total += 4;
	for (;;) {
		ssize_t k = rrecv(s, buf, sizeof(buf), 0);
		if (k < 0)
			die("rrecv");
		if (k == 0)
			break;
		send_all(s, buf, (size_t)k);
		total += (size_t)k;
	}
	printf("EOF after %zu bytes\n", total);
	if (rclose(s) || rclose(l))
		die("rclose");
	if (rrecv(s, buf, 1, 0) != -1 || errno != EBADF) {
		fprintf(stderr, "rrecv on a closed rsocket: not EBADF\n");
		return 1;
	}
	printf("ok\n");
	return 0;
}

/* A non-blocking rconnect: EINPROGRESS, then rpoll for POLLOUT; returns SO_ERROR. */
static int connect_nonblocking(int s, const struct sockaddr_in *a, short *revents,
			       int *poll_errno)
{
	int err = -1;
	socklen_t len = sizeof(err);
	unsigned char c;

	if (rfcntl(s, F_SETFL, O_NONBLOCK))
		die("rfcntl");
	if (rconnect(s, (const struct sockaddr *)a, sizeof(*a)) != -1 || errno != EINPROGRESS) {
		fprintf(stderr, "a non-blocking rconnect: not EINPROGRESS (%s)\n", strerror(errno));
		exit(1);
	}
	/* Nothing can have arrived: EAGAIN whether the connection is made yet or not (or, to a
	 * closed port, the refusal if it came already). */
	if (rrecv(s, &c, 1, 0) != -1 || (errno != EAGAIN && errno != ECONNREFUSED)) {
		fprintf(stderr, "rrecv while connecting: not EAGAIN (%s)\n", strerror(errno));
		exit(1);
	}
	int seen = errno == ECONNREFUSED;
	struct pollfd f = { .fd = s, .events = POLLOUT };
	errno = 0;
	if (rpoll(&f, 1, 10000) != 1) {
		fprintf(stderr, "rpoll while connecting: nothing in 10 s\n");
		exit(1);
	}
	/* A connection that fails inside rpoll leaves errno saying why, as rdma-core's rpoll
	 * does (riostream's "rpoll: Connection refused"); -1 when rrecv saw it first. */
	*poll_errno = seen ? -1 : errno;
	*revents = f.revents;
	if (rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len))
		die("rgetsockopt SO_ERROR");
	return err;
}

static int client(const char *host)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	struct sockaddr_in peer;
	socklen_t plen = sizeof(peer);
	static unsigned char out[MAX], in[MAX];
	static const size_t sizes[] = { 4, 1, 2, 63, 64, 65, 1000, 2048, 4096, 65536, 65537, MAX, 7, MAX };
	size_t total = 0;
	int s;

	/* rdma-core's rsockets are streams and datagrams: a sequenced-packet socket is not. */
	if (rsocket(AF_INET, SOCK_SEQPACKET, 0) != -1 || errno != EOPNOTSUPP) {
		fprintf(stderr, "a SOCK_SEQPACKET rsocket: not EOPNOTSUPP\n");
		return 1;
	}
	inet_pton(AF_INET, host, &a.sin_addr);

	/* Nobody listens on the next port: the server's side rejects the request. */
	struct sockaddr_in none = a;
	short ev = 0;
	none.sin_port = htons(PORT + 1);
	s = rsocket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		die("rsocket");
	int perr;
	int err = connect_nonblocking(s, &none, &ev, &perr);
	if (err != ECONNREFUSED || !(ev & POLLERR) || (perr != -1 && perr != ECONNREFUSED)) {
		fprintf(stderr, "refused connect: SO_ERROR %d (%s), revents %#x, errno after rpoll %d\n",
			err, strerror(err), ev, perr);
		return 1;
	}
	socklen_t len = sizeof(err);
	if (rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
		fprintf(stderr, "SO_ERROR read twice: %d\n", err);
		return 1;
	}
	rclose(s);
	printf("non-blocking connect to a closed port: EINPROGRESS, then POLLERR, ECONNREFUSED\n");

	s = rsocket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		die("rsocket");
	err = connect_nonblocking(s, &a, &ev, &perr);
	if (err || !(ev & POLLOUT) || (ev & (POLLERR | POLLHUP))) {
		fprintf(stderr, "connect: SO_ERROR %d (%s), revents %#x\n", err, strerror(err), ev);
		return 1;
	}
	/* The connection made, rconnect reports it (rdma-core's and TCP's answer). */
	if (rconnect(s, (struct sockaddr *)&a, sizeof(a)))
		die("rconnect after POLLOUT");
	if (rfcntl(s, F_SETFL, 0))
		die("rfcntl");
	printf("non-blocking connect: EINPROGRESS, then POLLOUT\n");
	if (rgetpeername(s, (struct sockaddr *)&peer, &plen) || peer.sin_port != htons(PORT))
		die("rgetpeername");
	printf("connected to %s:%d\n", inet_ntoa(peer.sin_addr), ntohs(peer.sin_port));
	for (size_t r = 0; r < 3; r++) {
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			size_t n = sizes[i];
			for (size_t j = 0; j < n; j++)
				out[j] = pattern(total + j, (unsigned)(r * 100 + i));
			send_all(s, out, n);
			recv_all(s, in, n);
			if (memcmp(in, out, n)) {
				fprintf(stderr, "round %zu message %zu (%zu bytes): echo differs\n", r, i, n);
				return 1;
			}
			total += n;
		}
	}
	printf("echoed %zu bytes\n", total);
	/* Half-close: the server reads EOF, answers by closing; this side reads EOF too. */
	if (rshutdown(s, SHUT_WR))
		die("rshutdown");
	unsigned char c;
	ssize_t k = rrecv(s, &c, 1, 0);
	if (k != 0) {
		fprintf(stderr, "after the server closed: rrecv returned %zd (%s)\n", k,
			k < 0 ? strerror(errno) : "data");
		return 1;
	}
	printf("EOF from the server\n");
	if (rclose(s))
		die("rclose");
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
	fprintf(stderr, "usage: rsocket_echo -s | -c SERVER\n");
	return 2;
}
