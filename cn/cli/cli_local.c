/* cli_local.c: `dmann local up|down`: a local cluster for tests, benchmarks and the demo
 * (the drills on one node, kill|stop|start, are in cli_local_node.c).
 *
 * up:   writes DIR/cluster.ini (+ DIR/secret, DIR/s3.secret, DIR/client.secret of the
 *       client identity [client.local]), starts N memory nodes and M
 *       compute nodes as background processes (logs in DIR/<node>.log, pids in DIR/pids),
 *       and returns once every node accepts connections. On loopback each node gets a port
 *       of 127.0.0.1; with --netns each node runs in its own network namespace, joined to a
 *       bridge namespace by a veth pair whose both ends are rate-limited with tc (tbf), so
 *       that the network, not the CPU, is the bottleneck (needs root).
 * down: SIGTERM to every process of DIR/pids (SIGKILL after a grace period), then deletes
 *       the namespaces it created. Safe to run twice. */
#include <fcntl.h>
#include <stdarg.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_local.h"
#include "cluster.h"
#include "dm.h"
#include <sched.h>

#define NS_PREFIX "dmann"

static void local_usage(FILE *f)
{
	fprintf(f,
		"usage: dmann local up --mn N --cn M --dir DIR [--netns --rate RATE] [--region-mb MB]\n"
		"                       [--redundancy R] [--base-port P] [--transport tcp|verbs] [--host IP]\n"
		"                       [--router KEY=VALUE ...] [--cn-set KEY=VALUE ...]\n"
		"                       [--mn-set KEY=VALUE ...]\n"
		"                       [--s3-set KEY=VALUE ...] [--s3-identity NAME ...] [--https]\n"
		"       dmann local down --dir DIR\n"
		"       dmann local kill|stop|start --dir DIR NODE   (failure drills: --help)\n\n"
		"Start (or stop) a local dmann cluster: N memory nodes and M compute nodes as\n"
		"background processes. `up` writes DIR/cluster.ini (nodes, the compute nodes' HTTP\n"
		"endpoints, test credentials) and returns when every node accepts connections.\n\n"
		"  --mn N          memory nodes (1..16, default 2)\n"
		"  --cn M          compute nodes (0..16, default 2)\n"
		"  --dir DIR       state directory (created; config, logs, pids, snapshots)\n"
		"  --netns         one network namespace per node, joined by rate-limited veth\n"
		"                  links to a bridge (needs root, iproute2 and tc)\n"
		"  --rate RATE     tc rate of every link with --netns (default 1gbit)\n"
		"  --region-mb MB  memory-node region size (1..1048576, default 512)\n"
		"  --redundancy R  replicas of every index block ([cluster] redundancy, 1..N,\n"
		"                  default 1)\n"
		"  --base-port P   first port (default: a free range chosen at random, below the\n"
		"                  kernel's ephemeral range)\n"
		"  --transport T   tcp (default) or verbs\n"
		"  --host IP       address of every node on loopback mode (default 127.0.0.1; with\n"
		"                  verbs use the IP of the RDMA netdev, e.g. rxe0's eth0)\n"
		"  --router K=V    a [router] setting of the cluster file (repeatable), e.g.\n"
		"                  --router strategy=adaptive --router recluster_secs=5\n"
		"  --cn-set K=V    a [cn] setting (repeatable), e.g. --cn-set cache=10%%\n"
		"  --s3-set K=V    an [s3] setting (repeatable), e.g. --s3-set policy_default=deny\n"
		"  --mn-set K=V    an [mn] setting (repeatable), e.g. --mn-set flat_max_mb=64\n"
		"  --s3-identity NAME  one more S3 identity (repeatable, at most 8): access key\n"
		"                  DMANNID<NAME upper-cased>, secret in DIR/s3.NAME.secret\n"
		"  --https         also serve the gateway over HTTPS (every CN's `https` port) with a\n"
		"                  self-signed certificate for 127.0.0.1/localhost written to\n"
		"                  DIR/s3.crt (trust it in clients) and DIR/s3.key (openssl CLI)\n"
		"  --no-etcd       no cluster state: by default a local etcd (data on /dev/shm,\n"
		"                  log DIR/etcd.log) starts first, the cluster file names it\n"
		"                  ([cluster] etcd) and every node registers there; down stops it\n"
		"  --member-lease S  [cluster] member_lease_s, the nodes' heartbeat lease (2..60,\n"
		"                  default 5)\n");
}

/* Run a shell-free command line (argv) and wait; 0 if it exited 0. */
static int run_cmd(char *const argv[], bool quiet)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		if (quiet) {
			int fd = open("/dev/null", O_WRONLY);

			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
			}
		}
		execvp(argv[0], argv);
		_exit(127);
	}
	if (waitpid(pid, &st, 0) < 0)
		return -errno;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

static int runf(bool quiet, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Split a formatted command on spaces (no quoting needed for our fixed commands). */
static int runf(bool quiet, const char *fmt, ...)
{
	char line[512], *argv[32], *save = NULL, *tok;
	int n = 0, rc;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	for (tok = strtok_r(line, " ", &save); tok && n < 31; tok = strtok_r(NULL, " ", &save))
		argv[n++] = tok;
	argv[n] = NULL;
	rc = run_cmd(argv, quiet);
	if (rc && !quiet)
		fprintf(stderr, "dmann local: command failed: %s\n", line);
	return rc;
}

/* Directory of this executable; sibling binaries are looked up there and in ../mn. */
int dm_local_find_binary(const char *name, char *out, size_t cap)
{
	char self[PATH_MAX], *slash;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	const char *cands[] = { "%s/%s", "%s/../mn/%s", "%s/../cn/%s" };

	if (n > 0) {
		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash)
			*slash = '\0';
		for (size_t i = 0; i < DM_ARRAY_SIZE(cands); i++) {
			snprintf(out, cap, cands[i], self, name);
			if (access(out, X_OK) == 0)
				return 0;
		}
	}
	/* Installed: rely on PATH. */
	snprintf(out, cap, "%s", name);
	return 0;
}

static int write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
	size_t len = strlen(text);

	if (fd < 0)
		return -errno;
	if (write(fd, text, len) != (ssize_t)len) {
		close(fd);
		return -EIO;
	}
	close(fd);
	return 0;
}

static int random_secret(char *hex, size_t n)
{
	unsigned char b[32];
	int fd = open("/dev/urandom", O_RDONLY);

	if (fd < 0 || read(fd, b, sizeof(b)) != (ssize_t)sizeof(b)) {
		if (fd >= 0)
			close(fd);
		return -EIO;
	}
	close(fd);
	for (size_t i = 0; i < sizeof(b) && 2 * i + 2 < n; i++)
		snprintf(hex + 2 * i, 3, "%02x", b[i]);
	return 0;
}

/* The last lines of a node's log on stderr, so a failed start says why where it is seen. */
void dm_local_log_tail(const char *dir, const char *role, int id)
{
	char p[PATH_MAX], line[512], ring[8][512];
	unsigned n = 0;
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s%d.log", dir, role, id);
	f = fopen(p, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		snprintf(ring[n++ % 8], sizeof(ring[0]), "%s", line);
	fclose(f);
	for (unsigned i = n > 8 ? n - 8 : 0; i < n; i++)
		fprintf(stderr, "  %s%d.log: %s", role, id, ring[i % 8]);
}

/* The kernel's ephemeral port range (outgoing connections take their local port from it). */
static void ephemeral_range(int *lo, int *hi)
{
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

	*lo = 32768;
	*hi = 60999;
	if (f) {
		if (fscanf(f, "%d %d", lo, hi) != 2) {
			*lo = 32768;
			*hi = 60999;
		}
		fclose(f);
	}
}

/* A port p such that p .. p+span-1 are free on 127.0.0.1 right now, chosen outside the
 * ephemeral range: a port in it can be taken by any outgoing connection (another node's
 * connection to a memory node, curl, a test) between this check and the node's bind. */
static int pick_ports(int span)
{
	struct timespec ts;
	int elo, ehi, lo = 10000, hi;

	ephemeral_range(&elo, &ehi);
	/* [10000, elo) when it is wide enough, else (ehi, 65535]. */
	if (elo - lo >= 4 * span) {
		hi = elo - span;
	} else {
		lo = ehi + 1;
		hi = 65535 - span;
		if (hi - lo < 4 * span) {
			lo = 10000;
			hi = 65535 - span;
		}
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	srand((unsigned)(ts.tv_nsec ^ getpid()));
	for (int attempt = 0; attempt < 50; attempt++) {
		int base = lo + rand() % (hi - lo), ok = 1;

		for (int i = 0; i < span && ok; i++) {
			struct sockaddr_in a = { .sin_family = AF_INET,
						 .sin_port = htons((uint16_t)(base + i)),
						 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
			int fd = socket(AF_INET, SOCK_STREAM, 0);

			if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)))
				ok = 0;
			if (fd >= 0)
				close(fd);
		}
		if (ok)
			return base;
	}
	return -EADDRINUSE;
}

/* Wait until the node at addr completes a transport handshake (from inside namespace ns,
 * if any): a real readiness check that also proves the node got the cluster secret. */
int dm_local_wait_ready(const struct dm_cluster_cfg *cfg, const char *ns, const char *addr,
		      int timeout_ms, pid_t node_pid)
{
	uint64_t deadline = dm_now_ns() + (uint64_t)timeout_ms * 1000000;

	while (dm_now_ns() < deadline) {
		pid_t probe;
		int st;

		if (node_pid > 0 && waitpid(node_pid, &st, WNOHANG) == node_pid)
			return -ECHILD;   /* the node exited: its log says why */
		probe = fork();
		if (probe < 0)
			return -errno;
		if (probe == 0) {
			struct dm_xport *x;
			struct dm_conn *c;
			char p[PATH_MAX];
			int fd;

			if (ns) {
				snprintf(p, sizeof(p), "/var/run/netns/%s", ns);
				fd = open(p, O_RDONLY | O_CLOEXEC);
				if (fd < 0 || setns(fd, CLONE_NEWNET))
					_exit(3);
			}
			dm_log_set_level(DM_LOG_ERROR);
			x = dm_cluster_xport(cfg, NULL);
			if (!x)
				_exit(2);
			if (dm_xport_connect(x, addr, 1000, &c))
				_exit(1);
			dm_conn_close(c);
			dm_xport_close(x);
			_exit(0);
		}
		if (waitpid(probe, &st, 0) == probe && WIFEXITED(st)) {
			if (WEXITSTATUS(st) == 0)
				return 0;
			if (WEXITSTATUS(st) >= 2)
				return -EIO;
		}
		usleep(100000);
	}
	return -ETIMEDOUT;
}

/* Start one node in the background: setsid, output to DIR/<role><id>.log. */
pid_t dm_local_spawn(const char *dir, const struct node_spec *n, const char *bin)
{
	char log[PATH_MAX], cfg[PATH_MAX], id[16];
	pid_t pid;

	snprintf(log, sizeof(log), "%s/%s%d.log", dir, n->role, n->id);
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", dir);
	snprintf(id, sizeof(id), "%d", n->id);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		setsid();
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0) {
			dup2(fd, 0);
			close(fd);
		}
		if (n->ns[0]) {
			char *argv[] = { "ip", "netns", "exec", (char *)n->ns, (char *)bin, "--config",
					 cfg, "--id", id, NULL };
			execvp("ip", argv);
		} else {
			char *argv[] = { (char *)bin, "--config", cfg, "--id", id, NULL };
			execv(bin, argv);
		}
		_exit(127);
	}
	return pid;
}

static void netns_down(const char *tag)
{
	char name[64];

	for (int i = 0; i < 40; i++) {
		snprintf(name, sizeof(name), NS_PREFIX "-%s-%d", tag, i);
		runf(true, "ip netns del %s", name);
	}
	snprintf(name, sizeof(name), NS_PREFIX "-%s-br", tag);
	runf(true, "ip netns del %s", name);
	runf(true, "ip link del dmh%s", tag);
}

/* Bridge namespace + one namespace per node, veth to the bridge, tbf on both ends. */
static int netns_up(const char *tag, struct node_spec *nodes, int nn, const char *rate)
{
	char br[64];

	snprintf(br, sizeof(br), NS_PREFIX "-%s-br", tag);
	/* The host (where dmann load / bench / demo run) joins the bridge as 10.213.0.1. */
	if (runf(false, "ip netns add %s", br) ||
	    runf(false, "ip -n %s link add br0 type bridge", br) ||
	    runf(false, "ip -n %s link set br0 up", br) ||
	    runf(false, "ip link add dmh%s type veth peer name dmhb%s", tag, tag) ||
	    runf(false, "ip link set dmhb%s netns %s", tag, br) ||
	    runf(false, "ip -n %s link set dmhb%s master br0", br, tag) ||
	    runf(false, "ip -n %s link set dmhb%s up", br, tag) ||
	    runf(false, "ip addr add 10.213.0.1/24 dev dmh%s", tag) ||
	    runf(false, "ip link set dmh%s up", tag))
		return -EIO;
	for (int i = 0; i < nn; i++) {
		struct node_spec *n = &nodes[i];

		snprintf(n->ns, sizeof(n->ns), NS_PREFIX "-%s-%d", tag, i);
		snprintf(n->ip, sizeof(n->ip), "10.213.%d.%d", 0, 10 + i);
		if (runf(false, "ip netns add %s", n->ns) ||
		    runf(false, "ip -n %s link set lo up", n->ns) ||
		    runf(false, "ip link add dmv%s%d type veth peer name dmb%s%d", tag, i, tag, i) ||
		    runf(false, "ip link set dmv%s%d netns %s name eth0", tag, i, n->ns) ||
		    runf(false, "ip link set dmb%s%d netns %s", tag, i, br) ||
		    runf(false, "ip -n %s link set dmb%s%d master br0", br, tag, i) ||
		    runf(false, "ip -n %s link set dmb%s%d up", br, tag, i) ||
		    runf(false, "ip -n %s addr add %s/24 dev eth0", n->ns, n->ip) ||
		    runf(false, "ip -n %s link set eth0 up", n->ns) ||
		    runf(false, "ip netns exec %s tc qdisc add dev eth0 root tbf rate %s burst 256kb latency 50ms",
			 n->ns, rate) ||
		    runf(false, "ip netns exec %s tc qdisc add dev dmb%s%d root tbf rate %s burst 256kb latency 50ms",
			 br, tag, i, rate))
			return -EIO;
	}
	return 0;
}

static int cmd_down(int argc, char **argv);

/* KEY=VALUE options as "KEY = VALUE" lines (under [section] when given and n > 0). */
static void put_sets(FILE *f, const char *section, const char *const *set, int n)
{
	if (section && n)
		fprintf(f, "\n[%s]\n", section);
	for (int i = 0; i < n; i++) {
		const char *eq = strchr(set[i], '=');

		fprintf(f, "%.*s = %s\n", (int)(eq - set[i]), set[i], eq + 1);
	}
}

/* The access key of --s3-identity NAME: DMANNID + NAME upper-cased. */
static void identity_key(const char *name, char *out, size_t cap)
{
	size_t j = (size_t)snprintf(out, cap, "DMANNID");

	for (const char *p = name; *p && j + 1 < cap; p++)
		out[j++] = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
	out[j] = 0;
}

/* The secrets of the extra identities and, for --https, a self-signed certificate. */
static int s3_extras(const char *dir, const char *const *ids, int nids, bool https)
{
	char path[PATH_MAX], sec[80];

	for (int i = 0; i < nids; i++) {
		snprintf(path, sizeof(path), "%s/s3.%s.secret", dir, ids[i]);
		if (random_secret(sec, sizeof(sec)) || write_file(path, sec, 0600)) {
			fprintf(stderr, "dmann local up: cannot write %s\n", path);
			return -EIO;
		}
	}
	if (https && runf(true, "openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "
			  "/CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost "
			  "-keyout %s/s3.key -out %s/s3.crt", dir, dir)) {
		fprintf(stderr, "dmann local up: cannot make a certificate (openssl CLI needed)\n");
		return -EIO;
	}
	return 0;
}

static int cmd_up(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "mn", required_argument, NULL, 'm' }, { "cn", required_argument, NULL, 'c' },
		{ "dir", required_argument, NULL, 'd' }, { "netns", no_argument, NULL, 'n' },
		{ "rate", required_argument, NULL, 'r' }, { "region-mb", required_argument, NULL, 'R' },
		{ "base-port", required_argument, NULL, 'p' },
		{ "redundancy", required_argument, NULL, 'D' },
		{ "transport", required_argument, NULL, 't' }, { "host", required_argument, NULL, 'H' },
		{ "router", required_argument, NULL, 'o' }, { "cn-set", required_argument, NULL, 'C' },
		{ "s3-set", required_argument, NULL, 'S' }, { "mn-set", required_argument, NULL, 'M' },
		{ "s3-identity", required_argument, NULL, 'I' }, { "https", no_argument, NULL, 'T' },
		{ "no-etcd", no_argument, NULL, 'E' }, { "member-lease", required_argument, NULL, 'L' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	unsigned long long nmn = 2, ncn = 2, region = 512, base = 0, redundancy = 1, lease_s = 5;
	const char *rset[16], *cset[16], *sset[16], *mset[16], *ids[8];
	int nrset = 0, ncset = 0, nsset = 0, nmset = 0, nids = 0;
	bool https = false, etcd = DM_HAVE_ETCD;
	char etcd_ep[160] = "", etcd_dir[1024] = "";
	pid_t etcd_pid = -1;
	const char *dir = NULL, *rate = "1gbit", *transport = "tcp", *host = "127.0.0.1";
	bool netns = false;
	struct node_spec nodes[32];
	char path[PATH_MAX], secret[80], s3secret[80], tag[16], bin_mn[PATH_MAX], bin_cn[PATH_MAX];
	char *ini = NULL, addr[64], err[1024];
	struct dm_cluster_cfg *cfg;
	size_t inilen = 0;
	FILE *f;
	int c, nn, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'm': if (dm_cli_parse_u64("local up", "--mn", optarg, 1, 16, &nmn)) return 2; break;
		case 'c': if (dm_cli_parse_u64("local up", "--cn", optarg, 0, 16, &ncn)) return 2; break;
		case 'd': dir = optarg; break;
		case 'n': netns = true; break;
		case 'r': rate = optarg; break;
		case 'R': if (dm_cli_parse_u64("local up", "--region-mb", optarg, 1, 1 << 20, &region)) return 2; break;
		case 'D': if (dm_cli_parse_u64("local up", "--redundancy", optarg, 1, 16, &redundancy)) return 2; break;
		case 'p': if (dm_cli_parse_u64("local up", "--base-port", optarg, 1024, 65000, &base)) return 2; break;
		case 't':
			if (strcmp(optarg, "tcp") && strcmp(optarg, "verbs")) {
				fprintf(stderr, "dmann local up: --transport must be tcp or verbs\n");
				return 2;
			}
			transport = optarg;
			break;
		case 'H': {
			struct in_addr ia;

			if (inet_pton(AF_INET, optarg, &ia) != 1) {
				fprintf(stderr, "dmann local up: --host '%s' is not an IPv4 address\n", optarg);
				return 2;
			}
			host = optarg;
			break;
		}
		case 'T': https = true; break;
		case 'I':
			if (nids == (int)DM_ARRAY_SIZE(ids) || !*optarg || strlen(optarg) > 32 ||
			    strspn(optarg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
				   "0123456789") != strlen(optarg)) {
				fprintf(stderr, "dmann local up: --s3-identity '%s': want 1..32 letters "
					"or digits (at most %zu identities)\n", optarg,
					DM_ARRAY_SIZE(ids));
				return 2;
			}
			ids[nids++] = optarg;
			break;
		case 'o':
		case 'S':
		case 'M':
		case 'C': {
			const char *eq = strchr(optarg, '=');
			const char **set = c == 'o' ? rset : c == 'S' ? sset : c == 'M' ? mset : cset;
			int *nset = c == 'o' ? &nrset : c == 'S' ? &nsset : c == 'M' ? &nmset : &ncset;

			/* The key and value are checked by the config parser below. */
			if (!eq || eq == optarg || strpbrk(optarg, "\n\r[];#") ||
			    *nset == (int)DM_ARRAY_SIZE(rset)) {
				fprintf(stderr, "dmann local up: --%s '%s': want KEY=VALUE (at most %zu)\n",
					c == 'o' ? "router" : c == 'S' ? "s3-set" : c == 'M' ? "mn-set" :
					"cn-set", optarg,
					DM_ARRAY_SIZE(rset));
				return 2;
			}
			set[(*nset)++] = optarg;
			break;
		}
		case 'E': etcd = false; break;
		case 'L':
			if (dm_cli_parse_u64("local up", "--member-lease", optarg, 2, 60, &lease_s))
				return 2;
			break;
		case 'h': local_usage(stdout); return 0;
		default: dm_cli_bad_option("local up", c, argv, optind); return 2;
		}
	}
	if (!dir || optind != argc) {
		local_usage(stderr);
		return 2;
	}
	if (strspn(rate, "0123456789kmgbitKMGBps") != strlen(rate) || !*rate) {
		fprintf(stderr, "dmann local up: --rate '%s' is not a tc rate like 1gbit\n", rate);
		return 2;
	}
	if (netns && geteuid() != 0) {
		fprintf(stderr, "dmann local up: --netns needs root (network namespaces, veth, tc)\n");
		return 1;
	}
	if (mkdir(dir, 0700) && errno != EEXIST) {
		fprintf(stderr, "dmann local up: cannot create %s: %s\n", dir, strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "%s/pids", dir);
	if (access(path, F_OK) == 0) {
		fprintf(stderr, "dmann local up: %s exists: a cluster is running there "
			"(dmann local down --dir %s first)\n", path, dir);
		return 1;
	}
	nn = (int)(nmn + ncn);
	if (!base) {
		base = (unsigned long long)pick_ports(4 * nn + 2);   /* + etcd client, peer */
		if ((long long)base < 0) {
			fprintf(stderr, "dmann local up: no free port range on 127.0.0.1\n");
			return 1;
		}
	}
	snprintf(tag, sizeof(tag), "%llx", base % 0xfff);
	for (int i = 0; i < nn; i++) {
		nodes[i] = (struct node_spec){ .role = i < (int)nmn ? "mn" : "cn",
					       .id = i < (int)nmn ? i : i - (int)nmn };
		snprintf(nodes[i].ip, sizeof(nodes[i].ip), "%s", host);
		nodes[i].port = (int)base + i;
		nodes[i].http_port = (int)base + nn + i;
		nodes[i].metrics_port = (int)base + 2 * nn + i;
		nodes[i].https_port = (int)base + 3 * nn + i;
	}
	if (netns) {
		netns_down(tag);
		if (netns_up(tag, nodes, nn, rate)) {
			netns_down(tag);
			return 1;
		}
	}
	if (random_secret(secret, sizeof(secret)) || random_secret(s3secret, sizeof(s3secret))) {
		fprintf(stderr, "dmann local up: cannot read /dev/urandom\n");
		return 1;
	}
	snprintf(path, sizeof(path), "%s/secret", dir);
	strcat(secret, "\n");
	if (write_file(path, secret, 0600)) {
		fprintf(stderr, "dmann local up: cannot write %s\n", path);
		return 1;
	}
	snprintf(path, sizeof(path), "%s/s3.secret", dir);
	write_file(path, s3secret, 0600);
	if (s3_extras(dir, ids, nids, https))
		return 1;
	/* A client identity for libdmann, the Python binding and the CLI's data commands. */
	if (random_secret(s3secret, sizeof(s3secret))) {
		fprintf(stderr, "dmann local up: cannot read /dev/urandom\n");
		return 1;
	}
	snprintf(path, sizeof(path), "%s/client.secret", dir);
	write_file(path, s3secret, 0600);

	/* The cluster state: a local etcd, before the nodes (they register at start). */
	if (etcd) {
		etcd_pid = dm_local_etcd_start(dir, netns ? "10.213.0.1" : host, (int)base + 4 * nn,
					       (int)base + 4 * nn + 1, etcd_ep, sizeof(etcd_ep),
					       etcd_dir, sizeof(etcd_dir));
		if (etcd_pid < 0 || (rc = dm_local_etcd_wait(etcd_ep, etcd_pid, 20000))) {
			if (etcd_pid > 0)
				fprintf(stderr, "dmann local up: etcd did not start (%s); see "
					"%s/etcd.log\n", strerror(-rc), dir);
			dm_local_etcd_stop(etcd_pid, etcd_dir);
			if (netns)
				netns_down(tag);
			return 1;
		}
	}
	f = open_memstream(&ini, &inilen);
	fprintf(f, "; written by dmann local up\n[cluster]\nname = local-%s\nsecret_file = secret\n"
		   "transport = %s\nredundancy = %llu\n", tag, transport, redundancy);
	if (etcd_ep[0])
		fprintf(f, "; the cluster state: a local etcd, stopped by local down\n"
			   "etcd = %s\nmember_lease_s = %llu\n", etcd_ep, lease_s);
	fprintf(f, "\n[s3]\naccess_key = DMANNLOCALTEST\nsecret_key_file = s3.secret\n");
	put_sets(f, NULL, sset, nsset);
	if (https)
		fprintf(f, "https_cert = s3.crt\nhttps_key = s3.key\n");
	for (int i = 0; i < nids; i++) {
		char ak[48];

		identity_key(ids[i], ak, sizeof(ak));
		fprintf(f, "\n[s3.identity.%s]\naccess_key = %s\nsecret_key_file = s3.%s.secret\n",
			ids[i], ak, ids[i]);
	}
	fprintf(f, "\n[client.local]\nsecret_file = client.secret\n");
	put_sets(f, "mn", mset, nmset);
	put_sets(f, "router", rset, nrset);
	put_sets(f, "cn", cset, ncset);
	if (netns)
		fprintf(f, "; netns mode: one namespace per node (" NS_PREFIX "-%s-N), links at %s\n", tag, rate);
	for (int i = 0; i < nn; i++) {
		fprintf(f, "\n[%s.%d]\naddress = %s:%d\nmetrics = %s:%d\n", nodes[i].role, nodes[i].id,
			nodes[i].ip, nodes[i].port, nodes[i].ip, nodes[i].metrics_port);
		if (!strcmp(nodes[i].role, "mn"))
			fprintf(f, "region_mb = %llu\n", region);
		else
			fprintf(f, "http = %s:%d\n", nodes[i].ip, nodes[i].http_port);
		if (https && strcmp(nodes[i].role, "mn"))
			fprintf(f, "https = %s:%d\n", nodes[i].ip, nodes[i].https_port);
	}
	fclose(f);
	snprintf(path, sizeof(path), "%s/cluster.ini", dir);
	rc = write_file(path, ini, 0644);
	free(ini);
	if (rc) {
		fprintf(stderr, "dmann local up: cannot write %s\n", path);
		return 1;
	}

	cfg = calloc(1, sizeof(*cfg));
	if (!cfg || dm_config_load(path, cfg, err, sizeof(err))) {
		fprintf(stderr, "dmann local up: %s\n", cfg ? err : "out of memory");
		free(cfg);
		return 1;
	}
	dm_local_find_binary("dmann-mn", bin_mn, sizeof(bin_mn));
	dm_local_find_binary("dmann-cn", bin_cn, sizeof(bin_cn));
	snprintf(path, sizeof(path), "%s/pids", dir);
	f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "dmann local up: cannot write %s\n", path);
		return 1;
	}
	if (netns)
		fprintf(f, "netns %s\n", tag);
	if (etcd_pid > 0)
		fprintf(f, "etcd %d %s %s %d %d\n", (int)etcd_pid, etcd_dir,
			netns ? "10.213.0.1" : host, (int)base + 4 * nn, (int)base + 4 * nn + 1);
	rc = 0;
	/* Memory nodes first: compute nodes connect to them at start. */
	for (int i = 0; i < nn && !rc; i++) {
		struct node_spec *n = &nodes[i];

		n->pid = dm_local_spawn(dir, n, !strcmp(n->role, "mn") ? bin_mn : bin_cn);
		if (n->pid < 0) {
			rc = -errno;
			break;
		}
		fprintf(f, "%d %s%d %s\n", (int)n->pid, n->role, n->id, n->ns[0] ? n->ns : "-");
		fflush(f);
		snprintf(addr, sizeof(addr), "%s:%d", n->ip, n->port);
		rc = dm_local_wait_ready(cfg, netns ? n->ns : NULL, addr, 30000, n->pid);
		if (rc)
			fprintf(stderr, "dmann local up: %s%d did not start (%s); see %s/%s%d.log\n",
				n->role, n->id, rc == -ECHILD ? "it exited" :
				rc == -ETIMEDOUT ? "no handshake within 30 s" : "probe failed",
				dir, n->role, n->id);
		if (rc)
			dm_local_log_tail(dir, n->role, n->id);
	}
	fclose(f);
	free(cfg);
	if (rc) {
		char *dargv[] = { "down", "--dir", (char *)dir, NULL };

		cmd_down(3, dargv);
		return 1;
	}
	printf("dmann local: %llu memory + %llu compute nodes up (%s); config %s/cluster.ini\n",
	       nmn, ncn, netns ? "network namespaces" : "loopback", dir);
	return 0;
}

static int cmd_down(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dir", required_argument, NULL, 'd' }, { "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *dir = NULL;
	char path[PATH_MAX], line[1200], tag[32] = "", etcd_dir[1024] = "";
	int etcd_pid = -1;
	pid_t pids[64];
	int np = 0, c;
	FILE *f;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'd': dir = optarg; break;
		case 'h': local_usage(stdout); return 0;
		default: dm_cli_bad_option("local down", c, argv, optind); return 2;
		}
	}
	if (!dir || optind != argc) {
		local_usage(stderr);
		return 2;
	}
	snprintf(path, sizeof(path), "%s/pids", dir);
	f = fopen(path, "r");
	if (!f) {
		printf("dmann local: nothing running in %s\n", dir);
		return 0;
	}
	while (fgets(line, sizeof(line), f)) {
		int pid;

		if (sscanf(line, "netns %31s", tag) == 1)
			continue;
		if (sscanf(line, "etcd %d %1023s", &etcd_pid, etcd_dir) >= 1)
			continue;
		/* Only processes that are still dmann nodes: a killed node's pid may be reused. */
		if (sscanf(line, "%d", &pid) == 1 && np < 64 && dm_local_pid_is_node(pid))
			pids[np++] = pid;
	}
	fclose(f);
	for (int i = 0; i < np; i++)
		kill(pids[i], SIGTERM);
	/* Give nodes time to snapshot; then make sure. */
	for (int waited = 0; waited < 200; waited++) {
		int alive = 0;

		for (int i = 0; i < np; i++) {
			waitpid(pids[i], NULL, WNOHANG);
			if (dm_local_pid_alive(pids[i]))
				alive++;
		}
		if (!alive)
			break;
		usleep(50000);
	}
	for (int i = 0; i < np; i++)
		if (dm_local_pid_alive(pids[i])) {
			fprintf(stderr, "dmann local: pid %d did not stop in 10 s; killing it\n", pids[i]);
			kill(pids[i], SIGKILL);
		}
	/* etcd last: the nodes revoke their leases as they stop. */
	if (etcd_pid > 1) {
		dm_local_etcd_stop(etcd_pid, etcd_dir);
		np++;
	}
	if (tag[0])
		netns_down(tag);
	unlink(path);
	printf("dmann local: stopped %d processes in %s\n", np, dir);
	return 0;
}

int dm_cmd_local(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		local_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "up"))
		return cmd_up(argc - 1, argv + 1);
	if (!strcmp(argv[1], "down"))
		return cmd_down(argc - 1, argv + 1);
	if (!strcmp(argv[1], "kill") || !strcmp(argv[1], "stop") || !strcmp(argv[1], "start"))
		return dm_local_node_cmd(argc - 1, argv + 1);
	fprintf(stderr, "dmann local: unknown action '%s' (up, down, kill, stop or start)\n",
		argv[1]);
	return 2;
}
