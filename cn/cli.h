/* cli.h: the dmann command-line tool's subcommands. Each returns the process exit status
 * (0 ok, 1 failure, 2 usage error) and handles its own --help. */
#ifndef DM_CLI_H
#define DM_CLI_H

struct dm_cli_cmd {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv);   /* argv[0] is the subcommand name */
};

/* Progress bar on stderr when it is a terminal; silent otherwise. */
struct dm_progress;
struct dm_progress *dm_progress_start(const char *what, unsigned long long total);
void dm_progress_update(struct dm_progress *p, unsigned long long done);
void dm_progress_end(struct dm_progress *p);

#endif
