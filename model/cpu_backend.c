/*
 * cpu_backend.c — the CPU reference forward pass of DeepSeek-V3.2 behind model/backend.h.
 *
 * Reads top to bottom like the spec: the backend state, one decoder layer (§3.2-§3.9), the MTP
 * input (§4), the step (embedding, layers, final norm, lm_head §3.10), then create/destroy.
 * Numerics: activations are floats holding bf16 values, rounded once at each op's output (the
 * ops in cpu_ops.h say where); norms, softmax, RoPE, gate and head math in fp32.
 *
 * Batch invariance (issue 3): every token takes one path whatever the chunk size: its cache
 * entries are written first, then it attends with the absorbed form over keys read back from
 * the FP8 cache; every per-token op is row-independent and every reduction has one fixed
 * order; threads only split independent outputs. So full prefill, any chunking, token-by-token
 * decode and mixed batches give bit-identical logits.
 *
 * Must not: allocate pages or decide scheduling (the caller passes block tables), or sample.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "model/cpu_attn.h"
#include "model/cpu_indexer.h"
#include "model/cpu_moe.h"
#include "model/cpu_mutation.h"
#include "model/cpu_ops.h"
#include "model/cpu_pool.h"
#include "model/kv_cache.h"
#include "model/numerics.h"
#include "model/rope.h"

/* ---- backend state ---------------------------------------------------------------------- */

struct cpu_backend {
	struct backend base;
	const struct weights *w;
	struct cpu_pool *pool;
	struct kv_pools kv;      /* [n_layers] MLA and indexer pools */
	float *inv_freq;         /* [qk_rope_head_dim / 2] YaRN inverse frequencies */
	int naive_attention;     /* test switch: §3.7a instead of §3.7b */
	float *kept;             /* [n_kept, hidden] the latest main step's kept rows (backend.h) */
	int64_t n_kept, cap_kept;
};

/* The rows of one step, flattened across its sequences in order. */
struct rows {
	int64_t T;
	int32_t *tok;            /* [T] */
	int64_t *pos;            /* [T] */
	int64_t *seq;            /* [T] index into st->seqs */
	const struct backend_step *st;
};

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	ASSERT(p);
	return p;
}
#define ALLOC(type, count) ((type *)xmalloc((size_t)(count) * sizeof(type)))

/* Page holding position `pos` of row t's sequence. */
static int64_t page_of(const struct rows *R, int64_t t, int64_t pos)
{
	return R->st->seqs[R->seq[t]].block_table[pos / KV_PAGE_TOKENS];
}

/* Named intermediates: one call per row. */
static void dump_rows(const struct rows *R, const char *name, int64_t layer, const float *data,
		      int64_t width)
{
	const struct backend_dump *d = R->st->dump;
	if (!d)
		return;
	for (int64_t t = 0; t < R->T; t++)
		d->fn(d->ctx, name, layer, R->seq[t], R->pos[t], 0, data + t * width, width);
}

static void dump_row(const struct rows *R, const char *name, int64_t layer, int64_t t,
		     int is_int, const void *data, int64_t n)
{
	const struct backend_dump *d = R->st->dump;
	if (d)
		d->fn(d->ctx, name, layer, R->seq[t], R->pos[t], is_int, data, n);
}

/* ---- sparse attention of one row (§3.6.8-10, §3.7) ------------------------------------- */

/* Index scores over positions 0..pos of the row's sequence, top-k, gather of the selected
 * MLA cache rows, attention. q: [heads, qk_head_dim], q8: [H_idx, D_idx] codes, w: [H_idx],
 * o: [heads, v_head_dim] out. */
static void attend_row(struct cpu_backend *b, const struct rows *R, int64_t layer, int64_t t,
		       const float *q, const uint8_t *q8, const float *w, float *o)
{
	const struct dsv32_config *c = b->base.c;
	int64_t n = R->pos[t] + 1, Rk = c->kv_lora_rank, dkv = Rk + c->qk_rope_head_dim;
	if (cpu_mutated(CPU_MUTATION_SELF_EXCLUDED) && n > 1)
		n--; /* spec: the query's own key is a candidate (pitfall 9) */
	int64_t k_max = cpu_mutated(CPU_MUTATION_TOPK_IGNORED) ? n : c->index_topk;
	const uint8_t **keys = ALLOC(const uint8_t *, n); /* [n] indexer key codes per position */
	float *k_s = ALLOC(float, n);                      /* [n] */
	float *scores = ALLOC(float, n);                   /* [n] idx_scores */
	int32_t *sel = ALLOC(int32_t, n);                  /* [k] selected positions, ascending */
	for (int64_t s = 0; s < n; s++) {
		const uint8_t *page = kv_pools_idx(&b->kv, layer, page_of(R, t, s));
		keys[s] = kv_index_codes(c, page, s % KV_PAGE_TOKENS);
		k_s[s] = kv_index_scale(c, page, s % KV_PAGE_TOKENS);
	}
	indexer_scores(b->pool, c, q8, w, keys, k_s, n, scores);
	int64_t k = indexer_topk(scores, n, k_max, sel);
	dump_row(R, "idx_scores", layer, t, 0, scores, n);
	dump_row(R, "idx_topk", layer, t, 1, sel, k);

	float *kv = ALLOC(float, k * dkv); /* [k, kv_lora_rank + rope] selected cache rows */
	for (int64_t i = 0; i < k; i++) {
		const uint8_t *page = kv_pools_mla(&b->kv, layer, page_of(R, t, sel[i]));
		kv_mla_read(c, page, sel[i] % KV_PAGE_TOKENS, kv + i * dkv);
	}
	const struct layer_weights *lw = layer < c->num_hidden_layers ? &b->w->layers[layer]
								      : &b->w->mtp.layer;
	if (b->naive_attention) {
		attn_naive(b->pool, c, &lw->wkv_b, q, kv, k, o);
	} else {
		float *q_lat = R->st->dump ? ALLOC(float, c->num_attention_heads * Rk) : NULL;
		attn_absorbed(b->pool, c, &lw->wkv_b, q, kv, k, o, q_lat); /* q_lat [heads, R] */
		if (q_lat)
			dump_row(R, "q_lat", layer, t, 0, q_lat, c->num_attention_heads * Rk);
		free(q_lat);
	}
	free(keys);
	free(k_s);
	free(scores);
	free(sel);
	free(kv);
}

/* ---- one decoder layer (§3.2) -------------------------------------------------------------- */

/* MLA RoPE: interleaved pairs (x[2i], x[2i+1]) (spec §3.4, pitfall 1). x: [rope] */
static void mla_rope(float *x, const float *cs, int64_t half)
{
	if (cpu_mutated(CPU_MUTATION_MLA_ROPE_HALFSPLIT))
		rope_apply_halfsplit(x, cs, cs + half, half);
	else
		rope_apply_interleaved(x, cs, cs + half, half);
}

/* The q_b_proj head layout is [nope | rope] (spec §7.2); the mutation reads it rope-first by
 * rotating each head so that its first rope values land in the rope slot. q: [T, H, dq] */
static void q_head_layout(const struct dsv32_config *c, float *q, int64_t T)
{
	if (!cpu_mutated(CPU_MUTATION_Q_HEAD_ROPE_FIRST))
		return;
	int64_t dq = c->qk_head_dim, rope = c->qk_rope_head_dim;
	float *tmp = ALLOC(float, dq);
	for (int64_t i = 0; i < T * c->num_attention_heads; i++) {
		memcpy(tmp, q + i * dq + rope, (size_t)(dq - rope) * sizeof *tmp);
		memcpy(tmp + dq - rope, q + i * dq, (size_t)rope * sizeof *tmp);
		memcpy(q + i * dq, tmp, (size_t)dq * sizeof *tmp);
	}
	free(tmp);
}

/* x: [T, hidden] the previous layer's output (or the embedding when first), r: [T, hidden] the
 * bf16 residual stream. On return x holds this layer's FFN output. */
static void layer_forward(struct cpu_backend *b, const struct rows *R,
			  const struct layer_weights *lw, int64_t layer, float *x, float *r,
			  int first)
{
	const struct dsv32_config *c = b->base.c;
	struct cpu_pool *p = b->pool;
	const int64_t T = R->T, D = c->hidden_size;
	const float eps = (float)c->rms_norm_eps;
	const int64_t H = c->num_attention_heads, dq = c->qk_head_dim, nope = c->qk_nope_head_dim;
	const int64_t rope = c->qk_rope_head_dim, half = rope / 2, Rk = c->kv_lora_rank;
	const int64_t qlr = c->q_lora_rank, dv = c->v_head_dim;
	const int64_t Hi = c->index_n_heads, Di = c->index_head_dim;

	/* attention norm with the fused residual add: r = bf16(x + r), a = RMSNorm(x + r) */
	float *a = ALLOC(float, T * D); /* [T, D] attn_norm */
	for (int64_t t = 0; t < T; t++) {
		if (first) {
			memcpy(r + t * D, x + t * D, (size_t)D * sizeof *r);
			cpu_rmsnorm(a + t * D, x + t * D, lw->attn_norm, D, eps);
		} else {
			cpu_add_rmsnorm(a + t * D, x + t * D, r + t * D, lw->attn_norm, D, eps);
		}
	}
	dump_rows(R, "attn_norm", layer, a, D);

	/* MLA projections (§3.3) */
	float *q_a = ALLOC(float, T * qlr);     /* [T, q_lora_rank] */
	float *c_q = ALLOC(float, T * qlr);     /* [T, q_lora_rank] q_cmpr, also feeds the indexer */
	float *q = ALLOC(float, T * H * dq);    /* [T, H, nope | rope] */
	float *kv_a = ALLOC(float, T * (Rk + rope)); /* [T, kv_lora_rank | rope] */
	float *c_kv = ALLOC(float, T * Rk);     /* [T, kv_lora_rank] kv_cmpr (pre-FP8) */
	float *k_pe = ALLOC(float, T * rope);   /* [T, rope] post-RoPE */
	float *cs = ALLOC(float, rope);         /* [half cos | half sin] */
	cpu_fp8_linear(p, &lw->wq_a, a, T, q_a);
	for (int64_t t = 0; t < T; t++)
		cpu_rmsnorm(c_q + t * qlr, q_a + t * qlr, lw->q_norm, qlr, eps);
	cpu_fp8_linear(p, &lw->wq_b, c_q, T, q);
	q_head_layout(c, q, T);
	cpu_fp8_linear(p, &lw->wkv_a, a, T, kv_a);
	for (int64_t t = 0; t < T; t++) {
		const float *kvt = kv_a + t * (Rk + rope);
		cpu_rmsnorm(c_kv + t * Rk, kvt, lw->kv_norm, Rk, eps);
		memcpy(k_pe + t * rope, kvt + Rk, (size_t)rope * sizeof *k_pe);
		rope_cos_sin(b->inv_freq, half, R->pos[t], cs, cs + half);
		mla_rope(k_pe + t * rope, cs, half);
		for (int64_t h = 0; h < H; h++)
			mla_rope(q + (t * H + h) * dq + nope, cs, half);
	}
	dump_rows(R, "q_cmpr", layer, c_q, qlr);
	dump_rows(R, "q", layer, q, H * dq);
	dump_rows(R, "kv_cmpr", layer, c_kv, Rk);
	dump_rows(R, "k_pe", layer, k_pe, rope);

	/* lightning indexer projections (§3.6.1-7) */
	float *iq = ALLOC(float, T * Hi * Di);     /* [T, Hi, Di] idx_q (pre-FP8) */
	uint8_t *iq8 = ALLOC(uint8_t, T * Hi * Di); /* [T, Hi, Di] e4m3 codes */
	float *iw = ALLOC(float, T * Hi);          /* [T, Hi] idx_w, s_q folded in */
	float *ik = ALLOC(float, T * Di);          /* [T, Di] idx_k (pre-FP8) */
	uint8_t *ik8 = ALLOC(uint8_t, T * Di);     /* [T, Di] */
	float *iks = ALLOC(float, T);              /* [T] */
	indexer_project(p, c, lw, b->inv_freq, a, c_q, R->pos, T, iq, iq8, iw, ik, ik8, iks);
	dump_rows(R, "idx_q", layer, iq, Hi * Di);
	dump_rows(R, "idx_k", layer, ik, Di);
	dump_rows(R, "idx_w", layer, iw, Hi);

	/* cache writes for every row before any row attends */
	for (int64_t t = 0; t < T; t++) {
		int64_t page = page_of(R, t, R->pos[t]), slot = R->pos[t] % KV_PAGE_TOKENS;
		kv_mla_write(c, kv_pools_mla(&b->kv, layer, page), slot, c_kv + t * Rk,
			     k_pe + t * rope);
		kv_index_write(c, kv_pools_idx(&b->kv, layer, page), slot, ik8 + t * Di, iks[t]);
	}

	/* sparse attention per row, then the output projection */
	float *o = ALLOC(float, T * H * dv);      /* [T, H, v_head_dim] */
	float *attn_out = ALLOC(float, T * D);    /* [T, D] */
	for (int64_t t = 0; t < T; t++)
		attend_row(b, R, layer, t, q + t * H * dq, iq8 + t * Hi * Di, iw + t * Hi,
			   o + t * H * dv);
	dump_rows(R, "attn_o", layer, o, H * dv);
	cpu_fp8_linear(p, &lw->wo, o, T, attn_out);
	dump_rows(R, "attn_out", layer, attn_out, D);

	/* FFN: r = bf16(attn_out + r), f = RMSNorm(attn_out + r); x = FFN(f) */
	float *f = ALLOC(float, T * D); /* [T, D] ffn_norm */
	for (int64_t t = 0; t < T; t++)
		cpu_add_rmsnorm(f + t * D, attn_out + t * D, r + t * D, lw->ffn_norm, D, eps);
	dump_rows(R, "ffn_norm", layer, f, D);
	if (lw->is_moe) {
		int64_t E = c->n_routed_experts, K = c->num_experts_per_tok;
		int32_t *idx = ALLOC(int32_t, T * K); /* [T, K] ascending expert ids */
		float *wts = ALLOC(float, T * K);     /* [T, K] */
		float *logits = ALLOC(float, T * E);  /* [T, E] fp32 router logits */
		moe_forward(p, c, lw, f, T, x, idx, wts, logits);
		dump_rows(R, "ffn_moe_logits", layer, logits, E);
		for (int64_t t = 0; t < T; t++)
			dump_row(R, "ffn_moe_topk", layer, t, 1, idx + t * K, K);
		dump_rows(R, "ffn_moe_weights", layer, wts, K);
		dump_rows(R, "ffn_moe_out", layer, x, D);
		free(idx);
		free(wts);
		free(logits);
	} else {
		mlp_forward(p, &lw->w1, &lw->w3, &lw->w2, f, T, x);
		dump_rows(R, "ffn_out", layer, x, D);
	}
	free(a);
	free(q_a);
	free(c_q);
	free(q);
	free(kv_a);
	free(c_kv);
	free(k_pe);
	free(cs);
	free(iq);
	free(iq8);
	free(iw);
	free(ik);
	free(ik8);
	free(iks);
	free(o);
	free(attn_out);
	free(f);
}

/* ---- MTP input (§4): z = eh_proj([enorm(embed(x_{i+1})) ; hnorm(h_i)]) ---------------------- */

static void mtp_input(struct cpu_backend *b, const struct rows *R, float *z)
{
	const struct dsv32_config *c = b->base.c;
	const struct mtp_weights *m = &b->w->mtp;
	int64_t T = R->T, D = c->hidden_size;
	float eps = (float)c->rms_norm_eps;
	float *e = ALLOC(float, T * D);       /* [T, D] embedding of x_{i+1} */
	float *cat = ALLOC(float, T * 2 * D); /* [T, enorm(e) | hnorm(h)] */
	cpu_embed(&m->embed, R->tok, T, e);
	int64_t *row_in_seq = ALLOC(int64_t, R->st->n_seqs); /* running row index per sequence */
	memset(row_in_seq, 0, (size_t)R->st->n_seqs * sizeof *row_in_seq);
	for (int64_t t = 0; t < T; t++) {
		const struct backend_seq *s = &R->st->seqs[R->seq[t]];
		const int64_t j = row_in_seq[R->seq[t]]++;
		const float *h = s->mtp_hidden ? s->mtp_hidden + j * D /* [D] given or kept */
					       : b->kept + (s->mtp_kept + j) * D;
		int64_t e_at = 0, h_at = D; /* [e ; h]: the engines' order (spec §4, pitfall 12) */
		if (cpu_mutated(CPU_MUTATION_MTP_CONCAT_SWAPPED))
			e_at = D, h_at = 0;
		cpu_rmsnorm(cat + t * 2 * D + e_at, e + t * D, m->enorm, D, eps);
		cpu_rmsnorm(cat + t * 2 * D + h_at, h, m->hnorm, D, eps);
	}
	dump_rows(R, "mtp_cat", c->num_hidden_layers, cat, 2 * D);
	cpu_bf16_linear(b->pool, &m->eh_proj, cat, T, z, 1);
	dump_rows(R, "mtp_eh_proj", c->num_hidden_layers, z, D);
	free(e);
	free(cat);
	free(row_in_seq);
}

/* ---- the step ------------------------------------------------------------------------------- */

static int cpu_step(struct backend *base, const struct backend_step *st)
{
	struct cpu_backend *b = (struct cpu_backend *)base;
	const struct dsv32_config *c = base->c;
	const struct weights *w = b->w;
	int r_ = backend_validate_step(base, w, st);
	if (r_)
		return r_;
	if (!backend_kept_ok(st, b->n_kept))
		return -EINVAL;
	if (!st->mtp)
		b->n_kept = 0; /* (replaced below by this step's KEEP rows) */
	struct rows R = {0, NULL, NULL, NULL, st};
	for (int64_t i = 0; i < st->n_seqs; i++)
		R.T += st->seqs[i].n;
	if (R.T == 0)
		return 0;
	int64_t T = R.T, D = c->hidden_size, V = c->vocab_size;
	R.tok = ALLOC(int32_t, T);
	R.pos = ALLOC(int64_t, T);
	R.seq = ALLOC(int64_t, T);
	for (int64_t i = 0, t = 0; i < st->n_seqs; i++)
		for (int64_t j = 0; j < st->seqs[i].n; j++, t++) {
			R.tok[t] = st->seqs[i].tokens[j];
			R.pos[t] = st->seqs[i].pos[j];
			R.seq[t] = i;
		}

	float *x = ALLOC(float, T * D); /* [T, D] layer input / output */
	float *r = ALLOC(float, T * D); /* [T, D] residual stream (bf16 values) */
	const float *norm;
	const struct bf16_mat *head;
	if (!st->mtp) {
		cpu_embed(&w->embed, R.tok, T, x);
		dump_rows(&R, "embed", -1, x, D);
		for (int64_t l = 0; l < c->num_hidden_layers; l++)
			layer_forward(b, &R, &w->layers[l], l, x, r, l == 0);
		norm = w->norm;
		head = &w->lm_head;
	} else {
		mtp_input(b, &R, x);
		layer_forward(b, &R, &w->mtp.layer, c->num_hidden_layers, x, r, 1);
		norm = w->mtp.head_norm;
		head = &w->mtp.head;
	}

	/* final norm of the fp32 sum x + r (§3.2), then the fp32 head for the flagged rows */
	float *out = ALLOC(float, T * D);  /* [T, D] result_norm */
	float *pre = ALLOC(float, T * D);  /* [T, D] bf16(x + r), the MTP block's output */
	float *sum = ALLOC(float, D);      /* [D] fp32 */
	int64_t n_logits = 0;
	for (int64_t t = 0; t < T; t++) {
		for (int64_t i = 0; i < D; i++) {
			sum[i] = x[t * D + i] + r[t * D + i];
			pre[t * D + i] = bf16_round(sum[i]);
		}
		cpu_rmsnorm(out + t * D, sum, norm, D, (float)c->rms_norm_eps);
	}
	int64_t layer_tag = st->mtp ? c->num_hidden_layers : -1;
	dump_rows(&R, "result_norm", layer_tag, out, D);
	float *hrows = ALLOC(float, T * D);     /* [n_logits, D] rows that need logits */
	int64_t *hrow_t = ALLOC(int64_t, T);    /* [n_logits] their row index */
	for (int64_t i = 0, t = 0; i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		int64_t n_hidden = 0;
		for (int64_t j = 0; j < s->n; j++, t++) {
			unsigned fl = s->flags ? s->flags[j] : (j == s->n - 1 ? BACKEND_ROW_LOGITS : 0);
			if (fl & BACKEND_ROW_HIDDEN)
				memcpy(s->hidden + n_hidden++ * D, (st->mtp ? pre : out) + t * D,
				       (size_t)D * sizeof *out);
			if (fl & BACKEND_ROW_KEEP) {
				if (b->n_kept == b->cap_kept) {
					b->cap_kept = b->cap_kept ? 2 * b->cap_kept : 64;
					b->kept = realloc(b->kept, (size_t)(b->cap_kept * D) * sizeof *b->kept);
					ASSERT(b->kept);
				}
				memcpy(b->kept + b->n_kept++ * D, out + t * D, (size_t)D * sizeof *out);
			}
			if (fl & BACKEND_ROW_LOGITS) {
				memcpy(hrows + n_logits * D, out + t * D, (size_t)D * sizeof *out);
				hrow_t[n_logits++] = t;
			}
		}
	}
	if (n_logits) {
		float *logits = ALLOC(float, n_logits * V); /* [n_logits, V] fp32 */
		cpu_bf16_linear(b->pool, head, hrows, n_logits, logits, 0);
		for (int64_t i = 0, k = 0; i < st->n_seqs; i++) {
			int64_t n_out = 0;
			while (k < n_logits && R.seq[hrow_t[k]] == i) {
				memcpy(st->seqs[i].logits + n_out++ * V, logits + k * V,
				       (size_t)V * sizeof *logits);
				k++;
			}
		}
		free(logits);
	}
	free(hrows);
	free(hrow_t);
	free(out);
	free(pre);
	free(sum);
	free(x);
	free(r);
	free(R.tok);
	free(R.pos);
	free(R.seq);
	return 0;
}

/* ---- pages, create, destroy ------------------------------------------------------------------- */

static int cpu_page_io(struct backend *base, int64_t layer, enum backend_pool pool, int64_t page,
		       void *buf, int write)
{
	struct cpu_backend *b = (struct cpu_backend *)base;
	if (layer < 0 || layer >= base->n_layers || page < 0 || page >= base->n_pages || !buf)
		return -EINVAL;
	uint8_t *p = pool == BACKEND_POOL_MLA ? kv_pools_mla(&b->kv, layer, page)
					      : kv_pools_idx(&b->kv, layer, page);
	size_t n = pool == BACKEND_POOL_MLA ? base->mla_page_bytes : base->idx_page_bytes;
	if (write)
		memcpy(p, buf, n);
	else
		memcpy(buf, p, n);
	return 0;
}

static void cpu_destroy(struct backend *base)
{
	struct cpu_backend *b = (struct cpu_backend *)base;
	cpu_pool_stop(b->pool);
	kv_pools_free(&b->kv);
	free(b->inv_freq);
	free(b->kept);
	free(b);
}

static const struct backend_ops cpu_ops = {"cpu", cpu_step, cpu_page_io, cpu_destroy};

int backend_cpu_create(const struct dsv32_config *c, const struct weights *w, int64_t n_pages,
		       int n_threads, struct backend **out, struct err *e)
{
	*out = NULL;
	if (n_pages < 1 || n_threads < 1)
		return err_set(e, -EINVAL, "cpu backend: n_pages (%lld) and n_threads (%d) must be >= 1",
			       (long long)n_pages, n_threads);
	if (c->kv_lora_rank % 128 || c->index_head_dim % 128 || c->qk_rope_head_dim % 2)
		return err_set(e, -EINVAL, "cpu backend: kv_lora_rank and index_head_dim must be "
					   "multiples of 128");
	struct cpu_backend *b = calloc(1, sizeof *b);
	if (!b)
		return err_set(e, -ENOMEM, "cpu backend: out of memory");
	b->base.ops = &cpu_ops;
	b->base.c = c;
	b->base.n_layers = c->num_hidden_layers + (w->has_mtp ? 1 : 0);
	b->base.n_pages = n_pages;
	b->base.mla_page_bytes = kv_mla_page_bytes(c);
	b->base.idx_page_bytes = kv_index_page_bytes(c);
	b->w = w;
	b->inv_freq = malloc((size_t)(c->qk_rope_head_dim / 2) * sizeof *b->inv_freq);
	b->pool = cpu_pool_start(n_threads);
	if (!b->inv_freq || !b->pool || kv_pools_init(&b->kv, c, b->base.n_layers, n_pages)) {
		cpu_pool_stop(b->pool);
		free(b->inv_freq);
		free(b);
		return err_set(e, -ENOMEM, "cpu backend: cannot allocate %lld KV pages",
			       (long long)n_pages);
	}
	const char *mut = getenv("DSV32_CPU_MUTATION"); /* test-only, cpu_mutation.h */
	if (mut && *mut && cpu_mutation_set(mut)) {
		cpu_destroy(&b->base);
		return err_set(e, -EINVAL, "DSV32_CPU_MUTATION=%s: unknown mutation", mut);
	}
	if (cpu_mutation != CPU_MUTATION_NONE)
		fprintf(stderr, "dsv32: cpu backend: TEST MUTATION '%s' is on (spec deliberately "
				"violated)\n", cpu_mutation_name(cpu_mutation));
	if (cpu_mutated(CPU_MUTATION_KV_B_SWAPPED) && c->qk_nope_head_dim != c->v_head_dim) {
		cpu_destroy(&b->base);
		return err_set(e, -EINVAL, "mutation kv_b_swapped needs qk_nope_head_dim == v_head_dim");
	}
	rope_inv_freq(c, b->inv_freq, NULL, NULL);
	*out = &b->base;
	return 0;
}

void backend_cpu_set_naive_attention(struct backend *base, int on)
{
	ASSERT(base->ops == &cpu_ops);
	((struct cpu_backend *)base)->naive_attention = on;
}

/* Test-only (issue 4, teacher forcing): runs decoder layer `layer` alone on the step's rows. */
int backend_cpu_layer_step(struct backend *base, int64_t layer, const struct backend_step *st,
			   float *x, float *r)
{
	ASSERT(base->ops == &cpu_ops);
	struct cpu_backend *b = (struct cpu_backend *)base;
	const struct dsv32_config *c = base->c;
	if (layer < 0 || layer >= base->n_layers || st->mtp)
		return -EINVAL;
	int rc = backend_validate_step(base, b->w, st);
	if (rc)
		return rc;
	struct rows R = {0, NULL, NULL, NULL, st};
	for (int64_t i = 0; i < st->n_seqs; i++)
		R.T += st->seqs[i].n;
	R.tok = ALLOC(int32_t, R.T);
	R.pos = ALLOC(int64_t, R.T);
	R.seq = ALLOC(int64_t, R.T);
	for (int64_t i = 0, t = 0; i < st->n_seqs; i++)
		for (int64_t j = 0; j < st->seqs[i].n; j++, t++) {
			R.tok[t] = st->seqs[i].tokens[j];
			R.pos[t] = st->seqs[i].pos[j];
			R.seq[t] = i;
		}
	int is_mtp = layer == c->num_hidden_layers;
	if (R.T)
		layer_forward(b, &R, is_mtp ? &b->w->mtp.layer : &b->w->layers[layer], layer, x, r,
			      layer == 0 || is_mtp);
	free(R.tok);
	free(R.pos);
	free(R.seq);
	return 0;
}
