/*
 * dsv32.h — the public client API of dsv32 (the only public header; libdsv32.a).
 *
 * Clients talk to the dsv32d daemon over shared-memory rings handed over a unix socket.
 * Functions return 0 or a negative errno; opaque handles end in _t. This header grows with the
 * client library; what is here now is the closed list of typed errors every event may carry.
 */
#ifndef DSV32_H
#define DSV32_H

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
