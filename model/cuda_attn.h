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
 * bytes (0 allowed when that is 0). Tensor cores (bf16 mma.sync); the softmax weights are rounded
 * to bf16 before P V (kernels_ptx/mla_decode.cu says where this departs from attn_latent). */
int cuda_mla_decode(struct gpu *g, gpu_ptr q, gpu_ptr sel, int ld_sel, gpu_ptr pool, int rec_bytes,
		    int R, int H, int B, float scale, gpu_ptr o_lat, gpu_ptr ws);
#endif

#endif
