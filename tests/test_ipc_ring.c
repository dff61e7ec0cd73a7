/* test_ipc_ring.c — ring arithmetic, data-area allocation, record framing and validation. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "ipc/frame.h"
#include "ipc/ring.h"
#include "tests/test.h"

TEST(ipc_ring, full_empty_wraparound)
{
	const uint32_t n = 8;
	uint32_t head = UINT32_MAX - 3, tail = head; /* indices wrap past 2^32 during the test */
	CHECK_EQ_INT(ring_count(tail, head), 0);
	CHECK_EQ_INT(ring_space(tail, head, n), n);
	for (uint32_t i = 0; i < n; i++)
		tail++;
	CHECK_EQ_INT(ring_space(tail, head, n), 0);
	CHECK_EQ_INT(ring_count(tail, head), n);
	CHECK_EQ_INT(ring_slot(tail, n), ring_slot(head, n)); /* full: same slot, count says so */
	CHECK(tail < head);                                    /* the tail wrapped, the math holds */
	for (int k = 0; k < 100; k++) {                        /* steady state across the wrap */
		head++;
		tail++;
		CHECK_EQ_INT(ring_count(tail, head), n);
	}
	CHECK_EQ_INT(ring_check_tail(tail, tail, head, n), 0);
}

TEST(ipc_ring, index_ownership_checks)
{
	const uint32_t n = 16;
	uint32_t head = 100, seen = 104;
	CHECK_EQ_INT(ring_check_tail(104, seen, head, n), 0);
	CHECK_EQ_INT(ring_check_tail(116, seen, head, n), 0);         /* exactly full */
	CHECK_EQ_INT(ring_check_tail(117, seen, head, n), -EPROTO);   /* past the ring */
	CHECK_EQ_INT(ring_check_tail(103, seen, head, n), -EPROTO);   /* backwards */
	CHECK_EQ_INT(ring_check_tail(99, seen, head, n), -EPROTO);    /* behind head */
	CHECK_EQ_INT(ring_check_tail(0x80000000u, seen, head, n), -EPROTO);
	/* head of the peer: forward from seen, never past our tail */
	CHECK_EQ_INT(ring_check_head(10, 10, 20), 0);
	CHECK_EQ_INT(ring_check_head(20, 10, 20), 0);
	CHECK_EQ_INT(ring_check_head(21, 10, 20), -EPROTO);
	CHECK_EQ_INT(ring_check_head(9, 10, 20), -EPROTO);
	CHECK_EQ_INT(ring_check_head(3, UINT32_MAX - 2, 5), 0); /* across the wrap */
}

TEST(ipc_ring, data_area_alloc_wraps_and_keeps)
{
	struct ring_data d = {.head = 0, .tail = 0, .size = 256};
	CHECK_EQ_INT(ring_data_alloc(&d, 100, 8, 0), 0);   /* [0, 104) */
	CHECK_EQ_INT(ring_data_alloc(&d, 100, 8, 0), 104); /* [104, 208) */
	CHECK_EQ_INT(ring_data_alloc(&d, 100, 8, 0), -1);  /* 48 left */
	d.head = 104;                                       /* first record released */
	CHECK_EQ_INT(ring_data_alloc(&d, 60, 8, 0), 0);     /* skips 48 at the end, starts at 0 */
	CHECK_EQ_INT(d.tail - d.head, 48 + 104 + 64);
	CHECK_EQ_INT(ring_data_alloc(&d, 8, 8, 32), 64);    /* 40 free: 8 + 32 kept */
	CHECK_EQ_INT(ring_data_alloc(&d, 8, 8, 25), -1);    /* would leave < 25 free */
	CHECK_EQ_INT(ring_data_check(250, 6, 256), 0);
	CHECK_EQ_INT(ring_data_check(250, 7, 256), -EPROTO);
	CHECK_EQ_INT(ring_data_check(UINT32_MAX, 2, 256), -EPROTO); /* no 32-bit wrap */
	/* free-running positions across 2^32 */
	struct ring_data w = {.head = UINT32_MAX - 15, .tail = UINT32_MAX - 15, .size = 64};
	for (int i = 0; i < 1000; i++) {
		int64_t off = ring_data_alloc(&w, 24, 8, 0);
		REQUIRE(off >= 0 && off + 24 <= 64);
		w.head = w.tail; /* consumer keeps up */
	}
}

static struct dsv32_generate_params sample(void)
{
	static const uint32_t toks[] = {1, 2, 3};
	static const char *stops[] = {"\n\n", "END", "\xc3\xa9t\xc3\xa9"};
	static const uint32_t stop_toks[] = {7, 9};
	struct dsv32_generate_params p;
	dsv32_generate_params_init(&p, 42);
	p.input = DSV32_INPUT_TOKENS;
	p.tokens = toks;
	p.n_tokens = 3;
	p.temperature = 0.7f;
	p.top_p = 0.9f;
	p.top_k = 40;
	p.min_p = 0.05f;
	p.seed = 1234567890123ull;
	p.max_tokens = 77;
	p.stop = stops;
	p.n_stop = 3;
	p.stop_tokens = stop_toks;
	p.n_stop_tokens = 2;
	p.logprobs = 5;
	p.flags = DSV32_GEN_THINKING;
	return p;
}

static int roundtrip(const struct dsv32_generate_params *p, struct ipc_request **out, char *msg)
{
	size_t n = ipc_frame_generate_size(p);
	if (!n)
		return -1;
	uint64_t *buf = calloc(1, n + 8);
	ipc_frame_encode_generate(buf, p);
	int r = ipc_frame_decode_generate(buf, (uint32_t)n, p->request_id, 1 << 20, out, msg, 200);
	free(buf);
	return r;
}

TEST(ipc_frame, generate_roundtrip)
{
	struct dsv32_generate_params p = sample();
	struct ipc_request *r;
	char msg[200];
	REQUIRE(roundtrip(&p, &r, msg) == 0);
	CHECK_EQ_INT(r->id, 42);
	CHECK_EQ_INT(r->input, DSV32_INPUT_TOKENS);
	CHECK_EQ_INT(r->n_tokens, 3);
	CHECK(r->tokens[0] == 1 && r->tokens[2] == 3);
	CHECK(r->temperature == 0.7f && r->top_p == 0.9f && r->top_k == 40 && r->min_p == 0.05f);
	CHECK(r->seed == 1234567890123ull && r->max_tokens == 77 && r->logprobs == 5);
	CHECK(r->flags == DSV32_GEN_THINKING);
	CHECK_EQ_INT(r->n_stop, 3);
	CHECK_EQ_STR(r->stop[0], "\n\n");
	CHECK_EQ_STR(r->stop[2], "\xc3\xa9t\xc3\xa9");
	CHECK_EQ_INT(r->stop_len[2], 5);
	CHECK(r->n_stop_tokens == 2 && r->stop_tokens[1] == 9);
	ipc_request_free(r);
	/* text prompt, no stops */
	dsv32_generate_params_init(&p, 5);
	p.text = "h\xc3\xa9llo";
	p.text_len = 6;
	REQUIRE(roundtrip(&p, &r, msg) == 0);
	CHECK_EQ_STR(r->text, "h\xc3\xa9llo");
	CHECK(r->text_len == 6 && r->n_stop == 0 && r->tokens == NULL);
	ipc_request_free(r);
}

TEST(ipc_frame, typed_errors_for_bad_values)
{
	struct ipc_request *r;
	char msg[200];
	struct dsv32_generate_params p = sample();
	p.temperature = NAN;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	CHECK_CONTAINS(msg, "temperature");
	p = sample();
	p.top_p = 0;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	CHECK_CONTAINS(msg, "top_p");
	p = sample();
	p.frequency_penalty = INFINITY;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	p = sample();
	p.top_k = -1;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	p = sample();
	p.max_tokens = 0;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	p = sample();
	p.logprobs = DSV32_MAX_LOGPROBS + 1;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	p = sample();
	p.input = 9;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	p = sample();
	p.flags = 0x80;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	p = sample();
	p.input = DSV32_INPUT_TEXT;
	p.text = "ab\xff";
	p.text_len = 3;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_UTF8);
	p = sample();
	static const char *bad_stop[] = {"ok", "\xed\xa0\x80"}; /* a surrogate */
	p.stop = bad_stop;
	p.n_stop = 2;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_UTF8);
	CHECK_CONTAINS(msg, "stop string 1");
	p = sample();
	static const char *empty_stop[] = {""};
	p.stop = empty_stop;
	p.n_stop = 1;
	CHECK_EQ_INT(roundtrip(&p, &r, msg), DSV32_E_BAD_PARAM);
	/* prompt limit */
	p = sample();
	size_t n = ipc_frame_generate_size(&p);
	uint64_t *buf = calloc(1, n + 8);
	ipc_frame_encode_generate(buf, &p);
	CHECK_EQ_INT(ipc_frame_decode_generate(buf, (uint32_t)n, 1, 11, &r, msg, 200), DSV32_E_PROMPT_TOO_LONG);
	free(buf);
}

TEST(ipc_frame, malformed_records_are_bad_frames)
{
	struct dsv32_generate_params p = sample();
	size_t n = ipc_frame_generate_size(&p);
	uint64_t *buf = calloc(1, n + 64);
	struct ipc_gen_wire *w = (struct ipc_gen_wire *)buf;
	struct ipc_request *r;
	char msg[200];
	ipc_frame_encode_generate(buf, &p);
	CHECK_EQ_INT(ipc_frame_decode_generate(buf, (uint32_t)n - 4, 1, 1 << 20, &r, msg, 200), DSV32_E_BAD_FRAME);
	CHECK_EQ_INT(ipc_frame_decode_generate(buf, 10, 1, 1 << 20, &r, msg, 200), DSV32_E_BAD_FRAME);
	w->prompt_len = 0xffffffffu; /* a length that would wrap 32-bit math */
	CHECK_EQ_INT(ipc_frame_decode_generate(buf, (uint32_t)n, 1, 1 << 20, &r, msg, 200), DSV32_E_BAD_FRAME);
	ipc_frame_encode_generate(buf, &p);
	w->stop_bytes += 4;
	CHECK_EQ_INT(ipc_frame_decode_generate(buf, (uint32_t)n + 4, 1, 1 << 20, &r, msg, 200), DSV32_E_BAD_FRAME);
	ipc_frame_encode_generate(buf, &p);
	/* first stop string's length field points past the record */
	uint32_t big = 1000;
	memcpy((char *)buf + n - w->stop_bytes, &big, 4);
	CHECK_EQ_INT(ipc_frame_decode_generate(buf, (uint32_t)n, 1, 1 << 20, &r, msg, 200), DSV32_E_BAD_FRAME);
	ipc_frame_encode_generate(buf, &p);
	w->rsv = 1;
	CHECK_EQ_INT(ipc_frame_decode_generate(buf, (uint32_t)n, 1, 1 << 20, &r, msg, 200), DSV32_E_BAD_FRAME);
	free(buf);
}

TEST(ipc_frame, events_roundtrip)
{
	uint64_t buf[64];
	const uint32_t toks[] = {11, 22};
	const float lp[] = {-0.5f, -1.5f};
	const struct dsv32_top_logprob top[] = {{1, -1}, {2, -2}, {3, -3}, {4, -4}};
	uint32_t len = ipc_frame_token_size(2, 2, 1, 5);
	REQUIRE(len < sizeof buf - 1);
	ipc_frame_encode_token(buf, toks, 2, lp, top, 2, "hello", 5);
	struct ipc_cqe e = {.type = IPC_EV_TOKEN, .data_len = len, .seq = 3, .req_id = 9};
	struct dsv32_event ev;
	REQUIRE(ipc_frame_decode_event(&e, (char *)buf, len, &ev) == 0);
	CHECK(ev.type == DSV32_EVENT_TOKEN && ev.request_id == 9 && ev.token.seq == 3);
	CHECK(ev.token.n_tokens == 2 && ev.token.tokens[1] == 22 && ev.token.n_top == 2);
	CHECK(ev.token.logprobs[1] == -1.5f && ev.token.top[3].token == 4);
	CHECK_EQ_STR(ev.token.text, "hello");
	CHECK_EQ_INT(ipc_frame_decode_event(&e, (char *)buf, len - 1, &ev), -EPROTO);
	len = ipc_frame_error_size(3);
	ipc_frame_encode_error(buf, DSV32_E_BUSY, "abc", 3);
	e = (struct ipc_cqe){.type = IPC_EV_ERROR, .data_len = len, .req_id = 9};
	REQUIRE(ipc_frame_decode_event(&e, (char *)buf, len, &ev) == 0);
	CHECK(ev.error.code == DSV32_E_BUSY);
	CHECK_EQ_STR(ev.error.message, "abc");
	e.type = 77;
	CHECK_EQ_INT(ipc_frame_decode_event(&e, (char *)buf, len, &ev), -EPROTO);
}

TEST(ipc_frame, utf8_validator)
{
	CHECK(ipc_utf8_valid("", 0));
	CHECK(ipc_utf8_valid("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10));
	CHECK(!ipc_utf8_valid("\xc0\xaf", 2));         /* overlong */
	CHECK(!ipc_utf8_valid("\xe0\x80\xaf", 3));     /* overlong */
	CHECK(!ipc_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
	CHECK(!ipc_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
	CHECK(!ipc_utf8_valid("\xe2\x82", 2));         /* truncated */
	CHECK(!ipc_utf8_valid("\x80", 1));
	CHECK(!ipc_utf8_valid("\xf8\x88\x80\x80\x80", 5));
}
