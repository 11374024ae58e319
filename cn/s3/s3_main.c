/* s3_main.c: dmann-s3, the S3 Vectors gateway in single-process mode: the HTTP front end
 * over one local, durable flat store (state in --data DIR). It exists so that the API and
 * the official SDKs can be used and tested before the distributed path (CN fan-out, MN
 * fragments) is built. */
#include "dm.h"
#include "distance.h"
#include "flat.h"
#include "s3_api.h"
#include "s3_http.h"
#include "s3_scope.h"

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(f,
"usage: dmann-s3 --listen ADDR:PORT --data DIR ((--access-key AK --secret-key SK |\n"
"                --access-key AK --secret-key-file F)... | --credentials FILE) [options]\n"
"\n"
"S3 Vectors API gateway (REST-JSON, SigV4, AWS error shapes) over a local, durable\n"
"flat-index store: every write is in the write-ahead log in DIR, fsync'ed, before it is\n"
"acknowledged; a restart recovers snapshot + WAL. Queries are exact scans (recall 1.0).\n"
"\n"
"SINGLE-PROCESS MODE: all data lives in this process and its DIR. The distributed\n"
"service (data on memory nodes, writes replicated to them, queries fanned out to a\n"
"replica group of compute nodes and merged, hedged sub-requests) is the gateway inside\n"
"dmann-cn: see docs/api.md and `dmann local up`.\n"
"\n"
"options:\n"
"  --listen ADDR:PORT      numeric address and port (PORT 0 = ephemeral; [v6]:PORT)\n"
"  --data DIR              store directory (created if missing)\n"
"  --access-key AK         access key id accepted for SigV4 (repeatable: each one pairs\n"
"                          with the --secret-key or --secret-key-file next to it)\n"
"  --secret-key SK         its secret (visible in ps: prefer --secret-key-file)\n"
"  --secret-key-file F     read the secret from the first line of F\n"
"  --credentials FILE      lines of 'ACCESS_KEY SECRET_KEY [NAME|PRINCIPAL_ARN]' (several\n"
"                          identities; '#' comments)\n"
"                          an identity's principal in bucket policies is\n"
"                          arn:aws:iam::ACCOUNT:user/NAME (NAME: the access key if not\n"
"                          given)\n"
"  --policy-default P      allow (default) or deny: the decision for an action a bucket\n"
"                          policy neither allows nor denies (docs/api.md)\n"
"  --tls-cert F --tls-key F  serve HTTPS with this PEM certificate and key\n"
"  --region R              region in ARNs; if given, signatures must be scoped to it\n"
"                          (default: any region accepted, ARNs say us-east-1)\n"
"  --account ID            account id in ARNs (default 000000000000)\n"
"  --max-skew S            allowed clock skew of x-amz-date in seconds (default 900)\n"
"  --http-threads N        HTTP thread pool size (default 4)\n"
"  --search-threads N      query threads (default: online CPUs)\n"
"  --queue-depth N         admitted queries (running + waiting); beyond it QueryVectors\n"
"                          gets 503 ServiceUnavailableException at once (default 64)\n"
"  --batch N               queries of one index scanned together (sgemm) (default 16)\n"
"  --frag-rows N           rows per fragment (default 4096)\n"
"  --port-file F           write the bound port to F once listening\n"
"  --help                  this text\n"
"\n"
"Prints 'dmann-s3 listening on ADDR:PORT' on stdout when ready; SIGINT/SIGTERM stop it\n"
"cleanly (answers admitted queries, writes a snapshot).\n");
}

/* One more identity; who: NULL (named by its access key), a name or a principal ARN. */
static int add_cred(struct s3_cred **creds, size_t *n, const char *ak, const char *sk,
		    const char *who, const char *account)
{
	struct s3_cred *nc;

	for (size_t i = 0; i < *n; i++)
		if (!strcmp((*creds)[i].access_key, ak)) {
			fprintf(stderr, "dmann-s3: access key %s given twice\n", ak);
			return -EINVAL;
		}
	nc = realloc(*creds, (*n + 1) * sizeof(*nc));
	if (!nc)
		return -ENOMEM;
	*creds = nc;
	nc[*n].access_key = strdup(ak);
	nc[*n].secret_key = strdup(sk);
	if (who && !strncmp(who, "arn:", 4))
		nc[*n].principal = strdup(who);
	else if (asprintf(&nc[*n].principal, "arn:aws:iam::%s:user/%s",
			  account ? account : "000000000000", who ? who : ak) < 0)
		nc[*n].principal = NULL;
	if (!nc[*n].access_key || !nc[*n].secret_key || !nc[*n].principal) {
		free(nc[*n].access_key);
		free(nc[*n].secret_key);
		free(nc[*n].principal);
		return -ENOMEM;
	}
	(*n)++;
	return 0;
}

/* First line of a file, without the newline; NULL on error. */
static char *read_line(const char *path)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;

	if (!f)
		return NULL;
	n = getline(&line, &cap, f);
	fclose(f);
	if (n <= 0) {
		free(line);
		return NULL;
	}
	line[strcspn(line, "\r\n")] = 0;
	return line;
}

static int load_credentials(const char *path, struct s3_cred **creds, size_t *n,
			    const char *account)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	int ln = 0;

	if (!f) {
		fprintf(stderr, "dmann-s3: cannot open %s: %s\n", path, strerror(errno));
		return -errno;
	}
	while (fgets(line, sizeof(line), f)) {
		char ak[256], sk[256], who[256], extra[2];
		int k;

		ln++;
		line[strcspn(line, "\r\n")] = 0;
		if (!line[strspn(line, " \t")] || line[strspn(line, " \t")] == '#')
			continue;
		k = sscanf(line, "%255s %255s %255s %1s", ak, sk, who, extra);
		if (k != 2 && k != 3) {
			fprintf(stderr, "dmann-s3: %s:%d: expected 'ACCESS_KEY SECRET_KEY "
				"[NAME|PRINCIPAL_ARN]'\n", path, ln);
			fclose(f);
			return -EINVAL;
		}
		if (add_cred(creds, n, ak, sk, k == 3 ? who : NULL, account)) {
			fprintf(stderr, "dmann-s3: %s:%d: cannot add this identity\n", path, ln);
			fclose(f);
			return -EINVAL;
		}
	}
	fclose(f);
	return 0;
}

static bool parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out)
{
	char *end;

	errno = 0;
	*out = strtoul(s, &end, 10);
	return !errno && *s && !*end && *out >= lo && *out <= hi;
}

/* "ADDR:PORT" or "[ADDR6]:PORT". */
static bool parse_listen(const char *s, char *addr, size_t alen, uint16_t *port)
{
	const char *colon;
	unsigned long p;

	if (s[0] == '[') {
		const char *rb = strchr(s, ']');

		if (!rb || rb[1] != ':' || (size_t)(rb - s - 1) >= alen)
			return false;
		memcpy(addr, s + 1, (size_t)(rb - s - 1));
		addr[rb - s - 1] = 0;
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || (size_t)(colon - s) >= alen)
			return false;
		memcpy(addr, s, (size_t)(colon - s));
		addr[colon - s] = 0;
	}
	if (!parse_uint(colon + 1, 0, 65535, &p))
		return false;
	*port = (uint16_t)p;
	return addr[0] != 0;
}

int main(int argc, char **argv)
{
	enum { O_LISTEN = 1, O_DATA, O_AK, O_SK, O_SKF, O_CREDS, O_REGION, O_ACCOUNT, O_SKEW,
	       O_HTTP, O_SEARCH, O_QUEUE, O_BATCH, O_FRAG, O_PORTFILE, O_HELP, O_TLSC, O_TLSK,
	       O_POLICY };
	static const struct option lo[] = {
		{ "listen", required_argument, NULL, O_LISTEN },
		{ "data", required_argument, NULL, O_DATA },
		{ "access-key", required_argument, NULL, O_AK },
		{ "secret-key", required_argument, NULL, O_SK },
		{ "secret-key-file", required_argument, NULL, O_SKF },
		{ "credentials", required_argument, NULL, O_CREDS },
		{ "region", required_argument, NULL, O_REGION },
		{ "account", required_argument, NULL, O_ACCOUNT },
		{ "max-skew", required_argument, NULL, O_SKEW },
		{ "http-threads", required_argument, NULL, O_HTTP },
		{ "search-threads", required_argument, NULL, O_SEARCH },
		{ "queue-depth", required_argument, NULL, O_QUEUE },
		{ "batch", required_argument, NULL, O_BATCH },
		{ "frag-rows", required_argument, NULL, O_FRAG },
		{ "port-file", required_argument, NULL, O_PORTFILE },
		{ "help", no_argument, NULL, O_HELP },
		{ "tls-cert", required_argument, NULL, O_TLSC },
		{ "tls-key", required_argument, NULL, O_TLSK },
		{ "policy-default", required_argument, NULL, O_POLICY },
		{ 0 },
	};
	const char *listen = NULL, *data = NULL, *ak = NULL, *sk = NULL, *skf = NULL;
	const char *creds_file = NULL, *region = NULL, *account = NULL, *port_file = NULL;
	const char *tls_cert = NULL, *tls_key = NULL;
	bool policy_deny = false;
	/* --access-key / --secret-key(-file) pairs, in order. */
	const char *pair_ak[64], *pair_sk[64], *pair_skf[64];
	size_t nak = 0, nsk = 0;
	unsigned long skew = 900, http = 4, search = 0, queue = 64, batch = 16, frag = 4096;
	struct s3_cred *creds = NULL;
	size_t ncreds = 0;
	char addr[64];
	uint16_t port;
	char *sk_owned = NULL;
	struct flat_opts fo = { .checkpoint_bytes = 256ull << 20, .scope = &s3_scope_ops };
	struct flat_store *store;
	struct s3_api *api;
	struct s3_http *h;
	sigset_t set;
	int opt, sig, rc = 1;

	dm_blas_node_threads();   /* before any thread: no spinning BLAS pool */
	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		bool okv = true;

		switch (opt) {
		case O_LISTEN: listen = optarg; break;
		case O_DATA: data = optarg; break;
		case O_AK:
			okv = nak < DM_ARRAY_SIZE(pair_ak);
			if (okv)
				pair_ak[nak++] = optarg;
			break;
		case O_SK:
		case O_SKF:
			okv = nsk < DM_ARRAY_SIZE(pair_sk);
			if (okv) {
				pair_sk[nsk] = opt == O_SK ? optarg : NULL;
				pair_skf[nsk++] = opt == O_SKF ? optarg : NULL;
			}
			break;
		case O_TLSC: tls_cert = optarg; break;
		case O_TLSK: tls_key = optarg; break;
		case O_POLICY:
			okv = !strcmp(optarg, "allow") || !strcmp(optarg, "deny");
			policy_deny = !strcmp(optarg, "deny");
			break;
		case O_CREDS: creds_file = optarg; break;
		case O_REGION: region = optarg; break;
		case O_ACCOUNT: account = optarg; break;
		case O_SKEW: okv = parse_uint(optarg, 1, 7 * 86400, &skew); break;
		case O_HTTP: okv = parse_uint(optarg, 1, 256, &http); break;
		case O_SEARCH: okv = parse_uint(optarg, 1, 256, &search); break;
		case O_QUEUE: okv = parse_uint(optarg, 1, 1000000, &queue); break;
		case O_BATCH: okv = parse_uint(optarg, 1, 64, &batch); break;
		case O_FRAG: okv = parse_uint(optarg, 1, 1u << 24, &frag); break;
		case O_PORTFILE: port_file = optarg; break;
		case O_HELP: usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
		if (!okv) {
			fprintf(stderr, "dmann-s3: bad value '%s' for --%s\n", optarg,
				lo[opt - 1].name);
			return 2;
		}
	}
	if (optind < argc || !listen || !data) {
		fprintf(stderr, "dmann-s3: --listen and --data are required (see --help)\n");
		return 2;
	}
	if (!parse_listen(listen, addr, sizeof(addr), &port)) {
		fprintf(stderr, "dmann-s3: --listen wants ADDR:PORT, got '%s'\n", listen);
		return 2;
	}
	if (nak != nsk) {
		fprintf(stderr, "dmann-s3: every --access-key needs its --secret-key(-file) and vice "
			"versa\n");
		return 2;
	}
	if (!tls_cert != !tls_key) {
		fprintf(stderr, "dmann-s3: --tls-cert and --tls-key go together\n");
		return 2;
	}
	for (size_t i = 0; i < nak; i++) {
		ak = pair_ak[i];
		sk = pair_sk[i];
		skf = pair_skf[i];
		if (skf) {
			sk_owned = read_line(skf);
			if (!sk_owned) {
				fprintf(stderr, "dmann-s3: cannot read a secret from %s\n", skf);
				rc = 2;
				goto err_free_creds;
			}
			sk = sk_owned;
		}
		int arc = add_cred(&creds, &ncreds, ak, sk, NULL, account);

		free(sk_owned);
		sk_owned = NULL;
		if (arc) {
			rc = 2;
			goto err_free_creds;
		}
	}
	if (creds_file && load_credentials(creds_file, &creds, &ncreds, account))
		goto err_free_creds;
	if (!ncreds) {
		fprintf(stderr, "dmann-s3: no credentials: give --access-key/--secret-key or "
			"--credentials\n");
		rc = 2;
		goto err_free_creds;
	}

	/* Block the stop signals in every thread; main waits for them. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	fo.frag_rows = (uint32_t)frag;
	store = flat_open(data, &fo);
	if (!store) {
		fprintf(stderr, "dmann-s3: cannot open the store in %s: %s\n", data,
			strerror(errno));
		goto err_free_creds;
	}
	api = s3_api_new(store, region, account);
	if (!api)
		goto err_close_store;
	struct s3_http_cfg hc = {
		.addr = addr, .port = port, .api = api,
		.auth = { .creds = creds, .ncreds = ncreds, .service = "s3vectors",
			  .region = region, .max_skew_s = (int)skew },
		.http_threads = (unsigned)http, .search_threads = (unsigned)search,
		.queue_depth = (unsigned)queue, .batch_max = (unsigned)batch,
		.arn_region = region, .arn_account = account,
		.policy_default_deny = policy_deny, .tls_cert = tls_cert, .tls_key = tls_key,
	};

	h = s3_http_start(&hc);
	if (!h) {
		fprintf(stderr, "dmann-s3: cannot listen on %s: %s\n", listen, strerror(errno));
		goto err_free_api;
	}
	if (port_file) {
		FILE *f = fopen(port_file, "w");

		if (!f || fprintf(f, "%u\n", s3_http_port(h)) < 0 || fclose(f)) {
			fprintf(stderr, "dmann-s3: cannot write %s\n", port_file);
			s3_http_stop(h);
			goto err_free_api;
		}
	}
	printf(strchr(addr, ':') ? "dmann-s3 listening on [%s]:%u%s\n" :
				   "dmann-s3 listening on %s:%u%s\n", addr, s3_http_port(h),
	       tls_cert ? " (https)" : "");
	fflush(stdout);
	sigwait(&set, &sig);
	dm_info("dmann-s3: signal %d, stopping", sig);
	s3_http_stop(h);
	rc = 0;
err_free_api:
	s3_api_free(api);
err_close_store:
	flat_close(store);
err_free_creds:
	for (size_t i = 0; i < ncreds; i++) {
		free(creds[i].access_key);
		free(creds[i].secret_key);
		free(creds[i].principal);
	}
	free(creds);
	free(sk_owned);
	return rc;
}
