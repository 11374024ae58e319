/* cli_import.h: bulk import of an index image into a new S3 Vectors index (cli_import.c),
 * the S3 half of `dmann load --bucket B --name I`. */
#ifndef DM_CLI_IMPORT_H
#define DM_CLI_IMPORT_H

#include "dindex.h"

struct dm_import {
	const char *bucket, *index;
	const char *keys_file;        /* one key per line, or NULL: the node ids in decimal */
	const char *meta_file;        /* one JSON object (or an empty line) per vector, or NULL */
	const char *vec_file;         /* the vectors the image was built from (row = label), or
					 NULL: the image's own (rotated back, normalised for cos) */
	void (*progress)(void *, uint64_t);   /* rows put so far */
	void *parg;
	struct mn_set *s;             /* the memory nodes: the new index is tagged
					 DM_GRAPH_TAG_IMPORT until its mark (no graph is seeded
					 for it while its rows go in) */
	/* filled in by dm_import_rows */
	char **keys;                  /* n keys (the binding's) */
	uint32_t n;
};

/* Create index bucket/index with the image's dimension and metric and put every vector of
 * idx (key i for node i, its metadata line) through the compute nodes. 0 or -errno with a
 * message in err. */
int dm_import_rows(const struct dm_cluster_cfg *cfg,
		   const struct hnsw_index *idx, struct dm_import *im, char *err, size_t errlen);
/* Set the graph mark (rows 0..n-1 in generation gen) on every replica of the bucket.
 * -EBUSY: the index was written meanwhile. 0 or -errno with err. */
int dm_import_mark(const struct dm_cluster_cfg *cfg, struct mn_set *s,
		   const struct dm_import *im, uint64_t gen, char *err, size_t errlen);
void dm_import_fini(struct dm_import *im);

#endif
