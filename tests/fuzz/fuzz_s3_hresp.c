/* fuzz_s3_hresp.c: libFuzzer target for the internal client's HTTP response parser
 * (cn/s3/s3_hresp.c): any bytes, at every length the client may have received so far and
 * at the end of the connection; an accepted response must lie within the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "s3_hresp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* An exact-size copy: any read past the bytes is caught by ASan. */
	char *b = malloc(size ? size : 1);
	struct s3_hresp r;

	if (!b)
		return 0;
	memcpy(b, data, size);
	for (size_t n = size > 64 ? size - 64 : 0; n <= size; n++)
		for (int eof = 0; eof < 2; eof++) {
			int rc = s3_hresp_parse(b, n, eof, &r);

			if (rc == 1 && (r.hdr_len > n || r.body < b || r.body + r.blen > b + n ||
					r.status < 100 || r.status > 599))
				abort();
			if (rc == 0 && eof)
				abort();
		}
	free(b);
	return 0;
}
