/*
 * cpu_indexer.h — the lightning indexer (spec §3.6): per-token q/k/weights, index scores
 * over cached keys, and the top-k selection.
 *
 * Owns: one function per step of §3.6 (projection with rope-first slices, half-split RoPE,
 * Hadamard on q and k, FP8 act_quant, fp32 weights_proj with w' = w * H^-0.5 * s_q * D^-0.5,
 * ReLU-weighted scores times s_k, top-k with ties to the lower position). Must not: write
 * caches or choose which keys are causal-valid (the forward passes positions 0..pos).
 */
#ifndef DSV32_CPU_INDEXER_H
#define DSV32_CPU_INDEXER_H

#include <stdint.h>

#include "model/config.h"
#include "model/cpu_pool.h"
#include "model/weights.h"

/* Per-row indexer projections for T rows (H = index_n_heads, D = index_head_dim).
 * In:  a [T, hidden] (attn_norm output), c_q [T, q_lora_rank], pos [T], inv [rope/2]
 * Out: q [T, H, D] bf16 values after RoPE + Hadamard (pre-quant, for dumps),
 *      q8 [T, H, D] e4m3 codes, w [T, H] fp32 head weights w' (s_q folded in),
 *      k [T, D] bf16 values after LayerNorm + RoPE + Hadamard, k8 [T, D] codes, k_s [T] */
void indexer_project(struct cpu_pool *p, const struct dsv32_config *c,
		     const struct layer_weights *lw, const float *inv, const float *a,
		     const float *c_q, const int64_t *pos, int64_t T, float *q, uint8_t *q8,
		     float *w, float *k, uint8_t *k8, float *k_s);

/* I[s] = k_s[s] * sum_h ReLU(q8[h] . k8[s]) * w[h] for n keys (fp32 dots on e4m3 values).
 * q8: [H, D] codes of one query, w: [H], keys[s]: pointer to D codes, k_s: [n], scores: [n] */
void indexer_scores(struct cpu_pool *p, const struct dsv32_config *c, const uint8_t *q8,
		    const float *w, const uint8_t *const *keys, const float *k_s, int64_t n,
		    float *scores);

/* The k = min(k_max, n) highest scores, ties to the lower position, NaN lowest; writes the
 * selected positions sorted ascending into sel [k] and returns k. scores: [n] */
int64_t indexer_topk(const float *scores, int64_t n, int64_t k_max, int32_t *sel);

#endif
