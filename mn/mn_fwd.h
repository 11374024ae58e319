/* mn_fwd.h: the memory node's forwarding thread. Compute nodes hold no connections to each
 * other: a CN sends a query meant for another CN to a memory node, whose forwarding thread
 * re-sends the message (zero-copy, from the receive buffer it arrived in) on the target
 * CN's SERVE connection; the answer comes back the same way to the origin's connection. The
 * thread also keeps the last state report (queue length, cached-id sample) of every CN and
 * answers each report with all of them and the cache split penalty of the samples.
 *
 * Connections come from the control-RPC threads: a connection whose first message is
 * FWD_HELLO is handed over with mn_fwd_adopt and from then on belongs to this thread. Only
 * two-sided traffic goes through here; one-sided READs never involve the MN's CPU. */
#ifndef DM_MN_FWD_H
#define DM_MN_FWD_H

#include "rpc.h"

struct mn_fwd;

/* Start the forwarding thread on context x, whose receive buffers are pool's. NULL + errno. */
struct mn_fwd *mn_fwd_start(struct dm_xport *x, struct dm_msgpool *pool, uint32_t node_id);
/* Stop the thread, close its connections. */
void mn_fwd_stop(struct mn_fwd *f);
/* Hand over conn (its FWD_HELLO was hello). The forwarding thread closes it eventually. */
void mn_fwd_adopt(struct mn_fwd *f, struct dm_conn *conn, const struct dm_wire_fwd_hello *hello);

struct mn_fwd_stats {
	uint64_t relayed, bounced, dropped, reports;
	uint32_t conns;
};
void mn_fwd_stats(struct mn_fwd *f, struct mn_fwd_stats *st);

#endif
