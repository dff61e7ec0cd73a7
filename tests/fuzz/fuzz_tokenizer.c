/*
 * fuzz_tokenizer.c — libFuzzer target for model/tokenizer.h and model/detok.h: arbitrary bytes
 * encoded in both modes (and strictly), decoded back, the same bytes read as an id array for
 * decode and the streaming detokenizer, and streamed through the detokenizer in random splits.
 *
 * Needs the real tokenizer.json: $DSV32_TOKENIZER, else build/tokenizer/tokenizer.json relative
 * to the working directory (tools/run_tests.sh runs fuzzers from the repository root); aborts
 * loudly if it is missing. Input: byte 0 seeds the stream's split sizes; the rest is the text.
 * An input that starts with '{' is instead a whole tokenizer.json for tokenizer_parse (the
 * loader is a parser of untrusted files too); if it loads, it must encode and decode.
 * Also tokenizer_encode_spans (added tokens allowed only inside given spans).
 * Checks beyond "no crash": decode(encode(s)) == s for valid UTF-8 (its repair otherwise), strict
 * mode fails exactly on invalid UTF-8, uncached == cached, and streamed output is valid UTF-8
 * equal to the one-shot repair.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/detok.h"
#include "model/tokenizer.h"
#include "tests/fuzz/fuzz.h"

static struct tokenizer *tok;

/* memcmp that allows empty (NULL) buffers */
static int same(const void *a, size_t na, const void *b, size_t nb)
{
	return na == nb && (na == 0 || !memcmp(a, b, na));
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *p = getenv("DSV32_TOKENIZER");
	if (!p || !*p)
		p = "build/tokenizer/tokenizer.json";
	struct err e;
	if (tokenizer_load(&tok, p, &e)) {
		fprintf(stderr, "fuzz_tokenizer: cannot load the tokenizer (run `make tokenizer`, set "
				"DSV32_TOKENIZER or run from the repository root): %s\n", e.msg);
		abort();
	}
	return 0;
}

static void check_encode(const char *s, size_t n, const struct sbuf *fixed, int valid)
{
	for (int mode = 0; mode < 2; mode++) {
		unsigned fl = mode ? TOKENIZER_SPECIAL : 0;
		struct tokenizer_ids ids = {0}, cold = {0};
		FUZZ_CHECK(tokenizer_encode(tok, s, n, fl, &ids) == 0);
		FUZZ_CHECK(tokenizer_encode(tok, s, n, fl | TOKENIZER_NO_CACHE, &cold) == 0);
		FUZZ_CHECK(same(ids.v, ids.n * sizeof *ids.v, cold.v, cold.n * sizeof *cold.v));
		struct sbuf out = {0};
		FUZZ_CHECK(tokenizer_decode(tok, ids.v, ids.n, 0, &out) == 0);
		FUZZ_CHECK(same(out.p, out.len, fixed->p, fixed->len));
		cold.n = 0;
		int r = tokenizer_encode(tok, s, n, fl | TOKENIZER_STRICT_UTF8, &cold);
		FUZZ_CHECK(valid ? r == 0 && cold.n == ids.n : r == -EILSEQ && cold.n == 0);
		sbuf_free(&out);
		tokenizer_ids_free(&ids);
		tokenizer_ids_free(&cold);
	}
}

/* tokenizer_encode_spans: the whole text allowed = special mode, nothing allowed = plain mode,
 * and any spans keep every byte (valid UTF-8 only: spans refuse invalid text). */
static void check_spans(const char *s, size_t n, uint8_t seed, int valid)
{
	struct tokenizer_span whole = {0, n}, sp[8];
	struct tokenizer_ids a = {0}, b = {0};
	if (!valid) {
		FUZZ_CHECK(tokenizer_encode_spans(tok, s, n, &whole, 1, 0, &a) == -EILSEQ);
		return;
	}
	FUZZ_CHECK(tokenizer_encode_spans(tok, s, n, &whole, 1, 0, &a) == 0);
	FUZZ_CHECK(tokenizer_encode(tok, s, n, TOKENIZER_SPECIAL, &b) == 0);
	FUZZ_CHECK(same(a.v, a.n * sizeof *a.v, b.v, b.n * sizeof *b.v));
	a.n = b.n = 0;
	FUZZ_CHECK(tokenizer_encode_spans(tok, s, n, sp, 0, 0, &a) == 0);
	FUZZ_CHECK(tokenizer_encode(tok, s, n, 0, &b) == 0);
	FUZZ_CHECK(same(a.v, a.n * sizeof *a.v, b.v, b.n * sizeof *b.v));
	/* Up to 8 sorted, disjoint spans from a PRNG seeded by the input. */
	size_t k = 0, off = 0;
	uint32_t x = seed * 747796405u + 2891336453u;
	while (k < 8 && off < n) {
		x = x * 1103515245u + 12345u;
		size_t gap = (x >> 16) % 8, len = 1 + (x >> 8) % 32;
		if (off + gap >= n)
			break;
		sp[k].off = off + gap;
		sp[k].len = sp[k].off + len > n ? n - sp[k].off : len;
		off = sp[k].off + sp[k].len;
		k++;
	}
	a.n = 0;
	FUZZ_CHECK(tokenizer_encode_spans(tok, s, n, sp, k, 0, &a) == 0);
	struct sbuf out = {0};
	FUZZ_CHECK(tokenizer_decode(tok, a.v, a.n, 0, &out) == 0);
	FUZZ_CHECK(same(out.p, out.len, s, n));
	sbuf_free(&out);
	tokenizer_ids_free(&a);
	tokenizer_ids_free(&b);
}

static void check_ids(const uint8_t *d, size_t n)
{
	size_t k = n / 4;
	int32_t *ids = malloc((k ? k : 1) * sizeof *ids);
	FUZZ_CHECK(ids);
	int known = 1;
	for (size_t i = 0; i < k; i++) {
		uint32_t v;
		memcpy(&v, d + 4 * i, 4);
		/* Mostly ids in range, sometimes anything. */
		ids[i] = (v >> 31) ? (int32_t)v : (int32_t)(v % (tokenizer_n_ids(tok) + 2));
		const char *p;
		size_t l;
		known &= tokenizer_token_bytes(tok, ids[i], &p, &l) == 0;
	}
	struct sbuf out = {0}, st = {0}, fixed = {0};
	int r = tokenizer_decode(tok, ids, k, 0, &out);
	FUZZ_CHECK(known ? r == 0 : r == -EINVAL && out.len == 0);
	struct detok dt;
	detok_init(&dt, tok, 0);
	for (size_t i = 0; i < k; i++) {
		int rr = detok_push(&dt, ids[i], &st);
		FUZZ_CHECK(rr == 0 || rr == -EINVAL);
		FUZZ_CHECK(detok_valid_prefix(st.p, st.len) == st.len);
	}
	detok_flush(&dt, &st);
	if (known) {
		detok_repair(out.p, out.len, &fixed);
		FUZZ_CHECK(same(st.p, st.len, fixed.p, fixed.len));
	}
	free(ids);
	sbuf_free(&out);
	sbuf_free(&st);
	sbuf_free(&fixed);
}

static void check_stream(const char *s, size_t n, uint8_t seed, const struct sbuf *fixed)
{
	struct detok dt;
	struct sbuf st = {0};
	detok_init(&dt, NULL, 0);
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n;) {
		x = x * 1103515245u + 12345u;
		size_t k = 1 + (x >> 16) % 5;
		k = k > n - i ? n - i : k;
		detok_push_bytes(&dt, s + i, k, &st);
		FUZZ_CHECK(detok_pending(&dt) <= 3);
		i += k;
	}
	detok_flush(&dt, &st);
	FUZZ_CHECK(same(st.p, st.len, fixed->p, fixed->len));
	FUZZ_CHECK(detok_valid_prefix(st.p, st.len) == st.len);
	sbuf_free(&st);
}

static void check_load(const uint8_t *data, size_t size)
{
	struct tokenizer *t;
	struct err e = {{0}};
	int r = tokenizer_parse(&t, (const char *)data, size, "fuzz.json", &e);
	if (r) {
		FUZZ_CHECK(t == NULL && r < 0 && e.msg[0]);
		return;
	}
	static const char text[] = "Hello 123 \xe4\xbd\xa0\xe5\xa5\xbd <s> \xf0\x9f\x98\x80!!\n\n";
	for (int mode = 0; mode < 2; mode++) {
		struct tokenizer_ids ids = {0};
		FUZZ_CHECK(tokenizer_encode(t, text, sizeof text - 1, mode ? TOKENIZER_SPECIAL : 0,
					    &ids) == 0);
		struct sbuf out = {0};
		FUZZ_CHECK(tokenizer_decode(t, ids.v, ids.n, 0, &out) == 0);
		/* Plain mode must round-trip; with added tokens an id may stand for other bytes
		 * when a file maps one id to two contents, so only no-crash is asked there. */
		FUZZ_CHECK(mode || same(out.p, out.len, text, sizeof text - 1));
		sbuf_free(&out);
		tokenizer_ids_free(&ids);
	}
	tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 1 << 16)
		return 0;
	if (data[0] == '{') {
		check_load(data, size);
		return 0;
	}
	const char *s = (const char *)data + 1;
	size_t n = size - 1;
	struct sbuf fixed = {0};
	detok_repair(s, n, &fixed);
	int valid = detok_valid_prefix(s, n) == n;
	FUZZ_CHECK(!valid || same(fixed.p, fixed.len, s, n));
	check_encode(s, n, &fixed, valid);
	check_spans(s, n, data[0], valid);
	check_ids(data, size);
	check_stream(s, n, data[0], &fixed);
	sbuf_free(&fixed);
	return 0;
}
