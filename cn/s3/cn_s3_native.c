/* cn_s3_native.c: one S3 Vectors operation for the native client protocol (C_CALL,
 * wire.h): the same backend functions the HTTP front end calls after SigV4 (be_handle,
 * be_query), with the AWS error type folded into the JSON body as "__type" (HTTP carries it
 * in the x-amzn-ErrorType header). */
#include "cn_s3_int.h"

#include <jansson.h>
#include <string.h>

char *cn_s3_call(struct cn_s3 *s, const char *op, const char *body, size_t len, int *status,
		 size_t *out_len)
{
	struct s3_resp r = { 0 };
	char *out;

	if (!s3_api_known_op(op)) {
		s3_resp_error(&r, 404, "UnknownOperationException",
			      "Unknown or unsupported operation");
	} else if (!strcmp(op, "QueryVectors")) {
		/* Natively admitted by the connection (one call at a time per connection
		 * worker), not by the HTTP admission queue. */
		be_query(s, body, len, &r);
	} else {
		be_handle(s, op, body, len, &r);
	}
	*status = r.status ? r.status : 200;
	if (r.errtype) {
		json_t *o = r.body ? json_loadb(r.body, r.len, 0, NULL) : NULL;

		if (!json_is_object(o)) {
			json_decref(o);
			o = json_object();
		}
		json_object_set_new(o, "__type", json_string(r.errtype));
		out = o ? json_dumps(o, JSON_COMPACT) : NULL;
		json_decref(o);
		s3_resp_free(&r);
		*out_len = out ? strlen(out) : 0;
		return out;
	}
	if (!r.body) {
		out = strdup("{}");
		*out_len = out ? 2 : 0;
		return out;
	}
	*out_len = r.len;
	return r.body;   /* malloc'd by the operation */
}
