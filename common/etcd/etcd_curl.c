/* etcd_curl.c: libcurl opened with dlopen at the first etcd handle (etcd_curl.h): the
 * library, its symbols and curl_global_init, once per process; a failure is logged once. */
#include "etcd_curl.h"

#include "dm.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct dm_curl_api api;
static const struct dm_curl_api *loaded;   /* &api once everything resolved and initialised */
static int load_errno;

/* One symbol into *slot; false (logged) when libcurl lacks it. */
static bool sym(void *lib, const char *name, void *slot)
{
	void *p = dlsym(lib, name);

	if (!p) {
		dm_warn("etcd: libcurl has no %s", name);
		return false;
	}
	memcpy(slot, &p, sizeof(p));   /* (a data pointer to a function pointer, as POSIX says) */
	return true;
}

static void load(void)
{
	static const char *const names[] = DM_CURL_SONAMES;
	void *lib = NULL;

	load_errno = ELIBACC;
	for (size_t i = 0; !lib && i < sizeof(names) / sizeof(names[0]); i++) {
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!lib && i == 0) {   /* the reason for the usual name, not the fallback's */
			const char *why = dlerror();

			dm_warn("etcd: cannot load libcurl: %s (install libcurl4)",
				why ? why : names[0]);
		}
	}
	if (!lib)
		return;
	if (!sym(lib, "curl_global_init", &api.global_init) ||
	    !sym(lib, "curl_easy_init", &api.easy_init) ||
	    !sym(lib, "curl_easy_setopt", &api.easy_setopt) ||
	    !sym(lib, "curl_easy_perform", &api.easy_perform) ||
	    !sym(lib, "curl_easy_getinfo", &api.easy_getinfo) ||
	    !sym(lib, "curl_easy_strerror", &api.easy_strerror) ||
	    !sym(lib, "curl_easy_cleanup", &api.easy_cleanup) ||
	    !sym(lib, "curl_slist_append", &api.slist_append) ||
	    !sym(lib, "curl_slist_free_all", &api.slist_free_all))
		return;   /* (the library stays mapped: dlclose of a half-used libcurl gains nothing) */
	if (api.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		load_errno = EIO;
		dm_warn("etcd: curl_global_init failed");
		return;
	}
	load_errno = 0;
	loaded = &api;
}

const struct dm_curl_api *dm_curl_get(void)
{
	pthread_once(&once, load);
	if (!loaded)
		errno = load_errno;
	return loaded;
}
