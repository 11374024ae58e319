/* metrics.c: GET /metrics in the Prometheus text format over libmicrohttpd. */
#include "metrics.h"
#include "dm_config.h"

#include <stdlib.h>
#include <string.h>

#if DM_HAVE_HTTP
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include "xport/xport.h"

struct dm_metrics {
	struct MHD_Daemon *d;
	dm_metrics_fn fn;
	void *arg;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_len, void **state)
{
	struct dm_metrics *m = cls;
	struct MHD_Response *r;
	enum MHD_Result ret;
	unsigned status = MHD_HTTP_OK;
	char *body = NULL;
	size_t len = 0;
	FILE *f;

	(void)version;
	(void)upload;
	(void)upload_len;
	(void)state;
	if (strcmp(method, "GET")) {
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
		body = strdup("only GET\n");
	} else if (strcmp(url, "/metrics")) {
		status = MHD_HTTP_NOT_FOUND;
		body = strdup("see /metrics\n");
	} else {
		f = open_memstream(&body, &len);
		if (f) {
			m->fn(m->arg, f);
			fclose(f);
		}
	}
	if (!body)
		return MHD_NO;
	r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

struct dm_metrics *dm_metrics_start(const char *addr, dm_metrics_fn fn, void *arg)
{
	char host[128], port[16];
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct dm_metrics *m;
	long p;

	if (dm_addr_split(addr, host, sizeof(host), port, sizeof(port)) ||
	    inet_pton(AF_INET, host, &sa.sin_addr) != 1 || (p = strtol(port, NULL, 10)) <= 0 ||
	    p > 65535) {
		errno = EINVAL;
		return NULL;
	}
	sa.sin_port = htons((uint16_t)p);
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->fn = fn;
	m->arg = arg;
	m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
				answer, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
				MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
				MHD_OPTION_END);
	if (!m->d) {
		free(m);
		errno = EADDRINUSE;
		return NULL;
	}
	return m;
}

void dm_metrics_stop(struct dm_metrics *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->d);
	free(m);
}
#else
struct dm_metrics *dm_metrics_start(const char *addr, dm_metrics_fn fn, void *arg)
{
	(void)addr;
	(void)fn;
	(void)arg;
	errno = ENOSYS;
	return NULL;
}

void dm_metrics_stop(struct dm_metrics *m)
{
	(void)m;
}
#endif
