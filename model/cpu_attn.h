/*
 * cpu_attn.h — sparse MLA attention of one query row over its selected cache rows
 * (spec §3.7), in both algebraically equal forms.
 *
 * The backend uses the absorbed form for every token (batch invariance: one path per token,
 * whatever the chunk size); the naive form is kept for tests that check the two agree at the
 * FP8 noise level and for comparisons with references that use it in prefill.
 *
 * Inputs of both: q [heads, qk_head_dim] per head [q_nope | q_pe post-RoPE] (bf16 values);
 * kv [n_sel, kv_lora_rank + qk_rope_head_dim], the selected keys' cache rows (c_kv dequantised
 * from FP8 | k_pe), in ascending position order, which is also the softmax and P.V summation
 * order. Output o [heads, v_head_dim] (bf16 values), the input of o_proj.
 * Must not: select keys (the indexer does) or touch pages (the forward gathers rows).
 */
#ifndef DSV32_CPU_ATTN_H
#define DSV32_CPU_ATTN_H

#include <stdint.h>

#include "model/config.h"
#include "model/cpu_pool.h"
#include "model/weights.h"

/* Absorbed / MQA form (§3.7b): q_lat = W_UK^T q_nope (bf16), scores = s_att (q_lat.c_kv +
 * q_pe.k_pe) in fp32, fp32 softmax, o_lat = P.c_kv (bf16), o = W_UV o_lat (bf16).
 * q_lat_out: [heads, kv_lora_rank] or NULL (for dumps). */
void attn_absorbed(struct cpu_pool *p, const struct dsv32_config *c,
		   const struct fp8_linear *wkv_b, const float *q, const float *kv, int64_t n_sel,
		   float *o, float *q_lat_out);

/* The latent core of the absorbed form for one head: scores = scale (q_lat.c_kv + q_pe.k_pe)
 * in fp32 (keys in the given order), fp32 softmax, o_lat = bf16(P.c_kv). The part the GPU's
 * sparse MLA decode kernel computes. q_lat [kv_lora_rank], q_pe [qk_rope_head_dim] (bf16
 * values), kv [n_sel, kv_lora_rank + qk_rope_head_dim], score [n_sel] scratch (ends as P),
 * o_lat [kv_lora_rank]. */
void attn_latent(const struct dsv32_config *c, const float *q_lat, const float *q_pe,
		 const float *kv, int64_t n_sel, float scale, float *score, float *o_lat);

/* Naive / MHA form (§3.7a): [k_nope | v] = FP8Linear_{kv_b_proj}(c_kv) per key (bf16),
 * scores = s_att (q_nope.k_nope + q_pe.k_pe) in fp32, fp32 softmax, o = P.v (bf16). */
void attn_naive(struct cpu_pool *p, const struct dsv32_config *c, const struct fp8_linear *wkv_b,
		const float *q, const float *kv, int64_t n_sel, float *o);

/* Softmax in place over n fp32 scores (max-subtracted, sequential sum). */
void attn_softmax(float *x, int64_t n);

#endif
