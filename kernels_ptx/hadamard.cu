// hadamard.cu — the indexer's Hadamard rotation (spec §3.6 step 4): y = (x · H128) · 128^-0.5,
// H the Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)), bf16 in and out.
//
// k_hadamard128: x bf16 [rows, 128] (row stride ld) -> y bf16 [rows, 128] (may alias x).
// One warp per row; lane l holds x[4l .. 4l+3]: two butterfly stages inside the lane, five
// across lanes with shuffles (fast Walsh-Hadamard transform, fp32).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
k_hadamard128(const uint16_t *__restrict__ x, int ldx, uint16_t *__restrict__ y, int ldy,
	      int rows, float scale)
{
	const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	if (row >= rows)
		return;
	float v[4];
#pragma unroll
	for (int k = 0; k < 4; k++)
		v[k] = bf16_to_f32(x[(size_t)row * ldx + lane * 4 + k]);
	warp_hadamard128(v, lane);
#pragma unroll
	for (int k = 0; k < 4; k++)
		y[(size_t)row * ldy + lane * 4 + k] = f32_to_bf16(v[k] * scale);
}
