/* mem.c: hugepage, NUMA-local allocation of registered regions with an ordinary-page
 * fallback. libhugetlbfs finds a mounted hugetlbfs and the default huge page size. */
#include "mem.h"

#include <hugetlbfs.h>
#include <numa.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int read_int_file(const char *path, int *out)
{
	FILE *f = fopen(path, "r");
	int v, ok;

	if (!f)
		return -errno;
	ok = fscanf(f, "%d", &v) == 1;
	fclose(f);
	if (!ok)
		return -EINVAL;
	*out = v;
	return 0;
}

int dm_dev_numa_node(const char *dev)
{
	char path[256];
	int node;

	if (!dev || !*dev || strchr(dev, '/'))
		return -1;
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/numa_node", dev);
	if (read_int_file(path, &node) == 0 && node >= 0)
		return node;
	snprintf(path, sizeof(path), "/sys/class/net/%s/device/numa_node", dev);
	if (read_int_file(path, &node) == 0 && node >= 0)
		return node;
	return -1;
}

/* Bind [addr, addr+len) to node before first touch, so the pages are faulted there. */
static void bind_node(void *addr, size_t len, int node)
{
	if (node < 0 || numa_available() < 0)
		return;
	if (node > numa_max_node()) {
		dm_warn("mem: NUMA node %d does not exist (max %d); region left unbound",
			node, numa_max_node());
		return;
	}
	numa_tonode_memory(addr, len, node);
}

static int alloc_huge(struct dm_region *r, size_t len, int node)
{
	long hps = gethugepagesize();
	size_t sz;
	void *p;

	if (hps <= 0)
		return -ENOENT;
	sz = DM_ALIGN_UP(len, (size_t)hps);
	/* GHP_DEFAULT: hugetlbfs-backed mapping; NULL when no pages are reserved. */
	p = get_huge_pages(sz, GHP_DEFAULT);
	if (!p)
		return -ENOMEM;
	bind_node(p, sz, node);
	memset(p, 0, sz);
	r->addr = p;
	r->len = sz;
	r->huge = true;
	r->page_size = (size_t)hps;
	return 0;
}

int dm_region_alloc(struct dm_region *r, size_t len, int numa_node, enum dm_huge_mode mode)
{
	size_t ps = (size_t)sysconf(_SC_PAGESIZE);
	int rc;
	void *p;

	memset(r, 0, sizeof(*r));
	r->numa_node = -1;
	if (len == 0)
		return -EINVAL;
	if (numa_node >= 0 && numa_available() >= 0 && numa_node <= numa_max_node())
		r->numa_node = numa_node;
	if (mode != DM_HUGE_OFF) {
		rc = alloc_huge(r, len, r->numa_node);
		if (rc == 0)
			return 0;
		if (mode == DM_HUGE_ON) {
			dm_err("mem: %zu bytes of hugepages requested but none available (%s); "
			       "reserve some: echo N > /proc/sys/vm/nr_hugepages", len,
			       strerror(-rc));
			return -ENOMEM;
		}
		dm_warn("mem: no hugepages for a %zu-byte region (%s); using ordinary pages "
			"(reserve hugepages with /proc/sys/vm/nr_hugepages for fewer TLB misses)",
			len, rc == -ENOENT ? "no hugetlbfs mounted" : "none reserved");
	}
	r->len = DM_ALIGN_UP(len, ps);
	p = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	bind_node(p, r->len, r->numa_node);
	r->addr = p;
	r->page_size = ps;
	return 0;
}

void dm_region_free(struct dm_region *r)
{
	if (!r->addr)
		return;
	if (r->huge)
		free_huge_pages(r->addr);
	else
		munmap(r->addr, r->len);
	memset(r, 0, sizeof(*r));
}
