/*
 * fuzz_eval_files.c — libFuzzer target for the readers of `dsv32 eval`'s files: the token-id
 * file parser (model/token_file.h), .npy headers and .npz archives (model/npy.h). The first
 * byte picks the reader. On success the result must be consistent: ids inside the vocabulary
 * and non-empty sequences; arrays whose byte count matches their shape.
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/npy.h"
#include "model/token_file.h"
#include "tests/fuzz/fuzz.h"

static void check_array(const struct npy_array *a)
{
	size_t n = 4;
	for (int i = 0; i < a->ndim; i++)
		n *= (size_t)a->shape[i];
	FUZZ_CHECK(n == a->nbytes && a->data);
	volatile uint8_t sink = 0;
	for (size_t i = 0; i < a->nbytes; i++) /* every byte is readable */
		sink ^= ((const uint8_t *)a->data)[i];
	(void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	struct err e;
	struct npy_array a;
	const uint8_t *p = data + 1;
	size_t n = size - 1;
	switch (data[0] % 3) {
	case 0:
		if (npy_parse(p, n, &a, &e) == 0) {
			check_array(&a);
			npy_free(&a);
		}
		break;
	case 1:
		if (npz_find(p, n, "seq0", &a, &e) == 0) {
			check_array(&a);
			npy_free(&a);
		}
		break;
	default: {
		struct token_seqs s;
		int64_t vocab = 1000;
		if (token_file_parse((const char *)p, n, "fuzz.txt", vocab, &s, &e) == 0) {
			FUZZ_CHECK(s.n >= 1);
			for (int64_t i = 0; i < s.n; i++) {
				FUZZ_CHECK(s.len[i] >= 1);
				for (int64_t k = 0; k < s.len[i]; k++)
					FUZZ_CHECK(s.tok[i][k] >= 0 && s.tok[i][k] < vocab);
			}
			token_seqs_free(&s);
		}
		break;
	}
	}
	return 0;
}
