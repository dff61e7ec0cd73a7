// rmsnorm.cu — RMSNorm with the fused residual add (spec §3.2), device code only.
//
// k_rmsnorm_add: for each row t, s = fp32(x[t]) + fp32(residual[t]) (or x alone when residual
// is null), out[t] = bf16(w * s / sqrt(mean(s^2) + eps)), residual[t] = bf16(s).
// One block per row; blockDim.x = 256; dims up to 8192 (hidden 7168 fits with 28 values per
// thread). Shapes: x, out, residual [T, dim] bf16 (uint16 bits); w [dim] fp32.
#include "common.cuh"

#define RMS_THREADS 256
#define RMS_MAX_PER_THREAD 32

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
k_rmsnorm_add(const uint16_t *__restrict__ x, uint16_t *__restrict__ residual,
	      const float *__restrict__ w, uint16_t *__restrict__ out, int dim, float eps)
{
	const int row = blockIdx.x;
	block_rmsnorm_row<RMS_THREADS, RMS_MAX_PER_THREAD>(
		x + (size_t)row * dim, residual ? residual + (size_t)row * dim : nullptr, w,
		out + (size_t)row * dim, dim, eps);
}
