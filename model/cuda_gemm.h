/*
 * cuda_gemm.h — host launchers of the FP8 block-scaled GEMM kernels (kernels_ptx/gemm_fp8_*).
 *
 * Owns: choosing the kernel variant and grid for a shape, and checking the shape contract
 * (N % 16 == 0, K % 128 == 0, M <= 64 for the decode kernel). Must not: allocate.
 */
#ifndef DSV32_CUDA_GEMM_H
#define DSV32_CUDA_GEMM_H

#include "driver/gpu.h"

#ifndef DSV32_NO_CUDA
/* The decode kernel's split of a shape: ksplit warps share a tile's K; chunks of chunk_blocks
 * 128-wide K blocks are separate blocks (chunks > 1 needs a workspace). Depends only on N, K
 * and the GPU, never on M. */
struct gemm_split {
	int ksplit, chunks, chunk_blocks;
};
struct gemm_split cuda_gemm_decode_split(const struct gpu *g, int N, int K);
/* Workspace bytes the decode GEMM needs for M tokens (0 when K is not chunked). */
size_t cuda_gemm_decode_workspace(const struct gpu *g, int M, int N, int K);
/* y[M, ldy] (bf16) = x8[M, K] (e4m3, scales sx[M, K/128]) x W8[N, K]^T (e4m3, scales
 * S[N/128, K/128]), fp32 accumulation promoted per 128-block. M <= 64. ws: a workspace of
 * cuda_gemm_decode_workspace() bytes (may be 0 when that is 0). */
int cuda_gemm_fp8_decode(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
			 int M, int N, int K, int ldy, gpu_ptr ws);
#endif

#endif
