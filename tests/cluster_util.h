/* cluster_util.h: helpers of the tests that start local clusters (test_cluster,
 * test_router, test_reload): shell commands, time bounds, the local search's answers. */
#ifndef DM_TESTS_CLUSTER_UTIL_H
#define DM_TESTS_CLUSTER_UTIL_H

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hnsw/hnsw.h"
#include "vecfile.h"

/* Run a shell command (echoed to stderr); its exit status, or -1. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static int sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	fprintf(stderr, "+ %s\n", cmd);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A test's directory once its cluster is down: removed, or kept whole with
 * DMANN_KEEP_TEST_DIR=1, or with DMANN_KEEP_TEST_DIR=logs only its *.log files kept (the
 * soft-RoCE VM: its /tmp is RAM, and data files and etcd's preallocated WAL of every case
 * would add up; busybox's find there has no -delete). */
static __attribute__((unused)) void cluster_test_dir_done(const char *dir)
{
	const char *keep = getenv("DMANN_KEEP_TEST_DIR");

	if (!keep)
		sh("rm -rf %s", dir);
	else if (strcmp(keep, "logs") == 0)
		sh("find %s ! -type d ! -name '*.log' -exec rm -f {} +", dir);
}

/* s seconds in ns, scaled by DMANN_TEST_TIME_SCALE (the soft-RoCE VM runs emulated). */
static __attribute__((unused)) uint64_t bound_s(unsigned s)
{
	const char *e = getenv("DMANN_TEST_TIME_SCALE");
	unsigned f = e ? (unsigned)atoi(e) : 1;

	return (uint64_t)s * (f ? f : 1) * 1000000000ull;
}

/* bound_s(s), but at most max seconds: for waits that must end (and say why) before the
 * test's own timeout when the time scale is large (the soft-RoCE VM's 6). */
static __attribute__((unused)) uint64_t bound_max_s(unsigned s, unsigned max)
{
	uint64_t b = bound_s(s);

	return b < (uint64_t)max * 1000000000ull ? b : (uint64_t)max * 1000000000ull;
}

/* The ids (k per query) of the local search of index image `index` with ef for every
 * query of `queries`; *nq gets the query count. */
/* Ids of the local search (beam b, 1 = the plain search) of every query of a file; the index
 * must have neighbour codes when need_codes is set. */
static __attribute__((unused)) int32_t *local_search_ids_b(const char *index,
							    const char *queries, int k, int ef,
							    uint32_t beam, bool need_codes,
							    uint32_t *nq)
{
	struct dm_vecs qv;
	char err[512];
	struct hnsw_index *idx;
	struct hnsw_searcher *s;
	struct hnsw_src src;
	struct dm_hit *h = calloc((size_t)k, sizeof(*h));
	int32_t *ids;

	idx = hnsw_load(index, err, sizeof(err));
	cr_assert_not_null(idx, "%s", err);
	if (need_codes)
		cr_assert_not_null(idx->quant, "the index was built without neighbour codes");
	cr_assert_eq(dm_vecs_read(queries, DM_VF_FBIN, &qv, err, sizeof(err)), 0, "%s", err);
	hnsw_src_local(idx, &src);
	s = hnsw_searcher_new(idx->n, idx->p.dim);
	ids = calloc(qv.n * (size_t)k, sizeof(*ids));
	cr_assert(h && s && ids);
	for (uint64_t i = 0; i < qv.n; i++) {
		int n = hnsw_search_b(&src, s, (const float *)qv.data + i * qv.dim, (size_t)k,
				      (size_t)ef, beam, h);

		cr_assert_eq(n, k);
		for (int j = 0; j < k; j++)
			ids[i * (size_t)k + (size_t)j] =
				(int32_t)hnsw_label(idx->labels, idx->n, h[j].id);
	}
	*nq = (uint32_t)qv.n;
	free(h);
	hnsw_searcher_free(s);
	hnsw_free(idx);
	dm_vecs_free(&qv);
	return ids;
}

static __attribute__((unused)) int32_t *local_search_ids(const char *index, const char *queries,
							  int k, int ef, uint32_t *nq)
{
	return local_search_ids_b(index, queries, k, ef, 1, false, nq);
}

/* The pid of node `node` (mn0, cn1, ...) of the local cluster in dir (its pids file; the
 * last line naming it). */
static __attribute__((unused)) pid_t cluster_pid_of(const char *dir, const char *node)
{
	char p[256], line[128], name[32];
	int pid, found = -1;
	FILE *f;

	snprintf(p, sizeof(p), "%s/pids", dir);
	f = fopen(p, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%d %31s", &pid, name) == 2 && !strcmp(name, node))
			found = pid;
	fclose(f);
	cr_assert_gt(found, 1, "no pid for %s", node);
	return found;
}

/* The pid of the local cluster's etcd (the "etcd PID DIR" line of dir/pids). */
static __attribute__((unused)) pid_t cluster_etcd_pid(const char *dir)
{
	char line[1200];
	int pid = 0;
	FILE *f;

	snprintf(line, sizeof(line), "%s/pids", dir);
	f = fopen(line, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "etcd %d", &pid) == 1)
			break;
	fclose(f);
	cr_assert_gt(pid, 1, "local up records its etcd in pids");
	return pid;
}

/* GET /metrics of node kind.cn ("cn" or "mn") of the local cluster in dir (its `metrics`
 * address in cluster.ini) into out: 0, or -1 when it does not accept the connection. A
 * plain HTTP/1.0 GET: no client library needed (the VM has none). */
static __attribute__((unused)) int cluster_node_metrics(const char *dir, const char *kind,
							unsigned cn, char *out, size_t len)
{
	char p[256], line[256], addr[64] = "", sect[16], cmd[512];
	struct sockaddr_in sa = { .sin_family = AF_INET };
	bool in = false;
	char *colon;
	size_t n = 0;
	ssize_t r;
	FILE *f;
	int fd;

	snprintf(p, sizeof(p), "%s/cluster.ini", dir);
	snprintf(sect, sizeof(sect), "[%s.%u]", kind, cn);
	f = fopen(p, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '[')
			in = !strncmp(line, sect, strlen(sect));
		if (in && sscanf(line, "metrics = %63s", addr) == 1)
			break;
	}
	fclose(f);
	cr_assert(addr[0], "local up wrote no metrics address for %s.%u", kind, cn);
	colon = strrchr(addr, ':');
	cr_assert_not_null(colon);
	*colon = '\0';
	sa.sin_port = htons((uint16_t)atoi(colon + 1));
	cr_assert_eq(inet_pton(AF_INET, addr, &sa.sin_addr), 1);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		return -1;
	}
	snprintf(cmd, sizeof(cmd), "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr);
	cr_assert_eq(write(fd, cmd, strlen(cmd)), (ssize_t)strlen(cmd));
	while (n < len - 1 && (r = read(fd, out + n, len - 1 - n)) > 0)
		n += (size_t)r;
	out[n] = '\0';
	close(fd);
	return 0;
}

static __attribute__((unused)) int cluster_metrics(const char *dir, unsigned cn, char *out,
						   size_t len)
{
	return cluster_node_metrics(dir, "cn", cn, out, len);
}

/* A counter or gauge of node kind.id's /metrics (kind "cn" or "mn"; the local cluster in
 * dir); -1 when the node does not answer or has no such metric. */
static __attribute__((unused)) long long cluster_node_metric(const char *dir, const char *kind,
							     unsigned id, const char *name)
{
	static char out[65536];
	char key[128], *at;

	if (cluster_node_metrics(dir, kind, id, out, sizeof(out)))
		return -1;
	snprintf(key, sizeof(key), "\n%s{node=\"%u\"} ", name, id);
	at = strstr(out, key);
	return at ? atoll(at + strlen(key)) : -1;
}

/* A counter or gauge of compute node cn's /metrics (the local cluster in dir); -1 when the
 * node does not answer or has no such metric. */
static __attribute__((unused)) long long cluster_metric(const char *dir, unsigned cn,
							const char *name)
{
	return cluster_node_metric(dir, "cn", cn, name);
}

/* How many of the n x k ids in the ibin file at path differ from want (nq rows of k, query i
 * compared with row i % nq). */
static __attribute__((unused)) unsigned cluster_compare_ids(const char *path,
							    const int32_t *want, uint32_t nq,
							    uint64_t n, int k)
{
	struct dm_vecs got;
	char err[512];
	unsigned diff = 0;

	cr_assert_eq(dm_vecs_read(path, DM_VF_IBIN, &got, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(got.n, n);
	cr_assert_eq(got.dim, (uint32_t)k);
	for (uint64_t i = 0; i < n; i++)
		for (int j = 0; j < k; j++)
			diff += ((int32_t *)got.data)[i * k + j] != want[(i % nq) * k + j];
	dm_vecs_free(&got);
	return diff;
}

/* The first `http = host:port` of the cluster file cfgpath (a gateway's address) into out
 * (128 bytes); the test fails without one. */
static __attribute__((unused)) void cluster_http(const char *cfgpath, char *out)
{
	char line[256];
	FILE *f = fopen(cfgpath, "r");

	out[0] = 0;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "http = %127s", out) == 1)
			break;
	if (f)
		fclose(f);
	cr_assert(out[0], "no http address in %s", cfgpath);
}

#endif
