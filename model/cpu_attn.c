/*
 * cpu_attn.c — absorbed and naive sparse MLA attention for one query row (see cpu_attn.h).
 * Heads are independent: the absorbed form splits them across threads, each head's
 * reductions run in one fixed order.
 */
#include "model/cpu_attn.h"

#include <math.h>
#include <stdlib.h>

#include "model/cpu_mutation.h"
#include "model/cpu_ops.h"
#include "model/err.h"
#include "model/numerics.h"

void attn_softmax(float *x, int64_t n)
{
	float m = -INFINITY;
	for (int64_t i = 0; i < n; i++)
		m = fmaxf(m, x[i]);
	float sum = 0;
	for (int64_t i = 0; i < n; i++) {
		x[i] = expf(x[i] - m);
		sum += x[i];
	}
	for (int64_t i = 0; i < n; i++)
		x[i] /= sum;
}

/* Row r of kv_b_proj dequantised (exact in fp32: e4m3 times a power of two). w: [in] */
static void wkvb_row(const struct fp8_linear *W, int64_t r, float *w)
{
	const float *lut = cpu_e4m3_table();
	int64_t nkb = (W->in + 127) / 128;
	const uint8_t *w8 = W->w + (size_t)r * (size_t)W->in;
	const float *s = W->scale + (size_t)(r / 128) * (size_t)nkb;
	for (int64_t kb = 0; kb * 128 < W->in; kb++) {
		float scale = cpu_weight_scale(s[kb]);
		for (int64_t k = kb * 128; k < W->in && k < (kb + 1) * 128; k++)
			w[k] = lut[w8[k]] * scale;
	}
}

/* kv_b_proj rows of head h (spec §3.3): [k_nope (W_UK) | v (W_UV)], pitfall 11. */
static int64_t uk_row(const struct dsv32_config *c, int64_t h, int64_t d)
{
	int64_t per_head = c->qk_nope_head_dim + c->v_head_dim;
	return h * per_head + (cpu_mutated(CPU_MUTATION_KV_B_SWAPPED) ? c->qk_nope_head_dim : 0) + d;
}

static int64_t uv_row(const struct dsv32_config *c, int64_t h, int64_t d)
{
	int64_t per_head = c->qk_nope_head_dim + c->v_head_dim;
	return h * per_head + (cpu_mutated(CPU_MUTATION_KV_B_SWAPPED) ? 0 : c->qk_nope_head_dim) + d;
}

/* The softmax scale of both forms: qk_head_dim^-0.5 * m^2 (spec §3.5, pitfall 3). */
static float attn_scale(const struct dsv32_config *c)
{
	if (cpu_mutated(CPU_MUTATION_NO_MSCALE))
		return (float)pow((double)c->qk_head_dim, -0.5);
	if (cpu_mutated(CPU_MUTATION_SCALE_576))
		return (float)pow((double)(c->kv_lora_rank + c->qk_rope_head_dim), -0.5);
	return c->softmax_scale;
}

/* ---- absorbed form ------------------------------------------------------------------- */

void attn_latent(const struct dsv32_config *c, const float *q_lat, const float *q_pe,
		 const float *kv, int64_t n_sel, float scale, float *score, float *o_lat)
{
	int64_t R = c->kv_lora_rank, rope = c->qk_rope_head_dim, dkv = R + rope;
	for (int64_t s = 0; s < n_sel; s++) {
		const float *ks = kv + s * dkv;
		score[s] = (cpu_dot(q_lat, ks, R) + cpu_dot(q_pe, ks + R, rope)) * scale;
	}
	attn_softmax(score, n_sel);
	for (int64_t i = 0; i < R; i++)
		o_lat[i] = 0;
	for (int64_t s = 0; s < n_sel; s++)
		for (int64_t i = 0; i < R; i++)
			o_lat[i] += score[s] * kv[s * dkv + i];
	for (int64_t i = 0; i < R; i++)
		o_lat[i] = bf16_round(o_lat[i]);
}

struct absorbed_job {
	const struct dsv32_config *c;
	const struct fp8_linear *wkv_b;
	const float *q, *kv;
	int64_t n_sel;
	float *o, *q_lat_out;
};

static void absorbed_heads(void *a, int64_t h0, int64_t h1)
{
	struct absorbed_job *j = a;
	const struct dsv32_config *c = j->c;
	int64_t R = c->kv_lora_rank, nope = c->qk_nope_head_dim;
	int64_t dv = c->v_head_dim, dq = c->qk_head_dim;
	float scale = attn_scale(c);
	float *w = malloc((size_t)R * sizeof *w);              /* [R] one row of W_UK or W_UV */
	float *q_lat = malloc((size_t)R * sizeof *q_lat);      /* [R] */
	float *o_lat = malloc((size_t)R * sizeof *o_lat);      /* [R] */
	float *score = malloc((size_t)(j->n_sel ? j->n_sel : 1) * sizeof *score); /* [n_sel] */
	ASSERT(w && q_lat && o_lat && score);
	for (int64_t h = h0; h < h1; h++) {
		const float *q_nope = j->q + h * dq, *q_pe = q_nope + nope;
		/* q_lat[c] = sum_d q_nope[d] W_UK_h[d, c], d ascending */
		for (int64_t i = 0; i < R; i++)
			q_lat[i] = 0;
		for (int64_t d = 0; d < nope; d++) {
			wkvb_row(j->wkv_b, uk_row(c, h, d), w);
			for (int64_t i = 0; i < R; i++)
				q_lat[i] += q_nope[d] * w[i];
		}
		for (int64_t i = 0; i < R; i++)
			q_lat[i] = bf16_round(q_lat[i]);
		if (j->q_lat_out)
			for (int64_t i = 0; i < R; i++)
				j->q_lat_out[h * R + i] = q_lat[i];
		attn_latent(c, q_lat, q_pe, j->kv, j->n_sel, scale, score, o_lat);
		/* o[d] = W_UV_h[d, :] . o_lat */
		for (int64_t d = 0; d < dv; d++) {
			wkvb_row(j->wkv_b, uv_row(c, h, d), w);
			j->o[h * dv + d] = bf16_round(cpu_dot(o_lat, w, R));
		}
	}
	free(w);
	free(q_lat);
	free(o_lat);
	free(score);
}

void attn_absorbed(struct cpu_pool *p, const struct dsv32_config *c,
		   const struct fp8_linear *wkv_b, const float *q, const float *kv, int64_t n_sel,
		   float *o, float *q_lat_out)
{
	ASSERT(n_sel >= 1);
	struct absorbed_job j = {c, wkv_b, q, kv, n_sel, o, q_lat_out};
	cpu_pool_run(p, absorbed_heads, &j, c->num_attention_heads, 1);
}

/* ---- naive form ---------------------------------------------------------------------- */

void attn_naive(struct cpu_pool *p, const struct dsv32_config *c, const struct fp8_linear *wkv_b,
		const float *q, const float *kv, int64_t n_sel, float *o)
{
	ASSERT(n_sel >= 1);
	int64_t R = c->kv_lora_rank, rope = c->qk_rope_head_dim, nope = c->qk_nope_head_dim;
	int64_t dv = c->v_head_dim, dq = c->qk_head_dim, dkv = R + rope, per_head = nope + dv;
	int64_t H = c->num_attention_heads;
	float scale = attn_scale(c);
	float *ckv = malloc((size_t)(n_sel * R) * sizeof *ckv);          /* [n_sel, R] */
	float *kvb = malloc((size_t)(n_sel * H * per_head) * sizeof *kvb); /* [n_sel, H, nope+dv] */
	float *score = malloc((size_t)n_sel * sizeof *score);            /* [n_sel] */
	ASSERT(ckv && kvb && score);
	for (int64_t s = 0; s < n_sel; s++)
		for (int64_t i = 0; i < R; i++)
			ckv[s * R + i] = kv[s * dkv + i];
	cpu_fp8_linear(p, wkv_b, ckv, n_sel, kvb);
	for (int64_t h = 0; h < H; h++) {
		const float *q_nope = q + h * dq, *q_pe = q_nope + nope;
		for (int64_t s = 0; s < n_sel; s++) {
			const float *k_nope = kvb + s * H * per_head + uk_row(c, h, 0);
			score[s] = (cpu_dot(q_nope, k_nope, nope) +
				    cpu_dot(q_pe, kv + s * dkv + R, rope)) * scale;
		}
		attn_softmax(score, n_sel);
		for (int64_t d = 0; d < dv; d++) {
			float acc = 0;
			for (int64_t s = 0; s < n_sel; s++)
				acc += score[s] * kvb[s * H * per_head + uv_row(c, h, d)];
			o[h * dv + d] = bf16_round(acc);
		}
	}
	free(ckv);
	free(kvb);
	free(score);
}
