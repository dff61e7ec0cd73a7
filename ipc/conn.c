/*
 * conn.c — one client's shared region, server side: submission consumer, completion producer.
 *
 * Owns: the ring protocol checks (indices only move forward and stay in range, records lie
 * inside the data area, reserved fields are zero, the header keeps its magic and version) and
 * the completion-room accounting: every in-flight request holds a reservation of one cqe and
 * 2 x IPC_TERMINAL_MAX payload bytes, plus one for a connection-level error, so a terminal
 * event can always be posted without waiting; a token event that would eat into the
 * reservations ends its request with `busy` instead.
 * Must not: block, read a shared field twice (everything is copied out before it is looked
 * at), trust an index it owns from the region, or read outside the region's layout.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/conn.h"
#include "ipc/futex.h"

#define TERM_BYTES (2 * IPC_TERMINAL_MAX) /* payload + worst-case skip at the area's end */

static uint32_t page_align(uint64_t n) { return (uint32_t)((n + 4095) & ~(uint64_t)4095); }

int ipc_layout_compute(struct ipc_layout *l, uint32_t sq_entries, uint32_t cq_entries,
		       uint32_t sq_data_bytes, uint32_t cq_data_bytes)
{
	if (!ipc_is_pow2(sq_entries) || !ipc_is_pow2(cq_entries) || !ipc_is_pow2(sq_data_bytes) ||
	    !ipc_is_pow2(cq_data_bytes) || sq_entries > (1u << 16) || cq_entries > (1u << 16) ||
	    sq_data_bytes > (1u << 28) || cq_data_bytes > (1u << 28) || cq_data_bytes < 4096)
		return -EINVAL;
	l->sq_entries = sq_entries;
	l->cq_entries = cq_entries;
	l->sq_data_bytes = sq_data_bytes;
	l->cq_data_bytes = cq_data_bytes;
	l->sq_off = IPC_HEADER_BYTES;
	l->cq_off = page_align((uint64_t)l->sq_off + sq_entries * sizeof(struct ipc_sqe));
	l->sq_data_off = page_align((uint64_t)l->cq_off + cq_entries * sizeof(struct ipc_cqe));
	l->cq_data_off = page_align((uint64_t)l->sq_data_off + sq_data_bytes);
	l->bytes = page_align((uint64_t)l->cq_data_off + cq_data_bytes);
	return 0;
}

void ipc_conn_format(void *base, const struct ipc_layout *l, const struct ipc_conn_limits *lim,
		     uint64_t epoch, uint32_t client_id)
{
	struct ipc_header *h = base;
	h->magic = IPC_MAGIC;
	h->version = IPC_VERSION;
	h->epoch = epoch;
	h->region_bytes = l->bytes;
	h->client_id = client_id;
	h->sq_entries = l->sq_entries;
	h->cq_entries = l->cq_entries;
	h->sq_off = l->sq_off;
	h->cq_off = l->cq_off;
	h->sq_data_off = l->sq_data_off;
	h->sq_data_bytes = l->sq_data_bytes;
	h->cq_data_off = l->cq_data_off;
	h->cq_data_bytes = l->cq_data_bytes;
	h->max_msg_bytes = lim->max_msg_bytes;
	h->max_prompt_bytes = lim->max_prompt_bytes;
	h->max_inflight = lim->max_inflight;
	/* Relaxed: the region is not shared yet; the fd handover (sendmsg) publishes it. */
	atomic_store_explicit(&h->state.v, IPC_STATE_RUNNING, memory_order_relaxed);
}

int ipc_conn_init(struct ipc_conn *c, void *base, const struct ipc_layout *l,
		  const struct ipc_conn_limits *lim, struct ipc_totals *tot)
{
	memset(c, 0, sizeof *c);
	/* Every terminal reservation must fit even with all requests in flight. */
	if (lim->max_inflight == 0 || lim->max_msg_bytes > l->sq_data_bytes ||
	    lim->max_msg_bytes < sizeof(struct ipc_gen_wire) ||
	    l->cq_entries < lim->max_inflight + 2 ||
	    (uint64_t)(lim->max_inflight + 2) * TERM_BYTES > l->cq_data_bytes)
		return -EINVAL;
	c->base = base;
	c->hdr = base;
	c->sqes = (struct ipc_sqe *)(c->base + l->sq_off);
	c->cqes = (struct ipc_cqe *)(c->base + l->cq_off);
	c->sq_data = c->base + l->sq_data_off;
	c->cq_data = c->base + l->cq_data_off;
	c->lay = *l;
	c->lim = *lim;
	c->tot = tot;
	c->cq_dat.size = l->cq_data_bytes;
	c->cq_data_end = calloc(l->cq_entries, sizeof *c->cq_data_end);
	c->flight = calloc(lim->max_inflight, sizeof *c->flight);
	c->rec = malloc(ipc_align(lim->max_msg_bytes, 8) + 8);
	if (!c->cq_data_end || !c->flight || !c->rec) {
		ipc_conn_free(c);
		return -ENOMEM;
	}
	return 0;
}

void ipc_conn_free(struct ipc_conn *c)
{
	if (c->tot)
		c->tot->inflight -= c->n_flight;
	c->n_flight = 0;
	free(c->cq_data_end);
	free(c->flight);
	free(c->rec);
	c->cq_data_end = NULL;
	c->flight = NULL;
	c->rec = NULL;
}

struct ipc_flight *ipc_conn_find(struct ipc_conn *c, uint64_t req_id)
{
	for (uint32_t i = 0; i < c->n_flight; i++)
		if (c->flight[i].id == req_id)
			return &c->flight[i];
	return NULL;
}

/* Terminal events that must always fit: one per request in flight, plus one connection-level
 * error until it has been sent. */
static uint32_t reserve(const struct ipc_conn *c) { return c->n_flight + !c->conn_err_sent; }

static void flight_remove(struct ipc_conn *c, struct ipc_flight *f)
{
	*f = c->flight[--c->n_flight];
	c->tot->inflight--;
}

/* ---- completion side ------------------------------------------------------------------------ */

/* Reads the client's cq head, checks it and releases the data behind it. */
static int cq_refresh(struct ipc_conn *c)
{
	if (c->violated)
		return -EPROTO;
	/* Acquire: the client read the cqes and payloads below this head before it stored the
	 * head (release); we must not overwrite those slots and bytes until those reads are done. */
	uint32_t head = atomic_load_explicit(&c->hdr->cq_head.v, memory_order_acquire);
	if (ring_check_head(head, c->cq_head_seen, c->cq_tail))
		return ipc_conn_violation(c, "cq head %u outside [%u, %u]", head, c->cq_head_seen,
					  c->cq_tail);
	if (head != c->cq_head_seen) {
		c->cq_dat.head = c->cq_data_end[ring_slot(head - 1, c->lay.cq_entries)];
		c->cq_head_seen = head;
	}
	return 0;
}

/* Before a request's terminal event: refreshes the cq head, then removes the request (of op
 * `kind`, or any when kind < 0) from the flight table, which frees the terminal reservation the
 * event then uses. -ENOENT when no such request is in flight. */
static int cq_take_flight(struct ipc_conn *c, uint64_t req_id, int kind)
{
	int r = cq_refresh(c);
	if (r)
		return r;
	struct ipc_flight *f = ipc_conn_find(c, req_id);
	if (!f || (kind >= 0 && f->kind != (uint32_t)kind))
		return -ENOENT;
	flight_remove(c, f);
	return 0;
}

/* Room check: after posting `slots` cqes and `bytes` of payload, `reserve` terminal
 * reservations must still fit. Allocates the payload if so; returns its offset or -1. */
static int64_t cq_alloc(struct ipc_conn *c, uint32_t bytes, uint32_t reserve)
{
	uint32_t free_slots = ring_space(c->cq_tail, c->cq_head_seen, c->lay.cq_entries);
	if (free_slots < 1 + reserve)
		return -1;
	return ring_data_alloc(&c->cq_dat, bytes, IPC_DATA_ALIGN, reserve * TERM_BYTES);
}

/* Publishes one cqe whose payload is already in place, and wakes the client if it sleeps. */
static void cq_post(struct ipc_conn *c, uint8_t type, uint64_t req_id, uint32_t seq,
		    int64_t off, uint32_t len)
{
	struct ipc_cqe e = {.type = type, .data_len = len, .data_off = (uint32_t)off, .seq = seq,
			    .req_id = req_id};
	uint32_t slot = ring_slot(c->cq_tail, c->lay.cq_entries);
	memcpy(&c->cqes[slot], &e, sizeof e);
	c->cq_data_end[slot] = c->cq_dat.tail;
	c->cq_tail++;
	c->n_events++;
	/* Release: the cqe and its payload must be visible before the client can see the tail. */
	atomic_store_explicit(&c->hdr->cq_tail.v, c->cq_tail, memory_order_release);
	/* Full fence (Dekker with the client's "store flag; fence; load tail" before it sleeps):
	 * either the client sees our tail, or we see its NEED_WAKEUP flag. */
	atomic_thread_fence(memory_order_seq_cst);
	/* Relaxed: the fence above orders it; a stale 0 is impossible by that argument. */
	if (atomic_load_explicit(&c->hdr->cq_flags.v, memory_order_relaxed) & IPC_NEED_WAKEUP)
		ipc_futex_wake(&c->hdr->cq_tail.v);
}

/* Posts an error event using a terminal reservation (which always has room for it). */
static int post_error(struct ipc_conn *c, uint64_t req_id, int code, const char *msg,
		      uint32_t reserve_after)
{
	uint32_t ml = (uint32_t)strnlen(msg, IPC_ERROR_MSG_MAX);
	uint32_t len = ipc_frame_error_size(ml);
	int64_t off = cq_alloc(c, len, reserve_after);
	if (off < 0)
		return -ENOBUFS;
	ipc_frame_encode_error(c->cq_data + off, code, msg, ml);
	cq_post(c, IPC_EV_ERROR, req_id, 0, off, len);
	return 0;
}

int ipc_conn_violation(struct ipc_conn *c, const char *fmt, ...)
{
	if (c->violated)
		return -EPROTO;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->why, sizeof c->why, fmt, ap);
	va_end(ap);
	c->violated = 1;
	/* Best effort: uses the connection-level reservation (none is kept after it). The head
	 * may be unusable (it is what broke), so no refresh. */
	post_error(c, 0, DSV32_E_BAD_FRAME, c->why, 0);
	c->conn_err_sent = 1;
	return -EPROTO;
}

int ipc_conn_emit_token(struct ipc_conn *c, uint64_t req_id, const uint32_t *tokens,
			uint32_t n_tokens, const float *logprobs,
			const struct dsv32_top_logprob *top, uint32_t n_top, const char *text,
			uint32_t text_len)
{
	int r = cq_refresh(c);
	if (r)
		return r;
	struct ipc_flight *f = ipc_conn_find(c, req_id);
	if (!f || f->kind != IPC_OP_GENERATE)
		return -ENOENT;
	uint32_t len = ipc_frame_token_size(n_tokens, logprobs ? n_top : 0, !!logprobs, text_len);
	if (n_top > DSV32_MAX_LOGPROBS || len > c->lay.cq_data_bytes / 4)
		return -EMSGSIZE;
	/* every in-flight request (this one included) and the connection keep their reservation */
	int64_t off = cq_alloc(c, len, reserve(c));
	if (off < 0) {
		c->n_busy++;
		flight_remove(c, f);
		post_error(c, req_id, DSV32_E_BUSY, "completion ring full: client not draining", reserve(c));
		return -ENOBUFS;
	}
	ipc_frame_encode_token(c->cq_data + off, tokens, n_tokens, logprobs, top, n_top, text, text_len);
	cq_post(c, IPC_EV_TOKEN, req_id, f->seq++, off, len);
	return 0;
}

int ipc_conn_emit_done(struct ipc_conn *c, uint64_t req_id, const struct ipc_done_wire *d)
{
	int r = cq_take_flight(c, req_id, IPC_OP_GENERATE);
	if (r)
		return r;
	/* the reservation released by flight_remove is what this allocation uses */
	int64_t off = cq_alloc(c, sizeof *d, reserve(c));
	if (off < 0)
		return -ENOBUFS; /* unreachable while the reservation invariant holds */
	memcpy(c->cq_data + off, d, sizeof *d);
	cq_post(c, IPC_EV_DONE, req_id, 0, off, sizeof *d);
	return 0;
}

int ipc_conn_emit_error(struct ipc_conn *c, uint64_t req_id, int code, const char *msg)
{
	if (req_id == 0) {
		int r = cq_refresh(c);
		if (r)
			return r;
		r = post_error(c, 0, code, msg, c->n_flight);
		c->conn_err_sent |= r == 0;
		return r;
	}
	int r = cq_take_flight(c, req_id, -1);
	if (r)
		return r;
	return post_error(c, req_id, code, msg, reserve(c));
}

int ipc_conn_emit_stats(struct ipc_conn *c, uint64_t req_id, const char *text, uint32_t len)
{
	int r = cq_take_flight(c, req_id, IPC_OP_STATS);
	if (r)
		return r;
	int64_t off = len <= c->lay.cq_data_bytes / 4 ? cq_alloc(c, len, reserve(c)) : -1;
	if (off < 0) {
		c->n_busy++;
		post_error(c, req_id, DSV32_E_BUSY, "completion ring full: stats dropped", reserve(c));
		return -ENOBUFS;
	}
	if (len)
		memcpy(c->cq_data + off, text, len);
	cq_post(c, IPC_EV_STATS, req_id, 0, off, len);
	return 0;
}

/* ---- submission side ------------------------------------------------------------------------ */

/* Room to answer one more submission: the current reservations plus one. */
static int have_room(struct ipc_conn *c)
{
	uint32_t need = reserve(c) + 1;
	return ring_space(c->cq_tail, c->cq_head_seen, c->lay.cq_entries) >= need &&
	       ring_data_free(&c->cq_dat) >= need * TERM_BYTES;
}

/* Reads and checks the client's sq tail and the header's identity words. */
static int sq_refresh(struct ipc_conn *c, uint32_t *tail)
{
	/* Relaxed (GCC builtin on plain fields): these never change legitimately; the client can
	 * only scribble on them, and any value read once is checked. */
	uint32_t magic = __atomic_load_n(&c->hdr->magic, __ATOMIC_RELAXED);
	uint32_t version = __atomic_load_n(&c->hdr->version, __ATOMIC_RELAXED);
	if (magic != IPC_MAGIC || version != IPC_VERSION)
		return ipc_conn_violation(c, "header magic/version overwritten (0x%08x, %u)", magic, version);
	/* Acquire: pairs with the client's release store of the tail, so the sqes and records
	 * below it are visible before we copy them. */
	uint32_t t = atomic_load_explicit(&c->hdr->sq_tail.v, memory_order_acquire);
	if (t - c->sq_head > c->lay.sq_entries)
		return ipc_conn_violation(c, "sq tail %u is %u entries past head %u (ring has %u)", t,
					  t - c->sq_head, c->sq_head, c->lay.sq_entries);
	if (ring_check_tail(t, c->sq_tail_seen, c->sq_head, c->lay.sq_entries))
		return ipc_conn_violation(c, "sq tail moved backwards from %u to %u", c->sq_tail_seen, t);
	c->sq_tail_seen = t;
	*tail = t;
	return 0;
}

int ipc_conn_ready(struct ipc_conn *c)
{
	if (c->violated)
		return 1;
	/* Acquire for the same reason as in sq_refresh / cq_refresh (this is their read-only
	 * twin, run before the server sleeps). */
	uint32_t t = atomic_load_explicit(&c->hdr->sq_tail.v, memory_order_acquire);
	if (t == c->sq_head)
		return 0;
	if (t - c->sq_head > c->lay.sq_entries)
		return 1; /* a violation to report */
	uint32_t h = atomic_load_explicit(&c->hdr->cq_head.v, memory_order_acquire);
	if (ring_check_head(h, c->cq_head_seen, c->cq_tail))
		return 1;
	/* room estimate with the head just read (cq_refresh will account it for real) */
	uint32_t slots = ring_space(c->cq_tail, h, c->lay.cq_entries);
	uint32_t dhead = h != c->cq_head_seen ? c->cq_data_end[ring_slot(h - 1, c->lay.cq_entries)]
					      : c->cq_dat.head;
	uint32_t dfree = c->cq_dat.size - (c->cq_dat.tail - dhead);
	return slots >= reserve(c) + 1 && dfree >= (reserve(c) + 1) * TERM_BYTES;
}

/* Answers one submission with a typed error (it uses the room checked by have_room). */
static void reject(struct ipc_conn *c, uint64_t req_id, int code, const char *msg)
{
	c->n_rejected++;
	post_error(c, req_id, code, msg, reserve(c));
}

static int take_flight(struct ipc_conn *c, uint64_t id, uint32_t kind)
{
	if (c->n_flight >= c->lim.max_inflight) {
		reject(c, id, DSV32_E_QUEUE_FULL, "too many requests in flight on this connection");
		return 0;
	}
	if (c->tot->inflight >= c->tot->max_inflight) {
		reject(c, id, DSV32_E_QUEUE_FULL, "too many requests in flight on the server");
		return 0;
	}
	c->flight[c->n_flight++] = (struct ipc_flight){.id = id, .kind = kind};
	c->tot->inflight++;
	return 1;
}

/* One GENERATE: bounds, copy out, decode. Returns 1 (item made), 0 (answered), <0. */
static int consume_generate(struct ipc_conn *c, const struct ipc_sqe *e, int draining,
			    uint64_t now_ns, struct ipc_conn_item *it)
{
	if (ring_data_check(e->data_off, e->data_len, c->lay.sq_data_bytes))
		return ipc_conn_violation(c, "record [%u, +%u) outside the %u-byte data area",
					  e->data_off, e->data_len, c->lay.sq_data_bytes);
	if (ipc_conn_find(c, e->req_id))
		return ipc_conn_violation(c, "request id %llu is already in flight",
					  (unsigned long long)e->req_id);
	if (e->data_len > c->lim.max_msg_bytes) {
		char m[96];
		snprintf(m, sizeof m, "record of %u bytes > limit %u", e->data_len, c->lim.max_msg_bytes);
		reject(c, e->req_id, DSV32_E_TOO_LARGE, m);
		return 0;
	}
	if (draining) {
		reject(c, e->req_id, DSV32_E_DRAINING, "the server is shutting down");
		return 0;
	}
	/* Copy first: from here on only the private copy is read. */
	memcpy(c->rec, c->sq_data + e->data_off, e->data_len);
	c->sq_data_next = e->data_off + ipc_align(e->data_len, IPC_DATA_ALIGN);
	struct ipc_request *req;
	char msg[IPC_ERROR_MSG_MAX];
	int code = ipc_frame_decode_generate(c->rec, e->data_len, e->req_id,
					     c->lim.max_prompt_bytes, &req, msg, sizeof msg);
	if (code < 0) { /* out of memory: this request fails, the client stays */
		reject(c, e->req_id, DSV32_E_BUSY, "server out of memory");
		return 0;
	}
	if (code == DSV32_E_BAD_FRAME)
		return ipc_conn_violation(c, "%s", msg);
	if (code) {
		reject(c, e->req_id, code, msg);
		return 0;
	}
	if (!take_flight(c, e->req_id, IPC_OP_GENERATE)) {
		ipc_request_free(req);
		return 0;
	}
	req->t_submit_ns = now_ns;
	*it = (struct ipc_conn_item){.type = IPC_CONN_GENERATE, .req_id = e->req_id, .req = req};
	return 1;
}

int ipc_conn_consume(struct ipc_conn *c, int draining, uint64_t now_ns,
		     struct ipc_conn_item *items, int max)
{
	uint32_t tail = 0;
	int r = cq_refresh(c);
	if (!r)
		r = sq_refresh(c, &tail);
	if (r)
		return r;
	int n = 0;
	while (n < max && c->sq_head != tail && have_room(c)) {
		struct ipc_sqe e;
		/* The client allocates records one after another: fetch where the next one probably
		 * is while the entry itself is fetched, rather than after (one cache miss less on
		 * the round trip). Only a hint: the offset is masked into the area. */
		uint32_t guess = c->sq_data_next & (c->lay.sq_data_bytes - 1);
		__builtin_prefetch(c->sq_data + guess);
		if (guess + 64 < c->lay.sq_data_bytes)
			__builtin_prefetch(c->sq_data + guess + 64);
		/* Copy the entry once; the client may be rewriting it as we read. */
		memcpy(&e, &c->sqes[ring_slot(c->sq_head, c->lay.sq_entries)], sizeof e);
		c->sq_head++;
		c->n_submitted++;
		if (e.rsv0 || e.rsv1 || e.rsv2 || e.rsv3) {
			r = ipc_conn_violation(c, "reserved fields of sqe %u are not zero", c->sq_head - 1);
			break;
		}
		if (e.req_id == 0) {
			r = ipc_conn_violation(c, "sqe %u has request id 0", c->sq_head - 1);
			break;
		}
		if (e.opcode != IPC_OP_GENERATE && e.data_len) {
			r = ipc_conn_violation(c, "sqe %u (opcode %u) carries data", c->sq_head - 1, e.opcode);
			break;
		}
		r = 0;
		switch (e.opcode) {
		case IPC_OP_GENERATE:
			r = consume_generate(c, &e, draining, now_ns, &items[n]);
			if (r > 0)
				n += r, r = 0;
			break;
		case IPC_OP_CANCEL: {
			struct ipc_flight *f = ipc_conn_find(c, e.req_id);
			if (f && f->kind == IPC_OP_GENERATE)
				items[n++] = (struct ipc_conn_item){.type = IPC_CONN_CANCEL, .req_id = e.req_id};
			break; /* cancelling what already ended is not an error */
		}
		case IPC_OP_STATS:
			if (ipc_conn_find(c, e.req_id))
				r = ipc_conn_violation(c, "request id %llu is already in flight",
						       (unsigned long long)e.req_id);
			else if (take_flight(c, e.req_id, IPC_OP_STATS))
				items[n++] = (struct ipc_conn_item){.type = IPC_CONN_STATS, .req_id = e.req_id};
			break;
		default:
			r = ipc_conn_violation(c, "sqe %u has unknown opcode %u", c->sq_head - 1, e.opcode);
		}
		if (r < 0)
			break;
	}
	if (r < 0) {
		/* The connection is done for: what this call decoded never reaches the engine
		 * (the flights go with the conn). */
		for (int i = 0; i < n; i++)
			ipc_request_free(items[i].req);
		return r;
	}
	/* Release: our copies of the consumed sqes and records are complete before the client
	 * may reuse their slots and bytes. */
	atomic_store_explicit(&c->hdr->sq_head.v, c->sq_head, memory_order_release);
	return n;
}
