/* s3_fcache.c: the member-side fragment cache: hash map + intrusive LRU list, bounded in
 * bytes (see s3_fcache.h). */
#include "s3_fcache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/dm_hash.h"

#define FC_MAX_MN 256                /* DM_MAX_NODES */

struct s3_fcache {
	pthread_mutex_t mu;
	struct s3_frag **tab;
	size_t nbuckets;                 /* a power of two */
	size_t n;                        /* entries in the map */
	uint64_t bytes, cap;
	struct s3_frag lru;              /* sentinel: lru.lnext most recent, lru.lprev oldest */
	uint64_t mn_epoch[FC_MAX_MN];
	bool mn_seen[FC_MAX_MN];
	struct s3_fcache_stats st;
};

static uint64_t key_hash(const struct s3_fkey *k)
{
	uint64_t h = DM_FNV64_INIT;

	h = dm_fnv1a64(h, k->bucket, strlen(k->bucket) + 1);
	h = dm_fnv1a64(h, k->index, strlen(k->index) + 1);
	return dm_mix64(h ^ dm_hash64(k->frag) ^ ((uint64_t)k->mn << 48));
}

static bool same_place(const struct s3_frag *f, const struct s3_fkey *k, uint64_t h)
{
	return f->hash == h && f->mn == k->mn && f->frag == k->frag &&
	       !strcmp(f->bucket, k->bucket) && !strcmp(f->index, k->index);
}

static void lru_unlink(struct s3_frag *f)
{
	if (!f->lnext)
		return;
	f->lprev->lnext = f->lnext;
	f->lnext->lprev = f->lprev;
	f->lprev = f->lnext = NULL;
}

static void lru_push_front(struct s3_fcache *c, struct s3_frag *f)
{
	f->lnext = c->lru.lnext;
	f->lprev = &c->lru;
	c->lru.lnext->lprev = f;
	c->lru.lnext = f;
}

static void frag_destroy(struct s3_frag *f)
{
	for (uint32_t r = 0; r < f->rows; r++) {
		free(f->key[r]);
		free(f->meta[r]);
	}
	free(f->vec);
	free(f->norm2);
	free(f->key);
	free(f->meta);
	free(f->mlen);
	free(f->flen);
	free(f->deadf);
	free(f->part);
	free(f->porder);
	free(f->pstart);
	pthread_rwlock_destroy(&f->rw);
	pthread_mutex_destroy(&f->fetch);
	free(f);
}

/* Take f out of the hash map (mu held). */
static void map_remove(struct s3_fcache *c, struct s3_frag *f)
{
	struct s3_frag **pp = &c->tab[f->hash & (c->nbuckets - 1)];

	while (*pp && *pp != f)
		pp = &(*pp)->hnext;
	if (*pp) {
		*pp = f->hnext;
		c->n--;
	}
	f->hnext = NULL;
	f->detached = true;
}

/* Remove f from the cache for good: freed now if unreferenced, else at its last put. */
static void drop(struct s3_fcache *c, struct s3_frag *f)
{
	map_remove(c, f);
	lru_unlink(f);
	if (!f->refs) {
		c->bytes -= f->bytes;
		frag_destroy(f);
	}
}

static void map_grow(struct s3_fcache *c)
{
	size_t nb = c->nbuckets * 2;
	struct s3_frag **t = calloc(nb, sizeof(*t));

	if (!t)
		return;                  /* stays correct, only slower */
	for (size_t i = 0; i < c->nbuckets; i++)
		while (c->tab[i]) {
			struct s3_frag *f = c->tab[i];

			c->tab[i] = f->hnext;
			f->hnext = t[f->hash & (nb - 1)];
			t[f->hash & (nb - 1)] = f;
		}
	free(c->tab);
	c->tab = t;
	c->nbuckets = nb;
}

/* Evict the oldest unreferenced entries until the cache fits (mu held). */
static void trim(struct s3_fcache *c)
{
	while (c->bytes > c->cap && c->lru.lprev != &c->lru) {
		struct s3_frag *v = c->lru.lprev;

		c->st.evict_steps++;
		c->st.evictions++;
		drop(c, v);
	}
}

/* An epoch of MN mn not seen before: drop that MN's unreferenced older entries. */
static void note_epoch(struct s3_fcache *c, uint32_t mn, uint64_t epoch)
{
	if (c->mn_seen[mn] && c->mn_epoch[mn] == epoch)
		return;
	if (c->mn_seen[mn])
		for (struct s3_frag *f = c->lru.lnext, *nx; f != &c->lru; f = nx) {
			nx = f->lnext;
			if (f->mn == mn && f->epoch != epoch)
				drop(c, f);
		}
	c->mn_seen[mn] = true;
	c->mn_epoch[mn] = epoch;
}

struct s3_fcache *s3_fcache_new(uint64_t cap)
{
	struct s3_fcache *c;

	if (!cap) {
		errno = EINVAL;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		goto err;
	c->nbuckets = 256;
	c->tab = calloc(c->nbuckets, sizeof(*c->tab));
	if (!c->tab)
		goto err_free_c;
	c->cap = cap;
	c->lru.lnext = c->lru.lprev = &c->lru;
	pthread_mutex_init(&c->mu, NULL);
	return c;

err_free_c:
	free(c);
err:
	errno = ENOMEM;
	return NULL;
}

void s3_fcache_free(struct s3_fcache *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nbuckets; i++)
		while (c->tab[i]) {
			struct s3_frag *f = c->tab[i];

			c->tab[i] = f->hnext;
			frag_destroy(f);
		}
	free(c->tab);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

struct s3_frag *s3_fcache_get(struct s3_fcache *c, const struct s3_fkey *key, uint32_t dim,
			      bool *hit)
{
	uint64_t h;
	struct s3_frag *f;

	if (hit)
		*hit = false;
	if (strlen(key->bucket) >= S3_FC_NAME_MAX || strlen(key->index) >= S3_FC_NAME_MAX ||
	    key->mn >= FC_MAX_MN) {
		errno = EINVAL;
		return NULL;
	}
	h = key_hash(key);
	pthread_mutex_lock(&c->mu);
	note_epoch(c, key->mn, key->epoch);
	c->st.lookups++;
	for (f = c->tab[h & (c->nbuckets - 1)]; f; f = f->hnext) {
		c->st.probes++;
		if (same_place(f, key, h))
			break;
	}
	if (f && f->epoch == key->epoch && f->created == key->created) {
		c->st.hits++;
		if (!f->refs++)
			lru_unlink(f);
		pthread_mutex_unlock(&c->mu);
		if (hit)
			*hit = true;
		return f;
	}
	if (f) {                         /* the fragment changed: replace it */
		c->st.replaced++;
		drop(c, f);
	}
	c->st.misses++;
	f = calloc(1, sizeof(*f));
	if (!f) {
		pthread_mutex_unlock(&c->mu);
		errno = ENOMEM;
		return NULL;
	}
	f->mn = key->mn;
	f->frag = key->frag;
	f->epoch = key->epoch;
	f->created = key->created;
	f->dim = dim;
	f->hash = h;
	strcpy(f->bucket, key->bucket);
	strcpy(f->index, key->index);
	pthread_rwlock_init(&f->rw, NULL);
	pthread_mutex_init(&f->fetch, NULL);
	f->refs = 1;
	if (c->n >= c->nbuckets)
		map_grow(c);
	f->hnext = c->tab[h & (c->nbuckets - 1)];
	c->tab[h & (c->nbuckets - 1)] = f;
	c->n++;
	pthread_mutex_unlock(&c->mu);
	return f;
}

void s3_fcache_put(struct s3_fcache *c, struct s3_frag *f)
{
	pthread_mutex_lock(&c->mu);
	if (--f->refs == 0) {
		if (f->detached) {
			c->bytes -= f->bytes;
			frag_destroy(f);
		} else {
			lru_push_front(c, f);
		}
	}
	trim(c);
	pthread_mutex_unlock(&c->mu);
}

void s3_fcache_account(struct s3_fcache *c, struct s3_frag *f, size_t bytes)
{
	pthread_mutex_lock(&c->mu);
	c->bytes = c->bytes - f->bytes + bytes;
	f->bytes = bytes;
	pthread_mutex_unlock(&c->mu);
}

void s3_fcache_stats(struct s3_fcache *c, struct s3_fcache_stats *out)
{
	pthread_mutex_lock(&c->mu);
	*out = c->st;
	out->entries = c->n;
	out->bytes = c->bytes;
	out->cap = c->cap;
	pthread_mutex_unlock(&c->mu);
}

int s3_frag_reserve(struct s3_frag *f, uint32_t n)
{
	uint32_t cap = f->cap ? f->cap : 64;

	if (n <= f->cap)
		return 0;
	while (cap < n)
		cap *= 2;
	float *v = realloc(f->vec, (size_t)cap * f->dim * sizeof(float));

	if (!v)
		return -ENOMEM;
	f->vec = v;
#define GROW(field) do {                                                 \
		void *p_ = realloc(f->field, cap * sizeof(*f->field));   \
		if (!p_)                                                 \
			return -ENOMEM;                                  \
		f->field = p_;                                           \
	} while (0)
	GROW(norm2);
	GROW(key);
	GROW(meta);
	GROW(mlen);
	GROW(flen);
	GROW(deadf);
#undef GROW
	f->cap = cap;
	return 0;
}
