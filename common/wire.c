/* wire.c: encoders and checked decoders for the messages in wire.h. */
#include "wire.h"

#include <string.h>

void dm_wire_hdr_encode(uint8_t *buf, uint16_t op, uint32_t length, int32_t status,
			uint64_t req_id)
{
	dm_put_le32(buf + 0, DM_WIRE_MAGIC);
	buf[4] = DM_WIRE_VERSION;
	buf[5] = 0;
	dm_put_le16(buf + 6, op);
	dm_put_le32(buf + 8, length);
	dm_put_le32(buf + 12, (uint32_t)status);
	dm_put_le64(buf + 16, req_id);
}

int dm_wire_hdr_decode(const uint8_t *buf, size_t len, struct dm_wire_hdr *h)
{
	if (!buf || len < DM_WIRE_HDR_LEN)
		return -EBADMSG;
	h->magic = dm_get_le32(buf);
	h->version = buf[4];
	h->flags = buf[5];
	h->op = dm_get_le16(buf + 6);
	h->length = dm_get_le32(buf + 8);
	h->status = (int32_t)dm_get_le32(buf + 12);
	h->req_id = dm_get_le64(buf + 16);
	if (h->magic != DM_WIRE_MAGIC)
		return -EBADMSG;
	if (h->length < DM_WIRE_HDR_LEN || h->length > DM_WIRE_MAX_LEN)
		return -EBADMSG;
	if (h->version != DM_WIRE_VERSION || h->flags != 0)
		return -EPROTO;
	/* A status is 0 or a plausible -errno. */
	if (h->status > 0 || h->status < -4095)
		return -EBADMSG;
	return 0;
}

int dm_wire_body_len(uint16_t op, int32_t status)
{
	switch (op) {
	case DM_OP_HS_HELLO:  return sizeof(struct dm_wire_hs_hello);
	case DM_OP_HS_HELLO_CLIENT: return sizeof(struct dm_wire_hs_hello_client);
	case DM_OP_HS_REPLY:  return status ? 0 : (int)sizeof(struct dm_wire_hs_reply);
	case DM_OP_HS_AUTH:   return sizeof(struct dm_wire_hs_auth);
	case DM_OP_HS_RESULT: return 0;
	case DM_OP_READ_REQ:
	case DM_OP_WRITE_REQ: return sizeof(struct dm_wire_rw_req);
	case DM_OP_READ_RESP:
	case DM_OP_WRITE_RESP:
	case DM_OP_SEND:
	case DM_OP_SEND_ACK:  return 0;
	case DM_OP_CAS_REQ:   return sizeof(struct dm_wire_cas_req);
	case DM_OP_FAA_REQ:   return sizeof(struct dm_wire_faa_req);
	case DM_OP_CAS_RESP:
	case DM_OP_FAA_RESP:  return status ? 0 : (int)sizeof(struct dm_wire_atomic_resp);
	default:              return -EPROTO;
	}
}

int dm_wire_check_len(const struct dm_wire_hdr *h)
{
	int body = dm_wire_body_len(h->op, h->status);
	uint32_t fixed;
	bool variable;

	if (body < 0)
		return body;
	fixed = DM_WIRE_HDR_LEN + (uint32_t)body;
	/* Requests never carry a status. */
	switch (h->op) {
	case DM_OP_HS_HELLO: case DM_OP_HS_HELLO_CLIENT: case DM_OP_HS_AUTH: case DM_OP_READ_REQ: case DM_OP_WRITE_REQ:
	case DM_OP_CAS_REQ: case DM_OP_FAA_REQ: case DM_OP_SEND:
		if (h->status != 0)
			return -EBADMSG;
		break;
	default:
		break;
	}
	variable = h->op == DM_OP_WRITE_REQ || h->op == DM_OP_SEND ||
		   (h->op == DM_OP_READ_RESP && h->status == 0);
	if (variable ? h->length < fixed : h->length != fixed)
		return -EBADMSG;
	return 0;
}

int dm_wire_cluster_check(const char name[DM_HS_CLUSTER_LEN])
{
	size_t n = strnlen(name, DM_HS_CLUSTER_LEN);

	if (n == 0 || n == DM_HS_CLUSTER_LEN)
		return -EBADMSG;
	/* Padding after the name must be zero so that the field has one encoding. */
	for (size_t i = n; i < DM_HS_CLUSTER_LEN; i++)
		if (name[i])
			return -EBADMSG;
	return 0;
}

void dm_wire_hs_hello_encode(uint8_t *buf, const struct dm_wire_hs_hello *m)
{
	dm_put_le16(buf, m->version);
	dm_put_le16(buf + 2, m->flags);
	dm_put_le32(buf + 4, m->reserved);
	memcpy(buf + 8, m->nonce, DM_HS_NONCE_LEN);
	memcpy(buf + 40, m->cluster, DM_HS_CLUSTER_LEN);
}

int dm_wire_hs_hello_decode(const uint8_t *buf, size_t len, struct dm_wire_hs_hello *m)
{
	if (!buf || len < sizeof(*m))
		return -EBADMSG;
	m->version = dm_get_le16(buf);
	m->flags = dm_get_le16(buf + 2);
	m->reserved = dm_get_le32(buf + 4);
	memcpy(m->nonce, buf + 8, DM_HS_NONCE_LEN);
	memcpy(m->cluster, buf + 40, DM_HS_CLUSTER_LEN);
	if (m->flags || m->reserved)
		return -EPROTO;
	return dm_wire_cluster_check(m->cluster);
}

bool dm_wire_client_name_ok(const char *name)
{
	size_t n = strnlen(name, DM_HS_CLUSTER_LEN);

	if (n == 0 || n == DM_HS_CLUSTER_LEN)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == '-'))
			return false;
	}
	return true;
}

void dm_wire_hs_hello_client_encode(uint8_t *buf, const struct dm_wire_hs_hello_client *m)
{
	dm_wire_hs_hello_encode(buf, &m->hello);
	memcpy(buf + sizeof(m->hello), m->client, DM_HS_CLUSTER_LEN);
}

int dm_wire_hs_hello_client_decode(const uint8_t *buf, size_t len,
				   struct dm_wire_hs_hello_client *m)
{
	int rc;

	if (!buf || len < sizeof(*m))
		return -EBADMSG;
	rc = dm_wire_hs_hello_decode(buf, sizeof(m->hello), &m->hello);
	if (rc)
		return rc;
	memcpy(m->client, buf + sizeof(m->hello), DM_HS_CLUSTER_LEN);
	/* Same padding rule as the cluster name, then the identity alphabet. */
	rc = dm_wire_cluster_check(m->client);
	if (rc)
		return rc;
	return dm_wire_client_name_ok(m->client) ? 0 : -EBADMSG;
}

void dm_wire_hs_reply_encode(uint8_t *buf, const struct dm_wire_hs_reply *m)
{
	dm_put_le16(buf, m->version);
	dm_put_le16(buf + 2, m->flags);
	dm_put_le32(buf + 4, m->reserved);
	memcpy(buf + 8, m->nonce, DM_HS_NONCE_LEN);
	memcpy(buf + 40, m->proof, DM_HS_PROOF_LEN);
	memcpy(buf + 72, m->cluster, DM_HS_CLUSTER_LEN);
}

int dm_wire_hs_reply_decode(const uint8_t *buf, size_t len, struct dm_wire_hs_reply *m)
{
	if (!buf || len < sizeof(*m))
		return -EBADMSG;
	m->version = dm_get_le16(buf);
	m->flags = dm_get_le16(buf + 2);
	m->reserved = dm_get_le32(buf + 4);
	memcpy(m->nonce, buf + 8, DM_HS_NONCE_LEN);
	memcpy(m->proof, buf + 40, DM_HS_PROOF_LEN);
	memcpy(m->cluster, buf + 72, DM_HS_CLUSTER_LEN);
	if (m->flags || m->reserved)
		return -EPROTO;
	return dm_wire_cluster_check(m->cluster);
}

void dm_wire_hs_auth_encode(uint8_t *buf, const struct dm_wire_hs_auth *m)
{
	memcpy(buf, m->proof, DM_HS_PROOF_LEN);
}

int dm_wire_hs_auth_decode(const uint8_t *buf, size_t len, struct dm_wire_hs_auth *m)
{
	if (!buf || len < sizeof(*m))
		return -EBADMSG;
	memcpy(m->proof, buf, DM_HS_PROOF_LEN);
	return 0;
}

void dm_wire_rw_req_encode(uint8_t *buf, const struct dm_wire_rw_req *m)
{
	dm_put_le64(buf, m->remote);
	dm_put_le32(buf + 8, m->rkey);
	dm_put_le32(buf + 12, m->len);
}

int dm_wire_rw_req_decode(const uint8_t *buf, size_t len, struct dm_wire_rw_req *m)
{
	if (!buf || len < sizeof(*m))
		return -EBADMSG;
	m->remote = dm_get_le64(buf);
	m->rkey = dm_get_le32(buf + 8);
	m->len = dm_get_le32(buf + 12);
	if (m->len > DM_WIRE_MAX_LEN - DM_WIRE_HDR_LEN - sizeof(*m))
		return -EBADMSG;
	return 0;
}

void dm_wire_cas_req_encode(uint8_t *buf, const struct dm_wire_cas_req *m)
{
	dm_put_le64(buf, m->remote);
	dm_put_le32(buf + 8, m->rkey);
	dm_put_le32(buf + 12, m->reserved);
	dm_put_le64(buf + 16, m->compare);
	dm_put_le64(buf + 24, m->swap);
}

int dm_wire_cas_req_decode(const uint8_t *buf, size_t len, struct dm_wire_cas_req *m)
{
	if (!buf || len < sizeof(*m))
		return -EBADMSG;
	m->remote = dm_get_le64(buf);
	m->rkey = dm_get_le32(buf + 8);
	m->reserved = dm_get_le32(buf + 12);
	m->compare = dm_get_le64(buf + 16);
	m->swap = dm_get_le64(buf + 24);
	return m->reserved ? -EBADMSG : 0;
}

void dm_wire_faa_req_encode(uint8_t *buf, const struct dm_wire_faa_req *m)
{
	dm_put_le64(buf, m->remote);
	dm_put_le32(buf + 8, m->rkey);
	dm_put_le32(buf + 12, m->reserved);
	dm_put_le64(buf + 16, m->add);
}

int dm_wire_faa_req_decode(const uint8_t *buf, size_t len, struct dm_wire_faa_req *m)
{
	if (!buf || len < sizeof(*m))
		return -EBADMSG;
	m->remote = dm_get_le64(buf);
	m->rkey = dm_get_le32(buf + 8);
	m->reserved = dm_get_le32(buf + 12);
	m->add = dm_get_le64(buf + 16);
	return m->reserved ? -EBADMSG : 0;
}

void dm_wire_atomic_resp_encode(uint8_t *buf, const struct dm_wire_atomic_resp *m)
{
	dm_put_le64(buf, m->old);
}

int dm_wire_atomic_resp_decode(const uint8_t *buf, size_t len, struct dm_wire_atomic_resp *m)
{
	if (!buf || len < sizeof(*m))
		return -EBADMSG;
	m->old = dm_get_le64(buf);
	return 0;
}
