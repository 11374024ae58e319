/* flat_gindex.c: the online part of an index's graph mark (flat.h, "Online indexing"):
 * the key log of graph nodes an indexer inserted after the import, and the advance of the
 * mark over the rows they hold.
 *
 * An indexer (a compute node) inserts tail rows into the graph, makes the graph durable
 * (the memory nodes' region snapshots), then sends every replica of the bucket the batch
 * as (node id, key, CRC32C of the vector) entries: flat_gindex_add logs them as one
 * FLAT_REC_GINDEX {str bucket, str index, u64 tag, u32 n, n x {u64 id, str key, u32 vcrc}},
 * appends them to the key log (node id -> key, read by the gateways to turn node ids into
 * keys) and adds (key, vcrc) to the set of indexed row versions; then the mark moves over
 * every row from it on that is dead or whose (key, vector) is in that set, up to the first
 * one that is not. Rows are matched by key and vector, not by number, so a replica that
 * received the rows in another order advances as far as its own order allows, and never
 * past a row the graph does not hold. A snapshot writes the whole log after the index's
 * MARK record (flat_mark.c); replaying it from the renumbered mark gives the same mark. A
 * new import (flat_mark_set) empties the log: it belongs to one graph generation. */
#include "flat_int.h"

#include <stdlib.h>
#include <string.h>

#define GIX_SNAP_BATCH 4096u       /* log entries per snapshot record */

uint32_t flat_vec_crc(const float *v, uint32_t dim)
{
	return flat_crc32c(0, v, (size_t)dim * sizeof(float));
}

uint64_t flat_row_version(const char *key, uint32_t vcrc)
{
	uint64_t h = flat_key_hash(key, strlen(key)) ^ ((uint64_t)vcrc * 0x9e3779b97f4a7c15ull);

	h ^= h >> 29;
	return h ? h : 1;
}

void flat_gix_clear(struct flat_gix *g)
{
	for (size_t i = 0; i < g->n; i++)
		free(g->log[i].key);
	free(g->log);
	dm_u64set_free(&g->set);
	memset(g, 0, sizeof(*g));
}

/* Where the mark moves over the rows the set holds (wmu held, rw held either way). */
static uint64_t advance_to(const struct flat_index *ix)
{
	uint64_t m = ix->mark;

	while (m < ix->next_id) {
		if (!flat_row_dead(ix, m)) {
			struct flat_row r;

			flat_fill_row(ix, m, &r);
			if (!dm_u64set_has(&ix->gix.set, flat_row_version(r.key,
						      flat_vec_crc(r.vec, ix->info.dim))))
				break;
		}
		m++;
	}
	return m;
}

static void advance(struct flat_index *ix)
{
	ix->mark = advance_to(ix);
}

/* Prepared entries: key copies and room in the log and the set, so that applying them
 * cannot fail. */
struct gprep {
	struct flat_gkey *e;
	size_t n;
};

static void gprep_free(struct gprep *p)
{
	for (size_t i = 0; p->e && i < p->n; i++)
		free(p->e[i].key);
	free(p->e);
	p->e = NULL;
}

/* Copy entries and make room (wmu held; rw taken for growing the log). */
static int gprep_init(struct flat_index *ix, struct gprep *p, const struct flat_gentry *e,
		      size_t n)
{
	struct flat_gix *g = &ix->gix;
	int rc = 0;

	p->n = n;
	p->e = calloc(n ? n : 1, sizeof(*p->e));
	if (!p->e)
		return -ENOMEM;
	for (size_t i = 0; i < n && !rc; i++) {
		p->e[i] = (struct flat_gkey){ .id = e[i].id, .vcrc = e[i].vcrc,
					      .key = strdup(e[i].key) };
		if (!p->e[i].key)
			rc = -ENOMEM;
	}
	if (!rc)
		rc = dm_u64set_reserve(&g->set, n);
	if (!rc && g->n + n > g->cap) {
		size_t cap = DM_MAX(g->cap * 2, g->n + n + 64);
		struct flat_gkey *nl;

		pthread_rwlock_wrlock(&ix->rw);
		nl = realloc(g->log, cap * sizeof(*nl));
		if (nl) {
			g->log = nl;
			g->cap = cap;
		}
		pthread_rwlock_unlock(&ix->rw);
		rc = nl ? 0 : -ENOMEM;
	}
	if (rc)
		gprep_free(p);
	return rc;
}

/* Apply prepared entries (wmu and rw write-held); the keys move into the log. */
static void gprep_apply(struct flat_index *ix, struct gprep *p)
{
	struct flat_gix *g = &ix->gix;

	for (size_t i = 0; p->e && i < p->n; i++) {
		g->log[g->n++] = p->e[i];
		dm_u64set_add(&g->set, flat_row_version(p->e[i].key,
				    p->e[i].vcrc));
	}
	free(p->e);
	p->e = NULL;
	advance(ix);
}

static bool entry_ok(const struct flat_gentry *e)
{
	size_t l = e->key ? strnlen(e->key, FLAT_KEY_MAX + 1) : 0;

	return l >= 1 && l <= FLAT_KEY_MAX;
}

static void enc(struct dm_buf *b, const struct flat_index *ix, uint64_t tag,
		const struct flat_gkey *e, size_t n)
{
	dm_buf_str(b, ix->info.bucket);
	dm_buf_str(b, ix->info.name);
	dm_buf_u64(b, tag);
	dm_buf_u32(b, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		dm_buf_u64(b, e[i].id);
		dm_buf_str(b, e[i].key);
		dm_buf_u32(b, e[i].vcrc);
	}
}

int flat_gindex_add(struct flat_index *ix, uint64_t tag, const struct flat_gentry *e, size_t n,
		    uint64_t *mark)
{
	struct dm_buf b = { 0 };
	struct gprep p = { 0 };
	int rc;

	if (n > FLAT_GINDEX_MAX || (n && !e))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!entry_ok(&e[i]))
			return -EINVAL;
	pthread_mutex_lock(&ix->wmu);
	flat_drain(ix);                 /* every logged write applied: the rows are final */
	if (ix->deleted) {
		rc = -ENOENT;
		goto out_unlock;
	}
	if (!ix->mark_tag || tag != ix->mark_tag) {
		rc = -ESTALE;           /* another graph generation (or none) */
		goto out_unlock;
	}
	/* n == 0 (the advance alone over rows that arrived after the entries that hold them)
	 * is logged too when it moves the mark, so that replay reaches the same mark. */
	if (!n && advance_to(ix) == ix->mark) {
		if (mark)
			*mark = ix->mark;
		rc = 0;
		goto out_unlock;
	}
	rc = n ? gprep_init(ix, &p, e, n) : 0;
	if (rc)
		goto out_unlock;
	flat_rec_begin(&b);
	enc(&b, ix, tag, p.e, n);
	rc = flat_wal_append(ix->s, &b, FLAT_REC_GINDEX);
	if (rc) {
		gprep_free(&p);
		goto out_unlock;
	}
	pthread_rwlock_wrlock(&ix->rw);
	gprep_apply(ix, &p);
	if (mark)
		*mark = ix->mark;
	pthread_rwlock_unlock(&ix->rw);
	rc = 0;
out_unlock:
	pthread_mutex_unlock(&ix->wmu);
	dm_buf_free(&b);
	return rc;
}

uint64_t flat_gindex_read(struct flat_index *ix, uint64_t from, size_t max, flat_gkey_fn fn,
			  void *ctx)
{
	uint64_t total;

	pthread_rwlock_rdlock(&ix->rw);
	total = ix->gix.n;
	for (uint64_t i = from; i < total && i - from < max; i++)
		if (fn(ctx, ix->gix.log[i].id, ix->gix.log[i].key))
			break;
	pthread_rwlock_unlock(&ix->rw);
	return total;
}

uint64_t flat_gindex_count(struct flat_index *ix)
{
	uint64_t n;

	pthread_rwlock_rdlock(&ix->rw);
	n = ix->gix.n;
	pthread_rwlock_unlock(&ix->rw);
	return n;
}

int flat_gindex_apply(struct flat_store *s, const uint8_t *p, uint32_t len)
{
	struct dm_rbuf rd = { .p = p, .n = len };
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct flat_gentry *e = NULL;
	char (*keys)[FLAT_KEY_MAX + 1] = NULL;
	struct flat_index *ix;
	struct gprep pr = { 0 };
	uint64_t tag;
	uint32_t n;
	ssize_t i;
	int rc = 0;

	flat_rd_name(&rd, b, FLAT_NAME_MAX);
	flat_rd_name(&rd, x, FLAT_NAME_MAX);
	tag = dm_rbuf_u64(&rd);
	n = dm_rbuf_u32(&rd);
	/* each entry takes at least 8 + 4 + 1 + 4 bytes */
	if (rd.bad || n > FLAT_GINDEX_MAX || n > (rd.n - rd.at) / 17)
		return -EBADMSG;
	i = flat_index_find(s, b, x);
	if (i < 0)
		return -EBADMSG;
	ix = s->ix[i];
	if (!ix->mark_tag || tag != ix->mark_tag)
		return -EBADMSG;        /* the log order makes the generation match */
	e = calloc(n ? n : 1, sizeof(*e));
	keys = malloc((size_t)(n ? n : 1) * sizeof(*keys));
	if (!e || !keys) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t j = 0; j < n && !rd.bad; j++) {
		e[j].id = dm_rbuf_u64(&rd);
		flat_rd_name(&rd, keys[j], FLAT_KEY_MAX);
		e[j].key = keys[j];
		e[j].vcrc = dm_rbuf_u32(&rd);
	}
	if (rd.bad || rd.at != rd.n) {
		rc = -EBADMSG;
		goto out;
	}
	rc = gprep_init(ix, &pr, e, n);
	if (!rc)
		gprep_apply(ix, &pr);
out:
	free(keys);
	free(e);
	return rc;
}

bool flat_gindex_snap(struct flat_index *ix, size_t *at, struct dm_buf *b)
{
	size_t n;

	if (*at >= ix->gix.n)
		return false;
	n = DM_MIN((size_t)GIX_SNAP_BATCH, ix->gix.n - *at);
	enc(b, ix, ix->mark_tag, ix->gix.log + *at, n);
	*at += n;
	return true;
}
