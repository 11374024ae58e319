/* flat_mark.c: the graph mark of a flat index (flat.h): how many of its first rows an HNSW
 * graph holds, and which graph (a tag). Logged as FLAT_REC_MARK {str bucket, str index,
 * u64 mark, u64 tag}; a snapshot writes it after the index's rows in the snapshot's own
 * numbering (rows are compacted there: the mark becomes the number of live rows below it),
 * so a restarted store has the same rows below its mark. */
#include "flat_int.h"

#include <string.h>

static void mark_enc(struct dm_buf *b, const struct flat_index *ix, uint64_t mark, uint64_t tag)
{
	dm_buf_str(b, ix->info.bucket);
	dm_buf_str(b, ix->info.name);
	dm_buf_u64(b, mark);
	dm_buf_u64(b, tag);
}

int flat_mark_set(struct flat_index *ix, uint64_t rows, uint64_t tag)
{
	struct dm_buf b = { 0 };
	int rc;

	pthread_mutex_lock(&ix->wmu);
	flat_drain(ix);                 /* every logged write applied: next_id is final */
	if (ix->deleted) {
		rc = -ENOENT;
		goto out_unlock;
	}
	if (ix->scope_key) {
		rc = -EOPNOTSUPP;       /* scoped indexes have no graph (flat.h) */
		goto out_unlock;
	}
	/* rows 0: a graph bound with nothing below its mark yet (a graph seeded from an
	 * index's rows: the online indexer's hand-over moves the mark over them, row by row,
	 * by key and vector, on each replica) */
	if (rows && ix->next_id != rows) {
		rc = -EBUSY;
		goto out_unlock;
	}
	flat_rec_begin(&b);
	mark_enc(&b, ix, rows, tag);
	rc = flat_wal_append(ix->s, &b, FLAT_REC_MARK);
	if (!rc) {
		pthread_rwlock_wrlock(&ix->rw);
		ix->mark = rows;
		ix->mark_tag = tag;
		flat_gix_clear(&ix->gix);     /* the key log was the old graph's */
		pthread_rwlock_unlock(&ix->rw);
	}
out_unlock:
	pthread_mutex_unlock(&ix->wmu);
	dm_buf_free(&b);
	return rc;
}

void flat_mark_get(struct flat_index *ix, uint64_t *mark, uint64_t *tag)
{
	pthread_rwlock_rdlock(&ix->rw);
	*mark = ix->mark;
	*tag = ix->mark_tag;
	pthread_rwlock_unlock(&ix->rw);
}

int flat_mark_apply(struct flat_store *s, const uint8_t *p, uint32_t n)
{
	struct dm_rbuf rd = { .p = p, .n = n };
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	uint64_t mark, tag;
	ssize_t i;

	flat_rd_name(&rd, b, FLAT_NAME_MAX);
	flat_rd_name(&rd, x, FLAT_NAME_MAX);
	mark = dm_rbuf_u64(&rd);
	tag = dm_rbuf_u64(&rd);
	i = rd.bad || rd.at != rd.n ? -1 : flat_index_find(s, b, x);
	/* A mark past the rows the log has written so far cannot have been set. */
	if (i < 0 || mark > s->ix[i]->next_id)
		return -EBADMSG;
	s->ix[i]->mark = mark;
	s->ix[i]->mark_tag = tag;
	flat_gix_clear(&s->ix[i]->gix);
	return 0;
}

bool flat_mark_snap(struct flat_index *ix, struct dm_buf *b)
{
	uint64_t live = 0;

	if (!ix->mark)
		return false;
	for (uint64_t id = 0; id < ix->mark; id++)
		live += !flat_row_dead(ix, id);
	mark_enc(b, ix, live, ix->mark_tag);
	return true;
}
