/*
 * fuzz_chat.c — libFuzzer target for model/chat.h: arbitrary bytes as messages JSON for the
 * encoder and as model output for the parser, whole and streamed in pieces.
 *
 * Input: byte 0 picks the options (bit 0 thinking mode, bit 1 drop_thinking off, bit 2 no BOS,
 * bits 3-4 context 0..3, bits 5-7 seed of the stream's chunk sizes); the rest is the text.
 * Beyond "no crash, no sanitizer report" it checks that segments tile the prompt, that errors
 * leave nothing allocated and carry a message, and that streamed deltas add up to the parse.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat.h"
#include "tests/fuzz/fuzz.h"

static void fuzz_encode(const char *s, size_t n, uint8_t flags)
{
	struct chat_opts o = chat_opts_default((flags & 1) ? CHAT_MODE_THINKING : CHAT_MODE_CHAT);
	o.drop_thinking = !(flags & 2);
	o.add_bos = !(flags & 4);
	o.context = (flags >> 3) & 3;
	struct chat_prompt p;
	struct err e = {{0}};
	int r = chat_encode_json(&p, s, n, &o, &e);
	if (r) {
		FUZZ_CHECK(r == -EINVAL || r == -ENOMEM);
		FUZZ_CHECK(p.text == NULL && p.seg == NULL);
		FUZZ_CHECK(r == -ENOMEM || e.msg[0]);
		return;
	}
	size_t off = 0;
	for (size_t k = 0; k < p.n_seg; k++) {
		FUZZ_CHECK(p.seg[k].off == off && p.seg[k].len > 0);
		FUZZ_CHECK(!k || p.seg[k].allow_special != p.seg[k - 1].allow_special);
		off += p.seg[k].len;
	}
	FUZZ_CHECK(off == p.len && p.text[p.len] == 0);
	chat_prompt_free(&p);
}

static void fuzz_parse(const char *s, size_t n, enum chat_mode mode, uint64_t seed)
{
	struct chat_reply whole;
	struct err e = {{0}};
	int r = chat_parse(&whole, s, n, mode, &e);
	FUZZ_CHECK(r == 0 || r == -EINVAL || r == -ENOMEM);
	if (r == 0) {
		FUZZ_CHECK(whole.reasoning[whole.reasoning_len] == 0);
		FUZZ_CHECK(whole.content[whole.content_len] == 0);
		for (size_t k = 0; k < whole.n_calls; k++)
			FUZZ_CHECK(whole.calls[k].arguments[0] == '{');
	} else {
		FUZZ_CHECK(whole.content == NULL && whole.calls == NULL);
	}

	struct chat_stream st;
	struct sbuf rs = {0}, cs = {0};
	chat_stream_init(&st, mode);
	for (size_t i = 0; i < n;) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		size_t k = 1 + (size_t)(seed >> 33) % 17;
		if (k > n - i)
			k = n - i;
		FUZZ_CHECK(chat_stream_feed(&st, s + i, k, &rs, &cs) == 0);
		i += k;
	}
	struct chat_reply sr;
	int r2 = chat_stream_finish(&st, &rs, &cs, &sr, &e);
	FUZZ_CHECK(r != 0 || r2 == 0);
	if (r2 == 0) {
		FUZZ_CHECK(rs.len == sr.reasoning_len && !memcmp(rs.p ? rs.p : "", sr.reasoning, rs.len));
		FUZZ_CHECK(cs.len == sr.content_len && !memcmp(cs.p ? cs.p : "", sr.content, cs.len));
		/* the stream differs from the whole parse only for text cut off inside the reasoning */
		if (r == 0)
			FUZZ_CHECK(sr.n_calls == whole.n_calls && sr.content_len == whole.content_len);
		chat_reply_free(&sr);
	} else if (st.phase != CHAT_STREAM_REASONING) {
		FUZZ_CHECK(r != 0);
	}
	if (r == 0)
		chat_reply_free(&whole);
	chat_stream_free(&st);
	sbuf_free(&rs);
	sbuf_free(&cs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t flags = data[0];
	const char *s = (const char *)data + 1;
	size_t n = size - 1;
	fuzz_encode(s, n, flags);
	fuzz_parse(s, n, CHAT_MODE_CHAT, flags >> 5);
	fuzz_parse(s, n, CHAT_MODE_THINKING, flags >> 5);
	return 0;
}
