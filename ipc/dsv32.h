/*
 * dsv32.h — the public client API of dsv32 (the only public header; libdsv32.a).
 *
 * Clients talk to the dsv32d daemon over shared-memory rings handed over a unix socket
 * (docs/PROTOCOL.md). Functions return 0 or a negative errno; opaque handles end in _t.
 *
 *   dsv32_t *h;
 *   dsv32_connect(NULL, &h);                       // default socket path
 *   struct dsv32_generate_params p;
 *   dsv32_generate_params_init(&p, 1);             // request id 1, defaults (greedy)
 *   p.input = DSV32_INPUT_TEXT; p.text = "Hello"; p.text_len = 5; p.max_tokens = 16;
 *   dsv32_submit_generate(h, &p);
 *   struct dsv32_event ev;
 *   while (dsv32_wait(h, -1, &ev) == 1 && ev.type == DSV32_EVENT_TOKEN)
 *           fwrite(ev.token.text, 1, ev.token.text_len, stdout);
 *   dsv32_close(h);
 *
 * A handle is not thread-safe: use it from one thread at a time.
 */
#ifndef DSV32_H
#define DSV32_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Typed errors carried by error events (a closed, documented list; README "Errors"). */
enum dsv32_error {
	DSV32_OK = 0,
	DSV32_E_BAD_FRAME = 1,        /* malformed record or ring state: protocol violation */
	DSV32_E_VERSION = 2,          /* protocol version mismatch */
	DSV32_E_PROMPT_TOO_LONG = 3,  /* prompt longer than the configured limit */
	DSV32_E_BAD_PARAM = 4,        /* a sampling or request parameter out of range */
	DSV32_E_BAD_TOKEN = 5,        /* a token id outside the vocabulary */
	DSV32_E_BAD_UTF8 = 6,         /* text that must be UTF-8 is not */
	DSV32_E_TOO_LARGE = 7,        /* message larger than the data area allows */
	DSV32_E_QUEUE_FULL = 8,       /* too many in-flight requests (per client or total) */
	DSV32_E_TOO_MANY_CLIENTS = 9, /* client limit reached at connect */
	DSV32_E_BUSY = 10,            /* completion ring full: the client is not draining it */
	DSV32_E_DRAINING = 11,        /* the server is shutting down and takes no new requests */
	DSV32_E_ENGINE_FAULT = 12,    /* unrecoverable engine error (e.g. sticky GPU fault) */
	DSV32_E_CANCELLED = 13,       /* the request was cancelled */
	DSV32_E_SERVER_LOST = 14,     /* synthesised by the client: the server went away */
	DSV32_E_COUNT
};

/* Default socket path of dsv32d. */
#define DSV32_DEFAULT_SOCKET "/run/dsv32/dsv32.sock"

/* Limits every server applies (documented in docs/PROTOCOL.md; exceeding one: bad_parameter). */
#define DSV32_MAX_STOP 16          /* stop strings per request */
#define DSV32_MAX_STOP_LEN 256     /* bytes per stop string */
#define DSV32_MAX_STOP_TOKENS 64   /* stop token ids per request */
#define DSV32_MAX_LOGPROBS 20      /* top alternatives per token */

typedef struct dsv32 dsv32_t;

/* What the prompt is. */
enum dsv32_input {
	DSV32_INPUT_TEXT = 1,   /* raw UTF-8 text, tokenized as is */
	DSV32_INPUT_CHAT = 2,   /* OpenAI-style JSON array of messages (UTF-8), rendered by the server */
	DSV32_INPUT_TOKENS = 3, /* token ids */
};

/* Request flags. */
enum dsv32_gen_flags {
	DSV32_GEN_THINKING = 1u << 0, /* chat: thinking mode on */
};

/* Why a request finished (closed list). */
enum dsv32_finish {
	DSV32_FINISH_STOP = 1,          /* a stop string or stop token id matched */
	DSV32_FINISH_LENGTH = 2,        /* max_tokens reached */
	DSV32_FINISH_EOS = 3,           /* the model emitted end-of-sequence */
	DSV32_FINISH_CANCELLED = 4,     /* dsv32_cancel */
	DSV32_FINISH_CONTEXT_LIMIT = 5, /* the context window is full */
	DSV32_FINISH_COUNT
};

/* A generate request. Pointers need only live until dsv32_submit_generate returns. */
struct dsv32_generate_params {
	uint64_t request_id; /* client-chosen, non-zero, unique among this handle's in-flight ones */
	uint32_t input;      /* enum dsv32_input */
	uint32_t flags;      /* enum dsv32_gen_flags */
	const char *text;    /* TEXT or CHAT: UTF-8, text_len bytes (no NUL needed) */
	size_t text_len;
	const uint32_t *tokens; /* TOKENS: n_tokens ids */
	size_t n_tokens;
	float temperature;        /* [0, 100]; 0 = greedy                       default 0 */
	float top_p;              /* (0, 1]                                     default 1 */
	int32_t top_k;            /* >= 0; 0 = off                              default 0 */
	float min_p;              /* [0, 1]; 0 = off                            default 0 */
	float repetition_penalty; /* (0, 100]; 1 = off                          default 1 */
	float presence_penalty;   /* [-2, 2]                                    default 0 */
	float frequency_penalty;  /* [-2, 2]                                    default 0 */
	uint64_t seed;            /* sampling seed                              default 0 */
	uint32_t max_tokens;      /* >= 1                                       default 256 */
	const char *const *stop;  /* n_stop NUL-terminated UTF-8 stop strings */
	size_t n_stop;
	const uint32_t *stop_tokens; /* n_stop_tokens ids that end the request */
	size_t n_stop_tokens;
	uint32_t logprobs; /* 0: none; else the chosen token's logprob and this many alternatives */
};

/* Fills defaults (above) and the request id. */
void dsv32_generate_params_init(struct dsv32_generate_params *p, uint64_t request_id);

enum dsv32_event_type {
	DSV32_EVENT_TOKEN = 1, /* one or more tokens of a request */
	DSV32_EVENT_DONE = 2,  /* terminal: the request finished */
	DSV32_EVENT_ERROR = 3, /* terminal for request_id; request_id 0: about the connection */
	DSV32_EVENT_STATS = 4, /* terminal: the answer to dsv32_stats */
};

struct dsv32_top_logprob {
	uint32_t token;
	float logprob;
};

/* An event. Pointers point into the handle and stay valid until the next dsv32_poll,
 * dsv32_wait or dsv32_close on it. Every accepted request ends in exactly one DONE or ERROR
 * (a stats request: STATS or ERROR); TOKEN events carry seq 0, 1, 2, ... without gaps. */
struct dsv32_event {
	uint32_t type; /* enum dsv32_event_type */
	uint64_t request_id;
	union {
		struct {
			uint32_t seq;
			uint32_t n_tokens;
			const uint32_t *tokens;
			const char *text; /* UTF-8 piece (complete characters), text_len bytes, NUL-terminated */
			uint32_t text_len;
			uint32_t n_top;          /* alternatives per token (0: no logprobs) */
			const float *logprobs;   /* [n_tokens] or NULL */
			const struct dsv32_top_logprob *top; /* [n_tokens][n_top] or NULL */
		} token;
		struct {
			uint32_t reason; /* enum dsv32_finish */
			uint32_t prompt_tokens, completion_tokens;
			double queued_us;    /* submission to first scheduling */
			double ttft_us;      /* submission to first token */
			double per_token_us; /* mean time per completion token after the first */
		} done;
		struct {
			int32_t code;        /* enum dsv32_error */
			const char *message; /* NUL-terminated */
		} error;
		struct {
			const char *text; /* "key value\n" lines, NUL-terminated */
			uint32_t len;
		} stats;
	};
};

/* Connects to the server at path (NULL: DSV32_DEFAULT_SOCKET). Errors: -ENOENT/-ECONNREFUSED
 * (no server), -EACCES (uid/gid not allowed), -EUSERS (too many clients), -EPROTONOSUPPORT
 * (protocol version mismatch), -ETIMEDOUT (no hello within 10 s), -EPROTO (bad hello/region). */
int dsv32_connect(const char *path, dsv32_t **out);
/* Closes the connection; the server ends the handle's requests. */
void dsv32_close(dsv32_t *h);
/* Queues a generate request. -EAGAIN: the submission ring or its data area is full (consume
 * events and retry); -EEXIST: request id in flight; -EINVAL: bad arguments (id 0, NULL text);
 * -EMSGSIZE: the record exceeds the server's message limit; -ENOTCONN: connection lost.
 * Parameter ranges are checked by the server (an ERROR event with a typed code). */
int dsv32_submit_generate(dsv32_t *h, const struct dsv32_generate_params *p);
/* Asks the server to end a request early (its terminal event is DONE with reason cancelled,
 * or whatever ended it first). -ENOENT: not in flight. */
int dsv32_cancel(dsv32_t *h, uint64_t request_id);
/* Asks for the server's statistics; the answer is a STATS event with this request id. */
int dsv32_stats(dsv32_t *h, uint64_t request_id);
/* Takes the next event without blocking: 1 (an event in *ev), 0 (none), -ENOTCONN (the
 * connection is gone and every event, including the synthesised server_lost errors for the
 * requests that were in flight, has been delivered). */
int dsv32_poll(dsv32_t *h, struct dsv32_event *ev);
/* Like dsv32_poll but waits up to timeout_ms (-1: forever): spins briefly, then sleeps on a
 * futex. Returns 1, 0 on timeout, or -ENOTCONN. */
int dsv32_wait(dsv32_t *h, int timeout_ms, struct dsv32_event *ev);
/* Microseconds dsv32_wait spins before it sleeps (default 20). */
void dsv32_set_spin(dsv32_t *h, unsigned us);
/* The server instance this handle is connected to (a restarted server has another epoch). */
uint64_t dsv32_epoch(const dsv32_t *h);
/* Requests (and stats queries) of this handle still waiting for their terminal event. */
unsigned dsv32_inflight(const dsv32_t *h);

/* Stable name of a finish reason ("stop", "length", "eos", "cancelled", "context_limit"). */
const char *dsv32_finish_name(int reason);
/* Stable name of an error code ("bad_frame", ...), or "unknown". */
const char *dsv32_error_name(int code);
/* One-line description of an error code. */
const char *dsv32_error_text(int code);
/* Library version, "MAJOR.MINOR.PATCH". */
const char *dsv32_version(void);

#ifdef __cplusplus
}
#endif
#endif
