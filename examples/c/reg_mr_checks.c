/*
 * reg_mr_checks.c — what ibv_reg_mr does with memory it cannot pin: EFAULT, not a region the
 * device faults on later. The kernel's pinning (ib_umem_get) answers the same for every
 * rdma-core provider (checked on Linux rxe, kernel 6.1) except for PROT_NONE memory without a
 * write right, which it pins anyway (FOLL_FORCE) and ferroce, reading through the mapping,
 * refuses.
 *
 *   - a range with an unmapped page in it: EFAULT (registered on demand instead: accepted);
 *   - a read-only mapping: accepted without write rights, EFAULT with local write or remote
 *     write;
 *   - a PROT_NONE mapping: EFAULT (the kernel registers it when no right writes it);
 *   - a range over two adjacent mappings (private and shared), both writable: accepted;
 *   - ibv_rereg_mr moving a region onto an unmapped range: IBV_REREG_MR_ERR_CMD with EFAULT,
 *     the region unchanged.
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -- ./reg_mr_checks
 * Prints what each call gave and "ok" when every check passes (exit 0).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rc_connect.h"

static void fail(const char *what, int e)
{
	fprintf(stderr, "reg_mr_checks: %s: %s\n", what, strerror(e));
	exit(1);
}

static int bad;

/* Register and report; deregister what was registered. Returns the errno (0: registered). */
static int try_reg(struct ibv_pd *pd, const char *what, void *addr, size_t len, int access,
		   int want)
{
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
	int e = mr ? 0 : errno;
	printf("%s: %s\n", what, mr ? "registered" : strerror(e));
	if (mr && ibv_dereg_mr(mr))
		fail("ibv_dereg_mr", errno);
	if (e != want) {
		fprintf(stderr, "reg_mr_checks: %s: wanted %s\n", what,
			want ? strerror(want) : "registered");
		bad = 1;
	}
	return e;
}

static char *map(size_t len, int prot)
{
	char *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		fail("mmap", errno);
	return p;
}

int main(void)
{
	struct ibv_device **list;
	union ibv_gid gid;
	const char *step;
	struct ibv_context *ctx = open_first_device(&list, &gid, &step);
	if (!ctx)
		fail(step, errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	int w = IBV_ACCESS_LOCAL_WRITE;

	char *three = map(3 * page, PROT_READ | PROT_WRITE);
	if (munmap(three + page, page))
		fail("munmap", errno);
	try_reg(pd, "a range with an unmapped page", three, 3 * page, w, EFAULT);
	try_reg(pd, "the same on demand", three, 3 * page, w | IBV_ACCESS_ON_DEMAND, 0);
	try_reg(pd, "its first page alone", three, page, w, 0);

	char *ro = map(page, PROT_READ);
	try_reg(pd, "read-only memory, no write rights", ro, page, IBV_ACCESS_REMOTE_READ, 0);
	try_reg(pd, "read-only memory with local write", ro, page, w, EFAULT);
	try_reg(pd, "read-only memory with remote write", ro, page, w | IBV_ACCESS_REMOTE_WRITE,
		EFAULT);
	char *none = map(page, PROT_NONE);
	try_reg(pd, "PROT_NONE memory", none, page, 0, EFAULT);

	/* Two adjacent writable mappings (private, then shared: the kernel keeps them apart). */
	char *two = map(2 * page, PROT_READ | PROT_WRITE);
	if (mmap(two + page, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED,
		 -1, 0) != two + page)
		fail("mmap MAP_FIXED", errno);
	try_reg(pd, "two adjacent writable mappings", two, 2 * page, w, 0);

	/* ibv_rereg_mr onto a hole: refused by the command, the region as it was. */
	struct ibv_mr *mr = ibv_reg_mr(pd, three, page, w);
	if (!mr)
		fail("ibv_reg_mr", errno);
	uint32_t lkey = mr->lkey;
	errno = 0;
	int r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, three + page, page, 0);
	int e = errno;
	printf("rereg onto an unmapped page: %d %s, region %s\n", r, strerror(e),
	       mr->addr == three && mr->lkey == lkey ? "unchanged" : "changed");
	if (r != IBV_REREG_MR_ERR_CMD || e != EFAULT || mr->addr != three)
		bad = 1;
	if (ibv_dereg_mr(mr))
		fail("ibv_dereg_mr", errno);

	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	if (bad)
		return 1;
	printf("ok\n");
	return 0;
}
