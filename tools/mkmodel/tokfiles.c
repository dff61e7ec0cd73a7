/*
 * tokfiles.c — the tokenizer files of a generated checkpoint: the real DeepSeek tokenizer.json
 * copied (optionally with the V3.1-family added tokens patched in), or a small generated
 * byte-level BPE when the real one is absent, and a V3.2-style tokenizer_config.json.
 *
 * Owns: those two files. Must not: tokenize (model/tokenizer* does that).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/fileio.h"
#include "model/json.h"
#include "tools/mkmodel/mkmodel.h"

/* Spec §8.1: V3.1-family ids, from secondary sources. `special` as HF marks them. */
static const struct {
	int64_t id;
	const char *content;
	int special;
} v31_tokens[] = {
	{128798, "<think>", 0},
	{128799, "</think>", 0},
	{128803, "<\xef\xbd\x9cUser\xef\xbd\x9c>", 0},
	{128804, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", 0},
	{128806, "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>", 0},
	{128807, "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>", 0},
	{128808, "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>", 0},
	{128809, "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>", 0},
	{128812, "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "begin\xef\xbd\x9c>", 0},
	{128813, "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "end\xef\xbd\x9c>", 0},
	{128814, "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>", 0},
};
#define N_V31 (sizeof v31_tokens / sizeof *v31_tokens)

#define BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define PAD "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>"

static void added_token(struct sbuf *b, int64_t id, const char *content, int special)
{
	sbuf_printf(b, "{\"id\": %lld, \"content\": ", (long long)id);
	json_write_str(b, content, strlen(content), 0);
	sbuf_printf(b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
		       "\"normalized\": %s, \"special\": %s}",
		    special ? "false" : "true", special ? "true" : "false");
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to 256+n. */
static uint32_t byte_char(int byte)
{
	int n = 0;
	for (int c = 0; c < 256; c++) {
		int printable = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
		if (c == byte)
			return printable ? (uint32_t)c : 256u + (uint32_t)n;
		if (!printable)
			n++;
	}
	return 0;
}

/* The fallback: ids 0..2 BOS/EOS/pad, 3..258 the 256 byte tokens, then a few merges. */
static char *fallback_tokenizer(int patch_v31)
{
	static const char *merges[][2] = {
		{"\xc4\xa0", "t"}, {"\xc4\xa0", "a"}, {"h", "e"}, {"i", "n"}, {"r", "e"},
		{"o", "n"}, {"\xc4\xa0t", "he"}, {"e", "r"}, {"\xc4\xa0", "s"}, {"a", "t"},
	};
	struct sbuf b = {0};
	sbuf_puts(&b, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [");
	added_token(&b, 0, BOS, 1);
	sbuf_puts(&b, ", ");
	added_token(&b, 1, EOS, 1);
	sbuf_puts(&b, ", ");
	added_token(&b, 2, PAD, 1);
	for (size_t i = 0; patch_v31 && i < N_V31; i++) {
		sbuf_puts(&b, ", ");
		added_token(&b, v31_tokens[i].id, v31_tokens[i].content, v31_tokens[i].special);
	}
	sbuf_puts(&b, "], \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": []}, \"pre_tokenizer\": ");
	sbuf_puts(&b, mkmodel_deepseek_pretokenizer);
	sbuf_puts(&b, ", \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
		      "\"trim_offsets\": false, \"use_regex\": true}, \"decoder\": {\"type\": "
		      "\"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
		      "\"use_regex\": true}, \"model\": {\"type\": \"BPE\", \"dropout\": null, "
		      "\"unk_token\": null, \"continuing_subword_prefix\": null, \"end_of_word_suffix\": "
		      "null, \"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": {");
	int id = 3;
	for (int c = 0; c < 256; c++, id++) {
		char u[4];
		int n = utf8_encode(byte_char(c), u);
		if (c)
			sbuf_puts(&b, ", ");
		json_write_str(&b, u, (size_t)n, 0);
		sbuf_printf(&b, ": %d", id);
	}
	for (size_t i = 0; i < sizeof merges / sizeof *merges; i++, id++) {
		char tok[16];
		snprintf(tok, sizeof tok, "%s%s", merges[i][0], merges[i][1]);
		sbuf_puts(&b, ", ");
		json_write_str(&b, tok, strlen(tok), 0);
		sbuf_printf(&b, ": %d", id);
	}
	sbuf_puts(&b, "}, \"merges\": [");
	for (size_t i = 0; i < sizeof merges / sizeof *merges; i++) {
		char m[16];
		snprintf(m, sizeof m, "%s %s", merges[i][0], merges[i][1]);
		if (i)
			sbuf_puts(&b, ", ");
		json_write_str(&b, m, strlen(m), 0);
	}
	sbuf_puts(&b, "]}}\n");
	return sbuf_cstr(&b);
}

/* Rewrites a tokenizer.json with the V3.1 tokens patched into added_tokens (by id: an entry
 * with that id gets the new content; a missing id is appended). Other members unchanged. */
static char *patch_tokenizer(const struct json *root)
{
	struct sbuf b = {0};
	int done[N_V31] = {0};
	sbuf_putc(&b, '{');
	for (const struct json *m = root->child; m; m = m->next) {
		if (m != root->child)
			sbuf_puts(&b, ", ");
		json_write_str(&b, m->key, m->key_len, 0);
		sbuf_puts(&b, ": ");
		if (strcmp(m->key, "added_tokens") || m->type != JSON_ARRAY) {
			json_write(&b, m, 0);
			continue;
		}
		sbuf_putc(&b, '[');
		for (const struct json *t = m->child; t; t = t->next) {
			if (t != m->child)
				sbuf_puts(&b, ", ");
			int64_t id = -1;
			json_int64(json_get(t, "id"), &id);
			size_t k = 0;
			while (k < N_V31 && v31_tokens[k].id != id)
				k++;
			if (k == N_V31 || t->type != JSON_OBJECT) {
				json_write(&b, t, 0);
				continue;
			}
			done[k] = 1;
			added_token(&b, id, v31_tokens[k].content, v31_tokens[k].special);
		}
		for (size_t k = 0; k < N_V31; k++)
			if (!done[k]) {
				sbuf_puts(&b, ", ");
				added_token(&b, v31_tokens[k].id, v31_tokens[k].content,
					    v31_tokens[k].special);
			}
		sbuf_putc(&b, ']');
	}
	sbuf_puts(&b, "}\n");
	return sbuf_cstr(&b);
}

/* Largest id in model.vocab and added_tokens. */
static int64_t max_id(const struct json *root)
{
	int64_t mx = -1, v;
	const struct json *vocab = json_get(json_get(root, "model"), "vocab");
	for (const struct json *m = vocab ? vocab->child : NULL; m; m = m->next)
		if (!json_int64(m, &v) && v > mx)
			mx = v;
	const struct json *at = json_get(root, "added_tokens");
	for (const struct json *t = at ? at->child : NULL; t; t = t->next)
		if (!json_int64(json_get(t, "id"), &v) && v > mx)
			mx = v;
	return mx;
}

static const char tokenizer_config[] =
	"{\n"
	"  \"add_bos_token\": false,\n"
	"  \"add_eos_token\": false,\n"
	"  \"bos_token\": \"" BOS "\",\n"
	"  \"clean_up_tokenization_spaces\": false,\n"
	"  \"eos_token\": \"" EOS "\",\n"
	"  \"legacy\": true,\n"
	"  \"model_max_length\": 131072,\n"
	"  \"pad_token\": \"" EOS "\",\n"
	"  \"sp_model_kwargs\": {},\n"
	"  \"unk_token\": null,\n"
	"  \"tokenizer_class\": \"LlamaTokenizerFast\"\n"
	"}\n";

int tokfiles_write(const char *dir, const char *src, int patch_v31, int64_t vocab_size,
		   struct err *e)
{
	char path[4096];
	char *text = NULL, *out = NULL;
	size_t len = 0;
	struct err re;
	if (src && !(text = file_read(src, &len, 256u << 20, &re)))
		fprintf(stderr,
			"mkmodel: ************************************************************\n"
			"mkmodel: FALLBACK TOKENIZER: %s\n"
			"mkmodel: writing a small generated byte-level BPE instead of DeepSeek's.\n"
			"mkmodel: Tests that need the real tokenizer will fail on this checkpoint;\n"
			"mkmodel: run `make tokenizer` to fetch it.\n"
			"mkmodel: ************************************************************\n",
			re.msg);
	else if (!src)
		fprintf(stderr, "mkmodel: note: using the generated byte-level BPE fallback tokenizer "
				"(not DeepSeek's)\n");
	int r = 0;
	if (text) {
		struct json_doc doc;
		if ((r = json_parse(&doc, text, len))) {
			r = err_set(e, r, "%s: not valid JSON: %s", src, doc.err);
			goto out;
		}
		int64_t mx = max_id(doc.root);
		if (mx >= vocab_size) {
			json_doc_free(&doc);
			r = err_set(e, -EINVAL, "%s: token ids go up to %lld but the config's vocab_size "
				    "is %lld (use --tokenizer fallback with a small vocab)", src,
				    (long long)mx, (long long)vocab_size);
			goto out;
		}
		if (patch_v31)
			out = patch_tokenizer(doc.root);
		json_doc_free(&doc);
		if (patch_v31 && !out) {
			r = err_set(e, -ENOMEM, "out of memory");
			goto out;
		}
	} else {
		if (patch_v31 && vocab_size <= 128814) {
			r = err_set(e, -EINVAL, "--patch-v31-tokens needs vocab_size > 128814 (got %lld)",
				    (long long)vocab_size);
			goto out;
		}
		if (vocab_size < 269) {
			r = err_set(e, -EINVAL, "the fallback tokenizer needs vocab_size >= 269 (got %lld)",
				    (long long)vocab_size);
			goto out;
		}
		if (!(out = fallback_tokenizer(patch_v31))) {
			r = err_set(e, -ENOMEM, "out of memory");
			goto out;
		}
	}
	if (patch_v31) {
		fprintf(stderr, "mkmodel: patched V3.1-family added tokens into tokenizer.json:");
		for (size_t k = 0; k < N_V31; k++)
			fprintf(stderr, " %s=%lld", v31_tokens[k].content, (long long)v31_tokens[k].id);
		fprintf(stderr, "\nmkmodel: these ids are SECONDHAND (V3.1 tokenizer as quoted by "
				"FastDeploy tests and third-party docs, spec §8.1), not read from a "
				"DeepSeek-V3.2 tokenizer.json\n");
	}
	path_join(path, sizeof path, dir, "tokenizer.json");
	if (out)
		r = file_write(path, out, strlen(out), e);
	else
		r = file_write(path, text, len, e);
	if (!r)
		r = file_write(path_join(path, sizeof path, dir, "tokenizer_config.json"),
			       tokenizer_config, sizeof tokenizer_config - 1, e);
out:
	free(text);
	free(out);
	return r;
}
