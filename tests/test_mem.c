/* test_mem.c: region allocation: hugepages when reserved, ordinary pages otherwise, and
 * "hugepages = on" failing cleanly instead of falling back. */
#include <criterion/criterion.h>
#include <string.h>

#include "mem.h"

Test(mem, auto_mode_always_gives_zeroed_memory)
{
	struct dm_region r;

	cr_assert_eq(dm_region_alloc(&r, 3 << 20, 0, DM_HUGE_AUTO), 0);
	cr_assert_not_null(r.addr);
	cr_assert_geq(r.len, (size_t)3 << 20);
	cr_assert_eq(r.len % r.page_size, 0);
	for (size_t i = 0; i < r.len; i += 4096)
		cr_assert_eq(((char *)r.addr)[i], 0);
	memset(r.addr, 0xab, r.len);
	dm_region_free(&r);
	cr_assert_null(r.addr);
}

Test(mem, off_mode_uses_ordinary_pages)
{
	struct dm_region r;

	cr_assert_eq(dm_region_alloc(&r, 1000, -1, DM_HUGE_OFF), 0);
	cr_assert_eq(r.huge, false);
	cr_assert_eq(r.numa_node, -1);
	dm_region_free(&r);
}

Test(mem, on_mode_fails_or_gives_hugepages)
{
	struct dm_region r;
	int rc = dm_region_alloc(&r, 2 << 20, -1, DM_HUGE_ON);

	if (rc == 0) {
		cr_assert(r.huge);
		dm_region_free(&r);
	} else {
		cr_assert_eq(rc, -ENOMEM);
	}
}

Test(mem, zero_length_rejected)
{
	struct dm_region r;

	cr_assert_eq(dm_region_alloc(&r, 0, -1, DM_HUGE_AUTO), -EINVAL);
}

Test(mem, dev_numa_node_unknown)
{
	cr_assert_eq(dm_dev_numa_node("no-such-dev"), -1);
	cr_assert_eq(dm_dev_numa_node("../etc"), -1);
	cr_assert_eq(dm_dev_numa_node(NULL), -1);
}
