/* cn_graph.h: the compute node's side of its gateway's graph path (cn_s3.h struct
 * cn_s3_graph_ops) over the node's index view: the binding's keys, the bound index, which
 * compute node runs the online indexer, its inserts and the snapshot that makes them
 * durable. */
#ifndef DM_CN_GRAPH_H
#define DM_CN_GRAPH_H

#include "cn.h"
#include "cn_s3.h"

extern const struct cn_s3_graph_ops cn_graph_ops;   /* ctx: struct cn * */

/* Free the indexer's insert engines (after the gateway stopped). */
void cn_graph_fini(struct cn *cn);

#endif
