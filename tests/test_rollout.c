/* test_rollout.c: the decisions of the two-phase oracle epoch rollout (oracle/rollout.c):
 * the epoch the cluster moves to, the epoch a compute node without an oracle starts from,
 * and when a compute node holding the new oracle switches to it. */
#include <criterion/criterion.h>

#include "rollout.h"

/* A compute node that runs `epoch` with an oracle and rolls out nothing, reported 50 ms ago. */
static struct dm_rollout_cn running(uint32_t epoch)
{
	return (struct dm_rollout_cn){ .valid = true, .ready = true, .epoch = epoch,
				       .next = epoch, .age_ms = 50 };
}

/* The same, rolling out `next` (built or not). */
static struct dm_rollout_cn rolling(uint32_t epoch, uint32_t next, bool prepared)
{
	struct dm_rollout_cn c = running(epoch);

	c.next = next;
	c.prepared = prepared;
	return c;
}

Test(rollout, target_is_the_highest_epoch_asked_for_or_run)
{
	struct dm_rollout_cn cn[4] = { running(2), rolling(2, 3, false), running(2), { 0 } };

	cr_assert_eq(dm_rollout_target(cn, 4, 2), 3, "a rollout another node started");
	cr_assert_eq(dm_rollout_target(cn, 4, 5), 5, "asked for here");
	cn[1] = running(2);
	cr_assert_eq(dm_rollout_target(cn, 4, 2), 2, "nothing to do");
	cn[3] = (struct dm_rollout_cn){ .epoch = 9, .next = 9 };   /* not valid: no report */
	cr_assert_eq(dm_rollout_target(cn, 4, 2), 2, "an invalid slot counts for nothing");
	cn[3].valid = true;
	cr_assert_eq(dm_rollout_target(cn, 4, 2), 9, "a node that runs a later epoch");
	cr_assert_eq(dm_rollout_target(NULL, 0, 4), 4);
}

Test(rollout, a_new_node_starts_from_the_epoch_the_others_run)
{
	struct dm_rollout_cn cn[3] = { rolling(4, 5, true), running(4), { 0 } };

	cn[2] = (struct dm_rollout_cn){ .valid = true, .ready = false, .epoch = 0, .next = 0 };
	cr_assert_eq(dm_rollout_current(cn, 3), 4, "the running epoch, not the one rolled out");
	cn[0].valid = false;
	cr_assert_eq(dm_rollout_current(cn, 3), 4);
	cn[1].ready = false;
	cr_assert_eq(dm_rollout_current(cn, 3), 0, "nobody has an oracle");
	cr_assert_eq(dm_rollout_current(NULL, 3), 0);
}

Test(rollout, activates_once_every_live_node_has_it_prepared)
{
	struct dm_rollout_cn cn[3] = { rolling(1, 2, true), rolling(1, 2, false),
				       rolling(1, 2, true) };

	cr_assert_not(dm_rollout_may_activate(cn, NULL, 3, 0, 2, 2000), "cn1 still building");
	cr_assert_not(dm_rollout_may_activate(cn, NULL, 3, 2, 2, 2000));
	cn[1].prepared = true;
	for (uint32_t s = 0; s < 3; s++)
		cr_assert(dm_rollout_may_activate(cn, NULL, 3, s, 2, 2000), "cn%u", s);
	/* A node that switched already counts as ready: the last ones follow it. */
	cn[0] = running(2);
	cr_assert(dm_rollout_may_activate(cn, NULL, 3, 1, 2, 2000));
	/* Prepared for another epoch is not prepared for this one. */
	cn[1] = rolling(1, 3, true);
	cr_assert_not(dm_rollout_may_activate(cn, NULL, 3, 2, 2, 2000));
	/* self out of range, no reports */
	cr_assert_not(dm_rollout_may_activate(cn, NULL, 3, 3, 2, 2000));
	cr_assert_not(dm_rollout_may_activate(NULL, NULL, 3, 0, 2, 2000));
}

Test(rollout, down_silent_and_oracle_less_nodes_are_not_waited_for)
{
	struct dm_rollout_cn cn[4] = { rolling(1, 2, true), rolling(1, 2, false),
				       rolling(1, 2, false), rolling(1, 2, false) };
	bool up[4] = { true, false, true, true };

	cr_assert_not(dm_rollout_may_activate(cn, up, 4, 0, 2, 2000));
	cn[2].age_ms = 2001;                 /* silent: it stopped reporting */
	cn[3].ready = false;                 /* building its first oracle */
	cr_assert(dm_rollout_may_activate(cn, up, 4, 0, 2, 2000),
		  "cn1 is down, cn2 silent, cn3 without an oracle");
	up[1] = true;
	cr_assert_not(dm_rollout_may_activate(cn, up, 4, 0, 2, 2000), "cn1 is up again");
	cn[1].valid = false;
	cr_assert(dm_rollout_may_activate(cn, up, 4, 0, 2, 2000), "no report of cn1 at all");
	/* self is never waited for, whatever it reported */
	cn[0] = rolling(1, 2, false);
	cr_assert(dm_rollout_may_activate(cn, up, 4, 0, 2, 2000));
}

/* Mass drift: the largest partition over its fair share. */
Test(rollout, mass_ratio)
{
	uint64_t even[4] = { 25, 25, 25, 25 }, skew[4] = { 70, 10, 10, 10 }, one[3] = { 0, 9, 0 };
	uint64_t none[2] = { 0, 0 };

	cr_assert_float_eq(dm_rollout_mass_ratio(even, 4), 1.0, 1e-12);
	cr_assert_float_eq(dm_rollout_mass_ratio(skew, 4), 2.8, 1e-12);
	cr_assert_float_eq(dm_rollout_mass_ratio(one, 3), 3.0, 1e-12, "all in one: k");
	cr_assert_float_eq(dm_rollout_mass_ratio(none, 2), 0.0, 1e-12, "no sample: 0");
	cr_assert_float_eq(dm_rollout_mass_ratio(NULL, 2), 0.0, 1e-12);
	cr_assert_float_eq(dm_rollout_mass_ratio(even, 0), 0.0, 1e-12);
}
