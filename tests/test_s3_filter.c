/* test_s3_filter.c: metadata validation/encoding (AWS limits) and the filter language:
 * parse errors and evaluation of every operator, lists, missing keys, $and/$or, and
 * non-filterable keys. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "s3_filter.h"

static const char *nf[] = { "text", "blob" };

/* Encode metadata JSON text; returns the fmeta blob (caller frees). */
static uint8_t *enc(const char *meta_json, size_t *flen)
{
	json_t *m = json_loads(meta_json, 0, NULL);
	char *js, err[256];
	size_t jl;
	uint8_t *fm;

	cr_assert_not_null(m, "bad test JSON %s", meta_json);
	cr_assert_eq(s3_meta_encode(m, nf, 2, &js, &jl, &fm, flen, err, sizeof(err)), 0, "%s",
		     err);
	json_decref(m);
	free(js);
	return fm;
}

static int enc_err(const char *meta_json, char *err, size_t errlen)
{
	json_t *m = json_loads(meta_json, 0, NULL);
	char *js;
	size_t jl, fl;
	uint8_t *fm;
	int rc;

	cr_assert_not_null(m);
	rc = s3_meta_encode(m, nf, 2, &js, &jl, &fm, &fl, err, errlen);
	json_decref(m);
	if (!rc) {
		free(js);
		free(fm);
	}
	return rc;
}

Test(s3meta, encode_roundtrip_excludes_nonfilterable)
{
	size_t fl;
	uint8_t *fm = enc("{\"genre\":\"drama\",\"year\":2021,\"ok\":true,\"tags\":[\"a\",1,false],"
			  "\"text\":\"long non-filterable\"}", &fl);
	json_t *back = s3_fmeta_to_json(fm, fl);
	json_t *want = json_loads("{\"genre\":\"drama\",\"year\":2021.0,\"ok\":true,"
				  "\"tags\":[\"a\",1.0,false]}", 0, NULL);

	cr_assert(json_equal(back, want), "%s", json_dumps(back, 0));
	json_decref(back);
	json_decref(want);
	free(fm);
	cr_assert_null(s3_fmeta_to_json("\x05\x00ab", 4));
}

Test(s3meta, limits)
{
	char err[256], *big;
	size_t n;

	cr_assert_eq(enc_err("[1]", err, sizeof(err)), -EINVAL);
	cr_assert_eq(enc_err("{\"a\":{\"b\":1}}", err, sizeof(err)), -EINVAL);
	cr_assert_eq(enc_err("{\"a\":null}", err, sizeof(err)), -EINVAL);
	cr_assert_eq(enc_err("{\"a\":[[1]]}", err, sizeof(err)), -EINVAL);
	cr_assert_eq(enc_err("{\"\":1}", err, sizeof(err)), -EINVAL);

	/* 51 keys */
	big = malloc(64 * 1024);
	n = (size_t)sprintf(big, "{");
	for (int i = 0; i < 51; i++)
		n += (size_t)sprintf(big + n, "%s\"k%d\":%d", i ? "," : "", i, i);
	sprintf(big + n, "}");
	cr_assert_eq(enc_err(big, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "50"), "%s", err);

	/* > 2 KB filterable, but fine as non-filterable */
	sprintf(big, "{\"a\":\"%02100d\"}", 0);
	cr_assert_eq(enc_err(big, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "filterable"), "%s", err);
	sprintf(big, "{\"text\":\"%02100d\"}", 0);
	cr_assert_eq(enc_err(big, err, sizeof(err)), 0);

	/* > 40 KB in total */
	sprintf(big, "{\"text\":\"%041000d\"}", 0);
	cr_assert_eq(enc_err(big, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "40960"), "%s", err);
	free(big);
}

/* ---- filters ---------------------------------------------------------------------- */

static void parse_fails(const char *f, const char *why)
{
	json_t *j = json_loads(f, 0, NULL);
	char err[256] = "";

	cr_assert_not_null(j, "bad test JSON %s", f);
	cr_assert_null(s3_filter_parse(j, nf, 2, err, sizeof(err)), "%s parsed", f);
	cr_assert_eq(errno, EINVAL);
	cr_assert(strstr(err, why), "%s: message '%s' lacks '%s'", f, err, why);
	json_decref(j);
}

Test(s3filter, parse_errors)
{
	parse_fails("{}", "non-empty");
	parse_fails("[]", "object");
	parse_fails("{\"a\":{\"$foo\":1}}", "unknown filter operator");
	parse_fails("{\"$not\":[{\"a\":1}]}", "unknown filter operator");
	parse_fails("{\"a\":{\"$gt\":\"x\"}}", "number");
	parse_fails("{\"a\":{\"$eq\":[1]}}", "string, number or boolean");
	parse_fails("{\"a\":{\"$eq\":null}}", "string, number or boolean");
	parse_fails("{\"a\":null}", "string, number or boolean");
	parse_fails("{\"a\":{\"$in\":[]}}", "non-empty array");
	parse_fails("{\"a\":{\"$nin\":\"x\"}}", "non-empty array");
	parse_fails("{\"a\":{\"$in\":[{}]}}", "values must be");
	parse_fails("{\"a\":{\"$exists\":1}}", "boolean");
	parse_fails("{\"$and\":{}}", "non-empty array");
	parse_fails("{\"$or\":[]}", "non-empty array");
	parse_fails("{\"$or\":[1]}", "object");
	parse_fails("{\"a\":{}}", "empty operator");
	parse_fails("{\"text\":\"x\"}", "non-filterable");
	parse_fails("{\"$or\":[{\"blob\":{\"$exists\":true}}]}", "non-filterable");

	char deep[512] = "", *p = deep;

	for (int i = 0; i < 20; i++)
		p += sprintf(p, "{\"$and\":[");
	p += sprintf(p, "{\"a\":1}");
	for (int i = 0; i < 20; i++)
		p += sprintf(p, "]}");
	parse_fails(deep, "deeper");
}

static const char *doc =
	"{\"genre\":\"drama\",\"year\":2021,\"rating\":4.5,\"ok\":true,"
	"\"tags\":[\"a\",\"b\",7],\"text\":\"ignored\"}";

static bool match(const char *f)
{
	json_t *j = json_loads(f, 0, NULL);
	char err[256];
	struct s3_filter *sf;
	size_t fl;
	uint8_t *fm = enc(doc, &fl);
	bool m;

	cr_assert_not_null(j, "bad test JSON %s", f);
	sf = s3_filter_parse(j, nf, 2, err, sizeof(err));
	cr_assert_not_null(sf, "%s: %s", f, err);
	m = s3_filter_match(sf, fm, fl);
	s3_filter_free(sf);
	json_decref(j);
	free(fm);
	return m;
}

Test(s3filter, evaluate)
{
	static const struct { const char *f; bool want; } cases[] = {
		{ "{\"genre\":\"drama\"}", true },
		{ "{\"genre\":\"comedy\"}", false },
		{ "{\"genre\":{\"$eq\":\"drama\"}}", true },
		{ "{\"genre\":{\"$ne\":\"drama\"}}", false },
		{ "{\"genre\":{\"$ne\":\"comedy\"}}", true },
		{ "{\"year\":2021}", true },
		{ "{\"year\":2021.0}", true },
		{ "{\"year\":\"2021\"}", false },          /* types do not coerce */
		{ "{\"ok\":true}", true },
		{ "{\"ok\":1}", false },
		{ "{\"year\":{\"$gt\":2020}}", true },
		{ "{\"year\":{\"$gt\":2021}}", false },
		{ "{\"year\":{\"$gte\":2021}}", true },
		{ "{\"year\":{\"$lt\":2021}}", false },
		{ "{\"year\":{\"$lte\":2021}}", true },
		{ "{\"rating\":{\"$gt\":4,\"$lt\":5}}", true },
		{ "{\"rating\":{\"$gt\":4,\"$lt\":4.5}}", false },
		{ "{\"genre\":{\"$gt\":1}}", false },      /* a string is not a number */
		{ "{\"genre\":{\"$in\":[\"x\",\"drama\"]}}", true },
		{ "{\"genre\":{\"$in\":[\"x\",\"y\"]}}", false },
		{ "{\"genre\":{\"$nin\":[\"x\",\"y\"]}}", true },
		{ "{\"genre\":{\"$nin\":[\"drama\"]}}", false },
		{ "{\"genre\":{\"$exists\":true}}", true },
		{ "{\"nope\":{\"$exists\":true}}", false },
		{ "{\"nope\":{\"$exists\":false}}", true },
		/* missing keys */
		{ "{\"nope\":1}", false },
		{ "{\"nope\":{\"$ne\":1}}", true },
		{ "{\"nope\":{\"$nin\":[1]}}", true },
		{ "{\"nope\":{\"$in\":[1]}}", false },
		{ "{\"nope\":{\"$gt\":1}}", false },
		/* lists: any element */
		{ "{\"tags\":\"b\"}", true },
		{ "{\"tags\":\"c\"}", false },
		{ "{\"tags\":{\"$ne\":\"b\"}}", false },
		{ "{\"tags\":{\"$ne\":\"c\"}}", true },
		{ "{\"tags\":{\"$in\":[\"z\",\"a\"]}}", true },
		{ "{\"tags\":{\"$nin\":[\"z\",\"a\"]}}", false },
		{ "{\"tags\":{\"$gt\":6}}", true },
		{ "{\"tags\":{\"$gt\":7}}", false },
		/* logic */
		{ "{\"$and\":[{\"genre\":{\"$eq\":\"drama\"}},{\"year\":{\"$gte\":2020}}]}", true },
		{ "{\"$and\":[{\"genre\":\"drama\"},{\"year\":{\"$gte\":2022}}]}", false },
		{ "{\"$or\":[{\"genre\":\"comedy\"},{\"year\":{\"$gte\":2022}}]}", false },
		{ "{\"$or\":[{\"genre\":\"comedy\"},{\"year\":2021}]}", true },
		{ "{\"genre\":\"drama\",\"year\":2020}", false },
		{ "{\"genre\":\"drama\",\"year\":2021}", true },
		{ "{\"$or\":[{\"$and\":[{\"ok\":false},{\"year\":2021}]},{\"tags\":7}]}", true },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		cr_assert_eq(match(cases[i].f), cases[i].want, "%s should be %s", cases[i].f,
			     cases[i].want ? "true" : "false");
}

Test(s3filter, empty_and_malformed_metadata)
{
	json_t *j = json_loads("{\"a\":{\"$exists\":false}}", 0, NULL);
	struct s3_filter *sf = s3_filter_parse(j, NULL, 0, NULL, 0);

	cr_assert_not_null(sf);
	cr_assert(s3_filter_match(sf, NULL, 0));
	cr_assert(!s3_filter_match(sf, "\x01\x00", 2));     /* truncated: matches nothing */
	cr_assert(s3_filter_match(NULL, "junk", 4));        /* no filter */
	s3_filter_free(sf);
	json_decref(j);
}
