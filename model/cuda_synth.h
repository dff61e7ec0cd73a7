/*
 * cuda_synth.h — synthetic weights made on the GPU (issue 12: real-dimension runs with no
 * checkpoint on disk). A header-only checkpoint (`mkmodel real --header-only`: every name,
 * dtype and shape, the small tensors written, the big ones left as file holes) gives the
 * tensor list; the CUDA backend uploads the small tensors and asks this file to generate the
 * big ones in place, with mkmodel's recipes (tools/mkmodel/gen.h; kernels_ptx/synth.cu).
 *
 * Also synthetic KV caches (kernels_ptx/synth_kv.cu): random latent, rope and indexer-key vectors
 * written through the real KV-write kernels, as if a prompt had been prefilled, so decode can be
 * benchmarked at long contexts without running the prefill.
 *
 * Owns: which tensors are generated (exactly the ones header-only leaves as holes: every
 * F8_E4M3 tensor and every 2-D BF16 matrix) and their recipe (fan-in = columns, 1 for
 * embeddings); the synthetic KV values and their host reference. Must not: allocate (the KV
 * fill takes its staging from the caller's scratch arena).
 */
#ifndef DSV32_CUDA_SYNTH_H
#define DSV32_CUDA_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "driver/gpu.h"
#include "model/config.h"
#include "model/safetensors.h"

/* 1 when t is generated rather than read (see above), else 0. */
int cuda_synth_generated(const struct st_tensor *t);

/* The synthetic KV values (host reference of kernels_ptx/synth_kv.cu, bit for bit).
 * kind: 0 = c_kv latent [kv_lora_rank], 1 = k_pe [qk_rope_head_dim], 2 = indexer key
 * [index_head_dim]. Element j of position pos is cuda_synth_kv_value(stream, pos * dim + j,
 * scale) with stream = cuda_synth_kv_stream(seed, layer, kind) and scale =
 * cuda_synth_kv_scale(kind); every kind has RMS ~1 (the latent after its RMSNorm, the indexer
 * key after LayerNorm and the orthonormal Hadamard, k_pe alike). */
#define CUDA_SYNTH_KV_RMS 1.0f
uint64_t cuda_synth_kv_stream(uint64_t seed, int64_t layer, int kind);
float cuda_synth_kv_scale(int kind);
uint16_t cuda_synth_kv_value(uint64_t stream, uint64_t i, float scale); /* bf16 bits */

#ifndef DSV32_NO_CUDA
/* Fills dst (t->nbytes on the device) with t's synthetic values on the engine stream, from
 * seed and t's name. 0, -EINVAL when t is not a generated tensor, or the launch error. */
int cuda_synth_tensor(struct gpu *g, gpu_ptr dst, const struct st_tensor *t, uint64_t seed);

/* Tokens per chunk of the KV fill (staging: chunk x (R + rope + index_head_dim) bf16 + slots);
 * halved until the staging fits what the arena has left. */
#define CUDA_SYNTH_KV_CHUNK 65536

/* Fills positions [0, n_tokens) of one sequence (block table bt: page bt[p / 64] holds
 * position p; ceil(n_tokens / 64) entries) in the pools of layers 0 .. n_layers-1 with
 * synthetic records written by the real KV-write kernels (k_kv_mla_write, k_kv_index_write):
 * layer l's MLA pool starts at mla_pool + l * mla_layer_bytes (pages of 64 records of
 * c->mla_record_bytes), its indexer pool at idx_pool + l * idx_layer_bytes (pages of
 * kv_index_page_bytes(c)). Only those slots are written. Staging comes from scratch (released
 * before returning), CUDA_SYNTH_KV_CHUNK tokens at a time; the work is queued on the engine
 * stream (not synchronised). 0; -EINVAL (n_tokens < 1, a page id outside the pools); -ENOMEM
 * (scratch cannot hold a 64-token chunk); or the launch error. */
int cuda_synth_kv_fill(struct gpu *g, const struct dsv32_config *c, gpu_ptr mla_pool,
		       size_t mla_layer_bytes, gpu_ptr idx_pool, size_t idx_layer_bytes, int n_layers,
		       const int32_t *bt, int64_t n_tokens, uint64_t seed, struct gpu_arena *scratch);
#endif

#endif
