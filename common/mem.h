/* mem.h: the memory-node region and other large buffers: hugepages through libhugetlbfs,
 * bound to a NUMA node with libnuma (the NIC's node, read from sysfs), with a fallback to
 * ordinary pages and a logged warning when hugepages are not available. */
#ifndef DM_MEM_H
#define DM_MEM_H

#include "dm.h"

enum dm_huge_mode { DM_HUGE_AUTO = 0, DM_HUGE_ON, DM_HUGE_OFF };

struct dm_region {
	void *addr;
	size_t len;        /* rounded up to the page size used */
	bool huge;         /* backed by hugepages */
	int numa_node;     /* node it is bound to, -1 if unbound */
	size_t page_size;
};

/* Allocate and zero a region of at least len bytes. numa_node -1 means "no binding".
 * DM_HUGE_ON fails (-ENOMEM) instead of falling back; AUTO falls back with a warning.
 * Returns 0 or -errno. */
int dm_region_alloc(struct dm_region *r, size_t len, int numa_node, enum dm_huge_mode mode);
void dm_region_free(struct dm_region *r);

/* NUMA node of an RDMA device (/sys/class/infiniband/DEV/device/numa_node) or, failing
 * that, of a network interface (/sys/class/net/DEV/device/numa_node). -1 when unknown
 * (virtual devices, single-node machines). */
int dm_dev_numa_node(const char *dev);

#endif
