/* vecfile.h: vector and id files. TEXMEX fvecs/ivecs/bvecs (each row: i32 dim, then dim
 * values) and big-ann-benchmarks fbin/u8bin/i8bin/ibin (header: u32 n, u32 dim; then n*dim
 * values), all little-endian. Readers mmap the file and validate it completely: a truncated
 * file, inconsistent per-row dimensions, zero or absurd sizes are refused with a message
 * that names the file and the problem. */
#ifndef DM_VECFILE_H
#define DM_VECFILE_H

#include "dm.h"

enum dm_vec_format {
	DM_VF_AUTO = 0,  /* from the file name's extension */
	DM_VF_FVECS, DM_VF_IVECS, DM_VF_BVECS,
	DM_VF_FBIN, DM_VF_U8BIN, DM_VF_I8BIN, DM_VF_IBIN,
};

enum dm_vec_type { DM_VT_F32, DM_VT_I32, DM_VT_U8, DM_VT_I8 };

/* Limits for "absurd" sizes. */
#define DM_VEC_MAX_DIM  65536u
#define DM_VEC_MAX_ROWS (1ull << 34)

/* A whole vector file in memory, converted to a dense row-major matrix. f32 files are
 * used in place when the layout allows (fbin); others are converted. */
struct dm_vecs {
	uint64_t n;
	uint32_t dim;
	enum dm_vec_type type;   /* type of data below: F32 for float files, I32 for id files;
				    u8/i8 files are converted to F32 */
	void *data;              /* n * dim elements of type */
	/* private */
	void *map;
	size_t map_len;
	void *owned;
};

/* Read a file. On error returns -errno and, when err is not NULL, writes a one-line
 * message naming the file and the problem into err (errlen bytes). Formats: vectors as
 * F32 (u8/i8/bvecs converted), ids (ivecs/ibin) as I32. */
int dm_vecs_read(const char *path, enum dm_vec_format fmt, struct dm_vecs *out,
		 char *err, size_t errlen);
void dm_vecs_free(struct dm_vecs *v);
/* Same validation and conversion for a file image already in memory (network uploads,
 * fuzzing). name is used for the format (DM_VF_AUTO) and in messages; the result never
 * points into buf (data is always a copy). */
int dm_vecs_parse(const void *buf, size_t len, enum dm_vec_format fmt, const char *name,
		  struct dm_vecs *out, char *err, size_t errlen);

/* Write n rows of dim elements of type (F32 for float formats, I32 for id formats, U8/I8
 * for u8bin/i8bin/bvecs). Written to path.tmp then renamed, so readers never see half a
 * file. Returns 0 or -errno. */
int dm_vecs_write(const char *path, enum dm_vec_format fmt, const void *data,
		  enum dm_vec_type type, uint64_t n, uint32_t dim);

enum dm_vec_format dm_vec_format_from_name(const char *path);
const char *dm_vec_format_name(enum dm_vec_format fmt);

#endif
