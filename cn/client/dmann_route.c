/* dmann_route.c: libdmann's client-side router. The compute nodes' router (cn/router/)
 * ranks every query with the oracle and relays the ones for another CN through a memory
 * node; a client that holds the same oracle sends each query straight to the CN the router
 * would pick, so nothing is relayed.
 *
 * The oracle and the strategy come from Q_ROUTER (every CN builds the same oracle; the
 * client checks that the CNs agree on its epoch and centroid hash), with the table of
 * partition owners (a CN that left has its partition served by a ring neighbour; the
 * routing epoch changes with the owners). The per-batch state is the CNs' own: rank
 * partitions with dm_oracle_rank, candidates = their owners in that order
 * (route_owner_order), bestfit = the first, balanced / adaptive / adaptive-ring = the
 * first candidate in rank (or ring) order under its batch limit, limits over the live CNs
 * from
 * oracle/route_limits.c with the demand of this client's stream and the queue lengths the
 * CNs piggyback on their answers. A CN whose window is full is skipped (the query goes to
 * the next candidate, marked spilled). Every query says which epoch it was routed with; a
 * CN stays authoritative and re-routes a query of another epoch, or one it is too loaded
 * to take. An answer with another epoch or strategy makes the state stale: the next call
 * fetches it again. A client never gets remote memory access or memory keys. */
#include "dmann_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "distance.h"
#include "route_limits.h"

void dmann_route_free(struct dmann_route *rt)
{
	dm_oracle_free(rt->o);
	free(rt->spill);
	free(rt->owner);
	free(rt->cand);
	free(rt->hist);
	free(rt->limit);
	free(rt->want);
	free(rt->qlen);
	free(rt->cns);
	free(rt->demand);
	free(rt->qv);
	memset(rt, 0, sizeof(*rt));
}

/* A refresh in progress: the Q_ROUTER answers taken so far, whether synchronously (one
 * connection after the other, nothing else in flight) or asynchronously (dmann_search: the
 * answers come in with the queries'). */
struct dmann_fetch {
	struct dmann_route n;        /* the new state, from the first usable answer */
	struct dm_wire_q_router h0;
	uint32_t own0[DM_MAX_NODES_WIRE];
	bool have0;                  /* h0 / n.o: the first usable answer */
	bool disagree;               /* an answer differs from h0 (a switch in progress) */
	bool partial;                /* a node has no oracle yet: left out */
	bool unusable;               /* an answer no client can route with */
	uint64_t id;                 /* asynchronous: the Q_ROUTER request id */
	uint32_t npending;
	bool pending[DMANN_MAX_CN];
};

static struct dmann_fetch *fetch_new(void)
{
	struct dmann_fetch *f = calloc(1, sizeof(*f));

	if (f)
		for (uint32_t i = 0; i < DM_MAX_NODES_WIRE; i++)
			f->n.conn_of[i] = -1;
	return f;
}

static void fetch_free(struct dmann_fetch *f)
{
	if (!f)
		return;
	dmann_route_free(&f->n);
	free(f);
}

/* One node's Q_ROUTER answer (body of len bytes, or its status) from connection c. */
static void fetch_add(dmann_t *d, struct dmann_fetch *f, uint32_t c, const uint8_t *body,
		      uint32_t len, int status)
{
	struct dm_wire_q_router h;
	uint32_t own[DM_MAX_NODES_WIRE];
	int e = status;

	(void)d;
	if (e == -EAGAIN) {
		/* No oracle yet (a compute node that has just started): routed to once it
		 * has one, by a later refresh; the others' owners send its partition to the
		 * next candidate meanwhile. */
		f->partial = true;
		return;
	}
	if (!e)
		e = dm_wire_q_router_decode(body, len, &h);
	if (!e)
		e = dm_wire_q_router_owners(body, len, &h, own);
	if (e) {
		f->unusable = true;   /* no oracle a client can use */
		return;
	}
	if (f->have0 && (h.epoch != f->h0.epoch || h.centroid_hash != f->h0.centroid_hash ||
			 h.strategy != f->h0.strategy || h.ncn != f->h0.ncn ||
			 memcmp(own, f->own0, f->h0.ncn * sizeof(*own)))) {
		f->disagree = true;   /* the CNs disagree (an epoch change in progress) */
		return;
	}
	if (!f->have0) {
		size_t off = sizeof(h) + 4 * (size_t)h.ncn;

		f->n.o = dm_oracle_decode(body + off, len - off);
		if (!f->n.o) {
			f->unusable = true;
			return;
		}
		f->h0 = h;
		memcpy(f->own0, own, h.ncn * sizeof(*own));
		f->have0 = true;
	}
	if (f->n.conn_of[h.self] >= 0 || h.self >= f->h0.ncn) {
		f->unusable = true;   /* two connections to one node, or a node out of range */
		return;
	}
	f->n.conn_of[h.self] = (int32_t)c;
	f->n.node_of[c] = h.self;
}

/* All answers are in: route with the new state, keep the current one (the CNs disagree and
 * we have one), or stop routing client-side. Frees f. 0 when routing client-side now,
 * -EAGAIN when not, -ENOMEM. */
static int fetch_finish(dmann_t *d, struct dmann_fetch *f)
{
	struct dmann_route *rt = &d->rt, *n = &f->n;
	int rc = -EAGAIN;

	if (f->unusable || f->disagree || !f->have0)
		goto out;
	if (f->h0.strategy == DM_ROUTE_NONE || f->h0.ncn != n->o->k || f->h0.ncn < 2)
		goto out;
	n->k = f->h0.ncn;
	n->epoch = f->h0.epoch;
	n->strategy = f->h0.strategy;
	n->batch = f->h0.batch;
	n->metric = f->h0.metric;
	n->hash = f->h0.centroid_hash;
	n->spill = calloc((size_t)n->k * (n->k - 1), sizeof(uint32_t));
	n->owner = malloc(n->k * sizeof(uint32_t));
	n->cand = calloc(2 * (size_t)n->k, sizeof(uint32_t));
	n->hist = calloc(n->k, sizeof(uint32_t));
	n->limit = calloc(n->k, sizeof(uint32_t));
	n->want = calloc(n->k, sizeof(uint32_t));
	n->qlen = calloc(n->k, sizeof(uint32_t));
	n->cns = calloc(n->k, sizeof(uint32_t));
	n->demand = calloc(n->k, sizeof(double));
	n->qv = malloc(n->o->dim * sizeof(float));
	if (!n->spill || !n->owner || !n->cand || !n->hist || !n->limit || !n->want ||
	    !n->qlen || !n->cns || !n->demand || !n->qv) {
		rc = -ENOMEM;
		goto out;
	}
	memcpy(n->owner, f->own0, n->k * sizeof(uint32_t));
	for (uint32_t c = 0; c < n->k; c++) {
		dm_oracle_spill_order(n->o, c, n->spill + (size_t)c * (n->k - 1));
		n->demand[c] = 1.0 / n->k;
	}
	route_limits_owned(n->k, n->batch, n->strategy != DM_ROUTE_BALANCED, n->demand, n->qlen,
			   n->owner, n->limit);
	n->ok = true;
	n->kept = f->partial;   /* fetched again soon: the node without an oracle will have one */
	rc = 0;
out:
	if (rc && f->disagree && !f->unusable && rt->ok) {
		/* Keep routing with the state we have: every CN admits its epoch or the one
		 * after it, and the switch ends within a report period or two. */
		fetch_free(f);
		rt->stale = false;
		rt->kept = true;
		return 0;
	}
	dmann_route_free(rt);
	if (rc == 0) {
		*rt = *n;
		memset(n, 0, sizeof(*n));
	} else {
		for (uint32_t i = 0; i < DM_MAX_NODES_WIRE; i++)
			rt->conn_of[i] = -1;
	}
	fetch_free(f);
	return rc;
}

int dmann_route_refresh(dmann_t *d)
{
	struct dmann_fetch *f = fetch_new();
	uint8_t *buf = malloc(DM_C_MAX_RESP);

	if (!f || !buf) {
		fetch_free(f);
		free(buf);
		return -ENOMEM;
	}
	for (uint32_t c = 0; c < d->ncn && !f->disagree && !f->unusable; c++) {
		uint32_t len = 0;
		int e;

		if (d->cn[c].dead)
			continue;   /* its node gets no query until it is reachable again */
		e = dm_rpc_call(&d->cn[c].ch, DM_OP_Q_ROUTER, NULL, 0, buf, DM_C_MAX_RESP, &len);
		if (e && e != -EAGAIN && e != -ENOSYS && e != -E2BIG && e != -EBADMSG &&
		    e != -EPROTO) {
			dmann_conn_lost(d, c);   /* a transport failure: route over the others */
			continue;
		}
		fetch_add(d, f, c, buf, len, e);
	}
	free(buf);
	return fetch_finish(d, f);
}

bool dmann_route_fetching(const dmann_t *d)
{
	return d->fetch != NULL;
}

int dmann_route_fetch_start(dmann_t *d, uint32_t *sent)
{
	struct dmann_fetch *f;
	int rc = 0;

	*sent = 0;
	if (d->fetch)
		return 0;
	f = fetch_new();
	if (!f)
		return -ENOMEM;
	f->id = DMANN_FETCH_ID | d->next_fetch++;
	for (uint32_t c = 0; c < d->ncn; c++) {
		if (d->cn[c].dead)
			continue;
		rc = dm_rpc_send(&d->cn[c].ch, DM_OP_Q_ROUTER, f->id, 0, NULL, 0);
		if (rc) {
			/* the caller's loop finds the connection broken with its next receive */
			rc = 0;
			continue;
		}
		d->cn[c].inflight++;
		f->pending[c] = true;
		f->npending++;
		(*sent)++;
	}
	if (!f->npending) {
		fetch_free(f);
		return -EHOSTDOWN;
	}
	d->fetch = f;
	return rc;
}

int dmann_route_fetch_answer(dmann_t *d, uint32_t c, const struct dm_wire_hdr *h,
			     const uint8_t *body, uint32_t len)
{
	struct dmann_fetch *f = d->fetch;

	if (!f || c >= d->ncn || !f->pending[c] || h->req_id != f->id)
		return -EBADMSG;
	f->pending[c] = false;
	f->npending--;
	fetch_add(d, f, c, body, len, h->status);
	if (f->npending)
		return 0;
	d->fetch = NULL;
	fetch_finish(d, f);
	return 1;
}

void dmann_route_fetch_cancel(dmann_t *d)
{
	fetch_free(d->fetch);
	d->fetch = NULL;
}

int dmann_route_fetch_lost(dmann_t *d, uint32_t c)
{
	struct dmann_fetch *f = d->fetch;

	if (!f || c >= d->ncn || !f->pending[c])
		return 0;
	f->pending[c] = false;
	if (--f->npending)
		return 0;
	d->fetch = NULL;
	fetch_finish(d, f);
	return 1;
}

/* End of a batch: new limits from the demand and the queues (as the CNs' set_limits). */
static void next_batch(struct dmann_route *rt)
{
	route_demand_update(rt->k, rt->demand, rt->want, rt->total);
	route_limits_owned(rt->k, rt->batch, rt->strategy != DM_ROUTE_BALANCED, rt->demand,
			   rt->qlen, rt->owner, rt->limit);
	memset(rt->hist, 0, rt->k * sizeof(uint32_t));
	memset(rt->want, 0, rt->k * sizeof(uint32_t));
	rt->total = 0;
}

/* Connection of CN node, or -1 when it has none or its window is full. */
static int room(const dmann_t *d, uint32_t node, const uint32_t *window)
{
	int32_t c = d->rt.conn_of[node];

	return c >= 0 && !d->cn[c].dead && d->cn[c].inflight < window[c] ? c : -1;
}

int dmann_route_pick(dmann_t *d, const float *v, const uint32_t *window, uint32_t *flags)
{
	struct dmann_route *rt = &d->rt;
	uint32_t k = rt->k, top, target = UINT32_MAX, n, *cand = rt->cand, *seq = rt->cand + k;
	int c = -1;

	if (rt->metric == DM_METRIC_COS) {
		memcpy(rt->qv, v, rt->o->dim * sizeof(float));
		dm_normalize(rt->qv, rt->o->dim);
		v = rt->qv;
	}
	dm_oracle_rank(rt->o, v, rt->cns, NULL);
	n = route_owner_order(rt->owner, rt->cns, k, cand);
	top = cand[0];   /* the owner of the top-ranked partition */
	/* The router's choice ... */
	if (rt->strategy == DM_ROUTE_BESTFIT) {
		target = top;
	} else {
		uint32_t nr = n, *order = cand;

		if (rt->strategy == DM_ROUTE_ADAPTIVE_RING) {
			/* The owners of the top partition's ring neighbours (seq: scratch). */
			uint32_t parts[DM_MAX_NODES_WIRE];

			parts[0] = rt->cns[0];
			memcpy(parts + 1, rt->spill + (size_t)rt->cns[0] * (k - 1),
			       (k - 1) * sizeof(uint32_t));
			nr = route_owner_order(rt->owner, parts, k, seq);
			order = seq;
		}
		for (uint32_t i = 0; i < nr && target == UINT32_MAX; i++)
			if (rt->hist[order[i]] < rt->limit[order[i]])
				target = order[i];
		if (target == UINT32_MAX)
			target = top;
	}
	c = room(d, target, window);
	/* ... or, its window full, the next candidate in rank order with room. */
	for (uint32_t i = 0; c < 0 && i < n; i++)
		if (cand[i] != target && (c = room(d, cand[i], window)) >= 0)
			target = cand[i];
	/* ... or, when no owner is connected from here (their windows are not just full),
	 * any compute node with room: it routes the query on. */
	bool owner_conn = false;

	for (uint32_t i = 0; c < 0 && i < n && !owner_conn; i++)
		owner_conn = rt->conn_of[cand[i]] >= 0 && !d->cn[rt->conn_of[cand[i]]].dead;
	for (uint32_t i = 0; c < 0 && !owner_conn && i < k; i++)
		if ((c = room(d, i, window)) >= 0)
			target = i;
	if (c < 0)
		return -1;   /* counted when it is sent, not now */
	rt->want[top]++;
	rt->hist[target]++;
	if (rt->strategy != DM_ROUTE_BESTFIT && ++rt->total >= rt->batch) {
		/* Our own queues are fresher than the last answers' reports. */
		for (uint32_t n = 0; n < k; n++)
			if (rt->conn_of[n] >= 0)
				rt->qlen[n] = DM_MAX(rt->qlen[n], d->cn[rt->conn_of[n]].inflight);
		next_batch(rt);
	}
	*flags = DM_Q_F_ROUTED | (target != top ? DM_Q_F_SPILLED : 0);
	return c;
}

void dmann_route_answer(dmann_t *d, const struct dm_wire_q_result *r)
{
	struct dmann_route *rt = &d->rt;

	if (!rt->ok)
		return;
	if (!(r->rflags & DM_Q_R_ORACLE) || r->epoch != rt->epoch ||
	    r->rflags >> DM_Q_R_STRATEGY_SHIFT != rt->strategy) {
		/* A new routing epoch may mean a compute node joined: try the dead connections
		 * again at the next dmann_revive, back-off or not. */
		if (!rt->stale)
			for (uint32_t c = 0; c < d->ncn; c++)
				if (d->cn[c].dead)
					d->cn[c].retry_ns = 0;
		rt->stale = true;
	}
	else if (r->cn < rt->k)
		rt->qlen[r->cn] = r->qlen;
}
