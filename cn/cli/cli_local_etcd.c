/* cli_local_etcd.c: the etcd of a local cluster (`dmann local up`): one etcd member with its
 * data on tmpfs (/dev/shm, else the cluster directory), client port on the nodes' host
 * address (and 127.0.0.1), started before the nodes and stopped after them. */
#include "cli_local.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dm.h"
#if DM_HAVE_ETCD
#include "etcd.h"
#endif

/* etcd on PATH (or $DMANN_ETCD). */
static int find_etcd(char *out, size_t cap)
{
	const char *env = getenv("DMANN_ETCD"), *path = getenv("PATH");
	char buf[4096];

	if (env && *env) {
		snprintf(out, cap, "%s", env);
		return access(out, X_OK) ? -ENOENT : 0;
	}
	snprintf(buf, sizeof(buf), "%s", path && *path ? path : "/usr/bin:/bin");
	for (char *s = strtok(buf, ":"); s; s = strtok(NULL, ":")) {
		snprintf(out, cap, "%s/etcd", s);
		if (access(out, X_OK) == 0)
			return 0;
	}
	return -ENOENT;
}

pid_t dm_local_etcd_start(const char *dir, const char *host, int client_port, int peer_port,
			  char *endpoint, size_t ecap, char *datadir, size_t dcap)
{
	char bin[1024], curls[256], acurl[128], purl[128], cluster[160], logp[1024];
	pid_t pid;
	int fd;

	if (find_etcd(bin, sizeof(bin))) {
		fprintf(stderr, "dmann local up: etcd not found (install etcd-server, e.g. with "
			"deploy/install-deps.sh, or pass --no-etcd)\n");
		errno = ENOENT;
		return -1;
	}
	if (datadir[0]) {
		/* A restart (dmann local start etcd): the same data directory. */
		if (access(datadir, W_OK)) {
			fprintf(stderr, "dmann local: etcd data directory %s: %s\n", datadir,
				strerror(errno));
			return -1;
		}
	} else if (snprintf(datadir, dcap, "/dev/shm/dmann-etcd-XXXXXX"),
		   access("/dev/shm", W_OK) || !mkdtemp(datadir)) {
		snprintf(datadir, dcap, "%s/etcd", dir);
		if (mkdir(datadir, 0700) && errno != EEXIST) {
			fprintf(stderr, "dmann local up: cannot create %s: %s\n", datadir,
				strerror(errno));
			return -1;
		}
	}
	snprintf(acurl, sizeof(acurl), "http://%s:%d", host, client_port);
	if (strcmp(host, "127.0.0.1"))
		snprintf(curls, sizeof(curls), "%s,http://127.0.0.1:%d", acurl, client_port);
	else
		snprintf(curls, sizeof(curls), "%s", acurl);
	snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", peer_port);
	snprintf(cluster, sizeof(cluster), "default=%s", purl);
	snprintf(endpoint, ecap, "%s", acurl);
	snprintf(logp, sizeof(logp), "%s/etcd.log", dir);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		char *argv[] = { bin, "--name", "default", "--data-dir", datadir,
				 "--listen-client-urls", curls, "--advertise-client-urls", acurl,
				 "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
				 "--initial-cluster", cluster, "--log-level", "warn", NULL };

		setsid();
		fd = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execv(bin, argv);
		_exit(127);
	}
	return pid;
}

int dm_local_etcd_wait(const char *endpoint, pid_t pid, int timeout_ms)
{
#if DM_HAVE_ETCD
	struct dm_etcd *e = dm_etcd_open(endpoint, 1000);
	int rc = -ETIMEDOUT;

	if (!e)
		return -errno;
	for (int waited = 0; waited < timeout_ms; waited += 100) {
		void *v = NULL;
		size_t len;

		if (waitpid(pid, NULL, WNOHANG) == pid) {
			rc = -ECHILD;
			break;
		}
		rc = dm_etcd_get(e, "/dmann/ping", &v, &len, NULL);
		free(v);
		if (rc == 0 || rc == -ENOENT) {
			rc = 0;
			break;
		}
		usleep(100000);
	}
	dm_etcd_close(e);
	return rc;
#else
	(void)endpoint;
	(void)pid;
	(void)timeout_ms;
	return -ENOSYS;
#endif
}

void dm_local_etcd_stop(pid_t pid, const char *datadir)
{
	if (pid > 1) {
		kill(pid, SIGTERM);
		for (int i = 0; i < 100 && dm_local_pid_alive(pid); i++) {
			waitpid(pid, NULL, WNOHANG);
			usleep(50000);
		}
		if (dm_local_pid_alive(pid))
			kill(pid, SIGKILL);
	}
	if (datadir && *datadir) {
		char cmd[1200];

		/* Only what local up created: a /dev/shm/dmann-etcd-* or DIR/etcd directory. */
		if (!strncmp(datadir, "/dev/shm/dmann-etcd-", 20) ||
		    (strlen(datadir) > 5 && !strcmp(datadir + strlen(datadir) - 5, "/etcd"))) {
			snprintf(cmd, sizeof(cmd), "rm -rf '%s'", datadir);
			if (system(cmd) != 0)
				fprintf(stderr, "dmann local: could not remove %s\n", datadir);
		}
	}
}
