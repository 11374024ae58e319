/* wire_ctl.c: encoders and checked decoders for the control RPC messages of wire.h. */
#include "wire.h"

#include <string.h>

int dm_wire_ctl_body_len(uint16_t op, int32_t status)
{
	bool resp = op & 1;

	if (op < DM_OP_CTL_INFO || op > DM_OP_CTL_GEN_DROP + 1)
		return -EPROTO;
	if (resp && status)
		return 0;
	switch (op & ~1u) {
	case DM_OP_CTL_INFO:
		return resp ? (int)sizeof(struct dm_wire_ctl_info) : 0;
	case DM_OP_CTL_ALLOC:
	case DM_OP_CTL_LOOKUP:
	case DM_OP_CTL_DROP:
		return sizeof(struct dm_wire_ctl_obj);
	case DM_OP_CTL_COMMIT:
		return resp ? 0 : (int)sizeof(struct dm_wire_ctl_obj);
	case DM_OP_CTL_SNAPSHOT:
		return 0;
	case DM_OP_CTL_ATOMIC:
		return sizeof(struct dm_wire_ctl_atomic);
	case DM_OP_CTL_GEN_LIST:
		return resp ? (int)DM_WIRE_CTL_GEN_LIST_HDR : 0;
	case DM_OP_CTL_GEN_PUBLISH:
	case DM_OP_CTL_GEN_REPORT:
	case DM_OP_CTL_GEN_DROP:
		return resp ? (int)sizeof(struct dm_wire_ctl_gen_state) :
			      (int)sizeof(struct dm_wire_ctl_gen);
	default:
		return -EPROTO;
	}
}

int dm_wire_ctl_check(const struct dm_wire_hdr *h, size_t buflen)
{
	int body = dm_wire_ctl_body_len(h->op, h->status);

	if (body < 0)
		return body;
	if (!(h->op & 1) && h->status != 0)
		return -EBADMSG;
	if (h->op == DM_OP_CTL_GEN_LIST + 1 && !h->status) {
		uint32_t b = h->length - DM_WIRE_HDR_LEN;   /* the header decoder checked >= */

		if (h->length != buflen || h->length < DM_WIRE_HDR_LEN ||
		    b < DM_WIRE_CTL_GEN_LIST_HDR || b > DM_WIRE_CTL_GEN_LIST_MAX ||
		    (b - DM_WIRE_CTL_GEN_LIST_HDR) % sizeof(struct dm_wire_ctl_gen_entry))
			return -EBADMSG;
		return 0;
	}
	if (h->length != buflen || h->length != DM_WIRE_HDR_LEN + (uint32_t)body)
		return -EBADMSG;
	return 0;
}

void dm_wire_ctl_info_encode(uint8_t *b, const struct dm_wire_ctl_info *m)
{
	dm_put_le64(b + 0, m->region_addr);
	dm_put_le64(b + 8, m->region_len);
	dm_put_le64(b + 16, m->used);
	dm_put_le32(b + 24, m->rkey);
	dm_put_le32(b + 28, m->node_id);
	dm_put_le32(b + 32, m->objects);
	b[36] = m->huge;
	memset(b + 37, 0, 3);
	dm_put_le32(b + 40, (uint32_t)m->numa_node);
	dm_put_le32(b + 44, 0);
}

int dm_wire_ctl_info_decode(const uint8_t *b, size_t len, struct dm_wire_ctl_info *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	memset(m, 0, sizeof(*m));
	m->region_addr = dm_get_le64(b + 0);
	m->region_len = dm_get_le64(b + 8);
	m->used = dm_get_le64(b + 16);
	m->rkey = dm_get_le32(b + 24);
	m->node_id = dm_get_le32(b + 28);
	m->objects = dm_get_le32(b + 32);
	m->huge = b[36];
	m->numa_node = (int32_t)dm_get_le32(b + 40);
	if (b[37] || b[38] || b[39] || dm_get_le32(b + 44) || m->huge > 1 || m->numa_node < -1 ||
	    m->used > m->region_len)
		return -EBADMSG;
	return 0;
}

void dm_wire_ctl_obj_encode(uint8_t *b, const struct dm_wire_ctl_obj *m)
{
	dm_put_le64(b + 0, m->key);
	dm_put_le64(b + 8, m->len);
	dm_put_le64(b + 16, m->addr);
	dm_put_le64(b + 24, m->aux);
}

int dm_wire_ctl_obj_decode(const uint8_t *b, size_t len, struct dm_wire_ctl_obj *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->key = dm_get_le64(b + 0);
	m->len = dm_get_le64(b + 8);
	m->addr = dm_get_le64(b + 16);
	m->aux = dm_get_le64(b + 24);
	return 0;
}

void dm_wire_ctl_atomic_encode(uint8_t *b, const struct dm_wire_ctl_atomic *m)
{
	dm_put_le64(b + 0, m->addr);
	dm_put_le64(b + 8, m->compare);
	dm_put_le64(b + 16, m->value);
	dm_put_le32(b + 24, m->op);
	dm_put_le32(b + 28, m->reserved);
}

int dm_wire_ctl_atomic_decode(const uint8_t *b, size_t len, struct dm_wire_ctl_atomic *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->addr = dm_get_le64(b + 0);
	m->compare = dm_get_le64(b + 8);
	m->value = dm_get_le64(b + 16);
	m->op = dm_get_le32(b + 24);
	m->reserved = dm_get_le32(b + 28);
	return m->op > DM_CTL_ATOMIC_FAA || m->reserved ? -EBADMSG : 0;
}

void dm_wire_ctl_gen_encode(uint8_t *b, const struct dm_wire_ctl_gen *m)
{
	dm_put_le64(b + 0, m->gen);
	dm_put_le32(b + 8, m->index);
	dm_put_le32(b + 12, m->cn);
}

int dm_wire_ctl_gen_decode(const uint8_t *b, size_t len, struct dm_wire_ctl_gen *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->gen = dm_get_le64(b + 0);
	m->index = dm_get_le32(b + 8);
	m->cn = dm_get_le32(b + 12);
	if (m->index > DM_GEN_MAX_INDEX || (m->cn >= DM_MAX_NODES_WIRE && m->cn != DM_GEN_NO_CN))
		return -EBADMSG;
	return 0;
}

void dm_wire_ctl_gen_state_encode(uint8_t *b, const struct dm_wire_ctl_gen_state *m)
{
	dm_put_le64(b + 0, m->current);
	dm_put_le64(b + 8, m->retired);
	dm_put_le32(b + 16, m->waiting);
	dm_put_le32(b + 20, m->lease_ms);
	dm_put_le32(b + 24, m->flags);
	dm_put_le32(b + 28, 0);
}

int dm_wire_ctl_gen_state_decode(const uint8_t *b, size_t len, struct dm_wire_ctl_gen_state *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->current = dm_get_le64(b + 0);
	m->retired = dm_get_le64(b + 8);
	m->waiting = dm_get_le32(b + 16);
	m->lease_ms = dm_get_le32(b + 20);
	m->flags = dm_get_le32(b + 24);
	m->reserved = dm_get_le32(b + 28);
	if (m->reserved || (m->flags & ~(DM_GEN_F_CURRENT | DM_GEN_F_RETIRED)))
		return -EBADMSG;
	/* RETIRED alone: a dropped graph whose blocks are still held */
	if ((m->flags & DM_GEN_F_RETIRED) && (m->flags & DM_GEN_F_CURRENT) &&
	    m->retired >= m->current)
		return -EBADMSG;
	if (!(m->flags & DM_GEN_F_RETIRED) && (m->waiting || m->retired))
		return -EBADMSG;
	return 0;
}

size_t dm_wire_ctl_gen_list_encode(uint8_t *b, const struct dm_wire_ctl_gen_list *m)
{
	uint32_t n = DM_MIN(m->count, DM_MAX_GRAPHS);
	uint8_t *p = b + DM_WIRE_CTL_GEN_LIST_HDR;

	dm_put_le32(b + 0, n);
	dm_put_le32(b + 4, 0);
	for (uint32_t i = 0; i < n; i++, p += sizeof(struct dm_wire_ctl_gen_entry)) {
		dm_put_le32(p + 0, m->e[i].index);
		dm_put_le32(p + 4, m->e[i].flags);
		dm_put_le64(p + 8, m->e[i].current);
		dm_put_le64(p + 16, m->e[i].retired);
	}
	return (size_t)(p - b);
}

int dm_wire_ctl_gen_list_decode(const uint8_t *b, size_t len, struct dm_wire_ctl_gen_list *m)
{
	const uint8_t *p = b + DM_WIRE_CTL_GEN_LIST_HDR;
	uint32_t n;

	memset(m, 0, sizeof(*m));
	if (len < DM_WIRE_CTL_GEN_LIST_HDR)
		return -EBADMSG;
	n = dm_get_le32(b + 0);
	if (n > DM_MAX_GRAPHS || dm_get_le32(b + 4) ||
	    len != DM_WIRE_CTL_GEN_LIST_HDR + (size_t)n * sizeof(struct dm_wire_ctl_gen_entry))
		return -EBADMSG;
	for (uint32_t i = 0; i < n; i++, p += sizeof(struct dm_wire_ctl_gen_entry)) {
		struct dm_wire_ctl_gen_entry *e = &m->e[i];

		e->index = dm_get_le32(p + 0);
		e->flags = dm_get_le32(p + 4);
		e->current = dm_get_le64(p + 8);
		e->retired = dm_get_le64(p + 16);
		if (e->index > DM_GEN_MAX_INDEX ||
		    (e->flags & ~(DM_GEN_F_CURRENT | DM_GEN_F_RETIRED)) ||
		    (!(e->flags & DM_GEN_F_CURRENT) && e->current) ||
		    (!(e->flags & DM_GEN_F_RETIRED) && e->retired) ||
		    ((e->flags & DM_GEN_F_CURRENT) && (e->flags & DM_GEN_F_RETIRED) &&
		     e->retired >= e->current))
			goto bad;
		for (uint32_t j = 0; j < i; j++)
			if (m->e[j].index == e->index)
				goto bad;
	}
	m->count = n;
	return 0;
bad:
	memset(m, 0, sizeof(*m));
	return -EBADMSG;
}
