/* test_wire_fwd.c: the forwarded CN<->CN messages of wire.h (round trips, every length and
 * field check of dm_wire_fwd_check) and the [router] keys of the cluster file. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "wire.h"

/* A FWD_QUERY carrying a Q_SEARCH of dim floats; returns its length. */
static uint32_t make_query(uint8_t *b, uint32_t dim, uint16_t op)
{
	struct dm_wire_fwd f = { .target = 3, .origin = 1, .token = 77 };
	struct dm_wire_q_search s = { .qid = 9, .k = 10, .ef = 20, .dim = dim };
	uint32_t ilen = DM_WIRE_HDR_LEN + sizeof(s) + 4 * dim;
	float v[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };

	dm_wire_hdr_encode(b, op, DM_FWD_INNER_OFF + ilen, 0, 5);
	dm_wire_fwd_encode(b + DM_WIRE_HDR_LEN, &f);
	dm_wire_hdr_encode(b + DM_FWD_INNER_OFF, DM_OP_Q_SEARCH, ilen, 0, 9);
	dm_wire_q_search_encode(b + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN, &s);
	dm_wire_put_f32s(b + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN + sizeof(s), v, dim);
	return DM_FWD_INNER_OFF + ilen;
}

static int check(const uint8_t *b, uint32_t len)
{
	struct dm_wire_hdr h;
	int rc = dm_wire_hdr_decode(b, len, &h);

	return rc ? rc : dm_wire_fwd_check(&h, b, len);
}

Test(wire_fwd, query_and_bounce)
{
	uint8_t b[512];
	uint32_t len = make_query(b, 8, DM_OP_FWD_QUERY);
	struct dm_wire_fwd f;

	cr_assert_eq(check(b, len), 0);
	cr_assert_eq(dm_wire_fwd_decode(b + DM_WIRE_HDR_LEN, len, &f), 0);
	cr_assert_eq(f.target, 3);
	cr_assert_eq(f.origin, 1);
	cr_assert_eq(f.token, 77);
	cr_assert_neq(check(b, len - 4), 0, "truncated");
	len = make_query(b, 8, DM_OP_FWD_BOUNCE);
	cr_assert_eq(check(b, len), 0);
	/* A RESULT must carry an answer, not a query. */
	len = make_query(b, 8, DM_OP_FWD_RESULT);
	cr_assert_eq(check(b, len), -EPROTO);
	/* Inner length that disagrees with the outer one. */
	len = make_query(b, 8, DM_OP_FWD_QUERY);
	dm_wire_hdr_encode(b + DM_FWD_INNER_OFF, DM_OP_Q_SEARCH, len - DM_FWD_INNER_OFF - 4, 0, 9);
	cr_assert_neq(check(b, len), 0);
	/* Target out of range, reserved field set. */
	len = make_query(b, 8, DM_OP_FWD_QUERY);
	dm_put_le32(b + DM_WIRE_HDR_LEN, 1000);
	cr_assert_eq(check(b, len), -EBADMSG);
	len = make_query(b, 8, DM_OP_FWD_QUERY);
	dm_put_le32(b + DM_WIRE_HDR_LEN + 20, 1);
	cr_assert_eq(check(b, len), -EPROTO);
	/* The routing flags, and nothing else, may be set. */
	len = make_query(b, 8, DM_OP_FWD_QUERY);
	dm_put_le32(b + DM_WIRE_HDR_LEN + 16, DM_FWD_F_SPILLED | DM_FWD_F_ORIGIN_TOP);
	cr_assert_eq(check(b, len), 0);
	cr_assert_eq(dm_wire_fwd_decode(b + DM_WIRE_HDR_LEN, len, &f), 0);
	cr_assert_eq(f.flags, DM_FWD_F_SPILLED | DM_FWD_F_ORIGIN_TOP);
	dm_put_le32(b + DM_WIRE_HDR_LEN + 16, 4);
	cr_assert_eq(check(b, len), -EPROTO);
}

Test(wire_fwd, result)
{
	uint8_t b[512];
	struct dm_wire_fwd f = { .target = 0, .origin = 2, .token = 1ull << 40 };
	struct dm_wire_q_result r = { .qid = 4, .n = 2 };
	struct dm_wire_q_hit hit = { .id = 17, .dist = 0.5f };
	uint32_t ilen = DM_WIRE_HDR_LEN + sizeof(r) + 2 * sizeof(hit), len = DM_FWD_INNER_OFF + ilen;

	dm_wire_hdr_encode(b, DM_OP_FWD_RESULT, len, 0, 4);
	dm_wire_fwd_encode(b + DM_WIRE_HDR_LEN, &f);
	dm_wire_hdr_encode(b + DM_FWD_INNER_OFF, DM_OP_Q_SEARCH + 1, ilen, 0, 4);
	dm_wire_q_result_encode(b + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN, &r);
	for (int i = 0; i < 2; i++)
		dm_wire_q_hit_encode(b + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN + sizeof(r) + 16 * i, &hit);
	cr_assert_eq(check(b, len), 0);
	/* n says 3 hits but 2 are there. */
	r.n = 3;
	dm_wire_q_result_encode(b + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN, &r);
	cr_assert_eq(check(b, len), -EBADMSG);
}

Test(wire_fwd, state_table_router)
{
	uint8_t b[1024];
	struct dm_wire_fwd_state s = { .cn = 2, .epoch = 1, .qlen = 40, .nsample = 3, .entries = 200,
				       .next = 2, .flags = DM_FWD_S_READY | DM_FWD_S_PREPARED |
						DM_FWD_S_RESEED },
				 s2;
	struct dm_wire_fwd_entry e = { .cn = 1, .qlen = 3, .age_ms = 20, .epoch = 4, .next = 5,
				       .flags = DM_FWD_S_READY }, e2;
	struct dm_wire_fwd_table t = { .n = 2, .epoch = 1, .csp_ppm = 250000, .csp_cns = 2 }, t2;
	struct dm_wire_fwd_rcfg c = { .set = 1, .strategy = DM_ROUTE_ADAPTIVE_RING, .batch = 100,
				      .spill_cache = DM_FWD_SPILL_YES }, c2;
	struct dm_wire_fwd_rstats st = { .strategy = DM_ROUTE_BESTFIT, .k = 4,
					 .centroid_hash = 0x1234567890abcdefull,
					 .csp_ppm = DM_FWD_CSP_NONE, .paused = 7,
					 .spill_cache = 1 }, st2;
	uint32_t len;

	len = DM_WIRE_HDR_LEN + sizeof(s) + 12;
	dm_wire_hdr_encode(b, DM_OP_FWD_STATE, len, 0, 1);
	dm_wire_fwd_state_encode(b + DM_WIRE_HDR_LEN, &s);
	cr_assert_eq(check(b, len), 0);
	cr_assert_eq(check(b, len - 4), -EBADMSG, "nsample disagrees with the length");
	cr_assert_eq(dm_wire_fwd_state_decode(b + DM_WIRE_HDR_LEN, sizeof(s), &s2), 0);
	cr_assert_eq(memcmp(&s, &s2, sizeof(s)), 0);
	s.next = 0;                     /* rolling out an epoch before the one it runs */
	dm_wire_fwd_state_encode(b + DM_WIRE_HDR_LEN, &s);
	cr_assert_eq(dm_wire_fwd_state_decode(b + DM_WIRE_HDR_LEN, sizeof(s), &s2), -EBADMSG);
	s.next = 1;
	s.flags = 8;                    /* unknown flag */
	dm_wire_fwd_state_encode(b + DM_WIRE_HDR_LEN, &s);
	cr_assert_eq(dm_wire_fwd_state_decode(b + DM_WIRE_HDR_LEN, sizeof(s), &s2), -EBADMSG);
	s.flags = DM_FWD_S_READY;
	s.entries = DM_FWD_NO_SAMPLE;   /* a queue-length-only report carries no ids */
	dm_wire_fwd_state_encode(b + DM_WIRE_HDR_LEN, &s);
	cr_assert_eq(dm_wire_fwd_state_decode(b + DM_WIRE_HDR_LEN, sizeof(s), &s2), -EBADMSG);
	s.nsample = 0;
	dm_wire_fwd_state_encode(b + DM_WIRE_HDR_LEN, &s);
	cr_assert_eq(dm_wire_fwd_state_decode(b + DM_WIRE_HDR_LEN, sizeof(s), &s2), 0);
	s.entries = 200;
	s.nsample = DM_FWD_MAX_SAMPLE + 1;
	dm_wire_fwd_state_encode(b + DM_WIRE_HDR_LEN, &s);
	cr_assert_eq(dm_wire_fwd_state_decode(b + DM_WIRE_HDR_LEN, sizeof(s), &s2), -EBADMSG);

	len = DM_WIRE_HDR_LEN + sizeof(t) + 2 * sizeof(struct dm_wire_fwd_entry);
	dm_wire_hdr_encode(b, DM_OP_FWD_STATE + 1, len, 0, 1);
	dm_wire_fwd_table_encode(b + DM_WIRE_HDR_LEN, &t);
	cr_assert_eq(check(b, len), 0);
	cr_assert_eq(dm_wire_fwd_table_decode(b + DM_WIRE_HDR_LEN, sizeof(t), &t2), 0);
	cr_assert_eq(memcmp(&t, &t2, sizeof(t)), 0);
	dm_wire_fwd_entry_encode(b, &e);
	cr_assert_eq(dm_wire_fwd_entry_decode(b, sizeof(e), &e2), 0);
	cr_assert_eq(memcmp(&e, &e2, sizeof(e)), 0);
	cr_assert_eq(dm_wire_fwd_entry_decode(b, sizeof(e) - 1, &e2), -EBADMSG);
	e.next = 3;
	dm_wire_fwd_entry_encode(b, &e);
	cr_assert_eq(dm_wire_fwd_entry_decode(b, sizeof(e), &e2), -EBADMSG, "next below epoch");
	e.next = 4;
	e.flags = DM_FWD_S_READY | DM_FWD_S_RESEED;
	dm_wire_fwd_entry_encode(b, &e);
	cr_assert_eq(dm_wire_fwd_entry_decode(b, sizeof(e), &e2), 0);
	cr_assert_eq(e2.flags, DM_FWD_S_READY | DM_FWD_S_RESEED);
	e.flags = 8;
	dm_wire_fwd_entry_encode(b, &e);
	cr_assert_eq(dm_wire_fwd_entry_decode(b, sizeof(e), &e2), -EBADMSG, "unknown flag");
	dm_wire_hdr_encode(b, DM_OP_FWD_STATE + 1, len, 0, 1);
	dm_wire_fwd_table_encode(b + DM_WIRE_HDR_LEN, &t);
	t.csp_ppm = 1000001;
	dm_wire_fwd_table_encode(b + DM_WIRE_HDR_LEN, &t);
	cr_assert_eq(check(b, len), -EBADMSG);

	len = DM_WIRE_HDR_LEN + sizeof(c);
	dm_wire_hdr_encode(b, DM_OP_FWD_ROUTER, len, 0, 1);
	dm_wire_fwd_rcfg_encode(b + DM_WIRE_HDR_LEN, &c);
	cr_assert_eq(check(b, len), 0);
	cr_assert_eq(dm_wire_fwd_rcfg_decode(b + DM_WIRE_HDR_LEN, sizeof(c), &c2), 0);
	cr_assert_eq(memcmp(&c, &c2, sizeof(c)), 0);
	c.strategy = DM_ROUTE_COUNT;
	dm_wire_fwd_rcfg_encode(b + DM_WIRE_HDR_LEN, &c);
	cr_assert_eq(dm_wire_fwd_rcfg_decode(b + DM_WIRE_HDR_LEN, sizeof(c), &c2), -EBADMSG);
	c.strategy = DM_ROUTE_NONE;
	c.spill_cache = DM_FWD_SPILL_YES + 1;
	dm_wire_fwd_rcfg_encode(b + DM_WIRE_HDR_LEN, &c);
	cr_assert_eq(dm_wire_fwd_rcfg_decode(b + DM_WIRE_HDR_LEN, sizeof(c), &c2), -EBADMSG,
		     "unknown spill_cache value");
	c.spill_cache = DM_FWD_SPILL_NO;
	c.refresh = 7;   /* dmann route refresh: the epoch to move to */
	dm_wire_fwd_rcfg_encode(b + DM_WIRE_HDR_LEN, &c);
	cr_assert_eq(dm_get_le32(b + DM_WIRE_HDR_LEN + 20), 7);
	cr_assert_eq(dm_wire_fwd_rcfg_decode(b + DM_WIRE_HDR_LEN, sizeof(c), &c2), 0);
	cr_assert_eq(c2.refresh, 7);
	cr_assert_eq(dm_wire_fwd_rcfg_decode(b + DM_WIRE_HDR_LEN, sizeof(c) - 1, &c2), -EBADMSG,
		     "short message");

	dm_wire_fwd_rstats_encode(b, &st);
	cr_assert_eq(dm_wire_fwd_rstats_decode(b, sizeof(st), &st2), 0);
	cr_assert_eq(memcmp(&st, &st2, sizeof(st)), 0);
	st.epoch = 3;
	st.next_epoch = 4;
	st.rollout = DM_FWD_ROLLOUT_PREPARED;
	dm_wire_fwd_rstats_encode(b, &st);
	cr_assert_eq(dm_wire_fwd_rstats_decode(b, sizeof(st), &st2), 0);
	cr_assert_eq(memcmp(&st, &st2, sizeof(st)), 0);
	st.rollout = DM_FWD_ROLLOUT_COUNT;
	dm_wire_fwd_rstats_encode(b, &st);
	cr_assert_eq(dm_wire_fwd_rstats_decode(b, sizeof(st), &st2), -EBADMSG, "unknown rollout");
	st.rollout = DM_FWD_ROLLOUT_IDLE;
	st.next_epoch = 2;
	dm_wire_fwd_rstats_encode(b, &st);
	cr_assert_eq(dm_wire_fwd_rstats_decode(b, sizeof(st), &st2), -EBADMSG,
		     "next epoch below the epoch");

	dm_wire_hdr_encode(b, 0x2ffe, DM_WIRE_HDR_LEN, 0, 1);
	cr_assert_eq(check(b, DM_WIRE_HDR_LEN), -EPROTO, "unknown op");
}

Test(wire_fwd, route_names)
{
	for (int i = 0; i < DM_ROUTE_COUNT; i++)
		cr_assert_eq(dm_route_parse(dm_route_name((uint32_t)i)), i);
	cr_assert_eq(dm_route_parse("fastest"), -EINVAL);
}

/* [router] keys: defaults, values, and a clear error naming the line for each bad value. */
Test(wire_fwd, router_config_keys)
{
	char dir[64] = "/tmp/dmann-rcfg-XXXXXX", p[128], err[512] = "", text[1024];
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	const char *hdr = "[cluster]\nname = x\nsecret_file = secret\n[mn.0]\naddress = h:1\n";
	static const char *const bad[][2] = {
		{ "strategy = fastest", "strategy 'fastest'" }, { "batch = 0", "batch '0'" },
		{ "pause_queue = 2000000", "pause_queue" }, { "exchange_ms = 5", "exchange_ms" },
		{ "recluster_csp = 1.5", "recluster_csp" }, { "recluster_csp = nan", "recluster_csp" },
		{ "recluster_secs = -1", "recluster_secs" }, { "sample_min_nodes = 0", "sample_min" },
		{ "colour = blue", "unknown key 'colour'" }, { "spill_cache = maybe", "spill_cache" },
		{ "recluster_mass = 101", "recluster_mass" }, { "recluster_mass = -0.1", "recluster_mass" },
		{ "recluster_mass = x", "recluster_mass" }, { "csp_slice = 0", "csp_slice" },
		{ "csp_slice = 3", "csp_slice" }, { "csp_slice = 128", "csp_slice" },
	};
	FILE *f;

	cr_assert_not_null(mkdtemp(dir));
	snprintf(p, sizeof(p), "%s/secret", dir);
	f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs("0123456789abcdef0123456789abcdef\n", f);
	fclose(f);
	cr_assert_eq(dm_config_parse(hdr, "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c->router.strategy, DM_ROUTE_NONE);
	cr_assert_eq(c->router.batch, 1000);
	cr_assert_eq(c->router.pause_queue, 1000);
	cr_assert_float_eq(c->router.recluster_csp, 0.5, 1e-12);
	cr_assert_float_eq(c->router.recluster_mass, 0.5, 1e-12);
	cr_assert_eq(c->router.csp_slice, 64);
	cr_assert_not(c->router.spill_cache, "spilled queries do not fill the cache by default");
	snprintf(text, sizeof(text), "%s[router]\nstrategy = adaptive-ring\nbatch = 500\n"
		 "recluster_csp = 0.4\nrecluster_secs = 0\nexchange_ms = 50\nspill_cache = yes\n"
		 "recluster_mass = 0.25\ncsp_slice = 4\n",
		 hdr);
	cr_assert_eq(dm_config_parse(text, "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c->router.strategy, DM_ROUTE_ADAPTIVE_RING);
	cr_assert_eq(c->router.batch, 500);
	cr_assert_eq(c->router.recluster_secs, 0);
	cr_assert_eq(c->router.exchange_ms, 50);
	cr_assert_float_eq(c->router.recluster_csp, 0.4, 1e-12);
	cr_assert_float_eq(c->router.recluster_mass, 0.25, 1e-12);
	cr_assert_eq(c->router.csp_slice, 4);
	cr_assert(c->router.spill_cache);
	for (size_t i = 0; i < DM_ARRAY_SIZE(bad); i++) {
		snprintf(text, sizeof(text), "%s[router]\n%s\n", hdr, bad[i][0]);
		cr_assert_lt(dm_config_parse(text, "c.ini", dir, c, err, sizeof(err)), 0,
			     "accepted %s", bad[i][0]);
		cr_assert_not_null(strstr(err, bad[i][1]), "'%s' lacks '%s'", err, bad[i][1]);
		cr_assert_not_null(strstr(err, "c.ini:7"), "'%s' lacks the line", err);
	}
	snprintf(p, sizeof(p), "rm -rf %s", dir);
	cr_assert_eq(system(p), 0);
	free(c);
}
