/* xport.h: the transport interface. One API, several backends chosen when a context is
 * opened ("verbs" over rdma-core, "tcp" over sockets with the same semantics).
 *
 * Model (mirrors RDMA RC verbs so that the tcp backend cannot hide a semantic the verbs
 * backend lacks):
 *   - a context (struct dm_xport) owns registered memory and a shared receive pool (SRQ);
 *   - a connection (struct dm_conn) is a reliable, ordered channel to one peer; it has its
 *     own completion queue, polled with dm_conn_poll / dm_conn_wait;
 *   - one-sided READ/WRITE/CAS/FAA name remote memory by (address, rkey) as returned by the
 *     peer's dm_xport_reg; the target checks key and bounds (the RNIC, or the tcp progress
 *     thread) and a violation is an error completion at the initiator;
 *   - two-sided SEND consumes one buffer posted with dm_xport_post_recv on the receiver's
 *     context; the RECV completion arrives on the connection the message came in on;
 *   - every operation that was posted produces exactly one completion if it was SIGNALED
 *     or failed; errors are completions (status -errno), never crashes or hangs. After an
 *     error the connection is in error state: later posts fail with -ENOTCONN and all
 *     outstanding work completes with -ECANCELED.
 *
 * Every connection starts with a handshake (protocol version, cluster name, HMAC-SHA256
 * proof of the cluster secret, see wire.h) that the backend performs inside connect/accept:
 * a connection is returned only once the peer has proved it knows the secret.
 *
 * Backends implement struct dm_xport_ops; callers use the inline forwarders below. An op a
 * backend lacks is NULL in the table, and the forwarder returns -ENOSYS.
 */
#ifndef DM_XPORT_H
#define DM_XPORT_H

#include "../dm.h"

struct dm_xport;
struct dm_conn;
struct dm_listener;
struct dm_notify;

/* Capability flags. */
enum {
	DM_XCAP_READ     = 1u << 0, /* one-sided READ */
	DM_XCAP_WRITE    = 1u << 1, /* one-sided WRITE */
	DM_XCAP_ATOMIC   = 1u << 2, /* 8-byte CAS and FAA */
	DM_XCAP_SEND     = 1u << 3, /* two-sided SEND/RECV */
	DM_XCAP_INLINE   = 1u << 4, /* small sends copied at post time (buffer reusable at once) */
	DM_XCAP_ZEROCOPY = 1u << 5, /* data moves without the target's CPU (real RDMA) */
};

/* Work request flags. */
enum {
	DM_WR_SIGNALED = 1u << 0, /* produce a completion on success (errors always complete) */
	DM_WR_INLINE   = 1u << 1, /* SEND only: copy at post time, lkey not needed */
};

enum dm_wc_opcode {
	DM_WC_READ = 1,
	DM_WC_WRITE,
	DM_WC_CAS,
	DM_WC_FAA,
	DM_WC_SEND,
	DM_WC_RECV,
};

/* A completion. status is 0 or -errno (-EACCES: bad key, -EFAULT: out of bounds,
 * -ECONNRESET: peer gone, -ECANCELED: flushed after an earlier error). */
struct dm_wc {
	uint64_t wr_id;
	int32_t status;
	uint32_t byte_len;   /* bytes transferred (RECV: message length) */
	uint8_t opcode;      /* enum dm_wc_opcode */
	uint8_t pad[7];
};

/* Registered memory. addr/len are local; rkey is what a peer needs to address it. */
struct dm_mr {
	void *addr;
	size_t len;
	uint32_t lkey;
	uint32_t rkey;
	void *priv;          /* backend's own handle */
};

enum { DM_MR_REMOTE_READ = 1, DM_MR_REMOTE_WRITE = 2, DM_MR_REMOTE_ATOMIC = 4 };
#define DM_MR_REMOTE_ALL (DM_MR_REMOTE_READ | DM_MR_REMOTE_WRITE | DM_MR_REMOTE_ATOMIC)

/* One element of a READ or WRITE batch. */
struct dm_rdma_wr {
	uint64_t wr_id;
	void *local;         /* inside a registered MR */
	struct dm_mr *mr;    /* the MR that holds local */
	uint64_t remote;     /* remote address as the peer registered it */
	uint32_t rkey;
	uint32_t len;
	uint32_t flags;      /* DM_WR_* */
};

/* A client identity a server context accepts in the handshake (HS_HELLO_CLIENT, wire.h). */
#define DM_XPORT_MAX_CREDS 40   /* [client.NAME] identities and the gateways' own */
struct dm_xport_cred {
	char name[64];            /* [A-Za-z0-9_.-]{1,63} */
	uint8_t secret[64];
	size_t secret_len;        /* 16..64 */
};

/* Options for opening a context. */
struct dm_xport_params {
	const char *backend;      /* "tcp", "verbs"; NULL: verbs if a device exists, else tcp */
	const char *cluster;      /* cluster name, checked in the handshake */
	const uint8_t *secret;    /* cluster secret; with client: that client's secret */
	size_t secret_len;
	const char *client;       /* connect as this client identity (NULL: as a cluster node) */
	const struct dm_xport_cred *creds;   /* accepted client identities (a compute node) */
	size_t n_creds;           /* at most DM_XPORT_MAX_CREDS */
	const char *device;       /* verbs: device name, NULL for the first active one */
	uint32_t max_send_wr;     /* outstanding sends+reads per connection (0: default 256) */
	uint32_t max_recv_wr;     /* shared receive pool depth (0: default 1024) */
	uint32_t max_inline;      /* inline send threshold in bytes (0: default 128) */
};

struct dm_xport_ops {
	size_t size;              /* sizeof(struct dm_xport_ops) the backend was built with */
	const char *name;
	uint32_t caps;

	void (*close)(struct dm_xport *x);
	int (*reg)(struct dm_xport *x, void *addr, size_t len, int access, struct dm_mr **out);
	int (*dereg)(struct dm_xport *x, struct dm_mr *mr);
	int (*post_recv)(struct dm_xport *x, void *buf, uint32_t len, struct dm_mr *mr,
			 uint64_t wr_id);

	int (*listen)(struct dm_xport *x, const char *addr, struct dm_listener **out);
	int (*accept)(struct dm_listener *l, int timeout_ms, struct dm_conn **out);
	void (*listener_close)(struct dm_listener *l);
	int (*listener_port)(struct dm_listener *l);
	int (*connect)(struct dm_xport *x, const char *addr, int timeout_ms,
		       struct dm_conn **out);
	void (*conn_close)(struct dm_conn *c);

	int (*read_batch)(struct dm_conn *c, const struct dm_rdma_wr *wr, int n);
	int (*write_batch)(struct dm_conn *c, const struct dm_rdma_wr *wr, int n);
	int (*cas)(struct dm_conn *c, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
		   uint64_t remote, uint32_t rkey, uint64_t expect, uint64_t desired,
		   uint32_t flags);
	int (*faa)(struct dm_conn *c, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
		   uint64_t remote, uint32_t rkey, uint64_t add, uint32_t flags);
	int (*send)(struct dm_conn *c, uint64_t wr_id, const void *buf, uint32_t len,
		    struct dm_mr *mr, uint32_t flags);
	int (*poll)(struct dm_conn *c, struct dm_wc *wc, int n);
	int (*wait)(struct dm_conn *c, struct dm_wc *wc, int n, int timeout_ms);
	int (*notify)(struct dm_conn *c, struct dm_notify *n);
};

/* Base structs: backends embed these first and downcast with container_of. */
struct dm_xport {
	const struct dm_xport_ops *ops;
	char cluster[64];
	uint8_t secret[64];
	size_t secret_len;
	char client[64];     /* we are this client identity ("" : a node) */
	struct dm_xport_cred creds[DM_XPORT_MAX_CREDS];   /* identities we accept */
	size_t n_creds;
};

struct dm_conn {
	struct dm_xport *x;
	char peer[64];       /* "host:port" for logs */
	char client[64];     /* accepted side: the peer's client identity, "" for a node; the
			      * backend refuses every one-sided access on such a connection */
};

struct dm_listener {
	struct dm_xport *x;
};

/* Open a context with the given backend. Returns NULL and sets errno (ENODEV: no RDMA
 * device for verbs; ENOENT: unknown backend name; EINVAL: bad params). */
struct dm_xport *dm_xport_open(const struct dm_xport_params *p);

/* Names of the backends compiled in, NULL-terminated. */
const char *const *dm_xport_backends(void);

/* Whether a backend can run on this machine (compiled in and, for verbs, a device exists).
 * On false, *why (if not NULL) says why, for skip messages. */
bool dm_xport_available(const char *backend, const char **why);

static inline void dm_xport_close(struct dm_xport *x) { if (x) x->ops->close(x); }
static inline uint32_t dm_xport_caps(const struct dm_xport *x) { return x->ops->caps; }
static inline const char *dm_xport_name(const struct dm_xport *x) { return x->ops->name; }

#define DM_XOP(obj_x, op) ((obj_x)->ops->op)
#define DM_XCALL(x, op, ...) \
	(DM_XOP(x, op) ? DM_XOP(x, op)(__VA_ARGS__) : -ENOSYS)

static inline int dm_xport_reg(struct dm_xport *x, void *addr, size_t len, int access,
			       struct dm_mr **out)
{ return DM_XCALL(x, reg, x, addr, len, access, out); }
static inline int dm_xport_dereg(struct dm_xport *x, struct dm_mr *mr)
{ return DM_XCALL(x, dereg, x, mr); }
static inline int dm_xport_post_recv(struct dm_xport *x, void *buf, uint32_t len,
				     struct dm_mr *mr, uint64_t wr_id)
{ return DM_XCALL(x, post_recv, x, buf, len, mr, wr_id); }
static inline int dm_xport_listen(struct dm_xport *x, const char *addr, struct dm_listener **out)
{ return DM_XCALL(x, listen, x, addr, out); }
static inline int dm_listener_accept(struct dm_listener *l, int timeout_ms, struct dm_conn **out)
{ return DM_XCALL(l->x, accept, l, timeout_ms, out); }
static inline int dm_listener_port(struct dm_listener *l)
{ return DM_XCALL(l->x, listener_port, l); }
static inline void dm_listener_close(struct dm_listener *l)
{ if (l) l->x->ops->listener_close(l); }
static inline int dm_xport_connect(struct dm_xport *x, const char *addr, int timeout_ms,
				   struct dm_conn **out)
{ return DM_XCALL(x, connect, x, addr, timeout_ms, out); }
static inline void dm_conn_close(struct dm_conn *c) { if (c) c->x->ops->conn_close(c); }

static inline int dm_conn_read_batch(struct dm_conn *c, const struct dm_rdma_wr *wr, int n)
{ return DM_XCALL(c->x, read_batch, c, wr, n); }
static inline int dm_conn_write_batch(struct dm_conn *c, const struct dm_rdma_wr *wr, int n)
{ return DM_XCALL(c->x, write_batch, c, wr, n); }
static inline int dm_conn_cas(struct dm_conn *c, uint64_t wr_id, uint64_t *local,
			      struct dm_mr *mr, uint64_t remote, uint32_t rkey,
			      uint64_t expect, uint64_t desired, uint32_t flags)
{ return DM_XCALL(c->x, cas, c, wr_id, local, mr, remote, rkey, expect, desired, flags); }
static inline int dm_conn_faa(struct dm_conn *c, uint64_t wr_id, uint64_t *local,
			      struct dm_mr *mr, uint64_t remote, uint32_t rkey, uint64_t add,
			      uint32_t flags)
{ return DM_XCALL(c->x, faa, c, wr_id, local, mr, remote, rkey, add, flags); }
static inline int dm_conn_send(struct dm_conn *c, uint64_t wr_id, const void *buf,
			       uint32_t len, struct dm_mr *mr, uint32_t flags)
{ return DM_XCALL(c->x, send, c, wr_id, buf, len, mr, flags); }
/* Non-blocking: returns the number of completions written to wc (0..n) or -errno. */
static inline int dm_conn_poll(struct dm_conn *c, struct dm_wc *wc, int n)
{ return DM_XCALL(c->x, poll, c, wc, n); }
/* Blocks up to timeout_ms (-1: forever) for at least one completion; 0 on timeout. */
static inline int dm_conn_wait(struct dm_conn *c, struct dm_wc *wc, int n, int timeout_ms)
{ return DM_XCALL(c->x, wait, c, wc, n, timeout_ms); }

/* Wake-ups for a thread that waits on several connections at once (and on work other
 * threads hand it), instead of polling them in a sleep loop (notify.c). The owner arms it,
 * looks at every source once more, and only then sleeps in dm_notify_wait; a producer that
 * adds work calls dm_notify_wake after making it visible. A wake costs a syscall only while
 * the owner is armed (about to sleep or asleep); none is lost, because the owner arms before
 * its last look and a producer that finds it armed writes the eventfd, which stays readable
 * until the owner drains it. */
struct dm_notify {
	int fd;              /* eventfd */
	int armed;           /* atomic: 1 from dm_notify_arm until the next wake or wait */
};
/* 0 or -errno (eventfd). */
int dm_notify_init(struct dm_notify *n);
void dm_notify_fini(struct dm_notify *n);
/* Any thread: work for the owner is visible; wake it if it is armed. */
void dm_notify_wake(struct dm_notify *n);
/* Owner: from now on producers wake us; look at every source once more before waiting. */
void dm_notify_arm(struct dm_notify *n);
/* Owner, armed: sleep until a wake (at once if one came since dm_notify_arm) or timeout_ms
 * (-1: none) passes; disarms. 1 woken, 0 timed out, -errno. */
int dm_notify_wait(struct dm_notify *n, int timeout_ms);

/* From now on, every completion queued on c (and its failure) wakes n (NULL: stop; n must
 * outlive c or be taken back first). c's completions are still taken with dm_conn_poll /
 * dm_conn_wait. 0 or -ENOSYS (the backend cannot, e.g. verbs: poll c instead). */
static inline int dm_conn_notify(struct dm_conn *c, struct dm_notify *n)
{
	const struct dm_xport_ops *o = c->x->ops;

	if (o->size <= offsetof(struct dm_xport_ops, notify) || !o->notify)
		return -ENOSYS;
	return o->notify(c, n);
}

/* Parse "host:port" (IPv4, [IPv6] or a name) into host and port strings. 0 or -EINVAL. */
int dm_addr_split(const char *addr, char *host, size_t hostlen, char *port, size_t portlen);

#endif /* DM_XPORT_H */
