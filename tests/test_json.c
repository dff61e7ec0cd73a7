/* test_json.c — the JSON reader and the Python-compatible writer. */
#include <errno.h>
#include <stdlib.h>

#include "model/json.h"
#include "tests/test.h"

static int parse(struct json_doc *d, const char *s) { return json_parse(d, s, strlen(s)); }

TEST(json, scalars_and_nesting)
{
	struct json_doc d;
	REQUIRE(parse(&d, " {\"a\": [1, -2.5e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\"], \"b\": {}} ") == 0);
	const struct json *a = json_get(d.root, "a");
	REQUIRE(a && a->type == JSON_ARRAY && a->n == 6);
	int64_t i;
	CHECK(json_int64(json_at(a, 0), &i) == 0 && i == 1);
	CHECK(json_at(a, 1)->num == -2500.0);
	CHECK(json_int64(json_at(a, 1), &i) == -EINVAL);
	CHECK(json_at(a, 2)->type == JSON_TRUE);
	CHECK(json_at(a, 4)->type == JSON_NULL);
	CHECK_EQ_STR(json_at(a, 5)->str, "x\xc3\xa9\xf0\x9f\x98\x80");
	CHECK(json_get(d.root, "b")->type == JSON_OBJECT && json_get(d.root, "b")->n == 0);
	CHECK(json_get(d.root, "c") == NULL);
	json_doc_free(&d);
}

TEST(json, rejects_malformed_with_position)
{
	const char *bad[] = {"", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "\"\\x\"", "\"a\nb\"",
			     "[1] 2", "\"\\ud800\"", "\"\\udc00x\"", "\"\xff\"", "\"\xc0\xaf\"",
			     "\"\xed\xa0\x80\"", "nul", "{\"a\":1,}", "[\"\\u12\"]", "1e", "+1"};
	for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
		struct json_doc d;
		int r = parse(&d, bad[k]);
		CHECK(r == -EINVAL);
		CHECK(d.root == NULL);
		CHECK_CONTAINS(d.err, "line 1, column");
	}
	struct json_doc d;
	CHECK(parse(&d, "{\n  \"a\": tru\n}") == -EINVAL);
	CHECK_CONTAINS(d.err, "line 2, column 8");
}

TEST(json, depth_limit)
{
	char deep[JSON_MAX_DEPTH * 2 + 10];
	size_t n = 0;
	for (int i = 0; i < JSON_MAX_DEPTH + 1; i++)
		deep[n++] = '[';
	for (int i = 0; i < JSON_MAX_DEPTH + 1; i++)
		deep[n++] = ']';
	struct json_doc d;
	CHECK(json_parse(&d, deep, n) == -EINVAL);
	CHECK_CONTAINS(d.err, "too deep");
	CHECK(json_parse(&d, deep + 1, n - 2) == 0);
	json_doc_free(&d);
}

TEST(json, python_dumps_form)
{
	struct json_doc d;
	REQUIRE(parse(&d, "{\"name\":\"f\",\"q\":\"a\\\"b\\\\c\\n\\u0001\xe6\x97\xa5\",\"n\":[1,2.50,1e5,-0,1e-7,1e16,123456789012345678901234]}") == 0);
	struct sbuf b = {0};
	json_write(&b, d.root, 0);
	CHECK_EQ_STR(sbuf_cstr(&b), "{\"name\": \"f\", \"q\": \"a\\\"b\\\\c\\n\\u0001\xe6\x97\xa5\", "
				    "\"n\": [1, 2.5, 100000.0, 0, 1e-07, 1e+16, 123456789012345678901234]}");
	b.len = 0;
	json_write(&b, d.root, 1);
	CHECK_CONTAINS(sbuf_cstr(&b), "\\u0001\\u65e5\"");
	sbuf_free(&b);
	json_doc_free(&d);
}

TEST(json, utf8_codec)
{
	uint32_t cp;
	char out[4];
	for (uint32_t c = 0; c <= 0x10ffff; c += 97) {
		if (c >= 0xd800 && c <= 0xdfff)
			continue;
		int n = utf8_encode(c, out);
		CHECK(utf8_decode((unsigned char *)out, (size_t)n, &cp) == n && cp == c);
	}
	CHECK(utf8_decode((const unsigned char *)"\xf4\x90\x80\x80", 4, &cp) == 0); /* > U+10FFFF */
	CHECK(utf8_decode((const unsigned char *)"\xe0\x80\x80", 3, &cp) == 0);     /* overlong */
	CHECK(utf8_decode((const unsigned char *)"\xe6\x97", 2, &cp) == 0);         /* truncated */
}

/* Regression (fuzz_json): a number beyond double's range was written as Infinity, which the
 * reader rightly rejects, so write(parse(x)) did not parse. Its source text is kept instead. */
TEST(json, huge_number_round_trips)
{
	struct json_doc d, d2;
	REQUIRE(parse(&d, "[1e400, -1E+999, 1e-400]") == 0);
	struct sbuf b = {0}, b2 = {0};
	json_write(&b, d.root, 0);
	CHECK_EQ_STR(sbuf_cstr(&b), "[1e400, -1E+999, 0.0]");
	REQUIRE(json_parse(&d2, b.p, b.len) == 0);
	json_write(&b2, d2.root, 0);
	CHECK_EQ_STR(sbuf_cstr(&b2), sbuf_cstr(&b));
	sbuf_free(&b);
	sbuf_free(&b2);
	json_doc_free(&d);
	json_doc_free(&d2);
}
