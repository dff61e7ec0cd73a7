/*
 * proto.h — the wire protocol between dsv32d and its clients: the layout of one client's shared
 * region (header, submission ring, completion ring, two data areas), the records that travel in
 * the data areas, and the hello sent over the unix socket. docs/PROTOCOL.md is the prose version.
 *
 * Owns: sizes, offsets, magic numbers and record formats (sized, little-endian types only).
 * Must not: contain logic beyond constant helpers, know about models, include anything but libc.
 *
 * Index ownership (io_uring's rule: every index has exactly one writer):
 *   sq_tail  client   sq_head  server   sq_flags  server (NEED_WAKEUP: the server sleeps)
 *   cq_tail  server   cq_head  client   cq_flags  client (NEED_WAKEUP: the client sleeps)
 *   state    server   everything in the fixed part of the header: server, before handover.
 * Indices are free-running u32; slot = index & (entries - 1). The server never reads back an
 * index it owns from shared memory: it keeps private copies and only stores them.
 */
#ifndef DSV32_IPC_PROTO_H
#define DSV32_IPC_PROTO_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define IPC_MAGIC 0x32335644u /* "DV32" as little-endian bytes */
#define IPC_VERSION 1u
#define IPC_HEADER_BYTES 4096u
#define IPC_CACHE_LINE 64

/* Region state word (server-written): CLOSED means the server shut down cleanly. */
enum ipc_state { IPC_STATE_RUNNING = 0, IPC_STATE_CLOSED = 1 };
/* Flag bit in sq_flags / cq_flags: the flag's owner is (about to be) asleep; wake it. */
#define IPC_NEED_WAKEUP 1u

/* A free-running index padded to its own cache line so producer and consumer never share one. */
struct ipc_index {
	alignas(IPC_CACHE_LINE) _Atomic uint32_t v;
};

/* The first IPC_HEADER_BYTES of the region. The fixed part is written once by the server before
 * the memfd is handed over (the sendmsg/recvmsg pair orders it before any client read). */
struct ipc_header {
	uint32_t magic;        /* IPC_MAGIC */
	uint32_t version;      /* IPC_VERSION */
	uint64_t epoch;        /* server instance; a restarted server has another one */
	uint64_t region_bytes; /* size of the memfd (sealed: cannot grow or shrink) */
	uint32_t client_id;    /* server's slot number for this client (diagnostics) */
	uint32_t sq_entries;   /* power of two */
	uint32_t cq_entries;   /* power of two */
	uint32_t sq_off;       /* struct ipc_sqe[sq_entries] */
	uint32_t cq_off;       /* struct ipc_cqe[cq_entries] */
	uint32_t sq_data_off;  /* client-owned byte area, power-of-two size */
	uint32_t sq_data_bytes;
	uint32_t cq_data_off;  /* server-owned byte area, power-of-two size */
	uint32_t cq_data_bytes;
	uint32_t max_msg_bytes;    /* largest submission record */
	uint32_t max_prompt_bytes; /* largest prompt (text bytes, or 4 x token ids) */
	uint32_t max_inflight;     /* per client */
	struct ipc_index state;    /* enum ipc_state (server) */
	struct ipc_index sq_tail;  /* client */
	struct ipc_index sq_head;  /* server */
	struct ipc_index sq_flags; /* server */
	struct ipc_index cq_tail;  /* server; also the client's futex word */
	struct ipc_index cq_head;  /* client */
	struct ipc_index cq_flags; /* client */
};
_Static_assert(sizeof(struct ipc_header) <= IPC_HEADER_BYTES, "header fits its page");
_Static_assert(offsetof(struct ipc_header, state) == 128, "fixed part: two cache lines");

/* Submission opcodes. */
enum ipc_op { IPC_OP_GENERATE = 1, IPC_OP_CANCEL = 2, IPC_OP_STATS = 3 };

/* One submission (client -> server). Reserved fields must be zero. */
struct ipc_sqe {
	uint8_t opcode; /* enum ipc_op */
	uint8_t rsv0;
	uint16_t rsv1;
	uint32_t data_len; /* record bytes in the sq data area (GENERATE only; else 0) */
	uint32_t data_off; /* offset of the record inside the sq data area */
	uint32_t rsv2;
	uint64_t req_id; /* client-chosen, non-zero */
	uint64_t rsv3;
};
_Static_assert(sizeof(struct ipc_sqe) == 32, "sqe is 32 bytes");

/* Completion event types. */
enum ipc_ev { IPC_EV_TOKEN = 1, IPC_EV_DONE = 2, IPC_EV_ERROR = 3, IPC_EV_STATS = 4 };

/* One completion (server -> client). */
struct ipc_cqe {
	uint8_t type; /* enum ipc_ev */
	uint8_t rsv0;
	uint16_t rsv1;
	uint32_t data_len; /* payload bytes in the cq data area */
	uint32_t data_off;
	uint32_t seq;    /* TOKEN: consecutive per request from 0 */
	uint64_t req_id; /* 0: an error about the connection itself */
	uint64_t rsv3;
};
_Static_assert(sizeof(struct ipc_cqe) == 32, "cqe is 32 bytes");

/* GENERATE record, followed by (each section padded to 4 bytes):
 *   prompt: prompt_len bytes of UTF-8 (TEXT, CHAT) or prompt_len u32 token ids (TOKENS)
 *   stop token ids: u32[n_stop_tokens]
 *   stop strings: n_stop x { u32 len; u8 bytes[len]; pad to 4 }   (stop_bytes in all)
 * The record's data_len must equal the sum exactly. */
struct ipc_gen_wire {
	uint32_t input; /* enum dsv32_input */
	uint32_t flags; /* DSV32_GEN_* */
	float temperature, top_p, min_p;
	int32_t top_k;
	float repetition_penalty, presence_penalty, frequency_penalty;
	uint32_t max_tokens;
	uint64_t seed;
	uint32_t logprobs;
	uint32_t prompt_len;
	uint32_t n_stop;
	uint32_t n_stop_tokens;
	uint32_t stop_bytes;
	uint32_t rsv;
};
_Static_assert(sizeof(struct ipc_gen_wire) == 72, "generate header is 72 bytes");

/* TOKEN payload: header, u32 tokens[n_tokens], then if IPC_TOK_LOGPROBS: f32 logprob[n_tokens]
 * and { u32 id; f32 logprob; }[n_tokens * n_top], then text_len bytes of UTF-8. */
#define IPC_TOK_LOGPROBS 1u
struct ipc_token_wire {
	uint32_t n_tokens, text_len, n_top, flags;
};
/* DONE payload. */
struct ipc_done_wire {
	uint32_t reason; /* enum dsv32_finish */
	uint32_t prompt_tokens, completion_tokens, rsv;
	uint64_t queued_ns, ttft_ns, per_token_ns;
};
/* ERROR payload: header then msg_len bytes (no NUL). */
struct ipc_error_wire {
	int32_t code; /* enum dsv32_error */
	uint32_t msg_len;
};
/* STATS payload: "key value\n" lines of ASCII (documented in docs/PROTOCOL.md). */

/* Bounds on terminal events: a done or error payload is at most IPC_TERMINAL_MAX bytes, so the
 * server can reserve room for every in-flight request's terminal event (see conn.c). */
#define IPC_ERROR_MSG_MAX 200u
#define IPC_TERMINAL_MAX 256u
#define IPC_DATA_ALIGN 8u

/* Hello: the one socket message, server -> client, with SCM_RIGHTS {memfd, eventfd} when
 * status == 0. On refusal (status = a dsv32_error code) no fds are sent and the socket closes. */
struct ipc_hello {
	uint32_t magic, version;
	int32_t status;
	uint32_t client_id;
	uint64_t epoch;
	uint64_t region_bytes;
	uint32_t uid, gid; /* the identity the server saw (SO_PEERCRED) */
	uint32_t max_inflight, max_msg_bytes, max_prompt_bytes, rsv;
};
_Static_assert(sizeof(struct ipc_hello) == 56, "hello is 56 bytes");

static inline int ipc_is_pow2(uint64_t x) { return x && !(x & (x - 1)); }
static inline uint32_t ipc_align(uint32_t n, uint32_t a) { return (n + a - 1) & ~(a - 1); }

#endif
