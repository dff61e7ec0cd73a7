/*
 * test_ops.c — the CPU backend's ops on hand-checkable cases (issue 3): number formats,
 * act_quant, RoPE tables and layouts, Hadamard, norms, FP8 linear, MoE routing and indexer
 * top-k tie rules, indexer scores, naive vs absorbed attention, KV record layout.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/cpu_attn.h"
#include "model/cpu_indexer.h"
#include "model/cpu_moe.h"
#include "model/cpu_ops.h"
#include "model/cpu_pool.h"
#include "model/kv_cache.h"
#include "model/numerics.h"
#include "model/rope.h"
#include "tests/test.h"

static float frand(uint64_t *s) /* uniform in [-1, 1) */
{
	return (float)((double)(test_rand(s) >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* The real V3.2 dimensions that the ops read (spec §1). */
static struct dsv32_config real_config(void)
{
	struct dsv32_config c;
	memset(&c, 0, sizeof c);
	c.hidden_size = 7168;
	c.num_attention_heads = 128;
	c.q_lora_rank = 1536;
	c.kv_lora_rank = 512;
	c.qk_nope_head_dim = 128;
	c.qk_rope_head_dim = 64;
	c.v_head_dim = 128;
	c.n_routed_experts = 256;
	c.num_experts_per_tok = 8;
	c.n_group = 8;
	c.topk_group = 4;
	c.routed_scaling_factor = 2.5;
	c.norm_topk_prob = 1;
	c.rope_theta = 10000;
	c.rope_scaling.factor = 40;
	c.rope_scaling.original_max_position_embeddings = 4096;
	c.rope_scaling.beta_fast = 32;
	c.rope_scaling.beta_slow = 1;
	c.rope_scaling.mscale = 1;
	c.rope_scaling.mscale_all_dim = 1;
	c.index_n_heads = 64;
	c.index_head_dim = 128;
	c.index_topk = 2048;
	c.rms_norm_eps = 1e-6;
	config_derive(&c);
	return c;
}

/* ---- number formats ------------------------------------------------------------------- */

TEST(ops, bf16_rounding_table)
{
	CHECK_EQ_INT(f32_to_bf16(1.0f), 0x3f80);
	CHECK_EQ_INT(f32_to_bf16(f32_from_bits(0x3f808000)), 0x3f80); /* tie -> even (down) */
	CHECK_EQ_INT(f32_to_bf16(f32_from_bits(0x3f818000)), 0x3f82); /* tie -> even (up) */
	CHECK_EQ_INT(f32_to_bf16(f32_from_bits(0x3f808001)), 0x3f81); /* above the tie */
	CHECK_EQ_INT(f32_to_bf16(-2.0f), 0xc000);
	CHECK_EQ_INT(f32_to_bf16(f32_from_bits(0x00010000)), 0x0001); /* smallest subnormal */
	CHECK_EQ_INT(f32_to_bf16(f32_from_bits(0x00008000)), 0x0000); /* tie to even zero */
	CHECK_EQ_INT(f32_to_bf16(f32_from_bits(0x00018000)), 0x0002); /* tie to even */
	CHECK_EQ_INT(f32_to_bf16(f32_from_bits(0x7f7fffff)), 0x7f80); /* rounds up to inf */
	CHECK_EQ_INT(f32_to_bf16(INFINITY), 0x7f80);
	CHECK(isnan(bf16_to_f32(f32_to_bf16(NAN))));
	CHECK(bf16_round(3.14159265f) == 3.140625f);
}

TEST(ops, e4m3_rounding_table)
{
	struct { float in; uint8_t code; } t[] = {
		{0.0f, 0x00}, {-0.0f, 0x80}, {1.0f, 0x38}, {-1.0f, 0xb8}, {448.0f, 0x7e},
		{-448.0f, 0xfe}, {500.0f, 0x7e}, /* saturates */
		{1.0625f, 0x38},   /* tie between 1 and 1.125 -> even mantissa 0 */
		{1.1875f, 0x3a},   /* tie between 1.125 and 1.25 -> even mantissa 2 */
		{0.015625f, 0x08}, /* 2^-6, smallest normal */
		{0.001953125f, 0x01}, /* 2^-9, smallest subnormal */
		{0.0009765625f, 0x00}, /* 2^-10: tie between 0 and 2^-9 -> 0 */
		{0.0029296875f, 0x02}, /* 3 * 2^-10: tie between 1 and 2 (x 2^-9) -> 2 */
		{0.013671875f, 0x07}, /* 7 * 2^-9, largest subnormal */
		{240.0f, 0x77}, {256.0f, 0x78}, {432.0f, 0x7e}, /* 432 between 416 and 448: tie -> 448 */
	};
	for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
		if (f32_to_e4m3(t[i].in) != t[i].code)
			test_fail(__FILE__, __LINE__, "e4m3(%g) = 0x%02x, want 0x%02x", t[i].in,
				  f32_to_e4m3(t[i].in), t[i].code);
	}
	CHECK_EQ_INT(f32_to_e4m3(NAN), 0x7f);
	CHECK(isnan(e4m3_to_f32(0x7f)) && isnan(e4m3_to_f32(0xff)));
	CHECK(e4m3_to_f32(0x7e) == 448.0f && e4m3_to_f32(0x01) == 0.001953125f);
	/* every non-NaN code decodes and re-encodes to itself */
	for (int b = 0; b < 256; b++)
		if ((b & 0x7f) != 0x7f && f32_to_e4m3(e4m3_to_f32((uint8_t)b)) != b)
			test_fail(__FILE__, __LINE__, "code 0x%02x does not round-trip", b);
	const float *lut = cpu_e4m3_table();
	CHECK(lut[0x38] == 1.0f && lut[0xfe] == -448.0f);
}

TEST(ops, act_quant_codes_and_scales)
{
	float x[256];
	uint8_t q[256];
	float s[2];
	/* all zero: amax floored at 1e-4 -> s = 2^ceil(log2(1e-4/448)) = 2^-22, codes 0 */
	memset(x, 0, sizeof x);
	cpu_act_quant(x, 128, q, s);
	CHECK(s[0] == ldexpf(1, -22));
	CHECK(q[0] == 0 && q[127] == 0);
	/* amax exactly 448 -> s = 1 (power of two, no rounding up) */
	for (int i = 0; i < 128; i++)
		x[i] = (float)(i - 64);
	x[5] = 448.0f;
	cpu_act_quant(x, 128, q, s);
	CHECK(s[0] == 1.0f);
	CHECK(q[5] == 0x7e && q[64] == 0x00 && q[65] == 0x38 && q[63] == 0xb8);
	/* amax 449 -> s = 2; 1.0 -> 1/2 */
	x[5] = 449.0f;
	cpu_act_quant(x, 128, q, s);
	CHECK(s[0] == 2.0f);
	CHECK(q[65] == 0x30); /* 0.5 */
	/* amax 1 -> 1/448 = 2^-8.8 -> s = 2^-8, 1.0 -> 256 */
	for (int i = 0; i < 128; i++)
		x[i] = i == 0 ? 1.0f : 0.25f;
	cpu_act_quant(x, 128, q, s);
	CHECK(s[0] == ldexpf(1, -8));
	CHECK(q[0] == 0x78 && q[1] == 0x68); /* 256, 64 */
	/* two groups quantise independently; exact power-of-two amax = 448 * 2^-3 */
	for (int i = 0; i < 256; i++)
		x[i] = i < 128 ? 56.0f : -3e-5f;
	cpu_act_quant(x, 256, q, s);
	CHECK(s[0] == 0.125f && q[0] == 0x7e);
	CHECK(s[1] == ldexpf(1, -22)); /* 3e-5 < 1e-4 floor */
	CHECK(q[128] == f32_to_e4m3(-3e-5f / ldexpf(1, -22)));
}

/* ---- RoPE ------------------------------------------------------------------------------- */

TEST(ops, rope_inv_freq_matches_appendix_a)
{
	static const double want[32] = {
		1.000000000e+00, 7.498942093e-01, 5.623413252e-01, 4.216965034e-01, 3.162277660e-01,
		2.371373706e-01, 1.778279410e-01, 1.333521432e-01, 1.000000000e-01, 7.498942093e-02,
		5.623413252e-02, 3.900692657e-02, 2.687936011e-02, 1.837814622e-02, 1.244795587e-02,
		8.334508951e-03, 5.500000000e-03, 3.561997494e-03, 2.249365301e-03, 1.370513636e-03,
		7.905694150e-04, 4.149903985e-04, 1.778279410e-04, 3.333803580e-05, 2.500000000e-05,
		1.874735523e-05, 1.405853313e-05, 1.054241259e-05, 7.905694150e-06, 5.928434264e-06,
		4.445698525e-06, 3.333803580e-06};
	struct dsv32_config c = real_config();
	float inv[32];
	int low, high;
	rope_inv_freq(&c, inv, &low, &high);
	CHECK_EQ_INT(low, 10);
	CHECK_EQ_INT(high, 23);
	for (int i = 0; i < 32; i++)
		if (fabs(inv[i] - want[i]) > 1e-6 * want[i])
			test_fail(__FILE__, __LINE__, "inv_freq[%d] = %.9e, want %.9e", i, inv[i],
				  want[i]);
	/* cos/sin of p * inv in fp32: p = 0 is the identity */
	float cs[32], sn[32];
	rope_cos_sin(inv, 32, 0, cs, sn);
	CHECK(cs[0] == 1.0f && sn[31] == 0.0f);
	rope_cos_sin(inv, 32, 100000, cs, sn);
	CHECK(cs[0] == cosf((float)100000 * inv[0]));
}

TEST(ops, rope_layouts_hand_case)
{
	/* pair 0 turned by 90 degrees, pair 1 not at all */
	float cs[2] = {0.0f, 1.0f}, sn[2] = {1.0f, 0.0f};
	float a[4] = {1, 2, 3, 4};
	rope_apply_interleaved(a, cs, sn, 2); /* pairs (x0,x1), (x2,x3) */
	CHECK(a[0] == -2 && a[1] == 1 && a[2] == 3 && a[3] == 4);
	float b[4] = {1, 2, 3, 4};
	rope_apply_halfsplit(b, cs, sn, 2); /* pairs (x0,x2), (x1,x3) */
	CHECK(b[0] == -3 && b[1] == 2 && b[2] == 1 && b[3] == 4);
	/* the output is bf16: 1/3 rotated by 0 becomes bf16(1/3) */
	float c1[2] = {1.0f / 3, 0}, one = 1, zero = 0;
	rope_apply_interleaved(c1, &one, &zero, 1);
	CHECK(c1[0] == bf16_round(1.0f / 3));
}

/* ---- Hadamard, norms ----------------------------------------------------------------- */

TEST(ops, hadamard_orthogonal)
{
	static float H[128][128]; /* H[j] = transform of e_j, unscaled back to +-1 */
	for (int j = 0; j < 128; j++) {
		float x[128] = {0};
		x[j] = 1.0f;
		cpu_hadamard(x, 128);
		for (int i = 0; i < 128; i++) {
			float want = (__builtin_popcount((unsigned)(i & j)) & 1) ? -1.0f : 1.0f;
			if (x[i] != bf16_round(want * (float)pow(128, -0.5)))
				test_fail(__FILE__, __LINE__, "H[%d][%d] wrong", i, j);
			H[j][i] = x[i] > 0 ? 1.0f : -1.0f;
		}
	}
	for (int i = 0; i < 128; i++) /* H . H = 128 I */
		for (int j = 0; j < 128; j++) {
			float s = 0;
			for (int k = 0; k < 128; k++)
				s += H[i][k] * H[k][j];
			if (s != (i == j ? 128.0f : 0.0f))
				test_fail(__FILE__, __LINE__, "(H.H)[%d][%d] = %g", i, j, s);
		}
	uint64_t seed = 7;
	float x[128], y[128];
	for (int i = 0; i < 128; i++)
		x[i] = y[i] = bf16_round(frand(&seed));
	cpu_hadamard(y, 128);
	cpu_hadamard(y, 128);
	double err = 0, ref = 0;
	for (int i = 0; i < 128; i++)
		err += (y[i] - x[i]) * (y[i] - x[i]), ref += x[i] * x[i];
	CHECK(sqrt(err / ref) < 8e-3); /* two bf16 roundings */
}

TEST(ops, norms_hand_cases)
{
	float x[2] = {3, 4}, w[2] = {1, 2}, out[2];
	cpu_rmsnorm(out, x, w, 2, 0); /* rms = sqrt(12.5) */
	CHECK(out[0] == bf16_round(3 / sqrtf(12.5f)) && out[1] == bf16_round(2 * 4 / sqrtf(12.5f)));
	/* fused add: s = x + r normalised in fp32, r = bf16(s) */
	float xa[2] = {1.0f, 1.0f}, r[2] = {1.0f / 256, 0.0f}, o2[2], w1[2] = {1, 1};
	cpu_add_rmsnorm(o2, xa, r, w1, 2, 0);
	CHECK(r[0] == 1.0f && r[1] == 1.0f); /* 1 + 2^-8 rounds to 1 in bf16 (tie to even) */
	float s0 = 1.0f + 1.0f / 256, ms = (s0 * s0 + 1.0f) / 2;
	CHECK(o2[0] == bf16_round(s0 / sqrtf(ms))); /* the unrounded sum is normalised */
	/* LayerNorm with bias: [1,2,3,4], mean 2.5, var 1.25 */
	float l[4] = {1, 2, 3, 4}, lw[4] = {1, 1, 1, 2}, lb[4] = {0.5f, 0.5f, 0.5f, 0}, lo[4];
	cpu_layernorm(lo, l, lw, lb, 4, 0);
	CHECK(lo[0] == bf16_round(-1.5f / sqrtf(1.25f) + 0.5f));
	CHECK(lo[3] == bf16_round(1.5f / sqrtf(1.25f) * 2));
	float sw[3] = {0, 2, -2}, su[3] = {5, 3, 3}, so[3];
	cpu_swiglu(so, sw, su, 3);
	CHECK(so[0] == 0 && so[1] == bf16_round(2 / (1 + expf(-2)) * 3));
	CHECK(so[2] == bf16_round(-2 / (1 + expf(2)) * 3));
}

/* ---- linears -------------------------------------------------------------------------- */

struct rand_fp8 {
	uint8_t *w;
	float *s;
	struct fp8_linear lin;
};

static void rand_fp8_init(struct rand_fp8 *r, int64_t out, int64_t in, uint64_t *seed)
{
	int64_t nob = (out + 127) / 128, nib = (in + 127) / 128;
	r->w = malloc((size_t)(out * in));
	r->s = malloc((size_t)(nob * nib) * sizeof *r->s);
	for (int64_t i = 0; i < out * in; i++) {
		uint8_t b = (uint8_t)test_rand(seed);
		r->w[i] = (b & 0x7f) == 0x7f ? 0x30 : b;
	}
	for (int64_t i = 0; i < nob * nib; i++)
		r->s[i] = ldexpf(1.0f, -8 - (int)(test_rand(seed) % 4));
	r->lin = (struct fp8_linear){r->w, r->s, out, in};
}

static void rand_fp8_free(struct rand_fp8 *r)
{
	free(r->w);
	free(r->s);
}

TEST(ops, fp8_linear_matches_double_and_is_row_and_thread_invariant)
{
	uint64_t seed = 11;
	int64_t out = 200, in = 384, T = 5; /* partial last output block */
	struct rand_fp8 W;
	rand_fp8_init(&W, out, in, &seed);
	float *x = malloc((size_t)(T * in) * sizeof *x), *y = malloc((size_t)(T * out) * sizeof *y);
	float *y1 = malloc((size_t)out * sizeof *y1), *y3 = malloc((size_t)(T * out) * sizeof *y3);
	for (int64_t i = 0; i < T * in; i++)
		x[i] = bf16_round(frand(&seed) * (i % 128 == 3 ? 30.0f : 1.0f));
	cpu_fp8_linear(NULL, &W.lin, x, T, y);
	for (int64_t t = 0; t < T; t++) {
		uint8_t q[384];
		float s[3];
		cpu_act_quant(x + t * in, in, q, s);
		for (int64_t o = 0; o < out; o++) {
			double ref = 0;
			for (int64_t k = 0; k < in; k++)
				ref += (double)e4m3_to_f32(q[k]) * s[k / 128] *
				       e4m3_to_f32(W.w[o * in + k]) * W.s[(o / 128) * 3 + k / 128];
			double err = fabs(y[t * out + o] - ref);
			if (err > fabs(ref) * (1.0 / 256) + 1e-6)
				test_fail(__FILE__, __LINE__, "y[%lld,%lld] = %g, ref %g", (long long)t,
					  (long long)o, y[t * out + o], ref);
		}
	}
	/* a row alone and a batch on 3 threads give the same bits */
	cpu_fp8_linear(NULL, &W.lin, x + 2 * in, 1, y1);
	CHECK(!memcmp(y1, y + 2 * out, (size_t)out * sizeof *y1));
	struct cpu_pool *p = cpu_pool_start(3);
	REQUIRE(p);
	cpu_fp8_linear(p, &W.lin, x, T, y3);
	CHECK(!memcmp(y3, y, (size_t)(T * out) * sizeof *y));
	cpu_pool_stop(p);
	free(x);
	free(y);
	free(y1);
	free(y3);
	rand_fp8_free(&W);
}

TEST(ops, bf16_linear_fp32_out)
{
	uint16_t w[6] = {0x3f80, 0x4000, 0xbf80, 0x3f00, 0x3f00, 0x3f00}; /* [[1,2,-1],[.5,.5,.5]] */
	struct bf16_mat m = {w, 2, 3};
	float x[3] = {1.0f, 1.0f / 3, 0.25f}, y[2];
	cpu_bf16_linear(NULL, &m, x, 1, y, 0);
	CHECK(y[0] == 1.0f + 2.0f / 3 - 0.25f);
	cpu_bf16_linear(NULL, &m, x, 1, y, 1);
	CHECK(y[0] == bf16_round(1.0f + 2.0f / 3 - 0.25f));
}

/* ---- MoE routing ---------------------------------------------------------------------- */

static struct dsv32_config moe_config(void)
{
	struct dsv32_config c = real_config();
	c.n_routed_experts = 8;
	c.n_group = 4; /* 2 experts per group */
	c.topk_group = 2;
	c.num_experts_per_tok = 2;
	c.routed_scaling_factor = 2.5;
	return c;
}

static float logit(float p) { return logf(p / (1 - p)); }

TEST(ops, moe_route_ties_group_limit_bias)
{
	struct dsv32_config c = moe_config();
	float lg[8], bias[8] = {0};
	int32_t idx[2];
	float wts[2];
	/* all equal: groups tie -> groups 0 and 1; experts tie -> 0 and 1 */
	for (int i = 0; i < 8; i++)
		lg[i] = 0.3f;
	moe_route(&c, lg, bias, idx, wts);
	CHECK(idx[0] == 0 && idx[1] == 1);
	CHECK(fabsf(wts[0] - 1.25f) < 1e-6f && fabsf(wts[1] - 1.25f) < 1e-6f);
	/* group limit: expert 0 has the single best score but group 0's top-2 sum is lowest;
	 * groups 2 (0.6+0.6) and 3 (0.55+0.55) win over group 0 (0.9+0.05) and 1 (0.5+0.5) */
	float p[8] = {0.9f, 0.05f, 0.5f, 0.5f, 0.6f, 0.6f, 0.55f, 0.56f};
	for (int i = 0; i < 8; i++)
		lg[i] = logit(p[i]);
	moe_route(&c, lg, bias, idx, wts);
	CHECK(idx[0] == 4 && idx[1] == 5);
	/* without the group limit expert 0 would win */
	c.n_group = 1;
	moe_route(&c, lg, bias, idx, wts);
	CHECK(idx[0] == 0 && idx[1] == 4);
	/* weights: unbiased sigmoid renormalised over the picks, times 2.5 */
	CHECK(fabsf(wts[0] - 2.5f * 0.9f / 1.5f) < 1e-5f && fabsf(wts[1] - 2.5f * 0.6f / 1.5f) < 1e-5f);
	/* bias selects but does not weigh: expert 1 gets a big bias */
	c.n_group = 4;
	bias[1] = 10.0f;
	moe_route(&c, lg, bias, idx, wts);
	CHECK(idx[0] == 0 && idx[1] == 1); /* group 0 now wins, and expert 1 is picked */
	CHECK(fabsf(wts[1] - 2.5f * 0.05f / 0.95f) < 1e-5f);
	/* no renormalisation when norm_topk_prob is off */
	c.norm_topk_prob = 0;
	moe_route(&c, lg, bias, idx, wts);
	CHECK(fabsf(wts[0] - 2.5f * 0.9f) < 1e-5f);
	/* equal group scores tie to the lower group id even with the experts reversed */
	c.norm_topk_prob = 1;
	memset(bias, 0, sizeof bias);
	float q[8] = {0.2f, 0.2f, 0.7f, 0.1f, 0.1f, 0.7f, 0.2f, 0.2f};
	for (int i = 0; i < 8; i++)
		lg[i] = logit(q[i]);
	moe_route(&c, lg, bias, idx, wts); /* groups 1 and 2 tie at 0.8: both kept */
	CHECK(idx[0] == 2 && idx[1] == 5);
}

/* ---- indexer --------------------------------------------------------------------------- */

TEST(ops, indexer_topk_ties_and_k)
{
	float s[6] = {1, 3, 3, 2, 3, NAN};
	int32_t sel[6];
	CHECK_EQ_INT(indexer_topk(s, 6, 2, sel), 2);
	CHECK(sel[0] == 1 && sel[1] == 2); /* three 3s: the two lowest positions */
	CHECK_EQ_INT(indexer_topk(s, 6, 4, sel), 4);
	CHECK(sel[0] == 1 && sel[1] == 2 && sel[2] == 3 && sel[3] == 4); /* ascending */
	CHECK_EQ_INT(indexer_topk(s, 6, 5, sel), 5);
	CHECK(sel[0] == 0 && sel[4] == 4); /* NaN ranks last */
	CHECK_EQ_INT(indexer_topk(s, 3, 2048, sel), 3); /* k = min(index_topk, pos + 1) */
	CHECK(sel[0] == 0 && sel[1] == 1 && sel[2] == 2);
	float neg[3] = {-5, -1, -1};
	CHECK_EQ_INT(indexer_topk(neg, 3, 1, sel), 1);
	CHECK(sel[0] == 1);
}

TEST(ops, indexer_scores_hand_case)
{
	struct dsv32_config c = real_config();
	c.index_n_heads = 2;
	uint8_t q8[256], k0[128], k1[128];
	for (int d = 0; d < 128; d++) {
		q8[d] = 0x38;         /* head 0: +1 */
		q8[128 + d] = 0xb8;   /* head 1: -1 */
		k0[d] = 0x38;         /* key 0: +1 */
		k1[d] = d < 64 ? 0x40 : 0xb8; /* key 1: +2 on half, -1 on half: q0.k1 = 64 */
	}
	float w[2] = {0.5f, 3.0f}, ks[2] = {0.25f, 2.0f}, sc[2];
	const uint8_t *keys[2] = {k0, k1};
	indexer_scores(NULL, &c, q8, w, keys, ks, 2, sc);
	/* key 0: ReLU(128) * 0.5 + ReLU(-128) * 3 = 64, times 0.25 */
	CHECK(sc[0] == 16.0f);
	/* key 1: ReLU(64) * 0.5 + ReLU(-64) * 3 = 32, times 2 */
	CHECK(sc[1] == 64.0f);
}

/* ---- attention -------------------------------------------------------------------------- */

TEST(ops, naive_and_absorbed_attention_agree)
{
	struct dsv32_config c = real_config();
	c.num_attention_heads = 3;
	c.kv_lora_rank = 256;
	c.qk_nope_head_dim = 64;
	c.v_head_dim = 64;
	config_derive(&c);
	uint64_t seed = 5;
	int64_t H = 3, R = 256, rope = 64, dq = 128, n_sel = 11, dkv = R + rope;
	struct rand_fp8 W;
	rand_fp8_init(&W, H * (64 + 64), R, &seed);
	float *q = malloc((size_t)(H * dq) * sizeof *q);
	float *kv = malloc((size_t)(n_sel * dkv) * sizeof *kv);
	uint8_t *page = calloc(KV_PAGE_TOKENS, c.mla_record_bytes);
	for (int64_t i = 0; i < H * dq; i++)
		q[i] = bf16_round(frand(&seed) * 4);
	for (int64_t s = 0; s < n_sel; s++) { /* keys as they come back from the FP8 cache */
		float ckv[256], kpe[64];
		for (int i = 0; i < 256; i++)
			ckv[i] = bf16_round(frand(&seed));
		for (int i = 0; i < 64; i++)
			kpe[i] = bf16_round(frand(&seed));
		kv_mla_write(&c, page, s, ckv, kpe);
		kv_mla_read(&c, page, s, kv + s * dkv);
	}
	float oa[192], on[192];
	attn_absorbed(NULL, &c, &W.lin, q, kv, n_sel, oa, NULL);
	attn_naive(NULL, &c, &W.lin, q, kv, n_sel, on);
	/* exact reference in double: both forms sit within bf16 noise of it */
	double od[192];
	for (int64_t h = 0; h < H; h++) {
		double sc[11], mx = -1e300, sum = 0;
		for (int64_t s = 0; s < n_sel; s++) {
			double dot = 0;
			for (int d = 0; d < 64; d++) {
				double k = 0;
				for (int i = 0; i < 256; i++)
					k += (double)e4m3_to_f32(W.w[(h * 128 + d) * 256 + i]) *
					     W.s[((h * 128 + d) / 128) * 2 + i / 128] * kv[s * dkv + i];
				dot += q[h * dq + d] * k;
			}
			for (int d = 0; d < 64; d++)
				dot += (double)q[h * dq + 64 + d] * kv[s * dkv + 256 + d];
			sc[s] = dot * c.softmax_scale;
			mx = fmax(mx, sc[s]);
		}
		for (int64_t s = 0; s < n_sel; s++)
			sum += (sc[s] = exp(sc[s] - mx));
		for (int d = 0; d < 64; d++) {
			double o = 0;
			for (int64_t s = 0; s < n_sel; s++) {
				double v = 0;
				for (int i = 0; i < 256; i++)
					v += (double)e4m3_to_f32(W.w[(h * 128 + 64 + d) * 256 + i]) *
					     W.s[((h * 128 + 64 + d) / 128) * 2 + i / 128] * kv[s * dkv + i];
				o += sc[s] / sum * v;
			}
			od[h * 64 + d] = o;
		}
	}
	double ea = 0, en = 0, rd = 0;
	for (int i = 0; i < 192; i++) {
		ea += (oa[i] - od[i]) * (oa[i] - od[i]);
		en += (on[i] - od[i]) * (on[i] - od[i]);
		rd += od[i] * od[i];
	}
	fprintf(stderr, "    vs exact: absorbed %.2e, naive %.2e\n", sqrt(ea / rd), sqrt(en / rd));
	CHECK(sqrt(ea / rd) < 2e-2 && sqrt(en / rd) < 2e-2);
	double err = 0, ref = 0;
	for (int i = 0; i < 192; i++)
		err += (oa[i] - on[i]) * (oa[i] - on[i]), ref += on[i] * on[i];
	CHECK(ref > 0);
	/* bf16 roundings in different places (k_nope, v vs q_lat, o_lat), amplified by the
	 * sharp softmax of these random inputs (scores of order +-10) */
	CHECK(sqrt(err / ref) < 3e-2);
	/* one key: softmax = 1, o = W_UV . c_kv in both forms */
	attn_absorbed(NULL, &c, &W.lin, q, kv, 1, oa, NULL);
	attn_naive(NULL, &c, &W.lin, q, kv, 1, on);
	err = ref = 0;
	for (int i = 0; i < 192; i++)
		err += (oa[i] - on[i]) * (oa[i] - on[i]), ref += on[i] * on[i];
	CHECK(sqrt(err / ref) < 4e-3); /* o = W_UV c_kv, one bf16 rounding apart */
	/* heads split over threads: same bits */
	struct cpu_pool *p = cpu_pool_start(2);
	float ob[192];
	attn_absorbed(NULL, &c, &W.lin, q, kv, n_sel, oa, NULL);
	attn_absorbed(p, &c, &W.lin, q, kv, n_sel, ob, NULL);
	CHECK(!memcmp(oa, ob, sizeof oa));
	cpu_pool_stop(p);
	free(q);
	free(kv);
	free(page);
	rand_fp8_free(&W);
}

TEST(ops, softmax_scale_is_not_576)
{
	struct dsv32_config c = real_config();
	CHECK(fabsf(c.softmax_scale - 0.1352337789f) < 1e-7f);
}

/* ---- KV cache layout --------------------------------------------------------------------- */

TEST(ops, kv_record_byte_layout)
{
	struct dsv32_config c = real_config();
	CHECK_EQ_INT(c.mla_record_bytes, 656);
	CHECK_EQ_INT(kv_mla_scale_offset(&c), 512);
	CHECK_EQ_INT(kv_mla_kpe_offset(&c), 528);
	CHECK_EQ_INT(kv_mla_page_bytes(&c), 64 * 656);
	CHECK_EQ_INT(kv_index_page_bytes(&c), 64 * 132);
	uint8_t *page = calloc(64, 656);
	float ckv[512], kpe[64], back[576];
	for (int i = 0; i < 512; i++)
		ckv[i] = i < 128 ? 1.0f : i < 256 ? -448.0f : i < 384 ? 0.0f : 0.5f;
	for (int i = 0; i < 64; i++)
		kpe[i] = bf16_round((float)i / 3);
	kv_mla_write(&c, page, 3, ckv, kpe);
	const uint8_t *rec = page + 3 * 656;
	CHECK(rec[0] == 0x78); /* 1.0 / 2^-8 = 256 */
	CHECK(rec[128] == 0xfe && rec[256] == 0x00);
	float s[4];
	memcpy(s, rec + 512, 16);
	CHECK(s[0] == ldexpf(1, -8) && s[1] == 1.0f && s[2] == ldexpf(1, -22) && s[3] == ldexpf(1, -9));
	uint16_t h;
	memcpy(&h, rec + 528 + 2 * 5, 2);
	CHECK(h == f32_to_bf16(5.0f / 3));
	CHECK(page[2 * 656 + 600] == 0 && page[4 * 656] == 0); /* neighbours untouched */
	kv_mla_read(&c, page, 3, back);
	CHECK(back[0] == 1.0f && back[200] == -448.0f && back[511] == 0.5f && back[512 + 5] == kpe[5]);
	free(page);
	/* indexer page: all 64 x 128 codes first, then 64 fp32 scales */
	uint8_t *ip = calloc(64, 132), k8[128];
	for (int i = 0; i < 128; i++)
		k8[i] = (uint8_t)i;
	kv_index_write(&c, ip, 5, k8, 0.375f);
	CHECK(ip[5 * 128 + 17] == 17 && ip[5 * 128 + 127] == 127);
	float sc;
	memcpy(&sc, ip + 64 * 128 + 5 * 4, 4);
	CHECK(sc == 0.375f);
	CHECK(kv_index_scale(&c, ip, 5) == 0.375f && kv_index_codes(&c, ip, 5)[9] == 9);
	free(ip);
}

static void count_hits(void *a, int64_t b, int64_t e)
{
	int *h = a;
	for (int64_t i = b; i < e; i++)
		h[i]++;
}

TEST(ops, pool_covers_every_item_once)
{
	struct cpu_pool *p = cpu_pool_start(3);
	REQUIRE(p);
	static int hits[1000];
	for (int64_t n = 1; n < 1000; n += 97) {
		memset(hits, 0, sizeof hits);
		cpu_pool_run(p, count_hits, hits, n, 1);
		for (int64_t i = 0; i < n; i++)
			CHECK_EQ_INT(hits[i], 1);
	}
	cpu_pool_stop(p);
}
