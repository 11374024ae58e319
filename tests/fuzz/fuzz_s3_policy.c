/* fuzz_s3_policy.c: libFuzzer target for the bucket policy parser and evaluator
 * (common/index/s3_policy.c): any input is parsed; an accepted policy is evaluated for a
 * few principals, actions and resources (taken from the input's tail too), and a refused
 * one must leave a reason. The glob matcher runs on input-derived patterns. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "s3_policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const who[] = { "arn:aws:iam::000000000000:user/alice",
		"arn:aws:iam::111122223333:user/bob", "*", "" };
	static const char *const act[] = { "s3vectors:PutVectors", "s3vectors:GetVectors",
		"s3vectors:x", "" };
	static const char *const res[] = { "arn:aws:s3vectors:us-east-1:000000000000:bucket/b",
		"arn:aws:s3vectors:us-east-1:000000000000:bucket/b/index/i", "*", "" };
	char msg[256];
	char *s = malloc(size + 1);
	struct s3p_policy *p;

	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = 0;
	p = s3p_parse(s, size, msg, sizeof(msg));
	if (!p) {
		if (errno == EINVAL && !msg[0])
			abort();                       /* a refusal always says why */
	} else {
		for (size_t i = 0; i < 4; i++)
			for (size_t j = 0; j < 4; j++)
				for (size_t k = 0; k < 4; k++) {
					enum s3p_decision d = s3p_eval(p, who[i], act[j], res[k]);

					if (d != S3P_IMPLICIT && d != S3P_ALLOW && d != S3P_DENY)
						abort();
				}
		s3p_eval(p, s, s, s);
		s3p_free(p);
	}
	/* The matcher on the input split in two at its first NUL or middle. */
	size_t half = strlen(s) / 2;
	char *pat = strndup(s, half);

	if (pat) {
		s3p_match(pat, s + half, false);
		s3p_match(pat, s + half, true);
		free(pat);
	}
	free(s);
	return 0;
}
