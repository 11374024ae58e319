/* config_int.h: what the files of the cluster-file parser share (private to common/):
 *   config.c     sections, keys, secrets, validation of the whole file
 *   config_s3.c  the S3 identities ([s3.identity.NAME]) and the [s3] file paths
 */
#ifndef DM_CONFIG_INT_H
#define DM_CONFIG_INT_H

#include "config.h"

struct parse_ctx {
	struct dm_cluster_cfg *cfg;
	const char *base_dir;
	char msg[256];               /* first error, without location */
	char secret_file[512];
	char s3_secret_file[512];
	char cnmsg[256];
	struct dm_s3_identity ids[DM_S3_MAX_IDS];   /* [s3.identity.NAME], file order */
	uint32_t nids;
	const char *only_client;     /* dm_config_load_client: read only this client's secret */
};

/* Record the first error (fmt with two %s) for the current line; returns 0 (inih: stop). */
int dm_cfg_fail(struct parse_ctx *pc, const char *fmt, const char *a, const char *b);
/* Read a secret file (relative to base_dir): its contents minus a trailing newline, 16..cap
 * bytes. 0 or -errno with the reason in msg. */
int dm_cfg_read_secret(const char *base_dir, const char *file, uint8_t *out, size_t cap,
		       size_t *len, char *msg, size_t msglen);
/* A path relative to base_dir (or absolute) into out; false if empty or too long. */
bool dm_cfg_resolve_path(const char *base_dir, const char *v, char *out, size_t cap);
/* One key of [s3.identity.NAME] (inih handler convention: 1 taken, 0 error). */
int dm_cfg_identity_key(struct parse_ctx *pc, const char *name, const char *key,
			const char *v);
/* The identities into cfg ([s3]'s first) once the file is read; 0 or -EINVAL (err). */
int dm_cfg_identities_finish(struct parse_ctx *pc, const char *name, char *err,
			     size_t errlen);

#endif
