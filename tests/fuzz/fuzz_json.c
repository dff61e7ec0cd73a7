/*
 * fuzz_json.c — libFuzzer target for model/json.h: json_parse on arbitrary bytes, and the
 * writer's round trip: for any text the parser accepts, w1 = write(parse(x)) must parse, and
 * write(parse(w1)) must equal w1 byte for byte (both with and without ensure_ascii). Aborts on
 * a mismatch. Also exercises the lookups on whatever tree came out.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/json.h"
#include "tests/fuzz/fuzz.h"

static void round_trip(const struct json *root, int ascii)
{
	struct sbuf w1 = {0}, w2 = {0};
	json_write(&w1, root, ascii);
	FUZZ_CHECK(!w1.oom);
	struct json_doc d2;
	int r = json_parse(&d2, w1.p ? w1.p : "", w1.len);
	if (r) {
		fprintf(stderr, "written JSON does not parse (%s): %.*s\n", d2.err, (int)w1.len, w1.p);
		abort();
	}
	json_write(&w2, d2.root, ascii);
	if (w1.len != w2.len || memcmp(w1.p, w2.p, w1.len)) {
		fprintf(stderr, "round trip differs:\n  %.*s\n  %.*s\n", (int)w1.len, w1.p,
			(int)w2.len, w2.p);
		abort();
	}
	json_doc_free(&d2);
	sbuf_free(&w1);
	sbuf_free(&w2);
}

static void walk(const struct json *v, int depth)
{
	int64_t i;
	json_int64(v, &i);
	if (v->type == JSON_OBJECT) {
		const char *s;
		size_t n;
		int b;
		double d;
		for (const struct json *c = v->child; c; c = c->next) {
			FUZZ_CHECK(c->key);
			json_get(v, c->key);
			json_get_str(v, c->key, &s, &n);
			json_get_bool(v, c->key, &b);
			json_get_num(v, c->key, &d);
		}
	}
	if (v->type == JSON_ARRAY)
		FUZZ_CHECK(v->n == 0 || json_at(v, v->n - 1) != NULL);
	for (const struct json *c = v->child; c && depth < 64; c = c->next)
		walk(c, depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct json_doc d;
	if (json_parse(&d, (const char *)data, size)) {
		FUZZ_CHECK(d.root == NULL && d.err[0]);
		return 0;
	}
	walk(d.root, 0);
	round_trip(d.root, 0);
	round_trip(d.root, 1);
	json_doc_free(&d);
	return 0;
}
