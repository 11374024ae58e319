/* test_s3_scope.c: scoped retrieval's pieces without a cluster (common/index/s3_scope.c,
 * flat_scope.c and the S3 operations over a store opened with s3_scope_ops): the
 * declaration and what refuses a bad one, a row's scope value, the pin of a filter, the
 * store's per-scope fragments (every fragment holds the rows of one scope value; an
 * overwrite that moves a key to another scope tombstones its old row), scoped QueryVectors
 * against a brute force over the test's own copy of the rows, the same after a clean
 * restart (snapshot) and after a crash (WAL replay), concurrent writers and a reservation
 * that fails halfway. */
#include <criterion/criterion.h>

#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "flat.h"
#include "flat_int.h"      /* the fault hook */
#include "s3_api.h"
#include "s3_filter.h"
#include "s3_scope.h"

#define DIM 8
#define FR 16              /* rows per fragment: every tenant spans several */
#define NT 10              /* tenants */
#define NR 400             /* rows */

static char tdir[64];
static struct flat_store *store;
static struct s3_api *api;

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st; (void)flag; (void)f;
	return remove(p);
}

static void open_all(void)
{
	struct flat_opts o = { .frag_rows = FR, .scope = &s3_scope_ops };

	store = flat_open(tdir, &o);
	cr_assert_not_null(store);
	api = s3_api_new(store, "us-east-1", "123456789012");
	cr_assert_not_null(api);
}

static void setup(void)
{
	snprintf(tdir, sizeof(tdir), "/tmp/dmann-scope-XXXXXX");
	cr_assert_not_null(mkdtemp(tdir));
	open_all();
}

static void teardown(void)
{
	s3_api_free(api);
	if (store)
		flat_close(store);
	nftw(tdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(scope, .init = setup, .fini = teardown, .timeout = 60);

static json_t *call(const char *op, int want, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static json_t *call(const char *op, int want, const char *fmt, ...)
{
	va_list ap;
	char *body;
	struct s3_resp r;
	json_t *o;

	va_start(ap, fmt);
	cr_assert_geq(vasprintf(&body, fmt, ap), 0);
	va_end(ap);
	s3_api_handle(api, op, body, strlen(body), &r);
	o = json_loadb(r.body ? r.body : "{}", r.body ? r.len : 2, 0, NULL);
	cr_assert_eq(r.status, want, "%s %s -> %d %s", op, body, r.status, r.body);
	s3_resp_free(&r);
	free(body);
	return o;
}

#define B "\"vectorBucketName\":\"bkt\""
#define IX B ",\"indexName\":\"idx\""

/* ---------------------------------------------------------------- parsing ---------- */

Test(scope, conf_value_label_and_pin)
{
	char key[S3_SCOPE_KEY_MAX + 1];
	const char *v;
	uint32_t vl;
	char *pv;
	size_t pl;

	cr_assert_eq(s3_scope_conf_key(NULL, 0, key), 0);
	const char *c = "{\"nonFilterableMetadataKeys\":[\"a\"]}";

	cr_assert_eq(s3_scope_conf_key(c, (uint32_t)strlen(c), key), 0);
	c = "{\"dmannScope\":\"tenant\"}";

	cr_assert_eq(s3_scope_conf_key(c, (uint32_t)strlen(c), key), 1);
	cr_assert_str_eq(key, "tenant");
	c = "{\"dmannScope\":7}";
	cr_assert_eq(s3_scope_conf_key(c, (uint32_t)strlen(c), key), -EINVAL);
	c = "{\"dmannScope\":\"\"}";
	cr_assert_eq(s3_scope_conf_key(c, (uint32_t)strlen(c), key), -EINVAL);
	cr_assert_eq(s3_scope_conf_key("[", 1, key), -EINVAL);

	/* a row's value from the encoded metadata */
	json_t *m = json_loads("{\"tenant\":\"acme\",\"n\":3,\"l\":[1,\"x\"]}", 0, NULL);
	char *js;
	uint8_t *fm;
	size_t jl, fl;

	cr_assert_eq(s3_meta_encode(m, NULL, 0, &js, &jl, &fm, &fl, NULL, 0), 0);
	cr_assert_eq(s3_scope_value(fm, fl, "tenant", &v, &vl), 1);
	cr_assert(vl == 4 && !memcmp(v, "acme", 4));
	cr_assert_eq(s3_scope_value(fm, fl, "n", &v, &vl), -EINVAL);      /* a number */
	cr_assert_eq(s3_scope_value(fm, fl, "l", &v, &vl), -EINVAL);      /* a list */
	cr_assert_eq(s3_scope_value(fm, fl, "missing", &v, &vl), 0);
	cr_assert_eq(s3_scope_value(fm, fl - 1, "zzz", &v, &vl), -EINVAL); /* cut */
	cr_assert_eq(s3_scope_value(NULL, 0, "tenant", &v, &vl), 0);
	free(js);
	free(fm);
	json_decref(m);
	cr_assert_neq(s3_scope_label("", 0), 0);
	cr_assert_neq(s3_scope_label("a", 1), s3_scope_label("b", 1));

	/* pins: a conjunct of the top level only */
	static const struct { const char *f; const char *want; } pins[] = {
		{ "{\"tenant\":\"a\"}", "a" },
		{ "{\"tenant\":{\"$eq\":\"b\"}}", "b" },
		{ "{\"tenant\":{\"$ne\":\"z\",\"$eq\":\"c\"}}", "c" },
		{ "{\"year\":{\"$gt\":1},\"tenant\":\"d\"}", "d" },
		{ "{\"$and\":[{\"x\":1},{\"tenant\":{\"$eq\":\"e\"}}]}", "e" },
		{ "{\"$and\":[{\"$and\":[{\"tenant\":\"f\"}]}]}", "f" },
		{ "{\"$or\":[{\"tenant\":\"a\"},{\"tenant\":\"b\"}]}", NULL },
		{ "{\"$and\":[{\"$or\":[{\"tenant\":\"a\"}]}]}", NULL },
		{ "{\"tenant\":{\"$ne\":\"a\"}}", NULL },
		{ "{\"tenant\":{\"$in\":[\"a\"]}}", NULL },
		{ "{\"tenant\":5}", NULL },
		{ "{\"tenant\":[\"a\"]}", NULL },
		{ "{\"other\":\"a\"}", NULL },
	};
	for (size_t i = 0; i < sizeof(pins) / sizeof(pins[0]); i++) {
		json_t *f = json_loads(pins[i].f, 0, NULL);
		int rc = s3_scope_pin(f, "tenant", &pv, &pl);

		cr_assert_not_null(f);
		cr_assert_eq(rc, pins[i].want ? 1 : 0, "%s", pins[i].f);
		if (pins[i].want)
			cr_assert(pl == strlen(pins[i].want) && !strcmp(pv, pins[i].want), "%s",
				  pins[i].f);
		free(pv);
		json_decref(f);
	}
}

/* ---------------------------------------------------------------- declaration ------ */

Test(scope, declaration_and_refusals)
{
	json_t *o;

	json_decref(call("CreateVectorBucket", 200, "{" B "}"));
	/* refused declarations */
	json_decref(call("CreateIndex", 400, "{" IX ",\"dataType\":\"float32\",\"dimension\":4,"
			 "\"distanceMetric\":\"euclidean\",\"metadataConfiguration\":{"
			 "\"nonFilterableMetadataKeys\":[\"tenant\"]},\"tags\":{\"dmann:scope\":"
			 "\"tenant\"}}"));
	json_decref(call("CreateIndex", 400, "{" IX ",\"dataType\":\"float32\",\"dimension\":4,"
			 "\"distanceMetric\":\"euclidean\",\"tags\":{\"dmann:scope\":\"\"}}"));
	json_decref(call("CreateIndex", 400, "{" IX ",\"dataType\":\"float32\",\"dimension\":4,"
			 "\"distanceMetric\":\"euclidean\",\"tags\":{\"dmann:scope\":\"$and\"}}"));
	json_decref(call("CreateVectorBucket", 400, "{\"vectorBucketName\":\"b2\",\"tags\":{"
			 "\"dmann:scope\":\"tenant\"}}"));
	/* a good one */
	json_decref(call("CreateIndex", 200, "{" IX ",\"dataType\":\"float32\",\"dimension\":4,"
			 "\"distanceMetric\":\"euclidean\",\"metadataConfiguration\":{"
			 "\"nonFilterableMetadataKeys\":[\"body\"]},\"tags\":{\"dmann:scope\":"
			 "\"tenant\",\"team\":\"x\"}}"));
	o = call("GetIndex", 200, "{" IX "}");
	json_t *mc = json_object_get(json_object_get(o, "index"), "metadataConfiguration");

	cr_assert_eq(json_object_size(mc), 1, "only nonFilterableMetadataKeys is shown");
	cr_assert_not_null(json_object_get(mc, "nonFilterableMetadataKeys"));
	json_decref(o);
	const char *arn = "arn:aws:s3vectors:us-east-1:123456789012:bucket/bkt/index/idx";

	o = call("ListTagsForResource", 200, "{\"resourceArn\":\"%s\"}", arn);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(o, "tags"),
							   "dmann:scope")), "tenant");
	json_decref(o);
	/* immutable */
	json_decref(call("TagResource", 400, "{\"resourceArn\":\"%s\",\"tags\":{\"dmann:scope\":"
			 "\"other\"}}", arn));
	json_decref(call("UntagResource", 400, "{\"resourceArn\":\"%s\",\"tagKeys\":["
			 "\"dmann:scope\"]}", arn));
	json_decref(call("UntagResource", 200, "{\"resourceArn\":\"%s\",\"tagKeys\":[\"team\"]}",
			 arn));
	/* scope values are strings (or absent) */
	json_decref(call("PutVectors", 400, "{" IX ",\"vectors\":[{\"key\":\"a\",\"data\":{"
			 "\"float32\":[1,2,3,4]},\"metadata\":{\"tenant\":5}}]}"));
	json_decref(call("PutVectors", 400, "{" IX ",\"vectors\":[{\"key\":\"a\",\"data\":{"
			 "\"float32\":[1,2,3,4]},\"metadata\":{\"tenant\":[\"x\"]}}]}"));
	json_decref(call("PutVectors", 200, "{" IX ",\"vectors\":[{\"key\":\"a\",\"data\":{"
			 "\"float32\":[1,2,3,4]},\"metadata\":{\"tenant\":\"x\"}},{\"key\":\"b\","
			 "\"data\":{\"float32\":[1,2,3,5]}}]}"));
	struct flat_index *ix = flat_index_get(store, "bkt", "idx");

	cr_assert_not_null(ix);
	cr_assert(flat_index_scoped(ix));
	cr_assert_eq(flat_mark_set(ix, 2, 7), -EOPNOTSUPP, "scoped indexes take no graph");
	flat_index_put(ix);
}

/* ---------------------------------------------------------------- storage + query -- */

/* The test's copy of the rows. */
static struct row {
	char key[16];
	int tenant;                      /* -1: no tenant */
	float v[DIM];
	bool alive;
} rows[NR];

static float rnd(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*s >> 33) % 20000) / 1000.0f - 10.0f;
}

static void put_row(int i, int tenant, uint64_t *seed)
{
	char body[1024], *p = body;

	snprintf(rows[i].key, sizeof(rows[i].key), "k%d", i);
	rows[i].tenant = tenant;
	rows[i].alive = true;
	p += sprintf(p, "{" IX ",\"vectors\":[{\"key\":\"%s\",\"data\":{\"float32\":[",
		     rows[i].key);
	for (int j = 0; j < DIM; j++) {
		rows[i].v[j] = rnd(seed);
		p += sprintf(p, "%s%.3f", j ? "," : "", (double)rows[i].v[j]);
	}
	if (tenant >= 0)
		sprintf(p, "]},\"metadata\":{\"tenant\":\"t%d\",\"n\":%d}}]}", tenant, i);
	else
		sprintf(p, "]},\"metadata\":{\"n\":%d}}]}", i);
	json_decref(call("PutVectors", 200, "%s", body));
	/* the vector as the gateway read it from the text */
	char *q = strstr(body, "\"float32\":[") + 11;

	for (int j = 0; j < DIM; j++) {
		rows[i].v[j] = strtof(q, &q);
		q++;
	}
}

static void make_scoped(void)
{
	uint64_t seed = 42;

	json_decref(call("CreateVectorBucket", 200, "{" B "}"));
	json_decref(call("CreateIndex", 200, "{" IX ",\"dataType\":\"float32\",\"dimension\":%d,"
			 "\"distanceMetric\":\"euclidean\",\"tags\":{\"dmann:scope\":\"tenant\"}}",
			 DIM));
	for (int i = 0; i < NR; i++)
		put_row(i, i % 23 == 0 ? -1 : (int)((i * 7) % NT), &seed);
}

/* Every fragment holds the rows of one scope label, and the label is its rows'. */
struct fctx {
	uint64_t want;
	int bad;
};

static int frag_row(void *x, const struct flat_row *r)
{
	struct fctx *c = x;
	const char *v;
	uint32_t vl;
	uint64_t l = s3_scope_value(r->fmeta, r->fmeta_len, "tenant", &v, &vl) == 1 ?
		     s3_scope_label(v, vl) : 0;

	c->bad += l != c->want;
	return 0;
}

static int check_fragments(void)
{
	struct flat_index *ix = flat_index_get(store, "bkt", "idx");
	struct flat_frag_stat st[512];
	size_t n;
	static uint8_t dead[4096];
	int frags_of_t0 = 0;

	cr_assert_not_null(ix);
	n = flat_frag_stats(ix, st, 512);
	cr_assert_leq(n, 512);
	for (size_t f = 0; f < n; f++) {
		struct fctx c = { st[f].scope, 0 };

		cr_assert_geq(flat_frag_read(ix, f, 0, dead, sizeof(dead), frag_row, &c), 1);
		cr_assert_eq(c.bad, 0, "fragment %zu holds rows of another scope", f);
		frags_of_t0 += st[f].scope == s3_scope_label("t0", 2);
	}
	flat_index_put(ix);
	return frags_of_t0;
}

static float l2(const float *a, const float *b)
{
	float d = 0;

	for (int j = 0; j < DIM; j++)
		d += (a[j] - b[j]) * (a[j] - b[j]);
	return d;
}

/* Scoped queries of every tenant against the brute force over its live rows. */
static void check_queries(void)
{
	uint64_t seed = 7;

	for (int t = 0; t < NT; t++) {
		float q[DIM];
		char body[1024], *p = body;

		for (int j = 0; j < DIM; j++)
			q[j] = rnd(&seed);
		p += sprintf(p, "{" IX ",\"topK\":10,\"queryVector\":{\"float32\":[");
		for (int j = 0; j < DIM; j++)
			p += sprintf(p, "%s%.9g", j ? "," : "", (double)q[j]);
		sprintf(p, "]},\"filter\":{\"$and\":[{\"tenant\":{\"$eq\":\"t%d\"}},{\"n\":{"
			"\"$gte\":0}}]}}", t);
		json_t *o = call("QueryVectors", 200, "%s", body), *e;
		size_t i;
		/* the brute force: the 10 nearest live rows of tenant t */
		int best[10], nb = 0;

		for (int r = 0; r < NR; r++) {
			if (!rows[r].alive || rows[r].tenant != t)
				continue;
			if (nb < 10)
				best[nb++] = r;
			else if (l2(q, rows[r].v) < l2(q, rows[best[9]].v))
				best[9] = r;
			else
				continue;
			for (int a = nb - 1; a > 0 && l2(q, rows[best[a]].v) <
						     l2(q, rows[best[a - 1]].v); a--) {
				int tmp = best[a];

				best[a] = best[a - 1];
				best[a - 1] = tmp;
			}
		}
		cr_assert_eq(json_array_size(json_object_get(o, "vectors")), (size_t)nb);
		json_array_foreach(json_object_get(o, "vectors"), i, e)
			cr_assert_str_eq(json_string_value(json_object_get(e, "key")),
					 rows[best[i]].key, "tenant t%d, hit %zu: %s", t, i,
					 json_dumps(o, JSON_COMPACT));
		json_decref(o);
	}
}

Test(scope, fragments_per_scope_and_exact_scoped_queries)
{
	make_scoped();
	cr_assert_gt(check_fragments(), 1, "t0 spans several fragments");
	check_queries();
	/* an overwrite moving k1 (t7) to t3 tombstones the old row; a delete */
	uint64_t seed = 99;

	cr_assert_eq(rows[1].tenant, 7);
	put_row(1, 3, &seed);
	json_decref(call("DeleteVectors", 200, "{" IX ",\"keys\":[\"k2\",\"k3\"]}"));
	rows[2].alive = rows[3].alive = false;
	check_fragments();
	check_queries();
	json_t *o = call("GetVectors", 200, "{" IX ",\"keys\":[\"k1\"],\"returnMetadata\":true}");

	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(
		json_object_get(o, "vectors"), 0), "metadata"), "tenant")), "t3");
	json_decref(o);

	/* a clean restart (snapshot), then a crash (WAL replay) after more writes */
	s3_api_free(api);
	flat_close(store);
	open_all();
	check_fragments();
	check_queries();
	seed = 5;
	for (int i = 0; i < 40; i++)
		put_row(i, (i * 3) % NT, &seed);
	s3_api_free(api);
	flat_abandon(store);
	open_all();
	check_fragments();
	check_queries();
	uint64_t live, all, nf;
	struct flat_index *ix = flat_index_get(store, "bkt", "idx");

	flat_index_stats(ix, &live, &all, &nf);
	cr_assert_eq(live, NR, "k2 and k3 were put again");
	flat_index_put(ix);
}

/* ---------------------------------------------------------------- writers ---------- */

struct wctx {
	struct flat_index *ix;
	int id;
};

static void *writer(void *x)
{
	struct wctx *w = x;
	uint64_t seed = (uint64_t)w->id * 31 + 1;

	for (int b = 0; b < 40; b++) {
		struct flat_row_in in[5];
		char keys[5][24];
		float v[5][DIM];
		char *js[5];
		uint8_t *fm[5];

		for (int i = 0; i < 5; i++) {
			char meta[64];
			size_t jl, fl;
			json_t *m;

			snprintf(keys[i], sizeof(keys[i]), "w%d-%d", w->id, (b * 5 + i) % 150);
			for (int j = 0; j < DIM; j++)
				v[i][j] = rnd(&seed);
			snprintf(meta, sizeof(meta), "{\"tenant\":\"t%u\"}",
				 (unsigned)(rnd(&seed) + 10.0f) % 7);
			m = json_loads(meta, 0, NULL);
			cr_assert_eq(s3_meta_encode(m, NULL, 0, &js[i], &jl, &fm[i], &fl, NULL, 0),
				     0);
			json_decref(m);
			in[i] = (struct flat_row_in){ keys[i], v[i], js[i], (uint32_t)jl, fm[i],
						      (uint32_t)fl };
		}
		cr_assert_eq(flat_put(w->ix, in, 5), 0);
		for (int i = 0; i < 5; i++) {
			free(js[i]);
			free(fm[i]);
		}
	}
	return NULL;
}

Test(scope, concurrent_writers_and_a_failed_reservation)
{
	json_decref(call("CreateVectorBucket", 200, "{" B "}"));
	json_decref(call("CreateIndex", 200, "{" IX ",\"dataType\":\"float32\",\"dimension\":%d,"
			 "\"distanceMetric\":\"euclidean\",\"tags\":{\"dmann:scope\":\"tenant\"}}",
			 DIM));
	struct flat_index *ix = flat_index_get(store, "bkt", "idx");
	pthread_t th[4];
	struct wctx w[4];

	for (int i = 0; i < 4; i++) {
		w[i] = (struct wctx){ ix, i };
		cr_assert_eq(pthread_create(&th[i], NULL, writer, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	/* reservations that fail at every allocation point, then writes go on */
	float v[DIM] = { 1 };
	struct flat_row_in r = { "fault", v, "{}", 2, "", 0 };

	for (int at = 1; at <= 8; at++) {
		struct wctx one = { ix, 10 + at };
		int rc;

		flat_fault_alloc = at;
		rc = flat_put(ix, &r, 1);
		flat_fault_alloc = 0;
		cr_assert(rc == 0 || rc == -ENOMEM);
		writer(&one);
	}
	cr_assert_eq(flat_put(ix, &r, 1), 0);
	uint64_t live, all, nf;

	flat_index_stats(ix, &live, &all, &nf);
	cr_assert_eq(live, 4 * 150 + 8 * 150 + 1, "every key once");
	flat_index_put(ix);
	check_fragments();
	s3_api_free(api);
	flat_abandon(store);
	open_all();
	check_fragments();
	ix = flat_index_get(store, "bkt", "idx");
	flat_index_stats(ix, &live, &all, &nf);
	cr_assert_eq(live, 4 * 150 + 8 * 150 + 1);
	flat_index_put(ix);
}

/* A scoped index's fragments start small and grow with their rows. */
Test(scope, fragments_grow_with_their_rows)
{
	struct flat_opts o = { .frag_rows = 1024, .scope = &s3_scope_ops };
	uint64_t seed = 3;

	s3_api_free(api);
	flat_close(store);
	store = flat_open(tdir, &o);
	cr_assert_not_null(store);
	api = s3_api_new(store, "us-east-1", "123456789012");
	make_scoped();              /* 400 rows over 10 tenants + none: ~37 per fragment */
	struct flat_index *ix = flat_index_get(store, "bkt", "idx");

	cr_assert_not_null(ix);
	cr_assert_eq(ix->nfrags, NT + 1, "one fragment per scope value and one without");
	for (size_t f = 0; f < ix->nfrags; f++)
		cr_assert(ix->frags[f]->alloc >= ix->frags[f]->n && ix->frags[f]->alloc <= 64,
			  "fragment %zu: room for %u rows for %u", f, ix->frags[f]->alloc,
			  ix->frags[f]->n);
	flat_index_put(ix);
	for (int i = 0; i < 300; i++)
		put_row(i, 4, &seed);    /* t4 grows past 256 rows */
	ix = flat_index_get(store, "bkt", "idx");
	for (size_t f = 0; f < ix->nfrags; f++) {
		const struct flat_frag *fr = ix->frags[f];

		cr_assert(fr->alloc >= fr->n && fr->alloc <= DM_MAX(16u, 2 * fr->n),
			  "fragment %zu: room for %u rows for %u", f, fr->alloc, fr->n);
	}
	flat_index_put(ix);
	check_fragments();
	check_queries();
}
