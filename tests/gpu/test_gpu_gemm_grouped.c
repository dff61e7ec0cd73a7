/*
 * test_gpu_gemm_grouped.c — the grouped FP8 GEMM (MoE experts, model/cuda_gemm.h
 * cuda_gemm_fp8_grouped) against cpu_fp8_linear group by group on fresh random inputs: random
 * row offsets with empty groups (whose weight pointers are NULL, so reading one faults), a group
 * of more than 64 rows, and the real expert shapes with 256 groups. Each group's rows must also
 * equal, bit for bit, the dense GEMM (cuda_gemm_fp8) of the same rows and weight (the numbers of
 * a row do not depend on its group's other rows).
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/cpu_ops.h"
#include "model/cpu_pool.h"
#include "model/cuda_gemm.h"

/* Random bf16-representable activations, a per-row magnitude over many binades. */
static void fill_rows(float *x, int64_t rows, int64_t cols, uint64_t *seed)
{
	for (int64_t r = 0; r < rows; r++) {
		float amp = ldexpf(1.0f, (int)(test_rand(seed) % 24) - 16);
		for (int64_t i = 0; i < cols; i++) {
			float u = (float)((test_rand(seed) >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
			x[r * cols + i] = bf16_round(u * amp);
		}
	}
}

/* The dense GEMM (cuda_gemm_fp8) of each group's first <= 64 rows with the group's weight,
 * against the grouped result yg: bit for bit. */
static void check_dense_equal(struct gpu *g, int G, const int *rows, const int *off, int N, int K,
			      const gpu_ptr *dW, const gpu_ptr *dS, gpu_ptr dx, gpu_ptr dsx,
			      gpu_ptr ddy, const uint16_t *yg, uint16_t *yd)
{
	const size_t KB = (size_t)K / 128;
	size_t dwsb = 0;
	for (int m = 1; m <= 64; m++) {
		size_t b = cuda_gemm_fp8_workspace(g, m, N, K);
		dwsb = b > dwsb ? b : dwsb;
	}
	gpu_ptr ddws = gpu_test_alloc(dwsb);
	int64_t differ = 0, first = -1;
	unsigned first_dense = 0;
	for (int e = 0; e < G; e++) {
		int m = rows[e] < 64 ? rows[e] : 64;
		if (!m)
			continue;
		gpu_test_poison(g, ddy, (size_t)m * N * 2);
		REQUIRE(cuda_gemm_fp8(g, dW[e], dS[e], dx + (size_t)off[e] * K,
				      dsx + (size_t)off[e] * KB * 4, ddy, m, N, K, N, ddws, dwsb) == 0);
		REQUIRE(gpu_download(g, yd, ddy, (size_t)m * N * 2) == 0);
		for (size_t i = 0; i < (size_t)m * N; i++)
			if (yd[i] != yg[(size_t)off[e] * N + i]) {
				if (first < 0)
					first = (int64_t)off[e] * N + (int64_t)i, first_dense = yd[i];
				differ++;
			}
	}
	if (first >= 0)
		printf("    dense vs grouped: %lld outputs differ, first at row %lld col %lld: "
		       "dense %04x, grouped %04x\n", (long long)differ, (long long)(first / N),
		       (long long)(first % N), first_dense, yg[first]);
	else
		printf("    dense vs grouped: bit-identical\n");
	CHECK_EQ_INT(differ, 0);
	cu.cuMemFree(ddws);
}

/* G groups with rows[e] rows each (0: empty, weight pointer NULL); N x K weights; one CPU
 * reference (cpu_fp8_linear per group, on the pool) against each kernel: exact = 1: the
 * streaming kernel called directly: its mma.sync consumers with 1 and 2 MMA tiles per warp, each
 * group's rows also bit-equal to the dense GEMM's (cuda_gemm_fp8 on the same kernel), and its
 * wgmma consumers (CPU check within the wgmma limit); exact = 0: cuda_gemm_fp8_grouped's
 * dispatch (wgmma for many rows where enabled), CPU check only. */
static void check_grouped(struct gpu *g, struct cpu_pool *pool, int G, const int *rows, int N,
			  int K, uint64_t seed, int exact)
{
	const size_t KB = (size_t)K / 128, NB = (size_t)N / 128 + (N % 128 != 0);
	int *off = malloc((size_t)(G + 1) * sizeof *off);
	off[0] = 0;
	for (int e = 0; e < G; e++)
		off[e + 1] = off[e] + rows[e];
	const int R = off[G], max_rows = R + 3; /* a bound above the real count, as callers pass */
	float *x = malloc((size_t)max_rows * K * 4), *sx = malloc((size_t)max_rows * KB * 4),
	      *y = malloc((size_t)max_rows * N * 4);
	uint8_t *xq = malloc((size_t)max_rows * K), *W = malloc((size_t)N * K);
	float *S = malloc(NB * KB * 4);
	uint16_t *yg = malloc((size_t)max_rows * N * 2), *yd = malloc((size_t)64 * N * 2);
	fill_rows(x, max_rows, K, &seed);
	for (int m = 0; m < max_rows; m++)
		cpu_act_quant(x + (size_t)m * K, K, xq + (size_t)m * K, sx + (size_t)m * KB);
	uint64_t *wt = calloc((size_t)G, 8), *st = calloc((size_t)G, 8);
	gpu_ptr *dW = calloc((size_t)G, sizeof *dW), *dS = calloc((size_t)G, sizeof *dS);
	for (int e = 0; e < G; e++) {
		if (!rows[e])
			continue; /* NULL pointers: a kernel that reads an empty group's weights faults */
		for (size_t i = 0; i < (size_t)N * K; i++) {
			uint8_t b = (uint8_t)test_rand(&seed);
			W[i] = (b & 0x80) | ((b & 0x7f) % 0x70); /* any code but NaN */
		}
		for (size_t i = 0; i < NB * KB; i++)
			S[i] = ldexpf(1.0f, -(int)(test_rand(&seed) % 6) - 8);
		dW[e] = gpu_test_alloc((size_t)N * K);
		dS[e] = gpu_test_alloc(NB * KB * 4);
		REQUIRE(gpu_upload(g, dW[e], W, (size_t)N * K) == 0);
		REQUIRE(gpu_upload(g, dS[e], S, NB * KB * 4) == 0);
		wt[e] = dW[e], st[e] = dS[e];
		struct fp8_linear L = {W, S, N, K};
		cpu_fp8_linear(pool, &L, x + (size_t)off[e] * K, rows[e], y + (size_t)off[e] * N);
	}
	gpu_ptr dwt = gpu_test_alloc((size_t)G * 8), dst = gpu_test_alloc((size_t)G * 8),
		doff = gpu_test_alloc((size_t)(G + 1) * 4), dx = gpu_test_alloc((size_t)max_rows * K),
		dsx = gpu_test_alloc((size_t)max_rows * KB * 4),
		dy = gpu_test_alloc((size_t)max_rows * N * 2), ddy = gpu_test_alloc((size_t)64 * N * 2);
	REQUIRE(gpu_upload(g, dwt, wt, (size_t)G * 8) == 0);
	REQUIRE(gpu_upload(g, dst, st, (size_t)G * 8) == 0);
	REQUIRE(gpu_upload(g, doff, off, (size_t)(G + 1) * 4) == 0);
	REQUIRE(gpu_upload(g, dx, xq, (size_t)max_rows * K) == 0);
	REQUIRE(gpu_upload(g, dsx, sx, (size_t)max_rows * KB * 4) == 0);
	size_t wsb = cuda_gemm_fp8_grouped_workspace(g, max_rows, G, N, K);
	gpu_ptr dws = wsb ? gpu_test_alloc(wsb) : 0;
	/* exact: the streaming kernel's mma.sync consumers with 1 and 2 MMA tiles per warp (RT),
	 * then its wgmma consumers (the fast mode's; within the wgmma limit) with the K chunks
	 * summed in the kernel and as dispatched; not exact: the dispatch */
	static const struct {
		const char *name;
		int rt, wi, fused, mma_sync;
	} vs[] = {{"stream rt=1", 1, -1, -1, 1},	    {"stream rt=2", 2, -1, -1, 1},
		  {"stream wg, fused sum", 1, 2, 1, 0}, {"stream wg", 1, 2, -1, 0},
		  {"dispatch", 0, -1, -1, 0}};
	cuda_gemm_set_stream(1); /* the dense GEMM of check_dense_equal: the streaming kernel */
	for (int v = exact ? 0 : 4; v < (exact ? 4 : 5); v++) {
		cuda_gemm_set_stream_rt(vs[v].rt);
		cuda_gemm_set_stream_wi(vs[v].wi);
		cuda_gemm_set_stream_diag(vs[v].fused, 0);
		gpu_test_poison(g, dy, (size_t)max_rows * N * 2);
		if (exact)
			REQUIRE(cuda_gemm_fp8_grouped_stream(g, dwt, dst, doff, G, dx, dsx, dy, max_rows,
							     N, K, N, dws, wsb) == 0);
		else
			REQUIRE(cuda_gemm_fp8_grouped(g, dwt, dst, doff, G, dx, dsx, dy, max_rows, N, K,
						      N, dws, wsb) == 0);
		REQUIRE(gpu_sync(g) == 0);
		REQUIRE(gpu_download(g, yg, dy, (size_t)max_rows * N * 2) == 0);
		char what[96];
		snprintf(what, sizeof what, "%s G=%d rows=%d N=%d K=%d", vs[v].name, G, R, N, K);
		/* the mma.sync kernels: within fp32 summation order (1 ulp, 2^-12 of the row RMS);
		 * the dispatch's wgmma path: Hopper's wgmma keeps ~14 bits when it adds a k32 step's
		 * FP8 products (run 1, every wgmma path incl. cuBLASLt's), so 2^-5 of the row RMS on
		 * these wide-range operands, as the MoE block's test allows above 64 rows */
		CHECK_EQ_INT(vs[v].mma_sync ? gpu_gemm_count_bad(y, yg, R, N, what)
					    : gpu_count_bad_bf16(y, yg, R, N, 1.0 / 32, what),
			     0);
		/* each group's rows equal the dense GEMM's with the same weight (the mma.sync
		 * kernels; the fast mode's wgmma variant makes no such promise) */
		if (vs[v].mma_sync)
			check_dense_equal(g, G, rows, off, N, K, dW, dS, dx, dsx, ddy, yg, yd);
	}
	cuda_gemm_set_stream(-1);
	cuda_gemm_set_stream_rt(0);
	cuda_gemm_set_stream_wi(-1);
	cuda_gemm_set_stream_diag(-1, 0);
	for (int e = 0; e < G; e++)
		if (rows[e])
			cu.cuMemFree(dW[e]), cu.cuMemFree(dS[e]);
	if (dws)
		cu.cuMemFree(dws);
	cu.cuMemFree(dwt), cu.cuMemFree(dst), cu.cuMemFree(doff);
	cu.cuMemFree(dx), cu.cuMemFree(dsx), cu.cuMemFree(dy), cu.cuMemFree(ddy);
	free(off), free(x), free(sx), free(y), free(xq), free(W), free(S), free(yg), free(yd);
	free(wt), free(st), free(dW), free(dS);
}

struct gcase {
	int G;
	const int *rows;
	int N, K;
	uint64_t seed;
	int exact;
};

/* Each case on one GPU and one CPU pool. */
static void run_grouped(const struct gcase *cs, int n)
{
	struct gpu g;
	gpu_test_open(&g);
	struct cpu_pool *pool = cpu_pool_start(16);
	REQUIRE(pool);
	for (int i = 0; i < n; i++)
		check_grouped(&g, pool, cs[i].G, cs[i].rows, cs[i].N, cs[i].K, cs[i].seed,
			      cs[i].exact);
	cpu_pool_stop(pool);
	gpu_close(&g);
}

/* Empty groups first, last and in between; groups of more than 64 rows; K chunked (2112 x
 * 7168) and not. */
TEST_T(gpu_gemm_grouped, small_groups_vs_cpu, 60)
{
	static const int rows[] = {0, 3, 100, 0, 0, 1, 17, 64, 0, 9, 0}, rows2[] = {5},
			 rows3[] = {0, 0, 130};
	const struct gcase cs[] = {{11, rows, 384, 1024, 900, 1},
				   {1, rows2, 7168, 2048, 901, 1},
				   {3, rows3, 2112, 7168, 904, 1}};
	run_grouped(cs, 3);
}

/* 8000 groups, two with rows, K chunked: more arrival counts than the streaming kernel's fused
 * chunk sum has (slices x tiles x warps > 2^20), so the chunks are summed by a second launch;
 * equal to the dense GEMM's fused sum. */
TEST_T(gpu_gemm_grouped, many_groups_vs_cpu, 60)
{
	static int many[8000];
	many[5] = 3, many[7000] = 9;
	const struct gcase c = {8000, many, 2112, 7168, 906, 1};
	run_grouped(&c, 1);
}

/* The dispatch with many rows per group (the wgmma kernel). */
TEST_T(gpu_gemm_grouped, dispatch_many_rows_vs_cpu, 60)
{
	static const int rows4[] = {200, 0, 77, 300, 1};
	const struct gcase c = {5, rows4, 512, 1024, 905, 0};
	run_grouped(&c, 1);
}

/* The real expert shapes: 256 experts, a decode step of 5 tokens x 8 experts, several experts
 * shared by tokens, most experts empty. */
TEST_T(gpu_gemm_grouped, expert_shapes_vs_cpu, 60)
{
	static int rows[256];
	uint64_t seed = 77;
	for (int i = 0; i < 40; i++)
		rows[(test_rand(&seed) % 32) * 8 + 3]++; /* 40 rows over <= 32 experts */
	const struct gcase cs[] = {{256, rows, 4096, 7168, 902, 1}, {256, rows, 7168, 2048, 903, 1}};
	run_grouped(cs, 2);
}

/* The one-row kernel's grouped form (cuda_gemm_fp8_grouped in the fast mode with
 * cuda_gemm_set_gemv(2), at most 16 rows) against the CPU: the one-token MoE shapes (8 experts
 * of 1 row + the shared expert, 257 groups; gate|up with K chunked, down), groups of more than 8
 * rows (two slices), empty groups first and last, a 16-row tile alone. */
TEST_T(gpu_gemm_grouped, gemv_grouped_vs_cpu, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	struct cpu_pool *pool = cpu_pool_start(16);
	REQUIRE(pool);
	cuda_gemm_set_batch_invariant(&g, 0);
	cuda_gemm_set_gemv(2);
	static int moe[257];
	for (int k = 0; k < 8; k++)
		moe[k * 31 + 2] = 1;
	moe[256] = 1;
	static const int rows2[] = {0, 10, 0, 2, 0}, rows3[] = {2, 1};
	check_grouped(&g, pool, 5, rows2, 576, 1536, 910, 0);
	check_grouped(&g, pool, 2, rows3, 16, 256, 911, 0);
	check_grouped(&g, pool, 257, moe, 7168, 2048, 912, 0);
	check_grouped(&g, pool, 257, moe, 4096, 7168, 913, 0);
	cuda_gemm_set_gemv(-1);
	cuda_gemm_set_batch_invariant(&g, 1);
	cpu_pool_stop(pool);
	gpu_close(&g);
}

/* The operands of the fused chunk-sum tests: `rows` activation rows quantised 1x128 (xq, sx),
 * then G random N x K e4m3 weights (finite codes) with power-of-two block scales uploaded to
 * dW / dS, their addresses in wt / st. */
static void fused_operands(struct gpu *g, int G, int N, int K, int rows, uint64_t *seed,
			   uint8_t *xq, float *sx, gpu_ptr *dW, gpu_ptr *dS, uint64_t *wt,
			   uint64_t *st)
{
	const int KB = K / 128;
	uint8_t *W = malloc((size_t)N * K);
	float *S = malloc((size_t)(N / 128) * KB * 4), *x = malloc((size_t)K * 4);
	REQUIRE(W && S && x);
	for (int m = 0; m < rows; m++) {
		fill_rows(x, 1, K, seed);
		cpu_act_quant(x, K, xq + (size_t)m * K, sx + (size_t)m * KB);
	}
	for (int e = 0; e < G; e++) {
		for (size_t i = 0; i < (size_t)N * K; i++) {
			uint8_t b = (uint8_t)test_rand(seed);
			W[i] = (b & 0x80) | ((b & 0x7f) % 0x70);
		}
		for (int i = 0; i < (N / 128) * KB; i++)
			S[i] = ldexpf(1.0f, -(int)(test_rand(seed) % 6) - 8);
		dW[e] = gpu_test_alloc((size_t)N * K), dS[e] = gpu_test_alloc((size_t)(N / 128) * KB * 4);
		REQUIRE(gpu_upload(g, dW[e], W, (size_t)N * K) == 0);
		REQUIRE(gpu_upload(g, dS[e], S, (size_t)(N / 128) * KB * 4) == 0);
		wt[e] = dW[e], st[e] = dS[e];
	}
	free(W), free(S), free(x);
}

/* cuda_gemm_fp8_grouped_swiglu (SwiGLU + act_quant in the K-chunk sum) against
 * cuda_gemm_fp8_grouped then k_moe_swiglu_quant (kernels_ptx/moe_block.cu) on the same operands:
 * h8 and hs byte for byte, in the batch-invariant and the fast mode (also on the one-row
 * kernel: its fp32 sums as the one chunk); groups of 0-3 rows, K chunked. */
TEST_T(gpu_gemm_grouped, swiglu_in_chunk_sum, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	const int G = 6, N = 1024, K = 2048, I = N / 2, KB = K / 128;
	static const int rows[] = {1, 0, 3, 1, 2, 1};
	int off[7] = {0};
	for (int e = 0; e < G; e++)
		off[e + 1] = off[e] + rows[e];
	const int R = off[G], max_rows = R + 2;
	uint64_t seed = 4242;
	uint8_t *xq = malloc((size_t)max_rows * K);
	float *sx = malloc((size_t)max_rows * KB * 4);
	uint64_t wt[6], st[6];
	gpu_ptr dW[6], dS[6];
	fused_operands(&g, G, N, K, max_rows, &seed, xq, sx, dW, dS, wt, st);
	gpu_ptr dwt = gpu_test_alloc(G * 8), dst = gpu_test_alloc(G * 8),
		doff = gpu_test_alloc((G + 1) * 4), dx = gpu_test_alloc((size_t)max_rows * K),
		dsx = gpu_test_alloc((size_t)max_rows * KB * 4),
		dgu = gpu_test_alloc((size_t)max_rows * N * 2), dh = gpu_test_alloc((size_t)max_rows * I),
		dhs = gpu_test_alloc((size_t)max_rows * (I / 128) * 4),
		rh = gpu_test_alloc((size_t)max_rows * I),
		rhs = gpu_test_alloc((size_t)max_rows * (I / 128) * 4);
	REQUIRE(gpu_upload(&g, dwt, wt, G * 8) == 0 && gpu_upload(&g, dst, st, G * 8) == 0);
	REQUIRE(gpu_upload(&g, doff, off, (G + 1) * 4) == 0);
	REQUIRE(gpu_upload(&g, dx, xq, (size_t)max_rows * K) == 0);
	REQUIRE(gpu_upload(&g, dsx, sx, (size_t)max_rows * KB * 4) == 0);
	size_t wsb = cuda_gemm_fp8_grouped_workspace(&g, max_rows, G, N, K);
	REQUIRE(wsb > 0); /* K chunked: the fused form applies */
	gpu_ptr dws = gpu_test_alloc(wsb);
	uint8_t *h_ref = malloc((size_t)R * I), *h_got = malloc((size_t)R * I);
	float *s_ref = malloc((size_t)R * (I / 128) * 4), *s_got = malloc((size_t)R * (I / 128) * 4);
	static const char *const modes[] = {"batch-invariant", "fast", "fast, one-row kernel"};
	for (int mode = 0; mode < 3; mode++) {
		cuda_gemm_set_batch_invariant(&g, mode == 0);
		cuda_gemm_set_gemv(mode == 2 ? 3 : 0);
		gpu_test_poison(&g, rh, (size_t)max_rows * I);
		gpu_test_poison(&g, rhs, (size_t)max_rows * (I / 128) * 4);
		REQUIRE(cuda_gemm_fp8_grouped(&g, dwt, dst, doff, G, dx, dsx, dgu, max_rows, N, K, N,
					      dws, wsb) == 0);
		long long n_groups = (long long)R * (I / 128);
		int Ii = I, table = 0;
		void *args[] = {&dgu, &rh, &rhs, &Ii, &n_groups, &table};
		REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_swiglu_quant"),
				   (unsigned)((n_groups + 7) / 8), 1, 1, 256, 1, 1, 0, args) == 0);
		gpu_test_poison(&g, dh, (size_t)max_rows * I);
		gpu_test_poison(&g, dhs, (size_t)max_rows * (I / 128) * 4);
		int one_row = -1;
		REQUIRE(cuda_gemm_fp8_grouped_swiglu(&g, dwt, dst, doff, G, dx, dsx, dh, dhs, max_rows,
						     N, K, dws, wsb, &one_row) == 0);
		CHECK_EQ_INT(one_row, mode == 2); /* (what lets the down GEMM read off early) */
		REQUIRE(gpu_sync(&g) == 0);
		REQUIRE(gpu_download(&g, h_ref, rh, (size_t)R * I) == 0);
		REQUIRE(gpu_download(&g, h_got, dh, (size_t)R * I) == 0);
		REQUIRE(gpu_download(&g, s_ref, rhs, (size_t)R * (I / 128) * 4) == 0);
		REQUIRE(gpu_download(&g, s_got, dhs, (size_t)R * (I / 128) * 4) == 0);
		long long dh_n = 0, ds_n = 0, first = -1;
		for (long long i = 0; i < (long long)R * I; i++)
			if (h_ref[i] != h_got[i]) {
				first = first < 0 ? i : first;
				dh_n++;
			}
		ds_n = memcmp(s_ref, s_got, (size_t)R * (I / 128) * 4) != 0;
		printf("    swiglu in the chunk sum (%s mode) G=%d rows=%d N=%d K=%d: %lld of %lld h8 "
		       "bytes differ (first %lld), scales %s\n", modes[mode], G, R, N, K, dh_n,
		       (long long)R * I, first, ds_n ? "differ" : "equal");
		CHECK_EQ_INT(dh_n, 0);
		CHECK_EQ_INT(ds_n, 0);
	}
	cuda_gemm_set_gemv(-1);
	cuda_gemm_set_batch_invariant(&g, 1);
	for (int e = 0; e < G; e++)
		cu.cuMemFree(dW[e]), cu.cuMemFree(dS[e]);
	cu.cuMemFree(dwt), cu.cuMemFree(dst), cu.cuMemFree(doff), cu.cuMemFree(dx);
	cu.cuMemFree(dsx), cu.cuMemFree(dgu), cu.cuMemFree(dh), cu.cuMemFree(dhs);
	cu.cuMemFree(rh), cu.cuMemFree(rhs), cu.cuMemFree(dws);
	free(xq), free(sx), free(h_ref), free(h_got), free(s_ref), free(s_got);
	gpu_close(&g);
}

/* cuda_gemm_fp8_grouped_combine (the MoE combine in the K-chunk sum) against
 * cuda_gemm_fp8_grouped then k_moe_combine (kernels_ptx/moe_permute.cu) on the same operands:
 * y byte for byte, in both modes (the fast one also on the one-row kernel, with and without
 * the offsets read before the previous kernel completes: GV_OFF_EARLY). Two tokens, three
 * picks each over six experts (one expert picked by both), then the shared expert as group 6 on
 * rows R .. R + T - 1; K chunked. */
TEST_T(gpu_gemm_grouped, combine_in_chunk_sum, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	enum { G = 7, T = 2, TK = 3, R = T * TK, RT = R + T };
	const int N = 1024, K = 2048, KB = K / 128;
	static const int off[G + 1] = {0, 1, 1, 3, 4, 5, 6, 8};
	static const int perm[R] = {0, 1, 4, 2, 3, 5}; /* token t's picks in ascending expert id */
	const float wts[R] = {0.5f, 0.3125f, 0.1875f, 0.71875f, 0.25f, 0.03125f};
	uint64_t seed = 4343;
	uint8_t *xq = malloc((size_t)RT * K);
	float *sx = malloc((size_t)RT * KB * 4);
	uint64_t wt[G], st[G];
	gpu_ptr dW[G], dS[G];
	fused_operands(&g, G, N, K, RT, &seed, xq, sx, dW, dS, wt, st);
	gpu_ptr dwt = gpu_test_alloc(G * 8), dst = gpu_test_alloc(G * 8),
		doff = gpu_test_alloc((G + 1) * 4), dx = gpu_test_alloc((size_t)RT * K),
		dsx = gpu_test_alloc((size_t)RT * KB * 4), dey = gpu_test_alloc((size_t)RT * N * 2),
		dw = gpu_test_alloc(R * 4), dperm = gpu_test_alloc(R * 4),
		dref = gpu_test_alloc((size_t)T * N * 2), dy = gpu_test_alloc((size_t)T * N * 2);
	REQUIRE(gpu_upload(&g, dwt, wt, G * 8) == 0 && gpu_upload(&g, dst, st, G * 8) == 0);
	REQUIRE(gpu_upload(&g, doff, off, (G + 1) * 4) == 0);
	REQUIRE(gpu_upload(&g, dx, xq, (size_t)RT * K) == 0);
	REQUIRE(gpu_upload(&g, dsx, sx, (size_t)RT * KB * 4) == 0);
	REQUIRE(gpu_upload(&g, dw, wts, R * 4) == 0 && gpu_upload(&g, dperm, perm, R * 4) == 0);
	size_t wsb = cuda_gemm_fp8_grouped_workspace(&g, RT, G, N, K);
	REQUIRE(wsb > 0); /* K chunked: the fused form applies */
	gpu_ptr dws = gpu_test_alloc(wsb);
	uint16_t *y_ref = malloc((size_t)T * N * 2), *y_got = malloc((size_t)T * N * 2);
	static const char *const modes[] = {"batch-invariant", "fast", "fast, one-row kernel",
					    "fast, one-row kernel, offsets read early"};
	for (int mode = 0; mode < 4; mode++) {
		cuda_gemm_set_batch_invariant(&g, mode == 0);
		cuda_gemm_set_gemv(mode >= 2 ? 3 : 0);
		gpu_test_poison(&g, dref, (size_t)T * N * 2);
		REQUIRE(cuda_gemm_fp8_grouped(&g, dwt, dst, doff, G, dx, dsx, dey, RT, N, K, N, dws,
					      wsb) == 0);
		gpu_ptr sh = dey + (size_t)R * N * 2;
		int t_ = T, k_ = TK, n_ = N;
		void *args[] = {&dey, &dw, &dperm, &sh, &dref, &t_, &k_, &n_};
		REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_moe_combine"), (T * N + 255) / 256, 1, 1, 256,
				   1, 1, 0, args) == 0);
		REQUIRE(gpu_download(&g, y_ref, dref, (size_t)T * N * 2) == 0);
		gpu_test_poison(&g, dy, (size_t)T * N * 2);
		/* (off_early: the offsets were uploaded before any of these launches) */
		REQUIRE(cuda_gemm_fp8_grouped_combine(&g, dwt, dst, doff, G, dx, dsx, dy, T, TK, dw,
						      dperm, N, K, dws, wsb, mode == 3) == 0);
		REQUIRE(gpu_sync(&g) == 0);
		REQUIRE(gpu_download(&g, y_got, dy, (size_t)T * N * 2) == 0);
		long long differ = 0, first = -1;
		for (long long i = 0; i < (long long)T * N; i++)
			if (y_ref[i] != y_got[i]) {
				first = first < 0 ? i : first;
				differ++;
			}
		printf("    combine in the chunk sum (%s mode) T=%d top-k=%d N=%d K=%d: %lld of %lld "
		       "outputs differ (first %lld)\n",
		       modes[mode], T, TK, N, K, differ, (long long)T * N, first);
		CHECK_EQ_INT(differ, 0);
	}
	cuda_gemm_set_gemv(-1);
	cuda_gemm_set_batch_invariant(&g, 1);
	for (int e = 0; e < G; e++)
		cu.cuMemFree(dW[e]), cu.cuMemFree(dS[e]);
	cu.cuMemFree(dwt), cu.cuMemFree(dst), cu.cuMemFree(doff), cu.cuMemFree(dx);
	cu.cuMemFree(dsx), cu.cuMemFree(dey), cu.cuMemFree(dw), cu.cuMemFree(dperm);
	cu.cuMemFree(dref), cu.cuMemFree(dy), cu.cuMemFree(dws);
	free(xq), free(sx), free(y_ref), free(y_got);
	gpu_close(&g);
}

#endif
