/* placement.h: Vespa-style ideal state by weighted rendezvous hashing. For each item
 * (block or fragment id) every node gets a deterministic score from (item id, node id)
 * weighted by its capacity; the R best up nodes hold it. Every node computes the same
 * answer from the same cluster state, with no lookup service. A node going down moves only
 * the items it held; a node coming up takes a capacity-proportional share. */
#ifndef DM_PLACEMENT_H
#define DM_PLACEMENT_H

#include "dm.h"
#include "util/dm_hash.h"

struct dm_place_node {
	uint32_t id;        /* stable node id */
	double capacity;    /* > 0; relative weight */
	bool up;
};

/* Score of node for item: -capacity / ln(u) with u in (0,1) from a 64-bit hash of
 * (item, node id); higher is better (weighted rendezvous hashing). */
double dm_place_score(uint64_t item, uint32_t node_id, double capacity);

/* Write the indexes (into nodes[]) of the min(r, up nodes) best nodes for item into out,
 * best first. Returns how many were written, or -EINVAL. Ties are broken by node id. */
int dm_place(uint64_t item, const struct dm_place_node *nodes, size_t n, uint32_t r,
	     uint32_t *out);


#endif
