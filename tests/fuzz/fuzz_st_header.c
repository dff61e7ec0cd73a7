/*
 * fuzz_st_header.c — libFuzzer target for st_parse_header (model/safetensors.h): arbitrary
 * bytes as a whole safetensors file held in memory.
 *
 * Beyond "no crash, no sanitizer report": on success every tensor must lie inside the data
 * area with nbytes = product(shape) x dtype size, names sorted and unique, and no two
 * non-empty tensors overlapping; on failure nothing is returned and the message names the file.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_tensor *t;
	size_t n;
	void *arena;
	struct err e = {{0}};
	int r = st_parse_header(data, size, "fuzz.safetensors", &t, &n, &arena, &e);
	if (r) {
		FUZZ_CHECK(r < 0 && !t && !n && !arena);
		FUZZ_CHECK(!strncmp(e.msg, "fuzz.safetensors", 16));
		return 0;
	}
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | data[i];
	uint64_t data_size = size - 8 - hl;
	for (size_t i = 0; i < n; i++) {
		uint64_t b = (uintptr_t)t[i].data, count = 1;
		FUZZ_CHECK(t[i].ndim >= 0 && t[i].ndim <= ST_MAX_DIMS);
		for (int k = 0; k < t[i].ndim; k++) {
			FUZZ_CHECK(t[i].shape[k] >= 0);
			count *= (uint64_t)t[i].shape[k];
		}
		FUZZ_CHECK(count * st_dtype_size(t[i].dtype) == t[i].nbytes);
		FUZZ_CHECK(b <= data_size && t[i].nbytes <= data_size - b);
		FUZZ_CHECK(t[i].name[0]);
		if (i)
			FUZZ_CHECK(strcmp(t[i - 1].name, t[i].name) < 0);
		for (size_t j = 0; j < i && n < 64; j++) { /* quadratic: small headers only */
			uint64_t c = (uintptr_t)t[j].data;
			if (t[i].nbytes && t[j].nbytes)
				FUZZ_CHECK(b + t[i].nbytes <= c || c + t[j].nbytes <= b);
		}
	}
	free(t);
	free(arena);
	return 0;
}
