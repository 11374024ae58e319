/* wire_q.c: encoders and checked decoders for the native query protocol of wire.h. */
#include "wire.h"

#include <math.h>
#include <string.h>

int dm_wire_q_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen)
{
	size_t body = buflen - DM_WIRE_HDR_LEN;
	bool resp = h->op & 1;

	if (h->length != buflen || buflen < DM_WIRE_HDR_LEN)
		return -EBADMSG;
	if (!resp && h->status)
		return -EBADMSG;
	switch (h->op & ~1u) {
	case DM_OP_Q_SEARCH:
		if (!resp) {
			struct dm_wire_q_search s;

			if (dm_wire_q_search_decode(buf + DM_WIRE_HDR_LEN, body, &s))
				return -EBADMSG;
			return body == sizeof(s) + 4ull * s.dim ? 0 : -EBADMSG;
		} else {
			struct dm_wire_q_result r;

			if (dm_wire_q_result_decode(buf + DM_WIRE_HDR_LEN, body, &r))
				return -EBADMSG;
			return body == sizeof(r) + sizeof(struct dm_wire_q_hit) * (uint64_t)r.n ?
				       0 : -EBADMSG;
		}
	case DM_OP_Q_CONFIG:
		return body == (resp ? 0 : sizeof(struct dm_wire_q_config)) ? 0 : -EBADMSG;
	case DM_OP_Q_INSERT:
		if (!resp) {
			struct dm_wire_q_insert s;

			if (dm_wire_q_insert_decode(buf + DM_WIRE_HDR_LEN, body, &s))
				return -EBADMSG;
			return body == sizeof(s) + 4ull * s.n * s.dim ? 0 : -EBADMSG;
		} else {
			struct dm_wire_q_inserted r;

			if (h->status && body == 0)
				return 0;
			if (dm_wire_q_inserted_decode(buf + DM_WIRE_HDR_LEN, body, &r))
				return -EBADMSG;
			return body == sizeof(r) + 8ull * r.n ? 0 : -EBADMSG;
		}
	case DM_OP_Q_ROUTER:
		/* The owners (dm_wire_q_router_owners) and the oracle (dm_oracle_decode) after the
		 * fixed part are checked by their decoders. */
		if (!resp || h->status)
			return body == 0 ? 0 : -EBADMSG;
		{
			struct dm_wire_q_router r;

			if (dm_wire_q_router_decode(buf + DM_WIRE_HDR_LEN, body, &r))
				return -EBADMSG;
			return body >= sizeof(r) + 4ull * r.ncn ? 0 : -EBADMSG;
		}
	case DM_OP_Q_STATS:
		if (resp && h->status)
			return body == 0 ? 0 : -EBADMSG;
		return body == (resp ? sizeof(struct dm_wire_q_stats) : 0) ? 0 : -EBADMSG;
	default:
		return -EPROTO;
	}
}

void dm_wire_q_search_encode(uint8_t *b, const struct dm_wire_q_search *m)
{
	dm_put_le64(b, m->qid);
	dm_put_le32(b + 8, m->k);
	dm_put_le32(b + 12, m->ef);
	dm_put_le32(b + 16, m->dim);
	dm_put_le32(b + 20, m->flags);
	dm_put_le32(b + 24, m->epoch);
	dm_put_le32(b + 28, m->graph);
}

int dm_wire_q_search_decode(const uint8_t *b, size_t len, struct dm_wire_q_search *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->qid = dm_get_le64(b);
	m->k = dm_get_le32(b + 8);
	m->ef = dm_get_le32(b + 12);
	m->dim = dm_get_le32(b + 16);
	m->flags = dm_get_le32(b + 20);
	m->epoch = dm_get_le32(b + 24);
	m->graph = dm_get_le32(b + 28);
	if (m->k == 0 || m->k > DM_Q_MAX_K || m->ef > DM_Q_MAX_EF || m->dim == 0 ||
	    m->dim > DM_Q_MAX_DIM ||
	    (m->flags & ~(DM_Q_BEAM_MASK | DM_Q_F_ROUTED | DM_Q_F_SPILLED)) ||
	    (m->flags & DM_Q_BEAM_MASK) > DM_Q_MAX_BEAM ||
	    ((m->flags & DM_Q_F_SPILLED) && !(m->flags & DM_Q_F_ROUTED)) ||
	    (!(m->flags & DM_Q_F_ROUTED) && m->epoch) || m->graph >= DM_MAX_GRAPHS ||
	    ((m->flags & DM_Q_F_ROUTED) && m->graph))
		return -EBADMSG;
	return 0;
}

void dm_wire_q_result_encode(uint8_t *b, const struct dm_wire_q_result *m)
{
	dm_put_le64(b, m->qid);
	dm_put_le32(b + 8, m->n);
	dm_put_le32(b + 12, m->hops);
	dm_put_le32(b + 16, m->reads);
	dm_put_le32(b + 20, m->round_trips);
	dm_put_le32(b + 24, m->cache_hits);
	dm_put_le32(b + 28, m->rereads);
	dm_put_le64(b + 32, m->bytes);
	dm_put_le64(b + 40, m->latency_ns);
	dm_put_le32(b + 48, m->cn);
	dm_put_le32(b + 52, m->epoch);
	dm_put_le32(b + 56, m->qlen);
	dm_put_le32(b + 60, m->rflags);
}

int dm_wire_q_result_decode(const uint8_t *b, size_t len, struct dm_wire_q_result *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->qid = dm_get_le64(b);
	m->n = dm_get_le32(b + 8);
	m->hops = dm_get_le32(b + 12);
	m->reads = dm_get_le32(b + 16);
	m->round_trips = dm_get_le32(b + 20);
	m->cache_hits = dm_get_le32(b + 24);
	m->rereads = dm_get_le32(b + 28);
	m->bytes = dm_get_le64(b + 32);
	m->latency_ns = dm_get_le64(b + 40);
	m->cn = dm_get_le32(b + 48);
	m->epoch = dm_get_le32(b + 52);
	m->qlen = dm_get_le32(b + 56);
	m->rflags = dm_get_le32(b + 60);
	return m->n <= DM_Q_MAX_K && m->cn < DM_MAX_NODES_WIRE && !(m->rflags & ~DM_Q_R_MASK) &&
	       (m->rflags >> DM_Q_R_STRATEGY_SHIFT) < DM_ROUTE_COUNT ? 0 : -EBADMSG;
}

void dm_wire_q_router_encode(uint8_t *b, const struct dm_wire_q_router *m)
{
	dm_put_le32(b, m->epoch);
	dm_put_le32(b + 4, m->strategy);
	dm_put_le32(b + 8, m->batch);
	dm_put_le32(b + 12, m->ncn);
	dm_put_le32(b + 16, m->self);
	dm_put_le32(b + 20, m->metric);
	dm_put_le64(b + 24, m->centroid_hash);
}

int dm_wire_q_router_decode(const uint8_t *b, size_t len, struct dm_wire_q_router *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->epoch = dm_get_le32(b);
	m->strategy = dm_get_le32(b + 4);
	m->batch = dm_get_le32(b + 8);
	m->ncn = dm_get_le32(b + 12);
	m->self = dm_get_le32(b + 16);
	m->metric = dm_get_le32(b + 20);
	m->centroid_hash = dm_get_le64(b + 24);
	return m->strategy < DM_ROUTE_COUNT && m->batch && m->ncn >= 1 &&
	       m->ncn <= DM_MAX_NODES_WIRE && m->self < DM_MAX_NODES_WIRE &&
	       m->metric <= 2 /* DM_METRIC_COS */ ? 0 : -EBADMSG;
}

int dm_wire_q_router_owners(const uint8_t *b, size_t len, const struct dm_wire_q_router *h,
			    uint32_t *owner)
{
	if (!h->ncn || h->ncn > DM_MAX_NODES_WIRE || len < sizeof(*h) + 4ull * h->ncn)
		return -EBADMSG;
	for (uint32_t p = 0; p < h->ncn; p++) {
		owner[p] = dm_get_le32(b + sizeof(*h) + 4 * (size_t)p);
		if (owner[p] >= h->ncn)
			return -EBADMSG;
	}
	return 0;
}

void dm_wire_q_hit_encode(uint8_t *b, const struct dm_wire_q_hit *m)
{
	uint32_t u;

	memcpy(&u, &m->dist, 4);
	dm_put_le64(b, m->id);
	dm_put_le32(b + 8, u);
	dm_put_le32(b + 12, 0);
}

int dm_wire_q_hit_decode(const uint8_t *b, size_t len, struct dm_wire_q_hit *m)
{
	uint32_t u;

	if (len < sizeof(*m))
		return -EBADMSG;
	m->id = dm_get_le64(b);
	u = dm_get_le32(b + 8);
	memcpy(&m->dist, &u, 4);
	m->reserved = dm_get_le32(b + 12);
	return m->reserved == 0 ? 0 : -EBADMSG;
}

void dm_wire_q_config_encode(uint8_t *b, const struct dm_wire_q_config *m)
{
	dm_put_le64(b, m->cache_bytes);
	dm_put_le32(b + 8, m->admit_ppm);
	dm_put_le32(b + 12, m->flags);
}

int dm_wire_q_config_decode(const uint8_t *b, size_t len, struct dm_wire_q_config *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->cache_bytes = dm_get_le64(b);
	m->admit_ppm = dm_get_le32(b + 8);
	m->flags = dm_get_le32(b + 12);
	if (m->admit_ppm > 1000000 || (m->flags & ~DM_Q_CONFIG_CLEAR))
		return -EBADMSG;
	return 0;
}

void dm_wire_q_stats_encode(uint8_t *b, const struct dm_wire_q_stats *m)
{
	const uint64_t *w = &m->hits;

	for (int i = 0; i < 9; i++)
		dm_put_le64(b + 8 * i, w[i]);
	dm_put_le32(b + 72, m->node_id);
	dm_put_le32(b + 76, m->workers);
	dm_put_le64(b + 80, m->failovers);
	dm_put_le64(b + 88, m->mn_downs);
	dm_put_le64(b + 96, m->mn_ups);
	dm_put_le32(b + 104, m->mn_down);
	dm_put_le32(b + 108, 0);
	for (int i = 0; i < 5; i++)
		dm_put_le64(b + 112 + 8 * i, (&m->loc_queries)[i]);
}

int dm_wire_q_stats_decode(const uint8_t *b, size_t len, struct dm_wire_q_stats *m)
{
	uint64_t *w = &m->hits;

	if (len < sizeof(*m))
		return -EBADMSG;
	for (int i = 0; i < 9; i++)
		w[i] = dm_get_le64(b + 8 * i);
	m->node_id = dm_get_le32(b + 72);
	m->workers = dm_get_le32(b + 76);
	m->failovers = dm_get_le64(b + 80);
	m->mn_downs = dm_get_le64(b + 88);
	m->mn_ups = dm_get_le64(b + 96);
	m->mn_down = dm_get_le32(b + 104);
	m->reserved = 0;
	for (int i = 0; i < 5; i++)
		(&m->loc_queries)[i] = dm_get_le64(b + 112 + 8 * i);
	return 0;
}

void dm_wire_put_f32s(uint8_t *b, const float *v, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t u;

		memcpy(&u, &v[i], 4);
		dm_put_le32(b + 4 * i, u);
	}
}

void dm_wire_get_f32s(const uint8_t *b, float *v, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t u = dm_get_le32(b + 4 * i);

		memcpy(&v[i], &u, 4);
	}
}

void dm_wire_q_insert_encode(uint8_t *b, const struct dm_wire_q_insert *m)
{
	dm_put_le32(b, m->n);
	dm_put_le32(b + 4, m->dim);
	dm_put_le32(b + 8, m->ef);
	dm_put_le32(b + 12, m->graph);
}

int dm_wire_q_insert_decode(const uint8_t *b, size_t len, struct dm_wire_q_insert *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->n = dm_get_le32(b);
	m->dim = dm_get_le32(b + 4);
	m->ef = dm_get_le32(b + 8);
	m->graph = dm_get_le32(b + 12);
	if (m->n == 0 || m->n > DM_Q_MAX_INSERT || m->dim == 0 || m->dim > DM_Q_MAX_DIM ||
	    m->ef > DM_Q_MAX_EF || m->graph >= DM_MAX_GRAPHS)
		return -EBADMSG;
	return 0;
}

void dm_wire_q_inserted_encode(uint8_t *b, const struct dm_wire_q_inserted *m)
{
	dm_put_le32(b, m->n);
	dm_put_le32(b + 4, m->links);
	dm_put_le32(b + 8, m->links_dropped);
	dm_put_le32(b + 12, m->lock_retries);
	dm_put_le32(b + 16, m->rereads);
	dm_put_le32(b + 20, m->reads);
	dm_put_le64(b + 24, m->latency_ns);
}

int dm_wire_q_inserted_decode(const uint8_t *b, size_t len, struct dm_wire_q_inserted *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->n = dm_get_le32(b);
	m->links = dm_get_le32(b + 4);
	m->links_dropped = dm_get_le32(b + 8);
	m->lock_retries = dm_get_le32(b + 12);
	m->rereads = dm_get_le32(b + 16);
	m->reads = dm_get_le32(b + 20);
	m->latency_ns = dm_get_le64(b + 24);
	return m->n <= DM_Q_MAX_INSERT ? 0 : -EBADMSG;
}
