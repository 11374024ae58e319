/* vecfile.c: readers and writers for TEXMEX (fvecs/ivecs/bvecs) and big-ann-benchmarks
 * (fbin/u8bin/i8bin/ibin) vector files. Readers mmap the file, validate it completely
 * before allocating anything (so a hostile header cannot make us allocate terabytes), then
 * use fbin/ibin data in place and convert the other formats into a dense matrix.
 * Writers write path.tmp, fsync it and rename it over path. */
#include "vecfile.h"

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Per-format facts: file element type and size, layout, type delivered to the caller. */
struct fmt_info {
	const char *ext;
	enum dm_vec_type ftype;  /* element type in the file */
	size_t esize;            /* bytes per element in the file */
	bool texmex;             /* per-row i32 dim header (else u32 n, u32 dim file header) */
	enum dm_vec_type otype;  /* type handed out by the reader */
};

static const struct fmt_info fmts[] = {
	[DM_VF_FVECS] = { "fvecs", DM_VT_F32, 4, true, DM_VT_F32 },
	[DM_VF_IVECS] = { "ivecs", DM_VT_I32, 4, true, DM_VT_I32 },
	[DM_VF_BVECS] = { "bvecs", DM_VT_U8, 1, true, DM_VT_F32 },
	[DM_VF_FBIN] = { "fbin", DM_VT_F32, 4, false, DM_VT_F32 },
	[DM_VF_U8BIN] = { "u8bin", DM_VT_U8, 1, false, DM_VT_F32 },
	[DM_VF_I8BIN] = { "i8bin", DM_VT_I8, 1, false, DM_VT_F32 },
	[DM_VF_IBIN] = { "ibin", DM_VT_I32, 4, false, DM_VT_I32 },
};

static bool fmt_valid(enum dm_vec_format f)
{
	return f > DM_VF_AUTO && f <= DM_VF_IBIN;
}

enum dm_vec_format dm_vec_format_from_name(const char *path)
{
	const char *dot = path ? strrchr(path, '.') : NULL;

	if (!dot || strchr(dot, '/'))
		return DM_VF_AUTO;
	for (int f = DM_VF_FVECS; f <= DM_VF_IBIN; f++)
		if (strcasecmp(dot + 1, fmts[f].ext) == 0)
			return (enum dm_vec_format)f;
	/* big-ann-benchmarks also name float files ".fbin" and ids ".ibin"; queries are
	 * sometimes ".bin" (float), which is ambiguous, so it is not accepted. */
	return DM_VF_AUTO;
}

const char *dm_vec_format_name(enum dm_vec_format fmt)
{
	return fmt_valid(fmt) ? fmts[fmt].ext : "auto";
}

/* Writes "name: message" into err (if any) and returns -e. */
static int __attribute__((format(printf, 5, 6)))
fail(char *err, size_t errlen, const char *name, int e, const char *fmt, ...)
{
	if (err && errlen) {
		int off = snprintf(err, errlen, "%s: ", name);
		if (off >= 0 && (size_t)off < errlen) {
			va_list ap;
			va_start(ap, fmt);
			vsnprintf(err + off, errlen - (size_t)off, fmt, ap);
			va_end(ap);
		}
	}
	return -e;
}

static uint32_t get_u32(const unsigned char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);  /* files are little-endian, as is x86-64 */
	return v;
}

/* Result of validating a buffer: shape and where the first row's data starts. */
struct layout {
	uint64_t n;
	uint32_t dim;
	size_t off;     /* offset of the first value */
	size_t stride;  /* bytes from one row's values to the next */
};

/* Validates a TEXMEX buffer: every row has the same positive dim, no partial row. */
static int check_texmex(const unsigned char *buf, size_t len, const struct fmt_info *fi,
			const char *name, struct layout *lo, char *err, size_t errlen)
{
	if (len < 4)
		return fail(err, errlen, name, EINVAL,
			    "truncated: %zu bytes, too short for the first row's 4-byte dimension", len);
	int32_t d0 = (int32_t)get_u32(buf);
	if (d0 == 0)
		return fail(err, errlen, name, EINVAL, "zero dimension in row 0");
	if (d0 < 0)
		return fail(err, errlen, name, EINVAL, "negative dimension %d in row 0", d0);
	if ((uint32_t)d0 > DM_VEC_MAX_DIM)
		return fail(err, errlen, name, EINVAL,
			    "absurd dimension %d in row 0 (limit %u)", d0, DM_VEC_MAX_DIM);

	size_t stride = 4 + (size_t)d0 * fi->esize;
	uint64_t n = len / stride;
	if (n > DM_VEC_MAX_ROWS)
		return fail(err, errlen, name, EINVAL, "absurd row count %llu (limit %llu)",
			    (unsigned long long)n, (unsigned long long)DM_VEC_MAX_ROWS);
	/* every row header must repeat the dimension (catches files mixing dims, and files
	 * that are not TEXMEX at all) */
	for (uint64_t i = 1; i < n; i++) {
		int32_t d = (int32_t)get_u32(buf + i * stride);
		if (d != d0)
			return fail(err, errlen, name, EINVAL,
				    "inconsistent dimensions: row %llu has dimension %d, row 0 has %d",
				    (unsigned long long)i, d, d0);
	}
	size_t rest = len - n * stride;
	if (rest) {
		if (rest >= 4 && (int32_t)get_u32(buf + n * stride) != d0)
			return fail(err, errlen, name, EINVAL,
				    "inconsistent dimensions: row %llu has dimension %d, row 0 has %d",
				    (unsigned long long)n, (int32_t)get_u32(buf + n * stride), d0);
		return fail(err, errlen, name, EINVAL,
			    "truncated: file size %zu is not a whole number of rows of %zu bytes "
			    "(dimension %d); row %llu has only %zu bytes",
			    len, stride, d0, (unsigned long long)n, rest);
	}
	lo->n = n;
	lo->dim = (uint32_t)d0;
	lo->off = 4;
	lo->stride = stride;
	return 0;
}

/* Validates a big-ann-benchmarks buffer: header, sizes, exact file length. */
static int check_bin(const unsigned char *buf, size_t len, const struct fmt_info *fi,
		     const char *name, struct layout *lo, char *err, size_t errlen)
{
	if (len < 8)
		return fail(err, errlen, name, EINVAL,
			    "truncated: %zu bytes, too short for the 8-byte header (u32 n, u32 dim)", len);
	uint32_t n = get_u32(buf), dim = get_u32(buf + 4);
	if (dim == 0)
		return fail(err, errlen, name, EINVAL, "zero dimension in header");
	if (n == 0)
		return fail(err, errlen, name, EINVAL, "zero rows in header");
	if (dim > DM_VEC_MAX_DIM)
		return fail(err, errlen, name, EINVAL, "absurd dimension %u in header (limit %u)",
			    dim, DM_VEC_MAX_DIM);
	/* n < 2^32, dim <= 2^16, esize <= 4: the product fits easily in 64 bits */
	uint64_t want = 8 + (uint64_t)n * dim * fi->esize;
	if (len < want)
		return fail(err, errlen, name, EINVAL,
			    "truncated: header says %u x %u (%llu bytes) but the file has %zu bytes",
			    n, dim, (unsigned long long)want, len);
	if (len > want)
		return fail(err, errlen, name, EINVAL,
			    "size mismatch: header says %u x %u (%llu bytes) but the file has %zu "
			    "bytes (%llu trailing)",
			    n, dim, (unsigned long long)want, len, (unsigned long long)(len - want));
	lo->n = n;
	lo->dim = dim;
	lo->off = 8;
	lo->stride = (size_t)dim * fi->esize;
	return 0;
}

/* Checks that all floats are finite (NaN or inf would poison every distance). */
static int check_finite(const unsigned char *buf, const struct layout *lo, const char *name,
			char *err, size_t errlen)
{
	for (uint64_t i = 0; i < lo->n; i++) {
		const unsigned char *row = buf + lo->off + i * lo->stride;
		for (uint32_t j = 0; j < lo->dim; j++) {
			float f;
			memcpy(&f, row + 4 * (size_t)j, 4);
			if (!isfinite(f))
				return fail(err, errlen, name, EINVAL,
					    "non-finite value (%g) at row %llu, column %u", (double)f,
					    (unsigned long long)i, j);
		}
	}
	return 0;
}

/* Converts validated rows into a dense matrix of fi->otype. */
static void convert(const unsigned char *buf, const struct layout *lo,
		    const struct fmt_info *fi, void *dst)
{
	size_t row_out = (size_t)lo->dim * 4;  /* output is always 4-byte elements */

	for (uint64_t i = 0; i < lo->n; i++) {
		const unsigned char *src = buf + lo->off + i * lo->stride;
		float *f = (float *)((char *)dst + i * row_out);
		switch (fi->ftype) {
		case DM_VT_F32:
		case DM_VT_I32:
			memcpy(f, src, row_out);
			break;
		case DM_VT_U8:
			for (uint32_t j = 0; j < lo->dim; j++)
				f[j] = (float)src[j];
			break;
		case DM_VT_I8:
			for (uint32_t j = 0; j < lo->dim; j++)
				f[j] = (float)(int8_t)src[j];
			break;
		}
	}
}

/* Validates buf and fills out; in place (pointing into buf) when allowed and the layout
 * is already dense, else into a fresh allocation. */
static int parse(const unsigned char *buf, size_t len, enum dm_vec_format fmt,
		 const char *name, bool in_place, struct dm_vecs *out, char *err, size_t errlen)
{
	const struct fmt_info *fi = &fmts[fmt];
	struct layout lo = { 0 };
	int r;

	if (len == 0)
		return fail(err, errlen, name, EINVAL, "empty file");
	r = fi->texmex ? check_texmex(buf, len, fi, name, &lo, err, errlen)
		       : check_bin(buf, len, fi, name, &lo, err, errlen);
	if (r < 0)
		return r;
	if (fi->ftype == DM_VT_F32) {
		r = check_finite(buf, &lo, name, err, errlen);
		if (r < 0)
			return r;
	}
	out->n = lo.n;
	out->dim = lo.dim;
	out->type = fi->otype;
	if (in_place && !fi->texmex && fi->esize == 4) {
		out->data = (void *)(buf + lo.off);
		return 0;
	}
	uint64_t bytes = lo.n * lo.dim * 4;
	if (bytes > SIZE_MAX)
		return fail(err, errlen, name, ENOMEM, "%llu bytes do not fit in memory",
			    (unsigned long long)bytes);
	out->owned = malloc(bytes);
	if (!out->owned)
		return fail(err, errlen, name, ENOMEM, "out of memory for %llu x %u values",
			    (unsigned long long)lo.n, lo.dim);
	convert(buf, &lo, fi, out->owned);
	out->data = out->owned;
	return 0;
}

/* Resolves DM_VF_AUTO from the name; error if neither gives a known format. */
static int resolve_fmt(enum dm_vec_format *fmt, const char *name, char *err, size_t errlen)
{
	if (*fmt == DM_VF_AUTO) {
		*fmt = dm_vec_format_from_name(name);
		if (*fmt == DM_VF_AUTO) {
			const char *dot = strrchr(name, '.');
			return fail(err, errlen, name, EINVAL,
				    "unknown extension '%s' (expected fvecs, ivecs, bvecs, fbin, "
				    "u8bin, i8bin or ibin)",
				    dot && !strchr(dot, '/') ? dot + 1 : "");
		}
	} else if (!fmt_valid(*fmt)) {
		return fail(err, errlen, name, EINVAL, "invalid format code %d", (int)*fmt);
	}
	return 0;
}

int dm_vecs_parse(const void *buf, size_t len, enum dm_vec_format fmt, const char *name,
		  struct dm_vecs *out, char *err, size_t errlen)
{
	int r;

	memset(out, 0, sizeof(*out));
	if (!name)
		name = "(buffer)";
	r = resolve_fmt(&fmt, name, err, errlen);
	if (r < 0)
		return r;
	r = parse(buf, len, fmt, name, false, out, err, errlen);
	if (r < 0)
		memset(out, 0, sizeof(*out));
	return r;
}

int dm_vecs_read(const char *path, enum dm_vec_format fmt, struct dm_vecs *out, char *err,
		 size_t errlen)
{
	struct stat st;
	void *map;
	int fd, r;

	memset(out, 0, sizeof(*out));
	r = resolve_fmt(&fmt, path, err, errlen);
	if (r < 0)
		return r;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(err, errlen, path, errno, "cannot open: %s", strerror(errno));
	if (fstat(fd, &st) < 0) {
		r = fail(err, errlen, path, errno, "cannot stat: %s", strerror(errno));
		goto err_close_fd;
	}
	if (!S_ISREG(st.st_mode)) {
		r = fail(err, errlen, path, EINVAL, "not a regular file");
		goto err_close_fd;
	}
	if (st.st_size == 0) {
		r = fail(err, errlen, path, EINVAL, "empty file");
		goto err_close_fd;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		r = fail(err, errlen, path, EFBIG, "file too large to map");
		goto err_close_fd;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		r = fail(err, errlen, path, errno, "cannot mmap %lld bytes: %s",
			 (long long)st.st_size, strerror(errno));
		goto err_close_fd;
	}
	close(fd);  /* the mapping keeps the file */
	madvise(map, (size_t)st.st_size, MADV_SEQUENTIAL);

	r = parse(map, (size_t)st.st_size, fmt, path, true, out, err, errlen);
	if (r < 0)
		goto err_unmap;
	if (out->owned) {
		/* converted: the file is no longer needed */
		munmap(map, (size_t)st.st_size);
	} else {
		madvise(map, (size_t)st.st_size, MADV_NORMAL);
		out->map = map;
		out->map_len = (size_t)st.st_size;
	}
	return 0;

err_unmap:
	munmap(map, (size_t)st.st_size);
	memset(out, 0, sizeof(*out));
	return r;

err_close_fd:
	close(fd);
	return r;
}

void dm_vecs_free(struct dm_vecs *v)
{
	if (!v)
		return;
	if (v->map)
		munmap(v->map, v->map_len);
	free(v->owned);
	memset(v, 0, sizeof(*v));
}

/* Writes all of len bytes to f; -EIO style errors are returned as -errno. */
static int put(FILE *f, const void *p, size_t len)
{
	if (len && fwrite(p, 1, len, f) != len)
		return errno ? -errno : -EIO;
	return 0;
}

/* Writes the rows of a validated request to f in the format's layout. */
static int write_rows(FILE *f, const struct fmt_info *fi, const void *data, uint64_t n,
		      uint32_t dim)
{
	size_t row = (size_t)dim * fi->esize;
	int r;

	if (!fi->texmex) {
		uint32_t hdr[2] = { (uint32_t)n, dim };
		r = put(f, hdr, sizeof(hdr));
		if (r < 0)
			return r;
		if (n * row / row != n)
			return -EOVERFLOW;
		return put(f, data, n * row);
	}
	int32_t d = (int32_t)dim;
	for (uint64_t i = 0; i < n; i++) {
		r = put(f, &d, 4);
		if (r == 0)
			r = put(f, (const char *)data + i * row, row);
		if (r < 0)
			return r;
	}
	return 0;
}

int dm_vecs_write(const char *path, enum dm_vec_format fmt, const void *data,
		  enum dm_vec_type type, uint64_t n, uint32_t dim)
{
	char *tmp;
	FILE *f;
	int fd, r;

	if (!path || (!data && n) || n == 0 || dim == 0 || dim > DM_VEC_MAX_DIM ||
	    n > DM_VEC_MAX_ROWS)
		return -EINVAL;
	if (fmt == DM_VF_AUTO)
		fmt = dm_vec_format_from_name(path);
	if (!fmt_valid(fmt))
		return -EINVAL;
	const struct fmt_info *fi = &fmts[fmt];
	if (type != fi->ftype)
		return -EINVAL;
	if (!fi->texmex && n > UINT32_MAX)
		return -EOVERFLOW;  /* the bin header holds n as u32 */

	if (asprintf(&tmp, "%s.tmp", path) < 0)
		return -ENOMEM;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		r = -errno;
		goto err_free_tmp;
	}
	f = fdopen(fd, "wb");
	if (!f) {
		r = -errno;
		close(fd);
		goto err_unlink;
	}
	setvbuf(f, NULL, _IOFBF, 1 << 20);
	errno = 0;
	r = write_rows(f, fi, data, n, dim);
	if (r == 0 && fflush(f) != 0)
		r = -errno;
	if (r == 0 && fsync(fileno(f)) != 0)
		r = -errno;
	if (fclose(f) != 0 && r == 0)
		r = -errno;
	if (r < 0)
		goto err_unlink;
	if (rename(tmp, path) != 0) {
		r = -errno;
		goto err_unlink;
	}
	free(tmp);
	return 0;

err_unlink:
	unlink(tmp);
err_free_tmp:
	free(tmp);
	return r;
}
