/*
 * cuda_gemm_wgmma.h — the FP8 block-scaled GEMM for many tokens (prefill, MoE prefill) on
 * Hopper's warpgroup MMA (kernels_ptx/gemm_fp8_wgmma.cu): bulk tensor copies (TMA) into
 * swizzled shared memory through an mbarrier pipeline, wgmma e4m3 with fp32 accumulators
 * promoted after every 128-wide K block (spec §5.4, DeepSeek's 2xAcc), bf16 output.
 *
 * Operands as in model/cuda_gemm.h: W8 e4m3 [N, K] with S fp32 [N/128, K/128], x8 e4m3 [M, K]
 * with sx fp32 [M, K/128] (UE8M0 values), y bf16 [M, ldy]. Shape contract: N % 64 == 0 (kv_a
 * has 576 rows; the last weight tile is masked), K % 128 == 0, ldy even and >= N (y's rows are
 * written as bf16 pairs); any M >= 1 (the last tile is masked).
 * Owns: tile choice, grid, the launch (the operand tensor maps come from cuda_gemm_tmap_2d,
 * model/cuda_gemm.h).
 * Must not: allocate device memory (the tensor maps travel as kernel parameters).
 */
#ifndef DSV32_CUDA_GEMM_WGMMA_H
#define DSV32_CUDA_GEMM_WGMMA_H

#include "driver/gpu.h"

#ifndef DSV32_NO_CUDA
/* 0, -EINVAL (shape contract), -ENOTSUP (no tensor-map entry point in this driver), or the
 * launch's error. */
int cuda_gemm_fp8_wgmma(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
			int M, int N, int K, int ldy);
/* The grouped form (MoE experts; arguments as cuda_gemm_fp8_grouped in model/cuda_gemm.h): the
 * weights of each group are found through w_tab/s_tab on the device, rows through off. */
int cuda_gemm_fp8_wgmma_grouped(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
				gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K,
				int ldy);
/* The MoE gate|up GEMM with SwiGLU and act_quant fused (the SwiGLU form of
 * kernels_ptx/gemm_fp8_wgmma.cu; paired by size, the codes stored from registers, unless
 * DSV32_CUDA_WGMMA_SW / _SWST say otherwise: cuda_gemm_wgmma.c): group e's weight w_tab[e] is
 * the fused W13 e4m3 [2I, K] (gate
 * rows then up rows, scales s_tab[e] fp32 [2I/128, K/128]); writes h8 e4m3 [max_rows, I] and
 * hs fp32 [max_rows, I/128], the act_quant of bf16( silu(g) * u ) of the bf16 GEMM outputs —
 * the bits of this kernel family's GEMM followed by k_moe_swiglu_quant. I % 128 == 0. */
int cuda_gemm_fp8_wgmma_grouped_swiglu(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off,
				       int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr h8, gpu_ptr hs,
				       int max_rows, int I, int K);
/* The paired grouped forms in the two calls above (the same outputs): mode 1 always, 0 never,
 * -1 by size (the default; DSV32_CUDA_WGMMA_PAIRED=0 / 1, read at the first call, sets 0 / 1).
 * Process-wide; for tests and diagnosis. */
void cuda_gemm_wgmma_set_paired(int mode);
/* The same with the form forced: mc 1, or 2 for clusters of 2 CTAs that share copies (two token
 * tiles of a group share each weight tile; a group's odd last token tile is shared by two weight
 * tiles; I % 256 == 0): the same outputs. */
int cuda_gemm_fp8_wgmma_grouped_swiglu_mc(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab,
					  gpu_ptr off, int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr h8,
					  gpu_ptr hs, int max_rows, int I, int K, int mc);
/* The SwiGLU form's e4m3 codes staged in shared memory and stored as 16-byte chunks (on: the _st
 * kernels, where h8 is 16-byte aligned; the same outputs) in the two calls above. Process-wide;
 * DSV32_CUDA_WGMMA_SWST=1, read at the first call, sets it; for tests and A/Bs. */
void cuda_gemm_wgmma_set_swiglu_staged(int on);
/* The same with the variant forced (tests and benchmarks compare them; the two above pick):
 *   bn: weight rows per tile, 128, 192 or 256 (256 needs ss);
 *   mc: 1, or 2 for clusters of two CTAs that share each weight tile (TMA multicast);
 *   ss: 1 = the scales staged in shared memory by a producer warp (not with bn = 192 and
 *       mc = 2, nor in the grouped form with bn = 192);
 *   flags: WGMMA_SKEW, the second consumer warpgroup starts after the first's first MMAs, so
 *       their promotions overlap each other's MMAs; WGMMA_DIAG_* (timing diagnostics, wrong
 *       output): no stores / no MMAs (flags are ignored for bn = 192 without ss);
 *       WGMMA_STAGED: the outputs staged in shared memory and stored as whole 16-byte chunks
 *       (bn = 128 or 256 with ss only; ldy % 8 == 0 and y 16-byte aligned); WGMMA_RASTER;
 *       WGMMA_PAIRED (grouped, staged, N % (2 bn) == 0): clusters of 2 CTAs, two token tiles of
 *       a group sharing each weight tile's copy, a group's odd last token tile shared by two
 *       weight tiles (the same outputs).
 * Grouped: G <= 1024; the per-group tensor maps live in one module-global table per GPU, so
 * one grouped GEMM runs at a time per GPU (stream order: the engine's one stream). */
enum { WGMMA_SKEW = 1, WGMMA_DIAG_NOSTORE = 2, WGMMA_DIAG_NOMMA = 4, WGMMA_STAGED = 16,
       WGMMA_PAIRED = 32 };
/* flags bits 8..15 (plain form): tile order in bands of that many weight tiles, the weight tile
 * fastest inside a band (0: the token tile fastest over all of M) */
#define WGMMA_RASTER(n) ((n) << 8)
int cuda_gemm_fp8_wgmma_tile(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx,
			     gpu_ptr y, int M, int N, int K, int ldy, int bn, int mc, int ss,
			     int flags);
int cuda_gemm_fp8_wgmma_grouped_bn(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off,
				   int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N,
				   int K, int ldy, int bn, int ss, int flags);
/* The token-wide grouped form (k_gemm_fp8_tw_grouped: 256 weight rows x a chunk of up to 144 of
 * a group's token rows an item; the same outputs as the forms above): N % 256 == 0, ldy % 8 == 0,
 * y 16-byte aligned. */
int cuda_gemm_fp8_tw_grouped(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
			     gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K, int ldy);
/* The token-wide form in clusters of 2 (mc 2: k_gemm_fp8_tw_grouped_mc2, where N % 512 == 0: a
 * cluster's item the two weight tiles of one chunk, each CTA copying half of the chunk's token
 * rows into both; the leader draws the items for both) or one CTA an item (1, the default: the
 * clusters measured even at 4096 tokens, slower at decode sizes). The same outputs.
 * Process-wide, < 0 back to the environment's; DSV32_CUDA_TW_MC=n, read at the first call,
 * sets it. */
void cuda_gemm_tw_set_mc(int mc);
/* Whether the MoE block runs its GEMMs at prefill sizes on the token-wide form (gate|up unfused:
 * bf16, then k_moe_swiglu_quant; down) rather than the 128-token tile forms (gate|up with the
 * SwiGLU fused): on by default; DSV32_CUDA_WGMMA_TW=0, read at the first call, turns it off. */
int cuda_gemm_wgmma_tw(void);
#endif

#endif
