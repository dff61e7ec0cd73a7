/*
 * test_gpu_wgmma.c — the wgmma FP8 GEMM (model/cuda_gemm_wgmma.c, kernels_ptx/gemm_fp8_wgmma.cu)
 * against the CPU backend's cpu_fp8_linear on the same quantised activations, with the limit of
 * tests/gpu/gemm_fp8_limit.h (wgmma's FP8 accumulation keeps ~14 bits per k32 step: the error is
 * bounded relative to the sum of |products|, 2^-9 of it; within 1 bf16 ulp always passes). Two
 * kinds of operands: WIDE (random e4m3 codes over the whole range, activation rows over 24
 * binades: the hardest case for that accumulation and for the per-row scales) and REAL
 * (weights N(0,1) quantised per 128x128 block as the checkpoint is, activations N(0,1)), where
 * the error must also stay under 2^-8 of the row's RMS. Small and odd shapes in full, the real
 * V3.2 shapes at M = 256 and 4096 on sampled rows (the CPU reference is slow), the grouped form
 * (MoE experts) with empty groups; and the timing of the issue-9 shapes at M = 4096 and of the
 * MoE prefill (issue 11), with cuBLASLt on the same operands.
 */
#include "tests/gpu/gemm_fp8_limit.h"

#ifndef DSV32_NO_CUDA

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/cpu_ops.h"
#include "model/cuda_gemm.h"
#include "model/cuda_gemm_wgmma.h"

static struct cpu_pool *test_pool(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return cpu_pool_start(n < 1 ? 1 : n > 64 ? 64 : (int)n);
}

/* One problem: host inputs (x in bf16 values, its act_quant codes and scales), device copies. */
struct wg_case {
	int M, N, K;
	uint8_t *W, *xq; /* [N, K], [M, K] e4m3 */
	float *S, *sx;   /* [ceil(N/128), K/128], [M, K/128] */
	float *x;        /* [M, K] the activations before quantisation (bf16 values) */
	gpu_ptr dW, dS, dx, dsx, dy;
	int real;        /* operands: 0 WIDE, 1 REAL (file header) */
	float *ref;      /* [ref_n, N] the CPU's result for rows ref_rows (kept between checks) */
	double *A;       /* [ref_n, N] the bound of gemm_fp8_limit.h for the same rows */
	int *ref_rows, ref_n;
};

enum { WIDE, REAL };

/* An approximately standard normal deviate, cheap (the operands of the big shapes are
 * hundreds of millions of values): the sum of four 16-bit uniforms of one test_rand draw,
 * centred and scaled to unit variance (Irwin-Hall; tails end at 3.46). */
static double gauss(uint64_t *seed)
{
	uint64_t r = test_rand(seed);
	double u = (double)(r & 0xffff) + (double)((r >> 16) & 0xffff) +
		   (double)((r >> 32) & 0xffff) + (double)(r >> 48);
	return (u / 65536.0 - 2.0) * 1.7320508075688772;
}

/* REAL weights: N(0,1), each 128x128 block quantised so its largest |w| maps to 448, S the
 * block's scale (weight_scale_inv = amax / 448). */
static void fill_weights_real(uint8_t *W, float *S, int N, int K, uint64_t *seed)
{
	int KB = K / 128, NB = (N + 127) / 128;
	float *blk = malloc(128 * 128 * sizeof *blk);
	REQUIRE(blk);
	for (int nb = 0; nb < NB; nb++)
		for (int kb = 0; kb < KB; kb++) {
			int rows = N - nb * 128 < 128 ? N - nb * 128 : 128;
			float amax = 0;
			for (int i = 0; i < rows * 128; i++) {
				blk[i] = (float)gauss(seed);
				amax = fmaxf(amax, fabsf(blk[i]));
			}
			float sc = amax / 448;
			S[nb * KB + kb] = sc;
			for (int r = 0; r < rows; r++)
				for (int k = 0; k < 128; k++)
					W[(size_t)(nb * 128 + r) * K + kb * 128 + k] =
						f32_to_e4m3(blk[r * 128 + k] / sc);
		}
	free(blk);
}

static void fill_weights(uint8_t *W, float *S, size_t nw, size_t ns, uint64_t *seed)
{
	for (size_t i = 0; i < nw; i += 8) {
		uint64_t r = test_rand(seed);
		for (size_t k = 0; k < 8 && i + k < nw; k++) {
			uint8_t b = (uint8_t)(r >> (8 * k));
			W[i + k] = (b & 0x80) | ((b & 0x7f) % 0x70); /* any code but NaN */
		}
	}
	for (size_t i = 0; i < ns; i++)
		S[i] = ldexpf(1.0f, -(int)(test_rand(seed) % 6) - 8);
}

/* rows over many binades, so the per-row scales matter */
static void fill_acts(float *x, int M, int K, uint64_t *seed)
{
	for (int m = 0; m < M; m++) {
		float amp = ldexpf(1.0f, (int)(test_rand(seed) % 24) - 16);
		for (int k = 0; k < K; k++) {
			float u = (float)((test_rand(seed) >> 40) * (1.0 / (1ull << 24))) * 2 - 1;
			x[(size_t)m * K + k] = bf16_round(u * amp);
		}
	}
}

/* REAL activations: bf16 N(0,1) */
static void fill_acts_real(float *x, size_t n, uint64_t *seed)
{
	for (size_t i = 0; i < n; i++)
		x[i] = bf16_round((float)gauss(seed));
}

static void case_init(struct wg_case *c, int M, int N, int K, int real, uint64_t seed)
{
	size_t KB = (size_t)K / 128, NB = (size_t)(N + 127) / 128;
	*c = (struct wg_case){.M = M, .N = N, .K = K, .real = real};
	c->W = malloc((size_t)N * K), c->xq = malloc((size_t)M * K);
	c->S = malloc(NB * KB * 4), c->sx = malloc((size_t)M * KB * 4);
	c->x = malloc((size_t)M * K * 4);
	REQUIRE(c->W && c->xq && c->S && c->sx && c->x);
	if (real) {
		fill_weights_real(c->W, c->S, N, K, &seed);
		fill_acts_real(c->x, (size_t)M * K, &seed);
	} else {
		fill_weights(c->W, c->S, (size_t)N * K, NB * KB, &seed);
		fill_acts(c->x, M, K, &seed);
	}
	for (int m = 0; m < M; m++)
		cpu_act_quant(c->x + (size_t)m * K, K, c->xq + (size_t)m * K, c->sx + (size_t)m * KB);
	c->dW = gpu_test_alloc((size_t)N * K), c->dS = gpu_test_alloc(NB * KB * 4);
	c->dx = gpu_test_alloc((size_t)M * K), c->dsx = gpu_test_alloc((size_t)M * KB * 4);
	c->dy = gpu_test_alloc((size_t)M * N * 2);
}

static void case_upload(struct gpu *g, struct wg_case *c)
{
	size_t KB = (size_t)c->K / 128, NB = (size_t)(c->N + 127) / 128;
	REQUIRE(gpu_upload(g, c->dW, c->W, (size_t)c->N * c->K) == 0);
	REQUIRE(gpu_upload(g, c->dS, c->S, NB * KB * 4) == 0);
	REQUIRE(gpu_upload(g, c->dx, c->xq, (size_t)c->M * c->K) == 0);
	REQUIRE(gpu_upload(g, c->dsx, c->sx, (size_t)c->M * KB * 4) == 0);
}

static void case_free(struct wg_case *c)
{
	cu.cuMemFree(c->dW), cu.cuMemFree(c->dS), cu.cuMemFree(c->dx), cu.cuMemFree(c->dsx);
	cu.cuMemFree(c->dy);
	free(c->W), free(c->xq), free(c->S), free(c->sx), free(c->x), free(c->ref), free(c->A);
	free(c->ref_rows);
}

/* Checks rows rows[0..n) of the GPU's y [M, N] (already in c->dy) against cpu_fp8_linear on the
 * same rows of x, with the limit of gemm_fp8_limit.h (REAL operands: also 2^-8 of the row RMS).
 * Returns the number of bad outputs. */
static int64_t check_rows(struct gpu *g, struct cpu_pool *pool, struct wg_case *c,
			  const int *rows, int n, const char *what)
{
	int N = c->N, K = c->K, KB = K / 128;
	if (!c->ref || c->ref_n != n || memcmp(c->ref_rows, rows, (size_t)n * sizeof *rows)) {
		float *xs = calloc((size_t)n * K, 4), *sxs = calloc((size_t)n * KB, 4);
		uint8_t *xqs = calloc((size_t)n * K, 1);
		free(c->ref), free(c->A), free(c->ref_rows);
		c->ref = malloc((size_t)n * N * 4), c->A = malloc((size_t)n * N * 8);
		c->ref_rows = malloc((size_t)n * sizeof *rows);
		REQUIRE(xs && sxs && xqs && c->ref && c->A && c->ref_rows);
		for (int i = 0; i < n; i++) {
			memcpy(xs + (size_t)i * K, c->x + (size_t)rows[i] * K, (size_t)K * 4);
			memcpy(xqs + (size_t)i * K, c->xq + (size_t)rows[i] * K, (size_t)K);
			memcpy(sxs + (size_t)i * KB, c->sx + (size_t)rows[i] * KB, (size_t)KB * 4);
		}
		struct fp8_linear L = {c->W, c->S, N, K};
		cpu_fp8_linear(pool, &L, xs, n, c->ref);
		gemm_fp8_absum(pool, c->W, c->S, N, K, xqs, sxs, n, c->A);
		memcpy(c->ref_rows, rows, (size_t)n * sizeof *rows);
		c->ref_n = n;
		free(xs), free(sxs), free(xqs);
	}
	uint16_t *got = malloc((size_t)n * N * 2);
	REQUIRE(got);
	for (int i = 0; i < n; i++)
		REQUIRE(gpu_download(g, got + (size_t)i * N, c->dy + (size_t)rows[i] * N * 2,
				     (size_t)N * 2) == 0);
	int64_t bad = gemm_fp8_count_bad_hw(c->ref, got, c->A, n, N, c->real ? 1.0 / 256 : 0, rows,
					    what);
	free(got);
	return bad;
}

/* The plain form's variants: weight rows per tile, CTAs per cluster, scales through smem,
 * kernel flags: 1 skewed consumer warpgroups, RS(n) the tile order in bands of n weight tiles
 * (cuda_gemm_fp8_wgmma_tile) */
#define RS(n) WGMMA_RASTER(n)
#define ST WGMMA_STAGED
static const int variants[][4] = {
	{128, 1, 0, 0},  {192, 1, 0, 0},  {128, 2, 0, 0},  {192, 2, 0, 0}, {128, 1, 1, 0},
	{192, 1, 1, 0},  {128, 2, 1, 0},  {128, 1, 0, 1},  {128, 1, 1, 1}, {128, 2, 1, 1},
	{128, 1, 1, RS(8)}, {128, 1, 1, RS(16)}, {128, 2, 1, RS(16)}, {128, 1, 0, RS(16)},
	{128, 1, 1, ST},  {128, 2, 1, ST},  {128, 1, 1, ST | RS(16)}, {128, 2, 1, ST | RS(16)},
	{256, 1, 1, 0},   {256, 1, 1, 1},   {256, 1, 1, RS(8)},       {256, 1, 1, 1 | RS(8)},
	{256, 2, 1, 0},   {256, 2, 1, RS(8)}, {256, 1, 1, ST}, {256, 2, 1, ST | RS(8)},
	{256, 1, 1, ST | RS(8)}};
#define N_VAR (int)(sizeof variants / sizeof *variants)

/* Runs the plain GEMM with tiling v into a poisoned y and checks rows (all when n_rows <= 0,
 * else n_rows spread over M incl. the first and the last). */
/* (v = -1: the default entry point, cuda_gemm_fp8_wgmma) */
static void run_check(struct gpu *g, struct cpu_pool *pool, struct wg_case *c, int v, int n_rows)
{
	int bn = 0, mc = 0, ss = 0, sk = 0;
	if (v >= 0)
		bn = variants[v][0], mc = variants[v][1], ss = variants[v][2], sk = variants[v][3];
	gpu_test_poison(g, c->dy, (size_t)c->M * c->N * 2);
	int r = v < 0 ? cuda_gemm_fp8_wgmma(g, c->dW, c->dS, c->dx, c->dsx, c->dy, c->M, c->N, c->K,
					    c->N)
		      : cuda_gemm_fp8_wgmma_tile(g, c->dW, c->dS, c->dx, c->dsx, c->dy, c->M, c->N,
						 c->K, c->N, bn, mc, ss, sk);
	CHECK_EQ_INT(r, 0);
	if (r)
		return;
	REQUIRE(gpu_sync(g) == 0);
	int n = n_rows <= 0 || n_rows > c->M ? c->M : n_rows;
	int *rows = malloc((size_t)n * sizeof *rows);
	for (int i = 0; i < n; i++)
		rows[i] = n == c->M ? i : (int)((long long)i * (c->M - 1) / (n - 1));
	char what[96];
	snprintf(what, sizeof what, "wgmma n%d mc%d ss%d sk%d %s M=%d N=%d K=%d (%d rows)", bn, mc,
		 ss, sk, c->real ? "REAL" : "WIDE", c->M, c->N, c->K, n);
	CHECK_EQ_INT(check_rows(g, pool, c, rows, n, what), 0);
	free(rows);
}

TEST_T(gpu_wgmma, gemm_fp8_vs_cpu, 90)
{
	struct gpu g;
	gpu_test_open(&g);
	struct cpu_pool *pool = test_pool();
	/* small and odd: M not a multiple of 128, N % 128 == 64 (kv_a 576, q_a + kv_a 2112) */
	static const int small[][3] = {{1, 128, 128},   {77, 576, 512},    {200, 2112, 1536},
				       {130, 64, 256},  {129, 192, 1024},  {300, 1536, 7168},
				       {256, 320, 384}, {513, 2048, 512}};
	for (size_t i = 0; i < sizeof small / sizeof *small; i++)
		for (int real = 0; real < 2; real++) {
			struct wg_case c;
			case_init(&c, small[i][0], small[i][1], small[i][2], real, 1000 + i);
			case_upload(&g, &c);
			for (int v = -1; v < N_VAR; v++)
				run_check(&g, pool, &c, v, 0);
			case_free(&c);
		}
	cpu_pool_stop(pool);
	gpu_close(&g);
}

/* The issue-9 shapes (N x K) */
static const int big_shapes[][2] = {{24576, 1536}, {32768, 512},  {7168, 16384}, {18432, 7168},
				    {7168, 18432}, {4096, 7168},  {7168, 2048},  {2112, 7168}};
#define N_BIG (int)(sizeof big_shapes / sizeof *big_shapes)

TEST_T(gpu_wgmma, real_shapes_m256, 90)
{
	struct gpu g;
	gpu_test_open(&g);
	struct cpu_pool *pool = test_pool();
	for (int i = 0; i < N_BIG; i++) {
		struct wg_case c;
		case_init(&c, 256, big_shapes[i][0], big_shapes[i][1], i % 2 ? WIDE : REAL, 1100 + i);
		case_upload(&g, &c);
		for (int v = -1; v < N_VAR; v++)
			run_check(&g, pool, &c, v, 12);
		case_free(&c);
	}
	cpu_pool_stop(pool);
	gpu_close(&g);
}

/* ---- timing --------------------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* path: a tiling of variants[], N_VAR for cuBLASLt, or N_VAR + 1 + f for n128/mc1/ss with
 * kernel flags f (the timing diagnostics) */
static int run_path(struct gpu *g, struct wg_case *c, int path, gpu_ptr ws, size_t ws_bytes)
{
	if (path > N_VAR)
		return cuda_gemm_fp8_wgmma_tile(g, c->dW, c->dS, c->dx, c->dsx, c->dy, c->M, c->N,
						c->K, c->N, 128, 1, 1, path - N_VAR - 1);
	if (path == N_VAR)
		return cuda_gemm_fp8_lt(g, c->dW, c->dS, c->dx, c->dsx, c->dy, c->M, c->N, c->K,
					c->N, ws, ws_bytes);
	return cuda_gemm_fp8_wgmma_tile(g, c->dW, c->dS, c->dx, c->dsx, c->dy, c->M, c->N, c->K,
					c->N, variants[path][0], variants[path][1], variants[path][2],
					variants[path][3]);
}

/* Microseconds per launch: the median of 5 event-timed batches of 8 back-to-back launches after
 * a warm-up (back to back so the host's tensor-map encoding overlaps the previous launch, as in
 * a prefill step; L2 warm: prefill shapes are compute-bound); < 0 when the path fails. */
static float time_path(struct gpu *g, struct wg_case *c, int path, gpu_ptr ws, size_t ws_bytes)
{
	if (run_path(g, c, path, ws, ws_bytes) || gpu_sync(g))
		return -1;
	CUevent e0, e1;
	REQUIRE(cu.cuEventCreate(&e0, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
	REQUIRE(cu.cuEventCreate(&e1, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
	float t[5];
	int k, fail = 0;
	for (k = 0; k < 5 && !fail; k++) {
		cu.cuEventRecord(e0, g->stream);
		for (int i = 0; i < 8 && !fail; i++)
			fail = run_path(g, c, path, ws, ws_bytes) != 0;
		cu.cuEventRecord(e1, g->stream);
		if (fail || cu.cuEventSynchronize(e1) != CUDA_SUCCESS)
			fail = 1;
		else
			cu.cuEventElapsedTime(&t[k], e0, e1);
	}
	cu.cuEventDestroy(e0), cu.cuEventDestroy(e1);
	if (fail)
		return -1;
	qsort(t, 5, sizeof *t, cmp_float);
	return t[2] * 1e3f / 8;
}

/* M = 4096 on the shapes: ours (every tiling) and cuBLASLt, in us and TFLOP/s (the
 * H200's dense FP8 peak is 1979, spec), the ratio best/cuBLASLt; sampled rows checked. */
static void timing_m4096(int first, int last)
{
	struct gpu g;
	gpu_test_open(&g);
	struct cpu_pool *pool = test_pool();
	const int M = 4096;
	printf("    %-12s", "N x K  (us)");
	for (int v = 0; v < N_VAR; v++)
		printf(" %d/%d/%d/%d", variants[v][0], variants[v][1], variants[v][2], variants[v][3]);
	printf("  cuBLASLt | TFLOP/s: ours best (n/mc/ss/skew), cuBLASLt, best/LT\n");
	for (int i = first; i < last; i++) {
		struct wg_case c;
		int N = big_shapes[i][0], K = big_shapes[i][1];
		case_init(&c, M, N, K, REAL, 1200 + i);
		case_upload(&g, &c);
		size_t ws_bytes = cuda_gemm_fp8_workspace(&g, M, N, K);
		gpu_ptr ws = gpu_test_alloc(ws_bytes);
		float us[N_VAR + 1];
		for (int p = 0; p <= N_VAR; p++)
			us[p] = time_path(&g, &c, p, ws, ws_bytes);
		double flop = 2.0 * M * N * K;
		int best = -1;
		for (int p = 0; p < N_VAR; p++)
			if (us[p] > 0 && (best < 0 || us[p] < us[best]))
				best = p;
		char nk[24];
		snprintf(nk, sizeof nk, "%dx%d", N, K);
		printf("    %-12s", nk);
		for (int p = 0; p <= N_VAR; p++)
			printf(" %9.1f", us[p]);
		double tb = best >= 0 ? flop / (us[best] * 1e-6) / 1e12 : -1;
		double tl = us[N_VAR] > 0 ? flop / (us[N_VAR] * 1e-6) / 1e12 : -1;
		printf("  | %5.0f (%d/%d/%d/%d) %5.0f %5.2f\n", tb, best >= 0 ? variants[best][0] : 0,
		       best >= 0 ? variants[best][1] : 0, best >= 0 ? variants[best][2] : 0,
		       best >= 0 ? variants[best][3] : 0, tl, tl > 0 ? tb / tl : -1);
		CHECK(best >= 0);
		/* where the time goes (n128/mc1/ss/skew): without the stores, without the MMAs
		 * (loads, handshake and stores), with neither (the load pipeline alone) */
		float dg[3];
		static const int dflags[3] = {WGMMA_SKEW | WGMMA_DIAG_NOSTORE,
					      WGMMA_SKEW | WGMMA_DIAG_NOMMA,
					      WGMMA_SKEW | WGMMA_DIAG_NOSTORE | WGMMA_DIAG_NOMMA};
		for (int d = 0; d < 3; d++)
			dg[d] = time_path(&g, &c, N_VAR + 1 + dflags[d], ws, ws_bytes);
		printf("    %-12s diag 128/1/1/1: no stores %.1f us, no MMAs %.1f us, loads only %.1f "
		       "us (full %.1f)\n",
		       nk, dg[0], dg[1], dg[2], us[8]);
		/* the timed shapes' results, sampled rows, every tiling */
		for (int v = -1; v < N_VAR; v++)
			run_check(&g, pool, &c, v, 4);
		cu.cuMemFree(ws);
		case_free(&c);
	}
	printf("    floor: 2*M*N*K FLOPs at the dense FP8 peak 1979 TFLOP/s (spec)\n");
	cpu_pool_stop(pool);
	cuda_gemm_close(&g);
	gpu_close(&g);
}

/* in two cases, so each stays well under the runner's budget */
TEST_T(gpu_wgmma, timing_m4096_a, 90) { timing_m4096(0, N_BIG / 2); }
TEST_T(gpu_wgmma, timing_m4096_b, 90) { timing_m4096(N_BIG / 2, N_BIG); }

/* Prefill chunks smaller than 4096 tokens (the dispatch's M buckets): a few variants against
 * cuBLASLt, so the dispatch can be set per (M, N, K). */
TEST_T(gpu_wgmma, timing_small_m, 90)
{
	struct gpu g;
	gpu_test_open(&g);
	static const int Ms[] = {128, 256, 512, 1024, 2048};
	static const int shapes[][2] = {{24576, 1536}, {4096, 7168}, {7168, 2048}, {2112, 7168}};
	static const int pick[] = {4, 14, 18}; /* 128/1/1/0, 128/1/1/ST, 256/1/1/0 */
	printf("    %-18s %10s %10s %10s %10s  best/LT\n", "M N x K (us)", "128/1/1/0", "128/1/1/ST",
	       "256/1/1/0", "cuBLASLt");
	for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
		for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
			struct wg_case c;
			int M = Ms[mi], N = shapes[si][0], K = shapes[si][1];
			case_init(&c, M, N, K, WIDE, 1500 + si * 8 + mi);
			case_upload(&g, &c);
			size_t ws_bytes = cuda_gemm_fp8_workspace(&g, M, N, K);
			gpu_ptr ws = gpu_test_alloc(ws_bytes);
			float us[4];
			for (int p = 0; p < 3; p++)
				us[p] = time_path(&g, &c, pick[p], ws, ws_bytes);
			us[3] = time_path(&g, &c, N_VAR, ws, ws_bytes);
			float best = -1;
			for (int p = 0; p < 3; p++)
				if (us[p] > 0 && (best < 0 || us[p] < best))
					best = us[p];
			char nk[32];
			snprintf(nk, sizeof nk, "%d %dx%d", M, N, K);
			printf("    %-18s %10.1f %10.1f %10.1f %10.1f  %.2f\n", nk, us[0], us[1], us[2],
			       us[3], best > 0 && us[3] > 0 ? us[3] / best : -1);
			CHECK(best > 0);
			cu.cuMemFree(ws);
			case_free(&c);
		}
	cuda_gemm_close(&g);
	gpu_close(&g);
}

/* ---- grouped -------------------------------------------------------------------------------- */

/* G groups with the given row counts; each group its own weight. Checks every row (or sampled
 * rows per group when the groups are big) against cpu_fp8_linear with the group's weight. */
struct grp_case {
	int G, N, K, rows, fill; /* fill: WIDE or REAL host weights, or SYNTH (made on the GPU) */
	int *off;              /* [G + 1] */
	uint8_t **W;           /* [G] host weights [N, K] */
	float **S;             /* [G] host scales */
	float *x;              /* [rows, K] */
	uint8_t *xq;
	float *sx;
	gpu_ptr dWall, dSall, dw_tab, ds_tab, doff, dx, dsx, dy;
};

enum { SYNTH = 2 };

static void grp_init(struct gpu *g, struct grp_case *c, int G, const int *counts, int N, int K,
		     uint64_t seed, int fill)
{
	size_t KB = (size_t)K / 128, NB = (size_t)(N + 127) / 128;
	size_t wbytes = (size_t)N * K, sbytes = NB * KB * 4;
	int host_weights = fill != SYNTH;
	*c = (struct grp_case){.G = G, .N = N, .K = K, .fill = fill};
	c->off = calloc((size_t)G + 1, sizeof *c->off);
	for (int e = 0; e < G; e++)
		c->off[e + 1] = c->off[e] + counts[e];
	c->rows = c->off[G];
	int R = c->rows > 0 ? c->rows : 1;
	c->x = malloc((size_t)R * K * 4), c->xq = malloc((size_t)R * K);
	c->sx = malloc((size_t)R * KB * 4);
	REQUIRE(c->x && c->xq && c->sx);
	if (fill == WIDE)
		fill_acts(c->x, c->rows, K, &seed);
	else
		fill_acts_real(c->x, (size_t)c->rows * K, &seed);
	for (int m = 0; m < c->rows; m++)
		cpu_act_quant(c->x + (size_t)m * K, K, c->xq + (size_t)m * K, c->sx + (size_t)m * KB);
	/* weights: one device block, group e at e * wbytes (addresses in w_tab, as the engine) */
	c->dWall = gpu_test_alloc(wbytes * G), c->dSall = gpu_test_alloc(sbytes * G);
	uint64_t *wt = malloc((size_t)G * 8), *st = malloc((size_t)G * 8);
	c->W = calloc((size_t)G, sizeof *c->W), c->S = calloc((size_t)G, sizeof *c->S);
	for (int e = 0; e < G; e++) {
		wt[e] = c->dWall + (size_t)e * wbytes, st[e] = c->dSall + (size_t)e * sbytes;
		if (host_weights) {
			c->W[e] = malloc(wbytes), c->S[e] = malloc(sbytes);
			if (fill == WIDE)
				fill_weights(c->W[e], c->S[e], wbytes, NB * KB, &seed);
			else
				fill_weights_real(c->W[e], c->S[e], N, K, &seed);
			REQUIRE(gpu_upload(g, wt[e], c->W[e], wbytes) == 0);
			REQUIRE(gpu_upload(g, st[e], c->S[e], sbytes) == 0);
		}
	}
	if (!host_weights) { /* synthetic weights made on the GPU (timing only) */
		long long nw = (long long)(wbytes * G), ns = (long long)(NB * KB * G);
		unsigned long long sd = seed;
		int lo = -14, hi = -8;
		void *a1[] = {&c->dWall, &nw, &sd};
		REQUIRE(gpu_launch(g, gpu_kernel(g, "k_fill_e4m3"), 1024, 1, 1, 256, 1, 1, 0, a1) == 0);
		void *a2[] = {&c->dSall, &ns, &sd, &lo, &hi};
		REQUIRE(gpu_launch(g, gpu_kernel(g, "k_fill_f32_pow2"), 1024, 1, 1, 256, 1, 1, 0, a2) ==
			0);
	}
	c->dw_tab = gpu_test_alloc((size_t)G * 8), c->ds_tab = gpu_test_alloc((size_t)G * 8);
	c->doff = gpu_test_alloc(((size_t)G + 1) * 4);
	REQUIRE(gpu_upload(g, c->dw_tab, wt, (size_t)G * 8) == 0);
	REQUIRE(gpu_upload(g, c->ds_tab, st, (size_t)G * 8) == 0);
	REQUIRE(gpu_upload(g, c->doff, c->off, ((size_t)G + 1) * 4) == 0);
	c->dx = gpu_test_alloc((size_t)R * K), c->dsx = gpu_test_alloc((size_t)R * KB * 4);
	c->dy = gpu_test_alloc((size_t)R * N * 2);
	if (c->rows > 0) {
		REQUIRE(gpu_upload(g, c->dx, c->xq, (size_t)c->rows * K) == 0);
		REQUIRE(gpu_upload(g, c->dsx, c->sx, (size_t)c->rows * KB * 4) == 0);
	}
	free(wt), free(st);
}

static void grp_free(struct grp_case *c)
{
	cu.cuMemFree(c->dWall), cu.cuMemFree(c->dSall), cu.cuMemFree(c->dw_tab);
	cu.cuMemFree(c->ds_tab), cu.cuMemFree(c->doff), cu.cuMemFree(c->dx), cu.cuMemFree(c->dsx);
	cu.cuMemFree(c->dy);
	for (int e = 0; e < c->G; e++)
		free(c->W[e]), free(c->S[e]);
	free(c->W), free(c->S), free(c->off), free(c->x), free(c->xq), free(c->sx);
}

/* grouped variants: bn, scales through smem, kernel flags (the paired ones need N % (2 bn) == 0:
 * grp_usable) */
static const int gvars[][3] = {{128, 0, 0},  {192, 0, 0}, {128, 0, 1},
			       {128, 1, 0},  {128, 1, 1}, {128, 1, ST},
			       {256, 1, 0},  {256, 1, 1}, {256, 1, ST},
			       {128, 1, ST | WGMMA_PAIRED}, {256, 1, ST | WGMMA_PAIRED}};
#define N_GVAR (int)(sizeof gvars / sizeof *gvars)

/* v = TW: the token-wide form, cuda_gemm_fp8_tw_grouped (N % 256 == 0); TW2: the same in
 * clusters of 2 sharing the token rows (cuda_gemm_tw_set_mc(2), N % 512 == 0) */
enum { TW2 = -3, TW = -2 };

/* Whether variant v applies to the case's N (the paired forms: N % (2 bn) == 0). */
static int grp_usable(const struct grp_case *c, int v)
{
	if (v == TW2)
		return c->N % 512 == 0;
	if (v == TW)
		return c->N % 256 == 0;
	return v < 0 || !(gvars[v][2] & WGMMA_PAIRED) || c->N % (2 * gvars[v][0]) == 0;
}

/* (v = -1: the default entry point, cuda_gemm_fp8_wgmma_grouped; v = TW: the token-wide form) */
static int grp_run(struct gpu *g, struct grp_case *c, int v)
{
	if (v == TW || v == TW2) {
		cuda_gemm_tw_set_mc(v == TW2 ? 2 : 1);
		int r = cuda_gemm_fp8_tw_grouped(g, c->dw_tab, c->ds_tab, c->doff, c->G, c->dx,
						 c->dsx, c->dy, c->rows, c->N, c->K, c->N);
		cuda_gemm_tw_set_mc(-1);
		return r;
	}
	if (v < 0)
		return cuda_gemm_fp8_wgmma_grouped(g, c->dw_tab, c->ds_tab, c->doff, c->G, c->dx,
						   c->dsx, c->dy, c->rows, c->N, c->K, c->N);
	return cuda_gemm_fp8_wgmma_grouped_bn(g, c->dw_tab, c->ds_tab, c->doff, c->G, c->dx, c->dsx,
					      c->dy, c->rows, c->N, c->K, c->N, gvars[v][0],
					      gvars[v][1], gvars[v][2]);
}

/* Checks up to max_per rows of each group (the first and last among them) against the CPU. */
static void grp_check(struct gpu *g, struct cpu_pool *pool, struct grp_case *c, int v,
		      int max_per)
{
	if (!grp_usable(c, v))
		return;
	gpu_test_poison(g, c->dy, (size_t)(c->rows > 0 ? c->rows : 1) * c->N * 2);
	int r = grp_run(g, c, v);
	CHECK_EQ_INT(r, 0);
	if (r)
		return;
	REQUIRE(gpu_sync(g) == 0);
	int64_t bad = 0;
	for (int e = 0; e < c->G; e++) {
		int cnt = c->off[e + 1] - c->off[e];
		if (!cnt)
			continue;
		int n = cnt < max_per ? cnt : max_per;
		int rows[64];
		for (int i = 0; i < n; i++)
			rows[i] = c->off[e] + (n == cnt ? i : (int)((long long)i * (cnt - 1) / (n - 1)));
		struct wg_case gc = {.M = c->rows, .N = c->N, .K = c->K, .W = c->W[e], .S = c->S[e],
				     .x = c->x, .xq = c->xq, .sx = c->sx, .dy = c->dy,
				     .real = c->fill == REAL};
		char what[112];
		snprintf(what, sizeof what,
			 "grouped %s%d/%d/%d %s group %d (%d rows, %d checked) N=%d K=%d",
			 v == TW2 ? "token-wide pairs " : v == TW ? "token-wide " : "",
			 v < 0 ? 0 : gvars[v][0],
			 v < 0 ? 0 : gvars[v][1], v < 0 ? 0 : gvars[v][2],
			 c->fill == REAL ? "REAL" : "WIDE", e, cnt, n, c->N, c->K);
		bad += check_rows(g, pool, &gc, rows, n, what);
		free(gc.ref), free(gc.A), free(gc.ref_rows);
	}
	CHECK_EQ_INT(bad, 0);
}

TEST_T(gpu_wgmma, grouped_vs_cpu, 90)
{
	struct gpu g;
	gpu_test_open(&g);
	struct cpu_pool *pool = test_pool();
	/* empty groups first, in the middle and last; partial tiles; a group of several tiles */
	static const int counts[] = {0, 5, 130, 0, 1, 257, 64, 0, 128, 0};
	struct grp_case c;
	grp_init(&g, &c, 10, counts, 576, 1024, 1300, WIDE);
	for (int v = -1; v < N_GVAR; v++)
		grp_check(&g, pool, &c, v, 64);
	grp_free(&c);
	/* the expert shapes of V3.2 (gate+up 4096 x 7168, down 7168 x 2048), sampled rows */
	static const int c2[] = {3, 0, 200, 129, 0, 64};
	grp_init(&g, &c, 6, c2, 4096, 7168, 1301, REAL);
	for (int v = TW2; v < N_GVAR; v++)
		grp_check(&g, pool, &c, v, 8);
	grp_free(&c);
	grp_init(&g, &c, 6, c2, 7168, 2048, 1302, WIDE);
	for (int v = TW2; v < N_GVAR; v++)
		grp_check(&g, pool, &c, v, 8);
	grp_free(&c);
	/* the token-wide form's chunks: 600 rows in 5 chunks of 120, 145 in 2 (80 + 65), 144 in
	 * one, short groups, the last group's rows ending at max_rows; up to 64 rows of each */
	static const int c4[] = {600, 16, 0, 145, 1, 144, 31};
	grp_init(&g, &c, 7, c4, 512, 512, 1304, WIDE);
	grp_check(&g, pool, &c, -1, 64);
	const size_t ybytes = (size_t)c.rows * c.N * 2;
	uint16_t *ya = malloc(ybytes), *yb = malloc(ybytes);
	REQUIRE(ya && yb && gpu_download(&g, ya, c.dy, ybytes) == 0);
	/* and bit for bit the tile form's outputs (the same products and K-block order), alone
	 * and in clusters of 2 */
	for (int v = TW; v >= TW2; v--) {
		grp_check(&g, pool, &c, v, 64);
		REQUIRE(gpu_download(&g, yb, c.dy, ybytes) == 0);
		long long ndiff = 0;
		for (size_t i = 0; i < ybytes / 2; i++)
			ndiff += ya[i] != yb[i];
		printf("    token-wide%s vs the 128-token tile form: %lld of %zu outputs differ\n",
		       v == TW2 ? " pairs" : "", ndiff, ybytes / 2);
		CHECK_EQ_INT(ndiff, 0);
	}
	free(ya), free(yb);
	grp_free(&c);
	/* the token-wide form at K = 128 and 256 (one and two K blocks an item) */
	for (int k = 128; k <= 256; k += 128) {
		grp_init(&g, &c, 7, c4, 256, k, 1305 + k, WIDE);
		grp_check(&g, pool, &c, TW, 64);
		grp_free(&c);
	}
	/* all groups empty: nothing to do, no error */
	static const int c3[] = {0, 0, 0};
	grp_init(&g, &c, 3, c3, 128, 128, 1303, WIDE);
	for (int v = 0; v < N_GVAR; v++)
		CHECK_EQ_INT(grp_run(&g, &c, v), 0);
	REQUIRE(gpu_sync(&g) == 0);
	grp_free(&c);
	cpu_pool_stop(pool);
	gpu_close(&g);
}

/* The SwiGLU form (cuda_gemm_fp8_wgmma_grouped_swiglu: the MoE gate|up GEMM with SwiGLU and
 * act_quant in its epilogue) against the grouped GEMM's bf16 output through k_moe_swiglu_quant
 * (the MoE block's unfused path): the same e4m3 codes and scales, to the bit, on every row of
 * every group (empty groups, partial tiles, several tiles), in both forms (one CTA a tile; the
 * paired clusters of 2: pairs of token tiles, and odd last token tiles over pairs of weight
 * tiles), each with its codes stored from registers and staged. */
static void swiglu_case(struct gpu *g, int G, const int *counts, int I, int K, uint64_t seed)
{
	struct grp_case c;
	grp_init(g, &c, G, counts, 2 * I, K, seed, REAL);
	const size_t rows = (size_t)(c.rows > 0 ? c.rows : 1), KBo = (size_t)I / 128;
	gpu_ptr ref8 = gpu_test_alloc(rows * I), refs = gpu_test_alloc(rows * KBo * 4),
		h8 = gpu_test_alloc(rows * I), hs = gpu_test_alloc(rows * KBo * 4);
	gpu_test_poison(g, c.dy, rows * 2 * I * 2);
	gpu_test_poison(g, ref8, rows * I), gpu_test_poison(g, refs, rows * KBo * 4);
	gpu_test_poison(g, h8, rows * I), gpu_test_poison(g, hs, rows * KBo * 4);
	CHECK_EQ_INT(cuda_gemm_fp8_wgmma_grouped(g, c.dw_tab, c.ds_tab, c.doff, c.G, c.dx, c.dsx, c.dy,
						 c.rows, 2 * I, K, 2 * I), 0);
	long long n = (long long)c.rows * (long long)KBo;
	int ii = I, table = 0;
	void *args[] = {&c.dy, &ref8, &refs, &ii, &n, &table};
	CHECK_EQ_INT(gpu_launch(g, gpu_kernel(g, "k_moe_swiglu_quant"), (unsigned)((n + 7) / 8), 1, 1,
				256, 1, 1, 0, args), 0);
	uint8_t *a = malloc(rows * I), *b = malloc(rows * I);
	float *sa = malloc(rows * KBo * 4), *sb = malloc(rows * KBo * 4);
	REQUIRE(a && b && sa && sb);
	/* mc 1: one CTA a tile; mc 2: clusters of 2 sharing copies (I % 256 == 0); forms 3, 4: 1
	 * and 2 with the codes staged (cuda_gemm_wgmma_set_swiglu_staged) */
	for (int form = 1; form <= 4; form++) {
		const int mc = form > 2 ? form - 2 : form;
		if (mc == 2 && I % 256)
			continue;
		cuda_gemm_wgmma_set_swiglu_staged(form > 2);
		gpu_test_poison(g, h8, rows * I), gpu_test_poison(g, hs, rows * KBo * 4);
		CHECK_EQ_INT(cuda_gemm_fp8_wgmma_grouped_swiglu_mc(g, c.dw_tab, c.ds_tab, c.doff, c.G,
								   c.dx, c.dsx, h8, hs, c.rows, I,
								   K, mc),
			     0);
		cuda_gemm_wgmma_set_swiglu_staged(0);
		REQUIRE(gpu_sync(g) == 0);
		REQUIRE(gpu_download(g, a, ref8, rows * I) == 0 && gpu_download(g, b, h8, rows * I) == 0);
		REQUIRE(gpu_download(g, sa, refs, rows * KBo * 4) == 0);
		REQUIRE(gpu_download(g, sb, hs, rows * KBo * 4) == 0);
		int64_t bad8 = 0, bads = 0, first = -1;
		for (size_t i = 0; i < (size_t)c.rows * I; i++)
			if (a[i] != b[i]) {
				bad8++;
				first = first < 0 ? (int64_t)i : first;
			}
		for (size_t i = 0; i < (size_t)c.rows * KBo; i++)
			bads += memcmp(&sa[i], &sb[i], 4) != 0;
		printf("    swiglu form mc %d%s, %d groups, %d rows, I=%d K=%d: %lld of %lld codes and "
		       "%lld of %lld scales differ from GEMM + k_moe_swiglu_quant",
		       mc, form > 2 ? " staged" : "", G, c.rows, I, K, (long long)bad8,
		       (long long)c.rows * I, (long long)bads,
		       (long long)(c.rows * (long long)KBo));
		if (first >= 0)
			printf(" (first: row %lld col %lld: 0x%02x vs 0x%02x)", (long long)(first / I),
			       (long long)(first % I), a[first], b[first]);
		printf("\n");
		CHECK_EQ_INT(bad8, 0);
		CHECK_EQ_INT(bads, 0);
	}
	cu.cuMemFree(ref8), cu.cuMemFree(refs), cu.cuMemFree(h8), cu.cuMemFree(hs);
	free(a), free(b), free(sa), free(sb);
	grp_free(&c);
}

TEST_T(gpu_wgmma, grouped_swiglu_exact, 90)
{
	struct gpu g;
	gpu_test_open(&g);
	static const int counts[] = {0, 5, 130, 0, 1, 257, 64, 0, 128, 0};
	swiglu_case(&g, 10, counts, 256, 1024, 1500);
	static const int c2[] = {3, 0, 200, 129, 0, 64}; /* V3.2's expert: I = 2048, K = 7168 */
	swiglu_case(&g, 6, c2, 2048, 7168, 1501);
	/* a group of 600 rows (five token tiles, the last partial), the last group's rows ending
	 * at max_rows */
	static const int c3[] = {600, 16, 0, 31};
	swiglu_case(&g, 4, c3, 384, 512, 1502);
	gpu_close(&g);
}

/* One GEMM timed by timing_moe_prefill: variant v of gvars (v < N_GVAR), the forced form gv
 * (bn / ss / flags), or with sw_mc > 0 the SwiGLU form in clusters of sw_mc into h8, hs. */
struct timed_gemm {
	struct gpu *g;
	struct grp_case *c;
	int v;
	const int *gv;
	int sw_mc;
	gpu_ptr h8, hs;
};

static int timed_gemm_run(const struct timed_gemm *t)
{
	struct grp_case *c = t->c;
	if (t->sw_mc)
		return cuda_gemm_fp8_wgmma_grouped_swiglu_mc(t->g, c->dw_tab, c->ds_tab, c->doff, c->G,
							     c->dx, c->dsx, t->h8, t->hs, c->rows,
							     c->N / 2, c->K, t->sw_mc);
	if (t->v < N_GVAR)
		return grp_run(t->g, c, t->v);
	return cuda_gemm_fp8_wgmma_grouped_bn(t->g, c->dw_tab, c->ds_tab, c->doff, c->G, c->dx,
					      c->dsx, c->dy, c->rows, c->N, c->K, c->N, t->gv[0],
					      t->gv[1], t->gv[2]);
}

/* Microseconds a call: one checked call, then the median of 5 batches of 4 back to back (the
 * maps kernel included). */
static double timed_gemm_us(const struct timed_gemm *t)
{
	CHECK_EQ_INT(timed_gemm_run(t), 0);
	REQUIRE(gpu_sync(t->g) == 0);
	CUevent e0, e1;
	REQUIRE(cu.cuEventCreate(&e0, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
	REQUIRE(cu.cuEventCreate(&e1, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
	float ms[5];
	for (int k = 0; k < 5; k++) {
		cu.cuEventRecord(e0, t->g->stream);
		for (int i = 0; i < 4; i++)
			timed_gemm_run(t);
		cu.cuEventRecord(e1, t->g->stream);
		REQUIRE(cu.cuEventSynchronize(e1) == CUDA_SUCCESS);
		cu.cuEventElapsedTime(&ms[k], e0, e1);
	}
	cu.cuEventDestroy(e0), cu.cuEventDestroy(e1);
	qsort(ms, 5, sizeof *ms, cmp_float);
	return ms[2] * 1e3 / 4;
}

/* MoE prefill (issue 11): 4096 tokens x 8 experts of 256, routed at random (seeded), gate+up
 * N x K = 4096 x 7168 then down 7168 x 2048; TFLOP/s of the rows' useful FLOPs. */
TEST_T(gpu_wgmma, timing_moe_prefill, 90)
{
	struct gpu g;
	gpu_test_open(&g);
	const int G = 256, T = 4096, topk = 8;
	int counts[256] = {0};
	uint64_t seed = 1400;
	for (int t = 0; t < T; t++) { /* topk distinct experts per token */
		int chosen[8], n = 0;
		while (n < topk) {
			int e = (int)(test_rand(&seed) % G), dup = 0;
			for (int k = 0; k < n; k++)
				dup |= chosen[k] == e;
			if (!dup)
				chosen[n++] = e, counts[e]++;
		}
	}
	int cmin = T, cmax = 0;
	for (int e = 0; e < G; e++)
		cmin = counts[e] < cmin ? counts[e] : cmin, cmax = counts[e] > cmax ? counts[e] : cmax;
	printf("    rows per expert: %d .. %d (mean %d)\n", cmin, cmax, T * topk / G);
	static const int shapes[][2] = {{4096, 7168}, {7168, 2048}};
	/* after the variants, timing diagnostics (wrong output): the tile loads alone (no MMAs, no
	 * stores) for 256/1/0. Run 8/9 at these 4096 tokens: gate|up 2.7 ms of loads alone in a
	 * 3.1-3.3 ms GEMM; 32768 rows as 256 groups of 128 rows vs 128 groups of 256 (half the
	 * weights): loads alone 2031 vs 1803 us — bound by the bytes into the SMs per tile (A + B
	 * through L2, ~5.5 TB/s), not by HBM; down: loads 909 us, no stores 1359, pair stores 1865
	 * (hence n256 staged). Also the paired staged form (the MoE block's at 4096 tokens): its
	 * loads alone, and without the stores: whether the multicast took the loads off the bound
	 * (run 15: 256/1/48 3026 us against 2974 of loads alone unpaired). */
	enum { ND = 3 };
	static const int diag[ND][3] = {
		{256, 1, WGMMA_DIAG_NOMMA | WGMMA_DIAG_NOSTORE},
		{256, 1, WGMMA_DIAG_NOMMA | WGMMA_DIAG_NOSTORE | WGMMA_STAGED | WGMMA_PAIRED},
		{256, 1, WGMMA_DIAG_NOSTORE | WGMMA_STAGED | WGMMA_PAIRED}};
	for (int s = 0; s < 2; s++) {
		struct grp_case c;
		grp_init(&g, &c, G, counts, shapes[s][0], shapes[s][1], 1401 + s, SYNTH);
		const double flop = 2.0 * c.rows * c.N * c.K, wbytes = (double)G * c.N * c.K;
		for (int v = 0; v < N_GVAR + ND; v++) {
			const int *gv = v < N_GVAR ? gvars[v] : diag[v - N_GVAR];
			if (v < N_GVAR && !grp_usable(&c, v))
				continue;
			struct timed_gemm tg = {&g, &c, v, gv, 0, 0, 0};
			const double us = timed_gemm_us(&tg);
			printf("    grouped %d/%d/%d (n/ss/flags)%s %d x (%dx%d), %d rows: %.1f us, %.0f "
			       "TFLOP/s, weights %.2f TB/s\n",
			       gv[0], gv[1], gv[2], v < N_GVAR ? "" : " DIAG", G, c.N, c.K, c.rows, us,
			       flop / (us * 1e-6) / 1e12, wbytes / (us * 1e-6) / 1e12);
		}
		/* gate|up: the SwiGLU form the MoE block runs (cuda_gemm_fp8_wgmma_grouped_swiglu_mc,
		 * one CTA a tile, the paired clusters); run 17's bench moe took 3701 us for it on
		 * another H200 with the shared expert's 4096 rows too (run 15: 3325) */
		for (int form = 1; s == 0 && form <= 4; form++) { /* 3, 4: 1, 2 with staged codes */
			const int I = c.N / 2, mc = form > 2 ? form - 2 : form;
			cuda_gemm_wgmma_set_swiglu_staged(form > 2);
			struct timed_gemm tg = {&g, &c, 0, NULL, mc, gpu_test_alloc((size_t)c.rows * I),
						gpu_test_alloc((size_t)c.rows * (I / 128) * 4)};
			const double us = timed_gemm_us(&tg);
			cuda_gemm_wgmma_set_swiglu_staged(0);
			printf("    grouped swiglu form mc %d%s %d x (%dx%d), %d rows: %.1f us, %.0f "
			       "TFLOP/s, weights %.2f TB/s\n",
			       mc, form > 2 ? " staged" : "", G, c.N, c.K, c.rows, us,
			       flop / (us * 1e-6) / 1e12, wbytes / (us * 1e-6) / 1e12);
			cu.cuMemFree(tg.h8), cu.cuMemFree(tg.hs);
		}
		grp_free(&c);
	}
	gpu_close(&g);
}

#endif
