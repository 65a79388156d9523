/*
 * device_memory.c — device memory as libibverbs offers it (ibv_alloc_dm, ibv_memcpy_to_dm,
 * ibv_memcpy_from_dm, ibv_reg_dm_mr, ibv_free_dm). On ferroce the "device" memory is memory
 * the library owns; the program reaches it only through the copy calls, peers and the
 * device through a zero-based region registered over it. Two RC QPs of one device,
 * connected to each other:
 *
 *   - ibv_query_device_ex reports max_dm_size;
 *   - allocation: zero bytes, more than max_dm_size, an unknown comp_mask: EINVAL;
 *   - copies in and out in 4-byte units; an offset or a length that is not, or a range past
 *     the end: EINVAL;
 *   - a region over it: IBV_ACCESS_ZERO_BASED required (EINVAL without), the range inside
 *     the memory (EINVAL past it); its address is 0, so a peer's WRITE and READ, and a local
 *     SEND's scatter/gather entry, name its bytes by their offset: each moves the right bytes;
 *   - ibv_rereg_mr of it: IBV_REREG_MR_ERR_CMD; ibv_free_dm while a region is over it: EBUSY,
 *     then 0 once it is deregistered.
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./device_memory
 * (rxe has no device memory: ibv_alloc_dm fails there with EOPNOTSUPP). Prints what each step
 * gave and "ok" when every check passes (exit 0).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "device_memory"
#include "rc_connect.h"
#define DM_LEN 4096

static const char *err_of(void *p)
{
	return p ? "made" : strerror(errno);
}

static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb;

/* One signaled request on QP `q`: its completion's status. */
static enum ibv_wc_status post(struct ibv_qp *q, enum ibv_wr_opcode op, uint64_t laddr,
			       uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	int e = ibv_post_send(q, &wr, &bad);
	if (e)
		fail("ibv_post_send", e);
	return poll_one_or_exit(cq, PROG).status;
}

int main(void)
{
	struct ibv_device **list;
	const char *step;
	union ibv_gid gid;
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_context *ctx = open_first_device(&list, &gid, &step);
	if (!ctx)
		fail(step, errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);
	struct ibv_device_attr_ex dx;
	memset(&dx, 0, sizeof(dx));
	if (ibv_query_device_ex(ctx, NULL, &dx))
		fail("ibv_query_device_ex", errno);
	printf("max_dm_size: %s\n", dx.max_dm_size >= DM_LEN ? ">= 4096" : "smaller");
	check(dx.max_dm_size >= DM_LEN, "max_dm_size");

	struct ibv_alloc_dm_attr da = {.length = 0};
	printf("ibv_alloc_dm of 0 bytes: %s\n", err_of(ibv_alloc_dm(ctx, &da)));
	da.length = dx.max_dm_size + 4;
	printf("ibv_alloc_dm past max_dm_size: %s\n", err_of(ibv_alloc_dm(ctx, &da)));
	da.length = DM_LEN;
	da.comp_mask = 1 << 7;
	printf("ibv_alloc_dm with an unknown comp_mask: %s\n", err_of(ibv_alloc_dm(ctx, &da)));
	da.comp_mask = 0;
	da.log_align_req = 6;
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &da);
	printf("ibv_alloc_dm of 4096 bytes: %s\n", err_of(dm));
	if (!dm)
		fail("ibv_alloc_dm", errno);

	char pat[256], back[256];
	for (int i = 0; i < 256; i++)
		pat[i] = (char)(i * 11 + 3);
	int r = ibv_memcpy_to_dm(dm, 8, pat, 256);
	memset(back, 0, sizeof(back));
	int r2 = ibv_memcpy_from_dm(back, dm, 8, 256);
	printf("copy in and out: %d %d, %s\n", r, r2,
	       memcmp(pat, back, 256) ? "data differ" : "data identical");
	check(!r && !r2 && !memcmp(pat, back, 256), "copies");
	printf("copy at offset 2: %s; of 6 bytes: %s; past the end: %s\n",
	       strerror(ibv_memcpy_to_dm(dm, 2, pat, 4)), strerror(ibv_memcpy_from_dm(back, dm, 0, 6)),
	       strerror(ibv_memcpy_to_dm(dm, DM_LEN - 4, pat, 8)));

	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	printf("ibv_reg_dm_mr without ZERO_BASED: %s\n", err_of(ibv_reg_dm_mr(pd, dm, 0, DM_LEN, acc)));
	printf("ibv_reg_dm_mr past the memory: %s\n",
	       err_of(ibv_reg_dm_mr(pd, dm, 0, DM_LEN + 4, acc | IBV_ACCESS_ZERO_BASED)));
	struct ibv_mr *dmr = ibv_reg_dm_mr(pd, dm, 0, DM_LEN, acc | IBV_ACCESS_ZERO_BASED);
	printf("ibv_reg_dm_mr: %s, address %p\n", err_of(dmr), dmr ? dmr->addr : NULL);
	if (!dmr)
		fail("ibv_reg_dm_mr", errno);

	char *host = calloc(1, 8192);
	if (!host)
		fail("calloc", ENOMEM);
	struct ibv_mr *hmr = ibv_reg_mr(pd, host, 8192, IBV_ACCESS_LOCAL_WRITE);
	if (!hmr)
		fail("ibv_reg_mr", errno);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!cq)
		fail("ibv_create_cq", errno);
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	qa = ibv_create_qp(pd, &ia);
	qb = ibv_create_qp(pd, &ia);
	if (!qa || !qb)
		fail("ibv_create_qp", errno);
	int e;
	step = rc_to_rts(qa, qb->qp_num, &gid, acc, 9, &e);
	if (!step)
		step = rc_to_rts(qb, qa->qp_num, &gid, acc, 9, &e);
	if (step)
		fail(step, e);

	/* A peer's WRITE into the device memory at offset 1024, named by that offset. */
	for (int i = 0; i < 2048; i++)
		host[i] = (char)(i * 7 + 1);
	enum ibv_wc_status st = post(qa, IBV_WR_RDMA_WRITE, (uintptr_t)host, 2048, hmr->lkey, 1024,
				     dmr->rkey);
	char got[2048];
	ibv_memcpy_from_dm(got, dm, 1024, 2048);
	printf("WRITE into device memory at offset 1024: %s, %s\n", ibv_wc_status_str(st),
	       memcmp(got, host, 2048) ? "data differ" : "data identical");
	check(st == IBV_WC_SUCCESS && !memcmp(got, host, 2048), "WRITE");
	/* A READ of the bytes copied in at offset 8. */
	st = post(qa, IBV_WR_RDMA_READ, (uintptr_t)(host + 4096), 256, hmr->lkey, 8, dmr->rkey);
	printf("READ from device memory at offset 8: %s, %s\n", ibv_wc_status_str(st),
	       memcmp(host + 4096, pat, 256) ? "data differ" : "data identical");
	check(st == IBV_WC_SUCCESS && !memcmp(host + 4096, pat, 256), "READ");
	/* A SEND gathered from the device memory (offset 8) into a host receive buffer. */
	struct ibv_sge rs = {.addr = (uintptr_t)(host + 6144), .length = 256, .lkey = hmr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 2, .sg_list = &rs, .num_sge = 1}, *rbad;
	if (ibv_post_recv(qa, &rw, &rbad))
		fail("ibv_post_recv", errno);
	st = post(qb, IBV_WR_SEND, 8, 256, dmr->lkey, 0, 0);
	struct ibv_wc rc = poll_one_or_exit(cq, PROG);
	printf("SEND from device memory: %s, receive %s, %s\n", ibv_wc_status_str(st),
	       ibv_wc_status_str(rc.status),
	       memcmp(host + 6144, pat, 256) ? "data differ" : "data identical");
	check(st == IBV_WC_SUCCESS && rc.status == IBV_WC_SUCCESS, "SEND");

	printf("ibv_rereg_mr of it: %d\n", ibv_rereg_mr(dmr, IBV_REREG_MR_CHANGE_ACCESS, NULL,
							 NULL, 0, IBV_ACCESS_LOCAL_WRITE));
	printf("ibv_free_dm with a region over it: %s\n", strerror(ibv_free_dm(dm)));
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(hmr);
	if (ibv_dereg_mr(dmr))
		fail("ibv_dereg_mr", errno);
	r = ibv_free_dm(dm);
	printf("then ibv_free_dm: %d\n", r);
	check(r == 0, "ibv_free_dm");
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(host);
	printf("ok\n");
	return 0;
}
