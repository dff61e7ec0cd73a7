/*
 * cpu_ops.h — the elementwise, normalisation and matmul ops of the CPU reference backend
 * (spec §2, §3.1, §3.2, §3.8, §5.3, §5.4), one function per op.
 *
 * Conventions of every op here:
 *   - activations are float arrays whose values are bf16-representable; an op that produces
 *     an activation rounds its result with bf16_round once, at its output (the op boundary);
 *     fp32-valued outputs (router logits, weights_proj, lm_head) say so;
 *   - every reduction runs in one fixed order (cpu_dot), and thread parallelism only splits
 *     independent outputs (matmul columns), so a row's numbers never depend on the other rows
 *     of the batch or on the thread count.
 * Must not: know about layers, caches or the step (cpu_forward.c composes the ops).
 */
#ifndef DSV32_CPU_OPS_H
#define DSV32_CPU_OPS_H

#include <stdint.h>

#include "model/cpu_pool.h"
#include "model/weights.h"

#define CPU_QBLOCK 128 /* act_quant group and weight block edge (spec §5) */

/* e4m3 code -> fp32 value, a 256-entry table. */
const float *cpu_e4m3_table(void);

/* The one fixed-order fp32 dot product: 8 lanes (lane j sums k = j mod 8 in order), then
 * ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). Every matmul and score in the backend uses it. */
float cpu_dot(const float *a, const float *b, int64_t n);
/* The same with bf16 weights decoded on the fly (exact, so the same bits as decoding first). */
float cpu_dot_bf16(const float *a, const uint16_t *w, int64_t n);

/* h[t] = E[tokens[t]] (bf16 rows, exact). h: [T, cols] */
void cpu_embed(const struct bf16_mat *E, const int32_t *tokens, int64_t T, float *h);

/* RMSNorm of an fp32 vector: out = bf16(w * x / sqrt(mean(x^2) + eps)). x, out: [n] */
void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);

/* Fused residual add + RMSNorm (spec §3.2): s = fp32(x) + fp32(r); out = RMSNorm(s);
 * r = bf16(s). x, r, out: [n]; out may alias x. */
void cpu_add_rmsnorm(float *out, const float *x, float *r, const float *w, int64_t n, float eps);

/* LayerNorm with bias (indexer k_norm, spec §3.6.3): mean-subtracted, biased variance,
 * fp32 math, bf16 out. x, out: [n] */
void cpu_layernorm(float *out, const float *x, const float *w, const float *b, int64_t n,
		   float eps);

/* act_quant (spec §5.3) of one row: groups of 128 along n. q: [n] e4m3 codes, s: [ceil(n/128)] */
void cpu_act_quant(const float *x, int64_t n, uint8_t *q, float *s);

/* FP8 linear (spec §5.4): y[t, o] = bf16( sum_kb (sum_{k in kb} x8[t,k] * W8[o,k]) * s_x[t,kb] *
 * S[o/128, kb] ), x quantised per row by cpu_act_quant. x: [T, in], y: [T, out] */
void cpu_fp8_linear(struct cpu_pool *p, const struct fp8_linear *W, const float *x, int64_t T,
		    float *y);

/* The factor a block of an FP8 weight is multiplied by: its weight_scale_inv (spec §5.2). */
float cpu_weight_scale(float scale_inv);

/* bf16-weight linear with fp32 inputs and accumulation. y: [T, rows]; round_bf16 = 1 rounds
 * the output to bf16 (eh_proj), 0 keeps fp32 (router, weights_proj, lm_head). x: [T, cols] */
void cpu_bf16_linear(struct cpu_pool *p, const struct bf16_mat *W, const float *x, int64_t T,
		     float *y, int round_bf16);

/* SwiGLU middle (spec §3.8): out = bf16( silu(g) * u ) in fp32. g, u, out: [n] */
void cpu_swiglu(float *out, const float *g, const float *u, int64_t n);

/* Sylvester Hadamard transform with scale n^-0.5, bf16 in/out (spec §3.6.4). x: [n], n a
 * power of two (128 in V3.2). */
void cpu_hadamard(float *x, int64_t n);

#endif
