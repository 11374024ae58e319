/* handshake.h: the connection handshake every backend runs before it returns a connection:
 * protocol version, cluster name and mutual HMAC-SHA256 proof of the cluster secret (the
 * message flow is described in wire.h).
 *
 * Two layers:
 *   - dm_hs_step works on byte buffers only, so a backend with its own channel (verbs: a
 *     SEND/RECV exchange or rdma_cm private data) can drive it;
 *   - dm_hs_run_fd drives it over a connected stream socket with a deadline.
 * A failure is logged (dm_warn, with the peer's name and the reason) by the side that
 * detects it; the other side receives HS_RESULT with the status and logs it too.
 */
#ifndef DM_HANDSHAKE_H
#define DM_HANDSHAKE_H

#include "xport.h"
#include "../wire.h"

enum dm_hs_role { DM_HS_CLIENT, DM_HS_SERVER };

/* Largest handshake message (header + HS_HELLO_CLIENT): size of the out buffer for dm_hs_step. */
#define DM_HS_MAX_MSG (DM_WIRE_HDR_LEN + sizeof(struct dm_wire_hs_hello_client))
/* Default deadline for a whole handshake. */
#define DM_HS_TIMEOUT_MS 5000

struct dm_hs {
	enum dm_hs_role role;
	int state;
	char peer[64];
	char cluster[DM_HS_CLUSTER_LEN];
	char client[DM_HS_CLUSTER_LEN];   /* client identity ("" : a node) */
	const struct dm_xport *x;          /* server: the identities it accepts */
	uint8_t secret[64];
	size_t secret_len;
	uint8_t nonce_c[DM_HS_NONCE_LEN];
	uint8_t nonce_s[DM_HS_NONCE_LEN];
};

/* Prepare one side of a handshake with the context's cluster name and secret (a context
 * opened with a client identity sends HS_HELLO_CLIENT and proves that client's secret; a
 * server accepts the identities in x->creds). peer names the other side in log messages.
 * After success hs->client names the peer's client identity ("" : a node). 0 or -EINVAL. */
int dm_hs_init(struct dm_hs *hs, const struct dm_xport *x, enum dm_hs_role role,
	       const char *peer);

/* Advance the handshake by one message. in/inlen: the peer's whole message (header
 * included); the client's first call passes NULL/0. The message to send back is written to
 * out (at least DM_HS_MAX_MSG bytes) and its length to *outlen (0: nothing to send).
 * Returns 0: send *out and feed the next peer message; 1: done and accepted (send *out first
 * if *outlen > 0); -errno: failed (send *out if *outlen > 0 to tell the peer, then drop it).
 * Errors: -EBADMSG/-EPROTO malformed, -EPROTONOSUPPORT version, -EPERM cluster name,
 * -EACCES wrong secret or unknown client identity, or the status the peer refused us with. */
int dm_hs_step(struct dm_hs *hs, const uint8_t *in, size_t inlen, uint8_t *out,
	       size_t *outlen);

/* Wipe the secret and nonces. */
void dm_hs_clear(struct dm_hs *hs);

/* Run a whole handshake over a connected stream socket (blocking or not) within timeout_ms.
 * Reads exactly the handshake messages, nothing after them. client (if not NULL, 64 bytes)
 * gets the peer's client identity ("" : a node). 0 or -errno (-ETIMEDOUT, -ECONNRESET, or a
 * dm_hs_step error). */
int dm_hs_run_fd(const struct dm_xport *x, int fd, enum dm_hs_role role, const char *peer,
		 int timeout_ms, char *client);

#endif /* DM_HANDSHAKE_H */
