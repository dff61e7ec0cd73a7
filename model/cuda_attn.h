/*
 * cuda_attn.h — host launchers of the attention kernels (kernels_ptx/mla_decode.cu, ...).
 *
 * Owns: choosing grids and splits for a shape. Must not: allocate (workspaces come from the
 * caller's scratch arena).
 */
#ifndef DSV32_CUDA_ATTN_H
#define DSV32_CUDA_ATTN_H

#include "driver/gpu.h"

#ifndef DSV32_NO_CUDA
/* Splits of the key list the sparse MLA decode uses for B rows of H heads over ld_sel keys: one
 * block is 64 heads of a row (one block per SM); the keys are split (in whole tiles of 64) while
 * the blocks would fill at most half of the SMs. */
int cuda_mla_decode_splits(const struct gpu *g, int B, int H, int ld_sel);
size_t cuda_mla_decode_workspace(const struct gpu *g, int B, int H, int R, int ld_sel);
/* o_lat[B, H, R] (bf16) = sparse MLA decode of q[B, H, R + 64] over the slots sel[B, ld_sel]
 * (-1 ends a row's list, and every entry after it must be -1 too, as k_topk writes them) of the
 * layer's MLA records at pool (rec_bytes each). ws: a workspace of cuda_mla_decode_workspace()
 * bytes (0 allowed when that is 0). Tensor cores (fp16 operands); the softmax weights go into
 * P V as two fp16 parts (kernels_ptx/mla_decode.cu says where this departs from attn_latent).
 * k_mla_decode_wg2 (wgmma, a cluster of the row's two 64-head blocks, kernels_ptx/mla_wgmma.cu)
 * where it applies (R = 512, 656-byte records, H % 128 == 0, <= 2048 keys a split), else
 * k_mla_decode_wg (H % 64 == 0), else k_mla_decode; DSV32_MLA_WG=1: never the pair, 0: always
 * k_mla_decode. */
int cuda_mla_decode(struct gpu *g, gpu_ptr q, gpu_ptr sel, int ld_sel, gpu_ptr pool, int rec_bytes,
		    int R, int H, int B, float scale, gpu_ptr o_lat, gpu_ptr ws);
/* The same with the kernel's phase switches (benchmarks only: bit 0 no gathers after the first
 * tile, bit 1 no MMAs, bit 2 no dequantisation after the first tile, bit 3 no combine, bit 4 the
 * combine alone, bit 5 no load of Q, bit 6 no output stores, bit 19 no softmax (the wgmma kernels;
 * P V with zero weights); bits 0-6 and 19 leave the output meaningless) and bits 8-15 forcing the number of key splits (rounded to whole tiles of 64
 * keys; ws must then hold B x H x splits x (R + 2) floats, as cuda_mla_decode_workspace; a
 * correct result). Bit 7 takes k_mla_decode_wg (kernels_ptx/mla_wgmma.cu: wgmma, R = 512 and
 * 656-byte records and H % 64 == 0 and at most 2048 keys a split only, else -EINVAL; the same
 * limits of attn_latent). Bit 16 (with bit 7) takes k_mla_decode_wg2: the pair of 64-head blocks of a
 * row as a cluster sharing the dequantisation of their keys (H % 128 == 0, else -EINVAL). Bit 20
 * (the wgmma kernels): P V of a key tile and S of the next issued together, one wait a tile (a
 * correct result, the same bits; not yet the default). Bit 21 (k_mla_decode_wg2): the light
 * handover between the CTAs (mbarrier arrivals and waits at CTA scope; the default). */
int cuda_mla_decode_diag(struct gpu *g, gpu_ptr q, gpu_ptr sel, int ld_sel, gpu_ptr pool, int rec_bytes,
			 int R, int H, int B, float scale, gpu_ptr o_lat, gpu_ptr ws, int diag);
/* DSV32_MLA_PDL (default 1): the wgmma decode kernels launched as programmatic dependents of the
 * kernel before them (the top-k in the forward), their set-up overlapping its end (0: ordinary
 * launches; the A/B switch of the forward); this sets it (1 on, 0 off, < 0 the default) */
void cuda_attn_set_mla_pdl(int on);
/* Programmatic dependent launch of k_mla_combine after k_mla_decode and of the top-k after the
 * scores: on unless DSV32_ATTN_PDL=0; benchmarks may switch it (1 on, 0 off). */
void cuda_attn_set_pdl(int on);
/* Lightning-indexer scores (spec §3.6 step 8) of B query rows over their paged FP8 keys
 * (k_indexer_scores_fp8: e4m3 converted to fp16 once per 16 keys, fp16 tensor cores with fp32
 * accumulation): q8 e4m3 [B, H, 128] (H <= 64), w fp32 [B, H] (the folded head weights), pages of
 * page_bytes (64 x 128 codes, then 64 fp32 scales; page_bytes % 16 == 0) through block_table
 * [B, max_blocks], n_keys int [B]; scores fp32 [B, ld], -inf from n_keys[b] on. The dots are
 * exact products summed in fp32 (another order than the CPU's; within 2^-23 of the sum of
 * |products| on the H200). */
int cuda_indexer_scores(struct gpu *g, gpu_ptr q8, gpu_ptr w, int H, gpu_ptr pool, long long page_bytes,
			gpu_ptr block_table, int max_blocks, gpu_ptr n_keys, gpu_ptr scores, int ld, int B);
/* The same with the keys each warp scans given (a multiple of 16, <= 1024; 0: chosen by the
 * shape, as cuda_indexer_scores does): tests and benchmarks. */
int cuda_indexer_scores_kpw(struct gpu *g, gpu_ptr q8, gpu_ptr w, int H, gpu_ptr pool, long long page_bytes,
			    gpu_ptr block_table, int max_blocks, gpu_ptr n_keys, gpu_ptr scores, int ld, int B,
			    int keys_per_warp);
/* The indexer's top-k (kernels_ptx/topk.cu): for each of B rows, the min(k_max, n_keys[b])
 * highest of scores[b, 0 .. n_keys[b]) (fp32, row stride ld), the set of a full sort with ties
 * to the lower position, as positions (out_pos) and/or physical slots through block_table
 * [B, max_blocks] (out_slot), ascending, -1 padded to k_max; either output may be 0. scores may
 * be 0 when every n_keys[b] <= k_max. A row over a cluster of CTAs from 8192 keys while the
 * clusters fit the SMs (k_topk_cl16 for one row of >= 65536 keys, k_topk_cl4 for 2-16 rows of at
 * most 130816, else k_topk_cl8 while 8 B <= the SMs; ld <= 261632), else k_topk_select (a block a
 * row, two reads of it) when its bitmaps fit in shared memory, else k_topk; DSV32_TOPK_MODE=m
 * (1-5) forces cuda_indexer_topk_mode's mode m (A/B; 5 leaves rows it cannot take to the
 * dispatch). */
int cuda_indexer_topk(struct gpu *g, gpu_ptr scores, int ld, gpu_ptr n_keys, int k_max,
		      gpu_ptr block_table, int max_blocks, gpu_ptr out_pos, gpu_ptr out_slot, int B);
/* Sets the mode DSV32_TOPK_MODE gives (0: the dispatch's own choice, else 1-5 below; A/B switches) */
void cuda_attn_set_topk_mode(int mode);
/* The same with the kernel chosen (tests, benchmarks): mode 0 as above, 1 k_topk_select, 2
 * k_topk_cl8, 3 k_topk, 4 k_topk_cl16, 5 k_topk_cl4 (ld <= 130816); -EINVAL where the chosen
 * kernel cannot take ld.
 * Benchmarks only: mode m | s << 4 (m = 2, 4, 5) stops the cluster kernel after its load (s = 1),
 * its first round (2) or all its rounds (3), the output then incomplete. */
int cuda_indexer_topk_mode(struct gpu *g, gpu_ptr scores, int ld, gpu_ptr n_keys, int k_max,
			   gpu_ptr block_table, int max_blocks, gpu_ptr out_pos, gpu_ptr out_slot, int B, int mode);
#endif

#endif
