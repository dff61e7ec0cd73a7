// moe_epi.cuh — the MoE block's two epilogue steps on fp32 GEMM partials (spec §5.3), one output
// group at a time: the launch kernels k_gemm_stream_reduce_swiglu / _combine (gemm_fp8_stream.cu)
// and the one-launch decode block k_moe_gemv_block (gemm_fp8_gemv.cu) run the same code, so the
// same bits. The partials are read by ordinary loads, never the non-coherent path: in
// k_moe_gemv_block other blocks wrote them in the same launch, before the grid-wide arrival whose
// acquire orders these reads after those writes (gv_grid_sync).
#pragma once
#include "common.cuh"

// SwiGLU and act_quant of one (row, 128 columns) group grp of h (I = N / 2 columns a row, gate
// columns first in the fused gate|up output), lane l columns 4l .. 4l + 3:
//   g, u = bf16( Σ_chunks partial[.][row][c ..] ), bf16( Σ_chunks partial[.][row][I + c ..] )
//   h = bf16( silu(g) * u ), h8[row, c ..] e4m3 and hs[grp] = act_quant(h)
// (plane: the floats a chunk's partials take)
__device__ __forceinline__ void moe_epi_swiglu_group(const float *__restrict__ partial,
						     uint8_t *__restrict__ h8, float *__restrict__ hs,
						     int chunks, long long plane, long long grp, int I,
						     int lane)
{
	const int per_row = I / 128;
	const long long row = grp / per_row;
	const int c = (int)(grp % per_row);
	const float *pg = partial + row * 2 * I + c * 128 + lane * 4, *pu = pg + I;
	// the first 4 chunks' loads in flight together, then the sums in chunk order
	float gl[4][4], ul[4][4];
#pragma unroll
	for (int ch = 0; ch < 4; ch++)
#pragma unroll
		for (int k = 0; k < 4; k++) {
			gl[ch][k] = ch < chunks ? pg[ch * plane + k] : 0.f;
			ul[ch][k] = ch < chunks ? pu[ch * plane + k] : 0.f;
		}
	float v[4];
#pragma unroll
	for (int k = 0; k < 4; k++) {
		float gs = gl[0][k], us = ul[0][k];
#pragma unroll
		for (int ch = 1; ch < 4; ch++)
			if (ch < chunks)
				gs += gl[ch][k], us += ul[ch][k];
		for (int ch = 4; ch < chunks; ch++)
			gs += pg[ch * plane + k], us += pu[ch * plane + k];
		v[k] = swiglu_bf16(gs, us);
	}
	const float sc = warp_act_quant128_regs(v, h8 + row * I + c * 128, lane);
	if (lane == 0)
		hs[grp] = sc;
}

// The combine of output i = t N + d: rows are the R = T K routed rows in expert-sorted order,
// then the T rows of the shared expert;
//   e_r = bf16( Σ_chunks partial[.][r][d] )   (the GEMM's bf16 output of row r)
//   y[t, d] = bf16( Σ_{k < K} e_{perm[t K + k]} · w[t, k]  +  e_{R + t} )
// with one fp32 multiply and one fp32 add each in pick order (no FMA): k_moe_combine's
// arithmetic (moe_permute.cu), value for value.
__device__ __forceinline__ uint16_t moe_epi_combine_at(const float *__restrict__ partial,
						       const float *__restrict__ w,
						       const int *__restrict__ perm, int chunks,
						       long long plane, int N, int T, int K,
						       long long i)
{
	const int t = (int)(i / N), d = (int)(i % N);
	const int R = T * K;
	float acc = 0.f;
	// picks in groups of 8 (the shared row as pick K): the group's rows, then all their
	// chunks' loads in flight together (chunks <= 4 at once), then the adds in order
	for (int k0 = 0; k0 <= K; k0 += 8) {
		int r[8];
#pragma unroll
		for (int j = 0; j < 8; j++)
			r[j] = k0 + j < K ? perm[t * K + k0 + j] : R + t;
		float e[8];
#pragma unroll
		for (int j = 0; j < 8; j++) {
			const float *p = partial + (size_t)r[j] * N + d;
			float v[4];
#pragma unroll
			for (int c = 0; c < 4; c++)
				v[c] = k0 + j <= K && c < chunks ? p[c * plane] : 0.f;
			float s = v[0];
#pragma unroll
			for (int c = 1; c < 4; c++)
				if (c < chunks)
					s += v[c];
			for (int c = 4; c < chunks; c++)
				s += p[c * plane];
			e[j] = bf16_to_f32(f32_to_bf16(s));
		}
#pragma unroll
		for (int j = 0; j < 8; j++) {
			const int k = k0 + j;
			if (k < K)
				acc = __fadd_rn(acc, __fmul_rn(e[j], w[(size_t)t * K + k]));
			else if (k == K)
				acc = __fadd_rn(acc, e[j]);
		}
	}
	return f32_to_bf16(acc);
}
