/*
 * test_gpu_mla.c — the sparse MLA decode kernel (absorbed form's latent core) against the CPU
 * backend's attn_latent on the same queries and the same FP8 cache records, reached through
 * physical slots: o_lat within one bf16 ulp, or 2^-10 of the row's RMS where an output cancels
 * (an online softmax and fp32 dots in another order).
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/cpu_attn.h"
#include "model/cuda_attn.h"
#include "model/kv_cache.h"

static void check_mla(struct gpu *g, int R, int H, int B, const int *n_sel, int n_pages, uint64_t seed)
{
	struct dsv32_config c = {.kv_lora_rank = R, .qk_rope_head_dim = 64, .index_head_dim = 128};
	config_derive(&c);
	const int DK = R + 64, rec = (int)c.mla_record_bytes;
	int ld = 0;
	for (int b = 0; b < B; b++)
		ld = n_sel[b] > ld ? n_sel[b] : ld;
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
	/* queries [B, H, DK] (bf16 values) and each row's selected slots (distinct, any order) */
	float *qf = malloc((size_t)B * H * DK * 4);
	uint16_t *qh = malloc((size_t)B * H * DK * 2);
	for (size_t i = 0; i < (size_t)B * H * DK; i++) {
		qf[i] = bf16_round(((float)((test_rand(&seed) >> 40) % 2001) - 1000.0f) / 400.0f);
		qh[i] = f32_to_bf16(qf[i]);
	}
	int *sel = malloc((size_t)B * ld * sizeof *sel);
	for (int b = 0; b < B; b++)
		for (int s = 0; s < ld; s++)
			sel[(size_t)b * ld + s] = s < n_sel[b] ? (int)((uint64_t)(s * 7919 + b * 131) % (uint64_t)(n_pages * 64)) : -1;
	/* the CPU: rows of the selected records, then attn_latent per head */
	float *kv = malloc((size_t)ld * DK * 4), *score = malloc((size_t)ld * 4);
	float *ref = malloc((size_t)B * H * R * 4);
	for (int b = 0; b < B; b++) {
		for (int s = 0; s < n_sel[b]; s++) {
			int sl = sel[(size_t)b * ld + s];
			kv_mla_read(&c, pool + (size_t)(sl / 64) * 64 * rec, sl % 64, kv + (size_t)s * DK);
		}
		for (int h = 0; h < H; h++) {
			const float *qq = qf + ((size_t)b * H + h) * DK;
			attn_latent(&c, qq, qq + R, kv, n_sel[b], 0.1352f, score,
				    ref + ((size_t)b * H + h) * R);
		}
	}
	gpu_ptr d_q = gpu_test_alloc((size_t)B * H * DK * 2), d_sel = gpu_test_alloc((size_t)B * ld * 4),
		d_pool = gpu_test_alloc(pool_bytes), d_o = gpu_test_alloc((size_t)B * H * R * 2);
	REQUIRE(gpu_upload(g, d_q, qh, (size_t)B * H * DK * 2) == 0);
	REQUIRE(gpu_upload(g, d_sel, sel, (size_t)B * ld * 4) == 0);
	REQUIRE(gpu_upload(g, d_pool, pool, pool_bytes) == 0);
	gpu_test_poison(g, d_o, (size_t)B * H * R * 2);
	size_t wsb = cuda_mla_decode_workspace(g, B, H, R, ld);
	gpu_ptr d_ws = wsb ? gpu_test_alloc(wsb) : 0;
	printf("    (%d key splits)\n", cuda_mla_decode_splits(g, B, H, ld));
	REQUIRE(cuda_mla_decode(g, d_q, d_sel, ld, d_pool, rec, R, H, B, 0.1352f, d_o, d_ws) == 0);
	if (d_ws)
		cu.cuMemFree(d_ws);
	uint16_t *got = malloc((size_t)B * H * R * 2);
	REQUIRE(gpu_download(g, got, d_o, (size_t)B * H * R * 2) == 0);
	char what[96];
	snprintf(what, sizeof what, "mla decode R=%d H=%d B=%d", R, H, B);
	int64_t bad = gpu_count_bad_bf16(ref, got, B * H, R, 1.0 / 1024, what);
	CHECK_EQ_INT(bad, 0);
	cu.cuMemFree(d_q), cu.cuMemFree(d_sel), cu.cuMemFree(d_pool), cu.cuMemFree(d_o);
	free(pool), free(ckv), free(qf), free(qh), free(sel), free(kv), free(score), free(ref), free(got);
}

TEST_T(gpu_mla, decode_matches_cpu, 180)
{
	struct gpu g;
	gpu_test_open(&g);
	int n_real[4] = {1, 17, 300, 2048};
	check_mla(&g, 512, 128, 4, n_real, 64, 3001); /* the real dims: 128 heads, 656-byte records */
	int n_tiny[3] = {5, 64, 100};
	check_mla(&g, 256, 16, 3, n_tiny, 4, 3002);   /* the tiny model's latent (4 heads padded to 16) */
	gpu_close(&g);
}

#endif
