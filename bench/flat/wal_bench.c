/* wal_bench.c: WAL write throughput of the flat store (the code path a memory node runs for
 * PutVectors: flat_put, durable when it returns) with N concurrent writers on one index, group
 * commit off (one fdatasync per write, serialised: the behaviour before group commit) and on,
 * in the same run, on the same file system, alternating which goes first. Prints a markdown
 * table (medians of the repeats; the ratio is the median of per-repeat ratios).
 *
 *   wal_bench [--dir DIR] [--writers 1,4,16,64] [--seconds S] [--repeat R]
 *             [--vectors V] [--dim D] [--meta BYTES]
 */
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "flat.h"
#include "util/dm_hash.h"

#define MAX_RUNS 16
#define MAX_REPEAT 15

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wal_bench [options]\n\n"
		"Measure PutVectors-sized flat_put calls per second (each durable when it returns)\n"
		"with N concurrent writers on one index, group commit off and on, in the same run\n"
		"and directory. Prints a markdown table (median of the repeats).\n\n"
		"  --dir DIR         store directory, on the file system to measure (default:\n"
		"                    ./wal-bench.tmp; removed afterwards)\n"
		"  --writers LIST    comma-separated writer counts (default 1,4,16,64)\n"
		"  --seconds S       duration of each measurement (default 3)\n"
		"  --repeat R        measurements per cell, off and on interleaved (default 3)\n"
		"  --vectors V       vectors per PutVectors call (default 8)\n"
		"  --dim D           dimension (default 384)\n"
		"  --meta BYTES      metadata bytes per vector (default 200)\n"
		"  --help            this text\n");
}

struct cfg {
	const char *dir;
	unsigned writers[MAX_RUNS], nw;
	double seconds;
	unsigned repeat, vectors, dim, meta;
};

struct wctx {
	struct flat_index *ix;
	const struct cfg *c;
	unsigned id;
	volatile int *stop;
	uint64_t writes;
	int err;
};

static void *writer(void *p)
{
	struct wctx *w = p;
	const struct cfg *c = w->c;
	struct flat_row_in *rows = calloc(c->vectors, sizeof(*rows));
	float *v = malloc((size_t)c->vectors * c->dim * sizeof(float));
	char (*keys)[48] = malloc((size_t)c->vectors * 48);
	char *meta = malloc(c->meta + 1);
	struct dm_rng rng;

	if (!rows || !v || !keys || !meta) {
		w->err = -ENOMEM;
		goto out_free;
	}
	dm_rng_seed(&rng, w->id + 1);
	memset(meta, 'm', c->meta);
	for (size_t i = 0; i < (size_t)c->vectors * c->dim; i++)
		v[i] = (float)dm_rng_double(&rng);
	while (!*w->stop) {
		for (unsigned i = 0; i < c->vectors; i++) {
			snprintf(keys[i], 48, "w%u-%llu-%u", w->id, (unsigned long long)w->writes, i);
			rows[i] = (struct flat_row_in){ keys[i], v + (size_t)i * c->dim, meta, c->meta,
							NULL, 0 };
		}
		w->err = flat_put(w->ix, rows, c->vectors);
		if (w->err)
			break;
		w->writes++;
	}
out_free:
	free(rows);
	free(v);
	free(keys);
	free(meta);
	return NULL;
}

/* Remove the store and settle the file system (the freed blocks and the directory change
 * are committed here, not inside the next measurement). */
static void rm_store(const char *dir)
{
	char p[4200];
	const char *names[] = { "wal", "snapshot", "snapshot.tmp", "LOCK" };
	int fd;

	for (size_t i = 0; i < 4; i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
	snprintf(p, sizeof(p), "%s/..", dir);
	fd = open(p, O_RDONLY | O_DIRECTORY);
	if (fd >= 0) {
		syncfs(fd);
		close(fd);
	}
}

/* One measurement: writes/s and fdatasyncs per write. */
static int measure(const struct cfg *c, unsigned nw, bool group, double *wps, double *spw)
{
	struct flat_opts o = { .frag_rows = 4096, .checkpoint_bytes = 0, .no_group_commit = !group };
	struct flat_store *s;
	struct flat_index *ix;
	struct wctx *w = calloc(nw, sizeof(*w));
	pthread_t *t = calloc(nw, sizeof(*t));
	struct flat_wal_stats a, b;
	volatile int stop = 0;
	uint64_t writes = 0;
	uint64_t t0, t1;
	int rc = 0;

	if (!w || !t) {
		rc = -ENOMEM;
		goto out_free;
	}
	rm_store(c->dir);
	s = flat_open(c->dir, &o);
	if (!s) {
		rc = -errno;
		fprintf(stderr, "wal_bench: cannot open a store in %s: %s\n", c->dir, strerror(errno));
		goto out_free;
	}
	flat_bucket_create(s, "bench", 0);
	rc = flat_index_create(s, "bench", "i", c->dim, DM_METRIC_COS, NULL, 0, 0);
	ix = rc ? NULL : flat_index_get(s, "bench", "i");
	if (!ix) {
		fprintf(stderr, "wal_bench: cannot create the index: %s\n", strerror(-rc));
		goto out_close;
	}
	flat_wal_stats(s, &a);
	t0 = dm_now_ns();
	for (unsigned i = 0; i < nw; i++) {
		w[i] = (struct wctx){ .ix = ix, .c = c, .id = i, .stop = &stop };
		if (pthread_create(&t[i], NULL, writer, &w[i])) {
			nw = i;
			stop = 1;
			rc = -EAGAIN;
			break;
		}
	}
	while (!stop && dm_now_ns() - t0 < (uint64_t)(c->seconds * 1e9))
		usleep(10000);
	stop = 1;
	for (unsigned i = 0; i < nw; i++) {
		pthread_join(t[i], NULL);
		writes += w[i].writes;
		if (w[i].err && !rc)
			rc = w[i].err;
	}
	t1 = dm_now_ns();
	flat_wal_stats(s, &b);
	*wps = (double)writes / ((double)(t1 - t0) / 1e9);
	*spw = writes ? (double)(b.syncs - a.syncs) / (double)writes : 0;
	if (rc)
		fprintf(stderr, "wal_bench: a writer failed: %s\n", strerror(-rc));
	flat_index_put(ix);
out_close:
	flat_abandon(s);
	rm_store(c->dir);
out_free:
	free(w);
	free(t);
	return rc;
}

static int dcmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), dcmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int parse_list(const char *s, struct cfg *c)
{
	char *dup = strdup(s), *save = NULL, *tok;

	c->nw = 0;
	for (tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		long v = strtol(tok, NULL, 10);

		if (v < 1 || v > 4096 || c->nw == MAX_RUNS) {
			free(dup);
			return -EINVAL;
		}
		c->writers[c->nw++] = (unsigned)v;
	}
	free(dup);
	return c->nw ? 0 : -EINVAL;
}

int main(int argc, char **argv)
{
	struct cfg c = { .dir = "wal-bench.tmp", .writers = { 1, 4, 16, 64 }, .nw = 4,
			 .seconds = 3, .repeat = 3, .vectors = 8, .dim = 384, .meta = 200 };
	static const struct option lo[] = {
		{ "dir", required_argument, NULL, 'd' }, { "writers", required_argument, NULL, 'w' },
		{ "seconds", required_argument, NULL, 's' }, { "repeat", required_argument, NULL, 'r' },
		{ "vectors", required_argument, NULL, 'v' }, { "dim", required_argument, NULL, 'D' },
		{ "meta", required_argument, NULL, 'm' }, { "help", no_argument, NULL, 'h' },
		{ 0 } };
	struct statfs sf;
	struct utsname un;
	int o;

	while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (o) {
		case 'd': c.dir = optarg; break;
		case 'w':
			if (parse_list(optarg, &c)) {
				fprintf(stderr, "wal_bench: --writers wants e.g. 1,4,16,64 (1..4096)\n");
				return 2;
			}
			break;
		case 's': c.seconds = atof(optarg); break;
		case 'r': c.repeat = (unsigned)atoi(optarg); break;
		case 'v': c.vectors = (unsigned)atoi(optarg); break;
		case 'D': c.dim = (unsigned)atoi(optarg); break;
		case 'm': c.meta = (unsigned)atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc || !(c.seconds > 0) || c.repeat < 1 || c.repeat > MAX_REPEAT ||
	    c.vectors < 1 || c.vectors > 500 || c.dim < 1 || c.dim > FLAT_DIM_MAX ||
	    c.meta > 40960) {
		usage(stderr);
		return 2;
	}
	dm_log_set_level(DM_LOG_WARN);
	uname(&un);
	mkdir(c.dir, 0755);
	if (statfs(c.dir, &sf) == 0)
		printf("<!-- wal_bench: %s %s, %ld CPUs, store in %s (statfs type 0x%lx), %u vectors x "
		       "dim %u + %u B metadata per write, %.1f s x %u repeats per cell -->\n",
		       un.sysname, un.release, sysconf(_SC_NPROCESSORS_ONLN), c.dir,
		       (unsigned long)sf.f_type, c.vectors, c.dim, c.meta, c.seconds, c.repeat);
	rmdir(c.dir);
	printf("| writers | writes/s, group commit off | writes/s, on | ratio on/off | "
	       "fdatasyncs/write off | on |\n|---:|---:|---:|---:|---:|---:|\n");
	for (unsigned i = 0; i < c.nw; i++) {
		double off[MAX_REPEAT], on[MAX_REPEAT], soff[MAX_REPEAT], son[MAX_REPEAT], ratio[MAX_REPEAT];

		for (unsigned r = 0; r < c.repeat; r++) {
			/* Alternate which mode goes first, so neither always follows the other. */
			bool first = r % 2;

			if (measure(&c, c.writers[i], first, first ? &on[r] : &off[r],
				    first ? &son[r] : &soff[r]) ||
			    measure(&c, c.writers[i], !first, !first ? &on[r] : &off[r],
				    !first ? &son[r] : &soff[r]))
				return 1;
			ratio[r] = off[r] > 0 ? on[r] / off[r] : 0;
		}
		printf("| %u | %.0f | %.0f | %.2f | %.3f | %.3f |\n", c.writers[i],
		       median(off, c.repeat), median(on, c.repeat), median(ratio, c.repeat),
		       median(soff, c.repeat), median(son, c.repeat));
		fflush(stdout);
	}
	return 0;
}
