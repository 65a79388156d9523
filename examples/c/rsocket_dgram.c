/* rsocket_dgram: librdmacm's datagram rsockets as a UDP program uses them (<rdma/rsocket.h>).
 *
 *   rsocket_dgram -s ADDR      server on ADDR:7472: echoes every datagram to its source,
 *                              checks and counts burst datagrams, answers "CNT" with the
 *                              count and exits on "END"
 *   rsocket_dgram -c SERVER    client: the checks below, then "END"
 *
 * What it checks: rsocket(SOCK_DGRAM)/rbind/rsendto/rrecvfrom with an unbound client (it gets
 * an address and port on its first send, read back with rgetsockname); every echoed byte of
 * datagrams of 1 byte to the largest a message buffer holds (2040 bytes), and the source
 * rrecvfrom reports being the server's address and port; one byte more refused with
 * EMSGSIZE; MSG_PEEK then a normal read of the same datagram; a datagram longer than the
 * receive buffer truncated as UDP truncates; a non-blocking rrecv with nothing there failing
 * with EAGAIN; rpoll on the socket; rconnect then rsend/rrecv; rlisten refused; a burst sent
 * without waiting arriving intact (UD may drop, never corrupt: the server checks every byte);
 * 2000 ping-pongs, their round-trip times printed (p50/p99/max); foreign and malformed
 * datagrams on the server's UDP side channel ignored, and a well-formed one answered with
 * rdma-core's control message as a plain UDP socket reads it. UD is unreliable: a request
 * whose answer does not come within a second is sent again (and counted).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/time.h>
#include <unistd.h>

#define PORT 7472
#define MAXMSG 2040
#define BURST 300

static void die(const char *what)
{
	fprintf(stderr, "%s: %s\n", what, strerror(errno));
	exit(1);
}

static unsigned char pattern(size_t i, unsigned seed)
{
	return (unsigned char)((i * 131u + seed * 7u) ^ (i >> 8));
}

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pattern(i, seed);
}

static long long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int dgram_socket(void)
{
	int s = rsocket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0)
		die("rsocket(SOCK_DGRAM)");
	return s;
}

/* ---- server ---------------------------------------------------------------------------- */

static int server(const char *addr)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	static unsigned char b[4096];
	unsigned burst = 0, bad = 0, total = 0;

	inet_pton(AF_INET, addr, &a.sin_addr);
	int s = dgram_socket();
	if (rbind(s, (struct sockaddr *)&a, sizeof a))
		die("rbind");
	if (rlisten(s, 1) != -1 || (errno != EOPNOTSUPP && errno != ENOTSUP)) {
		fprintf(stderr, "rlisten on a datagram rsocket: not refused\n");
		return 1;
	}
	printf("server: bound %s:%d\n", addr, PORT);
	fflush(stdout);
	for (;;) {
		struct sockaddr_in from;
		socklen_t fl = sizeof from;
		ssize_t n = rrecvfrom(s, b, sizeof b, 0, (struct sockaddr *)&from, &fl);
		if (n < 0)
			die("rrecvfrom");
		total++;
		if (n >= 3 && !memcmp(b, "END", 3)) {
			rsendto(s, b, (size_t)n, 0, (struct sockaddr *)&from, fl);
			break;
		}
		if (n >= 3 && !memcmp(b, "CNT", 3)) {
			char r[64];
			int k = snprintf(r, sizeof r, "CNT %u %u", burst, bad);
			if (rsendto(s, r, (size_t)k, 0, (struct sockaddr *)&from, fl) != k)
				die("rsendto CNT");
			continue;
		}
		if (n >= 4 && !memcmp(b, "BRST", 4)) {
			/* "BRST" + 4-byte seed + pattern */
			uint32_t seed;
			memcpy(&seed, b + 4, 4);
			burst++;
			for (ssize_t i = 8; i < n; i++)
				if (b[i] != pattern((size_t)(i - 8), seed)) {
					bad++;
					break;
				}
			continue;
		}
		if (rsendto(s, b, (size_t)n, 0, (struct sockaddr *)&from, fl) != n)
			die("rsendto echo");
	}
	printf("server: %u datagrams, burst %u, bad %u\n", total, burst, bad);
	rclose(s);
	printf("ok\n");
	return bad ? 1 : 0;
}

/* ---- client ---------------------------------------------------------------------------- */

static struct sockaddr_in srv;
static unsigned resent;

/* Waits up to 1 s for a datagram; its length, or -1 on timeout. */
static ssize_t recv_wait(int s, unsigned char *b, size_t len, struct sockaddr_in *from)
{
	struct pollfd p = { .fd = s, .events = POLLIN };
	int r = rpoll(&p, 1, 1000);
	if (r < 0)
		die("rpoll");
	if (r == 0)
		return -1;
	if (!(p.revents & POLLIN)) {
		fprintf(stderr, "rpoll: revents %#x\n", p.revents);
		exit(1);
	}
	socklen_t fl = sizeof *from;
	ssize_t n = rrecvfrom(s, b, len, MSG_DONTWAIT, (struct sockaddr *)from, &fl);
	if (n < 0)
		die("rrecvfrom");
	return n;
}

/* Sends `n` bytes of `out` (its first 4 bytes a sequence number) and waits for the echo with
 * that number (earlier echoes of resent requests are skipped); checks the bytes and source. */
static void echo(int s, unsigned char *out, size_t n, int connected)
{
	static unsigned char in[4096];
	for (int tries = 0; tries < 10; tries++) {
		ssize_t k = connected ? rsend(s, out, n, 0)
				      : rsendto(s, out, n, 0, (struct sockaddr *)&srv, sizeof srv);
		if (k != (ssize_t)n)
			die("rsendto");
		for (;;) {
			struct sockaddr_in from;
			ssize_t r = recv_wait(s, in, sizeof in, &from);
			if (r < 0) {
				resent++;
				break;
			}
			if (r >= 4 && memcmp(in, out, 4))
				continue; /* an echo of an earlier request */
			if (r != (ssize_t)n || memcmp(in, out, n)) {
				fprintf(stderr, "echo of %zu bytes: %zd bytes back, differ\n", n, r);
				exit(1);
			}
			if (from.sin_addr.s_addr != srv.sin_addr.s_addr || from.sin_port != srv.sin_port) {
				fprintf(stderr, "echo from %s:%d, not the server\n",
					inet_ntoa(from.sin_addr), ntohs(from.sin_port));
				exit(1);
			}
			return;
		}
	}
	fprintf(stderr, "no echo of %zu bytes after 10 tries\n", n);
	exit(1);
}

static uint32_t seq;

static void echo_size(int s, size_t n, int connected)
{
	static unsigned char out[MAXMSG + 1];
	fill(out, n, (unsigned)n);
	seq++;
	if (n >= 4)
		memcpy(out, &seq, 4);
	echo(s, out, n, connected);
}

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return (x > y) - (x < y);
}

static int client(const char *addr)
{
	static unsigned char b[4096];
	struct sockaddr_in me;
	socklen_t ml = sizeof me;

	srv.sin_family = AF_INET;
	srv.sin_port = htons(PORT);
	inet_pton(AF_INET, addr, &srv.sin_addr);
	int s = dgram_socket();

	/* Foreign and malformed datagrams on the server's side channel, from a plain UDP
	 * socket: ignored (the exchanges below still work); a well-formed data header gets
	 * rdma-core's control answer (tag 0x55555555, version 4, op 7, length 16, a QPN). */
	{
		int u = socket(AF_INET, SOCK_DGRAM, 0);
		unsigned char g[4100], r[64];
		unsigned char h[16] = { 0x55, 0x55, 0x55, 0x55, 6, 0, 16, 0,
					0,    0xab, 0xcd, 0xef, 127, 0, 0, 2 };
		if (u < 0)
			die("socket");
		memset(g, 0xa5, sizeof g);
		struct sockaddr *sa = (struct sockaddr *)&srv;
		sendto(u, g, 0, 0, sa, sizeof srv);		/* empty */
		sendto(u, g, 3, 0, sa, sizeof srv);		/* short */
		sendto(u, g, sizeof g, 0, sa, sizeof srv);	/* no tag, long */
		sendto(u, h, 16, 0, sa, sizeof srv);		/* version 6 from IPv4 */
		h[4] = 4;
		h[6] = 28;
		sendto(u, h, 16, 0, sa, sizeof srv);		/* wrong length */
		h[6] = 16;
		memcpy(g, h, 16);
		memcpy(g + 16, "HOSTILE", 7);
		sendto(u, g, 23, 0, sa, sizeof srv);		/* well formed: data */
		struct pollfd p = { .fd = u, .events = POLLIN };
		if (poll(&p, 1, 5000) != 1)
			die("no control answer on the side channel");
		ssize_t n = recv(u, r, sizeof r, 0);
		uint32_t qpn = (uint32_t)r[8] << 24 | (uint32_t)r[9] << 16 | r[10] << 8 | r[11];
		if (n != 16 || r[0] != 0x55 || r[1] != 0x55 || r[2] != 0x55 || r[3] != 0x55 ||
		    r[4] != 4 || r[5] != 7 || r[6] != 16 || qpn == 0 || qpn > 0xffffff ||
		    memcmp(r + 12, &srv.sin_addr, 4)) {
			fprintf(stderr, "side channel: not a control answer (%zd bytes)\n", n);
			return 1;
		}
		printf("side channel: control answer, QPN %#x\n", qpn);
		close(u);
	}

	/* Sizes 1 .. MAXMSG, unbound: the first send binds. */
	size_t sizes[] = { 1, 2, 3, 4, 8, 64, 100, 511, 1000, 1024, 1500, 2000, MAXMSG };
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
		echo_size(s, sizes[i], 0);
	printf("echoed %zu sizes, 1 to %d bytes\n", sizeof sizes / sizeof *sizes, MAXMSG);
	if (rgetsockname(s, (struct sockaddr *)&me, &ml) || me.sin_port == 0)
		die("rgetsockname: no port");
	printf("bound to %s with a port\n", inet_ntoa(me.sin_addr));

	/* One byte more than a message buffer holds. */
	memset(b, 1, sizeof b);
	if (rsendto(s, b, MAXMSG + 1, 0, (struct sockaddr *)&srv, sizeof srv) != -1 ||
	    errno != EMSGSIZE) {
		fprintf(stderr, "%d bytes: not EMSGSIZE\n", MAXMSG + 1);
		return 1;
	}
	printf("%d bytes: EMSGSIZE\n", MAXMSG + 1);

	/* Non-blocking receive with nothing there. */
	int fl = rfcntl(s, F_GETFL);
	if (rfcntl(s, F_SETFL, fl | O_NONBLOCK))
		die("rfcntl");
	if (rrecv(s, b, sizeof b, 0) != -1 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
		fprintf(stderr, "non-blocking rrecv with nothing there: not EAGAIN\n");
		return 1;
	}
	rfcntl(s, F_SETFL, fl);
	printf("non-blocking rrecv: EAGAIN\n");

	/* MSG_PEEK, then the same datagram read; then truncation. */
	{
		/* Late echoes of resent requests, if any, out of the way first. */
		while (rrecv(s, b, sizeof b, MSG_DONTWAIT) >= 0)
			;
		unsigned char out[300], p1[300], p2[300], small[10];
		struct sockaddr_in from;
		socklen_t l = sizeof from;
		seq++;
		fill(out, sizeof out, 99);
		memcpy(out, &seq, 4);
		if (rsendto(s, out, sizeof out, 0, (struct sockaddr *)&srv, sizeof srv) != sizeof out)
			die("rsendto");
		struct pollfd p = { .fd = s, .events = POLLIN };
		if (rpoll(&p, 1, 5000) != 1)
			die("rpoll for the peeked echo");
		if (rrecvfrom(s, p1, sizeof p1, MSG_PEEK, (struct sockaddr *)&from, &l) != sizeof p1 ||
		    rrecv(s, p2, sizeof p2, 0) != sizeof p2 || memcmp(p1, out, sizeof out) ||
		    memcmp(p2, out, sizeof out)) {
			fprintf(stderr, "MSG_PEEK then read: differ\n");
			return 1;
		}
		printf("MSG_PEEK then read: same datagram\n");
		seq++;
		memcpy(out, &seq, 4);
		if (rsendto(s, out, sizeof out, 0, (struct sockaddr *)&srv, sizeof srv) != sizeof out)
			die("rsendto");
		if (rpoll(&p, 1, 5000) != 1)
			die("rpoll for the truncated echo");
		if (rrecv(s, small, sizeof small, 0) != sizeof small || memcmp(small, out, sizeof small)) {
			fprintf(stderr, "truncated read: wrong\n");
			return 1;
		}
		/* The rest of that datagram is gone: the next read is the next datagram. */
		echo_size(s, 50, 0);
		printf("truncated to 10 bytes, rest discarded\n");
	}

	/* rpoll with an ordinary pipe beside the socket, and rselect: only the socket is
	 * readable once an echo is there; with nothing there rselect times out. */
	{
		int pp[2];
		unsigned char out[64];
		if (pipe(pp))
			die("pipe");
		while (rrecv(s, b, sizeof b, MSG_DONTWAIT) >= 0)
			; /* late echoes of resent requests, if any */
		struct timeval tv = { .tv_sec = 0, .tv_usec = 20000 };
		fd_set rs;
		FD_ZERO(&rs);
		FD_SET(s, &rs);
		if (rselect(s + 1, &rs, NULL, NULL, &tv) != 0) {
			fprintf(stderr, "rselect with nothing there: not a timeout\n");
			return 1;
		}
		seq++;
		fill(out, sizeof out, 5);
		memcpy(out, &seq, 4);
		if (rsendto(s, out, sizeof out, 0, (struct sockaddr *)&srv, sizeof srv) != sizeof out)
			die("rsendto");
		struct pollfd p[2] = { { .fd = s, .events = POLLIN }, { .fd = pp[0], .events = POLLIN } };
		if (rpoll(p, 2, 5000) != 1 || !(p[0].revents & POLLIN) || p[1].revents) {
			fprintf(stderr, "rpoll on the socket and a pipe: wrong\n");
			return 1;
		}
		FD_ZERO(&rs);
		FD_SET(s, &rs);
		tv.tv_sec = 5;
		if (rselect(s + 1, &rs, NULL, NULL, &tv) != 1 || !FD_ISSET(s, &rs)) {
			fprintf(stderr, "rselect with an echo there: not readable\n");
			return 1;
		}
		if (rrecv(s, b, sizeof b, 0) != sizeof out || memcmp(b, out, sizeof out)) {
			fprintf(stderr, "the polled echo: wrong\n");
			return 1;
		}
		close(pp[0]);
		close(pp[1]);
		printf("rpoll with a pipe and rselect: socket readable, pipe not\n");
	}

	/* Ping-pongs: round-trip times. */
	{
		enum { N = 2000 };
		static long long rtt[N];
		unsigned before = resent;
		for (int i = 0; i < N; i++) {
			long long t0 = now_ns();
			echo_size(s, 16, 0);
			rtt[i] = now_ns() - t0;
		}
		qsort(rtt, N, sizeof *rtt, cmp_ll);
		printf("ping-pong 16 B x %d: rtt p50 %.1f us p99 %.1f us max %.1f us, resent %u\n", N,
		       rtt[N / 2] / 1e3, rtt[N * 99 / 100] / 1e3, rtt[N - 1] / 1e3, resent - before);
	}

	/* A burst without waiting, checked by the server. */
	{
		unsigned char out[1000];
		for (uint32_t i = 0; i < BURST; i++) {
			memcpy(out, "BRST", 4);
			memcpy(out + 4, &i, 4);
			fill(out + 8, sizeof out - 8, i);
			if (rsendto(s, out, sizeof out, 0, (struct sockaddr *)&srv, sizeof srv) != sizeof out)
				die("rsendto burst");
		}
		usleep(200000);
		unsigned got = 0, bad = 0;
		for (int tries = 0;; tries++) {
			struct sockaddr_in from;
			if (rsendto(s, "CNT", 3, 0, (struct sockaddr *)&srv, sizeof srv) != 3)
				die("rsendto CNT");
			ssize_t n;
			while ((n = recv_wait(s, b, sizeof b - 1, &from)) >= 0 && memcmp(b, "CNT ", 4))
				;
			if (n >= 0) {
				b[n] = 0;
				sscanf((char *)b, "CNT %u %u", &got, &bad);
				break;
			}
			if (tries == 10)
				die("no answer to CNT");
		}
		printf("burst of %d: %u arrived, %u corrupt\n", BURST, got, bad);
		if (got == 0 || got > BURST || bad) {
			fprintf(stderr, "burst: wrong counts\n");
			return 1;
		}
	}

	/* Connected: rconnect, then rsend/rrecv. */
	if (rconnect(s, (struct sockaddr *)&srv, sizeof srv))
		die("rconnect");
	for (size_t n = 1; n <= MAXMSG; n = n * 3 + 1)
		echo_size(s, n, 1);
	printf("connected: rsend/rrecv echoed\n");

	/* The end: "END" echoed, then the server exits. */
	for (int tries = 0;; tries++) {
		struct sockaddr_in from;
		if (rsend(s, "END", 3, 0) != 3)
			die("rsend END");
		ssize_t n;
		while ((n = recv_wait(s, b, sizeof b, &from)) >= 0 && (n != 3 || memcmp(b, "END", 3)))
			;
		if (n == 3)
			break;
		if (tries == 10)
			die("no answer to END");
	}
	printf("resent %u\n", resent);
	if (rclose(s))
		die("rclose");
	if (rsendto(s, "x", 1, 0, (struct sockaddr *)&srv, sizeof srv) != -1 || errno != EBADF) {
		fprintf(stderr, "rsendto after rclose: not EBADF\n");
		return 1;
	}
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "-s"))
		return server(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "-c"))
		return client(argv[2]);
	fprintf(stderr, "usage: %s -s ADDR | -c SERVER\n", argv[0]);
	return 2;
}
