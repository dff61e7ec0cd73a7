// gemm_fp8_f16.cuh — the FP8 decode GEMMs' tensor-core step on fp16 MMAs (gemm_fp8_decode.cu,
// gemm_fp8_stream.cu). Device code only.
//
// Why: sm_90 has no mma.sync for e4m3. ptxas lowers every mma.m16n8k32 e4m3 to 12 conversions
// (F2FP e4m3x2 -> f16x2: 8 for the A fragment, 4 for B) and two HMMA.16816.F32 (a test cubin:
// 16 more instructions than one f16 m16n8k16), so a decode GEMM that reuses one weight fragment
// for MG token groups paid the weight conversion MG times over. Here each fragment is converted
// once, by the same cvt instruction, and the MMA is the same pair of f16 MMAs with fp32
// accumulation: e4m3 -> f16 is exact, so the arithmetic is what the e4m3 mma.sync did. (Run 8:
// no faster — the conversions were not the bound; the HMMAs are: ~75-87 TFLOP/s of mma.sync on
// the H200 whatever the conversion count, see model/cuda_gemm.c.) fp16 wgmma on these same
// converted operands (gemm_fp8_stream.cu, WI = 3) gave bit-identical results in run 9.
//
// Layout: a 32-bit word holds 4 consecutive e4m3 (bytes b0..b3 = k 4i..4i+3 of the thread's
// 32-byte slice of a K block); it becomes two f16x2 words, lo = (b0, b1), hi = (b2, b3). One
// m16n8k16 f16 MMA takes, per thread, one such word of A row g (lo as a0... see mma_w) and one
// of row g + 8, and the same word of its token (B): lo lands on k 2t, 2t + 1 of the MMA, hi on
// 2t + 8, 2t + 9, so A and B see the same permutation of k and each dot product is complete.
// The e4m3 m16n8k32 of words (x, y) is mma_w(x) then mma_w(y), as ptxas lowers it.
#pragma once
#include <stdint.h>

#include "mma.cuh"

// (lo, hi) = f16x2 of the e4m3 pairs (b0, b1), (b2, b3) of w; exact
__device__ __forceinline__ void e4m3x4_f16(uint32_t w, uint32_t &lo, uint32_t &hi)
{
	asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
	    "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
	    : "=r"(lo), "=r"(hi)
	    : "r"(w));
}

// c += the 16 x 8 products over one word's 4 k: A row g word (ag_lo, ag_hi), row g + 8 word
// (ah_lo, ah_hi), token word (b_lo, b_hi), all converted by e4m3x4_f16
__device__ __forceinline__ void mma_w(float c[4], uint32_t ag_lo, uint32_t ag_hi, uint32_t ah_lo,
				      uint32_t ah_hi, uint32_t b_lo, uint32_t b_hi)
{
	mma_f16_16816(c, ag_lo, ah_lo, ag_hi, ah_hi, b_lo, b_hi);
}

// A 16-row x 128-K weight fragment of one thread, converted: words q = 0..7 of row g (the two
// 16-byte loads lo0, lo1 in order x, y, z, w) and of row g + 8 (hi0, hi1), each (lo, hi)
struct wfrag {
	uint32_t g[8][2], h[8][2];
};

__device__ __forceinline__ void wfrag_cvt(wfrag &f, uint4 lo0, uint4 lo1, uint4 hi0, uint4 hi1)
{
	const uint32_t a[8] = {lo0.x, lo0.y, lo0.z, lo0.w, lo1.x, lo1.y, lo1.z, lo1.w};
	const uint32_t b[8] = {hi0.x, hi0.y, hi0.z, hi0.w, hi1.x, hi1.y, hi1.z, hi1.w};
#pragma unroll
	for (int q = 0; q < 8; q++) {
		e4m3x4_f16(a[q], f.g[q][0], f.g[q][1]);
		e4m3x4_f16(b[q], f.h[q][0], f.h[q][1]);
	}
}

// c += one K block (128) of products: the converted weight fragment against 8 tokens whose raw
// e4m3 words are b0 (k bytes 0-15 of the slice), b1 (16-31); the token words are converted here
__device__ __forceinline__ void mma_kblock(float c[4], const wfrag &f, uint4 b0, uint4 b1)
{
	const uint32_t b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
	for (int q = 0; q < 8; q++) {
		uint32_t lo, hi;
		e4m3x4_f16(b[q], lo, hi);
		mma_w(c, f.g[q][0], f.g[q][1], f.h[q][0], f.h[q][1], lo, hi);
	}
}

// acc += K block kb of one token group, promoted: the converted weight fragment f (16 rows)
// against tokens tok0 + g (B column g: row tok0 + g of X, e4m3 at row stride K; zero from M on)
// gives a fresh fp32 fragment (mma_kblock), each (row, token) entry then scaled by
// SX[token][kb] · sw (the token's and the weight block's scales) into acc: acc0, acc1 row g,
// tokens tok0 + 2t, + 1; acc2, acc3 row g + 8. The decode kernels' step (gemm_fp8_decode.cu,
// gemm_fp8_gemv.cu).
// The operands of kblock_promote that come from memory: the token words (b0, b1: zero from M
// on) and the scales of the thread's two tokens (x0, x1: SX[token][kb], zero from M on). Where
// they come from (SRC):
//   KB_NC   an earlier kernel's output, read after griddepcontrol.wait by the non-coherent path
//           (__ldg; see pdl_wait in fwd_lin.cuh);
//   KB_OWN  written by other blocks of this grid before a grid-wide arrival (k_moe_gemv_block's
//           down phase): ordinary loads (ld.global.ca), never the non-coherent path, whose
//           contract is data nobody writes while the kernel runs;
//   KB_SMEM this block's shared memory (the one-token block's own quantised row, gemm_fp8_gemv.cu).
#define KB_NC 0
#define KB_OWN 1
#define KB_SMEM 2
struct kblock_tok {
	uint4 b0, b1;
	float x0, x1;
};

// A token's scale
template <int SRC>
__device__ __forceinline__ float kblock_scale(const float *__restrict__ p)
{
	return SRC == KB_OWN ? __ldca(p) : *p;
}

template <int SRC = KB_NC>
__device__ __forceinline__ void kblock_load(kblock_tok &o, const uint8_t *__restrict__ X,
					    const float *__restrict__ SX, int M, int K, int kb,
					    int tok0)
{
	const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, KB = K >> 7;
	o.b0 = make_uint4(0, 0, 0, 0), o.b1 = o.b0;
	if (tok0 + g < M) {
		const uint4 *xp = reinterpret_cast<const uint4 *>(X + (size_t)(tok0 + g) * K +
								  (size_t)kb * 128 + 32 * t);
		o.b0 = SRC == KB_OWN ? __ldca(xp) : SRC == KB_SMEM ? xp[0] : __ldg(xp);
		o.b1 = SRC == KB_OWN ? __ldca(xp + 1) : SRC == KB_SMEM ? xp[1] : __ldg(xp + 1);
	}
	const int m0 = tok0 + 2 * t;
	o.x0 = m0 < M ? kblock_scale<SRC>(SX + (size_t)m0 * KB + kb) : 0.f;
	o.x1 = m0 + 1 < M ? kblock_scale<SRC>(SX + (size_t)(m0 + 1) * KB + kb) : 0.f;
}

// acc += the K block's fresh products c, each (row, token) scaled by the token's scale times
// sw (the weight block's)
__device__ __forceinline__ void kblock_promote_c(float acc[4], const float c[4],
						 const kblock_tok &o, float sw)
{
	const float s0 = o.x0 * sw, s1 = o.x1 * sw;
	acc[0] += c[0] * s0;
	acc[1] += c[1] * s1;
	acc[2] += c[2] * s0;
	acc[3] += c[3] * s1;
}

template <int SRC = KB_NC>
__device__ __forceinline__ void kblock_promote(float acc[4], const wfrag &f,
					       const uint8_t *__restrict__ X,
					       const float *__restrict__ SX, int M, int K, int kb,
					       int tok0, float sw)
{
	kblock_tok o;
	kblock_load<SRC>(o, X, SX, M, K, kb, tok0);
	float c[4] = {0.f, 0.f, 0.f, 0.f};
	mma_kblock(c, f, o.b0, o.b1); // = the 4 e4m3 m16n8k32 of the K block
	kblock_promote_c(acc, c, o, sw);
}
