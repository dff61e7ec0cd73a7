/*
 * numerics_ops.h — the op-level checks of the CPU backend against the oracle's ops.npz (issue 4):
 * e4m3, bf16 and act_quant bit-exact; FP8 GEMM, RMSNorm, LayerNorm, the YaRN table and both
 * RoPE layouts, Hadamard, indexer scores, attention in both forms and SwiGLU within fp32
 * rounding of the same quantised inputs; top-k and routing identical, ties included. The
 * inputs are fresh random values drawn by tests/oracle/oracle.py (ops). Shared by
 * tests/test_numerics.c and tests/test_mutations.c. Must not: skip a missing array (nc_load
 * fails the case loudly).
 */
#ifndef DSV32_TESTS_NUMERICS_OPS_H
#define DSV32_TESTS_NUMERICS_OPS_H

#include "tests/oracle/numerics_check.h"

/* ---- op level (ops.npz) ---------------------------------------------------------------------- */

/* Whether two bf16 values differ by more than one bf16 ulp (of the larger; NaN: yes). */
NC_FN int nc_bf16_far(float a, float b)
{
	float m = fmaxf(fabsf(a), fabsf(b));
	int ex;
	frexpf(m, &ex);
	return !(fabsf(a - b) <= ldexpf(1.0f, ex - 8)) && m > 1e-30f;
}

/* Elements of ours vs ref (bf16 values): none may differ by more than one bf16 ulp, at most
 * max_frac may differ at all. */
NC_FN void nc_bf16_close(struct nc_verdict *v, const char *what, const float *ours,
			 const float *ref, int64_t n, double max_frac)
{
	int64_t diff = 0, far = 0;
	for (int64_t i = 0; i < n; i++) {
		if (ours[i] == ref[i])
			continue;
		diff++;
		far += nc_bf16_far(ours[i], ref[i]);
	}
	fprintf(stderr, "numerics op %-16s %lld values: %lld differ (%lld by more than 1 bf16 ulp)\n",
		what, (long long)n, (long long)diff, (long long)far);
	if (far || (double)diff > max_frac * (double)n)
		nc_fail(v, "op %s: %lld of %lld values differ, %lld by more than one bf16 ulp", what,
			(long long)diff, (long long)n, (long long)far);
}

#define NC_OPS(key, a) nc_load("", "ops.npz", key, a)

NC_FN void nc_ops(struct nc_verdict *v)
{
	struct npy_array a, b, c2, d2, e2;
	struct err e;
	struct dsv32_config cfg;
	char p[1024];
	snprintf(p, sizeof p, "%s/tests/data/numerics_tiny.json", test_root());
	REQUIRE(config_load(&cfg, p, &e) == 0);

	/* e4m3: decode of every code, encode of the test values: bit-exact */
	NC_OPS("e4m3_all", &a);
	int64_t bad = 0;
	for (int i = 0; i < 256; i++) {
		float r = ((const float *)a.data)[i], o = e4m3_to_f32((uint8_t)i);
		bad += isnan(r) ? !isnan(o) : f32_bits(r) != f32_bits(o);
	}
	npy_free(&a);
	NC_OPS("e4m3_in", &a);
	NC_OPS("e4m3_codes", &b);
	for (int64_t i = 0; i < a.shape[0]; i++)
		bad += f32_to_e4m3(((const float *)a.data)[i]) != ((const int32_t *)b.data)[i];
	fprintf(stderr, "numerics op e4m3             %lld values + 256 codes: %lld differ\n",
		(long long)a.shape[0], (long long)bad);
	if (bad)
		nc_fail(v, "op e4m3: %lld mismatches", (long long)bad);
	npy_free(&a);
	npy_free(&b);

	/* bf16 rounding of fp32 bit patterns: bit-exact */
	NC_OPS("bf16_in", &a);
	NC_OPS("bf16_out", &b);
	bad = 0;
	for (int64_t i = 0; i < a.shape[0]; i++) {
		float f;
		memcpy(&f, (const int32_t *)a.data + i, 4);
		bad += f32_to_bf16(f) != (uint16_t)((const int32_t *)b.data)[i];
	}
	fprintf(stderr, "numerics op bf16             %lld values: %lld differ\n", (long long)a.shape[0],
		(long long)bad);
	if (bad)
		nc_fail(v, "op bf16: %lld mismatches", (long long)bad);
	npy_free(&a);
	npy_free(&b);

	/* act_quant: codes and scales bit-exact */
	NC_OPS("aq_x", &a);
	NC_OPS("aq_codes", &b);
	NC_OPS("aq_scales", &c2);
	bad = 0;
	{
		int64_t R = a.shape[0], n = a.shape[1], g = n / 128;
		uint8_t *q = malloc((size_t)n);
		float *s = malloc((size_t)g * sizeof *s);
		REQUIRE(q && s);
		for (int64_t i = 0; i < R; i++) {
			cpu_act_quant((const float *)a.data + i * n, n, q, s);
			for (int64_t j = 0; j < n; j++)
				bad += q[j] != ((const int32_t *)b.data)[i * n + j];
			for (int64_t j = 0; j < g; j++)
				bad += f32_bits(s[j]) != f32_bits(((const float *)c2.data)[i * g + j]);
		}
		free(q);
		free(s);
		fprintf(stderr, "numerics op act_quant        %lld rows: %lld codes/scales differ\n",
			(long long)R, (long long)bad);
	}
	if (bad)
		nc_fail(v, "op act_quant: %lld mismatches", (long long)bad);
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);

	/* FP8 GEMM (act_quant inside, same quantised inputs): within fp32 rounding */
	NC_OPS("gemm_x", &a);
	NC_OPS("gemm_w", &b);
	NC_OPS("gemm_s", &c2);
	NC_OPS("gemm_y", &d2);
	{
		struct fp8_linear W = {b.data, c2.data, b.shape[0], b.shape[1] * 4};
		int64_t T = a.shape[0];
		float *y = malloc((size_t)(T * W.out) * sizeof *y);
		REQUIRE(y && d2.shape[1] == W.out);
		cpu_fp8_linear(NULL, &W, a.data, T, y);
		nc_bf16_close(v, "fp8_gemm", y, d2.data, T * W.out, 0.02);
		free(y);
	}
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);
	npy_free(&d2);

	/* RMSNorm, LayerNorm */
	NC_OPS("rms_x", &a);
	NC_OPS("rms_w", &b);
	NC_OPS("rms_y", &c2);
	{
		int64_t R = a.shape[0], n = a.shape[1];
		float *y = malloc((size_t)(R * n) * sizeof *y);
		REQUIRE(y);
		for (int64_t i = 0; i < R; i++)
			cpu_rmsnorm(y + i * n, (const float *)a.data + i * n, b.data, n, 1e-6f);
		nc_bf16_close(v, "rmsnorm", y, c2.data, R * n, 0.02);
		free(y);
	}
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);
	NC_OPS("ln_x", &a);
	NC_OPS("ln_w", &b);
	NC_OPS("ln_b", &c2);
	NC_OPS("ln_y", &d2);
	{
		int64_t R = a.shape[0], n = a.shape[1];
		float *y = malloc((size_t)(R * n) * sizeof *y);
		REQUIRE(y);
		for (int64_t i = 0; i < R; i++)
			cpu_layernorm(y + i * n, (const float *)a.data + i * n, b.data, c2.data, n, 1e-6f);
		nc_bf16_close(v, "layernorm", y, d2.data, R * n, 0.02);
		free(y);
	}
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);
	npy_free(&d2);

	/* RoPE: the YaRN table within one fp32 ulp; both layouts within fp32 rounding */
	NC_OPS("rope_inv", &a);
	NC_OPS("rope_pos", &b);
	NC_OPS("rope_x", &c2);
	NC_OPS("rope_inter_y", &d2);
	NC_OPS("rope_half_y", &e2);
	{
		int64_t half = a.shape[0], R = b.shape[0], n = 2 * half;
		float inv[64], cs[64];
		REQUIRE(half <= 32);
		rope_inv_freq(&cfg, inv, NULL, NULL);
		int64_t far = 0;
		for (int64_t i = 0; i < half; i++) {
			int64_t d = (int64_t)f32_bits(inv[i]) - (int64_t)f32_bits(((const float *)a.data)[i]);
			far += d > 1 || d < -1;
		}
		fprintf(stderr, "numerics op rope_inv_freq    %lld values: %lld differ by more than 1 ulp\n",
			(long long)half, (long long)far);
		if (far)
			nc_fail(v, "op rope_inv_freq: %lld values off by more than one fp32 ulp", (long long)far);
		float *yi = malloc((size_t)(R * n) * sizeof *yi), *yh = malloc((size_t)(R * n) * sizeof *yh);
		REQUIRE(yi && yh);
		for (int64_t i = 0; i < R; i++) {
			rope_cos_sin(inv, half, ((const int32_t *)b.data)[i], cs, cs + half);
			memcpy(yi + i * n, (const float *)c2.data + i * n, (size_t)n * sizeof *yi);
			memcpy(yh + i * n, (const float *)c2.data + i * n, (size_t)n * sizeof *yh);
			rope_apply_interleaved(yi + i * n, cs, cs + half, half);
			rope_apply_halfsplit(yh + i * n, cs, cs + half, half);
		}
		nc_bf16_close(v, "rope_interleaved", yi, d2.data, R * n, 0.05);
		nc_bf16_close(v, "rope_halfsplit", yh, e2.data, R * n, 0.05);
		free(yi);
		free(yh);
	}
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);
	npy_free(&d2);
	npy_free(&e2);

	/* Hadamard */
	NC_OPS("had_x", &a);
	NC_OPS("had_y", &b);
	{
		int64_t R = a.shape[0], n = a.shape[1];
		float *y = malloc((size_t)(R * n) * sizeof *y);
		REQUIRE(y);
		memcpy(y, a.data, (size_t)(R * n) * sizeof *y);
		for (int64_t i = 0; i < R; i++)
			cpu_hadamard(y + i * n, n);
		nc_bf16_close(v, "hadamard", y, b.data, R * n, 0.02);
		free(y);
	}
	npy_free(&a);
	npy_free(&b);

	/* indexer scores on the same quantised q and k: within fp32 rounding */
	NC_OPS("is_q8", &a);
	NC_OPS("is_k8", &b);
	NC_OPS("is_w", &c2);
	NC_OPS("is_ks", &d2);
	NC_OPS("is_scores", &e2);
	{
		struct dsv32_config ic = cfg;
		ic.index_n_heads = a.shape[0];
		ic.index_head_dim = a.shape[1];
		int64_t H = a.shape[0], Di = a.shape[1], n = b.shape[0];
		uint8_t *q8 = malloc((size_t)(H * Di)), *k8 = malloc((size_t)(n * Di));
		const uint8_t **keys = malloc((size_t)n * sizeof *keys);
		float *sc = malloc((size_t)n * sizeof *sc);
		REQUIRE(q8 && k8 && keys && sc);
		for (int64_t i = 0; i < H * Di; i++)
			q8[i] = (uint8_t)((const int32_t *)a.data)[i];
		for (int64_t i = 0; i < n * Di; i++)
			k8[i] = (uint8_t)((const int32_t *)b.data)[i];
		for (int64_t s = 0; s < n; s++)
			keys[s] = k8 + s * Di;
		indexer_scores(NULL, &ic, q8, c2.data, keys, d2.data, n, sc);
		double mx = 0, worst = 0;
		for (int64_t s = 0; s < n; s++)
			mx = fmax(mx, fabs(((const float *)e2.data)[s]));
		for (int64_t s = 0; s < n; s++)
			worst = fmax(worst, fabs(sc[s] - ((const float *)e2.data)[s]) / (mx > 0 ? mx : 1));
		fprintf(stderr, "numerics op indexer_scores   %lld keys: max |diff| / max |score| %.2e\n",
			(long long)n, worst);
		if (!(worst <= 1e-5))
			nc_fail(v, "op indexer_scores: max relative difference %.3g > 1e-5", worst);
		free(q8);
		free(k8);
		free(keys);
		free(sc);
	}
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);
	npy_free(&d2);
	npy_free(&e2);

	/* top-k with ties: identical */
	NC_OPS("tk_scores", &a);
	NC_OPS("tk_sel", &b);
	{
		int64_t R = a.shape[0], n = a.shape[1], k = b.shape[1];
		int32_t *sel = malloc((size_t)n * sizeof *sel);
		REQUIRE(sel);
		bad = 0;
		for (int64_t i = 0; i < R; i++) {
			int64_t got = indexer_topk((const float *)a.data + i * n, n, k, sel);
			bad += got != k || memcmp(sel, (const int32_t *)b.data + i * k, (size_t)k * 4);
		}
		fprintf(stderr, "numerics op indexer_topk     %lld rows with ties: %lld differ\n",
			(long long)R, (long long)bad);
		if (bad)
			nc_fail(v, "op indexer_topk: %lld rows differ", (long long)bad);
		free(sel);
	}
	npy_free(&a);
	npy_free(&b);

	/* routing with ties: identical picks, weights within fp32 rounding */
	NC_OPS("rt_logits", &a);
	NC_OPS("rt_bias", &b);
	NC_OPS("rt_idx", &c2);
	NC_OPS("rt_wts", &d2);
	{
		struct dsv32_config rc = cfg;
		rc.n_routed_experts = a.shape[1];
		rc.num_experts_per_tok = c2.shape[1];
		rc.n_group = 8;
		rc.topk_group = 3;
		rc.routed_scaling_factor = 2.5;
		rc.norm_topk_prob = 1;
		int64_t R = a.shape[0], E = a.shape[1], K = c2.shape[1];
		int32_t idx[64];
		float wts[64];
		double worst = 0;
		bad = 0;
		for (int64_t i = 0; i < R; i++) {
			moe_route(&rc, (const float *)a.data + i * E, b.data, idx, wts);
			bad += memcmp(idx, (const int32_t *)c2.data + i * K, (size_t)K * 4) != 0;
			for (int64_t k = 0; k < K; k++)
				worst = fmax(worst, fabs(wts[k] - ((const float *)d2.data)[i * K + k]));
		}
		fprintf(stderr, "numerics op moe_route        %lld rows with ties: %lld differ, weights "
			"max |diff| %.2e\n", (long long)R, (long long)bad, worst);
		if (bad || !(worst <= 1e-6))
			nc_fail(v, "op moe_route: %lld rows pick other experts, weights differ by %.3g", (long long)bad,
				worst);
	}
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);
	npy_free(&d2);

	/* attention, both forms, on the same inputs */
	NC_OPS("at_q", &a);
	NC_OPS("at_kv", &b);
	NC_OPS("at_w", &c2);
	NC_OPS("at_s", &d2);
	{
		struct dsv32_config ac = cfg;
		ac.num_attention_heads = a.shape[0];
		int64_t H = a.shape[0], n = b.shape[0], dv = ac.v_head_dim;
		struct fp8_linear W = {c2.data, d2.data, c2.shape[0], c2.shape[1] * 4};
		REQUIRE(W.out == H * (ac.qk_nope_head_dim + dv) && W.in == ac.kv_lora_rank);
		float *o = malloc((size_t)(H * dv) * sizeof *o);
		REQUIRE(o);
		attn_absorbed(NULL, &ac, &W, a.data, b.data, n, o, NULL);
		NC_OPS("at_o_absorbed", &e2);
		nc_bf16_close(v, "attn_absorbed", o, e2.data, H * dv, 0.05);
		npy_free(&e2);
		attn_naive(NULL, &ac, &W, a.data, b.data, n, o);
		NC_OPS("at_o_naive", &e2);
		nc_bf16_close(v, "attn_naive", o, e2.data, H * dv, 0.05);
		npy_free(&e2);
		free(o);
	}
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);
	npy_free(&d2);

	/* SwiGLU middle */
	NC_OPS("sw_g", &a);
	NC_OPS("sw_u", &b);
	NC_OPS("sw_y", &c2);
	{
		int64_t n = a.shape[0] * a.shape[1];
		float *y = malloc((size_t)n * sizeof *y);
		REQUIRE(y);
		cpu_swiglu(y, a.data, b.data, n);
		nc_bf16_close(v, "swiglu", y, c2.data, n, 0.02);
		free(y);
	}
	npy_free(&a);
	npy_free(&b);
	npy_free(&c2);
}

#endif
