/*
 * bench_gpu.h — what the GPU benchmarks share: synthetic data generated on the GPU (never zeros)
 * and the HBM limits each benchmark reports its ratios against, measured in the same run.
 */
#ifndef DSV32_BENCH_GPU_H
#define DSV32_BENCH_GPU_H

#include "driver/gpu.h"

#ifndef DSV32_NO_CUDA
/* n bytes of random e4m3 codes (never NaN) at p. */
int bench_fill_e4m3(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed);
/* n bytes of e4m3 codes of N(0, sigma^2) at p (k_fill_e4m3_normal: drawn like a checkpoint's
 * weights, quantised per block to e4m3's range). */
int bench_fill_e4m3_normal(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed,
			   float sigma);
/* n fp32 powers of two 2^e, e uniform in [lo, hi], at p. */
int bench_fill_pow2(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed, int lo, int hi);
/* Streaming read of 4 GiB (k_read_bw), median of `trials` timings of 3 passes: TB/s, or a
 * negative value when the GPU call failed. */
double bench_read_limit(struct gpu *g, int trials);
/* Device-to-device copy of 2 GiB (cuMemcpyDtoDAsync), median of `trials` timings of 3 copies:
 * TB/s of bytes read + written (2 x 2 GiB a copy), or a negative value when a GPU call failed. */
double bench_copy_limit(struct gpu *g, int trials);
/* GPU g's dense tensor-core peak in TFLOP/s at the SM clock its driver names
 * (CU_DEVICE_ATTRIBUTE_CLOCK_RATE, the top boost on Hopper; *mhz, when not NULL): SMs x clock x
 * FLOP a clock an SM (sm_90: 8192 FP8, 4096 bf16); 0 where the architecture is not one this
 * table knows or the clock cannot be read. */
double bench_tensor_peak(const struct gpu *g, int fp8, double *mhz);
/* The energy GPU g has used since its driver loaded, in millijoules (NVML's counter:
 * libnvidia-ml.so.1, opened at the first call; the device found by its PCI address, as CUDA's
 * ordinals and NVML's indices need not agree), or -1 where NVML or the counter is not there. */
long long bench_energy_mj(struct gpu *g);
#endif

#endif
