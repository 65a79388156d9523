/* rsocket_keepalive: an rsocket whose peer dies without a word.
 *
 *   rsocket_keepalive -s ADDR IDLE   server on ADDR:7473: accepts one connection, turns on
 *                                    SO_KEEPALIVE with TCP_KEEPIDLE = IDLE seconds (and reads
 *                                    both back), reads "hello", then blocks reading again
 *   rsocket_keepalive -c ADDR        client: connects, sends "hello", then sleeps for ever
 *
 * Kill the client with SIGKILL once the server has printed "got hello": a process killed so
 * cannot disconnect (on rdma-core the kernel would send its DREQ; a library cannot), and
 * without keepalives the server's read would wait for ever. With them the server's keepalive
 * goes unacknowledged, its QP runs out of retries and the read fails: the server prints
 * "read after the peer died: -1 (...)" and exits 0.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PORT 7473

static void die(const char *what)
{
	fprintf(stderr, "%s: %s\n", what, strerror(errno));
	exit(1);
}

static struct sockaddr_in addr_of(const char *ip)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", ip);
		exit(2);
	}
	return a;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "-s")) {
		struct sockaddr_in a = addr_of(argv[2]);
		int idle = atoi(argv[3]);
		int l = rsocket(AF_INET, SOCK_STREAM, 0);
		if (l < 0)
			die("rsocket");
		if (rbind(l, (struct sockaddr *)&a, sizeof(a)) || rlisten(l, 1))
			die("rbind/rlisten");
		int s = raccept(l, NULL, NULL);
		if (s < 0)
			die("raccept");
		int on = 1, got = 0;
		socklen_t len = sizeof(got);
		if (rsetsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) ||
		    rsetsockopt(s, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)))
			die("rsetsockopt");
		if (rgetsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &got, &len))
			die("rgetsockopt SO_KEEPALIVE");
		printf("SO_KEEPALIVE %d", got);
		len = sizeof(got);
		if (rgetsockopt(s, IPPROTO_TCP, TCP_KEEPIDLE, &got, &len))
			die("rgetsockopt TCP_KEEPIDLE");
		printf(", TCP_KEEPIDLE %d\n", got);
		char buf[16];
		ssize_t n = rrecv(s, buf, 5, MSG_WAITALL);
		if (n != 5 || memcmp(buf, "hello", 5))
			die("rrecv hello");
		printf("got hello\n");
		fflush(stdout);
		errno = 0;
		n = rrecv(s, buf, sizeof(buf), 0);
		printf("read after the peer died: %zd (%s)\n", n, strerror(errno));
		rclose(s);
		rclose(l);
		return n < 0 ? 0 : 1;
	}
	if (argc >= 3 && !strcmp(argv[1], "-c")) {
		struct sockaddr_in a = addr_of(argv[2]);
		int s = rsocket(AF_INET, SOCK_STREAM, 0);
		if (s < 0)
			die("rsocket");
		if (rconnect(s, (struct sockaddr *)&a, sizeof(a)))
			die("rconnect");
		if (rsend(s, "hello", 5, 0) != 5)
			die("rsend");
		printf("sent hello\n");
		fflush(stdout);
		for (;;)
			pause();
	}
	fprintf(stderr, "usage: rsocket_keepalive -s ADDR IDLE | -c ADDR\n");
	return 2;
}
