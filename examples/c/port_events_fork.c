/*
 * port_events_fork.c — port events in a child of fork(2). The parent opens the device and
 * closes it again, then forks at once; the child opens the device, prints "child ready" and
 * waits (up to 10 s) on the context's asynchronous event descriptor while whoever runs it takes
 * the interface's link away; it prints the event it got ("child event: IBV_EVENT_PORT_ERR,
 * port 1") or "child event: none". A child has none of its parent's threads, so a library
 * that watches links from a thread must start one of its own there.
 *
 * Built against the system's <infiniband/verbs.h> and -libverbs; run on ferroce with
 *   ferroce run -d IF -- ./port_events_fork
 * and take IF's link down once "child ready" is printed. Exits 0 once the child has ended.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct ibv_context *open_first(void)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || n < 1) {
		fprintf(stderr, "port_events_fork: no device\n");
		exit(1);
	}
	struct ibv_context *c = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	if (!c) {
		fprintf(stderr, "port_events_fork: ibv_open_device: %s\n", strerror(errno));
		exit(1);
	}
	return c;
}

int main(void)
{
	ibv_close_device(open_first());
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		struct ibv_context *c = open_first();
		printf("child ready\n");
		fflush(stdout);
		struct pollfd p = { .fd = c->async_fd, .events = POLLIN };
		if (poll(&p, 1, 10000) == 1) {
			struct ibv_async_event ev;
			if (!ibv_get_async_event(c, &ev)) {
				printf("child event: %s, port %d\n",
				       ev.event_type == IBV_EVENT_PORT_ERR ? "IBV_EVENT_PORT_ERR" :
				       ev.event_type == IBV_EVENT_PORT_ACTIVE ? "IBV_EVENT_PORT_ACTIVE" :
				       "another", ev.element.port_num);
				ibv_ack_async_event(&ev);
			}
		} else {
			printf("child event: none\n");
		}
		fflush(stdout);
		ibv_close_device(c);
		_exit(0);
	}
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
