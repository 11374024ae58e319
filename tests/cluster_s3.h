/* cluster_s3.h: the S3 Vectors calls of the tests that start local clusters (test_scope,
 * test_shards): one signed POST to a compute node's gateway through curl (--aws-sigv4),
 * with the local cluster's secret. Needs jansson. */
#ifndef DM_TESTS_CLUSTER_S3_H
#define DM_TESTS_CLUSTER_S3_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <jansson.h>

/* POST op with body to the gateway at http (host:port) of the local cluster in lc (its
 * s3.secret), with scratch files in dir: the answer's JSON (NULL when it is not JSON) and
 * *status. curl failing to run is a test failure. */
static __attribute__((unused)) json_t *cluster_s3_call(const char *lc, const char *dir,
						       const char *http, const char *op,
						       const char *body, int *status)
{
	char path[300], out[300], secret[256] = "", cmd[2048];
	FILE *f;
	int rc;

	snprintf(path, sizeof(path), "%s/s3.secret", lc);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(secret, sizeof(secret), f));
	fclose(f);
	secret[strcspn(secret, "\r\n")] = 0;
	snprintf(path, sizeof(path), "%s/body.json", dir);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(body, f);
	fclose(f);
	snprintf(out, sizeof(out), "%s/resp.json", dir);
	/* not through sh(): the command line holds the secret (and there are many calls) */
	snprintf(cmd, sizeof(cmd), "curl -s -o %s -w '%%{http_code}' --aws-sigv4 "
		 "aws:amz:us-east-1:s3vectors --user 'DMANNLOCALTEST:%s' -H 'Content-Type: "
		 "application/json' --data-binary @%s http://%s/%s > %s/code.txt", out, secret,
		 path, http, op, dir);
	rc = system(cmd);
	cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "curl %s failed (curl is needed)", op);
	snprintf(path, sizeof(path), "%s/code.txt", dir);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	cr_assert_eq(fscanf(f, "%d", status), 1);
	fclose(f);
	return json_load_file(out, 0, NULL);
}

#endif
