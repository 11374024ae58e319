/* flat_catalog.c: the flat store's catalog: buckets and indexes (create, get, list,
 * delete), index handles and their lifetime. Every change is logged and durable before it
 * is visible; the catalog arrays get their room before the record is logged, so applying a
 * logged change cannot fail. */
#include "flat_int.h"
#include "config.h"
#include "placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct flat_index *flat_index_new(struct flat_store *s, const char *bucket, const char *name,
				  uint32_t dim, enum dm_metric metric, const void *conf,
				  uint32_t conf_len, int64_t created)
{
	struct flat_index *ix = calloc(1, sizeof(*ix));

	if (!ix)
		goto err_nomem;
	ix->conf = malloc((size_t)conf_len + 1);
	if (!ix->conf)
		goto err_free_ix;
	ix->s = s;
	snprintf(ix->info.bucket, sizeof(ix->info.bucket), "%s", bucket);
	snprintf(ix->info.name, sizeof(ix->info.name), "%s", name);
	ix->info.dim = dim;
	ix->info.metric = metric;
	ix->info.created_ms = created;
	if (conf_len)
		memcpy(ix->conf, conf, conf_len);
	((char *)ix->conf)[conf_len] = 0;
	ix->info.conf = ix->conf;
	ix->info.conf_len = conf_len;
	ix->refs = 1;
	ix->frag_rows = s->o.frag_rows;
	/* A scoped index (flat.h): its key from the configuration, through the hooks. */
	ix->sops = s->o.scope;
	if (ix->sops && conf_len) {
		ix->scope_key = ix->sops->conf_key(conf, conf_len);
		if (!ix->scope_key)
			ix->sops = NULL;
	}
	pthread_mutex_init(&ix->wmu, NULL);
	pthread_cond_init(&ix->apply_cv, NULL);
	pthread_rwlock_init(&ix->rw, NULL);
	return ix;

err_free_ix:
	free(ix);
err_nomem:
	errno = ENOMEM;
	return NULL;
}

void flat_index_free(struct flat_index *ix)
{
	if (ix->s && ix->bytes)
		__atomic_sub_fetch(&ix->s->bytes, ix->bytes, __ATOMIC_RELAXED);
	for (size_t i = 0; i < ix->nfrags; i++)
		flat_frag_free(ix->frags[i]);
	while (ix->spare) {
		struct flat_frag *f = ix->spare;

		ix->spare = f->next_spare;
		flat_frag_free(f);
	}
	free(ix->frags);
	free(ix->map.slot);
	flat_gix_clear(&ix->gix);
	flat_scope_free(&ix->st);
	free(ix->scope_key);
	free(ix->conf);
	pthread_mutex_destroy(&ix->wmu);
	pthread_cond_destroy(&ix->apply_cv);
	pthread_rwlock_destroy(&ix->rw);
	free(ix);
}

void flat_index_put(struct flat_index *ix)
{
	if (ix && __atomic_sub_fetch(&ix->refs, 1, __ATOMIC_ACQ_REL) == 0)
		flat_index_free(ix);
}

void flat_store_usage(struct flat_store *s, uint64_t *used, uint64_t *max)
{
	*used = __atomic_load_n(&s->bytes, __ATOMIC_RELAXED);
	*max = s->o.max_bytes;
}

ssize_t flat_bucket_find(struct flat_store *s, const char *name)
{
	for (size_t i = 0; i < s->nb; i++)
		if (!strcmp(s->buckets[i].name, name))
			return (ssize_t)i;
	return -1;
}

ssize_t flat_index_find(struct flat_store *s, const char *bucket, const char *name)
{
	for (size_t i = 0; i < s->nix; i++)
		if (!strcmp(s->ix[i]->info.bucket, bucket) && !strcmp(s->ix[i]->info.name, name))
			return (ssize_t)i;
	return -1;
}

static bool name_ok(const char *n)
{
	size_t l = n ? strnlen(n, FLAT_NAME_MAX + 1) : 0;

	return l >= 1 && l <= FLAT_NAME_MAX;
}

int flat_grow(void **arr, size_t n, size_t *cap, size_t elem)
{
	size_t nc;
	void *p;

	if (n < *cap)
		return 0;
	nc = *cap ? *cap * 2 : 16;
	p = realloc(*arr, nc * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = nc;
	return 0;
}

int flat_cat_reserve(struct flat_store *s)
{
	if (flat_grow((void **)&s->ix, s->nix, &s->capix, sizeof(*s->ix)))
		return -ENOMEM;
	return flat_grow((void **)&s->buckets, s->nb, &s->capb, sizeof(*s->buckets));
}

void flat_cat_add_index(struct flat_store *s, struct flat_index *ix)
{
	s->ix[s->nix++] = ix;
}

void flat_cat_add_bucket(struct flat_store *s, const char *name, int64_t created)
{
	snprintf(s->buckets[s->nb].name, sizeof(s->buckets[0].name), "%s", name);
	s->buckets[s->nb].created_ms = created;
	s->nb++;
}

/* Remove index i from the catalog and drop the catalog's reference. */
void flat_cat_drop_index(struct flat_store *s, size_t i)
{
	struct flat_index *ix = s->ix[i];

	s->ix[i] = s->ix[--s->nix];
	flat_index_put(ix);
}

/* ---------------------------------------------------------------- catalog API ------ */

int flat_bucket_create(struct flat_store *s, const char *name, int64_t created_ms)
{
	struct dm_buf b = { 0 };
	int rc;

	if (!name_ok(name))
		return -EINVAL;
	pthread_rwlock_wrlock(&s->cat);
	if (flat_bucket_find(s, name) >= 0) {
		rc = -EEXIST;
		goto out_unlock;
	}
	rc = flat_cat_reserve(s);
	if (rc)
		goto out_unlock;
	flat_rec_begin(&b);
	dm_buf_str(&b, name);
	dm_buf_u64(&b, (uint64_t)created_ms);
	rc = flat_wal_append(s, &b, FLAT_REC_BUCKET_CREATE);
	if (!rc)
		flat_cat_add_bucket(s, name, created_ms);
out_unlock:
	pthread_rwlock_unlock(&s->cat);
	dm_buf_free(&b);
	return rc;
}

int flat_bucket_get(struct flat_store *s, const char *name, struct flat_bucket_info *out)
{
	ssize_t i;

	pthread_rwlock_rdlock(&s->cat);
	i = name ? flat_bucket_find(s, name) : -1;
	if (i >= 0 && out)
		*out = s->buckets[i];
	pthread_rwlock_unlock(&s->cat);
	return i >= 0 ? 0 : -ENOENT;
}

int flat_bucket_delete(struct flat_store *s, const char *name)
{
	struct dm_buf b = { 0 };
	ssize_t i;
	int rc = 0;

	pthread_rwlock_wrlock(&s->cat);
	i = name ? flat_bucket_find(s, name) : -1;
	if (i < 0) {
		rc = -ENOENT;
		goto out_unlock;
	}
	for (size_t j = 0; j < s->nix; j++)
		if (!strcmp(s->ix[j]->info.bucket, name)) {
			rc = -ENOTEMPTY;
			goto out_unlock;
		}
	flat_rec_begin(&b);
	dm_buf_str(&b, name);
	rc = flat_wal_append(s, &b, FLAT_REC_BUCKET_DELETE);
	if (!rc) {
		flat_attr_drop(s, name, NULL);
		s->buckets[i] = s->buckets[--s->nb];
	}
out_unlock:
	pthread_rwlock_unlock(&s->cat);
	dm_buf_free(&b);
	return rc;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

static bool list_take(const char *name, const char *prefix, const char *after)
{
	if (prefix && strncmp(name, prefix, strlen(prefix)))
		return false;
	return !after || strcmp(name, after) > 0;
}

int flat_bucket_list(struct flat_store *s, const char *prefix, const char *after, size_t max,
		     struct flat_bucket_info *out, bool *more)
{
	struct flat_bucket_info *all;
	size_t n = 0, k = 0;

	*more = false;
	pthread_rwlock_rdlock(&s->cat);
	all = malloc((s->nb + 1) * sizeof(*all));
	if (!all) {
		pthread_rwlock_unlock(&s->cat);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nb; i++)
		if (list_take(s->buckets[i].name, prefix, after))
			all[n++] = s->buckets[i];
	pthread_rwlock_unlock(&s->cat);
	qsort(all, n, sizeof(*all), name_cmp);   /* name is the first member */
	k = DM_MIN(n, max);
	memcpy(out, all, k * sizeof(*all));
	*more = n > k;
	free(all);
	return (int)k;
}

int flat_index_create(struct flat_store *s, const char *bucket, const char *name, uint32_t dim,
		      enum dm_metric metric, const void *conf, uint32_t conf_len,
		      int64_t created_ms)
{
	struct dm_buf b = { 0 };
	struct flat_index *ix = NULL;
	int rc;

	if (!name_ok(bucket) || !name_ok(name) || dim < 1 || dim > FLAT_DIM_MAX ||
	    (unsigned)metric > 2 || (conf_len && !conf))
		return -EINVAL;
	pthread_rwlock_wrlock(&s->cat);
	if (flat_bucket_find(s, bucket) < 0) {
		rc = -ENOENT;
		goto out_unlock;
	}
	if (flat_index_find(s, bucket, name) >= 0) {
		rc = -EEXIST;
		goto out_unlock;
	}
	ix = flat_index_new(s, bucket, name, dim, metric, conf, conf_len, created_ms);
	rc = ix ? flat_cat_reserve(s) : -ENOMEM;
	if (rc)
		goto out_unlock;
	flat_rec_begin(&b);
	dm_buf_str(&b, bucket);
	dm_buf_str(&b, name);
	dm_buf_u32(&b, dim);
	dm_buf_u32(&b, (uint32_t)metric);
	dm_buf_u64(&b, (uint64_t)created_ms);
	dm_buf_bytes(&b, conf, conf_len);
	rc = flat_wal_append(s, &b, FLAT_REC_INDEX_CREATE);
	if (!rc) {
		flat_cat_add_index(s, ix);
		ix = NULL;
	}
out_unlock:
	pthread_rwlock_unlock(&s->cat);
	if (ix)
		flat_index_free(ix);
	dm_buf_free(&b);
	return rc;
}

int flat_index_delete(struct flat_store *s, const char *bucket, const char *name)
{
	struct dm_buf b = { 0 };
	struct flat_index *ix;
	ssize_t i;
	int rc;

	pthread_rwlock_wrlock(&s->cat);
	i = (bucket && name) ? flat_index_find(s, bucket, name) : -1;
	if (i < 0) {
		rc = -ENOENT;
		goto out_unlock;
	}
	ix = s->ix[i];
	pthread_mutex_lock(&ix->wmu);
	flat_rec_begin(&b);
	dm_buf_str(&b, bucket);
	dm_buf_str(&b, name);
	rc = flat_wal_append(s, &b, FLAT_REC_INDEX_DELETE);
	if (!rc)
		ix->deleted = true;
	pthread_mutex_unlock(&ix->wmu);
	if (!rc) {
		flat_attr_drop(s, bucket, name);
		flat_cat_drop_index(s, (size_t)i);
	}
out_unlock:
	pthread_rwlock_unlock(&s->cat);
	dm_buf_free(&b);
	return rc;
}

int flat_index_list(struct flat_store *s, const char *bucket, const char *prefix,
		    const char *after, size_t max, char (*names)[FLAT_NAME_MAX + 1], bool *more)
{
	char (*all)[FLAT_NAME_MAX + 1];
	size_t n = 0, k;

	*more = false;
	pthread_rwlock_rdlock(&s->cat);
	if (!bucket || flat_bucket_find(s, bucket) < 0) {
		pthread_rwlock_unlock(&s->cat);
		return -ENOENT;
	}
	all = malloc((s->nix + 1) * sizeof(*all));
	if (!all) {
		pthread_rwlock_unlock(&s->cat);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nix; i++)
		if (!strcmp(s->ix[i]->info.bucket, bucket) &&
		    list_take(s->ix[i]->info.name, prefix, after))
			memcpy(all[n++], s->ix[i]->info.name, FLAT_NAME_MAX + 1);
	pthread_rwlock_unlock(&s->cat);
	qsort(all, n, sizeof(*all), name_cmp);
	k = DM_MIN(n, max);
	memcpy(names, all, k * sizeof(*all));
	*more = n > k;
	free(all);
	return (int)k;
}

struct flat_index *flat_index_get(struct flat_store *s, const char *bucket, const char *name)
{
	struct flat_index *ix = NULL;
	ssize_t i;

	pthread_rwlock_rdlock(&s->cat);
	i = (bucket && name) ? flat_index_find(s, bucket, name) : -1;
	if (i >= 0) {
		ix = s->ix[i];
		__atomic_add_fetch(&ix->refs, 1, __ATOMIC_ACQ_REL);
	}
	pthread_rwlock_unlock(&s->cat);
	if (!ix)
		errno = ENOENT;
	return ix;
}

const struct flat_index_info *flat_index_info(const struct flat_index *ix)
{
	return &ix->info;
}

bool flat_index_scoped(const struct flat_index *ix)
{
	return ix->scope_key != NULL;
}

int flat_bucket_mns_placed(const struct dm_cluster_cfg *cfg, const uint64_t *retired,
			   const char *bucket, uint32_t *out)
{
	struct dm_place_node nodes[DM_MAX_NODES];
	uint32_t r = DM_MAX(1u, DM_MIN(cfg->redundancy ? cfg->redundancy : 1, cfg->n_mn));

	for (uint32_t i = 0; i < cfg->n_mn; i++)
		nodes[i] = (struct dm_place_node){ .id = i, .capacity = cfg->mn[i].capacity > 0 ?
			cfg->mn[i].capacity : 1.0,
			.up = !retired || !(retired[i / 64] >> (i % 64) & 1) };
	return dm_place(flat_key_hash(bucket, strlen(bucket)), nodes, cfg->n_mn, r, out);
}

int flat_bucket_mns(const struct dm_cluster_cfg *cfg, const char *bucket, uint32_t *out)
{
	return flat_bucket_mns_placed(cfg, NULL, bucket, out);
}
