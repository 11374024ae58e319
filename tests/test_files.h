/* test_files.h: scratch directories and whole-file reads for the tests that write images
 * (test_hnsw, test_hnsw_order). Criterion asserts: a failure ends the test with its cause. */
#ifndef DM_TEST_FILES_H
#define DM_TEST_FILES_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A new directory /tmp/<prefix>.<6 random characters> made by mkdtemp (free() the name,
 * rmtree() the directory). */
static inline char *tmpdir_new(const char *prefix)
{
	char *d = malloc(strlen(prefix) + 16);

	cr_assert(d);
	sprintf(d, "/tmp/%s.XXXXXX", prefix);
	cr_assert(mkdtemp(d), "mkdtemp %s", d);
	return d;
}

static inline void rmtree(const char *d)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	cr_assert_eq(system(cmd), 0);
}

/* The whole file (NUL-terminated one byte past *len; free() it). */
static inline void *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	long l;
	void *b;

	cr_assert(f, "open %s", path);
	fseek(f, 0, SEEK_END);
	l = ftell(f);
	fseek(f, 0, SEEK_SET);
	b = malloc((size_t)l + 1);
	cr_assert(l >= 0 && b && fread(b, 1, (size_t)l, f) == (size_t)l);
	fclose(f);
	((char *)b)[l] = 0;
	*len = (size_t)l;
	return b;
}

/* Whether two files hold the same bytes. */
static inline bool same_file(const char *a, const char *b)
{
	size_t la, lb;
	void *x = slurp(a, &la), *y = slurp(b, &lb);
	bool same = la == lb && !memcmp(x, y, la);

	free(x);
	free(y);
	return same;
}

#endif
