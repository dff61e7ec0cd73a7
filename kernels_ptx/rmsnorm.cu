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
	const uint16_t *xr = x + (size_t)row * dim;
	uint16_t *rr = residual ? residual + (size_t)row * dim : nullptr;
	uint16_t *orow = out + (size_t)row * dim;
	float s[RMS_MAX_PER_THREAD];
	float ss = 0.f;
#pragma unroll
	for (int k = 0; k < RMS_MAX_PER_THREAD; k++) {
		int i = threadIdx.x + k * RMS_THREADS;
		s[k] = 0.f;
		if (i < dim) {
			float v = bf16_to_f32(xr[i]);
			if (rr)
				v += bf16_to_f32(rr[i]);
			s[k] = v;
			ss += v * v;
		}
	}
	// block reduction of the sum of squares: warp shuffles, then one value per warp in smem
	__shared__ float warp_sum[RMS_THREADS / 32];
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, o);
	if ((threadIdx.x & 31) == 0)
		warp_sum[threadIdx.x >> 5] = ss;
	__syncthreads(); // every warp's partial is in smem before any thread sums them
	float tot = 0.f;
#pragma unroll
	for (int k = 0; k < RMS_THREADS / 32; k++)
		tot += warp_sum[k];
	const float inv = rsqrtf(tot / (float)dim + eps);
#pragma unroll
	for (int k = 0; k < RMS_MAX_PER_THREAD; k++) {
		int i = threadIdx.x + k * RMS_THREADS;
		if (i < dim) {
			orow[i] = f32_to_bf16(w[i] * (s[k] * inv));
			if (rr)
				rr[i] = f32_to_bf16(s[k]);
		}
	}
}
