/* handshake.c: connection handshake (version, cluster name, mutual HMAC-SHA256 proof of the
 * cluster secret) as a buffer-level state machine plus a driver over a socket. */
#include "handshake.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

enum {
	HS_C_START,        /* client: nothing sent yet */
	HS_C_WAIT_REPLY,
	HS_C_WAIT_RESULT,
	HS_S_WAIT_HELLO,
	HS_S_WAIT_AUTH,
	HS_DONE,
	HS_FAILED,
};

static const char label_server[] = "dmann-hs-server";
static const char label_client[] = "dmann-hs-client";

int dm_hs_init(struct dm_hs *hs, const struct dm_xport *x, enum dm_hs_role role,
	       const char *peer)
{
	size_t cl;

	memset(hs, 0, sizeof(*hs));
	cl = strnlen(x->cluster, sizeof(x->cluster));
	if (cl == 0 || cl >= DM_HS_CLUSTER_LEN || x->secret_len == 0 ||
	    x->secret_len > sizeof(hs->secret))
		return -EINVAL;
	hs->role = role;
	hs->state = role == DM_HS_CLIENT ? HS_C_START : HS_S_WAIT_HELLO;
	snprintf(hs->peer, sizeof(hs->peer), "%s", peer ? peer : "?");
	memcpy(hs->cluster, x->cluster, cl);
	memcpy(hs->secret, x->secret, x->secret_len);
	hs->secret_len = x->secret_len;
	hs->x = x;
	if (role == DM_HS_CLIENT && x->client[0])
		snprintf(hs->client, sizeof(hs->client), "%s", x->client);
	return 0;
}

void dm_hs_clear(struct dm_hs *hs)
{
	OPENSSL_cleanse(hs->secret, sizeof(hs->secret));
	OPENSSL_cleanse(hs->nonce_c, sizeof(hs->nonce_c));
	OPENSSL_cleanse(hs->nonce_s, sizeof(hs->nonce_s));
	hs->secret_len = 0;
}

/* proof = HMAC-SHA256(secret, label | version | cluster [| client] | nonce_c | nonce_s);
 * the client name only in a client identity's handshake. */
static int hs_proof(const struct dm_hs *hs, const char *label, uint8_t out[DM_HS_PROOF_LEN])
{
	uint8_t msg[32 + 2 + 2 * DM_HS_CLUSTER_LEN + 2 * DM_HS_NONCE_LEN];
	size_t ll = strlen(label), off = 0;
	unsigned int mdlen = 0;

	memcpy(msg, label, ll);
	off = ll;
	dm_put_le16(msg + off, DM_WIRE_VERSION);
	off += 2;
	memcpy(msg + off, hs->cluster, DM_HS_CLUSTER_LEN);
	off += DM_HS_CLUSTER_LEN;
	if (hs->client[0]) {
		memcpy(msg + off, hs->client, DM_HS_CLUSTER_LEN);
		off += DM_HS_CLUSTER_LEN;
	}
	memcpy(msg + off, hs->nonce_c, DM_HS_NONCE_LEN);
	off += DM_HS_NONCE_LEN;
	memcpy(msg + off, hs->nonce_s, DM_HS_NONCE_LEN);
	off += DM_HS_NONCE_LEN;
	if (!HMAC(EVP_sha256(), hs->secret, (int)hs->secret_len, msg, off, out, &mdlen) ||
	    mdlen != DM_HS_PROOF_LEN)
		return -EIO;
	return 0;
}

/* Write a HS_RESULT carrying status into out. */
static size_t hs_result(uint8_t *out, int status)
{
	dm_wire_hdr_encode(out, DM_OP_HS_RESULT, DM_WIRE_HDR_LEN, status, 0);
	return DM_WIRE_HDR_LEN;
}

/* Fail the handshake: log why, and prepare a HS_RESULT telling the peer. */
static int hs_fail(struct dm_hs *hs, uint8_t *out, size_t *outlen, int err, const char *why)
{
	dm_warn("handshake with %s failed: %s (%s)", hs->peer, why, strerror(-err));
	hs->state = HS_FAILED;
	*outlen = hs_result(out, err);
	return err;
}

int dm_hs_step(struct dm_hs *hs, const uint8_t *in, size_t inlen, uint8_t *out,
	       size_t *outlen)
{
	struct dm_wire_hdr h;
	const uint8_t *body;
	uint8_t proof[DM_HS_PROOF_LEN];
	int rc;

	*outlen = 0;
	if (hs->state == HS_C_START) {
		struct dm_wire_hs_hello m = { .version = DM_WIRE_VERSION };

		if (RAND_bytes(hs->nonce_c, DM_HS_NONCE_LEN) != 1)
			return hs_fail(hs, out, outlen, -EIO, "no random bytes");
		memcpy(m.nonce, hs->nonce_c, DM_HS_NONCE_LEN);
		memcpy(m.cluster, hs->cluster, DM_HS_CLUSTER_LEN);
		if (hs->client[0]) {
			struct dm_wire_hs_hello_client mc = { .hello = m };

			memcpy(mc.client, hs->client, DM_HS_CLUSTER_LEN);
			dm_wire_hdr_encode(out, DM_OP_HS_HELLO_CLIENT, DM_WIRE_HDR_LEN + sizeof(mc),
					   0, 0);
			dm_wire_hs_hello_client_encode(out + DM_WIRE_HDR_LEN, &mc);
			*outlen = DM_WIRE_HDR_LEN + sizeof(mc);
		} else {
			dm_wire_hdr_encode(out, DM_OP_HS_HELLO, DM_WIRE_HDR_LEN + sizeof(m), 0, 0);
			dm_wire_hs_hello_encode(out + DM_WIRE_HDR_LEN, &m);
			*outlen = DM_WIRE_HDR_LEN + sizeof(m);
		}
		hs->state = HS_C_WAIT_REPLY;
		return 0;
	}
	if (hs->state == HS_DONE || hs->state == HS_FAILED)
		return -EINVAL;

	/* Every later step consumes one peer message: check its framing first. */
	rc = dm_wire_hdr_decode(in, inlen, &h);
	if (rc == -EPROTO && inlen >= DM_WIRE_HDR_LEN && in[4] != DM_WIRE_VERSION)
		return hs_fail(hs, out, outlen, -EPROTONOSUPPORT, "peer speaks another protocol version");
	if (rc)
		return hs_fail(hs, out, outlen, rc, "malformed message header");
	if (h.length != inlen)
		return hs_fail(hs, out, outlen, -EBADMSG, "message length mismatch");
	if (h.op == DM_OP_HS_RESULT && h.status != 0 && h.length == DM_WIRE_HDR_LEN) {
		hs->state = HS_FAILED;
		dm_warn("handshake with %s: refused by peer (%s)", hs->peer, strerror(-h.status));
		return h.status;
	}
	rc = dm_wire_check_len(&h);
	if (rc)
		return hs_fail(hs, out, outlen, rc, "bad message length for its op");
	body = in + DM_WIRE_HDR_LEN;

	switch (hs->state) {
	case HS_S_WAIT_HELLO: {
		struct dm_wire_hs_hello m;
		struct dm_wire_hs_reply r = { .version = DM_WIRE_VERSION };

		if (h.op == DM_OP_HS_HELLO_CLIENT) {
			struct dm_wire_hs_hello_client mc;
			const struct dm_xport_cred *cr = NULL;

			rc = dm_wire_hs_hello_client_decode(body, inlen - DM_WIRE_HDR_LEN, &mc);
			if (rc)
				return hs_fail(hs, out, outlen, rc, "malformed HELLO_CLIENT");
			for (size_t i = 0; hs->x && i < hs->x->n_creds; i++)
				if (!strcmp(hs->x->creds[i].name, mc.client))
					cr = &hs->x->creds[i];
			if (!cr)
				return hs_fail(hs, out, outlen, -EACCES, "unknown client identity");
			/* From here on the proofs use that client's secret. */
			memcpy(hs->client, mc.client, DM_HS_CLUSTER_LEN);
			OPENSSL_cleanse(hs->secret, sizeof(hs->secret));
			memcpy(hs->secret, cr->secret, cr->secret_len);
			hs->secret_len = cr->secret_len;
			m = mc.hello;
		} else if (h.op != DM_OP_HS_HELLO) {
			return hs_fail(hs, out, outlen, -EPROTO, "expected HELLO");
		} else {
			rc = dm_wire_hs_hello_decode(body, inlen - DM_WIRE_HDR_LEN, &m);
			if (rc)
				return hs_fail(hs, out, outlen, rc, "malformed HELLO");
		}
		if (m.version != DM_WIRE_VERSION)
			return hs_fail(hs, out, outlen, -EPROTONOSUPPORT,
				       "peer speaks another protocol version");
		if (memcmp(m.cluster, hs->cluster, DM_HS_CLUSTER_LEN))
			return hs_fail(hs, out, outlen, -EPERM, "peer belongs to another cluster");
		memcpy(hs->nonce_c, m.nonce, DM_HS_NONCE_LEN);
		if (RAND_bytes(hs->nonce_s, DM_HS_NONCE_LEN) != 1)
			return hs_fail(hs, out, outlen, -EIO, "no random bytes");
		if (hs_proof(hs, label_server, r.proof))
			return hs_fail(hs, out, outlen, -EIO, "HMAC failed");
		memcpy(r.nonce, hs->nonce_s, DM_HS_NONCE_LEN);
		memcpy(r.cluster, hs->cluster, DM_HS_CLUSTER_LEN);
		dm_wire_hdr_encode(out, DM_OP_HS_REPLY, DM_WIRE_HDR_LEN + sizeof(r), 0, 0);
		dm_wire_hs_reply_encode(out + DM_WIRE_HDR_LEN, &r);
		*outlen = DM_WIRE_HDR_LEN + sizeof(r);
		hs->state = HS_S_WAIT_AUTH;
		return 0;
	}
	case HS_C_WAIT_REPLY: {
		struct dm_wire_hs_reply r;
		struct dm_wire_hs_auth a;

		if (h.op != DM_OP_HS_REPLY)
			return hs_fail(hs, out, outlen, -EPROTO, "expected REPLY");
		rc = dm_wire_hs_reply_decode(body, inlen - DM_WIRE_HDR_LEN, &r);
		if (rc)
			return hs_fail(hs, out, outlen, rc, "malformed REPLY");
		if (r.version != DM_WIRE_VERSION)
			return hs_fail(hs, out, outlen, -EPROTONOSUPPORT,
				       "peer speaks another protocol version");
		if (memcmp(r.cluster, hs->cluster, DM_HS_CLUSTER_LEN))
			return hs_fail(hs, out, outlen, -EPERM, "peer belongs to another cluster");
		memcpy(hs->nonce_s, r.nonce, DM_HS_NONCE_LEN);
		if (hs_proof(hs, label_server, proof))
			return hs_fail(hs, out, outlen, -EIO, "HMAC failed");
		if (CRYPTO_memcmp(proof, r.proof, DM_HS_PROOF_LEN))
			return hs_fail(hs, out, outlen, -EACCES,
				       "peer failed to prove the cluster secret");
		if (hs_proof(hs, label_client, a.proof))
			return hs_fail(hs, out, outlen, -EIO, "HMAC failed");
		dm_wire_hdr_encode(out, DM_OP_HS_AUTH, DM_WIRE_HDR_LEN + sizeof(a), 0, 0);
		dm_wire_hs_auth_encode(out + DM_WIRE_HDR_LEN, &a);
		*outlen = DM_WIRE_HDR_LEN + sizeof(a);
		hs->state = HS_C_WAIT_RESULT;
		return 0;
	}
	case HS_S_WAIT_AUTH: {
		struct dm_wire_hs_auth a;

		if (h.op != DM_OP_HS_AUTH)
			return hs_fail(hs, out, outlen, -EPROTO, "expected AUTH");
		rc = dm_wire_hs_auth_decode(body, inlen - DM_WIRE_HDR_LEN, &a);
		if (rc)
			return hs_fail(hs, out, outlen, rc, "malformed AUTH");
		if (hs_proof(hs, label_client, proof))
			return hs_fail(hs, out, outlen, -EIO, "HMAC failed");
		if (CRYPTO_memcmp(proof, a.proof, DM_HS_PROOF_LEN))
			return hs_fail(hs, out, outlen, -EACCES,
				       "peer failed to prove the cluster secret");
		*outlen = hs_result(out, 0);
		hs->state = HS_DONE;
		return 1;
	}
	case HS_C_WAIT_RESULT:
		if (h.op != DM_OP_HS_RESULT)
			return hs_fail(hs, out, outlen, -EPROTO, "expected RESULT");
		hs->state = HS_DONE;
		return 1;
	default:
		return -EINVAL;
	}
}

/* Milliseconds left until deadline (ns), at least 0. */
static int ms_left(uint64_t deadline)
{
	uint64_t now = dm_now_ns();

	return now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
}

/* Read exactly len bytes before the deadline. */
static int read_full(int fd, uint8_t *buf, size_t len, uint64_t deadline)
{
	size_t got = 0;

	while (got < len) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		ssize_t n;
		int ms = ms_left(deadline);

		if (ms == 0)
			return -ETIMEDOUT;
		n = poll(&pfd, 1, ms);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ETIMEDOUT;
		n = recv(fd, buf + got, len - got, MSG_DONTWAIT);
		if (n == 0)
			return -ECONNRESET;
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			return -errno;
		}
		got += (size_t)n;
	}
	return 0;
}

/* Write exactly len bytes before the deadline. */
static int write_full(int fd, const uint8_t *buf, size_t len, uint64_t deadline)
{
	size_t put = 0;

	while (put < len) {
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };
		ssize_t n = send(fd, buf + put, len - put, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n > 0) {
			put += (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return errno == EPIPE ? -ECONNRESET : -errno;
		if (ms_left(deadline) == 0)
			return -ETIMEDOUT;
		if (poll(&pfd, 1, ms_left(deadline)) < 0 && errno != EINTR)
			return -errno;
	}
	return 0;
}

/* Read one handshake message (header first, then the announced length). */
static int read_msg(int fd, uint8_t *buf, size_t cap, size_t *len, uint64_t deadline)
{
	struct dm_wire_hdr h;
	int rc = read_full(fd, buf, DM_WIRE_HDR_LEN, deadline);

	if (rc)
		return rc;
	rc = dm_wire_hdr_decode(buf, DM_WIRE_HDR_LEN, &h);
	if (rc == -EPROTO) {
		/* Let dm_hs_step report the version mismatch from the header alone. */
		*len = DM_WIRE_HDR_LEN;
		return 0;
	}
	if (rc)
		return rc;
	if (h.length > cap || h.op < DM_OP_HS_HELLO || h.op > DM_OP_HS_HELLO_CLIENT)
		return -EBADMSG;
	rc = read_full(fd, buf + DM_WIRE_HDR_LEN, h.length - DM_WIRE_HDR_LEN, deadline);
	if (rc)
		return rc;
	*len = h.length;
	return 0;
}

int dm_hs_run_fd(const struct dm_xport *x, int fd, enum dm_hs_role role, const char *peer,
		 int timeout_ms, char *client)
{
	uint64_t deadline = dm_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms :
						     DM_HS_TIMEOUT_MS) * 1000000ull;
	uint8_t in[DM_HS_MAX_MSG], out[DM_HS_MAX_MSG];
	size_t inlen = 0, outlen = 0;
	struct dm_hs hs;
	int rc;

	rc = dm_hs_init(&hs, x, role, peer);
	if (rc)
		return rc;
	if (role == DM_HS_CLIENT) {
		rc = dm_hs_step(&hs, NULL, 0, out, &outlen);
		if (rc == 0)
			rc = write_full(fd, out, outlen, deadline);
		if (rc)
			goto out_clear;
	}
	for (;;) {
		rc = read_msg(fd, in, sizeof(in), &inlen, deadline);
		if (rc) {
			dm_warn("handshake with %s failed: %s", hs.peer, strerror(-rc));
			goto out_clear;
		}
		rc = dm_hs_step(&hs, in, inlen, out, &outlen);
		if (outlen) {
			int wrc = write_full(fd, out, outlen, deadline);

			if (rc >= 0 && wrc) {
				dm_warn("handshake with %s failed: %s", hs.peer, strerror(-wrc));
				rc = wrc;
			}
		}
		if (rc != 0)
			break;
	}
	rc = rc > 0 ? 0 : rc;
	if (rc == 0 && client)
		snprintf(client, DM_HS_CLUSTER_LEN, "%s", role == DM_HS_SERVER ? hs.client : "");
out_clear:
	dm_hs_clear(&hs);
	return rc;
}
