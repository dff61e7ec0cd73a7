/*
 * cuda_sampler.c — launcher of the GPU sampler (see cuda_sampler.h).
 */
#include "model/cuda_sampler.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdio.h>

#define SB_THREADS 512       /* sampler.cu */
#define SB_MAX_VOCAB 524288  /* SB_TILE * SB_MAX_TILES */

_Static_assert(sizeof(struct cuda_sampler_row) == 112, "sampler_row layout (sampler.cu)");
_Static_assert(sizeof(struct cuda_sampler_result) == 176, "sampler_result layout (sampler.cu)");

void cuda_sampler_row_set(struct cuda_sampler_row *r, const struct sampler_params *p,
			  uint64_t index, int64_t prompt_off, int64_t n_prompt, int64_t output_off,
			  int64_t n_output)
{
	*r = (struct cuda_sampler_row){
		.temperature = p->temperature,
		.top_p = p->top_p,
		.min_p = p->min_p,
		.repetition_penalty = p->repetition_penalty,
		.presence_penalty = p->presence_penalty,
		.frequency_penalty = p->frequency_penalty,
		.top_k = p->top_k,
		.seed = p->seed,
		.index = index,
		.prompt_off = prompt_off,
		.n_prompt = n_prompt,
		.output_off = output_off,
		.n_output = n_output,
		.logprobs = p->logprobs,
		.top_logprobs = p->top_logprobs,
	};
}

/* One block of 512 threads fits an SM (97 registers a thread); two rows an SM would need
 * twice the workspace for no gain. */
int cuda_sampler_grid(const struct gpu *g, int rows)
{
	int sm = g->sm_count > 0 ? g->sm_count : 1;
	return rows < sm ? rows : sm;
}

static size_t slot_bytes(int vocab)
{
	size_t vp = ((size_t)vocab + 63) / 64 * 64;
	return 3 * vp * 4; /* penalised copy, two id/count arrays */
}

size_t cuda_sampler_workspace(const struct gpu *g, int rows, int vocab)
{
	return rows > 0 ? (size_t)cuda_sampler_grid(g, rows) * slot_bytes(vocab) : 0;
}

int cuda_sampler_sample_flags(struct gpu *g, gpu_ptr logits, int64_t ld, int rows, int vocab,
			      gpu_ptr params, gpu_ptr hist, gpu_ptr out, gpu_ptr ws, int flags,
			      gpu_ptr diag)
{
	if (vocab < 1 || vocab > SB_MAX_VOCAB || ld < vocab || rows < 0 || (rows && !ws)) {
		fprintf(stderr, "<3>dsv32: sampler: unsupported shape rows=%d vocab=%d ld=%lld\n",
			rows, vocab, (long long)ld);
		return -EINVAL;
	}
	if (!rows)
		return 0;
	long long ldl = ld, sb = (long long)slot_bytes(vocab);
	int V = vocab, n = rows;
	void *args[] = {&logits, &ldl, &V, &n, &params, &hist, &out, &ws, &sb, &flags, &diag};
	return gpu_launch(g, gpu_kernel(g, "k_sampler"), (unsigned)cuda_sampler_grid(g, rows), 1, 1,
			  SB_THREADS, 1, 1, 0, args);
}

int cuda_sampler_sample(struct gpu *g, gpu_ptr logits, int64_t ld, int rows, int vocab,
			gpu_ptr params, gpu_ptr hist, gpu_ptr out, gpu_ptr ws)
{
	return cuda_sampler_sample_flags(g, logits, ld, rows, vocab, params, hist, out, ws,
					 CUDA_SAMPLER_FAST, 0);
}

int cuda_sampler_bits(struct gpu *g, gpu_ptr seed, gpu_ptr index, gpu_ptr bits, int n)
{
	if (n <= 0)
		return n ? -EINVAL : 0;
	void *args[] = {&seed, &index, &bits, &n};
	return gpu_launch(g, gpu_kernel(g, "k_sampler_uniform"), (unsigned)((n + 255) / 256), 1, 1,
			  256, 1, 1, 0, args);
}

#endif
