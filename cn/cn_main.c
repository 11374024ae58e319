/* cn_main.c: dmann-cn, the compute node. Connects to the memory nodes, reads the index
 * metadata and block table from them (when an index is loaded), and serves clients on its
 * address: each client connection gets a worker thread that keeps many queries in flight.
 * Every [cn] refresh_ms the main thread reports to the memory nodes and moves to a newly
 * loaded index generation (cn_gen.c). A memory node failure fails the affected queries
 * with a clear error; the main thread reconnects and re-reads the block table until the
 * node is back. SIGTERM: clean exit. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cn.h"
#include "distance.h"
#include "cn_upper.h"
#include "dm_config.h"
#include "metrics.h"
#if DM_HAVE_ETCD
#include "cstate.h"
#include "member.h"
#endif
#if DM_HAVE_HTTP
#include "cn_s3.h"
#include "cn_graph.h"
#endif

static volatile sig_atomic_t got_signal;
#if DM_HAVE_HTTP
static struct cn_s3 *s3gw;            /* S3 Vectors gateway (cn_s3.c), when http is set */
#endif

/* SIGTERM drain: after this CN left the cluster state, the routers and clients move its
 * partition to a neighbour (a new routing epoch); until then, and until the queries still
 * sent to it are answered, it serves on. Returns once no query arrived or was running for
 * DRAIN_IDLE_NS after the up-set stopped listing it (at once without a cluster state), or
 * for DRAIN_QUIET_NS while it still lists it (nobody sends anything: the whole cluster is
 * going down, or the next controller waits its grace), or after [cn] drain_ms. */
#define DRAIN_IDLE_NS 300000000ull
#define DRAIN_QUIET_NS 1000000000ull
static void drain(struct cn *cn, bool follows_state)
{
	uint64_t t0 = dm_now_ns(), now = t0, idle_since = t0, limit;
	unsigned long q = atomic_load(&cn->queries), q0 = q;
	bool left = !follows_state;

	limit = (uint64_t)cn->node->cnc.drain_ms * 1000000ull;
	while (now - t0 < limit) {
		unsigned long q1 = atomic_load(&cn->queries);

		left = left || atomic_load(&cn->state_self_down);
		if (q1 != q || atomic_load(&cn->qlen)) {
			q = q1;
			idle_since = now;
		}
		if (now - idle_since >= (left ? DRAIN_IDLE_NS : DRAIN_QUIET_NS))
			break;
		usleep(20000);
		now = dm_now_ns();
	}
	if (limit)
		dm_info("cn%u: drained in %llu ms (%s the cluster state, %lu queries answered "
			"meanwhile)", cn->node->id, (unsigned long long)((now - t0) / 1000000),
			left ? "out of" : "still in", q - q0);
}

static void on_signal(int sig)
{
	(void)sig;
	got_signal = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: dmann-cn --config FILE --id N [--log LEVEL]\n\n"
		"Run compute node N of the cluster described by FILE: connect to the memory\n"
		"nodes, load the block table and upper levels of the placed index, and serve\n"
		"queries (dmann bench, the native protocol) on its address.\n\n"
		"  --config FILE  cluster INI file\n"
		"  --id N         which [cn.N] section this process is\n"
		"  --log LEVEL    error|warn|info|debug (default info)\n"
		"  --help         this text\n");
}

/* The cluster's transport with the compute node's send queue ([cn] send_queue), accepting
 * the cluster file's client identities ([client.NAME]) besides the cluster secret. */
static struct dm_xport *cn_xport(const struct dm_cluster_cfg *cfg, const struct dm_node_cfg *n)
{
	static struct dm_xport_cred creds[DM_MAX_CLIENTS + 1];
	struct dm_xport_params p = {
		.backend = cfg->transport[0] ? cfg->transport : NULL,
		.cluster = cfg->name, .secret = cfg->secret, .secret_len = cfg->secret_len,
		.device = n->device[0] ? n->device : NULL,
		.max_send_wr = n->cnc.send_queue,
		.max_recv_wr = 4096,   /* several message pools share the receive queue */
		.creds = creds, .n_creds = cfg->n_clients + 1,
	};
	struct dm_client_cfg gw;
	struct dm_xport *x;

	_Static_assert(DM_MAX_CLIENTS + 1 <= DM_XPORT_MAX_CREDS, "client table");
	for (uint32_t i = 0; i < cfg->n_clients; i++) {
		snprintf(creds[i].name, sizeof(creds[i].name), "%s", cfg->clients[i].name);
		memcpy(creds[i].secret, cfg->clients[i].secret, cfg->clients[i].secret_len);
		creds[i].secret_len = cfg->clients[i].secret_len;
	}
	/* The gateways' own identity (config.h dm_config_gateway_client). */
	if (dm_config_gateway_client(cfg, &gw)) {
		p.n_creds--;
	} else {
		struct dm_xport_cred *c = &creds[cfg->n_clients];

		snprintf(c->name, sizeof(c->name), "%s", gw.name);
		memcpy(c->secret, gw.secret, gw.secret_len);
		c->secret_len = gw.secret_len;
		memset(&gw, 0, sizeof(gw));
	}
	x = dm_xport_open(&p);
	memset(creds, 0, sizeof(creds));

	if (!x)
		dm_err("cannot open the %s transport: %s", p.backend ? p.backend : "default",
		       strerror(errno));
	return x;
}

#if DM_HAVE_HTTP
/* cn->s3_placement: the gateway's buckets before a new placement is published. */
static int placement_s3(void *ctx, const uint64_t *old, const uint64_t *nx)
{
	return cn_s3_placement_prepare(ctx, old, nx);
}

/* cn->s3_call: native client data ops run on the S3 gateway. */
static char *call_s3(void *ctx, const char *op, const char *body, size_t len, int *status,
		     size_t *out_len)
{
	return cn_s3_call(ctx, op, body, len, status, out_len);
}

#endif

/* Prometheus text for GET /metrics. */
static void cn_metrics(void *arg, FILE *out)
{
	struct cn *cn = arg;
	struct dm_cache_stats cs = { 0 };
	uint64_t index_bytes = 0, gen = 0;
	unsigned id = cn->node->id;
	int retired = 0, graphs = 0;

	pthread_rwlock_rdlock(&cn->lock);
	if (cn->cache)
		dm_cache_stats(cn->cache, &cs);
	if (cn->views[0].cur)
		gen = cn->views[0].cur->gen;
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		if (cn->views[g].cur) {
			index_bytes += cn->views[g].cur->index_bytes;
			graphs++;
		}
		for (int i = 0; i < CN_MAX_RETIRED; i++)
			retired += cn->views[g].retired[i] != NULL;
	}
	pthread_rwlock_unlock(&cn->lock);
	fprintf(out, "# HELP dmann_cn_graphs HNSW graphs this compute node serves.\n"
		     "# TYPE dmann_cn_graphs gauge\n"
		     "dmann_cn_graphs{node=\"%u\"} %d\n"
		     "# HELP dmann_cn_index_generation Generation of graph 0 new queries use.\n"
		     "# TYPE dmann_cn_index_generation gauge\n"
		     "dmann_cn_index_generation{node=\"%u\"} %llu\n"
		     "# HELP dmann_cn_generation_switches_total Switches to a newer index generation.\n"
		     "# TYPE dmann_cn_generation_switches_total counter\n"
		     "dmann_cn_generation_switches_total{node=\"%u\"} %lu\n"
		     "# HELP dmann_cn_retired_views Older index views queries still finish on.\n"
		     "# TYPE dmann_cn_retired_views gauge\n"
		     "dmann_cn_retired_views{node=\"%u\"} %d\n"
		     "# HELP dmann_cn_read_queue_full_total READ posts a full send queue refused "
		     "(posted again later).\n"
		     "# TYPE dmann_cn_read_queue_full_total counter\n"
		     "dmann_cn_read_queue_full_total{node=\"%u\"} %lu\n",
		id, graphs, id, (unsigned long long)gen, id, atomic_load(&cn->gen_switches), id,
		retired, id,
		atomic_load(&cn->sq_full));
	{
		unsigned down = 0;

		for (uint32_t m = 0; m < cn->cfg->n_mn; m++)
			down += cn_mn_is_down(cn, m);
		fprintf(out, "# HELP dmann_cn_read_failovers_total READs reissued to another replica "
			     "of their block.\n"
			     "# TYPE dmann_cn_read_failovers_total counter\n"
			     "dmann_cn_read_failovers_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_torn_records_salvaged_total Records torn on every "
			     "replica by a writer that died holding them, used salvaged.\n"
			     "# TYPE dmann_cn_torn_records_salvaged_total counter\n"
			     "dmann_cn_torn_records_salvaged_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_record_rereads_total Records a query read again because "
			     "the copy was torn or held by a writer.\n"
			     "# TYPE dmann_cn_record_rereads_total counter\n"
			     "dmann_cn_record_rereads_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_mn_marked_down_total Memory nodes marked down.\n"
			     "# TYPE dmann_cn_mn_marked_down_total counter\n"
			     "dmann_cn_mn_marked_down_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_mn_marked_up_total Memory nodes marked up again.\n"
			     "# TYPE dmann_cn_mn_marked_up_total counter\n"
			     "dmann_cn_mn_marked_up_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_mn_down Memory nodes this compute node reads nothing from.\n"
			     "# TYPE dmann_cn_mn_down gauge\n"
			     "dmann_cn_mn_down{node=\"%u\"} %u\n",
			id, atomic_load(&cn->failovers), id, atomic_load(&cn->salvaged), id,
			atomic_load(&cn->rereads), id, atomic_load(&cn->mn_downs), id,
			atomic_load(&cn->mn_ups), id, down);
		fprintf(out, "# HELP dmann_cn_locality_queries_total Queries answered whose READs "
			     "the locality counters below sum over.\n"
			     "# TYPE dmann_cn_locality_queries_total counter\n"
			     "dmann_cn_locality_queries_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_locality_query_mns_total Sum over queries of the distinct "
			     "memory nodes their READs went to.\n"
			     "# TYPE dmann_cn_locality_query_mns_total counter\n"
			     "dmann_cn_locality_query_mns_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_locality_query_blocks_total Sum over queries of the "
			     "distinct blocks their READs went to.\n"
			     "# TYPE dmann_cn_locality_query_blocks_total counter\n"
			     "dmann_cn_locality_query_blocks_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_locality_round_trips_total Batches of READs of those "
			     "queries (round trips).\n"
			     "# TYPE dmann_cn_locality_round_trips_total counter\n"
			     "dmann_cn_locality_round_trips_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_locality_round_trip_mns_total Sum over those round trips of "
			     "the distinct memory nodes one batch went to.\n"
			     "# TYPE dmann_cn_locality_round_trip_mns_total counter\n"
			     "dmann_cn_locality_round_trip_mns_total{node=\"%u\"} %lu\n",
			id, atomic_load(&cn->loc_queries), id, atomic_load(&cn->loc_q_mns), id,
			atomic_load(&cn->loc_q_blocks), id, atomic_load(&cn->loc_rts), id,
			atomic_load(&cn->loc_rt_mns));
		{
			unsigned gst = 0;

			for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
				for (uint32_t m = 0; m < cn->cfg->n_mn; m++)
					gst += cn_graph_stale(cn, g, m);
			fprintf(out, "# HELP dmann_cn_graph_stale_replicas (graph, memory node) pairs "
				     "marked stale: the node missed inserts; reads prefer the other "
				     "replicas until the controller caught it up.\n"
				     "# TYPE dmann_cn_graph_stale_replicas gauge\n"
				     "dmann_cn_graph_stale_replicas{node=\"%u\"} %u\n"
				     "# HELP dmann_cn_graph_stale_marks_total Stale marks this compute node "
				     "put for memory nodes it brought back.\n"
				     "# TYPE dmann_cn_graph_stale_marks_total counter\n"
				     "dmann_cn_graph_stale_marks_total{node=\"%u\"} %lu\n"
				     "# HELP dmann_cn_graph_catchups_total Graph replicas caught up (this "
				     "node as the controller).\n"
				     "# TYPE dmann_cn_graph_catchups_total counter\n"
				     "dmann_cn_graph_catchups_total{node=\"%u\"} %lu\n"
				     "# HELP dmann_cn_graph_catchup_records_total Records those catch-ups "
				     "wrote.\n"
				     "# TYPE dmann_cn_graph_catchup_records_total counter\n"
				     "dmann_cn_graph_catchup_records_total{node=\"%u\"} %lu\n"
				     "# HELP dmann_cn_graph_catchup_errors_total Graph catch-ups that "
				     "failed (tried again after 3 s).\n"
				     "# TYPE dmann_cn_graph_catchup_errors_total counter\n"
				     "dmann_cn_graph_catchup_errors_total{node=\"%u\"} %lu\n",
				id, gst, id, atomic_load(&cn->gstale_marks), id,
				atomic_load(&cn->hcatchups), id, atomic_load(&cn->hcatchup_records),
				id, atomic_load(&cn->hcatchup_errors));
		}
		fprintf(out, "# HELP dmann_cn_id_ranges_total Ranges of online insert ids taken "
			     "from the cluster state.\n"
			     "# TYPE dmann_cn_id_ranges_total counter\n"
			     "dmann_cn_id_ranges_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_id_range_errors_total Ranges of ids that could not be "
			     "taken (etcd unreachable): those inserts failed.\n"
			     "# TYPE dmann_cn_id_range_errors_total counter\n"
			     "dmann_cn_id_range_errors_total{node=\"%u\"} %lu\n",
			id, atomic_load(&cn->id_ranges), id, atomic_load(&cn->id_range_errors));
		down = 0;
		for (uint32_t m = 0; m < cn->cfg->n_mn; m++)
			down += atomic_load(&cn->state_down[m]);
		fprintf(out, "# HELP dmann_cn_state_version Version of the cluster state's up-set "
			     "this compute node follows (0: none).\n"
			     "# TYPE dmann_cn_state_version gauge\n"
			     "dmann_cn_state_version{node=\"%u\"} %lld\n"
			     "# HELP dmann_cn_state_mn_down Memory nodes the up-set declares down.\n"
			     "# TYPE dmann_cn_state_mn_down gauge\n"
			     "dmann_cn_state_mn_down{node=\"%u\"} %u\n",
			id, (long long)atomic_load(&cn->state_version), id, down);
		fprintf(out, "# HELP dmann_cn_placement_version Version of the placement (retired "
			     "memory nodes) this compute node reads under.\n"
			     "# TYPE dmann_cn_placement_version gauge\n"
			     "dmann_cn_placement_version{node=\"%u\"} %lld\n"
			     "# HELP dmann_cn_repair_copies_total Block copies made by re-replication "
			     "(this node as the controller).\n"
			     "# TYPE dmann_cn_repair_copies_total counter\n"
			     "dmann_cn_repair_copies_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_repair_bytes_total Bytes copied by re-replication.\n"
			     "# TYPE dmann_cn_repair_bytes_total counter\n"
			     "dmann_cn_repair_bytes_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_repair_pending Block copies the running repair still "
			     "has to make (under-replicated blocks).\n"
			     "# TYPE dmann_cn_repair_pending gauge\n"
			     "dmann_cn_repair_pending{node=\"%u\"} %u\n"
			     "# HELP dmann_cn_repair_rounds_total Repairs completed (placements "
			     "published).\n"
			     "# TYPE dmann_cn_repair_rounds_total counter\n"
			     "dmann_cn_repair_rounds_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_repair_failed_total Repairs that failed and were "
			     "retried.\n"
			     "# TYPE dmann_cn_repair_failed_total counter\n"
			     "dmann_cn_repair_failed_total{node=\"%u\"} %lu\n",
			id, (long long)atomic_load(&cn->placement_version), id,
			atomic_load(&cn->repair_blocks), id, atomic_load(&cn->repair_bytes), id,
			atomic_load(&cn->repair_pending), id, atomic_load(&cn->repair_rounds), id,
			atomic_load(&cn->repair_failed));
		fprintf(out, "# HELP dmann_cn_inserts_total Rows inserted online into the graph.\n"
			     "# TYPE dmann_cn_inserts_total counter\n"
			     "dmann_cn_inserts_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_insert_links_total Back-links written by online inserts.\n"
			     "# TYPE dmann_cn_insert_links_total counter\n"
			     "dmann_cn_insert_links_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_insert_links_dropped_total Back-links not made (the "
			     "neighbour kept its list, or its lock was not taken in time).\n"
			     "# TYPE dmann_cn_insert_links_dropped_total counter\n"
			     "dmann_cn_insert_links_dropped_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_insert_lock_retries_total Record locks found held or "
			     "changed.\n"
			     "# TYPE dmann_cn_insert_lock_retries_total counter\n"
			     "dmann_cn_insert_lock_retries_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_insert_locks_broken_total Record locks of gone holders "
			     "broken (held past the lease) and their records restored.\n"
			     "# TYPE dmann_cn_insert_locks_broken_total counter\n"
			     "dmann_cn_insert_locks_broken_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_insert_links_forced_total New nodes none of whose "
			     "neighbours took the back-link, linked from the nearest in its farthest "
			     "slot.\n"
			     "# TYPE dmann_cn_insert_links_forced_total counter\n"
			     "dmann_cn_insert_links_forced_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_insert_links_kept_total Neighbours a back-link pushed "
			     "out of a full list, linked from the new node instead.\n"
			     "# TYPE dmann_cn_insert_links_kept_total counter\n"
			     "dmann_cn_insert_links_kept_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_insert_round_trips_total Round trips to the memory nodes "
			     "the online inserts waited for (requests to several nodes at once: one).\n"
			     "# TYPE dmann_cn_insert_round_trips_total counter\n"
			     "dmann_cn_insert_round_trips_total{node=\"%u\"} %lu\n",
			id, atomic_load(&cn->inserts), id, atomic_load(&cn->insert_links), id,
			atomic_load(&cn->insert_links_dropped), id,
			atomic_load(&cn->insert_lock_retries), id,
			atomic_load(&cn->insert_locks_broken), id,
			atomic_load(&cn->insert_links_forced), id,
			atomic_load(&cn->insert_links_kept), id, atomic_load(&cn->insert_rounds));
		fprintf(out, "# HELP dmann_cn_upper_published_total Nodes of level >= 1 this "
			     "node's online inserts published to the cluster state (and failed "
			     "to: they stay level 0).\n"
			     "# TYPE dmann_cn_upper_published_total counter\n"
			     "dmann_cn_upper_published_total{node=\"%u\"} %lu\n"
			     "dmann_cn_upper_published_total{node=\"%u\",result=\"error\"} %lu\n"
			     "# HELP dmann_cn_upper_added_total Published nodes (of any compute "
			     "node) added to this node's copy of the upper levels.\n"
			     "# TYPE dmann_cn_upper_added_total counter\n"
			     "dmann_cn_upper_added_total{node=\"%u\"} %lu\n"
			     "# HELP dmann_cn_upper_skipped_total Published nodes passed over (not "
			     "of the view's online ids, known already, or their record empty).\n"
			     "# TYPE dmann_cn_upper_skipped_total counter\n"
			     "dmann_cn_upper_skipped_total{node=\"%u\"} %lu\n",
			id, atomic_load(&cn->upper_published), id,
			atomic_load(&cn->upper_publish_errors), id, atomic_load(&cn->upper_added),
			id, atomic_load(&cn->upper_skipped));
	}
	fprintf(out, "# HELP dmann_cn_queries_total Queries answered (errors included).\n"
		     "# TYPE dmann_cn_queries_total counter\n"
		     "dmann_cn_queries_total{node=\"%u\"} %lu\n"
		     "# HELP dmann_cn_query_errors_total Queries answered with an error.\n"
		     "# TYPE dmann_cn_query_errors_total counter\n"
		     "dmann_cn_query_errors_total{node=\"%u\"} %lu\n"
		     "# HELP dmann_cn_cache_hits_total Record lookups served by the cache.\n"
		     "# TYPE dmann_cn_cache_hits_total counter\n"
		     "dmann_cn_cache_hits_total{node=\"%u\"} %llu\n"
		     "# HELP dmann_cn_cache_misses_total Record lookups the cache missed.\n"
		     "# TYPE dmann_cn_cache_misses_total counter\n"
		     "dmann_cn_cache_misses_total{node=\"%u\"} %llu\n"
		     "# HELP dmann_cn_cache_evictions_total Records evicted from the cache.\n"
		     "# TYPE dmann_cn_cache_evictions_total counter\n"
		     "dmann_cn_cache_evictions_total{node=\"%u\"} %llu\n"
		     "# HELP dmann_cn_cache_bytes Bytes of records held in the cache.\n"
		     "# TYPE dmann_cn_cache_bytes gauge\n"
		     "dmann_cn_cache_bytes{node=\"%u\"} %llu\n"
		     "# HELP dmann_cn_cache_capacity_bytes Cache capacity.\n"
		     "# TYPE dmann_cn_cache_capacity_bytes gauge\n"
		     "dmann_cn_cache_capacity_bytes{node=\"%u\"} %llu\n"
		     "# HELP dmann_cn_index_bytes Bytes of the graphs' records on the memory nodes.\n"
		     "# TYPE dmann_cn_index_bytes gauge\n"
		     "dmann_cn_index_bytes{node=\"%u\"} %llu\n"
		     "# HELP dmann_cn_workers Worker threads (client connections).\n"
		     "# TYPE dmann_cn_workers gauge\n"
		     "dmann_cn_workers{node=\"%u\"} %u\n",
		id, atomic_load(&cn->queries), id, atomic_load(&cn->errors), id,
		(unsigned long long)cs.hits, id, (unsigned long long)cs.misses, id,
		(unsigned long long)cs.evictions, id, (unsigned long long)cs.bytes, id,
		(unsigned long long)cs.capacity_bytes, id, (unsigned long long)index_bytes, id,
		atomic_load(&cn->workers));
	fprintf(out, "# HELP dmann_cn_cache_pinned Records pinned in the cache (top HNSW levels).\n"
		     "# TYPE dmann_cn_cache_pinned gauge\n"
		     "dmann_cn_cache_pinned{node=\"%u\"} %llu\n", id, (unsigned long long)cs.pinned);
#if DM_HAVE_HTTP
	cn_s3_metrics(s3gw, out);   /* S3 gateway counters (stopped after the metrics) */
#endif
	if (cn->rt) {
		struct dm_wire_fwd_rstats st;

		router_config(cn->rt, &(struct dm_wire_fwd_rcfg){ 0 }, &st);
		fprintf(out, "# HELP dmann_cn_routed_total Client queries by where they ran: here "
			     "(local) or sent to another compute node (forwarded).\n"
			     "# TYPE dmann_cn_routed_total counter\n"
			     "dmann_cn_routed_total{node=\"%u\",where=\"local\"} %llu\n"
			     "dmann_cn_routed_total{node=\"%u\",where=\"forwarded\"} %llu\n"
			     "# HELP dmann_cn_forwarded_received_total Queries other compute nodes forwarded here.\n"
			     "# TYPE dmann_cn_forwarded_received_total counter\n"
			     "dmann_cn_forwarded_received_total{node=\"%u\"} %llu\n"
			     "# HELP dmann_cn_forwarded_bounced_total Forwarded queries returned undelivered.\n"
			     "# TYPE dmann_cn_forwarded_bounced_total counter\n"
			     "dmann_cn_forwarded_bounced_total{node=\"%u\"} %llu\n"
			     "# HELP dmann_cn_routing_pauses_total Times routing paused (local queue over pause_queue).\n"
			     "# TYPE dmann_cn_routing_pauses_total counter\n"
			     "dmann_cn_routing_pauses_total{node=\"%u\"} %llu\n"
			     "# HELP dmann_cn_queue_length Queries assigned to this compute node, not answered.\n"
			     "# TYPE dmann_cn_queue_length gauge\n"
			     "dmann_cn_queue_length{node=\"%u\"} %u\n"
			     "# HELP dmann_cn_oracle_epoch Oracle epoch (re-clusterings move it on).\n"
			     "# TYPE dmann_cn_oracle_epoch gauge\n"
			     "dmann_cn_oracle_epoch{node=\"%u\"} %u\n",
			id, (unsigned long long)st.local, id, (unsigned long long)st.forwarded, id,
			(unsigned long long)st.received, id, (unsigned long long)st.bounced, id,
			(unsigned long long)st.paused, id, st.qlen, id, st.epoch);
		uint32_t repoch, moved, owner[DM_MAX_NODES];
		uint64_t changes, fitted, warm, taken;

		router_oracle_sources(cn->rt, &fitted, &warm, &taken);
		fprintf(out, "# HELP dmann_cn_oracle_fits_total Rollout oracles (new epochs) this "
			     "compute node fitted.\n"
			     "# TYPE dmann_cn_oracle_fits_total counter\n"
			     "dmann_cn_oracle_fits_total{node=\"%u\"} %llu\n"
			     "# HELP dmann_cn_oracle_warm_fits_total Of those, the fits that "
			     "started from the current epoch's centroids (through etcd).\n"
			     "# TYPE dmann_cn_oracle_warm_fits_total counter\n"
			     "dmann_cn_oracle_warm_fits_total{node=\"%u\"} %llu\n"
			     "# HELP dmann_cn_oracle_taken_total Oracles taken from etcd, fitted "
			     "by another compute node in a rollout.\n"
			     "# TYPE dmann_cn_oracle_taken_total counter\n"
			     "dmann_cn_oracle_taken_total{node=\"%u\"} %llu\n",
			id, (unsigned long long)fitted, id, (unsigned long long)warm, id,
			(unsigned long long)taken);

		double mass, mass0;
		uint64_t passes;
		uint32_t mass_epoch;

		if (router_mass(cn->rt, &mass, &mass0, &mass_epoch, &passes))
			fprintf(out, "# HELP dmann_cn_route_mass_ratio The largest partition's share of "
				     "the index's upper-level sample over its fair share (1: balanced; "
				     "re-clustering when it grows by recluster_mass over its value "
				     "at the epoch's first pass).\n"
				     "# TYPE dmann_cn_route_mass_ratio gauge\n"
				     "dmann_cn_route_mass_ratio{node=\"%u\"} %.6f\n"
				     "# HELP dmann_cn_route_mass_ratio_at_fit The same at the oracle "
				     "epoch's first pass.\n"
				     "# TYPE dmann_cn_route_mass_ratio_at_fit gauge\n"
				     "dmann_cn_route_mass_ratio_at_fit{node=\"%u\"} %.6f\n"
				     "# HELP dmann_cn_route_mass_epoch The oracle epoch of the last "
				     "measure.\n"
				     "# TYPE dmann_cn_route_mass_epoch gauge\n"
				     "dmann_cn_route_mass_epoch{node=\"%u\"} %u\n"
				     "# HELP dmann_cn_route_mass_passes_total Passes over the sample that "
				     "measured it.\n"
				     "# TYPE dmann_cn_route_mass_passes_total counter\n"
				     "dmann_cn_route_mass_passes_total{node=\"%u\"} %llu\n",
				id, mass, id, mass0, id, mass_epoch, id, (unsigned long long)passes);
		router_partitions(cn->rt, &repoch, &moved, &changes, owner);
		fprintf(out, "# HELP dmann_cn_route_epoch Routing epoch (the oracle epoch and the "
			     "partition owners: it changes when a compute node joins or leaves).\n"
			     "# TYPE dmann_cn_route_epoch gauge\n"
			     "dmann_cn_route_epoch{node=\"%u\"} %u\n"
			     "# HELP dmann_cn_route_partitions_moved Partitions served by a ring "
			     "neighbour because their compute node is down.\n"
			     "# TYPE dmann_cn_route_partitions_moved gauge\n"
			     "dmann_cn_route_partitions_moved{node=\"%u\"} %u\n"
			     "# HELP dmann_cn_route_owner_changes_total Times the partition owners "
			     "changed (compute nodes joining or leaving).\n"
			     "# TYPE dmann_cn_route_owner_changes_total counter\n"
			     "dmann_cn_route_owner_changes_total{node=\"%u\"} %llu\n"
			     "# HELP dmann_cn_route_owner The compute node that serves a partition.\n"
			     "# TYPE dmann_cn_route_owner gauge\n",
			id, repoch, id, moved, id, (unsigned long long)changes);
		for (uint32_t p = 0; p < cn->cfg->n_cn; p++)
			fprintf(out, "dmann_cn_route_owner{node=\"%u\",partition=\"%u\"} %u\n", id, p,
				owner[p]);
		fprintf(out, "# HELP dmann_cn_csp_sample_truncated_total Reports whose cache sample "
			     "was cut at %u ids (the CSP estimate is low: raise [router] csp_slice).\n"
			     "# TYPE dmann_cn_csp_sample_truncated_total counter\n"
			     "dmann_cn_csp_sample_truncated_total{node=\"%u\"} %llu\n",
			DM_FWD_MAX_SAMPLE, id, (unsigned long long)router_csp_truncated(cn->rt));
		/* No sample exchange yet (or a single CN): no value rather than a made-up 0. */
		if (st.csp_ppm != DM_FWD_CSP_NONE)
			fprintf(out, "# HELP dmann_cn_cache_split_penalty Duplicated / all cached entries "
				     "across the compute nodes (online estimate, a 1/csp_slice hash "
				     "slice).\n"
				     "# TYPE dmann_cn_cache_split_penalty gauge\n"
				     "dmann_cn_cache_split_penalty{node=\"%u\"} %.6f\n"
				     "# HELP dmann_cn_cache_split_penalty_age_seconds Age of the estimate.\n"
				     "# TYPE dmann_cn_cache_split_penalty_age_seconds gauge\n"
				     "dmann_cn_cache_split_penalty_age_seconds{node=\"%u\"} %.3f\n",
				id, st.csp_ppm / 1e6, id, st.csp_age_ms / 1e3);
	}
}

int main(int argc, char **argv)
{
	struct cn cn = { .ctl_lock = PTHREAD_MUTEX_INITIALIZER };
	struct sigaction sa = { .sa_handler = on_signal };
	pthread_rwlockattr_t rwa;
	const char *config = NULL;
	struct dm_listener *lis = NULL;
	struct dm_metrics *metrics = NULL;
	void *member = NULL;   /* struct dm_member: the node's heartbeat in etcd */
#if DM_HAVE_ETCD
	struct dm_upwatch *upwatch = NULL;   /* the up-set, applied by cn_state_apply */
	struct dm_ctl *ctl = NULL;           /* standing as the cluster's controller */
	struct dm_upwatch *placewatch = NULL; /* the placement (retired memory nodes) */
	struct cn_repair *repair = NULL;     /* re-replication while in office */
#endif
	char err[1024];
	uint64_t last_refresh = 0, refresh_ns = 1000000000ull;
	int accept_ms = 200;
	long id = -1;
	int c, rc, status = 1;

	c = dm_node_args(argc, argv, "dmann-cn", usage, &config, &id);
	if (c >= 0)
		return c;
	dm_blas_node_threads();   /* before any thread: no spinning BLAS pool */
	cn.cfg = calloc(1, sizeof(*cn.cfg));
	if (!cn.cfg)
		return 1;
	rc = dm_config_load(config, cn.cfg, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dmann-cn: %s\n", err);
		goto out_free_cfg;
	}
	cn.node = dm_config_node(cn.cfg, DM_ROLE_CN, (uint32_t)id);
	if (!cn.node) {
		fprintf(stderr, "dmann-cn: %s has no [cn.%ld] (it defines %u compute nodes)\n",
			config, id, cn.cfg->n_cn);
		goto out_free_cfg;
	}
	if (cn.cfg->n_mn == 0) {
		fprintf(stderr, "dmann-cn: %s defines no memory node\n", config);
		goto out_free_cfg;
	}
	/* Writers (index reload, cache resize) must not starve behind busy workers. */
	pthread_rwlockattr_init(&rwa);
	pthread_rwlockattr_setkind_np(&rwa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&cn.lock, &rwa);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	cn.fence_ns = (uint64_t)cn.node->cnc.lease_ms * 500000ull;   /* half the lease */
	cn.pin_level = INT_MAX;
	cn.x = cn_xport(cn.cfg, cn.node);
	if (!cn.x)
		goto out_free_cfg;
	cn.pool = dm_msgpool_new(cn.x, 1024, DM_CN_RECV_BUF);
	if (!cn.pool) {
		dm_err("cn%u: cannot post receive buffers: %s", cn.node->id, strerror(errno));
		goto out_close_x;
	}
	cn_hcatchup_init(&cn);   /* stale graph replicas: before any memory node rejoins */
	cn_ids_init(&cn);        /* online insert ids: ranges from the cluster state */
	cn_upper_start(&cn);     /* online upper levels: follow the cluster state */
	rc = cn_refresh(&cn, true);
	if (rc && rc != -ENOENT)
		dm_warn("cn%u: memory nodes not ready yet (%s); will retry", cn.node->id,
			strerror(-rc));
	{
		const struct dm_router_cfg *rc = &cn.cfg->router;
		struct router_params rp = {
			.strategy = rc->strategy, .batch = rc->batch, .pause = rc->pause_queue,
			.exchange_ms = rc->exchange_ms, .sample_min_nodes = rc->sample_min_nodes,
			.fit_duty = rc->fit_duty,
			.recluster_csp = rc->recluster_csp, .recluster_secs = rc->recluster_secs,
			.recluster_mass = rc->recluster_mass,
			.spill_cache = rc->spill_cache, .keyrange = rc->keyrange,
			.regions = rc->regions, .csp_slice = rc->csp_slice,
		};

		cn.rt = router_start(&cn, &rp);
		if (!cn.rt) {
			dm_err("cn%u: cannot start the router: %s", cn.node->id, strerror(errno));
			goto out_free_pool;
		}
	}
#if DM_HAVE_HTTP
	if (cn.node->http[0]) {
		s3gw = cn_s3_start(cn.cfg, cn.node);
		if (!s3gw && errno != ENOENT) {
			dm_err("cn%u: cannot start the S3 gateway on %s: %s", cn.node->id,
			       cn.node->http, strerror(errno));
			goto out_free_pool;
		}
		if (s3gw) {
			cn_s3_set_graph(s3gw, &cn_graph_ops, &cn);
			cn.s3_call = call_s3;
			cn.s3_ctx = s3gw;
			cn.s3_placement = placement_s3;
		}
	}
#endif
	rc = dm_xport_listen(cn.x, cn.node->address, &lis);
	if (rc) {
		dm_err("cn%u: cannot listen on %s: %s", cn.node->id, cn.node->address,
		       strerror(-rc));
		goto out_free_pool;
	}
	dm_info("cn%u: serving on %s (%s transport)", cn.node->id, cn.node->address,
		dm_xport_name(cn.x));
	refresh_ns = (uint64_t)cn.node->cnc.refresh_ms * 1000000ull;
	accept_ms = (int)DM_MIN(200u, cn.node->cnc.refresh_ms);
	if (cn.node->metrics[0]) {
		metrics = dm_metrics_start(cn.node->metrics, cn_metrics, &cn);
		if (!metrics)
			dm_warn("cn%u: no metrics endpoint on %s: %s", cn.node->id, cn.node->metrics,
				errno == ENOSYS ? "built without libmicrohttpd" : strerror(errno));
	}
	if (cn.cfg->etcd[0]) {
#if DM_HAVE_ETCD
		member = dm_member_join(cn.cfg, "cn", cn.node->id, cn.node->address);
		upwatch = dm_upwatch_start(cn.cfg, cn_state_apply, &cn);
		if (!upwatch)
			dm_warn("cn%u: not following the cluster state: %s", cn.node->id,
				strerror(errno));
		ctl = dm_ctl_start(cn.cfg, "cn", cn.node->id);
		cn.ctl = ctl;
		placewatch = dm_placewatch_start(cn.cfg, cn_placement_apply, &cn);
		if (!placewatch)
			dm_warn("cn%u: not following the placement: %s", cn.node->id,
				strerror(errno));
		repair = cn_repair_start(&cn);
#else
		dm_warn("cn%u: built without the etcd client (libcurl): not registering in %s",
			cn.node->id, cn.cfg->etcd);
#endif
	}

	while (!got_signal) {
		struct cn_worker_arg *a;
		struct dm_conn *conn;
		pthread_t t;
		uint64_t now = dm_now_ns();

		/* Reconnect / re-read the block table after a memory-node failure; otherwise
		 * report to the memory nodes and pick up a new index generation. */
		if ((atomic_load(&cn.need_refresh) || !cn.mns) && now - last_refresh > 500000000ull) {
			last_refresh = now;
			cn_refresh(&cn, true);
		} else if (now - last_refresh >= refresh_ns) {
			last_refresh = now;
			cn_refresh(&cn, false);
		}
		rc = dm_listener_accept(lis, accept_ms, &conn);
		if (rc) {
			if (rc != -ETIMEDOUT && rc != -EAGAIN && rc != -EINTR)
				dm_debug("cn%u: accept: %s", cn.node->id, strerror(-rc));
			continue;
		}
		a = malloc(sizeof(*a));
		if (!a) {
			dm_conn_close(conn);
			continue;
		}
		*a = (struct cn_worker_arg){ .cn = &cn, .client = conn };
		if (pthread_create(&t, NULL, cn_worker, a)) {
			dm_conn_close(conn);
			free(a);
			continue;
		}
		pthread_detach(t);
	}
	dm_info("cn%u: stopping", cn.node->id);
	/* No new connections while draining: a client's connect is refused at once rather than
	 * waiting for a handshake nobody accepts. */
	dm_listener_close(lis);
	lis = NULL;
#if DM_HAVE_ETCD
	cn_repair_stop(repair);
	dm_ctl_stop(ctl);         /* a controller in office resigns: another takes over */
	cn.ctl = NULL;
	dm_member_stop(member);   /* leave: the key goes at once */
	drain(&cn, upwatch != NULL);
	dm_upwatch_stop(placewatch);
	dm_upwatch_stop(upwatch);
#else
	drain(&cn, false);
#endif
	(void)member;
	atomic_store(&cn.stopping, true);
	dm_metrics_stop(metrics);
#if DM_HAVE_HTTP
	cn_s3_stop(s3gw);
	s3gw = NULL;
	cn_graph_fini(&cn);
#endif
	router_stop(cn.rt);   /* joins the router thread: no new SERVE worker after this */
	for (int i = 0; i < 100 && atomic_load(&cn.workers); i++)
		usleep(50000);
	status = 0;
out_free_pool:
#if DM_HAVE_HTTP
	cn_s3_stop(s3gw);
	s3gw = NULL;
	cn_graph_fini(&cn);
#endif
	atomic_store(&cn.stopping, true);
	cn_upper_stop(&cn);      /* joins the replay thread: before the views are freed */
	router_stop(cn.rt);
	if (!atomic_load(&cn.workers)) {
		router_free(cn.rt);   /* workers use it until they are gone */
		mn_set_close(cn.mns);
		for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
			dindex_free(cn.views[g].cur);
			for (int i = 0; i < CN_MAX_RETIRED; i++)
				dindex_free(cn.views[g].retired[i]);
		}
		dm_cache_free(cn.cache);
		dm_msgpool_free(cn.pool);
		cn_hcatchup_fini(&cn);
		cn_ids_fini(&cn);
	}
out_close_x:
	if (!atomic_load(&cn.workers))
		dm_xport_close(cn.x);
out_free_cfg:
	if (!atomic_load(&cn.workers))
		free(cn.cfg);
	return status;
}
