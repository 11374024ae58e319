/* test_vecfile.c: round trips of every vector/id file format, the in-memory parser, and
 * every malformed case (truncated, header/size mismatch, inconsistent dims, zero dim,
 * zero rows, absurd dim, empty file, unknown extension, non-finite floats), each refused
 * with a message naming the file and the problem. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vecfile.h"

static char dir[64];

static void make_dir(void)
{
	strcpy(dir, "/tmp/dmann-vecfile-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(vecfile, .init = make_dir, .fini = remove_dir);

static char *path_of(const char *name)
{
	static char p[256];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return p;
}

static void write_raw(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(buf, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
}

/* Writes n x dim of the format's file type, reads it back, compares. */
static void round_trip(const char *name, enum dm_vec_type type, uint64_t n, uint32_t dim)
{
	size_t cnt = (size_t)n * dim, es = (type == DM_VT_U8 || type == DM_VT_I8) ? 1 : 4;
	unsigned char *src = malloc(cnt * es);
	for (size_t i = 0; i < cnt; i++) {
		switch (type) {
		case DM_VT_F32: ((float *)src)[i] = (float)i * 0.25f - 100.0f; break;
		case DM_VT_I32: ((int32_t *)src)[i] = (int32_t)(i * 2654435761u); break;
		case DM_VT_U8: src[i] = (unsigned char)(i * 37); break;
		case DM_VT_I8: ((int8_t *)src)[i] = (int8_t)(i * 37); break;
		}
	}
	char *p = path_of(name);
	cr_assert_eq(dm_vecs_write(p, DM_VF_AUTO, src, type, n, dim), 0, "write %s", name);
	char tmp[300];
	snprintf(tmp, sizeof(tmp), "%s.tmp", p);
	cr_assert_neq(access(tmp, F_OK), 0, "%s left behind", tmp);

	struct dm_vecs v;
	char err[256] = "";
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &v, err, sizeof(err)), 0, "%s: %s", name, err);
	cr_assert_eq(v.n, n);
	cr_assert_eq(v.dim, dim);
	cr_assert_eq(v.type, type == DM_VT_I32 ? DM_VT_I32 : DM_VT_F32);
	for (size_t i = 0; i < cnt; i++) {
		switch (type) {
		case DM_VT_F32:
			cr_assert_eq(((float *)v.data)[i], ((float *)src)[i]);
			break;
		case DM_VT_I32:
			cr_assert_eq(((int32_t *)v.data)[i], ((int32_t *)src)[i]);
			break;
		case DM_VT_U8:
			cr_assert_eq(((float *)v.data)[i], (float)src[i]);
			break;
		case DM_VT_I8:
			cr_assert_eq(((float *)v.data)[i], (float)((int8_t *)src)[i]);
			break;
		}
	}
	dm_vecs_free(&v);
	cr_assert_null(v.data);

	/* the same bytes through the in-memory parser */
	FILE *f = fopen(p, "rb");
	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	rewind(f);
	unsigned char *buf = malloc((size_t)len);
	cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	cr_assert_eq(dm_vecs_parse(buf, (size_t)len, DM_VF_AUTO, name, &v, err, sizeof(err)), 0,
		     "%s", err);
	cr_assert_eq(v.n, n);
	cr_assert_eq(v.dim, dim);
	cr_assert(v.data != (void *)(buf + 8), "parse copies");
	if (type == DM_VT_F32 || type == DM_VT_I32)
		cr_assert_eq(memcmp(v.data, src, cnt * 4), 0);
	dm_vecs_free(&v);
	free(buf);
	free(src);
}

Test(vecfile, round_trip_all_formats)
{
	round_trip("a.fvecs", DM_VT_F32, 17, 5);
	round_trip("a.ivecs", DM_VT_I32, 9, 100);
	round_trip("a.bvecs", DM_VT_U8, 33, 128);
	round_trip("a.fbin", DM_VT_F32, 100, 96);
	round_trip("a.u8bin", DM_VT_U8, 7, 3);
	round_trip("a.i8bin", DM_VT_I8, 50, 100);
	round_trip("a.ibin", DM_VT_I32, 1000, 10);
	round_trip("one.fvecs", DM_VT_F32, 1, 1);
	round_trip("one.fbin", DM_VT_F32, 1, 1);
}

Test(vecfile, fbin_is_mapped_in_place)
{
	float x[6] = { 1, 2, 3, 4, 5, 6 };
	char *p = path_of("m.fbin");
	struct dm_vecs v;
	cr_assert_eq(dm_vecs_write(p, DM_VF_AUTO, x, DM_VT_F32, 2, 3), 0);
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &v, NULL, 0), 0);
	cr_assert_not_null(v.map);
	cr_assert_eq((char *)v.data, (char *)v.map + 8);
	cr_assert_eq(((float *)v.data)[5], 6.0f);
	dm_vecs_free(&v);
}

Test(vecfile, explicit_format_and_overwrite)
{
	float x[4] = { 1, 2, 3, 4 }, y[2] = { 9, 8 };
	char *p = path_of("data.raw");
	struct dm_vecs v;
	cr_assert_eq(dm_vecs_write(p, DM_VF_FVECS, x, DM_VT_F32, 2, 2), 0);
	cr_assert_eq(dm_vecs_write(p, DM_VF_FVECS, y, DM_VT_F32, 1, 2), 0);  /* replaces */
	cr_assert_eq(dm_vecs_read(p, DM_VF_FVECS, &v, NULL, 0), 0);
	cr_assert_eq(v.n, 1);
	cr_assert_eq(((float *)v.data)[0], 9.0f);
	dm_vecs_free(&v);
}

Test(vecfile, writer_rejects_bad_arguments)
{
	float x[4] = { 0 };
	cr_assert_eq(dm_vecs_write(path_of("w.fvecs"), DM_VF_AUTO, x, DM_VT_I32, 2, 2), -EINVAL);
	cr_assert_eq(dm_vecs_write(path_of("w.fvecs"), DM_VF_AUTO, x, DM_VT_F32, 0, 2), -EINVAL);
	cr_assert_eq(dm_vecs_write(path_of("w.fvecs"), DM_VF_AUTO, x, DM_VT_F32, 2, 0), -EINVAL);
	cr_assert_eq(dm_vecs_write(path_of("w.xyz"), DM_VF_AUTO, x, DM_VT_F32, 2, 2), -EINVAL);
	cr_assert_eq(dm_vecs_write("/nonexistent-dir/w.fbin", DM_VF_AUTO, x, DM_VT_F32, 2, 2),
		     -ENOENT);
	cr_assert_neq(access(path_of("w.fvecs"), F_OK), 0);
}

Test(vecfile, format_names)
{
	cr_assert_eq(dm_vec_format_from_name("x/base.fvecs"), DM_VF_FVECS);
	cr_assert_eq(dm_vec_format_from_name("GT.IVECS"), DM_VF_IVECS);
	cr_assert_eq(dm_vec_format_from_name("b.u8bin"), DM_VF_U8BIN);
	cr_assert_eq(dm_vec_format_from_name("b.i8bin"), DM_VF_I8BIN);
	cr_assert_eq(dm_vec_format_from_name("b.ibin"), DM_VF_IBIN);
	cr_assert_eq(dm_vec_format_from_name("b.fbin"), DM_VF_FBIN);
	cr_assert_eq(dm_vec_format_from_name("b.bvecs"), DM_VF_BVECS);
	cr_assert_eq(dm_vec_format_from_name("b.bin"), DM_VF_AUTO);
	cr_assert_eq(dm_vec_format_from_name("dir.fvecs/file"), DM_VF_AUTO);
	cr_assert_eq(dm_vec_format_from_name("noext"), DM_VF_AUTO);
	cr_assert_str_eq(dm_vec_format_name(DM_VF_I8BIN), "i8bin");
}

/* Reads name (already written) and asserts failure with a message naming the file and
 * containing what. */
static void expect_bad(const char *name, int want_err, const char *what)
{
	char *p = path_of(name);
	struct dm_vecs v;
	char err[512] = "";
	int r = dm_vecs_read(p, DM_VF_AUTO, &v, err, sizeof(err));
	cr_assert_eq(r, want_err, "%s: r=%d (%s)", name, r, err);
	cr_assert_not_null(strstr(err, p), "message does not name the file: '%s'", err);
	cr_assert_not_null(strstr(err, what), "message '%s' lacks '%s'", err, what);
	cr_assert_null(v.data);
	cr_log_info("%s", err);
}

/* A TEXMEX file of n rows, each with its own dim header dims[i] and dim_data values. */
static void write_texmex(const char *name, const int32_t *dims, size_t n, size_t dim_data,
			 size_t esize, size_t cut)
{
	size_t row = 4 + dim_data * esize, len = n * row;
	unsigned char *buf = calloc(1, len + 1);
	for (size_t i = 0; i < n; i++)
		memcpy(buf + i * row, &dims[i], 4);
	write_raw(path_of(name), buf, len - cut);
	free(buf);
}

static void write_bin(const char *name, uint32_t n, uint32_t dim, size_t data_bytes)
{
	unsigned char *buf = calloc(1, 8 + data_bytes);
	memcpy(buf, &n, 4);
	memcpy(buf + 4, &dim, 4);
	write_raw(path_of(name), buf, 8 + data_bytes);
	free(buf);
}

Test(vecfile, rejects_truncated)
{
	int32_t d[3] = { 4, 4, 4 };
	write_texmex("t.fvecs", d, 3, 4, 4, 3);
	expect_bad("t.fvecs", -EINVAL, "truncated");
	write_texmex("t.bvecs", d, 3, 4, 1, 1);
	expect_bad("t.bvecs", -EINVAL, "truncated");
	write_bin("t.fbin", 10, 4, 10 * 4 * 4 - 1);
	expect_bad("t.fbin", -EINVAL, "truncated");
	write_raw(path_of("h.u8bin"), "\x01\x00\x00\x00\x01", 5);  /* half a header */
	expect_bad("h.u8bin", -EINVAL, "truncated");
	write_raw(path_of("h.ivecs"), "\x01\x00", 2);
	expect_bad("h.ivecs", -EINVAL, "truncated");
}

Test(vecfile, rejects_header_size_mismatch)
{
	write_bin("m.fbin", 2, 3, 2 * 3 * 4 + 4);
	expect_bad("m.fbin", -EINVAL, "size mismatch");
	write_bin("m.i8bin", 2, 3, 7);
	expect_bad("m.i8bin", -EINVAL, "size mismatch");
	/* a huge header n on a small file is a mismatch, not an allocation */
	write_bin("huge.ibin", 0xffffffffu, 65536, 16);
	expect_bad("huge.ibin", -EINVAL, "truncated");
}

Test(vecfile, rejects_inconsistent_dims)
{
	int32_t d[4] = { 4, 4, 5, 4 };
	write_texmex("i.fvecs", d, 4, 4, 4, 0);
	expect_bad("i.fvecs", -EINVAL, "inconsistent dimensions: row 2 has dimension 5");
	int32_t e[2] = { 3, 7 };
	write_texmex("i.ivecs", e, 2, 3, 4, 0);
	expect_bad("i.ivecs", -EINVAL, "inconsistent dimensions: row 1");
}

Test(vecfile, rejects_zero_dim)
{
	int32_t d[1] = { 0 };
	write_texmex("z.fvecs", d, 1, 0, 4, 0);
	expect_bad("z.fvecs", -EINVAL, "zero dimension");
	write_bin("z.fbin", 5, 0, 0);
	expect_bad("z.fbin", -EINVAL, "zero dimension");
	int32_t neg[1] = { -3 };
	write_texmex("n.ivecs", neg, 1, 0, 4, 0);
	expect_bad("n.ivecs", -EINVAL, "negative dimension");
}

Test(vecfile, rejects_zero_rows)
{
	write_bin("r.u8bin", 0, 16, 0);
	expect_bad("r.u8bin", -EINVAL, "zero rows");
}

Test(vecfile, rejects_absurd_dim)
{
	write_bin("a.fbin", 1, DM_VEC_MAX_DIM + 1, 0);
	expect_bad("a.fbin", -EINVAL, "absurd dimension");
	int32_t d[1] = { 1 << 30 };
	write_texmex("a.fvecs", d, 1, 0, 4, 0);
	expect_bad("a.fvecs", -EINVAL, "absurd dimension");
}

Test(vecfile, rejects_empty_file)
{
	write_raw(path_of("e.fvecs"), "", 0);
	expect_bad("e.fvecs", -EINVAL, "empty file");
	write_raw(path_of("e.ibin"), "", 0);
	expect_bad("e.ibin", -EINVAL, "empty file");
}

Test(vecfile, rejects_unknown_extension)
{
	write_bin("u.npy", 1, 1, 4);
	expect_bad("u.npy", -EINVAL, "unknown extension 'npy'");
	write_bin("noext", 1, 1, 4);
	expect_bad("noext", -EINVAL, "unknown extension");
}

Test(vecfile, rejects_non_finite_and_missing)
{
	float x[4] = { 1, NAN, 3, 4 };
	write_bin("nan.fbin", 2, 2, 0);
	FILE *f = fopen(path_of("nan.fbin"), "ab");
	cr_assert_eq(fwrite(x, 4, 4, f), 4);
	fclose(f);
	expect_bad("nan.fbin", -EINVAL, "non-finite value (nan) at row 0, column 1");
	expect_bad("missing.fvecs", -ENOENT, "cannot open");
	mkdir(path_of("d.fvecs"), 0755);
	expect_bad("d.fvecs", -EINVAL, "not a regular file");
}

Test(vecfile, parse_rejects_with_name)
{
	struct dm_vecs v;
	char err[256];
	unsigned char junk[12] = { 0 };
	cr_assert_eq(dm_vecs_parse(junk, sizeof(junk), DM_VF_AUTO, "upload.fbin", &v, err,
				   sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "upload.fbin"), "%s", err);
	cr_assert_eq(dm_vecs_parse(junk, 0, DM_VF_FVECS, NULL, &v, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "empty"), "%s", err);
	/* tiny error buffers are truncated, never overrun */
	char small[8];
	cr_assert_eq(dm_vecs_parse(junk, 3, DM_VF_FBIN, "x.fbin", &v, small, sizeof(small)),
		     -EINVAL);
	cr_assert_eq(strlen(small), 7);
}
