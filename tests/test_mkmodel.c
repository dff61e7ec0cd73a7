/* test_mkmodel.c — mkmodel's tokenizer files: the real DeepSeek tokenizer copied (and patched
 * with the V3.1-family ids of spec §8.1 when asked), the generated fallback, tokenizer_config. */
#include <stdlib.h>
#include <unistd.h>

#include "model/fileio.h"
#include "model/json.h"
#include "tests/ckpt_helpers.h"
#include "tests/test.h"

#define THINK "<think>"
#define USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"

/* The added token with this id in DIR/tokenizer.json, or NULL; also counts added tokens. */
static char *added_content(const char *dir, int64_t id, size_t *n_added, size_t *n_vocab)
{
	char p[1024];
	size_t len;
	char *t = file_read(path_join(p, sizeof p, dir, "tokenizer.json"), &len, 64u << 20, NULL);
	REQUIRE(t);
	struct json_doc d;
	REQUIRE(json_parse(&d, t, len) == 0);
	free(t);
	const struct json *at = json_get(d.root, "added_tokens");
	REQUIRE(at && at->type == JSON_ARRAY);
	*n_added = at->n;
	*n_vocab = json_get(json_get(d.root, "model"), "vocab")->n;
	char *out = NULL;
	for (const struct json *a = at->child; a; a = a->next) {
		int64_t x;
		if (!json_int64(json_get(a, "id"), &x) && x == id) {
			out = strdup(json_get(a, "content")->str);
			break;
		}
	}
	json_doc_free(&d);
	return out;
}

static const char *real_tokenizer(void)
{
	static char p[4096];
	snprintf(p, sizeof p, "%s/build/tokenizer/tokenizer.json", test_root());
	if (access(p, R_OK)) {
		test_fail(__FILE__, __LINE__, "the real tokenizer %s is missing (run `make tokenizer`): "
			  "this test does not pass on the fallback", p);
		test_abort_case();
	}
	return p;
}

TEST(mkmodel, real_tokenizer_copied_and_patched)
{
	const char *src = real_tokenizer();
	char args[8192], dir[512];
	snprintf(dir, sizeof dir, "%s/plain", test_tmpdir());
	snprintf(args, sizeof args, "tiny --header-only --tokenizer %s --out %s", src, dir);
	char *log = NULL;
	REQUIRE(run_mkmodel(args, &log) == 0);
	CHECK(!strstr(log, "FALLBACK"));
	free(log);
	/* unpatched: a byte-identical copy */
	char p[1024];
	size_t la, lb;
	char *a = file_read(src, &la, 64u << 20, NULL);
	char *b = file_read(path_join(p, sizeof p, dir, "tokenizer.json"), &lb, 64u << 20, NULL);
	REQUIRE(a && b);
	CHECK(la == lb && !memcmp(a, b, la));
	free(a);
	free(b);
	size_t n_added, n_vocab;
	char *c = added_content(dir, 128798, &n_added, &n_vocab);
	CHECK(c && strcmp(c, THINK)); /* DeepSeek-V3's file holds a placeholder there */
	free(c);
	size_t n_added0 = n_added;

	snprintf(dir, sizeof dir, "%s/patched", test_tmpdir());
	snprintf(args, sizeof args, "tiny --header-only --patch-v31-tokens --tokenizer %s --out %s", src,
		 dir);
	REQUIRE(run_mkmodel(args, &log) == 0);
	CHECK_CONTAINS(log, "SECONDHAND");
	CHECK_CONTAINS(log, "<think>=128798");
	free(log);
	c = added_content(dir, 128798, &n_added, &n_vocab);
	CHECK_EQ_STR(c, THINK);
	free(c);
	c = added_content(dir, 128799, &n_added, &n_vocab);
	CHECK_EQ_STR(c, "</think>");
	free(c);
	c = added_content(dir, 128803, &n_added, &n_vocab);
	CHECK_EQ_STR(c, USER);
	free(c);
	c = added_content(dir, 1, &n_added, &n_vocab);
	CHECK_EQ_STR(c, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
	free(c);
	CHECK_EQ_INT(n_added, n_added0); /* patched in place, nothing appended */
	CHECK_EQ_INT(n_vocab, 128000);
}

TEST(mkmodel, fallback_tokenizer)
{
	char args[2048], dir[512];
	snprintf(dir, sizeof dir, "%s/fb", test_tmpdir());
	/* a missing file falls back loudly */
	snprintf(args, sizeof args, "tiny --header-only --tokenizer %s/none.json --patch-v31-tokens --out %s",
		 test_tmpdir(), dir);
	char *log = NULL;
	REQUIRE(run_mkmodel(args, &log) == 0);
	CHECK_CONTAINS(log, "FALLBACK TOKENIZER");
	CHECK_CONTAINS(log, "none.json");
	free(log);
	size_t n_added, n_vocab;
	char *c = added_content(dir, 0, &n_added, &n_vocab);
	CHECK_EQ_STR(c, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
	free(c);
	c = added_content(dir, 128798, &n_added, &n_vocab);
	CHECK_EQ_STR(c, THINK);
	free(c);
	CHECK_EQ_INT(n_added, 3 + 11);
	CHECK_EQ_INT(n_vocab, 256 + 10);
	/* GPT-2 byte alphabet: byte ' ' is U+0120 'Ġ' at id 3 + 32 */
	char p[1024];
	char *t = file_read(path_join(p, sizeof p, dir, "tokenizer.json"), NULL, 1 << 20, NULL);
	REQUIRE(t);
	CHECK_CONTAINS(t, "\"\xc4\xa0\": 35");
	CHECK_CONTAINS(t, "\"\xc4\xa0t he\"");
	CHECK_CONTAINS(t, "\"ByteLevel\"");
	free(t);
	t = file_read(path_join(p, sizeof p, dir, "tokenizer_config.json"), NULL, 1 << 20, NULL);
	REQUIRE(t);
	struct json_doc d;
	REQUIRE(json_parse(&d, t, strlen(t)) == 0);
	int b;
	CHECK(json_get_bool(d.root, "add_bos_token", &b) == 1 && !b);
	const char *s;
	size_t n;
	CHECK(json_get_str(d.root, "eos_token", &s, &n) == 1 && strstr(s, "end\xe2\x96\x81of"));
	json_doc_free(&d);
	free(t);
	/* a tokenizer whose ids do not fit vocab_size is refused */
	const char *mini = write_mini_config();
	snprintf(args, sizeof args, "--config %s --tokenizer %s/fb/tokenizer.json --patch-v31-tokens "
		 "--out %s/x", mini, test_tmpdir(), test_tmpdir());
	CHECK(run_mkmodel(args, &log) == 1);
	CHECK_CONTAINS(log, "vocab_size");
	free(log);
}
