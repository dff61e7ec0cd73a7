/*
 * test_gpu_mla.c — the sparse MLA decode kernel (absorbed form's latent core) against the CPU
 * backend's attn_latent on the same queries and the same FP8 cache records, reached through
 * physical slots.
 *
 * Limit, per output element d of a head: the kernel feeds the softmax weights to P V on the
 * tensor cores as P_hi + P_lo (two fp16 parts: within 2^-22 of p, or 2^-25 absolute where P_lo
 * is an fp16 subnormal) and normalises by the fp32 sum of p, so the weights are the CPU's up to
 * fp32 rounding. What is left: the scores' fp32 dots in another order (576 terms up to ~20,
 * x 0.1352: ~4e-5 in a score, so ~2^-14 of each weight on both sides), covered by 2^-12 A[d]
 * with A[d] = Σ_s w_s |v_s[d]| (w the CPU's weights); the subnormal P_lo parts, n_sel 2^-25
 * max_s |v_s[d]|; and the two bf16 roundings of the output (CPU and GPU), up to one bf16 ulp,
 * <= 2^-7 |ref|. An element is bad beyond 2^-12 A[d] + n_sel 2^-25 max_s |v_s[d]| +
 * 2^-7 |ref[d]|. A wrong key, scale, head or missed key is off by O(A[d]) and fails. The
 * operands here (|q| <= 2.5, tile scales 2^-10 .. 2^-5) are inside the range fp16 holds
 * exactly (kernels_ptx/mla_decode.cu). The worst error relative to the row's RMS is printed as
 * well.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/cpu_attn.h"
#include "model/cuda_attn.h"
#include "model/kv_cache.h"

/* force: the key splits cuda_mla_decode_diag is told to use (bits 8-15; the batch-invariant
 * forward's path, k_mla_decode), 0 = cuda_mla_decode's own choice; wg: 1 k_mla_decode_wg (diag
 * bit 7), 2 the pair k_mla_decode_wg2 (bits 7 and 16), 3 the pair with P V and the next S issued
 * together (bits 7, 16, 20), 4 the pair with the light handover (bits 7, 16, 21) instead, the last
 * three also compared to the bit with k_mla_decode_wg at the same splits */
static void check_mla(struct gpu *g, int R, int H, int B, const int *n_sel, int ld, int n_pages,
		      float q_amp, int force, int wg, uint64_t seed)
{
	struct dsv32_config c = {.kv_lora_rank = R, .qk_rope_head_dim = 64, .index_head_dim = 128};
	config_derive(&c);
	const int DK = R + 64, rec = (int)c.mla_record_bytes;
	/* a pool of random records written by the CPU writer */
	size_t pool_bytes = (size_t)n_pages * 64 * rec;
	uint8_t *pool = malloc(pool_bytes);
	float *ckv = malloc((size_t)R * 4), kpe[64];
	for (int sl = 0; sl < n_pages * 64; sl++) {
		float amp = ldexpf(1.0f, (int)(test_rand(&seed) % 6) - 2);
		for (int i = 0; i < R; i++)
			ckv[i] = bf16_round(((float)((test_rand(&seed) >> 40) % 2001) - 1000.0f) / 1000.0f * amp);
		for (int i = 0; i < 64; i++)
			kpe[i] = bf16_round(((float)((test_rand(&seed) >> 40) % 2001) - 1000.0f) / 500.0f);
		kv_mla_write(&c, pool + (size_t)(sl / 64) * 64 * rec, sl % 64, ckv, kpe);
	}
	/* queries [B, H, DK] (bf16 values) and each row's selected slots (distinct, any order; the
	 * list's tail after n_sel[b] is -1) */
	float *qf = malloc((size_t)B * H * DK * 4);
	uint16_t *qh = malloc((size_t)B * H * DK * 2);
	for (size_t i = 0; i < (size_t)B * H * DK; i++) {
		qf[i] = bf16_round(((float)((test_rand(&seed) >> 40) % 2001) - 1000.0f) / 1000.0f * q_amp);
		qh[i] = f32_to_bf16(qf[i]);
	}
	int *sel = malloc((size_t)B * ld * sizeof *sel);
	for (int b = 0; b < B; b++)
		for (int s = 0; s < ld; s++)
			sel[(size_t)b * ld + s] = s < n_sel[b] ? (int)((uint64_t)(s * 7919 + b * 131) % (uint64_t)(n_pages * 64)) : -1;
	/* the CPU: rows of the selected records, then attn_latent per head; A = Σ w |v| */
	float *kv = malloc((size_t)ld * DK * 4), *score = malloc((size_t)ld * 4);
	float *ref = malloc((size_t)B * H * R * 4), *A = malloc((size_t)B * H * R * 4);
	float *vmax = calloc((size_t)B * R, 4); /* max over a row's selected keys of |v[d]| */
	for (int b = 0; b < B; b++) {
		for (int s = 0; s < n_sel[b]; s++) {
			int sl = sel[(size_t)b * ld + s];
			kv_mla_read(&c, pool + (size_t)(sl / 64) * 64 * rec, sl % 64, kv + (size_t)s * DK);
			for (int d = 0; d < R; d++)
				vmax[(size_t)b * R + d] = fmaxf(vmax[(size_t)b * R + d], fabsf(kv[(size_t)s * DK + d]));
		}
		for (int h = 0; h < H; h++) {
			const float *qq = qf + ((size_t)b * H + h) * DK;
			float *a = A + ((size_t)b * H + h) * R;
			attn_latent(&c, qq, qq + R, kv, n_sel[b], 0.1352f, score,
				    ref + ((size_t)b * H + h) * R);
			for (int d = 0; d < R; d++)
				a[d] = 0;
			for (int s = 0; s < n_sel[b]; s++) /* score now holds the softmax weights */
				for (int d = 0; d < R; d++)
					a[d] += score[s] * fabsf(kv[(size_t)s * DK + d]);
		}
	}
	gpu_ptr d_q = gpu_test_alloc((size_t)B * H * DK * 2), d_sel = gpu_test_alloc((size_t)B * ld * 4),
		d_pool = gpu_test_alloc(pool_bytes), d_o = gpu_test_alloc((size_t)B * H * R * 2);
	REQUIRE(gpu_upload(g, d_q, qh, (size_t)B * H * DK * 2) == 0);
	REQUIRE(gpu_upload(g, d_sel, sel, (size_t)B * ld * 4) == 0);
	REQUIRE(gpu_upload(g, d_pool, pool, pool_bytes) == 0);
	gpu_test_poison(g, d_o, (size_t)B * H * R * 2);
	size_t wsb = force ? (size_t)B * H * force * (R + 2) * 4 : cuda_mla_decode_workspace(g, B, H, R, ld);
	gpu_ptr d_ws = wsb ? gpu_test_alloc(wsb) : 0;
	int splits = force ? force : cuda_mla_decode_splits(g, B, H, ld);
	if (force || wg)
		REQUIRE(cuda_mla_decode_diag(g, d_q, d_sel, ld, d_pool, rec, R, H, B, 0.1352f, d_o, d_ws,
					     force << 8 | (wg ? 128 : 0) | (wg >= 2 ? 0x10000 : 0) | (wg == 3 ? 0x100000 : 0) |
						     (wg == 4 ? 0x200000 : 0)) == 0);
	else
		REQUIRE(cuda_mla_decode(g, d_q, d_sel, ld, d_pool, rec, R, H, B, 0.1352f, d_o, d_ws) == 0);
	REQUIRE(gpu_sync(g) == 0);
	uint16_t *got = malloc((size_t)B * H * R * 2);
	REQUIRE(gpu_download(g, got, d_o, (size_t)B * H * R * 2) == 0);
	if (wg >= 2) { /* the pair computes k_mla_decode_wg's tiles with its consumers: the same bits */
		gpu_test_poison(g, d_o, (size_t)B * H * R * 2);
		REQUIRE(cuda_mla_decode_diag(g, d_q, d_sel, ld, d_pool, rec, R, H, B, 0.1352f, d_o, d_ws,
					     force << 8 | 128) == 0);
		REQUIRE(gpu_sync(g) == 0);
		uint16_t *one = malloc((size_t)B * H * R * 2);
		REQUIRE(gpu_download(g, one, d_o, (size_t)B * H * R * 2) == 0);
		int64_t differ = 0, first_d = -1;
		for (size_t i = 0; i < (size_t)B * H * R; i++)
			if (one[i] != got[i] && differ++ == 0)
				first_d = (int64_t)i;
		printf("    k_mla_decode_wg2%s against k_mla_decode_wg: %lld of %lld outputs differ",
		       wg == 4 ? " (light)" : wg == 3 ? " (fused)" : "", (long long)differ, (long long)B * H * R);
		if (differ)
			printf(" (first [b %lld h %lld d %lld]: %g against %g)", (long long)(first_d / R / H),
			       (long long)(first_d / R % H), (long long)(first_d % R), bf16_to_f32(got[first_d]),
			       bf16_to_f32(one[first_d]));
		printf("\n");
		CHECK_EQ_INT(differ, 0);
		free(one);
	}
	if (d_ws)
		cu.cuMemFree(d_ws);
	int64_t bad = 0, first = -1, worst_i = 0;
	int64_t bad_dim[8] = {0}, bad_head[4] = {0}; /* where they are: by 64 dims, by 16 heads of 64 */
	double worst = 0, worst_rms = 0;
	for (int r = 0; r < B * H; r++) {
		double rms = gpu_row_rms(ref + (size_t)r * R, R);
		for (int d = 0; d < R; d++) {
			size_t i = (size_t)r * R + d;
			double err = fabs((double)bf16_to_f32(got[i]) - ref[i]);
			const int bb = r / H;
			double lim = ldexp(A[i], -12) + ldexp(fabs(ref[i]), -7) +
				     ldexp((double)n_sel[bb] * vmax[(size_t)bb * R + d], -25);
			double ratio = lim > 0 ? err / lim : (err > 0 ? INFINITY : 0);
			if (!(ratio <= 1.0)) {
				bad++;
				bad_dim[d * 8 / R]++;
				bad_head[r % H % 64 / 16]++;
				if (first < 0)
					first = (int64_t)i;
			}
			if (!(ratio <= worst))
				worst = ratio, worst_i = (int64_t)i;
			if (rms > 0 && err / rms > worst_rms)
				worst_rms = err / rms;
		}
	}
	printf("    %s R=%d H=%d B=%d ld=%d q_amp=%g (%d key splits): worst err/limit %.3g at "
	       "[b %lld h %lld d %lld] (got %g ref %g A %g), worst |err|/rms(row) %.2g, %lld bad\n",
	       wg == 4 ? "k_mla_decode_wg2 (light)" : wg == 3 ? "k_mla_decode_wg2 (fused)" : wg == 2 ? "k_mla_decode_wg2" : wg ? "k_mla_decode_wg" : force ? "k_mla_decode" : "cuda_mla_decode", R, H, B, ld, q_amp, splits, worst, (long long)(worst_i / R / H),
	       (long long)(worst_i / R % H), (long long)(worst_i % R), bf16_to_f32(got[worst_i]),
	       ref[worst_i], A[worst_i], worst_rms, (long long)bad);
	if (first >= 0)
		printf("    first bad: [b %lld h %lld d %lld] got %g ref %g A %g\n", (long long)(first / R / H),
		       (long long)(first / R % H), (long long)(first % R), bf16_to_f32(got[first]), ref[first],
		       A[first]);
	if (bad)
		printf("    bad by dims (eighths of R): %lld %lld %lld %lld %lld %lld %lld %lld; by heads (16 of each "
		       "64): %lld %lld %lld %lld\n", (long long)bad_dim[0], (long long)bad_dim[1], (long long)bad_dim[2],
		       (long long)bad_dim[3], (long long)bad_dim[4], (long long)bad_dim[5], (long long)bad_dim[6],
		       (long long)bad_dim[7], (long long)bad_head[0], (long long)bad_head[1], (long long)bad_head[2],
		       (long long)bad_head[3]);
	CHECK_EQ_INT(bad, 0);
	cu.cuMemFree(d_q), cu.cuMemFree(d_sel), cu.cuMemFree(d_pool), cu.cuMemFree(d_o);
	free(pool), free(ckv), free(qf), free(qh), free(sel), free(kv), free(score), free(ref), free(A), free(vmax), free(got);
}

TEST_T(gpu_mla, decode_matches_cpu, 300)
{
	struct gpu g;
	gpu_test_open(&g);
	/* the real dims: 128 heads, 656-byte records; lists ending inside a tile, a split, a row */
	int n_real[4] = {1, 17, 300, 2048};
	check_mla(&g, 512, 128, 4, n_real, 2048, 64, 2.5f, 0, 0, 3001);
	check_mla(&g, 512, 128, 4, n_real, 2048, 64, 0.05f, 0, 0, 3003); /* flat softmax: outputs cancel */
	int n_one[1] = {2048};
	check_mla(&g, 512, 128, 1, n_one, 2048, 64, 2.5f, 0, 0, 3004); /* batch 1: the most splits */
	int n_many[70];
	for (int b = 0; b < 70; b++)
		n_many[b] = 64 + 3 * b;
	check_mla(&g, 512, 128, 70, n_many, 300, 16, 1.0f, 0, 0, 3005); /* 140 blocks: one split */
	int n_tiny[3] = {5, 64, 100};
	check_mla(&g, 256, 16, 3, n_tiny, 100, 4, 2.5f, 0, 0, 3002); /* the tiny model's latent (4 heads padded to 16) */
	/* forced splits (the batch-invariant forward): 2 tiles a split, 8 splits over short lists */
	check_mla(&g, 512, 128, 4, n_real, 2048, 64, 2.5f, 16, 0, 3006);
	check_mla(&g, 512, 128, 4, n_real, 2048, 64, 1.0f, 8, 0, 3007);
	check_mla(&g, 256, 16, 3, n_tiny, 100, 4, 2.5f, 2, 0, 3008);
	gpu_close(&g);
}

/* The cases of the wgmma kernels (k_mla_decode_wg and the pair's forms): lists ending inside a
 * tile, a split, a row (L_REAL), a flat softmax (amp 0.05), batch 1's many splits (L_ONE), 140
 * blocks of one split (L_MANY), forced splits, 64 splits of one 32-key tile each; `all` = 0: the
 * cases the pair's variants repeat. Seed = the caller's base + id. */
enum { L_REAL, L_ONE, L_MANY };
static const struct wg_case {
	int id, B, list;
	float amp;
	int force, all;
} wg_cases[] = {
	{4, 1, L_ONE, 2.5f, 0, 0},  {1, 4, L_REAL, 2.5f, 0, 0}, {3, 4, L_REAL, 0.05f, 0, 1},
	{5, 70, L_MANY, 1.0f, 0, 0}, {6, 3, L_REAL, 2.5f, 16, 1}, {7, 4, L_REAL, 1.0f, 8, 0},
	{8, 1, L_ONE, 2.5f, 64, 0},
};

/* wg_cases with kernel form wg (check_mla's); h6: the heads of case 6 (64 shows a single head
 * group to k_mla_decode_wg; the pair needs 128); all: every case, else those with all = 0 */
static void run_wg_cases(struct gpu *g, int wg, int h6, int all, uint64_t seed)
{
	int n_real[4] = {1, 17, 300, 2048}, n_one[1] = {2048}, n_many[70];
	for (int b = 0; b < 70; b++)
		n_many[b] = 64 + 3 * b;
	for (size_t i = 0; i < sizeof wg_cases / sizeof *wg_cases; i++) {
		const struct wg_case *c = &wg_cases[i];
		if (c->all && !all)
			continue;
		const int *n = c->list == L_REAL ? n_real : c->list == L_ONE ? n_one : n_many;
		const int ld = c->list == L_MANY ? 300 : 2048, pages = c->list == L_MANY ? 16 : 64;
		check_mla(g, 512, c->id == 6 ? h6 : 128, c->B, n, ld, pages, c->amp, c->force, wg, seed + (uint64_t)c->id);
	}
}

TEST_T(gpu_mla, decode_wg_matches_cpu, 300)
{
	struct gpu g;
	gpu_test_open(&g);
	run_wg_cases(&g, 1, 64, 1, 3100); /* k_mla_decode_wg (wgmma, tiles of 32 keys) */
	gpu_close(&g);
}

TEST_T(gpu_mla, decode_wg2_matches_cpu, 300)
{
	struct gpu g;
	gpu_test_open(&g);
	/* k_mla_decode_wg2 (the 64-head pair a cluster, each dequantising half of every tile's keys
	 * into both, the peer's half by st.async), H = 128 throughout (the pair needs two head
	 * groups); then P V of a tile and S of the next issued together (diag bit 20), and the light
	 * handover (diag bit 21), on the shorter list */
	run_wg_cases(&g, 2, 128, 1, 3200);
	run_wg_cases(&g, 3, 128, 0, 3210);
	run_wg_cases(&g, 4, 128, 0, 3220);
	gpu_close(&g);
}

#endif
