/*
 * token_file.c — the token-id file parser (see token_file.h).
 */
#include "model/token_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A byte as it can be printed in a message: 'x' or \xNN. out: [8] */
static const char *show(char c, char *out)
{
	if (c >= 0x20 && c < 0x7f)
		snprintf(out, 8, "'%c'", c);
	else
		snprintf(out, 8, "\\x%02x", (unsigned char)c);
	return out;
}

void token_seqs_free(struct token_seqs *s)
{
	for (int64_t i = 0; i < s->n; i++)
		free(s->tok[i]);
	free(s->tok);
	free(s->len);
	memset(s, 0, sizeof *s);
}

static int seqs_push(struct token_seqs *s, int32_t *tok, int64_t len)
{
	int32_t **nt = realloc(s->tok, (size_t)(s->n + 1) * sizeof *nt);
	int64_t *nl = nt ? realloc(s->len, (size_t)(s->n + 1) * sizeof *nl) : NULL;
	if (nt)
		s->tok = nt;
	if (!nl)
		return -ENOMEM;
	s->len = nl;
	s->tok[s->n] = tok;
	s->len[s->n++] = len;
	return 0;
}

int token_file_parse(const char *text, size_t n, const char *path, int64_t vocab,
		     struct token_seqs *out, struct err *e)
{
	memset(out, 0, sizeof *out);
	size_t i = 0;
	int64_t line = 0;
	while (i < n) {
		line++;
		size_t b = i, end = i;
		while (end < n && text[end] != '\n')
			end++;
		size_t stop = end > b && text[end - 1] == '\r' ? end - 1 : end;
		i = end + 1;
		int32_t *tok = NULL;
		int64_t len = 0, cap = 0;
		size_t p = b;
		int rc = 0;
		for (;;) {
			while (p < stop && (text[p] == ' ' || text[p] == '\t'))
				p++;
			size_t col = p - b + 1;
			if (p == stop) {
				rc = err_set(e, -EINVAL, len ? "%s:%lld:%zu: missing token id after ','"
							    : "%s:%lld:%zu: empty line (expected comma-separated token ids)",
					     path, (long long)line, col);
				break;
			}
			if (text[p] == ',' && len) {
				rc = err_set(e, -EINVAL, "%s:%lld:%zu: missing token id after ','", path,
					     (long long)line, col);
				break;
			}
			if (text[p] < '0' || text[p] > '9') {
				char sh[8];
				rc = err_set(e, -EINVAL, "%s:%lld:%zu: expected a token id, got %s", path,
					     (long long)line, col, show(text[p], sh));
				break;
			}
			int64_t v = 0;
			while (p < stop && text[p] >= '0' && text[p] <= '9') {
				v = v * 10 + (text[p++] - '0');
				if (v >= vocab)
					break;
			}
			if (v >= vocab) {
				rc = err_set(e, -EINVAL, "%s:%lld:%zu: token id out of range (vocab_size %lld)",
					     path, (long long)line, col, (long long)vocab);
				break;
			}
			if (len == cap) {
				cap = cap ? 2 * cap : 64;
				int32_t *nt = realloc(tok, (size_t)cap * sizeof *nt);
				if (!nt) {
					rc = err_set(e, -ENOMEM, "out of memory");
					break;
				}
				tok = nt;
			}
			tok[len++] = (int32_t)v;
			while (p < stop && (text[p] == ' ' || text[p] == '\t'))
				p++;
			if (p == stop)
				break;
			if (text[p] != ',') {
				char sh[8];
				rc = err_set(e, -EINVAL, "%s:%lld:%zu: expected ',' or end of line, got %s",
					     path, (long long)line, p - b + 1, show(text[p], sh));
				break;
			}
			p++;
		}
		if (!rc && seqs_push(out, tok, len))
			rc = err_set(e, -ENOMEM, "out of memory");
		if (rc) {
			free(tok);
			token_seqs_free(out);
			return rc;
		}
	}
	if (out->n == 0)
		return err_set(e, -EINVAL, "%s: no sequences (the file is empty)", path);
	return 0;
}
