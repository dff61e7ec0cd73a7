// mla_combine.cuh — the merge of the sparse MLA decode's key splits (FlashDecoding), the body of
// k_mla_combine (mla_decode.cu). part (cuda_mla_decode's workspace): o [nbh, splits][R] fp32,
// then (m, l) [nbh, splits][2]; for row-head bh (= b * H + h of nbh = B * H):
//   M = max m_i, w_i = e^(m_i - M), L = Σ l_i w_i, o[d] = bf16(Σ_i o_i[d] w_i / L)
// with the splits summed in order, so an element has the same bits whichever thread computes it.
// Device code only.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "common.cuh"

#define MLA_MAX_SPLITS 64

// One whole warp (lane i: splits i and i + 32; splits <= MLA_MAX_SPLITS): the weights w_i of
// row-head bh into wsh[0 .. splits), L into *L_out (lane 0). The caller makes them visible
// (e.g. __syncthreads) before mla_combine_elem.
__device__ __forceinline__ void mla_combine_weights(const float *__restrict__ part, int splits, int R, size_t bh,
						    size_t nbh, float *wsh, float *L_out)
{
	const float *ml = part + nbh * splits * R + bh * splits * 2; // [splits][2]
	const int i0 = threadIdx.x & 31, i1 = i0 + 32;
	const float m0 = i0 < splits ? ml[2 * i0] : -INFINITY;
	const float m1 = i1 < splits ? ml[2 * i1] : -INFINITY;
	const float l0 = i0 < splits ? ml[2 * i0 + 1] : 0.f;
	const float l1 = i1 < splits ? ml[2 * i1 + 1] : 0.f;
	const float M = warp_max(fmaxf(m0, m1));
	const float w0 = m0 == -INFINITY ? 0.f : expf(m0 - M);
	const float w1 = m1 == -INFINITY ? 0.f : expf(m1 - M);
	const float L = warp_sum(l0 * w0 + l1 * w1);
	if (i0 < splits)
		wsh[i0] = w0;
	if (i1 < splits)
		wsh[i1] = w1;
	if (i0 == 0)
		*L_out = L;
}

// Output element d (< R) of row-head bh as bf16 bits, from mla_combine_weights' wsh and L (the
// loads of 16 splits in flight)
__device__ __forceinline__ uint16_t mla_combine_elem(const float *__restrict__ part, int splits, int R, size_t bh,
						     int d, const float *wsh, float L)
{
	const float *pp = part + bh * splits * R; // [splits][R]
	float acc = 0.f;
#pragma unroll 16
	for (int i = 0; i < splits; i++)
		acc += pp[(size_t)i * R + d] * wsh[i];
	return f32_to_bf16(L > 0.f ? acc / L : 0.f);
}
