// rope.cu — rotary embedding with the YaRN frequencies (spec §3.4), in place on bf16 vectors.
//
// The cos/sin of every (position, frequency) pair come from a table the host computes once with
// the CPU backend's function (fp32 angle = pos * inv_freq, as the reference), so GPU and CPU
// rotate by identical values: cs fp32 [max_pos, 32, 2] = (cos, sin).
//
// k_rope: x bf16 rows; row r = token r / heads, head r % heads; the 64 rope dims of a row start
// at x + token*ld_token + head*ld_head + off. interleaved = 1: pairs (2i, 2i+1) (MLA q_pe, k_pe);
// interleaved = 0: pairs (i, i+32) (the indexer's half-split layout).
// One warp per row; lane i rotates pair i (32 pairs).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
k_rope(uint16_t *__restrict__ x, const int *__restrict__ pos, const float *__restrict__ cs,
       int n_tokens, int heads, long long ld_token, int ld_head, int off, int interleaved)
{
	const long long row = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	if (row >= (long long)n_tokens * heads)
		return;
	const int t = (int)(row / heads), h = (int)(row % heads);
	uint16_t *v = x + t * ld_token + (long long)h * ld_head + off;
	const int i0 = interleaved ? 2 * lane : lane;
	const int i1 = interleaved ? 2 * lane + 1 : lane + 32;
	const float c = cs[((size_t)pos[t] * 32 + lane) * 2 + 0];
	const float s = cs[((size_t)pos[t] * 32 + lane) * 2 + 1];
	const float a = bf16_to_f32(v[i0]), b = bf16_to_f32(v[i1]);
	// explicit roundings (no FMA contraction): the same fp32 operations as the CPU backend's
	// rope_apply_*, so the result is bit-identical
	v[i0] = f32_to_bf16(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
	v[i1] = f32_to_bf16(__fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}
