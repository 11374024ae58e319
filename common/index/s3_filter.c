/* s3_filter.c: metadata validation/encoding and the metadata filter parser + evaluator
 * (see s3_filter.h).
 *
 * fmeta encoding: a sequence of entries  u16 key_len | key | value, where a value is
 * u8 type | payload:  STR: u32 len + bytes; NUM: f64; BOOL: u8; LIST: u32 count + values
 * (primitives only). */
#include "s3_filter.h"
#include "util/dm_buf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T_STR = 1, T_NUM = 2, T_BOOL = 3, T_LIST = 4 };

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static bool nonfilterable(const char *key, const char *const *nf, size_t nnf)
{
	for (size_t i = 0; i < nnf; i++)
		if (!strcmp(nf[i], key))
			return true;
	return false;
}

/* ---------------------------------------------------------------- encoding --------- */

static void eprim(struct dm_buf *b, const json_t *v)
{
	uint8_t t;

	if (json_is_string(v)) {
		uint32_t l = (uint32_t)json_string_length(v);

		t = T_STR;
		dm_buf_put(b, &t, 1);
		dm_buf_put(b, &l, 4);
		dm_buf_put(b, json_string_value(v), l);
	} else if (json_is_number(v)) {
		double d = json_number_value(v);

		t = T_NUM;
		dm_buf_put(b, &t, 1);
		dm_buf_put(b, &d, 8);
	} else {
		uint8_t x = json_is_true(v);

		t = T_BOOL;
		dm_buf_put(b, &t, 1);
		dm_buf_put(b, &x, 1);
	}
}

static bool is_prim(const json_t *v)
{
	return json_is_string(v) || json_is_number(v) || json_is_boolean(v);
}

int s3_meta_encode(const json_t *meta, const char *const *nonfilter, size_t nnf,
		   char **json, size_t *json_len, uint8_t **fmeta, size_t *fmeta_len,
		   char *err, size_t errlen)
{
	struct dm_buf b = { 0 };
	json_t *filt = NULL;
	const char *key;
	json_t *v;
	char *txt = NULL, *ftxt = NULL;
	size_t tl;
	int rc = -EINVAL;

	*json = NULL;
	*json_len = 0;
	*fmeta = NULL;
	*fmeta_len = 0;
	if (!meta)
		return 0;
	if (!json_is_object(meta)) {
		seterr(err, errlen, "metadata must be a JSON object");
		return -EINVAL;
	}
	if (json_object_size(meta) > S3_META_MAX_KEYS) {
		seterr(err, errlen, "metadata has %zu keys, at most %d are allowed",
		       json_object_size(meta), S3_META_MAX_KEYS);
		return -EINVAL;
	}
	filt = json_object();
	if (!filt)
		return -ENOMEM;
	json_object_foreach((json_t *)meta, key, v) {
		size_t kl = strlen(key);

		if (!kl) {
			seterr(err, errlen, "metadata keys must not be empty");
			goto out;
		}
		if (json_is_array(v)) {
			size_t i;
			json_t *e;

			json_array_foreach(v, i, e) {
				if (!is_prim(e)) {
					seterr(err, errlen, "metadata key '%s': list elements must "
					       "be strings, numbers or booleans", key);
					goto out;
				}
			}
		} else if (!is_prim(v)) {
			seterr(err, errlen, "metadata key '%s': values must be strings, numbers, "
			       "booleans or lists of them", key);
			goto out;
		}
		if (json_is_real(v) && !isfinite(json_real_value(v))) {
			seterr(err, errlen, "metadata key '%s': number is not finite", key);
			goto out;
		}
		if (nonfilterable(key, nonfilter, nnf))
			continue;
		json_object_set((json_t *)filt, key, v);
		{
			uint16_t k16 = (uint16_t)kl;

			if (kl > UINT16_MAX) {
				seterr(err, errlen, "metadata key too long");
				goto out;
			}
			dm_buf_put(&b, &k16, 2);
			dm_buf_put(&b, key, kl);
		}
		if (json_is_array(v)) {
			uint8_t t = T_LIST;
			uint32_t cnt = (uint32_t)json_array_size(v);
			size_t i;
			json_t *e;

			dm_buf_put(&b, &t, 1);
			dm_buf_put(&b, &cnt, 4);
			json_array_foreach(v, i, e)
				eprim(&b, e);
		} else {
			eprim(&b, v);
		}
	}
	txt = json_dumps(meta, JSON_COMPACT | JSON_ENCODE_ANY);
	ftxt = json_dumps(filt, JSON_COMPACT);
	if (!txt || !ftxt || b.oom) {
		rc = -ENOMEM;
		goto out;
	}
	tl = strlen(txt);
	if (tl > S3_META_MAX_BYTES) {
		seterr(err, errlen, "metadata is %zu bytes, at most %d are allowed", tl,
		       S3_META_MAX_BYTES);
		goto out;
	}
	if (strlen(ftxt) > S3_META_MAX_FILTERABLE) {
		seterr(err, errlen, "filterable metadata is %zu bytes, at most %d are allowed",
		       strlen(ftxt), S3_META_MAX_FILTERABLE);
		goto out;
	}
	*json = txt;
	*json_len = tl;
	txt = NULL;
	*fmeta = b.p;
	*fmeta_len = b.n;
	b.p = NULL;
	rc = 0;
out:
	free(txt);
	free(ftxt);
	dm_buf_free(&b);
	json_decref(filt);
	return rc;
}

/* ---------------------------------------------------------------- decoding --------- */

/* Size of the value at p (type byte included), 0 if malformed; lists only at top level. */
static size_t val_size(const uint8_t *p, size_t n, bool allow_list)
{
	uint32_t l;

	if (n < 1)
		return 0;
	switch (p[0]) {
	case T_STR:
		if (n < 5)
			return 0;
		memcpy(&l, p + 1, 4);
		return (size_t)l <= n - 5 ? 5 + (size_t)l : 0;
	case T_NUM:
		return n >= 9 ? 9 : 0;
	case T_BOOL:
		return n >= 2 ? 2 : 0;
	case T_LIST: {
		size_t off = 5;

		if (!allow_list || n < 5)
			return 0;
		memcpy(&l, p + 1, 4);
		for (uint32_t i = 0; i < l; i++) {
			size_t s = val_size(p + off, n - off, false);

			if (!s)
				return 0;
			off += s;
		}
		return off;
	}
	default:
		return 0;
	}
}

/* Find key in fmeta: pointer to its value (type byte), NULL if absent; *bad on a malformed
 * encoding. */
static const uint8_t *fm_find(const uint8_t *p, size_t n, const char *key, size_t kl,
			      size_t *vlen, bool *bad)
{
	size_t off = 0;

	*bad = false;
	while (off < n) {
		uint16_t l;
		size_t s;

		if (n - off < 2) {
			*bad = true;
			return NULL;
		}
		memcpy(&l, p + off, 2);
		off += 2;
		if (n - off < l) {
			*bad = true;
			return NULL;
		}
		const uint8_t *k = p + off;

		off += l;
		s = val_size(p + off, n - off, true);
		if (!s) {
			*bad = true;
			return NULL;
		}
		if (l == kl && !memcmp(k, key, kl)) {
			*vlen = s;
			return p + off;
		}
		off += s;
	}
	return NULL;
}

int s3_fmeta_string(const void *fmeta, size_t len, const char *key, const char **val,
		    uint32_t *vlen)
{
	size_t n = 0;
	bool bad;
	const uint8_t *v = fm_find(fmeta, len, key, strlen(key), &n, &bad);

	*val = NULL;
	*vlen = 0;
	if (bad)
		return -EINVAL;
	if (!v)
		return 0;
	if (v[0] != T_STR)
		return -EINVAL;
	memcpy(vlen, v + 1, 4);
	*val = (const char *)v + 5;
	return 1;
}

static json_t *prim_to_json(const uint8_t *p)
{
	uint32_t l;
	double d;

	switch (p[0]) {
	case T_STR:
		memcpy(&l, p + 1, 4);
		return json_stringn((const char *)p + 5, l);
	case T_NUM:
		memcpy(&d, p + 1, 8);
		return json_real(d);
	default:
		return json_boolean(p[1]);
	}
}

json_t *s3_fmeta_to_json(const void *fmeta, size_t n)
{
	const uint8_t *p = fmeta;
	size_t off = 0;
	json_t *o = json_object();

	while (o && off < n) {
		uint16_t l;
		size_t s;
		char *k;
		json_t *v;

		if (n - off < 2)
			goto err;
		memcpy(&l, p + off, 2);
		off += 2;
		if (n - off < l)
			goto err;
		k = strndup((const char *)p + off, l);
		off += l;
		s = val_size(p + off, n - off, true);
		if (!k || !s) {
			free(k);
			goto err;
		}
		if (p[off] == T_LIST) {
			uint32_t cnt;
			size_t e = off + 5;

			memcpy(&cnt, p + off + 1, 4);
			v = json_array();
			for (uint32_t i = 0; i < cnt; i++) {
				json_array_append_new(v, prim_to_json(p + e));
				e += val_size(p + e, n - e, false);
			}
		} else {
			v = prim_to_json(p + off);
		}
		json_object_set_new(o, k, v);
		free(k);
		off += s;
	}
	return o;
err:
	json_decref(o);
	return NULL;
}

/* ---------------------------------------------------------------- filters ---------- */

enum fop { F_AND, F_OR, F_EQ, F_NE, F_GT, F_GTE, F_LT, F_LTE, F_IN, F_NIN, F_EXISTS };

struct fval {
	uint8_t type;
	bool b;
	double num;
	char *s;
	size_t slen;
};

struct fnode {
	enum fop op;
	char *key;
	size_t klen;
	struct fnode **kids;
	size_t nkids;
	struct fval *vals;
	size_t nvals;
	bool exists;
};

struct s3_filter {
	struct fnode *root;
};

struct pctx {
	const char *const *nf;
	size_t nnf;
	char *err;
	size_t errlen;
	size_t nodes;
	bool oom;
};

static void fnode_free(struct fnode *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->nkids; i++)
		fnode_free(n->kids[i]);
	for (size_t i = 0; i < n->nvals; i++)
		free(n->vals[i].s);
	free(n->kids);
	free(n->vals);
	free(n->key);
	free(n);
}

void s3_filter_free(struct s3_filter *f)
{
	if (!f)
		return;
	fnode_free(f->root);
	free(f);
}

static struct fnode *fnode_new(struct pctx *c, enum fop op)
{
	struct fnode *n;

	if (++c->nodes > S3_FILTER_MAX_NODES) {
		seterr(c->err, c->errlen, "filter has more than %d terms", S3_FILTER_MAX_NODES);
		return NULL;
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		c->oom = true;
	else
		n->op = op;
	return n;
}

static bool add_kid(struct pctx *c, struct fnode *p, struct fnode *k)
{
	struct fnode **nk = realloc(p->kids, (p->nkids + 1) * sizeof(*nk));

	if (!nk) {
		c->oom = true;
		fnode_free(k);
		return false;
	}
	p->kids = nk;
	p->kids[p->nkids++] = k;
	return true;
}

static bool set_val(struct pctx *c, struct fval *fv, const json_t *v)
{
	memset(fv, 0, sizeof(*fv));
	if (json_is_string(v)) {
		fv->type = T_STR;
		fv->slen = json_string_length(v);
		fv->s = malloc(fv->slen + 1);
		if (!fv->s) {
			c->oom = true;
			return false;
		}
		memcpy(fv->s, json_string_value(v), fv->slen + 1);
	} else if (json_is_number(v)) {
		fv->type = T_NUM;
		fv->num = json_number_value(v);
	} else {
		fv->type = T_BOOL;
		fv->b = json_is_true(v);
	}
	return true;
}

static const struct { const char *name; enum fop op; } ops[] = {
	{ "$eq", F_EQ }, { "$ne", F_NE }, { "$gt", F_GT }, { "$gte", F_GTE }, { "$lt", F_LT },
	{ "$lte", F_LTE }, { "$in", F_IN }, { "$nin", F_NIN }, { "$exists", F_EXISTS },
};

/* One operator on a field. */
static struct fnode *parse_op(struct pctx *c, const char *key, const char *opname,
			      const json_t *arg)
{
	struct fnode *n;
	enum fop op = F_AND;
	bool found = false;

	for (size_t i = 0; i < DM_ARRAY_SIZE(ops); i++)
		if (!strcmp(ops[i].name, opname)) {
			op = ops[i].op;
			found = true;
		}
	if (!found) {
		seterr(c->err, c->errlen, "unknown filter operator '%s' on key '%s'", opname, key);
		return NULL;
	}
	n = fnode_new(c, op);
	if (!n)
		return NULL;
	n->key = strdup(key);
	n->klen = strlen(key);
	if (!n->key) {
		c->oom = true;
		goto err_free_node;
	}
	switch (op) {
	case F_EQ:
	case F_NE:
		if (!is_prim(arg)) {
			seterr(c->err, c->errlen, "%s on '%s' needs a string, number or boolean",
			       opname, key);
			goto err_free_node;
		}
		n->vals = calloc(1, sizeof(*n->vals));
		if (!n->vals || !set_val(c, n->vals, arg)) {
			c->oom = true;
			goto err_free_node;
		}
		n->nvals = 1;
		break;
	case F_GT:
	case F_GTE:
	case F_LT:
	case F_LTE:
		if (!json_is_number(arg)) {
			seterr(c->err, c->errlen, "%s on '%s' needs a number", opname, key);
			goto err_free_node;
		}
		n->vals = calloc(1, sizeof(*n->vals));
		if (!n->vals) {
			c->oom = true;
			goto err_free_node;
		}
		set_val(c, n->vals, arg);
		n->nvals = 1;
		break;
	case F_IN:
	case F_NIN: {
		size_t i;
		json_t *e;

		if (!json_is_array(arg) || !json_array_size(arg)) {
			seterr(c->err, c->errlen, "%s on '%s' needs a non-empty array", opname, key);
			goto err_free_node;
		}
		if (json_array_size(arg) > S3_FILTER_MAX_NODES) {
			seterr(c->err, c->errlen, "%s on '%s': too many values", opname, key);
			goto err_free_node;
		}
		n->vals = calloc(json_array_size(arg), sizeof(*n->vals));
		if (!n->vals) {
			c->oom = true;
			goto err_free_node;
		}
		json_array_foreach(arg, i, e) {
			if (!is_prim(e)) {
				seterr(c->err, c->errlen, "%s on '%s': values must be strings, "
				       "numbers or booleans", opname, key);
				goto err_free_node;
			}
			if (!set_val(c, &n->vals[i], e))
				goto err_free_node;
			n->nvals = i + 1;
		}
		break;
	}
	default:
		if (!json_is_boolean(arg)) {
			seterr(c->err, c->errlen, "$exists on '%s' needs a boolean", key);
			goto err_free_node;
		}
		n->exists = json_is_true(arg);
		break;
	}
	return n;

err_free_node:
	fnode_free(n);
	return NULL;
}

static struct fnode *parse_obj(struct pctx *c, const json_t *f, int depth);

/* $and / $or: a non-empty array of filter objects. */
static struct fnode *parse_logic(struct pctx *c, enum fop op, const char *name,
				 const json_t *arr, int depth)
{
	struct fnode *n;
	size_t i;
	json_t *e;

	if (!json_is_array(arr) || !json_array_size(arr)) {
		seterr(c->err, c->errlen, "%s needs a non-empty array of filters", name);
		return NULL;
	}
	n = fnode_new(c, op);
	if (!n)
		return NULL;
	json_array_foreach(arr, i, e) {
		struct fnode *k = parse_obj(c, e, depth + 1);

		if (!k || !add_kid(c, n, k)) {
			fnode_free(n);
			return NULL;
		}
	}
	return n;
}

/* A filter object: every entry is ANDed. */
static struct fnode *parse_obj(struct pctx *c, const json_t *f, int depth)
{
	struct fnode *all, *k;
	const char *key;
	json_t *v;

	if (depth > S3_FILTER_MAX_DEPTH) {
		seterr(c->err, c->errlen, "filter nests deeper than %d", S3_FILTER_MAX_DEPTH);
		return NULL;
	}
	if (!json_is_object(f) || !json_object_size(f)) {
		seterr(c->err, c->errlen, "a filter must be a non-empty JSON object");
		return NULL;
	}
	all = fnode_new(c, F_AND);
	if (!all)
		return NULL;
	json_object_foreach((json_t *)f, key, v) {
		if (key[0] == '$') {
			if (!strcmp(key, "$and"))
				k = parse_logic(c, F_AND, key, v, depth);
			else if (!strcmp(key, "$or"))
				k = parse_logic(c, F_OR, key, v, depth);
			else {
				seterr(c->err, c->errlen, "unknown filter operator '%s' at the top "
				       "level (only $and, $or)", key);
				k = NULL;
			}
			if (!k || !add_kid(c, all, k))
				goto err_free_all;
			continue;
		}
		if (!key[0]) {
			seterr(c->err, c->errlen, "filter keys must not be empty");
			goto err_free_all;
		}
		if (nonfilterable(key, c->nf, c->nnf)) {
			seterr(c->err, c->errlen, "metadata key '%s' is non-filterable for this "
			       "index", key);
			goto err_free_all;
		}
		if (json_is_object(v)) {
			const char *op;
			json_t *arg;

			if (!json_object_size(v)) {
				seterr(c->err, c->errlen, "empty operator object for key '%s'", key);
				goto err_free_all;
			}
			json_object_foreach(v, op, arg) {
				k = parse_op(c, key, op, arg);
				if (!k || !add_kid(c, all, k))
					goto err_free_all;
			}
		} else {
			k = parse_op(c, key, "$eq", v);
			if (!k || !add_kid(c, all, k))
				goto err_free_all;
		}
	}
	/* A single condition needs no AND wrapper. */
	if (all->nkids == 1) {
		k = all->kids[0];
		all->nkids = 0;
		fnode_free(all);
		return k;
	}
	return all;

err_free_all:
	fnode_free(all);
	return NULL;
}

struct s3_filter *s3_filter_parse(const json_t *f, const char *const *nonfilter, size_t nnf,
				  char *err, size_t errlen)
{
	struct pctx c = { .nf = nonfilter, .nnf = nnf, .err = err, .errlen = errlen };
	struct s3_filter *sf;
	struct fnode *root;

	if (err && errlen)
		err[0] = 0;
	root = parse_obj(&c, f, 0);
	if (!root) {
		errno = c.oom ? ENOMEM : EINVAL;
		if (c.oom)
			seterr(err, errlen, "out of memory");
		return NULL;
	}
	sf = malloc(sizeof(*sf));
	if (!sf) {
		fnode_free(root);
		errno = ENOMEM;
		return NULL;
	}
	sf->root = root;
	return sf;
}

/* ---------------------------------------------------------------- evaluation ------- */

static bool prim_eq(const struct fval *fv, const uint8_t *p)
{
	uint32_t l;
	double d;

	if (p[0] != fv->type)
		return false;
	switch (p[0]) {
	case T_STR:
		memcpy(&l, p + 1, 4);
		return l == fv->slen && !memcmp(p + 5, fv->s, l);
	case T_NUM:
		memcpy(&d, p + 1, 8);
		return d == fv->num;
	default:
		return (p[1] != 0) == fv->b;
	}
}

static bool prim_cmp(enum fop op, double x, const uint8_t *p)
{
	double d;

	if (p[0] != T_NUM)
		return false;
	memcpy(&d, p + 1, 8);
	switch (op) {
	case F_GT:
		return d > x;
	case F_GTE:
		return d >= x;
	case F_LT:
		return d < x;
	default:
		return d <= x;
	}
}

/* Does any of the field's values (one, or each list element) satisfy the predicate? */
static bool any_value(const struct fnode *n, const uint8_t *v, size_t vlen)
{
	const uint8_t *p = v;
	uint32_t cnt = 1;
	size_t off = 0;

	if (v[0] == T_LIST) {
		memcpy(&cnt, v + 1, 4);
		off = 5;
	}
	for (uint32_t i = 0; i < cnt; i++) {
		size_t s;

		p = v + off;
		if (v[0] != T_LIST)
			p = v;
		s = val_size(p, vlen - off, false);
		if (!s)
			return false;
		switch (n->op) {
		case F_EQ:
		case F_NE:
			if (prim_eq(&n->vals[0], p))
				return true;
			break;
		case F_IN:
		case F_NIN:
			for (size_t j = 0; j < n->nvals; j++)
				if (prim_eq(&n->vals[j], p))
					return true;
			break;
		default:
			if (prim_cmp(n->op, n->vals[0].num, p))
				return true;
			break;
		}
		off += s;
	}
	return false;
}

static bool eval(const struct fnode *n, const uint8_t *fm, size_t len)
{
	const uint8_t *v;
	size_t vlen = 0;
	bool bad;

	switch (n->op) {
	case F_AND:
		for (size_t i = 0; i < n->nkids; i++)
			if (!eval(n->kids[i], fm, len))
				return false;
		return true;
	case F_OR:
		for (size_t i = 0; i < n->nkids; i++)
			if (eval(n->kids[i], fm, len))
				return true;
		return false;
	default:
		break;
	}
	v = fm_find(fm, len, n->key, n->klen, &vlen, &bad);
	if (bad)
		return false;
	switch (n->op) {
	case F_EXISTS:
		return (v != NULL) == n->exists;
	case F_NE:
	case F_NIN:
		return !v || !any_value(n, v, vlen);
	default:
		return v && any_value(n, v, vlen);
	}
}

bool s3_filter_match(const struct s3_filter *f, const void *fmeta, size_t len)
{
	if (!f)
		return true;
	return eval(f->root, fmeta ? fmeta : "", fmeta ? len : 0);
}
