/*
 * test_gpu_synth.c — synthetic weights generated on the GPU (model/cuda_synth.c) have mkmodel's
 * recipes: FP8 codes are exactly ±e4m3(k), k uniform in 0..15; BF16 values are exactly
 * k · 2^-shift with |k| <= 254 and rms 73.9 · 2^-shift (shift from the fan-in as in
 * tools/mkmodel/gen.h); the fill is deterministic, depends on seed and name, and only the
 * tensors a header-only checkpoint leaves as holes are generated.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include <string.h>

#include "model/cuda_synth.h"

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

#endif
