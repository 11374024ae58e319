/* cli_args.c: argument parsing helpers shared by the dmann subcommands, so that every bad
 * number or option gets the same clear message; the cluster file as an admin reads it. */
#include "cli.h"
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parse a decimal integer in [min, max]; anything else is a message and -EINVAL. */
int dm_cli_parse_u64(const char *cmd, const char *opt, const char *s, unsigned long long min,
		     unsigned long long max, unsigned long long *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-' || *s == '+')
		goto bad;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v < min || v > max)
		goto bad;
	*out = v;
	return 0;
bad:
	fprintf(stderr, "dmann %s: %s: '%s' is not an integer in %llu..%llu\n", cmd, opt,
		s ? s : "", min, max);
	return -EINVAL;
}

/* Parse a finite number in [min, max]. */
int dm_cli_parse_double(const char *cmd, const char *opt, const char *s, double min, double max,
			double *out)
{
	char *end;
	errno = 0;
	if (!s || !*s)
		goto bad;
	double v = strtod(s, &end);
	if (errno || *end || !isfinite(v) || v < min || v > max)
		goto bad;
	*out = v;
	return 0;
bad:
	fprintf(stderr, "dmann %s: %s: '%s' is not a number in %g..%g\n", cmd, opt, s ? s : "",
		min, max);
	return -EINVAL;
}

/* After getopt_long (optstring starting with ':') returned c = ':' (missing value) or '?'. */
void dm_cli_bad_option(const char *cmd, int c, char **argv, int optind_now)
{
	const char *arg = optind_now > 0 ? argv[optind_now - 1] : "?";
	if (c == ':')
		fprintf(stderr, "dmann %s: option '%s' needs a value\n", cmd, arg);
	else if (optopt)
		fprintf(stderr, "dmann %s: unknown option '-%c'\n", cmd, optopt);
	else
		fprintf(stderr, "dmann %s: unknown option '%s'\n", cmd, arg);
}

struct dm_cluster_cfg *dm_cli_load_cfg(const char *cmd, const char *path)
{
	struct dm_cluster_cfg *cfg = calloc(1, sizeof(*cfg));
	char err[1024];

	if (!cfg)
		return NULL;
	if (dm_config_load(path, cfg, err, sizeof(err))) {
		fprintf(stderr, "dmann %s: %s\n", cmd, err);
		free(cfg);
		return NULL;
	}
	return cfg;
}
