/* flat_frag.c: the rows of a flat index: fragments (column arrays of a fixed number of
 * rows; the last one is the mutable tail, or in a scoped index each scope value's last
 * one, whose columns grow with its rows), tombstones, the key -> row id map, the
 * reservation that lets a logged write be applied without failing, and the read API on
 * rows and fragments (get by key or id, list, fragment stats and reads). */
#include "flat_int.h"
#include "util/dm_hash.h"

#include <stdlib.h>
#include <string.h>

int flat_fault_alloc;

/* ---------------------------------------------------------------- key map ---------- */

uint64_t flat_key_hash(const char *key, size_t len)
{
	/* FNV-1a then murmur3's 64-bit finaliser: stable across builds and restarts (the
	 * ListVectors segments depend on it), so not to be swapped for dm_mix64. */
	uint64_t h = dm_fnv1a64(DM_FNV64_INIT, key, len);

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

static inline struct flat_frag *frag_of(const struct flat_index *ix, uint64_t id, uint32_t *r)
{
	*r = (uint32_t)(id % ix->frag_rows);
	return ix->frags[id / ix->frag_rows];
}

static const char *key_of(const struct flat_index *ix, uint64_t id)
{
	uint32_t r;
	struct flat_frag *f = frag_of(ix, id, &r);

	return f->key[r];
}

/* A copy of the map rehashed into ncap slots (a power of two), or NULL. */
static struct km_slot *km_rehash(const struct keymap *m, size_t ncap)
{
	struct km_slot *ns = malloc(ncap * sizeof(*ns));

	if (!ns)
		return NULL;
	for (size_t i = 0; i < ncap; i++)
		ns[i].id = UINT64_MAX;
	for (size_t i = 0; i < m->cap; i++) {
		if (m->slot[i].id == UINT64_MAX)
			continue;
		size_t j = m->slot[i].hash & (ncap - 1);

		while (ns[j].id != UINT64_MAX)
			j = (j + 1) & (ncap - 1);
		ns[j] = m->slot[i];
	}
	return ns;
}

/* Slot of key, or the empty slot where it would go. */
static size_t km_find(const struct flat_index *ix, uint64_t h, const char *key)
{
	const struct keymap *m = &ix->map;
	size_t j = h & (m->cap - 1);

	while (m->slot[j].id != UINT64_MAX) {
		if (m->slot[j].hash == h && !strcmp(key_of(ix, m->slot[j].id), key))
			return j;
		j = (j + 1) & (m->cap - 1);
	}
	return j;
}

uint64_t flat_km_get(const struct flat_index *ix, const char *key)
{
	if (!ix->map.cap)
		return UINT64_MAX;
	return ix->map.slot[km_find(ix, flat_key_hash(key, strlen(key)), key)].id;
}

static void km_del_slot(struct keymap *m, size_t j)
{
	size_t i = j;

	m->slot[j].id = UINT64_MAX;
	m->n--;
	for (;;) {
		i = (i + 1) & (m->cap - 1);
		if (m->slot[i].id == UINT64_MAX)
			return;
		size_t home = m->slot[i].hash & (m->cap - 1);
		/* Move slot i back to j unless its home lies cyclically in (j, i]. */
		bool stay = (j <= i) ? (home > j && home <= i) : (home > j || home <= i);

		if (!stay) {
			m->slot[j] = m->slot[i];
			m->slot[i].id = UINT64_MAX;
			j = i;
		}
	}
}

/* ---------------------------------------------------------------- fragments -------- */

void flat_frag_free(struct flat_frag *f)
{
	if (!f)
		return;
	for (uint32_t r = 0; r < f->n; r++) {
		free(f->key[r]);
		free(f->meta[r]);
	}
	free(f->vec);
	free(f->norm2);
	free(f->khash);
	free(f->key);
	free(f->meta);
	free(f->meta_len);
	free(f->fmeta_len);
	free(f->dead);
	free(f);
}

static bool fault(void);

/* The columns of f for alloc rows (alloc <= f->cap), with its first f->n rows copied from
 * the old columns into the new ones (the old ones are left as they are). -ENOMEM. */
static int frag_columns(struct flat_frag *f, uint32_t alloc, uint32_t dim, struct flat_frag *nw)
{
	nw->vec = aligned_alloc(64, DM_ALIGN_UP((size_t)alloc * dim * sizeof(float), 64));
	nw->norm2 = malloc(alloc * sizeof(float));
	nw->khash = malloc(alloc * sizeof(uint64_t));
	nw->key = calloc(alloc, sizeof(char *));
	nw->meta = calloc(alloc, sizeof(uint8_t *));
	nw->meta_len = calloc(alloc, sizeof(uint32_t));
	nw->fmeta_len = calloc(alloc, sizeof(uint32_t));
	nw->dead = calloc(alloc, 1);
	if (!nw->vec || !nw->norm2 || !nw->khash || !nw->key || !nw->meta || !nw->meta_len ||
	    !nw->fmeta_len || !nw->dead) {
		free(nw->vec);
		free(nw->norm2);
		free(nw->khash);
		free(nw->key);
		free(nw->meta);
		free(nw->meta_len);
		free(nw->fmeta_len);
		free(nw->dead);
		return -ENOMEM;
	}
	if (f && f->n) {
		memcpy(nw->vec, f->vec, (size_t)f->n * dim * sizeof(float));
		memcpy(nw->norm2, f->norm2, f->n * sizeof(float));
		memcpy(nw->khash, f->khash, f->n * sizeof(uint64_t));
		memcpy(nw->key, f->key, f->n * sizeof(char *));
		memcpy(nw->meta, f->meta, f->n * sizeof(uint8_t *));
		memcpy(nw->meta_len, f->meta_len, f->n * sizeof(uint32_t));
		memcpy(nw->fmeta_len, f->fmeta_len, f->n * sizeof(uint32_t));
		memcpy(nw->dead, f->dead, f->n);
	}
	nw->alloc = alloc;
	return 0;
}

struct flat_frag *flat_frag_new_n(uint32_t cap, uint32_t alloc, uint32_t dim)
{
	struct flat_frag *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->cap = cap;
	if (frag_columns(NULL, DM_MIN(alloc, cap), dim, f)) {
		free(f);
		return NULL;
	}
	return f;
}

struct flat_frag *flat_frag_new(uint32_t cap, uint32_t dim)
{
	return flat_frag_new_n(cap, cap, dim);
}

int flat_frag_grow(struct flat_index *ix, struct flat_frag *f, uint32_t rows, bool shared)
{
	struct flat_frag nw = { 0 }, old;
	uint32_t alloc = 16;

	if (rows <= f->alloc)
		return 0;
	while (alloc < rows && alloc < f->cap)
		alloc *= 2;
	alloc = DM_MIN(alloc, f->cap);
	if (fault() || frag_columns(f, alloc, ix->info.dim, &nw))
		return -ENOMEM;
	/* Readers use f's columns under rw: the copies are swapped in under its write lock. */
	if (shared)
		pthread_rwlock_wrlock(&ix->rw);
	old = *f;
	f->vec = nw.vec;
	f->norm2 = nw.norm2;
	f->khash = nw.khash;
	f->key = nw.key;
	f->meta = nw.meta;
	f->meta_len = nw.meta_len;
	f->fmeta_len = nw.fmeta_len;
	f->dead = nw.dead;
	f->alloc = nw.alloc;
	if (shared)
		pthread_rwlock_unlock(&ix->rw);
	free(old.vec);
	free(old.norm2);
	free(old.khash);
	free(old.key);
	free(old.meta);
	free(old.meta_len);
	free(old.fmeta_len);
	free(old.dead);
	return 0;
}

/* ---------------------------------------------------------------- rows ------------- */

/* Tombstone row id (if live) and drop it from the key map. */
void flat_row_kill(struct flat_index *ix, uint64_t id)
{
	uint32_t r;
	struct flat_frag *f = frag_of(ix, id, &r);

	if (f->dead[r])
		return;
	f->dead[r] = 1;
	ix->live--;
	km_del_slot(&ix->map, km_find(ix, f->khash[r], f->key[r]));
}

static bool fault(void)
{
	return __atomic_load_n(&flat_fault_alloc, __ATOMIC_RELAXED) > 0 &&
	       __atomic_sub_fetch(&flat_fault_alloc, 1, __ATOMIC_RELAXED) == 0;
}

int flat_prow_init(struct flat_prow *p, const char *key, const void *vec, const void *meta,
		   uint32_t mlen, const void *fmeta, uint32_t flen)
{
	size_t kl = strlen(key);

	*p = (struct flat_prow){ .meta_len = mlen, .fmeta_len = flen, .vec = vec,
		.key_len = (uint32_t)kl, .khash = flat_key_hash(key, kl) };
	p->key = fault() ? NULL : strdup(key);
	p->meta = fault() ? NULL : malloc((size_t)mlen + flen + 1);
	if (!p->key || !p->meta) {
		flat_prow_free(p);
		return -ENOMEM;
	}
	if (mlen)
		memcpy(p->meta, meta, mlen);
	if (flen)
		memcpy(p->meta + mlen, fmeta, flen);
	return 0;
}

void flat_prow_free(struct flat_prow *p)
{
	free(p->key);
	free(p->meta);
	p->key = NULL;
	p->meta = NULL;
}

int flat_reserve(struct flat_index *ix, const struct flat_prow *p, uint64_t n)
{
	uint64_t rows = ix->pending_rows + n;
	uint64_t frags = (ix->next_id + rows + ix->frag_rows - 1) / ix->frag_rows;
	size_t mcap = ix->map.cap ? ix->map.cap : 1024;
	struct km_slot *ns = NULL;
	struct flat_frag **nf = NULL;
	int rc;

	if (!n)
		return 0;
	/* A scoped index: one open tail per scope label, so the plan of where the rows go
	 * tells the fragments needed. */
	if (ix->scope_key) {
		rc = flat_scope_plan(ix, p, n, &frags);
		if (rc)
			return rc;
	}
	rc = -ENOMEM;
	/* Fragments: spares wait in a list private to the writers (wmu held). */
	while (ix->nfrags + ix->nspare < frags) {
		/* a scoped index's fragments start small and grow with their rows (room for
		 * them planned below): a scope value with few rows holds little memory */
		struct flat_frag *f = fault() ? NULL : ix->scope_key ?
			flat_frag_new_n(ix->frag_rows, 16, ix->info.dim) :
			flat_frag_new(ix->frag_rows, ix->info.dim);

		if (!f)
			goto err_unplan;
		f->next_spare = ix->spare;
		ix->spare = f;
		ix->nspare++;
	}
	if (ix->scope_key && flat_scope_room(ix, p, n))
		goto err_unplan;
	/* The map and the fragment table change only under wmu (held), so they can be copied
	 * while readers use them; the new ones are swapped in under rw. */
	while ((ix->map.n + rows) * 4 > mcap * 3)
		mcap *= 2;
	if (mcap != ix->map.cap) {
		ns = fault() ? NULL : km_rehash(&ix->map, mcap);
		if (!ns)
			goto err_unplan;
	}
	if (frags > ix->capfrags) {
		size_t nc = DM_MAX(ix->capfrags ? ix->capfrags * 2 : 16, frags);

		nf = fault() ? NULL : malloc(nc * sizeof(*nf));
		if (!nf) {
			free(ns);
			goto err_unplan;
		}
		if (ix->nfrags)
			memcpy(nf, ix->frags, ix->nfrags * sizeof(*nf));
		pthread_rwlock_wrlock(&ix->rw);
		free(ix->frags);
		ix->frags = nf;
		ix->capfrags = nc;
		pthread_rwlock_unlock(&ix->rw);
	}
	if (ns) {
		pthread_rwlock_wrlock(&ix->rw);
		free(ix->map.slot);
		ix->map.slot = ns;
		ix->map.cap = mcap;
		pthread_rwlock_unlock(&ix->rw);
	}
	ix->pending_rows = rows;
	return 0;

err_unplan:
	if (ix->scope_key)
		flat_scope_unplan(ix);
	return rc;
}

void flat_unreserve(struct flat_index *ix, uint64_t n)
{
	ix->pending_rows -= n;        /* spare fragments stay for later writes */
	if (ix->scope_key && n)
		flat_scope_unplan(ix);
}

uint64_t flat_row_bytes(uint32_t dim, size_t key_len, uint32_t meta_len, uint32_t fmeta_len)
{
	/* a fragment's columns (vector, norm, key hash, key and meta pointers, two lengths,
	 * the dead flag), the key string and the one meta allocation (meta, fmeta, a NUL) */
	return (uint64_t)dim * sizeof(float) + sizeof(float) + sizeof(uint64_t) +
	       2 * sizeof(void *) + 2 * sizeof(uint32_t) + 1 + key_len + 1 + meta_len +
	       fmeta_len + 1;
}

/* The reserved spare fragment appended to the table as fragment ix->nfrags, labelled. */
static void take_spare(struct flat_index *ix, uint64_t scope)
{
	struct flat_frag *f = ix->spare;       /* reserved: never NULL here */

	ix->spare = f->next_spare;
	ix->nspare--;
	f->next_spare = NULL;
	f->scope = scope;
	ix->frags[ix->nfrags++] = f;
}

void flat_place(struct flat_index *ix, struct flat_prow *p)
{
	uint64_t nb = flat_row_bytes(ix->info.dim, p->key_len, p->meta_len, p->fmeta_len);
	uint32_t dim = ix->info.dim, r;
	uint64_t id = ix->next_id;
	struct flat_frag *f;
	size_t j;

	if (ix->scope_key) {
		/* The open tail of the row's scope label, or a new fragment for it. */
		bool fresh;
		uint64_t fr = flat_scope_take(ix, p->scope, &fresh);

		if (fresh)
			take_spare(ix, p->scope);
		id = fr * ix->frag_rows + ix->frags[fr]->n;
	} else if (id / ix->frag_rows == ix->nfrags) {
		take_spare(ix, 0);
	}
	j = km_find(ix, p->khash, p->key);
	if (ix->map.slot[j].id != UINT64_MAX) {
		flat_row_kill(ix, ix->map.slot[j].id);
		j = km_find(ix, p->khash, p->key);
	}
	f = frag_of(ix, id, &r);
	memcpy(f->vec + (size_t)r * dim, p->vec, dim * sizeof(float));
	f->norm2[r] = dm_dot(f->vec + (size_t)r * dim, f->vec + (size_t)r * dim, dim);
	f->khash[r] = p->khash;
	f->key[r] = p->key;
	f->meta[r] = p->meta;
	f->meta_len[r] = p->meta_len;
	f->fmeta_len[r] = p->fmeta_len;
	f->dead[r] = 0;
	f->n = r + 1;
	ix->map.slot[j].hash = p->khash;
	ix->map.slot[j].id = id;
	ix->map.n++;
	ix->next_id = DM_MAX(ix->next_id, id + 1);
	ix->placed++;
	ix->live++;
	ix->pending_rows--;
	ix->bytes += nb;
	__atomic_add_fetch(&ix->s->bytes, nb, __ATOMIC_RELAXED);
	p->key = NULL;
	p->meta = NULL;
}

void flat_fill_row(const struct flat_index *ix, uint64_t id, struct flat_row *row)
{
	uint32_t r;
	struct flat_frag *f = frag_of(ix, id, &r);

	row->id = id;
	row->key = f->key[r];
	row->vec = f->vec + (size_t)r * ix->info.dim;
	row->meta = f->meta[r];
	row->meta_len = f->meta_len[r];
	row->fmeta = f->meta[r] + f->meta_len[r];
	row->fmeta_len = f->fmeta_len[r];
}

bool flat_row_dead(const struct flat_index *ix, uint64_t id)
{
	uint32_t r;
	struct flat_frag *f = frag_of(ix, id, &r);

	/* r >= f->n: a hole of a scoped index (a row another label's tail has not filled) */
	return r >= f->n || f->dead[r];
}

/* ---------------------------------------------------------------- read API --------- */

static bool key_ok(const char *k)
{
	size_t l = k ? strnlen(k, FLAT_KEY_MAX + 1) : 0;

	return l >= 1 && l <= FLAT_KEY_MAX;
}

void flat_index_stats(struct flat_index *ix, uint64_t *live, uint64_t *rows, uint64_t *frags)
{
	pthread_rwlock_rdlock(&ix->rw);
	if (live)
		*live = ix->live;
	if (rows)
		*rows = ix->placed;
	if (frags)
		*frags = ix->nfrags;
	pthread_rwlock_unlock(&ix->rw);
}

/* Call fn on row id; -1 to stop before (not counted), 1 to stop after, 0 to go on. */
static int give(const struct flat_index *ix, uint64_t id, flat_row_fn fn, void *ctx, int *found)
{
	struct flat_row r;
	int c;

	flat_fill_row(ix, id, &r);
	c = fn(ctx, &r);
	if (c < 0)
		return -1;
	(*found)++;
	return c > 0;
}

int flat_get(struct flat_index *ix, const char *const *keys, size_t n, flat_row_fn fn,
	     void *ctx)
{
	int found = 0;

	pthread_rwlock_rdlock(&ix->rw);
	for (size_t i = 0; i < n; i++) {
		uint64_t id = key_ok(keys[i]) ? flat_km_get(ix, keys[i]) : UINT64_MAX;

		if (id != UINT64_MAX && give(ix, id, fn, ctx, &found))
			break;
	}
	pthread_rwlock_unlock(&ix->rw);
	return found;
}

int flat_get_ids(struct flat_index *ix, const uint64_t *ids, size_t n, flat_row_fn fn,
		 void *ctx)
{
	int found = 0;

	pthread_rwlock_rdlock(&ix->rw);
	for (size_t i = 0; i < n; i++) {
		if (ids[i] >= ix->next_id || flat_row_dead(ix, ids[i]))
			continue;
		if (give(ix, ids[i], fn, ctx, &found))
			break;
	}
	pthread_rwlock_unlock(&ix->rw);
	return found;
}

static bool in_segment(const struct flat_index *ix, uint64_t id, uint32_t cnt, uint32_t idx)
{
	uint32_t r;
	struct flat_frag *f;

	if (cnt <= 1)
		return true;
	f = frag_of(ix, id, &r);
	return f->khash[r] % cnt == idx;
}

int flat_list(struct flat_index *ix, uint64_t start, uint32_t seg_count, uint32_t seg_index,
	      size_t max, flat_row_fn fn, void *ctx, uint64_t *next)
{
	int n = 0;
	uint64_t id;

	*next = UINT64_MAX;
	if (seg_count > 1 && seg_index >= seg_count)
		return -EINVAL;
	pthread_rwlock_rdlock(&ix->rw);
	for (id = start; id < ix->next_id; id++) {
		struct flat_row r;
		uint32_t ri;
		int c;

		if (frag_of(ix, id, &ri)->n <= ri) {
			/* the unfilled rest of a scoped index's fragment (flat.h): on to the next */
			id = (id / ix->frag_rows + 1) * ix->frag_rows - 1;
			continue;
		}
		if (flat_row_dead(ix, id) || !in_segment(ix, id, seg_count, seg_index))
			continue;
		if ((size_t)n == max) {
			*next = id;        /* the next page starts at the next live row */
			break;
		}
		flat_fill_row(ix, id, &r);
		c = fn(ctx, &r);
		if (c < 0) {
			*next = id;
			break;
		}
		n++;
		if (c > 0) {
			*next = id + 1;
			break;
		}
	}
	pthread_rwlock_unlock(&ix->rw);
	return n;
}

size_t flat_fragments(struct flat_index *ix, uint64_t *bytes, size_t max)
{
	size_t n;

	pthread_rwlock_rdlock(&ix->rw);
	n = ix->nfrags;
	for (size_t i = 0; i < DM_MIN(n, max); i++)
		bytes[i] = (uint64_t)ix->frags[i]->n * ix->info.dim * sizeof(float);
	pthread_rwlock_unlock(&ix->rw);
	return n;
}

uint32_t flat_frag_rows(const struct flat_index *ix)
{
	return ix->frag_rows;
}

size_t flat_frag_stats(struct flat_index *ix, struct flat_frag_stat *out, size_t max)
{
	size_t n;

	pthread_rwlock_rdlock(&ix->rw);
	n = ix->nfrags;
	for (size_t i = 0; i < DM_MIN(n, max); i++) {
		const struct flat_frag *f = ix->frags[i];
		uint32_t d = 0;

		for (uint32_t r = 0; r < f->n; r++)
			d += f->dead[r];
		out[i] = (struct flat_frag_stat){ .rows = f->n, .dead = d, .scope = f->scope };
	}
	pthread_rwlock_unlock(&ix->rw);
	return n;
}

int flat_frag_read(struct flat_index *ix, uint64_t frag, uint32_t from, uint8_t *dead,
		   size_t dead_cap, flat_row_fn fn, void *ctx)
{
	const struct flat_frag *f;
	int rc;

	if (dead_cap < ix->frag_rows)
		return -EINVAL;
	pthread_rwlock_rdlock(&ix->rw);
	if (frag >= ix->nfrags) {
		pthread_rwlock_unlock(&ix->rw);
		return -ENOENT;
	}
	f = ix->frags[frag];
	memcpy(dead, f->dead, f->n);
	rc = (int)f->n;
	for (uint32_t r = from; r < f->n; r++) {
		struct flat_row row;

		flat_fill_row(ix, frag * ix->frag_rows + r, &row);
		if (fn(ctx, &row))
			break;
	}
	pthread_rwlock_unlock(&ix->rw);
	return rc;
}
