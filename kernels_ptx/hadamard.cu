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
	// bits 0,1 of the index: inside the lane
	float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
	v[0] = a0 + a2, v[1] = a1 + a3, v[2] = a0 - a2, v[3] = a1 - a3;
	// bits 2..6: across lanes (lane bit j = index bit j+2); the lane with the bit clear keeps
	// the sum, the other the difference
#pragma unroll
	for (int m = 1; m < 32; m <<= 1) {
#pragma unroll
		for (int k = 0; k < 4; k++) {
			float o = __shfl_xor_sync(0xffffffffu, v[k], m);
			v[k] = (lane & m) ? o - v[k] : v[k] + o;
		}
	}
#pragma unroll
	for (int k = 0; k < 4; k++)
		y[(size_t)row * ldy + lane * 4 + k] = f32_to_bf16(v[k] * scale);
}
