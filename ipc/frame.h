/*
 * frame.h — encoding and decoding of the records that travel in the data areas: GENERATE
 * requests (client encodes, server decodes and validates) and events (server encodes, client
 * decodes). Formats: ipc/proto.h.
 *
 * Must not: read shared memory. Decoders only see private copies (the caller copies the record
 * out of the region first), so every field is read once, from memory nobody else writes.
 */
#ifndef DSV32_IPC_FRAME_H
#define DSV32_IPC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "ipc/dsv32.h"
#include "ipc/proto.h"

/* A validated generate request, copied out of shared memory into one heap block owned by the
 * serving loop (free with ipc_request_free). Strings are NUL-terminated copies. */
struct ipc_request {
	uint64_t id;    /* client-chosen request id */
	uint32_t input; /* enum dsv32_input */
	uint32_t flags; /* enum dsv32_gen_flags */
	float temperature, top_p, min_p;
	int32_t top_k;
	float repetition_penalty, presence_penalty, frequency_penalty;
	uint64_t seed;
	uint32_t max_tokens;
	uint32_t logprobs;
	const char *text; /* TEXT, CHAT: text_len bytes of valid UTF-8 (+ NUL) */
	uint32_t text_len;
	const uint32_t *tokens; /* TOKENS: n_tokens ids (not checked against the vocabulary) */
	uint32_t n_tokens;
	const uint32_t *stop_tokens; /* [n_stop_tokens] */
	uint32_t n_stop_tokens;
	const char **stop;       /* [n_stop] NUL-terminated UTF-8 */
	const uint32_t *stop_len; /* [n_stop] bytes */
	uint32_t n_stop;
	uint64_t t_submit_ns; /* CLOCK_MONOTONIC when the server took it off the ring */
};

void ipc_request_free(struct ipc_request *r);

/* 1 if s[0..n) is valid UTF-8 (no overlongs, surrogates or code points above U+10FFFF). */
int ipc_utf8_valid(const char *s, size_t n);

/* Bytes of the GENERATE record for p; 0 if p is structurally unusable (NULL text with a length,
 * a section larger than 4 GiB, more than DSV32_MAX_STOP*4 stop strings...). */
size_t ipc_frame_generate_size(const struct dsv32_generate_params *p);
/* Writes the record (dst has ipc_frame_generate_size(p) bytes). */
void ipc_frame_encode_generate(void *dst, const struct dsv32_generate_params *p);

/* Decodes and validates a GENERATE record (a private copy, len bytes, 8-byte aligned).
 * Returns 0 and *out, or a dsv32_error code with a message in msg: DSV32_E_BAD_FRAME means the
 * record is malformed (a protocol violation: disconnect); any other code is a typed error for
 * this request only. -ENOMEM: out of memory. */
int ipc_frame_decode_generate(const void *rec, uint32_t len, uint64_t req_id,
			      uint32_t max_prompt_bytes, struct ipc_request **out, char *msg,
			      size_t msg_cap);

/* Event payload sizes and encoders (server side). */
uint32_t ipc_frame_token_size(uint32_t n_tokens, uint32_t n_top, int has_logprobs,
			      uint32_t text_len);
void ipc_frame_encode_token(void *dst, const uint32_t *tokens, uint32_t n_tokens,
			    const float *logprobs, const struct dsv32_top_logprob *top,
			    uint32_t n_top, const char *text, uint32_t text_len);
uint32_t ipc_frame_error_size(uint32_t msg_len);
void ipc_frame_encode_error(void *dst, int32_t code, const char *msg, uint32_t msg_len);

/* Decodes one event (client side): cqe and payload are private copies; payload is 8-byte
 * aligned with one spare byte after len (for the NUL the strings get). Pointers in ev point
 * into payload. Returns 0 or -EPROTO. */
int ipc_frame_decode_event(const struct ipc_cqe *cqe, char *payload, uint32_t len,
			   struct dsv32_event *ev);

#endif
