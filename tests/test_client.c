/* test_client.c: client identities on a local cluster (2 MN + 2 CN, `dmann local up`, which
 * writes the identity [client.local]): a connection made with a client credential may
 * query and read counters, and is refused every admin operation (Q_CONFIG cache size /
 * index reload, FWD_ROUTER routing change) with -EPERM; memory nodes refuse a client
 * identity in the handshake (so a client can neither load an index nor reach remote
 * memory); a wrong client secret or an unknown identity is refused. */
#include <string.h>

#include "cluster_util.h"
#include "config.h"
#include "rpc.h"
#include "wire.h"
#include "xport/xport.h"

static char dir[128], dmann[300], cfgpath[256];
static struct dm_cluster_cfg cfg;

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");
	char err[512];

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-client-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(sh("%s local up --mn 2 --cn 2 --dir %s/lc --region-mb 32 --transport tcp",
			dmann, dir), 0);
	snprintf(cfgpath, sizeof(cfgpath), "%s/lc/cluster.ini", dir);
	cr_assert_eq(dm_config_load_client(cfgpath, "local", &cfg, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(cfg.secret_len, 0, "a client must not read the cluster secret");
}

static void teardown(void)
{
	sh("%s local down --dir %s/lc", dmann, dir);
	if (!getenv("DMANN_KEEP_TEST_DIR"))
		sh("rm -rf %s", dir);
}

/* A transport context for client identity name with secret (len bytes). */
static struct dm_xport *client_xport(const char *name, const uint8_t *secret, size_t len)
{
	struct dm_xport_params p = { .backend = "tcp", .cluster = cfg.name, .secret = secret,
				     .secret_len = len, .client = name };
	struct dm_xport *x = dm_xport_open(&p);

	cr_assert_not_null(x, "open: %s", strerror(errno));
	return x;
}

static const struct dm_client_cfg *me(void)
{
	const struct dm_client_cfg *c = dm_config_client(&cfg, "local");

	cr_assert_not_null(c);
	cr_assert_geq(c->secret_len, 16);
	return c;
}

TestSuite(client, .init = setup, .fini = teardown, .timeout = 240);

Test(client, admin_ops_refused_queries_allowed)
{
	const struct dm_client_cfg *c = me();
	struct dm_xport *x = client_xport(c->name, c->secret, c->secret_len);
	struct dm_msgpool *pool = dm_msgpool_new(x, 16, 4096);

	cr_assert_not_null(pool);
	for (uint32_t n = 0; n < cfg.n_cn; n++) {
		struct dm_conn *conn;
		struct dm_rpc_chan ch;
		uint8_t resp[256], body[64];
		uint32_t rlen = 0;
		struct dm_wire_q_config qc = { .cache_bytes = 1 << 20, .admit_ppm = 100000,
					       .flags = DM_Q_CONFIG_CLEAR };
		struct dm_wire_fwd_rcfg rc = { .set = 1, .strategy = DM_ROUTE_ADAPTIVE };

		cr_assert_eq(dm_xport_connect(x, cfg.cn[n].address, 5000, &conn), 0,
			     "cn%u accepts the client identity", n);
		cr_assert_eq(dm_rpc_chan_init(&ch, conn, pool, 4096, 10000), 0);
		/* Counters: allowed. */
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_Q_STATS, NULL, 0, resp, sizeof(resp), &rlen), 0);
		cr_assert_eq(rlen, sizeof(struct dm_wire_q_stats));
		/* Cache size / clear / index reload: refused. */
		dm_wire_q_config_encode(body, &qc);
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_Q_CONFIG, body, sizeof(qc), NULL, 0, NULL),
			     -EPERM, "Q_CONFIG from a client must be -EPERM");
		/* Routing change: refused, and reading the router's state too (same op). */
		dm_wire_fwd_rcfg_encode(body, &rc);
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_FWD_ROUTER, body, sizeof(rc), resp,
					 sizeof(resp), &rlen), -EPERM,
			     "FWD_ROUTER from a client must be -EPERM");
		/* The connection is still usable afterwards. */
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_Q_STATS, NULL, 0, resp, sizeof(resp), &rlen), 0);
		dm_rpc_chan_fini(&ch);
		dm_conn_close(conn);
	}
	dm_msgpool_free(pool);
	dm_xport_close(x);
}

Test(client, memory_nodes_refuse_clients)
{
	const struct dm_client_cfg *c = me();
	struct dm_xport *x = client_xport(c->name, c->secret, c->secret_len);

	for (uint32_t n = 0; n < cfg.n_mn; n++) {
		struct dm_conn *conn = NULL;

		cr_assert_eq(dm_xport_connect(x, cfg.mn[n].address, 5000, &conn), -EACCES,
			     "mn%u must refuse a client identity", n);
	}
	/* So nothing that talks to the memory nodes (`dmann load`) can run as a client. */
	dm_xport_close(x);
}

Test(client, wrong_secret_or_unknown_identity_refused)
{
	const struct dm_client_cfg *c = me();
	uint8_t bad[64];
	struct dm_xport *x;
	struct dm_conn *conn = NULL;

	memcpy(bad, c->secret, c->secret_len);
	bad[0] ^= 1;
	x = client_xport(c->name, bad, c->secret_len);
	cr_assert_eq(dm_xport_connect(x, cfg.cn[0].address, 5000, &conn), -EACCES);
	dm_xport_close(x);
	x = client_xport("nobody", c->secret, c->secret_len);
	cr_assert_eq(dm_xport_connect(x, cfg.cn[0].address, 5000, &conn), -EACCES);
	dm_xport_close(x);
}
