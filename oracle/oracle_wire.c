/* oracle_wire.c: the wire form of the oracle's predictor, so that a client can rank CNs for
 * a query exactly as the CNs do (dm_oracle_rank / best / spill_order / ring_prev/next on the
 * decoded copy). Byte format, little-endian, dm_oracle_wire_size() <= DM_ORACLE_WIRE_MAX:
 *     u32 magic "DMOR"  u32 version (1)  u32 k  u32 dim  u32 nfine  u32 algo  (24 bytes)
 *     f32 fine[nfine * dim]  u32 fine_group[nfine]  f32 bias[nfine]
 *     f32 centroids[k * dim]  u32 ring[k]
 * No checksum: the decoder validates every field (see dm_oracle_decode in oracle.h). Floats
 * travel as their bit patterns, so a decoded oracle ranks with the very same distances, and
 * encoding it again gives back the same bytes.
 */
#include "oracle.h"
#include "config.h"        /* DM_MAX_NODES */
#include "wire.h"          /* DM_Q_MAX_DIM */
#include "util/dm_buf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WIRE_MAGIC   0x524f4d44u /* "DMOR" as little-endian bytes */
#define WIRE_VERSION 1u
#define WIRE_HDR     24u
#define WIRE_FINE_PER_GROUP 256u /* nfine <= k * 256 */

/* Bytes of the wire form (64-bit: never overflows for 32-bit fields). */
static uint64_t wire_size(uint64_t k, uint64_t dim, uint64_t nfine)
{
	return WIRE_HDR + 4 * (nfine * dim + 2 * nfine + k * dim + k);
}

/* Header fields the format allows (the size bound is checked separately). */
static bool header_ok(uint32_t k, uint32_t dim, uint32_t nfine, uint32_t algo)
{
	return k >= 1 && k <= DM_MAX_NODES && dim >= 1 && dim <= DM_Q_MAX_DIM && nfine >= k &&
	       nfine <= k * WIRE_FINE_PER_GROUP &&
	       (algo == DM_ORACLE_CONSTRAINED || algo == DM_ORACLE_DOUBLING ||
		 algo == DM_ORACLE_KEYRANGE);
}

size_t dm_oracle_wire_size(const struct dm_oracle *o)
{
	return o ? (size_t)wire_size(o->k, o->dim, o->nfine) : 0;
}

static uint8_t *put_f32(uint8_t *w, const float *v, size_t n)
{
	for (size_t i = 0; i < n; i++, w += 4) {
		uint32_t u;
		memcpy(&u, &v[i], 4);
		dm_put_le32(w, u);
	}
	return w;
}

static uint8_t *put_u32(uint8_t *w, const uint32_t *v, size_t n)
{
	for (size_t i = 0; i < n; i++, w += 4)
		dm_put_le32(w, v[i]);
	return w;
}

long dm_oracle_encode(const struct dm_oracle *o, uint8_t *buf, size_t cap)
{
	uint8_t *w = buf;
	size_t size;

	if (!o || (!buf && cap) || !header_ok(o->k, o->dim, o->nfine, (uint32_t)o->algo) ||
	    !o->fine || !o->fine_group || !o->bias || !o->centroids || !o->ring)
		return -EINVAL;
	size = dm_oracle_wire_size(o);
	if (size > DM_ORACLE_WIRE_MAX)
		return -EINVAL;
	if (size > cap)
		return -ENOSPC;
	dm_put_le32(w, WIRE_MAGIC);
	dm_put_le32(w + 4, WIRE_VERSION);
	dm_put_le32(w + 8, o->k);
	dm_put_le32(w + 12, o->dim);
	dm_put_le32(w + 16, o->nfine);
	dm_put_le32(w + 20, (uint32_t)o->algo);
	w = put_f32(w + WIRE_HDR, o->fine, (size_t)o->nfine * o->dim);
	w = put_u32(w, o->fine_group, o->nfine);
	w = put_f32(w, o->bias, o->nfine);
	w = put_f32(w, o->centroids, (size_t)o->k * o->dim);
	w = put_u32(w, o->ring, o->k);
	return (long)(w - buf);
}

/* n finite floats from r into out; false if short or one is not finite. */
static bool get_f32(struct dm_rbuf *r, float *out, size_t n)
{
	const uint8_t *p = dm_rbuf_get(r, n * 4);

	if (!p)
		return false;
	for (size_t i = 0; i < n; i++) {
		uint32_t u = dm_get_le32(p + 4 * i);
		memcpy(&out[i], &u, 4);
		if (!isfinite(out[i]))
			return false;
	}
	return true;
}

/* n u32 values below bound from r into out; false if short or one is >= bound. */
static bool get_u32(struct dm_rbuf *r, uint32_t *out, size_t n, uint32_t bound)
{
	const uint8_t *p = dm_rbuf_get(r, n * 4);

	if (!p)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((out[i] = dm_get_le32(p + 4 * i)) >= bound)
			return false;
	return true;
}

/* Every group owns a fine centroid, and the ring is a permutation; builds ring_pos (which
 * doubles as the seen marker of both checks). */
static bool model_ok(struct dm_oracle *o)
{
	for (uint32_t g = 0; g < o->k; g++)
		o->ring_pos[g] = 0;
	for (uint32_t f = 0; f < o->nfine; f++)
		o->ring_pos[o->fine_group[f]] = 1;
	for (uint32_t g = 0; g < o->k; g++)
		if (!o->ring_pos[g])
			return false;
	for (uint32_t g = 0; g < o->k; g++)
		o->ring_pos[g] = UINT32_MAX;
	for (uint32_t t = 0; t < o->k; t++) {
		if (o->ring_pos[o->ring[t]] != UINT32_MAX)
			return false;
		o->ring_pos[o->ring[t]] = t;
	}
	return true;
}

struct dm_oracle *dm_oracle_decode(const uint8_t *buf, size_t len)
{
	struct dm_rbuf r = { .p = buf, .n = buf ? len : 0 };
	struct dm_oracle *o;
	uint32_t magic, version, k, dim, nfine, algo;
	int err = EBADMSG;

	magic = dm_rbuf_u32(&r);
	version = dm_rbuf_u32(&r);
	k = dm_rbuf_u32(&r);
	dim = dm_rbuf_u32(&r);
	nfine = dm_rbuf_u32(&r);
	algo = dm_rbuf_u32(&r);
	if (r.bad || magic != WIRE_MAGIC || version != WIRE_VERSION ||
	    !header_ok(k, dim, nfine, algo) || wire_size(k, dim, nfine) > DM_ORACLE_WIRE_MAX ||
	    wire_size(k, dim, nfine) != len) {
		errno = EBADMSG;
		return NULL;
	}
	o = calloc(1, sizeof(*o));
	if (!o) {
		errno = ENOMEM;
		return NULL;
	}
	o->k = k;
	o->dim = dim;
	o->nfine = nfine;
	o->algo = (enum dm_oracle_algo)algo;
	/* malloc/calloc like dm_oracle_build: dm_oracle_free releases each with free() */
	o->fine = malloc((size_t)nfine * dim * sizeof(float));
	o->fine_group = malloc(nfine * sizeof(uint32_t));
	o->bias = malloc(nfine * sizeof(float));
	o->centroids = malloc((size_t)k * dim * sizeof(float));
	o->sizes = calloc(k, sizeof(uint64_t));
	o->ring = malloc(k * sizeof(uint32_t));
	o->ring_pos = malloc(k * sizeof(uint32_t));
	if (!o->fine || !o->fine_group || !o->bias || !o->centroids || !o->sizes || !o->ring ||
	    !o->ring_pos) {
		err = ENOMEM;
		goto err_free;
	}
	if (!get_f32(&r, o->fine, (size_t)nfine * dim) || !get_u32(&r, o->fine_group, nfine, k) ||
	    !get_f32(&r, o->bias, nfine) || !get_f32(&r, o->centroids, (size_t)k * dim) ||
	    !get_u32(&r, o->ring, k, k) || r.at != r.n || !model_ok(o))
		goto err_free;
	return o;

err_free:
	dm_oracle_free(o);
	errno = err;
	return NULL;
}
