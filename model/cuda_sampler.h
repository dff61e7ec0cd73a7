/*
 * cuda_sampler.h — host launcher of the GPU sampler (kernels_ptx/sampler.cu): the function of
 * model/sampler.h for many rows at once, one block per row.
 *
 * Owns: the device layout of a row's parameters and result, the workspace size and the grid.
 * Must not: allocate (the caller passes the workspace) or validate parameters (the caller runs
 * sampler_params_check before filling a row, as for the CPU sampler).
 */
#ifndef DSV32_CUDA_SAMPLER_H
#define DSV32_CUDA_SAMPLER_H

#include "driver/gpu.h"
#include "model/sampler.h"

#ifndef DSV32_NO_CUDA
/* One row's parameters as the kernel reads them (struct sampler_row in sampler.cu). */
struct cuda_sampler_row {
	double temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
	int64_t top_k;
	uint64_t seed, index;    /* the stream key and position (sampler_uniform(seed, index)) */
	int64_t prompt_off, n_prompt; /* the prompt ids: hist[prompt_off .. + n_prompt) */
	int64_t output_off, n_output; /* the output ids: hist[output_off .. + n_output) */
	int32_t logprobs, top_logprobs;
};

/* One row's result: sampler_out's fields plus err (0, -EDOM: NaN / +inf logit or every logit
 * -inf, -EINVAL: a history id out of range; then token = -1 and the rest is zero). */
struct cuda_sampler_result {
	int32_t token, err;
	float logprob;
	int32_t n_top;
	int32_t top_ids[SAMPLER_MAX_LOGPROBS];
	float top_logprobs[SAMPLER_MAX_LOGPROBS];
};

void cuda_sampler_row_set(struct cuda_sampler_row *r, const struct sampler_params *p,
			  uint64_t index, int64_t prompt_off, int64_t n_prompt, int64_t output_off,
			  int64_t n_output);
/* Blocks of a launch for `rows` rows (each block loops over rows when fewer than rows). */
int cuda_sampler_grid(const struct gpu *g, int rows);
/* Workspace bytes for `rows` rows of `vocab` logits: 12 bytes per logit per block. */
size_t cuda_sampler_workspace(const struct gpu *g, int rows, int vocab);
/* Samples every row: logits fp32 [rows, ld] (device), params struct cuda_sampler_row [rows],
 * hist int32 (the ids the rows' offsets index), out struct cuda_sampler_result [rows], ws of
 * cuda_sampler_workspace() bytes. Asynchronous on the engine stream. -EINVAL for a shape the
 * kernel does not take (vocab > 524288, ld < vocab). */
int cuda_sampler_sample(struct gpu *g, gpu_ptr logits, int64_t ld, int rows, int vocab,
			gpu_ptr params, gpu_ptr hist, gpu_ptr out, gpu_ptr ws);
/* Flags of cuda_sampler_sample_flags (sampler.cu): */
#define CUDA_SAMPLER_FAST 1   /* parallel sums with an error bound; serial ones near a boundary */
#define CUDA_SAMPLER_VERIFY 2 /* with FAST: run both, diag[0] += disagreements, diag[1] +=
			       * fallbacks to the serial sums (diag: 2 uint64 on the device) */
/* cuda_sampler_sample with explicit flags (0: every sum serial, as sampler.c) and diag (may be
 * 0); cuda_sampler_sample uses CUDA_SAMPLER_FAST. */
int cuda_sampler_sample_flags(struct gpu *g, gpu_ptr logits, int64_t ld, int rows, int vocab,
			      gpu_ptr params, gpu_ptr hist, gpu_ptr out, gpu_ptr ws, int flags,
			      gpu_ptr diag);
/* bits[i] = sampler_bits(seed[i], index[i]) for i < n, on the device (the stream's test). */
int cuda_sampler_bits(struct gpu *g, gpu_ptr seed, gpu_ptr index, gpu_ptr bits, int n);
#endif

#endif
