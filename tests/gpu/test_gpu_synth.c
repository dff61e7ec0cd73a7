/*
 * test_gpu_synth.c — synthetic weights generated on the GPU (model/cuda_synth.c) have mkmodel's
 * recipes: FP8 codes are exactly ±e4m3(k), k uniform in 0..15; BF16 values are exactly
 * k · 2^-shift with |k| <= 254 and rms 73.9 · 2^-shift (shift from the fan-in as in
 * tools/mkmodel/gen.h); the fill is deterministic, depends on seed and name, and only the
 * tensors a header-only checkpoint leaves as holes are generated.
 *
 * The synthetic KV fill (cuda_synth_kv_fill) leaves the pools byte-identical to the CPU
 * backend's writers fed the host reference values (chunked through a small arena or in one
 * chunk alike), every filled record decodes to finite values of RMS ~1, and every byte of the
 * slots and pages it was not asked to fill still holds the poison.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include <string.h>

#include "model/cpu_ops.h"
#include "model/cuda_synth.h"
#include "model/kv_cache.h"

static struct st_tensor tensor(const char *name, enum st_dtype dt, int64_t rows, int64_t cols)
{
	struct st_tensor t = {.name = name, .dtype = dt, .ndim = cols ? 2 : 1};
	t.shape[0] = rows, t.shape[1] = cols;
	t.nbytes = (size_t)rows * (size_t)(cols ? cols : 1) * st_dtype_size(dt);
	return t;
}

TEST(gpu_synth, fp8_codes_and_distribution)
{
	struct gpu g;
	gpu_test_open(&g);
	struct st_tensor t = tensor("model.layers.3.mlp.experts.7.gate_proj.weight", ST_F8_E4M3,
				    512, 7168);
	CHECK(cuda_synth_generated(&t));
	gpu_ptr d = gpu_test_alloc(t.nbytes), d2 = gpu_test_alloc(t.nbytes);
	gpu_test_poison(&g, d, t.nbytes);
	REQUIRE(cuda_synth_tensor(&g, d, &t, 1) == 0);
	REQUIRE(cuda_synth_tensor(&g, d2, &t, 1) == 0);
	uint8_t *a = malloc(t.nbytes), *b = malloc(t.nbytes);
	REQUIRE(gpu_download(&g, a, d, t.nbytes) == 0);
	REQUIRE(gpu_download(&g, b, d2, t.nbytes) == 0);
	CHECK(memcmp(a, b, t.nbytes) == 0); /* deterministic */
	long long count[16] = {0}, neg = 0, bad = 0;
	for (size_t i = 0; i < t.nbytes; i++) {
		float v = e4m3_to_f32(a[i]);
		int k = (int)fabsf(v);
		if ((float)k != fabsf(v) || k > 15 || (a[i] == 0x80)) {
			if (bad++ < 5)
				printf("    byte %zu: code 0x%02x = %g is not ±k, k in 0..15\n", i, a[i], v);
			continue;
		}
		count[k]++;
		neg += v < 0;
	}
	CHECK(bad == 0);
	double expect = (double)t.nbytes / 16;
	for (int k = 0; k < 16; k++)
		CHECK(fabs((double)count[k] - expect) < 0.02 * expect);
	double nonzero = (double)t.nbytes - (double)count[0];
	CHECK(fabs((double)neg - nonzero / 2) < 0.01 * nonzero);
	printf("    %zu codes: k=0 %lld, k=15 %lld (expect %.0f), negative %.4f of non-zero\n",
	       t.nbytes, count[0], count[15], expect, (double)neg / nonzero);
	/* another seed, another name: other bytes */
	REQUIRE(cuda_synth_tensor(&g, d2, &t, 2) == 0);
	REQUIRE(gpu_download(&g, b, d2, t.nbytes) == 0);
	CHECK(memcmp(a, b, t.nbytes) != 0);
	struct st_tensor t2 = t;
	t2.name = "model.layers.3.mlp.experts.8.gate_proj.weight";
	REQUIRE(cuda_synth_tensor(&g, d2, &t2, 1) == 0);
	REQUIRE(gpu_download(&g, b, d2, t.nbytes) == 0);
	CHECK(memcmp(a, b, t.nbytes) != 0);
	free(a), free(b);
	gpu_close(&g);
}

/* k_fill_e4m3_normal (bench moe --weights normal): deterministic a seed, never NaN, and the
 * decoded values N(0, sigma^2) as e4m3 rounds them: mean ~0, standard deviation ~sigma, the
 * share of |value| >= 224 that of |x| >= 216 (the rounding midpoint below 224: 2.8%), the
 * largest near 448 (saturated there, never above). */
TEST(gpu_synth, e4m3_normal_fill)
{
	struct gpu g;
	gpu_test_open(&g);
	long long n = 1 << 22;
	unsigned long long seed = 7;
	float sigma = 448.0f / 4.56f;
	gpu_ptr d = gpu_test_alloc((size_t)n), d2 = gpu_test_alloc((size_t)n);
	void *a1[] = {&d, &n, &seed, &sigma}, *a2[] = {&d2, &n, &seed, &sigma};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_fill_e4m3_normal"), 256, 1, 1, 256, 1, 1, 0, a1) == 0);
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_fill_e4m3_normal"), 64, 1, 1, 128, 1, 1, 0, a2) == 0);
	uint8_t *a = malloc((size_t)n), *b = malloc((size_t)n);
	REQUIRE(a && b);
	REQUIRE(gpu_download(&g, a, d, (size_t)n) == 0);
	REQUIRE(gpu_download(&g, b, d2, (size_t)n) == 0);
	CHECK(memcmp(a, b, (size_t)n) == 0); /* the same bytes whatever the grid */
	double sum = 0, sq = 0, mx = 0;
	long long nan = 0, beyond = 0;
	for (long long i = 0; i < n; i++) {
		if ((a[i] & 0x7f) == 0x7f) {
			nan++;
			continue;
		}
		double v = e4m3_to_f32(a[i]);
		sum += v, sq += v * v;
		mx = fabs(v) > mx ? fabs(v) : mx;
		beyond += fabs(v) >= 224;
	}
	double mean = sum / n, sd = sqrt(sq / n - mean * mean), tail = (double)beyond / n;
	const double want = erfc(216 / (sigma * sqrt(2.0)));
	printf("    %lld codes: mean %.3f, sd %.2f (sigma %.2f), |v| >= 224 %.4f (want %.4f), "
	       "largest %g\n",
	       n, mean, sd, sigma, tail, want, mx);
	CHECK(nan == 0);
	CHECK(fabs(mean) < 0.01 * sigma);
	CHECK(fabs(sd - sigma) < 0.02 * sigma); /* e4m3's rounding: ~1% of a value's size */
	CHECK(fabs(tail - want) < 0.002);
	CHECK(mx <= 448 && mx >= 352);
	seed = 8; /* another seed: other bytes */
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_fill_e4m3_normal"), 64, 1, 1, 128, 1, 1, 0, a2) == 0);
	REQUIRE(gpu_download(&g, b, d2, (size_t)n) == 0);
	CHECK(memcmp(a, b, (size_t)n) != 0);
	free(a), free(b);
	gpu_close(&g);
}

static void check_bf16(struct gpu *g, const char *name, int64_t rows, int64_t cols, int shift)
{
	struct st_tensor t = tensor(name, ST_BF16, rows, cols);
	CHECK(cuda_synth_generated(&t));
	gpu_ptr d = gpu_test_alloc(t.nbytes);
	gpu_test_poison(g, d, t.nbytes);
	REQUIRE(cuda_synth_tensor(g, d, &t, 7) == 0);
	size_t n = t.nbytes / 2;
	uint16_t *h = malloc(t.nbytes);
	REQUIRE(gpu_download(g, h, d, t.nbytes) == 0);
	long long bad = 0;
	double s2 = 0, s1 = 0;
	for (size_t i = 0; i < n; i++) {
		double k = ldexp((double)bf16_to_f32(h[i]), shift);
		if (k != floor(k) || fabs(k) > 254) {
			if (bad++ < 5)
				printf("    %s[%zu] = %g: not k * 2^-%d, |k| <= 254\n", name, i,
				       (double)bf16_to_f32(h[i]), shift);
			continue;
		}
		s1 += k, s2 += k * k;
	}
	CHECK(bad == 0);
	double rms = sqrt(s2 / (double)n), mean = s1 / (double)n;
	printf("    %s [%lld, %lld]: k rms %.2f (expect 73.90), mean %.3f, shift %d\n", name,
	       (long long)rows, (long long)cols, rms, mean, shift);
	CHECK(fabs(rms - 73.9) < 0.5);
	CHECK(fabs(mean) < 0.5);
	free(h);
}

TEST(gpu_synth, bf16_matrices_follow_mkmodel)
{
	struct gpu g;
	gpu_test_open(&g);
	/* shift = (floor(log2(5461 * fan_in)) + 1) / 2: fan-in 7168 -> (25 + 1) / 2 = 13;
	 * embeddings use fan-in 1 -> (12 + 1) / 2 = 6 */
	check_bf16(&g, "model.layers.4.mlp.gate.weight", 256, 7168, 13);
	check_bf16(&g, "model.embed_tokens.weight", 4096, 7168, 6);
	/* not generated: what header-only writes (norms, scales, biases) */
	struct st_tensor norm = tensor("model.norm.weight", ST_BF16, 7168, 0);
	struct st_tensor sc = tensor("model.layers.4.mlp.experts.0.up_proj.weight_scale_inv", ST_F32, 16, 56);
	CHECK(!cuda_synth_generated(&norm));
	CHECK(!cuda_synth_generated(&sc));
	CHECK(cuda_synth_tensor(&g, 0, &sc, 1) == -EINVAL);
	gpu_close(&g);
}

/* The CPU's pools after writing the host reference values of positions [0, n) of the
 * sequence with block table bt into layers 0..L-1 (poison 0xab elsewhere). */
static void kv_fill_reference(const struct dsv32_config *c, uint8_t *mla, size_t mla_layer,
			      uint8_t *idx, size_t idx_layer, int L, const int32_t *bt, int64_t n,
			      uint64_t seed)
{
	const int R = (int)c->kv_lora_rank, rope = (int)c->qk_rope_head_dim, dk = (int)c->index_head_dim;
	size_t mla_page = kv_mla_page_bytes(c), idx_page = kv_index_page_bytes(c);
	float *ckv = malloc((size_t)R * 4), kpe[64], k[128];
	uint8_t k8[128];
	for (int l = 0; l < L; l++) {
		uint64_t sc = cuda_synth_kv_stream(seed, l, 0), sp = cuda_synth_kv_stream(seed, l, 1),
			 sk = cuda_synth_kv_stream(seed, l, 2);
		for (int64_t p = 0; p < n; p++) {
			for (int j = 0; j < R; j++)
				ckv[j] = bf16_to_f32(cuda_synth_kv_value(sc, (uint64_t)(p * R + j), cuda_synth_kv_scale(0)));
			for (int j = 0; j < rope; j++)
				kpe[j] = bf16_to_f32(cuda_synth_kv_value(sp, (uint64_t)(p * rope + j), cuda_synth_kv_scale(1)));
			for (int j = 0; j < dk; j++)
				k[j] = bf16_to_f32(cuda_synth_kv_value(sk, (uint64_t)(p * dk + j), cuda_synth_kv_scale(2)));
			int32_t page = bt[p / 64];
			kv_mla_write(c, mla + (size_t)l * mla_layer + (size_t)page * mla_page, p % 64, ckv, kpe);
			float ks;
			cpu_act_quant(k, 128, k8, &ks);
			kv_index_write(c, idx + (size_t)l * idx_layer + (size_t)page * idx_page, p % 64, k8, ks);
		}
	}
	free(ckv);
}

TEST(gpu_synth, kv_fill_matches_cpu_writers)
{
	struct gpu g;
	gpu_test_open(&g);
	struct dsv32_config c = {.kv_lora_rank = 512, .qk_rope_head_dim = 64, .index_head_dim = 128};
	config_derive(&c);
	const int L = 2, n_pages = 60, R = 512, rope = 64;
	const int64_t n = 2983; /* 47 pages, the last one partly filled */
	const size_t mla_page = kv_mla_page_bytes(&c), idx_page = kv_index_page_bytes(&c);
	const size_t mla_layer = (size_t)n_pages * mla_page, idx_layer = (size_t)n_pages * idx_page;
	/* bt: distinct pages in random order */
	int32_t perm[60];
	uint64_t rs = 4242;
	for (int i = 0; i < n_pages; i++)
		perm[i] = i;
	for (int i = n_pages - 1; i > 0; i--) {
		int j = (int)(test_rand(&rs) % (uint64_t)(i + 1));
		int32_t t = perm[i];
		perm[i] = perm[j], perm[j] = t;
	}
	const uint64_t seed = 77;
	uint8_t *mla_ref = malloc(L * mla_layer), *idx_ref = malloc(L * idx_layer);
	uint8_t *mla_got = malloc(L * mla_layer), *idx_got = malloc(L * idx_layer);
	memset(mla_ref, 0xab, L * mla_layer);
	memset(idx_ref, 0xab, L * idx_layer);
	kv_fill_reference(&c, mla_ref, mla_layer, idx_ref, idx_layer, L, perm, n, seed);
	gpu_ptr d_mla = gpu_test_alloc(L * mla_layer), d_idx = gpu_test_alloc(L * idx_layer);
	/* a 2 MiB arena forces chunks of ~750 tokens; a 64 MiB one takes all in one chunk */
	const size_t arenas[2] = {(size_t)2 << 20, (size_t)64 << 20};
	for (int a = 0; a < 2; a++) {
		struct gpu_arena ar;
		struct err e;
		REQUIRE(gpu_arena_init(&g, &ar, arenas[a], &e) == 0);
		REQUIRE(gpu_memset(&g, d_mla, 0xab, L * mla_layer) == 0);
		REQUIRE(gpu_memset(&g, d_idx, 0xab, L * idx_layer) == 0);
		REQUIRE(cuda_synth_kv_fill(&g, &c, d_mla, mla_layer, d_idx, idx_layer, L, perm, n, seed, &ar) == 0);
		CHECK_EQ_INT(gpu_arena_mark(&ar), 0); /* staging released */
		REQUIRE(gpu_download(&g, mla_got, d_mla, L * mla_layer) == 0);
		REQUIRE(gpu_download(&g, idx_got, d_idx, L * idx_layer) == 0);
		size_t bad_mla = 0, bad_idx = 0, first_mla = SIZE_MAX, first_idx = SIZE_MAX;
		for (size_t i = 0; i < L * mla_layer; i++)
			if (mla_ref[i] != mla_got[i] && !bad_mla++)
				first_mla = i;
		for (size_t i = 0; i < L * idx_layer; i++)
			if (idx_ref[i] != idx_got[i] && !bad_idx++)
				first_idx = i;
		printf("    arena %zu MiB (high water %zu KiB): %zu MLA and %zu indexer bytes differ from "
		       "the CPU writers", arenas[a] >> 20, ar.high_water >> 10, bad_mla, bad_idx);
		if (bad_mla)
			printf("; first MLA byte %zu (layer %zu, page %zu, slot %zu): 0x%02x, expected 0x%02x",
			       first_mla, first_mla / mla_layer, first_mla % mla_layer / mla_page,
			       first_mla % mla_page / c.mla_record_bytes, mla_got[first_mla], mla_ref[first_mla]);
		if (bad_idx)
			printf("; first indexer byte %zu: 0x%02x, expected 0x%02x", first_idx,
			       idx_got[first_idx], idx_ref[first_idx]);
		printf("\n");
		CHECK_EQ_INT(bad_mla, 0);
		CHECK_EQ_INT(bad_idx, 0);
		gpu_arena_free(&g, &ar);
	}
	/* decode what the GPU wrote: finite, RMS ~1; the rest untouched */
	uint8_t *filled = calloc((size_t)n_pages * 64, 1);
	for (int64_t p = 0; p < n; p++)
		filled[(size_t)perm[p / 64] * 64 + p % 64] = 1;
	float kv[576];
	double s_lat = 0, s_rope = 0, s_idx = 0, worst_rec = 1;
	long long nonfinite = 0, touched = 0, records = 0;
	for (int l = 0; l < L; l++)
		for (int pg = 0; pg < n_pages; pg++) {
			const uint8_t *mp = mla_got + (size_t)l * mla_layer + (size_t)pg * mla_page;
			const uint8_t *ip = idx_got + (size_t)l * idx_layer + (size_t)pg * idx_page;
			for (int s = 0; s < 64; s++) {
				if (!filled[(size_t)pg * 64 + s]) {
					for (size_t b = 0; b < c.mla_record_bytes; b++)
						touched += mp[(size_t)s * c.mla_record_bytes + b] != 0xab;
					const uint8_t *codes = kv_index_codes(&c, ip, s);
					for (int b = 0; b < 128; b++)
						touched += codes[b] != 0xab;
					const uint8_t *scb = ip + 64 * 128 + s * 4;
					for (int b = 0; b < 4; b++)
						touched += scb[b] != 0xab;
					continue;
				}
				records++;
				kv_mla_read(&c, mp, s, kv);
				double r2 = 0;
				for (int j = 0; j < R + rope; j++) {
					nonfinite += !isfinite(kv[j]);
					if (j < R)
						r2 += (double)kv[j] * kv[j];
					else
						s_rope += (double)kv[j] * kv[j];
				}
				s_lat += r2;
				double rec_rms = sqrt(r2 / R);
				if (fabs(rec_rms - 1) > fabs(worst_rec - 1))
					worst_rec = rec_rms;
				const uint8_t *codes = kv_index_codes(&c, ip, s);
				float ks = kv_index_scale(&c, ip, s);
				nonfinite += !isfinite(ks) || ks <= 0;
				for (int j = 0; j < 128; j++) {
					float v = e4m3_to_f32(codes[j]) * ks;
					nonfinite += !isfinite(v);
					s_idx += (double)v * v;
				}
			}
		}
	double rms_lat = sqrt(s_lat / ((double)records * R)), rms_rope = sqrt(s_rope / ((double)records * rope)),
	       rms_idx = sqrt(s_idx / ((double)records * 128));
	printf("    %lld records decoded: %lld non-finite values; RMS latent %.4f (worst record %.3f), "
	       "rope %.4f, indexer key %.4f (expect ~1); %lld bytes of unfilled slots changed\n",
	       records, nonfinite, rms_lat, worst_rec, rms_rope, rms_idx, touched);
	CHECK_EQ_INT(records, (long long)n * L);
	CHECK_EQ_INT(nonfinite, 0);
	CHECK_EQ_INT(touched, 0);
	CHECK(fabs(rms_lat - 1) < 0.05 && fabs(rms_rope - 1) < 0.05 && fabs(rms_idx - 1) < 0.05);
	CHECK(fabs(worst_rec - 1) < 0.3);
	/* argument errors: a page outside the pools, no tokens */
	struct gpu_arena ar;
	struct err e;
	REQUIRE(gpu_arena_init(&g, &ar, (size_t)2 << 20, &e) == 0);
	int32_t bad_bt[2] = {3, n_pages};
	CHECK(cuda_synth_kv_fill(&g, &c, d_mla, mla_layer, d_idx, idx_layer, L, bad_bt, 100, seed, &ar) == -EINVAL);
	CHECK(cuda_synth_kv_fill(&g, &c, d_mla, mla_layer, d_idx, idx_layer, L, perm, 0, seed, &ar) == -EINVAL);
	gpu_arena_free(&g, &ar);
	cu.cuMemFree(d_mla), cu.cuMemFree(d_idx);
	free(mla_ref), free(idx_ref), free(mla_got), free(idx_got), free(filled);
	gpu_close(&g);
}

#endif
