/* cli_client.c: `dmann put|get|delete|query`: the S3 Vectors indexes of a cluster through
 * libdmann (cn/client/dmann.h) with a client identity; vectors from fbin/fvecs files
 * (common/vecfile), results as text or --json. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dmann.h"
#include "vecfile.h"

struct vargs {
	const char *config, *client, *bucket, *name, *vectors, *keys, *prefix;
	unsigned long long k;
	bool json, whole;
	const char *create;          /* put --create METRIC: create the index first if missing */
};

static void usage(FILE *f, const char *cmd)
{
	fprintf(f,
		"usage: dmann %s --config C --bucket B --name I [--client NAME] ...\n"
		"  put:    --vectors FILE (fbin/fvecs) [--key-prefix P]   keys P0, P1, ... (default v)\n"
		"          [--create euclidean|cosine]  create the index (and bucket) first when\n"
		"          missing, of the file's dimension\n"
		"  get:    --keys K1,K2,... [--json]   --json: one array of {key, found, float32}\n"
		"  delete: --keys K1,K2,...  or  --whole-index (DeleteIndex: the index, its vectors\n"
		"          and its graph, which the compute nodes then free)\n"
		"  query:  --vectors FILE [--k K (default 10)] [--json]   one result line per query\n\n"
		"  --config C     cluster file; only the client identity's secret is read\n"
		"  --client NAME  its [client.NAME] (default $DMANN_CLIENT_NAME, else local)\n"
		"  --bucket B, --name I   the S3 Vectors bucket and index\n", cmd);
}

/* Split "a,b,c" in place into keys. */
static const char **split_keys(char *s, size_t *n)
{
	size_t cap = 1;
	const char **k;

	for (const char *p = s; *p; p++)
		cap += *p == ',';
	k = calloc(cap, sizeof(*k));
	*n = 0;
	for (char *t = strtok(s, ","); k && t; t = strtok(NULL, ","))
		k[(*n)++] = t;
	return k;
}

static int run(const char *cmd, struct vargs *a)
{
	const char *client = a->client ? a->client : getenv("DMANN_CLIENT_NAME");
	dmann_t *d = dmann_connect(a->config, client && *client ? client : "local");
	struct dm_vecs v = { 0 };
	char err[512];
	const char **keys = NULL;
	size_t nk = 0;
	int rc = 0;

	if (!d) {
		fprintf(stderr, "dmann %s: %s\n", cmd, dmann_errmsg());
		return 1;
	}
	if (a->vectors && dm_vecs_read(a->vectors, DM_VF_AUTO, &v, err, sizeof(err))) {
		fprintf(stderr, "dmann %s: %s\n", cmd, err);
		rc = 1;
		goto out;
	}
	if (!strcmp(cmd, "put") && a->create) {
		rc = dmann_create_index(d, a->bucket, a->name, (uint32_t)v.dim,
					!strcmp(a->create, "cosine") ? DMANN_COSINE : DMANN_EUCLIDEAN);
		if (rc == -EEXIST)
			rc = 0;
		if (rc)
			goto out_err;
	}
	if (!strcmp(cmd, "put")) {
		char **names = calloc(v.n ? v.n : 1, sizeof(*names));

		for (uint64_t i = 0; names && i < v.n; i++)
			if (asprintf(&names[i], "%s%llu", a->prefix ? a->prefix : "v",
				     (unsigned long long)i) < 0)
				names[i] = NULL;
		rc = names ? dmann_put(d, a->bucket, a->name, v.n, (const char *const *)names,
				       v.data, v.dim, NULL) : -ENOMEM;
		for (uint64_t i = 0; names && i < v.n; i++)
			free(names[i]);
		free(names);
		if (!rc)
			printf("put %llu vectors\n", (unsigned long long)v.n);
	} else if (!strcmp(cmd, "get") || !strcmp(cmd, "delete")) {
		uint32_t dim = 0;

		keys = a->whole ? calloc(1, sizeof(*keys)) : split_keys((char *)a->keys, &nk);
		if (!keys) {
			rc = -ENOMEM;
		} else if (!strcmp(cmd, "delete") && a->whole) {
			rc = dmann_drop_index(d, a->bucket, a->name);
			if (!rc)
				printf("deleted index %s/%s\n", a->bucket, a->name);
		} else if (!strcmp(cmd, "delete")) {
			rc = dmann_delete(d, a->bucket, a->name, nk, keys);
		} else if (!(rc = dmann_describe_index(d, a->bucket, a->name, &dim, NULL))) {
			float *out = calloc(nk * dim + 1, sizeof(float));
			uint8_t *found = calloc(nk + 1, 1);

			rc = out && found ? dmann_get(d, a->bucket, a->name, nk, keys, out, dim, found)
					  : -ENOMEM;
			if (a->json && rc >= 0)   /* one JSON array of the rows asked for */
				printf("[");
			for (size_t i = 0; rc >= 0 && i < nk; i++) {
				printf(a->json ? "%s{\"key\":\"%s\",\"found\":%s,\"float32\":[" : "%s%s %s",
				       a->json && i ? "," : "", keys[i],
				       found[i] ? "true" : "false");
				for (uint32_t e = 0; found[i] && e < dim; e++)
					printf(a->json ? "%s%.9g" : "%s%.9g", a->json && e ? "," : " ",
					       out[i * dim + e]);
				printf(a->json ? "]}" : "\n");
			}
			if (a->json && rc >= 0)
				printf("]\n");
			rc = rc < 0 ? rc : 0;
			free(out);
			free(found);
		}
	} else {   /* query */
		uint32_t k = (uint32_t)a->k;
		char **hk = calloc(v.n * k + 1, sizeof(*hk));
		float *hd = calloc(v.n * k + 1, sizeof(*hd));
		uint32_t *cnt = calloc(v.n + 1, sizeof(*cnt));

		rc = hk && hd && cnt ? dmann_batch_query(d, a->bucket, a->name, v.data, v.n, v.dim, k,
							 hk, hd, cnt) : -ENOMEM;
		for (uint64_t i = 0; !rc && i < v.n; i++) {
			printf(a->json ? "{\"query\":%llu,\"vectors\":[" : "%llu:",
			       (unsigned long long)i);
			for (uint32_t j = 0; j < cnt[i]; j++)
				printf(a->json ? "%s{\"key\":\"%s\",\"distance\":%.9g}" : "%s%s %.9g",
				       a->json ? (j ? "," : "") : " ", hk[i * k + j], hd[i * k + j]);
			printf(a->json ? "]}\n" : "\n");
		}
		if (hk)
			dmann_free_keys(hk, v.n * k);
		free(hk);
		free(hd);
		free(cnt);
	}
out_err:
	if (rc < 0)
		fprintf(stderr, "dmann %s: %s\n", cmd, dmann_errmsg());
out:
	free(keys);
	dm_vecs_free(&v);
	dmann_close(d);
	return rc < 0 ? 1 : rc;
}

int dm_cmd_vectors(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' }, { "client", required_argument, NULL, 'C' },
		{ "bucket", required_argument, NULL, 'b' }, { "name", required_argument, NULL, 'n' },
		{ "vectors", required_argument, NULL, 'v' }, { "keys", required_argument, NULL, 'K' },
		{ "key-prefix", required_argument, NULL, 'p' }, { "k", required_argument, NULL, 'k' },
		{ "json", no_argument, NULL, 'j' }, { "help", no_argument, NULL, 'h' },
		{ "whole-index", no_argument, NULL, 'W' }, { "create", required_argument, NULL, 'M' },
		{ NULL, 0, NULL, 0 },
	};
	const char *cmd = argv[0];
	struct vargs a = { .k = 10 };
	int c;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'c': a.config = optarg; break;
		case 'C': a.client = optarg; break;
		case 'b': a.bucket = optarg; break;
		case 'n': a.name = optarg; break;
		case 'v': a.vectors = optarg; break;
		case 'K': a.keys = optarg; break;
		case 'p': a.prefix = optarg; break;
		case 'j': a.json = true; break;
		case 'M':
			if (strcmp(cmd, "put")) {
				fprintf(stderr, "dmann %s: --create is an option of dmann put\n", cmd);
				return 2;
			}
			if (strcmp(optarg, "euclidean") && strcmp(optarg, "cosine")) {
				fprintf(stderr, "dmann put: --create %s: must be euclidean or cosine\n",
					optarg);
				return 2;
			}
			a.create = optarg;
			break;
		case 'W':
			if (strcmp(cmd, "delete")) {
				fprintf(stderr, "dmann %s: --whole-index is an option of dmann delete\n",
					cmd);
				return 2;
			}
			a.whole = true;
			break;
		case 'k':
			if (dm_cli_parse_u64(cmd, "--k", optarg, 1, DMANN_MAX_K, &a.k))
				return 2;
			break;
		case 'h': usage(stdout, cmd); return 0;
		default: dm_cli_bad_option(cmd, c, argv, optind); return 2;
		}
	}
	bool need_vec = !strcmp(cmd, "put") || !strcmp(cmd, "query");

	if (a.whole && a.keys) {
		fprintf(stderr, "dmann delete: --keys or --whole-index, not both\n");
		return 2;
	}
	if (!a.config || !a.bucket || !a.name || (need_vec ? !a.vectors : !a.keys && !a.whole)) {
		fprintf(stderr, "dmann %s: --config, --bucket, --name and %s are required\n", cmd,
			need_vec ? "--vectors" : a.whole || strcmp(cmd, "delete") ? "--keys" :
			"--keys (or --whole-index)");
		usage(stderr, cmd);
		return 2;
	}
	return run(cmd, &a);
}
