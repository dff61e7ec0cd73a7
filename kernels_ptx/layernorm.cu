// layernorm.cu — LayerNorm with bias over 128-wide rows (the indexer's k_norm, spec §3.6 step 3):
// mean-subtract, biased variance, eps, fp32 math, bf16 out.
//
// k_layernorm128: x bf16 [T, 128] (row stride ld), w, b fp32 [128], out bf16 [T, 128].
// One warp per row, 4 values per lane.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
k_layernorm128(const uint16_t *__restrict__ x, int ld, const float *__restrict__ w,
	       const float *__restrict__ b, uint16_t *__restrict__ out, int rows, float eps)
{
	const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	float v[4];
#pragma unroll
	for (int k = 0; k < 4; k++)
		v[k] = bf16_to_f32(x[(size_t)row * ld + lane * 4 + k]);
	warp_layernorm128(v, lane, w, b, eps);
#pragma unroll
	for (int k = 0; k < 4; k++)
		out[(size_t)row * 128 + lane * 4 + k] = f32_to_bf16(v[k]);
}
