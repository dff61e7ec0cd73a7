/*
 * test_gpu_nccl.c — driver/nccl.c on real GPUs (step 2 of docs/MULTIGPU.md): a clique over the
 * GPUs of this process and its all-reduce sum, against the host.
 *   - one rank: the sum of one is a copy (fp32 and bf16, out of place and in place, the bits
 *     kept), the caller's current context left as it was, and the same all-reduce captured in a
 *     CUDA graph and replayed;
 *   - every GPU of the machine (two or more): each rank's random values summed on the host in
 *     rank order; with two ranks a sum is one addition, so fp32 must be bit-exact and bf16 the
 *     round-to-nearest of the fp32 sum; with more, within the reordering of the additions (and
 *     bf16 within a rounding an addition).
 * (Its times at the sizes expert parallelism sums: `dsv32 bench nccl`.)
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include <string.h>

#include "driver/nccl.h"

static void nccl_test_open(struct gpu *const *gs, int n, struct nccl **c)
{
	struct err e = {""};
	if (nccl_open(gs, n, c, &e)) {
		test_fail(__FILE__, __LINE__, "nccl_open: %s", e.msg);
		test_abort_case();
	}
}

TEST(gpu_nccl, one_rank_is_a_copy)
{
	struct gpu g;
	gpu_test_open(&g);
	struct gpu *gs[1] = {&g};
	struct nccl *c;
	nccl_test_open(gs, 1, &c);
	printf("    %s, 1 rank on %s\n", nccl_version(), g.name);
	CUcontext cur = NULL;
	cu.cuCtxGetCurrent(&cur);
	CHECK(cur == g.ctx);

	const size_t n = 7168 * 16 + 5; /* not a multiple of anything NCCL splits by */
	float *x = malloc(n * 4), *y = malloc(n * 4);
	uint16_t *xb = malloc(n * 2), *yb = malloc(n * 2);
	uint64_t seed = 3;
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((int64_t)(test_rand(&seed) >> 40) - (1 << 23)) * 0x1p-20f;
	fill_bf16(xb, n, 4.0f, &seed);
	gpu_ptr dx = gpu_test_alloc(n * 4), dy = gpu_test_alloc(n * 4);
	gpu_ptr dxb = gpu_test_alloc(n * 2), dyb = gpu_test_alloc(n * 2);
	REQUIRE(gpu_upload(&g, dx, x, n * 4) == 0);
	REQUIRE(gpu_upload(&g, dxb, xb, n * 2) == 0);
	struct err e;
	gpu_test_poison(&g, dy, n * 4);
	gpu_test_poison(&g, dyb, n * 2);
	CHECK_EQ_INT(nccl_all_reduce_sum(c, &dx, &dy, n, NCCL_TYPE_F32, &e), 0);
	CHECK_EQ_INT(nccl_all_reduce_sum(c, &dxb, &dyb, n, NCCL_TYPE_BF16, &e), 0);
	REQUIRE(gpu_download(&g, y, dy, n * 4) == 0);
	REQUIRE(gpu_download(&g, yb, dyb, n * 2) == 0);
	CHECK(memcmp(x, y, n * 4) == 0);
	CHECK(memcmp(xb, yb, n * 2) == 0);
	CHECK_EQ_INT(nccl_all_reduce_sum(c, &dx, &dx, n, NCCL_TYPE_F32, &e), 0); /* in place */
	CHECK_EQ_INT(nccl_all_reduce_sum(c, &dxb, &dxb, n, NCCL_TYPE_BF16, &e), 0);
	REQUIRE(gpu_download(&g, y, dx, n * 4) == 0);
	REQUIRE(gpu_download(&g, yb, dxb, n * 2) == 0);
	CHECK(memcmp(x, y, n * 4) == 0);
	CHECK(memcmp(xb, yb, n * 2) == 0);
	cur = NULL;
	cu.cuCtxGetCurrent(&cur);
	CHECK(cur == g.ctx);
	CHECK_EQ_INT(nccl_check(c, &e), 0);
	CHECK_EQ_INT(nccl_all_reduce_sum(c, &dx, &dy, SIZE_MAX / 2, NCCL_TYPE_F32, &e), -EINVAL);
	CHECK_CONTAINS(e.msg, "elements");
	gpu_ptr none = 0;
	CHECK_EQ_INT(nccl_all_reduce_sum(c, &dx, &none, n, NCCL_TYPE_F32, &e), -EINVAL);
	CHECK_CONTAINS(e.msg, "rank 0 has no receive buffer");

	/* captured in a graph (as a step's graph would hold it), replayed three times */
	gpu_test_poison(&g, dy, n * 4);
	CUgraph graph;
	CUgraphExec exec;
	REQUIRE(cu_check(cu.cuStreamBeginCapture(g.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
			 "cuStreamBeginCapture", __FILE__, __LINE__) == 0);
	CHECK_EQ_INT(nccl_all_reduce_sum(c, &dx, &dy, n, NCCL_TYPE_F32, &e), 0);
	REQUIRE(cu_check(cu.cuStreamEndCapture(g.stream, &graph), "cuStreamEndCapture", __FILE__,
			 __LINE__) == 0);
	REQUIRE(cu_check(cu.cuGraphInstantiateWithFlags(&exec, graph, 0),
			 "cuGraphInstantiateWithFlags", __FILE__, __LINE__) == 0);
	for (int k = 0; k < 3; k++)
		REQUIRE(cu_check(cu.cuGraphLaunch(exec, g.stream), "cuGraphLaunch", __FILE__,
				 __LINE__) == 0);
	REQUIRE(gpu_download(&g, y, dy, n * 4) == 0);
	CHECK(memcmp(x, y, n * 4) == 0);
	cu.cuGraphExecDestroy(exec);
	cu.cuGraphDestroy(graph);
	CHECK_EQ_INT(nccl_check(c, &e), 0);

	nccl_close(c);
	free(x), free(y), free(xb), free(yb);
	gpu_close(&g);
}

TEST(gpu_nccl, every_gpu_sums)
{
	struct err e = {""};
	int n = 0;
	REQUIRE(cu_load(&e) == 0);
	REQUIRE(cu.cuDeviceGetCount(&n) == CUDA_SUCCESS);
	if (n < 2) {
		printf("    one GPU here: the sum over ranks needs two (nothing checked)\n");
		return;
	}
	if (n > 8)
		n = 8;
	struct gpu g[8];
	struct gpu *gs[8];
	for (int r = 0; r < n; r++) {
		if (gpu_open(&g[r], r, &e)) {
			test_fail(__FILE__, __LINE__, "gpu_open(%d): %s", r, e.msg);
			test_abort_case();
		}
		gs[r] = &g[r];
	}
	struct nccl *c;
	nccl_test_open(gs, n, &c);
	printf("    %s, %d ranks\n", nccl_version(), n);

	const size_t count = 7168 * 16 + 5;
	float *x = malloc(count * 4 * n), *y = malloc(count * 4);
	uint16_t *xb = malloc(count * 2 * n), *yb = malloc(count * 2);
	gpu_ptr d32[8], d16[8], out32[8];
	uint64_t seed = 5;
	for (int r = 0; r < n; r++) {
		float *xr = x + count * r;
		for (size_t i = 0; i < count; i++)
			xr[i] = (float)((int64_t)(test_rand(&seed) >> 40) - (1 << 23)) * 0x1p-20f;
		fill_bf16(xb + count * r, count, 4.0f, &seed);
		cu.cuCtxSetCurrent(g[r].ctx);
		d32[r] = gpu_test_alloc(count * 4), out32[r] = gpu_test_alloc(count * 4);
		d16[r] = gpu_test_alloc(count * 2);
		REQUIRE(gpu_upload(&g[r], d32[r], xr, count * 4) == 0);
		REQUIRE(gpu_upload(&g[r], d16[r], xb + count * r, count * 2) == 0);
		gpu_test_poison(&g[r], out32[r], count * 4);
	}
	CHECK_EQ_INT(nccl_all_reduce_sum(c, d32, out32, count, NCCL_TYPE_F32, &e), 0);
	CHECK_EQ_INT(nccl_all_reduce_sum(c, d16, d16, count, NCCL_TYPE_BF16, &e), 0);
	for (int r = 0; r < n; r++)
		REQUIRE(gpu_sync(&g[r]) == 0);
	CHECK_EQ_INT(nccl_check(c, &e), 0);

	/* the host's sums in rank order; two ranks: one addition, exact */
	double worst32 = 0;
	int worst16 = 0;
	for (int r = 0; r < n; r++) {
		REQUIRE(gpu_download(&g[r], y, out32[r], count * 4) == 0);
		REQUIRE(gpu_download(&g[r], yb, d16[r], count * 2) == 0);
		for (size_t i = 0; i < count; i++) {
			float s = 0, sb = 0;
			for (int q = 0; q < n; q++)
				s += x[count * q + i], sb += bf16_to_f32(xb[count * q + i]);
			double d = fabs((double)y[i] - s);
			worst32 = d > worst32 ? d : worst32;
			int u = bf16_ulps(yb[i], f32_to_bf16(sb));
			worst16 = u > worst16 ? u : worst16;
		}
	}
	printf("    worst |fp32 - host| %.3g, worst bf16 ulps %d\n", worst32, worst16);
	if (n == 2) {
		CHECK(worst32 == 0);
		CHECK_EQ_INT(worst16, 0);
	} else {
		CHECK(worst32 <= 8 * n * 0x1p-20); /* the values' ulp is 2^-20 or finer */
		CHECK(worst16 <= n); /* NCCL rounds to bf16 at each of its n - 1 additions */
	}
	nccl_close(c);
	free(x), free(y), free(xb), free(yb);
	for (int r = 0; r < n; r++)
		gpu_close(&g[r]);
}

#endif
