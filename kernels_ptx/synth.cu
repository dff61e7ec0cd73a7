// synth.cu — synthetic weights generated on the GPU for real-dimension runs without a checkpoint
// on disk (issue 12: `dsv32 bench model --synthetic`). The values follow mkmodel's recipes
// (tools/mkmodel/gen.h) so a synthetic model behaves like a generated one (roughly unit-variance
// residual stream, routing spread over the experts); the bytes differ (a counter-based hash of
// (seed, element index) instead of mkmodel's per-tensor xoshiro stream, so any element is made
// independently by any thread).
//
// k_synth_e4m3: p[i] = e4m3(±k), k uniform in 0..15 (sign only for k != 0), as GEN_FP8.
// k_synth_bf16: p[i] = bf16(k · 2^-shift), k = sum of four 7-bit draws − 254, as GEN_BF16.
// Both grid-stride over n elements with one draw per element (cheap next to the HBM writes), so
// the result does not depend on the grid.
#include "common.cuh"

__device__ __forceinline__ uint64_t synth_mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t synth_draw(uint64_t seed, uint64_t i)
{
	return synth_mix(seed + (i + 1) * 0x9e3779b97f4a7c15ull);
}

// e4m3 codes of the integers 0..15 (exact)
__constant__ uint8_t synth_e4m3_int[16] = {0x00, 0x38, 0x40, 0x44, 0x48, 0x4a, 0x4c, 0x4e,
					   0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57};

extern "C" __global__ void k_synth_e4m3(uint8_t *__restrict__ p, long long n,
					unsigned long long seed)
{
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		uint64_t r = synth_draw(seed, (uint64_t)i);
		int k = (int)(r & 15);
		uint8_t code = synth_e4m3_int[k];
		p[i] = k && (r & 16) ? (uint8_t)(code | 0x80) : code;
	}
}

extern "C" __global__ void k_synth_bf16(uint16_t *__restrict__ p, long long n,
					unsigned long long seed, int shift)
{
	const float step = __uint_as_float((uint32_t)(127 - shift) << 23); // 2^-shift
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		uint64_t r = synth_draw(seed, (uint64_t)i);
		int k = (int)(r & 127) + (int)((r >> 7) & 127) + (int)((r >> 14) & 127) +
			(int)((r >> 21) & 127) - 254;
		p[i] = f32_to_bf16((float)k * step); // exact: |k| < 256
	}
}
