/* vhash_frontier.c: Semord's bounded-fanout frontier (§3.2.1, eq. (11)-(12)) over
 * key-ordered fragments: owner, ring neighbours in key order, region hints, cut at a budget,
 * with optional ambiguity widening. The rules are in vhash_frontier.h. */
#include "vhash_frontier.h"

#include <math.h>

void dm_frontier_opts_default(struct dm_frontier_opts *o)
{
	o->ring = DM_FRONTIER_RING_DEFAULT;
	o->hints = DM_FRONTIER_HINTS_DEFAULT;
	o->widen = false;
	o->gap_rel = DM_FRONTIER_GAP_DEFAULT;
	o->wide_extra = DM_FRONTIER_WIDE_EXTRA_DEFAULT;
}

int dm_frontier_layout_check(const uint64_t *flo, const uint64_t *fhi, uint32_t nfrag)
{
	if (!flo || !fhi || nfrag == 0 || nfrag > DM_FRONTIER_FRAG_MAX || flo[0] != 0 ||
	    fhi[nfrag - 1] != UINT64_MAX)
		return -EINVAL;
	for (uint32_t f = 0; f < nfrag; f++) {
		if (flo[f] > fhi[f])
			return -EINVAL;
		/* fhi[f] < UINT64_MAX here unless f is the last: the next one starts right after */
		if (f + 1 < nfrag && (fhi[f] == UINT64_MAX || flo[f + 1] != fhi[f] + 1))
			return -EINVAL;
	}
	return 0;
}

uint32_t dm_frontier_fragment(const uint64_t *flo, uint32_t nfrag, uint64_t key)
{
	uint32_t a = 0, b = nfrag; /* the last fragment starting at or before key */

	while (b - a > 1) {
		uint32_t mid = a + (b - a) / 2;
		if (flo[mid] <= key)
			a = mid;
		else
			b = mid;
	}
	return a;
}

/* The list under construction: out[0..n) distinct, at most cap. */
struct flist {
	uint32_t *out;
	uint32_t n, cap;
};

static bool full(const struct flist *l)
{
	return l->n >= l->cap;
}

static void add(struct flist *l, uint32_t f)
{
	if (full(l))
		return;
	for (uint32_t i = 0; i < l->n; i++)
		if (l->out[i] == f)
			return;
	l->out[l->n++] = f;
}

/* Key distance of fragment f from key k held by fragment fk (0 for fk itself). */
static uint64_t key_dist(const uint64_t *flo, const uint64_t *fhi, uint32_t f, uint32_t fk,
			 uint64_t k)
{
	return f < fk ? k - fhi[f] : f > fk ? flo[f] - k : 0;
}

/* Add the fragments a..b (a <= fk <= b) nearest in key to k first, starting with fk: a merge
 * of the two sides walking outwards; ties to the lower side (the predecessor). */
static void add_outwards(struct flist *l, const uint64_t *flo, const uint64_t *fhi,
			 uint32_t a, uint32_t b, uint32_t fk, uint64_t k)
{
	uint32_t left = fk, right = fk; /* next candidates: left - 1, right + 1 */

	add(l, fk);
	while (!full(l) && (left > a || right < b)) {
		bool take_left;

		if (left == a)
			take_left = false;
		else if (right == b)
			take_left = true;
		else
			take_left = key_dist(flo, fhi, left - 1, fk, k) <=
				    key_dist(flo, fhi, right + 1, fk, k);
		add(l, take_left ? --left : ++right);
	}
}

int dm_vhash_frontier(const struct dm_vhash *vh, const uint64_t *flo, const uint64_t *fhi,
		      uint32_t nfrag, const float *q, uint32_t budget,
		      const struct dm_frontier_opts *opts, uint32_t *out, uint32_t room,
		      struct dm_frontier_info *info)
{
	struct dm_frontier_opts def;
	uint32_t regions[DM_FRONTIER_HINTS_MAX];
	double dist[DM_FRONTIER_HINTS_MAX];
	uint64_t most, key;
	double rel;
	int cnt;

	if (!opts) {
		dm_frontier_opts_default(&def);
		opts = &def;
	}
	if (!vh || !q || !out || budget == 0 || dm_frontier_layout_check(flo, fhi, nfrag))
		return -EINVAL;
	if (opts->hints == 0 || opts->hints > DM_FRONTIER_HINTS_MAX || !(opts->gap_rel >= 0) ||
	    opts->gap_rel > 1 || opts->ring > nfrag || opts->wide_extra > nfrag)
		return -EINVAL;
	most = (uint64_t)budget + (opts->widen ? opts->wide_extra : 0);
	if (room < DM_MIN(most, (uint64_t)nfrag))
		return -EINVAL;

	cnt = dm_vhash_rank(vh, q, regions, dist, opts->hints);
	if (cnt < 1)
		return cnt < 0 ? cnt : -EINVAL;
	dm_vhash_gap(dist, (uint32_t)cnt, &rel);
	bool widened = opts->widen && rel < opts->gap_rel;
	uint64_t cut = widened ? most : budget;
	struct flist l = { .out = out, .n = 0, .cap = (uint32_t)DM_MIN(cut, (uint64_t)nfrag) };

	/* 1. the owner: the fragment holding q's key at its nearest region (= dm_vhash_key) */
	key = dm_vhash_key_at(vh, regions[0], dist[0]);
	uint32_t owner = dm_frontier_fragment(flo, nfrag, key);
	add(&l, owner);

	/* 1b. widened: the key fragments of the regions ambiguous against the nearest */
	for (int i = 1; widened && i < cnt && !full(&l); i++) {
		double g = dist[i] > 0 ? (dist[i] - dist[0]) / dist[i] : 0.0;
		if (!(g < opts->gap_rel))
			break; /* dist[] ascends, so g does too: no later region is ambiguous */
		add(&l, dm_frontier_fragment(flo, nfrag,
					     dm_vhash_key_at(vh, regions[i], dist[i])));
	}

	/* 2. ring neighbours: rho fragments each side of the owner, nearest in key first */
	if (opts->ring > 0 && !full(&l)) {
		uint32_t a = owner > opts->ring ? owner - opts->ring : 0;
		uint32_t b = nfrag - 1 - owner > opts->ring ? owner + opts->ring : nfrag - 1;
		add_outwards(&l, flo, fhi, a, b, owner, key);
	}

	/* 3. region hints in rank order: P_j, from the fragment of q's key at j outwards */
	for (int i = 0; i < cnt && !full(&l); i++) {
		uint32_t r = regions[i];
		uint64_t kj = dm_vhash_key_at(vh, r, dist[i]);
		add_outwards(&l, flo, fhi, dm_frontier_fragment(flo, nfrag, vh->lo[r]),
			     dm_frontier_fragment(flo, nfrag, vh->hi[r]),
			     dm_frontier_fragment(flo, nfrag, kj), kj);
	}

	if (info) {
		info->key = key;
		info->region = regions[0];
		info->owner = owner;
		info->gap_rel = rel;
		info->widened = widened;
		info->budget = (uint32_t)DM_MIN(cut, (uint64_t)UINT32_MAX);
	}
	return (int)l.n;
}
