/* cstate.c: the up-set in etcd (cstate.h): its JSON form, the controller that keeps it
 * (election by put-if-absent of a leader key under a lease, guarded writes), and the watch
 * through which the nodes follow it. */
#include "cstate.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "etcd.h"

#define CST_TIMEOUT_MS 2000
#define CTL_PERIOD_MS 300
/* A poll ends with the first events, or after this long without any: the bound only
 * decides how often an idle watch opens a new stream (each one a watch created and
 * cancelled in etcd: with 1 s, 15 a second on an idle 2 MN + 3 CN cluster) and how soon
 * an etcd that stopped answering is noticed; stopping a watch aborts its poll at once.
 * 1 s was also too short for an etcd starved of CPU (the soft-RoCE VM under TCG: created
 * after more than a second, logged as unreachable again and again). */
#define WATCH_POLL_MS 10000

/* ---- the value ---- */

static int parse_ids(json_t *a, uint64_t *set)
{
	size_t i;
	json_t *v;

	if (!json_is_array(a) || json_array_size(a) > 64 * DM_UPSET_WORDS)
		return -EBADMSG;
	memset(set, 0, DM_UPSET_WORDS * sizeof(*set));
	json_array_foreach(a, i, v) {
		json_int_t id;

		if (!json_is_integer(v) || (id = json_integer_value(v)) < 0 ||
		    id >= 64 * DM_UPSET_WORDS || dm_upset_has(set, (uint32_t)id))
			return -EBADMSG;
		dm_upset_set(set, (uint32_t)id, true);
	}
	return 0;
}

int dm_upset_parse(const void *txt, size_t len, struct dm_upset *u)
{
	json_error_t je;
	json_t *o = json_loadb(txt, len, JSON_REJECT_DUPLICATES, &je), *mn, *cn;
	json_int_t ver, t;
	const char *ctl;
	int rc = -EBADMSG;

	if (!o)
		return -EBADMSG;
	memset(u, 0, sizeof(*u));
	if (json_unpack(o, "{s:I, s:I, s:s, s:o, s:o}", "version", &ver, "time", &t,
			"controller", &ctl, "mn", &mn, "cn", &cn) || ver < 1 || t < 0 ||
	    strlen(ctl) >= sizeof(u->controller) || parse_ids(mn, u->mn) || parse_ids(cn, u->cn))
		goto out;
	u->version = ver;
	u->time = t;
	snprintf(u->controller, sizeof(u->controller), "%s", ctl);
	rc = 0;
out:
	json_decref(o);
	return rc;
}

static json_t *ids_json(const uint64_t *set)
{
	json_t *a = json_array();

	for (uint32_t i = 0; a && i < 64 * DM_UPSET_WORDS; i++)
		if (dm_upset_has(set, i) && json_array_append_new(a, json_integer(i))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

char *dm_upset_format(const struct dm_upset *u)
{
	json_t *o = json_pack("{s:I, s:I, s:s, s:o*, s:o*}", "version", (json_int_t)u->version,
			      "time", (json_int_t)u->time, "controller", u->controller,
			      "mn", ids_json(u->mn), "cn", ids_json(u->cn));
	char *s = o && json_object_size(o) == 5 ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

int dm_placement_parse(const void *txt, size_t len, struct dm_placement *p)
{
	json_error_t je;
	json_t *o = json_loadb(txt, len, JSON_REJECT_DUPLICATES, &je), *ret;
	json_int_t ver, t;
	const char *by;
	int rc = -EBADMSG;

	if (!o)
		return -EBADMSG;
	memset(p, 0, sizeof(*p));
	if (json_unpack(o, "{s:I, s:I, s:s, s:o}", "version", &ver, "time", &t, "by", &by,
			"retired", &ret) || ver < 1 || t < 0 || strlen(by) >= sizeof(p->by) ||
	    parse_ids(ret, p->retired))
		goto out;
	p->version = ver;
	p->time = t;
	snprintf(p->by, sizeof(p->by), "%s", by);
	rc = 0;
out:
	json_decref(o);
	return rc;
}

char *dm_placement_format(const struct dm_placement *p)
{
	json_t *o = json_pack("{s:I, s:I, s:s, s:o*}", "version", (json_int_t)p->version,
			      "time", (json_int_t)p->time, "by", p->by,
			      "retired", ids_json(p->retired));
	char *s = o && json_object_size(o) == 4 ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

/* The value of /dmann/<cluster>/<name>: *val (free()), *len, *mod (0 and *val NULL when
 * there is none). */
static int key_get(struct dm_etcd *e, const char *cluster, const char *name, void **val,
		   size_t *len, int64_t *mod)
{
	char key[192];
	int rc;

	snprintf(key, sizeof(key), "/dmann/%s/%s", cluster, name);
	*val = NULL;
	*mod = 0;
	rc = dm_etcd_get(e, key, val, len, mod);
	return rc == -ENOENT ? 0 : rc;
}

int dm_placement_read(const char *endpoints, const char *cluster, int timeout_ms,
		      struct dm_placement *p, char *err, size_t errlen)
{
	struct dm_etcd *e = dm_etcd_open(endpoints, timeout_ms);
	void *val;
	size_t len;
	int64_t mod;
	int rc;

	memset(p, 0, sizeof(*p));
	if (!e) {
		rc = -errno;
		snprintf(err, errlen, "etcd endpoints '%s': %s", endpoints, strerror(-rc));
		return rc;
	}
	rc = key_get(e, cluster, "placement", &val, &len, &mod);
	if (rc)
		snprintf(err, errlen, "etcd %s: %s", endpoints, dm_etcd_errmsg(e));
	else if (!val)
		rc = -ENOENT;
	else if ((rc = dm_placement_parse(val, len, p)))
		snprintf(err, errlen, "etcd %s: the placement is not valid JSON of its form",
			 endpoints);
	else
		p->mod_revision = mod;
	free(val);
	dm_etcd_close(e);
	return rc;
}

/* ---- the controller ---- */

struct dm_ctl {
	struct dm_etcd *e;
	const struct dm_cluster_cfg *cfg;
	char me[16], prefix[160], ctl_key[192], up_key[192], *val;
	uint32_t ttl_s, grace_s;
	int64_t lease, create_rev;        /* create_rev > 0: in office */
	_Atomic int64_t guard;            /* create_rev for other threads (0: not in office) */
	uint64_t keepalive_ns, calm_since_ns;
	bool troubled;                    /* the last etcd call failed */
	atomic_bool leader, stop;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static void ctl_trouble(struct dm_ctl *c, int rc, const char *what)
{
	if (!c->troubled)
		dm_warn("controller %s: etcd %s failed (%s: %s); no node is declared down until "
			"etcd answers again for %u s", c->me, what, strerror(-rc),
			dm_etcd_errmsg(c->e), c->grace_s);
	c->troubled = true;
}

static void ctl_calm(struct dm_ctl *c)
{
	if (c->troubled)
		c->calm_since_ns = dm_now_ns();
	c->troubled = false;
}

static void ctl_depose(struct dm_ctl *c, const char *why)
{
	if (c->create_rev)
		dm_warn("controller %s: out of office (%s)", c->me, why);
	c->create_rev = 0;
	atomic_store(&c->guard, 0);
	atomic_store(&c->leader, false);
}

/* Keep the lease (or get one), then try to take office. 0 or -errno. */
static int ctl_lease_and_elect(struct dm_ctl *c)
{
	uint64_t now = dm_now_ns();
	void *cur = NULL;   /* the leader key's value, read before trying to take office */
	size_t len;
	bool ok;
	int64_t rev;
	int rc;

	if (c->lease && now - c->keepalive_ns >= c->ttl_s * 1000000000ull / 3) {
		rc = dm_etcd_lease_keepalive(c->e, c->lease, NULL);
		if (rc == -ENOENT) {
			c->lease = 0;
			ctl_depose(c, "its lease expired");
		} else if (rc) {
			return rc;
		} else {
			c->keepalive_ns = now;
		}
	}
	if (!c->lease) {
		rc = dm_etcd_lease_grant(c->e, (int)c->ttl_s, &c->lease);
		if (rc)
			return rc;
		c->keepalive_ns = now;
	}
	if (c->create_rev)
		return 0;
	/* Read first: while another candidate is in office its key is there, and a put-if-absent
	 * that fails is still a transaction through Raft (with every other candidate trying
	 * every CTL_PERIOD_MS, an idle cluster of 3 CNs wrote 6.7 of them a second). The read
	 * is serializable (no Raft round: the put-if-absent after it decides). */
	rc = dm_etcd_get_serial(c->e, c->ctl_key, &cur, &len, NULL);
	free(cur);
	if (rc != -ENOENT)
		return rc;   /* 0: in office elsewhere */
	rc = dm_etcd_put_if(c->e, c->ctl_key, c->val, strlen(c->val), c->lease, 0, &ok, &rev);
	if (rc || !ok)
		return rc;
	c->create_rev = rev;
	c->calm_since_ns = dm_now_ns();
	atomic_store(&c->guard, rev);
	atomic_store(&c->leader, true);
	dm_info("controller %s: in office (no node is declared down for the first %u s)", c->me,
		c->grace_s);
	return 0;
}

/* The registered members into mn / cn bit sets. */
static int ctl_members(struct dm_ctl *c, uint64_t *mn, uint64_t *cn)
{
	struct dm_etcd_kv *kvs;
	char prefix[200];
	size_t n;
	int rc;

	snprintf(prefix, sizeof(prefix), "%smembers/", c->prefix);
	rc = dm_etcd_range(c->e, prefix, &kvs, &n, NULL);
	if (rc)
		return rc;
	memset(mn, 0, DM_UPSET_WORDS * sizeof(*mn));
	memset(cn, 0, DM_UPSET_WORDS * sizeof(*cn));
	for (size_t i = 0; i < n; i++) {
		const char *k = kvs[i].key + strlen(prefix);
		unsigned id;
		char role[4], tail;

		/* members/<role>/<id>: the key says who; the value is for humans and status */
		if (sscanf(k, "%2[a-z]/%u%c", role, &id, &tail) != 2 || id >= 64 * DM_UPSET_WORDS)
			continue;
		if (!strcmp(role, "mn"))
			dm_upset_set(mn, id, true);
		else if (!strcmp(role, "cn"))
			dm_upset_set(cn, id, true);
	}
	dm_etcd_kvs_free(kvs, n);
	return 0;
}

/* The current up-set: 0 (u->mod_revision 0 when there is none) or -errno. */
static int upset_get(struct dm_etcd *e, const char *key, struct dm_upset *u)
{
	void *val;
	size_t len;
	int64_t mod;
	int rc = dm_etcd_get(e, key, &val, &len, &mod);

	if (rc == -ENOENT) {
		memset(u, 0, sizeof(*u));
		return 0;
	}
	if (rc)
		return rc;
	rc = dm_upset_parse(val, len, u);
	free(val);
	if (rc)
		return rc;
	u->mod_revision = mod;
	return 0;
}

/* One period in office: read the members and the up-set, write the next one if it changed. */
static int ctl_step(struct dm_ctl *c)
{
	const struct dm_cluster_cfg *cfg = c->cfg;
	uint64_t mn[DM_UPSET_WORDS], cn[DM_UPSET_WORDS];
	struct dm_upset cur, nx;
	bool may_down, changed, ok;
	char *val;
	int rc;

	if ((rc = ctl_members(c, mn, cn)) || (rc = upset_get(c->e, c->up_key, &cur)))
		return rc;
	may_down = !c->troubled && dm_now_ns() - c->calm_since_ns >= c->grace_s * 1000000000ull;
	nx = (struct dm_upset){ .version = cur.version + 1, .time = time(NULL) };
	snprintf(nx.controller, sizeof(nx.controller), "%s", c->me);
	for (int role = 0; role < 2; role++) {
		uint32_t n = role ? cfg->n_cn : cfg->n_mn;
		const uint64_t *reg = role ? cn : mn;
		const uint64_t *was = role ? cur.cn : cur.mn;
		uint64_t *out = role ? nx.cn : nx.mn;

		for (uint32_t i = 0; i < n && i < 64 * DM_UPSET_WORDS; i++) {
			bool up = dm_upset_has(reg, i);

			/* Absent but not yet declared down: keep what the up-set said (up when
			 * there is none yet). */
			if (!up && !may_down)
				up = !cur.mod_revision || dm_upset_has(was, i);
			dm_upset_set(out, i, up);
		}
	}
	changed = !cur.mod_revision || memcmp(nx.mn, cur.mn, sizeof(nx.mn)) ||
		  memcmp(nx.cn, cur.cn, sizeof(nx.cn));
	if (!changed)
		return 0;
	val = dm_upset_format(&nx);
	if (!val)
		return -ENOMEM;
	rc = dm_etcd_put_guarded(c->e, c->up_key, val, strlen(val), cur.mod_revision, c->ctl_key,
				 c->create_rev, &ok, NULL);
	free(val);
	if (rc)
		return rc;
	if (!ok) {
		/* Either the up-set moved under us (another controller wrote it) or our leader
		 * key is gone: check which. */
		void *v;
		size_t len;
		int64_t mod;

		rc = dm_etcd_get(c->e, c->ctl_key, &v, &len, &mod);
		if (rc == -ENOENT || (rc == 0 && (len != strlen(c->val) || memcmp(v, c->val, len))))
			ctl_depose(c, "the leader key is not ours any more");
		if (rc == 0)
			free(v);
		return rc == -ENOENT ? 0 : rc;
	}
	for (int role = 0; role < 2; role++) {
		uint32_t n = role ? cfg->n_cn : cfg->n_mn;

		for (uint32_t i = 0; i < n && i < 64 * DM_UPSET_WORDS; i++) {
			bool a = cur.mod_revision ? dm_upset_has(role ? cur.cn : cur.mn, i) : true;
			bool b = dm_upset_has(role ? nx.cn : nx.mn, i);

			if (a != b)
				dm_warn("controller %s: %s%u %s (up-set version %lld)", c->me,
					role ? "cn" : "mn", i, b ? "is up again" : "is down",
					(long long)nx.version);
		}
	}
	if (!cur.mod_revision)
		dm_info("controller %s: up-set version %lld written", c->me, (long long)nx.version);
	return 0;
}

static void *ctl_thread(void *arg)
{
	struct dm_ctl *c = arg;

	pthread_mutex_lock(&c->mu);
	while (!atomic_load(&c->stop)) {
		struct timespec ts;
		int rc;

		pthread_mutex_unlock(&c->mu);
		rc = ctl_lease_and_elect(c);
		if (!rc && c->create_rev)
			rc = ctl_step(c);
		if (rc)
			ctl_trouble(c, rc, c->create_rev ? "read or write" : "lease or election");
		else
			ctl_calm(c);
		pthread_mutex_lock(&c->mu);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += CTL_PERIOD_MS * 1000000l;
		ts.tv_sec += ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		if (!atomic_load(&c->stop))
			pthread_cond_timedwait(&c->cv, &c->mu, &ts);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

struct dm_ctl *dm_ctl_start(const struct dm_cluster_cfg *cfg, const char *role, uint32_t id)
{
	struct dm_ctl *c;
	json_t *o;
	int err;

	if (!cfg->etcd[0]) {
		errno = 0;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->cfg = cfg;
	c->ttl_s = cfg->etcd_lease_s ? cfg->etcd_lease_s : 5;
	c->grace_s = cfg->etcd_grace_s ? cfg->etcd_grace_s : c->ttl_s + 3;
	snprintf(c->me, sizeof(c->me), "%s%u", role, id);
	snprintf(c->prefix, sizeof(c->prefix), "/dmann/%s/", cfg->name);
	snprintf(c->ctl_key, sizeof(c->ctl_key), "%scontroller", c->prefix);
	snprintf(c->up_key, sizeof(c->up_key), "%supset", c->prefix);
	o = json_pack("{s:s, s:i, s:I, s:I}", "role", role, "id", (int)id, "pid",
		      (json_int_t)getpid(), "since", (json_int_t)time(NULL));
	c->val = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	c->e = dm_etcd_open(cfg->etcd, CST_TIMEOUT_MS);
	if (!c->val || !c->e) {
		err = c->e ? ENOMEM : errno;
		goto err_free;
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	err = pthread_create(&c->thread, NULL, ctl_thread, c);
	if (err)
		goto err_destroy;
	return c;

err_destroy:
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
err_free:
	dm_etcd_close(c->e);
	free(c->val);
	free(c);
	dm_warn("%s%u: not standing as controller: %s", role, id, strerror(err));
	errno = err;
	return NULL;
}

void dm_ctl_stop(struct dm_ctl *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->stop, true);
	pthread_cond_signal(&c->cv);
	pthread_mutex_unlock(&c->mu);
	pthread_join(c->thread, NULL);
	if (c->lease && dm_etcd_lease_revoke(c->e, c->lease) == 0 && c->create_rev)
		dm_info("controller %s: resigned", c->me);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	dm_etcd_close(c->e);
	free(c->val);
	free(c);
}

bool dm_ctl_leader(const struct dm_ctl *c)
{
	return c && atomic_load(&c->leader);
}

/* ---- the watch ---- */

struct dm_upwatch {
	struct dm_etcd *e;
	char key[192];
	bool placement;              /* watches the placement, not the up-set */
	dm_upset_cb cb;
	dm_placement_cb pcb;
	void *arg;
	_Atomic int64_t version;
	atomic_bool stop;
	bool warned;
	pthread_t thread;
};

static void watch_ev(void *arg, const struct dm_etcd_event *ev)
{
	struct dm_upwatch *w = arg;
	int64_t ver;

	if (ev->type != DM_ETCD_PUT || strcmp(ev->kv.key, w->key))
		return;
	if (w->placement) {
		struct dm_placement p;

		if (dm_placement_parse(ev->kv.val, ev->kv.len, &p)) {
			dm_warn("cluster state: %s holds no valid placement; ignored", w->key);
			return;
		}
		p.mod_revision = ev->kv.mod_revision;
		ver = p.version;
		if (ver <= atomic_load(&w->version))
			return;
		atomic_store(&w->version, ver);
		w->pcb(w->arg, &p);
	} else {
		struct dm_upset u;

		if (dm_upset_parse(ev->kv.val, ev->kv.len, &u)) {
			dm_warn("cluster state: %s holds no valid up-set; ignored", w->key);
			return;
		}
		u.mod_revision = ev->kv.mod_revision;
		ver = u.version;
		if (ver <= atomic_load(&w->version))
			return;
		atomic_store(&w->version, ver);
		w->cb(w->arg, &u);
	}
}

static void *watch_thread(void *arg)
{
	struct dm_upwatch *w = arg;
	int64_t from = 0;

	while (!atomic_load(&w->stop)) {
		int rc = dm_etcd_follow(w->e, w->key, &from, WATCH_POLL_MS, NULL, watch_ev, w);

		if (rc && atomic_load(&w->stop))
			break;                  /* aborted by dm_upwatch_stop */
		if (rc) {
			if (!w->warned)
				dm_warn("cluster state: etcd unreachable (%s); keeping %s version "
					"%lld", dm_etcd_errmsg(w->e), w->placement ? "placement" :
					"up-set", (long long)atomic_load(&w->version));
			w->warned = true;
			for (int i = 0; i < 5 && !atomic_load(&w->stop); i++)
				usleep(100000);
		} else if (w->warned) {
			dm_info("cluster state: etcd answers again");
			w->warned = false;
		}
	}
	return NULL;
}

static struct dm_upwatch *watch_start(const struct dm_cluster_cfg *cfg, const char *name,
				      dm_upset_cb cb, dm_placement_cb pcb, void *arg)
{
	struct dm_upwatch *w;
	int err;

	if (!cfg->etcd[0]) {
		errno = 0;
		return NULL;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		errno = ENOMEM;
		return NULL;
	}
	w->cb = cb;
	w->pcb = pcb;
	w->placement = pcb != NULL;
	w->arg = arg;
	snprintf(w->key, sizeof(w->key), "/dmann/%s/%s", cfg->name, name);
	w->e = dm_etcd_open(cfg->etcd, CST_TIMEOUT_MS);
	if (!w->e) {
		err = errno;
		free(w);
		errno = err;
		return NULL;
	}
	err = pthread_create(&w->thread, NULL, watch_thread, w);
	if (err) {
		dm_etcd_close(w->e);
		free(w);
		errno = err;
		return NULL;
	}
	return w;
}

struct dm_upwatch *dm_upwatch_start(const struct dm_cluster_cfg *cfg, dm_upset_cb cb, void *arg)
{
	return watch_start(cfg, "upset", cb, NULL, arg);
}

struct dm_upwatch *dm_placewatch_start(const struct dm_cluster_cfg *cfg, dm_placement_cb cb,
				       void *arg)
{
	return watch_start(cfg, "placement", NULL, cb, arg);
}

void dm_upwatch_stop(struct dm_upwatch *w)
{
	if (!w)
		return;
	atomic_store(&w->stop, true);
	dm_etcd_abort(w->e);             /* ends the poll in progress at once */
	pthread_join(w->thread, NULL);
	dm_etcd_close(w->e);
	free(w);
}

int64_t dm_upwatch_version(const struct dm_upwatch *w)
{
	return w ? atomic_load(&w->version) : 0;
}

int dm_upset_read(const char *endpoints, const char *cluster, int timeout_ms,
		  struct dm_upset *u, char *ctl, size_t ctlcap, char *err, size_t errlen)
{
	struct dm_etcd *e = dm_etcd_open(endpoints, timeout_ms);
	char key[192];
	void *val;
	size_t len;
	int rc;

	if (!e) {
		rc = -errno;
		snprintf(err, errlen, "etcd endpoints '%s': %s", endpoints, strerror(-rc));
		return rc;
	}
	snprintf(ctl, ctlcap, "%s", "");
	snprintf(key, sizeof(key), "/dmann/%s/controller", cluster);
	rc = dm_etcd_get(e, key, &val, &len, NULL);
	if (rc == 0) {
		json_error_t je;
		json_t *o = json_loadb(val, len, 0, &je);
		const char *role;
		json_int_t id;

		if (o && !json_unpack(o, "{s:s, s:I}", "role", &role, "id", &id) &&
		    strlen(role) < 4 && id >= 0 && id < 1 << 20)
			snprintf(ctl, ctlcap, "%s%lld", role, (long long)id);
		json_decref(o);
		free(val);
	} else if (rc != -ENOENT) {
		snprintf(err, errlen, "etcd %s: %s", endpoints, dm_etcd_errmsg(e));
		goto out;
	}
	snprintf(key, sizeof(key), "/dmann/%s/upset", cluster);
	rc = upset_get(e, key, u);
	if (rc) {
		snprintf(err, errlen, "etcd %s: %s", endpoints, rc == -EBADMSG ?
			 "the up-set is not valid JSON of its form" : dm_etcd_errmsg(e));
		goto out;
	}
	rc = u->mod_revision ? 0 : -ENOENT;
out:
	dm_etcd_close(e);
	return rc;
}

int dm_placement_write(const struct dm_ctl *c, const struct dm_placement *p, bool *ok,
		       char *err, size_t errlen)
{
	struct dm_etcd *e;
	char key[192], *val;
	int64_t guard = c ? atomic_load(&c->guard) : 0;
	int rc;

	*ok = false;
	if (!guard) {
		snprintf(err, errlen, "not the controller in office");
		return -EPERM;
	}
	val = dm_placement_format(p);
	e = dm_etcd_open(c->cfg->etcd, CST_TIMEOUT_MS);
	if (!val || !e) {
		free(val);
		dm_etcd_close(e);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	snprintf(key, sizeof(key), "/dmann/%s/placement", c->cfg->name);
	rc = dm_etcd_put_guarded(e, key, val, strlen(val), p->mod_revision, c->ctl_key, guard,
				 ok, NULL);
	if (rc)
		snprintf(err, errlen, "etcd: %s", dm_etcd_errmsg(e));
	else if (!*ok)
		snprintf(err, errlen, "refused: the placement changed meanwhile, or this node "
			 "lost its office");
	free(val);
	dm_etcd_close(e);
	return rc;
}
