/*
 * test_gpu_kv.c — the KV-cache write kernels against the CPU backend's writers: the whole pool
 * must be byte-identical after the same tokens are written to the same physical slots (records
 * written, and every byte not written still holding the poison), for the real dimensions (656-byte
 * MLA records) and the tiny model's.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/cpu_ops.h"
#include "model/kv_cache.h"

static void fill_bf16_floats(float *x, size_t n, float amp, uint64_t *seed)
{
	for (size_t i = 0; i < n; i++) {
		float u = (float)((test_rand(seed) >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
		x[i] = bf16_round(u * amp * (i % 97 == 0 ? 40.0f : 1.0f)); /* some outliers */
	}
}

static void check_kv_writes(struct gpu *g, int R, int T, int n_pages, uint64_t seed)
{
	struct dsv32_config c = {.kv_lora_rank = R, .qk_rope_head_dim = 64, .index_head_dim = 128};
	config_derive(&c);
	const int rope = 64;
	size_t rec = c.mla_record_bytes, mla_bytes = (size_t)n_pages * 64 * rec;
	size_t idx_page = kv_index_page_bytes(&c), idx_bytes = (size_t)n_pages * idx_page;
	float *ckv = malloc((size_t)T * R * 4), *kpe = malloc((size_t)T * rope * 4), *k = malloc((size_t)T * 128 * 4);
	uint16_t *ckv_h = malloc((size_t)T * R * 2), *kpe_h = malloc((size_t)T * rope * 2), *k_h = malloc((size_t)T * 128 * 2);
	uint8_t *mla_cpu = malloc(mla_bytes), *mla_gpu = malloc(mla_bytes);
	uint8_t *idx_cpu = malloc(idx_bytes), *idx_gpu = malloc(idx_bytes);
	int *slots = malloc((size_t)T * sizeof *slots);
	fill_bf16_floats(ckv, (size_t)T * R, 3.0f, &seed);
	fill_bf16_floats(kpe, (size_t)T * rope, 2.0f, &seed);
	fill_bf16_floats(k, (size_t)T * 128, 1.5f, &seed);
	for (int i = 0; i < R; i++) /* a tile under the 1e-4 amax floor */
		ckv[i] = bf16_round(1e-6f * (float)(i % 128 - 64));
	for (size_t i = 0; i < (size_t)T * R; i++)
		ckv_h[i] = f32_to_bf16(ckv[i]);
	for (size_t i = 0; i < (size_t)T * rope; i++)
		kpe_h[i] = f32_to_bf16(kpe[i]);
	for (size_t i = 0; i < (size_t)T * 128; i++)
		k_h[i] = f32_to_bf16(k[i]);
	/* distinct random physical slots */
	int64_t cap = (int64_t)n_pages * 64;
	uint8_t *used = calloc((size_t)cap, 1);
	for (int t = 0; t < T; t++) {
		int64_t s;
		do
			s = (int64_t)(test_rand(&seed) % (uint64_t)cap);
		while (used[s]);
		used[s] = 1;
		slots[t] = (int)s;
	}
	memset(mla_cpu, 0xab, mla_bytes);
	memset(idx_cpu, 0xab, idx_bytes);
	for (int t = 0; t < T; t++) {
		int p = slots[t] / 64, off = slots[t] % 64;
		kv_mla_write(&c, mla_cpu + (size_t)p * 64 * rec, off, ckv + (size_t)t * R, kpe + (size_t)t * rope);
		uint8_t k8[128];
		float ks;
		cpu_act_quant(k + (size_t)t * 128, 128, k8, &ks);
		kv_index_write(&c, idx_cpu + (size_t)p * idx_page, off, k8, ks);
	}
	gpu_ptr d_ckv = gpu_test_alloc((size_t)T * R * 2), d_kpe = gpu_test_alloc((size_t)T * rope * 2),
		d_k = gpu_test_alloc((size_t)T * 128 * 2), d_slots = gpu_test_alloc((size_t)T * 4),
		d_mla = gpu_test_alloc(mla_bytes), d_idx = gpu_test_alloc(idx_bytes);
	REQUIRE(gpu_upload(g, d_ckv, ckv_h, (size_t)T * R * 2) == 0);
	REQUIRE(gpu_upload(g, d_kpe, kpe_h, (size_t)T * rope * 2) == 0);
	REQUIRE(gpu_upload(g, d_k, k_h, (size_t)T * 128 * 2) == 0);
	REQUIRE(gpu_upload(g, d_slots, slots, (size_t)T * 4) == 0);
	REQUIRE(gpu_memset(g, d_mla, 0xab, mla_bytes) == 0);
	REQUIRE(gpu_memset(g, d_idx, 0xab, idx_bytes) == 0);
	int ldc = R, ldp = rope, r = R, rp = rope, rb = (int)rec, ldk = 128, nt = T;
	long long pb = (long long)idx_page;
	void *a1[] = {&d_ckv, &ldc, &d_kpe, &ldp, &d_slots, &d_mla, &r, &rp, &rb};
	REQUIRE(gpu_launch(g, gpu_kernel(g, "k_kv_mla_write"), (unsigned)T, 1, 1, 32 * (R / 128 + 1), 1, 1, 0, a1) == 0);
	void *a2[] = {&d_k, &ldk, &d_slots, &d_idx, &pb, &nt};
	REQUIRE(gpu_launch(g, gpu_kernel(g, "k_kv_index_write"), (unsigned)((T + 7) / 8), 1, 1, 256, 1, 1, 0, a2) == 0);
	REQUIRE(gpu_download(g, mla_gpu, d_mla, mla_bytes) == 0);
	REQUIRE(gpu_download(g, idx_gpu, d_idx, idx_bytes) == 0);
	size_t bad_mla = 0, bad_idx = 0;
	for (size_t i = 0; i < mla_bytes; i++)
		bad_mla += mla_cpu[i] != mla_gpu[i];
	for (size_t i = 0; i < idx_bytes; i++)
		bad_idx += idx_cpu[i] != idx_gpu[i];
	printf("    kv write R=%d (record %zu B), %d tokens over %d pages: %zu MLA and %zu indexer bytes differ\n",
	       R, rec, T, n_pages, bad_mla, bad_idx);
	CHECK_EQ_INT(bad_mla, 0);
	CHECK_EQ_INT(bad_idx, 0);
	cu.cuMemFree(d_ckv), cu.cuMemFree(d_kpe), cu.cuMemFree(d_k), cu.cuMemFree(d_slots);
	cu.cuMemFree(d_mla), cu.cuMemFree(d_idx);
	free(ckv), free(kpe), free(k), free(ckv_h), free(kpe_h), free(k_h);
	free(mla_cpu), free(mla_gpu), free(idx_cpu), free(idx_gpu), free(slots), free(used);
}

TEST(gpu_kv, writes_byte_identical_to_cpu)
{
	struct gpu g;
	gpu_test_open(&g);
	check_kv_writes(&g, 512, 300, 16, 901); /* the real 656-byte record */
	check_kv_writes(&g, 256, 77, 4, 902);   /* the tiny model's 392-byte record */
	gpu_close(&g);
}

#endif
