/*
 * cmd_tokenize.c — `dsv32 tokenize` (text on stdin -> comma-separated ids on one line) and
 * `dsv32 detokenize` (ids, separated by commas and/or whitespace, on stdin -> text on stdout).
 *
 *   dsv32 tokenize   --model DIR | --tokenizer FILE [--special] [--strict]
 *   dsv32 detokenize --model DIR | --tokenizer FILE [--skip-special]
 *
 * --special recognises added tokens in the text (for pre-rendered prompts); by default they are
 * encoded as plain text. --strict rejects invalid UTF-8 (default: each invalid sequence reads
 * as U+FFFD). detokenize writes the bytes the ids stand for, with invalid UTF-8 repaired the
 * same way the streaming detokenizer does.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/detok.h"
#include "model/tokenizer.h"
#include "tools/cli/cli.h"

static int read_all(FILE *f, struct sbuf *b)
{
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		sbuf_put(b, buf, n);
	return ferror(f) || b->oom ? -EIO : 0;
}

static int open_tokenizer(int argc, char **argv, const char *usage, const char *flag,
			  int *flag_set, const char *flag2, int *flag2_set, struct tokenizer **t)
{
	const char *path = NULL;
	for (int i = 1; i < argc; i++) {
		if ((!strcmp(argv[i], "--model") || !strcmp(argv[i], "--tokenizer")) && i + 1 < argc)
			path = argv[++i];
		else if (flag && !strcmp(argv[i], flag))
			*flag_set = 1;
		else if (flag2 && !strcmp(argv[i], flag2))
			*flag2_set = 1;
		else {
			fprintf(stderr, "usage: %s\n", usage);
			return 2;
		}
	}
	if (!path) {
		fprintf(stderr, "usage: %s\n", usage);
		return 2;
	}
	struct err e;
	if (tokenizer_load(t, path, &e)) {
		fprintf(stderr, "dsv32: %s\n", e.msg);
		return 1;
	}
	return 0;
}

int cmd_tokenize(int argc, char **argv)
{
	struct tokenizer *t;
	int special = 0, strict = 0;
	int rc = open_tokenizer(argc, argv,
				"dsv32 tokenize --model DIR | --tokenizer FILE [--special] [--strict]",
				"--special", &special, "--strict", &strict, &t);
	if (rc)
		return rc;
	struct sbuf in = {0};
	struct tokenizer_ids ids = {0};
	if (read_all(stdin, &in)) {
		fprintf(stderr, "dsv32: tokenize: cannot read stdin\n");
		rc = 1;
		goto out;
	}
	unsigned flags = (special ? TOKENIZER_SPECIAL : 0) | (strict ? TOKENIZER_STRICT_UTF8 : 0);
	int r = tokenizer_encode(t, in.p ? in.p : "", in.len, flags, &ids);
	if (r) {
		fprintf(stderr, "dsv32: tokenize: %s\n",
			r == -EILSEQ ? "invalid UTF-8 in the input" : strerror(-r));
		rc = 1;
		goto out;
	}
	for (size_t i = 0; i < ids.n; i++)
		printf(i ? ",%d" : "%d", ids.v[i]);
	printf("\n");
out:
	sbuf_free(&in);
	tokenizer_ids_free(&ids);
	tokenizer_free(t);
	return rc;
}

int cmd_detokenize(int argc, char **argv)
{
	struct tokenizer *t;
	int skip = 0;
	int rc = open_tokenizer(argc, argv,
				"dsv32 detokenize --model DIR | --tokenizer FILE [--skip-special]",
				"--skip-special", &skip, NULL, NULL, &t);
	if (rc)
		return rc;
	struct sbuf in = {0}, out = {0};
	struct detok d;
	detok_init(&d, t, skip ? TOKENIZER_SKIP_SPECIAL : 0);
	if (read_all(stdin, &in)) {
		fprintf(stderr, "dsv32: detokenize: cannot read stdin\n");
		rc = 1;
		goto out;
	}
	const char *p = sbuf_cstr(&in) ? in.p : "";
	while (*p) {
		if (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
			p++;
			continue;
		}
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
		    detok_push(&d, (int32_t)v, &out)) {
			fprintf(stderr, "dsv32: detokenize: not a token id: \"%.*s\"\n",
				(int)strcspn(p, ", \t\r\n"), p);
			rc = 1;
			goto out;
		}
		p = end;
	}
	detok_flush(&d, &out);
	if (out.len && fwrite(out.p, 1, out.len, stdout) != out.len)
		rc = 1;
out:
	sbuf_free(&in);
	sbuf_free(&out);
	tokenizer_free(t);
	return rc;
}
