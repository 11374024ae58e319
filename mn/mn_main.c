/* mn_main.c: dmann-mn, the memory node. Allocates and registers its region, reloads the
 * last snapshot, and serves the control RPC (one thread per connection); compute nodes
 * read the region with one-sided READs, so this process's CPU is not on the read path.
 * SIGTERM / SIGINT: stop accepting, snapshot, exit 0. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "distance.h"
#include "fl_rpc.h"
#include "dm_config.h"
#include "mem.h"
#include "metrics.h"
#include "mn_fwd.h"
#if DM_HAVE_HTTP
#include "mn_flat.h"
#endif
#include "mn_store.h"
#if DM_HAVE_ETCD
#include "member.h"
#endif
#include "rpc.h"

struct mn {
	struct dm_cluster_cfg *cfg;
	const struct dm_node_cfg *node;
	struct dm_xport *x;
	struct mn_store *st;
	struct dm_mr *mr;
	struct dm_msgpool *pool;
	struct mn_fwd *fwd;      /* forwarding thread (CN-to-CN messages) */
	struct mn_flat *flat;    /* S3 Vectors flat store (mn_flat.c), NULL without it */
	char snap_path[1024];
	int active;              /* connection threads alive */
	pthread_mutex_t lock;
};

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: dmann-mn --config FILE --id N [--log LEVEL]\n\n"
		"Run memory node N of the cluster described by FILE: allocate its region\n"
		"(hugepages on the NIC's NUMA node when possible), reload its snapshot from\n"
		"data_dir, and serve the control RPC on its address. SIGTERM snapshots and exits.\n\n"
		"  --config FILE  cluster INI file (see docs/operations.md)\n"
		"  --id N         which [mn.N] section this process is\n"
		"  --log LEVEL    error|warn|info|debug (default info)\n"
		"  --help         this text\n");
}

static void fill_info(struct mn *m, struct dm_wire_ctl_info *info)
{
	uint32_t objs;
	uint64_t bytes;

	mn_store_stats(m->st, &objs, &bytes);
	memset(info, 0, sizeof(*info));
	info->region_addr = (uint64_t)(uintptr_t)m->st->region.addr;
	info->region_len = m->st->region.len;
	info->used = m->st->used;
	info->rkey = m->mr->rkey;
	info->node_id = m->node->id;
	info->objects = objs;
	info->huge = m->st->region.huge;
	info->numa_node = m->st->region.numa_node;
}

/* CTL_GEN_LIST: every used entry of the generation table. */
static int handle_gen_list(struct mn *m, uint8_t *out, uint32_t *olen)
{
	struct mn_gen_entry e[MN_MAX_GEN_INDEXES];
	struct dm_wire_ctl_gen_list l = { 0 };

	_Static_assert(MN_MAX_GEN_INDEXES <= DM_MAX_GRAPHS, "gen_list holds every entry");
	l.count = mn_store_gen_list(m->st, e, MN_MAX_GEN_INDEXES);
	for (uint32_t i = 0; i < l.count; i++)
		l.e[i] = (struct dm_wire_ctl_gen_entry){
			.index = e[i].index, .current = e[i].current, .retired = e[i].retired,
			.flags = (e[i].has_current ? DM_GEN_F_CURRENT : 0) |
				 (e[i].has_retired ? DM_GEN_F_RETIRED : 0) };
	*olen = (uint32_t)dm_wire_ctl_gen_list_encode(out, &l);
	return 0;
}

/* CTL_GEN_PUBLISH / CTL_GEN_REPORT / CTL_GEN_DROP: the generation table of mn_store. */
static int handle_gen(struct mn *m, const struct dm_wire_hdr *h, const uint8_t *body,
		      uint8_t *out, uint32_t *olen)
{
	struct dm_wire_ctl_gen g;
	struct dm_wire_ctl_gen_state ws;
	struct mn_gen_state gs;
	int rc;

	rc = dm_wire_ctl_gen_decode(body, sizeof(g), &g);
	if (rc)
		return rc;
	if (h->op == DM_OP_CTL_GEN_PUBLISH) {
		if (g.cn != DM_GEN_NO_CN)
			return -EINVAL;
		rc = mn_store_gen_publish(m->st, g.index, g.gen, &gs);
		if (rc == 0)
			dm_info("mn%u: index %u generation %llu published", m->node->id, g.index,
				(unsigned long long)g.gen);
	} else if (h->op == DM_OP_CTL_GEN_DROP) {
		if (g.cn != DM_GEN_NO_CN)
			return -EINVAL;
		rc = mn_store_gen_drop(m->st, g.index, g.gen, &gs);
		if (rc == 0)
			dm_info("mn%u: index %u (generation %llu) dropped", m->node->id, g.index,
				(unsigned long long)g.gen);
	} else {
		if (g.cn != DM_GEN_NO_CN && g.cn >= m->cfg->n_cn)
			return -EINVAL;   /* not a compute node of this cluster file */
		rc = mn_store_gen_report(m->st, g.index, g.cn, g.gen, &gs);
	}
	if (rc)
		return rc;
	ws = (struct dm_wire_ctl_gen_state){
		.current = gs.current, .retired = gs.retired, .waiting = gs.waiting,
		.lease_ms = (uint32_t)(m->st->lease_ns / 1000000ull),
		.flags = (gs.has_current ? DM_GEN_F_CURRENT : 0) |
			 (gs.has_retired ? DM_GEN_F_RETIRED : 0) };
	dm_wire_ctl_gen_state_encode(out, &ws);
	*olen = sizeof(ws);
	return 0;
}

/* CTL_ATOMIC: a CAS or FAA by this CPU, for devices without remote atomics (what the tcp
 * backend's progress thread does for its one-sided atomics). */
static int handle_atomic(struct mn *m, const uint8_t *body, uint8_t *out, uint32_t *olen)
{
	struct dm_wire_ctl_atomic a;
	uintptr_t base = (uintptr_t)m->st->region.addr;
	uint64_t *p;
	int rc = dm_wire_ctl_atomic_decode(body, sizeof(a), &a);

	if (rc)
		return rc;
	if (a.addr < base || a.addr % 8 || a.addr - base > m->st->region.len - 8)
		return -EFAULT;
	p = (uint64_t *)(uintptr_t)a.addr;
	if (a.op == DM_CTL_ATOMIC_CAS) {
		uint64_t old = a.compare;

		__atomic_compare_exchange_n(p, &old, a.value, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_SEQ_CST);
		a.compare = old;
	} else {
		a.compare = __atomic_fetch_add(p, a.value, __ATOMIC_SEQ_CST);
	}
	dm_wire_ctl_atomic_encode(out, &a);
	*olen = sizeof(a);
	return 0;
}

/* Serve one control request; writes the response body into out. Returns its status. */
static int handle(struct mn *m, const struct dm_wire_hdr *h, const uint8_t *body,
		  uint8_t *out, uint32_t *olen)
{
	struct dm_wire_ctl_obj o, r;
	struct dm_wire_ctl_info info;
	struct mn_obj mo;
	uint64_t off;
	int rc;

	*olen = 0;
	if (h->op == DM_OP_CTL_GEN_PUBLISH || h->op == DM_OP_CTL_GEN_REPORT ||
	    h->op == DM_OP_CTL_GEN_DROP)
		return handle_gen(m, h, body, out, olen);
	if (h->op == DM_OP_CTL_GEN_LIST)
		return handle_gen_list(m, out, olen);
	if (h->op == DM_OP_CTL_ATOMIC)
		return handle_atomic(m, body, out, olen);
	if (h->op != DM_OP_CTL_INFO && h->op != DM_OP_CTL_SNAPSHOT)
		dm_wire_ctl_obj_decode(body, sizeof(o), &o);
	switch (h->op) {
	case DM_OP_CTL_INFO:
		fill_info(m, &info);
		dm_wire_ctl_info_encode(out, &info);
		*olen = sizeof(info);
		return 0;
	case DM_OP_CTL_ALLOC:
		rc = mn_store_alloc(m->st, o.key, o.len, &off);
		if (rc)
			return rc;
		r = (struct dm_wire_ctl_obj){ .key = o.key, .len = o.len,
			.addr = (uint64_t)(uintptr_t)m->st->region.addr + off };
		break;
	case DM_OP_CTL_COMMIT:
		/* aux: crc32 | DM_CTL_COMMIT_MUTABLE */
		if (o.aux & ~(UINT64_C(0xffffffff) | DM_CTL_COMMIT_MUTABLE))
			return -EINVAL;
		return mn_store_commit(m->st, o.key, o.len, (uint32_t)o.aux,
				       (o.aux & DM_CTL_COMMIT_MUTABLE) ? MN_OBJ_MUTABLE : 0);
	case DM_OP_CTL_LOOKUP:
		rc = mn_store_lookup(m->st, o.key, &mo);
		if (rc)
			return rc;
		r = (struct dm_wire_ctl_obj){ .key = mo.key, .len = mo.len,
			.addr = (uint64_t)(uintptr_t)m->st->region.addr + mo.off, .aux = mo.crc };
		break;
	case DM_OP_CTL_DROP:
		rc = mn_store_drop(m->st, o.key, o.aux);
		r = (struct dm_wire_ctl_obj){ .len = (uint64_t)rc };
		break;
	case DM_OP_CTL_SNAPSHOT:
		rc = mn_store_snapshot(m->st, m->snap_path);
		if (rc)
			dm_err("mn%u: snapshot to %s failed: %s", m->node->id, m->snap_path,
			       strerror(-rc));
		else
			dm_info("mn%u: snapshot written to %s", m->node->id, m->snap_path);
		return rc;
	default:
		return -EPROTO;
	}
	dm_wire_ctl_obj_encode(out, &r);
	*olen = sizeof(r);
	return 0;
}

/* FL_SNAPDELTA (wire.h): the snapshot brought up to date for the ranges an online
 * writer changed. Returns a transport error (the connection is closed); the request's own
 * status goes back to the peer. */
static int serve_snapdelta(struct mn *m, struct dm_rpc_chan *ch, const struct dm_wire_hdr *h,
			   const uint8_t *buf, uint32_t len, uint64_t wr_id)
{
	struct mn_range *r = NULL;
	uint8_t *req, body[4];
	size_t rlen;
	uint32_t n = 0;
	bool full = false;
	int rc, st = 0;

	rc = dm_wire_fl_check(h, buf, len);
	if (rc || (h->op & 1)) {
		dm_msgpool_repost(ch->pool, wr_id);
		return rc ? rc : -EPROTO;
	}
	rc = dm_fl_recv_rest(ch, h, buf, len, wr_id, 10000, &req, &rlen);
	if (rc)
		return rc;
	st = mn_snapdelta_parse(req, rlen, (uint64_t)(uintptr_t)m->st->region.addr, &r, &n);
	free(req);
	if (!st) {
		uint64_t t0 = dm_now_ns();

		st = mn_store_snapshot_delta(m->st, m->snap_path, r, n, &full);
		if (st)
			dm_err("mn%u: snapshot delta of %u ranges to %s failed: %s", m->node->id, n,
			       m->snap_path, strerror(-st));
		else
			dm_info("mn%u: %s snapshot for %u ranges in %.3f s", m->node->id,
				 full ? "full" : "delta", n, (double)(dm_now_ns() - t0) / 1e9);
	}
	free(r);
	dm_put_le32(body, full ? 1 : 0);
	return dm_fl_send(ch, h->op + 1, h->req_id, st, st ? NULL : body, st ? 0 : 4,
			  DM_FL_MIN_MSG);
}

struct conn_arg {
	struct mn *m;
	struct dm_conn *c;
};

/* One control connection: requests in, responses out, until the peer leaves or we stop. */
static void *conn_thread(void *arg)
{
	struct conn_arg *a = arg;
	struct mn *m = a->m;
	struct dm_rpc_chan ch;
	uint8_t out[DM_MAX(256, DM_WIRE_CTL_GEN_LIST_MAX)];
	int rc;

	rc = dm_rpc_chan_init(&ch, a->c, m->pool, 4096, 10000);
	if (rc) {
		dm_err("mn%u: cannot set up a channel to %s: %s", m->node->id, a->c->peer,
		       strerror(-rc));
		goto out_close;
	}
	while (!stopping) {
		struct dm_wire_hdr h;
		uint8_t *buf;
		uint32_t len, olen;
		uint64_t wr_id;
		int st;

		rc = dm_rpc_recv(&ch, 200, &buf, &len, &wr_id);
		if (rc == 0)
			continue;
		if (rc < 0) {
			if (rc != -ECONNRESET && rc != -ECANCELED && rc != -ENOTCONN)
				dm_warn("mn%u: connection %s: %s", m->node->id, a->c->peer,
					strerror(-rc));
			break;
		}
		rc = dm_wire_hdr_decode(buf, len, &h);
		if (rc == 0 && h.op == DM_OP_FWD_HELLO && m->fwd) {
			struct dm_wire_fwd_hello hello;

			/* A compute node's forwarding connection: the forwarding thread owns it
			 * from now on. */
			rc = dm_wire_fwd_check(&h, buf, len);
			if (rc == 0)
				dm_wire_fwd_hello_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN,
							 &hello);
			dm_msgpool_repost(m->pool, wr_id);
			if (rc) {
				dm_warn("mn%u: malformed FWD_HELLO from %s; closing", m->node->id,
					a->c->peer);
				break;
			}
			dm_rpc_chan_fini(&ch);
			mn_fwd_adopt(m->fwd, a->c, &hello);
			goto out_handed_over;
		}
		if (rc == 0 && h.op == DM_OP_FL_SNAPDELTA) {
			rc = serve_snapdelta(m, &ch, &h, buf, len, wr_id);
			if (rc) {
				dm_warn("mn%u: snapshot delta from %s: %s; closing", m->node->id,
					a->c->peer, strerror(-rc));
				break;
			}
			continue;
		}
#if DM_HAVE_HTTP
		if (rc == 0 && h.op >= DM_OP_FL_FIRST && h.op <= DM_OP_FL_LAST && m->flat) {
			/* S3 flat-index RPC (streams; mn_flat.c reposts the buffers). */
			rc = mn_flat_serve(m->flat, &ch, &h, buf, len, wr_id);
			if (rc) {
				dm_warn("mn%u: S3 request from %s: %s; closing", m->node->id,
					a->c->peer, strerror(-rc));
				break;
			}
			continue;
		}
#endif
		if (rc == 0)
			rc = dm_wire_ctl_check(&h, len);
		if (rc || (h.op & 1)) {
			/* A peer that sends garbage is not one we want to keep talking to. */
			dm_warn("mn%u: malformed control message from %s (%s); closing",
				m->node->id, a->c->peer, rc ? strerror(-rc) : "a response");
			dm_msgpool_repost(m->pool, wr_id);
			break;
		}
		st = handle(m, &h, buf + DM_WIRE_HDR_LEN, out, &olen);
		dm_msgpool_repost(m->pool, wr_id);
		rc = dm_rpc_send(&ch, h.op + 1, h.req_id, st, st ? NULL : out, st ? 0 : olen);
		if (rc) {
			dm_warn("mn%u: reply to %s failed: %s", m->node->id, a->c->peer,
				strerror(-rc));
			break;
		}
	}
	dm_rpc_chan_fini(&ch);
out_close:
	dm_conn_close(a->c);
out_handed_over:
	pthread_mutex_lock(&m->lock);
	m->active--;
	pthread_mutex_unlock(&m->lock);
	free(a);
	return NULL;
}

/* Prometheus text for GET /metrics. */
static void mn_metrics(void *arg, FILE *out)
{
	struct mn *m = arg;
	uint32_t objs;
	uint64_t bytes;

	mn_store_stats(m->st, &objs, &bytes);
	fprintf(out, "# HELP dmann_mn_region_bytes Size of the registered region.\n"
		     "# TYPE dmann_mn_region_bytes gauge\n"
		     "dmann_mn_region_bytes{node=\"%u\"} %zu\n"
		     "# HELP dmann_mn_region_used_bytes Bytes allocated to objects.\n"
		     "# TYPE dmann_mn_region_used_bytes gauge\n"
		     "dmann_mn_region_used_bytes{node=\"%u\"} %llu\n"
		     "# HELP dmann_mn_objects Committed objects (HNSW blocks, metadata).\n"
		     "# TYPE dmann_mn_objects gauge\n"
		     "dmann_mn_objects{node=\"%u\"} %u\n"
		     "# HELP dmann_mn_object_bytes Bytes of committed objects.\n"
		     "# TYPE dmann_mn_object_bytes gauge\n"
		     "dmann_mn_object_bytes{node=\"%u\"} %llu\n"
		     "# HELP dmann_mn_hugepages Whether the region is on hugepages.\n"
		     "# TYPE dmann_mn_hugepages gauge\n"
		     "dmann_mn_hugepages{node=\"%u\"} %d\n",
		m->node->id, m->st->region.len, m->node->id, (unsigned long long)m->st->used,
		m->node->id, objs, m->node->id, (unsigned long long)bytes, m->node->id,
		m->st->region.huge ? 1 : 0);
#if DM_HAVE_HTTP
	if (m->flat)
		mn_flat_metrics(m->flat, out);
#endif
}

static int open_store(struct mn *m)
{
	char dir[1024], err[512];
	int numa = m->node->numa_node, rc;

	if (numa < 0 && m->node->device[0])
		numa = dm_dev_numa_node(m->node->device);
	m->st = mn_store_new(m->node->region_bytes, numa, m->node->hugepages);
	if (!m->st) {
		dm_err("mn%u: cannot allocate a %llu-byte region: %s", m->node->id,
		       (unsigned long long)m->node->region_bytes, strerror(errno));
		return -errno;
	}
	dm_info("mn%u: region %zu bytes on %s, NUMA node %d", m->node->id, m->st->region.len,
		m->st->region.huge ? "hugepages" : "ordinary pages", m->st->region.numa_node);
	if (dm_cluster_path(m->cfg, m->node->data_dir, dir, sizeof(dir)) ||
	    (size_t)snprintf(m->snap_path, sizeof(m->snap_path), "%s/region.snap", dir) >=
		    sizeof(m->snap_path)) {
		dm_err("mn%u: data_dir path too long", m->node->id);
		return -ENAMETOOLONG;
	}
	if (mkdir(dir, 0700) && errno != EEXIST) {
		dm_err("mn%u: cannot create data_dir %s: %s", m->node->id, dir, strerror(errno));
		return -errno;
	}
#if DM_HAVE_HTTP
	{
		char fdir[1100];

		snprintf(fdir, sizeof(fdir), "%s/flat", dir);
		m->flat = mn_flat_open(fdir, m->node->id, &m->cfg->mn_set);
		if (!m->flat)
			return -errno;
	}
#endif
	rc = mn_store_restore(m->st, m->snap_path, err, sizeof(err));
	if (rc == 0) {
		uint32_t n;
		uint64_t b;

		mn_store_stats(m->st, &n, &b);
		dm_info("mn%u: reloaded %u objects (%llu bytes) from %s", m->node->id, n,
			(unsigned long long)b, m->snap_path);
	} else if (rc != -ENOENT) {
		/* Refuse to start on a damaged snapshot rather than silently serve nothing. */
		dm_err("mn%u: %s (move it away to start empty)", m->node->id, err);
		return rc;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct mn m = { .lock = PTHREAD_MUTEX_INITIALIZER };
	const char *config = NULL;
	struct dm_listener *lis = NULL;
	struct dm_metrics *metrics = NULL;
	void *member = NULL;   /* struct dm_member: the node's heartbeat in etcd */
	struct sigaction sa = { .sa_handler = on_signal };
	char err[1024];
	long id = -1;
	int c, rc, status = 1;

	c = dm_node_args(argc, argv, "dmann-mn", usage, &config, &id);
	if (c >= 0)
		return c;

	dm_blas_node_threads();   /* before any thread: no spinning BLAS pool */
	m.cfg = calloc(1, sizeof(*m.cfg));
	if (!m.cfg)
		return 1;
	rc = dm_config_load(config, m.cfg, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dmann-mn: %s\n", err);
		goto out_free_cfg;
	}
	m.node = dm_config_node(m.cfg, DM_ROLE_MN, (uint32_t)id);
	if (!m.node) {
		fprintf(stderr, "dmann-mn: %s has no [mn.%ld] (it defines %u memory nodes)\n",
			config, id, m.cfg->n_mn);
		goto out_free_cfg;
	}
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (open_store(&m))
		goto out_free_store;
	/* Every compute node of the cluster file acknowledges each new index generation. */
	mn_store_gen_setup(m.st, m.cfg->n_cn, m.cfg->cn_all.lease_ms);
	m.x = dm_cluster_xport(m.cfg, m.node->device);
	if (!m.x)
		goto out_free_store;
	rc = dm_xport_reg(m.x, m.st->region.addr, m.st->region.len, DM_MR_REMOTE_ALL, &m.mr);
	if (rc) {
		dm_err("mn%u: cannot register the region: %s (memlock limit? ulimit -l)",
		       m.node->id, strerror(-rc));
		goto out_close_x;
	}
	/* Forwarded queries carry whole vectors: buffers as large as a compute node's. */
	m.pool = dm_msgpool_new(m.x, 1024, 16384);
	if (!m.pool) {
		dm_err("mn%u: cannot post receive buffers: %s", m.node->id, strerror(errno));
		goto out_dereg;
	}
	m.fwd = mn_fwd_start(m.x, m.pool, m.node->id);
	if (!m.fwd) {
		dm_err("mn%u: cannot start the forwarding thread: %s", m.node->id, strerror(errno));
		goto out_free_pool;
	}
	rc = dm_xport_listen(m.x, m.node->address, &lis);
	if (rc) {
		dm_err("mn%u: cannot listen on %s: %s", m.node->id, m.node->address,
		       strerror(-rc));
		goto out_free_pool;
	}
	dm_info("mn%u: serving on %s (%s transport)", m.node->id, m.node->address,
		dm_xport_name(m.x));
	if (m.node->metrics[0]) {
		metrics = dm_metrics_start(m.node->metrics, mn_metrics, &m);
		if (!metrics)
			dm_warn("mn%u: no metrics endpoint on %s: %s", m.node->id, m.node->metrics,
				errno == ENOSYS ? "built without libmicrohttpd" : strerror(errno));
	}
	if (m.cfg->etcd[0]) {
#if DM_HAVE_ETCD
		member = dm_member_join(m.cfg, "mn", m.node->id, m.node->address);
#else
		dm_warn("mn%u: built without the etcd client (libcurl): not registering in %s",
			m.node->id, m.cfg->etcd);
#endif
	}

	while (!stopping) {
		struct dm_conn *conn;
		struct conn_arg *a;
		pthread_t t;

		mn_store_gen_tick(m.st);   /* the lease of compute nodes gone silent */
		rc = dm_listener_accept(lis, 200, &conn);
		if (rc) {
			/* Timeouts are how we notice `stopping`; failed handshakes were already
			 * logged by the transport. Either way keep serving. */
			if (rc != -ETIMEDOUT && rc != -EAGAIN && rc != -EINTR)
				dm_debug("mn%u: accept: %s", m.node->id, strerror(-rc));
			continue;
		}
		a = malloc(sizeof(*a));
		if (!a) {
			dm_conn_close(conn);
			continue;
		}
		*a = (struct conn_arg){ .m = &m, .c = conn };
		pthread_mutex_lock(&m.lock);
		m.active++;
		pthread_mutex_unlock(&m.lock);
		if (pthread_create(&t, NULL, conn_thread, a)) {
			pthread_mutex_lock(&m.lock);
			m.active--;
			pthread_mutex_unlock(&m.lock);
			dm_conn_close(conn);
			free(a);
			continue;
		}
		pthread_detach(t);
	}
	dm_info("mn%u: stopping", m.node->id);
#if DM_HAVE_ETCD
	dm_member_stop(member);   /* leave: the key goes at once */
#endif
	(void)member;
	dm_metrics_stop(metrics);
	dm_listener_close(lis);
	/* Connection threads notice `stopping` within their 200 ms receive timeout. */
	for (int i = 0; i < 100; i++) {
		int n;

		pthread_mutex_lock(&m.lock);
		n = m.active;
		pthread_mutex_unlock(&m.lock);
		if (!n)
			break;
		usleep(50000);
	}
	mn_fwd_stop(m.fwd);
	m.fwd = NULL;
#if DM_HAVE_HTTP
	mn_flat_close(m.flat);       /* snapshot of the flat store */
	m.flat = NULL;
#endif
	rc = mn_store_snapshot(m.st, m.snap_path);
	if (rc)
		dm_err("mn%u: final snapshot failed: %s", m.node->id, strerror(-rc));
	else
		status = 0;
out_free_pool:
	mn_fwd_stop(m.fwd);
	dm_msgpool_free(m.pool);
out_dereg:
	dm_xport_dereg(m.x, m.mr);
out_close_x:
	dm_xport_close(m.x);
out_free_store:
#if DM_HAVE_HTTP
	if (m.flat)
		mn_flat_close(m.flat);
#endif
	mn_store_free(m.st);
out_free_cfg:
	free(m.cfg);
	return status;
}
