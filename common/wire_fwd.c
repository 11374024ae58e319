/* wire_fwd.c: encoders and checked decoders for the forwarded CN<->CN messages of wire.h
 * (queries and answers relayed by memory nodes, queue-length / cache-sample reports, router
 * configuration). */
#include "wire.h"

#include <string.h>

static const char *const route_names[DM_ROUTE_COUNT] = {
	"none", "bestfit", "balanced", "adaptive", "adaptive-ring",
};

const char *dm_route_name(uint32_t strategy)
{
	return strategy < DM_ROUTE_COUNT ? route_names[strategy] : "?";
}

int dm_route_parse(const char *name)
{
	for (int i = 0; i < DM_ROUTE_COUNT; i++)
		if (!strcmp(name, route_names[i]))
			return i;
	return -EINVAL;
}

/* The inner message of QUERY/RESULT/BOUNCE: a whole query-protocol message of the given op. */
static int check_inner(const uint8_t *buf, size_t buflen, uint16_t op)
{
	struct dm_wire_hdr ih;
	const uint8_t *in = buf + DM_FWD_INNER_OFF;
	size_t ilen = buflen - DM_FWD_INNER_OFF;
	int rc;

	if (buflen < DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN)
		return -EBADMSG;
	rc = dm_wire_hdr_decode(in, ilen, &ih);
	if (rc)
		return rc;
	if (ih.op != op)
		return -EPROTO;
	return dm_wire_q_check(&ih, in, ilen);
}

int dm_wire_fwd_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen)
{
	size_t body;
	bool resp = h->op & 1;

	if (buflen < DM_WIRE_HDR_LEN || h->length != buflen)
		return -EBADMSG;
	body = buflen - DM_WIRE_HDR_LEN;
	if (h->op != DM_OP_FWD_RESULT && !resp && h->status)
		return -EBADMSG;
	switch (h->op) {
	case DM_OP_FWD_HELLO: {
		struct dm_wire_fwd_hello m;

		if (body != sizeof(m))
			return -EBADMSG;
		return dm_wire_fwd_hello_decode(buf + DM_WIRE_HDR_LEN, body, &m);
	}
	case DM_OP_FWD_QUERY:
	case DM_OP_FWD_RESULT:
	case DM_OP_FWD_BOUNCE: {
		struct dm_wire_fwd f;
		int rc = dm_wire_fwd_decode(buf + DM_WIRE_HDR_LEN, body, &f);

		if (rc)
			return rc;
		return check_inner(buf, buflen, h->op == DM_OP_FWD_RESULT ? DM_OP_Q_SEARCH + 1 :
				   DM_OP_Q_SEARCH);
	}
	case DM_OP_FWD_STATE: {
		struct dm_wire_fwd_state s;
		int rc = dm_wire_fwd_state_decode(buf + DM_WIRE_HDR_LEN, body, &s);

		if (rc)
			return rc;
		return body == sizeof(s) + 4ull * s.nsample ? 0 : -EBADMSG;
	}
	case DM_OP_FWD_STATE + 1: {
		struct dm_wire_fwd_table t;
		int rc;

		if (h->status)
			return body == 0 ? 0 : -EBADMSG;
		rc = dm_wire_fwd_table_decode(buf + DM_WIRE_HDR_LEN, body, &t);
		if (rc)
			return rc;
		return body == sizeof(t) + sizeof(struct dm_wire_fwd_entry) * (uint64_t)t.n ?
			       0 : -EBADMSG;
	}
	case DM_OP_FWD_ROUTER:
		return body == sizeof(struct dm_wire_fwd_rcfg) ? 0 : -EBADMSG;
	case DM_OP_FWD_ROUTER + 1:
		if (h->status)
			return body == 0 ? 0 : -EBADMSG;
		return body == sizeof(struct dm_wire_fwd_rstats) ? 0 : -EBADMSG;
	default:
		return -EPROTO;
	}
}

void dm_wire_fwd_hello_encode(uint8_t *b, const struct dm_wire_fwd_hello *m)
{
	dm_put_le32(b, m->cn);
	dm_put_le32(b + 4, m->role);
}

int dm_wire_fwd_hello_decode(const uint8_t *b, size_t len, struct dm_wire_fwd_hello *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->cn = dm_get_le32(b);
	m->role = dm_get_le32(b + 4);
	if (m->cn >= DM_MAX_NODES_WIRE || m->role > DM_FWD_ROLE_SERVE)
		return -EBADMSG;
	return 0;
}

void dm_wire_fwd_encode(uint8_t *b, const struct dm_wire_fwd *m)
{
	dm_put_le32(b, m->target);
	dm_put_le32(b + 4, m->origin);
	dm_put_le64(b + 8, m->token);
	dm_put_le32(b + 16, m->flags);
	dm_put_le32(b + 20, m->reserved);
}

int dm_wire_fwd_decode(const uint8_t *b, size_t len, struct dm_wire_fwd *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->target = dm_get_le32(b);
	m->origin = dm_get_le32(b + 4);
	m->token = dm_get_le64(b + 8);
	m->flags = dm_get_le32(b + 16);
	m->reserved = dm_get_le32(b + 20);
	if (m->target >= DM_MAX_NODES_WIRE || m->origin >= DM_MAX_NODES_WIRE)
		return -EBADMSG;
	return (m->flags & ~(DM_FWD_F_SPILLED | DM_FWD_F_ORIGIN_TOP)) || m->reserved ? -EPROTO : 0;
}

void dm_wire_fwd_state_encode(uint8_t *b, const struct dm_wire_fwd_state *m)
{
	dm_put_le32(b, m->cn);
	dm_put_le32(b + 4, m->epoch);
	dm_put_le32(b + 8, m->qlen);
	dm_put_le32(b + 12, m->nsample);
	dm_put_le64(b + 16, m->entries);
	dm_put_le64(b + 24, m->seq);
	dm_put_le32(b + 32, m->next);
	dm_put_le32(b + 36, m->flags);
}

int dm_wire_fwd_state_decode(const uint8_t *b, size_t len, struct dm_wire_fwd_state *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->cn = dm_get_le32(b);
	m->epoch = dm_get_le32(b + 4);
	m->qlen = dm_get_le32(b + 8);
	m->nsample = dm_get_le32(b + 12);
	m->entries = dm_get_le64(b + 16);
	m->seq = dm_get_le64(b + 24);
	m->next = dm_get_le32(b + 32);
	m->flags = dm_get_le32(b + 36);
	if (m->cn >= DM_MAX_NODES_WIRE || m->nsample > DM_FWD_MAX_SAMPLE ||
	    (m->entries == DM_FWD_NO_SAMPLE && m->nsample) || m->next < m->epoch ||
	    (m->flags & ~DM_FWD_S_MASK))
		return -EBADMSG;
	return 0;
}

void dm_wire_fwd_table_encode(uint8_t *b, const struct dm_wire_fwd_table *m)
{
	dm_put_le32(b, m->n);
	dm_put_le32(b + 4, m->epoch);
	dm_put_le32(b + 8, m->csp_ppm);
	dm_put_le32(b + 12, m->csp_cns);
}

int dm_wire_fwd_table_decode(const uint8_t *b, size_t len, struct dm_wire_fwd_table *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->n = dm_get_le32(b);
	m->epoch = dm_get_le32(b + 4);
	m->csp_ppm = dm_get_le32(b + 8);
	m->csp_cns = dm_get_le32(b + 12);
	if (m->n > DM_MAX_NODES_WIRE || m->csp_cns > DM_MAX_NODES_WIRE ||
	    (m->csp_ppm > 1000000 && m->csp_ppm != DM_FWD_CSP_NONE))
		return -EBADMSG;
	return 0;
}

void dm_wire_fwd_entry_encode(uint8_t *b, const struct dm_wire_fwd_entry *m)
{
	dm_put_le32(b, m->cn);
	dm_put_le32(b + 4, m->qlen);
	dm_put_le32(b + 8, m->age_ms);
	dm_put_le32(b + 12, m->epoch);
	dm_put_le32(b + 16, m->next);
	dm_put_le32(b + 20, m->flags);
}

int dm_wire_fwd_entry_decode(const uint8_t *b, size_t len, struct dm_wire_fwd_entry *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->cn = dm_get_le32(b);
	m->qlen = dm_get_le32(b + 4);
	m->age_ms = dm_get_le32(b + 8);
	m->epoch = dm_get_le32(b + 12);
	m->next = dm_get_le32(b + 16);
	m->flags = dm_get_le32(b + 20);
	return m->cn >= DM_MAX_NODES_WIRE || m->next < m->epoch || (m->flags & ~DM_FWD_S_MASK) ?
		       -EBADMSG : 0;
}

void dm_wire_fwd_rcfg_encode(uint8_t *b, const struct dm_wire_fwd_rcfg *m)
{
	dm_put_le32(b, m->set);
	dm_put_le32(b + 4, m->strategy);
	dm_put_le32(b + 8, m->batch);
	dm_put_le32(b + 12, m->pause);
	dm_put_le32(b + 16, m->spill_cache);
	dm_put_le32(b + 20, m->refresh);
}

int dm_wire_fwd_rcfg_decode(const uint8_t *b, size_t len, struct dm_wire_fwd_rcfg *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->set = dm_get_le32(b);
	m->strategy = dm_get_le32(b + 4);
	m->batch = dm_get_le32(b + 8);
	m->pause = dm_get_le32(b + 12);
	m->spill_cache = dm_get_le32(b + 16);
	m->refresh = dm_get_le32(b + 20);
	if (m->set > 1 || m->strategy >= DM_ROUTE_COUNT || m->batch > DM_FWD_MAX_BATCH ||
	    m->pause > DM_FWD_MAX_BATCH || m->spill_cache > DM_FWD_SPILL_YES)
		return -EBADMSG;
	return 0;
}

void dm_wire_fwd_rstats_encode(uint8_t *b, const struct dm_wire_fwd_rstats *m)
{
	dm_put_le32(b, m->strategy);
	dm_put_le32(b + 4, m->k);
	dm_put_le32(b + 8, m->batch);
	dm_put_le32(b + 12, m->pause);
	dm_put_le64(b + 16, m->centroid_hash);
	dm_put_le64(b + 24, m->local);
	dm_put_le64(b + 32, m->forwarded);
	dm_put_le64(b + 40, m->received);
	dm_put_le64(b + 48, m->bounced);
	dm_put_le32(b + 56, m->csp_ppm);
	dm_put_le32(b + 60, m->csp_cns);
	dm_put_le64(b + 64, m->csp_age_ms);
	dm_put_le32(b + 72, m->epoch);
	dm_put_le32(b + 76, m->reclusters);
	dm_put_le32(b + 80, m->qlen);
	dm_put_le32(b + 84, m->sample_level);
	dm_put_le64(b + 88, m->paused);
	dm_put_le32(b + 96, m->spill_cache);
	dm_put_le32(b + 100, m->route_epoch);
	dm_put_le64(b + 104, m->admitted);
	dm_put_le32(b + 112, m->next_epoch);
	dm_put_le32(b + 116, m->rollout);
}

int dm_wire_fwd_rstats_decode(const uint8_t *b, size_t len, struct dm_wire_fwd_rstats *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->strategy = dm_get_le32(b);
	m->k = dm_get_le32(b + 4);
	m->batch = dm_get_le32(b + 8);
	m->pause = dm_get_le32(b + 12);
	m->centroid_hash = dm_get_le64(b + 16);
	m->local = dm_get_le64(b + 24);
	m->forwarded = dm_get_le64(b + 32);
	m->received = dm_get_le64(b + 40);
	m->bounced = dm_get_le64(b + 48);
	m->csp_ppm = dm_get_le32(b + 56);
	m->csp_cns = dm_get_le32(b + 60);
	m->csp_age_ms = dm_get_le64(b + 64);
	m->epoch = dm_get_le32(b + 72);
	m->reclusters = dm_get_le32(b + 76);
	m->qlen = dm_get_le32(b + 80);
	m->sample_level = dm_get_le32(b + 84);
	m->paused = dm_get_le64(b + 88);
	m->spill_cache = dm_get_le32(b + 96);
	m->route_epoch = dm_get_le32(b + 100);
	m->admitted = dm_get_le64(b + 104);
	m->next_epoch = dm_get_le32(b + 112);
	m->rollout = dm_get_le32(b + 116);
	if (m->strategy >= DM_ROUTE_COUNT || m->spill_cache > 1 ||
	    m->rollout >= DM_FWD_ROLLOUT_COUNT || m->next_epoch < m->epoch ||
	    (m->csp_ppm > 1000000 && m->csp_ppm != DM_FWD_CSP_NONE))
		return -EBADMSG;
	return 0;
}
