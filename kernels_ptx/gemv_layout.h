/*
 * gemv_layout.h — the one-row kernel's launch constants (kernels_ptx/gemm_fp8_gemv.cu:
 * k_gemm_fp8_gemv, k_gemm_fp8_gemv_g, k_moe_gemv_block*), shared with its launcher
 * (model/cuda_gemm.c) so that the two cannot disagree on a block's threads, the ring's slots,
 * the arrival counts or the shared memory ahead of the ring. Plain preprocessor definitions:
 * read by nvcc and by the C compiler.
 */
#ifndef DSV32_GEMV_LAYOUT_H
#define DSV32_GEMV_LAYOUT_H

#define GV_CW 8			      /* consumer warps (and one producer warp) */
#define GV_THREADS ((GV_CW + 1) * 32) /* a block */
#define GV_MAXSTAGES 16		      /* the ring's slots at most (its barriers' room) */
#define GV_SLOTS 16		      /* arrival-count sets, taken in turn by the host's launches */
#define GV_TILES 16384		      /* (slice, 16-row tile) pairs a set counts */

/* Shared memory ahead of the ring: the ring's full and empty barriers, two sets of the warps'
 * unit sums (16 rows x 8 tokens of fp32 a warp), the last-arrival flags (128 bytes) */
#define GV_RED_OFF (2 * GV_MAXSTAGES * 8)
#define GV_FLAG_OFF (GV_RED_OFF + 2 * GV_CW * 128 * 4)
#define GV_RING_OFF (GV_FLAG_OFF + 128)

/* The one-token block that routes itself (k_moe_gemv_block_r1, k_moe_gemv_block1_r1): a routing
 * warp beside the consumers and the producer; after the slices, the routing warp's picks (32
 * expert ids, 32 weights) and the token's row quantised (D e4m3 codes, D / 128 fp32 scales) */
#define GV_R1_THREADS ((GV_CW + 2) * 32)
#define GV_R1_PICKS 256
#define GV_R1_SMEM(D) (GV_R1_PICKS + (D) + (D) / 128 * 4)

#endif
