/* log.c: leveled logging to stderr, one line per call, safe from any thread. */
#include "dm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_level = -1;

static enum dm_log_level level_from_env(void)
{
	const char *s = getenv("DMANN_LOG");

	if (!s)
		return DM_LOG_WARN;
	if (!strcmp(s, "error"))
		return DM_LOG_ERROR;
	if (!strcmp(s, "info"))
		return DM_LOG_INFO;
	if (!strcmp(s, "debug"))
		return DM_LOG_DEBUG;
	return DM_LOG_WARN;
}

void dm_log_set_level(enum dm_log_level level)
{
	__atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

enum dm_log_level dm_log_get_level(void)
{
	int l = __atomic_load_n(&log_level, __ATOMIC_RELAXED);

	if (l < 0) {
		l = (int)level_from_env();
		__atomic_store_n(&log_level, l, __ATOMIC_RELAXED);
	}
	return (enum dm_log_level)l;
}

void dm_log(enum dm_log_level level, const char *fmt, ...)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	char line[1024];
	va_list ap;
	int n;

	if ((int)level > (int)dm_log_get_level())
		return;
	n = snprintf(line, sizeof(line), "dmann %s: ", names[level]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One fputs per line so that concurrent threads do not interleave mid-line. */
	n = (int)strlen(line);
	if (n > 0 && line[n - 1] != '\n' && n < (int)sizeof(line) - 1) {
		line[n] = '\n';
		line[n + 1] = '\0';
	}
	fputs(line, stderr);
}

uint64_t dm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
