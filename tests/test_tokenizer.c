/*
 * test_tokenizer.c — the BPE tokenizer against the JavaScript reference, the safe default mode,
 * invalid UTF-8, the streaming detokenizer, load-time refusals, the CLI.
 *
 * The real tokenizer.json is build/tokenizer/tokenizer.json (make tokenizer; env
 * DSV32_TOKENIZER overrides) and the reference is node + @lenml/tokenizers under
 * build/tokenizer/js (tools/fetch_tokenizer_js.sh); a test that needs either fails loudly when
 * it is missing. The corpus is tests/tokenizer/corpus.bin (node tests/tokenizer/gen_corpus.js).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/detok.h"
#include "model/fileio.h"
#include "model/tokenizer.h"
#include "model/unicode_tables.h"
#include "tests/test.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static const char *tok_path(char *buf, size_t n)
{
	const char *env = getenv("DSV32_TOKENIZER");
	if (env && *env)
		return env;
	snprintf(buf, n, "%s/build/tokenizer/tokenizer.json", test_root());
	return buf;
}

/* The real tokenizer, or a loud failure that says how to get it. */
static struct tokenizer *real_tok(void)
{
	char buf[1024];
	const char *p = tok_path(buf, sizeof buf);
	struct tokenizer *t;
	struct err e;
	if (tokenizer_load(&t, p, &e)) {
		test_fail(__FILE__, __LINE__,
			  "the real tokenizer is missing or unreadable (run `make tokenizer`): %s",
			  e.msg);
		test_abort_case();
	}
	return t;
}

struct corpus {
	char *buf;
	size_t len, n;
	const char **rec; /* (n) */
	size_t *rec_len;  /* (n) */
};

static void corpus_load(struct corpus *c)
{
	char path[1024];
	struct err e;
	snprintf(path, sizeof path, "%s/tests/tokenizer/corpus.bin", test_root());
	memset(c, 0, sizeof *c);
	c->buf = file_read(path, &c->len, 64u << 20, &e);
	if (!c->buf) {
		test_fail(__FILE__, __LINE__, "%s", e.msg);
		test_abort_case();
	}
	size_t cap = 0;
	for (size_t p = 0; p < c->len;) {
		char *end;
		unsigned long n = strtoul(c->buf + p, &end, 10);
		REQUIRE(*end == '\n' && (size_t)(end - c->buf) + 1 + n < c->len + 1);
		if (c->n == cap) {
			cap = cap ? cap * 2 : 1024;
			c->rec = realloc(c->rec, cap * sizeof *c->rec);
			c->rec_len = realloc(c->rec_len, cap * sizeof *c->rec_len);
			REQUIRE(c->rec && c->rec_len);
		}
		c->rec[c->n] = end + 1;
		c->rec_len[c->n++] = n;
		p = (size_t)(end - c->buf) + 1 + n + 1;
	}
}

static void corpus_free(struct corpus *c)
{
	free(c->buf);
	free(c->rec);
	free(c->rec_len);
}

static void ids_str(struct sbuf *b, const struct tokenizer_ids *ids)
{
	b->len = 0;
	for (size_t i = 0; i < ids->n; i++)
		sbuf_printf(b, i ? ",%d" : "%d", ids->v[i]);
	sbuf_cstr(b);
}

static char *encode_str(const struct tokenizer *t, const char *s, size_t n, unsigned flags)
{
	struct tokenizer_ids ids = {0};
	struct sbuf b = {0};
	CHECK(tokenizer_encode(t, s, n, flags, &ids) == 0);
	ids_str(&b, &ids);
	tokenizer_ids_free(&ids);
	return sbuf_cstr(&b) ? b.p : strdup("");
}

/* Runs a shell command; returns its exit status (or -1). */
static int run(const char *cmd)
{
	int st = system(cmd);
	return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

static void escape(struct sbuf *b, const char *s, size_t n)
{
	for (size_t i = 0; i < n && i < 160; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c < 0x7f && c != '\\')
			sbuf_putc(b, (char)c);
		else
			sbuf_printf(b, "\\x%02x", c);
	}
}

/* ---- the reference comparison ------------------------------------------------------------ */

TEST_T(tokenizer, matches_reference_on_corpus, 240)
{
	struct tokenizer *t = real_tok();
	struct corpus c;
	corpus_load(&c);
	CHECK(c.n >= 3000);
	char cmd[4096], out[512], tokp[1024];
	snprintf(out, sizeof out, "%s/ref.txt", test_tmpdir());
	snprintf(cmd, sizeof cmd,
		 "cd '%s' && node tests/tokenizer/ref_encode.mjs --tokenizer '%s' "
		 "--corpus tests/tokenizer/corpus.bin --out '%s'",
		 test_root(), tok_path(tokp, sizeof tokp), out);
	if (run(cmd) != 0) {
		test_fail(__FILE__, __LINE__,
			  "the JavaScript reference did not run (needs node and `make tokenizer`, "
			  "which installs it into build/tokenizer/js): %s",
			  cmd);
		test_abort_case();
	}
	struct err e;
	size_t rlen;
	char *ref = file_read(out, &rlen, 256u << 20, &e);
	REQUIRE(ref);
	/* First line: the Unicode version of node's regexes. Records with code points whose classes
	 * differ between that and the tables' version come back as "#skip": allowed only when the
	 * versions differ (a CI node of another version), and never for more than 5% of them. */
	char *line = ref, *nl = strchr(ref, '\n');
	REQUIRE(nl && !strncmp(ref, "#unicode ", 9));
	*nl = 0;
	char node_unicode[32];
	snprintf(node_unicode, sizeof node_unicode, "%s", ref + 9);
	line = nl + 1;
	size_t bad[2] = {0, 0}, reported = 0, skipped = 0;
	for (size_t i = 0; i < c.n; i++) {
		for (int mode = 0; mode < 2; mode++) {
			nl = strchr(line, '\n');
			REQUIRE(nl);
			*nl = 0;
			if (!strncmp(line, "#skip", 5)) {
				if (mode == 0 && skipped++ < 3)
					printf("tokenizer: record %zu skipped: node's Unicode %s classes %s "
					       "differently from the tables' %s\n", i, node_unicode,
					       line + 6, unicode_tables_version);
				line = nl + 1;
				continue;
			}
			char *got = encode_str(t, c.rec[i], c.rec_len[i],
					       mode == 0 ? TOKENIZER_SPECIAL : 0);
			if (strcmp(got, line)) {
				bad[mode]++;
				if (reported++ < 5) {
					struct sbuf b = {0};
					escape(&b, c.rec[i], c.rec_len[i]);
					test_fail(__FILE__, __LINE__,
						  "record %zu (%s mode) \"%s\"\n  C:   %.400s\n  ref: %.400s",
						  i, mode ? "plain" : "special", sbuf_cstr(&b), got, line);
					sbuf_free(&b);
				}
			}
			free(got);
			line = nl + 1;
		}
	}
	printf("tokenizer: %zu records (%zu skipped): %zu/%zu identical with added tokens "
	       "recognised, %zu/%zu in the plain-text mode (node Unicode %s, tables %s)\n",
	       c.n, skipped, c.n - skipped - bad[0], c.n - skipped, c.n - skipped - bad[1],
	       c.n - skipped, node_unicode, unicode_tables_version);
	if (skipped && !strcmp(node_unicode, unicode_tables_version))
		test_fail(__FILE__, __LINE__, "%zu records skipped although node and the tables "
			  "agree on the Unicode version: the tables are wrong", skipped);
	CHECK(skipped * 20 <= c.n);
	CHECK_EQ_INT(bad[0], 0);
	CHECK_EQ_INT(bad[1], 0);
	free(ref);
	corpus_free(&c);
	tokenizer_free(t);
}

TEST_T(tokenizer, corpus_is_generated, 60)
{
	char cmd[2048];
	snprintf(cmd, sizeof cmd,
		 "cd '%s' && node tests/tokenizer/gen_corpus.js --out '%s/c.bin' 2>/dev/null && "
		 "cmp -s tests/tokenizer/corpus.bin '%s/c.bin'",
		 test_root(), test_tmpdir(), test_tmpdir());
	if (run(cmd) != 0)
		test_fail(__FILE__, __LINE__,
			  "tests/tokenizer/corpus.bin is not what `node tests/tokenizer/gen_corpus.js` "
			  "writes (or node is missing): regenerate and commit it");
}

/* ---- properties on the corpus --------------------------------------------------------------- */

TEST_T(tokenizer, decode_inverts_encode, 120)
{
	struct tokenizer *t = real_tok();
	struct corpus c;
	corpus_load(&c);
	struct sbuf dec = {0}, fixed = {0};
	size_t valid = 0;
	for (size_t i = 0; i < c.n; i++) {
		fixed.len = 0;
		detok_repair(c.rec[i], c.rec_len[i], &fixed);
		int is_valid = detok_valid_prefix(c.rec[i], c.rec_len[i]) == c.rec_len[i];
		valid += is_valid;
		for (int mode = 0; mode < 2; mode++) {
			struct tokenizer_ids ids = {0};
			unsigned fl = mode ? TOKENIZER_SPECIAL : 0;
			CHECK(tokenizer_encode(t, c.rec[i], c.rec_len[i], fl, &ids) == 0);
			dec.len = 0;
			CHECK(tokenizer_decode(t, ids.v, ids.n, 0, &dec) == 0);
			/* Valid text comes back byte for byte; invalid text as its repair. */
			if (dec.len != fixed.len || memcmp(dec.p, fixed.p, dec.len))
				test_fail(__FILE__, __LINE__, "record %zu mode %d: decode(encode(s)) != s",
					  i, mode);
			if (!is_valid)
				CHECK(tokenizer_encode(t, c.rec[i], c.rec_len[i],
						       fl | TOKENIZER_STRICT_UTF8, &ids) == -EILSEQ);
			/* Uncached encoding is the same. */
			struct tokenizer_ids ids2 = {0};
			CHECK(tokenizer_encode(t, c.rec[i], c.rec_len[i], fl | TOKENIZER_NO_CACHE,
					       &ids2) == 0);
			CHECK(ids2.n == ids.n && !memcmp(ids2.v, ids.v, ids.n * sizeof *ids.v));
			tokenizer_ids_free(&ids);
			tokenizer_ids_free(&ids2);
		}
	}
	CHECK(valid > 2500);
	sbuf_free(&dec);
	sbuf_free(&fixed);
	corpus_free(&c);
	tokenizer_free(t);
}

/* ---- added tokens -------------------------------------------------------------------------- */

TEST(tokenizer, added_tokens_only_when_allowed)
{
	struct tokenizer *t = real_tok();
	CHECK_EQ_INT(tokenizer_token_id(t, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"), 0);
	CHECK_EQ_INT(tokenizer_token_id(t, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"), 1);
	const char *user = "<\xef\xbd\x9cUser\xef\xbd\x9c>";
	int32_t uid = tokenizer_token_id(t, user);
	CHECK_EQ_INT(uid, 128803);
	CHECK_EQ_INT(tokenizer_token_id(t, "<\xef\xbd\x9cUser\xef\xbd\x9c> "), -1);
	CHECK_EQ_INT(tokenizer_token_id(t, "<\xef\xbd\x9cUser"), -1);
	CHECK_EQ_INT(tokenizer_token_id(t, "hello"), -1); /* a vocab string, not an added token */
	CHECK_EQ_INT(tokenizer_token_id(t, ""), -1);
	CHECK(tokenizer_n_added(t) == 818);
	CHECK(tokenizer_is_special(t, 0) && !tokenizer_is_special(t, 128803) &&
	      !tokenizer_is_special(t, 1000));

	/* Default: every added token in the text is ordinary text. */
	for (size_t i = 0; i < tokenizer_n_added(t); i++) {
		int32_t id;
		const char *s = tokenizer_added(t, i, &id);
		char text[256];
		snprintf(text, sizeof text, "a%s b%s", s, s);
		struct tokenizer_ids plain = {0}, spec = {0};
		REQUIRE(tokenizer_encode(t, text, strlen(text), 0, &plain) == 0);
		REQUIRE(tokenizer_encode(t, text, strlen(text), TOKENIZER_SPECIAL, &spec) == 0);
		int n_added_plain = 0, n_id_spec = 0;
		for (size_t k = 0; k < plain.n; k++)
			n_added_plain += plain.v[k] >= 128000 || plain.v[k] < 3;
		for (size_t k = 0; k < spec.n; k++)
			n_id_spec += spec.v[k] == id;
		CHECK_EQ_INT(n_added_plain, 0);
		CHECK_EQ_INT(n_id_spec, 2);
		tokenizer_ids_free(&plain);
		tokenizer_ids_free(&spec);
	}
	/* A chat prompt: special mode gives the single ids. */
	char prompt[256];
	snprintf(prompt, sizeof prompt, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>%shi<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", user);
	char *s = encode_str(t, prompt, strlen(prompt), TOKENIZER_SPECIAL);
	CHECK_EQ_STR(s, "0,128803,6366,128804");
	free(s);
	tokenizer_free(t);
}

/* ---- invalid UTF-8 --------------------------------------------------------------------------- */

TEST(tokenizer, invalid_utf8_reads_as_replacement)
{
	struct tokenizer *t = real_tok();
	static const char *const cases[][2] = {
		{"a\xff" "b", "a\xef\xbf\xbd" "b"},
		{"\xe4\xb8" "A", "\xef\xbf\xbd" "A"},
		{"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
		{"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
		{"\xf0\x9f\x98", "\xef\xbf\xbd"},
		{"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
		{"x\x80\x80y", "x\xef\xbf\xbd\xef\xbf\xbdy"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char *a = encode_str(t, cases[i][0], strlen(cases[i][0]), 0);
		char *b = encode_str(t, cases[i][1], strlen(cases[i][1]), 0);
		CHECK_EQ_STR(a, b);
		free(a);
		free(b);
		struct tokenizer_ids ids = {0};
		ids.n = 0;
		CHECK(tokenizer_encode(t, cases[i][0], strlen(cases[i][0]), TOKENIZER_STRICT_UTF8,
				       &ids) == -EILSEQ);
		CHECK(ids.n == 0);
		tokenizer_ids_free(&ids);
	}
	/* Every byte value alone, and NUL inside text. */
	for (int b = 0; b < 256; b++) {
		char c = (char)b;
		struct tokenizer_ids ids = {0};
		CHECK(tokenizer_encode(t, &c, 1, 0, &ids) == 0);
		CHECK(ids.n == 1);
		tokenizer_ids_free(&ids);
	}
	char *s = encode_str(t, "a\0b", 3, 0);
	CHECK(strlen(s) > 0);
	free(s);
	tokenizer_free(t);
}

/* ---- decode ----------------------------------------------------------------------------- */

TEST(tokenizer, decode_rejects_unknown_ids)
{
	struct tokenizer *t = real_tok();
	struct sbuf b = {0};
	int32_t bad[] = {15, -1};
	CHECK(tokenizer_decode(t, bad, 2, 0, &b) == -EINVAL);
	CHECK(b.len == 0);
	int32_t bad2[] = {(int32_t)tokenizer_n_ids(t)};
	CHECK(tokenizer_decode(t, bad2, 1, 0, &b) == -EINVAL);
	int32_t ok[] = {0, 19923, 1};
	CHECK(tokenizer_decode(t, ok, 3, 0, &b) == 0);
	CHECK_EQ_STR(sbuf_cstr(&b), "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>Hello<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
	b.len = 0;
	CHECK(tokenizer_decode(t, ok, 3, TOKENIZER_SKIP_SPECIAL, &b) == 0);
	CHECK_EQ_STR(sbuf_cstr(&b), "Hello");
	sbuf_free(&b);
	tokenizer_free(t);
}

/* ---- streaming detokenizer --------------------------------------------------------------- */

static void stream_split_check(const char *s, size_t n, uint64_t *seed)
{
	struct sbuf want = {0}, got = {0};
	detok_repair(s, n, &want);
	/* Every cut position, and random multi-cut streams. */
	for (size_t cut = 0; cut <= n; cut++) {
		struct detok d;
		detok_init(&d, NULL, 0);
		got.len = 0;
		detok_push_bytes(&d, s, cut, &got);
		size_t mid = got.len;
		CHECK(detok_valid_prefix(got.p, got.len) == got.len);
		CHECK(detok_pending(&d) <= 3);
		detok_push_bytes(&d, s + cut, n - cut, &got);
		detok_flush(&d, &got);
		CHECK(got.len == want.len && !memcmp(got.p, want.p, got.len));
		CHECK(mid <= got.len);
	}
	for (int r = 0; r < 20; r++) {
		struct detok d;
		detok_init(&d, NULL, 0);
		got.len = 0;
		for (size_t i = 0; i < n;) {
			size_t k = 1 + test_rand(seed) % 4;
			k = k > n - i ? n - i : k;
			detok_push_bytes(&d, s + i, k, &got);
			CHECK(detok_valid_prefix(got.p, got.len) == got.len);
			i += k;
		}
		detok_flush(&d, &got);
		CHECK(got.len == want.len && !memcmp(got.p, want.p, got.len));
	}
	sbuf_free(&want);
	sbuf_free(&got);
}

TEST(tokenizer, detok_streams_whole_characters)
{
	uint64_t seed = 7;
	const char *valid = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80z\xe2\x80\x8d\xf0\x9f\x91\xa9";
	stream_split_check(valid, strlen(valid), &seed);
	const char *invalid[] = {"\xe4\xb8" "A", "\xf0\x9f\x98", "\x80\xbf", "\xc0\xaf\xed\xa0\x80",
				 "ab\xf4\x90\x80\x80" "cd", "\xc3\xc3\xa9", "\xe0\x80\xaf",
				 "\xf0\x9f\x98\xf0\x9f\x98\x80", "\xff\xfe\xfd"};
	for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++)
		stream_split_check(invalid[i], strlen(invalid[i]), &seed);
	/* Random bytes. */
	for (int r = 0; r < 200; r++) {
		char buf[24];
		size_t n = 1 + test_rand(&seed) % sizeof buf;
		for (size_t i = 0; i < n; i++)
			buf[i] = (char)(test_rand(&seed) & 0xff);
		stream_split_check(buf, n, &seed);
	}
	/* The documented rule, step by step. */
	struct detok d;
	struct sbuf o = {0};
	detok_init(&d, NULL, 0);
	detok_push_bytes(&d, "\xe4", 1, &o);
	CHECK(o.len == 0 && detok_pending(&d) == 1);
	detok_push_bytes(&d, "\xb8", 1, &o);
	CHECK(o.len == 0 && detok_pending(&d) == 2);
	detok_push_bytes(&d, "\xad", 1, &o);
	CHECK(o.len == 3 && !memcmp(o.p, "\xe4\xb8\xad", 3) && detok_pending(&d) == 0);
	o.len = 0;
	detok_push_bytes(&d, "\xe4\xb8", 2, &o);
	detok_push_bytes(&d, "x", 1, &o); /* cannot complete: U+FFFD, then x afresh */
	CHECK(o.len == 4 && !memcmp(o.p, "\xef\xbf\xbdx", 4));
	o.len = 0;
	detok_push_bytes(&d, "\xe0\x80", 2, &o); /* E0 80 is invalid at once: two U+FFFD */
	CHECK(o.len == 6 && detok_pending(&d) == 0);
	o.len = 0;
	detok_push_bytes(&d, "\xf0\x9f", 2, &o);
	detok_flush(&d, &o); /* end of stream: the held prefix is one U+FFFD */
	CHECK(o.len == 3 && !memcmp(o.p, "\xef\xbf\xbd", 3));
	sbuf_free(&o);
}

TEST(tokenizer, detok_tokens_match_decode)
{
	struct tokenizer *t = real_tok();
	const char *text = "\xe4\xbd\xa0\xe5\xa5\xbd\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 "
			   "caf\xc3\xa9 <\xef\xbd\x9cUser\xef\xbd\x9c> \xe3\x82\xab\xe3\x82\xbf";
	struct tokenizer_ids ids = {0};
	REQUIRE(tokenizer_encode(t, text, strlen(text), TOKENIZER_SPECIAL, &ids) == 0);
	struct detok d;
	struct sbuf o = {0};
	detok_init(&d, t, 0);
	for (size_t i = 0; i < ids.n; i++) {
		CHECK(detok_push(&d, ids.v[i], &o) == 0);
		CHECK(detok_valid_prefix(o.p, o.len) == o.len);
	}
	CHECK(detok_push(&d, -5, &o) == -EINVAL);
	detok_flush(&d, &o);
	CHECK(o.len == strlen(text) && !memcmp(o.p, text, o.len));
	/* Single-byte tokens of a 4-byte emoji: nothing comes out until the last one. */
	const unsigned char emoji[4] = {0xf0, 0x9f, 0x98, 0x80};
	detok_init(&d, t, 0);
	o.len = 0;
	for (int i = 0; i < 4; i++) {
		int32_t id = -1;
		for (int32_t k = 0; k < 1000 && id < 0; k++) {
			const char *p;
			size_t n;
			if (!tokenizer_token_bytes(t, k, &p, &n) && n == 1 && (unsigned char)*p == emoji[i])
				id = k;
		}
		REQUIRE(id >= 0);
		CHECK(detok_push(&d, id, &o) == 0);
		CHECK(o.len == (i == 3 ? 4u : 0u));
	}
	CHECK(!memcmp(o.p, emoji, 4));
	sbuf_free(&o);
	tokenizer_ids_free(&ids);
	tokenizer_free(t);
}

/* ---- load-time checks, on a small synthetic tokenizer.json ------------------------------- */

static void bytelevel_char(struct sbuf *b, int byte)
{
	static int map[256];
	static int built;
	if (!built) {
		int n = 0;
		for (int c = 0; c < 256; c++) {
			int pr = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
			map[c] = pr ? c : 256 + n++;
		}
		built = 1;
	}
	char u[4];
	sbuf_put(b, u, (size_t)utf8_encode((uint32_t)map[byte], u));
}

/* A tokenizer.json with the 256 byte tokens (id = byte), merges "h e" -> 256, "he l" -> 257,
 * "hel l" -> 258, "l o" -> 259, and the given added tokens; parts replaced by overrides. */
static char *mini_json(const char *pretok, const char *decoder, const char *model_extra,
		       const char *merges, const char *added)
{
	struct sbuf b = {0};
	sbuf_puts(&b, "{\"version\":\"1.0\",\"normalizer\":null,\"pre_tokenizer\":");
	sbuf_puts(&b, pretok ? pretok :
		  "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
		  "{\"Regex\":\"\\\\p{N}{1,3}\"},\"behavior\":\"Isolated\",\"invert\":false},"
		  "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}");
	sbuf_puts(&b, ",\"decoder\":");
	sbuf_puts(&b, decoder ? decoder : "{\"type\":\"ByteLevel\"}");
	sbuf_puts(&b, ",\"added_tokens\":[");
	sbuf_puts(&b, added ? added : "");
	sbuf_puts(&b, "],\"model\":{\"type\":\"BPE\"");
	sbuf_puts(&b, model_extra ? model_extra : "");
	sbuf_puts(&b, ",\"vocab\":{");
	for (int c = 0; c < 256; c++) {
		struct sbuf k = {0};
		bytelevel_char(&k, c);
		sbuf_putc(&b, c ? ',' : ' ');
		json_write_str(&b, k.p, k.len, 0);
		sbuf_printf(&b, ":%d", c);
		sbuf_free(&k);
	}
	sbuf_puts(&b, ",\"he\":256,\"hel\":257,\"hell\":258,\"lo\":259},\"merges\":");
	sbuf_puts(&b, merges ? merges : "[\"h e\",[\"he\",\"l\"],\"hel l\",\"l o\"]");
	sbuf_puts(&b, "}}");
	return sbuf_cstr(&b);
}

static int mini_load(struct tokenizer **t, char *json, struct err *e)
{
	int r = tokenizer_parse(t, json, strlen(json), "mini.json", e);
	free(json);
	return r;
}

TEST(tokenizer, mini_tokenizer_and_strip_flags)
{
	struct tokenizer *t;
	struct err e;
	const char *added =
		"{\"id\":300,\"content\":\"[L]\",\"lstrip\":true,\"special\":true},"
		"{\"id\":301,\"content\":\"[R]\",\"rstrip\":true,\"special\":false},"
		"{\"id\":302,\"content\":\"[W]\",\"single_word\":true,\"special\":true},"
		"{\"id\":303,\"content\":\"[W]x\",\"special\":true}";
	int r = mini_load(&t, mini_json(NULL, NULL, NULL, NULL, added), &e);
	if (r)
		test_fail(__FILE__, __LINE__, "%s", e.msg);
	REQUIRE(r == 0);
	char *s = encode_str(t, "hello", 5, 0);
	CHECK_EQ_STR(s, "258,111"); /* h e -> he, he l -> hel, hel l -> hell; o */
	free(s);
	s = encode_str(t, "a  [L]  b", 9, TOKENIZER_SPECIAL);
	CHECK_EQ_STR(s, "97,300,32,32,98"); /* lstrip eats the spaces on the left only */
	free(s);
	s = encode_str(t, "a  [R] \t b", 10, TOKENIZER_SPECIAL);
	CHECK_EQ_STR(s, "97,32,32,301,98");
	free(s);
	s = encode_str(t, "a [W] b", 7, TOKENIZER_SPECIAL);
	CHECK_EQ_STR(s, "97,32,302,32,98");
	free(s);
	s = encode_str(t, "a[W] b", 6, TOKENIZER_SPECIAL); /* next to a letter: not a match */
	CHECK_EQ_STR(s, "97,91,87,93,32,98");
	free(s);
	s = encode_str(t, "[W]x", 4, TOKENIZER_SPECIAL); /* longest match wins */
	CHECK_EQ_STR(s, "303");
	free(s);
	s = encode_str(t, "a  [L]  b", 9, 0);
	CHECK_EQ_STR(s, "97,32,32,91,76,93,32,32,98");
	free(s);
	s = encode_str(t, "1234567", 7, 0);
	CHECK_EQ_STR(s, "49,50,51,52,53,54,55");
	free(s);
	CHECK_EQ_INT(tokenizer_token_id(t, "[R]"), 301);
	tokenizer_free(t);
}

TEST(tokenizer, refuses_what_it_does_not_implement)
{
	struct {
		char *json;
		const char *needle;
	} bad[] = {
		{mini_json("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}",
			   NULL, NULL, NULL, NULL), "add_prefix_space"},
		{mini_json("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
			   "{\"Regex\":\"\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
			   "{\"type\":\"ByteLevel\",\"use_regex\":false}]}", NULL, NULL, NULL, NULL),
		 "Split.pattern.Regex"},
		{mini_json("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
			   "{\"Regex\":\"\\\\p{N}{1,3}\"},\"behavior\":\"Removed\",\"invert\":false},"
			   "{\"type\":\"ByteLevel\",\"use_regex\":false}]}", NULL, NULL, NULL, NULL),
		 "Split.behavior"},
		{mini_json("{\"type\":\"Metaspace\"}", NULL, NULL, NULL, NULL), "Metaspace"},
		{mini_json(NULL, "{\"type\":\"WordPiece\"}", NULL, NULL, NULL), "decoder"},
		{mini_json(NULL, NULL, ",\"byte_fallback\":true", NULL, NULL), "model.byte_fallback"},
		{mini_json(NULL, NULL, ",\"dropout\":0.1", NULL, NULL), "model.dropout"},
		{mini_json(NULL, NULL, NULL, "[\"h q\"]", NULL), "merges[0]"},
		{mini_json(NULL, NULL, NULL, "[\"hq\"]", NULL), "merges[0]"},
		{mini_json(NULL, NULL, NULL, NULL, "{\"id\":300}"), "added_tokens"},
		{mini_json(NULL, NULL, NULL, NULL, "{\"id\":65,\"content\":\"<s>\"}"),
		 "id 65 is the vocab entry of other bytes"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct tokenizer *t = (void *)1;
		struct err e = {{0}};
		CHECK(mini_load(&t, bad[i].json, &e) < 0);
		CHECK(t == NULL);
		CHECK_CONTAINS(e.msg, bad[i].needle);
	}
	/* A normalizer that is not empty, and a model that is not BPE. */
	char *j = mini_json(NULL, NULL, NULL, NULL, NULL);
	char *p = strstr(j, "\"normalizer\":null");
	REQUIRE(p);
	struct sbuf b = {0};
	sbuf_put(&b, j, (size_t)(p - j));
	sbuf_puts(&b, "\"normalizer\":{\"type\":\"NFKC\"}");
	sbuf_puts(&b, p + strlen("\"normalizer\":null"));
	free(j);
	struct tokenizer *t;
	struct err e;
	CHECK(mini_load(&t, sbuf_cstr(&b), &e) == -ENOTSUP);
	CHECK_CONTAINS(e.msg, "normalizer");
	CHECK(tokenizer_load(&t, "/nonexistent/dir", &e) < 0);
	CHECK_CONTAINS(e.msg, "/nonexistent/dir/tokenizer.json");
}

/* ---- threads ------------------------------------------------------------------------------- */

struct thr {
	const struct tokenizer *t;
	const struct corpus *c;
	int ok;
};

static void *thr_main(void *p)
{
	struct thr *a = p;
	a->ok = 1;
	for (size_t i = 0; i < a->c->n; i += 7) {
		struct tokenizer_ids x = {0}, y = {0};
		tokenizer_encode(a->t, a->c->rec[i], a->c->rec_len[i], TOKENIZER_SPECIAL, &x);
		tokenizer_encode(a->t, a->c->rec[i], a->c->rec_len[i],
				 TOKENIZER_SPECIAL | TOKENIZER_NO_CACHE, &y);
		if (x.n != y.n || memcmp(x.v, y.v, x.n * sizeof *x.v))
			a->ok = 0;
		tokenizer_ids_free(&x);
		tokenizer_ids_free(&y);
	}
	return NULL;
}

TEST_T(tokenizer, concurrent_encoders_agree, 120)
{
	struct tokenizer *t = real_tok();
	struct corpus c;
	corpus_load(&c);
	pthread_t th[4];
	struct thr a[4];
	for (int i = 0; i < 4; i++) {
		a[i] = (struct thr){t, &c, 0};
		REQUIRE(pthread_create(&th[i], NULL, thr_main, &a[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CHECK(a[i].ok);
	}
	corpus_free(&c);
	tokenizer_free(t);
}

/* ---- the CLI ------------------------------------------------------------------------------ */

TEST(tokenizer, cli_tokenize_detokenize)
{
	char tokp[1024], cmd[4096], out[512];
	const char *bin = test_bin_dir();
	snprintf(out, sizeof out, "%s/out.txt", test_tmpdir());
	snprintf(cmd, sizeof cmd,
		 "cd '%s' && printf 'Hello, world! <\xef\xbd\x9cUser\xef\xbd\x9c>' | %s/dsv32 tokenize "
		 "--tokenizer '%s' --special > '%s' && %s/dsv32 detokenize --tokenizer '%s' < '%s' "
		 ">> '%s'",
		 test_root(), bin, tok_path(tokp, sizeof tokp), out, bin, tokp, out, out);
	REQUIRE(run(cmd) == 0);
	struct err e;
	char *s = file_read(out, NULL, 1 << 20, &e);
	REQUIRE(s);
	CHECK_EQ_STR(s, "19923,14,2058,3,223,128803\nHello, world! <\xef\xbd\x9cUser\xef\xbd\x9c>");
	free(s);
	snprintf(cmd, sizeof cmd, "cd '%s' && echo 1,x | %s/dsv32 detokenize --tokenizer '%s' "
		 "2>/dev/null >/dev/null", test_root(), bin, tokp);
	CHECK(run(cmd) == 1);
}

/* ---- long words (the heap BPE) ------------------------------------------------------------- */

TEST_T(tokenizer, long_words_round_trip, 60)
{
	/* Power-of-two lengths fill the heap scratch exactly: every merge may push two entries,
	 * so the heap must hold more than n (a regression under ASan). */
	struct tokenizer *t = real_tok();
	const char *units[] = {" ", "a", "ab", "\xe4\xb8\xad", "\n", "1", "!"};
	struct sbuf text = {0}, dec = {0};
	for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
		for (size_t n = 64; n <= 8192; n *= 4) {
			text.len = 0;
			while (text.len < n)
				sbuf_puts(&text, units[u]);
			struct tokenizer_ids ids = {0}, cold = {0};
			REQUIRE(tokenizer_encode(t, text.p, text.len, 0, &ids) == 0);
			REQUIRE(tokenizer_encode(t, text.p, text.len, TOKENIZER_NO_CACHE, &cold) == 0);
			CHECK(ids.n == cold.n && !memcmp(ids.v, cold.v, ids.n * sizeof *ids.v));
			dec.len = 0;
			REQUIRE(tokenizer_decode(t, ids.v, ids.n, 0, &dec) == 0);
			CHECK(dec.len == text.len && !memcmp(dec.p, text.p, dec.len));
			tokenizer_ids_free(&ids);
			tokenizer_ids_free(&cold);
		}
	}
	sbuf_free(&text);
	sbuf_free(&dec);
	tokenizer_free(t);
}

/* ---- the generated tables ---------------------------------------------------------------- */

TEST_T(tokenizer, unicode_tables_match_node, 60)
{
	/* Regenerate with this node; when its Unicode version is the tables', every range must be
	 * the same (line 3, which names the node and ICU builds, may differ). */
	char cmd[2048];
	snprintf(cmd, sizeof cmd,
		 "cd '%s' && v=$(node -p process.versions.unicode) || exit 2; "
		 "[ \"$v\" = '%s' ] || { echo \"tokenizer: node's Unicode $v is not the tables' %s: "
		 "range check skipped\"; exit 0; }; "
		 "node tools/gen_unicode.js | sed 3d > '%s/u.c' && sed 3d model/unicode_tables.c | "
		 "cmp -s - '%s/u.c'",
		 test_root(), unicode_tables_version, unicode_tables_version, test_tmpdir(),
		 test_tmpdir());
	int r = run(cmd);
	if (r == 2)
		test_fail(__FILE__, __LINE__, "node is missing: the tables cannot be checked");
	else if (r != 0)
		test_fail(__FILE__, __LINE__, "model/unicode_tables.c differs from what "
			  "`node tools/gen_unicode.js` writes with the same Unicode version");
}
