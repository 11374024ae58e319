/* cli_local.h: the parts of `dmann local` in their own files (cli_local_etcd.c). */
#ifndef DM_CLI_LOCAL_H
#define DM_CLI_LOCAL_H

#include <stddef.h>
#include <sys/types.h>

/* Start a one-member etcd for the local cluster in dir: client URL http://host:client_port
 * (also on 127.0.0.1), peer 127.0.0.1:peer_port, data in a new /dev/shm/dmann-etcd-*
 * (else dir/etcd; its path into datadir), log dir/etcd.log. endpoint gets the client URL.
 * Its pid, or -1 with errno (ENOENT: no etcd binary; the message is printed). */
pid_t dm_local_etcd_start(const char *dir, const char *host, int client_port, int peer_port,
			  char *endpoint, size_t ecap, char *datadir, size_t dcap);
/* Wait until etcd at endpoint answers (0), exits (-ECHILD) or timeout_ms pass (-ETIMEDOUT);
 * -ENOSYS when dmann was built without the etcd client. */
int dm_local_etcd_wait(const char *endpoint, pid_t pid, int timeout_ms);
/* SIGTERM (then SIGKILL after 5 s) and remove its data directory (only one local up made). */
void dm_local_etcd_stop(pid_t pid, const char *datadir);

#endif
