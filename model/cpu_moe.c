/*
 * cpu_moe.c — dense MLP, MoE gate and experts (see cpu_moe.h).
 *
 * Experts run on the rows routed to them (gathered), which changes nothing numerically: every
 * op is row-independent. The per-token sum then visits the picks in ascending expert id, as
 * the reference's loop over experts does, and adds the shared expert last.
 */
#include "model/cpu_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/cpu_mutation.h"
#include "model/cpu_ops.h"
#include "model/err.h"
#include "model/numerics.h"

/* ---- dense SwiGLU MLP ------------------------------------------------------------------ */

void mlp_forward(struct cpu_pool *p, const struct fp8_linear *w1, const struct fp8_linear *w3,
		 const struct fp8_linear *w2, const float *x, int64_t T, float *y)
{
	int64_t inter = w1->out;
	float *g = malloc((size_t)(T * inter) * sizeof *g); /* [T, inter] gate_proj */
	float *u = malloc((size_t)(T * inter) * sizeof *u); /* [T, inter] up_proj */
	ASSERT(g && u);
	cpu_fp8_linear(p, w1, x, T, g);
	cpu_fp8_linear(p, w3, x, T, u);
	cpu_swiglu(g, g, u, T * inter);
	cpu_fp8_linear(p, w2, g, T, y);
	free(g);
	free(u);
}

/* ---- gate ------------------------------------------------------------------------------ */

/* Index of the largest v[i] among i in [0, n) with !taken[i]; ties to the lower index. */
static int64_t argmax_free(const float *v, const uint8_t *taken, int64_t n)
{
	int64_t best = -1;
	for (int64_t i = 0; i < n; i++)
		if (!taken[i] && (best < 0 || v[i] > v[best]))
			best = i;
	return best;
}

void moe_route(const struct dsv32_config *c, const float *logits, const float *bias,
	       int32_t *idx, float *wts)
{
	int64_t E = c->n_routed_experts, K = c->num_experts_per_tok;
	int64_t G = c->n_group, per = E / G;
	float *sc = malloc((size_t)E * sizeof *sc);   /* [E] sigmoid scores (weights) */
	float *sel = malloc((size_t)E * sizeof *sel); /* [E] biased scores (selection) */
	uint8_t *taken = calloc((size_t)(E > G ? E : G), 1);
	float *gscore = malloc((size_t)G * sizeof *gscore); /* [G] */
	ASSERT(sc && sel && taken && gscore);
	for (int64_t e = 0; e < E; e++) {
		/* sigmoid in double, rounded once: the GPU gate (kernels_ptx/moe_gate.cu) computes the
		 * same, so both route identically even at near ties */
		sc[e] = (float)(1.0 / (1.0 + exp(-(double)logits[e])));
		sel[e] = sc[e];
		if (bias && !cpu_mutated(CPU_MUTATION_GATE_BIAS_IGNORED))
			sel[e] += bias[e]; /* selection only (pitfall 6) */
	}
	if (G > 1 && !cpu_mutated(CPU_MUTATION_NO_GROUP_LIMIT)) {
		/* group score = sum of the group's top-2 biased scores; keep topk_group groups */
		for (int64_t g = 0; g < G; g++) {
			const float *s = sel + g * per;
			int64_t a = 0;
			for (int64_t i = 1; i < per; i++)
				if (s[i] > s[a])
					a = i;
			int64_t b = -1;
			for (int64_t i = 0; i < per; i++)
				if (i != a && (b < 0 || s[i] > s[b]))
					b = i;
			gscore[g] = b < 0 ? s[a] : s[a] + s[b];
		}
		for (int64_t n = 0; n < c->topk_group; n++)
			taken[argmax_free(gscore, taken, G)] = 1;
		for (int64_t g = 0; g < G; g++)
			if (!taken[g])
				for (int64_t i = 0; i < per; i++)
					sel[g * per + i] = -INFINITY;
		memset(taken, 0, (size_t)G);
	}
	float sum = 0;
	for (int64_t n = 0; n < K; n++) {
		int64_t e = argmax_free(sel, taken, E);
		ASSERT(e >= 0);
		taken[e] = 1;
		idx[n] = (int32_t)e;
		wts[n] = sc[e];
		if (bias && cpu_mutated(CPU_MUTATION_GATE_BIAS_IN_WEIGHTS))
			wts[n] += bias[e];
		sum += wts[n];
	}
	float route_scale = (float)c->routed_scaling_factor;
	for (int64_t n = 0; n < K; n++) {
		if (c->norm_topk_prob && !cpu_mutated(CPU_MUTATION_NO_RENORM))
			wts[n] /= sum;
		if (!cpu_mutated(CPU_MUTATION_NO_ROUTE_SCALE))
			wts[n] *= route_scale;
	}
	/* ascending expert id (insertion sort, K is small), weights follow */
	for (int64_t i = 1; i < K; i++)
		for (int64_t j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
			int32_t ti = idx[j];
			idx[j] = idx[j - 1];
			idx[j - 1] = ti;
			float tw = wts[j];
			wts[j] = wts[j - 1];
			wts[j - 1] = tw;
		}
	free(sc);
	free(sel);
	free(taken);
	free(gscore);
}

/* ---- MoE block ------------------------------------------------------------------------- */

/* y[t] = sum over token t's picks in ascending expert id (idx NULL: every pick; else those
 * whose expert is in [e0, e1)) of ex_out * wts, one multiply and one add each, then + sh[t]
 * (sh NULL: nothing; sh may be y itself), rounded to bf16 when `round`. */
static void moe_sum_picks(int64_t T, int64_t K, int64_t D, const float *ex_out,
			  const float *wts, const int32_t *idx, int64_t e0, int64_t e1,
			  const float *sh, int round, float *y)
{
	for (int64_t t = 0; t < T; t++)
		for (int64_t d = 0; d < D; d++) {
			float acc = 0;
			for (int64_t n = 0; n < K; n++)
				if (!idx || (idx[t * K + n] >= e0 && idx[t * K + n] < e1))
					acc += ex_out[(t * K + n) * D + d] * wts[t * K + n];
			float v = sh ? acc + sh[t * D + d] : acc;
			y[t * D + d] = round ? bf16_round(v) : v;
		}
}

void moe_combine(int64_t T, int64_t K, int64_t D, const float *ex_out, const float *wts,
		 const float *sh, float *y)
{
	moe_sum_picks(T, K, D, ex_out, wts, NULL, 0, 0, sh, 1, y);
}

/* ex_out[t*K + n] = Expert_e(f[t]) for each pick n of token t whose expert e is in [e0, e1);
 * the other picks' rows are left as they are. ex_out [T, K, D]. */
static void moe_experts(struct cpu_pool *p, const struct dsv32_config *c,
			const struct layer_weights *lw, const float *f, int64_t T,
			const int32_t *idx, int64_t e0, int64_t e1, float *ex_out)
{
	int64_t D = c->hidden_size, K = c->num_experts_per_tok;
	float *xg = malloc((size_t)(T * D) * sizeof *xg);   /* [m, D] rows routed to one expert */
	float *yg = malloc((size_t)(T * D) * sizeof *yg);   /* [m, D] */
	int64_t *slot = malloc((size_t)T * sizeof *slot);   /* [m] t*K + pick of each gathered row */
	ASSERT(xg && yg && slot);
	for (int64_t e = e0; e < e1; e++) {
		int64_t m = 0;
		for (int64_t t = 0; t < T; t++)
			for (int64_t n = 0; n < K; n++)
				if (idx[t * K + n] == e) {
					memcpy(xg + m * D, f + t * D, (size_t)D * sizeof *xg);
					slot[m++] = t * K + n;
				}
		if (!m)
			continue;
		mlp_forward(p, &lw->exp_w1[e], &lw->exp_w3[e], &lw->exp_w2[e], xg, m, yg);
		for (int64_t i = 0; i < m; i++)
			memcpy(ex_out + slot[i] * D, yg + i * D, (size_t)D * sizeof *yg);
	}
	free(xg);
	free(yg);
	free(slot);
}

/* sh [T, D] = the shared expert of every row (zero under its mutation). */
static void moe_shared(struct cpu_pool *p, const struct dsv32_config *c,
		       const struct layer_weights *lw, const float *f, int64_t T, float *sh)
{
	mlp_forward(p, &lw->sh_w1, &lw->sh_w3, &lw->sh_w2, f, T, sh);
	if (cpu_mutated(CPU_MUTATION_NO_SHARED_EXPERT))
		memset(sh, 0, (size_t)(T * c->hidden_size) * sizeof *sh);
}

void moe_forward(struct cpu_pool *p, const struct dsv32_config *c, const struct layer_weights *lw,
		 const float *f, int64_t T, float *y, int32_t *idx, float *wts, float *logits)
{
	int64_t D = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
	cpu_bf16_linear(p, &lw->gate, f, T, logits, 0); /* logits [T, E] fp32 */
	for (int64_t t = 0; t < T; t++)
		moe_route(c, logits + t * E, lw->gate_bias, idx + t * K, wts + t * K);

	float *ex_out = malloc((size_t)(T * K * D) * sizeof *ex_out); /* [T, K, D] per pick */
	float *sh = malloc((size_t)(T * D) * sizeof *sh);   /* [T, D] shared expert */
	ASSERT(ex_out && sh);
	moe_experts(p, c, lw, f, T, idx, 0, E, ex_out);
	moe_shared(p, c, lw, f, T, sh);
	moe_combine(T, K, D, ex_out, wts, sh, y);
	free(ex_out);
	free(sh);
}

/* ---- expert parallelism: one rank's share (docs/MULTIGPU.md step 3) ---------------------- */

void moe_rank_experts(int64_t n_experts, int rank, int ranks, int64_t *e0, int64_t *e1)
{
	ASSERT(ranks >= 1 && rank >= 0 && rank < ranks);
	*e0 = n_experts * rank / ranks;
	*e1 = n_experts * (rank + 1) / ranks;
}

void moe_forward_rank(struct cpu_pool *p, const struct dsv32_config *c,
		      const struct layer_weights *lw, const float *f, int64_t T,
		      const int32_t *idx, const float *wts, int rank, int ranks, float *y_part)
{
	int64_t D = c->hidden_size, K = c->num_experts_per_tok, e0, e1;
	moe_rank_experts(c->n_routed_experts, rank, ranks, &e0, &e1);
	float *ex_out = malloc((size_t)(T * K * D) * sizeof *ex_out); /* [T, K, D] owned picks */
	ASSERT(ex_out);
	moe_experts(p, c, lw, f, T, idx, e0, e1, ex_out);
	if (rank == 0)
		moe_shared(p, c, lw, f, T, y_part); /* added after the picks, as moe_combine does */
	moe_sum_picks(T, K, D, ex_out, wts, idx, e0, e1, rank == 0 ? y_part : NULL, 0, y_part);
	free(ex_out);
}
