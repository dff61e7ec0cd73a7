/*
 * cuda_gemm_wgmma.c — host side of the wgmma FP8 GEMM (kernels_ptx/gemm_fp8_wgmma.cu): tensor
 * maps (cuda_gemm_tmap_2d), tile width, persistent grid, the shape contract; and the
 * grouped form's per-group weight maps, made on the device by k_wgmma_group_maps just before
 * the GEMM (the weight addresses live in a device table; see the kernel file's header).
 */
#include "model/cuda_gemm_wgmma.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels_ptx/wgmma_layout.h" /* the kernels' launch constants and shared memory */
#include "model/cuda_gemm.h"		    /* cuda_gemm_tmap_2d: the operand tensor maps */
#include "model/env_knob.h"

static int launch_n(struct gpu *g, const char *name, unsigned grid, unsigned smem, void **args,
		    int n_args)
{
	void *fn;
	int r = gpu_kernel_smem(g, name, &fn); /* (above 48 KB a kernel must opt in) */
	return r ? r : gpu_launch_n(g, fn, grid, 1, 1, WG_THREADS, 1, 1, smem, args, n_args);
}
/* (with the argument array's length, as gpu_launch) */
#define launch(g, name, grid, smem, args) launch_n(g, name, grid, smem, args, GPU_NARGS(args))

static int shape_ok(const char *what, int M, int N, int K, int ldy)
{
	if (M >= 1 && N >= 64 && N % 64 == 0 && K >= 128 && K % 128 == 0 && ldy >= N && ldy % 2 == 0)
		return 1;
	fprintf(stderr, "<3>dsv32: %s: unsupported shape M=%d N=%d K=%d ldy=%d\n", what, M, N, K,
		ldy);
	return 0;
}

int cuda_gemm_fp8_wgmma_tile(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx,
			     gpu_ptr y, int M, int N, int K, int ldy, int bn, int mc, int ss,
			     int flags)
{
	int st = (flags & WGMMA_STAGED) != 0;
	if (!shape_ok("gemm_fp8_wgmma", M, N, K, ldy) || (bn != 128 && bn != 192 && bn != 256) ||
	    (mc != 1 && mc != 2) || (ss != 0 && ss != 1) ||
	    (st && (bn == 192 || !ss || ldy % 8 || y % 16)) || (bn == 256 && !ss))
		return -EINVAL;
	CUtensorMap mA, mB;
	int r;
	/* with clusters each CTA copies (and multicasts) bn / mc rows of the weight tile */
	if ((r = cuda_gemm_tmap_2d(&mA, x8, M, K, WG_BM)) ||
	    (r = cuda_gemm_tmap_2d(&mB, W, N, K, bn / mc)))
		return r;
	/* work items: groups of mc token tiles x weight tiles, one cluster of mc CTAs each */
	long long items = (long long)(((M + WG_BM - 1) / WG_BM + mc - 1) / mc) * ((N + bn - 1) / bn);
	long long clusters = g->sm_count / mc;
	unsigned grid = (unsigned)((items < clusters ? items : clusters) * mc);
	void *args[] = {&mA, &mB, &sx, &S, &y, &M, &N, &K, &ldy, &flags};
	static const char *names[2][2][2] = {
		{{"k_gemm_fp8_wgmma_n128", "k_gemm_fp8_wgmma_n192"},
		 {"k_gemm_fp8_wgmma_mc2_n128", "k_gemm_fp8_wgmma_mc2_n192"}},
		{{"k_gemm_fp8_wgmma_n128_ss", "k_gemm_fp8_wgmma_n192_ss"},
		 {"k_gemm_fp8_wgmma_mc2_n128_ss", NULL}}}; /* (its scale warp would spill) */
	const char *name = bn < 256    ? names[ss][mc - 1][bn == 192]
			   : mc == 1 ? "k_gemm_fp8_wgmma_n256_ss"
				     : "k_gemm_fp8_wgmma_mc2_n256_ss";
	if (st && bn == 128)
		name = mc == 1 ? "k_gemm_fp8_wgmma_n128_ss_st" : "k_gemm_fp8_wgmma_mc2_n128_ss_st";
	else if (st)
		name = mc == 1 ? "k_gemm_fp8_wgmma_n256_ss_st" : "k_gemm_fp8_wgmma_mc2_n256_ss_st";
	if (!name)
		return -EINVAL;
	return launch(g, name, grid, (unsigned)WG_SMEM(bn, st), args);
}

/* The default variant, from the measurements at M = 128 .. 4096 (runs 4 and 5,
 * test_gpu_wgmma): with many tokens and many weight rows, 128 x 256 tiles with the outputs
 * staged for whole-chunk stores (run 5, M = 4096: 1.04-1.10 PFLOP/s on 7 of the 8 issue-9
 * shapes, 0.85 on K = 512); otherwise 128 x 128 tiles staged the same way; without staging
 * where y's rows are not 16-byte aligned. */
int cuda_gemm_fp8_wgmma(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
			int M, int N, int K, int ldy)
{
	int staged = ldy % 8 == 0 && y % 16 == 0;
	int bn = M >= 1024 && N >= 4096 ? 256 : 128;
	return cuda_gemm_fp8_wgmma_tile(g, W, S, x8, sx, y, M, N, K, ldy, bn, 1, 1,
					staged ? WGMMA_STAGED : 0);
}

/* The grouped forms' per-group weight maps, made on the device just before the GEMM
 * (k_wgmma_group_maps: tmpl with each non-empty group's address w_tab[e]). */
static int group_maps(struct gpu *g, CUtensorMap *tmpl, gpu_ptr w_tab, gpu_ptr off, int G)
{
	void *args[] = {tmpl, &w_tab, &off, &G};
	return gpu_launch(g, gpu_kernel(g, "k_wgmma_group_maps"), (unsigned)G, 1, 1, 32, 1, 1, 0,
			  args);
}

int cuda_gemm_fp8_wgmma_grouped_bn(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off,
				   int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N,
				   int K, int ldy, int bn, int ss, int flags)
{
	if (max_rows == 0 && G >= 1)
		return 0; /* no rows in any group */
	int st = (flags & WGMMA_STAGED) != 0, paired = (flags & WGMMA_PAIRED) != 0;
	if (!shape_ok("gemm_fp8_wgmma_grouped", max_rows, N, K, ldy) || G < 1 ||
	    G > WG_MAX_GROUPS || (bn != 128 && bn != 192 && bn != 256) || (ss && bn == 192) ||
	    (!ss && bn == 256) || (st && (bn == 192 || !ss || ldy % 8 || y % 16)) ||
	    (paired && (!st || N % (2 * bn) || g->sm_count < 2)))
		return -EINVAL;
	/* the template: any valid address (x8), replaced per group on the device (paired: boxes of
	 * bn / 2 weight rows; the token rows also as boxes of 64) */
	CUtensorMap mA, tmpl, mA64;
	int r;
	if ((r = cuda_gemm_tmap_2d(&mA, x8, max_rows, K, WG_BM)) ||
	    (r = cuda_gemm_tmap_2d(&tmpl, x8, N, K, paired ? bn / 2 : bn)) ||
	    (paired && (r = cuda_gemm_tmap_2d(&mA64, x8, max_rows, K, 64))))
		return r;
	if ((r = group_maps(g, &tmpl, w_tab, off, G)))
		return r;
	/* a bound on the tiles: every group adds at most one partial token tile */
	long long tiles = (long long)((max_rows + WG_BM - 1) / WG_BM + G) * ((N + bn - 1) / bn);
	unsigned grid = (unsigned)(tiles < g->sm_count ? tiles : g->sm_count);
	void *args[] = {&mA, &sx, &s_tab, &off, &G, &y, &max_rows, &N, &K, &ldy, &flags, &mA64};
	if (paired) /* clusters of 2: an even grid */
		return launch(g, bn == 256 ? "k_gemm_fp8_wgmma_grouped_n256_ss_st_mc2"
					   : "k_gemm_fp8_wgmma_grouped_n128_ss_st_mc2",
			      grid < 2 ? 2 : grid & ~1u, (unsigned)WG_SMEM(bn, st), args);
	return launch(g,
		      bn == 256 ? (st ? "k_gemm_fp8_wgmma_grouped_n256_ss_st"
				      : "k_gemm_fp8_wgmma_grouped_n256_ss")
		      : st	? "k_gemm_fp8_wgmma_grouped_n128_ss_st"
		      : ss	? "k_gemm_fp8_wgmma_grouped_n128_ss"
		      : bn == 128 ? "k_gemm_fp8_wgmma_grouped_n128"
				  : "k_gemm_fp8_wgmma_grouped_n192",
		      grid, (unsigned)WG_SMEM(bn, st), args);
}

/* The SwiGLU form's codes staged in shared memory and stored as 16-byte chunks (the _st
 * kernels; the same bytes): DSV32_CUDA_WGMMA_SWST=1 (read once; tests call
 * cuda_gemm_wgmma_set_swiglu_staged). Not the default: run 22 (timing_moe_prefill, 4096 tokens,
 * GPU 0) single-CTA 3,065 us staged against 3,601, paired 3,569 against 3,568, bench moe gate|up
 * paired 3,323 against 3,412; but run 23 bench moe (one GPU, one run): single-CTA staged 3,468 /
 * 2,290 / 2,118 us at 4096 / 2048 / 512 tokens against 3,241 / 2,184 / 2,093 for the
 * paired-by-size unstaged form. */
static int swst_cache = -1;

void cuda_gemm_wgmma_set_swiglu_staged(int on)
{
	swst_cache = on != 0;
}

static int swiglu_staged(void)
{
	return env_is_1(&swst_cache, "DSV32_CUDA_WGMMA_SWST");
}

int cuda_gemm_fp8_wgmma_grouped_swiglu_mc(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab,
					  gpu_ptr off, int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr h8,
					  gpu_ptr hs, int max_rows, int I, int K, int mc)
{
	if (max_rows == 0 && G >= 1)
		return 0; /* no rows in any group */
	if (!shape_ok("gemm_fp8_wgmma_grouped_swiglu", max_rows, 2 * I, K, 2 * I) || I % 128 ||
	    G < 1 || G > WG_MAX_GROUPS || mc < 1 || mc > 2 || (mc == 2 && I % 256) ||
	    g->sm_count < 2)
		return -EINVAL;
	/* the template of the group maps: boxes of 128 weight rows (the gate and the up half of a
	 * tile are one box each); paired: the token rows also as boxes of 64 */
	CUtensorMap mA, tmpl, mA64;
	int r;
	if ((r = cuda_gemm_tmap_2d(&mA, x8, max_rows, K, WG_BM)) ||
	    (r = cuda_gemm_tmap_2d(&tmpl, x8, 2 * I, K, 128)) ||
	    (mc == 2 && (r = cuda_gemm_tmap_2d(&mA64, x8, max_rows, K, 64))))
		return r;
	if ((r = group_maps(g, &tmpl, w_tab, off, G)))
		return r;
	long long tiles = (long long)((max_rows + WG_BM - 1) / WG_BM + G) * (I / 128);
	unsigned grid = (unsigned)(tiles < g->sm_count ? tiles : g->sm_count);
	if (mc == 2) /* clusters of 2: an even grid, each cluster one item of two tiles */
		grid = grid < 2 ? 2 : grid & ~1u;
	int flags = 0;
	void *args[] = {&mA, &sx, &s_tab, &off, &G, &h8, &hs, &max_rows, &I, &K, &flags, &mA64};
	int st = swiglu_staged() && h8 % 16 == 0;
	static const char *const names[2][2] = {
		{"k_gemm_fp8_wgmma_grouped_n256_ss_sw", "k_gemm_fp8_wgmma_grouped_n256_ss_sw_mc2"},
		{"k_gemm_fp8_wgmma_grouped_n256_ss_sw_st", "k_gemm_fp8_wgmma_grouped_n256_ss_sw_st_mc2"}};
	return launch(g, names[st][mc == 2], grid, (unsigned)WG_SMEM(256, st), args);
}

/* The paired grouped forms (clusters of 2 sharing copies) where the groups average 128 rows or
 * more, so most have two token tiles to pair (the pairs of one token tile with two weight tiles
 * measured slower). bench moe, gate|up / down alone, single vs paired: run 12 at 4096 tokens
 * (~143 rows a group) 3630 / 3452 and 2043 / 1859 us; run 13 at 4096 3638 / 3266 and 1941 /
 * 1843, at 2048 (~72) 2223 / 2279 and 1243 / 1450, at 512 2143 / 2196 and 1054 / 1124;
 * timing_moe_prefill (run 12, 4096 tokens) n256 staged 3223 / 3162 (4096x7168), 1668 / 1656
 * (7168x2048). The same bytes (gpu_moe_block, grouped_vs_cpu). DSV32_CUDA_WGMMA_PAIRED=0 / 1
 * (diagnosis, read at the first grouped GEMM): never / always; cuda_gemm_wgmma_set_paired. */
static int paired_mode = -2; /* -2: not read yet; -1: by size; 0 / 1: never / always */

void cuda_gemm_wgmma_set_paired(int mode)
{
	paired_mode = mode == 0 || mode == 1 ? mode : -1;
}

static int paired_on(int max_rows, int G)
{
	if (paired_mode == -2) {
		const int v = env_int("DSV32_CUDA_WGMMA_PAIRED", -1);
		cuda_gemm_wgmma_set_paired(v == 0 || v == 1 ? v : -1);
	}
	return paired_mode >= 0 ? paired_mode : max_rows >= 128LL * G;
}

/* The gate|up SwiGLU form, DSV32_CUDA_WGMMA_SW=f (read once): 0 (default) paired by size
 * (paired_on; run 23's bench moe: block 5,684 / 3,790 / 3,307 us at 4096 / 2048 / 512 tokens
 * against 5,845 / 3,835 / 3,386 for f = 1 with staging); 1 one CTA a tile; 2 paired. (A
 * token-wide form, the weight rows as wgmma's A and an expert's tokens as N, was removed after
 * runs 21-23: 4,379 / 3,516 us at 4096 / 2048 tokens against 3,413 / 2,304, its tile bringing
 * more bytes into the SMs per FLOP; its down-projection twin was no clear win.) */
static int sw_cache = -1;

int cuda_gemm_fp8_wgmma_grouped_swiglu(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off,
				       int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr h8, gpu_ptr hs,
				       int max_rows, int I, int K)
{
	int f = env_uint(&sw_cache, "DSV32_CUDA_WGMMA_SW");
	int mc = f == 0 ? (paired_on(max_rows, G) && I % 256 == 0 ? 2 : 1)
		 : f == 2 && I % 256 == 0 ? 2
					   : 1;
	return cuda_gemm_fp8_wgmma_grouped_swiglu_mc(g, w_tab, s_tab, off, G, x8, sx, h8, hs,
						     max_rows, I, K, mc);
}

/* DSV32_CUDA_TW_FLAGS (diagnosis): the token-wide kernel's flags, 2 = no stores (timing), 16 =
 * the items in steps of the grid rather than drawn */
static int tw_flags_cache = -1;

/* cuda_gemm_tw_set_mc: 2 the token-wide form in clusters of 2 sharing the token rows where the
 * weight tiles pair up (k_gemm_fp8_tw_grouped_mc2), else one CTA an item; < 0 not read yet.
 * Off by default: bench moe at 4096 tokens, graph-replayed block, against single CTAs in the
 * same call: s25-13 4,459 / 4,412 / 4,576 us against 4,641 / 4,543 / 4,637, s25-15 4,722 /
 * 4,717 against 4,585 / 4,668 (even, within the machines' noise); 4 / 16 / 64 tokens 10-15 us
 * slower (s25-14). */
static int tw_mc = -1;

void cuda_gemm_tw_set_mc(int mc) { tw_mc = mc < 0 ? -1 : mc == 2 ? 2 : 1; }

int cuda_gemm_fp8_tw_grouped(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
			     gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K, int ldy)
{
	if (max_rows == 0 && G >= 1)
		return 0; /* no rows in any group */
	if (!shape_ok("gemm_fp8_tw_grouped", max_rows, N, K, ldy) || N % 256 || G < 1 ||
	    G > WG_MAX_GROUPS || ldy % 8 || y % 16)
		return -EINVAL;
	/* the weight template (boxes of 128 rows), placed per group on the device; the token rows
	 * as boxes of 16 */
	CUtensorMap tmpl, mX;
	int r;
	if ((r = cuda_gemm_tmap_2d(&mX, x8, max_rows, K, 16)) ||
	    (r = cuda_gemm_tmap_2d(&tmpl, x8, N, K, 128)))
		return r;
	if ((r = group_maps(g, &tmpl, w_tab, off, G)))
		return r;
	int flags = env_uint(&tw_flags_cache, "DSV32_CUDA_TW_FLAGS");
	void *args[] = {&mX, &sx, &s_tab, &off, &G, &y, &max_rows, &N, &K, &ldy, &flags};
	if (tw_mc < 0)
		cuda_gemm_tw_set_mc(env_int("DSV32_CUDA_TW_MC", 1));
	if (tw_mc == 2 && (N / 256) % 2 == 0) {
		/* clusters of 2 sharing the token rows, as many as are resident at once (their
		 * leaders draw the items; 0 when the driver cannot say: then one wave of the SMs'
		 * pairs) */
		static int cap = -1;
		void *fn;
		if ((r = gpu_kernel_smem(g, "k_gemm_fp8_tw_grouped_mc2", &fn)))
			return r;
		const int most = gpu_max_active_clusters_once(g, &cap, "k_gemm_fp8_tw_grouped_mc2", 2,
							      WG_THREADS, TW_SMEM);
		unsigned grid = (unsigned)g->sm_count & ~1u;
		if (most > 0 && 2u * (unsigned)most < grid)
			grid = 2u * (unsigned)most;
		return gpu_launch_n(g, fn, grid, 1, 1, WG_THREADS, 1, 1, TW_SMEM, args,
				    GPU_NARGS(args));
	}
	return launch(g, "k_gemm_fp8_tw_grouped", (unsigned)g->sm_count, TW_SMEM, args);
}

/* The MoE block's GEMMs on the token-wide form (see cuda_gemm_wgmma.h). Measured (bench moe,
 * one H200, graph-replayed block, session 8): the token-wide gate|up (unfused, +
 * k_moe_swiglu_quant) 2,949 + ~250 us against the fused 128-token tile form's 3,395-3,405 at
 * 4096 tokens, 2,105 + 129 against 2,319 at 2048, 1,867 + 63 against 2,546 at 512; its down
 * GEMM at 4096 the tile form's equal until the scale products' form (session 9, run 37: block
 * 5,114 / 5,111 us against 5,211 / 5,248 with the down GEMM on tiles); a token-wide SwiGLU
 * epilogue (128-row chunks) measured slower (4,380 us at 4096) and was removed. */
static int tw_cache = -1;

int cuda_gemm_wgmma_tw(void)
{
	return env_on(&tw_cache, "DSV32_CUDA_WGMMA_TW");
}

int cuda_gemm_fp8_wgmma_grouped(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
				gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K,
				int ldy)
{
	/* run 4, 4096 tokens x 8 of 256 experts: gate+up (K = 7168) fastest as plain n128, down
	 * (K = 2048) with the staged stores; run 8 (timing_moe_prefill, down at 4096 tokens):
	 * n128 staged 1780 us, n256 with no stores 1353 and its stores as pairs 1865: the stores
	 * bound n256, so with ~128 rows a group (both warpgroups busy) down runs n256 staged */
	int staged = K < 4096 && ldy % 8 == 0 && y % 16 == 0;
	int bn = staged && N >= 4096 && max_rows >= 96LL * G ? 256 : 128;
	int paired = staged && paired_on(max_rows, G) && N % (2 * bn) == 0;
	return cuda_gemm_fp8_wgmma_grouped_bn(g, w_tab, s_tab, off, G, x8, sx, y, max_rows, N, K,
					      ldy, bn, staged,
					      (staged ? WGMMA_STAGED : 0) | (paired ? WGMMA_PAIRED : 0));
}

#endif
