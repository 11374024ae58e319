/* fuzz_patch.h: the input scheme of the loader fuzz targets whose format ends in a CRC-32
 * (zlib) of everything before it. Random bytes rarely pass such a checksum, so the first
 * input byte picks a mode: 0, the rest is the image as is; otherwise the rest is a list of
 * (u16 offset, u8 xor) patches applied to a valid base image, truncated by (mode & 0x3f)
 * bytes when mode & 0x80, whose checksum is then recomputed: that reaches the field
 * validation behind the checksum. */
#ifndef DM_FUZZ_PATCH_H
#define DM_FUZZ_PATCH_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* The image for input data[0..size) (size >= 1) over base[0..base_len) (base_len > 4):
 * malloc'd (abort on no memory), its length in *len. */
static inline uint8_t *fuzz_patch_image(const uint8_t *data, size_t size, const uint8_t *base,
					size_t base_len, size_t *len)
{
	uint8_t *img;

	if (data[0] == 0) {
		*len = size - 1;
		img = malloc(*len ? *len : 1);
		if (!img)
			abort();
		memcpy(img, data + 1, *len);
		return img;
	}
	*len = base_len;
	img = malloc(base_len);
	if (!img)
		abort();
	memcpy(img, base, base_len);
	for (size_t i = 1; i + 2 < size; i += 3)
		img[(data[i] | (size_t)data[i + 1] << 8) % (base_len - 4)] ^= data[i + 2];
	if (data[0] & 0x80)
		*len -= data[0] & 0x3f;
	if (*len >= 4) {
		uint32_t c = (uint32_t)crc32_z(crc32_z(0, Z_NULL, 0), img, *len - 4);
		memcpy(img + *len - 4, &c, 4);
	}
	return img;
}

#endif
