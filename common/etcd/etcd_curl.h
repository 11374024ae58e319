/* etcd_curl.h: libcurl for the etcd client, opened with dlopen when the first etcd handle
 * opens instead of being linked into every program. libcurl brings about 25 shared
 * libraries (TLS, Kerberos, LDAP, SSH, RTMP, ...) whose loading and constructors took ~20 ms
 * of CPU at every start of the dmann CLI, also for the commands that never talk to etcd
 * (`dmann route refresh`, `dmann search`, `--help`). The headers are libcurl's own; only the
 * calls the client makes go through this table. */
#ifndef DM_ETCD_CURL_H
#define DM_ETCD_CURL_H

#include <curl/curl.h>

/* The libcurl sonames tried in order: the OpenSSL build (libcurl4), then the GnuTLS one
 * (libcurl3-gnutls); both have the ABI of curl.h's major version 4. */
#define DM_CURL_SONAMES { "libcurl.so.4", "libcurl-gnutls.so.4" }

struct dm_curl_api {
	CURLcode (*global_init)(long flags);
	CURL *(*easy_init)(void);
	CURLcode (*easy_setopt)(CURL *c, CURLoption opt, ...);
	CURLcode (*easy_perform)(CURL *c);
	CURLcode (*easy_getinfo)(CURL *c, CURLINFO info, ...);
	const char *(*easy_strerror)(CURLcode cc);
	void (*easy_cleanup)(CURL *c);
	struct curl_slist *(*slist_append)(struct curl_slist *l, const char *s);
	void (*slist_free_all)(struct curl_slist *l);
};

/* The table, once libcurl is loaded and curl_global_init(CURL_GLOBAL_DEFAULT) succeeded
 * (both done once per process, thread-safe; the reason of a failure logged once); NULL with
 * errno = ELIBACC (no usable libcurl) or EIO (curl_global_init failed). */
const struct dm_curl_api *dm_curl_get(void);

#endif /* DM_ETCD_CURL_H */
