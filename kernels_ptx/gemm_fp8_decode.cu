// gemm_fp8_decode.cu — FP8 block-scaled GEMM for decode (M <= 64 tokens), spec §5.4:
//   y[m, n] = bf16( Σ_kb ( Σ_{k in kb} x8[m, k] · W8[n, k] ) · sx[m, kb] · S[n / 128, kb] )
// W8 e4m3 [N, K] (row stride K), S fp32 [N/128, K/128] (weight_scale_inv, multiplied),
// x8 e4m3 [M, K] (row stride K), sx fp32 [M, K/128] (UE8M0 act_quant scales), y bf16 [M, ldy].
//
// Decode is a stream of weights: every weight byte is read once, with 16-byte streaming loads
// (L1 no-allocate), two in flight per row per lane. The tensor cores do the arithmetic:
// mma.m16n8k32 e4m3 with the weights as A (16 output rows) and the tokens as B (8 per group),
// done as fp16 MMAs on fragments converted once (gemm_fp8_f16.cuh: sm_90 has no e4m3 mma.sync).
// Inside one 128-wide K block the 4 MMAs accumulate into a fresh fp32 fragment, which is then
// scaled and added to the fp32 accumulator ("promotion", as DeepSeek's 2xAcc), so limited
// tensor-core accumulation precision never spans more than 128 products.
//
// K order: lane (g, t) of a warp loads bytes [32t, 32t+32) of each 128-byte block of its rows
// and of its token's activations; MMA step s uses words 2s, 2s+1 of those 32 bytes for both A
// and B. A and B therefore see the same permutation of k, so every dot product is complete.
//
// Work split: a block of 8 warps covers `8 / ksplit` tiles of 16 rows; the ksplit warps of a
// tile take K blocks kb = ks, ks + ksplit, ... and their partial sums are added in smem in the
// fixed order ks = 0 .. ksplit-1. When a matrix has too few row tiles to fill the GPU, K is
// also cut into chunks of `chunk_blocks` blocks (the grid's y), whose fp32 partials are summed
// in chunk order by k_gemm_chunk_reduce. The split depends only on N and K, and each output
// element's arithmetic is independent of the other tokens: the result for (m, n) does not
// depend on M or on the batch (batch-invariant).
#include "common.cuh"
#include "gemm_fp8_f16.cuh"
#include "mma.cuh"

__device__ __forceinline__ uint4 ld_stream16(const uint8_t *p)
{
	uint4 r;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
		     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
		     : "l"(p));
	return r;
}

#define DEC_WARPS 8

// One work block (bx, by): tiles bx * tiles .. of 16 rows, K chunk by of `chunks`.
template <int MG> // token groups of 8: M <= 8 * MG
__device__ __forceinline__ void gemm_fp8_decode(const uint8_t *__restrict__ W,
						const float *__restrict__ S,
						const uint8_t *__restrict__ X,
						const float *__restrict__ SX,
						uint16_t *__restrict__ Y, int M, int N, int K,
						int ldy, int ksplit, float *__restrict__ partial,
						int chunk_blocks, int chunks, int bx, int by,
						float (*red)[16][8 * MG])
{
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int g = lane >> 2, t = lane & 3;
	const int tiles = DEC_WARPS / ksplit;
	const int tile = bx * tiles + warp / ksplit;
	const int ks = warp % ksplit;
	// K blocks of this work block's chunk (by); one chunk when chunks == 1
	const int KB = K >> 7;
	const int kb_begin = by * chunk_blocks;
	const int kb_end = min(KB, kb_begin + chunk_blocks);
	const int n0 = tile * 16;

	float acc[MG][4];
#pragma unroll
	for (int mg = 0; mg < MG; mg++)
		acc[mg][0] = acc[mg][1] = acc[mg][2] = acc[mg][3] = 0.f;

	if (n0 < N) {
		const uint8_t *w_lo = W + (size_t)(n0 + g) * K + 32 * t;
		const uint8_t *w_hi = w_lo + (size_t)8 * K;
		const float *s_row = S + (size_t)(n0 >> 7) * KB;
		// software pipeline: the next block's weights are in flight while this one computes
		int kb = kb_begin + ks;
		uint4 lo0, lo1, hi0, hi1;
		if (kb < kb_end) {
			lo0 = ld_stream16(w_lo + (size_t)kb * 128);
			lo1 = ld_stream16(w_lo + (size_t)kb * 128 + 16);
			hi0 = ld_stream16(w_hi + (size_t)kb * 128);
			hi1 = ld_stream16(w_hi + (size_t)kb * 128 + 16);
		}
		// programmatic dependent launch (model/cuda_gemm.c): the tokens and their scales are
		// the previous kernel's output; the first weights (constant) were loaded before
		asm volatile("griddepcontrol.wait;" ::: "memory");
		for (; kb < kb_end; kb += ksplit) {
			const uint4 a_lo0 = lo0, a_lo1 = lo1, a_hi0 = hi0, a_hi1 = hi1;
			const int kn = kb + ksplit;
			if (kn < kb_end) {
				lo0 = ld_stream16(w_lo + (size_t)kn * 128);
				lo1 = ld_stream16(w_lo + (size_t)kn * 128 + 16);
				hi0 = ld_stream16(w_hi + (size_t)kn * 128);
				hi1 = ld_stream16(w_hi + (size_t)kn * 128 + 16);
			}
			const float sw = s_row[kb];
			wfrag af; // the weight fragment, converted once for all token groups
			wfrag_cvt(af, a_lo0, a_lo1, a_hi0, a_hi1);
#pragma unroll
			for (int mg = 0; mg < MG; mg++) // token group mg (acc: rows g / g + 8 x its tokens)
				kblock_promote(acc[mg], af, X, SX, M, K, kb, mg * 8, sw);
		}
	} else {
		asm volatile("griddepcontrol.wait;" ::: "memory"); // (its outputs are written below)
	}
#pragma unroll
	for (int mg = 0; mg < MG; mg++) {
		red[warp][g][mg * 8 + 2 * t] = acc[mg][0];
		red[warp][g][mg * 8 + 2 * t + 1] = acc[mg][1];
		red[warp][g + 8][mg * 8 + 2 * t] = acc[mg][2];
		red[warp][g + 8][mg * 8 + 2 * t + 1] = acc[mg][3];
	}
	__syncthreads(); // every warp's partials are in smem before the fixed-order sum
	const int per_tile = 16 * M;
	for (int i = threadIdx.x; i < tiles * per_tile; i += blockDim.x) {
		const int tl = i / per_tile, r = i % per_tile;
		const int m = r / 16, row = r % 16;
		const int n = (bx * tiles + tl) * 16 + row;
		if (n >= N)
			continue;
		float sum = 0.f;
		for (int k = 0; k < ksplit; k++)
			sum += red[tl * ksplit + k][row][m];
		if (chunks == 1)
			Y[(size_t)m * ldy + n] = f32_to_bf16(sum);
		else // chunk partials, summed in chunk order by k_gemm_chunk_reduce
			partial[((size_t)by * M + m) * N + n] = sum;
	}
}

// y[m, n] = bf16( Σ_{c = 0 .. chunks-1} partial[c][m][n] ), the fixed-order sum of the K chunks.
extern "C" __global__ void __launch_bounds__(256)
k_gemm_chunk_reduce(const float *__restrict__ partial, uint16_t *__restrict__ Y, int chunks,
		    int M, int N, int ldy)
{
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); // (see gemm_fp8_decode)
	asm volatile("griddepcontrol.wait;" ::: "memory"); // the GEMM's partials (PDL launch)
	const long long total = (long long)M * N;
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (long long)gridDim.x * blockDim.x) {
		float sum = 0.f;
		for (int c = 0; c < chunks; c++)
			sum += partial[(size_t)c * total + i];
		Y[(i / N) * ldy + i % N] = f32_to_bf16(sum);
	}
}

// The grid: blocks_x x chunks blocks, block (x, y) the work block (bx, by) = (x, y).
#define DEC_ENTRY(MG, MINB)                                                                         \
	extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32, MINB)                        \
	k_gemm_fp8_decode_m##MG(const uint8_t *W, const float *S, const uint8_t *X,             \
				const float *SX, uint16_t *Y, int M, int N, int K, int ldy,     \
				int ksplit, float *partial, int chunk_blocks)                   \
	{                                                                                       \
		__shared__ float red[DEC_WARPS][16][8 * MG]; /* partials: warp, row, token */   \
		/* the next kernel (launched with PDL) may start and load its constants now; it \
		 * reads this grid's outputs only after its griddepcontrol.wait (grid complete) */ \
		asm volatile("griddepcontrol.launch_dependents;" ::: "memory");                   \
		gemm_fp8_decode<MG>(W, S, X, SX, Y, M, N, K, ldy, ksplit, partial, chunk_blocks, \
				    (int)gridDim.y, (int)blockIdx.x, (int)blockIdx.y, red);     \
	}

// blocks per SM the register budget is sized for (more warps hide more memory latency)
DEC_ENTRY(1, 3)
DEC_ENTRY(2, 2)
DEC_ENTRY(4, 1)
DEC_ENTRY(8, 1)
