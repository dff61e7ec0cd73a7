/*
 * cuda_fwd_attn.c — one decoder layer of the CUDA forward pass (§3.2; model/cuda_fwd.h): the
 * attention block — attn_norm, the q_a | indexer wk | kv_a projections and their norms, the
 * cache writes, the lightning indexer's queries, scores and top-k selection (§3.6), q
 * absorption, the sparse MLA over the selected slots (cuda_attn.c), W_UV, o_proj — then the
 * ffn_norm and the layer's FFN (cuda_fwd_ffn.c).
 *
 * Must not: synchronise (dumps excepted), allocate outside the arena.
 */
#include "model/cuda_fwd.h"

#ifndef DSV32_NO_CUDA

#include <math.h>
#include <stdlib.h>

#include "model/cuda_attn.h"
#include "model/numerics.h"

/* ---- one decoder layer (§3.2) ------------------------------------------------------------------ */

/* The layer's pools: MLA records (slot s at + s * record bytes) and indexer pages. */
static gpu_ptr fwd_pool_mla(const struct fwd *F, int64_t layer)
{
	const struct backend *b = F->E->base;
	return F->E->kv_base + (size_t)(layer - F->E->kv_layer0) * b->n_pages * b->mla_page_bytes;
}

static gpu_ptr fwd_pool_idx(const struct fwd *F, int64_t layer)
{
	const struct backend *b = F->E->base;
	return F->E->kv_base + (size_t)b->n_layers * b->n_pages * b->mla_page_bytes +
	       (size_t)(layer - F->E->kv_layer0) * b->n_pages * b->idx_page_bytes;
}

/* The query side of the attention after q_a's norm (§3.5): q = q_b(cq8) [T, H, nope | rope], its
 * q_pe RoPE, and the absorption into the MLA query qf [T, Hpad, R | rope] (q_lat = q_nope W_UK). */
struct q_branch {
	int64_t layer;
	const struct fwd_layer *L;
	gpu_ptr cq8, cqs;  /* e4m3 [Tp, q_lora_rank], fp32 [Tp, q_lora_rank / 128]: q_cmpr quantised */
	gpu_ptr q;         /* bf16 [Tp, H * qk_head_dim] */
	gpu_ptr qf;        /* bf16 [Tp, Hpad, kv_lora_rank + rope] */
	int fuse;          /* fwd_fused(F) */
	int have_q;        /* q is written already (the joint GEMM of fwd_qib): no q_b GEMM */
};

static int attn_q(struct fwd *F, const struct q_branch *b)
{
	const struct dsv32_config *c = F->c;
	const struct fwd_layer *L = b->L;
	int64_t layer = b->layer;
	int T = F->T, H = (int)c->num_attention_heads, dq = (int)c->qk_head_dim;
	int nope = (int)c->qk_nope_head_dim, rope = (int)c->qk_rope_head_dim;
	int Rk = (int)c->kv_lora_rank, dv = (int)c->v_head_dim, Hpad = (H + 15) / 16 * 16;
	gpu_ptr q = b->q, qf = b->qf, cs = F->m->rope_cs;
	if (!b->have_q)
		TRY(fwd_gemm(F, &L->q_b, b->cq8, b->cqs, q, T, H * dq));
	const int absorb_cc = T <= MMA_ROWS; /* q absorption on the CUDA cores (below) */
	if (!(b->fuse && absorb_cc)) /* else the q absorption rotates q_pe as it copies it */
		TRY(fwd_rope(F, q, H, (long long)H * dq, dq, nope, 1));
	if (Hpad > H && cu_check(cu.cuMemsetD8Async(qf, 0, (size_t)T * Hpad * (Rk + rope) * 2,
						    F->g->stream), "cuMemsetD8Async", __FILE__, __LINE__))
		return -EIO;
	gpu_ptr kvb_w = L->kv_b.w, kvb_s = L->kv_b.s;
	if (!absorb_cc) {
		int mode = 0, lda = H * dq, b_hs = nope + dv, b_row0 = 0, ldc = Hpad * (Rk + rope), out32 = 0;
		long long a_hs = dq, c_hs = Rk + rope;
		F->tag = "q absorb (mma)";
		LAUNCH3("k_fwd_mma", Rk / 64, (T + 63) / 64, H, 128, &mode, &q, &a_hs, &lda, &kvb_w, &kvb_s,
			&b_row0, &b_hs, &Rk, &qf, &c_hs, &ldc, &out32, &T, &Rk, &nope);
		F->tag = NULL;
	} else if (T == 1 && nope % 32 == 0 && nope <= 192 && Rk % 128 == 0 && Rk <= 512) {
		/* a decode row: one block a head, its weights loaded before the wait (PDL at every row
		 * count: run 21, -1..-5 us a step) */
		gpu_ptr qcs = b->fuse ? cs : 0;
		LAUNCH_PDL_ANY("k_fwd_q_absorb1h", H, 1, Rk / 4, FWD_QAH_SMEM, &q, &kvb_w, &kvb_s, &qf, &T, &H,
			       &Hpad, &nope, &rope, &dv, &Rk, &F->pos, &qcs);
	} else { /* rows a block: the step's, 2 to 8 */
		static const char *names[] = {"k_fwd_q_absorb2", "k_fwd_q_absorb4", "k_fwd_q_absorb8"};
		int v = T <= 2 ? 0 : T <= 4 ? 1 : 2, rows = 2 << v;
		gpu_ptr qcs = b->fuse ? cs : 0; /* RoPE of q_pe here (fused) or done above */
		LAUNCH3_PDL(names[v], H, (T + rows - 1) / rows, Rk / 128, 128, &q, &kvb_w, &kvb_s, &qf, &T,
			&H, &Hpad, &nope, &rope, &dv, &Rk, &F->pos, &qcs);
	}
	TRY(fwd_dump_all(F, "q", layer, q, DUMP_BF16, H * dq, H * dq));
	if (F->st->dump) { /* q_lat [H, R] per row, out of qf's [Hpad, R + rope] */
		size_t n = (size_t)T * Hpad * (Rk + rope);
		uint16_t *h = malloc(n * 2);
		float *row = malloc((size_t)H * Rk * sizeof *row);
		int rr = !h || !row ? -ENOMEM : gpu_download(F->g, h, qf, n * 2);
		for (int t = 0; t < T && !rr; t++) {
			for (int hh = 0; hh < H; hh++)
				for (int i = 0; i < Rk; i++)
					row[hh * Rk + i] = bf16_to_f32(h[((size_t)t * Hpad + hh) * (Rk + rope) + i]);
			F->st->dump->fn(F->st->dump->ctx, "q_lat", layer, F->seq_h[t], F->pos_h[t], 0, row,
					(int64_t)H * Rk);
		}
		free(h);
		free(row);
		TRY(rr);
	}
	return 0;
}

/* attn_q on the side stream (fwd_env.side), after everything issued so far on the engine stream;
 * the engine stream waits for it at fwd_side_close. The arena scratch it used (the GEMM's
 * workspace) stays taken on return (the caller's mark releases it, after the join), so what the
 * engine stream takes next cannot alias it while the branch may still run. */
static int fork_q(struct fwd *F, const struct q_branch *b)
{
	void *main = F->g->stream;
	if (cu_check(cu.cuEventRecord(F->E->ev_fork, main), "cuEventRecord", __FILE__, __LINE__) ||
	    cu_check(cu.cuStreamWaitEvent(F->E->side, F->E->ev_fork, 0), "cuStreamWaitEvent", __FILE__,
		     __LINE__))
		return -EIO;
	size_t top = F->A->top, hw = F->A->high_water;
	F->A->high_water = top;
	F->g->stream = F->E->side; /* the launchers (ours, cuda_gemm's) issue on g->stream */
	int r = attn_q(F, b);
	F->g->stream = main;
	F->side_open = 1;
	size_t used = F->A->high_water - top;
	F->A->high_water = hw > F->A->high_water ? hw : F->A->high_water;
	if (!r && used && !fwd_take(F, used))
		return -ENOMEM;
	return r;
}

/* 1: the step's rows take the attention's query branch on the side stream (one chunk of index
 * scores, no dumps, no profile, DSV32_CUDA_FWD_FORK not 0). */
static int fork_ok(const struct fwd *F)
{
	int chunk = (int)(SCORES_BUDGET / ((size_t)F->mb * 64 * 4));
	return F->E->side && chunk >= F->T && !F->st->dump && !fwd_prof_on() && F->E->sw->fork;
}

/* 1: the query branch forks right after k_fwd_qkv_norms, beside the whole index chain (idx q_b,
 * idx_qw, scores, top-k) instead of beside the top-k only: one-row steps that run the indexer
 * (need), on the side stream (fork_ok), by DSV32_CUDA_QB_EARLY or, unset, below
 * FWD_QB_EARLY_KEYS keys (model/cuda_fwd.h). */
static int fwd_qb_early(const struct fwd *F, int need)
{
	const int e = F->E->sw->qb_early;
	return need && F->T == 1 && fork_ok(F) && (e < 0 ? F->max_n < FWD_QB_EARLY_KEYS : e);
}

/* 1: q_b and the indexer's q_b run as one GEMM on the matrix placed as both (fwd_layer.qib:
 * both read q_cmpr), the rest of the query branch (the absorption) then forked beside the top-k:
 * by DSV32_CUDA_QB_FUSE or, unset, from FWD_QB_EARLY_KEYS keys (model/cuda_fwd.h; run 26 at
 * 128K: -31.5 us against the absorption forked right after the joint GEMM). One-row steps (q
 * and idx_q then lie in one output row) of the fast mode (the joint GEMM's K split need not be
 * either part's: the batch-invariant rows must not depend on the step's rows) that run the
 * indexer (need). */
static int fwd_qib(const struct fwd *F, int need, const struct fwd_layer *L)
{
	const int f = F->E->sw->qb_fuse;
	return need && F->T == 1 && L->fused_qib && !F->E->batch_invariant &&
	       (f < 0 ? F->max_n >= FWD_QB_EARLY_KEYS : f);
}

int fwd_side_close(struct fwd *F)
{
	if (!F->side_open)
		return 0;
	F->side_open = 0;
	if (cu_check(cu.cuEventRecord(F->E->ev_join, F->E->side), "cuEventRecord", __FILE__, __LINE__) ||
	    cu_check(cu.cuStreamWaitEvent(F->g->stream, F->E->ev_join, 0), "cuStreamWaitEvent", __FILE__,
		     __LINE__))
		return -EIO;
	return 0;
}

/* Index scores over positions 0..pos of each row's sequence and the top-k (§3.6.8-10): sel_pos /
 * sel_slot int [T, ksel] ascending, -1 padded. Dense (no scores) when no row has more than
 * index_topk keys. Rows go in chunks so the scores stay within SCORES_BUDGET. With them attn_q
 * (qb): on the side stream when fork_ok, between the scores and the top-k (the top-k of a few
 * rows runs on a few SMs: run 10, 20 us a layer on one block at batch 1 and 32K, while the q_b
 * GEMM and the absorption need the others) or, from FWD_FORK_EARLY_ROWS rows, before the scores;
 * DSV32_CUDA_FWD_FORK=0, dumps and the profile keep one stream, then before the selection.
 * forked: the branch forked already (fwd_qb_early); joined here all the same. */
static int fwd_select(struct fwd *F, int64_t layer, gpu_ptr iq8, gpu_ptr iw, gpu_ptr sel_pos,
		     gpu_ptr sel_slot, int ksel, const struct q_branch *qb, int forked)
{
	const struct dsv32_config *c = F->c;
	int Hi = (int)c->index_n_heads, mb = F->mb, ld = F->mb * 64;
	int need = F->max_n > c->index_topk || F->st->dump;
	long long pb = (long long)F->E->base->idx_page_bytes;
	gpu_ptr pool = fwd_pool_idx(F, layer);
	int chunk = (int)(SCORES_BUDGET / ((size_t)ld * 4));
	chunk = chunk < 1 ? 1 : chunk > F->T ? F->T : chunk;
	const int fork = !forked && fork_ok(F);
	/* forked before the scores or after them (FWD_FORK_EARLY_ROWS) */
	const int before = F->E->sw->fork == 3 || (F->E->sw->fork < 0 && F->T >= FWD_FORK_EARLY_ROWS);
	if (!forked && !fork)
		TRY(attn_q(F, qb));
	size_t mark = gpu_arena_mark(F->A);
	gpu_ptr scores = 0;
	if (need) {
		scores = fwd_take(F, (size_t)chunk * ld * 4);
		if (!scores)
			return -ENOMEM;
	}
	for (int t0 = 0; t0 < F->T; t0 += chunk) {
		int n = F->T - t0 < chunk ? F->T - t0 : chunk;
		gpu_ptr q = iq8 + (size_t)t0 * Hi * 128, w = iw + (size_t)t0 * Hi * 4;
		gpu_ptr bt = F->bt + (size_t)t0 * mb * 4, nk = F->nkeys + (size_t)t0 * 4;
		gpu_ptr op = sel_pos + (size_t)t0 * ksel * 4, os = sel_slot + (size_t)t0 * ksel * 4;
		if (fork && before)
			TRY(fork_q(F, qb));
		if (need) {
			/* FP8 tensor cores (k_indexer_scores_fp8; run 5: 2.27 TB/s at 128K x 128, the
			 * dots within 2^-23 of sum |q k|, as the fp32-exact k_indexer_scores) */
			int r = cuda_indexer_scores(F->g, q, w, Hi, pool, pb, bt, mb, nk, scores, ld, n);
			if (r)
				return fwd_fail("cuda_indexer_scores", r);
			fwd_prof_mark(F->g->stream, "indexer scores");
			TRY(fwd_dump_rows(F, "idx_scores", layer, scores, DUMP_F32, ld, -1, t0, n));
		}
		if (fork && !before)
			TRY(fork_q(F, qb));
		int r = cuda_indexer_topk(F->g, scores, ld, nk, ksel, bt, mb, op, os, n);
		if (r)
			return fwd_fail("cuda_indexer_topk", r);
		fwd_prof_mark(F->g->stream, "indexer topk");
	}
	TRY(fwd_side_close(F));
	gpu_arena_release(F->A, mark);
	return fwd_dump_all(F, "idx_topk", layer, sel_pos, DUMP_I32, ksel, ksel);
}

/* x [Tp, D] the layer input (the embedding when first), r [Tp, D] the residual stream. On
 * return x holds the layer's FFN output. first: FWD_FIRST (r starts as x) or FWD_FIRST_EMBED
 * (x unset: the norm reads the step's token embeddings, r starts as them; fused kernels only). */
int fwd_layer(struct fwd *F, int64_t layer, const struct fwd_layer *L, gpu_ptr x, gpu_ptr r,
		     int first)
{
	const struct dsv32_config *c = F->c;
	/* (not const: the kernels take their addresses) */
	int T = F->T, Tp = F->Tp, D = (int)c->hidden_size;
	int H = (int)c->num_attention_heads, dq = (int)c->qk_head_dim;
	int nope = (int)c->qk_nope_head_dim, rope = (int)c->qk_rope_head_dim;
	int Rk = (int)c->kv_lora_rank, qlr = (int)c->q_lora_rank, dv = (int)c->v_head_dim;
	int Hi = (int)c->index_n_heads, Hpad = (H + 15) / 16 * 16;
	int Nq = qlr + 128 + Rk + rope, kvo = qlr + 128; /* [q_a | idx wk | kv_a] */
	size_t mark = gpu_arena_mark(F->A);

	/* attention norm with the fused residual add: r = bf16(x + r), a = RMSNorm(x + r) */
	TAKE(a, (size_t)Tp * D * 2);          /* bf16 [Tp, D] attn_norm */
	TAKE(a8, (size_t)Tp * D);             /* e4m3 [Tp, D] */
	TAKE(as, (size_t)Tp * (D / 128) * 4); /* fp32 [Tp, D/128] */
	const int fuse = fwd_fused(F);
	gpu_ptr cs = F->m->rope_cs;
	if (first == FWD_FIRST_EMBED) { /* the rows from the embedding table, r = them, one launch */
		gpu_ptr emb = F->m->embed, nw = L->attn_norm;
		float e = (float)c->rms_norm_eps;
		int wide = D > 2048; /* fwd_rmsq's choice of block */
		LAUNCH_PDL(wide ? "k_fwd_embed_rmsnorm_1k" : "k_fwd_embed_rmsnorm", T, 1, wide ? 1024 : 256, 0,
			   &emb, &F->tok, &r, &nw, &a, &D, &e, &a8, &as);
	} else {
		if (first && cu_check(cu.cuMemcpyDtoDAsync(r, x, (size_t)T * D * 2, F->g->stream),
				      "cuMemcpyDtoDAsync", __FILE__, __LINE__))
			return -EIO;
		TRY(fwd_rmsq(F, x, D, first ? 0 : r, L->attn_norm, a, D, D, fuse ? a8 : 0, fuse ? as : 0));
	}
	if (!fuse)
		TRY(fwd_quant(F, a, a8, as, T, D));
	TRY(fwd_dump_all(F, "attn_norm", layer, a, DUMP_BF16, D, D));

	/* the projections of a (§3.3, §3.6.2): [q_a | indexer wk | kv_a] = a W^T, one GEMM when the
	 * three are placed as one matrix */
	TAKE(yq, (size_t)Tp * Nq * 2);        /* bf16 [Tp, q_lora_rank | 128 | kv_lora_rank | rope] */
	if (L->fused_qkv) {
		TRY(fwd_gemm(F, &L->qkv, a8, as, yq, T, Nq));
	} else {
		TRY(fwd_gemm(F, &L->q_a, a8, as, yq, T, Nq));
		TRY(fwd_gemm(F, &L->idx_k, a8, as, yq + (size_t)qlr * 2, T, Nq));
		TRY(fwd_gemm(F, &L->kv_a, a8, as, yq + (size_t)kvo * 2, T, Nq));
	}
	TAKE(cq, (size_t)Tp * qlr * 2);       /* bf16 [Tp, q_lora_rank] q_cmpr */
	TAKE(ckv, (size_t)Tp * Rk * 2);       /* bf16 [Tp, kv_lora_rank] kv_cmpr (pre-FP8) */
	gpu_ptr kpe = yq + (size_t)(kvo + Rk) * 2; /* bf16 [Tp, rope] in yq's rows */
	gpu_ptr ikr = yq + (size_t)qlr * 2;   /* bf16 [Tp, 128] indexer wk output, in yq's rows */
	TAKE(cq8, (size_t)Tp * qlr);
	TAKE(cqs, (size_t)Tp * (qlr / 128) * 4);
	TAKE(ik, (size_t)Tp * 128 * 2);       /* bf16 [Tp, 128] idx_k */
	float eps = (float)c->rms_norm_eps, had = (float)pow(128.0, -0.5);
	if (fuse) { /* q_norm + act_quant; kv_norm, k_pe RoPE, MLA record; indexer key and its
		     * cache write: one launch */
		gpu_ptr pm = fwd_pool_mla(F, layer), pi = fwd_pool_idx(F, layer), qnw = L->q_norm;
		gpu_ptr kvnw = L->kv_norm, inw = L->idx_k_norm_w, inb = L->idx_k_norm_b;
		int rec = (int)c->mla_record_bytes;
		long long pb = (long long)F->E->base->idx_page_bytes;
		LAUNCH_PDL("k_fwd_qkv_norms", 2 * T + (T + 7) / 8, 1, 256, 0, &yq, &Nq, &T, &eps, &qnw, &cq,
		       &qlr, &cq8, &cqs, &kvo, &kvnw, &ckv, &Rk, &F->pos, &cs, &F->slot, &pm, &rec, &inw,
		       &inb, &ik, &pi, &pb, &had);
	} else {
		TRY(fwd_rms(F, yq, Nq, 0, L->q_norm, cq, qlr, qlr));
		TRY(fwd_quant(F, cq, cq8, cqs, T, qlr));
		TRY(fwd_rms(F, yq + (size_t)kvo * 2, Nq, 0, L->kv_norm, ckv, Rk, Rk));
		TRY(fwd_rope(F, yq, 1, Nq, 0, kvo + Rk, 1));
	}
	TRY(fwd_dump_all(F, "q_cmpr", layer, cq, DUMP_BF16, qlr, qlr));
	TRY(fwd_dump_all(F, "kv_cmpr", layer, ckv, DUMP_BF16, Rk, Rk));
	TRY(fwd_dump_all(F, "k_pe", layer, kpe, DUMP_BF16, Nq, rope));

	/* lightning indexer projections (§3.6.1-7); the queries and their weights only when a row
	 * has more keys than the selection takes (else fwd_select selects every key whatever the
	 * scores: no scores run) or for the dumps */
	const int need = F->max_n > c->index_topk || F->st->dump;
	TAKE(iq, (size_t)Tp * Hi * 128 * 2);  /* bf16 [Tp, Hi, 128] idx_q */
	TAKE(iq8, (size_t)Tp * Hi * 128);     /* e4m3 */
	TAKE(iqs, (size_t)Tp * Hi * 4);       /* fp32 [Tp, Hi] s_q */
	TAKE(iw, (size_t)Tp * Hi * 4);        /* fp32 [Tp, Hi] idx_w */
	TAKE(q, (size_t)Tp * H * dq * 2);     /* bf16 [Tp, H, nope | rope] */
	TAKE(qf, (size_t)Tp * Hpad * (Rk + rope) * 2); /* bf16 [Tp, Hpad, q_lat | q_pe] */
	const int qib = fwd_qib(F, need, L);
	if (qib) { /* [q | idx_q] of the row by one GEMM */
		TAKE(qi, (size_t)Tp * L->qib.out * 2);
		TRY(fwd_gemm(F, &L->qib, cq8, cqs, qi, T, L->qib.out));
		q = qi, iq = qi + (size_t)H * dq * 2;
	}
	/* the branch forked here, beside the whole index chain (the joint GEMM's: in fwd_select) */
	const int early = !qib && fwd_qb_early(F, need);
	const struct q_branch qb = {layer, L, cq8, cqs, q, qf, fuse, qib};
	if (early)
		TRY(fork_q(F, &qb));
	if (need && !qib)
		TRY(fwd_gemm(F, &L->idx_q_b, cq8, cqs, iq, T, Hi * 128));
	float hs = (float)pow((double)Hi, -0.5), ds = had;
	gpu_ptr nw = L->idx_k_norm_w, nb = L->idx_k_norm_b;
	/* a decode step in the fast mode: weights_proj inside the query kernel (op_lin would run
	 * k_fwd_gemv_ks: the same numbers, one launch more) */
	const int qw = fuse && !F->E->batch_invariant && T <= 4 && D % 8 == 0 && Hi < 8 * F->g->sm_count;
	if (need && !qw)
		TRY_TAG("weights_proj", fwd_lin(F, L->idx_wproj, a, D, iw, 0, Hi, T, D, Hi));
	if (need && qw) { /* q: RoPE, Hadamard, act_quant, w' with w = weights_proj (the key: above) */
		gpu_ptr wp = L->idx_wproj;
		LAUNCH_PDL_ANY("k_fwd_idx_qw", T * Hi, 1, 256, 0, &iq, &iq8, &iw, &F->pos, &cs, &Hi, &had, &hs, &ds,
		       &wp, &a, &D, &D);
	} else if (need && fuse) { /* q: RoPE, Hadamard, act_quant, w' (the key is done, above) */
		int rows = T * Hi;
		LAUNCH_PDL("k_fwd_idx_q", (rows + 7) / 8, 1, 256, 0, &iq, &iq8, &iw, &F->pos, &cs,
		       &Hi, &rows, &had, &hs, &ds);
	} else if (need) {
		TRY(fwd_rope(F, iq, Hi, (long long)Hi * 128, 128, 0, 0));
		TRY(fwd_hadamard(F, iq, T * Hi));
		TRY(fwd_quant(F, iq, iq8, iqs, T * Hi, 128));
		int n = T * Hi;
		LAUNCH("k_fwd_idx_weights", (n + 255) / 256, 1, 256, 0, &iw, &iqs, &n, &hs, &ds);
	}
	if (!fuse) { /* the key: LayerNorm, RoPE, Hadamard (fused: in k_fwd_qkv_norms, above) */
		LAUNCH("k_layernorm128", (T + 7) / 8, 1, 256, 0, &ikr, &Nq, &nw, &nb, &ik, &T, &eps);
		TRY(fwd_rope(F, ik, 1, 128, 0, 0, 0));
		TRY(fwd_hadamard(F, ik, T));
	}
	TRY(fwd_dump_all(F, "idx_q", layer, iq, DUMP_BF16, Hi * 128, Hi * 128));
	TRY(fwd_dump_all(F, "idx_k", layer, ik, DUMP_BF16, 128, 128));
	TRY(fwd_dump_all(F, "idx_w", layer, iw, DUMP_F32, Hi, Hi));

	/* cache writes for every row before any row attends (done above when fused) */
	if (!fuse) {
		gpu_ptr pm = fwd_pool_mla(F, layer), pi = fwd_pool_idx(F, layer);
		int rec = (int)c->mla_record_bytes, ld128 = 128;
		long long pb = (long long)F->E->base->idx_page_bytes;
		LAUNCH("k_kv_mla_write", T, 1, 32 * (Rk / 128 + 1), 0, &ckv, &Rk, &kpe, &Nq, &F->slot, &pm,
		       &Rk, &rope, &rec);
		LAUNCH("k_kv_index_write", (T + 7) / 8, 1, 256, 0, &ik, &ld128, &F->slot, &pi, &pb, &T);
	}

	/* sparse attention: the queries (attn_q) beside the selection (or forked above), MLA over
	 * the selected slots, W_UV */
	int ksel = F->ksel;
	TAKE(sel_pos, (size_t)Tp * ksel * 4);
	TAKE(sel_slot, (size_t)Tp * ksel * 4);
	TRY(fwd_select(F, layer, iq8, iw, sel_pos, sel_slot, ksel, &qb, early));
	gpu_ptr kvb_w = L->kv_b.w, kvb_s = L->kv_b.s;
	TAKE(olat, (size_t)Tp * Hpad * Rk * 2); /* bf16 [Tp, Hpad, R] */
	if (F->E->sw->mla_fp32) { /* diagnosis: kernels_ptx/fwd_mla_fp32.cu */
		gpu_ptr pm = fwd_pool_mla(F, layer);
		int rec = (int)c->mla_record_bytes;
		float scale = c->softmax_scale;
		LAUNCH("k_fwd_mla_fp32", Hpad / 16, T, 256, 0, &qf, &sel_slot, &ksel, &pm, &rec, &Rk, &Hpad,
		       &scale, &olat);
	} else if (!F->E->batch_invariant) {
		size_t wsb = cuda_mla_decode_workspace(F->g, T, Hpad, Rk, ksel);
		gpu_ptr ws = 0;
		if (wsb && !(ws = fwd_take(F, wsb)))
			return -ENOMEM;
		int rc = cuda_mla_decode(F->g, qf, sel_slot, ksel, fwd_pool_mla(F, layer), (int)c->mla_record_bytes,
					 Rk, Hpad, T, c->softmax_scale, olat, ws);
		if (rc)
			return fwd_fail("cuda_mla_decode", rc);
		fwd_prof_mark(F->g->stream, "mla decode");
	} else {
		/* batch-invariant: the key splits a decode row gets (cuda_mla_decode_splits at one
		 * row) for every row count, in pieces of 32 rows (the split partials' workspace: 135
		 * MB at the real dimensions, within fwd_max_rows' fixed part) */
		int splits = cuda_mla_decode_splits(F->g, 1, Hpad, ksel);
		int piece = T < 32 ? T : 32;
		gpu_ptr ws = 0;
		if (splits > 1 && !(ws = fwd_take(F, (size_t)piece * Hpad * splits * (Rk + 2) * 4)))
			return -ENOMEM;
		for (int t0 = 0; t0 < T; t0 += piece) {
			int n = T - t0 < piece ? T - t0 : piece;
			int rc = cuda_mla_decode_diag(F->g, qf + (size_t)t0 * Hpad * (Rk + rope) * 2,
						      sel_slot + (size_t)t0 * ksel * 4, ksel, fwd_pool_mla(F, layer),
						      (int)c->mla_record_bytes, Rk, Hpad, n, c->softmax_scale,
						      olat + (size_t)t0 * Hpad * Rk * 2, ws, splits << 8);
			if (rc)
				return fwd_fail("cuda_mla_decode_diag", rc);
		}
		fwd_prof_mark(F->g->stream, "mla decode");
	}
	TAKE(o, (size_t)Tp * H * dv * 2);     /* bf16 [Tp, H * v_head_dim] attn_o */
	TAKE(o8, (size_t)Tp * H * dv);        /* its act_quant: e4m3 codes, fp32 scales */
	TAKE(os, (size_t)Tp * (H * dv / 128) * 4);
	int o_quantised = 0;
	if (T > MMA_ROWS) {
		int mode = 1, lda = Hpad * Rk, b_row0 = nope, b_hs = nope + dv, ldc = H * dv, out32 = 0;
		long long a_hs = Rk, c_hs = dv;
		F->tag = "uv (mma)";
		LAUNCH3("k_fwd_mma", (dv + 63) / 64, (T + 63) / 64, H, 128, &mode, &olat, &a_hs, &lda, &kvb_w,
			&kvb_s, &b_row0, &b_hs, &Rk, &o, &c_hs, &ldc, &out32, &T, &dv, &Rk);
		F->tag = NULL;
	} else if (T == 1 && fuse && dv == 128 && Rk <= 512 && Rk % 128 == 0) {
		/* a decode row, o's act_quant fused, a thread an output, its weights loaded before the
		 * wait (PDL at every row count: run 21, -7..-12 us a step) */
		LAUNCH_PDL_ANY("k_fwd_uv1_qh", H, 1, 128, FWD_UVH_SMEM, &olat, &kvb_w, &kvb_s, &o, &o8, &os, &H,
			       &Hpad, &nope, &dv, &Rk);
		o_quantised = 1;
	} else if (T == 1) { /* a decode row: one row a block */
		LAUNCH3_PDL("k_fwd_uv1", H, 1, (dv + 31) / 32, 256, &olat, &kvb_w, &kvb_s, &o, &T, &H, &Hpad,
			&nope, &dv, &Rk);
	} else {
		LAUNCH3_PDL("k_fwd_uv4", H, (T + 3) / 4, (dv + 31) / 32, 256, &olat, &kvb_w, &kvb_s, &o, &T, &H,
			&Hpad, &nope, &dv, &Rk);
	}
	TRY(fwd_dump_all(F, "attn_o", layer, o, DUMP_BF16, H * dv, H * dv));
	TAKE(ao, (size_t)Tp * D * 2);         /* bf16 [Tp, D] attn_out */
	if (!o_quantised)
		TRY(fwd_quant(F, o, o8, os, T, H * dv));
	TRY(fwd_gemm(F, &L->o, o8, os, ao, T, D));
	TRY(fwd_dump_all(F, "attn_out", layer, ao, DUMP_BF16, D, D));

	/* FFN: r = bf16(attn_out + r), f = RMSNorm(attn_out + r); x = FFN(f) (the dense MLP's
	 * act_quant of f in the norm's launch) */
	TAKE(f, (size_t)Tp * D * 2);          /* bf16 [Tp, D] ffn_norm */
	gpu_ptr f8 = 0, fs = 0;               /* e4m3 [Tp, D], fp32 [Tp, D / 128] */
	if (!L->is_moe && fuse &&
	    (!(f8 = fwd_take(F, (size_t)Tp * D)) || !(fs = fwd_take(F, (size_t)Tp * (D / 128) * 4))))
		return -ENOMEM;
	TRY(fwd_rmsq(F, ao, D, r, L->ffn_norm, f, D, D, f8, fs));
	TRY(fwd_dump_all(F, "ffn_norm", layer, f, DUMP_BF16, D, D));
	if (L->is_moe) {
		TRY(fwd_moe(F, layer, L, f, x));
	} else {
		TRY(fwd_mlp(F, &L->w13, &L->w2, f, f8, fs, x, T));
		TRY(fwd_dump_all(F, "ffn_out", layer, x, DUMP_BF16, D, D));
	}
	gpu_arena_release(F->A, mark);
	return 0;
}

#endif
