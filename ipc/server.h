/*
 * server.h — the server side of dsv32's IPC, as the serving loop sees it.
 *
 * The loop calls ipc_server_poll() once per step: it accepts clients, reaps dead or
 * misbehaving ones (IPC_ITEM_GONE: free their requests), and returns validated requests
 * copied out of shared memory. The loop answers with ipc_server_emit_*(), which never block.
 * With nothing to do, ipc_server_poll(s, timeout, ...) spins briefly and then sleeps until a
 * client submits, connects or dies. Single-threaded: one thread owns a server.
 *
 * Must not: know about models (token ids are not checked against a vocabulary; prompts are not
 * tokenized), or wait on any one client.
 */
#ifndef DSV32_IPC_SERVER_H
#define DSV32_IPC_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "ipc/dsv32.h"
#include "ipc/frame.h"

struct ipc_server;

struct ipc_server_config {
	const char *path;             /* socket path (default DSV32_DEFAULT_SOCKET) */
	uint32_t socket_mode;         /* file mode of the socket (default 0666) */
	const uint32_t *allow_uids;   /* a client is let in if its uid, its gid or one of its
				       * supplementary groups is listed */
	uint32_t n_allow_uids;        /* ... or if both lists are empty (default: anyone) */
	const uint32_t *allow_gids;
	uint32_t n_allow_gids;
	uint32_t max_clients;         /* default 64 */
	uint32_t max_inflight_client; /* default 64 (requests + stats queries) */
	uint32_t max_inflight_total;  /* default 1024 */
	uint32_t max_msg_bytes;       /* largest GENERATE record, default 4 MiB */
	uint32_t max_prompt_bytes;    /* default 2 MiB (text bytes, or 4 x token ids) */
	uint32_t sq_entries;          /* default 256 */
	uint32_t cq_entries;          /* default 1024 (>= max_inflight_client + 2) */
	uint32_t sq_data_bytes;       /* default 8 MiB (>= max_msg_bytes) */
	uint32_t cq_data_bytes;       /* default 1 MiB */
	uint32_t spin_us;             /* idle spin before sleeping in ipc_server_poll, default 50 */
};

void ipc_server_config_init(struct ipc_server_config *c);

/* Binds and listens (a stale socket file of a dead server is replaced; a live one: -EADDRINUSE).
 * -EINVAL: inconsistent limits. */
int ipc_server_open(struct ipc_server **out, const struct ipc_server_config *cfg);
/* Tells every client the server is gone (state CLOSED, socket EOF), unlinks the socket. */
void ipc_server_close(struct ipc_server *s);

enum ipc_item_type {
	IPC_ITEM_GENERATE = 1, /* a new request: req is the caller's (ipc_request_free) */
	IPC_ITEM_CANCEL = 2,   /* end req_id early (DONE with reason cancelled), if still running */
	IPC_ITEM_STATS = 3,    /* answer with ipc_server_emit_stats (see ipc_server_format_stats) */
	IPC_ITEM_GONE = 4,     /* the client is gone: free every request of `client` now */
};

struct ipc_item {
	int type;        /* enum ipc_item_type */
	uint64_t client; /* handle of the connection, never reused; 0 is never a handle */
	uint32_t uid, gid; /* the client's identity (SO_PEERCRED); uid keys its prefix cache */
	int32_t pid;
	uint64_t req_id;
	struct ipc_request *req; /* GENERATE */
	int code; /* GONE: 0 (hung up or closed) or the dsv32_error it was disconnected with */
	char why[IPC_ERROR_MSG_MAX]; /* GONE with a code: what the client did */
};

/* One step: returns the number of items written (<= max), or a negative errno.
 * timeout_ms 0: never sleeps and makes no system call except an epoll check at most once per
 * millisecond (new clients, hang-ups); > 0 or -1: when there is nothing to return, spins up to
 * spin_us, then sleeps up to timeout_ms (-1: no limit). */
int ipc_server_poll(struct ipc_server *s, int timeout_ms, struct ipc_item *items, int max);

/* Events. Each returns 0, or: -ENOTCONN (the client is gone or was just disconnected: an
 * IPC_ITEM_GONE follows; drop the request there), -ENOENT (req_id is not in flight).
 * Token: non-terminal; seq numbers are assigned here. -ENOBUFS: the client's completion ring
 * is full: the request was ended with a `busy` error, drop it. -EMSGSIZE: too large, nothing
 * sent. logprobs may be NULL (then top and n_top are ignored); top may be NULL. */
int ipc_server_emit_token(struct ipc_server *s, uint64_t client, uint64_t req_id,
			  const uint32_t *tokens, uint32_t n_tokens, const float *logprobs,
			  const struct dsv32_top_logprob *top, uint32_t n_top, const char *text,
			  uint32_t text_len);
/* Terminal. reason: enum dsv32_finish; times in nanoseconds. */
int ipc_server_emit_done(struct ipc_server *s, uint64_t client, uint64_t req_id,
			 uint32_t reason, uint32_t prompt_tokens, uint32_t completion_tokens,
			 uint64_t queued_ns, uint64_t ttft_ns, uint64_t per_token_ns);
/* Terminal error for a request (engine-side validation: DSV32_E_BAD_TOKEN,
 * DSV32_E_PROMPT_TOO_LONG, DSV32_E_ENGINE_FAULT, ...); req_id 0: about the connection. */
int ipc_server_emit_error(struct ipc_server *s, uint64_t client, uint64_t req_id, int code,
			  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Terminal answer to IPC_ITEM_STATS ("key value\n" lines). -ENOBUFS: sent `busy` instead. */
int ipc_server_emit_stats(struct ipc_server *s, uint64_t client, uint64_t req_id,
			  const char *text, size_t len);
/* Disconnects a client after an error event with req_id 0; an IPC_ITEM_GONE follows. */
int ipc_server_disconnect(struct ipc_server *s, uint64_t client, int code, const char *msg);

/* Draining: every new GENERATE gets DSV32_E_DRAINING; stats and cancel still work. */
void ipc_server_set_draining(struct ipc_server *s, int on);

struct ipc_server_counters {
	uint32_t clients;  /* connected now */
	uint32_t inflight; /* requests and stats queries without their terminal event */
	uint64_t accepted, refused, hung_up, violations, requests, rejected, events, busy;
};
void ipc_server_counters(const struct ipc_server *s, struct ipc_server_counters *c);
/* Appends the counters as "ipc_<name> <value>\n" lines; returns the length (snprintf rules). */
int ipc_server_format_stats(const struct ipc_server *s, char *buf, size_t cap);
/* The epoch every client's header carries. */
uint64_t ipc_server_epoch(const struct ipc_server *s);

#endif
