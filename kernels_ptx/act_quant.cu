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
	const float sc = warp_act_quant128(x + group * 128, q + group * 128, lane);
	if (lane == 0)
		s[group] = sc;
}
