/* mn_store.c: objects in the memory node's region: allocate, commit with checksum, look up,
 * drop, snapshot and restore. */
#include "mn_store.h"
#include "util/dm_buf.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define SNAP_MAGIC "DMSNAP01"

struct mn_store *mn_store_new(size_t len, int numa_node, enum dm_huge_mode huge)
{
	struct mn_store *st = calloc(1, sizeof(*st));
	int rc;

	if (!st)
		return NULL;
	st->objs = calloc(MN_MAX_OBJS, sizeof(*st->objs));
	if (!st->objs)
		goto err_free_st;
	rc = dm_region_alloc(&st->region, len, numa_node, huge);
	if (rc) {
		errno = -rc;
		goto err_free_objs;
	}
	pthread_mutex_init(&st->lock, NULL);
	return st;

err_free_objs:
	free(st->objs);
err_free_st:
	free(st);
	return NULL;
}

void mn_store_free(struct mn_store *st)
{
	if (!st)
		return;
	dm_region_free(&st->region);
	pthread_mutex_destroy(&st->lock);
	free(st->objs);
	free(st->snap_loc);
	free(st);
}

static struct mn_obj *find(struct mn_store *st, uint64_t key)
{
	for (uint32_t i = 0; i < st->nobj; i++)
		if (st->objs[i].state != MN_OBJ_FREE && st->objs[i].key == key)
			return &st->objs[i];
	return NULL;
}

/* Place a new object: the smallest free hole that fits, else the bump pointer. */
static int place(struct mn_store *st, uint64_t key, uint64_t len, uint64_t *off)
{
	uint64_t need = DM_ALIGN_UP(len, MN_OBJ_ALIGN);
	struct mn_obj *hole = NULL, *o;

	for (uint32_t i = 0; i < st->nobj; i++) {
		o = &st->objs[i];
		if (o->state == MN_OBJ_FREE && o->len >= need && (!hole || o->len < hole->len))
			hole = o;
	}
	if (hole) {
		/* Keep the hole's full length so it can be reused whole again later. */
		hole->key = key;
		hole->state = MN_OBJ_WRITING;
		st->objver++;
		hole->crc = 0;
		hole->flags = 0;
		*off = hole->off;
		return 0;
	}
	if (st->region.len - st->used < need)
		return -ENOSPC;
	if (st->nobj == MN_MAX_OBJS)
		return -ENOSPC;
	o = &st->objs[st->nobj++];
	*o = (struct mn_obj){ .key = key, .off = st->used, .len = need, .state = MN_OBJ_WRITING };
	st->objver++;
	st->used += need;
	*off = o->off;
	return 0;
}

int mn_store_alloc(struct mn_store *st, uint64_t key, uint64_t len, uint64_t *off)
{
	struct mn_obj *o;
	int rc;

	if (len == 0 || len > st->region.len)
		return len == 0 ? -EINVAL : -ENOSPC;
	pthread_mutex_lock(&st->lock);
	o = find(st, key);
	if (o && o->state == MN_OBJ_COMMITTED) {
		rc = -EEXIST;
	} else if (o && o->len >= DM_ALIGN_UP(len, MN_OBJ_ALIGN)) {
		*off = o->off;
		rc = 0;
	} else {
		if (o) {
			o->state = MN_OBJ_FREE;
			st->objver++;
		}
		rc = place(st, key, len, off);
	}
	pthread_mutex_unlock(&st->lock);
	return rc;
}

int mn_store_commit(struct mn_store *st, uint64_t key, uint64_t len, uint32_t crc,
		    uint32_t flags)
{
	struct mn_obj *o;
	uint32_t got;
	int rc = 0;

	pthread_mutex_lock(&st->lock);
	o = find(st, key);
	if (!o) {
		rc = -ENOENT;
	} else if (o->state == MN_OBJ_COMMITTED) {
		rc = -EEXIST;
	} else if (len == 0 || DM_ALIGN_UP(len, MN_OBJ_ALIGN) > o->len ||
		   (flags & ~MN_OBJ_MUTABLE)) {
		rc = -EINVAL;
	} else {
		got = (uint32_t)crc32_z(0, (const Bytef *)st->region.addr + o->off, len);
		if (got != crc) {
			rc = -EBADMSG;
		} else {
			o->len = len;
			o->crc = crc;
			o->flags = flags;
			o->state = MN_OBJ_COMMITTED;
			st->objver++;
		}
	}
	pthread_mutex_unlock(&st->lock);
	return rc;
}

int mn_store_lookup(struct mn_store *st, uint64_t key, struct mn_obj *out)
{
	struct mn_obj *o;
	int rc = -ENOENT;

	pthread_mutex_lock(&st->lock);
	o = find(st, key);
	if (o && o->state == MN_OBJ_COMMITTED) {
		*out = *o;
		rc = 0;
	}
	pthread_mutex_unlock(&st->lock);
	return rc;
}

static void free_obj(struct mn_store *st, struct mn_obj *o)
{
	o->state = MN_OBJ_FREE;
	st->objver++;
	/* Committed objects keep only their exact length: restore the hole. */
	o->len = DM_ALIGN_UP(o->len, MN_OBJ_ALIGN);
}

/* Give trailing holes back to the bump pointer. */
static void trim(struct mn_store *st)
{
	while (st->nobj > 0 && st->objs[st->nobj - 1].state == MN_OBJ_FREE) {
		st->used = st->objs[st->nobj - 1].off;
		st->nobj--;
	}
}

static int drop_locked(struct mn_store *st, uint64_t key_value, uint64_t mask)
{
	int n = 0;

	for (uint32_t i = 0; i < st->nobj; i++) {
		struct mn_obj *o = &st->objs[i];

		if (o->state != MN_OBJ_FREE && (o->key & mask) == (key_value & mask)) {
			free_obj(st, o);
			n++;
		}
	}
	trim(st);
	return n;
}

int mn_store_drop(struct mn_store *st, uint64_t key_value, uint64_t mask)
{
	int n;

	pthread_mutex_lock(&st->lock);
	n = drop_locked(st, key_value, mask);
	pthread_mutex_unlock(&st->lock);
	return n;
}

/* ---- index generations ------------------------------------------------------------------ */

/* The entry of index; with create, a free one (or, when none is free, one that holds no
 * generation: only compute nodes' reports of another index) taken for it. */
static struct mn_gen *gen_find(struct mn_store *st, uint32_t index, bool create)
{
	struct mn_gen *free_g = NULL, *empty_g = NULL;

	for (uint32_t i = 0; i < MN_MAX_GEN_INDEXES; i++) {
		struct mn_gen *g = &st->gens[i];

		if (g->used && g->index == index)
			return g;
		if (!g->used && !free_g)
			free_g = g;
		if (g->used && !g->has_current && !g->has_retired && !empty_g)
			empty_g = g;
	}
	if (!free_g)
		free_g = empty_g;
	if (!create || !free_g)
		return NULL;
	memset(free_g, 0, sizeof(*free_g));
	free_g->used = true;
	free_g->index = index;
	for (uint32_t c = 0; c < DM_MAX_NODES_WIRE; c++)
		free_g->seen_ns[c] = st->gen_t0;
	return free_g;
}

/* Drop the retired generation once no compute node holds it; fill out. st->lock held. */
static void gen_collect(struct mn_store *st, struct mn_gen *g, struct mn_gen_state *out)
{
	uint64_t now = dm_now_ns();
	uint32_t waiting = 0, freed = 0;

	if (g && g->has_retired) {
		for (uint32_t c = 0; c < st->n_cn; c++)
			if (g->reported[c] <= g->retired && now - g->seen_ns[c] <= st->lease_ns)
				waiting++;
		if (!waiting) {
			freed = (uint32_t)drop_locked(st, dm_gen_meta_key(g->index, g->retired),
						      ~0ull);
			freed += (uint32_t)drop_locked(st, dm_gen_block_key(g->index, g->retired, 0),
						       DM_GEN_BLOCK_MASK);
			dm_info("mn: index %u generation %llu released (%u objects freed)", g->index,
				(unsigned long long)g->retired, freed);
			g->has_retired = false;
			g->retired = 0;
			if (!g->has_current)
				g->used = false;   /* a dropped graph is gone: the entry is free */
		}
	}
	if (out)
		*out = (struct mn_gen_state){
			.has_current = g && g->has_current, .current = g ? g->current : 0,
			.has_retired = g && g->has_retired, .retired = g ? g->retired : 0,
			.waiting = waiting, .freed = freed };
}

void mn_store_gen_setup(struct mn_store *st, uint32_t n_cn, uint32_t lease_ms)
{
	pthread_mutex_lock(&st->lock);
	st->n_cn = DM_MIN(n_cn, DM_MAX_NODES_WIRE);
	st->lease_ns = (uint64_t)lease_ms * 1000000ull;
	st->gen_t0 = dm_now_ns();
	for (uint32_t i = 0; i < MN_MAX_GEN_INDEXES; i++)
		for (uint32_t c = 0; c < DM_MAX_NODES_WIRE; c++)
			st->gens[i].seen_ns[c] = st->gen_t0;
	pthread_mutex_unlock(&st->lock);
}

int mn_store_gen_publish(struct mn_store *st, uint32_t index, uint64_t gen,
			 struct mn_gen_state *out)
{
	struct mn_gen *g;
	struct mn_obj *o;
	int rc = 0;

	pthread_mutex_lock(&st->lock);
	o = find(st, dm_gen_meta_key(index, gen));
	g = gen_find(st, index, true);
	if (!o || o->state != MN_OBJ_COMMITTED) {
		rc = -ENOENT;
	} else if (!g) {
		rc = -ENOSPC;
	} else if (g->has_current && gen <= g->current) {
		rc = gen == g->current ? 0 : -ESTALE;   /* publishing twice is harmless */
	} else {
		gen_collect(st, g, NULL);
		if (g->has_retired) {
			rc = -EBUSY;
		} else {
			g->has_retired = g->has_current;
			g->retired = g->current;
			g->has_current = true;
			g->current = gen;
		}
	}
	gen_collect(st, g, out);
	pthread_mutex_unlock(&st->lock);
	return rc;
}

int mn_store_gen_report(struct mn_store *st, uint32_t index, uint32_t cn, uint64_t gen,
			struct mn_gen_state *out)
{
	struct mn_gen *g;

	if (cn != DM_GEN_NO_CN && cn >= DM_MAX_NODES_WIRE)
		return -EINVAL;
	pthread_mutex_lock(&st->lock);
	g = gen_find(st, index, cn != DM_GEN_NO_CN);
	if (g && cn != DM_GEN_NO_CN) {
		g->reported[cn] = gen;
		g->seen_ns[cn] = dm_now_ns();
	}
	gen_collect(st, g, out);
	pthread_mutex_unlock(&st->lock);
	return 0;
}

int mn_store_gen_drop(struct mn_store *st, uint32_t index, uint64_t gen,
		      struct mn_gen_state *out)
{
	struct mn_gen *g;
	int rc = 0;

	pthread_mutex_lock(&st->lock);
	g = gen_find(st, index, false);
	if (g)
		gen_collect(st, g, NULL);
	if (!g || !g->used) {
		rc = -ENOENT;
		g = NULL;
	} else if (!g->has_current) {
		/* dropped before: harmless while its blocks are held */
		rc = g->has_retired && g->retired == gen ? 0 : -ENOENT;
	} else if (gen != g->current) {
		rc = -ESTALE;
	} else if (g->has_retired) {
		rc = -EBUSY;   /* one retired generation at a time */
	} else {
		uint32_t n = (uint32_t)drop_locked(st, dm_gen_meta_key(index, gen), ~0ull);

		dm_info("mn: index %u dropped: generation %llu retired (%u metadata object%s "
			"freed)", index, (unsigned long long)gen, n, n == 1 ? "" : "s");
		g->has_current = false;
		g->current = 0;
		g->has_retired = true;
		g->retired = gen;
	}
	gen_collect(st, g, out);
	pthread_mutex_unlock(&st->lock);
	return rc;
}

uint32_t mn_store_gen_list(struct mn_store *st, struct mn_gen_entry *out, uint32_t cap)
{
	uint32_t n = 0;

	pthread_mutex_lock(&st->lock);
	for (uint32_t i = 0; i < MN_MAX_GEN_INDEXES && n < cap; i++) {
		const struct mn_gen *g = &st->gens[i];

		if (!g->used)
			continue;
		out[n++] = (struct mn_gen_entry){
			.index = g->index, .has_current = g->has_current,
			.has_retired = g->has_retired, .current = g->has_current ? g->current : 0,
			.retired = g->has_retired ? g->retired : 0 };
	}
	pthread_mutex_unlock(&st->lock);
	return n;
}

void mn_store_gen_tick(struct mn_store *st)
{
	pthread_mutex_lock(&st->lock);
	for (uint32_t i = 0; i < MN_MAX_GEN_INDEXES; i++)
		if (st->gens[i].used)
			gen_collect(st, &st->gens[i], NULL);
	pthread_mutex_unlock(&st->lock);
}

/* The HNSW blocks of an index without any metadata object are dropped: leftovers of a
 * dropped graph (CTL_GEN_DROP drops the metadata at once, the blocks once released). st->lock
 * held. */
static void drop_orphan_blocks(struct mn_store *st)
{
	uint8_t *meta = calloc((DM_GEN_MAX_INDEX + 1) / 8, 1);   /* indexes with metadata */
	uint32_t n = 0;

	if (!meta) {
		dm_warn("mn: out of memory: leftover blocks of dropped graphs are kept");
		return;
	}
	for (uint32_t i = 0; i < st->nobj; i++) {
		const struct mn_obj *o = &st->objs[i];
		uint32_t index = (uint32_t)(o->key >> 32) & DM_GEN_MAX_INDEX;

		if (o->state == MN_OBJ_COMMITTED && (o->key >> 56) == DM_GEN_KIND_META)
			meta[index / 8] |= (uint8_t)(1u << (index % 8));
	}
	for (uint32_t i = 0; i < st->nobj; i++) {
		struct mn_obj *o = &st->objs[i];
		uint32_t index = (uint32_t)(o->key >> 32) & DM_GEN_MAX_INDEX;

		if (o->state != MN_OBJ_COMMITTED || (o->key >> 56) != DM_GEN_KIND_BLOCK ||
		    (meta[index / 8] >> (index % 8) & 1))
			continue;
		free_obj(st, o);
		n++;
	}
	trim(st);
	free(meta);
	if (n)
		dm_info("mn: %u leftover blocks of dropped graphs (no metadata) freed", n);
}

/* After a restore: each index's current generation is its newest metadata object, the one
 * before it (if any) the retired one; leftovers of dropped graphs go. st->lock held. */
static void gen_rebuild(struct mn_store *st)
{
	drop_orphan_blocks(st);
	for (uint32_t i = 0; i < st->nobj; i++) {
		struct mn_obj *o = &st->objs[i];
		uint32_t index = (uint32_t)(o->key >> 32) & DM_GEN_MAX_INDEX;
		uint64_t gen = (uint32_t)o->key;
		struct mn_gen *g;

		if (o->state != MN_OBJ_COMMITTED || (o->key >> 56) != DM_GEN_KIND_META ||
		    (o->key & DM_GEN_SLOT_BIT))
			continue;
		g = gen_find(st, index, true);
		if (!g)
			continue;
		if (!g->has_current || gen > g->current) {
			if (g->has_current && (!g->has_retired || g->current > g->retired)) {
				g->has_retired = true;
				g->retired = g->current;
			}
			g->has_current = true;
			g->current = gen;
		} else if (gen < g->current && (!g->has_retired || gen > g->retired)) {
			g->has_retired = true;
			g->retired = gen;
		}
	}
}

void mn_store_stats(struct mn_store *st, uint32_t *objects, uint64_t *bytes)
{
	uint32_t n = 0;
	uint64_t b = 0;

	pthread_mutex_lock(&st->lock);
	for (uint32_t i = 0; i < st->nobj; i++)
		if (st->objs[i].state == MN_OBJ_COMMITTED) {
			n++;
			b += st->objs[i].len;
		}
	pthread_mutex_unlock(&st->lock);
	*objects = n;
	*bytes = b;
}

/* Snapshot file: magic[8] | u32 version | u32 count | u64 region_len | count x
 * {u64 key, u64 off, u64 len, u32 crc, u32 0} | u32 crc32 of everything before |
 * then each object's len bytes in table order. Little-endian (x86 and arm64 only). */
struct snap_ent {
	uint64_t key, off, len;
	uint32_t crc, flags;    /* MN_OBJ_MUTABLE (0 in snapshots before it existed) */
};
_Static_assert(sizeof(struct snap_ent) == 32, "snapshot entry layout");

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int loc_cmp(const void *a, const void *b)
{
	const struct mn_snap_loc *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/* Remember where a full snapshot put each object's bytes (lock held). */
static void snap_layout(struct mn_store *st, const struct snap_ent *ents, uint32_t count)
{
	struct mn_snap_loc *l = calloc(count ? count : 1, sizeof(*l));
	uint64_t foff = 8 + 4 + 4 + 8 + (uint64_t)count * sizeof(*ents) + 4;

	free(st->snap_loc);
	st->snap_loc = l;
	st->nsnap_loc = 0;
	st->snap_objver = 0;
	if (!l)
		return;         /* the next delta is a full snapshot */
	for (uint32_t i = 0; i < count; i++) {
		l[i] = (struct mn_snap_loc){ ents[i].off, ents[i].len, foff, ents[i].flags };
		foff += ents[i].len;
	}
	qsort(l, count, sizeof(*l), loc_cmp);
	st->nsnap_loc = count;
	st->snap_objver = st->objver + 1;   /* never 0: objver + 1 below is compared */
}

static const struct mn_snap_loc *loc_of(const struct mn_store *st, uint64_t off)
{
	uint32_t lo = 0, hi = st->nsnap_loc;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (st->snap_loc[mid].off <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!lo)
		return NULL;
	const struct mn_snap_loc *l = &st->snap_loc[lo - 1];

	return off - l->off < l->len ? l : NULL;
}

static int snapshot_locked(struct mn_store *st, const char *path);

int mn_snapdelta_parse(const uint8_t *p, size_t len, uint64_t base, struct mn_range **r,
		       uint32_t *n)
{
	struct dm_rbuf rb = { .p = p, .n = len };
	uint32_t cnt = dm_rbuf_u32(&rb);
	struct mn_range *out;

	*r = NULL;
	*n = 0;
	if (rb.bad || cnt > DM_FL_SNAPDELTA_MAX || cnt > (len - rb.at) / 12 ||
	    (len - rb.at) != (size_t)cnt * 12)
		return -EBADMSG;
	out = malloc((size_t)(cnt ? cnt : 1) * sizeof(*out));
	if (!out)
		return -ENOMEM;
	for (uint32_t i = 0; i < cnt; i++) {
		uint64_t addr = dm_rbuf_u64(&rb);

		out[i].len = dm_rbuf_u32(&rb);
		if (addr < base) {
			free(out);
			return -EINVAL;
		}
		out[i].off = addr - base;
	}
	*r = out;
	*n = cnt;
	return 0;
}

int mn_store_snapshot_delta(struct mn_store *st, const char *path, const struct mn_range *r,
			    size_t n, bool *full)
{
	int fd, rc = 0;

	*full = false;
	pthread_mutex_lock(&st->lock);
	for (size_t i = 0; i < n; i++)
		if (!r[i].len || r[i].off > st->region.len || r[i].len > st->region.len - r[i].off) {
			rc = -EINVAL;
			goto out_unlock;
		}
	if (!st->snap_objver || st->snap_objver != st->objver + 1) {
		*full = true;
		rc = snapshot_locked(st, path);
		goto out_unlock;
	}
	for (size_t i = 0; i < n; i++) {
		const struct mn_snap_loc *l = loc_of(st, r[i].off);

		if (!l || !(l->flags & MN_OBJ_MUTABLE) || r[i].off + r[i].len > l->off + l->len) {
			rc = -EINVAL;
			goto out_unlock;
		}
	}
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		goto out_unlock;
	}
	for (size_t i = 0; i < n && !rc; i++) {
		const struct mn_snap_loc *l = loc_of(st, r[i].off);
		const char *src = (const char *)st->region.addr + r[i].off;
		off_t at = (off_t)(l->foff + (r[i].off - l->off));
		size_t left = r[i].len;

		while (left && !rc) {
			ssize_t w = pwrite(fd, src, left, at);

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				rc = w < 0 ? -errno : -EIO;
			else {
				src += w;
				at += w;
				left -= (size_t)w;
			}
		}
	}
	if (!rc && fdatasync(fd))
		rc = -errno;
	close(fd);
out_unlock:
	pthread_mutex_unlock(&st->lock);
	return rc;
}

int mn_store_snapshot(struct mn_store *st, const char *path)
{
	int rc;

	pthread_mutex_lock(&st->lock);
	rc = snapshot_locked(st, path);
	pthread_mutex_unlock(&st->lock);
	return rc;
}

static int snapshot_locked(struct mn_store *st, const char *path)
{
	char tmp[1024];
	struct snap_ent *ents = NULL;
	uint32_t count = 0, version = 1, hcrc;
	uint64_t rlen = st->region.len;
	int fd, rc;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	ents = calloc(st->nobj ? st->nobj : 1, sizeof(*ents));
	if (!ents)
		return -ENOMEM;
	for (uint32_t i = 0; i < st->nobj; i++)
		if (st->objs[i].state == MN_OBJ_COMMITTED)
			ents[count++] = (struct snap_ent){ st->objs[i].key, st->objs[i].off,
							   st->objs[i].len, st->objs[i].crc,
							   st->objs[i].flags };
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		goto out_free;
	}
	hcrc = (uint32_t)crc32_z(0, (const Bytef *)SNAP_MAGIC, 8);
	hcrc = (uint32_t)crc32_z(hcrc, (const Bytef *)&version, 4);
	hcrc = (uint32_t)crc32_z(hcrc, (const Bytef *)&count, 4);
	hcrc = (uint32_t)crc32_z(hcrc, (const Bytef *)&rlen, 8);
	hcrc = (uint32_t)crc32_z(hcrc, (const Bytef *)ents, count * sizeof(*ents));
	rc = write_all(fd, SNAP_MAGIC, 8);
	if (!rc) rc = write_all(fd, &version, 4);
	if (!rc) rc = write_all(fd, &count, 4);
	if (!rc) rc = write_all(fd, &rlen, 8);
	if (!rc) rc = write_all(fd, ents, count * sizeof(*ents));
	if (!rc) rc = write_all(fd, &hcrc, 4);
	for (uint32_t i = 0; !rc && i < count; i++)
		rc = write_all(fd, (char *)st->region.addr + ents[i].off, ents[i].len);
	if (!rc && fsync(fd))
		rc = -errno;
	close(fd);
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (rc)
		unlink(tmp);
	else
		snap_layout(st, ents, count);
out_free:
	free(ents);
	return rc;
}

static int read_all(FILE *f, void *buf, size_t len)
{
	return fread(buf, 1, len, f) == len ? 0 : -EBADMSG;
}

int mn_store_restore(struct mn_store *st, const char *path, char *err, size_t errlen)
{
	char magic[8];
	uint32_t version, count, hcrc, got;
	uint64_t rlen, end = 0;
	struct snap_ent *ents = NULL;
	FILE *f;
	int rc = -EBADMSG;

	f = fopen(path, "rb");
	if (!f)
		return -errno;
	if (read_all(f, magic, 8) || memcmp(magic, SNAP_MAGIC, 8) || read_all(f, &version, 4) ||
	    read_all(f, &count, 4) || read_all(f, &rlen, 8)) {
		snprintf(err, errlen, "%s: not a dmann snapshot (bad or short header)", path);
		goto out_close;
	}
	if (version != 1 || count > MN_MAX_OBJS) {
		snprintf(err, errlen, "%s: unsupported version %u or %u objects", path, version, count);
		goto out_close;
	}
	ents = calloc(count ? count : 1, sizeof(*ents));
	if (!ents) {
		rc = -ENOMEM;
		goto out_close;
	}
	if (read_all(f, ents, count * sizeof(*ents)) || read_all(f, &hcrc, 4)) {
		snprintf(err, errlen, "%s: truncated object table", path);
		goto out_free;
	}
	got = (uint32_t)crc32_z(0, (const Bytef *)SNAP_MAGIC, 8);
	got = (uint32_t)crc32_z(got, (const Bytef *)&version, 4);
	got = (uint32_t)crc32_z(got, (const Bytef *)&count, 4);
	got = (uint32_t)crc32_z(got, (const Bytef *)&rlen, 8);
	got = (uint32_t)crc32_z(got, (const Bytef *)ents, count * sizeof(*ents));
	if (got != hcrc) {
		snprintf(err, errlen, "%s: object table checksum mismatch", path);
		goto out_free;
	}
	for (uint32_t i = 0; i < count; i++) {
		struct snap_ent *e = &ents[i];

		if (e->len == 0 || e->off % MN_OBJ_ALIGN || e->off > st->region.len ||
		    e->len > st->region.len - e->off) {
			snprintf(err, errlen, "%s: object %u (%llu bytes at %llu) does not fit the %zu-byte region",
				 path, i, (unsigned long long)e->len, (unsigned long long)e->off,
				 st->region.len);
			rc = -ENOSPC;
			goto out_free;
		}
		if (read_all(f, (char *)st->region.addr + e->off, e->len)) {
			snprintf(err, errlen, "%s: truncated in object %u", path, i);
			goto out_free;
		}
		if (e->flags & ~MN_OBJ_MUTABLE) {
			snprintf(err, errlen, "%s: object %u has unknown flags %#x", path, i,
				 e->flags);
			goto out_free;
		}
		/* a mutable object (HNSW blocks written online) changed after its commit: its
		 * records carry their own checksums */
		if (!(e->flags & MN_OBJ_MUTABLE) &&
		    (uint32_t)crc32_z(0, (const Bytef *)st->region.addr + e->off, e->len) != e->crc) {
			snprintf(err, errlen, "%s: object %u checksum mismatch", path, i);
			goto out_free;
		}
		end = DM_MAX(end, e->off + DM_ALIGN_UP(e->len, MN_OBJ_ALIGN));
	}
	pthread_mutex_lock(&st->lock);
	for (uint32_t i = 0; i < count; i++)
		st->objs[i] = (struct mn_obj){ ents[i].key, ents[i].off, ents[i].len, ents[i].crc,
					       MN_OBJ_COMMITTED, ents[i].flags };
	st->nobj = count;
	st->used = DM_ALIGN_UP(end, MN_OBJ_ALIGN);
	st->objver++;
	snap_layout(st, ents, count);     /* the file is this snapshot: deltas may follow */
	gen_rebuild(st);
	pthread_mutex_unlock(&st->lock);
	rc = 0;
out_free:
	free(ents);
out_close:
	fclose(f);
	return rc;
}
