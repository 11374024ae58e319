/* mn_flat_int.h: what mn_flat.c (the store and its FL requests) and mn_catchup.c (bucket
 * images and the catch-up of a stale replica: FL_IMAGE, FL_CATCHUP) share; not for users of
 * mn_flat.h.
 *
 * Lock order: wlock -> cu.mu -> the flat store's locks (cu.mu is never held across a store
 * call that takes a write path's locks; an image is taken before cu.mu is).
 */
#ifndef DM_MN_FLAT_INT_H
#define DM_MN_FLAT_INT_H

#include <pthread.h>

#include "flat.h"
#include "mn_flat.h"
#include "s3_api.h"
#include "util/dm_buf.h"
#include "wire.h"

#define MN_IMAGES_MAX 4u                /* images kept at once (FL_IMAGE TAKE: -EBUSY past it) */
#define MN_CATCHUPS_MAX 16u             /* catch-ups under way at once */

/* An image taken for a catch-up elsewhere (the source side). id 0: a free slot. */
struct mn_image {
	uint64_t id;
	char bucket[FLAT_NAME_MAX + 1];
	uint8_t *p;
	size_t len;
	uint64_t used_ns;               /* taken or last READ */
};

/* A catch-up of one bucket on this (stale) replica: the image received so far and the log
 * of the write requests that named the bucket since BEGIN, each u16 op | u32 len | bytes. */
struct mn_catchup {
	uint64_t id;
	char bucket[FLAT_NAME_MAX + 1];
	struct dm_buf img;
	struct dm_buf log;
	uint64_t nlog;
	uint64_t used_ns;               /* BEGIN or last DATA */
};

struct mn_cu {
	pthread_mutex_t mu;             /* the tables below */
	struct mn_image img[MN_IMAGES_MAX];
	struct mn_catchup *cu[MN_CATCHUPS_MAX];
	uint32_t ncu;                   /* catch-ups under way (atomic: writes read it unlocked) */
	uint64_t next_id;
	/* counters (atomics) */
	uint64_t n_images, n_installed, n_rerun;
};

struct mn_flat {
	struct flat_store *st;
	struct s3_api *api;
	uint64_t epoch;                 /* atomic: a catch-up's END changes it */
	uint32_t node_id;
	/* Every write request holds it shared while it runs (and is logged for a catch-up of
	 * its bucket); a catch-up's END holds it exclusive: the store takes no write then.
	 * Writer-preferring, so that a stream of writes cannot keep an END out. */
	pthread_rwlock_t wlock;
	struct mn_cu cu;
};

/* ---- mn_flat.c ---- */
/* Run one FL request of the store (not FL_IMAGE / FL_CATCHUP) without the write lock and
 * without logging it: mn_flat_handle's body, and a catch-up's re-run of logged writes. */
int mn_flat_run(struct mn_flat *f, uint16_t op, const uint8_t *req, size_t len,
		struct dm_buf *out, uint32_t *resp_msg);
/* Whether the request changes the store: an FL_CALL of a write operation, FL_MARK,
 * FL_GINDEX. */
bool mn_flat_is_write(uint16_t op, const uint8_t *req, size_t len);

/* ---- mn_catchup.c ---- */
/* Seconds an image or catch-up may stay idle (DM_FL_IMAGE_IDLE_S; tests shorten it). */
extern unsigned mn_flat_idle_s;
void mn_cu_init(struct mn_cu *c);
void mn_cu_fini(struct mn_cu *c);
/* FL_IMAGE and FL_CATCHUP (wire.h): 0 or -errno, the answer appended to out. */
int mn_image_handle(struct mn_flat *f, const uint8_t *req, size_t len, struct dm_buf *out);
int mn_catchup_handle(struct mn_flat *f, const uint8_t *req, size_t len, struct dm_buf *out);
/* A write request (mn_flat_is_write) has run, wlock held shared: log it for the catch-up
 * of the bucket it names, if one is under way. */
void mn_catchup_note(struct mn_flat *f, uint16_t op, const uint8_t *req, size_t len);
/* Prometheus counters: images taken, catch-ups installed, writes re-run. */
void mn_catchup_metrics(struct mn_flat *f, FILE *out);

#endif
