// lm_head.cu — logits = fp32(x) · W^T with W bf16 [V, D] (the LM head, spec §3.10; also the
// MTP head). x bf16 [M, D] (the final normed hidden states of the rows that sample), logits fp32
// [M, V]. Memory-bound: W (1.85 GB for the real model) is streamed once for all M rows.
//
// k_lm_head: one warp per output row v; lanes stride D in 8-element (16-byte) chunks; x is
// staged in shared memory as fp32 (M * D * 4 bytes, M <= LM_MAX_M). Launch with
// dynamic smem = M*D*4 and grid = ceil(V / 8) blocks of 256 threads.
#include "common.cuh"

#define LM_MAX_M 8

extern "C" __global__ void __launch_bounds__(256)
k_lm_head(const uint16_t *__restrict__ w, const uint16_t *__restrict__ x,
	  float *__restrict__ logits, int M, int D, int V)
{
	extern __shared__ float xs[]; // [M, D]
	for (int i = threadIdx.x; i < M * D; i += blockDim.x)
		xs[i] = bf16_to_f32(x[i]);
	__syncthreads(); // xs complete before any warp reads it
	const int v = blockIdx.x * 8 + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	if (v >= V)
		return;
	float acc[LM_MAX_M];
#pragma unroll
	for (int m = 0; m < LM_MAX_M; m++)
		acc[m] = 0.f;
	const uint4 *wr = reinterpret_cast<const uint4 *>(w + (size_t)v * D);
	for (int c = lane; c < D / 8; c += 32) {
		const uint4 q = wr[c];
		const uint32_t part[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const float w0 = __uint_as_float(part[k] << 16);
			const float w1 = __uint_as_float(part[k] & 0xffff0000u);
#pragma unroll
			for (int m = 0; m < LM_MAX_M; m++)
				if (m < M)
					acc[m] += w0 * xs[m * D + c * 8 + 2 * k] +
						  w1 * xs[m * D + c * 8 + 2 * k + 1];
		}
	}
	// every lane reduces all LM_MAX_M accumulators (unused ones are zero), then lane 0
	// stores the first M: no divergent shuffles
#pragma unroll
	for (int m = 0; m < LM_MAX_M; m++)
		acc[m] = warp_sum(acc[m]);
	if (lane == 0)
		for (int m = 0; m < M; m++)
			logits[(size_t)m * V + v] = acc[m];
}
