/* ring.c: the semantic ring of CNs (Semord, "topology-aware order"): order the group
 * centroids so that neighbours on the ring are neighbours in vector space, and let an
 * overloaded CN spill queries to its ring neighbours first (their caches hold the nearby
 * part of the graph). Centroid kNN graph -> minimum spanning tree -> depth-first preorder ->
 * 2-opt on the closed tour -> cut at the longest edge; then a 2-opt pass on the open path,
 * which the closed-tour objective cannot do alone (see two_opt_path).
 *
 * Everything is deterministic (exact double distances, ties to the lower index), so every CN
 * derives the same ring from the same centroids.
 */
#include "oracle.h"
#include "util/dm_hash.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Euclidean distance matrix (k x k, double). */
static double *dist_matrix(const float *pts, uint32_t k, size_t dim)
{
	double *d = malloc((size_t)k * k * sizeof(double));

	if (!d)
		return NULL;
	for (uint32_t i = 0; i < k; i++) {
		d[(size_t)i * k + i] = 0;
		for (uint32_t j = i + 1; j < k; j++) {
			double e = sqrt(dm_oracle_l2_exact(pts + (size_t)i * dim,
							   pts + (size_t)j * dim, dim));
			d[(size_t)i * k + j] = e;
			d[(size_t)j * k + i] = e;
		}
	}
	return d;
}

double dm_oracle_tour_length(const float *pts, const uint32_t *order, uint32_t k, size_t dim)
{
	double len = 0;

	for (uint32_t i = 0; k > 1 && i < k; i++)
		len += sqrt(dm_oracle_l2_exact(pts + (size_t)order[i] * dim,
					       pts + (size_t)order[(i + 1) % k] * dim, dim));
	return len;
}

/* 2-opt over a precomputed distance matrix; see dm_oracle_two_opt. */
static int two_opt_mat(const double *d, uint32_t *o, uint32_t k, uint32_t max_passes)
{
	int moves = 0;

	if (k < 4)
		return 0; /* every closed tour of <= 3 points has the same length */
	for (uint32_t pass = 0; pass < max_passes; pass++) {
		bool improved = false;
		for (uint32_t i = 0; i + 1 < k; i++) {
			for (uint32_t j = i + 2; j < k; j++) {
				uint32_t a = o[i], b = o[i + 1], c = o[j], e = o[(j + 1) % k];
				if (e == a)
					continue; /* edges share a vertex: not a 2-opt move */
				double before = d[(size_t)a * k + b] + d[(size_t)c * k + e];
				double after = d[(size_t)a * k + c] + d[(size_t)b * k + e];
				/* strictly shorter by more than rounding noise: never lengthens, and
				 * cannot cycle on equal-length moves */
				if (after < before - 1e-12 * before) {
					for (uint32_t l = i + 1, r = j; l < r; l++, r--) {
						uint32_t t = o[l];
						o[l] = o[r];
						o[r] = t;
					}
					moves++;
					improved = true;
				}
			}
		}
		if (!improved)
			break;
	}
	return moves;
}

int dm_oracle_two_opt(const float *pts, uint32_t *order, uint32_t k, size_t dim,
		      uint32_t max_passes)
{
	double *d;
	int moves;

	if (!pts || !order || k == 0)
		return -EINVAL;
	d = dist_matrix(pts, k, dim);
	if (!d)
		return -ENOMEM;
	moves = two_opt_mat(d, order, k, max_passes);
	free(d);
	return moves;
}

/* 2-opt on the open path o[0..k-1] (the cut ring): reversing o[i+1..j] replaces edges
 * (o[i], o[i+1]) and (o[j], o[j+1]), where a missing edge past either end costs nothing
 * (i = -1 reverses a prefix, j = k-1 a suffix). On a cycle, orders that go out and come
 * back are as short as the straight one (points on a line); on the path they are not, so
 * this pass turns the cut tour into the straight order. Never lengthens the path. */
static int two_opt_path(const double *d, uint32_t *o, uint32_t k, uint32_t max_passes)
{
	int moves = 0;

	for (uint32_t pass = 0; pass < max_passes; pass++) {
		bool improved = false;
		for (int64_t i = -1; i + 2 < (int64_t)k; i++) {
			for (uint32_t j = (uint32_t)(i + 2); j < k; j++) {
				double before = 0, after = 0;
				if (i >= 0) {
					before += d[(size_t)o[i] * k + o[i + 1]];
					after += d[(size_t)o[i] * k + o[j]];
				}
				if (j + 1 < k) {
					before += d[(size_t)o[j] * k + o[j + 1]];
					after += d[(size_t)o[i + 1] * k + o[j + 1]];
				}
				if (after < before - 1e-12 * before) {
					for (uint32_t l = (uint32_t)(i + 1), r = j; l < r; l++, r--) {
						uint32_t t = o[l];
						o[l] = o[r];
						o[r] = t;
					}
					moves++;
					improved = true;
				}
			}
		}
		if (!improved)
			break;
	}
	return moves;
}

/* Length of the open path through pts in order (Euclidean). */
static double path_length(const float *pts, const uint32_t *order, uint32_t k, size_t dim)
{
	double len = 0;

	for (uint32_t i = 0; i + 1 < k; i++)
		len += sqrt(dm_oracle_l2_exact(pts + (size_t)order[i] * dim,
					       pts + (size_t)order[i + 1] * dim, dim));
	return len;
}

int dm_oracle_ring_order_from(const float *pts, uint32_t k, size_t dim, uint32_t knn,
			      const uint32_t *init, double slack, uint32_t *order)
{
	bool *seen;
	int ret;

	if (!pts || !init || !order || k == 0 || dim == 0 || !(slack >= 0))
		return -EINVAL;
	seen = calloc(k, sizeof(*seen));
	if (!seen)
		return -ENOMEM;
	for (uint32_t i = 0; i < k; i++) {
		if (init[i] >= k || seen[init[i]]) {
			free(seen);
			return -EINVAL;   /* not a permutation of 0..k-1 */
		}
		seen[init[i]] = true;
	}
	free(seen);
	ret = dm_oracle_ring_order(pts, k, dim, knn, order);
	if (ret)
		return ret;
	if (path_length(pts, init, k, dim) <= (1 + slack) * path_length(pts, order, k, dim))
		memcpy(order, init, k * sizeof(*order));
	return 0;
}

/* Is j among the knn nearest of i (ties to the lower index)? Ranks j against every other. */
static bool in_knn(const double *d, uint32_t k, uint32_t i, uint32_t j, uint32_t knn)
{
	uint32_t closer = 0;

	for (uint32_t l = 0; l < k; l++) {
		if (l == i || l == j)
			continue;
		double dl = d[(size_t)i * k + l], dj = d[(size_t)i * k + j];
		if (dl < dj || (dl == dj && l < j))
			closer++;
	}
	return closer < knn;
}

int dm_oracle_ring_order(const float *pts, uint32_t k, size_t dim, uint32_t knn,
			 uint32_t *order)
{
	double *d = NULL, *key = NULL;
	uint8_t *tier = NULL, *ktier = NULL;
	uint32_t *parent = NULL, *stack = NULL;
	bool *in = NULL;
	int ret = 0;

	if (!pts || !order || k == 0 || dim == 0)
		return -EINVAL;
	if (k <= 2) {
		for (uint32_t i = 0; i < k; i++)
			order[i] = i;
		return 0;
	}
	if (knn == 0)
		knn = 1;
	d = dist_matrix(pts, k, dim);
	tier = malloc((size_t)k * k);
	key = malloc(k * sizeof(double));
	ktier = malloc(k);
	parent = malloc(k * sizeof(uint32_t));
	stack = malloc(k * sizeof(uint32_t));
	in = calloc(k, sizeof(bool));
	if (!d || !tier || !key || !ktier || !parent || !stack || !in) {
		ret = -ENOMEM;
		goto out_free;
	}
	/* symmetrised kNN graph: tier 0 = kNN edge, tier 1 = any other pair (used only to join
	 * components the kNN graph leaves apart, closest pair first) */
	for (uint32_t i = 0; i < k; i++)
		for (uint32_t j = 0; j < k; j++)
			tier[(size_t)i * k + j] = 1;
	for (uint32_t i = 0; i < k; i++)
		for (uint32_t j = 0; j < k; j++)
			if (i != j && in_knn(d, k, i, j, knn)) {
				tier[(size_t)i * k + j] = 0;
				tier[(size_t)j * k + i] = 0;
			}
	/* Prim from vertex 0 with (tier, distance) keys */
	for (uint32_t i = 0; i < k; i++) {
		key[i] = INFINITY;
		ktier[i] = 2;
		parent[i] = UINT32_MAX;
	}
	key[0] = 0;
	ktier[0] = 0;
	for (uint32_t step = 0; step < k; step++) {
		uint32_t u = UINT32_MAX;
		for (uint32_t v = 0; v < k; v++) {
			if (in[v])
				continue;
			if (u == UINT32_MAX || ktier[v] < ktier[u] ||
			    (ktier[v] == ktier[u] && key[v] < key[u]))
				u = v;
		}
		in[u] = true;
		for (uint32_t v = 0; v < k; v++) {
			if (in[v])
				continue;
			uint8_t t = tier[(size_t)u * k + v];
			double w = d[(size_t)u * k + v];
			if (t < ktier[v] || (t == ktier[v] && w < key[v])) {
				ktier[v] = t;
				key[v] = w;
				parent[v] = u;
			}
		}
	}
	/* DFS preorder from 0; children visited nearest first (pushed farthest first) */
	uint32_t sp = 0, no = 0;
	stack[sp++] = 0;
	while (sp) {
		uint32_t u = stack[--sp];
		order[no++] = u;
		uint32_t first = sp;
		for (uint32_t v = 0; v < k; v++)
			if (parent[v] == u)
				stack[sp++] = v;
		/* sort the pushed children by decreasing distance to u (insertion sort, small) */
		for (uint32_t a = first + 1; a < sp; a++) {
			uint32_t c = stack[a], b = a;
			double dc = d[(size_t)u * k + c];
			while (b > first) {
				uint32_t p = stack[b - 1];
				double dp = d[(size_t)u * k + p];
				if (dp > dc || (dp == dc && p > c))
					break;
				stack[b] = p;
				b--;
			}
			stack[b] = c;
		}
	}
	two_opt_mat(d, order, k, 1000);
	/* cut the closed tour at its longest edge: the ring starts right after it */
	uint32_t cut = 0;
	double longest = -1;
	for (uint32_t i = 0; i < k; i++) {
		double e = d[(size_t)order[i] * k + order[(i + 1) % k]];
		if (e > longest) {
			longest = e;
			cut = i;
		}
	}
	memcpy(stack, order, k * sizeof(uint32_t));
	for (uint32_t i = 0; i < k; i++)
		order[i] = stack[(cut + 1 + i) % k];
	two_opt_path(d, order, k, 1000);
out_free:
	free(d);
	free(tier);
	free(key);
	free(ktier);
	free(parent);
	free(stack);
	free(in);
	return ret;
}

/* Called by dm_oracle_build once the group centroids are known. */
int dm_oracle_ring_build(struct dm_oracle *o, uint32_t knn);
int dm_oracle_ring_build(struct dm_oracle *o, uint32_t knn)
{
	int ret;

	o->ring = malloc(o->k * sizeof(uint32_t));
	o->ring_pos = malloc(o->k * sizeof(uint32_t));
	if (!o->ring || !o->ring_pos)
		return -ENOMEM;
	ret = dm_oracle_ring_order(o->centroids, o->k, o->dim, knn, o->ring);
	if (ret)
		return ret;
	for (uint32_t i = 0; i < o->k; i++)
		o->ring_pos[o->ring[i]] = i;
	return 0;
}

int dm_oracle_ring_prev(const struct dm_oracle *o, uint32_t cn)
{
	if (cn >= o->k)
		return -EINVAL;
	uint32_t p = o->ring_pos[cn];
	return p == 0 ? -1 : (int)o->ring[p - 1];
}

int dm_oracle_ring_next(const struct dm_oracle *o, uint32_t cn)
{
	if (cn >= o->k)
		return -EINVAL;
	uint32_t p = o->ring_pos[cn];
	return p + 1 >= o->k ? -1 : (int)o->ring[p + 1];
}

int dm_oracle_spill_order(const struct dm_oracle *o, uint32_t cn, uint32_t *out)
{
	uint32_t n = 0, p;

	if (cn >= o->k || !out)
		return -EINVAL;
	p = o->ring_pos[cn];
	for (uint32_t c = 0; c < o->k; c++)
		if (c != cn)
			out[n++] = c;
	/* insertion sort by (ring distance, centroid distance, id); k is small */
	for (uint32_t a = 1; a < n; a++) {
		uint32_t c = out[a], b = a;
		uint32_t rc = (uint32_t)abs((int)o->ring_pos[c] - (int)p);
		double dc = dm_oracle_l2_exact(o->centroids + (size_t)c * o->dim,
					       o->centroids + (size_t)cn * o->dim, o->dim);
		while (b > 0) {
			uint32_t q = out[b - 1];
			uint32_t rq = (uint32_t)abs((int)o->ring_pos[q] - (int)p);
			double dq = dm_oracle_l2_exact(o->centroids + (size_t)q * o->dim,
						       o->centroids + (size_t)cn * o->dim, o->dim);
			if (rq < rc || (rq == rc && (dq < dc || (dq == dc && q < c))))
				break;
			out[b] = q;
			b--;
		}
		out[b] = c;
	}
	return (int)n;
}

int dm_oracle_owners(const struct dm_oracle *o, const bool *up, uint32_t *owner)
{
	uint32_t *order;
	int moved = 0;

	if (!o || !up || !owner)
		return -EINVAL;
	order = malloc((o->k ? o->k : 1) * sizeof(*order));
	if (!order)
		return -ENOMEM;
	for (uint32_t p = 0; p < o->k; p++) {
		owner[p] = p;
		if (up[p])
			continue;
		dm_oracle_spill_order(o, p, order);
		for (uint32_t i = 0; i + 1 < o->k; i++)
			if (up[order[i]]) {
				owner[p] = order[i];
				moved++;
				break;
			}
	}
	free(order);
	return moved;
}

uint32_t dm_oracle_route_epoch(uint32_t oracle_epoch, const uint32_t *owner, uint32_t k)
{
	uint64_t h = DM_FNV64_INIT;

	for (uint32_t p = 0; p < k; p++) {
		uint8_t b[4] = { (uint8_t)owner[p], (uint8_t)(owner[p] >> 8),
				 (uint8_t)(owner[p] >> 16), (uint8_t)(owner[p] >> 24) };

		h = dm_fnv1a64(h, b, sizeof(b));
	}
	h = dm_mix64(h);
	return (oracle_epoch & 0xffu) << 24 | (uint32_t)(h & 0xffffffu);
}
