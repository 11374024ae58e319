/* flat_attr.c: catalog attributes of the flat store: opaque values kept with a bucket or an
 * index (the S3 gateway's tags and bucket policies), logged as FLAT_REC_ATTR records,
 * written into snapshots after the buckets and indexes, dropped with their owner. Stores
 * written before attributes existed simply have none. */
#include "flat_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ssize_t attr_find(struct flat_store *s, const char *b, const char *x, uint32_t kind)
{
	for (size_t i = 0; i < s->nattr; i++)
		if (s->attrs[i].kind == kind && !strcmp(s->attrs[i].bucket, b) &&
		    !strcmp(s->attrs[i].index, x))
			return (ssize_t)i;
	return -1;
}

static void attr_remove(struct flat_store *s, size_t i)
{
	free(s->attrs[i].val);
	s->attrs[i] = s->attrs[--s->nattr];
}

/* Replace (or clear, val NULL) an attribute: the value's memory is owned by the store on
 * return. Room must have been reserved (attr_reserve) when adding. */
static void attr_put(struct flat_store *s, const char *b, const char *x, uint32_t kind,
		     uint8_t *val, uint32_t len)
{
	ssize_t i = attr_find(s, b, x, kind);

	if (i >= 0)
		attr_remove(s, (size_t)i);
	if (!val)
		return;
	struct flat_attr *a = &s->attrs[s->nattr++];

	snprintf(a->bucket, sizeof(a->bucket), "%s", b);
	snprintf(a->index, sizeof(a->index), "%s", x);
	a->kind = kind;
	a->val = val;
	a->len = len;
}

static int attr_reserve(struct flat_store *s)
{
	return flat_grow((void **)&s->attrs, s->nattr, &s->capattr, sizeof(*s->attrs));
}

static uint8_t *dup_val(const void *val, uint32_t len)
{
	uint8_t *v = malloc((size_t)len + 1);

	if (!v)
		return NULL;
	memcpy(v, val, len);
	v[len] = 0;
	return v;
}

/* Whether the owner exists (cat held). */
static bool owner_exists(struct flat_store *s, const char *b, const char *x)
{
	return x[0] ? flat_index_find(s, b, x) >= 0 : flat_bucket_find(s, b) >= 0;
}

void flat_attr_enc(struct dm_buf *b, const struct flat_attr *a)
{
	dm_buf_str(b, a->bucket);
	dm_buf_u32(b, a->index[0] ? 1 : 0);
	if (a->index[0])
		dm_buf_str(b, a->index);
	dm_buf_u32(b, a->kind);
	dm_buf_bytes(b, a->val, a->len);
}

int flat_attr_set(struct flat_store *s, const char *bucket, const char *index, uint32_t kind,
		  const void *val, uint32_t len)
{
	struct flat_attr a = { .kind = kind, .val = (uint8_t *)val, .len = len };
	struct dm_buf b = { 0 };
	uint8_t *copy = NULL;
	int rc;

	if (!bucket || strnlen(bucket, FLAT_NAME_MAX + 1) > FLAT_NAME_MAX || !bucket[0] ||
	    (index && (strnlen(index, FLAT_NAME_MAX + 1) > FLAT_NAME_MAX || !index[0])) ||
	    kind < FLAT_ATTR_TAGS || kind > FLAT_ATTR_SHARDS || len > FLAT_ATTR_MAX ||
	    (len && !val))
		return -EINVAL;
	snprintf(a.bucket, sizeof(a.bucket), "%s", bucket);
	snprintf(a.index, sizeof(a.index), "%s", index ? index : "");
	if (len && !(copy = dup_val(val, len)))
		return -ENOMEM;
	pthread_rwlock_wrlock(&s->cat);
	if (!owner_exists(s, a.bucket, a.index)) {
		rc = -ENOENT;
		goto out_unlock;
	}
	rc = attr_reserve(s);
	if (rc)
		goto out_unlock;
	flat_rec_begin(&b);
	flat_attr_enc(&b, &a);
	rc = flat_wal_append(s, &b, FLAT_REC_ATTR);
	if (!rc) {
		attr_put(s, a.bucket, a.index, kind, copy, len);
		copy = NULL;
	}
out_unlock:
	pthread_rwlock_unlock(&s->cat);
	free(copy);
	dm_buf_free(&b);
	return rc;
}

int flat_attr_get(struct flat_store *s, const char *bucket, const char *index, uint32_t kind,
		  char **out, uint32_t *len)
{
	const char *x = index ? index : "";
	ssize_t i;
	int rc = 0;

	*out = NULL;
	*len = 0;
	if (!bucket)
		return -ENOENT;
	pthread_rwlock_rdlock(&s->cat);
	if (!owner_exists(s, bucket, x)) {
		rc = -ENOENT;
		goto out_unlock;
	}
	i = attr_find(s, bucket, x, kind);
	if (i >= 0) {
		*out = (char *)dup_val(s->attrs[i].val, s->attrs[i].len);
		*len = s->attrs[i].len;
		if (!*out)
			rc = -ENOMEM;
	}
out_unlock:
	pthread_rwlock_unlock(&s->cat);
	return rc;
}

void flat_attr_drop(struct flat_store *s, const char *bucket, const char *index)
{
	const char *x = index ? index : "";

	for (size_t i = 0; i < s->nattr;) {
		if (!strcmp(s->attrs[i].bucket, bucket) && !strcmp(s->attrs[i].index, x))
			attr_remove(s, i);
		else
			i++;
	}
}

void flat_attr_drop_bucket(struct flat_store *s, const char *bucket)
{
	for (size_t i = 0; i < s->nattr;) {
		if (!strcmp(s->attrs[i].bucket, bucket))
			attr_remove(s, i);
		else
			i++;
	}
}

int flat_attr_reserve_n(struct flat_store *s, size_t n)
{
	while (s->capattr < s->nattr + n)
		if (flat_grow((void **)&s->attrs, s->capattr, &s->capattr, sizeof(*s->attrs)))
			return -ENOMEM;
	return 0;
}

void flat_attr_move(struct flat_store *s, struct flat_store *src)
{
	if (src->nattr)
		memcpy(s->attrs + s->nattr, src->attrs, src->nattr * sizeof(*s->attrs));
	s->nattr += src->nattr;
	src->nattr = 0;
}

int flat_attr_apply(struct flat_store *s, const uint8_t *p, uint32_t n)
{
	struct dm_rbuf rd = { .p = p, .n = n };
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1] = "";
	uint32_t has_ix, kind, len;
	const void *val;
	uint8_t *copy = NULL;
	int rc;

	flat_rd_name(&rd, b, FLAT_NAME_MAX);
	has_ix = dm_rbuf_u32(&rd);
	if (has_ix == 1)
		flat_rd_name(&rd, x, FLAT_NAME_MAX);
	kind = dm_rbuf_u32(&rd);
	val = dm_rbuf_bytes(&rd, &len, FLAT_ATTR_MAX);
	if (rd.bad || rd.at != rd.n || has_ix > 1 ||
	    kind < FLAT_ATTR_TAGS || kind > FLAT_ATTR_SHARDS || !owner_exists(s, b, x))
		return -EBADMSG;
	if (len && !(copy = dup_val(val, len)))
		return -ENOMEM;
	rc = attr_reserve(s);
	if (rc) {
		free(copy);
		return rc;
	}
	attr_put(s, b, x, kind, copy, len);
	return 0;
}

void flat_attr_free_all(struct flat_store *s)
{
	while (s->nattr)
		attr_remove(s, s->nattr - 1);
	free(s->attrs);
	s->attrs = NULL;
	s->capattr = 0;
}
