/* s3_policy.c: parser, validator and evaluator of S3 Vectors bucket policies (rules in
 * s3_policy.h). A parsed policy is a list of statements, each with its lists of principal,
 * action and resource patterns copied out of the JSON. */
#include "s3_policy.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#define MAX_STATEMENTS 100
#define MAX_ITEMS 100

struct strlist {
	char **v;
	size_t n;
};

struct stmt {
	bool deny;
	bool not_action, not_resource;
	struct strlist principals, actions, resources;
};

struct s3p_policy {
	struct stmt *st;
	size_t n;
};

static int bad(char *msg, size_t msglen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int bad(char *msg, size_t msglen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, msglen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static void strlist_free(struct strlist *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* A string or a non-empty array of strings into l. */
static int strlist_take(json_t *v, const char *what, struct strlist *l, char *msg,
			size_t msglen)
{
	size_t n = json_is_array(v) ? json_array_size(v) : 1;

	if (!json_is_string(v) && !json_is_array(v))
		return bad(msg, msglen, "%s must be a string or an array of strings", what);
	if (n == 0 || n > MAX_ITEMS)
		return bad(msg, msglen, "%s must list 1 to %d values", what, MAX_ITEMS);
	l->v = calloc(n, sizeof(*l->v));
	if (!l->v)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_is_array(v) ? json_array_get(v, i) : v;

		if (!json_is_string(e) || !json_string_length(e) ||
		    strlen(json_string_value(e)) != json_string_length(e))
			return bad(msg, msglen, "%s must hold non-empty strings", what);
		l->v[i] = strdup(json_string_value(e));
		if (!l->v[i])
			return -ENOMEM;
		l->n++;
	}
	return 0;
}

/* strlist_take, then every value checked by ok (the refusal names the value and hint). */
static int strlist_take_valid(json_t *v, const char *what, struct strlist *l,
			      bool (*ok)(const char *), const char *hint, char *msg,
			      size_t msglen)
{
	int rc = strlist_take(v, what, l, msg, msglen);

	if (rc)
		return rc;
	for (size_t i = 0; i < l->n; i++)
		if (!ok(l->v[i]))
			return bad(msg, msglen, "invalid %s '%s' (%s)", what, l->v[i], hint);
	return 0;
}

static bool valid_action(const char *a)
{
	if (!strcmp(a, "*"))
		return true;
	if (strncasecmp(a, "s3vectors:", 10) || !a[10])
		return false;
	for (const char *p = a + 10; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '*' && *p != '?')
			return false;
	return true;
}

static bool valid_resource(const char *r)
{
	return !strcmp(r, "*") || !strncmp(r, "arn:", 4);
}

static bool valid_principal(const char *p)
{
	size_t n = strlen(p);

	if (!strcmp(p, "*") || !strncmp(p, "arn:aws:iam::", 13))
		return true;
	if (n != 12)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isdigit((unsigned char)p[i]))
			return false;
	return true;
}

static int parse_principal(json_t *v, struct stmt *st, char *msg, size_t msglen)
{
	json_t *aws;
	const char *k;
	json_t *e;

	if (!v)
		return bad(msg, msglen, "every statement needs a Principal");
	if (json_is_string(v)) {
		if (strcmp(json_string_value(v), "*"))
			return bad(msg, msglen, "Principal must be \"*\" or {\"AWS\": ...}");
		return strlist_take(v, "Principal", &st->principals, msg, msglen);
	}
	if (!json_is_object(v))
		return bad(msg, msglen, "Principal must be \"*\" or {\"AWS\": ...}");
	json_object_foreach(v, k, e)
		if (strcmp(k, "AWS"))
			return bad(msg, msglen, "unsupported principal type '%s' (only AWS)", k);
	aws = json_object_get(v, "AWS");
	if (!aws)
		return bad(msg, msglen, "Principal needs an AWS member");
	return strlist_take_valid(aws, "principal", &st->principals, valid_principal,
				  "\"*\", an account id or an arn:aws:iam:: ARN", msg, msglen);
}

/* Exactly one of NAME and NotNAME (e.g. Action / NotAction) into l; *negated: NotNAME. */
static int take_either(json_t *o, const char *name, bool *negated, struct strlist *l,
		       bool (*ok)(const char *), const char *hint, char *msg, size_t msglen)
{
	char notname[32], what[32];
	json_t *yes = json_object_get(o, name), *no;

	snprintf(notname, sizeof(notname), "Not%s", name);
	no = json_object_get(o, notname);
	if (!yes == !no)
		return bad(msg, msglen, "a statement needs exactly one of %s and %s", name, notname);
	*negated = !yes;
	snprintf(what, sizeof(what), "%c%s", name[0] - 'A' + 'a', name + 1);
	return strlist_take_valid(yes ? yes : no, what, l, ok, hint, msg, msglen);
}

static int parse_stmt(json_t *o, struct stmt *st, char *msg, size_t msglen)
{
	static const char *const known[] = { "Sid", "Effect", "Principal", "Action",
		"NotAction", "Resource", "NotResource" };
	json_t *eff, *e;
	const char *k;
	int rc;

	if (!json_is_object(o))
		return bad(msg, msglen, "a Statement must be an object");
	json_object_foreach(o, k, e) {
		bool ok = false;

		for (size_t i = 0; i < DM_ARRAY_SIZE(known); i++)
			ok |= !strcmp(k, known[i]);
		if (!ok)
			return bad(msg, msglen, "unsupported statement member '%s'", k);
	}
	e = json_object_get(o, "Sid");
	if (e && !json_is_string(e))
		return bad(msg, msglen, "Sid must be a string");
	eff = json_object_get(o, "Effect");
	if (!json_is_string(eff) || (strcmp(json_string_value(eff), "Allow") &&
				     strcmp(json_string_value(eff), "Deny")))
		return bad(msg, msglen, "Effect must be Allow or Deny");
	st->deny = !strcmp(json_string_value(eff), "Deny");
	rc = parse_principal(json_object_get(o, "Principal"), st, msg, msglen);
	if (rc)
		return rc;
	rc = take_either(o, "Action", &st->not_action, &st->actions, valid_action,
			 "\"*\" or s3vectors:<Operation>, wildcards * and ? allowed", msg, msglen);
	if (rc)
		return rc;
	return take_either(o, "Resource", &st->not_resource, &st->resources, valid_resource,
			   "\"*\" or an ARN", msg, msglen);
}

void s3p_free(struct s3p_policy *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++) {
		strlist_free(&p->st[i].principals);
		strlist_free(&p->st[i].actions);
		strlist_free(&p->st[i].resources);
	}
	free(p->st);
	free(p);
}

struct s3p_policy *s3p_parse(const char *text, size_t len, char *msg, size_t msglen)
{
	json_error_t je;
	json_t *o = NULL, *sts, *v;
	const char *k;
	struct s3p_policy *p = NULL;
	size_t n;
	int rc = -EINVAL;

	msg[0] = 0;
	if (!text || !len) {
		bad(msg, msglen, "the policy is empty");
		goto err;
	}
	if (len > S3P_MAX_BYTES) {
		bad(msg, msglen, "the policy exceeds %u bytes", S3P_MAX_BYTES);
		goto err;
	}
	o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!o) {
		bad(msg, msglen, "the policy is not valid JSON: %s", je.text);
		goto err;
	}
	if (!json_is_object(o)) {
		bad(msg, msglen, "the policy must be a JSON object");
		goto err_decref_o;
	}
	json_object_foreach(o, k, v) {
		if (strcmp(k, "Version") && strcmp(k, "Id") && strcmp(k, "Statement")) {
			bad(msg, msglen, "unsupported policy member '%s'", k);
			goto err_decref_o;
		}
	}
	v = json_object_get(o, "Version");
	if (v && (!json_is_string(v) || (strcmp(json_string_value(v), "2012-10-17") &&
					 strcmp(json_string_value(v), "2008-10-17")))) {
		bad(msg, msglen, "Version must be 2012-10-17 or 2008-10-17");
		goto err_decref_o;
	}
	v = json_object_get(o, "Id");
	if (v && !json_is_string(v)) {
		bad(msg, msglen, "Id must be a string");
		goto err_decref_o;
	}
	sts = json_object_get(o, "Statement");
	if (!sts) {
		bad(msg, msglen, "the policy needs a Statement");
		goto err_decref_o;
	}
	n = json_is_array(sts) ? json_array_size(sts) : 1;
	if (n == 0 || n > MAX_STATEMENTS) {
		bad(msg, msglen, "a policy holds 1 to %d statements", MAX_STATEMENTS);
		goto err_decref_o;
	}
	p = calloc(1, sizeof(*p));
	if (!p || !(p->st = calloc(n, sizeof(*p->st)))) {
		rc = -ENOMEM;
		goto err_free_p;
	}
	for (size_t i = 0; i < n; i++) {
		p->n++;
		rc = parse_stmt(json_is_array(sts) ? json_array_get(sts, i) : sts, &p->st[i], msg,
				msglen);
		if (rc)
			goto err_free_p;
	}
	json_decref(o);
	return p;

err_free_p:
	s3p_free(p);
err_decref_o:
	json_decref(o);
err:
	if (rc == -ENOMEM)
		bad(msg, msglen, "out of memory");
	errno = -rc;
	return NULL;
}

bool s3p_match(const char *pat, const char *s, bool nocase)
{
	const char *star = NULL, *resume = NULL;

	while (*s) {
		char pc = nocase ? (char)tolower((unsigned char)*pat) : *pat;
		char sc = nocase ? (char)tolower((unsigned char)*s) : *s;

		if (*pat == '*') {
			star = pat++;
			resume = s;
		} else if (*pat && (*pat == '?' || pc == sc)) {
			pat++;
			s++;
		} else if (star) {
			pat = star + 1;
			s = ++resume;
		} else {
			return false;
		}
	}
	while (*pat == '*')
		pat++;
	return !*pat;
}

/* An account id out of arn:aws:iam::ACCOUNT:... (into acct[13]); false if not one. */
static bool arn_account(const char *arn, char *acct)
{
	const char *p = arn + 13, *e;

	if (strncmp(arn, "arn:aws:iam::", 13) || !(e = strchr(p, ':')) || e - p != 12)
		return false;
	memcpy(acct, p, 12);
	acct[12] = 0;
	return true;
}

static bool principal_match(const struct strlist *l, const char *who)
{
	char acct[13] = "", pacct[13];
	bool have = arn_account(who, acct);

	for (size_t i = 0; i < l->n; i++) {
		const char *p = l->v[i];

		if (!strcmp(p, "*") || !strcmp(p, who))
			return true;
		if (have && strlen(p) == 12 && !strcmp(p, acct))
			return true;
		if (have && arn_account(p, pacct) && !strcmp(pacct, acct) &&
		    !strcmp(p + 13 + 12, ":root"))
			return true;
	}
	return false;
}

static bool any_match(const struct strlist *l, const char *s, bool nocase)
{
	for (size_t i = 0; i < l->n; i++)
		if (s3p_match(l->v[i], s, nocase))
			return true;
	return false;
}

enum s3p_decision s3p_eval(const struct s3p_policy *p, const char *principal,
			   const char *action, const char *resource)
{
	bool allow = false;

	if (!p)
		return S3P_IMPLICIT;
	for (size_t i = 0; i < p->n; i++) {
		const struct stmt *st = &p->st[i];

		if (!principal_match(&st->principals, principal))
			continue;
		if (any_match(&st->actions, action, true) == st->not_action)
			continue;
		if (any_match(&st->resources, resource, false) == st->not_resource)
			continue;
		if (st->deny)
			return S3P_DENY;
		allow = true;
	}
	return allow ? S3P_ALLOW : S3P_IMPLICIT;
}
