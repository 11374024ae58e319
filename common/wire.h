/* wire.h: every message dmann puts on a network, in one place.
 *
 * Protocol overview
 * -----------------
 * All integers are little-endian, fixed width, and every message starts with the same
 * 24-byte header:
 *
 *      0        4     5     6        8          12         16                    24
 *      +--------+-----+-----+--------+----------+----------+---------------------+
 *      | magic  | ver |flags|   op   |  length  |  status  |       req_id        |
 *      +--------+-----+-----+--------+----------+----------+---------------------+
 *
 *   magic   DM_WIRE_MAGIC ("DMAN")
 *   ver     DM_WIRE_VERSION; a peer speaking another version is refused in the handshake
 *   flags   per-op flags (none defined yet, must be 0)
 *   op      enum dm_wire_op
 *   length  whole message length, header included (so a reader can always skip a message)
 *   status  0 in requests; 0 or -errno in responses
 *   req_id  chosen by the requester, echoed in the response
 *
 * Op numbers are grouped in ranges so that each layer has its own block (every range
 * below is in use; the rest of each block is free for that layer):
 *   0x0001-0x00ff  handshake (every backend, before anything else)
 *   0x0100-0x01ff  tcp transport: one-sided ops as request/response, two-sided SEND
 *   0x1000-0x1fff  control RPC between CN/CLI and MN: objects (0x1000-0x100b), snapshots,
 *                  index generations (0x100c-0x100f, 0x1012-0x1015); 0x1100-0x11ff the S3
 *                  flat-index RPC
 *                  (catalog, writes, fragments)
 *   0x2000-0x2fff  messages forwarded between compute nodes through memory nodes, router
 *                  state exchange and router settings
 *   0x3000-0x30ff  native query protocol: clients (dmann bench) <-> compute nodes
 *   0x3100-0x31ff  native client data ops: libdmann <-> compute nodes (S3 Vectors indexes)
 *
 * Handshake (client C connects to server S; secret K is the cluster secret):
 *   C -> S  HS_HELLO   {version, cluster name, nonce_c}
 *   S -> C  HS_REPLY   {version, cluster name, nonce_s, proof_s}
 *                      proof_s = HMAC-SHA256(K, "dmann-hs-server" | cluster | nonce_c | nonce_s)
 *   C -> S  HS_AUTH    {proof_c}
 *                      proof_c = HMAC-SHA256(K, "dmann-hs-client" | cluster | nonce_c | nonce_s)
 *   S -> C  HS_RESULT  {} with header status 0 (accepted) or -errno (refused)
 * A client identity ([client.NAME] of the cluster file, libdmann) opens with HS_HELLO_CLIENT
 * {the HS_HELLO fields, client name} instead; the rest is the same but K is that client's
 * secret and both proofs also cover the name (label | version | cluster | client | nonces).
 * A server that does not know the name (memory nodes know none) refuses with -EACCES; a
 * compute node marks the connection as a client's (dm_conn.client): no remote memory
 * access on it and every admin op refused with -EPERM.
 * Either side may answer any step with HS_RESULT carrying a negative status and close. Each
 * side proves knowledge of K over a nonce the other chose, so a recorded exchange is useless;
 * the role label keeps a server proof from being replayed as a client proof.
 *
 * tcp transport (after the handshake; the target serves requests in order, so responses come
 * back in request order):
 *   READ_REQ   {remote, rkey, len}                     -> READ_RESP  + len data bytes
 *   WRITE_REQ  {remote, rkey, len} + len data bytes    -> WRITE_RESP
 *   CAS_REQ    {remote, rkey, compare, swap}           -> CAS_RESP   {old value}
 *   FAA_REQ    {remote, rkey, add}                     -> FAA_RESP   {old value}
 *   SEND       payload (length - header)               -> SEND_ACK   (cumulative: acks every
 *                                                         SEND up to and including req_id)
 * An error response carries status -EACCES (bad key / access), -EFAULT (out of bounds),
 * -EINVAL (misaligned atomic) or -EMSGSIZE (SEND larger than the posted receive buffer) and
 * no body.
 *
 * The structs below are the decoded, host-order form; dm_wire_*_encode/decode convert to and
 * from byte buffers and never cast a struct onto a buffer. Their sizes equal the wire sizes
 * (asserted), which documents the layout. Decoders check every length and return -EBADMSG
 * (malformed) or -EPROTO (well-formed but not acceptable, e.g. unknown version or op).
 */
#ifndef DM_WIRE_H
#define DM_WIRE_H

#include "dm.h"
#include "util/dm_buf.h"

#define DM_WIRE_MAGIC   0x4e414d44u   /* "DMAN" as little-endian bytes */
#define DM_WIRE_VERSION 3   /* 2: Q_SEARCH epoch, Q_SEARCH+1 cn/epoch/qlen/rflags, Q_ROUTER;
				* 3: Q_ROUTER owners */
#define DM_WIRE_HDR_LEN 24u
/* Largest message any decoder accepts (header + payload). */
#define DM_WIRE_MAX_LEN (1u << 30)

enum dm_wire_op {
	/* 0x0001-0x00ff: handshake */
	DM_OP_HS_HELLO   = 0x0001,
	DM_OP_HS_REPLY   = 0x0002,
	DM_OP_HS_AUTH    = 0x0003,
	DM_OP_HS_RESULT  = 0x0004,
	DM_OP_HS_HELLO_CLIENT = 0x0005,
	/* 0x0100-0x01ff: tcp transport */
	DM_OP_READ_REQ   = 0x0100,
	DM_OP_READ_RESP  = 0x0101,
	DM_OP_WRITE_REQ  = 0x0102,
	DM_OP_WRITE_RESP = 0x0103,
	DM_OP_CAS_REQ    = 0x0104,
	DM_OP_CAS_RESP   = 0x0105,
	DM_OP_FAA_REQ    = 0x0106,
	DM_OP_FAA_RESP   = 0x0107,
	DM_OP_SEND       = 0x0108,
	DM_OP_SEND_ACK   = 0x0109,
	/* 0x1000-0x1fff: control RPC (enum dm_wire_ctl_op, enum dm_wire_fl_op) */
	DM_OP_CTL_FIRST  = 0x1000,
	DM_OP_CTL_LAST   = 0x1fff,
	/* 0x2000-0x2fff: CN-to-CN forwarded messages (enum dm_wire_fwd_op) */
	DM_OP_FWD_FIRST  = 0x2000,
	DM_OP_FWD_LAST   = 0x2fff,
};

/* Common header. */
struct dm_wire_hdr {
	uint32_t magic;
	uint8_t version;
	uint8_t flags;
	uint16_t op;
	uint32_t length;
	int32_t status;
	uint64_t req_id;
};
_Static_assert(sizeof(struct dm_wire_hdr) == DM_WIRE_HDR_LEN, "wire header layout");

/* ---- handshake bodies ---- */
#define DM_HS_NONCE_LEN   32
#define DM_HS_PROOF_LEN   32
#define DM_HS_CLUSTER_LEN 64   /* NUL-padded, at least one NUL, not empty */

struct dm_wire_hs_hello {      /* HS_HELLO */
	uint16_t version;          /* protocol version the client speaks */
	uint16_t flags;            /* 0 */
	uint32_t reserved;         /* 0 */
	uint8_t nonce[DM_HS_NONCE_LEN];
	char cluster[DM_HS_CLUSTER_LEN];
};
_Static_assert(sizeof(struct dm_wire_hs_hello) == 104, "hs_hello layout");

struct dm_wire_hs_reply {      /* HS_REPLY */
	uint16_t version;
	uint16_t flags;
	uint32_t reserved;
	uint8_t nonce[DM_HS_NONCE_LEN];
	uint8_t proof[DM_HS_PROOF_LEN];
	char cluster[DM_HS_CLUSTER_LEN];
};
_Static_assert(sizeof(struct dm_wire_hs_reply) == 136, "hs_reply layout");

struct dm_wire_hs_hello_client {   /* HS_HELLO_CLIENT */
	struct dm_wire_hs_hello hello;
	char client[DM_HS_CLUSTER_LEN];    /* identity: NUL-padded, [A-Za-z0-9_.-]{1,63} */
};
_Static_assert(sizeof(struct dm_wire_hs_hello_client) == 168, "hs_hello_client layout");

struct dm_wire_hs_auth {       /* HS_AUTH */
	uint8_t proof[DM_HS_PROOF_LEN];
};
_Static_assert(sizeof(struct dm_wire_hs_auth) == 32, "hs_auth layout");
/* HS_RESULT has no body: the header status says accepted (0) or refused (-errno). */

/* ---- tcp transport bodies ---- */
struct dm_wire_rw_req {        /* READ_REQ, WRITE_REQ (WRITE: followed by len bytes) */
	uint64_t remote;
	uint32_t rkey;
	uint32_t len;
};
_Static_assert(sizeof(struct dm_wire_rw_req) == 16, "rw_req layout");

struct dm_wire_cas_req {       /* CAS_REQ */
	uint64_t remote;
	uint32_t rkey;
	uint32_t reserved;         /* 0 */
	uint64_t compare;
	uint64_t swap;
};
_Static_assert(sizeof(struct dm_wire_cas_req) == 32, "cas_req layout");

struct dm_wire_faa_req {       /* FAA_REQ */
	uint64_t remote;
	uint32_t rkey;
	uint32_t reserved;         /* 0 */
	uint64_t add;
};
_Static_assert(sizeof(struct dm_wire_faa_req) == 24, "faa_req layout");

struct dm_wire_atomic_resp {   /* CAS_RESP, FAA_RESP when status == 0 */
	uint64_t old;
};
_Static_assert(sizeof(struct dm_wire_atomic_resp) == 8, "atomic_resp layout");
/* READ_RESP: header + data (status 0) or header only (error). WRITE_RESP, SEND_ACK: header. */

/* Largest fixed body of any transport message: a reader needs this many bytes after the
 * header before it can decode the body. */
#define DM_WIRE_MAX_FIXED_BODY 32u

/* Little-endian helpers (dm_put_le*, dm_get_le*): util/dm_buf.h. */

/* Header. encode writes DM_WIRE_HDR_LEN bytes (fills magic and version itself). decode
 * checks magic, version, length (>= header, <= DM_WIRE_MAX_LEN), flags == 0:
 * 0, -EBADMSG (len < header or bad magic/length) or -EPROTO (other version, flags). */
void dm_wire_hdr_encode(uint8_t *buf, uint16_t op, uint32_t length, int32_t status,
			uint64_t req_id);
int dm_wire_hdr_decode(const uint8_t *buf, size_t len, struct dm_wire_hdr *h);

/* Expected body size for op: fixed part only (READ_RESP/WRITE_REQ/SEND add a payload).
 * For responses with status != 0 the body is empty. -EPROTO for an op outside the handshake
 * and transport ranges. */
int dm_wire_body_len(uint16_t op, int32_t status);

/* Check that a decoded header's length fits its op: exactly header + fixed body, or for
 * READ_RESP (status 0), WRITE_REQ, SEND at least that. 0 or -EBADMSG/-EPROTO. */
int dm_wire_check_len(const struct dm_wire_hdr *h);

/* Bodies: encode writes exactly sizeof(struct) bytes; decode needs len >= that many bytes and
 * validates reserved fields (0 or -EBADMSG/-EPROTO). */
void dm_wire_hs_hello_encode(uint8_t *buf, const struct dm_wire_hs_hello *m);
int dm_wire_hs_hello_decode(const uint8_t *buf, size_t len, struct dm_wire_hs_hello *m);
void dm_wire_hs_hello_client_encode(uint8_t *buf, const struct dm_wire_hs_hello_client *m);
int dm_wire_hs_hello_client_decode(const uint8_t *buf, size_t len,
				   struct dm_wire_hs_hello_client *m);
/* A client identity name: 1..63 of [A-Za-z0-9_.-]. */
bool dm_wire_client_name_ok(const char *name);
void dm_wire_hs_reply_encode(uint8_t *buf, const struct dm_wire_hs_reply *m);
int dm_wire_hs_reply_decode(const uint8_t *buf, size_t len, struct dm_wire_hs_reply *m);
void dm_wire_hs_auth_encode(uint8_t *buf, const struct dm_wire_hs_auth *m);
int dm_wire_hs_auth_decode(const uint8_t *buf, size_t len, struct dm_wire_hs_auth *m);

void dm_wire_rw_req_encode(uint8_t *buf, const struct dm_wire_rw_req *m);
int dm_wire_rw_req_decode(const uint8_t *buf, size_t len, struct dm_wire_rw_req *m);
void dm_wire_cas_req_encode(uint8_t *buf, const struct dm_wire_cas_req *m);
int dm_wire_cas_req_decode(const uint8_t *buf, size_t len, struct dm_wire_cas_req *m);
void dm_wire_faa_req_encode(uint8_t *buf, const struct dm_wire_faa_req *m);
int dm_wire_faa_req_decode(const uint8_t *buf, size_t len, struct dm_wire_faa_req *m);
void dm_wire_atomic_resp_encode(uint8_t *buf, const struct dm_wire_atomic_resp *m);
int dm_wire_atomic_resp_decode(const uint8_t *buf, size_t len, struct dm_wire_atomic_resp *m);

/* Validate a NUL-padded cluster name field: non-empty, NUL-terminated inside the field.
 * 0 or -EBADMSG. */
int dm_wire_cluster_check(const char name[DM_HS_CLUSTER_LEN]);

/* ---- control RPC between CN/CLI and MN (0x1000-0x1fff) -------------------------------
 *
 * Carried as the payload of a transport SEND; every request is answered by exactly one
 * response with op = request op + 1, the same req_id and status 0 or -errno. Bulk data never
 * travels in control messages: a loader ALLOCs an object, fills it with one-sided WRITEs and
 * COMMITs it with its crc32 (zlib), which the MN verifies before the object becomes visible.
 *
 *   CTL_INFO      {}                         -> {region addr/len/rkey, used, node id, ...}
 *   CTL_ALLOC     obj{key, len}              -> obj{key, len, addr}     (-EEXIST, -ENOSPC)
 *   CTL_COMMIT    obj{key, len, aux=crc32}   -> {}                      (-EBADMSG: crc)
 *   CTL_LOOKUP    obj{key}                   -> obj{key, len, addr, aux=crc32} (-ENOENT)
 *   CTL_DROP      obj{key, aux=mask}         -> obj{len=objects dropped}
 *   CTL_SNAPSHOT  {}                         -> {}
 *   CTL_GEN_PUBLISH  gen{index, gen, cn=NONE} -> gen_state   (loader: make gen current)
 *   CTL_GEN_REPORT   gen{index, gen, cn}      -> gen_state   (CN: the oldest generation it
 *                                              still uses; cn = NONE only reads the state;
 *                                              gen = DM_GEN_NONE: it reads nothing of it)
 *   CTL_GEN_LIST     {}                       -> gen_list    (every used entry of the
 *                                              generation table: u32 count, u32 0, then
 *                                              count x gen_entry; count <= DM_MAX_GRAPHS)
 *   CTL_GEN_DROP     gen{index, gen, cn=NONE} -> gen_state   (drop graph `index`: gen must
 *                                              be its current generation, -ESTALE if not,
 *                                              -ENOENT for no such graph, -EBUSY while an
 *                                              older retired one is held; twice: 0)
 *   CTL_ATOMIC    atomic{addr, compare, value, op} -> atomic{old in compare}: an 8-byte CAS
 *                 (op 0) or FAA (op 1) at a region address, done by the memory node's CPU,
 *                 for transports whose device has no atomics (-EFAULT: outside the region
 *                 or not 8-aligned)
 * Error responses have no body.
 *
 * Index generations (docs/architecture.md, "Index generations"): every HNSW index has a
 * generation number, bumped by every `dmann load`. A generation's objects have their own
 * keys (dm_gen_meta_key, dm_gen_block_key), so the objects of generation g stay intact
 * while g+1 is written. PUBLISH makes g+1 current on a memory node (its metadata must be
 * committed there; -EBUSY while an older retired generation is still held, -ESTALE if
 * gen is not above the current one) and retires g; the memory node frees g's objects once
 * every compute node of the cluster file REPORTed a generation >= g+1, or has not
 * reported for lease_ms ([cn] lease_ms; a CN stops reading from a memory node it could
 * not report to for lease_ms / 2). A CN reports every refresh_ms.
 *
 * DROP removes a graph: the current generation's metadata object goes at once (a restarted
 * memory node never brings the graph back: at restore, the HNSW blocks of an index without
 * any metadata object are dropped as leftovers), the current generation becomes the
 * retired one (no current), and its blocks are freed by the rule above (a CN that reads
 * nothing of the graph reports DM_GEN_NONE). An entry with neither generation is free
 * again. A later load of the same graph number waits for that release first (the loader's
 * dgen_wait_released; the memory node refuses PUBLISH with -EBUSY meanwhile) and may start
 * again at generation 1: its block keys can only collide with blocks of a generation of the
 * same parity, and none is held any more by then.
 */
enum dm_wire_ctl_op {
	DM_OP_CTL_INFO     = 0x1000,
	DM_OP_CTL_ALLOC    = 0x1002,
	DM_OP_CTL_COMMIT   = 0x1004,
	DM_OP_CTL_LOOKUP   = 0x1006,
	DM_OP_CTL_DROP     = 0x1008,
	DM_OP_CTL_SNAPSHOT = 0x100a,
	DM_OP_CTL_GEN_PUBLISH = 0x100c,
	DM_OP_CTL_GEN_REPORT  = 0x100e,
	DM_OP_CTL_ATOMIC      = 0x1010,
	DM_OP_CTL_GEN_LIST    = 0x1012,
	DM_OP_CTL_GEN_DROP    = 0x1014,
	/* responses: request op + 1 */
};

#define DM_GEN_NO_CN 0xffffffffu     /* gen.cn of PUBLISH, DROP and of a read-only REPORT */
#define DM_GEN_NONE UINT64_MAX       /* gen of REPORT: this CN reads nothing of the graph
				      * (above any retired generation: releases it at once) */
#define DM_GEN_MAX_INDEX 0x7fffffu   /* index numbers of generation keys (23 bits) */
#define DM_MAX_GRAPHS 16u            /* HNSW graphs of one cluster: numbers 0..15 (the memory
				      * node's generation table has one entry each) */
/* The tag a flat index's graph mark carries (flat.h FL_MARK) when generation gen of graph
 * `graph` serves it: graph 0's tag is the bare generation, as before graph numbers. */
static inline uint64_t dm_graph_tag(uint32_t graph, uint64_t gen)
{
	return (uint64_t)graph << 32 | (uint32_t)gen;
}
/* The tag of an index a bulk import is writing (no graph number: nothing serves it; the
 * import's last mark replaces it; no graph is built for it meanwhile). */
#define DM_GRAPH_TAG_IMPORT ((uint64_t)DM_MAX_GRAPHS << 32)

struct dm_wire_ctl_gen {       /* CTL_GEN_PUBLISH, CTL_GEN_REPORT, CTL_GEN_DROP request */
	uint64_t gen;              /* PUBLISH: the new generation (> 0); REPORT: the oldest
				    * generation the CN still serves (0: none reported yet,
				    * DM_GEN_NONE: reads nothing); DROP: the current one */
	uint32_t index;            /* <= DM_GEN_MAX_INDEX (0: the HNSW index of dmann load) */
	uint32_t cn;               /* CN id < 256, or DM_GEN_NO_CN */
};
_Static_assert(sizeof(struct dm_wire_ctl_gen) == 16, "ctl_gen layout");

struct dm_wire_ctl_gen_state { /* response of PUBLISH, REPORT, DROP */
	uint64_t current;          /* the current generation (see flags) */
	uint64_t retired;          /* the generation whose objects are still held (see flags) */
	uint32_t waiting;          /* CNs that hold the retired generation back */
	uint32_t lease_ms;         /* the memory node's lease */
	uint32_t flags;            /* DM_GEN_F_* */
	uint32_t reserved;         /* 0 */
};
_Static_assert(sizeof(struct dm_wire_ctl_gen_state) == 32, "ctl_gen_state layout");
#define DM_GEN_F_CURRENT 1u    /* an index is there: current is valid */
#define DM_GEN_F_RETIRED 2u    /* retired is valid (and < current when both; alone after a
				* DROP) */

struct dm_wire_ctl_gen_entry { /* one generation-table entry of CTL_GEN_LIST's response */
	uint32_t index;            /* <= DM_GEN_MAX_INDEX */
	uint32_t flags;            /* DM_GEN_F_*; neither: only compute nodes' reports */
	uint64_t current;          /* with DM_GEN_F_CURRENT, else 0 */
	uint64_t retired;          /* with DM_GEN_F_RETIRED, else 0 */
};
_Static_assert(sizeof(struct dm_wire_ctl_gen_entry) == 24, "ctl_gen_entry layout");
#define DM_WIRE_CTL_GEN_LIST_HDR 8u   /* u32 count, u32 reserved (0) */
#define DM_WIRE_CTL_GEN_LIST_MAX (DM_WIRE_CTL_GEN_LIST_HDR + DM_MAX_GRAPHS * 24u)

struct dm_wire_ctl_gen_list {  /* CTL_GEN_LIST response, decoded (not a wire layout) */
	uint32_t count;            /* <= DM_MAX_GRAPHS */
	struct dm_wire_ctl_gen_entry e[DM_MAX_GRAPHS];
};

/* Object keys of generation gen of HNSW index `index`, in cluster.h's dm_obj_key layout
 * (kind << 56 | index << 32 | number): the metadata's number is the generation's low 32
 * bits; blocks carry the generation's parity in bit 23 of the index field (at most two
 * generations of an index exist at a time: current and retired). Generation 0 is an index
 * loaded before generations existed (its keys are the old ones). */
#define DM_GEN_KIND_META  1u           /* = DM_OBJ_HNSW_META */
#define DM_GEN_KIND_BLOCK 2u           /* = DM_OBJ_HNSW_BLOCK */
#define DM_GEN_SLOT_BIT   (1ull << 55) /* bit 23 of the index field */
#define DM_GEN_BLOCK_MASK 0xffffffff00000000ull   /* every block of one generation */
static inline uint64_t dm_gen_meta_key(uint32_t index, uint64_t gen)
{
	return ((uint64_t)DM_GEN_KIND_META << 56) | ((uint64_t)(index & DM_GEN_MAX_INDEX) << 32) |
	       (uint32_t)gen;
}
static inline uint64_t dm_gen_block_key(uint32_t index, uint64_t gen, uint32_t block)
{
	return ((uint64_t)DM_GEN_KIND_BLOCK << 56) | ((uint64_t)(index & DM_GEN_MAX_INDEX) << 32) |
	       ((gen & 1) ? DM_GEN_SLOT_BIT : 0) | block;
}

struct dm_wire_ctl_info {      /* CTL_INFO response */
	uint64_t region_addr;      /* address to use in READ/WRITE with rkey */
	uint64_t region_len;
	uint64_t used;             /* bytes allocated */
	uint32_t rkey;
	uint32_t node_id;
	uint32_t objects;          /* committed objects */
	uint8_t huge;              /* region on hugepages */
	uint8_t reserved[3];       /* 0 */
	int32_t numa_node;         /* -1: unbound */
	uint32_t reserved2;        /* 0 */
};
_Static_assert(sizeof(struct dm_wire_ctl_info) == 48, "ctl_info layout");

struct dm_wire_ctl_obj {       /* object descriptor: ALLOC, COMMIT, LOOKUP, DROP */
	uint64_t key;
	uint64_t len;
	uint64_t addr;
	uint64_t aux;              /* crc32 (COMMIT, LOOKUP; COMMIT may add
				      DM_CTL_COMMIT_MUTABLE) or key mask (DROP) */
};
struct dm_wire_ctl_atomic {    /* CTL_ATOMIC request and response */
	uint64_t addr;             /* region address (as CTL_INFO gives it), 8-aligned */
	uint64_t compare;          /* CAS: expected; response: the old value */
	uint64_t value;            /* CAS: the new value; FAA: what is added */
	uint32_t op;               /* DM_CTL_ATOMIC_CAS or _FAA */
	uint32_t reserved;         /* 0 */
};
_Static_assert(sizeof(struct dm_wire_ctl_atomic) == 32, "ctl_atomic layout");
#define DM_CTL_ATOMIC_CAS 0u
#define DM_CTL_ATOMIC_FAA 1u

/* COMMIT: the object changes after its commit (HNSW blocks of an index written online). */
#define DM_CTL_COMMIT_MUTABLE (UINT64_C(1) << 32)
_Static_assert(sizeof(struct dm_wire_ctl_obj) == 32, "ctl_obj layout");

/* Fixed body length of a control message, or -EPROTO for an unknown control op (for a
 * CTL_GEN_LIST response with status 0: DM_WIRE_CTL_GEN_LIST_HDR, its fixed part). */
int dm_wire_ctl_body_len(uint16_t op, int32_t status);
/* Validate a decoded control header against the buffer length it came in: the op is a
 * control op, length equals the buffer length and header + fixed body (a CTL_GEN_LIST
 * response: header + fixed part + up to DM_MAX_GRAPHS whole entries). 0, -EBADMSG,
 * -EPROTO. */
int dm_wire_ctl_check(const struct dm_wire_hdr *h, size_t buflen);
void dm_wire_ctl_info_encode(uint8_t *buf, const struct dm_wire_ctl_info *m);
int dm_wire_ctl_info_decode(const uint8_t *buf, size_t len, struct dm_wire_ctl_info *m);
void dm_wire_ctl_obj_encode(uint8_t *buf, const struct dm_wire_ctl_obj *m);
void dm_wire_ctl_atomic_encode(uint8_t *buf, const struct dm_wire_ctl_atomic *m);
/* op CAS or FAA, reserved 0. */
int dm_wire_ctl_atomic_decode(const uint8_t *buf, size_t len, struct dm_wire_ctl_atomic *m);
int dm_wire_ctl_obj_decode(const uint8_t *buf, size_t len, struct dm_wire_ctl_obj *m);
/* gen decode: index <= DM_GEN_MAX_INDEX, cn < DM_MAX_NODES_WIRE or DM_GEN_NO_CN. state
 * decode: known flags, retired < current when both are there (RETIRED alone: a dropped
 * graph), waiting 0 and retired 0 without RETIRED, reserved 0. */
void dm_wire_ctl_gen_encode(uint8_t *buf, const struct dm_wire_ctl_gen *m);
int dm_wire_ctl_gen_decode(const uint8_t *buf, size_t len, struct dm_wire_ctl_gen *m);
void dm_wire_ctl_gen_state_encode(uint8_t *buf, const struct dm_wire_ctl_gen_state *m);
int dm_wire_ctl_gen_state_decode(const uint8_t *buf, size_t len,
				 struct dm_wire_ctl_gen_state *m);
/* gen_list encode writes DM_WIRE_CTL_GEN_LIST_HDR + count * 24 bytes (count <=
 * DM_MAX_GRAPHS; buf has room for DM_WIRE_CTL_GEN_LIST_MAX) and returns that length. decode
 * needs len exactly that, count <= DM_MAX_GRAPHS, reserved 0, and per entry: index <=
 * DM_GEN_MAX_INDEX and no index twice, known flags, current 0 without CURRENT and retired 0
 * without RETIRED, retired < current with both. 0 or -EBADMSG. */
size_t dm_wire_ctl_gen_list_encode(uint8_t *buf, const struct dm_wire_ctl_gen_list *m);
int dm_wire_ctl_gen_list_decode(const uint8_t *buf, size_t len, struct dm_wire_ctl_gen_list *m);

/* ---- native query protocol: client <-> compute node (0x3000-0x30ff) --------------------
 *
 * Carried as transport SEND payloads on a client's connection to a CN; a client may keep
 * many SEARCH requests in flight (answers can come back in any order; qid matches them).
 *
 *   Q_SEARCH  search{qid, k, ef, dim, flags, epoch} + dim f32
 *                                                    -> result{qid, n, counters, cn, epoch,
 *                                                       qlen, rflags} + n hits
 *             (flags: beam; ROUTED when a client picked this CN with the oracle of `epoch`,
 *             SPILLED when that CN is not the query's top-ranked one. The answer names the
 *             CN that ran the query, its routing epoch and local queue length: what a
 *             client-side router follows, cn/client/dmann_route.c)
 *   Q_ROUTER  {}                                        -> router{epoch, strategy, batch,
 *                                                       ncn, self, hash} + ncn u32 owners
 *                                                       + the oracle's wire form (oracle.h;
 *                                                       client-allowed)
 *             (owners[p]: the CN that serves partition p now, dm_oracle_owners: the
 *             partitions of CNs the cluster state declares down go to ring neighbours;
 *             epoch is the routing epoch, dm_oracle_route_epoch of the oracle's epoch and
 *             the owners, so it changes when a CN joins or leaves)
 *   Q_CONFIG  config{cache bytes, admission ppm, flags} -> {}    (flags: CLEAR the cache)
 *   Q_STATS   {}                                        -> stats{cache and query counters}
 *   Q_INSERT  insert{n, dim, ef} + n x dim f32          -> inserted{n, counters} + n u64 ids
 *             (admin: online inserts into the loaded index, cn_insert.h; rows 0..n-1 got
 *             ids[0..n-1]; on an error the first `n` rows of the answer were inserted)
 * A failed search answers Q_SEARCH+1 with status -errno and a result body whose n is 0
 * (so that the client still learns the qid).
 */
enum dm_wire_q_op {
	DM_OP_Q_SEARCH = 0x3000,
	DM_OP_Q_CONFIG = 0x3002,
	DM_OP_Q_STATS  = 0x3004,
	DM_OP_Q_INSERT = 0x3006,
	DM_OP_Q_ROUTER = 0x3008,
	/* responses: request op + 1 */
};

#define DM_Q_MAX_DIM 4096u
#define DM_Q_MAX_K   1024u
#define DM_Q_MAX_EF  65536u
#define DM_Q_CONFIG_CLEAR 1u

struct dm_wire_q_search {      /* Q_SEARCH request, followed by dim little-endian f32 */
	uint64_t qid;
	uint32_t k;
	uint32_t ef;
	uint32_t dim;
	uint32_t flags;            /* bits 0-6: beam b (0 = 1; level-0 candidates expanded per
				      round trip with neighbour codes), DM_Q_F_ROUTED,
				      DM_Q_F_SPILLED (only with ROUTED), other bits 0 */
	uint32_t epoch;            /* ROUTED: the routing epoch of the client's oracle, else 0 */
	uint32_t graph;            /* the HNSW graph searched, < DM_MAX_GRAPHS (0: the default
				      one, what clients that predate graph numbers send); ROUTED
				      only with graph 0 (the router's partitions are graph 0's) */
};
_Static_assert(sizeof(struct dm_wire_q_search) == 32, "q_search layout");
#define DM_Q_BEAM_MASK 0x7fu
#define DM_Q_MAX_BEAM  16u
#define DM_Q_F_ROUTED  0x80u   /* the client routed it here (client-side routing) */
#define DM_Q_F_SPILLED 0x100u  /* ... to a CN other than its top-ranked one */

struct dm_wire_q_result {      /* Q_SEARCH response, followed by n hits */
	uint64_t qid;
	uint32_t n;
	uint32_t hops;
	uint32_t reads;            /* records read from memory nodes */
	uint32_t round_trips;      /* batches that needed at least one remote READ */
	uint32_t cache_hits;
	uint32_t rereads;          /* records read again after failing validation */
	uint64_t bytes;            /* bytes read from memory nodes */
	uint64_t latency_ns;       /* time the CN spent on the query */
	uint32_t cn;               /* node id of the CN that ran it */
	uint32_t epoch;            /* that CN's routing epoch (DM_Q_R_ORACLE) */
	uint32_t qlen;             /* that CN's local queue length when it answered */
	uint32_t rflags;           /* DM_Q_R_* */
};
_Static_assert(sizeof(struct dm_wire_q_result) == 64, "q_result layout");
#define DM_Q_R_ORACLE  1u      /* the CN routes with an oracle of `epoch` */
#define DM_Q_R_RELAYED 2u      /* the query was relayed to it through a memory node */
#define DM_Q_R_STRATEGY_SHIFT 4 /* bits 4-6: the CN's enum dm_route_strategy */
#define DM_Q_R_MASK    0x73u

struct dm_wire_q_router {      /* Q_ROUTER response, followed by the oracle's wire form */
	uint32_t epoch;            /* routing epoch of the oracle */
	uint32_t strategy;         /* enum dm_route_strategy the CN routes with */
	uint32_t batch;            /* routing batch (queries between two limit updates) */
	uint32_t ncn;              /* compute nodes = oracle groups */
	uint32_t self;             /* node id of the answering CN */
	uint32_t metric;           /* the index's enum dm_metric (cosine: ranked normalised) */
	uint64_t centroid_hash;    /* as FWD_ROUTER reports it */
};
_Static_assert(sizeof(struct dm_wire_q_router) == 32, "q_router layout");

struct dm_wire_q_hit {
	uint64_t id;
	float dist;                /* docs/api.md's: L2 (not squared), 1 - cos, -<q, x> */
	uint32_t reserved;         /* 0 */
};
_Static_assert(sizeof(struct dm_wire_q_hit) == 16, "q_hit layout");

struct dm_wire_q_config {      /* Q_CONFIG request */
	uint64_t cache_bytes;
	uint32_t admit_ppm;        /* admission probability once full, parts per million */
	uint32_t flags;            /* DM_Q_CONFIG_CLEAR */
};
_Static_assert(sizeof(struct dm_wire_q_config) == 16, "q_config layout");

struct dm_wire_q_stats {       /* Q_STATS response */
	uint64_t hits, misses, evictions, entries;
	uint64_t cache_bytes, capacity_bytes;
	uint64_t queries, errors;
	uint64_t index_bytes;      /* size of the index's records (for cache ratios) */
	uint32_t node_id, workers;
	uint64_t failovers;        /* READs reissued to another replica */
	uint64_t mn_downs, mn_ups; /* memory nodes marked down / up again */
	uint32_t mn_down;          /* memory nodes down now */
	uint32_t reserved;
	/* Locality of the answered queries' READs (bytes 112..151, added with issue 15; a
	 * Q_STATS answer of 112 bytes is refused): queries counted, the sums over them of the
	 * distinct memory nodes and distinct blocks their READs touched, their round trips
	 * (batches with a remote READ) and the sum over those of the distinct memory nodes
	 * one batch's READs went to. Means: loc_q_mns / loc_queries per query, loc_rt_mns /
	 * loc_rts per round trip. */
	uint64_t loc_queries, loc_q_mns, loc_q_blocks, loc_rts, loc_rt_mns;
};
_Static_assert(sizeof(struct dm_wire_q_stats) == 152, "q_stats layout");

#define DM_Q_MAX_INSERT 256u   /* rows per Q_INSERT (and its message must fit the CN's
				  receive buffers, DM_CN_RECV_BUF) */
#define DM_CN_RECV_BUF 16384u  /* a compute node's receive buffer: the longest message a
				  client may send it */

struct dm_wire_q_insert {      /* Q_INSERT request, followed by n x dim little-endian f32 */
	uint32_t n;                /* 1..DM_Q_MAX_INSERT */
	uint32_t dim;              /* 1..DM_Q_MAX_DIM */
	uint32_t ef;               /* efConstruction of the insert's search (0: 100) */
	uint32_t graph;            /* the graph inserted into, < DM_MAX_GRAPHS (this word was
				      a flags word that had to be 0: graph 0) */
};
_Static_assert(sizeof(struct dm_wire_q_insert) == 16, "q_insert layout");

struct dm_wire_q_inserted {    /* Q_INSERT response, followed by n u64 ids */
	uint32_t n;                /* rows inserted (all of them on success) */
	uint32_t links;            /* back-links written into neighbours' records */
	uint32_t links_dropped;    /* back-links not made (neighbour's list kept, or its lock
				      not taken in time) */
	uint32_t lock_retries;     /* CAS attempts that found the record held or changed */
	uint32_t rereads;          /* records read again after failing validation */
	uint32_t reads;            /* records read */
	uint64_t latency_ns;       /* time the CN spent on the batch */
};
_Static_assert(sizeof(struct dm_wire_q_inserted) == 32, "q_inserted layout");

/* Check a query-protocol message (header decoded from a buffer of buflen bytes): known op,
 * length consistent with the body (SEARCH: dim floats; result: n hits). 0 or -EBADMSG /
 * -EPROTO. */
int dm_wire_q_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen);
void dm_wire_q_search_encode(uint8_t *buf, const struct dm_wire_q_search *m);
int dm_wire_q_search_decode(const uint8_t *buf, size_t len, struct dm_wire_q_search *m);
void dm_wire_q_result_encode(uint8_t *buf, const struct dm_wire_q_result *m);
int dm_wire_q_result_decode(const uint8_t *buf, size_t len, struct dm_wire_q_result *m);
void dm_wire_q_router_encode(uint8_t *buf, const struct dm_wire_q_router *m);
/* q_router decode: strategy and metric known, batch >= 1, 1 <= ncn <= DM_MAX_NODES_WIRE,
 * self < DM_MAX_NODES_WIRE. */
int dm_wire_q_router_decode(const uint8_t *buf, size_t len, struct dm_wire_q_router *m);
/* The owner table after the fixed part of a Q_ROUTER body of len bytes whose fixed part
 * decoded into h: owner[0 .. h->ncn) (each < ncn). The oracle follows at
 * sizeof(struct dm_wire_q_router) + 4 * ncn. 0 or -EBADMSG. */
int dm_wire_q_router_owners(const uint8_t *buf, size_t len, const struct dm_wire_q_router *h,
			    uint32_t *owner);
void dm_wire_q_hit_encode(uint8_t *buf, const struct dm_wire_q_hit *m);
int dm_wire_q_hit_decode(const uint8_t *buf, size_t len, struct dm_wire_q_hit *m);
void dm_wire_q_config_encode(uint8_t *buf, const struct dm_wire_q_config *m);
int dm_wire_q_config_decode(const uint8_t *buf, size_t len, struct dm_wire_q_config *m);
void dm_wire_q_stats_encode(uint8_t *buf, const struct dm_wire_q_stats *m);
void dm_wire_q_insert_encode(uint8_t *buf, const struct dm_wire_q_insert *m);
int dm_wire_q_insert_decode(const uint8_t *buf, size_t len, struct dm_wire_q_insert *m);
void dm_wire_q_inserted_encode(uint8_t *buf, const struct dm_wire_q_inserted *m);
int dm_wire_q_inserted_decode(const uint8_t *buf, size_t len, struct dm_wire_q_inserted *m);
int dm_wire_q_stats_decode(const uint8_t *buf, size_t len, struct dm_wire_q_stats *m);
/* dim floats after the search body (little-endian on the wire, as on every host we run). */
void dm_wire_put_f32s(uint8_t *buf, const float *v, uint32_t n);
void dm_wire_get_f32s(const uint8_t *buf, float *v, uint32_t n);


/* ---- forwarded messages between compute nodes, via memory nodes (0x2000-0x2fff) -------
 *
 * CNs hold no CN-to-CN connections. A CN opens connections to every MN and makes FWD_HELLO
 * the first message on each; the MN then hands that connection to its forwarding thread.
 * role SERVE marks the connection on which the CN takes forwarded queries (one per CN per
 * MN); role ORIGIN marks a connection (a worker's) on which the CN sends queries to forward
 * and gets their answers back.
 *
 *   FWD_HELLO   hello{cn, role}                          (no response)
 *   FWD_QUERY   fwd{target, origin, token} + a whole Q_SEARCH message (header included)
 *               origin CN -> random MN; the MN sets token (its id of the origin connection)
 *               and re-sends it unchanged otherwise on the target's SERVE connection.
 *   FWD_RESULT  fwd{same} + a whole Q_SEARCH+1 message   target CN -> MN -> the connection
 *               named by token (the origin's), which answers its client with the inner message
 *   FWD_BOUNCE  fwd{same} + the Q_SEARCH message         MN -> origin when the target has no
 *               SERVE connection (not up yet): the origin runs the query itself
 *   FWD_STATE   state{cn, epoch, qlen, nsample, entries, seq, next, flags} + nsample u32
 *               cached ids (the 1/csp_slice hash slice of the CN's cache, default 1/64) -> table{...} + n
 *               entries{cn, qlen, age, epoch, next, flags}:
 *               every CN reports to every MN; each MN keeps the last report of each CN and
 *               answers with all it knows and the cache split penalty of the stored samples.
 *   FWD_ROUTER  (client -> CN on its native port) rcfg{set, strategy, batch, pause, spill_cache,
 *               refresh}
 *               -> rstats{...}: select the routing strategy (set = 1) and read the counters.
 * Error responses have no body. Forwarded messages are carried whole so that a relay never
 * re-encodes a query or an answer.
 */
enum dm_wire_fwd_op {
	DM_OP_FWD_HELLO  = 0x2000,
	DM_OP_FWD_QUERY  = 0x2002,
	DM_OP_FWD_RESULT = 0x2003,   /* the response of FWD_QUERY */
	DM_OP_FWD_BOUNCE = 0x2004,
	DM_OP_FWD_STATE  = 0x2006,   /* response 0x2007 */
	DM_OP_FWD_ROUTER = 0x2008,   /* response 0x2009 */
};

enum { DM_FWD_ROLE_ORIGIN = 0, DM_FWD_ROLE_SERVE = 1 };
enum dm_route_strategy {
	DM_ROUTE_NONE = 0, DM_ROUTE_BESTFIT, DM_ROUTE_BALANCED, DM_ROUTE_ADAPTIVE,
	DM_ROUTE_ADAPTIVE_RING, DM_ROUTE_COUNT
};
#define DM_FWD_CSP_NONE 0xffffffffu  /* csp_ppm when no estimate exists */
#define DM_FWD_MAX_SAMPLE 3072u      /* ids in one FWD_STATE */
#define DM_FWD_MAX_BATCH 1000000u
#define DM_FWD_NO_SAMPLE UINT64_MAX
#define DM_MAX_NODES_WIRE 256u       /* node ids on the wire (= DM_MAX_NODES of config.h) */

struct dm_wire_fwd_hello {     /* FWD_HELLO */
	uint32_t cn;
	uint32_t role;             /* DM_FWD_ROLE_* */
};
_Static_assert(sizeof(struct dm_wire_fwd_hello) == 8, "fwd_hello layout");

struct dm_wire_fwd {           /* FWD_QUERY, FWD_RESULT, FWD_BOUNCE, before the inner message */
	uint32_t target;           /* CN that runs the query */
	uint32_t origin;           /* CN whose client sent it */
	uint64_t token;            /* set by the relaying MN: the origin connection */
	uint32_t flags;            /* DM_FWD_F_* */
	uint32_t reserved;         /* 0 */
};
_Static_assert(sizeof(struct dm_wire_fwd) == 24, "fwd layout");
/* Set by the origin from its routing decision, so that no CN ranks the query again: the
 * target is not the query's top-ranked CN (the limits spilled it there); the origin is. A
 * spilled query does not fill the cache of the CN that runs it (router.h). */
#define DM_FWD_F_SPILLED    1u
#define DM_FWD_F_ORIGIN_TOP 2u
#define DM_FWD_INNER_OFF (DM_WIRE_HDR_LEN + 24u)

struct dm_wire_fwd_state {     /* FWD_STATE request, followed by nsample u32 */
	uint32_t cn;
	uint32_t epoch;            /* re-clustering epoch the CN runs */
	uint32_t qlen;             /* local queue: queries admitted and not answered */
	uint32_t nsample;          /* <= DM_FWD_MAX_SAMPLE */
	uint64_t entries;          /* cache entries in total (the sample is ~1/csp_slice of them), or
				    * DM_FWD_NO_SAMPLE: a queue-length-only report (nsample 0);
				    * the memory node keeps the CN's last sample */
	uint64_t seq;              /* report number (diagnostics) */
	uint32_t next;             /* the epoch it rolls out (>= epoch; = epoch when none) */
	uint32_t flags;            /* DM_FWD_S_* */
};
_Static_assert(sizeof(struct dm_wire_fwd_state) == 40, "fwd_state layout");
/* fwd_state / fwd_entry flags (the two-phase epoch rollout, oracle/rollout.h) */
#define DM_FWD_S_READY    1u       /* the CN has an oracle: it routes with `epoch` */
#define DM_FWD_S_PREPARED 2u       /* it holds the oracle of `next`, built */
#define DM_FWD_S_RESEED   4u       /* it asked for `next` because its partitions do not serve
				    * (the CSP re-clustering): fit it from a new seed, not from
				    * the current centroids */
#define DM_FWD_S_MASK     7u

struct dm_wire_fwd_table {     /* FWD_STATE response, followed by n entries */
	uint32_t n;                /* <= DM_MAX_NODES */
	uint32_t epoch;            /* highest epoch reported by any CN */
	uint32_t csp_ppm;          /* CSP of the stored samples, or DM_FWD_CSP_NONE */
	uint32_t csp_cns;          /* CNs whose samples went into it */
};
_Static_assert(sizeof(struct dm_wire_fwd_table) == 16, "fwd_table layout");

struct dm_wire_fwd_entry {
	uint32_t cn;
	uint32_t qlen;
	uint32_t age_ms;           /* since the MN got this CN's report */
	uint32_t epoch;
	uint32_t next;             /* as the CN's last fwd_state */
	uint32_t flags;
};
_Static_assert(sizeof(struct dm_wire_fwd_entry) == 24, "fwd_entry layout");

struct dm_wire_fwd_rcfg {      /* FWD_ROUTER request */
	uint32_t set;              /* 1: apply strategy/batch/pause and reset counters */
	uint32_t strategy;         /* enum dm_route_strategy */
	uint32_t batch;            /* queries per routing batch (0: keep) */
	uint32_t pause;            /* local queue length that pauses routing (0: keep) */
	uint32_t spill_cache;      /* DM_FWD_SPILL_*: spilled queries fill the cache (0: keep) */
	uint32_t refresh;          /* 0, or the oracle epoch to move to (dmann route refresh):
				    * at most one past the highest epoch the CN knows of */
};
_Static_assert(sizeof(struct dm_wire_fwd_rcfg) == 24, "fwd_rcfg layout");
enum { DM_FWD_SPILL_KEEP = 0, DM_FWD_SPILL_NO = 1, DM_FWD_SPILL_YES = 2 };

struct dm_wire_fwd_rstats {    /* FWD_ROUTER response */
	uint32_t strategy, k, batch, pause;
	uint64_t centroid_hash;    /* FNV-1a of the oracle's centroids (0: no oracle) */
	uint64_t local;            /* queries run where they arrived */
	uint64_t forwarded;        /* queries sent to another CN */
	uint64_t received;         /* forwarded queries this CN ran */
	uint64_t bounced;          /* forwarded queries that came back undelivered */
	uint32_t csp_ppm;          /* online CSP, or DM_FWD_CSP_NONE */
	uint32_t csp_cns;
	uint64_t csp_age_ms;       /* age of the estimate */
	uint32_t epoch, reclusters, qlen, sample_level;
	uint64_t paused;           /* queries that waited in the intake: routing paused */
	uint32_t spill_cache;      /* 1: spilled queries fill the cache */
	uint32_t route_epoch;      /* routing epoch: the oracle epoch and the partition owners
				      (dm_oracle_route_epoch), what Q_ROUTER and answers carry */
	uint64_t admitted;         /* client-routed queries run where the client sent them */
	uint32_t next_epoch;       /* the oracle epoch being rolled out (= epoch when none) */
	uint32_t rollout;          /* DM_FWD_ROLLOUT_* */
};
_Static_assert(sizeof(struct dm_wire_fwd_rstats) == 120, "fwd_rstats layout");
/* rstats.rollout: where the CN is in the rollout of next_epoch */
enum { DM_FWD_ROLLOUT_IDLE = 0, DM_FWD_ROLLOUT_PREPARING = 1, DM_FWD_ROLLOUT_PREPARED = 2,
       DM_FWD_ROLLOUT_COUNT };

/* Check a forwarding message (header decoded from a buffer of buflen bytes): known op,
 * length consistent with the body, and for QUERY/RESULT/BOUNCE a valid inner query
 * message. 0 or -EBADMSG / -EPROTO. */
int dm_wire_fwd_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen);
void dm_wire_fwd_hello_encode(uint8_t *buf, const struct dm_wire_fwd_hello *m);
int dm_wire_fwd_hello_decode(const uint8_t *buf, size_t len, struct dm_wire_fwd_hello *m);
void dm_wire_fwd_encode(uint8_t *buf, const struct dm_wire_fwd *m);
int dm_wire_fwd_decode(const uint8_t *buf, size_t len, struct dm_wire_fwd *m);
void dm_wire_fwd_state_encode(uint8_t *buf, const struct dm_wire_fwd_state *m);
int dm_wire_fwd_state_decode(const uint8_t *buf, size_t len, struct dm_wire_fwd_state *m);
void dm_wire_fwd_table_encode(uint8_t *buf, const struct dm_wire_fwd_table *m);
int dm_wire_fwd_table_decode(const uint8_t *buf, size_t len, struct dm_wire_fwd_table *m);
void dm_wire_fwd_entry_encode(uint8_t *buf, const struct dm_wire_fwd_entry *m);
int dm_wire_fwd_entry_decode(const uint8_t *buf, size_t len, struct dm_wire_fwd_entry *m);
void dm_wire_fwd_rcfg_encode(uint8_t *buf, const struct dm_wire_fwd_rcfg *m);
int dm_wire_fwd_rcfg_decode(const uint8_t *buf, size_t len, struct dm_wire_fwd_rcfg *m);
void dm_wire_fwd_rstats_encode(uint8_t *buf, const struct dm_wire_fwd_rstats *m);
int dm_wire_fwd_rstats_decode(const uint8_t *buf, size_t len, struct dm_wire_fwd_rstats *m);
/* Strategy names ("none", "bestfit", "balanced", "adaptive", "adaptive-ring"). */
const char *dm_route_name(uint32_t strategy);
int dm_route_parse(const char *name);   /* strategy or -EINVAL */
/* ---- end of forwarded messages ---- */

/* ---- S3 flat-index RPC between CN and MN (0x1100-0x11ff, inside the control range) ----
 *
 * Owned by the S3 Vectors path (common/wire_flat.c, mn/mn_flat.c, cn/s3/cn_s3*.c). Requests
 * and responses can be larger than a receive buffer, so each is a *stream* of messages
 * with the same op and req_id whose bodies are chunk{total, off} + bytes, sent in order
 * (off increasing) until off + bytes == total; a message is at most the peer's receive
 * buffer. The response has op + 1; status < 0 (transport-level failure) comes as one
 * message with an empty chunk. Payloads (the bytes of the stream), all integers LE:
 *
 *   FL_CALL     str op, bytes json      -> u16 http status, str errtype ("" = ok), bytes json
 *               (the MN runs the S3 operation on its flat store; writes are durable
 *               (fdatasync) before it answers)
 *   FL_STATE    str bucket, str index   -> u64 epoch, i64 created_ms, u32 dim, u32 metric,
 *               bytes conf, u32 frag_rows, u32 nfrag, nfrag x {u32 rows, u32 dead},
 *               u64 mark, u64 mark_tag (the graph mark, flat.h: rows [0, mark) are in
 *               the HNSW graph of generation mark_tag), u64 gkeys (the length of its key
 *               log: nodes the online indexer added), then for a scoped index only
 *               (s3_scope.h; absent otherwise, so the answer about an unscoped index is
 *               as before) nfrag x u64 scope label (the scope value's label of the
 *               fragment's rows, 0: rows without one)
 *               (-ENOENT: no such index)
 *   FL_FRAG     str bucket, str index, u64 epoch, i64 created_ms, u64 frag, u32 from,
 *               u32 resp_msg (the requester's receive buffer: the answer's messages may
 *               be that large), [u32 max_bytes (optional: row bytes per answer)]
 *               -> u32 rows, rows x u8 dead, (rows - from) x {str key, bytes meta,
 *                  bytes fmeta, dim x f32}
 *               An answer holds at most max_bytes (and at most DM_FL_FRAG_MAX_BYTES) of
 *               row bytes, but always at least one row: `rows` is then below the
 *               fragment's row count and the requester asks again from there (a fragment
 *               of wide rows, 4096 floats and 40 KB of metadata each, is far larger than
 *               the stream cap). Tombstones are those of rows [0, rows) at that instant.
 *               (-ESTALE: the MN restarted (epoch) or the index was re-created)
 *   FL_INFO     {}                      -> u32 recv_msg (the MN's receive buffer size: the
 *               largest request message it takes; requesters start at 4096)
 *   FL_GET      str bucket, str index, i64 created_ms, u32 n, n x str key
 *               -> u32 found, found x {str key, bytes meta, bytes fmeta, dim x f32}
 *               (the current rows of the keys that exist, in request order; at most
 *               DM_FL_GET_MAX keys; -ESTALE: the index was re-created)
 *   FL_MARK     str bucket, str index, i64 created_ms, u64 rows, u64 tag -> {}
 *               (set the graph mark, flat.h flat_mark_set: -EBUSY when the index does
 *               not have exactly `rows` rows written; -ESTALE: re-created)
 *   FL_GINDEX   str bucket, str index, i64 created_ms, u64 tag, u32 n,
 *               n x {u64 node id, str key, u32 crc32c of the row's vector} -> u64 mark
 *               (the online indexer's batch, flat.h flat_gindex_add: logged, then the
 *               mark moves over the rows it holds; at most DM_FL_GINDEX_MAX entries;
 *               -ESTALE: re-created, or no graph mark of generation tag)
 *   FL_GKEYS    str bucket, str index, i64 created_ms, u64 tag, u64 from, u32 max
 *               -> u64 total, u32 n, n x {u64 node id, str key}
 *               (entries [from, from + n) of the key log, n <= max <= DM_FL_GKEYS_MAX;
 *               -ESTALE as FL_GINDEX)
 *   FL_SNAPDELTA u32 n, n x {u64 addr, u32 len} -> u32 full
 *               (served by the memory node's store, mn_store.h mn_store_snapshot_delta:
 *               bring its region snapshot up to date for these ranges of mutable objects,
 *               addresses as CTL_ALLOC gives them; full = 1 when a full snapshot was taken
 *               instead; at most DM_FL_SNAPDELTA_MAX ranges; -EINVAL: a range outside the
 *               region or in an immutable object)
 *   FL_IMAGE    u32 phase, ...: an image of one bucket, on a caught-up replica (the source
 *               of a catch-up, see "Catch-up of a stale replica" in docs/architecture.md):
 *               phase 0 TAKE: str bucket -> u64 image id, u64 len (the bucket's catalog,
 *                 attributes, live rows, graph marks and key logs at one instant, kept by
 *                 the MN until DROP or DM_FL_IMAGE_IDLE_S seconds without a READ; -ENOENT:
 *                 no such bucket; -EBUSY: the MN keeps as many images as it will already)
 *               phase 1 READ: u64 id, u64 off, u32 max (1 .. DM_FL_IMAGE_CHUNK) -> bytes
 *                 (up to max bytes from off; -ESTALE: unknown or expired id, -EINVAL: off
 *                 past the end or max out of range)
 *               phase 2 DROP: u64 id -> {} (unknown ids are not an error)
 *   FL_CATCHUP  u32 phase, ...: bring a stale replica of a bucket up to date (on it):
 *               phase 0 BEGIN: str bucket -> u64 id (from now on every write that names
 *                 the bucket (FL_CALL writes, FL_MARK, FL_GINDEX) is logged as it is
 *                 applied; one catch-up per bucket: a new BEGIN replaces an older one;
 *                 -EBUSY: as many catch-ups under way as the MN takes)
 *               phase 1 DATA: u64 id, u64 off, bytes (the image's bytes from off; sent in
 *                 order, off == the bytes received so far, else -EINVAL; at most
 *                 DM_FL_IMAGE_MAX in all, -EFBIG past it)
 *               phase 2 END: u64 id, u8 exists -> {} (with the store's writes held out:
 *                 the bucket replaced by the image (exists 0: the bucket dropped, the
 *                 source has none), the writes logged since BEGIN run again in their
 *                 order, durable before the answer; the store's epoch changes; -ESTALE:
 *                 unknown id (replaced, expired, or dropped because its log of writes
 *                 could not grow), -EBADMSG: a bad image, nothing changed; an END ends the
 *                 catch-up whatever its outcome: its id is unknown afterwards)
 *               phase 3 ABORT: u64 id -> {} (unknown ids are not an error)
 * where str and bytes are u32 length + bytes. epoch is chosen at random when the MN opens
 * its store: row numbering is valid within one epoch (a restart compacts rows).
 */
enum dm_wire_fl_op {
	DM_OP_FL_FIRST = 0x1100,
	DM_OP_FL_CALL  = 0x1100,
	DM_OP_FL_STATE = 0x1102,
	DM_OP_FL_FRAG  = 0x1104,
	DM_OP_FL_INFO  = 0x1106,
	DM_OP_FL_GET   = 0x1108,
	DM_OP_FL_MARK  = 0x110a,
	DM_OP_FL_GINDEX = 0x110c,
	DM_OP_FL_GKEYS = 0x110e,
	DM_OP_FL_SNAPDELTA = 0x1110,
	DM_OP_FL_IMAGE = 0x1112,
	DM_OP_FL_CATCHUP = 0x1114,
	DM_OP_FL_LAST  = 0x11ff,
	/* responses: request op + 1 */
};

#define DM_FL_MAX_STREAM (64u << 20)   /* largest payload a receiver accepts */
#define DM_FL_MIN_MSG 4096u            /* every FL receiver takes messages this large */
#define DM_FL_MAX_MSG (1u << 20)       /* largest message size a requester may announce */
#define DM_FL_FRAG_MAX_BYTES (32u << 20) /* most row bytes in one FL_FRAG answer */
#define DM_FL_GET_MAX 1024u            /* keys in one FL_GET */
#define DM_FL_GINDEX_MAX 8192u         /* entries in one FL_GINDEX (FLAT_GINDEX_MAX) */
#define DM_FL_GKEYS_MAX 16384u         /* entries in one FL_GKEYS answer */
#define DM_FL_SNAPDELTA_MAX (4u << 20)  /* ranges in one FL_SNAPDELTA */
#define DM_FL_IMAGE_CHUNK (16u << 20)  /* most bytes in one FL_IMAGE READ / FL_CATCHUP DATA */
#define DM_FL_IMAGE_MAX (16ull << 30)  /* largest bucket image a catch-up takes */
#define DM_FL_IMAGE_IDLE_S 120         /* an image or catch-up left idle this long is freed */
enum { DM_FL_IMAGE_TAKE = 0, DM_FL_IMAGE_READ = 1, DM_FL_IMAGE_DROP = 2 };
enum { DM_FL_CATCHUP_BEGIN = 0, DM_FL_CATCHUP_DATA = 1, DM_FL_CATCHUP_END = 2,
       DM_FL_CATCHUP_ABORT = 3 };

struct dm_wire_fl_chunk {      /* body prefix of every FL message */
	uint32_t total;            /* payload length of the whole stream */
	uint32_t off;              /* offset of this message's bytes */
};
_Static_assert(sizeof(struct dm_wire_fl_chunk) == 8, "fl_chunk layout");

/* Check an FL message (header decoded from buflen bytes): FL op, length == buflen, a chunk
 * whose bytes fit inside total <= DM_FL_MAX_STREAM. 0, -EBADMSG or -EPROTO. */
int dm_wire_fl_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen);
void dm_wire_fl_chunk_encode(uint8_t *buf, const struct dm_wire_fl_chunk *m);
int dm_wire_fl_chunk_decode(const uint8_t *buf, size_t len, struct dm_wire_fl_chunk *m);

/* Payloads are written with struct dm_buf and read with struct dm_rbuf (util/dm_buf.h). */
/* ---- end of S3 flat-index RPC ---- */

/* ---- native client data ops: libdmann <-> compute node (0x3100-0x31ff) -----------------
 *
 * libdmann's indexes are the S3 Vectors indexes (bucket + index name). Carried as transport
 * SEND payloads on a client's connection to a CN, like Q_SEARCH; many calls may be in flight
 * on one connection (req_id matches the answer; the CN answers one connection's calls in
 * order).
 *
 *   C_CALL  call{op, json_len} + json_len bytes: the S3 Vectors request body of operation op
 *           (UTF-8 JSON, exactly the HTTP body docs/api.md describes)
 *        -> call{http status, json_len} + json_len bytes: the response body (the
 *           operation's JSON, or the AWS error shape {"__type", "message"} for status >= 400)
 * The CN runs the operation through the same function its HTTP gateway calls after SigV4
 * (cn_s3_call: catalog and writes to the bucket's MN replicas, QueryVectors as the exact
 * scan fan-out + merge), so the answers are the HTTP path's byte for byte. Header status of
 * the answer: 0 when the CN ran the operation (the outcome is the http status), -ENOSYS (the
 * CN has no S3 gateway: no http address or no [s3] key), -EMSGSIZE (answer larger than
 * DM_C_MAX_RESP), -ENOMEM; then json_len is 0. A request is at most DM_C_MAX_REQ bytes (the
 * CN's receive buffers): a client splits larger puts into several calls.
 */
enum dm_wire_c_op_code {
	DM_OP_C_CALL  = 0x3100,     /* response 0x3101 */
	DM_OP_C_FIRST = 0x3100,
	DM_OP_C_LAST  = 0x31ff,
};
#define DM_C_MAX_REQ  16384u
#define DM_C_MAX_RESP (256u * 1024u)

enum dm_c_op {                 /* call.op: S3 Vectors operation */
	DM_C_CREATE_BUCKET = 1, DM_C_GET_BUCKET, DM_C_DELETE_BUCKET, DM_C_LIST_BUCKETS,
	DM_C_CREATE_INDEX, DM_C_GET_INDEX, DM_C_DELETE_INDEX, DM_C_LIST_INDEXES,
	DM_C_PUT_VECTORS, DM_C_GET_VECTORS, DM_C_DELETE_VECTORS, DM_C_LIST_VECTORS,
	DM_C_QUERY_VECTORS,
	DM_C_OP_MAX = DM_C_QUERY_VECTORS,
};

struct dm_wire_c_call {        /* C_CALL request and response, followed by json_len bytes */
	uint32_t op;               /* request: enum dm_c_op; response: HTTP status (200..599) */
	uint32_t json_len;
};
_Static_assert(sizeof(struct dm_wire_c_call) == 8, "c_call layout");

/* The S3 operation name of a dm_c_op ("CreateIndex"...), NULL if unknown. */
const char *dm_c_op_name(uint32_t op);
void dm_wire_c_call_encode(uint8_t *buf, const struct dm_wire_c_call *m);
/* Decode and validate a whole C_CALL message (header decoded from buf, buflen bytes): the
 * request's op is known, the response's status is 200..599 (or json_len 0 with a header
 * error), json_len matches the length, a request is at most DM_C_MAX_REQ bytes and a
 * response DM_C_MAX_RESP. *json points into buf. 0, -EBADMSG or -EPROTO. */
int dm_wire_c_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen,
		    struct dm_wire_c_call *m, const uint8_t **json);
/* ---- end of native client data ops ---- */

#endif /* DM_WIRE_H */
