/* cli_local.h: the parts of `dmann local` in their own files: the cluster (cli_local.c),
 * its etcd (cli_local_etcd.c), the failure drills on one node (cli_local_node.c). */
#ifndef DM_CLI_LOCAL_H
#define DM_CLI_LOCAL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Start a one-member etcd for the local cluster in dir: client URL http://host:client_port
 * (also on 127.0.0.1), peer 127.0.0.1:peer_port, data in datadir when it is set (a restart),
 * else in a new /dev/shm/dmann-etcd-* (else dir/etcd; its path into datadir), log
 * dir/etcd.log. endpoint gets the client URL.
 * Its pid, or -1 with errno (ENOENT: no etcd binary; the message is printed). */
pid_t dm_local_etcd_start(const char *dir, const char *host, int client_port, int peer_port,
			  char *endpoint, size_t ecap, char *datadir, size_t dcap);
/* Wait until etcd at endpoint answers (0), exits (-ECHILD) or timeout_ms pass (-ETIMEDOUT);
 * -ENOSYS when dmann was built without the etcd client. */
int dm_local_etcd_wait(const char *endpoint, pid_t pid, int timeout_ms);
/* SIGTERM (then SIGKILL after 5 s) and remove its data directory (only one local up made). */
void dm_local_etcd_stop(pid_t pid, const char *datadir);

struct dm_cluster_cfg;

/* One node of a local cluster. */
struct node_spec {
	const char *role;   /* "mn" or "cn" */
	int id;
	char ns[64];        /* its network namespace ("" on loopback) */
	char ip[32];
	int port, http_port, metrics_port, https_port;
	pid_t pid;
};

/* The pids file DIR/pids: one line a process, "PID NAME NS" for a node (NAME mn<N> or
 * cn<N>, NS its namespace or "-"; a restarted node gets a new line, the last one counts),
 * "etcd PID DATADIR HOST CLIENT_PORT PEER_PORT" (the last one counts), "netns TAG". */

/* The path of a sibling binary of this executable (name alone: look it up in PATH). */
int dm_local_find_binary(const char *name, char *out, size_t cap);
/* Start node n in the background (setsid, output appended to dir/<role><id>.log, in its
 * namespace if any): its pid, or -1 with errno. */
pid_t dm_local_spawn(const char *dir, const struct node_spec *n, const char *bin);
/* Wait until the node at addr completes a transport handshake (0), exits (-ECHILD, when
 * node_pid > 0 is our child) or timeout_ms pass (-ETIMEDOUT); -EIO: the probe failed. */
int dm_local_wait_ready(const struct dm_cluster_cfg *cfg, const char *ns, const char *addr,
			int timeout_ms, pid_t node_pid);
/* The last lines of dir/<role><id>.log on stderr. */
void dm_local_log_tail(const char *dir, const char *role, int id);
/* Whether pid is a running dmann node process (not a zombie, not a reused pid). */
bool dm_local_pid_is_node(pid_t pid);
/* pid exists and is not a zombie (a node `local up` started is reparented: its zombie may
 * wait for the reaper after it exited, and kill(pid, 0) still succeeds on it). */
bool dm_local_pid_alive(pid_t pid);
/* `dmann local kill|start|stop --dir D NODE` (argv[0] is the action). */
int dm_local_node_cmd(int argc, char **argv);

#endif
