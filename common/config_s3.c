/* config_s3.c: the S3 identities of the cluster file ([s3.identity.NAME] sections: access
 * key, secret file read at its line, principal ARN; the [s3] key as identity "default") and
 * the path resolution of [s3] files. Rules in config.h. */
#include "config_int.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* ---- [s3.identity.NAME]: S3 identities ---- */

bool dm_cfg_resolve_path(const char *base_dir, const char *v, char *out, size_t cap)
{
	int n;

	if (!*v)
		return false;
	if (v[0] == '/' || !base_dir)
		n = snprintf(out, cap, "%s", v);
	else
		n = snprintf(out, cap, "%s/%s", base_dir, v);
	return n > 0 && (size_t)n < cap;
}

static bool all_of(const char *s, const char *extra)
{
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && !strchr(extra, *s))
			return false;
	return true;
}

int dm_cfg_identity_key(struct parse_ctx *pc, const char *name, const char *key,
			const char *v)
{
	struct dm_s3_identity *id = NULL;
	char msg[240];
	size_t n;

	if (!*name || strlen(name) > 63 || !all_of(name, "+=,.@_-"))
		return dm_cfg_fail(pc, "identity name '%s' must be 1..63 of A-Za-z0-9+=,.@_-%s", name, "");
	for (uint32_t i = 0; i < pc->nids && !id; i++)
		if (!strcmp(pc->ids[i].name, name))
			id = &pc->ids[i];
	if (!id) {
		if (pc->nids == DM_S3_MAX_IDS - 1)
			return dm_cfg_fail(pc, "too many S3 identities (at most %s)%s", "32", "");
		id = &pc->ids[pc->nids++];
		memset(id, 0, sizeof(*id));
		snprintf(id->name, sizeof(id->name), "%s", name);
	}
	if (!strcmp(key, "access_key")) {
		if (id->access_key[0])
			return dm_cfg_fail(pc, "access_key given twice for identity '%s'%s", name, "");
		if (strlen(v) > 127 || !*v || !all_of(v, ""))
			return dm_cfg_fail(pc, "access_key '%s' must be 1..127 of A-Za-z0-9%s", v, "");
		for (uint32_t i = 0; i < pc->nids; i++)
			if (!strcmp(pc->ids[i].access_key, v))
				return dm_cfg_fail(pc, "access_key '%s' is already identity '%s''s", v,
					    pc->ids[i].name);
		if (!strcmp(pc->cfg->s3_access_key, v))
			return dm_cfg_fail(pc, "access_key '%s' is already the [s3] access_key%s", v, "");
		snprintf(id->access_key, sizeof(id->access_key), "%s", v);
	} else if (!strcmp(key, "secret_key_file")) {
		if (id->secret[0])
			return dm_cfg_fail(pc, "secret_key_file given twice for identity '%s'%s", name, "");
		if (dm_cfg_read_secret(pc->base_dir, v, (uint8_t *)id->secret, sizeof(id->secret) - 1, &n,
				msg, sizeof(msg)))
			return dm_cfg_fail(pc, "%s%s", msg, "");
		id->secret[n] = 0;
		if (strlen(id->secret) != n)
			return dm_cfg_fail(pc, "secret file '%s' holds a NUL byte%s", v, "");
	} else if (!strcmp(key, "principal")) {
		if (strncmp(v, "arn:aws:iam::", 13) || strlen(v) >= sizeof(id->principal) ||
		    strpbrk(v, " \t\"*?"))
			return dm_cfg_fail(pc, "principal '%s' must be an arn:aws:iam:: ARN (no spaces, quotes "
				    "or wildcards)%s", v, "");
		snprintf(id->principal, sizeof(id->principal), "%s", v);
	} else {
		return dm_cfg_fail(pc, "unknown key '%s' in section [s3.identity.%s]", key, name);
	}
	return 1;
}

/* The identities in cfg: [s3]'s first, then the sections'. 0 or -EINVAL (err filled). */
int dm_cfg_identities_finish(struct parse_ctx *pc, const char *name, char *err, size_t errlen)
{
	struct dm_cluster_cfg *cfg = pc->cfg;

	cfg->n_s3_ids = 0;
	if (cfg->s3_access_key[0] && cfg->s3_secret_key[0]) {
		struct dm_s3_identity *d = &cfg->s3_ids[cfg->n_s3_ids++];

		snprintf(d->name, sizeof(d->name), "default");
		snprintf(d->access_key, sizeof(d->access_key), "%s", cfg->s3_access_key);
		snprintf(d->secret, sizeof(d->secret), "%s", cfg->s3_secret_key);
	}
	for (uint32_t i = 0; i < pc->nids; i++) {
		struct dm_s3_identity *id = &pc->ids[i];

		if (!id->access_key[0] || !id->secret[0]) {
			snprintf(err, errlen, "%s: [s3.identity.%s] needs access_key and "
				 "secret_key_file", name, id->name);
			return -EINVAL;
		}
		if (cfg->s3_access_key[0] && !strcmp(id->name, "default")) {
			snprintf(err, errlen, "%s: [s3.identity.default] clashes with the [s3] "
				 "access_key (which is identity 'default')", name);
			return -EINVAL;
		}
		cfg->s3_ids[cfg->n_s3_ids++] = *id;
	}
	for (uint32_t i = 0; i < cfg->n_s3_ids; i++) {
		struct dm_s3_identity *d = &cfg->s3_ids[i];
		char nm[sizeof(d->name)];

		if (d->principal[0])
			continue;
		/* through a copy: gcc's -Wrestrict cannot tell the two fields apart */
		memcpy(nm, d->name, sizeof(nm));
		nm[sizeof(nm) - 1] = 0;
		snprintf(d->principal, sizeof(d->principal), "arn:aws:iam::000000000000:user/%s", nm);
	}
	if (!cfg->s3_https_cert[0] != !cfg->s3_https_key[0]) {
		snprintf(err, errlen, "%s: [s3] https_cert and https_key go together", name);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < cfg->n_cn; i++)
		if (cfg->cn[i].https[0] && !cfg->s3_https_cert[0]) {
			snprintf(err, errlen, "%s: [cn.%u] https needs [s3] https_cert and https_key",
				 name, i);
			return -EINVAL;
		}
	return 0;
}

