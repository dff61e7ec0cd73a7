/*
 * test_gpu_moe_block.c — the whole MoE block on the GPU (model/cuda_moe.c) against the CPU
 * backend's moe_forward on random weights of realistic shape (block-quantised normals):
 * router logits and expert ids identical, routing weights within fp32 rounding, the output
 * within bf16/FP8 rounding (the GEMMs sum in another order, so an intermediate bf16 or e4m3
 * rounding may flip: the limit is relative to the row, and looser where wgmma GEMMs run).
 * Small configs at T = 1, 5, 64, 300, 512, 700, 1100, the real routing shape on a narrow model at
 * T = 1, 2, and the real dims (7168 / 2048, 256 experts, top-8) at T = 1, 4, 8, 16, 24, whose expert weights are 8 distinct code sets shared
 * round-robin by the experts, each expert with its own scales (a mix-up of experts still
 * shows). For T <= 64 (decode) the block is also captured into a CUDA graph and replayed: the
 * same bytes; every case runs again through the separate kernels (CUDA_MOE_UNFUSED): the same
 * bytes; and at 1 and 8-64 tokens in the fast mode (cuda_gemm_set_batch_invariant(g, 0)), against
 * the CPU within the wgmma limits, directly and through a graph (the same bytes); above 64 tokens
 * and at one token also in the fast mode with its own router logits (check_fast_block: on the
 * tensor cores, or at one token over E / 2 blocks).
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include <string.h>
#include <unistd.h>

#include "model/cpu_moe.h"
#include "model/cpu_ops.h"
#include "model/cpu_pool.h"
#include "model/cuda_gemm.h"
#include "model/cuda_gemm_wgmma.h"
#include "model/cuda_moe.h"

/* Outputs more than one bf16 ulp off must stay within this fraction of their row's RMS.
 * Decode sizes (T <= 64) run every GEMM on mma.sync kernels, whose fp32 sums differ from the
 * CPU's in order only (runs 1-4: bit-identical outputs). Larger T may run the grouped GEMMs
 * (routed experts and the shared one, a group of its own) on the wgmma kernel (model/cuda_moe.c
 * picks it by rows per group): Hopper's wgmma FP8 accumulates a k32 step with reduced
 * precision (DeepSeek-V3 report §3.3.2), about 2^-8 of the RMS per GEMM on realistic operands
 * (P's test, run 4). The MLP requantises between its two GEMMs: an intermediate off by 2^-8 of
 * its RMS flips its e4m3 code (2^-4 of the value apart) with probability ~2^-8 / 2^-4, and each
 * flip moves an output by ~2^-4 / sqrt(inter) of the row: over a few hundred thousand outputs
 * the worst reaches ~0.05-0.1 (run 4, T = 300: worst 0.087, mean 0.0012). So on wgmma: worst
 * 2^-3 of the row's RMS and a mean |err| / RMS under 2^-8 (a wrong expert, weight or row is off
 * by O(1) on the mean too). The stage taps print which stage departs. */
#define MOE_REL_LIMIT_MMA (1.0 / 128)
#define MOE_REL_LIMIT_WGMMA (1.0 / 8)
#define MOE_MEAN_LIMIT_WGMMA (1.0 / 256)

/* Realistic operands: weights ~ N(0, 1) quantised per 128x128 block so the block's largest
 * value maps near the top of e4m3 (code = e4m3(z * 128), |z| < 3.2 here), power-of-two
 * weight_scale_inv around 2^-12.5 (weights of RMS ~0.02); activations bf16 ~ N(0, 1).
 * tab: 256 codes at the normal quantiles (i + 0.5) / 256; a random byte picks one. */
static double normal_quantile(double p)
{
	double lo = -10, hi = 10;
	for (int i = 0; i < 100; i++) {
		double mid = 0.5 * (lo + hi);
		if (0.5 * (1 + erf(mid / sqrt(2.0))) < p)
			lo = mid;
		else
			hi = mid;
	}
	return 0.5 * (lo + hi);
}

static void e4m3_table(uint8_t *tab)
{
	for (int i = 0; i < 256; i++)
		tab[i] = f32_to_e4m3((float)(normal_quantile((i + 0.5) / 256.0) * 128.0));
}

static void fill_codes(uint8_t *w, size_t n, const uint8_t *tab, uint64_t *seed)
{
	for (size_t i = 0; i < n; i += 8) {
		uint64_t r = test_rand(seed);
		for (size_t k = 0; k < 8 && i + k < n; k++)
			w[i + k] = tab[(r >> (8 * k)) & 0xff];
	}
}

/* bf16 ~ N(0, sigma) (sum of four uniforms, scaled to variance sigma^2). */
static void fill_normal_bf16(uint16_t *x, size_t n, float sigma, uint64_t *seed)
{
	for (size_t i = 0; i < n; i++) {
		float z = 0;
		for (int k = 0; k < 4; k++)
			z += (float)((test_rand(seed) >> 40) * (1.0 / (1ull << 24))) - 0.5f;
		x[i] = f32_to_bf16(z * sqrtf(3.0f) * sigma);
	}
}

static void fill_scales(float *s, size_t n, uint64_t *seed)
{
	for (size_t i = 0; i < n; i++)
		s[i] = ldexpf(1.0f, -12 - (int)(test_rand(seed) % 2));
}

static gpu_ptr upload(struct gpu *g, const void *h, size_t bytes)
{
	gpu_ptr d = gpu_test_alloc(bytes);
	REQUIRE(gpu_upload(g, d, h, bytes) == 0);
	return d;
}

/* The block's intermediates (trace taps) against the CPU, stage by stage, to say which stage
 * departs first: the routed gate|up rows, the routed experts' outputs (both in sorted order:
 * by expert, tokens ascending, as the CPU's moe_forward gathers them), the shared expert. */
static void check_stages(struct gpu *g, struct cpu_pool *pool, const struct layer_weights *lw,
			 const struct dsv32_config *c, const float *f, int T, const int32_t *idx,
			 const struct cuda_moe_taps *tr)
{
	const int D = (int)c->hidden_size, I = (int)c->moe_intermediate_size,
		  E = (int)c->n_routed_experts, K = (int)c->num_experts_per_tok, R = T * K;
	float *xg = malloc((size_t)R * D * 4), *ref_gu = malloc((size_t)R * 2 * I * 4),
	      *ref_ey = malloc((size_t)R * D * 4), *ref_sh = malloc((size_t)T * D * 4),
	      *tmp = malloc((size_t)R * I * 4);
	uint16_t *got_gu = malloc((size_t)R * 2 * I * 2), *got_ey = malloc((size_t)R * D * 2),
		 *got_sh = malloc((size_t)T * D * 2);
	REQUIRE(xg && ref_gu && ref_ey && ref_sh && tmp && got_gu && got_ey && got_sh);
	int r0 = 0;
	for (int e = 0; e < E; e++) {
		int m = 0;
		for (int t = 0; t < T; t++)
			for (int n = 0; n < K; n++)
				if (idx[t * K + n] == e)
					memcpy(xg + (size_t)(r0 + m++) * D, f + (size_t)t * D, (size_t)D * 4);
		if (!m)
			continue;
		const float *xe = xg + (size_t)r0 * D;
		cpu_fp8_linear(pool, &lw->exp_w1[e], xe, m, tmp);
		for (int i = 0; i < m; i++)
			memcpy(ref_gu + (size_t)(r0 + i) * 2 * I, tmp + (size_t)i * I, (size_t)I * 4);
		cpu_fp8_linear(pool, &lw->exp_w3[e], xe, m, tmp);
		for (int i = 0; i < m; i++)
			memcpy(ref_gu + (size_t)(r0 + i) * 2 * I + I, tmp + (size_t)i * I, (size_t)I * 4);
		mlp_forward(pool, &lw->exp_w1[e], &lw->exp_w3[e], &lw->exp_w2[e], xe, m,
			    ref_ey + (size_t)r0 * D);
		r0 += m;
	}
	mlp_forward(pool, &lw->sh_w1, &lw->sh_w3, &lw->sh_w2, f, T, ref_sh);
	REQUIRE(gpu_download(g, got_gu, tr->gu, (size_t)R * 2 * I * 2) == 0);
	REQUIRE(gpu_download(g, got_ey, tr->ey, (size_t)R * D * 2) == 0);
	REQUIRE(gpu_download(g, got_sh, tr->sh, (size_t)T * D * 2) == 0);
	printf("    stages against the CPU (diagnosis; the limit column counts > 2^-7 of the row):\n");
	if (got_gu[0] == 0xffff) /* still the poison: SwiGLU fused into the GEMM (wgmma) */
		printf("      routed gate|up: not written (SwiGLU fused into the wgmma GEMM)\n");
	else
		gpu_count_bad_bf16(ref_gu, got_gu, R, 2 * I, 1.0 / 128,
				   "      routed gate|up (grouped GEMM 1)");
	gpu_count_bad_bf16(ref_ey, got_ey, R, D, 1.0 / 128, "      routed expert out (grouped GEMM 2)");
	gpu_count_bad_bf16(ref_sh, got_sh, T, D, 1.0 / 128, "      shared expert out (group E of both)");
	free(xg), free(ref_gu), free(ref_ey), free(ref_sh), free(tmp), free(got_gu), free(got_ey);
	free(got_sh);
}

/* The block on d_x into d_y (poisoned first) with flags, directly or captured into a CUDA graph
 * and replayed twice; y downloaded into out: bf16 [T, hidden] (cuda_moe_forward), or with
 * rank_share fp32 (cuda_moe_forward_rank, L a rank's layer). */
static void run_forward(struct gpu *g, struct gpu_arena *arena, const struct dsv32_config *c,
			const struct cuda_moe_layer *L, gpu_ptr d_x, gpu_ptr d_y, int T,
			const struct cuda_moe_trace *tr, unsigned flags, int graph, void *out,
			int rank_share)
{
	const size_t bytes = (size_t)T * c->hidden_size * (rank_share ? 4 : 2);
	gpu_test_poison(g, d_y, bytes);
#define MOE_FWD()                                                                                  \
	(rank_share ? cuda_moe_forward_rank(g, arena, c, L, d_x, d_y, T, tr, flags)                \
		    : cuda_moe_forward(g, arena, c, L, d_x, d_y, T, tr, flags))
	if (!graph) {
		REQUIRE(MOE_FWD() == 0);
	} else {
		CUgraph gr;
		CUgraphExec exec;
		REQUIRE(cu_check(cu.cuStreamBeginCapture(g->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
				 "cuStreamBeginCapture", __FILE__, __LINE__) == 0);
		int crc = MOE_FWD();
		REQUIRE(cu_check(cu.cuStreamEndCapture(g->stream, &gr), "cuStreamEndCapture",
				 __FILE__, __LINE__) == 0);
		REQUIRE(crc == 0);
		REQUIRE(cu_check(cu.cuGraphInstantiateWithFlags(&exec, gr, 0),
				 "cuGraphInstantiateWithFlags", __FILE__, __LINE__) == 0);
		for (int k = 0; k < 2; k++)
			REQUIRE(cu_check(cu.cuGraphLaunch(exec, g->stream), "cuGraphLaunch", __FILE__,
					 __LINE__) == 0);
		cu.cuGraphExecDestroy(exec);
		cu.cuGraphDestroy(gr);
	}
#undef MOE_FWD
	REQUIRE(gpu_download(g, out, d_y, bytes) == 0);
}

static void run_block(struct gpu *g, struct gpu_arena *arena, const struct dsv32_config *c,
		      const struct cuda_moe_layer *L, gpu_ptr d_x, gpu_ptr d_y, int T,
		      const struct cuda_moe_trace *tr, unsigned flags, int graph, uint16_t *out)
{
	run_forward(g, arena, c, L, d_x, d_y, T, tr, flags, graph, out, 0);
}

static int64_t count_diff(const uint16_t *a, const uint16_t *b, size_t n)
{
	int64_t d = 0;
	for (size_t i = 0; i < n; i++)
		d += a[i] != b[i];
	return d;
}

/* The fast mode (cuda_gemm_set_batch_invariant(g, 0)), whose router logits run on the tensor
 * cores from 17 tokens (the real routing shape: k_moe_gate_logits_ks, in parts of K; other
 * shapes above 64 tokens k_moe_gate_logits_mma: the CPU's products in another fp32 order), at
 * 2-16 tokens in k_moe_gate_route_t and at one token in k_moe_gate_route1s (the same products
 * over E / 2 blocks in another order; other shapes the exact logits): each logit
 * within 2^-16 of its sum of |products| of the CPU's (logits, on x = f and W = gate); the routing
 * the CPU's moe_route of those logits to the bit (experts and weights); the experts the CPU's own
 * but for near ties (a logit's rounding may flip one: at most 1 + T / 256 tokens, printed; a
 * wrong logit moves most tokens); y against the CPU's within the wgmma limits on the tokens
 * whose experts agree. tr receives the fast run's routing. */
static void check_fast_block(struct gpu *g, struct gpu_arena *arena, const struct dsv32_config *c,
			     const struct cuda_moe_layer *L, gpu_ptr d_x, gpu_ptr d_y, int T,
			     const struct cuda_moe_trace *tr, const float *f, const uint16_t *gate,
			     const float *bias, const float *logits, const int32_t *idx,
			     const float *y)
{
	const int D = (int)c->hidden_size, E = (int)c->n_routed_experts,
		  K = (int)c->num_experts_per_tok;
	float *gl = malloc((size_t)T * E * 4), *gw = malloc((size_t)T * K * 4),
	      *rw = malloc((size_t)K * 4);
	int32_t *gi = malloc((size_t)T * K * 4), *ri = malloc((size_t)K * 4);
	uint16_t *gy = malloc((size_t)T * D * 2);
	REQUIRE(gl && gw && rw && gi && ri && gy);
	gpu_test_poison(g, tr->logits, (size_t)T * E * 4);
	gpu_test_poison(g, tr->idx, (size_t)T * K * 4);
	gpu_test_poison(g, tr->wts, (size_t)T * K * 4);
	cuda_gemm_set_batch_invariant(g, 0);
	run_block(g, arena, c, L, d_x, d_y, T, tr, 0, 0, gy);
	cuda_gemm_set_batch_invariant(g, 1);
	REQUIRE(gpu_download(g, gl, tr->logits, (size_t)T * E * 4) == 0);
	REQUIRE(gpu_download(g, gi, tr->idx, (size_t)T * K * 4) == 0);
	REQUIRE(gpu_download(g, gw, tr->wts, (size_t)T * K * 4) == 0);
	int64_t bad_logits = 0, exact = 0, route_diff = 0, flips = 0, bad_y = 0, first_flip = -1;
	double worst = 0, worst_abs = 0, sum_rel = 0;
	for (int t = 0; t < T; t++) {
		for (int e = 0; e < E; e++) {
			double mag = 0;
			for (int k = 0; k < D; k++)
				mag += fabs((double)f[(size_t)t * D + k] * bf16_to_f32(gate[(size_t)e * D + k]));
			const size_t i = (size_t)t * E + e;
			const double d = fabs((double)gl[i] - logits[i]), r = d / (mag > 0 ? mag : 1);
			exact += gl[i] == logits[i];
			bad_logits += !(r <= 0x1p-16);
			worst = r > worst || isnan(r) ? r : worst;
			worst_abs = d > worst_abs || isnan(d) ? d : worst_abs;
		}
		moe_route(c, gl + (size_t)t * E, bias, ri, rw);
		route_diff += memcmp(ri, gi + (size_t)t * K, (size_t)K * 4) ||
			      memcmp(rw, gw + (size_t)t * K, (size_t)K * 4);
		if (memcmp(gi + (size_t)t * K, idx + (size_t)t * K, (size_t)K * 4)) {
			flips++;
			first_flip = first_flip < 0 ? t : first_flip;
			continue;
		}
		const double rms = gpu_row_rms(y + (size_t)t * D, D);
		for (int d = 0; d < D; d++) {
			const size_t i = (size_t)t * D + d;
			const double rel = fabs((double)bf16_to_f32(gy[i]) - y[i]) / (rms > 0 ? rms : 1);
			sum_rel += rel;
			bad_y += bf16_ulps(f32_to_bf16(y[i]), gy[i]) > 1 && !(rel <= MOE_REL_LIMIT_WGMMA);
		}
	}
	/* 2 .. 16 tokens (k_moe_gate_route_t): each token's logits the bits of the one-token
	 * router's (k_moe_gate_route1s) on that token alone */
	int64_t alone_diff = 0;
	if (T >= 2 && T <= 16) {
		struct cuda_moe_trace t1 = {gpu_test_alloc((size_t)E * 4), gpu_test_alloc((size_t)K * 4),
					    gpu_test_alloc((size_t)K * 4)};
		gpu_ptr y1 = gpu_test_alloc((size_t)D * 2);
		float *l1 = malloc((size_t)E * 4);
		uint16_t *o1 = malloc((size_t)D * 2);
		REQUIRE(l1 && o1);
		cuda_gemm_set_batch_invariant(g, 0);
		for (int t = 0; t < T; t++) {
			gpu_test_poison(g, t1.logits, (size_t)E * 4);
			run_block(g, arena, c, L, d_x + (size_t)t * D * 2, y1, 1, &t1, 0, 0, o1);
			REQUIRE(gpu_download(g, l1, t1.logits, (size_t)E * 4) == 0);
			for (int e = 0; e < E; e++)
				alone_diff += memcmp(&l1[e], &gl[(size_t)t * E + e], 4) != 0;
		}
		cuda_gemm_set_batch_invariant(g, 1);
		printf("    fast router of %d tokens against one token at a time: %lld logits differ\n", T,
		       (long long)alone_diff);
		cu.cuMemFree(t1.logits), cu.cuMemFree(t1.idx), cu.cuMemFree(t1.wts), cu.cuMemFree(y1);
		free(l1), free(o1);
	}
	CHECK_EQ_INT(alone_diff, 0);
	const double mean = T > flips ? sum_rel / ((double)(T - flips) * D) : 0;
	printf("    fast mode (router logits in another fp32 order): worst logit |d| %.3g = %.3g of the "
	       "sum of |products| (limit 2^-16 = %.3g), %lld over, %.1f%% bit-equal to the CPU's; "
	       "routing of those logits against moe_route: %lld tokens differ; experts unlike the "
	       "CPU's (near ties): %lld tokens (limit %d, first %lld); y on the others: %lld over the "
	       "wgmma limit, mean |err|/rms(row) %.3g (limit %.3g)\n",
	       worst_abs, worst, 0x1p-16, (long long)bad_logits, 100.0 * (double)exact / ((double)T * E),
	       (long long)route_diff, (long long)flips, 1 + T / 256, (long long)first_flip,
	       (long long)bad_y, mean, MOE_MEAN_LIMIT_WGMMA);
	CHECK_EQ_INT(bad_logits, 0);
	CHECK_EQ_INT(route_diff, 0);
	CHECK(flips <= 1 + T / 256);
	CHECK_EQ_INT(bad_y, 0);
	CHECK(mean < MOE_MEAN_LIMIT_WGMMA);
	free(gl), free(gw), free(rw), free(gi), free(ri), free(gy);
}

/* One case's device layer as cuda_moe_layer_init takes it (tables of expert addresses). */
struct moe_dev {
	gpu_ptr gate, bias;
	const gpu_ptr *t13, *ts13, *t2, *ts2; /* [E] */
	struct cuda_fp8_mat sh13, sh2;
};

/* Expert parallelism (cuda_moe_forward_rank, docs/MULTIGPU.md step 3) on one case, for 2 and 3
 * ranks, each rank's layer built from its own experts' addresses only (cuda_moe_layer_init_rank):
 * - batch-invariant mode: the routing is the CPU's; each rank's fp32 share against the CPU's
 *   moe_forward_rank on the CPU's routing within the block's own limits (a value more than one
 *   bf16 ulp and more than the limit of the row's RMS away is bad; an intermediate bf16 or e4m3
 *   rounding may flip, as for the whole block, so at most 1e-4 of the values may be; the values
 *   bit-identical are printed); the shares summed in rank order (as an all-reduce might) and
 *   rounded against the whole block's output y_whole: within one bf16 ulp or 2^-12 of the row's
 *   RMS (only the fp32 order of the pick sums differs); rank 1's share replayed from a CUDA graph
 *   gives the same bytes (decode sizes);
 * - fast mode at decode sizes: the routing the whole block's in the same mode (the same router
 *   kernels, so near ties fall alike), the summed shares against its output by the same
 *   criterion (the GEMMs run each expert's rows as there; at 1-3 tokens the whole block's one
 *   launch gives the four launches' bits).
 * A whole layer is refused by cuda_moe_forward_rank, a rank's by cuda_moe_forward (-EINVAL). */
static void check_ep(struct gpu *g, struct cpu_pool *pool, struct gpu_arena *arena,
		     struct gpu_region *reg, const struct dsv32_config *c,
		     const struct layer_weights *lw, const struct moe_dev *dev,
		     const struct cuda_moe_layer *whole, gpu_ptr d_x, int T, const float *f,
		     const int32_t *idx, const float *wts, const float *y_cpu,
		     const uint16_t *y_whole)
{
	const int D = (int)c->hidden_size, E = (int)c->n_routed_experts,
		  K = (int)c->num_experts_per_tok;
	const size_t n = (size_t)T * D;
	float *share = malloc(n * 4), *ref = malloc(n * 4), *sum = malloc(n * 4),
	      *again = malloc(n * 4);
	int32_t *g_idx = malloc((size_t)T * K * 4);
	REQUIRE(share && ref && sum && again && g_idx);
	gpu_ptr d_part = gpu_test_alloc(n * 4);
	struct cuda_moe_trace tr = {0, gpu_test_alloc((size_t)T * K * 4),
				    gpu_test_alloc((size_t)T * K * 4)};
	const double limit = T <= 64 ? MOE_REL_LIMIT_MMA : MOE_REL_LIMIT_WGMMA;
	CHECK_EQ_INT(cuda_moe_forward_rank(g, arena, c, whole, d_x, d_part, T, NULL, 0), -EINVAL);
	/* the whole block in the fast mode, its routing traced (decode sizes) */
	int32_t *fast_idx = malloc((size_t)T * K * 4);
	uint16_t *fast_y = malloc(n * 2);
	REQUIRE(fast_idx && fast_y);
	if (T <= 64) {
		cuda_gemm_set_batch_invariant(g, 0);
		run_forward(g, arena, c, whole, d_x, d_part, T, &tr, 0, 0, fast_y, 0);
		REQUIRE(gpu_download(g, fast_idx, tr.idx, (size_t)T * K * 4) == 0);
		cuda_gemm_set_batch_invariant(g, 1);
	}
	for (int ranks = 2; ranks <= 3; ranks++)
		for (int fast = 0; fast < 2 && (!fast || T <= 64); fast++) {
			cuda_gemm_set_batch_invariant(g, !fast);
			memset(sum, 0, n * 4);
			int64_t ids_bad = 0, exact = 0, share_bad = 0, graph_diff = 0;
			for (int r = 0; r < ranks; r++) {
				int64_t e0, e1;
				moe_rank_experts(E, r, ranks, &e0, &e1);
				struct cuda_moe_layer L;
				struct err er = {""};
				int rc = cuda_moe_layer_init_rank(g, reg, c, dev->gate, dev->bias,
								  dev->t13 + e0, dev->ts13 + e0,
								  dev->t2 + e0, dev->ts2 + e0, dev->sh13,
								  dev->sh2, r, ranks, &L, &er);
				if (rc)
					printf("    cuda_moe_layer_init_rank: %s\n", er.msg);
				REQUIRE(rc == 0);
				if (r == 1 && !fast)
					CHECK_EQ_INT(cuda_moe_forward(g, arena, c, &L, d_x, d_part, T,
								      NULL, 0),
						     -EINVAL);
				gpu_test_poison(g, tr.idx, (size_t)T * K * 4);
				run_forward(g, arena, c, &L, d_x, d_part, T, &tr, 0, 0, share, 1);
				REQUIRE(gpu_download(g, g_idx, tr.idx, (size_t)T * K * 4) == 0);
				ids_bad += memcmp(g_idx, fast ? fast_idx : idx, (size_t)T * K * 4) != 0;
				for (size_t i = 0; i < n; i++)
					sum[i] += share[i];
				if (fast)
					continue;
				moe_forward_rank(pool, c, lw, f, T, idx, wts, r, ranks, ref);
				for (int t = 0; t < T; t++) {
					double rms = gpu_row_rms(y_cpu + (size_t)t * D, D);
					for (int d = 0; d < D; d++) {
						size_t i = (size_t)t * D + d;
						exact += memcmp(&share[i], &ref[i], 4) == 0;
						/* the block's own criterion (gpu_count_bad_bf16) */
						int u = bf16_ulps(f32_to_bf16(ref[i]),
								  f32_to_bf16(share[i]));
						share_bad += u > 1 &&
							     !(fabs((double)share[i] - ref[i]) <=
							       limit * (rms > 0 ? rms : 1));
					}
				}
				if (r == 1 && T <= 64) {
					run_forward(g, arena, c, &L, d_x, d_part, T, &tr, 0, 1, again, 1);
					for (size_t i = 0; i < n; i++)
						graph_diff += memcmp(&again[i], &share[i], 4) != 0;
				}
			}
			printf("    EP, %d ranks, %s mode: routing %s the %s", ranks,
			       fast ? "fast" : "batch-invariant", ids_bad ? "NOT" : "is",
			       fast ? "whole block's" : "CPU's");
			int64_t bad = 0;
			if (!fast) {
				printf("; shares: %lld of %lld values the CPU's bits, %lld beyond the "
				       "limit; graph replay: %lld differ\n",
				       (long long)exact, (long long)(n * ranks), (long long)share_bad,
				       (long long)graph_diff);
				bad = gpu_count_bad_bf16(sum, y_whole, T, D, 1.0 / 4096,
							 "    EP shares summed against the whole block");
				/* flips are rare (s39-4, H100: at most 1 of 114,688 values, real dims
				 * at 8 tokens, where the whole block's y has 1.5% of its outputs over
				 * an ulp and its worst 0.013 of the row at one ulp: a share, smaller
				 * than y, spans more ulps for the same error); a wrong expert or rank
				 * moves every value of its rows, and the sum above catches it too */
				CHECK((double)share_bad <= 1e-4 * (double)(n * ranks));
				CHECK_EQ_INT(graph_diff, 0);
			} else {
				printf("\n");
				bad = gpu_count_bad_bf16(sum, fast_y, T, D, 1.0 / 4096,
							 "    EP shares summed against the whole block "
							 "(fast mode)");
			}
			CHECK_EQ_INT(ids_bad, 0);
			CHECK_EQ_INT(bad, 0);
		}
	cuda_gemm_set_batch_invariant(g, 1);
	cu.cuMemFree(d_part), cu.cuMemFree(tr.idx), cu.cuMemFree(tr.wts);
	free(share), free(ref), free(sum), free(again), free(g_idx), free(fast_idx);
	free(fast_y);
}

/* One case: config c, T rows, `sets` distinct expert code sets (expert e uses set e % sets). */
static void check_block(struct gpu *g, struct cpu_pool *pool, const struct dsv32_config *c, int T,
			int sets, uint64_t seed)
{
	const int D = (int)c->hidden_size, I = (int)c->moe_intermediate_size,
		  E = (int)c->n_routed_experts, K = (int)c->num_experts_per_tok;
	const int Ish = I * (int)c->n_shared_experts;
	const size_t n13 = (size_t)2 * I * D, n2 = (size_t)D * I;
	const size_t ns13 = (size_t)(2 * I / 128) * (D / 128), ns2 = (size_t)(D / 128) * (I / 128);
	uint8_t tab[256];
	e4m3_table(tab);
	/* host weights */
	uint8_t *w13 = malloc(n13 * sets), *w2 = malloc(n2 * sets);
	float *s13 = malloc(ns13 * E * 4), *s2 = malloc(ns2 * E * 4);
	uint8_t *sh13 = malloc((size_t)2 * Ish * D), *sh2 = malloc((size_t)D * Ish);
	float *shs13 = malloc((size_t)(2 * Ish / 128) * (D / 128) * 4),
	      *shs2 = malloc((size_t)(D / 128) * (Ish / 128) * 4);
	uint16_t *gate = malloc((size_t)E * D * 2), *xh = malloc((size_t)T * D * 2);
	float *bias = malloc((size_t)E * 4);
	REQUIRE(w13 && w2 && s13 && s2 && sh13 && sh2 && shs13 && shs2 && gate && xh && bias);
	fill_codes(w13, n13 * sets, tab, &seed);
	fill_codes(w2, n2 * sets, tab, &seed);
	fill_codes(sh13, (size_t)2 * Ish * D, tab, &seed);
	fill_codes(sh2, (size_t)D * Ish, tab, &seed);
	fill_scales(s13, ns13 * E, &seed);
	fill_scales(s2, ns2 * E, &seed);
	fill_scales(shs13, (size_t)(2 * Ish / 128) * (D / 128), &seed);
	fill_scales(shs2, (size_t)(D / 128) * (Ish / 128), &seed);
	fill_normal_bf16(gate, (size_t)E * D, 1.0f / sqrtf((float)D), &seed); /* logits ~ N(0, 1) */
	fill_normal_bf16(xh, (size_t)T * D, 1.0f, &seed);
	for (int e = 0; e < E; e++)
		bias[e] = ((float)(test_rand(&seed) % 2001) - 1000.0f) * 1e-5f;

	/* the CPU's view: w1 = rows [0, I) of the fused matrix, w3 = rows [I, 2I) */
	struct fp8_linear *ew1 = calloc((size_t)E, sizeof *ew1), *ew3 = calloc((size_t)E, sizeof *ew3),
			  *ew2 = calloc((size_t)E, sizeof *ew2);
	REQUIRE(ew1 && ew3 && ew2);
	for (int e = 0; e < E; e++) {
		const uint8_t *m13 = w13 + n13 * (e % sets);
		ew1[e] = (struct fp8_linear){m13, s13 + ns13 * e, I, D};
		ew3[e] = (struct fp8_linear){m13 + (size_t)I * D, s13 + ns13 * e + ns13 / 2, I, D};
		ew2[e] = (struct fp8_linear){w2 + n2 * (e % sets), s2 + ns2 * e, D, I};
	}
	struct layer_weights lw = {.is_moe = 1, .gate = {gate, E, D}, .gate_bias = bias,
				   .exp_w1 = ew1, .exp_w3 = ew3, .exp_w2 = ew2};
	lw.sh_w1 = (struct fp8_linear){sh13, shs13, Ish, D};
	lw.sh_w3 = (struct fp8_linear){sh13 + (size_t)Ish * D,
				       shs13 + (size_t)(Ish / 128) * (D / 128), Ish, D};
	lw.sh_w2 = (struct fp8_linear){sh2, shs2, D, Ish};
	float *f = malloc((size_t)T * D * 4), *y = malloc((size_t)T * D * 4),
	      *wts = malloc((size_t)T * K * 4), *logits = malloc((size_t)T * E * 4);
	int32_t *idx = malloc((size_t)T * K * 4);
	REQUIRE(f && y && wts && logits && idx);
	for (size_t i = 0; i < (size_t)T * D; i++)
		f[i] = bf16_to_f32(xh[i]);
	moe_forward(pool, c, &lw, f, T, y, idx, wts, logits);

	/* the device layout: fused W13 per expert, tables of addresses */
	gpu_ptr d_w13 = upload(g, w13, n13 * sets), d_w2 = upload(g, w2, n2 * sets),
		d_s13 = upload(g, s13, ns13 * E * 4), d_s2 = upload(g, s2, ns2 * E * 4),
		d_sh13 = upload(g, sh13, (size_t)2 * Ish * D), d_sh2 = upload(g, sh2, (size_t)D * Ish),
		d_shs13 = upload(g, shs13, (size_t)(2 * Ish / 128) * (D / 128) * 4),
		d_shs2 = upload(g, shs2, (size_t)(D / 128) * (Ish / 128) * 4),
		d_gate = upload(g, gate, (size_t)E * D * 2), d_bias = upload(g, bias, (size_t)E * 4),
		d_x = upload(g, xh, (size_t)T * D * 2);
	gpu_ptr *t13 = malloc((size_t)E * sizeof *t13), *ts13 = malloc((size_t)E * sizeof *ts13),
		*t2 = malloc((size_t)E * sizeof *t2), *ts2 = malloc((size_t)E * sizeof *ts2);
	REQUIRE(t13 && ts13 && t2 && ts2);
	for (int e = 0; e < E; e++) {
		t13[e] = d_w13 + n13 * (e % sets);
		ts13[e] = d_s13 + ns13 * e * 4;
		t2[e] = d_w2 + n2 * (e % sets);
		ts2[e] = d_s2 + ns2 * e * 4;
	}
	struct err er = {""};
	struct gpu_region reg;
	REQUIRE(gpu_region_reserve(g, &reg, "moe-test", (size_t)64 << 20, &er) == 0);
	REQUIRE(gpu_region_grow(g, &reg, (size_t)2 << 20, &er) == 0);
	struct cuda_moe_layer L;
	struct cuda_fp8_mat m_sh13 = {d_sh13, d_shs13, 2 * Ish, D}, m_sh2 = {d_sh2, d_shs2, D, Ish};
	int rc = cuda_moe_layer_init(g, &reg, c, d_gate, d_bias, t13, ts13, t2, ts2, m_sh13, m_sh2,
				     &L, &er);
	if (rc)
		printf("    cuda_moe_layer_init: %s\n", er.msg);
	REQUIRE(rc == 0);
	struct gpu_arena arena;
	REQUIRE(gpu_arena_init(g, &arena, cuda_moe_scratch_bytes(g, c, T), &er) == 0);
	struct cuda_moe_trace tr = {gpu_test_alloc((size_t)T * E * 4), gpu_test_alloc((size_t)T * K * 4),
				    gpu_test_alloc((size_t)T * K * 4)};
	/* the intermediates, stage by stage, from 64 rows (where the GEMMs change path) */
	struct cuda_moe_taps taps = {0, 0, 0};
	if (T >= 64)
		taps = (struct cuda_moe_taps){gpu_test_alloc((size_t)T * K * 2 * I * 2),
					      gpu_test_alloc((size_t)T * K * D * 2),
					      gpu_test_alloc((size_t)T * D * 2)};
	gpu_ptr d_y = gpu_test_alloc((size_t)T * D * 2);
	if (taps.gu)
		gpu_test_poison(g, taps.gu, (size_t)T * K * 2 * I * 2);
	gpu_test_poison(g, tr.logits, (size_t)T * E * 4);
	gpu_test_poison(g, tr.idx, (size_t)T * K * 4);
	gpu_test_poison(g, tr.wts, (size_t)T * K * 4);
	gpu_test_poison(g, d_y, (size_t)T * D * 2);
	rc = cuda_moe_forward_stages(g, &arena, c, &L, d_x, d_y, T, &tr, &taps, CUDA_MOE_ALL);
	if (rc)
		printf("    cuda_moe_forward: %d\n", rc);
	REQUIRE(rc == 0);
	REQUIRE(gpu_sync(g) == 0);
	CHECK_EQ_INT(arena.top, 0); /* scratch released */

	float *g_logits = malloc((size_t)T * E * 4), *g_wts = malloc((size_t)T * K * 4);
	int32_t *g_idx = malloc((size_t)T * K * 4);
	uint16_t *g_y = malloc((size_t)T * D * 2);
	REQUIRE(g_logits && g_wts && g_idx && g_y);
	REQUIRE(gpu_download(g, g_logits, tr.logits, (size_t)T * E * 4) == 0);
	REQUIRE(gpu_download(g, g_idx, tr.idx, (size_t)T * K * 4) == 0);
	REQUIRE(gpu_download(g, g_wts, tr.wts, (size_t)T * K * 4) == 0);
	REQUIRE(gpu_download(g, g_y, d_y, (size_t)T * D * 2) == 0);

	/* the separate kernels (CUDA_MOE_UNFUSED: no fused router, scatter, SwiGLU epilogue or
	 * combine in the chunk sum) give the same bytes */
	uint16_t *g_y2 = malloc((size_t)T * D * 2);
	REQUIRE(g_y2);
	run_block(g, &arena, c, &L, d_x, d_y, T, NULL, CUDA_MOE_UNFUSED, 0, g_y2);
	int64_t unfused_diff = count_diff(g_y2, g_y, (size_t)T * D);
	/* above 64 tokens (wgmma GEMMs): the paired grouped forms (clusters of 2 sharing copies) and
	 * the single-CTA ones give the same bytes (cuda_gemm_wgmma_set_paired(1 / 0) forces them;
	 * the default picks by size) */
	int64_t mc2_diff = 0;
	if (T > 64) {
		cuda_gemm_wgmma_set_paired(1);
		run_block(g, &arena, c, &L, d_x, d_y, T, NULL, 0, 0, g_y2);
		mc2_diff = count_diff(g_y2, g_y, (size_t)T * D);
		cuda_gemm_wgmma_set_paired(0);
		run_block(g, &arena, c, &L, d_x, d_y, T, NULL, 0, 0, g_y2);
		cuda_gemm_wgmma_set_paired(-1);
		mc2_diff += count_diff(g_y2, g_y, (size_t)T * D);
	}
	/* the decode step is captured into a CUDA graph: the block must capture (no host sync)
	 * and its replay must give the same bytes */
	int64_t graph_diff = -1;
	if (T <= 64) {
		run_block(g, &arena, c, &L, d_x, d_y, T, &tr, 0, 1, g_y2);
		graph_diff = count_diff(g_y2, g_y, (size_t)T * D);
	}
	/* the fast mode at decode sizes (graph-captured): against the CPU within the wgmma limits
	 * below, its graph replay the same bytes */
	uint16_t *g_yf = NULL;
	int64_t fast_graph_diff = 0;
	if (T <= 64) {
		g_yf = malloc((size_t)T * D * 2);
		REQUIRE(g_yf);
		/* the fast mode is the GEMM dispatch's: its wgmma consumers at these sizes */
		cuda_gemm_set_batch_invariant(g, 0);
		run_block(g, &arena, c, &L, d_x, d_y, T, NULL, 0, 0, g_yf);
		run_block(g, &arena, c, &L, d_x, d_y, T, NULL, 0, 1, g_y2);
		cuda_gemm_set_batch_invariant(g, 1);
		fast_graph_diff = count_diff(g_y2, g_yf, (size_t)T * D);
	}
	/* 1-3 tokens in the fast mode: the GEMMs, SwiGLU and combine in one launch
	 * (k_moe_gemv_block, a persistent grid meeting at grid-wide arrivals; its graph replays
	 * above) against the four launches (cuda_gemm_set_moe_block(0)): the same bits */
	int64_t one_diff = 0, one_path = 1;
	if (T <= 3) {
		cuda_gemm_set_batch_invariant(g, 0);
		const char *path = cuda_moe_path(g, c, T, 0);
		one_path = strstr(path, "in one launch: k_moe_gemv_block") != NULL;
		printf("    fast mode, %d token(s): %s\n", T, path);
		cuda_gemm_set_moe_block(0);
		run_block(g, &arena, c, &L, d_x, d_y, T, NULL, 0, 0, g_y2);
		cuda_gemm_set_moe_block(-1);
		cuda_gemm_set_batch_invariant(g, 1);
		one_diff = count_diff(g_y2, g_yf, (size_t)T * D);
		printf("    one launch against the four: %lld outputs differ\n", (long long)one_diff);
	}
	/* one token where the block routes itself, on the _r1 forms (cuda_gemm_set_moe_block_early
	 * 1: the router flags x complete, the blocks compute the shared expert's gate|up while it
	 * runs) and the _r1h forms (2: their stream held until that flag), eager and
	 * graph-replayed (the flag set and reset each replay): the same bits */
	int64_t early_diff = 0, early_path = 1;
	for (int form = 1; form <= 2 && T == 1; form++) {
		cuda_gemm_set_batch_invariant(g, 0);
		cuda_gemm_set_moe_block_early(form);
		const char *path = cuda_moe_path(g, c, T, 0);
		if (strstr(path, "k_moe_gate_logits1s")) { /* (where the block routes) */
			early_path &= strstr(path, "_r1") != NULL &&
				      (strstr(path, "_r1h") != NULL) == (form == 2);
			printf("    fast mode, early block (%d): %s\n", form, path);
			int64_t diff = 0;
			for (int graph = 0; graph < 2; graph++) {
				run_block(g, &arena, c, &L, d_x, d_y, T, NULL, 0, graph, g_y2);
				diff += count_diff(g_y2, g_yf, (size_t)T * D);
			}
			printf("    early block %d (eager, graph) against the default: %lld outputs "
			       "differ\n",
			       form, (long long)diff);
			early_diff += diff;
		}
		cuda_gemm_set_moe_block_early(-1);
		cuda_gemm_set_batch_invariant(g, 1);
	}
	CHECK_EQ_INT(one_path, 1);
	CHECK_EQ_INT(one_diff, 0);
	CHECK_EQ_INT(early_path, 1);
	CHECK_EQ_INT(early_diff, 0);
	free(g_y2);

	int64_t bad_logits = 0, bad_ids = 0, bad_w = 0, first_logit = -1, first_id = -1;
	double worst_logit = 0, worst_w = 0;
	for (size_t i = 0; i < (size_t)T * E; i++)
		if (memcmp(&g_logits[i], &logits[i], 4)) {
			double dd = fabs((double)g_logits[i] - logits[i]);
			worst_logit = dd > worst_logit || isnan(dd) ? dd : worst_logit;
			if (first_logit < 0)
				first_logit = (int64_t)i;
			bad_logits++;
		}
	for (int t = 0; t < T; t++) {
		if (memcmp(g_idx + (size_t)t * K, idx + (size_t)t * K, (size_t)K * 4)) {
			bad_ids++;
			if (first_id < 0)
				first_id = t;
			continue;
		}
		for (int n = 0; n < K; n++) {
			double w = wts[t * K + n], dw = fabs((double)g_wts[t * K + n] - w);
			double rel = dw / (fabs(w) > 0 ? fabs(w) : 1);
			worst_w = rel > worst_w || isnan(rel) ? rel : worst_w;
			bad_w += !(rel <= 4 * 0x1p-24);
		}
	}
	printf("    moe block D=%d I=%d E=%d top-%d (groups %d keep %d), T=%d:\n", D, I, E, K,
	       (int)c->n_group, (int)c->topk_group, T);
	printf("    logits: %lld of %lld differ from the CPU's (worst |d| %.3g, first at %lld)\n",
	       (long long)bad_logits, (long long)T * E, worst_logit, (long long)first_logit);
	printf("    expert ids: %lld tokens differ (first: token %lld); weights: worst rel %.3g, %lld "
	       "over 4 ulp\n", (long long)bad_ids, (long long)first_id, worst_w, (long long)bad_w);
	if (first_id >= 0) {
		printf("      token %lld cpu:", (long long)first_id);
		for (int n = 0; n < K; n++)
			printf(" %d", idx[first_id * K + n]);
		printf("  gpu:");
		for (int n = 0; n < K; n++)
			printf(" %d", g_idx[first_id * K + n]);
		printf("\n");
	}
	/* y: worst error relative to the row, fraction over one bf16 ulp, first bad element */
	const double limit = T <= 64 ? MOE_REL_LIMIT_MMA : MOE_REL_LIMIT_WGMMA;
	int64_t over1 = 0, first_bad = -1;
	double sum_rel = 0;
	for (int t = 0; t < T; t++) {
		double rms = gpu_row_rms(y + (size_t)t * D, D);
		for (int d = 0; d < D; d++) {
			size_t i = (size_t)t * D + d;
			int u = bf16_ulps(f32_to_bf16(y[i]), g_y[i]);
			double rel = fabs((double)bf16_to_f32(g_y[i]) - y[i]) / (rms > 0 ? rms : 1);
			over1 += u > 1;
			sum_rel += rel;
			if (first_bad < 0 && u > 1 && !(rel <= limit)) {
				first_bad = (int64_t)i;
				printf("      first bad y[%d, %d]: cpu %.6g gpu %.6g (row rms %.4g)\n", t, d,
				       y[i], bf16_to_f32(g_y[i]), rms);
			}
		}
	}
	int64_t bad_y = gpu_count_bad_bf16(y, g_y, T, D, limit, "    y");
	int64_t bad_fast = 0;
	double fast_mean = 0;
	if (g_yf) {
		bad_fast = gpu_count_bad_bf16(y, g_yf, T, D, MOE_REL_LIMIT_WGMMA, "    y (fast mode)");
		for (int t = 0; t < T; t++) {
			double rms = gpu_row_rms(y + (size_t)t * D, D);
			for (int d = 0; d < D; d++) {
				size_t i = (size_t)t * D + d;
				fast_mean += fabs((double)bf16_to_f32(g_yf[i]) - y[i]) / (rms > 0 ? rms : 1);
			}
		}
		fast_mean /= (double)T * D;
		printf("    fast mode: mean |err|/rms(row) %.3g (limit %.3g), graph replay: %lld outputs "
		       "differ\n", fast_mean, MOE_MEAN_LIMIT_WGMMA, (long long)fast_graph_diff);
	}
	printf("    y: %.3f%% of outputs over 1 bf16 ulp, mean |err|/rms(row) %.3g (limit %.3g of "
	       "the row's RMS beyond 1 ulp: %s GEMMs)\n",
	       100.0 * (double)over1 / ((double)T * D), sum_rel / ((double)T * D), limit,
	       T <= 64 ? "mma.sync" : "wgmma-based");
	if (graph_diff >= 0)
		printf("    graph-captured block, replayed: %lld outputs differ from the direct run\n",
		       (long long)graph_diff);
	printf("    separate kernels (CUDA_MOE_UNFUSED): %lld outputs differ from the fused run\n",
	       (long long)unfused_diff);
	if (T > 64)
		printf("    paired / single-CTA grouped GEMMs (cuda_gemm_wgmma_set_paired 1 / 0): %lld "
		       "outputs differ\n",
		       (long long)mc2_diff);
	CHECK_EQ_INT(bad_logits, 0);
	CHECK(graph_diff <= 0);
	CHECK_EQ_INT(unfused_diff, 0);
	CHECK_EQ_INT(mc2_diff, 0);
	CHECK_EQ_INT(bad_fast, 0);
	CHECK(fast_mean < MOE_MEAN_LIMIT_WGMMA);
	CHECK_EQ_INT(fast_graph_diff, 0);
	CHECK_EQ_INT(bad_ids, 0);
	CHECK_EQ_INT(bad_w, 0);
	CHECK_EQ_INT(bad_y, 0);
	/* flips are not the rule (wgmma: run 12, config a at T = 300 / 512 / 700 / 1100: 24.7 / 24.5
	 * / 25.4 / 24.3% of the outputs more than 1 ulp off, all within the limits above; a wrong
	 * expert, weight or row moves nearly every output of its row) */
	CHECK((double)over1 < (T <= 64 ? 0.02 : 0.35) * T * D);
	CHECK(sum_rel / ((double)T * D) < (T <= 64 ? MOE_REL_LIMIT_MMA : MOE_MEAN_LIMIT_WGMMA));

	if (taps.gu)
		check_stages(g, pool, &lw, c, f, T, idx, &taps);
	/* the fast routers: 1 token, 2 .. 16 (k_moe_gate_route_t), from 17 the logits in parts of K
	 * (k_moe_gate_logits_ks) on the real routing shape; the exact kernels otherwise */
	check_fast_block(g, &arena, c, &L, d_x, d_y, T, &tr, f, gate, bias, logits, idx, y);
	const struct moe_dev dev = {d_gate, d_bias, t13, ts13, t2, ts2, m_sh13, m_sh2};
	check_ep(g, pool, &arena, &reg, c, &lw, &dev, &L, d_x, T, f, idx, wts, y, g_y);

	gpu_ptr all[] = {d_w13, d_w2, d_s13, d_s2, d_sh13, d_sh2, d_shs13, d_shs2, d_gate, d_bias,
			 d_x, tr.logits, tr.idx, tr.wts, d_y, taps.gu, taps.ey, taps.sh};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		if (all[i])
			cu.cuMemFree(all[i]);
	gpu_arena_free(g, &arena);
	gpu_region_free(g, &reg);
	free(w13), free(w2), free(s13), free(s2), free(sh13), free(sh2), free(shs13), free(shs2);
	free(gate), free(xh), free(bias), free(ew1), free(ew3), free(ew2), free(f), free(y);
	free(wts), free(logits), free(idx), free(t13), free(ts13), free(t2), free(ts2);
	free(g_logits), free(g_wts), free(g_idx), free(g_y), free(g_yf);
}

/* A MoE config: hidden D, expert width I, E experts in G groups (keep tg), top-K, 1 shared. */
static struct dsv32_config moe_config(int D, int I, int E, int G, int tg, int K)
{
	return (struct dsv32_config){.hidden_size = D, .moe_intermediate_size = I,
				     .n_routed_experts = E, .n_shared_experts = 1,
				     .num_experts_per_tok = K, .n_group = G, .topk_group = tg,
				     .norm_topk_prob = 1, .routed_scaling_factor = 2.5};
}

/* Each case against the CPU on a pool of the machine's cores: configs[i] at Ts[i] rows with
 * sets[i] distinct expert code sets. */
static void check_blocks(const struct dsv32_config *configs, const int *Ts, const int *sets,
			 int n, uint64_t seed)
{
	struct gpu g;
	gpu_test_open(&g);
	long nproc = sysconf(_SC_NPROCESSORS_ONLN);
	struct cpu_pool *pool = cpu_pool_start(nproc < 1 ? 1 : nproc > 32 ? 32 : (int)nproc);
	for (int i = 0; i < n; i++)
		check_block(&g, pool, &configs[i], Ts[i], sets[i], seed + (uint64_t)i);
	cpu_pool_stop(pool);
	gpu_close(&g);
}

TEST_T(gpu_moe_block, small_configs_match_cpu, 120)
{
	/* a: hidden 512, inter 512, 32 experts in 4 groups, keep 2, top-6; b: the tiny model's
	 * routing: hidden 256, inter 128, 16 experts, 4 groups, keep 2, top-4 */
	const struct dsv32_config a = moe_config(512, 512, 32, 4, 2, 6),
				  b = moe_config(256, 128, 16, 4, 2, 4);
	/* (a at T = 300 / 512 / 700 / 1100: 1800 / 3072 / 4200 / 6600 routed rows on 32 groups,
	 * the token-wide grouped GEMMs (gate|up, then k_moe_swiglu_quant; down) and the shared
	 * expert's on the dense dispatch; at 700 and 1100 the many-block permutation, at 1100 the
	 * 64-token router tiles) */
	const struct dsv32_config configs[] = {a, a, a, a, a, b, b, a, a};
	static const int Ts[] = {1, 5, 64, 300, 512, 1, 37, 700, 1100},
			 sets[] = {32, 32, 32, 32, 32, 16, 16, 32, 32};
	check_blocks(configs, Ts, sets, 9, 5000);
}

TEST_T(gpu_moe_block, shared_as_group_match_cpu, 90)
{
	/* the shared expert as group E of the grouped GEMMs (cuda_moe_set_shared_dense(0); by
	 * default its GEMMs run on the dense dispatch above 64 tokens) at T = 300 and 1100 */
	const struct dsv32_config a = moe_config(512, 512, 32, 4, 2, 6);
	const struct dsv32_config configs[] = {a, a};
	static const int Ts[] = {300, 1100}, sets[] = {32, 32};
	cuda_moe_set_shared_dense(0);
	check_blocks(configs, Ts, sets, 2, 5400);
}

TEST_T(gpu_moe_block, router_one_token_match_cpu, 60)
{
	/* the real routing shape (256 experts in 8 groups, keep 4, top-8) on a narrow model (hidden
	 * 1024, inter 128): T = 1 runs the fused routers (k_moe_gate_route1; in the fast mode
	 * k_moe_gate_route1s), T = 2 and 3 the separate kernels (in the fast mode the few-token
	 * router, k_moe_gate_route_t); small enough for compute-sanitizer */
	const struct dsv32_config c = moe_config(1024, 128, 256, 8, 4, 8);
	const struct dsv32_config configs[] = {c, c, c};
	static const int Ts[] = {1, 2, 3}, sets[] = {16, 16, 16};
	check_blocks(configs, Ts, sets, 3, 5300);
}

TEST_T(gpu_moe_block, router_prefill_match_cpu, 90)
{
	/* the real routing shape on the narrow model above 64 tokens: in the fast mode the logits in
	 * 4 parts of K (k_moe_gate_logits_ks64 at these T) routed on their sum (k_moe_route_wsum),
	 * checked by check_fast_block against the CPU's products, its routing of them and its y */
	const struct dsv32_config c = moe_config(1024, 128, 256, 8, 4, 8);
	const struct dsv32_config configs[] = {c, c};
	static const int Ts[] = {130, 600}, sets[] = {16, 16};
	check_blocks(configs, Ts, sets, 2, 5350);
}

TEST_T(gpu_moe_block, real_dims_match_cpu, 180)
{
	/* T = 1: the fused router (k_moe_gate_route1; in the fast mode k_moe_gate_route1s); others
	 * the separate kernels; every T <= 64 also through a CUDA graph, and at 1 and from 8 in the
	 * fast mode; at 1 and 2 the fast mode's block in one launch (k_moe_gemv_block) */
	const struct dsv32_config c = moe_config(7168, 2048, 256, 8, 4, 8);
	const struct dsv32_config configs[] = {c, c, c, c, c, c};
	static const int Ts[] = {1, 4, 8, 16, 24, 2}, sets[] = {8, 8, 8, 8, 8, 8};
	check_blocks(configs, Ts, sets, 6, 5200);
}

/* k_moe_swiglu_quant with its silu table against silu computed (kernels_ptx/moe_block.cu): the
 * same e4m3 codes and scales, to the bit, where g takes every bf16 code (zeros, subnormals,
 * infinities, NaNs and the table's edges among them) against random u, on a grid of 3 blocks
 * (each block many pairs: the next pair's loads in flight) and on rows with an odd count of
 * groups (the second half of the last pair idle). */
static void swiglu_table_case(struct gpu *g, int I, int rows, uint64_t seed)
{
	const size_t n = (size_t)rows * I, KBo = (size_t)I / 128;
	uint16_t *gu = malloc(2 * n * 2);
	uint8_t *a = malloc(n), *b = malloc(n);
	float *sa = malloc(rows * KBo * 4), *sb = malloc(rows * KBo * 4);
	REQUIRE(gu && a && b && sa && sb);
	for (size_t r = 0, code = 0; r < (size_t)rows; r++)
		for (int j = 0; j < I; j++, code++) {
			gu[r * 2 * I + j] = (uint16_t)(code * 40503u); /* every code once a 65536 */
			gu[r * 2 * I + I + j] = f32_to_bf16(
				(float)((test_rand(&seed) >> 40) * (4.0 / (1ull << 24))) - 2.0f);
		}
	gpu_ptr dgu = gpu_test_alloc(2 * n * 2), h8[2], hs[2];
	REQUIRE(gpu_upload(g, dgu, gu, 2 * n * 2) == 0);
	long long groups = (long long)rows * (long long)KBo;
	for (int table = 0; table < 2; table++) {
		h8[table] = gpu_test_alloc(n), hs[table] = gpu_test_alloc(rows * KBo * 4);
		gpu_test_poison(g, h8[table], n), gpu_test_poison(g, hs[table], rows * KBo * 4);
		int Ii = I, tab = table;
		void *args[] = {&dgu, &h8[table], &hs[table], &Ii, &groups, &tab};
		const unsigned grid = table ? 3 : (unsigned)((groups + 15) / 16);
		REQUIRE(gpu_launch(g, gpu_kernel(g, "k_moe_swiglu_quant"), grid, 1, 1, 256, 1, 1, 0,
				   args) == 0);
	}
	REQUIRE(gpu_sync(g) == 0);
	REQUIRE(gpu_download(g, a, h8[0], n) == 0 && gpu_download(g, b, h8[1], n) == 0);
	REQUIRE(gpu_download(g, sa, hs[0], rows * KBo * 4) == 0);
	REQUIRE(gpu_download(g, sb, hs[1], rows * KBo * 4) == 0);
	long long bad8 = 0, bads = 0;
	for (size_t i = 0; i < n; i++)
		bad8 += a[i] != b[i];
	for (size_t i = 0; i < rows * KBo; i++)
		bads += memcmp(&sa[i], &sb[i], 4) != 0;
	printf("    silu table, I=%d rows=%d: %lld of %zu codes and %lld of %zu scales differ from "
	       "silu computed\n",
	       I, rows, bad8, n, bads, rows * KBo);
	CHECK_EQ_INT(bad8, 0);
	CHECK_EQ_INT(bads, 0);
	for (int t = 0; t < 2; t++)
		cu.cuMemFree(h8[t]), cu.cuMemFree(hs[t]);
	cu.cuMemFree(dgu);
	free(gu), free(a), free(b), free(sa), free(sb);
}

TEST_T(gpu_moe_block, swiglu_table_exact, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	swiglu_table_case(&g, 2048, 64, 5400); /* 2 x every code */
	swiglu_table_case(&g, 384, 171, 5401); /* 3 groups a row: the last pair half idle */
	gpu_close(&g);
}

#endif
