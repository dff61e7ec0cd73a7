/*
 * wgmma_layout.h — the wgmma GEMMs' launch constants, shared by the kernels
 * (kernels_ptx/gemm_fp8_wgmma.cu) and their launcher (model/cuda_gemm_wgmma.c), so that the two
 * cannot disagree on a block's threads, the size of the group-map table or a variant's dynamic
 * shared memory (the kernel file checks its own layouts against these with static_assert).
 * Plain preprocessor definitions: read by nvcc and by the C compiler.
 */
#ifndef DSV32_WGMMA_LAYOUT_H
#define DSV32_WGMMA_LAYOUT_H

#define WG_BM 128	   /* tokens per tile (2 consumer warpgroups x m64) */
#define WG_BK 128	   /* K bytes per stage = one scale block */
#define WG_THREADS 384	   /* producer warpgroup + 2 consumer warpgroups */
#define WG_MAX_GROUPS 1024 /* size of g_group_maps */
#define WG_SC_BYTES 528	   /* a stage's scales (SS variants): sx of 128 rows, 2 weight scales */

/* The tile form with BN weight rows a tile (st: its outputs staged for the stores): stages,
 * staged columns a round, and dynamic shared memory = stages x (the token tile, the weight
 * tile, 2 barriers, the scales) + the staged outputs (2 x 64 x ST_COLS bf16) + 1024 bytes of
 * alignment slack (wg_cfg in the kernel file) */
#define WG_STAGES(bn, st) ((bn) == 256 ? 4 : (bn) == 128 && !(st) ? 6 : 5)
#define WG_ST_COLS(bn) ((bn) > 128 ? 64 : (bn))
#define WG_SMEM(bn, st)                                                                        \
	(WG_STAGES(bn, st) * (WG_BM * WG_BK + (bn) * WG_BK + 2 * 8 + WG_SC_BYTES) +              \
	 ((st) ? 2 * 64 * WG_ST_COLS(bn) * 2 : 0) + 1024)

/* The token-wide form (k_gemm_fp8_tw_grouped): token rows an item at most (a multiple of 16),
 * stages, a stage's weight tile (256 rows x 128 K bytes), token rows and scale products, the
 * item queue's slots, a consumer warp's 1 KB of the 8 KB epilogue tile; dynamic shared memory =
 * the stages + the epilogue tile + 2 barriers a stage + the queue (2 barriers and an int a slot)
 * + 1024 bytes of alignment slack */
#define TW_N 144
#define TW_STAGES 4
#define TW_W_BYTES 32768
#define TW_X_BYTES (TW_N * 128)
#define TW_SC_BYTES 1280
#define TW_QSLOTS 2
#define TW_EP_WARP 1024
#define TW_SMEM                                                                                  \
	(TW_STAGES * (TW_W_BYTES + TW_X_BYTES + TW_SC_BYTES) + 8 * TW_EP_WARP + 2 * TW_STAGES * 8 + \
	 TW_QSLOTS * 20 + 1024)

#endif
