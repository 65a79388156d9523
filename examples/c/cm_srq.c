/*
 * cm_srq.c — rdma_create_srq_ex and rdma_create_srq on an RDMA-CM id, as librdmacm defines
 * them: the SRQ type must be in the mask (EINVAL otherwise), a missing PD is the id's (made
 * if the id has none), the id's `srq` and `pd` are set, and a QP created on the id with no
 * SRQ of its own takes the id's. Types a provider does not support (XRC here) are EOPNOTSUPP.
 *
 *   cm_srq ADDR   resolves ADDR (an address of the namespace) on one id and checks the
 *                 above on it; prints one line per step and "ok" at the end (exit 0).
 *
 * Built against the system's <rdma/rdma_cma.h> and <rdma/rdma_verbs.h> with -lrdmacm -libverbs.
 */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
	fprintf(stderr, "cm_srq: %s: %s\n", what, strerror(errno));
	exit(1);
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_event *e;
	struct rdma_cm_id *id;
	struct addrinfo *ai;

	if (argc != 2) {
		fprintf(stderr, "usage: cm_srq ADDR\n");
		return 2;
	}
	if (getaddrinfo(argv[1], "7480", NULL, &ai))
		die("getaddrinfo");
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000) || rdma_get_cm_event(ch, &e))
		die("rdma_resolve_addr");
	if (e->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
		fprintf(stderr, "cm_srq: %s\n", rdma_event_str(e->event));
		return 1;
	}
	rdma_ack_cm_event(e);

	struct ibv_srq_init_attr_ex a = { .attr = { .max_wr = 16, .max_sge = 1 } };
	/* No type in the mask. */
	if (rdma_create_srq_ex(id, &a) == 0 || errno != EINVAL) {
		fprintf(stderr, "cm_srq: no type: %d %s\n", errno, strerror(errno));
		return 1;
	}
	printf("no type: EINVAL\n");
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
	a.srq_type = IBV_SRQT_XRC;
	if (rdma_create_srq_ex(id, &a) == 0 || errno != EOPNOTSUPP) {
		fprintf(stderr, "cm_srq: XRC: %d %s\n", errno, strerror(errno));
		return 1;
	}
	if (id->srq) {
		fprintf(stderr, "cm_srq: a failed call set id->srq\n");
		return 1;
	}
	printf("XRC: EOPNOTSUPP\n");
	a.srq_type = IBV_SRQT_BASIC;
	a.srq_context = (void *)0x5eed;
	if (rdma_create_srq_ex(id, &a))
		die("rdma_create_srq_ex");
	if (!id->srq || !id->pd || a.pd != id->pd || id->srq->pd != id->pd ||
	    id->srq->srq_context != (void *)0x5eed) {
		fprintf(stderr, "cm_srq: srq %p pd %p (attr pd %p)\n", (void *)id->srq,
			(void *)id->pd, (void *)a.pd);
		return 1;
	}
	struct ibv_srq_attr sa;
	if (ibv_query_srq(id->srq, &sa) || sa.max_wr < 16)
		die("ibv_query_srq");
	printf("basic SRQ on the id, its PD, max_wr %u\n", sa.max_wr);

	/* A QP made on the id with no SRQ of its own receives through the id's. */
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq");
	struct ibv_qp_init_attr qa = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	if (rdma_create_qp(id, NULL, &qa))
		die("rdma_create_qp");
	if (id->qp->srq != id->srq) {
		fprintf(stderr, "cm_srq: the QP's srq %p, the id's %p\n", (void *)id->qp->srq,
			(void *)id->srq);
		return 1;
	}
	printf("the QP receives through the id's SRQ\n");
	struct ibv_recv_wr wr = { .wr_id = 1 }, *bad;
	if (ibv_post_srq_recv(id->srq, &wr, &bad))
		die("ibv_post_srq_recv");
	rdma_destroy_qp(id);
	rdma_destroy_srq(id);
	if (id->srq) {
		fprintf(stderr, "cm_srq: id->srq still set\n");
		return 1;
	}
	if (ibv_destroy_cq(cq))
		die("ibv_destroy_cq");
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	freeaddrinfo(ai);
	printf("ok\n");
	return 0;
}
