/*
 * cuda_fwd_ffn.c — the FFN blocks of the CUDA forward pass (model/cuda_fwd.h): the dense SwiGLU
 * MLP (§3.8) and the MoE block (§3.9) through cuda_moe_forward (model/cuda_moe.c), or the
 * all-experts fallback when its tables are not built.
 *
 * Must not: synchronise (dumps excepted), allocate outside the arena.
 */
#include "model/cuda_fwd.h"

#ifndef DSV32_NO_CUDA

#include <stdio.h>

/* Dense SwiGLU MLP (cpu_moe.c mlp_forward): y[M, D] = W2(bf16(silu(g) * u)), [g | u] = W13 f.
 * f8, fs: f's act_quant when the caller has it (the norm before, fused), else 0 (done here).
 * The SwiGLU and its act_quant in one launch (k_moe_swiglu_quant: k_swiglu then k_act_quant's
 * numbers; DSV32_CUDA_UNFUSED=1 runs those two). */
int fwd_mlp(struct fwd *F, const struct fwd_fp8 *w13, const struct fwd_fp8 *w2, gpu_ptr f,
	    gpu_ptr f8, gpu_ptr fs, gpu_ptr y, int M)
{
	int D = w13->in, inter = w13->out / 2, Mp = fwd_round8(M);
	size_t mark = gpu_arena_mark(F->A);
	if (!f8) {
		if (!(f8 = fwd_take(F, (size_t)Mp * D)) || !(fs = fwd_take(F, (size_t)Mp * (D / 128) * 4)))
			return -ENOMEM;
		TRY(fwd_quant(F, f, f8, fs, M, D));
	}
	TAKE(gu, (size_t)Mp * 2 * inter * 2);         /* bf16 [Mp, 2 * inter] */
	TAKE(h8, (size_t)Mp * inter);
	TAKE(hs, (size_t)Mp * (inter / 128) * 4);
	TRY(fwd_gemm(F, w13, f8, fs, gu, M, 2 * inter));
	if (fwd_fused(F)) {
		long long ng = (long long)M * (inter / 128);
		unsigned blocks;
		int table;
		cuda_moe_swiglu_grid(F->g, M, inter, &blocks, &table);
		LAUNCH("k_moe_swiglu_quant", blocks, 1, 256, 0, &gu, &h8, &hs, &inter, &ng, &table);
	} else {
		TAKE(h, (size_t)Mp * inter * 2);      /* bf16 [Mp, inter] */
		long long n = (long long)M * inter;
		long long blocks = (n + 255) / 256;
		LAUNCH("k_swiglu", blocks < 4096 ? blocks : 4096, 1, 256, 0, &gu, &h, &inter, &n);
		TRY(fwd_quant(F, h, h8, hs, M, inter));
	}
	TRY(fwd_gemm(F, w2, h8, hs, y, M, w2->out));
	gpu_arena_release(F->A, mark);
	return 0;
}

/* ---- the MoE block (spec §3.9) ---------------------------------------------------------------- */

/* y[T, D] = MoE(f) through cuda_moe_forward (model/cuda_moe.c), or, when its tables are not
 * built (DSV32_CUDA_MOE_DENSE=1, a diagnosis switch), by running every expert on every row and
 * combining the picks (the same numbers per row, E times the work). logits fp32 [T, E], idx int
 * [T, K], wts fp32 [T, K]: the routing (for the dumps). */
int fwd_moe(struct fwd *F, int64_t layer, const struct fwd_layer *L, gpu_ptr f, gpu_ptr y)
{
	const struct dsv32_config *c = F->c;
	int T = F->T, D = (int)c->hidden_size, E = (int)c->n_routed_experts;
	int K = (int)c->num_experts_per_tok;
	size_t mark = gpu_arena_mark(F->A);
	TAKE(logits, (size_t)F->Tp * E * 4);
	TAKE(idx, (size_t)F->Tp * K * 4);
	TAKE(wts, (size_t)F->Tp * K * 4);
	if (L->moe_ready) {
		int piece = LARGE_M(F) ? T : 64; /* the modes: see the file's header */
		for (int t0 = 0; t0 < T; t0 += piece) {
			int n = T - t0 < piece ? T - t0 : piece;
			struct cuda_moe_trace tr = {logits + (size_t)t0 * E * 4, idx + (size_t)t0 * K * 4,
						    wts + (size_t)t0 * K * 4};
			int r = cuda_moe_forward(F->g, F->A, c, &L->moe, f + (size_t)t0 * D * 2,
						 y + (size_t)t0 * D * 2, n, F->st->dump ? &tr : NULL,
						 fwd_fused(F) ? 0 : CUDA_MOE_UNFUSED);
			if (r)
				return fwd_fail("cuda_moe_forward", r);
		}
		fwd_prof_mark(F->g->stream, "moe block");
	} else {
		int G = (int)c->n_group, tg = (int)c->topk_group, norm = c->norm_topk_prob;
		float rs = (float)c->routed_scaling_factor;
		TRY(fwd_lin(F, L->gate, f, D, logits, 0, E, T, D, E));
		gpu_ptr bias = L->gate_bias;
		LAUNCH("k_moe_route", T, 1, 256, 0, &logits, &bias, &E, &G, &tg, &K, &norm, &rs, &idx,
		       &wts);
		TAKE(sh, (size_t)F->Tp * D * 2);
		TRY(fwd_mlp(F, &L->sh13, &L->sh2, f, 0, 0, sh, T));
		/* every expert on every row: [E, T, D] (+ 8 rows: the last GEMM may write Tp rows) */
		TAKE(ex, ((size_t)E * T + 8) * D * 2);
		for (int e = 0; e < E; e++)
			TRY(fwd_mlp(F, &L->ex13[e], &L->ex2[e], f, 0, 0, ex + (size_t)e * T * D * 2, T));
		TAKE(perm, (size_t)T * K * 4);
		LAUNCH("k_fwd_dense_perm", (T * K + 255) / 256, 1, 256, 0, &idx, &perm, &T, &K);
		long long blocks = ((long long)T * D + 255) / 256;
		LAUNCH("k_moe_combine", blocks < 4096 ? blocks : 4096, 1, 256, 0, &ex, &wts, &perm, &sh, &y,
		       &T, &K, &D);
	}
	if (F->st->dump) {
		TRY(fwd_dump_all(F, "ffn_moe_logits", layer, logits, DUMP_F32, E, E));
		TRY(fwd_dump_all(F, "ffn_moe_topk", layer, idx, DUMP_I32, K, K));
		TRY(fwd_dump_all(F, "ffn_moe_weights", layer, wts, DUMP_F32, K, K));
		TRY(fwd_dump_all(F, "ffn_moe_out", layer, y, DUMP_BF16, D, D));
	}
	gpu_arena_release(F->A, mark);
	return 0;
}

#endif
