/* test_etcd.c: the etcd v3 client (common/etcd) against a real etcd (/usr/bin/etcd, or
 * $DMANN_ETCD) started for each test: data dir on tmpfs, random loopback ports, SIGKILLed
 * and removed at the end. Missing etcd fails the test (never a skip).
 *   - put/get/range/delete with binary values (zero bytes inside), prefixes ending in 0xff,
 *     the 1 MiB value limit, bad arguments;
 *   - guarded puts: "must not exist", success on the expected mod_revision, conflicts;
 *   - leases: grant, keepalive, expiry without keepalive (TTL 2 s), revoke deletes keys;
 *   - watches: puts and deletes in order with increasing revisions, resuming at
 *     from_revision, -ESTALE for a compacted start revision;
 *   - endpoints: -ECONNREFUSED quickly, failover to the second endpoint, -ETIMEDOUT (and no
 *     retry elsewhere) once a request was sent to an endpoint that does not answer;
 *   - the answer parsers on malformed input;
 *   - a rollout epoch's oracle handed over (cn/router/router_etcd.c): claim, take, the
 *     checks, a dead claimer, the 1 MiB bound, pruning; its value parser. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"
#include "idrange.h"
#include "router_etcd.h"
#include "upper.h"
#include "util/dm_buf.h"

static char dir[64] = "/dev/shm/dmann-etcd-XXXXXX", url[64];
static pid_t etcd_pid;
static struct dm_etcd *E;

/* A loopback port nobody listens on (now). */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		  getsockname(fd, (struct sockaddr *)&a, &l) == 0);
	close(fd);
	return ntohs(a.sin_port);
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static void setup(void)
{
	const char *bin = getenv("DMANN_ETCD") ? getenv("DMANN_ETCD") : "/usr/bin/etcd";
	char curl[64], purl[64], cluster[96], data[96], log[96];
	int cp = free_port(), pp = free_port(), rc = -1;
	void *v;
	size_t n;

	cr_assert(access(bin, X_OK) == 0, "etcd not found at %s: install etcd-server "
		  "(deploy/install-deps.sh) or set DMANN_ETCD", bin);
	cr_assert_not_null(mkdtemp(dir));
	snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", cp);
	snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", pp);
	snprintf(cluster, sizeof(cluster), "default=%s", purl);
	snprintf(data, sizeof(data), "%s/data", dir);
	snprintf(log, sizeof(log), "%s/etcd.log", dir);
	snprintf(url, sizeof(url), "%s", curl);
	etcd_pid = fork();
	cr_assert(etcd_pid >= 0);
	if (etcd_pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd, 1);
		dup2(fd, 2);
		execl(bin, bin, "--name", "default", "--data-dir", data, "--listen-client-urls", curl,
		      "--advertise-client-urls", curl, "--listen-peer-urls", purl,
		      "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
		      (char *)NULL);
		_exit(127);
	}
	E = dm_etcd_open(url, 1000);
	cr_assert_not_null(E);
	for (double t0 = now_s(); now_s() - t0 < 20; usleep(50000)) {
		cr_assert_eq(waitpid(etcd_pid, NULL, WNOHANG), 0, "etcd exited: see %s", log);
		if ((rc = dm_etcd_get(E, "ping", &v, &n, NULL)) == -ENOENT)
			break;
	}
	cr_assert_eq(rc, -ENOENT, "etcd does not answer on %s: %s", url, dm_etcd_errmsg(E));
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st, (void)flag, (void)f;
	return remove(p);
}

static void teardown(void)
{
	dm_etcd_close(E);
	if (etcd_pid > 0) {
		kill(etcd_pid, SIGKILL);
		waitpid(etcd_pid, NULL, 0);
	}
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(etcd, .init = setup, .fini = teardown, .timeout = 60);

static void assert_get(const char *key, const void *val, size_t len)
{
	void *v;
	size_t n;

	cr_assert_eq(dm_etcd_get(E, key, &v, &n, NULL), 0, "%s: %s", key, dm_etcd_errmsg(E));
	cr_assert_eq(n, len, "%s: %zu bytes, not %zu", key, n, len);
	cr_assert(memcmp(v, val, len) == 0 && ((char *)v)[n] == 0);
	free(v);
}

Test(etcd, kv_round_trips)
{
	static const char bin[] = "a\0b\0\0c\xff\x01";
	char *big = malloc(DM_ETCD_VAL_MAX + 1);
	struct dm_etcd_kv *kvs;
	int64_t rev, mod, rrev, del;
	size_t n;
	void *v;

	cr_assert_eq(dm_etcd_put(E, "/t/a", bin, sizeof(bin), 0, &rev), 0, "%s", dm_etcd_errmsg(E));
	cr_assert_eq(dm_etcd_get(E, "/t/a", &v, &n, &mod), 0);
	cr_assert(n == sizeof(bin) && memcmp(v, bin, n) == 0 && mod == rev);
	free(v);
	/* the serializable read: the same answer from a single member */
	cr_assert_eq(dm_etcd_get_serial(E, "/t/a", &v, &n, &mod), 0, "%s", dm_etcd_errmsg(E));
	cr_assert(n == sizeof(bin) && memcmp(v, bin, n) == 0 && mod == rev);
	free(v);
	cr_assert_eq(dm_etcd_get_serial(E, "/t/none", &v, &n, NULL), -ENOENT);
	cr_assert_eq(dm_etcd_put(E, "/t/b", NULL, 0, 0, NULL), 0);
	assert_get("/t/b", "", 0);
	cr_assert_eq(dm_etcd_put(E, "/t/c", "\0", 1, 0, NULL), 0);
	cr_assert_eq(dm_etcd_put(E, "/t0", "x", 1, 0, NULL), 0);         /* just after the prefix */
	cr_assert_eq(dm_etcd_put(E, "/s/a", "y", 1, 0, NULL), 0);
	cr_assert_eq(dm_etcd_range(E, "/t/", &kvs, &n, &rrev), 0);
	cr_assert(n == 3 && rrev > rev);
	cr_assert_str_eq(kvs[0].key, "/t/a");
	cr_assert_str_eq(kvs[1].key, "/t/b");
	cr_assert_str_eq(kvs[2].key, "/t/c");
	cr_assert(kvs[0].len == sizeof(bin) && memcmp(kvs[0].val, bin, sizeof(bin)) == 0);
	cr_assert(kvs[1].len == 0 && kvs[2].len == 1 && ((char *)kvs[2].val)[0] == 0);
	cr_assert(kvs[0].mod_revision == rev && kvs[0].version == 1 && kvs[0].key_len == 4);
	dm_etcd_kvs_free(kvs, n);
	cr_assert_eq(dm_etcd_range(E, "", &kvs, &n, NULL), 0);             /* the whole key space */
	cr_assert_eq(n, 5);
	dm_etcd_kvs_free(kvs, n);

	/* A prefix ending in 0xff: its range ends at "/u". */
	cr_assert_eq(dm_etcd_put(E, "/t\xff\x01", "z", 1, 0, NULL), 0);
	cr_assert_eq(dm_etcd_put(E, "/t\xff", "z", 1, 0, NULL), 0);
	cr_assert_eq(dm_etcd_put(E, "/u", "z", 1, 0, NULL), 0);
	cr_assert_eq(dm_etcd_range(E, "/t\xff", &kvs, &n, NULL), 0);
	cr_assert_eq(n, 2);
	dm_etcd_kvs_free(kvs, n);

	/* The largest value. */
	for (size_t i = 0; i < DM_ETCD_VAL_MAX; i++)
		big[i] = (char)(i * 7);
	cr_assert_eq(dm_etcd_put(E, "/big", big, DM_ETCD_VAL_MAX, 0, NULL), 0, "%s", dm_etcd_errmsg(E));
	assert_get("/big", big, DM_ETCD_VAL_MAX);

	/* Delete: one key, a prefix, nothing. */
	cr_assert_eq(dm_etcd_delete(E, "/t/a", false, &del), 0);
	cr_assert_eq(del, 1);
	cr_assert_eq(dm_etcd_get(E, "/t/a", &v, &n, NULL), -ENOENT);
	cr_assert_eq(dm_etcd_delete(E, "/t/", true, &del), 0);
	cr_assert_eq(del, 2);
	cr_assert_eq(dm_etcd_range(E, "/t/", &kvs, &n, NULL), 0);
	cr_assert(n == 0 && kvs == NULL);
	cr_assert_eq(dm_etcd_delete(E, "/nothing", false, &del), 0);
	cr_assert_eq(del, 0);
	assert_get("/t0", "x", 1);

	/* Guarded delete: only at the revision expected. */
	{
		int64_t r1, r2;
		bool ok;

		cr_assert_eq(dm_etcd_put(E, "/d", "1", 1, 0, &r1), 0);
		cr_assert_eq(dm_etcd_put(E, "/d", "2", 1, 0, &r2), 0);
		cr_assert_eq(dm_etcd_delete_if(E, "/d", r1, &ok), 0, "%s", dm_etcd_errmsg(E));
		cr_assert(!ok);
		assert_get("/d", "2", 1);
		cr_assert_eq(dm_etcd_delete_if(E, "/d", r2, &ok), 0);
		cr_assert(ok);
		cr_assert_eq(dm_etcd_get(E, "/d", &v, &n, NULL), -ENOENT);
		cr_assert_eq(dm_etcd_delete_if(E, "/d", r2, &ok), 0);     /* gone: no match */
		cr_assert(!ok);
		cr_assert_eq(dm_etcd_delete_if(E, "/d", 0, &ok), -EINVAL);
	}

	/* Bad arguments. */
	cr_assert_eq(dm_etcd_put(E, NULL, "x", 1, 0, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_put(E, "", "x", 1, 0, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_put(E, "/k", NULL, 1, 0, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_put(E, "/k", big, DM_ETCD_VAL_MAX + 1, 0, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_put(E, "/k", "x", 1, -1, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_put(NULL, "/k", "x", 1, 0, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_get(E, "", &v, &n, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_delete(E, "", true, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_put(E, "/k", "x", 1, 12345, NULL), -ENOENT);  /* no such lease */
	cr_assert_null(dm_etcd_open("127.0.0.1:2379", 1000));
	cr_assert_eq(errno, EINVAL);
	cr_assert_null(dm_etcd_open("http://", 1000));
	cr_assert_null(dm_etcd_open(url, 0));
	free(big);
}

Test(etcd, put_if)
{
	int64_t r1, r2, mod;
	size_t n;
	void *v;
	bool ok;

	cr_assert_eq(dm_etcd_put_if(E, "/leader", "a", 1, 0, 0, &ok, &r1), 0, "%s", dm_etcd_errmsg(E));
	cr_assert(ok && r1 > 0);                                           /* did not exist */
	cr_assert_eq(dm_etcd_put_if(E, "/leader", "b", 1, 0, 0, &ok, NULL), 0);
	cr_assert(!ok);                                                    /* exists now */
	cr_assert_eq(dm_etcd_put_if(E, "/leader", "c", 1, 0, r1, &ok, &r2), 0);
	cr_assert(ok && r2 > r1);
	cr_assert_eq(dm_etcd_put_if(E, "/leader", "d", 1, 0, r1, &ok, NULL), 0);
	cr_assert(!ok);                                                    /* conflict */
	cr_assert_eq(dm_etcd_get(E, "/leader", &v, &n, &mod), 0);
	cr_assert(mod == r2 && n == 1 && memcmp(v, "c", 1) == 0);
	free(v);
	cr_assert_eq(dm_etcd_put_if(E, "/leader", "e", 1, 0, -1, &ok, NULL), -EINVAL);
}

/* A write guarded by a leader key: refused once the leader key is gone or re-created. */
Test(etcd, put_guarded)
{
	int64_t lr, lr2, r1, r2;
	size_t n;
	void *v;
	bool ok;

	cr_assert_eq(dm_etcd_put_if(E, "/g/leader", "me", 2, 0, 0, &ok, &lr), 0);
	cr_assert(ok);
	cr_assert_eq(dm_etcd_put_guarded(E, "/g/state", "1", 1, 0, "/g/leader", lr, &ok, &r1), 0,
		     "%s", dm_etcd_errmsg(E));
	cr_assert(ok && r1 > lr);
	cr_assert_eq(dm_etcd_put_guarded(E, "/g/state", "2", 1, r1, "/g/leader", lr, &ok, &r2), 0);
	cr_assert(ok && r2 > r1);
	/* A stale expectation of the state: refused. */
	cr_assert_eq(dm_etcd_put_guarded(E, "/g/state", "3", 1, r1, "/g/leader", lr, &ok, NULL), 0);
	cr_assert(!ok);
	/* The leader key re-created (another leader): its create revision differs. */
	cr_assert_eq(dm_etcd_delete(E, "/g/leader", false, NULL), 0);
	cr_assert_eq(dm_etcd_put_guarded(E, "/g/state", "4", 1, r2, "/g/leader", lr, &ok, NULL), 0);
	cr_assert(!ok, "a write guarded by a deleted leader key went through");
	cr_assert_eq(dm_etcd_put_if(E, "/g/leader", "you", 3, 0, 0, &ok, &lr2), 0);
	cr_assert(ok && lr2 != lr);
	cr_assert_eq(dm_etcd_put_guarded(E, "/g/state", "5", 1, r2, "/g/leader", lr, &ok, NULL), 0);
	cr_assert(!ok, "the old leader's write went through");
	cr_assert_eq(dm_etcd_put_guarded(E, "/g/state", "6", 1, r2, "/g/leader", lr2, &ok, NULL), 0);
	cr_assert(ok);
	cr_assert_eq(dm_etcd_get(E, "/g/state", &v, &n, NULL), 0);
	cr_assert(n == 1 && memcmp(v, "6", 1) == 0);
	free(v);
	cr_assert_eq(dm_etcd_put_guarded(E, "/g/state", "7", 1, r2, NULL, lr2, &ok, NULL), -EINVAL);
	cr_assert_eq(dm_etcd_put_guarded(E, "/g/state", "7", 1, r2, "/g/leader", 0, &ok, NULL),
		     -EINVAL);
}

Test(etcd, leases)
{
	int64_t l, l2;
	int ttl = 0;
	void *v;
	size_t n;
	double t0;
	int rc;

	cr_assert_eq(dm_etcd_lease_grant(E, 2, &l), 0, "%s", dm_etcd_errmsg(E));
	cr_assert(l > 0);
	cr_assert_eq(dm_etcd_put(E, "/live/a", "1", 1, l, NULL), 0, "%s", dm_etcd_errmsg(E));
	for (int i = 0; i < 6; i++) {                                      /* 3 s: kept alive */
		usleep(500000);
		cr_assert_eq(dm_etcd_lease_keepalive(E, l, &ttl), 0, "%s", dm_etcd_errmsg(E));
		cr_assert(ttl >= 1 && ttl <= 2, "ttl %d", ttl);
	}
	assert_get("/live/a", "1", 1);
	t0 = now_s();                                                      /* no keepalive now */
	while ((rc = dm_etcd_get(E, "/live/a", &v, &n, NULL)) == 0 && now_s() - t0 < 6) {
		free(v);
		usleep(100000);
	}
	cr_assert_eq(rc, -ENOENT, "the key outlived its lease (%.1f s)", now_s() - t0);
	cr_assert_eq(dm_etcd_lease_keepalive(E, l, &ttl), -ENOENT);
	cr_assert_eq(dm_etcd_put(E, "/live/b", "1", 1, l, NULL), -ENOENT);

	/* Revoke deletes the attached keys. */
	cr_assert_eq(dm_etcd_lease_grant(E, 30, &l2), 0);
	cr_assert_eq(dm_etcd_put(E, "/live/c", "1", 1, l2, NULL), 0);
	cr_assert_eq(dm_etcd_put(E, "/live/d", "1", 1, l2, NULL), 0);
	cr_assert_eq(dm_etcd_put(E, "/live/e", "1", 1, 0, NULL), 0);
	cr_assert_eq(dm_etcd_lease_revoke(E, l2), 0, "%s", dm_etcd_errmsg(E));
	cr_assert_eq(dm_etcd_get(E, "/live/c", &v, &n, NULL), -ENOENT);
	cr_assert_eq(dm_etcd_get(E, "/live/d", &v, &n, NULL), -ENOENT);
	assert_get("/live/e", "1", 1);
	cr_assert_eq(dm_etcd_lease_revoke(E, l2), -ENOENT);
	cr_assert_eq(dm_etcd_lease_grant(E, 0, &l2), -EINVAL);
	cr_assert_eq(dm_etcd_lease_keepalive(E, 0, &ttl), -EINVAL);
}

struct evs {
	int n;
	enum dm_etcd_ev_type type[16];
	char key[16][32], val[16][32];
	int64_t rev[16];
};

static void on_ev(void *arg, const struct dm_etcd_event *ev)
{
	struct evs *s = arg;

	cr_assert(s->n < 16);
	s->type[s->n] = ev->type;
	snprintf(s->key[s->n], 32, "%s", ev->kv.key);
	snprintf(s->val[s->n], 32, "%.*s", (int)ev->kv.len, ev->kv.val ? (char *)ev->kv.val : "");
	s->rev[s->n++] = ev->kv.mod_revision;
}

/* Poll until want events were collected (or 10 s). */
static void collect(const char *prefix, int64_t *from, struct evs *s, int want)
{
	double t0 = now_s();

	while (s->n < want && now_s() - t0 < 10) {
		int rc = dm_etcd_watch_poll(E, prefix, from, 2000, on_ev, s);

		cr_assert_geq(rc, 0, "watch: %d %s", rc, dm_etcd_errmsg(E));
	}
	cr_assert_eq(s->n, want);
}

Test(etcd, watch)
{
	struct evs s = { 0 }, s2 = { 0 };
	int64_t rev, from, first, now = 0;
	struct dm_etcd_kv *kvs;
	size_t n;
	double t0;

	cr_assert_eq(dm_etcd_range(E, "/w/", &kvs, &n, &rev), 0);
	from = first = rev + 1;
	cr_assert_eq(dm_etcd_put(E, "/w/a", "1", 1, 0, NULL), 0);
	cr_assert_eq(dm_etcd_put(E, "/x/a", "1", 1, 0, NULL), 0);         /* not watched */
	cr_assert_eq(dm_etcd_put(E, "/w/b", "2", 1, 0, NULL), 0);
	cr_assert_eq(dm_etcd_delete(E, "/w/a", false, NULL), 0);
	collect("/w/", &from, &s, 3);
	cr_assert(s.type[0] == DM_ETCD_PUT && strcmp(s.key[0], "/w/a") == 0 && strcmp(s.val[0], "1") == 0);
	cr_assert(s.type[1] == DM_ETCD_PUT && strcmp(s.key[1], "/w/b") == 0 && strcmp(s.val[1], "2") == 0);
	cr_assert(s.type[2] == DM_ETCD_DELETE && strcmp(s.key[2], "/w/a") == 0 && s.val[2][0] == 0);
	cr_assert(s.rev[0] == first && s.rev[1] > s.rev[0] && s.rev[2] > s.rev[1]);
	cr_assert_eq(from, s.rev[2] + 1);

	/* Nothing new: 0 after the time bound, from unchanged. */
	t0 = now_s();
	cr_assert_eq(dm_etcd_watch_poll(E, "/w/", &from, 300, on_ev, &s), 0, "%s", dm_etcd_errmsg(E));
	cr_assert(now_s() - t0 >= 0.25 && now_s() - t0 < 2);
	cr_assert_eq(from, s.rev[2] + 1);
	/* Resume: only the new event. */
	cr_assert_eq(dm_etcd_put(E, "/w/c", "3", 1, 0, NULL), 0);
	collect("/w/", &from, &s, 4);
	cr_assert(strcmp(s.key[3], "/w/c") == 0 && s.rev[3] > s.rev[2] && from == s.rev[3] + 1);
	/* From an older revision: the same events again. */
	collect("/w/", &(int64_t){ s.rev[1] }, &s2, 3);
	cr_assert(s2.rev[0] == s.rev[1] && s2.rev[2] == s.rev[3]);

	/* From 0 ("now"): nothing old, from set to the store revision + 1, then new events. */
	cr_assert_eq(dm_etcd_watch_poll(E, "/w/", &now, 300, on_ev, &s2), 0, "%s", dm_etcd_errmsg(E));
	cr_assert_eq(now, s.rev[3] + 1);                  /* /w/c was the last write */
	cr_assert_eq(dm_etcd_put(E, "/w/d", "4", 1, 0, NULL), 0);
	collect("/w/", &now, &s2, 4);
	cr_assert_str_eq(s2.key[3], "/w/d");
	cr_assert_eq(dm_etcd_watch_poll(E, "/w/", NULL, 300, on_ev, &s2), -EINVAL);
}

/* dm_etcd_abort from another thread ends a watch poll blocked on a quiet prefix long before
 * its time bound, and every later call on the handle fails with -ECANCELED. */
struct abort_poll {
	struct dm_etcd *e;
	int rc;
	double took;
};

static void *abort_poller(void *arg)
{
	struct abort_poll *a = arg;
	int64_t from = 0;
	struct evs s = { 0 };
	double t0 = now_s();

	a->rc = dm_etcd_watch_poll(a->e, "/quiet/", &from, 20000, on_ev, &s);
	a->took = now_s() - t0;
	return NULL;
}

Test(etcd, abort_ends_a_watch_poll)
{
	struct abort_poll a = { .e = dm_etcd_open(url, 1000) };
	pthread_t t;
	void *v;
	size_t n;

	cr_assert_not_null(a.e);
	cr_assert_eq(dm_etcd_get(a.e, "ping", &v, &n, NULL), -ENOENT);   /* a connection open */
	cr_assert_eq(pthread_create(&t, NULL, abort_poller, &a), 0);
	usleep(500000);                     /* the poll is waiting for events */
	dm_etcd_abort(a.e);
	pthread_join(t, NULL);
	cr_assert_lt(a.rc, 0, "the poll was not ended by the abort (%d)", a.rc);
	cr_assert_lt(a.took, 10.0, "the abort did not end the 20 s poll (%.1f s)", a.took);
	cr_assert_eq(dm_etcd_get(a.e, "ping", &v, &n, NULL), -ECANCELED);
	cr_assert(strstr(dm_etcd_errmsg(a.e), "aborted"), "%s", dm_etcd_errmsg(a.e));
	dm_etcd_close(a.e);
	/* Other handles are not affected. */
	cr_assert_eq(dm_etcd_get(E, "ping", &v, &n, NULL), -ENOENT);
}

Test(etcd, watch_compacted)
{
	struct evs s = { 0 };
	int64_t rev, from = 2;
	struct dm_etcd_kv *kvs;
	char req[64];
	size_t n;
	json_t *a;

	for (int i = 0; i < 5; i++)
		cr_assert_eq(dm_etcd_put(E, "/c/k", "v", 1, 0, &rev), 0);
	snprintf(req, sizeof(req), "{\"revision\":\"%lld\",\"physical\":true}", (long long)rev);
	cr_assert_eq(dm_etcd_call(E, "/v3/kv/compaction", req, &a), 0, "%s", dm_etcd_errmsg(E));
	json_decref(a);
	cr_assert_eq(dm_etcd_watch_poll(E, "/c/", &from, 2000, on_ev, &s), -ESTALE);
	cr_assert(strstr(dm_etcd_errmsg(E), "compacted"), "%s", dm_etcd_errmsg(E));
	cr_assert_eq(from, 2);
	/* The caller's resync: a range read, then watch from its revision + 1. */
	cr_assert_eq(dm_etcd_range(E, "/c/", &kvs, &n, &rev), 0);
	cr_assert_eq(n, 1);
	dm_etcd_kvs_free(kvs, n);
	from = rev + 1;
	cr_assert_eq(dm_etcd_put(E, "/c/k", "w", 1, 0, NULL), 0);
	collect("/c/", &from, &s, 1);
	cr_assert_str_eq(s.val[0], "w");
}

Test(etcd, endpoints)
{
	char list[160];
	struct dm_etcd *d;
	struct evs s = { 0 };
	int64_t from = 1;
	double t0;
	bool ok;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int hole = socket(AF_INET, SOCK_STREAM, 0);

	/* Nothing listens: -ECONNREFUSED, quickly, with a reason. */
	snprintf(list, sizeof(list), "http://127.0.0.1:%d", free_port());
	cr_assert_not_null(d = dm_etcd_open(list, 1000));
	t0 = now_s();
	cr_assert_eq(dm_etcd_put(d, "/k", "v", 1, 0, NULL), -ECONNREFUSED);
	cr_assert_eq(dm_etcd_watch_poll(d, "/k", &from, 1000, on_ev, &s), -ECONNREFUSED);
	cr_assert_lt(now_s() - t0, 2.0);
	cr_assert(strlen(dm_etcd_errmsg(d)) > 0);
	dm_etcd_close(d);

	/* The first endpoint down: the second one serves. */
	snprintf(list, sizeof(list), "http://127.0.0.1:%d,%s", free_port(), url);
	cr_assert_not_null(d = dm_etcd_open(list, 1000));
	cr_assert_eq(dm_etcd_put(d, "/k", "v", 1, 0, NULL), 0, "%s", dm_etcd_errmsg(d));
	assert_get("/k", "v", 1);
	cr_assert_eq(dm_etcd_put_if(d, "/k2", "v", 1, 0, 0, &ok, NULL), 0);
	cr_assert(ok);
	dm_etcd_close(d);

	/* An endpoint that accepts connections but never answers: -ETIMEDOUT after the bound,
	 * and the sent request is not retried on the second endpoint. */
	cr_assert(bind(hole, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(hole, 8) == 0 &&
		  getsockname(hole, (struct sockaddr *)&a, &l) == 0);
	snprintf(list, sizeof(list), "http://127.0.0.1:%d,%s", ntohs(a.sin_port), url);
	cr_assert_not_null(d = dm_etcd_open(list, 300));
	t0 = now_s();
	cr_assert_eq(dm_etcd_put_if(d, "/k3", "v", 1, 0, 0, &ok, NULL), -ETIMEDOUT);
	cr_assert(now_s() - t0 >= 0.25 && now_s() - t0 < 2);
	cr_assert_eq(dm_etcd_get(E, "/k3", &(void *){ NULL }, &(size_t){ 0 }, NULL), -ENOENT);
	dm_etcd_close(d);
	close(hole);
}

/* ---- the parsers on outside input (suite etcd_parse: no etcd started) ---- */
static int range_of(const char *txt, size_t *n)
{
	struct dm_etcd_kv *kvs;
	int64_t rev;
	json_t *r;
	int rc;

	if ((rc = dm_etcd_load(txt, strlen(txt), &r)))
		return rc;
	rc = dm_etcd_ans_range(r, &kvs, n, &rev);
	json_decref(r);
	if (rc == 0)
		dm_etcd_kvs_free(kvs, *n);
	return rc;
}

static int watch_of(const char *txt, struct dm_etcd_wmsg *m)
{
	json_t *r;
	int rc;

	if ((rc = dm_etcd_load(txt, strlen(txt), &r)))
		return rc;
	rc = dm_etcd_ans_watch(r, m);
	json_decref(r);
	return rc;
}

static int lease_of(const char *txt)
{
	int64_t id, ttl;
	json_t *r;
	int rc;

	if ((rc = dm_etcd_load(txt, strlen(txt), &r)))
		return rc;
	rc = dm_etcd_ans_lease(r, &id, &ttl);
	json_decref(r);
	return rc;
}

static int error_of(const char *txt)
{
	char msg[128];
	json_t *r;
	int rc;

	if ((rc = dm_etcd_load(txt, strlen(txt), &r)))
		return rc;
	rc = dm_etcd_ans_error(r, msg, sizeof(msg));
	json_decref(r);
	return rc;
}

#define H "\"header\":{\"revision\":\"7\"}"
#define KV(k, v, m) "{\"key\":\"" k "\",\"value\":\"" v "\",\"mod_revision\":\"" m "\"}"

Test(etcd_parse, malformed_answers)
{
	static const char *bad_range[] = {
		"", "[]", "{", "\"x\"", "{}", "{\"header\":1}", "{\"header\":{}}",
		"{\"header\":{\"revision\":\"abc\"}}", "{\"header\":{\"revision\":\"-3\"}}",
		"{\"header\":{\"revision\":\" 3\"}}", "{\"header\":{\"revision\":\"+3\"}}",
		"{\"header\":{\"revision\":\"99999999999999999999\"}}",
		"{\"header\":{\"revision\":{}}}", "{\"header\":{\"revision\":\"-\"}}",
		"{" H ",\"kvs\":{},\"count\":\"1\"}",
		"{" H ",\"kvs\":[1],\"count\":\"1\"}",
		"{" H ",\"kvs\":[" KV("YQ==", "", "3") "]}",                   /* count < n */
		"{" H ",\"kvs\":[" KV("YQ=", "", "3") "],\"count\":\"1\"}",    /* bad base64 */
		"{" H ",\"kvs\":[" KV("YR==", "", "3") "],\"count\":\"1\"}",   /* non-canonical */
		"{" H ",\"kvs\":[" KV("Y===", "", "3") "],\"count\":\"1\"}",
		"{" H ",\"kvs\":[" KV("YQ==", "!!!!", "3") "],\"count\":\"1\"}",
		"{" H ",\"kvs\":[" KV("", "", "3") "],\"count\":\"1\"}",       /* empty key */
		"{" H ",\"kvs\":[" KV("YQ==", "", "0") "],\"count\":\"1\"}",   /* mod_revision 0 */
		"{" H ",\"kvs\":[{\"key\":5,\"mod_revision\":\"3\"}],\"count\":\"1\"}",
		"{" H ",\"kvs\":[{\"key\":\"YQ==\",\"value\":7,\"mod_revision\":\"3\"}],\"count\":\"1\"}",
		"{" H ",\"kvs\":[{\"key\":\"YQ==\",\"mod_revision\":\"3\",\"lease\":\"-1\"}],\"count\":\"1\"}",
		"{" H ",\"kvs\":[" KV("Yg==", "", "3") "," KV("YQ==", "", "3") "],\"count\":\"2\"}",
		"{" H ",\"kvs\":[" KV("YQ==", "", "3") "," KV("YQ==", "", "3") "],\"count\":\"2\"}",
		"{" H ",\"header\":{\"revision\":\"8\"}}",                     /* duplicate field */
		"{" H ",\"count\":true}",
	};
	static const char *bad_watch[] = {
		"{}", "{\"result\":[]}", "{\"result\":{\"events\":{}}}",
		"{\"result\":{\"header\":{\"revision\":\"x\"}}}",
		"{\"result\":{\"compact_revision\":\"-1\"}}",
		"{\"result\":{\"events\":[{\"type\":\"FOO\",\"kv\":" KV("YQ==", "", "3") "}]}}",
		"{\"result\":{\"events\":[{\"type\":1,\"kv\":" KV("YQ==", "", "3") "}]}}",
		"{\"result\":{\"events\":[{\"type\":\"PUT\"}]}}",
		"{\"result\":{\"events\":[{\"kv\":" KV("YQ==", "", "4") "},{\"kv\":" KV("YQ==", "", "3") "}]}}",
		"{\"result\":{\"cancel_reason\":3}}",
	};
	static const char *bad_lease[] = {
		"{" H "}", "{" H ",\"ID\":\"0\",\"TTL\":\"5\"}", "{" H ",\"ID\":\"5\",\"TTL\":\"-1\"}",
		"{\"result\":5}", "{\"result\":{\"ID\":\"5\",\"TTL\":\"5\"}}", "{" H ",\"ID\":[],\"TTL\":\"5\"}",
	};
	struct dm_etcd_wmsg m;
	size_t n;

	for (size_t i = 0; i < DM_ARRAY_SIZE(bad_range); i++)
		cr_assert_eq(range_of(bad_range[i], &n), -EBADMSG, "accepted: %s", bad_range[i]);
	for (size_t i = 0; i < DM_ARRAY_SIZE(bad_watch); i++)
		cr_assert_eq(watch_of(bad_watch[i], &m), -EBADMSG, "accepted: %s", bad_watch[i]);
	for (size_t i = 0; i < DM_ARRAY_SIZE(bad_lease); i++)
		cr_assert_eq(lease_of(bad_lease[i]), -EBADMSG, "accepted: %s", bad_lease[i]);

	/* Well-formed answers. */
	cr_assert_eq(range_of("{" H "}", &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_eq(range_of("{" H ",\"kvs\":[" KV("YQ==", "AP8A", "3") "," KV("YWI=", "", "4")
			      "],\"count\":\"9\",\"more\":true}", &n), 0);
	cr_assert_eq(n, 2);
	cr_assert_eq(lease_of("{\"result\":{" H ",\"ID\":\"5\"}}"), 0);            /* expired */
	cr_assert_eq(watch_of("{\"result\":{" H ",\"events\":[{\"kv\":" KV("YQ==", "AP8A", "3")
			      "},{\"type\":\"DELETE\",\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"4\"}}]}}",
			      &m), 0);
	cr_assert(m.nev == 2 && m.ev[0].type == DM_ETCD_PUT && m.ev[0].kv.len == 3 &&
		  memcmp(m.ev[0].kv.val, "\0\xff\0", 3) == 0 && m.ev[1].type == DM_ETCD_DELETE &&
		  m.ev[1].kv.len == 0 && m.ev[1].kv.mod_revision == 4);
	dm_etcd_wmsg_free(&m);
	cr_assert_eq(watch_of("{\"result\":{\"header\":{},\"canceled\":true,\"compact_revision\":\"3\"}}",
			      &m), 0);
	cr_assert(m.canceled && m.compact_revision == 3 && m.nev == 0);

	/* Errors: the gRPC code mapped; malformed errors rejected. */
	cr_assert_eq(error_of("{\"error\":\"x\",\"message\":\"lease not found\",\"code\":5}"), -ENOENT);
	cr_assert_eq(error_of("{\"error\":{\"grpc_code\":11,\"message\":\"compacted\"}}"), -ESTALE);
	cr_assert_eq(error_of("{\"error\":\"x\",\"message\":\"no leader\",\"code\":14}"), -EAGAIN);
	cr_assert_eq(error_of("{\"error\":\"x\",\"message\":\"m\",\"code\":\"5\"}"), -EBADMSG);
	cr_assert_eq(error_of("{\"error\":\"x\",\"message\":7,\"code\":5}"), -EBADMSG);
	cr_assert_eq(error_of("{\"error\":{\"message\":\"m\",\"grpc_code\":0}}"), -EBADMSG);
	cr_assert_eq(error_of("{\"nothing\":1}"), -EBADMSG);

	/* base64 round trips of every length and byte. */
	for (size_t len = 0; len < 300; len++) {
		struct dm_buf b = { 0 };
		char src[300], *out;
		size_t ol;

		for (size_t i = 0; i < len; i++)
			src[i] = (char)(i * 37 + len);
		dm_etcd_b64_put(&b, src, len);
		cr_assert(!b.oom && b.n == (len + 2) / 3 * 4);
		cr_assert_eq(dm_etcd_unb64((char *)b.p, b.n, &out, &ol), 0);
		cr_assert(ol == len && memcmp(out, src, len) == 0 && out[len] == 0);
		free(out);
		dm_buf_free(&b);
	}
}

/* Id ranges (idrange.h): the first take seeds the key once; takers in parallel threads,
 * each with its own handle, never get overlapping ranges; the last range stops at the
 * capacity and the next take says -ENOSPC; another load tag is another key; no id below
 * first; a value that is not a number is refused. */
#define IDR_THREADS 4
#define IDR_TAKES 40

struct idr_arg {
	uint64_t lo[IDR_TAKES], hi[IDR_TAKES];
	int n, seeds, err;
};

static int idr_seed(void *ctx, uint64_t *base)
{
	((struct idr_arg *)ctx)->seeds++;
	*base = 1000;
	return 0;
}

static void *idr_main(void *p)
{
	struct idr_arg *a = p;
	struct dm_etcd *e = dm_etcd_open(url, 5000);

	for (int i = 0; e && i < IDR_TAKES; i++) {
		int rc = dm_idrange_take(e, "t", 3, 7, 0xabc, 500, 16, 1, 1000 + 16 * 150 + 5,
					 idr_seed, a, &a->lo[a->n], &a->hi[a->n]);

		if (rc == -ENOSPC)
			break;
		if (rc) {
			a->err = rc;
			break;
		}
		a->n++;
	}
	dm_etcd_close(e);
	return NULL;
}

static int u64_cmp(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return (a > b) - (a < b);
}

Test(etcd, id_ranges)
{
	struct idr_arg a[IDR_THREADS] = { 0 };
	pthread_t t[IDR_THREADS];
	uint64_t los[IDR_THREADS * IDR_TAKES], next, lo, hi, total = 0;
	int n = 0, seeds = 0;

	for (int i = 0; i < IDR_THREADS; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, idr_main, &a[i]), 0);
	for (int i = 0; i < IDR_THREADS; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(a[i].err, 0, "taker %d: %s", i, strerror(-a[i].err));
		seeds += a[i].seeds;
		for (int k = 0; k < a[i].n; k++) {
			cr_assert_gt(a[i].hi[k], a[i].lo[k]);
			cr_assert_leq(a[i].hi[k] - a[i].lo[k], 16);
			total += a[i].hi[k] - a[i].lo[k];
			los[n++] = a[i].lo[k] << 8 | (a[i].hi[k] - a[i].lo[k]);
		}
	}
	cr_assert_geq(seeds, 1, "the first take seeds the key");
	/* 150 full ranges and one of 5 between 1000 and the capacity, back to back */
	cr_assert_eq(n, 151, "%d ranges", n);
	cr_assert_eq(total, 16 * 150 + 5);
	qsort(los, (size_t)n, sizeof(los[0]), u64_cmp);
	for (int i = 0, at = 1000; i < n; i++) {
		cr_assert_eq(los[i] >> 8, (uint64_t)at, "range %d starts at %llu, not %d", i,
			     (unsigned long long)(los[i] >> 8), at);
		at += (int)(los[i] & 0xff);
	}
	cr_assert_eq(dm_idrange_read(E, "t", 3, 7, 0xabc, &next), 0);
	cr_assert_eq(next, 1000 + 16 * 150 + 5);
	cr_assert_eq(dm_idrange_take(E, "t", 3, 7, 0xabc, 500, 16, 1, next, idr_seed, &a[0], &lo,
				     &hi), -ENOSPC);
	cr_assert_eq(dm_idrange_read(E, "t", 3, 8, 0xabc, &next), -ENOENT);
	/* another load of the same graph and generation number: its own key */
	cr_assert_eq(dm_idrange_read(E, "t", 3, 7, 0xabd, &next), -ENOENT);
	/* ids below first are never handed out, whatever the key says */
	cr_assert_eq(dm_etcd_put(E, "/dmann/t/ids/3/10/0000000000000001", "5", 1, 0, NULL), 0);
	cr_assert_eq(dm_idrange_take(E, "t", 3, 10, 1, 2000, 16, 1, 100000, idr_seed, &a[0], &lo,
				     &hi), 0);
	cr_assert(lo == 2000 && hi == 2016, "[%llu, %llu)", (unsigned long long)lo,
		  (unsigned long long)hi);
	/* near the capacity the ranges shrink: 1/4 of the room left, then one id at a time */
	cr_assert_eq(dm_idrange_take(E, "t", 3, 10, 1, 0, 16, 4, 2056, idr_seed, &a[0], &lo,
				     &hi), 0);
	cr_assert(lo == 2016 && hi == 2026, "[%llu, %llu)", (unsigned long long)lo,
		  (unsigned long long)hi);
	for (uint64_t want = 2026; want < 2056;) {
		cr_assert_eq(dm_idrange_take(E, "t", 3, 10, 1, 0, 16, 4, 2056, idr_seed, &a[0],
					     &lo, &hi), 0);
		cr_assert(lo == want && hi > lo && hi - lo <= DM_MAX((2056 - lo) / 4, 1));
		want = hi;
	}
	cr_assert_eq(dm_idrange_take(E, "t", 3, 10, 1, 0, 16, 4, 2056, idr_seed, &a[0], &lo,
				     &hi), -ENOSPC);
	/* a value that is not a number: refused, never taken over */
	cr_assert_eq(dm_etcd_put(E, "/dmann/t/ids/3/9/0000000000000001", "12x", 3, 0, NULL), 0);
	cr_assert_eq(dm_idrange_take(E, "t", 3, 9, 1, 0, 16, 1, 100000, idr_seed, &a[0], &lo,
				     &hi), -EBADMSG);
	/* a dropped graph's keys go, every generation and load of it, and only its own */
	cr_assert_eq(dm_etcd_put(E, "/dmann/t/ids/30/1/0000000000000001", "7", 1, 0, NULL), 0);
	{
		int64_t deleted = 0;

		cr_assert_eq(dm_idrange_forget(E, "t", 3, &deleted), 0, "%s", dm_etcd_errmsg(E));
		cr_assert_eq(deleted, 3, "%lld keys deleted", (long long)deleted);
	}
	cr_assert_eq(dm_idrange_read(E, "t", 3, 7, 0xabc, &next), -ENOENT);
	cr_assert_eq(dm_idrange_read(E, "t", 3, 10, 1, &next), -ENOENT);
	cr_assert_eq(dm_idrange_read(E, "t", 30, 1, 1, &next), 0);
	cr_assert_eq(next, 7);
}

Test(etcd_parse, id_range_values)
{
	uint64_t v;

	cr_assert_eq(dm_idrange_parse("0", 1, &v), 0);
	cr_assert_eq(v, 0);
	cr_assert_eq(dm_idrange_parse("18446744073709551615", 20, &v), -EBADMSG);
	cr_assert_eq(dm_idrange_parse("9223372036854775808", 19, &v), 0);
	cr_assert_eq(v, UINT64_C(1) << 63);
	cr_assert_eq(dm_idrange_parse("9223372036854775809", 19, &v), -EBADMSG);
	cr_assert_eq(dm_idrange_parse("", 0, &v), -EBADMSG);
	cr_assert_eq(dm_idrange_parse("-1", 2, &v), -EBADMSG);
	cr_assert_eq(dm_idrange_parse(" 1", 2, &v), -EBADMSG);
	cr_assert_eq(dm_idrange_parse("1 ", 2, &v), -EBADMSG);
	cr_assert_eq(dm_idrange_parse("123456789012345678901", 21, &v), -EBADMSG);
}

/* Online upper-level nodes (upper.h): published keys read back with the parser, and a
 * graph's keys forgotten without touching another graph's. */
Test(etcd, upper_level_keys)
{
	struct dm_etcd_kv *kvs = NULL;
	struct dm_upper_ent x;
	char prefix[64];
	size_t n = 0;
	int plen = dm_upper_prefix(prefix, sizeof(prefix), "u");
	int64_t del = 0;

	cr_assert_eq(plen, (int)strlen("/dmann/u/upper/"));
	cr_assert_eq(dm_upper_put(E, "u", 3, 7, 0xabcull, 1000, 2), 0);
	cr_assert_eq(dm_upper_put(E, "u", 3, 7, 0xabcull, 1001, 1), 0);
	cr_assert_eq(dm_upper_put(E, "u", 13, 1, 1, 5, 31), 0);
	cr_assert_eq(dm_upper_put(E, "u", 16, 1, 1, 5, 1), -EINVAL);
	cr_assert_eq(dm_upper_put(E, "u", 1, 1, 1, 5, 0), -EINVAL);
	cr_assert_eq(dm_upper_put(E, "u", 1, 1, 1, 5, 32), -EINVAL);
	cr_assert_eq(dm_etcd_range(E, prefix, &kvs, &n, NULL), 0);
	cr_assert_eq(n, 3);
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(dm_upper_parse(kvs[i].key, kvs[i].key_len, (size_t)plen, kvs[i].val,
					    kvs[i].len, &x), 0, "%s", kvs[i].key);
		if (x.graph == 3) {
			cr_assert(x.gen == 7 && x.tag == 0xabc && (x.id == 1000 || x.id == 1001));
			cr_assert_eq(x.level, x.id == 1000 ? 2u : 1u);
		} else {
			cr_assert(x.graph == 13 && x.gen == 1 && x.tag == 1 && x.id == 5 &&
				  x.level == 31);
		}
	}
	dm_etcd_kvs_free(kvs, n);
	/* graph 1's prefix is not graph 13's */
	cr_assert_eq(dm_upper_forget(E, "u", 1, &del), 0);
	cr_assert_eq(del, 0);
	cr_assert_eq(dm_upper_forget(E, "u", 3, &del), 0);
	cr_assert_eq(del, 2);
	cr_assert_eq(dm_etcd_range(E, prefix, &kvs, &n, NULL), 0);
	cr_assert_eq(n, 1);
	dm_etcd_kvs_free(kvs, n);
}

Test(etcd_parse, upper_level_keys)
{
	struct dm_upper_ent x;
	const char *p = "/dmann/u/upper/";
	size_t pl = strlen(p);
	struct {
		const char *key, *val;
		int rc;
	} c[] = {
		{ "/dmann/u/upper/0/0/0000000000000000/0", "1", 0 },
		{ "/dmann/u/upper/15/18446744073709551615/ffffffffffffffff/4294967295", "31", 0 },
		{ "/dmann/u/upper/16/0/0000000000000000/0", "1", -EBADMSG },       /* graph */
		{ "/dmann/u/upper/01/0/0000000000000000/0", "1", -EBADMSG },       /* zero */
		{ "/dmann/u/upper/0/18446744073709551616/0000000000000000/0", "1", -EBADMSG },
		{ "/dmann/u/upper/0/0/000000000000000/0", "1", -EBADMSG },         /* 15 digits */
		{ "/dmann/u/upper/0/0/000000000000000A/0", "1", -EBADMSG },        /* upper case */
		{ "/dmann/u/upper/0/0/0000000000000000/4294967296", "1", -EBADMSG },
		{ "/dmann/u/upper/0/0/0000000000000000/1/2", "1", -EBADMSG },      /* extra part */
		{ "/dmann/u/upper/0/0/0000000000000000", "1", -EBADMSG },          /* no id */
		{ "/dmann/u/upper/0/0/0000000000000000/", "1", -EBADMSG },
		{ "/dmann/u/upper/0/0/0000000000000000/1", "0", -EBADMSG },        /* level */
		{ "/dmann/u/upper/0/0/0000000000000000/1", "32", -EBADMSG },
		{ "/dmann/u/upper/0/0/0000000000000000/1", "", -EBADMSG },
		{ "/dmann/u/upper/0/0/0000000000000000/1", "1 ", -EBADMSG },
		{ "/dmann/u/upper/", "1", -EBADMSG },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		cr_assert_eq(dm_upper_parse(c[i].key, strlen(c[i].key), pl, c[i].val,
					    strlen(c[i].val), &x), c[i].rc, "%s = %s", c[i].key,
			     c[i].val);
	cr_assert_eq(dm_upper_parse(c[1].key, strlen(c[1].key), pl, "31", 2, &x), 0);
	cr_assert(x.graph == 15 && x.gen == UINT64_MAX && x.tag == UINT64_MAX &&
		  x.id == UINT32_MAX && x.level == 31);
}

/* ---- a rollout epoch's oracle handed over through etcd (cn/router/router_etcd.h) ---- */

/* Register compute node id of cluster "o" as a member under a lease of ttl s: its lease. */
/* Revoke a lease after 300 ms (a claimer that dies while another CN waits). */
static void *revoke_later(void *arg)
{
	usleep(300000);
	dm_etcd_lease_revoke(E, *(int64_t *)arg);
	return NULL;
}

static int64_t member_of(uint32_t id, int ttl)
{
	char key[64];
	int64_t lease;

	snprintf(key, sizeof(key), "/dmann/o/members/cn/%u", id);
	cr_assert_eq(dm_etcd_lease_grant(E, ttl, &lease), 0);
	cr_assert_eq(dm_etcd_put(E, key, "{}", 2, lease, NULL), 0);
	return lease;
}

/* Keys under prefix (all with value val when not NULL). */
static size_t prefix_count(const char *prefix, const char *val)
{
	struct dm_etcd_kv *kvs = NULL;
	size_t n = 0;

	cr_assert_eq(dm_etcd_range(E, prefix, &kvs, &n, NULL), 0);
	for (size_t i = 0; val && i < n; i++)
		cr_assert(kvs[i].len == strlen(val) && !memcmp(kvs[i].val, val, kvs[i].len),
			  "%s = %s", kvs[i].key, (char *)kvs[i].val);
	dm_etcd_kvs_free(kvs, n);
	return n;
}

static bool never(void *arg)
{
	(void)arg;
	return false;
}

static bool always(void *arg)
{
	(void)arg;
	return true;
}

/* router_etcd_obtain on a thread of its own (bound 5 s). */
struct waiter {
	struct router_etcd *h;
	struct router_etcd_meta want, got;
	uint8_t *w;
	size_t len;
	int rc;
};

static void *wait_for_model(void *arg)
{
	struct waiter *wt = arg;

	wt->rc = router_etcd_obtain(wt->h, &wt->want, 5000, never, NULL, &wt->w, &wt->len,
				    &wt->got);
	return NULL;
}

/* cn1 claims epoch 3, cn2 waits (bound passes), cn1 claims again (its own claim), publishes;
 * cn2 takes exactly its bytes; another index or regions count has keys of its own; a value
 * of another index under the key, or junk, is refused; a claimer that dies (lease
 * revoked) leaves the claim to the next; a node not registered does not claim; an oracle
 * over 1 MiB is published as a header alone (-E2BIG: fit it locally); epochs E-2 and
 * older are pruned by the fitter of E; a CN already waiting when the model is published
 * takes it. */
Test(etcd, oracle_hand_over)
{
	struct router_etcd *h1 = router_etcd_open(url, "o", 1), *h2 = router_etcd_open(url, "o", 2);
	struct router_etcd *h3 = router_etcd_open(url, "o", 3);
	struct router_etcd_meta want = { .epoch = 3, .crc = 0xabcd, .ncn = 3, .dim = 8,
					 .metric = 0, .keyrange = 1, .lv = 1, .n = 600,
					 .fitter = 1, .hash = 0x1234 }, got, w2;
	uint8_t wire[1000], *w = NULL;
	size_t len = 0, bytes = 0;
	int64_t l1;

	cr_assert(h1 && h2 && h3);
	for (size_t i = 0; i < sizeof(wire); i++)
		wire[i] = (uint8_t)(i * 7);
	l1 = member_of(1, 30);
	member_of(2, 30);
	cr_assert_eq(router_etcd_obtain(h1, &want, 1000, never, NULL, &w, &len, &got), 0);
	cr_assert_eq(router_etcd_obtain(h2, &want, 200, never, NULL, &w, &len, &got), -ETIME);
	cr_assert_eq(router_etcd_obtain(h2, &want, 5000, always, NULL, &w, &len, &got),
		     -ECANCELED);
	cr_assert_eq(router_etcd_obtain(h1, &want, 1000, never, NULL, &w, &len, &got), 0,
		     "a claim of its own");
	cr_assert_eq(router_etcd_obtain(h3, &want, 1000, never, NULL, &w, &len, &got),
		     -ENOTCONN, "not a member: no claim");
	cr_assert_eq(router_etcd_take(h2, &want, &w, &len, &got), -ENOENT);
	cr_assert_eq(router_etcd_publish(h1, &want, wire, sizeof(wire), &bytes), 0);
	cr_assert_eq(bytes, ROE_HDR_LEN + sizeof(wire));
	cr_assert_eq(router_etcd_obtain(h2, &want, 1000, never, NULL, &w, &len, &got), 1);
	cr_assert(len == sizeof(wire) && !memcmp(w, wire, len));
	cr_assert(got.fitter == 1 && got.hash == 0x1234 && got.epoch == 3 && got.n == 600);
	free(w);
	cr_assert_eq(router_etcd_take(h2, &want, &w, &len, &got), 1);
	free(w);
	assert_get("/dmann/o/oracle/epoch", "3", 1);
	/* published: the claim stays without a lease (the list the pruning reads) */
	cr_assert_eq(dm_etcd_lease_revoke(E, l1), 0);
	cr_assert_eq(prefix_count("/dmann/o/oracle/fit/3/", "1"), 1);
	/* another index (or shape, partitions, sample level) has keys of its own */
	w2 = want;
	w2.crc++;
	cr_assert_eq(router_etcd_take(h2, &w2, &w, &len, &got), -ENOENT);
	w2 = want;
	w2.regions = 16;
	cr_assert_eq(router_etcd_obtain(h2, &w2, 1000, never, NULL, &w, &len, &got), 0);
	/* a value under the right key that is not of this index: refused */
	{
		struct dm_etcd_kv *kvs = NULL;
		uint8_t other[ROE_HDR_LEN + 4] = { 0 };
		size_t nk = 0;

		cr_assert_eq(dm_etcd_range(E, "/dmann/o/oracle/model/3/", &kvs, &nk, NULL), 0);
		cr_assert_eq(nk, 1);
		w2 = want;
		w2.crc++;
		router_etcd_encode(&w2, wire, 4, other);
		cr_assert_eq(dm_etcd_put(E, kvs[0].key, other, sizeof(other), 0, NULL), 0);
		cr_assert_eq(router_etcd_take(h2, &want, &w, &len, &got), -ESTALE);
		cr_assert_eq(dm_etcd_put(E, kvs[0].key, "junk", 4, 0, NULL), 0);
		cr_assert_eq(router_etcd_take(h2, &want, &w, &len, &got), -EBADMSG);
		dm_etcd_kvs_free(kvs, nk);
	}

	/* the claimer of epoch 4 dies before publishing: its claim goes with its lease */
	l1 = member_of(1, 30);
	want.epoch = 4;
	cr_assert_eq(router_etcd_obtain(h1, &want, 1000, never, NULL, &w, &len, &got), 0);
	cr_assert_eq(router_etcd_obtain(h2, &want, 200, never, NULL, &w, &len, &got), -ETIME);
	cr_assert_eq(dm_etcd_lease_revoke(E, l1), 0);
	cr_assert_eq(router_etcd_obtain(h2, &want, 1000, never, NULL, &w, &len, &got), 0);
	/* ... and while another CN waits for it: the waiter polls the claim with reads and
	 * claims it once the key is gone */
	{
		pthread_t t;
		struct timespec a, b;

		l1 = member_of(1, 30);
		want.epoch = 5;
		cr_assert_eq(router_etcd_obtain(h1, &want, 1000, never, NULL, &w, &len, &got), 0);
		clock_gettime(CLOCK_MONOTONIC, &a);
		cr_assert_eq(pthread_create(&t, NULL, revoke_later, &l1), 0);
		cr_assert_eq(router_etcd_obtain(h2, &want, 5000, never, NULL, &w, &len, &got), 0);
		clock_gettime(CLOCK_MONOTONIC, &b);
		pthread_join(t, NULL);
		cr_assert_geq((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000, 250,
			      "claimed before the holder's lease went");
		want.epoch = 4;
	}
	/* too large for one value: the header alone, the others fit it themselves */
	{
		size_t big = DM_ETCD_VAL_MAX;
		uint8_t *bw = calloc(1, big);

		cr_assert_not_null(bw);
		want.fitter = 2;
		cr_assert_eq(router_etcd_publish(h2, &want, bw, big, &bytes), 0);
		cr_assert_eq(bytes, ROE_HDR_LEN);
		free(bw);
	}
	cr_assert_eq(router_etcd_obtain(h1, &want, 1000, never, NULL, &w, &len, &got), -E2BIG);
	assert_get("/dmann/o/oracle/epoch", "4", 1);

	/* epochs 5 and 6: the fitter of 6 deletes 4 and older (3, 4), keeps 5 */
	for (uint32_t e = 5; e <= 6; e++) {
		want.epoch = e;
		cr_assert_eq(router_etcd_obtain(h2, &want, 1000, never, NULL, &w, &len, &got), 0);
		cr_assert_eq(router_etcd_publish(h2, &want, wire, 10, NULL), 0);
	}
	for (uint32_t e = 3; e <= 6; e++) {
		char k[64];
		size_t want_n = e >= 5 ? 1 : 0;

		snprintf(k, sizeof(k), "/dmann/o/oracle/model/%u/", e);
		cr_assert_eq(prefix_count(k, NULL), want_n, "%s", k);
		snprintf(k, sizeof(k), "/dmann/o/oracle/fit/%u/", e);
		cr_assert_eq(prefix_count(k, "2"), want_n, "%s", k);
	}
	assert_get("/dmann/o/oracle/epoch", "6", 1);

	/* epoch 7: cn2 is already waiting (watching the oracle keys) when cn1 publishes; it
	 * takes the model, within its bound */
	{
		pthread_t t;
		struct waiter wt = { .h = h2, .want = want };

		member_of(1, 30);
		want.epoch = wt.want.epoch = 7;
		want.fitter = 1;
		cr_assert_eq(router_etcd_obtain(h1, &want, 1000, never, NULL, &w, &len, &got), 0);
		cr_assert_eq(pthread_create(&t, NULL, wait_for_model, &wt), 0);
		usleep(300000);
		cr_assert_eq(router_etcd_publish(h1, &want, wire, 40, NULL), 0);
		pthread_join(t, NULL);
		cr_assert_eq(wt.rc, 1, "the waiter did not take the model: %d", wt.rc);
		cr_assert(wt.len == 40 && !memcmp(wt.w, wire, 40));
		cr_assert_eq(wt.got.fitter, 1);
		free(wt.w);
	}
	router_etcd_close(h1);
	router_etcd_close(h2);
	router_etcd_close(h3);
}

/* Field by field: the struct has padding before hash, which a parse does not set. */
static bool meta_eq(const struct router_etcd_meta *a, const struct router_etcd_meta *b)
{
	return a->epoch == b->epoch && a->crc == b->crc && a->ncn == b->ncn &&
	       a->dim == b->dim && a->metric == b->metric && a->keyrange == b->keyrange &&
	       a->regions == b->regions && a->lv == b->lv && a->n == b->n &&
	       a->fitter == b->fitter && a->flags == b->flags && a->hash == b->hash;
}

Test(etcd_parse, oracle_values)
{
	struct router_etcd_meta m = { .epoch = 9, .crc = 7, .ncn = 3, .dim = 4, .metric = 1,
				      .keyrange = 0, .lv = 2, .n = 50, .fitter = 2, .hash = 99 },
		got;
	uint8_t buf[ROE_HDR_LEN + 16], bad[sizeof(buf)], wire[16] = { 1, 2, 3 };
	const uint8_t *w;
	size_t wl;

	router_etcd_encode(&m, wire, sizeof(wire), buf);
	cr_assert_eq(router_etcd_parse(buf, sizeof(buf), &got, &w, &wl), 0);
	cr_assert(meta_eq(&got, &m) && w == buf + ROE_HDR_LEN && wl == sizeof(wire));
	cr_assert_eq(router_etcd_parse(buf, sizeof(buf) - 1, &got, &w, &wl), -EBADMSG);
	cr_assert_eq(router_etcd_parse(buf, ROE_HDR_LEN - 1, &got, &w, &wl), -EBADMSG);
	cr_assert_eq(router_etcd_parse(NULL, 0, &got, &w, &wl), -EBADMSG);
	/* every header word but epoch, crc, metric, lv, n, regions (free values) has values
	 * refused */
	static const struct { size_t off; uint32_t v; } cases[] = {
		{ 0, 0 }, { 4, 2 }, { 16, 0 }, { 16, DM_MAX_NODES + 1 }, { 20, 0 }, { 28, 2 },
		{ 40, DM_MAX_NODES }, { 44, 2 }, { 44, ROE_F_LOCAL }, { 56, 15 } };

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(bad, buf, sizeof(buf));
		dm_put_le32(bad + cases[i].off, cases[i].v);
		cr_assert_eq(router_etcd_parse(bad, sizeof(bad), &got, &w, &wl), -EBADMSG,
			     "word at %zu = %u", cases[i].off, cases[i].v);
	}
	/* a header alone, flagged: no wire form */
	m.flags = ROE_F_LOCAL;
	router_etcd_encode(&m, NULL, 0, buf);
	cr_assert_eq(router_etcd_parse(buf, ROE_HDR_LEN, &got, &w, &wl), 0);
	cr_assert(got.flags == ROE_F_LOCAL && !w && !wl);
	m.flags = 0;
	router_etcd_encode(&m, NULL, 0, buf);
	cr_assert_eq(router_etcd_parse(buf, ROE_HDR_LEN, &got, &w, &wl), -EBADMSG,
		     "no wire form without the flag");
}
