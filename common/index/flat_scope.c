/* flat_scope.c: the tails of a scoped index (flat.h, "Scoped indexes"): per scope label
 * its open fragment, and the plan of where the logged writes not yet applied will put
 * their rows, so that the reservation of a write knows how many new fragments it needs
 * (placing a row must not fail). The plan is advanced by each reservation (under the
 * index's wmu, in log order, which is the order writes are applied in) and recomputed from
 * the applied state and the queue of pending writes when a reservation was given back.
 * A scoped index's fragments start with room for 16 rows and grow (flat_frag_grow) to what
 * the plan puts in them, before the write is logged. */
#include "flat_int.h"

#include <stdlib.h>
#include <string.h>

#define NO_FRAG UINT64_MAX

uint64_t flat_scope_row(const struct flat_index *ix, const void *fmeta, uint32_t flen)
{
	if (!ix->scope_key)
		return 0;
	return ix->sops->label(ix->scope_key, flen ? fmeta : "", flen);
}

static size_t slot_of(const struct flat_stails *t, uint64_t label)
{
	size_t j = (size_t)(label * 0x9e3779b97f4a7c15ull >> 7) & (t->cap - 1);

	while (t->slot[j].used && t->slot[j].label != label)
		j = (j + 1) & (t->cap - 1);
	return j;
}

static struct flat_stail *find(struct flat_stails *t, uint64_t label)
{
	size_t j;

	if (!t->cap)
		return NULL;
	j = slot_of(t, label);
	return t->slot[j].used ? &t->slot[j] : NULL;
}

/* Room for n more labels (a load of at most 3/4): 0 or -ENOMEM, nothing changed then. */
static int room(struct flat_stails *t, size_t n)
{
	size_t cap = t->cap ? t->cap : 16;
	struct flat_stail *ns;

	while ((t->n + n) * 4 > cap * 3)
		cap *= 2;
	if (cap == t->cap)
		return 0;
	ns = calloc(cap, sizeof(*ns));
	if (!ns)
		return -ENOMEM;
	for (size_t i = 0; i < t->cap; i++) {
		if (!t->slot[i].used)
			continue;
		size_t j = (size_t)(t->slot[i].label * 0x9e3779b97f4a7c15ull >> 7) & (cap - 1);

		while (ns[j].used)
			j = (j + 1) & (cap - 1);
		ns[j] = t->slot[i];
	}
	free(t->slot);
	t->slot = ns;
	t->cap = cap;
	return 0;
}

/* The plan's entry of label, added (room made by the caller). */
static struct flat_stail *get(struct flat_stails *t, uint64_t label)
{
	size_t j = slot_of(t, label);

	if (!t->slot[j].used) {
		t->slot[j] = (struct flat_stail){ .label = label, .tail = NO_FRAG,
						  .rtail = NO_FRAG, .full = NO_FRAG, .used = true };
		t->n++;
	}
	return &t->slot[j];
}

/* One more row of entry e in the plan. */
static void advance(const struct flat_index *ix, struct flat_stails *t, struct flat_stail *e)
{
	if (e->rtail == NO_FRAG || e->rfill >= ix->frag_rows) {
		/* the fragment it leaves is full: one in the table needs all its room, a
		 * planned one is a spare that needs it */
		if (e->rtail != NO_FRAG && e->rtail < ix->nfrags)
			e->full = e->rtail;
		else if (e->rtail != NO_FRAG)
			t->fut_need = ix->frag_rows;
		e->rtail = t->rfrags++;
		e->rfill = 0;
	}
	e->rfill++;
}

/* The plan recomputed: the applied tails, then the rows of every pending write. */
static void replan(struct flat_index *ix)
{
	struct flat_stails *t = &ix->st;

	t->rfrags = ix->nfrags;
	t->fut_need = 0;
	for (size_t i = 0; i < t->cap; i++) {
		struct flat_stail *e = &t->slot[i];

		if (!e->used)
			continue;
		e->full = NO_FRAG;
		e->rtail = e->tail;
		e->rfill = e->tail == NO_FRAG ? 0 : ix->frags[e->tail]->n;
	}
	for (const struct flat_pending *pw = ix->qhead; pw; pw = pw->next)
		for (size_t i = 0; i < pw->nrows; i++)
			advance(ix, t, get(t, pw->rows[i].scope));   /* planned before: present */
	/* the pending writes' fragments got their room when they were planned (the same
	 * plan, as only the last planned write or writes that will never apply are given
	 * back); the need of the planned ones is recomputed */
	for (size_t i = 0; i < t->cap; i++) {
		struct flat_stail *e = &t->slot[i];

		e->full = NO_FRAG;
		if (e->used && e->rtail != NO_FRAG && e->rtail >= ix->nfrags)
			t->fut_need = DM_MAX(t->fut_need, e->rfill);
	}
	t->replan = false;
}

int flat_scope_plan(struct flat_index *ix, const struct flat_prow *p, uint64_t n,
		    uint64_t *frags)
{
	struct flat_stails *t = &ix->st;
	int rc = room(t, n);

	if (rc)
		return rc;
	if (!ix->qhead)
		t->fut_need = 0;        /* every planned fragment is in the table */
	if (t->replan)
		replan(ix);
	for (uint64_t i = 0; i < n; i++)
		advance(ix, t, get(t, p[i].scope));
	*frags = t->rfrags;
	return 0;
}

/* Room for the plan's rows in entry e's fragments (the one in the table it fills up, the
 * one in the table it ends in, or the need of a planned one). */
static int entry_room(struct flat_index *ix, struct flat_stails *t, struct flat_stail *e)
{
	if (e->full != NO_FRAG) {
		if (flat_frag_grow(ix, ix->frags[e->full], ix->frag_rows, true))
			return -ENOMEM;
		e->full = NO_FRAG;
	}
	if (e->rtail == NO_FRAG)
		return 0;
	if (e->rtail < ix->nfrags)
		return flat_frag_grow(ix, ix->frags[e->rtail], e->rfill, true);
	t->fut_need = DM_MAX(t->fut_need, e->rfill);
	return 0;
}

int flat_scope_room(struct flat_index *ix, const struct flat_prow *p, uint64_t n)
{
	struct flat_stails *t = &ix->st;

	/* the entries this plan moved (the others' room was made when they were planned) */
	for (uint64_t i = 0; i < n; i++)
		if (entry_room(ix, t, find(t, p[i].scope)))
			return -ENOMEM;
	/* spares are taken in any order: each gets room for the largest planned fill */
	for (struct flat_frag *f = ix->spare; f; f = f->next_spare)
		if (flat_frag_grow(ix, f, t->fut_need, false))
			return -ENOMEM;
	return 0;
}

void flat_scope_unplan(struct flat_index *ix)
{
	ix->st.replan = true;
}

uint64_t flat_scope_take(struct flat_index *ix, uint64_t label, bool *fresh)
{
	struct flat_stail *e = find(&ix->st, label);   /* planned: never NULL */

	*fresh = e->tail == NO_FRAG || ix->frags[e->tail]->n >= ix->frag_rows;
	if (*fresh)
		e->tail = ix->nfrags;
	return e->tail;
}

void flat_scope_free(struct flat_stails *t)
{
	free(t->slot);
	memset(t, 0, sizeof(*t));
}
