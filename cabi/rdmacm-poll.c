/* rpoll and rselect of ferroce's librdmacm.so.1 (tools/build-cabi links this into it).
 *
 * With no rsocket among the descriptors they are libc's poll and select, called from this C
 * frame: a thread cancelled while it waits there (rping's CM thread is) unwinds through C
 * frames only, never through Rust. With an rsocket among them, ferroce's rpoll/rselect in
 * libibverbs.so.1 (cabi/src/rsocket.rs) make progress on the rsockets and wait. */
#include <poll.h>
#include <sys/select.h>

int ferroce_rsocket_in_poll(const struct pollfd *fds, nfds_t n);
int ferroce_rpoll(struct pollfd *fds, nfds_t n, int timeout);
int ferroce_rsocket_in_select(int n, fd_set *r, fd_set *w, fd_set *e);
int ferroce_rselect(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t);

int rpoll(struct pollfd *fds, nfds_t n, int timeout)
{
	if (!ferroce_rsocket_in_poll(fds, n))
		return poll(fds, n, timeout);
	return ferroce_rpoll(fds, n, timeout);
}

int rselect(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t)
{
	if (!ferroce_rsocket_in_select(n, r, w, e))
		return select(n, r, w, e, t);
	return ferroce_rselect(n, r, w, e, t);
}
