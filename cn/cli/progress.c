/* progress.c: a one-line progress bar on stderr for long CLI work (gen, ground truth, build,
 * load, bench). Drawn only when stderr is a terminal, at most 10 times a second, so that
 * logs and pipes stay clean. Updates come from one thread at a time. */
#include "cli.h"
#include "dm.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct dm_progress {
	const char *what;
	unsigned long long total;
	uint64_t t0, last_draw;
	bool tty;
};

static void draw(struct dm_progress *p, unsigned long long done, bool final)
{
	uint64_t now = dm_now_ns();
	if (!final && now - p->last_draw < 100000000ull)
		return;
	p->last_draw = now;
	if (done > p->total)
		done = p->total;
	double frac = p->total ? (double)done / (double)p->total : 1.0;
	int width = 30, fill = (int)(frac * width);
	char bar[64];
	for (int i = 0; i < width; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[width] = 0;
	double el = (double)(now - p->t0) / 1e9;
	double eta = frac > 0.001 ? el / frac - el : 0;
	fprintf(stderr, "\r%-12.12s [%s] %5.1f%% %llu/%llu %.1fs", p->what, bar, 100.0 * frac,
		done, p->total, el);
	if (!final && frac > 0.001)
		fprintf(stderr, " eta %.0fs ", eta);
	else
		fprintf(stderr, "          ");
	if (final)
		fputc('\n', stderr);
	fflush(stderr);
}

/* Start a bar; silent (but valid) when stderr is not a terminal. NULL only without memory. */
struct dm_progress *dm_progress_start(const char *what, unsigned long long total)
{
	struct dm_progress *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->what = what;
	p->total = total;
	p->t0 = dm_now_ns();
	p->tty = isatty(STDERR_FILENO) && !getenv("DMANN_NO_PROGRESS");
	if (p->tty)
		draw(p, 0, false);
	return p;
}

void dm_progress_update(struct dm_progress *p, unsigned long long done)
{
	if (p && p->tty)
		draw(p, done, false);
}

void dm_progress_end(struct dm_progress *p)
{
	if (!p)
		return;
	if (p->tty)
		draw(p, p->total, true);
	free(p);
}
