/* test_mn_store.c: memory-node objects: allocate, commit with checksum, lookup, drop and
 * hole reuse, snapshot round trip, corrupted and truncated snapshots refused; index
 * generations (publish, report, list, drop of a graph) and their messages. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "mn_store.h"

static void fill(struct mn_store *st, uint64_t off, size_t len, unsigned seed)
{
	unsigned char *p = (unsigned char *)st->region.addr + off;

	for (size_t i = 0; i < len; i++)
		p[i] = (unsigned char)(seed * 131 + i * 7);
}

static uint32_t crc_of(struct mn_store *st, uint64_t off, size_t len)
{
	return (uint32_t)crc32_z(0, (const Bytef *)st->region.addr + off, len);
}

Test(mn_store, alloc_commit_lookup)
{
	struct mn_store *st = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	struct mn_obj o;
	uint64_t off, off2;

	cr_assert_not_null(st);
	cr_assert_eq(mn_store_alloc(st, 7, 1000, &off), 0);
	cr_assert_eq(off % MN_OBJ_ALIGN, 0);
	fill(st, off, 1000, 1);
	cr_assert_eq(mn_store_lookup(st, 7, &o), -ENOENT, "uncommitted objects are invisible");
	cr_assert_eq(mn_store_commit(st, 7, 1000, crc_of(st, off, 1000) ^ 1, 0), -EBADMSG);
	cr_assert_eq(mn_store_commit(st, 7, 1000, crc_of(st, off, 1000), 0), 0);
	cr_assert_eq(mn_store_lookup(st, 7, &o), 0);
	cr_assert_eq(o.off, off);
	cr_assert_eq(o.len, 1000);
	cr_assert_eq(mn_store_alloc(st, 7, 10, &off2), -EEXIST);
	cr_assert_eq(mn_store_alloc(st, 8, 2 << 20, &off2), -ENOSPC);
	cr_assert_eq(mn_store_alloc(st, 8, 0, &off2), -EINVAL);
	cr_assert_eq(mn_store_commit(st, 99, 10, 0, 0), -ENOENT);
	mn_store_free(st);
}

Test(mn_store, drop_and_reuse)
{
	struct mn_store *st = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	uint64_t a, b, c, d;
	uint32_t n;
	uint64_t bytes;

	cr_assert_eq(mn_store_alloc(st, 0x100, 4096, &a), 0);
	cr_assert_eq(mn_store_alloc(st, 0x101, 4096, &b), 0);
	cr_assert_eq(mn_store_alloc(st, 0x200, 4096, &c), 0);
	fill(st, a, 4096, 1);
	fill(st, b, 4096, 2);
	fill(st, c, 4096, 3);
	cr_assert_eq(mn_store_commit(st, 0x100, 4096, crc_of(st, a, 4096), 0), 0);
	cr_assert_eq(mn_store_commit(st, 0x101, 4096, crc_of(st, b, 4096), 0), 0);
	cr_assert_eq(mn_store_commit(st, 0x200, 4096, crc_of(st, c, 4096), 0), 0);
	mn_store_stats(st, &n, &bytes);
	cr_assert_eq(n, 3);
	cr_assert_eq(bytes, 3 * 4096);
	cr_assert_eq(mn_store_drop(st, 0x100, ~0xffull), 2);
	cr_assert_eq(mn_store_alloc(st, 0x300, 4000, &d), 0);
	cr_assert(d == a || d == b, "a freed hole is reused");
	mn_store_free(st);
}

Test(mn_store, snapshot_round_trip_and_corruption)
{
	struct mn_store *st = mn_store_new(1 << 20, -1, DM_HUGE_OFF), *st2;
	char path[] = "/tmp/dmann-snap-XXXXXX", err[256];
	struct mn_obj o;
	uint64_t off[5];
	FILE *f;
	long sz;
	int fd = mkstemp(path);

	cr_assert_geq(fd, 0);
	close(fd);
	for (unsigned i = 0; i < 5; i++) {
		size_t len = 100 + i * 1000;

		cr_assert_eq(mn_store_alloc(st, i, len, &off[i]), 0);
		fill(st, off[i], len, i);
		cr_assert_eq(mn_store_commit(st, i, len, crc_of(st, off[i], len), 0), 0);
	}
	cr_assert_eq(mn_store_snapshot(st, path), 0);

	st2 = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	cr_assert_eq(mn_store_restore(st2, path, err, sizeof(err)), 0, "%s", err);
	for (unsigned i = 0; i < 5; i++) {
		cr_assert_eq(mn_store_lookup(st2, i, &o), 0);
		cr_assert_eq(o.off, off[i]);
		cr_assert_eq(memcmp((char *)st2->region.addr + o.off, (char *)st->region.addr + off[i],
				    o.len), 0);
	}
	mn_store_free(st2);

	/* Flip one data byte: refused with a message. */
	f = fopen(path, "r+b");
	fseek(f, 0, SEEK_END);
	sz = ftell(f);
	fseek(f, sz - 10, SEEK_SET);
	fputc(0x5a ^ fgetc(f), f);
	fclose(f);
	st2 = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	cr_assert_eq(mn_store_restore(st2, path, err, sizeof(err)), -EBADMSG);
	cr_assert_not_null(strstr(err, "checksum mismatch"), "%s", err);
	mn_store_free(st2);

	/* Truncate: refused. */
	cr_assert_eq(truncate(path, sz - 500), 0);
	st2 = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	cr_assert_eq(mn_store_restore(st2, path, err, sizeof(err)), -EBADMSG);
	cr_assert_not_null(strstr(err, "truncated"), "%s", err);
	mn_store_free(st2);

	/* Too small a region: refused, not overflowed. */
	st2 = mn_store_new(4096, -1, DM_HUGE_OFF);
	cr_assert_eq(mn_store_snapshot(st, path), 0);
	cr_assert_eq(mn_store_restore(st2, path, err, sizeof(err)), -ENOSPC);
	mn_store_free(st2);

	cr_assert_eq(mn_store_restore(st, "/nonexistent/snap", err, sizeof(err)), -ENOENT);
	unlink(path);
	mn_store_free(st);
}

/* Put a committed object of len bytes under key. */
static void put(struct mn_store *st, uint64_t key, size_t len)
{
	uint64_t off;

	cr_assert_eq(mn_store_alloc(st, key, len, &off), 0);
	fill(st, off, len, (unsigned)key);
	cr_assert_eq(mn_store_commit(st, key, len, crc_of(st, off, len), 0), 0);
}

/* One generation: metadata + two blocks. */
static void put_gen(struct mn_store *st, uint64_t gen)
{
	put(st, dm_gen_meta_key(0, gen), 200);
	put(st, dm_gen_block_key(0, gen, 0), 4096);
	put(st, dm_gen_block_key(0, gen, 1), 4096);
}

static bool has(struct mn_store *st, uint64_t key)
{
	struct mn_obj o;

	return mn_store_lookup(st, key, &o) == 0;
}

/* Index generations: publish retires the previous one, which stays until every compute
 * node reported a newer one or went silent for the lease; a snapshot keeps them apart. */
Test(mn_store, generations)
{
	struct mn_store *st = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	struct mn_gen_state gs;
	char path[] = "/tmp/dmann-gen-XXXXXX", err[256];
	int fd = mkstemp(path);

	cr_assert_not_null(st);
	cr_assert_geq(fd, 0);
	close(fd);
	mn_store_gen_setup(st, 2, 1000);
	cr_assert_eq(mn_store_gen_report(st, 0, DM_GEN_NO_CN, 0, &gs), 0);
	cr_assert(!gs.has_current && !gs.has_retired);
	cr_assert_eq(mn_store_gen_publish(st, 0, 1, &gs), -ENOENT, "no metadata yet");
	put_gen(st, 1);
	cr_assert_eq(mn_store_gen_publish(st, 0, 1, &gs), 0);
	cr_assert(gs.has_current && gs.current == 1 && !gs.has_retired);
	cr_assert_eq(mn_store_gen_publish(st, 0, 1, &gs), 0, "publishing twice is harmless");
	/* Both CNs use 1; generation 2 is written beside it and published. */
	cr_assert_eq(mn_store_gen_report(st, 0, 0, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_report(st, 0, 1, 1, &gs), 0);
	put_gen(st, 2);
	cr_assert_neq(dm_gen_block_key(0, 1, 0), dm_gen_block_key(0, 2, 0));
	cr_assert_eq(mn_store_gen_publish(st, 0, 2, &gs), 0);
	cr_assert(gs.current == 2 && gs.has_retired && gs.retired == 1 && gs.waiting == 2);
	cr_assert_eq(mn_store_gen_publish(st, 0, 1, &gs), -ESTALE);
	put(st, dm_gen_meta_key(0, 3), 200);
	cr_assert_eq(mn_store_gen_publish(st, 0, 3, &gs), -EBUSY, "1 is still held");
	cr_assert_eq(mn_store_drop(st, dm_gen_meta_key(0, 3), ~0ull), 1);   /* as the loader does */
	cr_assert(has(st, dm_gen_block_key(0, 1, 1)));
	/* CN 0 moves on; CN 1 still reads 1: nothing is freed. */
	cr_assert_eq(mn_store_gen_report(st, 0, 0, 2, &gs), 0);
	cr_assert(gs.has_retired && gs.waiting == 1 && gs.freed == 0);
	cr_assert(has(st, dm_gen_meta_key(0, 1)) && has(st, dm_gen_block_key(0, 1, 0)));
	/* A snapshot now: the restored store knows 2 is current and 1 retired. */
	cr_assert_eq(mn_store_snapshot(st, path), 0);
	cr_assert_eq(mn_store_gen_report(st, 0, 1, 2, &gs), 0);
	cr_assert(!gs.has_retired && gs.freed == 3, "freed %u", gs.freed);
	cr_assert(!has(st, dm_gen_meta_key(0, 1)) && !has(st, dm_gen_block_key(0, 1, 0)) &&
		  !has(st, dm_gen_block_key(0, 1, 1)));
	cr_assert(has(st, dm_gen_meta_key(0, 2)) && has(st, dm_gen_block_key(0, 2, 1)));
	mn_store_free(st);

	st = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	cr_assert_eq(mn_store_restore(st, path, err, sizeof(err)), 0, "%s", err);
	mn_store_gen_setup(st, 2, 1000);
	cr_assert_eq(mn_store_gen_report(st, 0, DM_GEN_NO_CN, 0, &gs), 0);
	cr_assert(gs.has_current && gs.current == 2 && gs.has_retired && gs.retired == 1 &&
		  gs.waiting == 2, "reports start empty after a restart");
	/* CN 0 reports; CN 1 stays silent: after the lease, 1 is released anyway. */
	cr_assert_eq(mn_store_gen_report(st, 0, 0, 2, &gs), 0);
	cr_assert(gs.has_retired && gs.waiting == 1);
	usleep(1100000);
	mn_store_gen_tick(st);
	cr_assert_eq(mn_store_gen_report(st, 0, DM_GEN_NO_CN, 0, &gs), 0);
	cr_assert(!gs.has_retired);
	cr_assert(!has(st, dm_gen_block_key(0, 1, 0)) && has(st, dm_gen_block_key(0, 2, 0)));
	/* Generation 0 is an index loaded before generations: its old keys. */
	cr_assert_eq(dm_gen_meta_key(0, 0), (1ull << 56));
	cr_assert_eq(dm_gen_block_key(0, 0, 5), (2ull << 56) | 5);
	cr_assert_eq(mn_store_gen_report(st, 0, 300, 0, &gs), -EINVAL);
	mn_store_free(st);
	unlink(path);
}

/* The generation messages: round trip, and the decoders refuse what cannot be. */
Test(mn_store, generation_messages)
{
	struct dm_wire_ctl_gen g = { .gen = 0x123456789ull, .index = 7, .cn = 3 }, g2;
	struct dm_wire_ctl_gen_state st = { .current = 9, .retired = 8, .waiting = 2,
					    .lease_ms = 20000,
					    .flags = DM_GEN_F_CURRENT | DM_GEN_F_RETIRED }, st2;
	uint8_t b[32];

	dm_wire_ctl_gen_encode(b, &g);
	cr_assert_eq(dm_wire_ctl_gen_decode(b, sizeof(g), &g2), 0);
	cr_assert(g2.gen == g.gen && g2.index == 7 && g2.cn == 3);
	cr_assert_eq(dm_wire_ctl_gen_decode(b, sizeof(g) - 1, &g2), -EBADMSG);
	g.cn = 256;
	dm_wire_ctl_gen_encode(b, &g);
	cr_assert_eq(dm_wire_ctl_gen_decode(b, sizeof(g), &g2), -EBADMSG);
	g.cn = DM_GEN_NO_CN;
	g.index = DM_GEN_MAX_INDEX + 1;
	dm_wire_ctl_gen_encode(b, &g);
	cr_assert_eq(dm_wire_ctl_gen_decode(b, sizeof(g), &g2), -EBADMSG);

	dm_wire_ctl_gen_state_encode(b, &st);
	cr_assert_eq(dm_wire_ctl_gen_state_decode(b, sizeof(st), &st2), 0);
	cr_assert(st2.current == 9 && st2.retired == 8 && st2.waiting == 2 &&
		  st2.lease_ms == 20000 && st2.flags == st.flags);
	st.retired = 9;   /* retired must be older than current */
	dm_wire_ctl_gen_state_encode(b, &st);
	cr_assert_eq(dm_wire_ctl_gen_state_decode(b, sizeof(st), &st2), -EBADMSG);
	st = (struct dm_wire_ctl_gen_state){ .waiting = 1 };   /* waiting without retired */
	dm_wire_ctl_gen_state_encode(b, &st);
	cr_assert_eq(dm_wire_ctl_gen_state_decode(b, sizeof(st), &st2), -EBADMSG);
	st = (struct dm_wire_ctl_gen_state){ .flags = 4 };
	dm_wire_ctl_gen_state_encode(b, &st);
	cr_assert_eq(dm_wire_ctl_gen_state_decode(b, sizeof(st), &st2), -EBADMSG);
	/* retired without current: a dropped graph whose blocks are still held */
	st = (struct dm_wire_ctl_gen_state){ .flags = DM_GEN_F_RETIRED, .retired = 4, .waiting = 1 };
	dm_wire_ctl_gen_state_encode(b, &st);
	cr_assert_eq(dm_wire_ctl_gen_state_decode(b, sizeof(st), &st2), 0);
	cr_assert(st2.flags == DM_GEN_F_RETIRED && st2.retired == 4 && st2.waiting == 1);
	cr_assert_eq(dm_wire_ctl_body_len(DM_OP_CTL_GEN_REPORT, 0), (int)sizeof(g));
	cr_assert_eq(dm_wire_ctl_body_len(DM_OP_CTL_GEN_PUBLISH + 1, 0), (int)sizeof(st));
	cr_assert_eq(dm_wire_ctl_body_len(DM_OP_CTL_GEN_REPORT + 1, -EBUSY), 0);
}

/* One generation of graph `index`: metadata + two blocks. */
static void put_gen_of(struct mn_store *st, uint32_t index, uint64_t gen)
{
	put(st, dm_gen_meta_key(index, gen), 200);
	put(st, dm_gen_block_key(index, gen, 0), 4096);
	put(st, dm_gen_block_key(index, gen, 1), 4096);
}

/* The entry of index in a list, or NULL. */
static const struct mn_gen_entry *entry_of(const struct mn_gen_entry *e, uint32_t n,
					   uint32_t index)
{
	for (uint32_t i = 0; i < n; i++)
		if (e[i].index == index)
			return &e[i];
	return NULL;
}

/* GEN_LIST: one entry per used table entry, after publishes of graphs 0 and 3. */
Test(mn_store, gen_list)
{
	struct mn_store *st = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	struct mn_gen_entry e[MN_MAX_GEN_INDEXES];
	const struct mn_gen_entry *x;
	struct mn_gen_state gs;
	uint32_t n;

	cr_assert_not_null(st);
	mn_store_gen_setup(st, 1, 1000);
	cr_assert_eq(mn_store_gen_list(st, e, MN_MAX_GEN_INDEXES), 0);
	put_gen_of(st, 0, 1);
	put_gen_of(st, 3, 1);
	cr_assert_eq(mn_store_gen_publish(st, 0, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_publish(st, 3, 1, &gs), 0);
	put_gen_of(st, 3, 2);
	cr_assert_eq(mn_store_gen_report(st, 3, 0, 1, &gs), 0);   /* CN 0 reads 1 of graph 3 */
	cr_assert_eq(mn_store_gen_publish(st, 3, 2, &gs), 0);
	n = mn_store_gen_list(st, e, MN_MAX_GEN_INDEXES);
	cr_assert_eq(n, 2);
	x = entry_of(e, n, 0);
	cr_assert(x && x->has_current && x->current == 1 && !x->has_retired && !x->retired);
	x = entry_of(e, n, 3);
	cr_assert(x && x->has_current && x->current == 2 && x->has_retired && x->retired == 1);
	cr_assert_eq(mn_store_gen_list(st, e, 1), 1, "at most cap entries");
	/* A read-only report of an unknown graph creates nothing. */
	cr_assert_eq(mn_store_gen_report(st, 5, DM_GEN_NO_CN, 0, &gs), 0);
	cr_assert_eq(mn_store_gen_list(st, e, MN_MAX_GEN_INDEXES), 2);
	mn_store_free(st);
}

/* GEN_DROP: the metadata goes at once, the blocks once every CN reported DM_GEN_NONE or a
 * newer generation (or its lease ran out); then the entry is free, a new load of the same
 * graph starts again, and a restore drops a dropped graph's leftover blocks. */
Test(mn_store, gen_drop)
{
	struct mn_store *st = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	struct mn_gen_entry e[MN_MAX_GEN_INDEXES];
	struct mn_gen_state gs;
	char path[] = "/tmp/dmann-gdrop-XXXXXX", err[256];
	int fd = mkstemp(path);

	cr_assert_not_null(st);
	cr_assert_geq(fd, 0);
	close(fd);
	mn_store_gen_setup(st, 2, 1000);
	cr_assert_eq(mn_store_gen_drop(st, 2, 1, &gs), -ENOENT, "no such graph");
	put_gen_of(st, 2, 1);
	put_gen_of(st, 0, 1);
	cr_assert_eq(mn_store_gen_publish(st, 2, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_publish(st, 0, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_report(st, 2, 0, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_report(st, 2, 1, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_drop(st, 2, 2, &gs), -ESTALE, "not the current generation");
	cr_assert_eq(mn_store_gen_drop(st, 2, 1, &gs), 0);
	cr_assert(!gs.has_current && gs.has_retired && gs.retired == 1 && gs.waiting == 2);
	cr_assert(!has(st, dm_gen_meta_key(2, 1)), "metadata dropped at once");
	cr_assert(has(st, dm_gen_block_key(2, 1, 0)) && has(st, dm_gen_block_key(2, 1, 1)),
		  "blocks held while CNs read them");
	cr_assert_eq(mn_store_gen_drop(st, 2, 1, &gs), 0, "dropping twice is harmless");
	cr_assert_eq(mn_store_gen_publish(st, 2, 1, &gs), -ENOENT, "its metadata is gone");
	/* A snapshot now: restored, the graph's blocks have no metadata and are dropped. */
	cr_assert_eq(mn_store_snapshot(st, path), 0);
	/* CN 0 reads nothing of it any more; CN 1 still does. */
	cr_assert_eq(mn_store_gen_report(st, 2, 0, DM_GEN_NONE, &gs), 0);
	cr_assert(gs.has_retired && gs.waiting == 1 && !gs.freed);
	cr_assert(has(st, dm_gen_block_key(2, 1, 0)));
	cr_assert_eq(mn_store_gen_report(st, 2, 1, DM_GEN_NONE, &gs), 0);
	cr_assert(!gs.has_current && !gs.has_retired && gs.freed == 2, "freed %u", gs.freed);
	cr_assert(!has(st, dm_gen_block_key(2, 1, 0)) && !has(st, dm_gen_block_key(2, 1, 1)));
	cr_assert(has(st, dm_gen_meta_key(0, 1)) && has(st, dm_gen_block_key(0, 1, 0)),
		  "graph 0 untouched");
	/* The entry is free again (CN 1's report of DM_GEN_NONE above made the last one). */
	cr_assert_eq(mn_store_gen_drop(st, 2, 1, &gs), -ENOENT, "released: gone");
	uint32_t n = mn_store_gen_list(st, e, MN_MAX_GEN_INDEXES);

	cr_assert_eq(n, 1);
	cr_assert_eq(e[0].index, 0);
	/* A new load of graph 2 starts again at generation 1 (same block keys as before). */
	put_gen_of(st, 2, 1);
	cr_assert_eq(mn_store_gen_publish(st, 2, 1, &gs), 0);
	cr_assert(gs.has_current && gs.current == 1 && !gs.has_retired);
	/* A drop released by the lease: CNs silent for lease_ms. */
	cr_assert_eq(mn_store_gen_report(st, 2, 0, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_drop(st, 2, 1, &gs), 0);
	cr_assert(gs.has_retired && gs.waiting == 2, "CN 1 silent since the setup: %u",
		  gs.waiting);
	cr_assert_eq(mn_store_gen_publish(st, 2, 3, &gs), -ENOENT);
	usleep(1100000);
	mn_store_gen_tick(st);
	cr_assert(!has(st, dm_gen_block_key(2, 1, 0)));
	cr_assert_eq(mn_store_gen_list(st, e, MN_MAX_GEN_INDEXES), 1);
	/* While an older retired generation is held, a drop waits (-EBUSY). */
	put_gen_of(st, 0, 2);
	cr_assert_eq(mn_store_gen_report(st, 0, 0, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_report(st, 0, 1, 1, &gs), 0);
	cr_assert_eq(mn_store_gen_publish(st, 0, 2, &gs), 0);
	cr_assert(gs.has_retired && gs.retired == 1);
	cr_assert_eq(mn_store_gen_drop(st, 0, 2, &gs), -EBUSY);
	cr_assert(has(st, dm_gen_meta_key(0, 2)));
	mn_store_free(st);

	/* Restore of the snapshot taken after the drop: graph 2's blocks are leftovers. */
	st = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	cr_assert_eq(mn_store_restore(st, path, err, sizeof(err)), 0, "%s", err);
	mn_store_gen_setup(st, 2, 1000);
	cr_assert(!has(st, dm_gen_block_key(2, 1, 0)) && !has(st, dm_gen_block_key(2, 1, 1)));
	cr_assert(has(st, dm_gen_meta_key(0, 1)) && has(st, dm_gen_block_key(0, 1, 1)));
	n = mn_store_gen_list(st, e, MN_MAX_GEN_INDEXES);
	cr_assert_eq(n, 1);
	cr_assert(e[0].index == 0 && e[0].has_current && e[0].current == 1);
	mn_store_free(st);
	unlink(path);
}

/* CTL_GEN_LIST's answer: round trip; bad lengths, counts and entries refused. */
Test(mn_store, gen_list_message)
{
	struct dm_wire_ctl_gen_list l = { .count = 2 }, l2;
	uint8_t b[DM_WIRE_CTL_GEN_LIST_MAX + 24];
	struct dm_wire_hdr h = { .op = DM_OP_CTL_GEN_LIST + 1 };
	size_t n;

	l.e[0] = (struct dm_wire_ctl_gen_entry){ .index = 0, .flags = DM_GEN_F_CURRENT,
						 .current = 7 };
	l.e[1] = (struct dm_wire_ctl_gen_entry){ .index = 3, .flags = DM_GEN_F_RETIRED,
						 .retired = 0x100000002ull };
	n = dm_wire_ctl_gen_list_encode(b, &l);
	cr_assert_eq(n, 8 + 2 * 24);
	cr_assert_eq(dm_wire_ctl_gen_list_decode(b, n, &l2), 0);
	cr_assert_eq(l2.count, 2);
	cr_assert_eq(memcmp(l2.e, l.e, 2 * sizeof(l.e[0])), 0);
	cr_assert_eq(dm_wire_ctl_gen_list_decode(b, n - 1, &l2), -EBADMSG, "short");
	cr_assert_eq(dm_wire_ctl_gen_list_decode(b, n + 1, &l2), -EBADMSG, "long");
	cr_assert_eq(dm_wire_ctl_gen_list_decode(b, 7, &l2), -EBADMSG, "no count");
	dm_put_le32(b + 4, 1);
	cr_assert_eq(dm_wire_ctl_gen_list_decode(b, n, &l2), -EBADMSG, "reserved");
	dm_put_le32(b + 4, 0);
	dm_put_le32(b, DM_MAX_GRAPHS + 1);
	memset(b + n, 0, sizeof(b) - n);
	cr_assert_eq(dm_wire_ctl_gen_list_decode(b, 8 + (DM_MAX_GRAPHS + 1) * 24, &l2), -EBADMSG,
		     "too many entries");
	/* Bad entries. */
	struct dm_wire_ctl_gen_entry bad[] = {
		{ .index = DM_GEN_MAX_INDEX + 1, .flags = DM_GEN_F_CURRENT, .current = 1 },
		{ .index = 1, .flags = 4 },
		{ .index = 1, .current = 3 },                    /* current without the flag */
		{ .index = 1, .flags = DM_GEN_F_CURRENT, .retired = 3, .current = 4 },
		{ .index = 1, .flags = DM_GEN_F_CURRENT | DM_GEN_F_RETIRED, .current = 3,
		  .retired = 3 },
		{ .index = 0, .flags = DM_GEN_F_CURRENT, .current = 1 },   /* index 0 twice */
	};
	for (size_t i = 0; i < DM_ARRAY_SIZE(bad); i++) {
		l.e[1] = bad[i];
		n = dm_wire_ctl_gen_list_encode(b, &l);
		cr_assert_eq(dm_wire_ctl_gen_list_decode(b, n, &l2), -EBADMSG, "entry %zu", i);
	}
	/* An empty list, and a full one. */
	l.count = 0;
	n = dm_wire_ctl_gen_list_encode(b, &l);
	cr_assert_eq(n, 8);
	cr_assert_eq(dm_wire_ctl_gen_list_decode(b, n, &l2), 0);
	cr_assert_eq(l2.count, 0);
	l.count = DM_MAX_GRAPHS;
	for (uint32_t i = 0; i < DM_MAX_GRAPHS; i++)
		l.e[i] = (struct dm_wire_ctl_gen_entry){ .index = i, .flags = DM_GEN_F_CURRENT |
							 DM_GEN_F_RETIRED, .current = i + 2,
							 .retired = i + 1 };
	n = dm_wire_ctl_gen_list_encode(b, &l);
	cr_assert_eq(n, DM_WIRE_CTL_GEN_LIST_MAX);
	cr_assert_eq(dm_wire_ctl_gen_list_decode(b, n, &l2), 0);
	cr_assert_eq(memcmp(&l2, &l, sizeof(l)), 0);
	/* The header checks: the request is empty, the answer as long as its entries. */
	cr_assert_eq(dm_wire_ctl_body_len(DM_OP_CTL_GEN_LIST, 0), 0);
	cr_assert_eq(dm_wire_ctl_body_len(DM_OP_CTL_GEN_DROP, 0),
		     (int)sizeof(struct dm_wire_ctl_gen));
	cr_assert_eq(dm_wire_ctl_body_len(DM_OP_CTL_GEN_DROP + 1, 0),
		     (int)sizeof(struct dm_wire_ctl_gen_state));
	cr_assert_eq(dm_wire_ctl_body_len(DM_OP_CTL_GEN_DROP + 2, 0), -EPROTO);
	h.length = DM_WIRE_HDR_LEN + 8 + 24;
	cr_assert_eq(dm_wire_ctl_check(&h, h.length), 0);
	cr_assert_eq(dm_wire_ctl_check(&h, h.length + 1), -EBADMSG);
	h.length = DM_WIRE_HDR_LEN + 8 + 23;
	cr_assert_eq(dm_wire_ctl_check(&h, h.length), -EBADMSG, "part of an entry");
	h.length = DM_WIRE_HDR_LEN + DM_WIRE_CTL_GEN_LIST_MAX + 24;
	cr_assert_eq(dm_wire_ctl_check(&h, h.length), -EBADMSG, "more than DM_MAX_GRAPHS");
	h.length = DM_WIRE_HDR_LEN + 4;
	cr_assert_eq(dm_wire_ctl_check(&h, h.length), -EBADMSG, "no count");
	h = (struct dm_wire_hdr){ .op = DM_OP_CTL_GEN_LIST, .length = DM_WIRE_HDR_LEN };
	cr_assert_eq(dm_wire_ctl_check(&h, h.length), 0);
	h.length += 8;
	cr_assert_eq(dm_wire_ctl_check(&h, h.length), -EBADMSG, "the request is empty");
}

/* A delta snapshot: ranges of mutable objects written in place into the last full snapshot
 * (restored as if a full snapshot had been taken); a range in an immutable object or past
 * the region refused; a changed object set, or no snapshot yet, takes a full snapshot. */
Test(mn_store, snapshot_delta)
{
	struct mn_store *st = mn_store_new(1 << 20, -1, DM_HUGE_OFF), *st2;
	char path[] = "/tmp/dmann-snapd-XXXXXX", err[256];
	uint64_t off[3];
	struct mn_obj o;
	bool full;
	int fd = mkstemp(path);

	cr_assert_geq(fd, 0);
	close(fd);
	unlink(path);
	for (unsigned i = 0; i < 3; i++) {
		cr_assert_eq(mn_store_alloc(st, i, 8192, &off[i]), 0);
		fill(st, off[i], 8192, i);
		cr_assert_eq(mn_store_commit(st, i, 8192, crc_of(st, off[i], 8192),
					     i == 1 ? 0 : MN_OBJ_MUTABLE), 0);
	}
	struct mn_range r[2] = { { off[0] + 100, 300 }, { off[2] + 8000, 192 } };

	cr_assert_eq(mn_store_snapshot_delta(st, path, r, 2, &full), 0);
	cr_assert(full, "no snapshot yet: a full one");
	fill(st, off[0] + 100, 300, 9);          /* one-sided WRITEs into mutable objects */
	fill(st, off[2] + 8000, 192, 10);
	fill(st, off[2] + 10, 10, 11);           /* not in a range: stays old in the file */
	cr_assert_eq(mn_store_snapshot_delta(st, path, r, 2, &full), 0);
	cr_assert(!full, "a delta");
	st2 = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	cr_assert_eq(mn_store_restore(st2, path, err, sizeof(err)), 0, "%s", err);
	for (unsigned i = 0; i < 3; i++) {
		const char *a = (char *)st->region.addr + off[i], *b;

		cr_assert_eq(mn_store_lookup(st2, i, &o), 0);
		b = (char *)st2->region.addr + o.off;
		if (i == 2) {
			cr_assert_neq(memcmp(a + 10, b + 10, 10), 0, "outside the ranges: old bytes");
			cr_assert_eq(memcmp(a + 20, b + 20, 8192 - 20), 0);
		} else {
			cr_assert_eq(memcmp(a, b, 8192), 0, "object %u", i);
		}
	}
	mn_store_free(st2);
	struct mn_range bad[2] = { { off[1] + 10, 10 }, { (1 << 20) - 4, 8 } };

	cr_assert_eq(mn_store_snapshot_delta(st, path, &bad[0], 1, &full), -EINVAL,
		     "an immutable object");
	cr_assert_eq(mn_store_snapshot_delta(st, path, &bad[1], 1, &full), -EINVAL,
		     "past the region");
	/* A new object: the next one is full again, and has it. */
	cr_assert_eq(mn_store_alloc(st, 7, 100, &off[0]), 0);
	fill(st, off[0], 100, 7);
	cr_assert_eq(mn_store_commit(st, 7, 100, crc_of(st, off[0], 100), 0), 0);
	cr_assert_eq(mn_store_snapshot_delta(st, path, r, 1, &full), 0);
	cr_assert(full, "the object set changed");
	st2 = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	cr_assert_eq(mn_store_restore(st2, path, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(mn_store_lookup(st2, 7, &o), 0);
	/* After a restore the file is the restored snapshot: deltas go on from it. */
	cr_assert_eq(mn_store_snapshot_delta(st2, path, r, 1, &full), 0);
	cr_assert(!full);
	mn_store_free(st2);
	unlink(path);
	mn_store_free(st);
}
