/* dgen.h: index generations, the side of the processes that talk to memory nodes (the
 * loader and compute nodes). The memory-node side is the generation table of
 * mn/mn_store.c; the messages are CTL_GEN_PUBLISH / REPORT / LIST / DROP of wire.h; the whole
 * protocol is described in docs/architecture.md ("Index generations"):
 *
 *   loader:  wait until no memory node holds a retired generation; g+1 = current + 1;
 *            write every object of g+1 under its own keys (g stays intact); PUBLISH g+1
 *            on every memory node (each retires g); wait until the memory nodes freed g.
 *   CN:      every refresh_ms REPORT the oldest generation it still reads to every
 *            memory node; when a report shows a newer current generation, open it, switch
 *            new queries to it, let queries on the old view finish, then drop the old view
 *            and REPORT the new generation: that is the acknowledgement.
 *   MN:      frees generation g once every CN of the cluster file reported > g, or has not
 *            reported for lease_ms; a CN reads from a memory node only while its last
 *            successful report to it is less than lease_ms / 2 old.
 */
#ifndef DM_CN_DGEN_H
#define DM_CN_DGEN_H

#include "dindex.h"

/* The memory nodes' generation state, merged over the nodes that answered. */
struct dgen_view {
	bool has_current;          /* some memory node has an index */
	bool has_retired;          /* some memory node still holds a retired generation */
	bool agree;                /* every node that answered has the same current one */
	uint64_t current;          /* the highest current generation */
	uint64_t min_current;      /* the lowest (== current when agree) */
	uint64_t retired;          /* the highest retired generation */
	uint32_t waiting;          /* most CNs any node waits for */
	uint32_t lease_ms;         /* the memory nodes' lease (largest) */
	uint32_t answered;         /* memory nodes that answered */
};

/* REPORT to every memory node that is up: compute node cn (DM_GEN_NO_CN: read the state
 * only) still reads generations >= gen of index 0. sent_ns[m] (may be NULL) is set to the
 * time the request to node m was sent when it was answered (left alone otherwise). 0 when
 * every node that is up answered, -EHOSTDOWN when some did not (*v still holds what the
 * others said; v->answered counts them). No index loaded is not an error: has_current is
 * false. */
int dgen_report(struct mn_set *s, uint32_t graph, uint32_t cn, uint64_t gen, struct dgen_view *v,
		uint64_t *sent_ns);

/* The same REPORT to memory node m alone: its state in *st, *sent_ns (may be NULL) the
 * send time. 0 or -EHOSTDOWN (link down or no answer). */
int dgen_report_node(struct mn_set *s, uint32_t m, uint32_t graph, uint32_t cn, uint64_t gen,
		     struct dm_wire_ctl_gen_state *st, uint64_t *sent_ns);

/* PUBLISH gen on memory node m alone (a node joining the placement). 0 or -errno. */
int dgen_publish_node(struct mn_set *s, uint32_t m, uint32_t graph, uint64_t gen);
/* PUBLISH gen on every memory node (all must be up). 0 or -errno with a message. */
int dgen_publish(struct mn_set *s, uint32_t graph, uint64_t gen, char *err, size_t errlen);

/* After a failed load of gen: drop its metadata on every node where it is not current
 * (a restarted memory node takes its newest metadata for the current generation). Best
 * effort. */
void dgen_abandon(struct mn_set *s, uint32_t graph, uint64_t gen);

/* The graphs the memory nodes hold (CTL_GEN_LIST), merged over the nodes that answered. */
_Static_assert(DM_MAX_GRAPHS <= 32, "dgen_graphs masks");
struct dgen_graphs {
	uint32_t mask;             /* bit g: some memory node has a current generation of g */
	uint32_t retired_mask;     /* bit g: some memory node still holds a retired one of g */
	uint64_t current[DM_MAX_GRAPHS];   /* the highest current generation (bit g of mask) */
	uint64_t retired[DM_MAX_GRAPHS];   /* the highest retired one (bit g of retired_mask) */
	uint32_t answered;         /* memory nodes that answered */
};

/* LIST on every memory node that is up and not retired, merged into *out (graph numbers
 * >= DM_MAX_GRAPHS are left out). 0 when every such node answered, -EHOSTDOWN when some
 * did not (*out still holds what the others said). */
int dgen_list(struct mn_set *s, struct dgen_graphs *out);

/* The lowest graph number of which no memory node of list gl holds a generation (current
 * or retired), or DM_MAX_GRAPHS when every number is in use. */
static inline uint32_t dgen_free_graph(const struct dgen_graphs *gl)
{
	uint32_t g = 0;

	while (g < DM_MAX_GRAPHS && ((gl->mask | gl->retired_mask) >> g & 1))
		g++;
	return g;
}

/* DROP generation gen of graph on memory node m alone (CTL_GEN_DROP): 0 or -errno
 * (-EHOSTDOWN: link down; -ESTALE: gen is not its current one; -ENOENT: no such graph
 * there; -EBUSY: an older generation is still held there). */
int dgen_drop_node(struct mn_set *s, uint32_t m, uint32_t graph, uint64_t gen);

/* Poll until no memory node holds a retired generation, for at most timeout_ms. 0 when
 * none does (v: the last state), -ETIMEDOUT, or -errno. */
int dgen_wait_released(struct mn_set *s, uint32_t graph, uint32_t timeout_ms, struct dgen_view *v);

#endif
