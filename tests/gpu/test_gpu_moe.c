/*
 * test_gpu_moe.c — the MoE gate on the GPU against the CPU backend's moe_route: the same
 * experts and bit-identical weights for every token, on logits with many exact and near ties,
 * for the real routing (256 experts, 8 groups, 4 kept, 8 picks) and smaller ones; the router
 * logits bit-identical to the CPU's (the fast mode's tensor-core form within fp32 reordering); the
 * token permutation, gather and combine exact.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/cpu_moe.h"
#include "model/cpu_ops.h"

/* The routing outputs (idx, wts on the device, poisoned before the launch) of one kernel against
 * the CPU's ri, rw: prints and checks the rows that differ. */
struct route_case {
	struct gpu *g;
	gpu_ptr d_i, d_w;
	const int32_t *ri;
	const float *rw;
	int32_t *gi;
	float *gw;
	int E, G, topk_group, K, T;
};

static void run_route(const struct route_case *rc, const char *kernel, unsigned grid, void **args)
{
	size_t n = (size_t)rc->T * rc->K;
	gpu_test_poison(rc->g, rc->d_i, n * 4);
	gpu_test_poison(rc->g, rc->d_w, n * 4);
	REQUIRE(gpu_launch(rc->g, gpu_kernel(rc->g, kernel), grid, 1, 1, 256, 1, 1, 0, args) == 0);
	REQUIRE(gpu_download(rc->g, rc->gi, rc->d_i, n * 4) == 0);
	REQUIRE(gpu_download(rc->g, rc->gw, rc->d_w, n * 4) == 0);
	int64_t bad_ids = 0, bad_w = 0;
	for (int t = 0; t < rc->T; t++) {
		size_t o = (size_t)t * rc->K, b = (size_t)rc->K * 4;
		bad_ids += memcmp(rc->ri + o, rc->gi + o, b) != 0;
		bad_w += memcmp(rc->rw + o, rc->gw + o, b) != 0;
	}
	printf("    %s E=%d G=%d keep %d pick %d, %d tokens: %lld expert sets and %lld weight rows differ\n",
	       kernel, rc->E, rc->G, rc->topk_group, rc->K, rc->T, (long long)bad_ids, (long long)bad_w);
	CHECK_EQ_INT(bad_ids, 0);
	CHECK_EQ_INT(bad_w, 0);
}

/* k_moe_route_wsum (kernels_ptx/moe_gate_mma.cu) on np parts of the logits lg: parts 1 .. np-1
 * random multiples of 1/8 in [-2, 2), part 0 = lg less their sum; every partial sum is a multiple
 * of 1/8 below 2^6, so exact in any order, and the parts' sum is lg to the bit, while a part
 * skipped or added twice moves most logits. The logits it leaves are lg to the bit, and the
 * routing the CPU's. */
static void check_route_wsum(struct gpu *g, const struct route_case *rc, const float *lg,
			     gpu_ptr d_b, int np, uint64_t seed)
{
	const int T = rc->T;
	const size_t n = (size_t)T * 256;
	float *parts = malloc((size_t)np * n * 4), *back = malloc(n * 4);
	REQUIRE(parts && back && np >= 2);
	for (size_t i = 0; i < n; i++) {
		float rest = 0.f;
		for (int p = 1; p < np; p++) {
			const float a = ((float)(test_rand(&seed) % 32) - 16.0f) * 0.125f;
			parts[p * n + i] = a;
			rest += a;
		}
		parts[i] = lg[i] - rest;
	}
	gpu_ptr d_p = gpu_test_alloc((size_t)np * n * 4), d_l = gpu_test_alloc(n * 4);
	REQUIRE(gpu_upload(g, d_p, parts, (size_t)np * n * 4) == 0);
	gpu_test_poison(g, d_l, n * 4);
	int tt = T, tg = rc->topk_group, k = rc->K, norm = 1, npp = np;
	float scale = 2.5f;
	void *args[] = {&d_p, &npp, &d_l, &d_b, &tt, &tg, &k, &norm, &scale, (void *)&rc->d_i,
			(void *)&rc->d_w};
	run_route(rc, "k_moe_route_wsum", (unsigned)((T + 7) / 8), args);
	REQUIRE(gpu_download(g, back, d_l, n * 4) == 0);
	int64_t differ = 0;
	for (size_t i = 0; i < n; i++)
		differ += memcmp(&back[i], &lg[i], 4) != 0;
	printf("    k_moe_route_wsum, %d parts: %lld of %lld summed logits differ from the parts' "
	       "exact sum\n",
	       np, (long long)differ, (long long)n);
	CHECK_EQ_INT(differ, 0);
	cu.cuMemFree(d_p), cu.cuMemFree(d_l);
	free(parts), free(back);
}

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
	struct route_case rc = {g, d_i, d_w, ri, rw, gi, gw, E, G, topk_group, K, T};
	int e = E, gg = G, tg = topk_group, k = K, norm = 1, tt = T;
	float scale = 2.5f;
	void *args[] = {&d_lg, &d_b, &e, &gg, &tg, &k, &norm, &scale, &d_i, &d_w};
	run_route(&rc, "k_moe_route", (unsigned)T, args);
	if (E == 256 && G == 8) { /* the warp-per-token form of the real shape */
		void *wargs[] = {&d_lg, &d_b, &tt, &tg, &k, &norm, &scale, &d_i, &d_w};
		run_route(&rc, "k_moe_route_w", (unsigned)((T + 7) / 8), wargs);
		check_route_wsum(g, &rc, lg, d_b, 4, seed);  /* above 64 tokens */
		check_route_wsum(g, &rc, lg, d_b, 28, seed); /* 17-64: 7168 / 256 */
	}
	cu.cuMemFree(d_lg), cu.cuMemFree(d_b), cu.cuMemFree(d_i), cu.cuMemFree(d_w);
	free(lg), free(bias), free(ri), free(gi), free(rw), free(gw);
}

TEST(gpu_moe, gate_matches_cpu)
{
	struct gpu g;
	gpu_test_open(&g);
	check_route(&g, 256, 8, 4, 8, 1000, 4001); /* the real routing */
	check_route(&g, 256, 8, 3, 6, 300, 4005);  /* the real shape, other counts */
	check_route(&g, 256, 8, 4, 1, 300, 4006);  /* ... one pick */
	check_route(&g, 256, 8, 2, 5, 300, 4007);
	check_route(&g, 16, 4, 2, 4, 500, 4002);   /* the tiny model's */
	check_route(&g, 32, 8, 3, 6, 500, 4003);   /* the wide numerics config's shape */
	check_route(&g, 64, 1, 1, 8, 200, 4004);   /* no group limit */
	gpu_close(&g);
}

#endif

#ifndef DSV32_NO_CUDA
/* Token permutation by expert, the gather, and the weighted combine against the CPU's
 * moe_combine: rows of an expert in token order, exact gathers, bit-identical outputs. */
TEST(gpu_moe, permute_gather_combine_exact)
{
	struct gpu g;
	gpu_test_open(&g);
	const int T = 300, K = 8, E = 256, D = 512;
	uint64_t seed = 4101;
	int *idx = malloc((size_t)T * K * 4);
	for (int t = 0; t < T; t++) { /* K distinct ascending experts, skewed toward low ids */
		int n = 0;
		uint8_t used[256] = {0};
		while (n < K) {
			int e = (int)((test_rand(&seed) % 64) * (test_rand(&seed) % 4 + 1)) % E;
			if (!used[e])
				used[e] = 1, n++;
		}
		n = 0;
		for (int e = 0; e < E; e++)
			if (used[e])
				idx[t * K + n++] = e;
	}
	/* the expected permutation: experts in order, rows of an expert in token order */
	int *want_perm = malloc((size_t)T * K * 4), *want_src = malloc((size_t)T * K * 4);
	int r = 0;
	for (int e = 0; e < E; e++)
		for (int i = 0; i < T * K; i++)
			if (idx[i] == e)
				want_perm[i] = r, want_src[r++] = i / K;
	float *xf = malloc((size_t)T * D * 4), *ex = malloc((size_t)T * K * D * 4), *w = malloc((size_t)T * K * 4),
	      *sh = malloc((size_t)T * D * 4), *y = malloc((size_t)T * D * 4);
	uint16_t *xh = malloc((size_t)T * D * 2), *exh = malloc((size_t)T * K * D * 2), *shh = malloc((size_t)T * D * 2);
	fill_bf16(xh, (size_t)T * D, 2.0f, &seed);
	fill_bf16(exh, (size_t)T * K * D, 3.0f, &seed); /* expert outputs, in sorted-row order */
	fill_bf16(shh, (size_t)T * D, 1.0f, &seed);
	for (size_t i = 0; i < (size_t)T * K; i++)
		w[i] = (float)(test_rand(&seed) % 10000) * 1e-4f;
	for (int t = 0; t < T; t++) /* the CPU's ex_out is [T, K, D] in pick order */
		for (int n = 0; n < K; n++)
			for (int d = 0; d < D; d++)
				ex[((size_t)t * K + n) * D + d] = bf16_to_f32(exh[(size_t)want_perm[t * K + n] * D + d]);
	for (size_t i = 0; i < (size_t)T * D; i++)
		sh[i] = bf16_to_f32(shh[i]), xf[i] = bf16_to_f32(xh[i]);
	moe_combine(T, K, D, ex, w, sh, y);
	gpu_ptr d_idx = gpu_test_alloc((size_t)T * K * 4), d_cnt = gpu_test_alloc((size_t)E * 4),
		d_off = gpu_test_alloc((size_t)(E + 2) * 4), d_perm = gpu_test_alloc((size_t)T * K * 4),
		d_src = gpu_test_alloc((size_t)T * K * 4), d_x = gpu_test_alloc((size_t)T * D * 2),
		d_xs = gpu_test_alloc((size_t)T * K * D * 2), d_ex = gpu_test_alloc((size_t)T * K * D * 2),
		d_w = gpu_test_alloc((size_t)T * K * 4), d_sh = gpu_test_alloc((size_t)T * D * 2),
		d_y = gpu_test_alloc((size_t)T * D * 2);
	REQUIRE(gpu_upload(&g, d_idx, idx, (size_t)T * K * 4) == 0);
	REQUIRE(gpu_upload(&g, d_x, xh, (size_t)T * D * 2) == 0);
	REQUIRE(gpu_upload(&g, d_ex, exh, (size_t)T * K * D * 2) == 0);
	REQUIRE(gpu_upload(&g, d_w, w, (size_t)T * K * 4) == 0);
	REQUIRE(gpu_upload(&g, d_sh, shh, (size_t)T * D * 2) == 0);
	gpu_test_poison(&g, d_perm, (size_t)T * K * 4);
	gpu_test_poison(&g, d_xs, (size_t)T * K * D * 2);
	gpu_test_poison(&g, d_y, (size_t)T * D * 2);
	int tt = T, kk = K, ee = E, dd = D;
	void *a1[] = {&d_idx, &tt, &kk, &ee, &d_cnt, &d_off, &d_perm, &d_src};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_permute"), 1, 1, 1, 256, 1, 1, 0, a1) == 0);
	void *a2[] = {&d_x, &d_src, &d_xs, &dd};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_gather"), (unsigned)(T * K), 1, 1, 64, 1, 1, 0, a2) == 0);
	void *a3[] = {&d_ex, &d_w, &d_perm, &d_sh, &d_y, &tt, &kk, &dd};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_combine"), 264, 1, 1, 256, 1, 1, 0, a3) == 0);
	int *perm = malloc((size_t)T * K * 4);
	uint16_t *xs = malloc((size_t)T * K * D * 2), *yg = malloc((size_t)T * D * 2);
	REQUIRE(gpu_download(&g, perm, d_perm, (size_t)T * K * 4) == 0);
	REQUIRE(gpu_download(&g, xs, d_xs, (size_t)T * K * D * 2) == 0);
	REQUIRE(gpu_download(&g, yg, d_y, (size_t)T * D * 2) == 0);
	CHECK(memcmp(perm, want_perm, (size_t)T * K * 4) == 0);
	int64_t bad_rows = 0, bad_y = 0;
	for (int rr = 0; rr < T * K; rr++)
		bad_rows += memcmp(xs + (size_t)rr * D, xh + (size_t)want_src[rr] * D, (size_t)D * 2) != 0;
	for (size_t i = 0; i < (size_t)T * D; i++)
		bad_y += yg[i] != f32_to_bf16(y[i]);
	printf("    moe permute/gather/combine T=%d K=%d D=%d: %lld gathered rows and %lld outputs differ\n",
	       T, K, D, (long long)bad_rows, (long long)bad_y);
	CHECK_EQ_INT(bad_rows, 0);
	CHECK_EQ_INT(bad_y, 0);
	gpu_ptr all[] = {d_idx, d_cnt, d_off, d_perm, d_src, d_x, d_xs, d_ex, d_w, d_sh, d_y};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		cu.cuMemFree(all[i]);
	free(idx), free(want_perm), free(want_src), free(xf), free(ex), free(w), free(sh), free(y);
	free(xh), free(exh), free(shh), free(perm), free(xs), free(yg);
	gpu_close(&g);
}
#endif

#ifndef DSV32_NO_CUDA
/* k_moe_permute at prefill sizes and with the block's 1024 threads, and its many-block form
 * (k_moe_permute_count + k_moe_permute_place): counts, offsets, the permutation (rows of an
 * expert in token order) and the source tokens, exact. */
TEST(gpu_moe, permute_large_exact)
{
	struct gpu g;
	gpu_test_open(&g);
	static const int cases[][4] = {{4096, 8, 256, 1024}, {1, 8, 256, 1024}, {77, 6, 32, 1024},
				       {300, 8, 256, 256}, {129, 1, 64, 1024}};
	uint64_t seed = 4201;
	for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
		const int T = cases[ci][0], K = cases[ci][1], E = cases[ci][2], nt = cases[ci][3];
		int *idx = malloc((size_t)T * K * 4), *want_perm = malloc((size_t)T * K * 4),
		    *want_src = malloc((size_t)T * K * 4), *want_cnt = calloc((size_t)E, 4),
		    *want_off = malloc((size_t)(E + 2) * 4);
		for (int t = 0; t < T; t++) { /* K distinct ascending experts */
			uint8_t used[256] = {0};
			for (int n = 0; n < K;) {
				int e = (int)(test_rand(&seed) % (uint64_t)E);
				if (!used[e])
					used[e] = 1, n++;
			}
			for (int e = 0, n = 0; e < E; e++)
				if (used[e])
					idx[t * K + n++] = e, want_cnt[e]++;
		}
		want_off[0] = 0;
		for (int e = 0; e < E; e++)
			want_off[e + 1] = want_off[e] + want_cnt[e];
		want_off[E + 1] = T * K + T; /* the shared expert's rows follow the routed ones */
		for (int e = 0, r = 0; e < E; e++)
			for (int i = 0; i < T * K; i++)
				if (idx[i] == e)
					want_perm[i] = r, want_src[r++] = i / K;
		gpu_ptr d_idx = gpu_test_alloc((size_t)T * K * 4), d_cnt = gpu_test_alloc((size_t)E * 4),
			d_off = gpu_test_alloc((size_t)(E + 2) * 4), d_perm = gpu_test_alloc((size_t)T * K * 4),
			d_src = gpu_test_alloc((size_t)T * K * 4);
		REQUIRE(gpu_upload(&g, d_idx, idx, (size_t)T * K * 4) == 0);
		/* v = 0: k_moe_permute on one block of nt threads; v = 1: k_moe_permute_count +
		 * k_moe_permute_place over blocks of 128 tokens (bcnt: their rows per expert) */
		gpu_ptr d_bcnt = gpu_test_alloc((size_t)((T + 127) / 128) * E * 4);
		int *perm = malloc((size_t)T * K * 4), *src = malloc((size_t)T * K * 4),
		    *cnt = malloc((size_t)E * 4), *off = malloc((size_t)(E + 2) * 4);
		for (int v = 0; v < 2; v++) {
			gpu_test_poison(&g, d_cnt, (size_t)E * 4);
			gpu_test_poison(&g, d_off, (size_t)(E + 2) * 4);
			gpu_test_poison(&g, d_perm, (size_t)T * K * 4);
			gpu_test_poison(&g, d_src, (size_t)T * K * 4);
			int tt = T, kk = K, ee = E;
			if (v == 0) {
				void *a1[] = {&d_idx, &tt, &kk, &ee, &d_cnt, &d_off, &d_perm, &d_src};
				REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_permute"), 1, 1, 1, (unsigned)nt,
						   1, 1, 0, a1) == 0);
			} else {
				unsigned nb = (unsigned)((T + 127) / 128);
				gpu_test_poison(&g, d_bcnt, (size_t)nb * E * 4);
				void *a1[] = {&d_idx, &tt, &kk, &ee, &d_bcnt};
				void *a2[] = {&d_idx, &tt, &kk, &ee, &d_bcnt, &d_cnt, &d_off, &d_perm, &d_src};
				REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_permute_count"), nb, 1, 1, 256, 1,
						   1, 0, a1) == 0);
				REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_permute_place"), nb, 1, 1, 1024, 1,
						   1, 0, a2) == 0);
			}
			REQUIRE(gpu_download(&g, perm, d_perm, (size_t)T * K * 4) == 0);
			REQUIRE(gpu_download(&g, src, d_src, (size_t)T * K * 4) == 0);
			REQUIRE(gpu_download(&g, cnt, d_cnt, (size_t)E * 4) == 0);
			REQUIRE(gpu_download(&g, off, d_off, (size_t)(E + 2) * 4) == 0);
			int64_t bad_perm = 0, bad_src = 0, first = -1;
			for (int i = 0; i < T * K; i++) {
				bad_perm += perm[i] != want_perm[i];
				bad_src += src[i] != want_src[i];
				if (first < 0 && (perm[i] != want_perm[i] || src[i] != want_src[i]))
					first = i;
			}
			int bad_cnt = memcmp(cnt, want_cnt, (size_t)E * 4) != 0,
			    bad_off = memcmp(off, want_off, (size_t)(E + 2) * 4) != 0;
			printf("    %s T=%d K=%d E=%d: %lld perm, %lld src differ (first %lld); counts %s, "
			       "offsets %s\n",
			       v ? "k_moe_permute_count + _place" : "k_moe_permute (one block)", T, K, E,
			       (long long)bad_perm, (long long)bad_src, (long long)first,
			       bad_cnt ? "DIFFER" : "ok", bad_off ? "DIFFER" : "ok");
			CHECK_EQ_INT(bad_perm, 0);
			CHECK_EQ_INT(bad_src, 0);
			CHECK_EQ_INT(bad_cnt, 0);
			CHECK_EQ_INT(bad_off, 0);
		}
		cu.cuMemFree(d_bcnt);
		gpu_ptr all[] = {d_idx, d_cnt, d_off, d_perm, d_src};
		for (size_t i = 0; i < sizeof all / sizeof *all; i++)
			cu.cuMemFree(all[i]);
		free(idx), free(want_perm), free(want_src), free(want_cnt), free(want_off);
		free(perm), free(src), free(cnt), free(off);
	}
	gpu_close(&g);
}
#endif

#ifndef DSV32_NO_CUDA
/* Random router operands for the logit tests: W bf16 [E, D] (amplitude 0.05), x bf16 [T, D]
 * (amplitude 2) and as fp32 (xf), the CPU's logits ref fp32 [T, E] (cpu_bf16_linear); W and x
 * uploaded (d_w, d_x). */
struct gate_case {
	uint16_t *w, *xh;
	float *xf, *ref;
	gpu_ptr d_w, d_x;
};

static void gate_case_make(struct gpu *g, struct gate_case *gc, int T, int E, int D,
			   uint64_t *seed)
{
	gc->w = malloc((size_t)E * D * 2), gc->xh = malloc((size_t)T * D * 2);
	gc->xf = malloc((size_t)T * D * 4), gc->ref = malloc((size_t)T * E * 4);
	REQUIRE(gc->w && gc->xh && gc->xf && gc->ref);
	fill_bf16(gc->w, (size_t)E * D, 0.05f, seed);
	fill_bf16(gc->xh, (size_t)T * D, 2.0f, seed);
	for (size_t i = 0; i < (size_t)T * D; i++)
		gc->xf[i] = bf16_to_f32(gc->xh[i]);
	struct bf16_mat Wm = {gc->w, E, D};
	cpu_bf16_linear(NULL, &Wm, gc->xf, T, gc->ref, 0);
	gc->d_w = gpu_test_alloc((size_t)E * D * 2), gc->d_x = gpu_test_alloc((size_t)T * D * 2);
	REQUIRE(gpu_upload(g, gc->d_w, gc->w, (size_t)E * D * 2) == 0);
	REQUIRE(gpu_upload(g, gc->d_x, gc->xh, (size_t)T * D * 2) == 0);
}

static void gate_case_free(struct gate_case *gc)
{
	cu.cuMemFree(gc->d_w), cu.cuMemFree(gc->d_x);
	free(gc->w), free(gc->xh), free(gc->xf), free(gc->ref);
}

/* Every router-logit kernel (kernels_ptx/moe_block.cu) against the CPU's cpu_bf16_linear, to
 * the bit: the cp.async rings a8, a2 and a2l, the tiled forms (32- and 64-token tiles); token
 * counts across their tile edges, the real hidden size and small ones. */
TEST_T(gpu_moe, gate_logits_bit_exact, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	static const int shapes[][3] = {{1, 256, 7168}, {5, 256, 7168},  {16, 256, 7168},
					{17, 32, 512},  {64, 256, 7168}, {65, 16, 256},
					{300, 32, 512}, {257, 64, 1024}, {37, 16, 256},
					{130, 256, 7168}};
	static const struct {
		const char *name;
		int rows, experts, kc; /* tile; K chunk (D % kc == 0) */
		unsigned smem;
	} ks[] = {{"k_moe_gate_logits_a8", 16, 2, 512, 6 * 18 * 1040},
		  {"k_moe_gate_logits_a2", 64, 2, 128, 6 * 66 * 272},
		  {"k_moe_gate_logits_a2l", 64, 2, 512, 3 * 66 * 1040},
		  {"k_moe_gate_logits_tiled", 32, 32, 64, 64 * 104 * 4 + 4 * 64 * 144},
		  {"k_moe_gate_logits_t64", 64, 32, 64, 96 * 104 * 4 + 4 * 96 * 144}};
	uint64_t seed = 4301;
	for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
		const int T = shapes[si][0], E = shapes[si][1], D = shapes[si][2];
		struct gate_case gc;
		gate_case_make(&g, &gc, T, E, D, &seed);
		const float *ref = gc.ref;
		gpu_ptr d_w = gc.d_w, d_x = gc.d_x, d_l = gpu_test_alloc((size_t)T * E * 4);
		float *got = malloc((size_t)T * E * 4);
		REQUIRE(got);
		for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
			if (E % ks[ki].experts || D % ks[ki].kc)
				continue;
			void *fn;
			REQUIRE(gpu_kernel_smem(&g, ks[ki].name, &fn) == 0);
			gpu_test_poison(&g, d_l, (size_t)T * E * 4);
			int tt = T, ee = E, dd = D;
			void *args[] = {&d_w, &d_x, &d_l, &tt, &ee, &dd};
			REQUIRE(gpu_launch(&g, fn, (unsigned)(E / ks[ki].experts),
					   (unsigned)((T + ks[ki].rows - 1) / ks[ki].rows), 1, 256, 1, 1,
					   ks[ki].smem, args) == 0);
			REQUIRE(gpu_download(&g, got, d_l, (size_t)T * E * 4) == 0);
			int64_t bad = 0, first = -1;
			for (size_t i = 0; i < (size_t)T * E; i++)
				if (memcmp(&got[i], &ref[i], 4)) {
					if (first < 0)
						first = (int64_t)i;
					bad++;
				}
			printf("    %-24s T=%-3d E=%-3d D=%-4d: %lld of %lld logits differ", ks[ki].name, T, E,
			       D, (long long)bad, (long long)T * E);
			if (first >= 0)
				printf(" (first [%lld, %lld]: gpu %.9g cpu %.9g)", (long long)(first / E),
				       (long long)(first % E), got[first], ref[first]);
			printf("\n");
			CHECK_EQ_INT(bad, 0);
		}
		cu.cuMemFree(d_l);
		free(got);
		gate_case_free(&gc);
	}
	gpu_close(&g);
}
#endif

#ifndef DSV32_NO_CUDA
/* The fast mode's router logits on the tensor cores (k_moe_gate_logits_mma, kernels_ptx/
 * moe_gate_mma.cu) against the CPU's cpu_bf16_linear: the same exact products summed in another fp32
 * order, so each logit within 2^-16 of its sum of |products| (fp32 reordering over D <= 7168
 * terms stays ~100x below that; a lost or doubled 16-wide K step, a wrong row or expert is off by
 * ~sqrt(16 / D) of the logit's scale and more); and each row's logits the same bits whatever the
 * token count (the first rows of a run of T tokens against a run of fewer). Token counts across
 * the 128-token tiles, expert counts across the 64-expert tiles (E = 16, 66), the real shape. */
/* k_moe_gate_logits_mma (form 0: 128-token tiles) or _mma64 (form 1: 64-token tiles) on x
 * [T, D] and W [E, D] into logits [T, E]; their dynamic shared memory (GM_SMEM(rows, 64, stages)) set first. */
static int mma_gate_launch(struct gpu *g, int form, gpu_ptr w, gpu_ptr x, gpu_ptr l, int T, int E,
			   int D)
{
	static const char *const names[2] = {"k_moe_gate_logits_mma", "k_moe_gate_logits_mma64"};
	const int rows = form ? 64 : 128;
	const unsigned smem = form ? 12 * 128 * 144 : 8 * 192 * 144;
	void *fn;
	if (gpu_kernel_smem(g, names[form], &fn))
		return -1;
	void *args[] = {&w, &x, &l, &T, &E, &D};
	return gpu_launch(g, fn, (unsigned)((E + 63) / 64), (unsigned)((T + rows - 1) / rows), 1, 256,
			  1, 1, smem, args);
}

TEST_T(gpu_moe, gate_logits_mma_within_fp32, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	static const int shapes[][4] = {/* T, E, D, fewer tokens for the batch check */
					{65, 16, 256, 1},    {300, 32, 512, 129}, {257, 64, 1024, 128},
					{200, 66, 192, 77},  {130, 256, 7168, 5}, {1100, 256, 7168, 777}};
	uint64_t seed = 4402;
	for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
		const int T = shapes[si][0], E = shapes[si][1], D = shapes[si][2], T2 = shapes[si][3];
		struct gate_case gc;
		gate_case_make(&g, &gc, T, E, D, &seed);
		const uint16_t *w = gc.w;
		const float *xf = gc.xf, *ref = gc.ref;
		gpu_ptr d_w = gc.d_w, d_x = gc.d_x, d_l = gpu_test_alloc((size_t)T * E * 4);
		float *got = malloc((size_t)T * E * 4), *got2 = malloc((size_t)T2 * E * 4),
		      *got3 = malloc((size_t)T * E * 4);
		REQUIRE(got && got2 && got3);
		/* the 128-token form on T tokens, on the first T2, then the 64-token form on T */
		for (int pass = 0; pass < 3; pass++) {
			const int tt = pass == 1 ? T2 : T;
			gpu_test_poison(&g, d_l, (size_t)T * E * 4);
			REQUIRE(mma_gate_launch(&g, pass == 2, d_w, d_x, d_l, tt, E, D) == 0);
			float *out = pass == 0 ? got : pass == 1 ? got2 : got3;
			REQUIRE(gpu_download(&g, out, d_l, (size_t)tt * E * 4) == 0);
		}
		double worst = 0, worst_abs = 0;
		int64_t bad = 0, first = -1, exact = 0, batch_diff = 0;
		for (int t = 0; t < T; t++)
			for (int e = 0; e < E; e++) {
				double mag = 0;
				for (int k = 0; k < D; k++)
					mag += fabs((double)xf[(size_t)t * D + k] *
						    bf16_to_f32(w[(size_t)e * D + k]));
				const size_t i = (size_t)t * E + e;
				const double d = fabs((double)got[i] - ref[i]), r = d / (mag > 0 ? mag : 1);
				exact += got[i] == ref[i];
				if (!(r <= 0x1p-16)) {
					if (first < 0)
						first = (int64_t)i;
					bad++;
				}
				worst = r > worst || isnan(r) ? r : worst;
				worst_abs = d > worst_abs || isnan(d) ? d : worst_abs;
			}
		int64_t form_diff = 0;
		for (size_t i = 0; i < (size_t)T2 * E; i++)
			batch_diff += memcmp(&got2[i], &got[i], 4) != 0;
		for (size_t i = 0; i < (size_t)T * E; i++)
			form_diff += memcmp(&got3[i], &got[i], 4) != 0;
		printf("    k_moe_gate_logits_mma T=%-4d E=%-3d D=%-4d: worst |d| %.3g = %.3g of the sum "
		       "of |products| (limit 2^-16 = %.3g), %lld over, %.1f%% bit-equal to the CPU; "
		       "first %d rows run alone: %lld logits differ; 64-token tiles: %lld differ\n",
		       T, E, D, worst_abs, worst, 0x1p-16, (long long)bad,
		       100.0 * (double)exact / ((double)T * E), T2, (long long)batch_diff,
		       (long long)form_diff);
		if (first >= 0)
			printf("      first over [%lld, %lld]: gpu %.9g cpu %.9g\n", (long long)(first / E),
			       (long long)(first % E), got[first], ref[first]);
		CHECK_EQ_INT(bad, 0);
		CHECK_EQ_INT(batch_diff, 0);
		CHECK_EQ_INT(form_diff, 0);
		cu.cuMemFree(d_l);
		free(got), free(got2), free(got3);
		gate_case_free(&gc);
	}
	gpu_close(&g);
}
#endif

#ifndef DSV32_NO_CUDA
/* The fast mode's prefill router logits in 4 parts of K (k_moe_gate_logits_ks, _ks64:
 * kernels_ptx/moe_gate_mma.cu), summed on the host in part order as k_moe_route_wsum sums them
 * (checked to the bit in gate_matches_cpu), against the CPU's cpu_bf16_linear: each logit within
 * 2^-16 of its sum of |products|, as gate_logits_mma_within_fp32 holds the 64-expert tiles; each
 * part the same bits whatever the token count (the first rows alone) and the tile (_ks64 against
 * _ks). Token counts across the 64- and 128-token tiles, expert counts below 256, the real shape. */
static int ks_gate_launch(struct gpu *g, int bm, int np, gpu_ptr w, gpu_ptr x, gpu_ptr p, int T,
			  int E, int D)
{
	void *fn;
	if (gpu_kernel_smem(g, bm == 128 ? "k_moe_gate_logits_ks" : "k_moe_gate_logits_ks64", &fn))
		return -1;
	void *args[] = {&w, &x, &p, &T, &E, &D};
	return gpu_launch(g, fn, (unsigned)np, (unsigned)((T + bm - 1) / bm), 1, 256, 1, 1,
			  (unsigned)(4 * (bm + 256) * 144), args);
}

TEST_T(gpu_moe, gate_logits_ks_within_fp32, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	static const int shapes[][5] = {/* T, E, D, fewer tokens for the batch check, parts */
					{65, 256, 256, 1, 4},    {300, 256, 1024, 129, 4},
					{200, 66, 512, 77, 4},   {130, 256, 7168, 5, 4},
					{1100, 256, 7168, 777, 4}, {17, 256, 7168, 5, 28},
					{64, 256, 7168, 33, 28},  {40, 256, 1024, 17, 4}};
	uint64_t seed = 4411;
	for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
		const int T = shapes[si][0], E = shapes[si][1], D = shapes[si][2], T2 = shapes[si][3],
			  np = shapes[si][4];
		struct gate_case gc;
		gate_case_make(&g, &gc, T, E, D, &seed);
		const size_t n = (size_t)T * E, n2 = (size_t)T2 * E;
		gpu_ptr d_p = gpu_test_alloc((size_t)np * n * 4);
		float *got = malloc((size_t)np * n * 4), *got2 = malloc((size_t)np * n2 * 4),
		      *got3 = malloc((size_t)np * n * 4);
		REQUIRE(got && got2 && got3);
		/* the 128-token form on T tokens, on the first T2, then the 64-token form on T */
		for (int pass = 0; pass < 3; pass++) {
			const int tt = pass == 1 ? T2 : T;
			gpu_test_poison(&g, d_p, (size_t)np * n * 4);
			REQUIRE(ks_gate_launch(&g, pass == 2 ? 64 : 128, np, gc.d_w, gc.d_x, d_p, tt, E,
					       D) == 0);
			REQUIRE(gpu_download(&g, pass == 0 ? got : pass == 1 ? got2 : got3, d_p,
					     (size_t)np * tt * E * 4) == 0);
		}
		double worst = 0;
		int64_t bad = 0, first = -1, batch_diff = 0, form_diff = 0;
		for (int t = 0; t < T; t++)
			for (int e = 0; e < E; e++) {
				const size_t i = (size_t)t * E + e;
				float sum = got[i];
				for (int p = 1; p < np; p++)
					sum += got[p * n + i];
				double mag = 0;
				for (int k = 0; k < D; k++)
					mag += fabs((double)gc.xf[(size_t)t * D + k] *
						    bf16_to_f32(gc.w[(size_t)e * D + k]));
				const double r = fabs((double)sum - gc.ref[i]) / (mag > 0 ? mag : 1);
				if (!(r <= 0x1p-16)) {
					first = first < 0 ? (int64_t)i : first;
					bad++;
				}
				worst = r > worst || isnan(r) ? r : worst;
			}
		for (int p = 0; p < np; p++)
			for (size_t i = 0; i < n2; i++)
				batch_diff += memcmp(&got2[p * n2 + i], &got[p * n + i], 4) != 0;
		for (size_t i = 0; i < (size_t)np * n; i++)
			form_diff += memcmp(&got3[i], &got[i], 4) != 0;
		printf("    k_moe_gate_logits_ks T=%-4d E=%-3d D=%-4d %2d parts: worst |d| = %.3g of the "
		       "sum of |products| (limit 2^-16), %lld over; first %d rows alone: %lld parts "
		       "differ; 64-token tiles: %lld differ\n",
		       T, E, D, np, worst, (long long)bad, T2, (long long)batch_diff,
		       (long long)form_diff);
		if (first >= 0)
			printf("      first over [%lld, %lld]: cpu %.9g\n", (long long)(first / E),
			       (long long)(first % E), gc.ref[first]);
		CHECK_EQ_INT(bad, 0);
		CHECK_EQ_INT(batch_diff, 0);
		CHECK_EQ_INT(form_diff, 0);
		cu.cuMemFree(d_p);
		free(got), free(got2), free(got3);
		gate_case_free(&gc);
	}
	gpu_close(&g);
}
#endif

#ifndef DSV32_NO_CUDA
/* k_moe_quant_scatter (kernels_ptx/moe_block.cu: the block's quantised rows above 64 tokens):
 * act_quant of each x row (model/numerics.h act_quant_group) in its K sorted rows perm[t, n] and
 * in row R + t, codes and scales, byte for byte; every row written (poisoned first). perm: a
 * random permutation of the R = T * K rows. */
TEST(gpu_moe, quant_scatter_exact)
{
	struct gpu g;
	gpu_test_open(&g);
	static const int cases[][3] = {{65, 8, 7168}, {300, 6, 512}, {129, 1, 256}, {1000, 8, 1024},
				       {1, 8, 7168},  {4, 8, 7168},  {37, 4, 256}};
	uint64_t seed = 4501;
	for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
		const int T = cases[ci][0], K = cases[ci][1], D = cases[ci][2], R = T * K,
			  KB = D / 128;
		uint16_t *xh = malloc((size_t)T * D * 2);
		int *perm = malloc((size_t)R * 4);
		uint8_t *want = malloc((size_t)(R + T) * D), *got = malloc((size_t)(R + T) * D);
		float *want_s = malloc((size_t)(R + T) * KB * 4), *got_s = malloc((size_t)(R + T) * KB * 4),
		      *row = malloc((size_t)D * 4);
		REQUIRE(xh && perm && want && got && want_s && got_s && row);
		fill_bf16(xh, (size_t)T * D, 3.0f, &seed);
		for (int i = 0; i < R; i++)
			perm[i] = i;
		for (int i = R - 1; i > 0; i--) { /* Fisher-Yates */
			int j = (int)(test_rand(&seed) % (uint64_t)(i + 1)), tmp = perm[i];
			perm[i] = perm[j], perm[j] = tmp;
		}
		for (int t = 0; t < T; t++) {
			for (int d = 0; d < D; d++)
				row[d] = bf16_to_f32(xh[(size_t)t * D + d]);
			for (int c = 0; c < KB; c++) {
				uint8_t *q = want + (size_t)(R + t) * D + c * 128;
				want_s[(size_t)(R + t) * KB + c] = act_quant_group(row + c * 128, 128, q);
				for (int n = 0; n < K; n++) {
					const int r = perm[t * K + n];
					memcpy(want + (size_t)r * D + c * 128, q, 128);
					want_s[(size_t)r * KB + c] = want_s[(size_t)(R + t) * KB + c];
				}
			}
		}
		gpu_ptr d_x = gpu_test_alloc((size_t)T * D * 2), d_perm = gpu_test_alloc((size_t)R * 4),
			d_q = gpu_test_alloc((size_t)(R + T) * D),
			d_s = gpu_test_alloc((size_t)(R + T) * KB * 4);
		REQUIRE(gpu_upload(&g, d_x, xh, (size_t)T * D * 2) == 0);
		REQUIRE(gpu_upload(&g, d_perm, perm, (size_t)R * 4) == 0);
		gpu_test_poison(&g, d_q, (size_t)(R + T) * D);
		gpu_test_poison(&g, d_s, (size_t)(R + T) * KB * 4);
		int dd = D, tt = T, kk = K, rr = R;
		void *args[] = {&d_x, &d_perm, &d_q, &d_s, &dd, &tt, &kk, &rr};
		const long long ng = (long long)T * KB;
		REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_quant_scatter"), (unsigned)((ng + 7) / 8), 1,
				   1, 256, 1, 1, 0, args) == 0);
		REQUIRE(gpu_download(&g, got, d_q, (size_t)(R + T) * D) == 0);
		REQUIRE(gpu_download(&g, got_s, d_s, (size_t)(R + T) * KB * 4) == 0);
		int64_t bad_q = 0, bad_s = 0, first = -1;
		for (size_t i = 0; i < (size_t)(R + T) * D; i++)
			if (got[i] != want[i]) {
				first = first < 0 ? (int64_t)i : first;
				bad_q++;
			}
		for (size_t i = 0; i < (size_t)(R + T) * KB; i++)
			bad_s += memcmp(&got_s[i], &want_s[i], 4) != 0;
		printf("    k_moe_quant_scatter T=%d K=%d D=%d: %lld of %lld codes, %lld of %lld scales "
		       "differ (first code at row %lld)\n",
		       T, K, D, (long long)bad_q, (long long)(R + T) * D, (long long)bad_s,
		       (long long)(R + T) * KB, first < 0 ? -1LL : (long long)(first / D));
		CHECK_EQ_INT(bad_q, 0);
		CHECK_EQ_INT(bad_s, 0);
		cu.cuMemFree(d_x), cu.cuMemFree(d_perm), cu.cuMemFree(d_q), cu.cuMemFree(d_s);
		free(xh), free(perm), free(want), free(got), free(want_s), free(got_s), free(row);
	}
	gpu_close(&g);
}
#endif

#ifndef DSV32_NO_CUDA
/* The two tile forms of the tensor-core router logits at the real dims (E = 256, D = 7168) and
 * prefill token counts: the same bits (each output the same mma chain; gate_logits_mma_within_fp32
 * checks them against the CPU), and their times (the fastest of 5 batches of 4 launches), to
 * place cuda_moe.c's choice between them (run 17: the 4-stage 128-token form ~90 us at every T). */
TEST_T(gpu_moe, timing_gate_logits_mma, 30)
{
	struct gpu g;
	gpu_test_open(&g);
	const int E = 256, D = 7168, Tmax = 4096;
	uint64_t seed = 4601;
	uint16_t *w, *xh;
	gpu_ptr d_w = gpu_test_rand_bf16(&g, (size_t)E * D, 0.05f, &seed, &w);
	gpu_ptr d_x = gpu_test_rand_bf16(&g, (size_t)Tmax * D, 2.0f, &seed, &xh);
	gpu_ptr d_l = gpu_test_alloc((size_t)Tmax * E * 4), d_p = gpu_test_alloc(4 * (size_t)Tmax * E * 4);
	float *a = malloc((size_t)Tmax * E * 4), *b = malloc((size_t)Tmax * E * 4);
	REQUIRE(a && b);
	CUevent e0, e1;
	REQUIRE(cu.cuEventCreate(&e0, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
	REQUIRE(cu.cuEventCreate(&e1, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
	static const int Ts[] = {128, 512, 1024, 2048, 4096};
	for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
		const int T = Ts[ti];
		float best[2] = {1e30f, 1e30f};
		for (int form = 0; form < 2; form++) {
			gpu_test_poison(&g, d_l, (size_t)T * E * 4);
			REQUIRE(mma_gate_launch(&g, form, d_w, d_x, d_l, T, E, D) == 0);
			REQUIRE(gpu_download(&g, form ? b : a, d_l, (size_t)T * E * 4) == 0);
			for (int k = 0; k < 5; k++) {
				float ms;
				cu.cuEventRecord(e0, g.stream);
				for (int i = 0; i < 4; i++)
					mma_gate_launch(&g, form, d_w, d_x, d_l, T, E, D);
				cu.cuEventRecord(e1, g.stream);
				REQUIRE(cu.cuEventSynchronize(e1) == CUDA_SUCCESS);
				cu.cuEventElapsedTime(&ms, e0, e1);
				best[form] = ms < best[form] ? ms : best[form];
			}
		}
		int64_t diff = 0;
		for (size_t i = 0; i < (size_t)T * E; i++)
			diff += memcmp(&a[i], &b[i], 4) != 0;
		float kbest[2] = {1e30f, 1e30f}; /* k_moe_gate_logits_ks / _ks64 into d_p */
		for (int form = 0; form < 2; form++)
			for (int k = 0; k < 5; k++) {
				float ms;
				cu.cuEventRecord(e0, g.stream);
				for (int i = 0; i < 4; i++)
					ks_gate_launch(&g, form ? 64 : 128, 4, d_w, d_x, d_p, T, E, D);
				cu.cuEventRecord(e1, g.stream);
				REQUIRE(cu.cuEventSynchronize(e1) == CUDA_SUCCESS);
				cu.cuEventElapsedTime(&ms, e0, e1);
				kbest[form] = ms < kbest[form] ? ms : kbest[form];
			}
		printf("    router logits T=%-4d E=%d D=%d: 128-token tiles %.1f us, 64-token tiles %.1f "
		       "us (%u / %u blocks); %lld logits differ between them; in 4 parts of K: "
		       "128-token tiles %.1f us, 64 %.1f (%u / %u blocks)\n",
		       T, E, D, best[0] * 1e3 / 4, best[1] * 1e3 / 4, (unsigned)(4 * ((T + 127) / 128)),
		       (unsigned)(4 * ((T + 63) / 64)), (long long)diff, kbest[0] * 1e3 / 4,
		       kbest[1] * 1e3 / 4, (unsigned)(4 * ((T + 127) / 128)),
		       (unsigned)(4 * ((T + 63) / 64)));
		CHECK_EQ_INT(diff, 0);
	}
	cu.cuEventDestroy(e0), cu.cuEventDestroy(e1);
	cu.cuMemFree(d_w), cu.cuMemFree(d_x), cu.cuMemFree(d_l), cu.cuMemFree(d_p);
	free(w), free(xh), free(a), free(b);
	gpu_close(&g);
}
#endif
