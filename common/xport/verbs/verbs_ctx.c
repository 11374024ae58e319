/* verbs_ctx.c: the rdma-core backend's context: device selection among librdmacm's devices,
 * protection domain, shared receive queue, memory registration, and the backend entry points
 * (dm_verbs_backend: open + available). */
#include "verbs_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VERBS_DEF_SEND_WR 256u
#define VERBS_DEF_RECV_WR 1024u
#define VERBS_DEF_INLINE  128u

/* First port of ctx in state ACTIVE, or 0. */
static uint8_t active_port(struct ibv_context *ctx)
{
	struct ibv_device_attr da;

	if (ibv_query_device(ctx, &da))
		return 0;
	for (uint8_t p = 1; p <= da.phys_port_cnt; p++) {
		struct ibv_port_attr pa;

		if (!ibv_query_port(ctx, p, &pa) && pa.state == IBV_PORT_ACTIVE)
			return p;
	}
	return 0;
}

/* Can the backend run here: a verbs device with an active port exists. */
static bool verbs_available(const char **why)
{
	struct ibv_device **list;
	bool active = false;
	int n = 0;

	list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		if (list)
			ibv_free_device_list(list);
		if (why)
			*why = "no RDMA device (ibv_get_device_list found none)";
		return false;
	}
	for (int i = 0; i < n && !active; i++) {
		struct ibv_context *ctx = ibv_open_device(list[i]);

		if (ctx) {
			active = active_port(ctx) != 0;
			ibv_close_device(ctx);
		}
	}
	ibv_free_device_list(list);
	if (!active) {
		if (why)
			*why = "RDMA device present but no port is ACTIVE";
		return false;
	}
	return true;
}

/* Pick the device: by name, or the first with an active port, from the contexts librdmacm
 * owns (QPs made with rdma_create_qp must use a PD of the cm id's own context). */
static struct ibv_context *pick_device(const char *name)
{
	struct ibv_context **list, *found = NULL;
	int n = 0;

	list = rdma_get_devices(&n);
	if (!list) {
		dm_err("verbs: rdma_get_devices failed: %s (is /dev/infiniband/rdma_cm there?)",
		       strerror(errno));
		return NULL;
	}
	for (int i = 0; i < n && !found; i++) {
		const char *dn = ibv_get_device_name(list[i]->device);

		if (name ? !strcmp(dn, name) : active_port(list[i]) != 0)
			found = list[i];
	}
	rdma_free_devices(list);
	if (!found) {
		if (name)
			dm_err("verbs: RDMA device '%s' not found", name);
		else
			dm_err("verbs: no RDMA device with an active port");
	}
	return found;
}

/* Take a free receive slot for wr_id. 0 or -EAGAIN when all are in use. */
int verbs_rslot_get(struct verbs_xport *vx, uint64_t wr_id, uint32_t *idx)
{
	int rc = 0;

	pthread_mutex_lock(&vx->rlock);
	if (vx->rfree == UINT32_MAX) {
		rc = -EAGAIN;
	} else {
		*idx = vx->rfree;
		vx->rfree = vx->rslots[*idx].next_free;
		vx->rslots[*idx].wr_id = wr_id;
	}
	pthread_mutex_unlock(&vx->rlock);
	return rc;
}

/* Release a receive slot; returns the caller's wr_id it carried. */
uint64_t verbs_rslot_put(struct verbs_xport *vx, uint32_t idx)
{
	uint64_t wr_id;

	pthread_mutex_lock(&vx->rlock);
	wr_id = vx->rslots[idx].wr_id;
	vx->rslots[idx].next_free = vx->rfree;
	vx->rfree = idx;
	pthread_mutex_unlock(&vx->rlock);
	return wr_id;
}

/* Register [addr, addr+len) with the PD; remote access as asked. */
static int verbs_reg(struct dm_xport *x, void *addr, size_t len, int access, struct dm_mr **out)
{
	struct verbs_xport *vx = to_vx(x);
	int acc = IBV_ACCESS_LOCAL_WRITE;
	struct verbs_mr *m;
	struct ibv_mr *imr;

	if (!addr || len == 0 || !out || (access & ~DM_MR_REMOTE_ALL))
		return -EINVAL;
	if (access & DM_MR_REMOTE_READ)
		acc |= IBV_ACCESS_REMOTE_READ;
	if (access & DM_MR_REMOTE_WRITE)
		acc |= IBV_ACCESS_REMOTE_WRITE;
	if (access & DM_MR_REMOTE_ATOMIC)
		acc |= IBV_ACCESS_REMOTE_ATOMIC;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	imr = ibv_reg_mr(vx->pd, addr, len, acc);
	if (!imr) {
		int err = errno ? errno : EIO;

		dm_err("verbs: ibv_reg_mr(%zu bytes) failed: %s%s", len, strerror(err),
		       err == ENOMEM || err == EPERM ? " (memlock limit? try ulimit -l unlimited)" : "");
		free(m);
		return -err;
	}
	m->mr.addr = addr;
	m->mr.len = len;
	m->mr.lkey = imr->lkey;
	m->mr.rkey = imr->rkey;
	m->mr.priv = imr;
	pthread_mutex_lock(&vx->mlock);
	m->next = vx->mrs;
	if (vx->mrs)
		vx->mrs->prev = m;
	vx->mrs = m;
	pthread_mutex_unlock(&vx->mlock);
	*out = &m->mr;
	return 0;
}

static int verbs_dereg(struct dm_xport *x, struct dm_mr *mr)
{
	struct verbs_xport *vx = to_vx(x);
	struct verbs_mr *m;
	int rc;

	if (!mr)
		return -EINVAL;
	m = container_of(mr, struct verbs_mr, mr);
	rc = ibv_dereg_mr(mr->priv);
	if (rc)
		return rc > 0 ? -rc : -EIO;
	pthread_mutex_lock(&vx->mlock);
	if (m->prev)
		m->prev->next = m->next;
	else
		vx->mrs = m->next;
	if (m->next)
		m->next->prev = m->prev;
	pthread_mutex_unlock(&vx->mlock);
	free(m);
	return 0;
}

/* Post one receive buffer to the shared receive queue. */
static int verbs_post_recv(struct dm_xport *x, void *buf, uint32_t len, struct dm_mr *mr,
			   uint64_t wr_id)
{
	struct verbs_xport *vx = to_vx(x);
	struct ibv_recv_wr wr = { 0 }, *bad = NULL;
	struct ibv_sge sge;
	uint32_t idx;
	int rc;

	if (!buf || !mr || (char *)buf < (char *)mr->addr ||
	    (char *)buf + len > (char *)mr->addr + mr->len)
		return -EINVAL;
	rc = verbs_rslot_get(vx, wr_id, &idx);
	if (rc)
		return rc;
	sge.addr = (uintptr_t)buf;
	sge.length = len;
	sge.lkey = mr->lkey;
	wr.wr_id = idx;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	rc = ibv_post_srq_recv(vx->srq, &wr, &bad);
	if (rc) {
		verbs_rslot_put(vx, idx);
		return rc == ENOMEM ? -EAGAIN : -(rc > 0 ? rc : EIO);
	}
	return 0;
}

static void verbs_close(struct dm_xport *x)
{
	struct verbs_xport *vx = to_vx(x);

	while (vx->mrs)
		if (verbs_dereg(x, &vx->mrs->mr)) {
			dm_warn("verbs: cannot deregister memory at close");
			break;
		}
	if (ibv_destroy_srq(vx->srq))
		dm_warn("verbs: ibv_destroy_srq failed (connections still open?)");
	if (ibv_dealloc_pd(vx->pd))
		dm_warn("verbs: ibv_dealloc_pd failed (memory still registered?)");
	pthread_mutex_destroy(&vx->rlock);
	pthread_mutex_destroy(&vx->mlock);
	free(vx->rslots);
	free(vx);
}

static const struct dm_xport_ops verbs_ops_template = {
	.size = sizeof(struct dm_xport_ops),
	.name = "verbs",
	.caps = DM_XCAP_READ | DM_XCAP_WRITE | DM_XCAP_ATOMIC | DM_XCAP_SEND |
		DM_XCAP_INLINE | DM_XCAP_ZEROCOPY,
	.close = verbs_close,
	.reg = verbs_reg,
	.dereg = verbs_dereg,
	.post_recv = verbs_post_recv,
	.listen = verbs_listen,
	.accept = verbs_accept,
	.listener_close = verbs_listener_close,
	.listener_port = verbs_listener_port,
	.connect = verbs_connect,
	.conn_close = verbs_conn_close,
	.read_batch = verbs_read_batch,
	.write_batch = verbs_write_batch,
	.cas = verbs_cas,
	.faa = verbs_faa,
	.send = verbs_send,
	.poll = verbs_poll,
	.wait = verbs_wait,
};

/* Open a context: device, PD, SRQ and the receive slot table. */
static struct dm_xport *verbs_open(const struct dm_xport_params *p)
{
	struct ibv_srq_init_attr sa = { 0 };
	struct ibv_device_attr da;
	struct verbs_xport *vx;
	int err;

	vx = calloc(1, sizeof(*vx));
	if (!vx) {
		errno = ENOMEM;
		return NULL;
	}
	vx->ops = verbs_ops_template;
	if (dm_xport_base_init(&vx->base, &vx->ops, p)) {
		err = EINVAL;
		goto err_free_vx;
	}
	vx->ctx = pick_device(p->device);
	if (!vx->ctx) {
		err = ENODEV;
		goto err_free_vx;
	}
	snprintf(vx->devname, sizeof(vx->devname), "%s", ibv_get_device_name(vx->ctx->device));
	if (ibv_query_device(vx->ctx, &da)) {
		err = errno ? errno : EIO;
		dm_err("verbs: ibv_query_device(%s) failed", vx->devname);
		goto err_free_vx;
	}
	if (da.atomic_cap == IBV_ATOMIC_NONE) {
		vx->ops.caps &= ~(uint32_t)DM_XCAP_ATOMIC;
		vx->ops.cas = NULL;
		vx->ops.faa = NULL;
	}
	vx->send_depth = p->max_send_wr ? p->max_send_wr : VERBS_DEF_SEND_WR;
	vx->send_depth = DM_MIN(vx->send_depth, (uint32_t)da.max_qp_wr);
	vx->srq_depth = p->max_recv_wr ? p->max_recv_wr : VERBS_DEF_RECV_WR;
	vx->srq_depth = DM_MIN(vx->srq_depth, (uint32_t)da.max_srq_wr);
	vx->max_inline = p->max_inline ? p->max_inline : VERBS_DEF_INLINE;
	vx->max_cqe = (uint32_t)da.max_cqe;
	if (vx->send_depth * 2 + vx->srq_depth + 16 > vx->max_cqe) {
		/* a connection's CQ must hold its send queue and the whole receive pool */
		dm_warn("verbs: %s: send depth %u + receive pool %u exceed the CQ limit %d; "
			"using a smaller receive pool", vx->devname, vx->send_depth, vx->srq_depth,
			da.max_cqe);
		if (vx->max_cqe <= vx->send_depth * 2 + 16 + 64) {
			err = EINVAL;
			goto err_free_vx;
		}
		vx->srq_depth = vx->max_cqe - vx->send_depth * 2 - 16;
	}
	vx->rd_atom = (uint8_t)DM_MIN(16, DM_MIN(da.max_qp_rd_atom, da.max_qp_init_rd_atom));
	if (vx->rd_atom == 0)
		vx->rd_atom = 1;

	vx->pd = ibv_alloc_pd(vx->ctx);
	if (!vx->pd) {
		err = errno ? errno : EIO;
		dm_err("verbs: ibv_alloc_pd(%s) failed: %s", vx->devname, strerror(err));
		goto err_free_vx;
	}
	sa.attr.max_wr = vx->srq_depth;
	sa.attr.max_sge = 1;
	vx->srq = ibv_create_srq(vx->pd, &sa);
	if (!vx->srq) {
		err = errno ? errno : EIO;
		dm_err("verbs: ibv_create_srq(%u) on %s failed: %s", vx->srq_depth, vx->devname,
		       strerror(err));
		goto err_dealloc_pd;
	}
	/* the device may round the SRQ up: the slot table keeps the pool at what was asked,
	 * which every connection's CQ was sized for */
	vx->rslots = calloc(vx->srq_depth, sizeof(*vx->rslots));
	if (!vx->rslots) {
		err = ENOMEM;
		goto err_destroy_srq;
	}
	for (uint32_t i = 0; i < vx->srq_depth; i++)
		vx->rslots[i].next_free = i + 1 < vx->srq_depth ? i + 1 : UINT32_MAX;
	vx->rfree = 0;
	pthread_mutex_init(&vx->rlock, NULL);
	pthread_mutex_init(&vx->mlock, NULL);
	dm_info("verbs: context on %s (send depth %u, srq %u, inline %u, rd_atom %u)",
		vx->devname, vx->send_depth, vx->srq_depth, vx->max_inline, vx->rd_atom);
	return &vx->base;

err_destroy_srq:
	ibv_destroy_srq(vx->srq);
err_dealloc_pd:
	ibv_dealloc_pd(vx->pd);
err_free_vx:
	free(vx);
	errno = err;
	return NULL;
}

const struct dm_xport_backend dm_verbs_backend = {
	.name = "verbs",
	.open = verbs_open,
	.available = verbs_available,
};
