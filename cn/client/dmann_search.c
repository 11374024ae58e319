/* dmann_search.c: dmann_search, the native search of the cluster's HNSW index (Q_SEARCH,
 * wire.h) with many queries in flight over the compute nodes, routed client-side
 * (dmann_route.c) or round robin. One thread: it fills the windows, then collects the
 * answers that are there, waiting at most 1 ms on one connection when none is. */
#include "dmann_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dm.h"

#define REFRESH_NS 1000000000ull   /* retry fetching the oracle at most once a second */
#define REROUTE_NS 100000000ull    /* ... or every 100 ms after it went stale in a call, */
#define REROUTE_TRIES 30u          /* ... at most this many times in one call */
#define STALL_NS (60ull * 1000000000ull) /* no answer from anybody for this long: -ETIMEDOUT */

struct search {
	dmann_t *d;
	const float *vec;
	uint32_t k, ef, beam, dim, graph;
	size_t nq;
	uint64_t base;
	uint64_t *ids;
	float *dist;
	uint32_t *counts;
	struct dmann_search_info *info;
	uint64_t *t0;                /* send time of each query */
	uint32_t *on;                /* connection + 1 each query is in flight on, 0: none */
	uint8_t *tries;              /* times each query was sent */
	size_t *retry, nretry;       /* queries whose compute node died, to send again */
	uint8_t *msg;                /* one Q_SEARCH body */
	size_t done;
	bool fetched;                /* an asynchronous refresh settled */
};

static int send_query(struct search *s, uint32_t c, size_t i, uint32_t flags)
{
	dmann_t *d = s->d;
	struct dm_wire_q_search q = { .qid = s->base + i, .k = s->k, .ef = s->ef, .dim = s->dim,
				      .flags = (s->beam > 1 ? s->beam : 0) | flags,
				      .epoch = flags & DM_Q_F_ROUTED ? d->rt.epoch : 0,
				      .graph = s->graph };
	uint32_t len = (uint32_t)(sizeof(q) + 4ull * s->dim);
	int rc;

	dm_wire_q_search_encode(s->msg, &q);
	dm_wire_put_f32s(s->msg + sizeof(q), s->vec + i * s->dim, s->dim);
	s->t0[i] = dm_now_ns();
	rc = dm_rpc_send(&d->cn[c].ch, DM_OP_Q_SEARCH, s->base + i, 0, s->msg, len);
	if (rc)
		return dmann_fail(rc, "compute node %s: send: %s", d->cn[c].ep, strerror(-rc));
	d->cn[c].inflight++;
	s->on[i] = c + 1;
	s->tries[i]++;
	if (s->info)
		s->info[i] = (struct dmann_search_info){
			.status = -ECANCELED, .sent_to = d->rt.ok ? d->rt.node_of[c] : c,
			.sent_ns = s->t0[i], .epoch = q.epoch,
			.flags = (flags & DM_Q_F_ROUTED ? DMANN_SI_ROUTED : 0) |
				 (flags & DM_Q_F_SPILLED ? DMANN_SI_SPILLED : 0) |
				 (s->tries[i] > 1 ? DMANN_SI_RETRIED : 0) };
	return 0;
}

/* One answer from connection c if there is one within ms. 1: took one, 2: took the answer
 * to an asynchronous Q_ROUTER (dmann_route_fetch_answer), 0: none, -errno (a transport
 * failure, a malformed answer, or the query's own error, set in *qerr). */
static int take_answer(struct search *s, uint32_t c, int ms, int *qerr)
{
	dmann_t *d = s->d;
	struct dm_wire_hdr h;
	struct dm_wire_q_result r;
	uint8_t *buf;
	uint32_t len;
	uint64_t wr_id, i;
	int rc = dm_rpc_recv(&d->cn[c].ch, ms, &buf, &len, &wr_id);

	if (rc <= 0) {
		if (rc < 0)
			dmann_fail(rc, "compute node %s: %s", d->cn[c].ep, strerror(-rc));
		return rc;
	}
	if (dm_wire_hdr_decode(buf, len, &h) == 0 && h.op == DM_OP_Q_ROUTER + 1) {
		if (dm_wire_q_check(&h, buf, len) == 0 && d->cn[c].inflight &&
		    (rc = dmann_route_fetch_answer(d, c, &h, buf + DM_WIRE_HDR_LEN,
						   len - DM_WIRE_HDR_LEN)) >= 0) {
			d->cn[c].inflight--;
			s->fetched = s->fetched || rc == 1;
			dm_msgpool_repost(d->pool, wr_id);
			return 2;
		}
		dm_msgpool_repost(d->pool, wr_id);
		return dmann_fail(-EBADMSG, "compute node %s: unexpected router answer",
				  d->cn[c].ep);
	}
	if (dm_wire_hdr_decode(buf, len, &h) || h.op != DM_OP_Q_SEARCH + 1 ||
	    dm_wire_q_check(&h, buf, len) ||
	    dm_wire_q_result_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &r) ||
	    r.qid < s->base || (i = r.qid - s->base) >= s->nq || s->on[i] != c + 1 ||
	    r.n > s->k) {
		dm_msgpool_repost(d->pool, wr_id);
		return dmann_fail(-EBADMSG, "compute node %s: malformed answer", d->cn[c].ep);
	}
	d->cn[c].inflight--;
	s->on[i] = 0;
	if (h.status == -ECONNABORTED && s->tries[i] < DMANN_TRIES + 2) {
		/* The compute node it was relayed to died: not run; send it again (a query
		 * whose own CN died may meet a relay to the dead one before the cluster state
		 * declares it down: hence two more tries). */
		s->retry[s->nretry++] = i;
		dm_msgpool_repost(d->pool, wr_id);
		return 1;
	}
	s->done++;
	dmann_route_answer(d, &r);
	if (h.status && !*qerr) {
		char why[64];

		if (h.status == -ENOENT && s->graph)
			snprintf(why, sizeof(why), "no HNSW index is loaded as graph %u", s->graph);
		else
			snprintf(why, sizeof(why), "%s", h.status == -ENOENT ?
				 "no HNSW index is loaded" : h.status == -EINVAL ?
				 "wrong dimension or a non-finite component" : strerror(-h.status));
		*qerr = dmann_fail(h.status, "compute node %s: query %llu: %s", d->cn[c].ep,
				   (unsigned long long)i, why);
	}
	if (h.status)
		r.n = 0;
	for (uint32_t j = 0; j < s->k; j++) {
		struct dm_wire_q_hit qh = { .id = UINT64_MAX, .dist = INFINITY };

		if (j < r.n)
			dm_wire_q_hit_decode(buf + DM_WIRE_HDR_LEN + sizeof(r) + 16 * j, 16, &qh);
		s->ids[i * s->k + j] = qh.id;
		if (s->dist)
			s->dist[i * s->k + j] = qh.dist;
	}
	if (s->counts)
		s->counts[i] = r.n;
	if (s->info) {
		struct dmann_search_info *in = &s->info[i];

		in->latency_ns = dm_now_ns() - s->t0[i];
		in->bytes = r.bytes;
		in->reads = r.reads;
		in->round_trips = r.round_trips;
		in->hops = r.hops;
		in->cache_hits = r.cache_hits;
		in->rereads = r.rereads;
		in->ran_on = r.cn;
		in->ran_epoch = r.rflags & DM_Q_R_ORACLE ? r.epoch : 0;
		in->status = h.status;
		in->flags |= r.rflags & DM_Q_R_RELAYED ? DMANN_SI_RELAYED : 0;
	}
	dm_msgpool_repost(d->pool, wr_id);
	return 1;
}

/* Connection c failed with err: it is closed (dmann_conn_lost) and its queries in flight
 * go to the retry queue, each once; a query that was sent twice fails the call (err). */
static int lost(struct search *s, uint32_t c, uint32_t *total, int err)
{
	char ep[128];
	int rc = 0;

	snprintf(ep, sizeof(ep), "%s", s->d->cn[c].ep);
	*total -= s->d->cn[c].inflight;
	dmann_conn_lost(s->d, c);
	if (dmann_route_fetch_lost(s->d, c) == 1)
		s->fetched = true;
	for (size_t i = 0; i < s->nq; i++) {
		if (s->on[i] != c + 1)
			continue;
		s->on[i] = 0;
		if (s->tries[i] < DMANN_TRIES && err != -ETIMEDOUT) {
			s->retry[s->nretry++] = i;
			continue;
		}
		s->done++;
		if (!rc)
			rc = dmann_fail(-EHOSTDOWN, "search: compute node %s failed with query %zu "
					"(%s), which was sent %u times", ep, i, strerror(-err),
					s->tries[i]);
	}
	return rc;
}

/* Validate the call. 0 or -EINVAL with the message. */
static int check_args(dmann_t *d, const float *vectors, size_t nq, uint32_t dim,
		      const struct dmann_search_params *p, const uint64_t *ids)
{
	if (!d || !vectors || !p || !ids)
		return dmann_fail(-EINVAL, "search: NULL argument");
	if (nq > DMANN_MAX_BATCH)
		return dmann_fail(-E2BIG, "search: %zu queries (at most %u per call)", nq,
				  DMANN_MAX_BATCH);
	if (p->k == 0 || p->k > DM_Q_MAX_K)
		return dmann_fail(-EINVAL, "search: k %u (must be 1..%u)", p->k, DM_Q_MAX_K);
	if (p->ef > DM_Q_MAX_EF || p->beam > DM_Q_MAX_BEAM)
		return dmann_fail(-EINVAL, "search: ef %u / beam %u (at most %u / %u)", p->ef,
				  p->beam, DM_Q_MAX_EF, DM_Q_MAX_BEAM);
	if (p->routing != DMANN_ROUTE_CLIENT && p->routing != DMANN_ROUTE_SERVER)
		return dmann_fail(-EINVAL, "search: unknown routing %d", (int)p->routing);
	if (p->graph >= DM_MAX_GRAPHS)
		return dmann_fail(-EINVAL, "search: graph %u (must be 0..%u)", p->graph,
				  DM_MAX_GRAPHS - 1);
	if (dim == 0 || DM_WIRE_HDR_LEN + sizeof(struct dm_wire_q_search) + 4ull * dim >
			       DM_CN_RECV_BUF)
		return dmann_fail(-EINVAL, "search: dimension %u: too many dimensions for a "
				  "compute node's receive buffer (1..%u)", dim,
				  (uint32_t)((DM_CN_RECV_BUF - DM_WIRE_HDR_LEN -
					      sizeof(struct dm_wire_q_search)) / 4));
	for (size_t i = 0; i < nq * dim; i++)
		if (!isfinite(vectors[i]))
			return dmann_fail(-EINVAL, "search: query %zu: component %zu is not finite",
					  i / dim, i % dim);
	return 0;
}

int dmann_search(dmann_t *d, const float *vectors, size_t nq, uint32_t dim,
		 const struct dmann_search_params *p, uint64_t *ids, float *distances,
		 uint32_t *counts, struct dmann_search_info *info)
{
	struct search s = { .d = d, .vec = vectors, .nq = nq, .dim = dim, .ids = ids,
			    .dist = distances, .counts = counts, .info = info };
	uint32_t window[DMANN_MAX_CN], cap, total = 0, rr, wait_c = 0;
	uint64_t last = dm_now_ns();
	size_t next = 0;
	int err = 0, qerr = 0, rc;
	bool client, want, reroute = false;
	unsigned reroutes = 0;

	rc = check_args(d, vectors, nq, dim, p, ids);
	if (rc)
		return rc;
	s.k = p->k;
	s.ef = p->ef ? p->ef : 64;
	s.beam = p->beam;
	s.graph = p->graph;
	s.t0 = calloc(nq ? nq : 1, sizeof(*s.t0));
	s.on = calloc(nq ? nq : 1, sizeof(*s.on));
	s.tries = calloc(nq ? nq : 1, sizeof(*s.tries));
	s.retry = malloc((nq ? nq : 1) * sizeof(*s.retry));
	s.msg = malloc(sizeof(struct dm_wire_q_search) + 4ull * dim);
	if (!s.t0 || !s.on || !s.tries || !s.retry || !s.msg) {
		err = dmann_fail(-ENOMEM, "search: out of memory");
		goto out_free;
	}
	for (size_t i = 0; i < nq; i++) {
		for (uint32_t j = 0; j < p->k; j++) {
			ids[i * p->k + j] = UINT64_MAX;
			if (distances)
				distances[i * p->k + j] = INFINITY;
		}
		if (counts)
			counts[i] = 0;
		if (info)
			info[i] = (struct dmann_search_info){ .status = -ECANCELED };
	}
	pthread_mutex_lock(&d->mu);
	dmann_clear_err();
	dmann_revive(d);
	s.base = d->next_id;
	d->next_id += nq;
	/* the oracle partitions graph 0: other graphs' queries are not routed */
	want = client = p->routing == DMANN_ROUTE_CLIENT && p->graph == 0;
	if (client && (d->rt.stale || (d->rt.kept && last - d->rt_checked_ns > REROUTE_NS) ||
		       (!d->rt.ok && last - d->rt_checked_ns > REFRESH_NS))) {
		d->rt_checked_ns = last;
		rc = dmann_route_refresh(d);
		if (rc && rc != -EAGAIN) {
			err = dmann_fail(rc, "search: fetching the router's oracle: %s", strerror(-rc));
			goto out;
		}
	}
	cap = p->inflight ? p->inflight : 16 * d->ncn;
	for (uint32_t c = 0; c < d->ncn; c++)
		window[c] = DM_MIN(DMANN_WINDOW, cap);
	rr = d->rr++;
	/* A refresh sent with queries in flight is settled before the call returns. */
	while (s.done < next || ((next < nq || s.nretry) && !err && !qerr) ||
	       dmann_route_fetching(d)) {
		bool progress = false, hold = false;

		if (s.fetched) {
			/* Not for ever: routing may have been switched off (strategy none). */
			reroute = !d->rt.ok && ++reroutes < REROUTE_TRIES;
			if (d->rt.kept)
				reroutes++;
			s.fetched = false;
		}
		/* The routing state went stale during the call (an answer showed a new routing
		 * epoch: a compute node joined or left, or the CNs re-clustered; or a connection
		 * died or came back): fetch it again. With a state to route with meanwhile, the
		 * Q_ROUTERs go out beside the queries and their answers come in with theirs
		 * (dmann_route_fetch_*); with none, nothing new is sent until the queries in
		 * flight are back, then the fetch waits for its answers. A fetch that finds the
		 * CNs still disagreeing is tried again every REROUTE_NS; the queries meanwhile go
		 * on with the state we had (kept: the CNs admit the previous routing epoch), or,
		 * with none, round robin and the CNs route them. */
		if (want && (d->rt.stale || reroute || (d->rt.kept && reroutes < REROUTE_TRIES)) &&
		    !dmann_route_fetching(d) && (next < nq || s.nretry) && !err && !qerr) {
			uint64_t now = dm_now_ns();
			bool due = (d->rt.stale && !d->rt.kept) ||
				   now - d->rt_checked_ns > REROUTE_NS;

			if (due && total > 0 && d->rt.ok) {
				uint32_t sent = 0;

				d->rt_checked_ns = now;
				dmann_revive(d);   /* a node that joined is routed to at once */
				rc = dmann_route_fetch_start(d, &sent);
				if (rc == -ENOMEM) {
					err = dmann_fail(rc, "search: fetching the router's oracle: %s",
							 strerror(-rc));
					continue;
				}
				total += sent;
			} else if (due && total > 0) {
				hold = true;
			} else if (due) {
				d->rt_checked_ns = now;
				dmann_revive(d);   /* a node that joined is routed to at once */
				rc = dmann_route_refresh(d);
				if (rc && rc != -EAGAIN) {
					err = dmann_fail(rc, "search: fetching the router's oracle: %s",
							 strerror(-rc));
					continue;
				}
				/* Not for ever: routing may have been switched off (strategy none). */
				reroute = !d->rt.ok && ++reroutes < REROUTE_TRIES;
				if (d->rt.kept)
					reroutes++;
			}
		}
		/* Fill the windows: the queries of a compute node that died first (round robin
		 * over the live ones), then the next ones in query order. */
		while (!hold && (next < nq || s.nretry) && total < cap && !err && !qerr) {
			bool again = s.nretry > 0;
			size_t i = again ? s.retry[s.nretry - 1] : next;
			uint32_t flags = 0;
			int c = -1;

			if (!again && want && d->rt.ok &&
			    (!d->rt.stale || d->rt.kept || dmann_route_fetching(d)))
				c = dmann_route_pick(d, vectors + i * dim, window, &flags);
			else
				c = dmann_live_pick(d, &rr, window, 0);
			if (c < 0) {
				if (dmann_live_pick(d, &rr, NULL, UINT32_MAX) < 0)
					err = dmann_fail(-EHOSTDOWN, "search: no compute node is "
							 "reachable");
				break;
			}
			rc = send_query(&s, (uint32_t)c, i, flags);
			if (rc) {
				rc = lost(&s, (uint32_t)c, &total, rc);
				err = err ? err : rc;
				continue;   /* query i was not sent: it is still where it was */
			}
			if (again)
				s.nretry--;
			else
				next++;
			total++;
			progress = true;
		}
		if ((err || qerr) && s.nretry) {
			s.done += s.nretry;   /* failed call: they are not sent again */
			s.nretry = 0;
		}
		/* Collect what has arrived. */
		for (uint32_t c = 0; c < d->ncn; c++)
			while (!d->cn[c].dead && d->cn[c].inflight) {
				rc = take_answer(&s, c, 0, &qerr);
				if (rc < 0) {
					rc = lost(&s, c, &total, rc);
					err = err ? err : rc;
					break;
				}
				if (rc == 0)
					break;
				total--;
				progress = true;
			}
		if (progress) {
			last = dm_now_ns();
			continue;
		}
		if (dm_now_ns() - last > STALL_NS) {
			err = dmann_fail(-ETIMEDOUT, "search: no answer for %llu s",
					 (unsigned long long)(STALL_NS / 1000000000ull));
			for (uint32_t c = 0; c < d->ncn; c++)
				if (!d->cn[c].dead && d->cn[c].inflight)
					lost(&s, c, &total, -ETIMEDOUT);
			break;
		}
		/* Nothing ready: wait briefly on the next connection with queries in flight. */
		for (uint32_t j = 0; j < d->ncn; j++) {
			uint32_t c = (wait_c + j) % d->ncn;

			if (d->cn[c].dead || !d->cn[c].inflight)
				continue;
			wait_c = c + 1;
			rc = take_answer(&s, c, 1, &qerr);
			if (rc >= 1) {
				total--;
				last = dm_now_ns();
			} else if (rc < 0) {
				rc = lost(&s, c, &total, rc);
				err = err ? err : rc;
			}
			break;
		}
	}
out:
	pthread_mutex_unlock(&d->mu);
out_free:
	free(s.t0);
	free(s.on);
	free(s.tries);
	free(s.retry);
	free(s.msg);
	return err ? err : qerr;
}
