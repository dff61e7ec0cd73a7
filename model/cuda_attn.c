/*
 * cuda_attn.c — launchers of the attention kernels (see cuda_attn.h).
 */
#include "model/cuda_attn.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>

int cuda_mla_decode_splits(const struct gpu *g, int B, int H, int ld_sel)
{
	int blocks = B * (H / 16), splits = 1;
	while (blocks * splits < 2 * g->sm_count && ld_sel / (splits * 2) >= 128)
		splits *= 2;
	return splits;
}

size_t cuda_mla_decode_workspace(const struct gpu *g, int B, int H, int R, int ld_sel)
{
	int splits = cuda_mla_decode_splits(g, B, H, ld_sel);
	return splits > 1 ? (size_t)B * H * splits * (R + 2) * sizeof(float) : 0;
}

int cuda_mla_decode(struct gpu *g, gpu_ptr q, gpu_ptr sel, int ld_sel, gpu_ptr pool, int rec_bytes,
		    int R, int H, int B, float scale, gpu_ptr o_lat, gpu_ptr ws)
{
	if (R > 512 || R % 128 || H % 16 || B < 1 || ld_sel < 1)
		return -EINVAL;
	int splits = cuda_mla_decode_splits(g, B, H, ld_sel);
	if (splits > 1 && !ws)
		return -EINVAL;
	int kps = (ld_sel + splits - 1) / splits;
	void *args[] = {&q, &sel, &ld_sel, &pool, &rec_bytes, &R, &H, &scale, &o_lat, &kps, &ws};
	int r = gpu_launch(g, gpu_kernel(g, "k_mla_decode"), (unsigned)(H / 16), (unsigned)B,
			   (unsigned)splits, 256, 1, 1, 0, args);
	if (r || splits == 1)
		return r;
	void *cargs[] = {&ws, &splits, &R, &o_lat};
	return gpu_launch(g, gpu_kernel(g, "k_mla_combine"), (unsigned)(B * H), 1, 1,
			  (unsigned)(R < 32 ? 32 : R), 1, 1, 0, cargs);
}

#endif
