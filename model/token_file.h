/*
 * token_file.h — token-id files: one sequence per line, comma-separated decimal ids
 * ("0,100,200\n"), the input of `dsv32 eval` and of the reference tools that mirror it.
 *
 * Owns: parsing and validating such text (spaces and tabs around ids and a CR before the LF are
 * accepted; an empty line, a missing id, anything non-numeric, an id >= vocab_size is an error
 * naming the file, line and column, 1-based). Must not: read files or know about models.
 */
#ifndef DSV32_TOKEN_FILE_H
#define DSV32_TOKEN_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "model/err.h"

struct token_seqs {
	int64_t n;     /* sequences */
	int32_t **tok; /* [n] -> [len[i]] */
	int64_t *len;  /* [n] */
};

/* Parses text[0, n); `path` only names the file in messages. 0 or -EINVAL / -ENOMEM with e set;
 * on error *out is empty. */
int token_file_parse(const char *text, size_t n, const char *path, int64_t vocab,
		     struct token_seqs *out, struct err *e);
void token_seqs_free(struct token_seqs *s);

#endif
