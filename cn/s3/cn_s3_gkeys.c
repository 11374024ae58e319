/* cn_s3_gkeys.c: the gateway's copy of the key log of a graph-bound index (flat.h,
 * "Online indexing"): node id -> S3 key for the graph nodes the online indexer added
 * after the import (the import's own nodes have their keys in the binding, dindex_bind.h).
 *
 * The copy belongs to one memory node's log (the replica the query's state came from: its
 * log order is its own) of one index incarnation and graph generation, and grows from the
 * log with FL_GKEYS. A query's state (FL_STATE) gives the log's length at the instant its
 * mark was read; the copy is brought up to that length before node ids are mapped, so
 * every node below the query's mark has its key (nodes past it are either unknown here,
 * and their rows are in the tail the query scans, or known and merged by key). */
#include "cn_s3_int.h"
#include "util/dm_hash.h"

#include <stdlib.h>
#include <string.h>

static void gk_reset(struct gkcache *g)
{
	for (size_t i = 0; i < g->cap; i++)
		free(g->slot[i].key);
	free(g->slot);
	g->slot = NULL;
	g->cap = g->used = 0;
	g->n = 0;
}

void gk_fini(struct cn_s3 *s)
{
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		gk_reset(&s->gk[g]);
		pthread_mutex_destroy(&s->gk[g].mu);
	}
}

static struct gkslot *gk_find(const struct gkcache *g, uint64_t id)
{
	if (!g->cap)
		return NULL;
	for (size_t i = dm_hash64(id) & (g->cap - 1);; i = (i + 1) & (g->cap - 1)) {
		if (!g->slot[i].key)
			return NULL;
		if (g->slot[i].id == id)
			return &g->slot[i];
	}
}

/* Add id -> key (key is taken over); a node id seen again keeps its latest key. */
static int gk_add(struct gkcache *g, uint64_t id, char *key)
{
	if ((g->used + 1) * 2 > g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 1024;
		struct gkslot *ns = calloc(cap, sizeof(*ns));

		if (!ns) {
			free(key);
			return -ENOMEM;
		}
		for (size_t i = 0; i < g->cap; i++) {
			if (!g->slot[i].key)
				continue;
			size_t j = dm_hash64(g->slot[i].id) & (cap - 1);

			while (ns[j].key)
				j = (j + 1) & (cap - 1);
			ns[j] = g->slot[i];
		}
		free(g->slot);
		g->slot = ns;
		g->cap = cap;
	}
	size_t i = dm_hash64(id) & (g->cap - 1);

	while (g->slot[i].key && g->slot[i].id != id)
		i = (i + 1) & (g->cap - 1);
	if (g->slot[i].key) {
		free(g->slot[i].key);
	} else {
		g->used++;
	}
	g->slot[i] = (struct gkslot){ .id = id, .key = key };
	return 0;
}

/* Read the log from g->n up to st->gkeys entries (g->mu held). */
static int gk_fetch(struct cn_s3 *s, struct gkcache *g, const struct ixstate *st)
{
	while (g->n < st->gkeys) {
		struct dm_buf w = { 0 };
		uint8_t *resp = NULL;
		size_t rlen;
		uint64_t total;
		uint32_t n;
		int rc;

		dm_buf_str(&w, g->b);
		dm_buf_str(&w, g->x);
		dm_buf_u64(&w, (uint64_t)g->created);
		dm_buf_u64(&w, g->tag);
		dm_buf_u64(&w, g->n);
		dm_buf_u32(&w, DM_FL_GKEYS_MAX);
		rc = mn_call(s, g->mn, DM_OP_FL_GKEYS, &w, &resp, &rlen);   /* frees w */
		if (rc)
			return rc;
		struct dm_rbuf rb = { .p = resp, .n = rlen };

		total = dm_rbuf_u64(&rb);
		n = dm_rbuf_u32(&rb);
		if (rb.bad || n > DM_FL_GKEYS_MAX || total < g->n + n) {
			free(resp);
			return -EBADMSG;
		}
		for (uint32_t i = 0; i < n && !rc; i++) {
			uint64_t id = dm_rbuf_u64(&rb);
			uint32_t kl;
			const char *k = dm_rbuf_bytes(&rb, &kl, FLAT_KEY_MAX);
			char *key;

			if (rb.bad || !kl || memchr(k, 0, kl)) {
				rc = -EBADMSG;
				break;
			}
			key = strndup(k, kl);
			rc = key ? gk_add(g, id, key) : -ENOMEM;
			if (!rc)
				g->n++;
		}
		if (!rc && rb.at != rb.n)
			rc = -EBADMSG;
		free(resp);
		if (rc)
			return rc;
		if (!n)
			break;          /* the log is shorter than the state said: a restarted MN */
	}
	return 0;
}

int gk_keys(struct cn_s3 *s, uint32_t graph, const char *b, const char *x,
	    const struct ixstate *st, const uint64_t *ids, size_t n, char **keys)
{
	struct gkcache *g = &s->gk[graph % DM_MAX_GRAPHS];
	bool need = false;
	int rc = 0;

	for (size_t i = 0; i < n && !need; i++)
		need = !keys[i];
	if (!need || !st->gkeys)
		return 0;
	pthread_mutex_lock(&g->mu);
	if (strcmp(g->b, b) || strcmp(g->x, x) || g->created != st->created ||
	    g->tag != st->mark_tag || g->mn != st->mn || g->epoch != st->epoch ||
	    g->n > st->gkeys) {
		gk_reset(g);
		snprintf(g->b, sizeof(g->b), "%s", b);
		snprintf(g->x, sizeof(g->x), "%s", x);
		g->created = st->created;
		g->tag = st->mark_tag;
		g->mn = st->mn;
		g->epoch = st->epoch;
	}
	rc = gk_fetch(s, g, st);
	for (size_t i = 0; !rc && i < n; i++) {
		struct gkslot *sl;

		if (keys[i] || !(sl = gk_find(g, ids[i])))
			continue;
		keys[i] = strdup(sl->key);
		if (!keys[i])
			rc = -ENOMEM;
	}
	pthread_mutex_unlock(&g->mu);
	return rc;
}
