/*
 * bench_gpu.c — synthetic GPU data and the read-limit probe of the benchmarks (bench_gpu.h).
 */
#include "tools/cli/bench_gpu.h"

#ifndef DSV32_NO_CUDA

#include <stdlib.h>

int bench_fill_e4m3(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed)
{
	void *args[] = {&p, &n, &seed};
	return gpu_launch(g, gpu_kernel(g, "k_fill_e4m3"), (unsigned)g->sm_count * 8, 1, 1, 256, 1,
			  1, 0, args);
}

int bench_fill_pow2(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed, int lo, int hi)
{
	void *args[] = {&p, &n, &seed, &lo, &hi};
	return gpu_launch(g, gpu_kernel(g, "k_fill_f32_pow2"), (unsigned)g->sm_count * 4, 1, 1, 256,
			  1, 1, 0, args);
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

double bench_read_limit(struct gpu *g, int trials)
{
	long long n16 = (4ll << 30) / 16;
	gpu_ptr buf, sink;
	if (cu_check(cu.cuMemAlloc(&buf, (size_t)n16 * 16), "cuMemAlloc", __FILE__, __LINE__))
		return -1;
	if (cu_check(cu.cuMemAlloc(&sink, 8), "cuMemAlloc", __FILE__, __LINE__)) {
		cu.cuMemFree(buf);
		return -1;
	}
	bench_fill_e4m3(g, buf, n16 * 16, 1);
	void *fn = gpu_kernel(g, "k_read_bw"), *args[] = {&buf, &n16, &sink};
	const int reps = 3;
	float t[32];
	trials = trials < 1 ? 1 : trials > 32 ? 32 : trials;
	CUevent e0, e1;
	cu.cuEventCreate(&e0, CU_EVENT_DEFAULT);
	cu.cuEventCreate(&e1, CU_EVENT_DEFAULT);
	int r = gpu_launch(g, fn, (unsigned)g->sm_count * 4, 1, 1, 512, 1, 1, 0, args); /* warm-up */
	for (int k = 0; k < trials && !r; k++) {
		cu.cuEventRecord(e0, g->stream);
		for (int i = 0; i < reps; i++)
			gpu_launch(g, fn, (unsigned)g->sm_count * 4, 1, 1, 512, 1, 1, 0, args);
		cu.cuEventRecord(e1, g->stream);
		r = cu_check(cu.cuEventSynchronize(e1), "cuEventSynchronize", __FILE__, __LINE__);
		cu.cuEventElapsedTime(&t[k], e0, e1);
		t[k] /= (float)reps;
	}
	cu.cuEventDestroy(e0);
	cu.cuEventDestroy(e1);
	cu.cuMemFree(buf);
	cu.cuMemFree(sink);
	if (r)
		return -1;
	qsort(t, (size_t)trials, sizeof *t, cmp_float);
	return (double)n16 * 16 / (t[trials / 2] * 1e-3) / 1e12;
}

#endif
