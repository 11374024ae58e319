/* fuzz_vecfile.c: libFuzzer target for the vector file readers. The first input byte picks
 * the format (and whether to go through the mmap file path), the rest is the file image.
 * Accepted files are read completely so that ASan sees any out-of-bounds result. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vecfile.h"

/* Reads every value of an accepted result and checks the shape invariants. */
static void touch(const struct dm_vecs *v)
{
	volatile uint32_t acc = 0;
	const uint32_t *p = v->data;

	if (v->n == 0 || v->dim == 0 || v->dim > DM_VEC_MAX_DIM || !v->data)
		__builtin_trap();
	for (uint64_t i = 0; i < v->n * v->dim; i++)
		acc ^= p[i];
	(void)acc;
}

/* Goes through dm_vecs_read (open, fstat, mmap, in-place fbin) on a memfd. */
static void via_file(const uint8_t *buf, size_t len, enum dm_vec_format fmt)
{
	static int fd = -1;
	char path[64], err[256];
	struct dm_vecs v;

	if (fd < 0)
		fd = memfd_create("fuzz_vecfile", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, buf, len, 0) != (ssize_t)len)
		return;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (dm_vecs_read(path, fmt, &v, err, sizeof(err)) == 0) {
		touch(&v);
		dm_vecs_free(&v);
	} else if (!strstr(err, path)) {
		__builtin_trap();  /* every error names the file */
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	struct dm_vecs v;

	if (size < 1)
		return 0;
	enum dm_vec_format fmt = (enum dm_vec_format)(data[0] % 8);  /* 0 = AUTO: error */
	const char *name = fmt == DM_VF_AUTO ? "fuzz.input" : "fuzz";
	if (dm_vecs_parse(data + 1, size - 1, fmt, name, &v, err, sizeof(err)) == 0) {
		touch(&v);
		dm_vecs_free(&v);
	} else if (!strstr(err, name) || v.data) {
		__builtin_trap();
	}
	if (data[0] & 0x80)
		via_file(data + 1, size - 1, fmt);
	return 0;
}
