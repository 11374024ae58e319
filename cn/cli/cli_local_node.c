/* cli_local_node.c: the failure drills of a local cluster, one node at a time:
 *
 *   dmann local kill  --dir D NODE   SIGKILL (a crash: no snapshot, no lease revoked)
 *   dmann local stop  --dir D NODE   SIGTERM (a clean leave: in-flight work finishes, the
 *                                    memory node snapshots, the lease is revoked), SIGKILL
 *                                    after --timeout seconds
 *   dmann local start --dir D NODE   start it again with the same cluster file and data
 *                                    directory (a memory node reloads its snapshot) and wait
 *                                    until it accepts connections
 *
 * NODE is mn<N> or cn<N> of D/cluster.ini, or etcd (the local etcd `dmann local up`
 * started; start reuses its data directory). The pids file (cli_local.h) says which process
 * is the node now: the last line naming it. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_local.h"
#include "config.h"
#include "dm.h"

static void node_usage(FILE *f)
{
	fprintf(f,
		"usage: dmann local kill  --dir DIR NODE\n"
		"       dmann local stop  --dir DIR [--timeout S] NODE\n"
		"       dmann local start --dir DIR [--timeout S] NODE\n\n"
		"Failure drills on one node (mn<N>, cn<N>, or etcd: the local cluster state) of\n"
		"the local cluster in DIR:\n"
		"  kill   SIGKILL, as a crash (no snapshot; its etcd lease expires on its own)\n"
		"  stop   SIGTERM: the node drains (in-flight work finishes, a memory node\n"
		"         snapshots, the lease is revoked); SIGKILL if it is not gone within S\n"
		"         seconds (default 10)\n"
		"  start  start a stopped or killed node again with its data directory and wait\n"
		"         until it accepts connections (at most S seconds, default 30)\n"
		"Exit status: 0 done, 1 failed (the message says why), 2 bad usage.\n");
}

/* Whether pid runs (not a zombie); its /proc/PID/stat line into buf. */
static bool pid_running(pid_t pid, char *buf, size_t cap)
{
	char p[64], st = 0, *rp;
	size_t n;
	FILE *f;

	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	f = pid > 1 ? fopen(p, "r") : NULL;
	if (!f)
		return false;
	n = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[n] = '\0';
	rp = strrchr(buf, ')');   /* "pid (comm) S ..." */
	return rp && sscanf(rp + 1, " %c", &st) == 1 && st != 'Z' && st != 'X';
}

bool dm_local_pid_alive(pid_t pid)
{
	char buf[512];

	return pid_running(pid, buf, sizeof(buf));
}

bool dm_local_pid_is_node(pid_t pid)
{
	char p[64], buf[512];
	size_t n;
	FILE *f;

	if (!pid_running(pid, buf, sizeof(buf)))
		return false;
	snprintf(p, sizeof(p), "/proc/%d/cmdline", (int)pid);
	f = fopen(p, "r");
	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';   /* argv[0] only: the binary */
	return strstr(buf, "dmann-mn") || strstr(buf, "dmann-cn") ||
	       (!strcmp(buf, "ip") && n > 3);   /* `ip netns exec` before its exec */
}

/* The node's current pid and namespace from dir/pids: 0, or -ENOENT (never started). */
static int node_entry(const char *dir, const char *name, pid_t *pid, char *ns, size_t nscap)
{
	char path[PATH_MAX], line[1200], nm[32], nsb[64];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "%s/pids", dir);
	f = fopen(path, "r");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		int p, k = sscanf(line, "%d %31s %63s", &p, nm, nsb);

		if (k >= 2 && !strcmp(nm, name)) {
			*pid = p;
			snprintf(ns, nscap, "%s", k == 3 && strcmp(nsb, "-") ? nsb : "");
			found = true;
		}
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

/* Wait up to ms for pid to be gone (reaped by whoever is its parent, or a zombie). */
/* Wait until pid has exited: a zombie or gone, not merely without a command line (a process
 * tearing down a large address space, e.g. under ASan, loses /proc/PID/cmdline before it
 * closes its files, so its data directory's lock would still be held). */
static bool wait_gone(pid_t pid, int ms)
{
	char buf[512];

	for (int t = 0; t < ms; t += 50) {
		waitpid(pid, NULL, WNOHANG);
		if (!pid_running(pid, buf, sizeof(buf)))
			return true;
		usleep(50000);
	}
	return !pid_running(pid, buf, sizeof(buf));
}

/* The local etcd's last "etcd" line of dir/pids. */
static int etcd_entry(const char *dir, pid_t *pid, char *datadir, size_t dcap, char *host,
		      size_t hcap, int *cport, int *pport)
{
	char path[PATH_MAX], line[1400], dd[1024], h[64];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "%s/pids", dir);
	f = fopen(path, "r");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		int p, c, q;

		if (sscanf(line, "etcd %d %1023s %63s %d %d", &p, dd, h, &c, &q) == 5) {
			*pid = p;
			snprintf(datadir, dcap, "%s", dd);
			snprintf(host, hcap, "%s", h);
			*cport = c;
			*pport = q;
			found = true;
		}
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

static bool pid_is_etcd(pid_t pid)
{
	char buf[256];

	return pid_running(pid, buf, sizeof(buf)) && strstr(buf, "(etcd)") != NULL;
}

/* kill / stop / start of the local etcd (NODE "etcd"). */
static int etcd_cmd(const char *what, const char *act, const char *dir, unsigned timeout_s)
{
	char datadir[1024] = "", host[64] = "", endpoint[160], path[PATH_MAX];
	int cport = 0, pport = 0, rc;
	pid_t pid = 0;
	FILE *f;

	rc = etcd_entry(dir, &pid, datadir, sizeof(datadir), host, sizeof(host), &cport, &pport);
	if (rc) {
		fprintf(stderr, "dmann %s: %s\n", what, rc == -ENOENT ? "this local cluster runs "
			"no etcd (or was started by an older dmann)" : "no pids file: no local "
			"cluster runs there");
		return 1;
	}
	if (strcmp(act, "start")) {
		if (!pid_is_etcd(pid)) {
			fprintf(stderr, "dmann %s: etcd is not running\n", what);
			return 1;
		}
		kill(pid, strcmp(act, "stop") ? SIGKILL : SIGTERM);
		for (unsigned t = 0; t < (timeout_s ? timeout_s : 10) * 20 && pid_is_etcd(pid); t++) {
			waitpid(pid, NULL, WNOHANG);
			usleep(50000);
		}
		if (pid_is_etcd(pid)) {
			kill(pid, SIGKILL);
			usleep(200000);
		}
		printf("dmann local: %s etcd (pid %d)\n", strcmp(act, "stop") ? "killed" : "stopped",
		       (int)pid);
		return 0;
	}
	if (pid_is_etcd(pid)) {
		fprintf(stderr, "dmann %s: etcd runs already (pid %d)\n", what, (int)pid);
		return 1;
	}
	pid = dm_local_etcd_start(dir, host, cport, pport, endpoint, sizeof(endpoint), datadir,
				  sizeof(datadir));
	if (pid < 0)
		return 1;
	snprintf(path, sizeof(path), "%s/pids", dir);
	f = fopen(path, "a");
	if (f) {
		fprintf(f, "etcd %d %s %s %d %d\n", (int)pid, datadir, host, cport, pport);
		fclose(f);
	}
	rc = dm_local_etcd_wait(endpoint, pid, (int)(timeout_s ? timeout_s : 30) * 1000);
	if (rc) {
		fprintf(stderr, "dmann %s: etcd did not start (%s); see %s/etcd.log\n", what,
			strerror(-rc), dir);
		return 1;
	}
	printf("dmann local: started etcd (pid %d) on its data directory %s\n", (int)pid,
	       datadir);
	return 0;
}

int dm_local_node_cmd(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dir", required_argument, NULL, 'd' }, { "timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
	};
	const char *act = argv[0], *dir = NULL, *name;
	char what[32], path[PATH_MAX], err[1024], ns[64], bin[PATH_MAX];
	unsigned long long timeout_s = 0;
	struct dm_cluster_cfg *cfg = NULL;
	const struct dm_node_cfg *nc;
	struct node_spec spec;
	enum dm_role role;
	unsigned long id;
	char *end;
	pid_t pid = 0;
	int c, rc = 1;
	FILE *f;

	snprintf(what, sizeof(what), "local %s", act);
	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'd': dir = optarg; break;
		case 't':
			if (dm_cli_parse_u64(what, "--timeout", optarg, 1, 3600, &timeout_s))
				return 2;
			break;
		case 'h': node_usage(stdout); return 0;
		default: dm_cli_bad_option(what, c, argv, optind); return 2;
		}
	}
	if (!dir || optind + 1 != argc) {
		node_usage(stderr);
		return 2;
	}
	name = argv[optind];
	if (!strcmp(name, "etcd"))
		return etcd_cmd(what, act, dir, (unsigned)timeout_s);
	if ((strncmp(name, "mn", 2) && strncmp(name, "cn", 2)) || !name[2] ||
	    (id = strtoul(name + 2, &end, 10), *end) || strspn(name + 2, "0123456789") !=
	    strlen(name + 2) || id >= DM_MAX_NODES) {
		fprintf(stderr, "dmann %s: NODE '%s' is not mn<N> or cn<N>\n", what, name);
		return 2;
	}
	role = name[0] == 'm' ? DM_ROLE_MN : DM_ROLE_CN;
	snprintf(path, sizeof(path), "%s/cluster.ini", dir);
	cfg = calloc(1, sizeof(*cfg));
	if (!cfg || dm_config_load(path, cfg, err, sizeof(err))) {
		fprintf(stderr, "dmann %s: %s\n", what, cfg ? err : "out of memory");
		goto free_cfg;
	}
	nc = dm_config_node(cfg, role, (uint32_t)id);
	if (!nc) {
		fprintf(stderr, "dmann %s: %s has no node %s\n", what, path, name);
		goto free_cfg;
	}
	rc = node_entry(dir, name, &pid, ns, sizeof(ns));
	if (rc) {
		fprintf(stderr, "dmann %s: %s: %s\n", what, rc == -ENOENT ? name : dir,
			rc == -ENOENT ? "not in the pids file (was the cluster started with "
			"dmann local up?)" : "no pids file: no local cluster runs there");
		rc = 1;
		goto free_cfg;
	}
	rc = 1;
	if (!strcmp(act, "kill") || !strcmp(act, "stop")) {
		bool term = !strcmp(act, "stop");

		if (!dm_local_pid_is_node(pid)) {
			fprintf(stderr, "dmann %s: %s is not running\n", what, name);
			goto free_cfg;
		}
		if (kill(pid, term ? SIGTERM : SIGKILL)) {
			fprintf(stderr, "dmann %s: %s (pid %d): %s\n", what, name, (int)pid,
				strerror(errno));
			goto free_cfg;
		}
		if (!wait_gone(pid, term ? (int)(timeout_s ? timeout_s : 10) * 1000 : 5000)) {
			if (!term) {
				fprintf(stderr, "dmann %s: %s (pid %d) still runs 5 s after "
					"SIGKILL\n", what, name, (int)pid);
				goto free_cfg;
			}
			fprintf(stderr, "dmann %s: %s did not stop in %llu s; killing it\n", what,
				name, timeout_s ? timeout_s : 10);
			kill(pid, SIGKILL);
			wait_gone(pid, 5000);
		}
		printf("dmann local: %s %s (pid %d)\n", term ? "stopped" : "killed", name,
		       (int)pid);
		rc = 0;
		goto free_cfg;
	}
	/* start */
	if (dm_local_pid_is_node(pid)) {
		fprintf(stderr, "dmann %s: %s runs already (pid %d)\n", what, name, (int)pid);
		goto free_cfg;
	}
	spec = (struct node_spec){ .role = role == DM_ROLE_MN ? "mn" : "cn", .id = (int)id };
	snprintf(spec.ns, sizeof(spec.ns), "%s", ns);
	dm_local_find_binary(role == DM_ROLE_MN ? "dmann-mn" : "dmann-cn", bin, sizeof(bin));
	spec.pid = dm_local_spawn(dir, &spec, bin);
	if (spec.pid < 0) {
		fprintf(stderr, "dmann %s: cannot start %s: %s\n", what, name, strerror(errno));
		goto free_cfg;
	}
	snprintf(path, sizeof(path), "%s/pids", dir);
	f = fopen(path, "a");
	if (!f) {
		fprintf(stderr, "dmann %s: cannot append to %s: %s (pid %d runs)\n", what, path,
			strerror(errno), (int)spec.pid);
		goto free_cfg;
	}
	fprintf(f, "%d %s %s\n", (int)spec.pid, name, ns[0] ? ns : "-");
	fclose(f);
	c = dm_local_wait_ready(cfg, ns[0] ? ns : NULL, nc->address,
				(int)(timeout_s ? timeout_s : 30) * 1000, spec.pid);
	if (c) {
		fprintf(stderr, "dmann %s: %s did not start (%s); see %s/%s.log\n", what, name,
			c == -ECHILD ? "it exited" : c == -ETIMEDOUT ? "no handshake in time" :
			"probe failed", dir, name);
		dm_local_log_tail(dir, spec.role, spec.id);
		goto free_cfg;
	}
	printf("dmann local: started %s (pid %d)\n", name, (int)spec.pid);
	rc = 0;
free_cfg:
	free(cfg);
	return rc;
}
