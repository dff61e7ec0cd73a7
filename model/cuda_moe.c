/*
 * cuda_moe.c — the MoE block on the GPU (see cuda_moe.h).
 *
 * The flow for T rows, R = T * num_experts_per_tok routed rows, all on the engine stream with
 * grids sized from host bounds (the per-expert counts never leave the device):
 *   k_moe_gate_logits_* (fp32 logits, the CPU's summation order; in the fast mode above 64 tokens
 *   the same products summed on the tensor cores: on the real routing shape in 4 parts of K,
 *   k_moe_gate_logits_ks, routed on their sum by k_moe_route_wsum (gate_ks), else
 *   k_moe_gate_logits_mma) -> k_moe_route* (experts, weights)
 *   -> k_moe_permute (rows by expert, token order within an expert; offsets[E + 1] = R + T; from
 *   PERM_PAR_FROM tokens over many blocks: k_moe_permute_count, k_moe_permute_place);
 *   for one token of the real routing shape these three are one launch (k_moe_gate_route1,
 *   which also writes the quantised rows below: they are all x[0]'s; in the fast mode
 *   k_moe_gate_route1s, the same over E / 2 blocks with the logits summed in another order)
 *   -> the quantised rows: the R routed rows in sorted order, then the T rows of x itself for
 *      the shared expert (rows R .. R+T-1): k_moe_quant_scatter (each x row quantised once into
 *      row R + t and copied to its K sorted rows; with CUDA_MOE_UNFUSED k_act_quant of x into
 *      rows R.. then k_moe_gather_q of the routed rows from there: the same bytes)
 *   -> grouped FP8 GEMM over E + 1 groups, the fused gate|up weights (N = 2 * moe_inter): group
 *      e < E is routed expert e, group E the shared expert on rows R .. R+T-1 (its weights are
 *      entry E of the address tables), so both run in one launch; at prefill sizes (above 64
 *      tokens) on the token-wide grouped form (cuda_gemm_fp8_tw_grouped: 256 weight rows x up
 *      to 144 of an expert's rows an item, so an expert's weight tile is read once, not once
 *      per 128 rows; DSV32_CUDA_WGMMA_TW=0: the 128-token tile form with SwiGLU fused, below)
 *      over the E routed groups only, the shared expert's rows then by the dense dispatch
 *      (cuda_gemm_fp8; cuda_moe_set_shared_dense)
 *   -> k_moe_swiglu_quant (bf16 of silu(g) * u, then act_quant) over the R + T rows; with
 *      DSV32_CUDA_WGMMA_TW=0 the wgmma gate|up GEMM does this in its epilogue
 *      (cuda_gemm_fp8_wgmma_grouped_swiglu: the same bits), and on the streaming kernel (decode
 *      sizes) its K-chunk sum does (cuda_gemm_fp8_grouped_swiglu, where it can: the same
 *      bits); gu is then never written (a bench stage SWIGLU timed alone runs the separate
 *      kernel)
 *   -> grouped FP8 GEMM down_proj over the same groups (at prefill sizes on the token-wide form;
 *      the shared expert's likewise on the dense dispatch)
 *   -> k_moe_combine_v8 (bit-identical to the CPU's moe_combine; the shared output is rows R..);
 *      on the streaming kernel the down GEMM's K-chunk sum does it where it can
 *      (cuda_gemm_fp8_grouped_combine: the same bits; a bench stage COMBINE timed alone runs
 *      the separate kernel).
 *   At 1-3 tokens in the fast mode (both GEMMs on the one-row kernel) the two GEMMs, the SwiGLU
 *   and the combine are one launch, k_moe_gemv_block (cuda_gemm_fp8_moe_block: a persistent
 *   grid meeting at grid-wide arrivals; the same bits; DSV32_CUDA_MOE_GEMV_BLOCK=0: the four);
 *   at one token on the fast router that launch also routes: the router is k_moe_gate_logits1s
 *   (k_moe_gate_route1s without its last block's routing) and each block of k_moe_gemv_block
 *   selects from the scores (the same numbers; DSV32_CUDA_MOE_BLOCK_ROUTE=0: route1s routes);
 *   with DSV32_CUDA_MOE_BLOCK_EARLY=1 on k_moe_gemv_block_r1, whose blocks stream and compute
 *   the shared expert's gate|up while the router runs (the router flags x complete; the same
 *   bits).
 * Every rounding is the CPU's (mlp_forward): each GEMM output is bf16, SwiGLU rounds to bf16,
 * act_quant as in cpu_fp8_linear. The shared expert's rows are the same function as a routed
 * expert's (same shapes: n_shared_experts == 1), so it is one more group.
 * The expert GEMMs are model/cuda_gemm.c's cuda_gemm_fp8_grouped (the decode kernel or wgmma by
 * size).
 * DSV32_CUDA_MOE_STATS=n (diagnosis, eager steps only: it synchronises): the first n calls print
 * the routing's row counts per expert and the GPU time of each stage to stderr.
 * Expert parallelism (cuda_moe_forward_rank, docs/MULTIGPU.md step 3): a rank's layer lists only
 * its experts [e0, e0 + own) and the shared expert (cuda_moe_layer_init_rank). The routing runs
 * as above (every rank computes the same), then k_moe_rank_picks gives
 * the rank's view of the picks: its own experts as K + (e - e0), every other pick n of a token as
 * n, so k_moe_permute (over K + own experts) sorts the other ranks' picks first, as K groups, and
 * offsets + K are the grouped GEMMs' offsets over the rank's experts then the shared expert
 * (empty on ranks other than 0: its end is set to R); the rows before offsets[K] belong to no
 * group, so no GEMM reads or writes them. k_moe_combine_rank sums the picks whose sorted row is
 * at or past offsets[K] (+ the shared expert's row on rank 0) in fp32, unrounded. The fused
 * routers' own permutation is redone so; not on this path: the one-launch block and the combine
 * in the down GEMM's chunk sum.
 * CUDA_MOE_UNFUSED (the caller's flag: the forward's DSV32_CUDA_UNFUSED=1): the separate kernels
 * instead of the fused router (k_moe_gate_route1), the quantise-and-scatter, the SwiGLU epilogues
 * and the combine in the chunk sum (the same bits; but for the fast mode's one-token router,
 * k_moe_gate_route1s, whose logits the separate kernels sum in the CPU's order).
 */
#include "model/cuda_moe.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/cpu_moe.h" /* moe_rank_experts */
#include "model/cuda_gemm.h"
#include "model/cuda_gemm_wgmma.h"
#include "model/env_knob.h"

int cuda_moe_layer_init_rank(struct gpu *g, struct gpu_region *r, const struct dsv32_config *c,
			     gpu_ptr gate, gpu_ptr gate_bias, const gpu_ptr *w13, const gpu_ptr *s13,
			     const gpu_ptr *w2, const gpu_ptr *s2, struct cuda_fp8_mat sh13,
			     struct cuda_fp8_mat sh2, int rank, int ranks, struct cuda_moe_layer *L,
			     struct err *e)
{
	int E = (int)c->n_routed_experts, I = (int)c->moe_intermediate_size;
	if (E < 2 || E > 256 || E % 2 || c->hidden_size % 128 || I % 128 ||
	    c->num_experts_per_tok < 1 || c->num_experts_per_tok > 32 || c->n_group < 1 ||
	    E % c->n_group || sh13.out != 2 * I || sh13.in != c->hidden_size ||
	    sh2.out != c->hidden_size || sh2.in != I) {
		return err_set(e, -EINVAL,
			       "cuda_moe_layer_init: unsupported MoE shape (E %d, hidden %lld, inter %d, "
			       "shared expert %d x %d; one shared expert of the routed width)",
			       E, (long long)c->hidden_size, I, sh13.out, sh13.in);
	}
	if (ranks < 1 || ranks > E || rank < 0 || rank >= ranks)
		return err_set(e, -EINVAL, "cuda_moe_layer_init: rank %d of %d (1 to %d ranks)", rank,
			       ranks, E);
	int64_t e0, e1;
	moe_rank_experts(E, rank, ranks, &e0, &e1);
	const int own = (int)(e1 - e0);
	/* the rank's permutation sorts over K + own virtual experts (k_moe_rank_picks) */
	if (ranks > 1 && c->num_experts_per_tok + own > 256)
		return err_set(e, -EINVAL,
			       "cuda_moe_layer_init: rank %d of %d owns %d experts; with %lld picks a "
			       "token that is more than the permutation's 256",
			       rank, ranks, own, (long long)c->num_experts_per_tok);
	/* entry `own` of each table: the shared expert (the last group of the grouped GEMMs) */
	size_t tab = (size_t)(own + 1) * sizeof(uint64_t);
	*L = (struct cuda_moe_layer){.gate = gate, .gate_bias = gate_bias, .sh13 = sh13, .sh2 = sh2,
				     .rank = rank, .ranks = ranks, .e0 = (int)e0, .n_own = own};
	L->w13_tab = gpu_region_alloc(r, tab);
	L->s13_tab = gpu_region_alloc(r, tab);
	L->w2_tab = gpu_region_alloc(r, tab);
	L->s2_tab = gpu_region_alloc(r, tab);
	if (!L->w13_tab || !L->s13_tab || !L->w2_tab || !L->s2_tab)
		return err_set(e, -ENOMEM, "cuda_moe_layer_init: region %s full", r->name);
	uint64_t *h = malloc(tab);
	if (!h)
		return err_set(e, -ENOMEM, "cuda_moe_layer_init: out of memory");
	const gpu_ptr *src[4] = {w13, s13, w2, s2};
	const gpu_ptr shared[4] = {sh13.w, sh13.s, sh2.w, sh2.s};
	gpu_ptr dst[4] = {L->w13_tab, L->s13_tab, L->w2_tab, L->s2_tab};
	int rc = 0;
	for (int k = 0; k < 4 && !rc; k++) {
		for (int x = 0; x < own; x++)
			h[x] = src[k][x];
		h[own] = shared[k];
		rc = gpu_upload(g, dst[k], h, tab);
	}
	free(h);
	return rc ? err_set(e, rc, "cuda_moe_layer_init: upload of the expert tables failed (%d)", rc)
		  : 0;
}

int cuda_moe_layer_init(struct gpu *g, struct gpu_region *r, const struct dsv32_config *c,
			gpu_ptr gate, gpu_ptr gate_bias, const gpu_ptr *w13, const gpu_ptr *s13,
			const gpu_ptr *w2, const gpu_ptr *s2, struct cuda_fp8_mat sh13,
			struct cuda_fp8_mat sh2, struct cuda_moe_layer *L, struct err *e)
{
	return cuda_moe_layer_init_rank(g, r, c, gate, gate_bias, w13, s13, w2, s2, sh13, sh2, 0, 1,
					L, e);
}

/* The shapes of one call: R routed rows, then the T shared-expert rows (RT = R + T in all). */
struct moe_dims {
	int T, R, RT, D, I, E, K;
	int unfused; /* CUDA_MOE_UNFUSED */
	int fast;    /* the GEMM dispatch's fast mode (!cuda_gemm_batch_invariant) */
	/* expert parallelism (cuda_moe_forward_rank): ep 1 for a rank's share; the rank, its first
	 * expert and how many it owns (E when ep is 0) */
	int ep, rank, e0, own;
};

static struct moe_dims moe_dims(const struct gpu *g, const struct dsv32_config *c, int T,
				unsigned flags)
{
	struct moe_dims d = {.T = T, .D = (int)c->hidden_size, .I = (int)c->moe_intermediate_size,
			     .E = (int)c->n_routed_experts, .K = (int)c->num_experts_per_tok,
			     .unfused = !!(flags & CUDA_MOE_UNFUSED),
			     .fast = !cuda_gemm_batch_invariant(g)};
	d.R = T * d.K;
	d.RT = d.R + T;
	d.own = d.E;
	return d;
}

/* Decode sizes (T <= 64) in the fast mode on the token-wide grouped GEMMs (cuda_gemm_fp8_tw_grouped:
 * the weights as wgmma's A, each expert's rows as N, the whole of K an item, so no K chunks, no
 * partials, no chunk-sum launch) from MOE_TW_FROM tokens, where the dims allow it (tw_decode;
 * CUDA_MOE_UNFUSED: the wgmma tile form, the same bits). s11-8 (bench moe --trials 5,
 * graph-replayed block, two runs): 8 / 16 / 32 / 64 tokens 656 / 1,133 / 1,701 / 2,370 us (3.97 /
 * 4.16 / 4.20 / 4.22 TB/s of touched weights) against the streaming kernel's 722-726 /
 * 1,286-1,296 / 2,053-2,059 / 3,058-3,115 (3.59 / 3.65 / 3.47 / 3.24); s11-10: at 1 / 2 / 4
 * tokens 162.7 / 253.9 / 400.9 us against 121.0 / 226.3 / 408.0. The batch-invariant mode keeps
 * the streaming kernel's exact consumers. */
#define MOE_TW_FROM 4

static int tw_decode(const struct moe_dims *d)
{
	return d->fast && d->T >= MOE_TW_FROM && d->T <= 64 && d->D % 256 == 0 &&
	       (2 * d->I) % 256 == 0 && cuda_gemm_wgmma_tw();
}

/* Whether the grouped GEMMs run on the wgmma kernel (then the gate|up GEMM has SwiGLU and
 * act_quant fused) rather than cuda_gemm_fp8_grouped's choice (the streaming kernel, whose chunk
 * sums do SwiGLU and the combine; its exact consumers in the batch-invariant mode, its wgmma
 * consumers in the fast mode): above 64 tokens, and at decode sizes in the fast mode on the
 * token-wide form (tw_decode). Run 12 (engineer G, bench gemm --grouped, fast
 * mode, TB/s of touched weights, streaming kernel with wgmma consumers vs the wgmma grouped
 * kernel): gate|up at 1 / 16 / 64 / 256 tokens 3.49 / 3.72 / 3.59 / 3.39 vs 2.01 / 2.92 / 3.38 /
 * 3.43, down 3.02 / 3.65 / 3.56 / 3.30 vs 1.59 / 2.82 / 3.37 / 3.50 — so the fast mode no longer
 * sends 8-64 tokens to wgmma (run 9-12 did). Earlier: run 8 bench moe T = 128 / 256: 4.97 / 6.64
 * ms on the exact decode kernel, 2.81 / 3.28 on wgmma. (Run 7's prefill ran passes of ~1000
 * rows on the decode kernel: 15 ms a layer.)
 * DSV32_CUDA_MOE_WGMMA=n (diagnosis, read once; n >= 1): wgmma from n tokens on instead, in
 * either mode. */
static int use_wgmma(const struct moe_dims *d)
{
	static int from_env = -1;
	const int from = env_uint(&from_env, "DSV32_CUDA_MOE_WGMMA");
	if (d->D % 64)
		return 0;
	if (from > 0)
		return d->T >= from;
	return d->T > 64 || tw_decode(d);
}

/* Whether the prefill-size gate|up GEMM runs on the token-wide grouped form (then unfused:
 * k_moe_swiglu_quant after it; cuda_gemm_wgmma_tw), and the down GEMM too (runs 38-39 of
 * session 8, bench moe: 1,141-1,189 us against the tile form's 1,301-1,318 at 2048 tokens,
 * 986-1,139 against 1,150-1,165 at 512; at 4096 it was the tile form's equal until the
 * products' form: run 37 (session 9), graph-replayed block 5,114 / 5,111 us with the down GEMM
 * token-wide against 5,211 / 5,248 on tiles, w2 1,796 / 1,788 against 1,849 / 1,838). */
static int use_tw(const struct moe_dims *d)
{
	return use_wgmma(d) && !d->unfused && (2 * d->I) % 256 == 0 && cuda_gemm_wgmma_tw();
}

/* cuda_moe_set_shared_dense. Run 36b (bench moe --trials 5, in-process A/B twice, graph-replayed
 * block): 4096 tokens 5,252 / 5,208 us against 5,287 / 5,231 as group E; 2048 3,500 / 3,495
 * against 3,549 / 3,546; 512 2,849 / 2,853 against 2,879 / 2,882 (-0.6 .. -1.5%). Above 64
 * tokens only: at decode sizes the shared expert stays group E of the token-wide GEMMs (s11-10:
 * 16 / 64 tokens 1,121.9 / 2,382.7 us against 1,137.9 / 2,390.7 on the dense dispatch; and the
 * separate kernels' tile form then gives the same bits). */
static int shared_dense = -1;

void cuda_moe_set_shared_dense(int on)
{
	shared_dense = on != 0;
}

static int use_shared_dense(const struct moe_dims *d)
{
	if (shared_dense < 0)
		cuda_moe_set_shared_dense(env_int("DSV32_CUDA_MOE_SHARED_DENSE", 1));
	return shared_dense && use_tw(d) && d->T > 64;
}

static int use_tw_down(const struct moe_dims *d)
{
	return use_tw(d) && d->D % 256 == 0;
}

/* Workspace of the grouped GEMMs (one buffer, used by one GEMM at a time): the streaming
 * kernel's K-chunk partials (~590 KB a token at V3.2's shapes; none on wgmma, whose smaller
 * scratch lets the forward's passes hold more rows). */
static size_t gemm_ws(const struct gpu *g, const struct moe_dims *d)
{
	size_t a = 0, b = 0;
	if (use_shared_dense(d)) { /* the shared expert's dense GEMMs (cuBLASLt's scales, ...) */
		a = cuda_gemm_fp8_workspace(g, d->T, 2 * d->I, d->D);
		b = cuda_gemm_fp8_workspace(g, d->T, d->D, d->I);
	} else if (!use_wgmma(d)) {
		a = cuda_gemm_fp8_grouped_workspace(g, d->RT, d->E + 1, 2 * d->I, d->D);
		b = cuda_gemm_fp8_grouped_workspace(g, d->RT, d->E + 1, d->D, d->I);
	}
	/* both at once where cuda_gemm_fp8_moe_block runs (1-3 tokens on the one-row kernel: the
	 * two GEMMs' fp32 sums apart) */
	size_t m = d->T <= 3 && !use_wgmma(d) ? a + b + 256 : a > b ? a : b;
	return m > 256 ? m : 256;
}

/* The scratch buffers, in push order; sizes in bytes. The row buffers hold R + T rows: the
 * routed rows in sorted order, then the shared expert's (x itself). */
enum { B_LOGITS, B_IDX, B_WTS, B_CNT, B_OFF, B_PERM, B_SRC, B_XS8, B_SXS, B_GU, B_H8, B_HS, B_EY,
       B_WS, B_BCNT, B_SCORE, B_GPARTS, B_RIDX, B_COUNT };

/* The permutation over many blocks (k_moe_permute_count + _place, PERM_TOKENS = 128 tokens a
 * block) above this many tokens; below, k_moe_permute on one block (run 10: 67 us at 4096
 * tokens, 24 at 1024, 13 at 512). */
#define PERM_PAR_FROM 512
#define ROUTE_T_MAX 16 /* k_moe_gate_route_t's most tokens (GRT_MAXT, moe_block.cu) */
#define PERM_TOKENS 128
/* k_moe_gate_logits_ks's parts of K (moe_gate_mma.cu): 4 above 64 tokens; at 17-64 tokens one a
 * 256 columns (28 at V3.2's hidden size: blocks for the GPU where one token tile is all) */
#define GK_PARTS 4
#define GK_DECODE_COLS 256
static int gate_parts(const struct moe_dims *d)
{
	return d->T > 64 ? GK_PARTS : d->D / GK_DECODE_COLS;
}

static void scratch_sizes(const struct gpu *g, const struct moe_dims *d, size_t *sz)
{
	size_t T = (size_t)d->T, R = (size_t)d->R, RT = (size_t)d->RT, D = (size_t)d->D,
	       I = (size_t)d->I;
	sz[B_LOGITS] = T * d->E * 4;
	sz[B_IDX] = R * 4;
	sz[B_WTS] = R * 4;
	/* counts and offsets of the permutation's experts: E, or under ep K + own (<= E + K) */
	sz[B_CNT] = ((size_t)d->E + d->K) * 4;
	sz[B_OFF] = ((size_t)d->E + d->K + 2) * 4;
	sz[B_PERM] = R * 4;
	sz[B_SRC] = R * 4;
	sz[B_XS8] = RT * D;
	sz[B_SXS] = RT * (D / 128) * 4;
	sz[B_GU] = RT * 2 * I * 2;
	sz[B_H8] = RT * I;
	sz[B_HS] = RT * (I / 128) * 4;
	sz[B_EY] = RT * D * 2;
	sz[B_WS] = gemm_ws(g, d);
	sz[B_BCNT] = ((T + PERM_TOKENS - 1) / PERM_TOKENS) * ((size_t)d->E + d->K) * 4;
	/* the fused routers' scores, [2][E] a token (k_moe_gate_route1 / _route_t) */
	sz[B_SCORE] = (size_t)2 * d->E * 4 * (T < ROUTE_T_MAX ? (T > 1 ? T : 1) : ROUTE_T_MAX);
	/* k_moe_gate_logits_ks's parts of the logits (gate_ks) */
	sz[B_GPARTS] = d->fast && T > 16 && gate_parts(d) > 0 ? (size_t)gate_parts(d) * T * d->E * 4
							      : 256;
	sz[B_RIDX] = R * 4; /* k_moe_rank_picks's picks (ep) */
}

size_t cuda_moe_scratch_bytes(const struct gpu *g, const struct dsv32_config *c, int T)
{
	/* the larger of the two modes' (their GEMMs' workspaces differ at decode sizes) */
	size_t most = 0;
	for (int fast = 0; fast < 2; fast++) {
		struct moe_dims d = moe_dims(g, c, T, 0);
		d.fast = fast;
		size_t sz[B_COUNT], total = 256;
		scratch_sizes(g, &d, sz);
		for (int i = 0; i < B_COUNT; i++)
			total += (sz[i] + 255) / 256 * 256;
		most = total > most ? total : most;
	}
	return most;
}

/* The router-logit kernel for T rows (kernels_ptx/moe_block.cu; the tensor-core _mma forms
 * kernels_ptx/moe_gate_mma.cu; all but those give the CPU's bits): its tile (token rows x
 * experts a block) and dynamic shared memory. a8 / a2l / a2: cp.async rings of 6 / 3 / 6 stages
 * of (rows + 2) rows of 2 KC + 16 bytes (KC = 512 / 512 / 128); tiled, t64: GT_SMEM. (Run 8 measured a 64 x 64-tile form with all 8 partials a thread and 1 byte of shared
 * memory a FMA at the tiled kernel's speed, 688 us at 4096 tokens: not kept.) */
struct gate_kernel {
	const char *name;
	int rows, experts;
	unsigned smem;
};

static struct gate_kernel gate_kernel_for(const struct gpu *g, int T, int E, int D)
{
	/* the fast mode above 64 tokens: the tensor cores (the CPU's products, summed in another
	 * fp32 order; issue #11), 64-token tiles while their grid fits the GPU in one wave, else
	 * 128; GM_SMEM: 8 stages of 192 rows or 12 of 128, of 144 bytes. Run 15 measured the exact
	 * forms at 128 / 1024 / 4096 tokens: 88 / 166 / 567 us; run 17 the 128-token tiles with 4
	 * stages at 88-95 us for every T from 128 to 4096 (each SM's block bound by its bytes in
	 * flight). Up to 64 tokens both modes keep the exact logits (decode steps) */
	if (!cuda_gemm_batch_invariant(g) && T > 64 && D % 64 == 0 && E % 2 == 0) {
		const long long b64 = (long long)((E + 63) / 64) * ((T + 63) / 64);
		return b64 <= g->sm_count
			       ? (struct gate_kernel){"k_moe_gate_logits_mma64", 64, 64, 12 * 128 * 144}
			       : (struct gate_kernel){"k_moe_gate_logits_mma", 128, 64, 8 * 192 * 144};
	}
	/* run 8: a2l 71 / 152 us at 128 / 256 tokens (each block re-reads its 64 token rows), the
	 * 32 x 32 tiles ~100 us for up to 512 (one wave): tiled from 176 tokens */
	/* GT_SMEM(tt): (tt + 32) rows of 104 floats, 4 ring stages of (tt + 32) rows of 144 bytes;
	 * _t64 (64-token tiles, ~60% of the shared-memory traffic a FMA) from 1024 tokens,
	 * where its grid still fills the GPU (run 10, 32-token tiles: 198 / 388 / 730 us at 1024 /
	 * 2048 / 4096 tokens) */
	if (T >= 1024 && E % 32 == 0)
		return (struct gate_kernel){"k_moe_gate_logits_t64", 64, 32, 96 * 104 * 4 + 4 * 96 * 144};
	if (T > 176 && E % 32 == 0)
		return (struct gate_kernel){"k_moe_gate_logits_tiled", 32, 32, 64 * 104 * 4 + 4 * 64 * 144};
	if (T <= 16 && D % 512 == 0)
		return (struct gate_kernel){"k_moe_gate_logits_a8", 16, 2, 6 * (16 + 2) * (512 * 2 + 16)};
	if (D % 512 == 0)
		return (struct gate_kernel){"k_moe_gate_logits_a2l", 64, 2, 3 * (64 + 2) * (512 * 2 + 16)};
	return (struct gate_kernel){"k_moe_gate_logits_a2", 64, 2, 6 * (64 + 2) * (128 * 2 + 16)};
}

/* The router at one token (k_moe_gate_route1: its weight copies before its griddepcontrol.wait)
 * and the combine (waits first) by programmatic dependent launch, so they start while the
 * kernel before them finishes (the forward's norm triggers its dependents early; engineer S);
 * DSV32_CUDA_MOE_PDL=0 (diagnosis, read once): plain launches. */
static int moe_pdl(void)
{
	static int pdl = -1;
	return env_on(&pdl, "DSV32_CUDA_MOE_PDL");
}
#define moe_launch(g, fn, gx, bx, smem, args)                                                    \
	gpu_launch_as(g, moe_pdl(), fn, gx, 1, 1, bx, 1, 1, smem, args)

/* k_moe_route_w's shape (E = 256 in 8 groups: a warp a token), and within it the decode sizes
 * whose logits, routing and permutation are one launch (k_moe_gate_route1). */
static int warp_route(const struct dsv32_config *c, const struct moe_dims *d)
{
	return d->E == 256 && c->n_group == 8 && c->topk_group <= 8 && d->K <= 32;
}

/* The fused router, k_moe_gate_route1 (logits over E / 8 blocks, routing and permutation in
 * its last block), at one token where the hidden size fits its chunk table (D % 512 == 0,
 * D <= 8192). Run 8 (bench moe, eager) measured its first form (k_moe_gate_route_a8, a fused
 * version of k_moe_gate_logits_a8) at T = 1 / 8 / 16: block 195 / 1102 / 1947 us fused, 200 /
 * 1096 / 1931 separate — the last block's serial routing and permutation cost what the saved
 * launches did from two tokens on; run 12: route1 14.4 us graph-replayed, the a8 form 17.4. */
static int fused_router(const struct dsv32_config *c, const struct moe_dims *d)
{
	return warp_route(c, d) && d->T == 1 && d->D % 512 == 0 && d->D <= 8192 && !d->unfused;
}

/* The fast mode's one-token router, k_moe_gate_route1s (the same outputs, each logit summed in
 * another fp32 order, over E / 2 blocks of 256 threads: every SM streams its two weight rows at
 * once, where route1's 32 blocks each pull 115 KB then run 896-step FMA chains. Run 25, bench
 * moe T = 1, the router alone graph-replayed: 6.4 us against route1's 10.5; the model step
 * (--ab DSV32_CUDA_MOE_ROUTER=0) 16.0 / 16.5 / 11.6 us faster with it at 1K / 32K / 128K; run 26
 * +13.4 / +11.1 / +17.3 for route1), where the fused router runs, D % 1024 == 0 and D <= 8192;
 * the batch-invariant mode keeps route1 (the CPU's bits, as every T). Runs 25-26 timed both
 * without their last block's routing (the counter, the selection, the permutation): 2.5-2.6
 * and 6.4 us, so that tail takes ~4 us in either; a selection by sorted lanes instead of an
 * 8-way scan a pick (run 26) did not move it (removed). DSV32_CUDA_MOE_ROUTER=m (read once;
 * cuda_moe_set_router, a forward switch): 0 route1 in both modes; 1 (default) route1s.
 * Returns 0 (route1) or 1. */
static int router_mode = -1;

void cuda_moe_set_router(int mode)
{
	router_mode = mode != 0;
}

static int split_router(const struct gpu *g, const struct dsv32_config *c,
			const struct moe_dims *d)
{
	if (router_mode < 0)
		cuda_moe_set_router(env_int("DSV32_CUDA_MOE_ROUTER", 1));
	if (!router_mode || !fused_router(c, d) || cuda_gemm_batch_invariant(g) || d->D % 1024 ||
	    d->D > 8192)
		return 0;
	return router_mode;
}

/* The fast mode's router of 2 .. ROUTE_T_MAX tokens, k_moe_gate_route_t: route1s's logits for
 * each token (the same bits as at one token), then its last block routes and permutes them, in
 * place of the separate logits (k_moe_gate_logits_a8), route and permute launches;
 * k_moe_quant_scatter follows by PDL. cuda_moe_set_router_t / DSV32_CUDA_MOE_ROUTER_T=0 (read
 * once; a forward switch): the separate kernels. */
static int router_t_on = -1;

void cuda_moe_set_router_t(int on)
{
	router_t_on = on != 0;
}

static int few_router(const struct gpu *g, const struct dsv32_config *c, const struct moe_dims *d)
{
	return env_on(&router_t_on, "DSV32_CUDA_MOE_ROUTER_T") && d->T >= 2 && d->T <= ROUTE_T_MAX &&
	       warp_route(c, d) && !d->unfused && !cuda_gemm_batch_invariant(g) &&
	       d->D % 1024 == 0 && d->D <= 8192;
}

/* 1 where one token's router only writes the scores and cuda_gemm_fp8_moe_block routes it (the
 * split router and the one-launch block at these sizes: model/cuda_gemm.h); the caller adds
 * its own conditions on the stages run and the taps. */
static int block_routes(const struct gpu *g, const struct dsv32_config *c, const struct moe_dims *d)
{
	return split_router(g, c, d) && !use_wgmma(d) &&
	       cuda_gemm_fp8_moe_block_routes(g, d->T, d->K, d->E + 1, d->D, d->I, gemm_ws(g, d));
}

/* The fast mode's router from 17 tokens on the real routing shape: the logits in gate_parts(d)
 * parts of K with every expert in a block (k_moe_gate_logits_ks / _ks64, moe_gate_mma.cu: x
 * taken into the SMs once, not once per 64 experts as by k_moe_gate_logits_mma), then the
 * routing on their sum in part order (k_moe_route_wsum, which also leaves the logits). Above 64
 * tokens 4 parts; at 17-64 (decode batches) parts of 256 columns, in place of the exact
 * kernels (k_moe_gate_logits_a2l: each logit 8 FMA chains of D / 8 on the CUDA cores, 36.7 us at
 * 64 tokens, s21-2). Independent of T within each range. cuda_moe_set_gate_ks /
 * DSV32_CUDA_MOE_GATE_KS=0 (read once; a forward switch): k_moe_gate_logits_mma / _mma64 above
 * 64 tokens, the exact kernels at 17-64, then k_moe_route_w. */
static int gate_ks_on = -1;

void cuda_moe_set_gate_ks(int on)
{
	gate_ks_on = on != 0;
}

static int gate_ks(const struct dsv32_config *c, const struct moe_dims *d)
{
	return env_on(&gate_ks_on, "DSV32_CUDA_MOE_GATE_KS") && d->fast && d->T > 16 &&
	       warp_route(c, d) && d->D % GK_DECODE_COLS == 0;
}

/* k_moe_gate_logits_ks or _ks64 (a block: 128 or 64 tokens x all 256 experts x a part of K),
 * whichever makes the fewer rows a block takes in (rows + 256 a K column) times its waves of
 * gate_parts(d) x ceil(T / rows) blocks, one an SM; smem: GM_SMEM(rows, 256, 4), 4 stages of
 * rows + 256 rows of 144 bytes (moe_gate_mma.cu). */
static struct gate_kernel gate_ks_kernel(const struct gpu *g, const struct moe_dims *d)
{
	const long long sms = g->sm_count > 0 ? g->sm_count : 1, parts = gate_parts(d), T = d->T,
			w128 = (parts * ((T + 127) / 128) + sms - 1) / sms,
			w64 = (parts * ((T + 63) / 64) + sms - 1) / sms;
	const int rows = 384 * w128 < 320 * w64 ? 128 : 64;
	return (struct gate_kernel){rows == 128 ? "k_moe_gate_logits_ks" : "k_moe_gate_logits_ks64",
				    rows, 256, (unsigned)(4 * (rows + 256) * 144)};
}

/* Dynamic shared memory of k_moe_gate_route1: barriers, x split by partial, 8 weight rows
 * (moe_block.cu). */
static unsigned gate_route1_smem(int D)
{
	return (unsigned)(8 * 16 + 32 * (D / 8 + 4) + 8 * (2 * D + 16));
}

/* One grouped GEMM over G groups (y row stride N). */
static int grouped(struct gpu *g, int wgmma, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
		   gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int rows, int N, int K, gpu_ptr ws,
		   size_t ws_bytes)
{
	if (wgmma)
		return cuda_gemm_fp8_wgmma_grouped(g, w_tab, s_tab, off, G, x8, sx, y, rows, N, K, N);
	return cuda_gemm_fp8_grouped(g, w_tab, s_tab, off, G, x8, sx, y, rows, N, K, N, ws, ws_bytes);
}

/* k_moe_swiglu_quant's silu table (cuda_moe_set_swiglu_table): 2 by rows (SQ_TABLE_FROM), 0
 * off, 1 on; < 0 not read yet. */
static int swiglu_table = -1;

void cuda_moe_set_swiglu_table(int mode) { swiglu_table = mode < 0 || mode > 1 ? 2 : mode; }

/* SwiGLU of gu [rows, 2I] then act_quant -> h8 [rows, I], hs [rows, I/128]: from SQ_TABLE_FROM
 * rows a grid of 4 blocks an SM, each making the silu table once, else one pair of groups a
 * warp with silu computed. s14-3 (bench moe, stage alone, graph-replayed, twice): 4096 tokens
 * 142.5 / 143.1 us against 228.7 / 241.0 computed (session 13's kernel: 222-225), 2048 70 / 75
 * against 112 / 115, 512 20 / 20 against 25 / 25; ncu at 4096: 114 us, IPC 2.79, issue slots
 * 67% busy, DRAM 68% (the computed form: issue-bound, 2.7 IPC, DRAM 48%). */
#define SQ_TABLE_FROM 2048
void cuda_moe_swiglu_grid(const struct gpu *g, int rows, int I, unsigned *blocks, int *table)
{
	long long n = (long long)rows * (I / 128), b = (n + 15) / 16;
	if (swiglu_table < 0)
		cuda_moe_set_swiglu_table(env_int("DSV32_CUDA_MOE_SWIGLU_TABLE", 2));
	*table = swiglu_table == 2 ? rows >= SQ_TABLE_FROM : swiglu_table;
	const long long most = 4LL * (g->sm_count > 0 ? g->sm_count : 132); /* SQ_BLOCKS_SM */
	*blocks = (unsigned)(*table && b > most ? most : b);
}

static int swiglu_quant(struct gpu *g, gpu_ptr gu, gpu_ptr h8, gpu_ptr hs, int rows, int I)
{
	long long n = (long long)rows * (I / 128);
	unsigned blocks;
	int table;
	cuda_moe_swiglu_grid(g, rows, I, &blocks, &table);
	void *args[] = {&gu, &h8, &hs, &I, &n, &table};
	return gpu_launch(g, gpu_kernel(g, "k_moe_swiglu_quant"), blocks, 1, 1, 256, 1, 1, 0, args);
}

/* A copy of n bytes of an intermediate into a trace buffer (when the trace asks for it). */
static int tap(struct gpu *g, gpu_ptr dst, gpu_ptr src, size_t n)
{
	if (!dst)
		return 0;
	return cu_check(cu.cuMemcpyDtoDAsync(dst, src, n, g->stream), "cuMemcpyDtoDAsync", __FILE__,
			__LINE__)
		       ? -EIO
		       : 0;
}

/* ---- DSV32_CUDA_MOE_STATS (see the file header) ---------------------------------------------- */

enum { ST_GATE, ST_ROUTE, ST_PERMUTE, ST_GATHER, ST_W13, ST_SWIGLU, ST_W2, ST_COMBINE, ST_N };
static const char *const stage_names[ST_N] = {"gate", "route", "permute", "gather",
					      "w13", "swiglu", "w2", "combine"};

static struct {
	int init, left, on;
	CUevent ev[ST_N + 1];
} stats;

/* Whether this call is measured (the first n calls of the process). */
static int stats_begin(void)
{
	if (!stats.init) {
		stats.init = 1;
		stats.left = env_int("DSV32_CUDA_MOE_STATS", 0);
		for (int i = 0; i <= ST_N && stats.left > 0; i++)
			if (cu.cuEventCreate(&stats.ev[i], CU_EVENT_DEFAULT) != CUDA_SUCCESS)
				stats.left = 0;
	}
	stats.on = stats.left > 0;
	if (stats.on)
		stats.left--;
	return stats.on;
}

/* Event i: the end of stage i - 1 (0: the start). */
static void stats_mark(struct gpu *g, int i)
{
	if (stats.on)
		cu.cuEventRecord(stats.ev[i], g->stream);
}

/* Waits for the call, prints the routing's rows per expert and each stage's time. */
static void stats_print(struct gpu *g, const struct moe_dims *d, gpu_ptr cnt)
{
	int c[256];
	float ms[ST_N];
	if (cu.cuEventSynchronize(stats.ev[ST_N]) != CUDA_SUCCESS ||
	    gpu_download(g, c, cnt, (size_t)d->E * 4))
		return;
	int hit = 0, lo = 1 << 30, hi = 0, arg = -1;
	long long tiles = 0;
	for (int e = 0; e < d->E; e++) {
		if (!c[e])
			continue;
		hit++;
		tiles += (c[e] + 127) / 128;
		lo = c[e] < lo ? c[e] : lo;
		if (c[e] > hi)
			hi = c[e], arg = e;
	}
	for (int i = 0; i < ST_N; i++)
		if (cu.cuEventElapsedTime(&ms[i], stats.ev[i], stats.ev[i + 1]) != CUDA_SUCCESS)
			ms[i] = -1;
	fprintf(stderr, "moe stats: T=%d, %d routed rows on %d experts (rows per expert hit: min %d, "
			"mean %.1f, max %d at expert %d; %lld tiles of 128 rows = %.2fx the rows)\n  us:",
		d->T, d->R, hit, hit ? lo : 0, hit ? (double)d->R / hit : 0.0, hi, arg, tiles,
		(double)tiles * 128 / d->R);
	for (int i = 0; i < ST_N; i++)
		fprintf(stderr, " %s %.1f", stage_names[i], ms[i] * 1e3);
	fprintf(stderr, "\n");
}

/* ---- the block ------------------------------------------------------------------------------- */

static int moe_run(struct gpu *g, const struct dsv32_config *c, const struct cuda_moe_layer *L,
		   gpu_ptr x, gpu_ptr y, const struct moe_dims *d, const gpu_ptr *b, size_t ws_bytes,
		   unsigned stages, const struct cuda_moe_taps *tr)
{
	int T = d->T, E = d->E, D = d->D, K = d->K, R = d->R, RT = d->RT, I = d->I;
	/* the shared expert's rows: R .. R+T-1 of the row buffers */
	gpu_ptr x8 = b[B_XS8] + (size_t)R * D, sx = b[B_SXS] + (size_t)R * (D / 128) * 4;
	int rc = 0;
	stats_mark(g, 0);
	/* router logits and the routing; decode sizes of the real routing shape: the logits, the
	 * routing and the permutation in one launch (k_moe_gate_route1) */
	int G = (int)c->n_group, tg = (int)c->topk_group, norm = c->norm_topk_prob;
	float scale = (float)c->routed_scaling_factor;
	gpu_ptr bias = L->gate_bias;
	const int fused = fused_router(c, d), few = few_router(g, c, d), ks = gate_ks(c, d);
	/* one token on the fast router where the GEMMs, SwiGLU and combine run in one launch (the
	 * same conditions as below): the router only writes the scores, and that launch routes
	 * (cuda_gemm_fp8_moe_block's rt; the same numbers) */
	const unsigned four = CUDA_MOE_W13 | CUDA_MOE_SWIGLU | CUDA_MOE_W2 | CUDA_MOE_COMBINE;
	const int one_launch = (stages & four) == four && !use_wgmma(d) && !d->unfused && !d->ep &&
			       !(tr && (tr->ey || tr->sh));
	const int self_route = (stages & CUDA_MOE_GATE) && one_launch && block_routes(g, c, d);
	/* self_route on the _r1 forms: the router sets x_ready once x is complete (the block
	 * reads x after it) */
	gpu_ptr x_ready = 0;
	const int early = self_route ? cuda_gemm_moe_block_early() : 0;
	if (early && (rc = cuda_gemm_fp8_moe_block_x_ready(g, &x_ready)))
		return rc;
	if ((stages & CUDA_MOE_GATE) && fused) {
		void *args[] = {(void *)&L->gate, &x, (void *)&b[B_LOGITS], &E, &D, &bias, &tg, &K,
				&norm, &scale, (void *)&b[B_IDX], (void *)&b[B_WTS], (void *)&b[B_CNT],
				(void *)&b[B_OFF], (void *)&b[B_PERM], (void *)&b[B_SRC],
				(void *)&b[B_XS8], (void *)&b[B_SXS], (void *)&b[B_SCORE], &x_ready};
		if (split_router(g, c, d)) { /* E / 2 blocks of 256 threads (GR1S_EPB) */
			rc = moe_launch(g, gpu_kernel(g, self_route ? "k_moe_gate_logits1s"
								    : "k_moe_gate_route1s"),
					(unsigned)(E / 2), 256, 0, args);
		} else {
			void *fn;
			rc = gpu_kernel_smem(g, "k_moe_gate_route1", &fn);
			if (!rc)
				rc = moe_launch(g, fn, (unsigned)(E / 8), 96, gate_route1_smem(D),
						args); /* GR1_THREADS */
		}
		if (rc)
			return rc;
	} else if ((stages & CUDA_MOE_GATE) && few) {
		void *args[] = {(void *)&L->gate, &x, (void *)&b[B_LOGITS], &E, &D, &bias, &tg, &K,
				&norm, &scale, (void *)&b[B_IDX], (void *)&b[B_WTS], (void *)&b[B_CNT],
				(void *)&b[B_OFF], (void *)&b[B_PERM], (void *)&b[B_SRC],
				(void *)&b[B_SCORE], &T};
		rc = moe_launch(g, gpu_kernel(g, "k_moe_gate_route_t"), (unsigned)(E / 2), 256, 0, args);
		if (rc)
			return rc;
	} else if ((stages & CUDA_MOE_GATE) && ks) {
		const struct gate_kernel k = gate_ks_kernel(g, d);
		void *args[] = {(void *)&L->gate, &x, (void *)&b[B_GPARTS], &T, &E, &D};
		void *fn;
		rc = gpu_kernel_smem(g, k.name, &fn);
		if (!rc) /* a part of K a block in x */
			rc = gpu_launch(g, fn, (unsigned)gate_parts(d),
					(unsigned)((T + k.rows - 1) / k.rows), 1, 256, 1, 1, k.smem, args);
		if (rc)
			return rc;
	} else if (stages & CUDA_MOE_GATE) {
		struct gate_kernel k = gate_kernel_for(g, T, E, D);
		void *args[] = {(void *)&L->gate, &x, (void *)&b[B_LOGITS], &T, &E, &D};
		void *fn;
		rc = gpu_kernel_smem(g, k.name, &fn);
		if (!rc)
			rc = gpu_launch(g, fn, (unsigned)((E + k.experts - 1) / k.experts),
					(unsigned)((T + k.rows - 1) / k.rows), 1, 256, 1, 1, k.smem, args);
		if (rc)
			return rc;
	}
	stats_mark(g, ST_GATE + 1);
	if ((stages & CUDA_MOE_ROUTE) && !fused && !few && ks) {
		int parts = gate_parts(d);
		void *wargs[] = {(void *)&b[B_GPARTS], &parts, (void *)&b[B_LOGITS], &bias, &T, &tg, &K,
				 &norm, &scale, (void *)&b[B_IDX], (void *)&b[B_WTS]};
		rc = gpu_launch(g, gpu_kernel(g, "k_moe_route_wsum"), (unsigned)((T + 7) / 8), 1, 1, 256,
				1, 1, 0, wargs);
		if (rc)
			return rc;
	} else if ((stages & CUDA_MOE_ROUTE) && !fused && !few) {
		if (warp_route(c, d)) { /* the real shape: a warp a token */
			void *wargs[] = {(void *)&b[B_LOGITS], &bias, &T, &tg, &K, &norm, &scale,
					 (void *)&b[B_IDX], (void *)&b[B_WTS]};
			rc = gpu_launch(g, gpu_kernel(g, "k_moe_route_w"), (unsigned)((T + 7) / 8), 1, 1,
					256, 1, 1, 0, wargs);
		} else {
			void *rargs[] = {(void *)&b[B_LOGITS], &bias, &E, &G, &tg, &K, &norm, &scale,
					 (void *)&b[B_IDX], (void *)&b[B_WTS]};
			rc = gpu_launch(g, gpu_kernel(g, "k_moe_route"), (unsigned)T, 1, 1, 256, 1, 1, 0,
					rargs);
		}
		if (rc)
			return rc;
	}
	stats_mark(g, ST_ROUTE + 1);
	/* under ep the permutation sorts the rank's view of the picks (k_moe_rank_picks: the other
	 * ranks' picks first, as K groups no GEMM runs) over PE = K + own experts, also after the
	 * fused routers, whose own permutation it replaces (at one token their quantised rows are
	 * all x's, right for any order) */
	gpu_ptr pidx = b[B_IDX];
	/* the permutation's experts: E, or K + own (the other ranks' picks as K groups first) */
	int PE = d->ep ? K + d->own : E;
	if ((stages & CUDA_MOE_PERMUTE) && d->ep) {
		int e1 = d->e0 + d->own;
		void *args[] = {(void *)&b[B_IDX], &R, &K, (void *)&d->e0, &e1, (void *)&b[B_RIDX]};
		rc = gpu_launch(g, gpu_kernel(g, "k_moe_rank_picks"), (unsigned)((R + 255) / 256), 1, 1,
				256, 1, 1, 0, args);
		if (rc)
			return rc;
		pidx = b[B_RIDX];
	}
	/* rows by expert (offsets [PE + 2]: group PE, the shared expert, is rows R .. R+T-1) */
	const int permute = (stages & CUDA_MOE_PERMUTE) && (d->ep || (!fused && !few));
	if (permute && T > PERM_PAR_FROM) {
		unsigned nb = (unsigned)((T + PERM_TOKENS - 1) / PERM_TOKENS);
		void *cargs[] = {(void *)&pidx, &T, &K, &PE, (void *)&b[B_BCNT]};
		void *pargs[] = {(void *)&pidx, &T, &K, &PE, (void *)&b[B_BCNT], (void *)&b[B_CNT],
				 (void *)&b[B_OFF], (void *)&b[B_PERM], (void *)&b[B_SRC]};
		rc = gpu_launch(g, gpu_kernel(g, "k_moe_permute_count"), nb, 1, 1, 256, 1, 1, 0, cargs);
		if (!rc)
			rc = gpu_launch(g, gpu_kernel(g, "k_moe_permute_place"), nb, 1, 1, 1024, 1, 1, 0,
					pargs);
		if (rc)
			return rc;
	} else if (permute) {
		void *pargs[] = {(void *)&pidx, &T, &K, &PE, (void *)&b[B_CNT], (void *)&b[B_OFF],
				 (void *)&b[B_PERM], (void *)&b[B_SRC]};
		rc = gpu_launch(g, gpu_kernel(g, "k_moe_permute"), 1, 1, 1, 1024, 1, 1, 0, pargs);
		if (rc)
			return rc;
	}
	/* a rank without the shared expert: its group (the last) has no rows */
	const int has_shared = !d->ep || d->rank == 0;
	if ((stages & CUDA_MOE_PERMUTE) && !has_shared &&
	    cu_check(cu.cuMemsetD32Async(b[B_OFF] + ((size_t)PE + 1) * 4, (unsigned)R, 1, g->stream),
		     "cuMemsetD32Async", __FILE__, __LINE__))
		return -EIO;
	/* the grouped GEMMs' offsets: group j's rows [off[j], off[j + 1]), j < G; under ep from the
	 * rank's first own expert (the other ranks' rows before it are in no group) */
	const gpu_ptr off = b[B_OFF] + (d->ep ? (size_t)K * 4 : 0);
	const int NG = d->own + 1; /* the grouped GEMMs' groups: the shared expert last */
	stats_mark(g, ST_PERMUTE + 1);
	/* the quantised rows: routed rows in sorted order, then x itself (one token through the
	 * fused router: written there) */
	const int gathered = fused && T == 1;
	if ((stages & CUDA_MOE_GATHER) && !gathered && !d->unfused) {
		/* each x row quantised once, written to its K sorted rows and the shared row */
		long long ng = (long long)T * (D / 128);
		void *args[] = {&x, (void *)&b[B_PERM], (void *)&b[B_XS8], (void *)&b[B_SXS], &D, &T, &K,
				&R};
		void *fn = gpu_kernel(g, "k_moe_quant_scatter");
		rc = few ? moe_launch(g, fn, (unsigned)((ng + 7) / 8), 256, 0, args)
			 : gpu_launch(g, fn, (unsigned)((ng + 7) / 8), 1, 1, 256, 1, 1, 0, args);
		if (rc)
			return rc;
	} else if ((stages & CUDA_MOE_GATHER) && !gathered) { /* x quantised once, rows copied */
		long long ng = (long long)T * (D / 128);
		void *args[] = {&x, &x8, &sx, &ng};
		rc = gpu_launch(g, gpu_kernel(g, "k_act_quant"), (unsigned)((ng + 7) / 8), 1, 1, 256, 1,
				1, 0, args);
		if (rc)
			return rc;
		void *gargs[] = {&x8, &sx, (void *)&b[B_SRC], (void *)&b[B_XS8], (void *)&b[B_SXS], &D,
				 &R};
		rc = gpu_launch(g, gpu_kernel(g, "k_moe_gather_q"), (unsigned)((R + 7) / 8), 1, 1, 256,
				1, 1, 0, gargs);
		if (rc)
			return rc;
	}
	stats_mark(g, ST_GATHER + 1);
	/* the routed experts and the shared one (group E): gate|up, SwiGLU + act_quant, down;
	 * tw: gate|up on the token-wide grouped form, then k_moe_swiglu_quant; sw: on the wgmma
	 * tile form the first GEMM writes the SwiGLU's quantised output itself */
	const int wgmma = use_wgmma(d), tw = use_tw(d), sw = wgmma && !d->unfused && !tw;
	/* sd: the shared expert on the dense dispatch, the grouped GEMMs over the routed experts */
	const int sd = use_shared_dense(d), ng = sd ? NG - 1 : NG;
	int sw_done = sw; /* SwiGLU done by the gate|up GEMM */
	int one_row = 0;  /* ... on the one-row kernel: the down GEMM may read off early */
	/* at 1-3 tokens (the one-row kernel) the GEMMs, the SwiGLU and the combine in one launch
	 * (cuda_gemm_fp8_moe_block: the same bits; -ENOTSUP: not), when all four stages run and no
	 * expert output is tapped */
	int block_done = 0;
	if (one_launch) {
		const struct cuda_moe_route1 rt = {
			b[B_SCORE], b[B_IDX], b[B_CNT], b[B_SRC], scale, tg, norm, x, x_ready, early};
		rc = cuda_gemm_fp8_moe_block(g, L->w13_tab, L->s13_tab, L->w2_tab, L->s2_tab,
					     off, NG, b[B_XS8], b[B_SXS], b[B_H8], b[B_HS], y,
					     T, K, b[B_WTS], b[B_PERM], D, I, b[B_WS], ws_bytes,
					     self_route ? &rt : NULL);
		if (self_route && rc) { /* (the routing was left to this launch) */
			if (x_ready) /* the router still sets it: clear it after, as the block would */
				(void)gpu_memset(g, x_ready, 0, sizeof(unsigned));
			return rc;
		}
		block_done = sw_done = rc == 0;
		if (rc != -ENOTSUP && rc)
			return rc;
		rc = 0;
	}
	const int w13 = (stages & CUDA_MOE_W13) && !block_done;
	if (w13 && sw) {
		rc = cuda_gemm_fp8_wgmma_grouped_swiglu(g, L->w13_tab, L->s13_tab, off, NG,
							b[B_XS8], b[B_SXS], b[B_H8], b[B_HS], RT, I,
							D);
	} else if (w13) {
		/* the streaming kernel's chunk sum does the SwiGLU where it can (-ENOTSUP: not) */
		rc = d->unfused || wgmma ? -ENOTSUP
					 : cuda_gemm_fp8_grouped_swiglu(g, L->w13_tab, L->s13_tab, off,
							      NG, b[B_XS8], b[B_SXS], b[B_H8],
							      b[B_HS], RT, 2 * I, D, b[B_WS], ws_bytes,
							      &one_row);
		sw_done = rc == 0;
		if (rc == -ENOTSUP) {
			rc = tw ? cuda_gemm_fp8_tw_grouped(g, L->w13_tab, L->s13_tab, off, ng,
							   b[B_XS8], b[B_SXS], b[B_GU], RT, 2 * I,
							   D, 2 * I)
				: grouped(g, wgmma, L->w13_tab, L->s13_tab, off, NG,
					  b[B_XS8], b[B_SXS], b[B_GU], RT, 2 * I, D, b[B_WS],
					  ws_bytes);
			if (!rc && sd && has_shared) /* rows R .. R + T: x itself */
				rc = cuda_gemm_fp8(g, L->sh13.w, L->sh13.s, b[B_XS8] + (size_t)R * D,
						   b[B_SXS] + (size_t)R * (D / 128) * 4,
						   b[B_GU] + (size_t)R * 2 * I * 2, T, 2 * I, D, 2 * I,
						   b[B_WS], ws_bytes);
			if (!rc && tr)
				rc = tap(g, tr->gu, b[B_GU], (size_t)R * 2 * I * 2);
		}
	}
	stats_mark(g, ST_W13 + 1);
	if (!rc && (stages & CUDA_MOE_SWIGLU) && !sw_done)
		rc = swiglu_quant(g, b[B_GU], b[B_H8], b[B_HS], RT, I);
	stats_mark(g, ST_SWIGLU + 1);
	/* on the streaming kernel the down GEMM's chunk sum does the combine where it can
	 * (cuda_gemm_fp8_grouped_combine, engineer G's: the same bits; -ENOTSUP: not), unless the
	 * expert outputs are tapped */
	int comb_done = block_done;
	if (!rc && (stages & CUDA_MOE_W2) && !comb_done && !wgmma && !d->unfused && !d->ep &&
	    !(tr && (tr->ey || tr->sh))) {
		rc = cuda_gemm_fp8_grouped_combine(g, L->w2_tab, L->s2_tab, off, NG, b[B_H8],
						   b[B_HS], y, T, K, b[B_WTS], b[B_PERM], D, I,
						   b[B_WS], ws_bytes, one_row);
		comb_done = rc == 0;
		rc = rc == -ENOTSUP ? 0 : rc;
	}
	if (!rc && (stages & CUDA_MOE_W2) && !comb_done) {
		rc = use_tw_down(d)
			     ? cuda_gemm_fp8_tw_grouped(g, L->w2_tab, L->s2_tab, off, ng,
							b[B_H8], b[B_HS], b[B_EY], RT, D, I, D)
			     : grouped(g, wgmma, L->w2_tab, L->s2_tab, off, ng, b[B_H8],
				       b[B_HS], b[B_EY], RT, D, I, b[B_WS], ws_bytes);
		if (!rc && sd && has_shared)
			rc = cuda_gemm_fp8(g, L->sh2.w, L->sh2.s, b[B_H8] + (size_t)R * I,
					   b[B_HS] + (size_t)R * (I / 128) * 4,
					   b[B_EY] + (size_t)R * D * 2, T, D, I, D, b[B_WS], ws_bytes);
		if (!rc && tr)
			rc = tap(g, tr->ey, b[B_EY], (size_t)R * D * 2);
		if (!rc && tr)
			rc = tap(g, tr->sh, b[B_EY] + (size_t)R * D * 2, (size_t)T * D * 2);
	}
	stats_mark(g, ST_W2 + 1);
	if (rc)
		return rc;
	/* y = bf16( sum of weighted expert rows + shared ); under ep the rank's fp32 share: its own
	 * picks (sorted rows from off[0] on), + shared on the rank that has it */
	long long cblocks = ((long long)T * D / 8 + 255) / 256, cap = 64LL * g->sm_count;
	cblocks = cblocks < cap ? cblocks : cap;
	if ((stages & CUDA_MOE_COMBINE) && !comb_done && d->ep) {
		gpu_ptr sh = has_shared ? b[B_EY] + (size_t)R * D * 2 : 0;
		void *cargs[] = {(void *)&b[B_EY], (void *)&b[B_WTS], (void *)&b[B_PERM], (void *)&off,
				 &sh, &y, &T, &K, &D};
		rc = moe_launch(g, gpu_kernel(g, "k_moe_combine_rank"), (unsigned)cblocks, 256, 0,
				cargs);
	} else if ((stages & CUDA_MOE_COMBINE) && !comb_done) {
		gpu_ptr sh = b[B_EY] + (size_t)R * D * 2;
		void *cargs[] = {(void *)&b[B_EY], (void *)&b[B_WTS], (void *)&b[B_PERM], &sh, &y, &T,
				 &K, &D};
		rc = moe_launch(g, gpu_kernel(g, "k_moe_combine_v8"), (unsigned)cblocks, 256, 0, cargs);
	}
	stats_mark(g, ST_COMBINE + 1);
	return rc;
}

const char *cuda_moe_path(const struct gpu *g, const struct dsv32_config *c, int T,
			  unsigned flags)
{
	struct moe_dims d = moe_dims(g, c, T, flags);
	int fused = fused_router(c, &d), few = few_router(g, c, &d), wg = use_wgmma(&d);
	struct gate_kernel k =
		gate_ks(c, &d) ? gate_ks_kernel(g, &d) : gate_kernel_for(g, T, d.E, d.D);
	const int self_route = block_routes(g, c, &d);
	const char *one = wg || d.unfused ? NULL
					  : cuda_gemm_fp8_moe_block_kernel(g, T, d.K, d.E + 1, d.D, d.I,
									   gemm_ws(g, &d),
									   self_route ? cuda_gemm_moe_block_early() : 0);
	static char buf[320];
	snprintf(buf, sizeof buf, "router %s%s; grouped GEMMs %s%s%s%s",
		 few	      ? "k_moe_gate_route_t"
		 : !fused     ? k.name
		 : self_route ? "k_moe_gate_logits1s"
		 : split_router(g, c, &d) ? "k_moe_gate_route1s" : "k_moe_gate_route1",
		 self_route	? " (logits; the routing and permutation in the one launch below)"
		 : fused || few ? " (logits, routing, permutation)"
				: " + route + permute",
		 !wg ? d.unfused ? "cuda_gemm_fp8_grouped (streaming decode kernel)"
			       : "cuda_gemm_fp8_grouped (streaming decode kernel; SwiGLU and the combine "
				 "in the chunk sums where they run)"
		 : d.unfused	     ? "wgmma"
		 : !use_tw(&d)	     ? "wgmma, SwiGLU in the gate|up epilogue"
		 : use_tw_down(&d) ? "token-wide (gate|up, then k_moe_swiglu_quant; down)"
				   : "token-wide gate|up, then k_moe_swiglu_quant; down on wgmma tiles",
		 one ? ", with SwiGLU and the combine, in one launch: " : "", one ? one : "",
		 use_shared_dense(&d) ? "; the shared expert's on the dense dispatch" : "");
	return buf;
}

int cuda_moe_forward(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
		     const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y, int T,
		     const struct cuda_moe_trace *trace, unsigned flags)
{
	return cuda_moe_forward_stages(g, a, c, L, x, y, T, trace, NULL,
				       CUDA_MOE_ALL | (flags & CUDA_MOE_UNFUSED));
}

/* The block for cuda_moe_forward_stages (ep 0) and cuda_moe_forward_rank (ep 1). */
static int moe_block_forward(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
			     const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y, int T,
			     const struct cuda_moe_trace *trace, const struct cuda_moe_taps *taps,
			     unsigned stages, int ep)
{
	if (ep != (L->ranks > 1)) /* a rank's tables hold only its experts, and the reverse */
		return -EINVAL;
	if (T < 1)
		return T == 0 ? 0 : -EINVAL;
	struct moe_dims d = moe_dims(g, c, T, stages);
	if (ep) {
		d.ep = 1, d.rank = L->rank, d.e0 = L->e0, d.own = L->n_own;
	}
	size_t sz[B_COUNT];
	scratch_sizes(g, &d, sz);
	size_t mark = gpu_arena_mark(a);
	gpu_ptr b[B_COUNT];
	for (int i = 0; i < B_COUNT; i++) {
		gpu_ptr t = 0;
		if (trace && i == B_LOGITS)
			t = trace->logits;
		else if (trace && i == B_IDX)
			t = trace->idx;
		else if (trace && i == B_WTS)
			t = trace->wts;
		b[i] = t ? t : gpu_arena_push(a, sz[i]);
		if (!b[i]) {
			gpu_arena_release(a, mark);
			return -ENOMEM;
		}
	}
	int measured = (stages & CUDA_MOE_ALL) == CUDA_MOE_ALL && !ep && stats_begin();
	int rc = moe_run(g, c, L, x, y, &d, b, sz[B_WS], stages, taps);
	if (!rc && measured)
		stats_print(g, &d, b[B_CNT]);
	stats.on = 0;
	gpu_arena_release(a, mark);
	return rc;
}

int cuda_moe_forward_stages(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
			    const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y, int T,
			    const struct cuda_moe_trace *trace, const struct cuda_moe_taps *taps,
			    unsigned stages)
{
	return moe_block_forward(g, a, c, L, x, y, T, trace, taps, stages, 0);
}

int cuda_moe_forward_rank(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
			  const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y_part, int T,
			  const struct cuda_moe_trace *trace, unsigned flags)
{
	return moe_block_forward(g, a, c, L, x, y_part, T, trace, NULL,
			   CUDA_MOE_ALL | (flags & CUDA_MOE_UNFUSED), 1);
}

#endif
