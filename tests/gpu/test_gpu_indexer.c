/*
 * test_gpu_indexer.c — the lightning-indexer score kernel against the CPU backend's
 * indexer_scores on the same FP8 queries, head weights and paged FP8 keys: every causal score
 * within fp32 summation-order rounding, every masked position -inf.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/cpu_indexer.h"
#include "model/cpu_ops.h"
#include "model/cuda_attn.h"
#include "model/kv_cache.h"

static uint8_t rand_e4m3(uint64_t *seed)
{
	uint8_t b = (uint8_t)test_rand(seed);
	return (b & 0x80) | ((b & 0x7f) % 0x70); /* |value| <= 240, never NaN */
}

/* kpw >= 0: through cuda_indexer_scores_kpw (k_indexer_scores_fp8, FP8 MMA dots, kpw keys a warp;
 * 0 = the launcher's choice) instead of kpw = -1: k_indexer_scores (exact products in fp16, fp32
 * sums). Limit of both: 1e-5 of the row's
 * largest |score| (fp32 summation order). For the FP8 kernel the worst error relative to the
 * score's magnitude scale M = s_k Σ_h |w_h| Σ_d |q_hd k_d| is printed too: run 3 on the H200
 * measured 2^-23 .. 2^-24, i.e. mma.sync e4m3 adds the exact products as fp32 would (unlike
 * wgmma's FP8 accumulation, which keeps ~13 bits). */
static void check_scores(struct gpu *g, int H, const int *n, int B, int max_blocks, int kpw, uint64_t seed)
{
	const int fp8 = kpw >= 0;
	struct dsv32_config c = {.index_n_heads = H, .index_head_dim = 128, .kv_lora_rank = 512,
				 .qk_rope_head_dim = 64};
	config_derive(&c);
	size_t page_bytes = kv_index_page_bytes(&c);
	int n_pages = B * max_blocks;
	uint8_t *pool = malloc((size_t)n_pages * page_bytes);
	for (size_t i = 0; i < (size_t)n_pages * page_bytes; i++)
		pool[i] = rand_e4m3(&seed);
	for (int p = 0; p < n_pages; p++) /* power-of-two key scales */
		for (int s = 0; s < 64; s++) {
			float sc = ldexpf(1.0f, -(int)(test_rand(&seed) % 8) - 2);
			memcpy(pool + (size_t)p * page_bytes + 64 * 128 + s * 4, &sc, 4);
		}
	/* each query's pages: a random permutation slice, so pages are not in order */
	int *bt = malloc((size_t)B * max_blocks * sizeof *bt), *perm = malloc((size_t)n_pages * sizeof *perm);
	for (int i = 0; i < n_pages; i++)
		perm[i] = i;
	for (int i = n_pages - 1; i > 0; i--) {
		int j = (int)(test_rand(&seed) % (uint64_t)(i + 1)), tmp = perm[i];
		perm[i] = perm[j], perm[j] = tmp;
	}
	for (int i = 0; i < B * max_blocks; i++)
		bt[i] = perm[i];
	uint8_t *q8 = malloc((size_t)B * H * 128);
	float *w = malloc((size_t)B * H * 4);
	for (size_t i = 0; i < (size_t)B * H * 128; i++)
		q8[i] = rand_e4m3(&seed);
	for (int i = 0; i < B * H; i++)
		w[i] = ((float)(test_rand(&seed) % 2001) - 1000.0f) * 1e-6f;
	int ld = max_blocks * 64;
	float *ref = malloc((size_t)B * ld * 4), *got = malloc((size_t)B * ld * 4);
	const uint8_t **keys = malloc((size_t)ld * sizeof *keys);
	float *ks = malloc((size_t)ld * 4);
	for (int b = 0; b < B; b++) {
		for (int s = 0; s < n[b]; s++) {
			const uint8_t *pg = pool + (size_t)bt[b * max_blocks + s / 64] * page_bytes;
			keys[s] = kv_index_codes(&c, pg, s % 64);
			ks[s] = kv_index_scale(&c, pg, s % 64);
		}
		indexer_scores(NULL, &c, q8 + (size_t)b * H * 128, w + (size_t)b * H, keys, ks, n[b],
			       ref + (size_t)b * ld);
	}
	gpu_ptr d_q = gpu_test_alloc((size_t)B * H * 128), d_w = gpu_test_alloc((size_t)B * H * 4),
		d_pool = gpu_test_alloc((size_t)n_pages * page_bytes),
		d_bt = gpu_test_alloc((size_t)B * max_blocks * 4), d_n = gpu_test_alloc((size_t)B * 4),
		d_out = gpu_test_alloc((size_t)B * ld * 4);
	REQUIRE(gpu_upload(g, d_q, q8, (size_t)B * H * 128) == 0);
	REQUIRE(gpu_upload(g, d_w, w, (size_t)B * H * 4) == 0);
	REQUIRE(gpu_upload(g, d_pool, pool, (size_t)n_pages * page_bytes) == 0);
	REQUIRE(gpu_upload(g, d_bt, bt, (size_t)B * max_blocks * 4) == 0);
	REQUIRE(gpu_upload(g, d_n, n, (size_t)B * 4) == 0);
	gpu_test_poison(g, d_out, (size_t)B * ld * 4);
	long long pb = (long long)page_bytes;
	int hh = H, mb = max_blocks, l = ld;
	void *args[] = {&d_q, &d_w, &hh, &d_pool, &pb, &d_bt, &mb, &d_n, &d_out, &l};
	if (fp8)
		REQUIRE(cuda_indexer_scores_kpw(g, d_q, d_w, H, d_pool, pb, d_bt, max_blocks, d_n, d_out, ld, B, kpw) == 0);
	else
		REQUIRE(gpu_launch(g, gpu_kernel(g, "k_indexer_scores"), (unsigned)((ld + 255) / 256),
				   (unsigned)B, 1, 128, 1, 1, 0, args) == 0);
	REQUIRE(gpu_download(g, got, d_out, (size_t)B * ld * 4) == 0);
	int64_t bad = 0, masked_bad = 0;
	double worst = 0, worst_m = 0;
	int worst_b = 0, worst_s = 0;
	const float *lut = cpu_e4m3_table();
	for (int b = 0; b < B; b++) {
		double mx = 0;
		for (int s = 0; s < n[b]; s++)
			mx = fmax(mx, fabs(ref[(size_t)b * ld + s]));
		for (int s = 0; s < ld; s++) {
			float r = ref[(size_t)b * ld + s], x = got[(size_t)b * ld + s];
			if (s >= n[b]) {
				masked_bad += !(isinf(x) && x < 0);
				continue;
			}
			/* fp32 order of 128-term dots and an H-term sum: relative to the row's scale */
			double e = fabs((double)x - r) / (mx > 0 ? mx : 1);
			if (fp8) { /* M: the magnitude scale of this score */
				const uint8_t *pg = pool + (size_t)bt[b * max_blocks + s / 64] * page_bytes;
				const uint8_t *kc = kv_index_codes(&c, pg, s % 64);
				double M = 0;
				for (int h = 0; h < H; h++) {
					double a = 0;
					for (int d = 0; d < 128; d++)
						a += fabs((double)lut[q8[((size_t)b * H + h) * 128 + d]] * lut[kc[d]]);
					M += fabs(w[b * H + h]) * a;
				}
				M *= kv_index_scale(&c, pg, s % 64);
				double em = M > 0 ? fabs((double)x - r) / M : (x == r ? 0 : INFINITY);
				if (!(em <= worst_m))
					worst_m = em, worst_b = b, worst_s = s;
			}
			worst = e > worst || isnan(e) ? e : worst;
			bad += !(e <= 1e-5);
		}
	}
	printf("    indexer scores%s H=%d B=%d kpw=%d: worst |err|/max|row| %.2g, %lld bad, %lld masked not -inf\n",
	       fp8 ? " (FP8 MMA)" : "", H, B, kpw, worst, (long long)bad, (long long)masked_bad);
	if (fp8)
		printf("    worst |err| / M (M = s_k sum_h |w_h| sum_d |q k|) %.3g = 2^%.1f at row %d key %d (got %g ref %g)\n",
		       worst_m, worst_m > 0 ? log2(worst_m) : -INFINITY, worst_b, worst_s,
		       got[(size_t)worst_b * ld + worst_s], ref[(size_t)worst_b * ld + worst_s]);
	CHECK_EQ_INT(bad, 0);
	CHECK_EQ_INT(masked_bad, 0);
	cu.cuMemFree(d_q), cu.cuMemFree(d_w), cu.cuMemFree(d_pool), cu.cuMemFree(d_bt);
	cu.cuMemFree(d_n), cu.cuMemFree(d_out);
	free(pool), free(bt), free(perm), free(q8), free(w), free(ref), free(got), free(keys), free(ks);
}

TEST_T(gpu_indexer, scores_match_cpu, 120)
{
	struct gpu g;
	gpu_test_open(&g);
	/* the exact kernel, then the FP8 one at the launcher's keys a warp and at 16, 48 (warps
	 * straddling pages), 256 and 1024 */
	const int kpws[] = {-1, 0, 16, 48, 256, 1024};
	for (size_t v = 0; v < sizeof kpws / sizeof *kpws; v++) {
		int kpw = kpws[v];
		int n_real[6] = {1, 63, 64, 65, 300, 2047};
		check_scores(&g, 64, n_real, 6, 32, kpw, 1001); /* the real 64 heads */
		int n_tiny[3] = {5, 128, 500};
		check_scores(&g, 4, n_tiny, 3, 8, kpw, 1002);   /* the tiny model's 4 heads */
		int n_long[2] = {5000, 3333};
		check_scores(&g, 64, n_long, 2, 80, kpw, 1003); /* several blocks of 1024 keys */
	}
	gpu_close(&g);
}

#endif

#ifndef DSV32_NO_CUDA
/* The top-k kernel against indexer_topk on the same scores: the same positions, in ascending
 * order, -1 padded; slots through the block table. Scores with many ties, NaN and -inf. */
/* dist: 0 = 512 levels with NaN, -inf, -0 (many ties); 1 = continuous (a sum of uniforms, no
 * ties to speak of); 2 = rows of one value with a few larger ones (the threshold bin holds
 * nearly the whole row: k_topk_select's candidate list overflows); 3 = rising with the
 * position plus noise (a sample of the row is not representative of its top). mode: the kernel
 * cuda_indexer_topk_mode runs (1 k_topk_select, 2 k_topk_cl8, 3 k_topk, 4 k_topk_cl16, 5
 * k_topk_cl4: rows of at most 130816 keys, longer ones skipped). */
static const char *const topk_names[6] = {"auto", "k_topk_select", "k_topk_cl8", "k_topk", "k_topk_cl16", "k_topk_cl4"};
static void check_topk(struct gpu *g, const int *n, int B, int k_max, int dist, int mode, uint64_t seed)
{
	int ld = 0;
	for (int b = 0; b < B; b++)
		ld = n[b] > ld ? n[b] : ld;
	if (mode == 5 && ld > 130816) {
		printf("    k_topk_cl4: rows of %d keys skipped (at most 130816)\n", ld);
		return;
	}
	int max_blocks = (ld + 63) / 64;
	float *sc = malloc((size_t)B * ld * 4);
	int *bt = malloc((size_t)B * max_blocks * 4);
	for (int b = 0; b < B; b++) {
		for (int s = 0; s < ld; s++) {
			uint64_t r = test_rand(&seed);
			float v;
			if (dist == 1) {
				v = 0;
				for (int u = 0; u < 4; u++)
					v += (float)((test_rand(&seed) >> 40) * (1.0 / (1ull << 24)));
				v = (v - 2.0f) * 3.0f;
			} else if (dist == 2) {
				v = r % 97 == 0 ? 1.5f + (float)(r % 7) : 1.25f;
			} else if (dist == 3) { /* rising with the position (recent keys score higher) */
				v = (float)s * 1e-3f + (float)((test_rand(&seed) >> 40) % 1000) * 1e-3f;
			} else {
				v = (float)(r % 512) * 0.25f - 64.0f; /* 512 levels: plenty of ties */
				if (r % 1000 == 7)
					v = NAN;
				if (r % 1000 == 8)
					v = -INFINITY;
				if (r % 1000 == 9)
					v = -0.0f;
			}
			sc[(size_t)b * ld + s] = v;
		}
		for (int i = 0; i < max_blocks; i++)
			bt[b * max_blocks + i] = (int)(test_rand(&seed) % 100000);
	}
	int32_t *ref = malloc((size_t)k_max * 4);
	int *pos = malloc((size_t)B * k_max * 4), *slot = malloc((size_t)B * k_max * 4);
	gpu_ptr d_sc = gpu_test_alloc((size_t)B * ld * 4), d_n = gpu_test_alloc((size_t)B * 4),
		d_bt = gpu_test_alloc((size_t)B * max_blocks * 4), d_pos = gpu_test_alloc((size_t)B * k_max * 4),
		d_slot = gpu_test_alloc((size_t)B * k_max * 4);
	REQUIRE(gpu_upload(g, d_sc, sc, (size_t)B * ld * 4) == 0);
	REQUIRE(gpu_upload(g, d_n, n, (size_t)B * 4) == 0);
	REQUIRE(gpu_upload(g, d_bt, bt, (size_t)B * max_blocks * 4) == 0);
	gpu_test_poison(g, d_pos, (size_t)B * k_max * 4);
	gpu_test_poison(g, d_slot, (size_t)B * k_max * 4);
	REQUIRE(cuda_indexer_topk_mode(g, d_sc, ld, d_n, k_max, d_bt, max_blocks, d_pos, d_slot, B, mode) == 0);
	REQUIRE(gpu_download(g, pos, d_pos, (size_t)B * k_max * 4) == 0);
	REQUIRE(gpu_download(g, slot, d_slot, (size_t)B * k_max * 4) == 0);
	int64_t bad_rows = 0;
	for (int b = 0; b < B; b++) {
		int64_t k = indexer_topk(sc + (size_t)b * ld, n[b], k_max, ref);
		int bad = 0;
		for (int i = 0; i < k_max; i++) {
			int want = i < k ? ref[i] : -1;
			int p = pos[(size_t)b * k_max + i], s = slot[(size_t)b * k_max + i];
			int want_slot = want < 0 ? -1 : bt[b * max_blocks + want / 64] * 64 + want % 64;
			bad += p != want || s != want_slot;
		}
		if (bad) {
			int i = 0;
			while (i < k_max && pos[(size_t)b * k_max + i] == (i < k ? ref[i] : -1))
				i++;
			printf("    topk row %d (n=%d, k_max=%d): %d entries differ, first at %d: got pos %d, want %d\n",
			       b, n[b], k_max, bad, i, i < k_max ? pos[(size_t)b * k_max + i] : 0,
			       i < k_max ? (i < k ? ref[i] : -1) : 0);
		}
		bad_rows += bad != 0;
	}
	printf("    %s k_max=%d dist=%d over %d rows: %lld rows differ from the CPU's sorted selection\n",
	       topk_names[mode], k_max, dist, B, (long long)bad_rows);
	CHECK_EQ_INT(bad_rows, 0);
	cu.cuMemFree(d_sc), cu.cuMemFree(d_n), cu.cuMemFree(d_bt), cu.cuMemFree(d_pos), cu.cuMemFree(d_slot);
	free(sc), free(bt), free(ref), free(pos), free(slot);
}

/* The cases of the top-k tests with kernel `mode`: rows from 1 key to 163840 (ld % 4 == 0) with
 * every distribution, k_max 2048 and 64; rows with ld % 4 != 0 (scalar loads); k_max 5 with few
 * keys a CTA of a cluster (not k_topk: a block a row takes those like any other) */
static void topk_cases(struct gpu *g, int mode)
{
	int n[8] = {1, 100, 2048, 2049, 5000, 70000, 163840, 777};
	check_topk(g, n, 8, 2048, 0, mode, 2001);
	check_topk(g, n, 8, 64, 0, mode, 2002);
	check_topk(g, n, 8, 2048, 1, mode, 2003);
	check_topk(g, n, 8, 2048, 2, mode, 2004);
	check_topk(g, n, 8, 2048, 3, mode, 2007);
	if (mode == 3)
		return;
	int n_odd[3] = {131071, 4099, 2050}; /* ld % 4 != 0: scalar loads */
	check_topk(g, n_odd, 3, 2048, 1, mode, 2005);
	check_topk(g, n_odd, 3, 2048, 0, mode, 2006);
	int n_small[5] = {9, 3000, 2049, 17, 40000}; /* few keys a CTA of the cluster, k_max 5 */
	check_topk(g, n_small, 5, 5, 0, mode, 2008);
	check_topk(g, n_small, 5, 5, 1, mode, 2009);
}

TEST_T(gpu_indexer, topk_matches_full_sort, 240)
{
	struct gpu g;
	gpu_test_open(&g);
	for (int mode = 0; mode <= 3; mode++) /* (the dispatch's own choice, then each block kernel) */
		if (mode != 2)
			topk_cases(&g, mode);
	gpu_close(&g);
}

/* the cluster kernels k_topk_cl8, k_topk_cl16, k_topk_cl4 (modes 2, 4, 5): the cases above, then
 * the forward's shapes at batch 1-16: 16 rows of ~32K (continuous scores), 2 of 128K (ties, NaN,
 * -inf; not cl4), 2 of ~32K (cl4's batch 1) */
TEST_T(gpu_indexer, topk_cluster_kernels, 120)
{
	struct gpu g;
	gpu_test_open(&g);
	int n_32k[16], n_128k[2] = {131072, 131000};
	for (int b = 0; b < 16; b++)
		n_32k[b] = 32768 - 61 * b;
	int n_32k1[2] = {32768, 30001};
	for (int mode = 2; mode <= 5; mode++) {
		if (mode == 3)
			continue;
		topk_cases(&g, mode);
		check_topk(&g, n_32k, 16, 2048, 1, mode, 2010);
		check_topk(&g, n_128k, 2, 2048, 0, mode, 2011);
		check_topk(&g, n_32k1, 2, 2048, 0, mode, 2012);
	}
	gpu_close(&g);
}
#endif
