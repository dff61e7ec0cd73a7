/*
 * test_gpu_driver.c — the driver layer on a real GPU: device, embedded modules, VMM regions,
 * the scratch arena, copies, and CUDA graph capture and replay.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "driver/kernels.h"

TEST(gpu_driver, open_and_modules)
{
	struct gpu g;
	gpu_test_open(&g);
	printf("    %s: sm_%d%d, %d SMs, %.1f GiB, VMM granularity %zu\n", g.name, g.cc_major,
	       g.cc_minor, g.sm_count, g.total_mem / 1073741824.0, g.granularity);
	CHECK(g.cc_major >= 9);
	CHECK_EQ_INT(g.n_modules, n_kernel_images);
	CHECK(n_kernel_images > 0);
	CHECK(gpu_kernel(&g, "k_rmsnorm_add") != NULL);
	CHECK(gpu_kernel(&g, "k_no_such_kernel") == NULL);
	gpu_close(&g);
}

TEST(gpu_driver, region_grows_in_place)
{
	struct gpu g;
	gpu_test_open(&g);
	struct gpu_region r;
	struct err e;
	REQUIRE(gpu_region_reserve(&g, &r, "test", (size_t)1 << 30, &e) == 0);
	size_t n = 3 * g.granularity + 100;
	REQUIRE(gpu_region_grow(&g, &r, n, &e) == 0);
	gpu_ptr a = gpu_region_alloc(&r, n);
	REQUIRE(a == r.base);
	uint8_t *src = malloc(n), *dst = malloc(n);
	uint64_t seed = 7;
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)test_rand(&seed);
	REQUIRE(gpu_upload(&g, a, src, n) == 0);
	/* growing maps new chunks after the old ones: old contents stay where they were */
	REQUIRE(gpu_region_grow(&g, &r, 64u << 20, &e) == 0);
	gpu_ptr b = gpu_region_alloc(&r, 32u << 20);
	CHECK(b >= a + n);
	REQUIRE(gpu_memset(&g, b, 0xab, 32u << 20) == 0);
	REQUIRE(gpu_download(&g, dst, a, n) == 0);
	CHECK(memcmp(src, dst, n) == 0);
	CHECK(gpu_region_grow(&g, &r, (size_t)2 << 30, &e) == -ENOMEM);
	CHECK_CONTAINS(e.msg, "reserved");
	gpu_region_free(&g, &r);
	free(src);
	free(dst);
	gpu_close(&g);
}

TEST(gpu_driver, arena_is_lifo)
{
	struct gpu g;
	gpu_test_open(&g);
	struct gpu_arena a;
	struct err e;
	REQUIRE(gpu_arena_init(&g, &a, 8u << 20, &e) == 0);
	size_t m0 = gpu_arena_mark(&a);
	gpu_ptr p1 = gpu_arena_push(&a, 1000);
	size_t m1 = gpu_arena_mark(&a);
	gpu_ptr p2 = gpu_arena_push(&a, 4u << 20);
	CHECK(p1 && p2 && p2 >= p1 + 1000);
	gpu_arena_release(&a, m1);
	CHECK(gpu_arena_push(&a, 16) == p2); /* the released space is reused */
	gpu_arena_release(&a, m0);
	CHECK(gpu_arena_push(&a, 16u << 20) == 0); /* larger than the arena: refused, not grown */
	CHECK(a.high_water >= (4u << 20));
	gpu_arena_free(&g, &a);
	gpu_close(&g);
}

/* Captures one RMSNorm launch into a graph and replays it: the replay must produce the
 * same bytes as the eager launch. */
TEST(gpu_driver, graph_capture_replay)
{
	struct gpu g;
	gpu_test_open(&g);
	const int rows = 16, dim = 7168;
	size_t nb = (size_t)rows * dim * 2;
	uint16_t *x = malloc(nb), *y1 = malloc(nb), *y2 = malloc(nb);
	float *w = malloc((size_t)dim * 4);
	uint64_t seed = 11;
	fill_bf16(x, (size_t)rows * dim, 3.0f, &seed);
	for (int i = 0; i < dim; i++)
		w[i] = 1.0f + (float)(i % 7) * 0.01f;
	gpu_ptr dx = gpu_test_alloc(nb), dy = gpu_test_alloc(nb), dw = gpu_test_alloc((size_t)dim * 4);
	REQUIRE(gpu_upload(&g, dx, x, nb) == 0);
	REQUIRE(gpu_upload(&g, dw, w, (size_t)dim * 4) == 0);
	void *fn = gpu_kernel(&g, "k_rmsnorm_add");
	REQUIRE(fn);
	gpu_ptr no_res = 0;
	float eps = 1e-6f;
	void *args[] = {&dx, &no_res, &dw, &dy, (void *)&dim, &eps};
	gpu_test_poison(&g, dy, nb);
	REQUIRE(gpu_launch(&g, fn, rows, 1, 1, 256, 1, 1, 0, args) == 0);
	REQUIRE(gpu_download(&g, y1, dy, nb) == 0);

	gpu_test_poison(&g, dy, nb);
	CUgraph graph;
	CUgraphExec exec;
	REQUIRE(cu_check(cu.cuStreamBeginCapture(g.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
			 "cuStreamBeginCapture", __FILE__, __LINE__) == 0);
	REQUIRE(gpu_launch(&g, fn, rows, 1, 1, 256, 1, 1, 0, args) == 0);
	REQUIRE(cu_check(cu.cuStreamEndCapture(g.stream, &graph), "cuStreamEndCapture", __FILE__, __LINE__) == 0);
	REQUIRE(cu_check(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags", __FILE__, __LINE__) == 0);
	for (int k = 0; k < 3; k++)
		REQUIRE(cu_check(cu.cuGraphLaunch(exec, g.stream), "cuGraphLaunch", __FILE__, __LINE__) == 0);
	REQUIRE(gpu_download(&g, y2, dy, nb) == 0);
	CHECK(memcmp(y1, y2, nb) == 0);
	int nan = 0;
	for (size_t i = 0; i < (size_t)rows * dim; i++)
		nan += isnan(bf16_to_f32(y1[i]));
	CHECK_EQ_INT(nan, 0);
	cu.cuGraphExecDestroy(exec);
	cu.cuGraphDestroy(graph);
	free(x), free(y1), free(y2), free(w);
	gpu_close(&g);
}

#endif
