/* dgen.c: index generations, the loader's and the compute nodes' calls (dgen.h). */
#include "dgen.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int gen_call(struct mn_link *l, uint16_t op, uint32_t graph, uint32_t cn, uint64_t gen,
		    struct dm_wire_ctl_gen_state *st)
{
	struct dm_wire_ctl_gen g = { .gen = gen, .index = graph, .cn = cn };
	uint8_t req[sizeof(g)], resp[sizeof(*st)];
	uint32_t blen = 0;
	int rc;

	dm_wire_ctl_gen_encode(req, &g);
	rc = dm_rpc_call(&l->ch, op, req, sizeof(req), resp, sizeof(resp), &blen);
	if (rc)
		return rc;
	return blen == sizeof(resp) ? dm_wire_ctl_gen_state_decode(resp, blen, st) : -EBADMSG;
}

static void merge(struct dgen_view *v, const struct dm_wire_ctl_gen_state *st)
{
	bool cur = st->flags & DM_GEN_F_CURRENT;

	if (v->answered == 0) {
		v->agree = true;
	} else if (cur != v->has_current || (cur && st->current != v->current) ||
		   (cur && st->current != v->min_current)) {
		v->agree = false;
	}
	if (cur) {
		if (!v->has_current || st->current > v->current)
			v->current = st->current;
		if (!v->has_current || st->current < v->min_current)
			v->min_current = st->current;
		v->has_current = true;
	}
	if (st->flags & DM_GEN_F_RETIRED) {
		if (!v->has_retired || st->retired > v->retired)
			v->retired = st->retired;
		v->has_retired = true;
	}
	v->waiting = DM_MAX(v->waiting, st->waiting);
	v->lease_ms = DM_MAX(v->lease_ms, st->lease_ms);
	v->answered++;
}

int dgen_report_node(struct mn_set *s, uint32_t m, uint32_t graph, uint32_t cn, uint64_t gen,
		     struct dm_wire_ctl_gen_state *st, uint64_t *sent_ns)
{
	uint64_t t = dm_now_ns();
	int rc;

	if (!s->link[m].up)
		return -EHOSTDOWN;
	rc = gen_call(&s->link[m], DM_OP_CTL_GEN_REPORT, graph, cn, gen, st);
	if (rc) {
		dm_debug("generation report to memory node %u: %s", m, strerror(-rc));
		return -EHOSTDOWN;
	}
	if (sent_ns)
		*sent_ns = t;
	return 0;
}

int dgen_report(struct mn_set *s, uint32_t graph, uint32_t cn, uint64_t gen, struct dgen_view *v,
		uint64_t *sent_ns)
{
	int rc = 0;

	memset(v, 0, sizeof(*v));
	for (uint32_t i = 0; i < s->n; i++) {
		struct dm_wire_ctl_gen_state st;

		if (mn_set_retired(s, i))
			continue;   /* holds nothing */
		if (dgen_report_node(s, i, graph, cn, gen, &st, sent_ns ? &sent_ns[i] : NULL)) {
			rc = -EHOSTDOWN;
			continue;
		}
		merge(v, &st);
	}
	return rc;
}

int dgen_publish_node(struct mn_set *s, uint32_t m, uint32_t graph, uint64_t gen)
{
	struct dm_wire_ctl_gen_state st;

	return s->link[m].up ? gen_call(&s->link[m], DM_OP_CTL_GEN_PUBLISH, graph, DM_GEN_NO_CN, gen,
					&st) : -EHOSTDOWN;
}

int dgen_publish(struct mn_set *s, uint32_t graph, uint64_t gen, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < s->n; i++) {
		struct dm_wire_ctl_gen_state st;
		int rc;

		if (mn_set_retired(s, i))
			continue;
		rc = s->link[i].up ? gen_call(&s->link[i], DM_OP_CTL_GEN_PUBLISH, graph,
					      DM_GEN_NO_CN, gen, &st) : -EHOSTDOWN;

		if (rc) {
			snprintf(err, errlen, "publishing generation %llu on memory node %u: %s%s",
				 (unsigned long long)gen, i, strerror(-rc),
				 rc == -EBUSY ? " (an older generation is still held by a compute node)" :
				 "");
			return rc;
		}
	}
	return 0;
}

void dgen_abandon(struct mn_set *s, uint32_t graph, uint64_t gen)
{
	for (uint32_t i = 0; i < s->n; i++) {
		struct dm_wire_ctl_obj o = { .key = dm_gen_meta_key(graph, gen), .aux = ~0ull };
		struct dm_wire_ctl_gen_state st;
		uint8_t buf[sizeof(o)];
		uint32_t blen;

		if (!s->link[i].up ||
		    gen_call(&s->link[i], DM_OP_CTL_GEN_REPORT, graph, DM_GEN_NO_CN, 0, &st) ||
		    ((st.flags & DM_GEN_F_CURRENT) && st.current == gen))
			continue;
		dm_wire_ctl_obj_encode(buf, &o);
		dm_rpc_call(&s->link[i].ch, DM_OP_CTL_DROP, buf, sizeof(buf), buf, sizeof(buf), &blen);
	}
}

int dgen_list(struct mn_set *s, struct dgen_graphs *out)
{
	int rc = 0;

	memset(out, 0, sizeof(*out));
	for (uint32_t i = 0; i < s->n; i++) {
		uint8_t resp[DM_WIRE_CTL_GEN_LIST_MAX];
		struct dm_wire_ctl_gen_list l;
		uint32_t blen = 0;
		int r;

		if (mn_set_retired(s, i))
			continue;   /* holds nothing */
		r = s->link[i].up ? dm_rpc_call(&s->link[i].ch, DM_OP_CTL_GEN_LIST, NULL, 0, resp,
						sizeof(resp), &blen) : -EHOSTDOWN;
		if (!r)
			r = dm_wire_ctl_gen_list_decode(resp, blen, &l);
		if (r) {
			dm_debug("generation list of memory node %u: %s", i, strerror(-r));
			rc = -EHOSTDOWN;
			continue;
		}
		for (uint32_t j = 0; j < l.count; j++) {
			const struct dm_wire_ctl_gen_entry *e = &l.e[j];
			uint32_t g = e->index, bit = 1u << (g % 32);

			if (g >= DM_MAX_GRAPHS)
				continue;
			if ((e->flags & DM_GEN_F_CURRENT) &&
			    (!(out->mask & bit) || e->current > out->current[g])) {
				out->current[g] = e->current;
				out->mask |= bit;
			}
			if ((e->flags & DM_GEN_F_RETIRED) &&
			    (!(out->retired_mask & bit) || e->retired > out->retired[g])) {
				out->retired[g] = e->retired;
				out->retired_mask |= bit;
			}
		}
		out->answered++;
	}
	return rc;
}

int dgen_drop_node(struct mn_set *s, uint32_t m, uint32_t graph, uint64_t gen)
{
	struct dm_wire_ctl_gen_state st;

	return s->link[m].up ? gen_call(&s->link[m], DM_OP_CTL_GEN_DROP, graph, DM_GEN_NO_CN, gen,
					&st) : -EHOSTDOWN;
}

int dgen_wait_released(struct mn_set *s, uint32_t graph, uint32_t timeout_ms, struct dgen_view *v)
{
	uint64_t t0 = dm_now_ns();

	for (;;) {
		int rc = dgen_report(s, graph, DM_GEN_NO_CN, 0, v, NULL);

		if (rc && !v->answered)
			return rc;
		if (!v->has_retired && !rc)
			return 0;
		if (dm_now_ns() - t0 >= (uint64_t)timeout_ms * 1000000ull)
			return -ETIMEDOUT;
		usleep(100000);
	}
}
