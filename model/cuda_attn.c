/*
 * cuda_attn.c — launchers of the attention kernels (see cuda_attn.h).
 */
#include "model/cuda_attn.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/env_knob.h"

/* Programmatic dependent launch of the kernels that follow one of ours (k_mla_combine after
 * k_mla_decode, the top-k after the scores): launched while the first still runs (it triggers
 * with griddepcontrol.launch_dependents), their blocks wait in griddepcontrol.wait instead of
 * behind the launch gap (~3 us a launch on the H200, run 8). DSV32_ATTN_PDL=0 turns it off
 * (diagnosis); cuda_attn_set_pdl for benchmarks. */
static int attn_pdl = -1;

void cuda_attn_set_pdl(int on)
{
	attn_pdl = on;
}

static int pdl_on(void)
{
	return env_on(&attn_pdl, "DSV32_ATTN_PDL");
}

/* a launch by PDL where DSV32_ATTN_PDL lets it */
#define launch_pdl(g, fn, gx, gy, gz, bx, smem, args)                                            \
	gpu_launch_as(g, pdl_on(), fn, gx, gy, gz, bx, 1, 1, smem, args)

/* k_mla_decode's tiles: 64 heads of a row per block, keys in tiles of 64 */
#define MLA_HG 64
#define MLA_KT 64

/* Dynamic shared memory of k_mla_decode (its layout comment): Q and K [64][R + 64 + 8] fp16,
 * P_hi and P_lo [64][72] fp16, the raw records [64][rec_bytes rounded to 16], 5 x 64 floats,
 * 2 ints, the slots of two tiles (2 x 64 ints). */
static size_t mla_smem_bytes(int R, int rec_bytes)
{
	size_t ld = (size_t)R + 64 + 8, rb = ((size_t)rec_bytes + 15) & ~(size_t)15;
	return 2 * 64 * ld * 2 + 2 * 64 * 72 * 2 + 64 * rb + 5 * 64 * 4 + 2 * 4 + 2 * 64 * 4;
}

/* k_mla_decode_wg and k_mla_decode_wg2 (kernels_ptx/mla_wgmma.cu): the real latent only (R = 512,
 * 656-byte records), 64 heads a block, at most MLA_WG_MAXK keys a split; their dynamic shared
 * memory (the kernel's layout comment): 1024 of alignment, Q [9][64][128 B], two key tiles
 * [9][32][128 B], the S exchange 4 x 2048 floats, two tiles of raw records 2 x 32 x 656 bytes,
 * the split's slots, 4 mbarriers (k_mla_decode_wg2's). */
#define MLA_WG_REC 656
#define MLA_WG_PAIR 0x10000 /* diag bit 16: k_mla_decode_wg2 */
#define MLA_WG_LIGHT 0x200000 /* diag bit 21: its CTA-scope handover between the pair */
#define MLA_WG_MAXK 2048
static size_t mla_wg_smem_bytes(void)
{
	return 1024 + 9 * 64 * 128 + 2 * 9 * 32 * 128 + 4 * 2048 * 4 + 2 * 32 * MLA_WG_REC + MLA_WG_MAXK * 4 + 4 * 8;
}

/* keys a split covers: ld_sel over `splits`, rounded up to whole tiles of `tile` keys */
static int mla_keys_per_split_t(int ld_sel, int splits, int tile)
{
	int kps = (ld_sel + splits - 1) / splits;
	return (kps + tile - 1) / tile * tile;
}

static int mla_keys_per_split(int ld_sel, int splits)
{
	return mla_keys_per_split_t(ld_sel, splits, MLA_KT);
}

int cuda_mla_decode_splits(const struct gpu *g, int B, int H, int ld_sel)
{
	/* one block per SM (~200 KB of shared memory): split the keys while the blocks do not fill
	 * the SMs, keeping >= 64 keys (one tile) per split */
	int blocks = B * ((H + MLA_HG - 1) / MLA_HG), splits = 1;
	while (blocks * splits * 2 <= g->sm_count && ld_sel / (splits * 2) >= MLA_KT && splits < 64)
		splits *= 2;
	int kps = mla_keys_per_split(ld_sel, splits);
	return (ld_sel + kps - 1) / kps;
}

size_t cuda_mla_decode_workspace(const struct gpu *g, int B, int H, int R, int ld_sel)
{
	int splits = cuda_mla_decode_splits(g, B, H, ld_sel);
	return splits > 1 ? (size_t)B * H * splits * (R + 2) * sizeof(float) : 0;
}

/* keys a split of cuda_mla_decode_diag's kernel: the splits forced by diag bits 8-15
 * (benchmarks), else by the shape; forced splits of the wgmma kernels in whole tiles of 32 keys
 * (theirs; 64 splits of 2048 keys are one tile each), the caller's workspace holding the forced
 * count */
static int mla_split_keys(const struct gpu *g, int B, int H, int ld_sel, int diag)
{
	int splits = (diag >> 8) & 255;
	if (!splits)
		splits = cuda_mla_decode_splits(g, B, H, ld_sel);
	return mla_keys_per_split_t(ld_sel, splits, (diag & 0xff00) && (diag & 128) ? 32 : MLA_KT);
}

/* the key splits the kernel then runs */
static int mla_final_splits(const struct gpu *g, int B, int H, int ld_sel, int diag)
{
	int kps = mla_split_keys(g, B, H, ld_sel, diag);
	return (ld_sel + kps - 1) / kps;
}

/* cuda_mla_decode takes k_mla_decode_wg2 with the light handover where it can (H % 128 == 0:
 * run 19, 128 rows: 32K 345.1-347.4 us against k_mla_decode_wg's ~392, 128K 362.2 against
 * ~399-455, 8K 175.6, 1K 246.3 against 302.5; batch 1 16.5 against 16.5-16.7; the same bits as
 * k_mla_decode_wg in every test), else k_mla_decode_wg (run 13, 32K: batch 1 16.6 against k_mla_decode's 21.1 us,
 * 128: 402.7 / 615.3); DSV32_MLA_WG=1 keeps k_mla_decode_wg, 0 k_mla_decode (diagnosis) */
static int mla_wg_default = -1;

static int mla_wg_mode(void)
{
	if (mla_wg_default < 0) {
		const int v = env_int("DSV32_MLA_WG", 2);
		mla_wg_default = v == 0 || v == 1 ? v : 2;
	}
	return mla_wg_default;
}

/* DSV32_MLA_PDL (cuda_attn_set_mla_pdl, the forward's switch; default 1): the wgmma decode kernels
 * launched as programmatic dependents of the kernel before them (the top-k, which lets its
 * dependents start once its blocks have their inputs): their set-up (mbarriers, the cluster
 * barrier) overlaps its end; they wait (griddepcontrol.wait) before reading anything. Bench
 * model --ab DSV32_MLA_PDL=1 at batch 1, 32K / 128K: run 25 -2.7 / -0.9 us, run 26 -4.6 and -0.9
 * / -6.7 us a step. 0: ordinary launches */
static int mla_pdl = -1;

#define MLA_PDL_DEFAULT 1

void cuda_attn_set_mla_pdl(int on)
{
	mla_pdl = on < 0 ? MLA_PDL_DEFAULT : on > 0;
}

static int mla_pdl_on(void)
{
	if (mla_pdl < 0) {
		const int v = env_int("DSV32_MLA_PDL", -1);
		cuda_attn_set_mla_pdl(v < 0 ? -1 : v == 1);
	}
	return mla_pdl && pdl_on();
}

/* the diag bits of cuda_mla_decode's kernel for this shape */
static int mla_default_diag(struct gpu *g, int R, int rec_bytes, int H, int B, int ld_sel)
{
	int mode = mla_wg_mode();
	if (mode && R == 512 && rec_bytes == MLA_WG_REC && H % MLA_HG == 0 && B >= 1 && ld_sel >= 1 &&
	    mla_keys_per_split(ld_sel, cuda_mla_decode_splits(g, B, H, ld_sel)) <= MLA_WG_MAXK)
		return mode == 2 && H % (2 * MLA_HG) == 0 ? 128 | MLA_WG_PAIR | MLA_WG_LIGHT : 128;
	return 0;
}

int cuda_mla_decode(struct gpu *g, gpu_ptr q, gpu_ptr sel, int ld_sel, gpu_ptr pool, int rec_bytes,
		    int R, int H, int B, float scale, gpu_ptr o_lat, gpu_ptr ws)
{
	return cuda_mla_decode_diag(g, q, sel, ld_sel, pool, rec_bytes, R, H, B, scale, o_lat, ws,
				    mla_default_diag(g, R, rec_bytes, H, B, ld_sel));
}

int cuda_mla_decode_diag(struct gpu *g, gpu_ptr q, gpu_ptr sel, int ld_sel, gpu_ptr pool, int rec_bytes,
			 int R, int H, int B, float scale, gpu_ptr o_lat, gpu_ptr ws, int diag)
{
	if (R > 512 || R < 128 || R % 128 || H % 16 || H < 16 || B < 1 || ld_sel < 1 || rec_bytes % 4 ||
	    ((diag >> 8) & 255) > 64)
		return -EINVAL;
	int splits = mla_final_splits(g, B, H, ld_sel, diag);
	int kps = mla_split_keys(g, B, H, ld_sel, diag);
	if ((splits > 1 && !ws) || ((diag & 128) && kps > MLA_WG_MAXK))
		return -EINVAL;
	const int skip_main = diag & 16, skip_combine = diag & 8, wg = diag & 128, pair = diag & MLA_WG_PAIR;
	if ((wg && (R != 512 || rec_bytes != MLA_WG_REC || H % MLA_HG)) || (pair && (!wg || H % (2 * MLA_HG))))
		return -EINVAL;
	const char *name = pair ? "k_mla_decode_wg2" : wg ? "k_mla_decode_wg" : "k_mla_decode";
	/* the kernel's own switches (bit 19 -> 4, 20 -> 3, 21 -> 7) */
	diag = (diag & 0x67) | (diag & 0x80000 ? 16 : 0) | (diag & 0x100000 ? 8 : 0) | (diag & 0x200000 ? 128 : 0);
	void *fn;
	int r = gpu_kernel_smem(g, name, &fn);
	if (r)
		return r;
	unsigned smem = (unsigned)(wg ? mla_wg_smem_bytes() : mla_smem_bytes(R, rec_bytes));
	void *args[] = {&q, &sel, &ld_sel, &pool, &rec_bytes, &R, &H, &scale, &o_lat, &kps, &ws, &diag};
	/* the wgmma kernels wait for their inputs themselves: by PDL where DSV32_MLA_PDL is on */
	r = skip_main ? 0
		      : gpu_launch_as(g, wg && mla_pdl_on(), fn, (unsigned)((H + MLA_HG - 1) / MLA_HG),
				      (unsigned)B, (unsigned)splits, wg ? 384 : 512, 1, 1, smem, args);
	if (r || splits == 1 || skip_combine)
		return r;
	void *cargs[] = {&ws, &splits, &R, &o_lat};
	return launch_pdl(g, gpu_kernel(g, "k_mla_combine"), (unsigned)(B * H), 1, 1, (unsigned)(R < 32 ? 32 : R),
			  0, cargs);
}

/* Keys a warp of k_indexer_scores_fp8 scans: 256, halved while the grid would have fewer than 1.5
 * blocks an SM, down to 16 (one group): a small batch spreads its rows over every SM instead of
 * running 16 dependent copy rounds in 32 blocks. Run 8 (keys a warp 16..256): batch 1 x 32K
 * best at 32 (5.9 us; 16: 7.2), x 128K at 128 (11.2; 16: 16.0), 128K x 128 at 256 (828 us). */
static int indexer_keys_per_warp(const struct gpu *g, int ld, int B)
{
	int kpw = 256;
	while (kpw > 16 && 2LL * B * ((ld + 4 * kpw - 1) / (4 * kpw)) < 3LL * g->sm_count)
		kpw /= 2;
	return kpw;
}

int cuda_indexer_scores_kpw(struct gpu *g, gpu_ptr q8, gpu_ptr w, int H, gpu_ptr pool, long long page_bytes,
			    gpu_ptr block_table, int max_blocks, gpu_ptr n_keys, gpu_ptr scores, int ld, int B,
			    int keys_per_warp)
{
	if (H < 1 || H > 64 || B < 1 || ld < 1 || page_bytes % 16 || keys_per_warp < 0 || keys_per_warp % 16 ||
	    keys_per_warp > 1024)
		return -EINVAL;
	int kpw = keys_per_warp ? keys_per_warp : indexer_keys_per_warp(g, ld, B);
	void *args[] = {&q8, &w, &H, &pool, &page_bytes, &block_table, &max_blocks, &n_keys, &scores, &ld, &kpw};
	return gpu_launch(g, gpu_kernel(g, "k_indexer_scores_fp8"), (unsigned)((ld + 4 * kpw - 1) / (4 * kpw)),
			  (unsigned)B, 1, 128, 1, 1, 0, args);
}

int cuda_indexer_scores(struct gpu *g, gpu_ptr q8, gpu_ptr w, int H, gpu_ptr pool, long long page_bytes,
			gpu_ptr block_table, int max_blocks, gpu_ptr n_keys, gpu_ptr scores, int ld, int B)
{
	return cuda_indexer_scores_kpw(g, q8, w, H, pool, page_bytes, block_table, max_blocks, n_keys, scores, ld,
				       B, 0);
}

/* Dynamic shared memory of k_topk_select: 8 copies of 2048 bins (+1 of padding each), 8192
 * candidates (key, position), two bitmaps of ld bits. */
static size_t topk_smem_bytes(int ld)
{
	return 8 * 2049 * 4 + 8192 * 8 + 2 * (((size_t)ld + 31) / 32) * 4;
}

/* k_topk_cl8 / k_topk_cl16 / k_topk_cl4: a row over a cluster of 8, 16 or 4 CTAs of 1024
 * threads; each CTA holds S = ceil(ld / CL) rounded up to 64 keys of it and their block-table entries,
 * after two histograms of 2048 bins and two sets of 64 bucket sums, then (16-byte aligned) three
 * rounds' inboxes of CL x 96 ints; S at most TOPK_CL_SLICE (the output's packed counts: S << 16
 * fits an int) */
#define TOPK_CL_SLICE 32704
static int topk_cl_slice(int ld, int cl)
{
	return ((ld + cl - 1) / cl + 63) / 64 * 64;
}

static size_t topk_cl_smem_bytes(int ld, int cl)
{
	int S = topk_cl_slice(ld, cl);
	size_t b = (2 * 2048 + 2 * 64) * 4 + (size_t)S * 4 + (size_t)(S / 64 + 1) * 4;
	return (b + 15) / 16 * 16 + (size_t)3 * cl * 96 * 4;
}

/* DSV32_TOPK_MODE=m forces cuda_indexer_topk's kernel (cuda_indexer_topk_mode's modes; A/B);
 * cuda_attn_set_topk_mode sets it (the forward's switch) */
static int topk_forced = -1;

void cuda_attn_set_topk_mode(int mode)
{
	topk_forced = mode >= 0 && mode <= 5 ? mode : 0;
}

static int topk_env_mode(void)
{
	if (topk_forced < 0) {
		const int v = env_int("DSV32_TOPK_MODE", 0);
		topk_forced = v >= 1 && v <= 5 ? v : 0;
	}
	return topk_forced;
}

int cuda_indexer_topk_mode(struct gpu *g, gpu_ptr scores, int ld, gpu_ptr n_keys, int k_max,
			   gpu_ptr block_table, int max_blocks, gpu_ptr out_pos, gpu_ptr out_slot, int B, int mode)
{
	int stop = mode >> 4; /* the cluster kernels' phase stop (benchmarks) */
	mode &= 15;
	if (B < 1 || ld < 0 || k_max < 1 || mode < 0 || mode > 5 || (stop && mode != 2 && mode < 4))
		return -EINVAL;
	void *args[] = {&scores, &ld, &n_keys, &k_max, &block_table, &max_blocks, &out_pos, &out_slot, &stop};
	/* a cluster a row while the rows' clusters fit the SMs at once, from 8K keys: k_topk_cl16 for
	 * one row from 64K keys, k_topk_cl4 for 2-16 rows (up to 130816 keys), else k_topk_cl8 (run
	 * 22, bench attention, batch 1: cl8 8.38 / 9.30 / 14.35 us at 8K / 32K / 128K, the former
	 * k_topk_cluster 13.65 / 15.51 / 22.03; batch 64 at 32K: cl8 41.3 against k_topk_select's 19.4.
	 * Run 25: batch 1 at 128K cl16 11.00 (512 threads a CTA: 11.83), cl8 13.43; batch 16 at 8K /
	 * 32K cl4 7.02 / 9.84 against cl8's 11.05 / 16.71 (16 clusters of 8 do not fit the GPCs at
	 * once), batch 64 cl4 26.8 against select's 19.5), else a block a row */
	if (!mode) {
		if (B == 1 && ld >= 65536 && topk_cl_slice(ld, 16) <= TOPK_CL_SLICE)
			mode = 4;
		else if (B > 1 && B <= 16 && ld >= 8192 && topk_cl_slice(ld, 4) <= TOPK_CL_SLICE)
			mode = 5;
		else if (B * 8 <= g->sm_count && ld >= 8192 && topk_cl_slice(ld, 8) <= TOPK_CL_SLICE)
			mode = 2;
		else
			mode = topk_smem_bytes(ld) <= 200 * 1024 ? 1 : 3;
	}
	if (mode == 3) /* rows beyond ~1.2 M keys: the one-block radix select */
		return launch_pdl(g, gpu_kernel(g, "k_topk"), (unsigned)B, 1, 1, 1024, 0, args);
	if (mode == 2 || mode >= 4) {
		const int cl = mode == 4 ? 16 : mode == 5 ? 4 : 8;
		if (ld < 1 || topk_cl_slice(ld, cl) > TOPK_CL_SLICE)
			return -EINVAL;
		void *fn;
		int r = gpu_kernel_smem(g, cl == 8 ? "k_topk_cl8" : cl == 4 ? "k_topk_cl4" : "k_topk_cl16",
					&fn);
		if (r)
			return r;
		size_t smem = topk_cl_smem_bytes(ld, cl);
		if (cl > 8)
			CU_TRY(cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
		return launch_pdl(g, fn, (unsigned)cl, (unsigned)B, 1, 1024, (unsigned)smem, args);
	}
	if (topk_smem_bytes(ld) > 200 * 1024)
		return -EINVAL;
	void *fn;
	int r = gpu_kernel_smem(g, "k_topk_select", &fn);
	if (r)
		return r;
	size_t smem = topk_smem_bytes(ld);
	return launch_pdl(g, fn, (unsigned)B, 1, 1, 1024, (unsigned)smem, args);
}

int cuda_indexer_topk(struct gpu *g, gpu_ptr scores, int ld, gpu_ptr n_keys, int k_max,
		      gpu_ptr block_table, int max_blocks, gpu_ptr out_pos, gpu_ptr out_slot, int B)
{
	int mode = topk_env_mode();
	if (mode == 5 && topk_cl_slice(ld, 4) > TOPK_CL_SLICE) /* k_topk_cl4 forced: the dispatch's beyond it */
		mode = 0;
	return cuda_indexer_topk_mode(g, scores, ld, n_keys, k_max, block_table, max_blocks, out_pos, out_slot, B,
				      mode);
}

#endif
