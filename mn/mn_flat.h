/* mn_flat.h: the S3 Vectors side of a memory node: the flat store (catalog + flat-index
 * data, WAL + snapshot) in <data_dir>/flat, served over the FL RPC (wire.h): S3 operations
 * forwarded by compute nodes (durable before the answer), index state and fragment reads
 * for the compute nodes that scan, and a bucket's image and the catch-up of a stale replica
 * (FL_IMAGE, FL_CATCHUP: mn_catchup.c). dmann-mn serves each connection on its own thread
 * and a compute node keeps a pool of connections per MN (one per concurrent call), so
 * writes from several CNs and clients reach the store concurrently and share WAL syncs. */
#ifndef DM_MN_FLAT_H
#define DM_MN_FLAT_H

#include <stdio.h>

#include "config.h"
#include "rpc.h"

struct mn_flat;

/* Open (and recover) the store in dir with the [mn] settings (NULL: defaults). NULL +
 * errno; a message is logged (EBADMSG: a damaged WAL or snapshot; the MN must not start). */
struct mn_flat *mn_flat_open(const char *dir, uint32_t node_id,
			     const struct dm_mn_settings *set);
/* Snapshot and free. */
void mn_flat_close(struct mn_flat *f);

/* Prometheus text of the store's WAL counters (records, fdatasyncs, bytes, sticky error),
 * its bytes, and the catch-up counters (images taken, catch-ups installed, writes re-run). */
void mn_flat_metrics(struct mn_flat *f, FILE *out);

/* Run one reassembled FL request (op: any FL request op but FL_INFO; req[0..len)): the
 * answer's payload appended to out, *resp_msg the message size the requester announced
 * (FL_FRAG; left alone otherwise). The peer status: 0 or -errno (-EBADMSG for a malformed
 * request, -EPROTO for an unknown op). Every field is checked (fuzz_mn_flat). */
struct dm_buf;
int mn_flat_handle(struct mn_flat *f, uint16_t op, const uint8_t *req, size_t len,
		   struct dm_buf *out, uint32_t *resp_msg);
/* Serve one FL request whose first message (buf, len, wr_id; header h, any FL op) came in
 * on ch: receives the rest of the stream, runs it and sends the response stream. Takes the
 * buffer (reposts it). 0, or -errno when the connection should be closed. */
int mn_flat_serve(struct mn_flat *f, struct dm_rpc_chan *ch, const struct dm_wire_hdr *h,
		  const uint8_t *buf, uint32_t len, uint64_t wr_id);

#endif
