/* test_client_id.c: client identities in the transport (tcp backend): the handshake with a
 * client credential names the identity on the accepting side, a client's one-sided READ of
 * registered memory fails with -EACCES while a node's succeeds, a wrong secret or an
 * unknown name is refused; and the [client.NAME] sections of the cluster file. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "xport/xport.h"

#define CLUSTER "cid-test"
#define SECRET  "cluster-secret-0123456789"
#define CSECRET "client-secret-abcdefghij"

struct acc {
	struct dm_listener *l;
	struct dm_conn *c;
	int rc;
};

static void *acc_main(void *arg)
{
	struct acc *a = arg;

	a->rc = dm_listener_accept(a->l, 5000, &a->c);
	return NULL;
}

/* Connect a context as `client` (NULL: a node) with secret to server context sx; returns the
 * connect status, with the accepted and the connecting end in sc and cc. */
static int connect_as(struct dm_xport *sx, const char *client, const char *secret,
		      struct dm_xport **cx, struct dm_conn **sc, struct dm_conn **cc)
{
	struct dm_xport_params p = { .backend = "tcp", .cluster = CLUSTER,
				     .secret = (const uint8_t *)secret, .secret_len = strlen(secret),
				     .client = client };
	struct acc a = { 0 };
	char addr[64];
	pthread_t t;
	int rc;

	*cx = dm_xport_open(&p);
	cr_assert_not_null(*cx);
	cr_assert_eq(dm_xport_listen(sx, "127.0.0.1:0", &a.l), 0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", dm_listener_port(a.l));
	cr_assert_eq(pthread_create(&t, NULL, acc_main, &a), 0);
	rc = dm_xport_connect(*cx, addr, 5000, cc);
	pthread_join(t, NULL);
	dm_listener_close(a.l);
	*sc = a.c;
	return rc;
}

static int read_one(struct dm_conn *cc, struct dm_xport *cx, struct dm_mr *rmr)
{
	static uint8_t local[64];
	struct dm_mr *lmr;
	struct dm_wc wc = { 0 };
	int n = 0;

	cr_assert_eq(dm_xport_reg(cx, local, sizeof(local), 0, &lmr), 0);
	struct dm_rdma_wr wr = { .wr_id = 1, .local = local, .mr = lmr,
				 .remote = (uintptr_t)rmr->addr, .rkey = rmr->rkey, .len = 64,
				 .flags = DM_WR_SIGNALED };
	cr_assert_eq(dm_conn_read_batch(cc, &wr, 1), 0);
	for (int i = 0; i < 500 && n == 0; i++)
		n = dm_conn_wait(cc, &wc, 1, 10);
	cr_assert_eq(n, 1);
	dm_xport_dereg(cx, lmr);
	return wc.status;
}

Test(client_id, handshake_and_no_remote_access)
{
	struct dm_xport_cred cr = { .name = "bench", .secret_len = strlen(CSECRET) };
	struct dm_xport_params sp = { .backend = "tcp", .cluster = CLUSTER,
				      .secret = (const uint8_t *)SECRET, .secret_len = strlen(SECRET),
				      .creds = &cr, .n_creds = 1 };
	static uint8_t mem[4096];
	struct dm_xport *sx, *cx;
	struct dm_conn *sc, *cc;
	struct dm_mr *mr;

	memcpy(cr.secret, CSECRET, strlen(CSECRET));
	sx = dm_xport_open(&sp);
	cr_assert_not_null(sx);
	cr_assert_eq(dm_xport_reg(sx, mem, sizeof(mem), DM_MR_REMOTE_ALL, &mr), 0);

	/* A node (cluster secret): named "" and may READ. */
	cr_assert_eq(connect_as(sx, NULL, SECRET, &cx, &sc, &cc), 0);
	cr_assert_str_empty(sc->client);
	cr_assert_eq(read_one(cc, cx, mr), 0);
	dm_conn_close(cc);
	dm_conn_close(sc);
	dm_xport_close(cx);

	/* The client identity: named on the server, its READ refused. */
	cr_assert_eq(connect_as(sx, "bench", CSECRET, &cx, &sc, &cc), 0);
	cr_assert_str_eq(sc->client, "bench");
	cr_assert_eq(read_one(cc, cx, mr), -EACCES);
	dm_conn_close(cc);
	dm_conn_close(sc);
	dm_xport_close(cx);

	/* Wrong secret, unknown name, a client proving the cluster secret: refused. */
	cr_assert_eq(connect_as(sx, "bench", SECRET, &cx, &sc, &cc), -EACCES);
	dm_xport_close(cx);
	cr_assert_eq(connect_as(sx, "other", CSECRET, &cx, &sc, &cc), -EACCES);
	dm_xport_close(cx);
	/* A bad identity name is refused when the context opens. */
	struct dm_xport_params bad = { .backend = "tcp", .cluster = CLUSTER,
				       .secret = (const uint8_t *)CSECRET, .secret_len = 20,
				       .client = "no spaces" };
	cr_assert_null(dm_xport_open(&bad));
	dm_xport_dereg(sx, mr);
	dm_xport_close(sx);
}

Test(client_id, cluster_file_sections)
{
	char dir[] = "/tmp/dmann-cid-XXXXXX", path[128], err[512];
	struct dm_cluster_cfg *cfg = calloc(1, sizeof(*cfg));
	FILE *f;

	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/secret", dir);
	f = fopen(path, "w");
	fputs(SECRET "\n", f);
	fclose(f);
	snprintf(path, sizeof(path), "%s/bench.secret", dir);
	f = fopen(path, "w");
	fputs(CSECRET "\n", f);
	fclose(f);
	static const char ok[] = "[cluster]\nname = c\nsecret_file = secret\n"
				 "[client.bench]\nsecret_file = bench.secret\n"
				 "[mn.0]\naddress = 127.0.0.1:1\n";
	cr_assert_eq(dm_config_parse(ok, "t.ini", dir, cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(cfg->n_clients, 1);
	cr_assert_str_eq(cfg->clients[0].name, "bench");
	cr_assert_eq(cfg->clients[0].secret_len, strlen(CSECRET));
	cr_assert_neq(dm_config_parse("[cluster]\nname = c\nsecret_file = secret\n"
				      "[client.b a]\nsecret_file = x\n", "t.ini", dir, cfg, err,
				      sizeof(err)), 0);
	cr_assert(strstr(err, "client name"), "%s", err);
	cr_assert_neq(dm_config_parse("[cluster]\nname = c\nsecret_file = secret\n"
				      "[client.b]\nkey = x\n", "t.ini", dir, cfg, err,
				      sizeof(err)), 0);
	cr_assert(strstr(err, "only secret_file"), "%s", err);
	cr_assert_neq(dm_config_parse("[cluster]\nname = c\nsecret_file = secret\n"
				      "[client.b]\nsecret_file = missing\n", "t.ini", dir, cfg, err,
				      sizeof(err)), 0);
	cr_assert(strstr(err, "[client.b]"), "%s", err);
	/* As the client loads it: the cluster secret is not read (and may be absent). */
	snprintf(path, sizeof(path), "%s/c.ini", dir);
	f = fopen(path, "w");
	fputs("[cluster]\nname = c\nsecret_file = no-such-file\n"
	      "[client.bench]\nsecret_file = bench.secret\n[cn.0]\naddress = 127.0.0.1:1\n", f);
	fclose(f);
	cr_assert_eq(dm_config_load_client(path, "bench", cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(cfg->secret_len, 0);
	cr_assert_eq(dm_config_client(cfg, "bench")->secret_len, strlen(CSECRET));
	cr_assert_eq(dm_config_load_client(path, "nobody", cfg, err, sizeof(err)), -ENOENT);
	free(cfg);
	char cmd[160];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}
