/* cn_state.c: the compute node's side of the cluster state (common/etcd/cstate.h): the
 * up-set callback. A memory node the up-set declares down is marked down here at once
 * (reads go to other replicas without waiting for a failed READ or a timeout, e.g. for a
 * node that hangs or is cut off) and is not brought back by cn_refresh while the up-set says
 * so; once the up-set lists it again, cn_refresh may bring it back (reconnect, generation
 * report, probe READ). The CN's own failure detection stays: a node the up-set lists as up
 * but that does not answer is still marked down locally. */
#include "cn.h"

#include <stdio.h>
#include <string.h>

#include "config.h"
#if DM_HAVE_ETCD
#include "cstate.h"

void cn_state_apply(void *arg, const struct dm_upset *u)
{
	struct cn *cn = arg;
	unsigned downs = 0, ups = 0;

	for (uint32_t m = 0; m < cn->cfg->n_mn && m < DM_MAX_NODES; m++) {
		bool down = !dm_upset_has(u->mn, m);
		bool was = atomic_exchange(&cn->state_down[m], down);

		if (down && !was) {
			downs++;
			atomic_store(&cn->state_down_ns[m], dm_now_ns());
			cn_mn_down(cn, m, atomic_load(&cn->mn_epoch[m]), -EHOSTDOWN);
		}
		if (!down && was) {
			ups++;
			atomic_store(&cn->state_up_ns[m], dm_now_ns());
			pthread_mutex_lock(&cn->ctl_lock);
			cn->rejoin_at[m] = 0;   /* cn_refresh tries it at its next run */
			pthread_mutex_unlock(&cn->ctl_lock);
		}
	}
	/* Compute nodes declared down get no routed or relayed query (cn/router). */
	for (uint32_t c = 0; c < cn->cfg->n_cn && c < DM_MAX_NODES; c++)
		atomic_store(&cn->state_cn_down[c], c != cn->node->id && !dm_upset_has(u->cn, c));
	atomic_store(&cn->state_self_down, !dm_upset_has(u->cn, cn->node->id));
	atomic_store(&cn->state_version, u->version);
	atomic_fetch_add(&cn->state_changes, 1);
	dm_info("cn%u: cluster state version %lld (controller %s): %u memory node(s) newly "
		"down, %u up again", cn->node->id, (long long)u->version, u->controller, downs,
		ups);
}
void cn_placement_apply(void *arg, const struct dm_placement *p)
{
	struct cn *cn = arg;
	char list[256] = "";

	for (uint32_t m = 0; m < cn->cfg->n_mn && m < DM_MAX_NODES; m++)
		if (dm_upset_has(p->retired, m))
			snprintf(list + strlen(list), sizeof(list) - strlen(list), " mn%u", m);
	pthread_mutex_lock(&cn->ctl_lock);
	memcpy(cn->retired_mn, p->retired, sizeof(cn->retired_mn));
	atomic_store(&cn->placement_version, p->version);
	pthread_mutex_unlock(&cn->ctl_lock);
	atomic_store(&cn->placement_dirty, true);
	dm_info("cn%u: placement version %lld (by %s): retired:%s", cn->node->id,
		(long long)p->version, p->by, list[0] ? list : " none");
}
#endif
