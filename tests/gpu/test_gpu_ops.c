/*
 * test_gpu_ops.c — every small kernel against the CPU backend's function on fresh random
 * inputs, with a per-op error limit: bit-exact where the spec defines the rounding (act_quant,
 * embedding, RoPE with the shared cos/sin table, the residual of the fused add), within one
 * bf16 ulp where only fp32 summation order or libm differ (norms, Hadamard, SwiGLU), and within
 * fp32 rounding for fp32 outputs (lm_head, the FP8 GEMM before its bf16 rounding).
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/cpu_ops.h"
#include "model/cpu_pool.h"
#include "model/cuda_gemm.h"
#include "model/rope.h"

static void to_bf16(const float *x, uint16_t *h, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h[i] = f32_to_bf16(x[i]);
}

/* Random bf16-representable floats with a per-row magnitude spread over many binades. */
static void fill_act(float *x, int64_t rows, int64_t cols, uint64_t *seed)
{
	for (int64_t r = 0; r < rows; r++) {
		float amp = ldexpf(1.0f, (int)(test_rand(seed) % 24) - 16);
		for (int64_t i = 0; i < cols; i++) {
			float u = (float)((test_rand(seed) >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
			x[r * cols + i] = bf16_round(u * amp);
		}
	}
}

/* Counts elements further apart than max_ulps bf16 ulps; prints the worst. */
static int64_t count_ulp_diff(const uint16_t *a, const uint16_t *b, size_t n, int max_ulps,
			      const char *what)
{
	int64_t bad = 0;
	int worst = 0;
	for (size_t i = 0; i < n; i++) {
		int d = bf16_ulps(a[i], b[i]);
		if (d > worst)
			worst = d;
		bad += d > max_ulps;
	}
	printf("    %s: %zu values, worst %d bf16 ulp\n", what, n, worst);
	return bad;
}

TEST(gpu_ops, act_quant_bit_exact)
{
	struct gpu g;
	gpu_test_open(&g);
	const int64_t T = 37, K = 7168, G = T * K / 128;
	float *x = malloc(T * K * 4), *s_cpu = malloc(G * 4), *s_gpu = malloc(G * 4);
	uint16_t *xh = malloc(T * K * 2);
	uint8_t *q_cpu = malloc(T * K), *q_gpu = malloc(T * K);
	uint64_t seed = 101;
	fill_act(x, T, K, &seed);
	for (int64_t i = 0; i < 128; i++) /* a group under the 1e-4 amax floor */
		x[i] = bf16_round(1e-6f * (float)(i - 64));
	for (int64_t t = 0; t < T; t++)
		cpu_act_quant(x + t * K, K, q_cpu + t * K, s_cpu + t * (K / 128));
	to_bf16(x, xh, (size_t)(T * K));
	gpu_ptr dx = gpu_test_alloc(T * K * 2), dq = gpu_test_alloc(T * K), ds = gpu_test_alloc(G * 4);
	REQUIRE(gpu_upload(&g, dx, xh, T * K * 2) == 0);
	gpu_test_poison(&g, dq, T * K);
	gpu_test_poison(&g, ds, G * 4);
	long long ng = G;
	void *args[] = {&dx, &dq, &ds, &ng};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_act_quant"), (unsigned)((G + 7) / 8), 1, 1, 256, 1, 1, 0, args) == 0);
	REQUIRE(gpu_download(&g, q_gpu, dq, T * K) == 0);
	REQUIRE(gpu_download(&g, s_gpu, ds, G * 4) == 0);
	CHECK(memcmp(q_cpu, q_gpu, T * K) == 0);
	CHECK(memcmp(s_cpu, s_gpu, G * 4) == 0);
	free(x), free(s_cpu), free(s_gpu), free(xh), free(q_cpu), free(q_gpu);
	gpu_close(&g);
}

TEST(gpu_ops, rmsnorm_add)
{
	struct gpu g;
	gpu_test_open(&g);
	const int64_t T = 19, D = 7168;
	size_t n = (size_t)(T * D);
	float *x = malloc(n * 4), *r = malloc(n * 4), *w = malloc(D * 4), *out = malloc(n * 4);
	uint16_t *xh = malloc(n * 2), *rh = malloc(n * 2), *oh = malloc(n * 2), *og = malloc(n * 2),
		 *rg = malloc(n * 2);
	uint64_t seed = 202;
	fill_act(x, T, D, &seed);
	fill_act(r, T, D, &seed);
	for (int64_t i = 0; i < D; i++)
		w[i] = bf16_round(0.5f + (float)(test_rand(&seed) % 1000) / 1000.0f);
	to_bf16(x, xh, n);
	to_bf16(r, rh, n);
	for (int64_t t = 0; t < T; t++)
		cpu_add_rmsnorm(out + t * D, x + t * D, r + t * D, w, D, 1e-6f);
	gpu_ptr dx = gpu_test_alloc(n * 2), dr = gpu_test_alloc(n * 2), dw = gpu_test_alloc(D * 4),
		dout = gpu_test_alloc(n * 2);
	REQUIRE(gpu_upload(&g, dx, xh, n * 2) == 0);
	REQUIRE(gpu_upload(&g, dr, rh, n * 2) == 0);
	REQUIRE(gpu_upload(&g, dw, w, D * 4) == 0);
	gpu_test_poison(&g, dout, n * 2);
	int dim = (int)D;
	float eps = 1e-6f;
	void *args[] = {&dx, &dr, &dw, &dout, &dim, &eps};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_rmsnorm_add"), (unsigned)T, 1, 1, 256, 1, 1, 0, args) == 0);
	REQUIRE(gpu_download(&g, og, dout, n * 2) == 0);
	REQUIRE(gpu_download(&g, rg, dr, n * 2) == 0);
	to_bf16(out, oh, n);
	to_bf16(r, rh, n); /* the CPU updated r to bf16(x + r) */
	CHECK(count_ulp_diff(oh, og, n, 1, "rmsnorm out") == 0);
	CHECK(memcmp(rh, rg, n * 2) == 0); /* the residual is one exact fp32 add, rounded */
	free(x), free(r), free(w), free(out), free(xh), free(rh), free(oh), free(og), free(rg);
	gpu_close(&g);
}

TEST(gpu_ops, embed_layernorm_hadamard_swiglu)
{
	struct gpu g;
	gpu_test_open(&g);
	uint64_t seed = 303;
	/* embedding gather: exact */
	const int64_t V = 1000, D = 512, T = 33;
	uint16_t *table = malloc(V * D * 2), *eg = malloc(T * D * 2), *eh = malloc(T * D * 2);
	fill_bf16(table, (size_t)(V * D), 2.0f, &seed);
	int32_t ids[33];
	for (int64_t t = 0; t < T; t++)
		ids[t] = (int32_t)(test_rand(&seed) % V);
	struct bf16_mat E = {table, V, D};
	float *ef = malloc(T * D * 4);
	cpu_embed(&E, ids, T, ef);
	to_bf16(ef, eh, (size_t)(T * D));
	gpu_ptr dtab = gpu_test_alloc(V * D * 2), dids = gpu_test_alloc(T * 4), dout = gpu_test_alloc(T * D * 2);
	REQUIRE(gpu_upload(&g, dtab, table, V * D * 2) == 0);
	REQUIRE(gpu_upload(&g, dids, ids, T * 4) == 0);
	gpu_test_poison(&g, dout, T * D * 2);
	int dim = (int)D;
	void *a1[] = {&dtab, &dids, &dout, &dim};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_embed"), (unsigned)T, 1, 1, 256, 1, 1, 0, a1) == 0);
	REQUIRE(gpu_download(&g, eg, dout, T * D * 2) == 0);
	CHECK(memcmp(eg, eh, T * D * 2) == 0);

	/* LayerNorm 128 with bias, Hadamard 128, on R rows */
	const int R = 200;
	float *x = malloc(R * 128 * 4), *w = malloc(128 * 4), *b = malloc(128 * 4), *y = malloc(R * 128 * 4);
	uint16_t *xh = malloc(R * 128 * 2), *yh = malloc(R * 128 * 2), *yg = malloc(R * 128 * 2);
	fill_act(x, R, 128, &seed);
	for (int i = 0; i < 128; i++) {
		w[i] = bf16_round(0.8f + (float)(test_rand(&seed) % 400) / 1000.0f);
		b[i] = bf16_round(((float)(test_rand(&seed) % 200) - 100.0f) / 1000.0f);
	}
	to_bf16(x, xh, R * 128);
	for (int r = 0; r < R; r++)
		cpu_layernorm(y + r * 128, x + r * 128, w, b, 128, 1e-6f);
	to_bf16(y, yh, R * 128);
	gpu_ptr dx = gpu_test_alloc(R * 128 * 2), dy = gpu_test_alloc(R * 128 * 2),
		dw = gpu_test_alloc(128 * 4), db = gpu_test_alloc(128 * 4);
	REQUIRE(gpu_upload(&g, dx, xh, R * 128 * 2) == 0);
	REQUIRE(gpu_upload(&g, dw, w, 512) == 0);
	REQUIRE(gpu_upload(&g, db, b, 512) == 0);
	gpu_test_poison(&g, dy, R * 128 * 2);
	int ld = 128, rows = R;
	float eps = 1e-6f;
	void *a2[] = {&dx, &ld, &dw, &db, &dy, &rows, &eps};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_layernorm128"), (R + 7) / 8, 1, 1, 256, 1, 1, 0, a2) == 0);
	REQUIRE(gpu_download(&g, yg, dy, R * 128 * 2) == 0);
	CHECK(count_ulp_diff(yh, yg, R * 128, 1, "layernorm") == 0);

	for (int r = 0; r < R; r++) {
		memcpy(y + r * 128, x + r * 128, 512);
		cpu_hadamard(y + r * 128, 128);
	}
	to_bf16(y, yh, R * 128);
	gpu_test_poison(&g, dy, R * 128 * 2);
	float scale = (float)pow(128.0, -0.5);
	void *a3[] = {&dx, &ld, &dy, &ld, &rows, &scale};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_hadamard128"), (R + 7) / 8, 1, 1, 256, 1, 1, 0, a3) == 0);
	REQUIRE(gpu_download(&g, yg, dy, R * 128 * 2) == 0);
	CHECK(count_ulp_diff(yh, yg, R * 128, 0, "hadamard (same butterfly order: exact)") == 0);

	/* SwiGLU on [g | u] rows */
	const int inter = 2048, TT = 9;
	size_t n = (size_t)TT * inter;
	float *gu = malloc(2 * n * 4), *h = malloc(n * 4);
	uint16_t *guh = malloc(2 * n * 2), *hh = malloc(n * 2), *hg = malloc(n * 2);
	fill_act(gu, 2 * TT, inter, &seed);
	for (int t = 0; t < TT; t++)
		cpu_swiglu(h + (size_t)t * inter, gu + (size_t)t * 2 * inter,
			   gu + (size_t)t * 2 * inter + inter, inter);
	to_bf16(gu, guh, 2 * n);
	to_bf16(h, hh, n);
	gpu_ptr dgu = gpu_test_alloc(2 * n * 2), dh = gpu_test_alloc(n * 2);
	REQUIRE(gpu_upload(&g, dgu, guh, 2 * n * 2) == 0);
	gpu_test_poison(&g, dh, n * 2);
	long long nn = (long long)n;
	int in = inter;
	void *a4[] = {&dgu, &dh, &in, &nn};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_swiglu"), 132, 1, 1, 256, 1, 1, 0, a4) == 0);
	REQUIRE(gpu_download(&g, hg, dh, n * 2) == 0);
	CHECK(count_ulp_diff(hh, hg, n, 1, "swiglu") == 0);
	gpu_close(&g);
}

TEST(gpu_ops, rope_both_layouts_bit_exact)
{
	struct gpu g;
	gpu_test_open(&g);
	struct dsv32_config c = {.qk_rope_head_dim = 64, .rope_theta = 10000,
				 .rope_scaling = {.factor = 40, .original_max_position_embeddings = 4096,
						  .beta_fast = 32, .beta_slow = 1, .mscale = 1, .mscale_all_dim = 1}};
	float inv[32];
	rope_inv_freq(&c, inv, NULL, NULL);
	const int P = 200000; /* past max_position_embeddings, to stress large angles */
	float *cs = malloc((size_t)P * 64 * 4);
	for (int p = 0; p < P; p++) {
		float co[32], si[32];
		rope_cos_sin(inv, 32, p, co, si);
		for (int i = 0; i < 32; i++)
			cs[((size_t)p * 32 + i) * 2] = co[i], cs[((size_t)p * 32 + i) * 2 + 1] = si[i];
	}
	gpu_ptr dcs = gpu_test_alloc((size_t)P * 64 * 4);
	REQUIRE(gpu_upload(&g, dcs, cs, (size_t)P * 64 * 4) == 0);
	uint64_t seed = 404;
	const int T = 50, H = 16, ld_head = 192, off = 128; /* an MLA q row: [nope 128 | rope 64] */
	size_t n = (size_t)T * H * ld_head;
	float *x = malloc(n * 4);
	uint16_t *xh = malloc(n * 2), *yh = malloc(n * 2), *yg = malloc(n * 2);
	int pos[50];
	for (int t = 0; t < T; t++)
		pos[t] = t < 5 ? t : (int)(test_rand(&seed) % P);
	gpu_ptr dx = gpu_test_alloc(n * 2), dpos = gpu_test_alloc(T * 4);
	REQUIRE(gpu_upload(&g, dpos, pos, T * 4) == 0);
	for (int inter = 0; inter <= 1; inter++) {
		fill_act(x, T * H, ld_head, &seed);
		to_bf16(x, xh, n);
		for (int t = 0; t < T; t++)
			for (int h = 0; h < H; h++) {
				float *v = x + ((size_t)t * H + h) * ld_head + off;
				const float *co = cs + (size_t)pos[t] * 64;
				float cc[32], ss[32];
				for (int i = 0; i < 32; i++)
					cc[i] = co[2 * i], ss[i] = co[2 * i + 1];
				if (inter)
					rope_apply_interleaved(v, cc, ss, 32);
				else
					rope_apply_halfsplit(v, cc, ss, 32);
			}
		to_bf16(x, yh, n);
		REQUIRE(gpu_upload(&g, dx, xh, n * 2) == 0);
		int nt = T, heads = H, lh = ld_head, o = off;
		long long ldt = (long long)H * ld_head;
		void *args[] = {&dx, &dpos, &dcs, &nt, &heads, &ldt, &lh, &o, &inter};
		REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_rope"), (T * H + 7) / 8, 1, 1, 256, 1, 1, 0, args) == 0);
		REQUIRE(gpu_download(&g, yg, dx, n * 2) == 0);
		CHECK(count_ulp_diff(yh, yg, n, 0, inter ? "rope interleaved" : "rope half-split") == 0);
	}
	gpu_close(&g);
}

TEST(gpu_ops, lm_head_fp32)
{
	struct gpu g;
	gpu_test_open(&g);
	const int V = 4099, D = 1024, M = 5;
	uint64_t seed = 505;
	uint16_t *W = malloc((size_t)V * D * 2), *xh = malloc((size_t)M * D * 2);
	float *x = malloc((size_t)M * D * 4), *ref = malloc((size_t)M * V * 4), *got = malloc((size_t)M * V * 4);
	fill_bf16(W, (size_t)V * D, 0.05f, &seed);
	fill_act(x, M, D, &seed);
	to_bf16(x, xh, (size_t)M * D);
	struct bf16_mat Wm = {W, V, D};
	cpu_bf16_linear(NULL, &Wm, x, M, ref, 0);
	gpu_ptr dW = gpu_test_alloc((size_t)V * D * 2), dx = gpu_test_alloc((size_t)M * D * 2),
		dl = gpu_test_alloc((size_t)M * V * 4);
	REQUIRE(gpu_upload(&g, dW, W, (size_t)V * D * 2) == 0);
	REQUIRE(gpu_upload(&g, dx, xh, (size_t)M * D * 2) == 0);
	gpu_test_poison(&g, dl, (size_t)M * V * 4);
	int m = M, d = D, v = V;
	void *args[] = {&dW, &dx, &dl, &m, &d, &v};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_lm_head"), (V + 7) / 8, 1, 1, 256, 1, 1, M * D * 4, args) == 0);
	REQUIRE(gpu_download(&g, got, dl, (size_t)M * V * 4) == 0);
	double worst = 0;
	for (int r = 0; r < M; r++) {
		/* error relative to the row's scale: fp32 summation order only */
		double norm = 0;
		for (int i = 0; i < V; i++)
			norm += (double)ref[r * V + i] * ref[r * V + i];
		norm = sqrt(norm / V);
		for (int i = 0; i < V; i++) {
			double e = fabs((double)got[r * V + i] - ref[r * V + i]) / norm;
			if (!(e <= worst))
				worst = isnan(e) ? INFINITY : e;
		}
	}
	printf("    lm_head: worst |err| / rms(row) = %.3g\n", worst);
	CHECK(worst < 1e-5);
	gpu_close(&g);
}

/* The FP8 decode GEMM against cpu_fp8_linear on the same quantised activations: the streaming
 * kernel with 1 and 2 MMA tiles per warp, then the previous kernel, against one CPU result (the
 * CPU reference on a thread pool: the GPU suite keeps each case well under 30 s). */
static void check_gemm(struct gpu *g, struct cpu_pool *pool, int M, int N, int K, uint64_t seed)
{
	size_t KB = (size_t)K / 128, NB = (size_t)N / 128 + (N % 128 != 0);
	uint8_t *W = malloc((size_t)N * K), *xq = malloc((size_t)M * K);
	float *S = malloc(NB * KB * 4), *x = malloc((size_t)M * K * 4), *sx = malloc((size_t)M * KB * 4),
	      *y = malloc((size_t)M * N * 4);
	uint16_t *yg = malloc((size_t)M * N * 2);
	for (size_t i = 0; i < (size_t)N * K; i++) {
		uint8_t b = (uint8_t)test_rand(&seed);
		W[i] = (b & 0x80) | ((b & 0x7f) % 0x70); /* any code but NaN */
	}
	for (size_t i = 0; i < NB * KB; i++)
		S[i] = ldexpf(1.0f, -(int)(test_rand(&seed) % 6) - 8);
	fill_act(x, M, K, &seed);
	struct fp8_linear L = {W, S, N, K};
	cpu_fp8_linear(pool, &L, x, M, y);
	for (int m = 0; m < M; m++)
		cpu_act_quant(x + (size_t)m * K, K, xq + (size_t)m * K, sx + (size_t)m * KB);
	gpu_ptr dW = gpu_test_alloc((size_t)N * K), dS = gpu_test_alloc(NB * KB * 4),
		dx = gpu_test_alloc((size_t)M * K), dsx = gpu_test_alloc((size_t)M * KB * 4),
		dy = gpu_test_alloc((size_t)M * N * 2);
	REQUIRE(gpu_upload(g, dW, W, (size_t)N * K) == 0);
	REQUIRE(gpu_upload(g, dS, S, NB * KB * 4) == 0);
	REQUIRE(gpu_upload(g, dx, xq, (size_t)M * K) == 0);
	REQUIRE(gpu_upload(g, dsx, sx, (size_t)M * KB * 4) == 0);
	size_t wsb = cuda_gemm_decode_workspace(g, M, N, K);
	gpu_ptr dws = wsb ? gpu_test_alloc(wsb) : 0;
	static const char *names[] = {"stream rt=1", "stream rt=2", "v2"};
	for (int v = 0; v < 3; v++) {
		cuda_gemm_set_stream(v < 2);
		cuda_gemm_set_stream_rt(v + 1);
		gpu_test_poison(g, dy, (size_t)M * N * 2);
		REQUIRE(cuda_gemm_fp8_decode(g, dW, dS, dx, dsx, dy, M, N, K, N, dws) == 0);
		REQUIRE(gpu_download(g, yg, dy, (size_t)M * N * 2) == 0);
		char what[64];
		snprintf(what, sizeof what, "%s M=%d N=%d K=%d", names[v], M, N, K);
		CHECK_EQ_INT(gpu_gemm_count_bad(y, yg, M, N, what), 0);
	}
	cuda_gemm_set_stream(1);
	cuda_gemm_set_stream_rt(0);
	if (dws)
		cu.cuMemFree(dws);
	cu.cuMemFree(dW), cu.cuMemFree(dS), cu.cuMemFree(dx), cu.cuMemFree(dsx), cu.cuMemFree(dy);
	free(W), free(xq), free(S), free(x), free(sx), free(y), free(yg);
}

TEST_T(gpu_ops, gemm_fp8_decode_vs_cpu, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	struct cpu_pool *pool = cpu_pool_start(16);
	REQUIRE(pool);
	static const int shapes[][3] = {{1, 2112, 7168}, {5, 576, 7168},  {8, 1536, 7168},
					{2, 7168, 16384}, {9, 4096, 7168},
					{13, 256, 1536}, {16, 4096, 512}, {31, 7168, 2048},
					{64, 1024, 2048}, {40, 128, 7168}, {3, 32768, 512}};
	for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
		check_gemm(&g, pool, shapes[i][0], shapes[i][1], shapes[i][2], 600 + i);
	cpu_pool_stop(pool);
	gpu_close(&g);
}

/* Batch invariance of the decode GEMM (the streaming kernel): the first m rows of a 64-row
 * product, recomputed with M = m (1, 7, 8, 9, 33, 63), are bit-identical to the 64-row result
 * (shapes with one and with several K chunks), with 1 and with 2 MMA tiles per warp. */
TEST_T(gpu_ops, gemm_fp8_decode_batch_invariant, 30)
{
	struct gpu g;
	gpu_test_open(&g);
	static const int shapes[][2] = {{2112, 7168}, {7168, 16384}, {576, 512}};
	static const int ms[] = {1, 7, 8, 9, 33, 63};
	uint64_t seed = 4242;
	cuda_gemm_set_stream(1);
	for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
		const int N = shapes[si][0], K = shapes[si][1], KB = K / 128, M = 64;
		const int NB = N / 128 + (N % 128 != 0);
		uint8_t *W = malloc((size_t)N * K), *xq = malloc((size_t)M * K);
		float *S = malloc((size_t)NB * KB * 4), *x = malloc((size_t)M * K * 4),
		      *sx = malloc((size_t)M * KB * 4);
		uint16_t *y64 = malloc((size_t)M * N * 2), *ym = malloc((size_t)M * N * 2);
		for (size_t i = 0; i < (size_t)N * K; i++) {
			uint8_t b = (uint8_t)test_rand(&seed);
			W[i] = (b & 0x80) | ((b & 0x7f) % 0x70);
		}
		for (int i = 0; i < NB * KB; i++)
			S[i] = ldexpf(1.0f, -(int)(test_rand(&seed) % 6) - 8);
		fill_act(x, M, K, &seed);
		for (int m = 0; m < M; m++)
			cpu_act_quant(x + (size_t)m * K, K, xq + (size_t)m * K, sx + (size_t)m * KB);
		gpu_ptr dW = gpu_test_alloc((size_t)N * K), dS = gpu_test_alloc((size_t)NB * KB * 4),
			dx = gpu_test_alloc((size_t)M * K), dsx = gpu_test_alloc((size_t)M * KB * 4),
			dy = gpu_test_alloc((size_t)M * N * 2);
		size_t wsb = cuda_gemm_decode_workspace(&g, M, N, K);
		gpu_ptr dws = gpu_test_alloc(wsb ? wsb : 256);
		REQUIRE(gpu_upload(&g, dW, W, (size_t)N * K) == 0);
		REQUIRE(gpu_upload(&g, dS, S, (size_t)NB * KB * 4) == 0);
		REQUIRE(gpu_upload(&g, dx, xq, (size_t)M * K) == 0);
		REQUIRE(gpu_upload(&g, dsx, sx, (size_t)M * KB * 4) == 0);
		gpu_test_poison(&g, dy, (size_t)M * N * 2);
		cuda_gemm_set_stream_rt(1);
		REQUIRE(cuda_gemm_fp8_decode(&g, dW, dS, dx, dsx, dy, M, N, K, N, dws) == 0);
		REQUIRE(gpu_download(&g, y64, dy, (size_t)M * N * 2) == 0);
		struct gemm_split sp = cuda_gemm_decode_split(&g, N, K);
		for (size_t mi = 0; mi < 2 * sizeof ms / sizeof *ms; mi++) {
			const int m = mi < sizeof ms / sizeof *ms ? ms[mi] : ms[mi - sizeof ms / sizeof *ms];
			const int rt = mi < sizeof ms / sizeof *ms ? 1 : 2; /* rt=2 vs rt=1 too */
			cuda_gemm_set_stream_rt(rt);
			gpu_test_poison(&g, dy, (size_t)M * N * 2);
			REQUIRE(cuda_gemm_fp8_decode(&g, dW, dS, dx, dsx, dy, m, N, K, N, dws) == 0);
			REQUIRE(gpu_download(&g, ym, dy, (size_t)m * N * 2) == 0);
			int64_t differ = 0, first = -1;
			for (size_t i = 0; i < (size_t)m * N; i++)
				if (ym[i] != y64[i]) {
					first = first < 0 ? (int64_t)i : first;
					differ++;
				}
			printf("    N=%d K=%d (%d chunks) rt=%d M=%d vs rt=1 M=64: %lld differ", N, K,
			       sp.chunks, rt, m, (long long)differ);
			if (first >= 0)
				printf(", first row %lld col %lld: %04x vs %04x", (long long)(first / N),
				       (long long)(first % N), ym[first], y64[first]);
			printf("\n");
			CHECK_EQ_INT(differ, 0);
		}
		cu.cuMemFree(dW), cu.cuMemFree(dS), cu.cuMemFree(dx), cu.cuMemFree(dsx);
		cu.cuMemFree(dy), cu.cuMemFree(dws);
		free(W), free(xq), free(S), free(x), free(sx), free(y64), free(ym);
	}
	gpu_close(&g);
}

#endif
