/*
 * gpu_harness.h — shared helpers of the GPU tests (tests/gpu/, run by `make gpu-test` on the
 * GPU machine; built but not run in CI). Each case runs in its own forked process, so each
 * opens the device itself. Outputs are poisoned (0xff bytes: NaN in bf16 and fp32) before a
 * kernel runs, so an element the kernel never wrote cannot pass.
 */
#ifndef DSV32_GPU_HARNESS_H
#define DSV32_GPU_HARNESS_H

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "driver/gpu.h"
#include "model/numerics.h"
#include "tests/test.h"

#ifndef DSV32_NO_CUDA

/* Opens GPU 0 or ends the case with the reason. */
static inline void gpu_test_open(struct gpu *g)
{
	struct err e = {""};
	if (gpu_open(g, 0, &e)) {
		test_fail(__FILE__, __LINE__, "gpu_open: %s", e.msg);
		test_abort_case();
	}
}

/* Device buffer from a plain allocation (tests only; the engine uses regions). */
static inline gpu_ptr gpu_test_alloc(size_t bytes)
{
	CUdeviceptr p = 0;
	if (cu_check(cu.cuMemAlloc(&p, bytes), "cuMemAlloc", __FILE__, __LINE__))
		test_abort_case();
	return p;
}

static inline void gpu_test_poison(struct gpu *g, gpu_ptr p, size_t bytes)
{
	REQUIRE(gpu_memset(g, p, 0xff, bytes) == 0);
}

/* Random bf16 values ~ U(-amp, amp), never all zero. */
static inline void fill_bf16(uint16_t *x, size_t n, float amp, uint64_t *seed)
{
	for (size_t i = 0; i < n; i++) {
		float u = (float)((test_rand(seed) >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
		x[i] = f32_to_bf16(u * amp);
	}
}

/* n random bf16 values ~ U(-amp, amp) (fill_bf16) in a new host buffer *host (the caller frees
 * it) and a device copy, returned (tests' random weights and inputs). */
static inline gpu_ptr gpu_test_rand_bf16(struct gpu *g, size_t n, float amp, uint64_t *seed,
					 uint16_t **host)
{
	uint16_t *h = malloc(n * 2);
	REQUIRE(h);
	fill_bf16(h, n, amp, seed);
	gpu_ptr d = gpu_test_alloc(n * 2);
	REQUIRE(gpu_upload(g, d, h, n * 2) == 0);
	*host = h;
	return d;
}

/* Distance in bf16 units in the last place between two bf16 values (NaN: huge). */
static inline int bf16_ulps(uint16_t a, uint16_t b)
{
	if (isnan(bf16_to_f32(a)) || isnan(bf16_to_f32(b)))
		return 1 << 30;
	int ia = (a & 0x8000) ? -(int)(a & 0x7fff) : (int)a;
	int ib = (b & 0x8000) ? -(int)(b & 0x7fff) : (int)b;
	return abs(ia - ib);
}

/* The RMS of a row of n fp32 values (summed in double): the scale the GPU tests' error limits
 * are relative to. */
static inline double gpu_row_rms(const float *x, int n)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	return sqrt(s / n);
}

/* bf16 outputs got [rows, cols] against the CPU's fp32 result ref: an output is bad when it is
 * more than one bf16 ulp from bf16(ref) AND more than rel_limit of its row's RMS away from ref
 * (an output that cancels to near zero can differ by several of its own ulps when only the
 * fp32 summation order differs). Prints the worst of both; returns the number of bad outputs. */
static inline int64_t gpu_count_bad_bf16(const float *ref, const uint16_t *got, int rows, int cols,
					 double rel_limit, const char *what)
{
	int64_t bad = 0;
	int worst_ulp = 0;
	double worst_rel = 0;
	for (int m = 0; m < rows; m++) {
		double rms = gpu_row_rms(ref + (size_t)m * cols, cols);
		for (int n = 0; n < cols; n++) {
			size_t i = (size_t)m * cols + n;
			int u = bf16_ulps(f32_to_bf16(ref[i]), got[i]);
			double rel = fabs((double)bf16_to_f32(got[i]) - ref[i]) / (rms > 0 ? rms : 1);
			worst_ulp = u > worst_ulp ? u : worst_ulp;
			worst_rel = rel > worst_rel || isnan(rel) ? rel : worst_rel;
			bad += u > 1 && !(rel <= rel_limit);
		}
	}
	printf("    %s: worst %d bf16 ulp, worst |err|/rms(row) %.2g, %lld bad\n", what, worst_ulp,
	       worst_rel, (long long)bad);
	return bad;
}

/* The error limit of an FP8 GEMM (spec §5.4) against the CPU's fp32 result ref[M, N]: fp32
 * accumulation order differs (tensor-core k32 sums, split-K, another library's tiling): one
 * bf16 ulp, or 2^-12 of the row's RMS. */
static inline int64_t gpu_gemm_count_bad(const float *ref, const uint16_t *got, int M, int N,
					 const char *what)
{
	return gpu_count_bad_bf16(ref, got, M, N, 1.0 / 4096, what);
}

#endif
#endif
