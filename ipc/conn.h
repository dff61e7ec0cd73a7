/*
 * conn.h — the server's view of one client's shared region: consuming the submission ring
 * (copy out, then validate) and producing the completion ring (with room reserved for every
 * in-flight request's terminal event). Memory only: no sockets, no fds, no waiting; the one
 * system call is the futex wake of a sleeping client. server.c wraps it; the fuzz target
 * drives it over arbitrary bytes.
 *
 * Trust: nothing read from the region is trusted. Geometry comes from struct ipc_layout (the
 * server's private copy), indices the server owns are kept privately and only stored, indices
 * the client owns are checked on every read.
 */
#ifndef DSV32_IPC_CONN_H
#define DSV32_IPC_CONN_H

#include <stdint.h>

#include "ipc/frame.h"
#include "ipc/proto.h"
#include "ipc/ring.h"

/* Where the parts of a region lie (computed by the server, copied into the header). */
struct ipc_layout {
	uint32_t sq_entries, cq_entries, sq_data_bytes, cq_data_bytes;
	uint32_t sq_off, cq_off, sq_data_off, cq_data_off;
	uint64_t bytes;
};

/* Per-client limits. */
struct ipc_conn_limits {
	uint32_t max_msg_bytes;    /* largest GENERATE record (<= sq_data_bytes) */
	uint32_t max_prompt_bytes; /* largest prompt: text bytes or 4 x token ids */
	uint32_t max_inflight;     /* requests + stats queries waiting for their terminal event */
};

/* Server-wide in-flight count, shared by every conn of one server. */
struct ipc_totals {
	uint32_t inflight, max_inflight;
};

/* A request waiting for its terminal event. */
struct ipc_flight {
	uint64_t id;
	uint32_t seq;  /* next TOKEN sequence number */
	uint32_t kind; /* IPC_OP_GENERATE or IPC_OP_STATS */
};

struct ipc_conn {
	/* private copies of the geometry */
	uint8_t *base;
	struct ipc_header *hdr;
	struct ipc_sqe *sqes;
	struct ipc_cqe *cqes;
	uint8_t *sq_data, *cq_data;
	struct ipc_layout lay;
	struct ipc_conn_limits lim;
	struct ipc_totals *tot;
	/* ring state: indices this side owns, and the last accepted value of the peer's */
	uint32_t sq_head, sq_tail_seen;
	uint32_t sq_data_next; /* where the client's next record probably starts (a prefetch hint) */
	uint32_t cq_tail, cq_head_seen;
	struct ring_data cq_dat;  /* the cq data area, allocated by us */
	uint32_t *cq_data_end;    /* [cq_entries]: cq_dat.tail after each event's payload */
	struct ipc_flight *flight; /* [lim.max_inflight] */
	uint32_t n_flight;
	uint8_t *rec; /* [max_msg_bytes]: private copy of the record being decoded */
	/* set once the client broke the protocol: the connection must be closed */
	int violated;
	int conn_err_sent; /* the connection-level error reservation is used up */
	char why[IPC_ERROR_MSG_MAX];
	/* counters (diagnostics, tests) */
	uint64_t n_submitted, n_rejected, n_events, n_busy;
};

enum ipc_conn_item_type { IPC_CONN_GENERATE = 1, IPC_CONN_CANCEL = 2, IPC_CONN_STATS = 3 };

struct ipc_conn_item {
	int type;
	uint64_t req_id;
	struct ipc_request *req; /* GENERATE: owned by the caller from here on */
};

/* Lays out a region (ring entries and data sizes: powers of two). -EINVAL if not. */
int ipc_layout_compute(struct ipc_layout *l, uint32_t sq_entries, uint32_t cq_entries,
		       uint32_t sq_data_bytes, uint32_t cq_data_bytes);
/* Writes the header of a fresh (zeroed) region. */
void ipc_conn_format(void *base, const struct ipc_layout *l, const struct ipc_conn_limits *lim,
		     uint64_t epoch, uint32_t client_id);
/* Attaches to a formatted region. -EINVAL (limits do not fit the layout), -ENOMEM. */
int ipc_conn_init(struct ipc_conn *c, void *base, const struct ipc_layout *l,
		  const struct ipc_conn_limits *lim, struct ipc_totals *tot);
/* Releases private state and the conn's share of tot (the region is the caller's). */
void ipc_conn_free(struct ipc_conn *c);

/* Takes up to max submissions. Invalid requests are answered here with their typed error.
 * Returns the number of items, or -EPROTO once the client broke the protocol (a bad_frame
 * error was posted if there was room; c->why says what), or -ENOMEM. */
int ipc_conn_consume(struct ipc_conn *c, int draining, uint64_t now_ns,
		     struct ipc_conn_item *items, int max);
/* 1 if ipc_conn_consume would make progress now (or find a violation). */
int ipc_conn_ready(struct ipc_conn *c);

/* Events. -ENOENT: no such request in flight (finished, or never accepted): ignore.
 * -EPROTO: the client broke the protocol (close it). */
/* Non-terminal. -ENOBUFS: no room left beside the terminal reservations: the request was
 * ended with a `busy` error here, the caller drops it. -EMSGSIZE: larger than the data area
 * allows (nothing sent, request still in flight). */
int ipc_conn_emit_token(struct ipc_conn *c, uint64_t req_id, const uint32_t *tokens,
			uint32_t n_tokens, const float *logprobs,
			const struct dsv32_top_logprob *top, uint32_t n_top, const char *text,
			uint32_t text_len);
/* Terminal; always has room (reserved when the request was accepted). */
int ipc_conn_emit_done(struct ipc_conn *c, uint64_t req_id, const struct ipc_done_wire *d);
/* Terminal for req_id; req_id 0: about the connection (best effort: -ENOBUFS). Messages are
 * cut to IPC_ERROR_MSG_MAX bytes. */
int ipc_conn_emit_error(struct ipc_conn *c, uint64_t req_id, int code, const char *msg);
/* Terminal for a stats query; -ENOBUFS: no room, ended with `busy` instead. */
int ipc_conn_emit_stats(struct ipc_conn *c, uint64_t req_id, const char *text, uint32_t len);
/* Marks the connection violated and posts a bad_frame error (once). Returns -EPROTO. */
int ipc_conn_violation(struct ipc_conn *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Finds a request in flight, or NULL. */
struct ipc_flight *ipc_conn_find(struct ipc_conn *c, uint64_t req_id);

#endif
