/* test_oracle_wire.c: the wire form of the oracle's predictor (oracle/oracle_wire.c): a
 * decoded copy ranks CNs exactly as the original (same orders, same float distances, same
 * spill orders and ring neighbours) for both clustering algorithms, re-encodes to the same
 * bytes, -ENOSPC on a short buffer, and the validating decoder (every truncation, field-level
 * corruptions) answers NULL with errno EBADMSG.
 */
#include <criterion/criterion.h>

#include "oracle.h"
#include "util/dm_buf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_rng.h"

/* lcg, u01, normal: test_rng.h */

static struct dm_oracle *build(size_t n, size_t dim, uint32_t k, enum dm_oracle_algo algo)
{
	struct dm_oracle_params p;
	float *x = rng_mixture(11, n, dim, 2 * k + 1, 10.0, NULL, NULL);

	dm_oracle_params_default(&p, k);
	p.algo = algo;
	struct dm_oracle *o = dm_oracle_build(x, n, dim, &p);
	cr_assert(o, "build failed: errno %d", errno);
	free(x);
	return o;
}

static uint8_t *encode(const struct dm_oracle *o, size_t *len)
{
	*len = dm_oracle_wire_size(o);
	uint8_t *b = malloc(*len);
	cr_assert(b);
	cr_assert_eq(dm_oracle_encode(o, b, *len), (long)*len);
	return b;
}

/* d (decoded from o's bytes) answers every predictor and ring question as o does. */
static void check_same(const struct dm_oracle *o, const struct dm_oracle *d)
{
	uint32_t k = o->k, a[k], b[k];
	float da[k], db[k];
	uint64_t s = 99;
	float *q = malloc(o->dim * sizeof(float));

	cr_assert(q);
	cr_assert_eq(d->k, k);
	cr_assert_eq(d->dim, o->dim);
	cr_assert_eq(d->nfine, o->nfine);
	cr_assert_eq(d->algo, o->algo);
	cr_assert(d->sse == 0 && d->n == 0 && d->iterations == 0 && d->exact_rechecks == 0);
	for (uint32_t g = 0; g < k; g++) {
		cr_assert_eq(d->sizes[g], 0);
		cr_assert_eq(d->ring_pos[g], o->ring_pos[g]);
	}
	for (int t = 0; t < 1000; t++) {
		for (uint32_t i = 0; i < o->dim; i++)
			q[i] = (float)(u01(&s) * 12.0 - 1.0);
		cr_assert_eq(dm_oracle_rank(o, q, a, da), (int)k);
		cr_assert_eq(dm_oracle_rank(d, q, b, db), (int)k);
		cr_assert_arr_eq(a, b, sizeof(a), "rank differs at query %d", t);
		cr_assert_arr_eq(da, db, sizeof(da), "distances differ at query %d", t);
		cr_assert_eq(dm_oracle_best(o, q), dm_oracle_best(d, q));
	}
	for (uint32_t c = 0; c < k; c++) {
		cr_assert_eq(dm_oracle_spill_order(o, c, a), (int)k - 1);
		cr_assert_eq(dm_oracle_spill_order(d, c, b), (int)k - 1);
		cr_assert_arr_eq(a, b, (k - 1) * sizeof(uint32_t), "spill order of CN %u", c);
		cr_assert_eq(dm_oracle_ring_prev(o, c), dm_oracle_ring_prev(d, c));
		cr_assert_eq(dm_oracle_ring_next(o, c), dm_oracle_ring_next(d, c));
	}
	free(q);
}

static void roundtrip(uint32_t k, enum dm_oracle_algo algo)
{
	struct dm_oracle *o = build(2000, 32, k, algo);
	size_t len;
	uint8_t *b = encode(o, &len);
	struct dm_oracle *d = dm_oracle_decode(b, len);

	cr_assert(d, "decode failed: errno %d", errno);
	check_same(o, d);
	size_t len2;
	uint8_t *b2 = encode(d, &len2);
	cr_assert_eq(len2, len);
	cr_assert_arr_eq(b2, b, len, "re-encoding differs");
	free(b2);
	free(b);
	dm_oracle_free(d);
	dm_oracle_free(o);
}

Test(oracle_wire, roundtrip_constrained)
{
	roundtrip(4, DM_ORACLE_CONSTRAINED);
}

Test(oracle_wire, roundtrip_doubling)
{
	roundtrip(3, DM_ORACLE_DOUBLING);
}

Test(oracle_wire, short_buffer_and_bad_args)
{
	struct dm_oracle *o = build(64, 4, 2, DM_ORACLE_CONSTRAINED);
	size_t len = dm_oracle_wire_size(o);
	uint8_t *b = malloc(len);

	cr_assert(b);
	cr_assert_eq(len, 24 + 4 * ((size_t)o->nfine * 4 + 2 * o->nfine + 2 * 4 + 2));
	cr_assert_eq(dm_oracle_encode(o, b, len - 1), -ENOSPC);
	cr_assert_eq(dm_oracle_encode(o, NULL, 0), -ENOSPC);
	cr_assert_eq(dm_oracle_encode(NULL, b, len), -EINVAL);
	cr_assert_eq(dm_oracle_encode(o, b, len), (long)len);
	free(b);
	dm_oracle_free(o);
}

/* decode(img, len) is NULL with errno EBADMSG. */
static void rejects(const uint8_t *img, size_t len, const char *what)
{
	errno = 0;
	struct dm_oracle *d = dm_oracle_decode(img, len);
	cr_assert_null(d, "%s accepted", what);
	cr_assert_eq(errno, EBADMSG, "%s: errno %d", what, errno);
}

Test(oracle_wire, every_truncation)
{
	struct dm_oracle *o = build(64, 4, 2, DM_ORACLE_DOUBLING);
	size_t len;
	uint8_t *b = encode(o, &len), *longer = malloc(len + 1);

	cr_assert(longer);
	for (size_t l = 0; l < len; l++)
		rejects(b, l, "a truncation");
	rejects(NULL, 0, "NULL");
	memcpy(longer, b, len);
	longer[len] = 0;
	rejects(longer, len + 1, "a trailing byte");
	free(longer);
	free(b);
	dm_oracle_free(o);
}

Test(oracle_wire, corruptions)
{
	struct dm_oracle *o = build(64, 4, 2, DM_ORACLE_CONSTRAINED);
	size_t len;
	uint8_t *b = encode(o, &len), *c = malloc(len);
	const size_t nf = o->nfine, dim = o->dim;
	const size_t fine = 24, group = fine + 4 * nf * dim, bias = group + 4 * nf;
	const size_t cent = bias + 4 * nf, ring = cent + 4 * o->k * dim;
	const float nan = NAN, inf = INFINITY;
	uint32_t u;

	cr_assert(c);
	cr_assert_eq(o->k, 2);
	cr_assert_eq(ring + 4 * o->k, len);
#define CASE(what, stmt)                  \
	do {                              \
		memcpy(c, b, len);        \
		stmt;                     \
		rejects(c, len, what);    \
	} while (0)
	CASE("flipped magic", c[0] ^= 1);
	CASE("flipped magic (last byte)", c[3] ^= 0x80);
	CASE("version 2", dm_put_le32(c + 4, 2));
	CASE("version 0", dm_put_le32(c + 4, 0));
	CASE("k = 0", dm_put_le32(c + 8, 0));
	CASE("k = 3", dm_put_le32(c + 8, 3));
	CASE("k over DM_MAX_NODES", dm_put_le32(c + 8, 257));
	CASE("dim = 0", dm_put_le32(c + 12, 0));
	CASE("dim + 1", dm_put_le32(c + 12, (uint32_t)dim + 1));
	CASE("nfine < k", dm_put_le32(c + 16, 1));
	CASE("nfine > k * 256", dm_put_le32(c + 16, 513));
	CASE("algo 3", dm_put_le32(c + 20, 3));   /* 2 is DM_ORACLE_KEYRANGE */
	CASE("fine_group out of range", dm_put_le32(c + group, 2));
	CASE("fine_group huge", dm_put_le32(c + group, UINT32_MAX));
	CASE("NaN in fine", (memcpy(&u, &nan, 4), dm_put_le32(c + fine + 4, u)));
	CASE("inf in bias", (memcpy(&u, &inf, 4), dm_put_le32(c + bias, u)));
	CASE("NaN in centroids", (memcpy(&u, &nan, 4), dm_put_le32(c + ring - 4, u)));
	CASE("ring duplicate", dm_put_le32(c + ring + 4, dm_get_le32(c + ring)));
	CASE("ring out of range", dm_put_le32(c + ring, 2));
	/* a group with no fine centroid: every fine centroid in group 0 */
	CASE("empty group", for (size_t f = 0; f < nf; f++) dm_put_le32(c + group + 4 * f, 0));
#undef CASE
	/* the unmodified image still decodes (the cases above broke one thing each) */
	struct dm_oracle *d = dm_oracle_decode(b, len);
	cr_assert(d);
	dm_oracle_free(d);
	free(c);
	free(b);
	dm_oracle_free(o);
}

/* Partition owners (dm_oracle_owners): identity while every CN is up; a CN down has its
 * partition served by the first live CN of its spill order (a ring neighbour), nobody
 * else's moves; the same table from a decoded copy; the routing epoch changes with the
 * owners and the oracle epoch, and is the same for the same inputs. */
Test(oracle_wire, owners_follow_the_live_set)
{
	struct dm_oracle *o = build(800, 8, 5, DM_ORACLE_CONSTRAINED);
	bool up[5] = { true, true, true, true, true };
	uint32_t own[5], own2[5], spill[4], id[5] = { 0, 1, 2, 3, 4 };
	size_t len;
	uint8_t *b = encode(o, &len);
	struct dm_oracle *d = dm_oracle_decode(b, len);
	uint32_t e_all, e_down;

	cr_assert_not_null(d);
	cr_assert_eq(dm_oracle_owners(o, up, own), 0);
	cr_assert_arr_eq(own, id, sizeof(id));
	e_all = dm_oracle_route_epoch(0, own, 5);
	up[2] = false;
	cr_assert_eq(dm_oracle_owners(o, up, own), 1);
	dm_oracle_spill_order(o, 2, spill);
	cr_assert_eq(own[2], spill[0], "partition 2 goes to its first ring neighbour");
	for (uint32_t p = 0; p < 5; p++)
		if (p != 2)
			cr_assert_eq(own[p], p, "partition %u moved", p);
	cr_assert_eq(dm_oracle_owners(d, up, own2), 1);
	cr_assert_arr_eq(own, own2, sizeof(own), "a client's copy gives the same owners");
	e_down = dm_oracle_route_epoch(0, own, 5);
	cr_assert_neq(e_down, e_all);
	cr_assert_eq(dm_oracle_route_epoch(0, own2, 5), e_down);
	cr_assert_neq(dm_oracle_route_epoch(1, own, 5), e_down, "re-clustering moves it too");
	/* The first neighbour down as well: the next live one in the spill order. */
	up[spill[0]] = false;
	cr_assert_eq(dm_oracle_owners(o, up, own), 2);
	cr_assert_eq(own[2], spill[1]);
	cr_assert(up[own[spill[0]]]);
	/* Back up: the first table and epoch again. */
	for (uint32_t p = 0; p < 5; p++)
		up[p] = true;
	cr_assert_eq(dm_oracle_owners(o, up, own), 0);
	cr_assert_eq(dm_oracle_route_epoch(0, own, 5), e_all);
	/* Nobody up: every partition keeps its own id. */
	for (uint32_t p = 0; p < 5; p++)
		up[p] = false;
	cr_assert_eq(dm_oracle_owners(o, up, own), 0);
	cr_assert_arr_eq(own, id, sizeof(id));
	cr_assert_eq(dm_oracle_owners(NULL, up, own), -EINVAL);
	free(b);
	dm_oracle_free(d);
	dm_oracle_free(o);
}
