/*
 * cq_teardown.c — a completion thread waits in ibv_get_cq_event while the main thread destroys
 * the CQ and then the completion channel, reuses the heap and returns, the thread still
 * waiting. With the kernel's channel that thread sleeps in read(2) on a file that stays open
 * under it; ferroce's library must likewise keep what the waiting thread reads alive, and
 * never hand out a CQ destroyed after the thread looked at the channel's list.
 *
 *   ferroce run -- ./cq_teardown   prints one line per step and "ok" (exit 0). Meant to run
 *                                  under valgrind too: any read of freed memory shows there.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int waiting;

static void die(const char *what, int e)
{
	fprintf(stderr, "cq_teardown: %s: %s\n", what, strerror(e));
	exit(1);
}

static void *completions(void *arg)
{
	struct ibv_comp_channel *ch = arg;
	struct ibv_cq *cq;
	void *ctx;
	atomic_store(&waiting, 1);
	/* Nothing completes: this waits until the process exits. */
	if (ibv_get_cq_event(ch, &cq, &ctx) == 0) {
		fprintf(stderr, "cq_teardown: an event of CQ %p (destroyed)\n", (void *)cq);
		exit(1);
	}
	fprintf(stderr, "cq_teardown: ibv_get_cq_event returned: %s\n", strerror(errno));
	exit(1);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die("ibv_get_device_list", ENODEV);
	struct ibv_context *c = ibv_open_device(list[0]);
	if (!c)
		die("ibv_open_device", errno);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
	if (!ch)
		die("ibv_create_comp_channel", errno);
	struct ibv_cq *cq = ibv_create_cq(c, 8, (void *)0x5eed, ch, 0);
	if (!cq)
		die("ibv_create_cq", errno);
	if (ibv_req_notify_cq(cq, 0))
		die("ibv_req_notify_cq", errno);
	pthread_t t;
	if (pthread_create(&t, NULL, completions, ch))
		die("pthread_create", errno);
	while (!atomic_load(&waiting))
		usleep(1000);
	usleep(100000);
	int r = ibv_destroy_comp_channel(ch);
	if (r != EBUSY)
		die("ibv_destroy_comp_channel with a CQ bound (EBUSY expected)", r);
	if ((r = ibv_destroy_cq(cq)))
		die("ibv_destroy_cq", r);
	printf("CQ destroyed while the thread waits\n");
	usleep(50000);
	if ((r = ibv_destroy_comp_channel(ch)))
		die("ibv_destroy_comp_channel", r);
	printf("channel destroyed while the thread waits on it\n");
	fflush(stdout);
	/* Reuse the freed memory: anything still reading it reads garbage. */
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		void *p[64];
		for (int i = 0; i < 64; i++) {
			p[i] = malloc(8 + 8 * i);
			memset(p[i], 0xa5, 8 + 8 * i);
		}
		usleep(1000);
		for (int i = 0; i < 64; i++)
			free(p[i]);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) < 1500000000L);
	printf("ok\n");
	return 0;
}
