/* placement.c: weighted rendezvous hashing (ideal state). */
#include "placement.h"

#include <math.h>

double dm_place_score(uint64_t item, uint32_t node_id, double capacity)
{
	uint64_t h = dm_hash64(dm_hash64(item) ^ ((uint64_t)node_id * 0xd6e8feb86659fd93ull));
	/* 53 random bits -> u in (0, 1), never 0 or 1, so ln(u) is finite and negative. */
	double u = ((double)(h >> 11) + 0.5) / 9007199254740992.0;

	return -capacity / log(u);
}

int dm_place(uint64_t item, const struct dm_place_node *nodes, size_t n, uint32_t r,
	     uint32_t *out)
{
	double best_score[64];
	uint32_t cnt = 0;

	if (r == 0 || r > DM_ARRAY_SIZE(best_score) || (!nodes && n))
		return -EINVAL;
	/* Insertion into a small sorted list: n is the node count, r is small. */
	for (size_t i = 0; i < n; i++) {
		double s;
		uint32_t pos;

		if (!nodes[i].up || !(nodes[i].capacity > 0))
			continue;
		s = dm_place_score(item, nodes[i].id, nodes[i].capacity);
		pos = cnt;
		while (pos > 0 && (s > best_score[pos - 1] ||
				   (s == best_score[pos - 1] && nodes[i].id < nodes[out[pos - 1]].id)))
			pos--;
		if (pos >= r)
			continue;
		for (uint32_t j = DM_MIN(cnt, r - 1); j > pos; j--) {
			best_score[j] = best_score[j - 1];
			out[j] = out[j - 1];
		}
		best_score[pos] = s;
		out[pos] = (uint32_t)i;
		if (cnt < r)
			cnt++;
	}
	return (int)cnt;
}
