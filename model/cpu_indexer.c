/*
 * cpu_indexer.c — lightning indexer ops (see cpu_indexer.h).
 */
#include "model/cpu_indexer.h"

#include <math.h>
#include <stdlib.h>

#include "model/cpu_mutation.h"
#include "model/cpu_ops.h"
#include "model/err.h"
#include "model/numerics.h"
#include "model/rope.h"

/* ---- per-token projections ------------------------------------------------------------- */

/* The indexer's RoPE layout: half-split pairs (x[i], x[i + 32]), spec §3.4 / pitfall 1. */
static void indexer_rope(float *x, const float *cs, int64_t half)
{
	if (cpu_mutated(CPU_MUTATION_INDEXER_ROPE_INTERLEAVED))
		rope_apply_interleaved(x, cs, cs + half, half);
	else
		rope_apply_halfsplit(x, cs, cs + half, half);
}

void indexer_project(struct cpu_pool *p, const struct dsv32_config *c,
		     const struct layer_weights *lw, const float *inv, const float *a,
		     const float *c_q, const int64_t *pos, int64_t T, float *q, uint8_t *q8,
		     float *w, float *k, uint8_t *k8, float *k_s)
{
	int64_t H = c->index_n_heads, D = c->index_head_dim, rope = c->qk_rope_head_dim;
	int64_t half = rope / 2;
	float *cs = malloc((size_t)rope * sizeof *cs); /* [half cos | half sin] */
	float *kraw = malloc((size_t)(T * D) * sizeof *kraw); /* [T, D] wk output */
	float *q_s = malloc((size_t)H * sizeof *q_s);   /* [H] */
	ASSERT(cs && kraw && q_s);
	cpu_fp8_linear(p, &lw->idx_wq_b, c_q, T, q);   /* q [T, H, D], per head [pe | nope] */
	cpu_fp8_linear(p, &lw->idx_wk, a, T, kraw);     /* kraw [T, D] */
	cpu_bf16_linear(p, &lw->idx_weights_proj, a, T, w, 0); /* w [T, H] fp32 */
	float head_scale = (float)pow((double)H, -0.5), dim_scale = (float)pow((double)D, -0.5);
	for (int64_t t = 0; t < T; t++) {
		rope_cos_sin(inv, half, pos[t], cs, cs + half);
		for (int64_t h = 0; h < H; h++) {
			float *qh = q + (t * H + h) * D; /* [D] */
			indexer_rope(qh, cs, half);
			cpu_hadamard(qh, D);
			cpu_act_quant(qh, D, q8 + (t * H + h) * D, &q_s[h]);
		}
		for (int64_t h = 0; h < H; h++)
			w[t * H + h] = w[t * H + h] * head_scale * q_s[h] * dim_scale;
		float *kt = k + t * D; /* [D] */
		cpu_layernorm(kt, kraw + t * D, lw->idx_k_norm_w, lw->idx_k_norm_b, D,
			      (float)c->rms_norm_eps);
		indexer_rope(kt, cs, half);
		if (!cpu_mutated(CPU_MUTATION_HADAMARD_Q_ONLY))
			cpu_hadamard(kt, D);
		cpu_act_quant(kt, D, k8 + t * D, &k_s[t]);
	}
	free(cs);
	free(kraw);
	free(q_s);
}

/* ---- scores ---------------------------------------------------------------------------- */

struct score_job {
	const struct dsv32_config *c;
	const float *qf;  /* [H, D] decoded e4m3 values */
	const float *w;   /* [H] */
	const uint8_t *const *keys;
	const float *k_s;
	float *scores;
};

static void score_keys(void *a, int64_t s0, int64_t s1)
{
	struct score_job *j = a;
	int64_t H = j->c->index_n_heads, D = j->c->index_head_dim;
	const float *lut = cpu_e4m3_table();
	float *kf = malloc((size_t)D * sizeof *kf); /* [D] */
	ASSERT(kf);
	for (int64_t s = s0; s < s1; s++) {
		for (int64_t d = 0; d < D; d++)
			kf[d] = lut[j->keys[s][d]];
		float sum = 0;
		for (int64_t h = 0; h < H; h++) {
			float dot = cpu_dot(j->qf + h * D, kf, D);
			if (!cpu_mutated(CPU_MUTATION_INDEXER_NO_RELU))
				dot = dot > 0 ? dot : 0;
			sum += dot * j->w[h];
		}
		j->scores[s] = cpu_mutated(CPU_MUTATION_INDEXER_NO_K_SCALE) ? sum : sum * j->k_s[s];
	}
	free(kf);
}

void indexer_scores(struct cpu_pool *p, const struct dsv32_config *c, const uint8_t *q8,
		    const float *w, const uint8_t *const *keys, const float *k_s, int64_t n,
		    float *scores)
{
	int64_t H = c->index_n_heads, D = c->index_head_dim;
	const float *lut = cpu_e4m3_table();
	float *qf = malloc((size_t)(H * D) * sizeof *qf); /* [H, D] */
	ASSERT(qf);
	for (int64_t i = 0; i < H * D; i++)
		qf[i] = lut[q8[i]];
	struct score_job j = {c, qf, w, keys, k_s, scores};
	cpu_pool_run(p, score_keys, &j, n, 64);
	free(qf);
}

/* ---- top-k ----------------------------------------------------------------------------- */

struct ranked {
	float score;
	int32_t pos;
};

/* Higher score first; equal scores: lower position first; NaN after every number. */
static int ranked_cmp(const void *pa, const void *pb)
{
	const struct ranked *a = pa, *b = pb;
	int na = isnan(a->score), nb = isnan(b->score);
	if (na != nb)
		return na - nb;
	if (!na && a->score != b->score)
		return a->score > b->score ? -1 : 1;
	return (a->pos > b->pos) - (a->pos < b->pos);
}

static int int32_cmp(const void *pa, const void *pb)
{
	int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
	return (a > b) - (a < b);
}

int64_t indexer_topk(const float *scores, int64_t n, int64_t k_max, int32_t *sel)
{
	int64_t k = n < k_max ? n : k_max;
	if (k == n) { /* every key selected: no ranking needed */
		for (int64_t s = 0; s < n; s++)
			sel[s] = (int32_t)s;
		return k;
	}
	struct ranked *r = malloc((size_t)n * sizeof *r); /* [n] */
	ASSERT(r);
	for (int64_t s = 0; s < n; s++)
		r[s] = (struct ranked){scores[s], (int32_t)s};
	qsort(r, (size_t)n, sizeof *r, ranked_cmp);
	for (int64_t i = 0; i < k; i++)
		sel[i] = r[i].pos;
	qsort(sel, (size_t)k, sizeof *sel, int32_cmp);
	free(r);
	return k;
}
