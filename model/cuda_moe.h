/*
 * cuda_moe.h — the MoE block on the GPU (spec §3.9): the sigmoid gate with its group limit,
 * the token permutation by expert, the grouped FP8 expert GEMMs (gate and up fused), SwiGLU,
 * the down projection, the shared expert and the weighted combine — the numbers of the CPU's
 * moe_forward (model/cpu_moe.h): the same experts for the same logits, weights within fp32
 * rounding, the output within bf16/FP8 rounding.
 *
 * Weight layout on the device (the CUDA backend places the tensors so): each expert's
 * gate_proj and up_proj are adjacent, forming one fused matrix W13 e4m3 [2 * moe_inter, hidden]
 * (gate rows first) with one scale matrix [2 * moe_inter / 128, hidden / 128]; the shared
 * expert likewise, of the same width (n_shared_experts == 1: it runs as one more group of the
 * routed experts' grouped GEMMs).
 * Owns: the per-layer device tables of expert addresses, the block's scratch (from the caller's
 * arena, released before return). Must not: norm its input or add the residual.
 */
#ifndef DSV32_CUDA_MOE_H
#define DSV32_CUDA_MOE_H

#include "driver/gpu.h"
#include "model/config.h"
#include "model/err.h"

#ifndef DSV32_NO_CUDA
/* A device FP8 weight [out, in] e4m3 with its fp32 block scales [out/128, in/128]. */
struct cuda_fp8_mat {
	gpu_ptr w, s;
	int out, in;
};

/* One MoE layer's device tensors. */
struct cuda_moe_layer {
	gpu_ptr gate;            /* bf16 [n_routed_experts, hidden] mlp.gate.weight */
	gpu_ptr gate_bias;       /* fp32 [n_routed_experts] e_score_correction_bias */
	/* device uint64 [E + 1]: expert e's fused gate|up and its scales, down_proj [hidden, inter]
	 * and its scales; entry E: the shared expert's */
	gpu_ptr w13_tab, s13_tab;
	gpu_ptr w2_tab, s2_tab;
	struct cuda_fp8_mat sh13, sh2; /* shared expert: fused gate|up, down */
	/* expert parallelism (cuda_moe_layer_init_rank): this layer is rank `rank` of `ranks`, its
	 * tables list experts [e0, e0 + n_own) then the shared expert (entry n_own); ranks 1: all
	 * E experts, entry E the shared expert */
	int rank, ranks, e0, n_own;
};

/* Builds L: allocates and fills the address tables in region r (the weights region).
 * w13[e], s13[e], w2[e], s2[e]: device addresses of expert e's tensors (host arrays [E]).
 * -EINVAL unless the shared expert has the routed experts' shape (sh13 [2 * moe_inter, hidden],
 * sh2 [hidden, moe_inter]). */
int cuda_moe_layer_init(struct gpu *g, struct gpu_region *r, const struct dsv32_config *c,
			gpu_ptr gate, gpu_ptr gate_bias, const gpu_ptr *w13, const gpu_ptr *s13,
			const gpu_ptr *w2, const gpu_ptr *s2, struct cuda_fp8_mat sh13,
			struct cuda_fp8_mat sh2, struct cuda_moe_layer *L, struct err *e);

/* The same for rank `rank` of `ranks` under expert parallelism (docs/MULTIGPU.md step 3): the
 * rank owns experts [e0, e1) of moe_rank_experts (model/cpu_moe.h) and rank 0 the shared expert;
 * w13, s13, w2, s2 list the owned experts' tensors only (host arrays [e1 - e0]; index 0 is expert
 * e0); sh13 / sh2 are used on rank 0 only (others may pass zero addresses of the right shape).
 * -EINVAL also for a rank outside [0, ranks), ranks < 1 or > E, or K + e1 - e0 > 256 (the
 * permutation's experts). cuda_moe_layer_init is rank 0 of 1. */
int cuda_moe_layer_init_rank(struct gpu *g, struct gpu_region *r, const struct dsv32_config *c,
			     gpu_ptr gate, gpu_ptr gate_bias, const gpu_ptr *w13, const gpu_ptr *s13,
			     const gpu_ptr *w2, const gpu_ptr *s2, struct cuda_fp8_mat sh13,
			     struct cuda_fp8_mat sh2, int rank, int ranks, struct cuda_moe_layer *L,
			     struct err *e);

/* Device buffers that receive the routing of the T rows, for dumps and tests (any may be 0). */
struct cuda_moe_trace {
	gpu_ptr logits; /* fp32 [T, n_routed_experts] */
	gpu_ptr idx;    /* int32 [T, num_experts_per_tok], ascending expert ids */
	gpu_ptr wts;    /* fp32 [T, num_experts_per_tok] */
};

/* Bytes of arena scratch cuda_moe_forward needs for T rows (the caller sizes its arena). */
size_t cuda_moe_scratch_bytes(const struct gpu *g, const struct dsv32_config *c, int T);

/* y[T, hidden] (bf16) = MoE(x) for the ffn-normed input x[T, hidden] (bf16): routed experts
 * and the shared expert, combined like moe_combine. Everything on the engine stream, no host
 * synchronisation (graph-capturable). trace may be NULL. flags: CUDA_MOE_UNFUSED or 0. 0 or a
 * negative errno. The mode (fast or batch-invariant) is the GEMM dispatch's
 * (cuda_gemm_set_batch_invariant).
 * Numerics: up to 64 tokens the grouped GEMMs are cuda_gemm_fp8_grouped's (model/cuda_gemm.h):
 * in the batch-invariant mode its exact kernels (each row's output the CPU's whatever T), in the
 * fast mode its wgmma consumers; above 64 tokens the wgmma kernels, within wgmma's accumulation
 * limit. The router logits are the CPU's bits but in the fast mode (the GEMM dispatch's,
 * cuda_gemm_set_batch_invariant(g, 0)) above 64 tokens and, on the real routing shape, from 17
 * (cuda_moe_set_gate_ks), where the tensor cores sum the same products in another fp32 order,
 * and at 1-16 tokens (cuda_moe_set_router, cuda_moe_set_router_t), where E / 2 blocks sum them
 * in another order; the experts are the CPU's routing of the logits either way.
 * CUDA_MOE_UNFUSED (the forward's DSV32_CUDA_UNFUSED=1, a diagnosis switch): the separate
 * kernels instead of the fused router, quantise-and-scatter, SwiGLU epilogues and combine in the
 * chunk sums (model/cuda_moe.c): the same bits. */
enum { CUDA_MOE_UNFUSED = 1 << 16 };
int cuda_moe_forward(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
		     const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y, int T,
		     const struct cuda_moe_trace *trace, unsigned flags);

/* One rank's share of the block under expert parallelism (L from cuda_moe_layer_init_rank with
 * ranks > 1): y_part fp32 [T, hidden] = the weighted outputs of the picks whose experts the rank
 * owns, summed in pick order, + the shared expert's output on rank 0, not rounded: the CPU's
 * moe_forward_rank. Every rank computes the same routing (the router is replicated, the same
 * kernels as cuda_moe_forward's; the one-launch block of 1-3 tokens does not run here, the
 * separate GEMM, SwiGLU and combine launches do); the rank's grouped GEMMs run only its own
 * experts' rows (the other ranks' picks are sorted before them and belong to no group). The sum
 * of every rank's share, rounded to bf16, is cuda_moe_forward's y up to the order of that sum
 * (an all-reduce's). trace and flags as cuda_moe_forward's (trace->idx: the routing over all E
 * experts). -EINVAL for a layer of one rank. */
int cuda_moe_forward_rank(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
			  const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y_part, int T,
			  const struct cuda_moe_trace *trace, unsigned flags);

/* The fast mode's one-token router: mode 1 (the default) the logits over E / 2 blocks in another
 * fp32 order (k_moe_gate_route1s), 0 the CPU's order over E / 8 blocks (k_moe_gate_route1, the
 * batch-invariant mode's in every case); 5 (an A/B) mode 1 in two launches (model/cuda_moe.c).
 * Process-wide; DSV32_CUDA_MOE_ROUTER=m, read at the first call, sets it; a forward switch
 * (bench model --ab DSV32_CUDA_MOE_ROUTER=0). */
void cuda_moe_set_router(int mode);

/* The fast mode's router of 2 .. 16 tokens: on 1 (the default) one launch (k_moe_gate_route_t:
 * the one-token router's logits for each token, then the routing and the permutation in its last
 * block), 0 the separate logits, route and permute kernels. Process-wide;
 * DSV32_CUDA_MOE_ROUTER_T=n, read at the first call, sets it; a forward switch. */
void cuda_moe_set_router_t(int on);

/* The fast mode's router from 17 tokens (E = 256 in 8 groups, hidden % 256 == 0): on 1 (the
 * default) the logits in parts of K with all the experts in a block (k_moe_gate_logits_ks: 4
 * parts above 64 tokens, parts of 256 columns at 17-64), routed on their sum
 * (k_moe_route_wsum); 0 the 64-expert tiles over all of K (k_moe_gate_logits_mma) above 64
 * tokens and the exact kernels (the CPU's order) at 17-64, then k_moe_route_w. Either way the
 * logits do not depend on T within each range. Process-wide; DSV32_CUDA_MOE_GATE_KS=n, read at
 * the first call, sets it; a forward switch. */
void cuda_moe_set_gate_ks(int on);

/* The shared expert at prefill sizes (the token-wide path: T > 64): on 1, its two GEMMs on the
 * dense dispatch (cuda_gemm_fp8: at these M the wgmma kernel or cuBLASLt) after the grouped
 * GEMMs of the routed experts alone; off 0, group E of those grouped GEMMs. Process-wide;
 * DSV32_CUDA_MOE_SHARED_DENSE=n, read at the first call, sets it (default 1). */
void cuda_moe_set_shared_dense(int on);

/* k_moe_swiglu_quant's silu (the same bits either way): mode 1 from a table each block makes
 * once in shared memory (a grid of 4 blocks an SM), 0 computed (one pair of groups a warp), 2
 * (the default) the table from 2048 rows. Process-wide; DSV32_CUDA_MOE_SWIGLU_TABLE=m, read at
 * the first call, sets it. */
void cuda_moe_set_swiglu_table(int mode);

/* k_moe_swiglu_quant's launch for rows x I (the MoE block's and the dense MLP's): its grid and
 * its `table` argument, by the mode above. */
void cuda_moe_swiglu_grid(const struct gpu *g, int rows, int I, unsigned *blocks, int *table);

/* Which kernels cuda_moe_forward runs for T rows with these flags (router; grouped GEMMs), in
 * words, for benchmarks (a static buffer). */
const char *cuda_moe_path(const struct gpu *g, const struct dsv32_config *c, int T,
			  unsigned flags);

/* The block's stages, for benchmarks (cuda_moe_forward runs them all, in this order). */
enum {
	CUDA_MOE_GATE = 1,     /* router logits (1 token, E = 256: with ROUTE, PERMUTE, GATHER) */
	CUDA_MOE_ROUTE = 256,  /* routing: experts and weights from the logits */
	CUDA_MOE_PERMUTE = 2,  /* rows by expert (counts, offsets, permutation) */
	CUDA_MOE_GATHER = 128, /* act_quant of x, the rows gathered in expert order */
	CUDA_MOE_W13 = 4,      /* grouped GEMM, fused gate|up (routed experts and the shared one) */
	CUDA_MOE_SWIGLU = 8,   /* SwiGLU + act_quant of the routed and shared rows */
	CUDA_MOE_W2 = 16,      /* grouped GEMM, down_proj (routed experts and the shared one) */
	CUDA_MOE_COMBINE = 64, /* weighted sum into y */
	CUDA_MOE_ALL = 511,
};
/* For tests: device buffers that receive copies of the block's intermediates (any may be 0).
 * Rows "sorted": the T * num_experts_per_tok routed rows by expert, within one in token order. */
struct cuda_moe_taps {
	gpu_ptr gu; /* bf16 [sorted rows, 2 * moe_inter]: the routed gate|up outputs (not written
		     * where SwiGLU is fused into the first GEMM, see cuda_moe.c) */
	gpu_ptr ey; /* bf16 [sorted rows, hidden]: the routed experts' outputs (when ey or sh is
		     * given, the down GEMM keeps the combine apart so they exist) */
	gpu_ptr sh; /* bf16 [T, hidden]: the shared expert's output */
};
/* cuda_moe_forward running only the stages in `stages` (which may include CUDA_MOE_UNFUSED),
 * copying intermediates to taps (may be NULL). The scratch is pushed in a fixed order, so with
 * the same arena mark and T a skipped stage's outputs are what the previous call left (for
 * benchmarks: time one stage on the data of a full run). */
int cuda_moe_forward_stages(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
			    const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y, int T,
			    const struct cuda_moe_trace *trace, const struct cuda_moe_taps *taps,
			    unsigned stages);
#endif

#endif
