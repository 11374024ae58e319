/* notify.c: the wake-up of a thread that waits on several connections and producers at once
 * (struct dm_notify, xport.h), over an eventfd. */
#include "xport.h"

#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

int dm_notify_init(struct dm_notify *n)
{
	n->armed = 0;
	n->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	return n->fd < 0 ? -errno : 0;
}

void dm_notify_fini(struct dm_notify *n)
{
	if (n->fd >= 0)
		close(n->fd);
	n->fd = -1;
}

void dm_notify_wake(struct dm_notify *n)
{
	uint64_t one = 1;

	if (!__atomic_exchange_n(&n->armed, 0, __ATOMIC_SEQ_CST))
		return;
	/* Only EAGAIN can fail (the counter is full): it is readable then anyway. */
	if (write(n->fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		dm_err("notify: eventfd write: %s", strerror(errno));
}

void dm_notify_arm(struct dm_notify *n)
{
	__atomic_store_n(&n->armed, 1, __ATOMIC_SEQ_CST);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);   /* the owner's last look comes after */
}

int dm_notify_wait(struct dm_notify *n, int timeout_ms)
{
	struct pollfd pfd = { .fd = n->fd, .events = POLLIN };
	uint64_t v;
	int rc;

	rc = poll(&pfd, 1, timeout_ms);
	if (rc < 0)
		rc = errno == EINTR ? 0 : -errno;
	if (rc > 0 && read(n->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		rc = -errno;
	__atomic_store_n(&n->armed, 0, __ATOMIC_SEQ_CST);
	return rc > 0 ? 1 : rc;
}
