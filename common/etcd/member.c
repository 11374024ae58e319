/* member.c: a node's registration in the cluster state (member.h): a lease kept alive by a
 * thread (keepalive every ttl / 3), the member key attached to it, re-registration with a
 * new lease when the old one expired (etcd was unreachable for longer than the TTL), and
 * the revocation when the node leaves. */
#include "member.h"

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

#define MEMBER_TIMEOUT_MS 2000

struct dm_member {
	struct dm_etcd *e;
	char key[256];
	char *val;                   /* the member's JSON */
	uint32_t ttl_s;
	int64_t lease;               /* 0: not registered */
	atomic_bool up, stop;
	bool warned;                 /* etcd unreachable was logged (once per outage) */
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

/* Register with a new lease. 0 or -errno. */
static int join(struct dm_member *m)
{
	int64_t lease;
	int rc = dm_etcd_lease_grant(m->e, (int)m->ttl_s, &lease);

	if (rc)
		return rc;
	rc = dm_etcd_put(m->e, m->key, m->val, strlen(m->val), lease, NULL);
	if (rc) {
		dm_etcd_lease_revoke(m->e, lease);
		return rc;
	}
	m->lease = lease;
	return 0;
}

/* One heartbeat: keep the lease alive, or register again. */
static void beat(struct dm_member *m)
{
	int rc = m->lease ? dm_etcd_lease_keepalive(m->e, m->lease, NULL) : join(m);

	if (rc == -ENOENT && m->lease) {
		dm_warn("member %s: lease expired (etcd was unreachable for longer than %u s); "
			"registering again", m->key, m->ttl_s);
		m->lease = 0;
		rc = join(m);
	}
	if (rc) {
		if (!m->warned)
			dm_warn("member %s: etcd unreachable (%s: %s): serving on, retrying", m->key,
				strerror(-rc), dm_etcd_errmsg(m->e));
		m->warned = true;
		atomic_store(&m->up, false);
		return;
	}
	if (m->warned)
		dm_info("member %s: registered in etcd again", m->key);
	m->warned = false;
	atomic_store(&m->up, true);
}

static void *member_thread(void *arg)
{
	struct dm_member *m = arg;

	pthread_mutex_lock(&m->mu);
	while (!atomic_load(&m->stop)) {
		struct timespec ts;
		uint32_t ms = atomic_load(&m->up) ? m->ttl_s * 1000 / 3 : 500;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += (long)(ms % 1000) * 1000000;
		ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&m->cv, &m->mu, &ts);
		if (atomic_load(&m->stop))
			break;
		pthread_mutex_unlock(&m->mu);
		beat(m);
		pthread_mutex_lock(&m->mu);
	}
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

struct dm_member *dm_member_start(const char *endpoints, const char *cluster, const char *role,
				  uint32_t id, const char *address, uint32_t ttl_s)
{
	struct dm_member *m;
	json_t *o;
	int err;

	if (!endpoints || !cluster || !role || !address || ttl_s < 2 || ttl_s > 60 ||
	    (strcmp(role, "mn") && strcmp(role, "cn"))) {
		errno = EINVAL;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->ttl_s = ttl_s;
	snprintf(m->key, sizeof(m->key), "/dmann/%s/members/%s/%u", cluster, role, id);
	o = json_pack("{s:s, s:i, s:s, s:I, s:I}", "role", role, "id", (int)id, "address", address,
		      "pid", (json_int_t)getpid(), "since", (json_int_t)time(NULL));
	m->val = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	m->e = dm_etcd_open(endpoints, MEMBER_TIMEOUT_MS);
	if (!m->val || !m->e) {
		err = m->e ? ENOMEM : errno;
		goto err_free;
	}
	pthread_mutex_init(&m->mu, NULL);
	pthread_cond_init(&m->cv, NULL);
	beat(m);
	if (atomic_load(&m->up))
		dm_info("member %s: registered in etcd (lease %llx, %u s)", m->key,
			(unsigned long long)m->lease, ttl_s);
	err = pthread_create(&m->thread, NULL, member_thread, m);
	if (err)
		goto err_destroy;
	return m;

err_destroy:
	if (m->lease)
		dm_etcd_lease_revoke(m->e, m->lease);
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
err_free:
	dm_etcd_close(m->e);
	free(m->val);
	free(m);
	errno = err;
	return NULL;
}

struct dm_member *dm_member_join(const struct dm_cluster_cfg *cfg, const char *role,
				 uint32_t id, const char *address)
{
	struct dm_member *m;

	if (!cfg->etcd[0])
		return NULL;
	m = dm_member_start(cfg->etcd, cfg->name, role, id, address, cfg->etcd_lease_s);
	if (!m)
		dm_warn("%s%u: not registering in etcd %s: %s", role, id, cfg->etcd, strerror(errno));
	return m;
}

void dm_member_stop(struct dm_member *m)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->mu);
	atomic_store(&m->stop, true);
	pthread_cond_signal(&m->cv);
	pthread_mutex_unlock(&m->mu);
	pthread_join(m->thread, NULL);
	if (m->lease && dm_etcd_lease_revoke(m->e, m->lease) == 0)
		dm_info("member %s: left (lease revoked)", m->key);
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	dm_etcd_close(m->e);
	free(m->val);
	free(m);
}

bool dm_member_up(const struct dm_member *m)
{
	return m && atomic_load(&m->up);
}

/* One member's JSON value into *mi; false when it is not one. */
static bool parse_member(const struct dm_etcd_kv *kv, struct dm_member_info *mi)
{
	json_error_t je;
	json_t *o = json_loadb(kv->val, kv->len, 0, &je);
	const char *role, *addr;
	json_int_t id, pid, since;
	bool ok;

	ok = o && json_unpack(o, "{s:s, s:I, s:s, s:I, s:I}", "role", &role, "id", &id,
			      "address", &addr, "pid", &pid, "since", &since) == 0 &&
	     (!strcmp(role, "mn") || !strcmp(role, "cn")) && id >= 0 && id < 1 << 20 &&
	     strlen(addr) < sizeof(mi->address);
	if (ok) {
		snprintf(mi->role, sizeof(mi->role), "%s", role);
		mi->id = (uint32_t)id;
		snprintf(mi->address, sizeof(mi->address), "%s", addr);
		mi->pid = pid;
		mi->since = since;
		mi->lease = kv->lease;
	}
	json_decref(o);
	return ok;
}

int dm_members_list(const char *endpoints, const char *cluster, int timeout_ms,
		    struct dm_member_info **out, size_t *n, char *err, size_t errlen)
{
	struct dm_etcd *e = dm_etcd_open(endpoints, timeout_ms);
	struct dm_etcd_kv *kvs = NULL;
	char prefix[192];
	size_t nkv = 0;
	int rc;

	*out = NULL;
	*n = 0;
	if (!e) {
		rc = -errno;
		snprintf(err, errlen, "etcd endpoints '%s': %s", endpoints, strerror(-rc));
		return rc;
	}
	snprintf(prefix, sizeof(prefix), "/dmann/%s/members/", cluster);
	rc = dm_etcd_range(e, prefix, &kvs, &nkv, NULL);
	if (rc) {
		snprintf(err, errlen, "etcd %s: %s", endpoints, dm_etcd_errmsg(e));
		goto out;
	}
	*out = calloc(nkv ? nkv : 1, sizeof(**out));
	if (!*out) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nkv; i++)
		*n += parse_member(&kvs[i], &(*out)[*n]);
out:
	dm_etcd_kvs_free(kvs, nkv);
	dm_etcd_close(e);
	return rc;
}
