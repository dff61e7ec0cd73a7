/*
 * cuda_synth.c — synthetic weights on the GPU (model/cuda_synth.h).
 */
#include "model/cuda_synth.h"

#include <errno.h>
#include <string.h>

int cuda_synth_generated(const struct st_tensor *t)
{
	return t->dtype == ST_F8_E4M3 || (t->dtype == ST_BF16 && t->ndim == 2);
}

#ifndef DSV32_NO_CUDA

static uint64_t name_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
	for (const unsigned char *c = (const unsigned char *)s; *c; c++)
		h = (h ^ *c) * 0x100000001b3ull;
	return h;
}

static int ilog2_u64(uint64_t x)
{
	int n = -1;
	while (x)
		x >>= 1, n++;
	return n;
}

int cuda_synth_tensor(struct gpu *g, gpu_ptr dst, const struct st_tensor *t, uint64_t seed)
{
	if (!cuda_synth_generated(t))
		return -EINVAL;
	unsigned long long s = seed ^ (name_hash(t->name) * 0x9e3779b97f4a7c15ull);
	unsigned blocks = (unsigned)(g->sm_count > 0 ? g->sm_count * 8 : 1024);
	if (t->dtype == ST_F8_E4M3) {
		long long n = (long long)t->nbytes;
		void *args[] = {&dst, &n, &s};
		return gpu_launch(g, gpu_kernel(g, "k_synth_e4m3"), blocks, 1, 1, 256, 1, 1, 0, args);
	}
	/* mkmodel's GEN_BF16: rms ~ 1/sqrt(fan-in), fan-in = columns (1 for embeddings) */
	uint64_t fan_in = strstr(t->name, "embed_tokens") ? 1 : (uint64_t)t->shape[1];
	int shift = (ilog2_u64(5461 * fan_in) + 1) / 2;
	long long n = (long long)(t->nbytes / 2);
	void *args[] = {&dst, &n, &s, &shift};
	return gpu_launch(g, gpu_kernel(g, "k_synth_bf16"), blocks, 1, 1, 256, 1, 1, 0, args);
}

#endif
