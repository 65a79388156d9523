/*
 * cm_fork.c — both ends of an RDMA-CM connection in children of one process that used the
 * device before it forked, as rdma-core's own RDMA-CM tests run (Python's multiprocessing
 * forks the server and the client from the test runner, which has opened contexts, PDs and
 * regions by then). On rdma-core's libraries each child makes its own context and CM id; the
 * parent's are not for it to use. A library whose device runs threads inside the process
 * must do the same: a child has none of its parent's threads.
 *
 *   cm_fork ADDR PORT
 *
 * The parent binds an id to ADDR (the device's address: the CM and the device start), takes
 * a PD and registers a region on it, then forks a server (listens on PORT, accepts, takes one
 * SEND and checks it) and a client (connects, sends, waits for its completion). It prints
 * each child's exit status and "ok" when both succeeded, with its own id and region still
 * there.
 *
 * Built against the system's <rdma/rdma_cma.h> and <rdma/rdma_verbs.h> with -lrdmacm
 * -libverbs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSG "hello from the client"

static void die(const char *who, const char *what)
{
	fprintf(stderr, "cm_fork %s: %s: %s\n", who, what, strerror(errno));
	_exit(1);
}

static struct rdma_addrinfo *info(const char *addr, const char *port, int passive)
{
	struct rdma_addrinfo hints, *res;
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(addr, port, &hints, &res))
		return NULL;
	return res;
}

/* One send and one receive of one entry, every send signaled. */
static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	return attr;
}

static void server(const char *addr, const char *port, int ready)
{
	struct rdma_addrinfo *res = info(addr, port, 1);
	struct ibv_qp_init_attr attr = qp_attr();
	struct rdma_cm_id *listen_id, *id;
	struct ibv_wc wc;
	char buf[64] = { 0 };
	if (!res)
		die("server", "rdma_getaddrinfo");
	if (rdma_create_ep(&listen_id, res, NULL, &attr))
		die("server", "rdma_create_ep");
	if (rdma_listen(listen_id, 1))
		die("server", "rdma_listen");
	if (write(ready, "l", 1) != 1)
		die("server", "write");
	if (rdma_get_request(listen_id, &id))
		die("server", "rdma_get_request");
	struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof buf);
	if (!mr)
		die("server", "rdma_reg_msgs");
	if (rdma_post_recv(id, NULL, buf, sizeof buf, mr))
		die("server", "rdma_post_recv");
	if (rdma_accept(id, NULL))
		die("server", "rdma_accept");
	if (rdma_get_recv_comp(id, &wc) <= 0)
		die("server", "rdma_get_recv_comp");
	printf("server: received \"%s\" (status %d)\n", buf, wc.status);
	int ok = wc.status == IBV_WC_SUCCESS && !strcmp(buf, MSG);
	rdma_disconnect(id);
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	fflush(stdout);
	_exit(ok ? 0 : 1);
}

static void client(const char *addr, const char *port, int ready)
{
	char c;
	if (read(ready, &c, 1) != 1)
		die("client", "read");
	struct rdma_addrinfo *res = info(addr, port, 0);
	struct ibv_qp_init_attr attr = qp_attr();
	struct rdma_cm_id *id;
	struct ibv_wc wc;
	char buf[64] = MSG;
	if (!res)
		die("client", "rdma_getaddrinfo");
	if (rdma_create_ep(&id, res, NULL, &attr))
		die("client", "rdma_create_ep");
	struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof buf);
	if (!mr)
		die("client", "rdma_reg_msgs");
	if (rdma_connect(id, NULL))
		die("client", "rdma_connect");
	if (rdma_post_send(id, NULL, buf, strlen(MSG) + 1, mr, 0))
		die("client", "rdma_post_send");
	if (rdma_get_send_comp(id, &wc) <= 0)
		die("client", "rdma_get_send_comp");
	printf("client: sent (status %d)\n", wc.status);
	rdma_disconnect(id);
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
	fflush(stdout);
	_exit(wc.status == IBV_WC_SUCCESS ? 0 : 1);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: cm_fork ADDR PORT\n");
		return 2;
	}
	/* The parent uses the device first: an id bound to its address, a PD, a region. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in a = { .sin_family = AF_INET };
	static char region[4096];
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("parent", "rdma_create_id");
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1)
		die("parent", "inet_pton");
	if (rdma_bind_addr(id, (struct sockaddr *)&a) || !id->verbs)
		die("parent", "rdma_bind_addr");
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	if (!pd)
		die("parent", "ibv_alloc_pd");
	struct ibv_mr *mr = ibv_reg_mr(pd, region, sizeof region, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("parent", "ibv_reg_mr");
	printf("parent: device in use\n");
	fflush(stdout);
	int p[2];
	if (pipe(p))
		die("parent", "pipe");
	pid_t s = fork();
	if (s == 0) {
		close(p[0]);
		server(argv[1], argv[2], p[1]);
	}
	pid_t c = fork();
	if (c == 0) {
		close(p[1]);
		client(argv[1], argv[2], p[0]);
	}
	close(p[0]);
	close(p[1]);
	int ss = -1, cs = -1;
	if (waitpid(s, &ss, 0) < 0 || waitpid(c, &cs, 0) < 0)
		die("parent", "waitpid");
	int sx = WIFEXITED(ss) ? WEXITSTATUS(ss) : 128 + WTERMSIG(ss);
	int cx = WIFEXITED(cs) ? WEXITSTATUS(cs) : 128 + WTERMSIG(cs);
	printf("server exit %d, client exit %d\n", sx, cx);
	/* The parent's objects are still its own. */
	int ok = sx == 0 && cx == 0 && !ibv_dereg_mr(mr) && !ibv_dealloc_pd(pd) &&
		 !rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	if (ok)
		printf("ok\n");
	return ok ? 0 : 1;
}
