/*
 * frame.c — GENERATE records and event payloads: size, encode, decode, validate.
 *
 * Owns: the byte formats of ipc/proto.h and the parameter ranges of dsv32.h (checked here, on
 * the server, so a bad value becomes a typed error on that request).
 * Must not: read shared memory (callers pass private copies), know about models (token ids are
 * not checked against a vocabulary: that is the engine's job).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/frame.h"

static uint64_t pad4(uint64_t n) { return (n + 3) & ~(uint64_t)3; }

int ipc_utf8_valid(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + n;
	while (p < end) {
		unsigned c = *p;
		if (c < 0x80) {
			p++;
			continue;
		}
		size_t k;
		unsigned lo = 0x80, hi = 0xbf;
		if (c >= 0xc2 && c <= 0xdf)
			k = 1;
		else if (c >= 0xe0 && c <= 0xef) {
			k = 2;
			if (c == 0xe0)
				lo = 0xa0; /* no overlongs */
			if (c == 0xed)
				hi = 0x9f; /* no surrogates */
		} else if (c >= 0xf0 && c <= 0xf4) {
			k = 3;
			if (c == 0xf0)
				lo = 0x90;
			if (c == 0xf4)
				hi = 0x8f; /* <= U+10FFFF */
		} else
			return 0;
		if ((size_t)(end - p) <= k)
			return 0;
		if (p[1] < lo || p[1] > hi)
			return 0;
		for (size_t i = 2; i <= k; i++)
			if ((p[i] & 0xc0) != 0x80)
				return 0;
		p += k + 1;
	}
	return 1;
}

void ipc_request_free(struct ipc_request *r) { free(r); }

/* ---- GENERATE: client side ------------------------------------------------------------------ */

size_t ipc_frame_generate_size(const struct dsv32_generate_params *p)
{
	uint64_t prompt = p->input == DSV32_INPUT_TOKENS ? (uint64_t)p->n_tokens * 4 : p->text_len;
	if (p->input == DSV32_INPUT_TOKENS ? (p->n_tokens && !p->tokens) : (p->text_len && !p->text))
		return 0;
	if ((p->n_stop && !p->stop) || (p->n_stop_tokens && !p->stop_tokens))
		return 0;
	if (p->n_stop > 4 * DSV32_MAX_STOP || p->n_stop_tokens > 4 * DSV32_MAX_STOP_TOKENS ||
	    prompt > UINT32_MAX / 2)
		return 0;
	uint64_t n = sizeof(struct ipc_gen_wire) + pad4(prompt) + 4 * (uint64_t)p->n_stop_tokens;
	for (size_t i = 0; i < p->n_stop; i++) {
		if (!p->stop[i])
			return 0;
		size_t l = strlen(p->stop[i]);
		if (l > 4 * DSV32_MAX_STOP_LEN)
			return 0;
		n += 4 + pad4(l);
	}
	return n > UINT32_MAX / 2 ? 0 : (size_t)n;
}

void ipc_frame_encode_generate(void *dst, const struct dsv32_generate_params *p)
{
	char *o = dst;
	struct ipc_gen_wire w = {
		.input = p->input,
		.flags = p->flags,
		.temperature = p->temperature,
		.top_p = p->top_p,
		.min_p = p->min_p,
		.top_k = p->top_k,
		.repetition_penalty = p->repetition_penalty,
		.presence_penalty = p->presence_penalty,
		.frequency_penalty = p->frequency_penalty,
		.max_tokens = p->max_tokens,
		.seed = p->seed,
		.logprobs = p->logprobs,
		.prompt_len = (uint32_t)(p->input == DSV32_INPUT_TOKENS ? p->n_tokens : p->text_len),
		.n_stop = (uint32_t)p->n_stop,
		.n_stop_tokens = (uint32_t)p->n_stop_tokens,
	};
	size_t stop_bytes = 0;
	for (size_t i = 0; i < p->n_stop; i++)
		stop_bytes += 4 + pad4(strlen(p->stop[i]));
	w.stop_bytes = (uint32_t)stop_bytes;
	memcpy(o, &w, sizeof w);
	size_t off = sizeof w;
	size_t plen = p->input == DSV32_INPUT_TOKENS ? p->n_tokens * 4 : p->text_len;
	if (plen)
		memcpy(o + off, p->input == DSV32_INPUT_TOKENS ? (const void *)p->tokens
							       : (const void *)p->text, plen);
	memset(o + off + plen, 0, pad4(plen) - plen);
	off += pad4(plen);
	if (p->n_stop_tokens)
		memcpy(o + off, p->stop_tokens, 4 * p->n_stop_tokens);
	off += 4 * p->n_stop_tokens;
	for (size_t i = 0; i < p->n_stop; i++) {
		uint32_t l = (uint32_t)strlen(p->stop[i]);
		memcpy(o + off, &l, 4);
		memcpy(o + off + 4, p->stop[i], l);
		memset(o + off + 4 + l, 0, pad4(l) - l);
		off += 4 + pad4(l);
	}
}

/* ---- GENERATE: server side ------------------------------------------------------------------ */

__attribute__((format(printf, 4, 5))) static int fail(char *msg, size_t cap, int code,
						      const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, cap, fmt, ap);
	va_end(ap);
	return code;
}

static int in_range(float v, float lo, float hi) { return isfinite(v) && v >= lo && v <= hi; }

/* Value checks on a structurally sound record. */
static int validate(const struct ipc_gen_wire *w, char *msg, size_t cap)
{
	if (w->input < DSV32_INPUT_TEXT || w->input > DSV32_INPUT_TOKENS)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "input kind %u is not 1 (text), 2 (chat) or 3 (tokens)", w->input);
	if (w->flags & ~(uint32_t)DSV32_GEN_THINKING)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "unknown flags 0x%x", w->flags);
	if (!in_range(w->temperature, 0, 100))
		return fail(msg, cap, DSV32_E_BAD_PARAM, "temperature %g not in [0, 100]", w->temperature);
	if (!in_range(w->top_p, 0, 1) || w->top_p == 0)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "top_p %g not in (0, 1]", w->top_p);
	if (!in_range(w->min_p, 0, 1))
		return fail(msg, cap, DSV32_E_BAD_PARAM, "min_p %g not in [0, 1]", w->min_p);
	if (w->top_k < 0)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "top_k %d is negative", w->top_k);
	if (!in_range(w->repetition_penalty, 0, 100) || w->repetition_penalty == 0)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "repetition_penalty %g not in (0, 100]", w->repetition_penalty);
	if (!in_range(w->presence_penalty, -2, 2))
		return fail(msg, cap, DSV32_E_BAD_PARAM, "presence_penalty %g not in [-2, 2]", w->presence_penalty);
	if (!in_range(w->frequency_penalty, -2, 2))
		return fail(msg, cap, DSV32_E_BAD_PARAM, "frequency_penalty %g not in [-2, 2]", w->frequency_penalty);
	if (w->max_tokens == 0)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "max_tokens is 0");
	if (w->logprobs > DSV32_MAX_LOGPROBS)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "logprobs %u > %d", w->logprobs, DSV32_MAX_LOGPROBS);
	if (w->n_stop > DSV32_MAX_STOP)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "%u stop strings > %d", w->n_stop, DSV32_MAX_STOP);
	if (w->n_stop_tokens > DSV32_MAX_STOP_TOKENS)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "%u stop token ids > %d", w->n_stop_tokens, DSV32_MAX_STOP_TOKENS);
	if (w->prompt_len == 0)
		return fail(msg, cap, DSV32_E_BAD_PARAM, "empty prompt");
	return 0;
}

int ipc_frame_decode_generate(const void *rec, uint32_t len, uint64_t req_id,
			      uint32_t max_prompt_bytes, struct ipc_request **out, char *msg,
			      size_t msg_cap)
{
	const char *b = rec;
	*out = NULL;
	struct ipc_gen_wire w;
	if (len < sizeof w)
		return fail(msg, msg_cap, DSV32_E_BAD_FRAME, "generate record of %u bytes < %zu", len, sizeof w);
	memcpy(&w, b, sizeof w);
	if (w.rsv)
		return fail(msg, msg_cap, DSV32_E_BAD_FRAME, "reserved field of generate record is %u", w.rsv);
	/* structure: the sections must add up to len exactly (64-bit math: no field can wrap) */
	uint64_t unit = w.input == DSV32_INPUT_TOKENS ? 4 : 1;
	uint64_t prompt_bytes = w.prompt_len * unit;
	uint64_t off_prompt = sizeof w, off_stoptok = off_prompt + pad4(prompt_bytes);
	uint64_t off_stop = off_stoptok + 4 * (uint64_t)w.n_stop_tokens;
	if (off_stop + w.stop_bytes != len)
		return fail(msg, msg_cap, DSV32_E_BAD_FRAME,
			    "generate record sections add up to %llu bytes, record has %u",
			    (unsigned long long)(off_stop + w.stop_bytes), len);
	uint64_t so = off_stop, n_chars = 0;
	for (uint32_t i = 0; i < w.n_stop; i++) {
		uint32_t l;
		if (so + 4 > len)
			return fail(msg, msg_cap, DSV32_E_BAD_FRAME, "stop string %u header past the record", i);
		memcpy(&l, b + so, 4);
		if (so + 4 + pad4(l) > len)
			return fail(msg, msg_cap, DSV32_E_BAD_FRAME, "stop string %u (%u bytes) past the record", i, l);
		so += 4 + pad4(l);
		n_chars += l;
	}
	if (so != len)
		return fail(msg, msg_cap, DSV32_E_BAD_FRAME, "stop section has %llu stray bytes",
			    (unsigned long long)(len - so));
	/* values */
	int code = validate(&w, msg, msg_cap);
	if (code)
		return code;
	if (prompt_bytes > max_prompt_bytes)
		return fail(msg, msg_cap, DSV32_E_PROMPT_TOO_LONG, "prompt of %llu bytes > limit %u",
			    (unsigned long long)prompt_bytes, max_prompt_bytes);
	if (unit == 1 && !ipc_utf8_valid(b + off_prompt, prompt_bytes))
		return fail(msg, msg_cap, DSV32_E_BAD_UTF8, "prompt is not valid UTF-8");
	so = off_stop;
	for (uint32_t i = 0; i < w.n_stop; i++) {
		uint32_t l;
		memcpy(&l, b + so, 4);
		if (l == 0 || l > DSV32_MAX_STOP_LEN)
			return fail(msg, msg_cap, DSV32_E_BAD_PARAM, "stop string %u has %u bytes (1..%d)", i, l, DSV32_MAX_STOP_LEN);
		if (!ipc_utf8_valid(b + so + 4, l))
			return fail(msg, msg_cap, DSV32_E_BAD_UTF8, "stop string %u is not valid UTF-8", i);
		so += 4 + pad4(l);
	}
	/* one block: struct, arrays (4-byte aligned first), then strings */
	uint64_t sz = sizeof(struct ipc_request) + (uint64_t)w.n_stop * (sizeof(char *) + 4) +
		      4 * (uint64_t)w.n_stop_tokens + (unit == 4 ? prompt_bytes : prompt_bytes + 1) +
		      n_chars + w.n_stop;
	char *m = malloc(sz);
	if (!m)
		return -ENOMEM;
	struct ipc_request *r = (struct ipc_request *)m;
	char *p = m + sizeof *r;
	*r = (struct ipc_request){
		.id = req_id,
		.input = w.input,
		.flags = w.flags,
		.temperature = w.temperature,
		.top_p = w.top_p,
		.min_p = w.min_p,
		.top_k = w.top_k,
		.repetition_penalty = w.repetition_penalty,
		.presence_penalty = w.presence_penalty,
		.frequency_penalty = w.frequency_penalty,
		.seed = w.seed,
		.max_tokens = w.max_tokens,
		.logprobs = w.logprobs,
		.n_stop_tokens = w.n_stop_tokens,
		.n_stop = w.n_stop,
	};
	r->stop = (const char **)p;
	p += w.n_stop * sizeof(char *);
	r->stop_len = (const uint32_t *)p;
	p += 4 * (size_t)w.n_stop;
	r->stop_tokens = (const uint32_t *)p;
	memcpy(p, b + off_stoptok, 4 * (size_t)w.n_stop_tokens);
	p += 4 * (size_t)w.n_stop_tokens;
	if (unit == 4) {
		r->tokens = (const uint32_t *)p;
		r->n_tokens = w.prompt_len;
		memcpy(p, b + off_prompt, prompt_bytes);
		p += prompt_bytes;
	} else {
		r->text = p;
		r->text_len = w.prompt_len;
		memcpy(p, b + off_prompt, prompt_bytes);
		p[prompt_bytes] = 0;
		p += prompt_bytes + 1;
	}
	so = off_stop;
	for (uint32_t i = 0; i < w.n_stop; i++) {
		uint32_t l;
		memcpy(&l, b + so, 4);
		((uint32_t *)r->stop_len)[i] = l;
		r->stop[i] = p;
		memcpy(p, b + so + 4, l);
		p[l] = 0;
		p += l + 1;
		so += 4 + pad4(l);
	}
	*out = r;
	return 0;
}

/* ---- events --------------------------------------------------------------------------------- */

uint32_t ipc_frame_token_size(uint32_t n_tokens, uint32_t n_top, int has_logprobs,
			      uint32_t text_len)
{
	uint64_t n = sizeof(struct ipc_token_wire) + 4 * (uint64_t)n_tokens + text_len;
	if (has_logprobs)
		n += 4 * (uint64_t)n_tokens + 8 * (uint64_t)n_tokens * n_top;
	return n > UINT32_MAX / 2 ? UINT32_MAX : (uint32_t)n;
}

void ipc_frame_encode_token(void *dst, const uint32_t *tokens, uint32_t n_tokens,
			    const float *logprobs, const struct dsv32_top_logprob *top,
			    uint32_t n_top, const char *text, uint32_t text_len)
{
	char *o = dst;
	struct ipc_token_wire h = {n_tokens, text_len, logprobs ? n_top : 0,
				   logprobs ? IPC_TOK_LOGPROBS : 0};
	memcpy(o, &h, sizeof h);
	o += sizeof h;
	if (n_tokens) /* tokens may be NULL with n_tokens 0 (a text-only piece) */
		memcpy(o, tokens, 4 * (size_t)n_tokens);
	o += 4 * (size_t)n_tokens;
	if (logprobs) {
		if (n_tokens)
			memcpy(o, logprobs, 4 * (size_t)n_tokens);
		o += 4 * (size_t)n_tokens;
		if (n_top && top && n_tokens)
			memcpy(o, top, 8 * (size_t)n_tokens * n_top);
		else if (n_top && n_tokens)
			memset(o, 0, 8 * (size_t)n_tokens * n_top);
		o += 8 * (size_t)n_tokens * n_top;
	}
	if (text_len)
		memcpy(o, text, text_len);
}

uint32_t ipc_frame_error_size(uint32_t msg_len)
{
	return (uint32_t)sizeof(struct ipc_error_wire) + msg_len;
}

void ipc_frame_encode_error(void *dst, int32_t code, const char *msg, uint32_t msg_len)
{
	struct ipc_error_wire h = {code, msg_len};
	memcpy(dst, &h, sizeof h);
	if (msg_len)
		memcpy((char *)dst + sizeof h, msg, msg_len);
}

int ipc_frame_decode_event(const struct ipc_cqe *cqe, char *payload, uint32_t len,
			   struct dsv32_event *ev)
{
	memset(ev, 0, sizeof *ev);
	ev->type = cqe->type;
	ev->request_id = cqe->req_id;
	payload[len] = 0;
	switch (cqe->type) {
	case IPC_EV_TOKEN: {
		struct ipc_token_wire h;
		if (len < sizeof h)
			return -EPROTO;
		memcpy(&h, payload, sizeof h);
		int lp = !!(h.flags & IPC_TOK_LOGPROBS);
		if (h.n_top > DSV32_MAX_LOGPROBS || (!lp && h.n_top) ||
		    ipc_frame_token_size(h.n_tokens, h.n_top, lp, h.text_len) != len)
			return -EPROTO;
		char *o = payload + sizeof h;
		ev->token.seq = cqe->seq;
		ev->token.n_tokens = h.n_tokens;
		ev->token.tokens = (const uint32_t *)o;
		o += 4 * (size_t)h.n_tokens;
		if (lp) {
			ev->token.n_top = h.n_top;
			ev->token.logprobs = (const float *)o;
			o += 4 * (size_t)h.n_tokens;
			ev->token.top = h.n_top ? (const struct dsv32_top_logprob *)o : NULL;
			o += 8 * (size_t)h.n_tokens * h.n_top;
		}
		ev->token.text = o;
		ev->token.text_len = h.text_len;
		return 0;
	}
	case IPC_EV_DONE: {
		struct ipc_done_wire d;
		if (len != sizeof d)
			return -EPROTO;
		memcpy(&d, payload, sizeof d);
		ev->done.reason = d.reason;
		ev->done.prompt_tokens = d.prompt_tokens;
		ev->done.completion_tokens = d.completion_tokens;
		ev->done.queued_us = d.queued_ns / 1e3;
		ev->done.ttft_us = d.ttft_ns / 1e3;
		ev->done.per_token_us = d.per_token_ns / 1e3;
		return 0;
	}
	case IPC_EV_ERROR: {
		struct ipc_error_wire h;
		if (len < sizeof h)
			return -EPROTO;
		memcpy(&h, payload, sizeof h);
		if (sizeof h + (uint64_t)h.msg_len != len)
			return -EPROTO;
		ev->error.code = h.code;
		ev->error.message = payload + sizeof h;
		return 0;
	}
	case IPC_EV_STATS:
		ev->stats.text = payload;
		ev->stats.len = len;
		return 0;
	default:
		return -EPROTO;
	}
}
