/*
 * test_gpu_moe.c — the MoE gate on the GPU against the CPU backend's moe_route: the same
 * experts and bit-identical weights for every token, on logits with many exact and near ties,
 * for the real routing (256 experts, 8 groups, 4 kept, 8 picks) and smaller ones.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/cpu_moe.h"

static void check_route(struct gpu *g, int E, int G, int topk_group, int K, int T, uint64_t seed)
{
	struct dsv32_config c = {.n_routed_experts = E, .n_group = G, .topk_group = topk_group,
				 .num_experts_per_tok = K, .norm_topk_prob = 1,
				 .routed_scaling_factor = 2.5};
	float *lg = malloc((size_t)T * E * 4), *bias = malloc((size_t)E * 4);
	for (size_t i = 0; i < (size_t)T * E; i++) /* 64 levels: exact ties in and across groups */
		lg[i] = ((float)(test_rand(&seed) % 64) - 32.0f) * 0.125f;
	for (int e = 0; e < E; e++)
		bias[e] = e == 3 ? 0.5f : ((float)(test_rand(&seed) % 16) - 8.0f) * 0.001f;
	int32_t *ri = malloc((size_t)T * K * 4), *gi = malloc((size_t)T * K * 4);
	float *rw = malloc((size_t)T * K * 4), *gw = malloc((size_t)T * K * 4);
	for (int t = 0; t < T; t++)
		moe_route(&c, lg + (size_t)t * E, bias, ri + (size_t)t * K, rw + (size_t)t * K);
	gpu_ptr d_lg = gpu_test_alloc((size_t)T * E * 4), d_b = gpu_test_alloc((size_t)E * 4),
		d_i = gpu_test_alloc((size_t)T * K * 4), d_w = gpu_test_alloc((size_t)T * K * 4);
	REQUIRE(gpu_upload(g, d_lg, lg, (size_t)T * E * 4) == 0);
	REQUIRE(gpu_upload(g, d_b, bias, (size_t)E * 4) == 0);
	gpu_test_poison(g, d_i, (size_t)T * K * 4);
	gpu_test_poison(g, d_w, (size_t)T * K * 4);
	int e = E, gg = G, tg = topk_group, k = K, norm = 1;
	float scale = 2.5f;
	void *args[] = {&d_lg, &d_b, &e, &gg, &tg, &k, &norm, &scale, &d_i, &d_w};
	REQUIRE(gpu_launch(g, gpu_kernel(g, "k_moe_route"), (unsigned)T, 1, 1, 256, 1, 1, 0, args) == 0);
	REQUIRE(gpu_download(g, gi, d_i, (size_t)T * K * 4) == 0);
	REQUIRE(gpu_download(g, gw, d_w, (size_t)T * K * 4) == 0);
	int64_t bad_ids = 0, bad_w = 0;
	for (int t = 0; t < T; t++) {
		bad_ids += memcmp(ri + (size_t)t * K, gi + (size_t)t * K, (size_t)K * 4) != 0;
		bad_w += memcmp(rw + (size_t)t * K, gw + (size_t)t * K, (size_t)K * 4) != 0;
	}
	printf("    moe gate E=%d G=%d keep %d pick %d, %d tokens: %lld expert sets and %lld weight rows differ\n",
	       E, G, topk_group, K, T, (long long)bad_ids, (long long)bad_w);
	CHECK_EQ_INT(bad_ids, 0);
	CHECK_EQ_INT(bad_w, 0);
	cu.cuMemFree(d_lg), cu.cuMemFree(d_b), cu.cuMemFree(d_i), cu.cuMemFree(d_w);
	free(lg), free(bias), free(ri), free(gi), free(rw), free(gw);
}

TEST(gpu_moe, gate_matches_cpu)
{
	struct gpu g;
	gpu_test_open(&g);
	check_route(&g, 256, 8, 4, 8, 1000, 4001); /* the real routing */
	check_route(&g, 16, 4, 2, 4, 500, 4002);   /* the tiny model's */
	check_route(&g, 32, 8, 3, 6, 500, 4003);   /* the wide numerics config's shape */
	check_route(&g, 64, 1, 1, 8, 200, 4004);   /* no group limit */
	gpu_close(&g);
}

#endif
