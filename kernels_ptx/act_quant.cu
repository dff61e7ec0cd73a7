// act_quant.cu — per-token 1x128 activation quantisation to FP8 e4m3 with UE8M0 scales
// (spec §5.3), bit-exact to model/numerics.h act_quant_group.
//
// k_act_quant: x bf16 [T, K] (row stride K) -> q e4m3 [T, K], s fp32 [T, K/128].
// One warp per 128-group, 4 values per lane (one 8-byte load); grid covers T*K/128 groups,
// 8 warps per block.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
k_act_quant(const uint16_t *__restrict__ x, uint8_t *__restrict__ q, float *__restrict__ s,
	    long long n_groups)
{
	const long long group = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	if (group >= n_groups)
		return;
	const uint2 raw = *reinterpret_cast<const uint2 *>(x + group * 128 + lane * 4);
	float v[4] = {bf16_to_f32(raw.x & 0xffff), bf16_to_f32(raw.x >> 16),
		      bf16_to_f32(raw.y & 0xffff), bf16_to_f32(raw.y >> 16)};
	float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
	amax = fmaxf(warp_max(amax), 1e-4f);
	const float sc = ue8m0_scale(amax);
	// x / sc is exact (sc is a power of two); clamp then round to nearest even
	uint32_t packed = 0;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		float y = fminf(fmaxf(v[k] / sc, -448.f), 448.f);
		packed |= (uint32_t)f32_to_e4m3(y) << (8 * k);
	}
	*reinterpret_cast<uint32_t *>(q + group * 128 + lane * 4) = packed;
	if (lane == 0)
		s[group] = sc;
}
