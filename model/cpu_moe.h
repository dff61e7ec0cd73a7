/*
 * cpu_moe.h — the feed-forward blocks: dense SwiGLU MLP (spec §3.8) and the MoE with its
 * sigmoid gate, group limit, routed experts and shared expert (spec §3.9).
 *
 * Owns: the routing rule (moe_route, a pure function of the fp32 logits so its tie rules are
 * tested directly) and the expert/shared accumulation order. Must not: norm its input or add
 * the residual (the forward does).
 */
#ifndef DSV32_CPU_MOE_H
#define DSV32_CPU_MOE_H

#include <stdint.h>

#include "model/config.h"
#include "model/cpu_pool.h"
#include "model/weights.h"

/* y = FP8Linear_{w2}( bf16( silu(FP8Linear_{w1}(x)) * FP8Linear_{w3}(x) ) ).
 * x: [T, w1.in], y: [T, w2.out] */
void mlp_forward(struct cpu_pool *p, const struct fp8_linear *w1, const struct fp8_linear *w3,
		 const struct fp8_linear *w2, const float *x, int64_t T, float *y);

/* Routing of one token (spec §3.9): sc = sigmoid(logits); sel = sc + bias (selection only);
 * if n_group > 1 keep the topk_group groups with the largest sum of their top-2 sel (ties to
 * the lower group id); pick num_experts_per_tok experts by sel (ties to the lower expert id);
 * weights = sc of the picks, renormalised if norm_topk_prob, times routed_scaling_factor.
 * logits, bias: [n_routed_experts]; out idx [k] ascending expert ids, wts [k] aligned. */
void moe_route(const struct dsv32_config *c, const float *logits, const float *bias,
	       int32_t *idx, float *wts);

/* The combine of the MoE block: y[t] = bf16( sum_n ex_out[t, n] * wts[t, n] (picks in ascending
 * expert id, fp32, one multiply and one add each) + sh[t] ). ex_out [T, K, D], wts [T, K],
 * sh [T, D] (bf16 values), y [T, D]. The GPU's k_moe_combine computes the same to the bit. */
void moe_combine(int64_t T, int64_t K, int64_t D, const float *ex_out, const float *wts,
		 const float *sh, float *y);

/* MoE block for T rows: y[t] = bf16( sum over picks in ascending expert id of
 * wts * Expert(f[t]) + Shared(f[t]) ), fp32 accumulation. f, y: [T, hidden];
 * idx, wts: [T, num_experts_per_tok] out (for dumps); logits: [T, n_routed_experts] out. */
void moe_forward(struct cpu_pool *p, const struct dsv32_config *c, const struct layer_weights *lw,
		 const float *f, int64_t T, float *y, int32_t *idx, float *wts, float *logits);

/* Expert parallelism (docs/MULTIGPU.md step 3): rank `rank` of `ranks` owns the routed experts
 * [e0, e1) = [E * rank / ranks, E * (rank + 1) / ranks) (contiguous; the ranks together own
 * each expert once) and, on rank 0, the shared expert. */
void moe_rank_experts(int64_t n_experts, int rank, int ranks, int64_t *e0, int64_t *e1);

/* One rank's share of the MoE block, given the routing every rank computes alike (idx, wts
 * [T, num_experts_per_tok] from moe_route): y_part[t] = the fp32 sum over token t's picks that
 * the rank owns, in ascending expert id, of wts * Expert(f[t]), plus Shared(f[t]) on rank 0;
 * not rounded. The block's output is bf16 of the sum of the ranks' shares (the all-reduce):
 * moe_forward's y up to the order of that fp32 sum, and with one rank its bits. f, y_part:
 * [T, hidden]. */
void moe_forward_rank(struct cpu_pool *p, const struct dsv32_config *c,
		      const struct layer_weights *lw, const float *f, int64_t T,
		      const int32_t *idx, const float *wts, int rank, int ranks, float *y_part);

#endif
