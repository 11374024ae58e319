/* cn_s3.c: start and stop of the compute node's S3 Vectors gateway (distributed path,
 * see cn_s3.h): the settings ([s3] of the cluster file, environment overrides for tests),
 * the cluster-internal signing key of sub-requests, the transport context towards the
 * memory nodes, the HTTP front end; the gateway's Prometheus metrics. */
#include "cn_s3_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "cluster.h"

/* The [s3] settings of the cluster file, each overridden by DMANN_S3_<KEY> when that is
 * set: a copy of cfg->s3 with the overrides applied (an invalid one is warned about and
 * the file's value kept). */
static struct dm_s3_cfg settings(const struct dm_cluster_cfg *cfg)
{
	static const char *const keys[] = { "width", "groups", "max_scan_mb", "hedge_ms",
		"cache_mb", "frag_fetch_kb", "queue_depth", "search_threads", "http_threads",
		"graph_min_rows", "graph_ef", "graph_beam", "graph_filter_widen", "index_interval_ms",
		"index_batch", "index_threads", "index_ef", "member_conns", "graph_auto",
		"graph_room", "write_min_replicas", "bucket_shards", "scan_budget", "scan_regions",
		"scan_min_rows", "scan_widen" };
	struct dm_s3_cfg out = cfg->s3;

	for (size_t i = 0; i < DM_ARRAY_SIZE(keys); i++) {
		char name[64], msg[160];
		const char *v;
		size_t j;

		j = (size_t)snprintf(name, sizeof(name), "DMANN_S3_");
		for (const char *k = keys[i]; *k && j + 1 < sizeof(name); k++)
			name[j++] = (char)(*k >= 'a' && *k <= 'z' ? *k - 32 : *k);
		name[j] = 0;
		v = getenv(name);
		if (!v || !*v)
			continue;
		if (dm_s3_cfg_key(&out, keys[i], v, msg, sizeof(msg)))
			dm_warn("s3: ignoring %s=%s: %s", name, v, msg);
	}
	return out;
}

/* One HTTP front end of the gateway on hostport (HTTPS with the [s3] certificate when tls).
 * NULL + errno, logged. */
static struct s3_http *serve(struct cn_s3 *s, const struct dm_s3_cfg *set, const char *hostport,
			     bool tls)
{
	const struct dm_cluster_cfg *cfg = s->cfg;
	char host[DM_ADDR_MAX], *colon, *end;
	unsigned long port;
	struct s3_http *h;

	snprintf(host, sizeof(host), "%s", hostport);
	colon = strrchr(host, ':');
	port = colon ? strtoul(colon + 1, &end, 10) : 0;
	if (!colon || *end || port > 65535) {
		dm_err("cn%u: %s = %s is not host:port", s->node->id, tls ? "https" : "http",
		       hostport);
		errno = EINVAL;
		return NULL;
	}
	*colon = 0;
	struct s3_http_cfg hc = {
		.addr = host[0] == '[' ? NULL : host,
		.port = (uint16_t)port,
		.backend = &s->be,
		.auth = { .creds = s->creds, .ncreds = cfg->n_s3_ids, .service = "s3vectors",
			  .region = NULL, .max_skew_s = 900 },
		.http_threads = set->http_threads,
		.search_threads = s->search_threads,
		.queue_depth = set->queue_depth,
		.policy_default_deny = cfg->s3_policy_deny,
		.tls_cert = tls ? cfg->s3_https_cert : NULL,
		.tls_key = tls ? cfg->s3_https_key : NULL,
	};

	h = s3_http_start(&hc);
	if (!h)
		dm_err("cn%u: s3: cannot serve on %s: %s", s->node->id, hostport, strerror(errno));
	return h;
}

struct cn_s3 *cn_s3_start(const struct dm_cluster_cfg *cfg, const struct dm_node_cfg *node)
{
	struct cn_s3 *s;
	int err;

	if (!node->http[0] || !cfg->n_s3_ids) {
		errno = ENOENT;
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	s->cfg = cfg;
	s->node = node;
	s->redundancy = DM_MAX(1u, DM_MIN(cfg->redundancy ? cfg->redundancy : 1, cfg->n_mn));
	struct dm_s3_cfg set = settings(cfg);

	s->force_w = set.width;
	s->force_r = set.groups;
	s->max_scan_bytes = set.max_scan_bytes;
	s->hedge_ms = set.hedge_ms;
	s->frag_piece_bytes = set.frag_fetch_bytes;
	s->search_threads = set.search_threads;
	s->graph_min_rows = set.graph_min_rows;
	s->graph_ef = set.graph_ef;
	s->graph_beam = set.graph_beam;
	s->graph_widen = set.graph_filter_widen;
	s->ix.interval_ms = set.index_interval_ms;
	s->ix.batch = set.index_batch;
	s->ix.threads = set.index_threads;
	s->ix.ef = set.index_ef;
	s->ix.seed_auto = set.graph_auto != 0;
	s->ix.seed_room = set.graph_room;
	s->member_conns = DM_MIN(set.member_conns, (uint32_t)HPOOL_MAX);
	s->repl.write_min = DM_MAX(1u, set.write_min_replicas);
	s->shards = DM_MAX(1u, DM_MIN(set.bucket_shards, (uint32_t)DM_S3_SHARDS_MAX));
	s->scan_budget = set.scan_budget;
	s->scan_regions = set.scan_regions;
	s->scan_min_rows = set.scan_min_rows;
	s->scan_widen = set.scan_widen;
	/* Test hook only (not a setting): DMANN_S3_TEST_DELAY_MS on the CN that
	 * DMANN_S3_TEST_DELAY_CN names delays the scans it serves for other CNs. */
	const char *dcn = getenv("DMANN_S3_TEST_DELAY_CN");
	const char *dms = getenv("DMANN_S3_TEST_DELAY_MS");

	if (dcn && *dcn && dms && strtoul(dcn, NULL, 10) == node->id)
		s->test_delay_ms = (uint32_t)DM_MIN(strtoul(dms, NULL, 10), 60000ul);
	/* Test hook only: while the file DMANN_S3_TEST_BUSY_FILE names exists, every
	 * QueryVectors is answered 503 (how the tests see libdmann send busy reads again). */
	const char *busy = getenv("DMANN_S3_TEST_BUSY_FILE");

	if (busy && *busy)
		snprintf(s->test_busy, sizeof(s->test_busy), "%s", busy);
	pthread_mutex_init(&s->rmu, NULL);
	pthread_mutex_init(&s->shmu, NULL);
	pthread_mutex_init(&s->gmu, NULL);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		pthread_mutex_init(&s->gk[g].mu, NULL);
	pthread_mutex_init(&s->hpool_mu, NULL);
	for (uint32_t i = 0; i < cfg->n_mn; i++)
		pthread_mutex_init(&s->mn[i].mu, NULL);
	s->cache = s3_fcache_new(set.cache_bytes);
	if (!s->cache) {
		err = errno;
		goto err_destroy_locks;
	}
	s->parts = parts_new();
	if (!s->parts) {
		err = errno;
		goto err_free_cache;
	}
	for (uint32_t i = 0; i < cfg->n_s3_ids; i++)
		s->creds[i] = (struct s3_cred){ .access_key = (char *)cfg->s3_ids[i].access_key,
						.secret_key = (char *)cfg->s3_ids[i].secret,
						.principal = (char *)cfg->s3_ids[i].principal };
	/* Sub-requests between CNs are signed with a key only cluster members can derive: an
	 * HMAC of the cluster secret (S3 users hold the [s3] key, not this one). */
	{
		uint8_t mac[32];
		unsigned int ml = sizeof(mac);

		HMAC(EVP_sha256(), cfg->secret, (int)cfg->secret_len,
		     (const uint8_t *)"dmann-s3-internal", 17, mac, &ml);
		for (unsigned i = 0; i < 32; i++)
			sprintf(s->isecret + 2 * i, "%02x", mac[i]);
		snprintf(s->ikey, sizeof(s->ikey), "DMANNCLUSTER%02X%02X", mac[30], mac[31]);
		s->icred = (struct s3_cred){ .access_key = s->ikey, .secret_key = s->isecret };
		s->iauth = (struct s3_sigv4_cfg){ .creds = &s->icred, .ncreds = 1,
						  .service = "s3vectors", .max_skew_s = 900 };
	}

	s->x = dm_cluster_xport(cfg, NULL);
	if (!s->x) {
		err = errno;
		goto err_free_cache;
	}
	/* Our own context: S3 streams never share receive buffers with the HNSW path. */
	s->pool = dm_msgpool_new(s->x, 256, MY_MSG);
	if (!s->pool) {
		err = errno;
		dm_err("cn%u: s3: cannot post receive buffers: %s", node->id, strerror(err));
		goto err_close_x;
	}
	s->be = (struct s3_backend){ .ctx = s, .handle = be_handle, .query = be_query,
				     .internal = be_internal_http, .internal_auth = &s->iauth };
	s->http = serve(s, &set, node->http, false);
	if (!s->http) {
		err = errno;
		goto err_free_pool;
	}
	if (node->https[0]) {
		s->https = serve(s, &set, node->https, true);
		if (!s->https) {
			err = errno;
			goto err_stop_http;
		}
	}
	if (!s->search_threads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		s->search_threads = n > 0 ? (uint32_t)n : 1;   /* s3_http's default */
	}
	repl_start(s);
	dm_info("cn%u: S3 Vectors gateway on http://%s%s%s (%u memory nodes, redundancy %u, %u "
		"identities)", node->id, node->http, node->https[0] ? " and https://" : "",
		node->https, cfg->n_mn, s->redundancy, cfg->n_s3_ids);
	return s;

err_stop_http:
	s3_http_stop(s->http);
err_free_pool:
	dm_msgpool_free(s->pool);
err_close_x:
	dm_xport_close(s->x);
err_free_cache:
	parts_free(s->parts);
	s3_fcache_free(s->cache);
err_destroy_locks:
	for (uint32_t i = 0; i < cfg->n_mn; i++)
		pthread_mutex_destroy(&s->mn[i].mu);
	pthread_mutex_destroy(&s->rmu);
	pthread_mutex_destroy(&s->shmu);
	pthread_mutex_destroy(&s->gmu);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		pthread_mutex_destroy(&s->gk[g].mu);
	pthread_mutex_destroy(&s->hpool_mu);
	free(s);
	errno = err;
	return NULL;
}

void cn_s3_stop(struct cn_s3 *s)
{
	if (!s)
		return;
	indexer_stop(s);
	s3_http_stop(s->https);
	s3_http_stop(s->http);
	repl_stop(s);
	parts_drain(s->parts);
	for (uint32_t i = 0; i < s->cfg->n_mn; i++) {
		while (s->mn[i].idle) {
			struct mnconn *mc = s->mn[i].idle;

			s->mn[i].idle = mc->next;
			mnconn_free(mc);
		}
		pthread_mutex_destroy(&s->mn[i].mu);
	}
	graph_pool_fini(s);
	gk_fini(s);
	hpool_fini(s);
	parts_free(s->parts);
	s3_fcache_free(s->cache);
	dm_info("cn%u: s3: %llu graph queries (%llu sent to the exact path after the graph, %llu "
		"by the filter estimate, %llu graph errors)", s->node->id,
		(unsigned long long)s->graph_queries, (unsigned long long)s->graph_fallbacks,
		(unsigned long long)s->graph_planned_exact, (unsigned long long)s->graph_errors);
	dm_info("cn%u: s3: %llu sub-requests (%llu connections opened, %llu kept-alive ones "
		"reused), %llu hedged, %llu retried, %llu fragment fetches, %llu plan fallbacks",
		s->node->id, (unsigned long long)s->subreqs, (unsigned long long)s->subreq_conns,
		(unsigned long long)s->subreq_reused,
		(unsigned long long)s->hedges, (unsigned long long)s->retries,
		(unsigned long long)s->fetches, (unsigned long long)s->plan_fallbacks);
	dm_msgpool_free(s->pool);
	dm_xport_close(s->x);
	pthread_mutex_destroy(&s->rmu);
	pthread_mutex_destroy(&s->shmu);
	free(s);
}

void cn_s3_metrics(struct cn_s3 *s, FILE *out)
{
	struct s3_fcache_stats fc;
	unsigned id;

	if (!s)
		return;
	id = s->node->id;
	s3_fcache_stats(s->cache, &fc);
#define CTR(name, help, v) fprintf(out, "# HELP dmann_cn_s3_" name " " help "\n"          \
				   "# TYPE dmann_cn_s3_" name " counter\n"               \
				   "dmann_cn_s3_" name "{node=\"%u\"} %llu\n", id,           \
				   (unsigned long long)(v))
#define GAUGE(name, help, v) fprintf(out, "# HELP dmann_cn_s3_" name " " help "\n"        \
				     "# TYPE dmann_cn_s3_" name " gauge\n"               \
				     "dmann_cn_s3_" name "{node=\"%u\"} %llu\n", id,         \
				     (unsigned long long)(v))
	CTR("subrequests_total", "Scan sub-requests sent to other compute nodes.",
	    __atomic_load_n(&s->subreqs, __ATOMIC_RELAXED));
	CTR("subrequest_connections_total", "Connections opened to other compute nodes' "
	    "gateways for sub-requests (the rest reused kept-alive ones).",
	    __atomic_load_n(&s->subreq_conns, __ATOMIC_RELAXED));
	CTR("subrequest_reused_total", "Sub-requests sent on a kept-alive connection "
	    "([s3] member_conns).", __atomic_load_n(&s->subreq_reused, __ATOMIC_RELAXED));
	CTR("hedges_total", "Slow scan members hedged to another compute node.",
	    __atomic_load_n(&s->hedges, __ATOMIC_RELAXED));
	CTR("retries_total", "Failed scan shares retried elsewhere.",
	    __atomic_load_n(&s->retries, __ATOMIC_RELAXED));
	CTR("fragment_fetches_total", "Fragment pieces fetched from the memory nodes.",
	    __atomic_load_n(&s->fetches, __ATOMIC_RELAXED));
	CTR("plan_fallbacks_total", "Queries scanned by this compute node alone because no "
	    "replica group could be formed (W x R past the plan table, or no member up).",
	    __atomic_load_n(&s->plan_fallbacks, __ATOMIC_RELAXED));
	CTR("partitioned_queries_total", "QueryVectors whose exact scan read only the rows of "
	    "the regions the bounded-fanout frontier chose ([s3] scan_budget).",
	    __atomic_load_n(&s->part_queries, __ATOMIC_RELAXED));
	CTR("partition_regions_total", "Regions those queries scanned, added up (over "
	    "partitioned_queries_total: the mean fan-out).",
	    __atomic_load_n(&s->part_regions_sel, __ATOMIC_RELAXED));
	CTR("partition_fits_total", "Partition models (VHash of an index) fitted here.",
	    __atomic_load_n(&s->part_fits, __ATOMIC_RELAXED));
	CTR("partition_fit_milliseconds_total", "Time spent fitting them.",
	    __atomic_load_n(&s->part_fit_ns, __ATOMIC_RELAXED) / 1000000ull);
	CTR("partition_mismatches_total", "Partitioned shares scanned whole because this "
	    "compute node's model differed from the ingress's or was not ready.",
	    __atomic_load_n(&s->part_mismatch, __ATOMIC_RELAXED));
	CTR("scan_rows_total", "Rows the exact-scan shares served here compared with their "
	    "query.", __atomic_load_n(&s->scan_rows, __ATOMIC_RELAXED));
	CTR("scan_rows_skipped_total", "Rows of those shares skipped because their region was "
	    "not chosen (partitioned scans).",
	    __atomic_load_n(&s->scan_skipped, __ATOMIC_RELAXED));
	CTR("scope_queries_total", "QueryVectors of a scoped index whose filter pins the scope "
	    "key: planned on that scope value's fragments only (ingress).",
	    __atomic_load_n(&s->scope_queries, __ATOMIC_RELAXED));
	CTR("scope_fragments_total", "Fragments those queries kept (their scope value's).",
	    __atomic_load_n(&s->scope_frags, __ATOMIC_RELAXED));
	CTR("scope_fragments_skipped_total", "Fragments of other scope values those queries "
	    "left out.", __atomic_load_n(&s->scope_frags_skipped, __ATOMIC_RELAXED));
	CTR("scope_rows_total", "Live rows scoped queries read (compared) in the shares "
	    "served here.", __atomic_load_n(&s->scope_rows, __ATOMIC_RELAXED));
	CTR("scope_other_rows_total", "Of those, rows whose scope value is not the query's "
	    "(0 unless two values share a label).",
	    __atomic_load_n(&s->scope_other_rows, __ATOMIC_RELAXED));
	CTR("graph_queries_total", "QueryVectors served by the graph path (HNSW candidates of a "
	    "bulk-imported index plus an exact scan of its tail).",
	    __atomic_load_n(&s->graph_queries, __ATOMIC_RELAXED));
	CTR("graph_fallbacks_total", "Queries of a graph-bound index sent to the exact path "
	    "after the graph: too few candidates passed the filter or were alive.",
	    __atomic_load_n(&s->graph_fallbacks, __ATOMIC_RELAXED));
	CTR("graph_tail_rows_total", "Rows past the graph mark (dead ones included) that graph-path "
	    "queries scanned exactly: what the online indexer has not yet moved into the graph.",
	    __atomic_load_n(&s->graph_tail_rows, __ATOMIC_RELAXED));
	CTR("graph_planned_exact_total", "Filtered queries of a graph-bound index that the "
	    "filter's cardinality estimate sent straight to the exact path (too few rows pass "
	    "for the graph's candidates to hold topK of them).",
	    __atomic_load_n(&s->graph_planned_exact, __ATOMIC_RELAXED));
	CTR("graph_errors_total", "Graph searches that failed (the exact path served them).",
	    __atomic_load_n(&s->graph_errors, __ATOMIC_RELAXED));
	CTR("indexed_rows_total", "Tail rows the online indexer put into the graph and handed "
	    "over to every replica (the mark moved over them).",
	    __atomic_load_n(&s->ix.rows, __ATOMIC_RELAXED));
	CTR("index_batches_total", "Batches of the online indexer handed over.",
	    __atomic_load_n(&s->ix.batches, __ATOMIC_RELAXED));
	CTR("index_errors_total", "Online indexer steps that failed (inserts, snapshots, "
	    "hand-overs); the rows stay in the tail.",
	    __atomic_load_n(&s->ix.errors, __ATOMIC_RELAXED));
	CTR("index_snapshots_total", "Graph snapshots the online indexer asked for.",
	    __atomic_load_n(&s->ix.snapshots, __ATOMIC_RELAXED));
	CTR("index_snapshot_seconds_total", "Seconds spent in those snapshots (whole seconds).",
	    __atomic_load_n(&s->ix.snapshot_ns, __ATOMIC_RELAXED) / 1000000000ull);
	CTR("index_insert_milliseconds_total", "Milliseconds the online indexer spent inserting "
	    "rows into the graph (its rate: indexed rows over this).",
	    __atomic_load_n(&s->ix.insert_ns, __ATOMIC_RELAXED) / 1000000ull);
	CTR("index_graphs_seeded_total", "Graphs built for indexes created through the API "
	    "([s3] graph_auto) and placed by this compute node.",
	    __atomic_load_n(&s->ix.seeded, __ATOMIC_RELAXED));
	CTR("index_graphs_dropped_total", "Graphs dropped because the S3 index bound to them was "
	    "deleted.", __atomic_load_n(&s->ix.graphs_dropped, __ATOMIC_RELAXED));
	GAUGE("index_lag_rows", "Rows past the graph marks of the graph-bound indexes, on their "
	      "buckets' primaries at the indexer's last look (0 on compute nodes that do not "
	      "index).",
	      __atomic_load_n(&s->ix.lag, __ATOMIC_RELAXED));
	CTR("degraded_writes_total", "Writes acknowledged without every replica of their bucket "
	    "(the missed ones marked stale first; [s3] write_min_replicas).",
	    __atomic_load_n(&s->repl.degraded_writes, __ATOMIC_RELAXED));
	CTR("stale_marks_total", "Stale marks this compute node put into the cluster state (one "
	    "per write and replica it missed).", __atomic_load_n(&s->repl.marks, __ATOMIC_RELAXED));
	CTR("stale_mark_errors_total", "Stale marks that could not be put (etcd unreachable): "
	    "those writes were refused with 503.",
	    __atomic_load_n(&s->repl.mark_errors, __ATOMIC_RELAXED));
	GAUGE("stale_replicas", "Bucket replicas marked stale in the cluster state now (reads "
	      "skip them until the controller caught them up).", repl_stale_count(s));
	CTR("catchups_total", "Stale bucket replicas this compute node caught up as the "
	    "controller.", __atomic_load_n(&s->repl.catchups, __ATOMIC_RELAXED));
	CTR("catchup_errors_total", "Catch-ups that failed (tried again after 5 s).",
	    __atomic_load_n(&s->repl.catchup_errors, __ATOMIC_RELAXED));
	CTR("catchup_bytes_total", "Bytes of bucket images copied by those catch-ups.",
	    __atomic_load_n(&s->repl.catchup_bytes, __ATOMIC_RELAXED));
	CTR("fragment_cache_hits_total", "Fragment cache lookups that hit.", fc.hits);
	CTR("fragment_cache_misses_total", "Fragment cache lookups that missed.", fc.misses);
	CTR("fragment_cache_evictions_total", "Fragments evicted from the cache.", fc.evictions);
	GAUGE("fragment_cache_bytes", "Bytes held by the fragment cache.", fc.bytes);
	GAUGE("fragment_cache_capacity_bytes", "Fragment cache capacity.", fc.cap);
#undef CTR
#undef GAUGE
}
