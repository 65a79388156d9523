/*
 * cm_bind.c — which local addresses an rdma_cm_id may bind, and what rdma_getaddrinfo answers
 * from hints alone, as libfabric's verbs provider relies on them:
 *
 *   an address of the device           binds, and the id is on the device (id->verbs set),
 *                                       with the device's PD in id->pd (one per device: the
 *                                       same for every id; pyverbs' CMID.pd and rdma-core's
 *                                       RDMA-CM tests use it);
 *   the wildcard                        binds, on no device yet (no PD);
 *   a loopback address the device does not serve
 *                                       binds, on no device (libfabric then advertises the
 *                                       device's own addresses instead of 127.0.0.1);
 *   another local address (of an interface with no RDMA device)
 *                                       fails with ENODEV;
 *   an address that is not the host's   fails with EADDRNOTAVAIL;
 *   rdma_getaddrinfo(NULL, NULL, hints) answers with the hints' family, port space,
 *                                       destination and source.
 *
 * Every case but "another local address" was compared with the kernel's RDMA-CM and rdma-core's
 * librdmacm on rxe (Debian 12's guest of tools/rxe-peer, which has no second interface).
 *
 * Usage: cm_bind DEVICE_ADDR OTHER_LOOPBACK OTHER_LOCAL FOREIGN   (IPv4 addresses)
 * Prints one line per case and "ok" when each behaves as above.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <string.h>

static int failures;
/* The PD of the first id bound to the device: every later one has the same. */
static struct ibv_pd *device_pd;

static void bind_case(struct rdma_event_channel *ch, const char *what, const char *ip,
		      int want_err, int want_device)
{
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		printf("%s: rdma_create_id: %s\n", what, strerror(errno));
		failures++;
		return;
	}
	struct sockaddr_in a = { .sin_family = AF_INET };
	inet_pton(AF_INET, ip, &a.sin_addr);
	errno = 0;
	int r = rdma_bind_addr(id, (struct sockaddr *)&a);
	int err = r ? errno : 0;
	const char *pd = "no PD";
	if (id->pd && id->verbs && id->pd->context == id->verbs) {
		if (!device_pd)
			device_pd = id->pd;
		pd = id->pd == device_pd ? "the device's PD" : "a PD of its own";
	} else if (id->pd) {
		pd = "a PD of another context";
	}
	printf("bind %s (%s): %s, %s, %s\n", what, ip, r ? strerror(err) : "bound",
	       id->verbs ? "on the device" : "on no device", pd);
	if (err != want_err || (!r && !!id->verbs != want_device) ||
	    (!r && want_device && (!id->pd || id->pd != device_pd)) ||
	    ((r || !want_device) && id->pd))
		failures++;
	rdma_destroy_id(id);
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: cm_bind DEVICE_ADDR OTHER_LOOPBACK OTHER_LOCAL FOREIGN\n");
		return 2;
	}
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch) {
		perror("rdma_create_event_channel");
		return 1;
	}
	bind_case(ch, "the device's address", argv[1], 0, 1);
	bind_case(ch, "the wildcard", "0.0.0.0", 0, 0);
	bind_case(ch, "another loopback address", argv[2], 0, 0);
	bind_case(ch, "another interface's address", argv[3], ENODEV, 0);
	bind_case(ch, "a foreign address", argv[4], EADDRNOTAVAIL, 0);

	/* Hints alone: their addresses come back. */
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7471) };
	struct sockaddr_in src = { .sin_family = AF_INET };
	inet_pton(AF_INET, argv[4], &dst.sin_addr);
	inet_pton(AF_INET, argv[1], &src.sin_addr);
	struct rdma_addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_dst_addr = (struct sockaddr *)&dst;
	hints.ai_dst_len = sizeof(dst);
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof(src);
	int r = rdma_getaddrinfo(NULL, NULL, &hints, &res);
	if (r) {
		printf("rdma_getaddrinfo from hints alone: %s\n", strerror(errno));
		failures++;
	} else {
		int dst_same = res->ai_dst_len == sizeof(dst) &&
			       !memcmp(res->ai_dst_addr, &dst, sizeof(dst));
		int src_same = res->ai_src_len == sizeof(src) &&
			       !memcmp(res->ai_src_addr, &src, sizeof(src));
		printf("rdma_getaddrinfo from hints alone: family %d, port space %d, destination %s, "
		       "source %s\n",
		       res->ai_family, res->ai_port_space, dst_same ? "the hints'" : "OTHER",
		       src_same ? "the hints'" : "OTHER");
		if (!dst_same || !src_same)
			failures++;
		rdma_freeaddrinfo(res);
	}
	r = rdma_getaddrinfo(NULL, NULL, NULL, &res);
	printf("rdma_getaddrinfo with nothing: %s\n", r ? strerror(errno) : "answered");
	if (!r || errno != EINVAL)
		failures++;

	rdma_destroy_event_channel(ch);
	if (failures)
		return 1;
	printf("ok\n");
	return 0;
}
