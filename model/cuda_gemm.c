/*
 * cuda_gemm.c — launchers of the FP8 GEMM kernels, the cuBLASLt path and the per-shape
 * dispatch between them (see cuda_gemm.h).
 */
#include "model/cuda_gemm.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/cublaslt.h"
#include "kernels_ptx/gemv_layout.h"   /* the one-row kernel's threads, ring, counts, smem */
#include "kernels_ptx/stream_layout.h" /* the streaming kernel's st_maps, st_count */
#include "model/cuda_gemm_wgmma.h"
#include "model/env_knob.h"

static pthread_mutex_t gemm_lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_GPUS 16

/* The SMs the launch sizing plans for: the device's (gpu_open), or the H200's 132 where no
 * count was reported. */
static int gemm_sms(const struct gpu *g)
{
	return g->sm_count > 0 ? g->sm_count : 132;
}

/* Per GPU ordinal: 1 the fast mode: the decode and grouped GEMMs may run on wgmma (native
 * FP8; within tests/gpu/gemm_fp8_limit.h's limit of the CPU) and on cuBLASLt where measured
 * faster (the start-up measurement, else run 10's table); 0 (until the backend says otherwise)
 * the batch-invariant mode: the exact mma.sync decode kernels, a row's result independent of
 * M. */
static int fast_mode[MAX_GPUS];

void cuda_gemm_set_batch_invariant(const struct gpu *g, int on)
{
	if (g->ordinal >= 0 && g->ordinal < MAX_GPUS)
		fast_mode[g->ordinal] = !on;
}

int cuda_gemm_batch_invariant(const struct gpu *g)
{
	return !(g->ordinal >= 0 && g->ordinal < MAX_GPUS && fast_mode[g->ordinal]);
}

/* Where the wgmma kernel (model/cuda_gemm_wgmma.h) runs without a measurement saying so:
 * DENSE 1: the default rule for M > 64 picks it over cuBLASLt — cuBLASLt is faster (run 4:
 * 987-1137 against 765-845 TFLOP/s at M = 4096) but misses the CPU check by far more than
 * wgmma's accumulation (run 4: the MoE block at T = 300 had outputs 8.7% of the row RMS off
 * through its shared expert on cuBLASLt; wgmma stays within ~2^-8 on such operands);
 * cuda_gemm_tune can still pick cuBLASLt by speed. GROUPED 1: grouped GEMMs with many rows
 * per group (prefill) run on it. Both accumulate FP8 products more coarsely than mma.sync. */
#define CUDA_GEMM_WGMMA_DENSE 1
#define CUDA_GEMM_WGMMA_GROUPED 1

/* wgmma's shape contract (model/cuda_gemm_wgmma.h) beyond ours: N % 64, ldy even. */
static int wgmma_fits(int N, int ldy) { return N % 64 == 0 && N >= 64 && ldy % 2 == 0; }

/* ---- the decode kernels ------------------------------------------------------------------ */

/* What bounds them (runs 8-12, H200): the exact kernels (v2, the streaming kernel's mma.sync
 * consumers) do one HMMA.16816 per 256 weight bytes and 8 tokens, and mma.sync runs at ~75-87
 * TFLOP/s here (v2 at M = 32 / 64 whatever the conversion count): from M = 16 they are bound by
 * it, at M <= 8 co-limited with HBM (v2 2.9-3.6 TB/s on the large matrices). The fast mode
 * (cuda_gemm_set_batch_invariant(g, 0)) therefore runs the streaming kernel's native-FP8 wgmma
 * consumers (STREAM_WG, K chunks summed by a second launch: run 12 3.0-3.4 TB/s at M <= 16 on
 * the large matrices, its copies alone 3.7-4.0) and cuBLASLt where each measured faster. From
 * M = 32 the wgmma consumers fall to 2.5-2.7 / 1.8-2.0 TB/s at 32 / 64 rows: the token rows
 * take a growing share of the stage ring (5 / 4 stages instead of 6), so fewer weight bytes are
 * in flight. (fp16 wgmma on the converted operands, bit-identical to mma.sync, was no faster
 * than mma.sync and 0.6-0.8x of v2 in runs 9 and 17: removed.) */

/* The streaming kernel's K chunks (kernels_ptx/gemm_fp8_stream.cu): work units are 128-row tiles
 * x K chunks, one block per SM takes units round-robin, so the busiest SM streams
 * ceil(units / SMs) x chunk_blocks K blocks. Pick the chunk count that minimises that (plus one
 * block's worth per unit for the pipeline fill and the epilogue, and a flat cost for the reduce
 * launch when there is more than one chunk). A function of N, K and the SM count only: the
 * summation order, and so every result, never depends on M. */
struct gemm_split cuda_gemm_decode_split(const struct gpu *g, int N, int K)
{
	int kb = K / 128, tiles = (N + 127) / 128, sms = gemm_sms(g);
	struct gemm_split best = {1, 1, kb > 0 ? kb : 1};
	double best_cost = 1e30;
	for (int c = 1; c <= kb && c <= 64; c++) {
		int cb = (kb + c - 1) / c, ce = (kb + cb - 1) / cb;
		long long units = (long long)tiles * ce, rounds = (units + sms - 1) / sms;
		double cost = (double)rounds * (cb + 1.0) + (ce > 1 ? 3.0 : 0.0);
		if (cost < best_cost - 1e-9) {
			best_cost = cost;
			best = (struct gemm_split){1, ce, cb};
		}
	}
	return best;
}

static size_t v2_workspace(const struct gpu *g, int M, int N, int K);
static size_t gemv_workspace(const struct gpu *g, int M, int N, int K);

size_t cuda_gemm_decode_workspace(const struct gpu *g, int M, int N, int K)
{
	struct gemm_split sp = cuda_gemm_decode_split(g, N, K);
	size_t st = sp.chunks > 1 ? (size_t)sp.chunks * M * N * 4 : 0, v2 = v2_workspace(g, M, N, K);
	size_t gv = gemv_workspace(g, M, N, K), most = st > v2 ? st : v2;
	return gv > most ? gv : most; /* room for any of the kernels */
}

/* Encoded maps kept for reuse (a decode step calls the same GEMMs on the same buffers again),
 * replaced round-robin; the encoding is a pure function of these fields (f32: the token scales'
 * map, below). */
#define MAP_CACHE 256
static struct map_entry {
	gpu_ptr base;
	int rows, K, box_rows, f32, promo;
	CUtensorMap map;
} map_cache[MAP_CACHE];
static int map_next;

/* L2 promotion of a decode GEMM's dense weight stream: none (a box row is 128 bytes, each L2
 * miss fetches its 128 bytes). With CU_TENSOR_MAP_L2_PROMOTION_L2_256B, as before session 10,
 * the streaming kernel's weight copies alone (tools/probes/stream_probe.cu: its grid, units and
 * ring, nothing computed) came in at 3.88-3.98 TB/s against 4.10-4.24 without, on the row-major
 * and a tile-contiguous layout alike (the layout is not what costs, the promotion is), and bench
 * gemm's decode rows moved +3..+7%. The other maps (tokens, the prefill GEMMs, the grouped
 * experts' templates) keep 256-byte promotion: the MoE block at 64-4096 tokens measured no gain
 * without it. DSV32_GEMM_L2_PROMO=1 puts the decode weights back on 256 bytes (read once). */
static int decode_promo_256(void)
{
	static int on = -1;
	return env_is_1(&on, "DSV32_GEMM_L2_PROMO");
}

/* f32 0: e4m3 [rows][K], boxes of 128 bytes x box_rows, 128-byte swizzle (cuda_gemm_tmap_2d);
 * 1: fp32 [rows][K / 128] (act_quant scales), boxes of 8 values x box_rows, no swizzle.
 * promo: e4m3 copies' L2 promotion to 256 bytes (else none; the scales' never). */
static int tmap_encode(CUtensorMap *m, gpu_ptr base, int rows, int K, int box_rows, int f32,
		       int promo)
{
	if (!cu.cuTensorMapEncodeTiled)
		return -ENOTSUP;
	pthread_mutex_lock(&gemm_lock);
	for (int i = 0; i < MAP_CACHE; i++) {
		const struct map_entry *c = &map_cache[i];
		if (c->base == base && c->rows == rows && c->K == K && c->box_rows == box_rows &&
		    c->f32 == f32 && c->promo == promo && base) {
			*m = c->map;
			pthread_mutex_unlock(&gemm_lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&gemm_lock);
	cuuint64_t dims[2] = {(cuuint64_t)(f32 ? K / 128 : K), (cuuint64_t)rows};
	cuuint64_t strides[1] = {(cuuint64_t)(f32 ? K / 128 * 4 : K)};
	cuuint32_t box[2] = {f32 ? 8 : 128, (cuuint32_t)box_rows};
	cuuint32_t estr[2] = {1, 1};
	CU_TRY(cu.cuTensorMapEncodeTiled(
		m, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
		(void *)(uintptr_t)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
		f32 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
		!f32 && promo ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE,
		CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
	pthread_mutex_lock(&gemm_lock);
	map_cache[map_next] = (struct map_entry){base, rows, K, box_rows, f32, promo, *m};
	map_next = (map_next + 1) % MAP_CACHE;
	pthread_mutex_unlock(&gemm_lock);
	return 0;
}

int cuda_gemm_tmap_2d(CUtensorMap *m, gpu_ptr base, int rows, int K, int box_rows)
{
	return tmap_encode(m, base, rows, K, box_rows, 0, 1);
}

/* A dense decode GEMM's weight map (W [N][K], boxes of box_rows): L2 promotion as
 * decode_promo_256 says. */
static int decode_wmap(CUtensorMap *m, gpu_ptr W, int N, int K, int box_rows)
{
	return tmap_encode(m, W, N, K, box_rows, 0, decode_promo_256());
}

/* The streaming kernel's rows per warp (RT 16-row MMA tiles): 0 = the default rule below. */
static int stream_rt = 0;

void cuda_gemm_set_stream_rt(int rt) { stream_rt = rt == 1 || rt == 2 ? rt : 0; }

/* The streaming kernel's consumers when forced (tests, the benchmark): 0 mma.sync (the exact
 * kernels), 2 wgmma (native FP8, the _w variants; within the wgmma limit); -1: by the caller
 * (mma.sync, or wgmma for the fast mode's paths). */
static int stream_wi = -1;

void cuda_gemm_set_stream_wi(int on) { stream_wi = on; }

/* Diagnosis (bench gemm): stream_fused 1 sums the K chunks in the kernel (its last-arriving
 * warps), 0 by the second launch, 2 not at all (the GEMM launch alone: the benchmark's measure
 * of the chunk sum's cost; the output is not written), -1 the default (in the kernel for the
 * mma.sync consumers, by the second launch for wgmma's: run 10, bench gemm wg against wg_nf at
 * M = 1: 2.3-3.0 against 3.35-3.42 TB/s on the large matrices; run 33, a tenth "epilogue" warp
 * summing them in the kernel (the unit that started last among a tile's chunks waited for the
 * others' partials): 3.34 / 2.47 / 1.88 / 0.98 TB/s at M = 1 / 8 / 16 / 32 on 7168x16384
 * against 3.44 / 3.40 / 3.27 / 2.97 with the second launch, removed); stream_k1 1 runs one K
 * chunk. */
static int stream_fused = -1, stream_k1 = 0;

void cuda_gemm_set_stream_diag(int fused, int k1) { stream_fused = fused, stream_k1 = k1; }

/* The tokens' scales of a stage by one bulk tensor copy (ST_SX_TMA: wgmma consumers, dense, from
 * 9 rows) instead of a 4-byte cp.async per token and K block: run 34, bench gemm --shape
 * 7168x16384 with and without, wg 3.13 / 2.94 / 2.51 against 2.98 / 2.69 / 2.21 TB/s at
 * M = 16 / 32 / 64, but 3.31 / 3.22 against 3.35 / 3.31 at M = 1 / 8 (2 / 16 copies a stage);
 * 18432x7168 M = 16 / 32 2.75 / 2.53 against 2.79 / 2.52. 1 on, 0 off, -1 the environment
 * (DSV32_GEMM_SX_TMA=0 off; default on). */
static int sx_tma_on = -1;

void cuda_gemm_set_stream_sx_tma(int on) { sx_tma_on = on; }


static int sx_tma(void) { return env_on(&sx_tma_on, "DSV32_GEMM_SX_TMA"); }

/* The streaming kernel's ring: at most STREAM_NS_DENSE stages for dense GEMMs (run 17,
 * 7168x16384, wgmma consumers with the chunk sum's launch: 4 stages 3.45 / 3.44 / 3.23 TB/s at
 * M = 1 / 8 / 16 against 3.28 / 3.32 / 3.08 with the 6 that fit; the GEMM launch alone 3.65 either
 * way; run 18: 3 stages the same as 4, 2 stages 2.62 / 2.76 / 2.71), as many as fit (8 at most)
 * for grouped ones (run 18, bench moe with 4: T = 1 graph 130.8 against 130.2 us, T = 16 w13
 * 811 against 776). DSV32_GEMM_STREAM_NS=n (diagnosis) caps both at n, and the swapped
 * kernel's ring (as many as fit, 8 at most) too. */
#define STREAM_NS_DENSE 4
static int stream_ns_env(void) /* DSV32_GEMM_STREAM_NS (>= 2), 0 when unset */
{
	static int cap = -1;
	return env_uint(&cap, "DSV32_GEMM_STREAM_NS") >= 2 ? cap : 0;
}

static int stream_ns_cap(int dense)
{
	return stream_ns_env() ? stream_ns_env() : dense ? STREAM_NS_DENSE : 8;
}

/* Diagnosis (the benchmark only: the results are wrong): DSV32_GEMM_STREAM_DIAG=1 leaves out
 * the copies of the tokens' scales (ST_NO_SX), to see what they cost at 33-64 rows. */
static int stream_diag_no_sx(void)
{
	static int on = -1;
	return env_is_1(&on, "DSV32_GEMM_STREAM_DIAG");
}

/* Programmatic dependent launch of the decode GEMMs (the streaming kernel, v2): the grid may
 * start while the previous kernel drains, its weight loads under way before it waits
 * (griddepcontrol.wait) for that kernel's outputs. DSV32_GEMM_PDL=0 turns it off; -1 = not
 * read yet. */
static int gemm_pdl = -1;

void cuda_gemm_set_pdl(int on) { gemm_pdl = on; }

static int pdl_on(void) { return env_on(&gemm_pdl, "DSV32_GEMM_PDL"); }

/* a launch by PDL where DSV32_GEMM_PDL lets it */
#define launch_pdl(g, fn, gx, gy, bx, smem, args)                                                \
	gpu_launch_as(g, pdl_on(), fn, gx, gy, 1, bx, 1, 1, smem, args)

/* The MoE block's step fused into the K-chunk sum of a grouped GEMM (kind 0: none): SwiGLU and
 * act_quant of the gate|up output into h8/hs (k_gemm_stream_reduce_swiglu), or the combine of
 * the down output's T tokens (routing weights w, pick order perm, top-k K) into y
 * (k_gemm_stream_reduce_combine). */
enum { EPI_NONE, EPI_SWIGLU, EPI_COMBINE };
struct stream_epi {
	int kind;
	gpu_ptr h8, hs;	  /* EPI_SWIGLU */
	gpu_ptr w, perm; /* EPI_COMBINE */
	int T, K;
};

/* The fused step epi (EPI_SWIGLU / EPI_COMBINE) over ws's `chunks` fp32 partials [chunks][rows][N]
 * (rows_dev: the device's row count, or 0), summed in chunk order: k_gemm_stream_reduce_swiglu
 * (into epi's h8 / hs) or k_gemm_stream_reduce_combine (into y). */
static int epi_launch(struct gpu *g, const struct stream_epi *epi, gpu_ptr ws, int chunks,
		      int rows, gpu_ptr rows_dev, int N, gpu_ptr y)
{
	if (epi->kind == EPI_SWIGLU) {
		int I = N / 2;
		gpu_ptr h8 = epi->h8, hs = epi->hs;
		void *sargs[] = {&ws, &h8, &hs, &chunks, &rows, &rows_dev, &I};
		unsigned sb = (unsigned)(((long long)rows * (I / 128) + 7) / 8); /* a warp a group */
		return launch_pdl(g, gpu_kernel(g, "k_gemm_stream_reduce_swiglu"),
				  sb < 1024 ? sb : 1024, 1, 256, 0, sargs);
	}
	gpu_ptr w = epi->w, perm = epi->perm;
	int T = epi->T, tk = epi->K;
	void *cargs[] = {&ws, &y, &w, &perm, &chunks, &rows, &N, &T, &tk};
	unsigned cb = (unsigned)(((long long)T * N + 255) / 256);
	return launch_pdl(g, gpu_kernel(g, "k_gemm_stream_reduce_combine"),
			  cb < 1024 ? cb : 1024, 1, 256, 0, cargs);
}

/* k_gemm_fp8_stream_m*_r* (+ k_gemm_stream_reduce when K is chunked and not summed in the
 * kernel): dense when w_tab == 0 (W, S, rows = M), grouped otherwise (rows = max_rows).
 * epi (may be NULL): the K chunks summed with that step instead (y: EPI_COMBINE's output, else
 * unused; -ENOTSUP when K is not chunked). */
static int stream_launch(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
			 gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int rows, int N,
			 int K, int ldy, gpu_ptr ws, int copy_only, int wg,
			 const struct stream_epi *epi)
{
	struct gemm_split sp = cuda_gemm_decode_split(g, N, K);
	if (stream_k1) /* diagnosis: one K chunk (no partials, the SMs unevenly loaded) */
		sp = (struct gemm_split){1, 1, K / 128};
	const int ek = epi ? epi->kind : EPI_NONE;
	if (ek != EPI_NONE && (sp.chunks < 2 || (ek == EPI_SWIGLU && N % 256)))
		return -ENOTSUP;
	if (sp.chunks > 1 && !ws && !copy_only)
		return -EINVAL;
	int slice_rows = rows < 64 ? rows : 64; /* the most rows a slice can have */
	int v = slice_rows <= 8 ? 0 : slice_rows <= 16 ? 1 : slice_rows <= 32 ? 2 : 3;
	int mpad = 8 << v;
	/* RT = 2 (4 consumer warps of two 16-row MMA tiles each) reads each token fragment from
	 * shared memory once for two tiles. Not the default until measured: its runs 2 and 3
	 * "deadlocks" were the RT = 1 kernel launched with RT = 2's 160 threads (no producer warp),
	 * because gpu_kernel caches the name pointer it is given and these names were built in a
	 * reused stack buffer; the names are literals now. */
	int rt = stream_rt ? stream_rt : 1;
	const int tile = 128; /* the kernel's ST_TR */
	/* literals: gpu_kernel keeps the pointer it is given as its cache key; rows: mma.sync RT = 1,
	 * RT = 2, wgmma; columns: 8, 16, 32, 64 token rows, the copy-only probe */
	static const char *names[3][5] = {
		{"k_gemm_fp8_stream_m1_r1", "k_gemm_fp8_stream_m2_r1", "k_gemm_fp8_stream_m4_r1",
		 "k_gemm_fp8_stream_m8_r1", "k_gemm_fp8_stream_m0_r1"},
		{"k_gemm_fp8_stream_m1_r2", "k_gemm_fp8_stream_m2_r2", "k_gemm_fp8_stream_m4_r2",
		 "k_gemm_fp8_stream_m8_r2", "k_gemm_fp8_stream_m0_r1"},
		{"k_gemm_fp8_stream_m1_r1_w", "k_gemm_fp8_stream_m2_r1_w", "k_gemm_fp8_stream_m4_r1_w",
		 "k_gemm_fp8_stream_m8_r1_w", "k_gemm_fp8_stream_m0_r1"}};
	int wi = stream_wi >= 0 ? stream_wi : wg ? 2 : 0;
	if (copy_only || wi)
		rt = 1;
	const char *name = names[wi == 2 ? 2 : rt - 1][copy_only ? 4 : v];
	if (w_tab && G > ST_MAXG) {
		fprintf(stderr, "<3>dsv32: gemm_fp8_stream: %d groups (at most %d)\n", G, ST_MAXG);
		return -EINVAL;
	}
	/* shared memory: barriers (256 bytes), the slices and 3 more entries' room (their count and
	 * the slice scan's warp totals), 1 KB of alignment slack, ns stages of two K blocks of 128
	 * weight rows and mpad token rows, two buffers of the fp16 token fragments of a stage (2 K
	 * blocks x mpad / 8 groups x 2 KB each), each stage's promotion scales (ST_SCL_BYTES), 8
	 * stages at most (ST_MAXSTAGES) */
	int slice_cap = (rows + 63) / 64 + (w_tab ? G : 0);
	int head = 256 + (slice_cap + 3) * 16 + 1024, stage = 2 * (tile + mpad) * 128;
	head += copy_only || wi == 2 ? 0 : 2 * 2 * (mpad / 8) * 2048;
	head += 8 * (16 + 2 * 64 * 4);
	/* the token scales by bulk tensor copies from 9 rows: sx 16-byte aligned, its rows
	 * (K / 128 fp32) too */
	const int sxt = wi == 2 && !w_tab && !copy_only && mpad >= 16 && (K / 128) % 4 == 0 &&
			!(sx & 15) && sx_tma();
	head += sxt ? 128 + 8 * mpad * 32 : 0; /* each stage's box (8 stages at most) */
	int ns = (g->smem_block_optin - head) / stage;
	ns = ns > 8 ? 8 : ns;
	ns = ns > stream_ns_cap(!w_tab) ? stream_ns_cap(!w_tab) : ns;
	if (!w_tab) {
		/* dense: no more stages than a block streams in all (its units x their stages of
		 * two K blocks): a small matrix's block then leaves shared memory for the kernels
		 * around it, so it can be resident, its copies under way, while the previous one
		 * runs (all of its weights, when they fit the ring) */
		long long units = (long long)((rows + 63) / 64) * ((N + tile - 1) / tile) * sp.chunks;
		int sms = gemm_sms(g);
		long long per = (units + sms - 1) / sms;
		long long need = per * ((sp.chunk_blocks + 1) / 2);
		ns = need < ns ? (int)(need > 2 ? need : 2) : ns;
	}
	if (ns < 2) {
		fprintf(stderr, "<3>dsv32: gemm_fp8_stream: %d groups x %d rows do not fit\n", G,
			rows);
		return -EINVAL;
	}
	int smem = head + ns * stage;
	void *fn;
	int r = gpu_kernel_smem(g, name, &fn);
	if (r)
		return r;
	/* tensor maps: the weights (dense) or the template of every group's (grouped), boxes of
	 * 128 rows; the tokens, boxes of 8 rows (grouped) or mpad rows (dense: one copy a K block);
	 * one K block wide, 128-byte swizzle */
	CUtensorMap wmap, xmap, smap;
	if ((r = w_tab ? cuda_gemm_tmap_2d(&wmap, x8, N, K, tile) /* the groups' template */
		       : decode_wmap(&wmap, W, N, K, tile)) ||
	    (r = cuda_gemm_tmap_2d(&xmap, x8, rows, K, w_tab ? 8 : mpad)))
		return r;
	smap = xmap; /* (unused without ST_SX_TMA) */
	if (sxt && (r = tmap_encode(&smap, sx, rows, K, mpad, 1, 0)))
		return r;
	if (w_tab) {
		void *margs[] = {&wmap, &w_tab, &G};
		if ((r = launch_pdl(g, gpu_kernel(g, "k_stream_group_maps"), (unsigned)G, 1, 32, 0,
				    margs)))
			return r;
	}
	unsigned grid = (unsigned)g->sm_count;
	if (!w_tab) { /* dense: no more blocks than units */
		long long units = (long long)((rows + 63) / 64) * ((N + tile - 1) / tile) * sp.chunks;
		grid = units < grid ? (unsigned)units : grid;
	}
	/* the chunks' partials summed by the kernel's last-arriving warps (st_count has room for
	 * one count per slice x tile x warp), else by a second launch */
	int fused = (long long)slice_cap * ((N + tile - 1) / tile) * (8 / rt) <= ST_COUNTS;
	if (copy_only || ek != EPI_NONE || stream_fused == 0 || stream_fused == 2 ||
	    (stream_fused < 0 && wi == 2))
		fused = 0;
	int flags = fused ? 1 : 0; /* ST_FUSED */
	if (stream_diag_no_sx())
		flags |= 2; /* ST_NO_SX */
	if (sxt)
		flags |= 4; /* ST_SX_TMA */
	void *args[] = {&wmap, &xmap, &smap, &w_tab, &s_tab, &off, &G, &S, &sx, &y, &ws,
			&rows, &N, &K, &ldy, &sp.chunks, &sp.chunk_blocks, &ns, &mpad, &slice_cap,
			&flags};
	r = launch_pdl(g, fn, grid, 1, (unsigned)(8 / rt + 1) * 32, (unsigned)smem, args);
	if (r || sp.chunks == 1 || fused || copy_only || stream_fused == 2)
		return r;
	gpu_ptr rows_dev = w_tab ? off + (gpu_ptr)G * 4 : 0;
	if (ek != EPI_NONE)
		return epi_launch(g, epi, ws, sp.chunks, rows, rows_dev, N, y);
	/* at most two blocks an SM (grid-stride): its blocks wait resident beside the GEMM's for
	 * it to complete, and at 1024 (M = 64) they took the room of the next launch's */
	void *rargs[] = {&ws, &y, &sp.chunks, &rows, &rows_dev, &N, &ldy};
	unsigned rb = (unsigned)(((long long)rows * N / 4 + 255) / 256), rmax = 2u * (unsigned)grid;
	rb = rb < rmax ? rb : rmax;
	return launch_pdl(g, gpu_kernel(g, "k_gemm_stream_reduce"), rb, 1, 256, 0, rargs);
}

/* Which kernel cuda_gemm_fp8_decode runs: 1 the streaming kernel, 0 the previous one (v2), -1
 * (the default) per shape by run 4's measurements: the dense decode GEMM on v2
 * except where the streaming kernel was faster at every M <= 64 (32768x512). One kernel per
 * shape for every M, so a row's result never depends on M. */
static int stream_on = -1;

void cuda_gemm_set_stream(int on) { stream_on = on; }

static int dense_streams(int N, int K)
{
	if (stream_on >= 0)
		return stream_on;
	return N == 32768 && K == 512;
}

int cuda_gemm_decode_streams(int N, int K) { return dense_streams(N, K); }

/* The exact decode kernels (the batch-invariant mode's, and the fast mode's where they are
 * the fastest): v2 or the streaming kernel's mma.sync consumers, one of them per shape. */
int cuda_gemm_fp8_decode(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
			 int M, int N, int K, int ldy, gpu_ptr ws)
{
	if (!dense_streams(N, K))
		return cuda_gemm_fp8_decode_v2(g, W, S, x8, sx, y, M, N, K, ldy, ws);
	return cuda_gemm_fp8_stream_wg(g, W, S, x8, sx, y, M, N, K, ldy, ws, 0);
}

int cuda_gemm_fp8_stream_wg(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx,
			    gpu_ptr y, int M, int N, int K, int ldy, gpu_ptr ws, int wg)
{
	if (M < 1 || M > 64 || N % 16 || K % 128 || ldy < N) {
		fprintf(stderr, "<3>dsv32: gemm_fp8_decode: unsupported shape M=%d N=%d K=%d ldy=%d\n",
			M, N, K, ldy);
		return -EINVAL;
	}
	return stream_launch(g, 0, 0, 0, 0, W, S, x8, sx, y, M, N, K, ldy, ws, 0, wg, NULL);
}

/* The swapped kernel's tiles (kernels_ptx/gemm_fp8_stream.cu SW_ENTRY; names are literals:
 * gpu_kernel keeps the pointer as its cache key): NT weight rows, split 0 = one tile a block
 * (the two warpgroups on alternate stages), 1 = the rows split between them, any number of
 * tiles a block. */
static const struct {
	int nt, split;
	const char *name;
} sw_tiles[] = {{8, 0, "k_gemm_fp8_swap_n8"},	   {16, 0, "k_gemm_fp8_swap_n16"},
		{24, 0, "k_gemm_fp8_swap_n24"},	   {32, 0, "k_gemm_fp8_swap_n32"},
		{48, 0, "k_gemm_fp8_swap_n48"},	   {56, 0, "k_gemm_fp8_swap_n56"},
		{64, 0, "k_gemm_fp8_swap_n64"},	   {96, 0, "k_gemm_fp8_swap_n96"},
		{128, 0, "k_gemm_fp8_swap_n128"},  {144, 0, "k_gemm_fp8_swap_n144"},
		{144, 1, "k_gemm_fp8_swap_n144s"}, {192, 1, "k_gemm_fp8_swap_n192s"},
		{256, 1, "k_gemm_fp8_swap_n256s"}};

/* A cluster form of the swapped kernel at one tile width: the tables below. */
struct sw_width {
	int nt;
	const char *name;
};

/* The cluster form (KS = 2: two blocks a tile, each streaming half of K; SW_ENTRY2) and its
 * widths (no 144: its end's exchange by st.async would spill registers, s19; no model shape
 * took it), for K >= 1024 (two stages a half or more: the ring holds the end's exchanges). */
static const struct sw_width sw_tiles2[] = {{16, "k_gemm_fp8_swap_n16k2"},	  {32, "k_gemm_fp8_swap_n32k2"},
		 {48, "k_gemm_fp8_swap_n48k2"},	  {64, "k_gemm_fp8_swap_n64k2"},
		 {96, "k_gemm_fp8_swap_n96k2"},	  {112, "k_gemm_fp8_swap_n112k2"},
		 {128, "k_gemm_fp8_swap_n128k2"}};
/* The pair forms (NP = 2, SW_ENTRY_P2): two one-tile blocks of a cluster sharing their token
 * boxes, by tile width (the one-block form's widths; the K-halves form's pairs are clusters of
 * 4, sw_quads below). */
static const struct sw_width sw_pairs[] = {{16, "k_gemm_fp8_swap_n16p2"},	 {32, "k_gemm_fp8_swap_n32p2"},
		{48, "k_gemm_fp8_swap_n48p2"},	 {56, "k_gemm_fp8_swap_n56p2"},
		{64, "k_gemm_fp8_swap_n64p2"},	 {96, "k_gemm_fp8_swap_n96p2"},
		{128, "k_gemm_fp8_swap_n128p2"}, {144, "k_gemm_fp8_swap_n144p2"}};

/* Whether the swapped kernel pairs its tiles (the token boxes shared, NP = 2) for token boxes
 * of mpad rows: DSV32_GEMM_SW_PAIR=0 never, 1 wherever a pair form fits (one tile a block, an
 * even number of tiles, M > 8); unset: from 17 rows (s17-2, 18432x7168: +1.7% at M = 32, +2.5%
 * at 64, even at 16). cuda_gemm_set_sw_pair overrides (-1: the environment again). */
static int sw_pair_on = -2;

void cuda_gemm_set_sw_pair(int on) { sw_pair_on = on < 0 ? -2 : on != 0; }

static int sw_pair_mode(void)
{
	if (sw_pair_on == -2) { /* (0, 1, or anything else: the default) */
		const int v = env_int("DSV32_GEMM_SW_PAIR", -1);
		sw_pair_on = v == 0 || v == 1 ? v : -1;
	}
	return sw_pair_on;
}

/* Whether a pair form is taken for token boxes of mpad rows: switched on, from 9 rows (mpad
 * 16: the box's half a multiple of 8, the swizzle's 1 KB); by default from `from` rows' boxes. */
static int sw_paired(int mpad, int from)
{
	const int on = sw_pair_mode();
	return mpad >= 16 && (on == 1 || (on < 0 && mpad >= from));
}

/* The pairs of the K-halves form (KS = 2 and NP = 2: clusters of 4, SW_ENTRY_Q4), by width.
 * A GPC holds a cluster's blocks, so of ~200 KB blocks in fours the H200 holds 30 at once, not
 * 33 (s18-3, tools/probes/cluster_probe.cu; 32 clusters ran as two waves at 2.1 TB/s in s17-2):
 * the form takes a width whose grid is one wave of those, on 7168 rows 120 (60 tiles, 120 of the
 * 132 SMs). Under the pair switch (sw_pair_mode): by default from 33 rows, where the K-halves
 * form's token reads bound it (M = 64: 117 MB of weights filled and read beside 67 MB of token
 * boxes on 7168x16384; pairs halve the token boxes, and the 12 idle SMs cost little at that
 * bound), with DSV32_GEMM_SW_PAIR=1 from 9 rows. */
static const struct sw_width sw_quads[] = {{120, "k_gemm_fp8_swap_n120q4"}};

/* The quads' fours (KS = 2 and NP = 4: clusters of 8, SW_ENTRY_O8): four tiles of a K half share
 * its token boxes, a box served once a four instead of once a pair (M = 64 on 7168x16384: the
 * L2's bound 117 + 117 + 16 MB instead of 117 + 117 + 31 MB); the H200 holds 15 clusters of 8
 * of ~200 KB blocks (s18-3), 120 SMs as the quads' 30 clusters of 4. By DSV32_GEMM_SW_OCT (1 on,
 * where a quad is taken and a one-wave grid of them fits; default off). cuda_gemm_set_sw_oct
 * overrides (-1: the environment again). */
static const struct sw_width sw_octs[] = {{120, "k_gemm_fp8_swap_n120o8"}};
static int sw_oct_on = -1;

void cuda_gemm_set_sw_oct(int on) { sw_oct_on = on < 0 ? -1 : on != 0; }

/* How many clusters of `size` (4: the quads, 8: the fours) of the swapped kernel's ~200 KB
 * blocks the device holds at once (asked once a process and size, of the form's first kernel:
 * every width has the same block shape); 0 when the driver cannot say (the form is then not
 * used). */
int cuda_gemm_sw_clusters(struct gpu *g, int size)
{
	static int n4 = -1, n8 = -1;
	if (size != 4 && size != 8)
		return 0;
	return gpu_max_active_clusters_once(g, size == 4 ? &n4 : &n8,
					    (size == 4 ? sw_quads : sw_octs)[0].name,
					    (unsigned)size, 288, (unsigned)g->smem_block_optin);
}

/* The tile for N rows on sms SMs: the fewest rows streamed by the busiest SM
 * (ceil(tiles / sms) x NT), the first (narrowest, unsplit) on a tie — 7168 rows: 56 (128
 * blocks), 18432: 144, 24576: 192s, 32768: 256s (one wave each); 36864: 144s (256 tiles, two
 * a block). */
static int sw_tile(int N, int sms)
{
	int best = -1;
	long long best_rows = 0;
	for (int i = 0; i < (int)(sizeof sw_tiles / sizeof *sw_tiles); i++) {
		long long tiles = (N + sw_tiles[i].nt - 1) / sw_tiles[i].nt;
		if (!sw_tiles[i].split && tiles > sms)
			continue;
		long long rows = (tiles + sms - 1) / sms * sw_tiles[i].nt;
		if (best < 0 || rows < best_rows)
			best = i, best_rows = rows;
	}
	return best;
}

/* Diagnosis of the swapped kernel (the benchmark only: wrong results; kernels_ptx/gemm_fp8_stream.cu
 * SW_NOMMA ..): DSV32_GEMM_SW_DIAG=n, read once, the sum of 2 no MMAs, 4 no token boxes (s11-1:
 * what each costs the stream). */
static int sw_diag(void)
{
	static int flags = -1;
	return env_uint(&flags, "DSV32_GEMM_SW_DIAG") & 6;
}

/* cuda_gemm_sw_trace: the launches traced so far (-1: tracing off); each traces into slot
 * count % SW_TRACE_SLOTS (kernels_ptx/gemm_fp8_stream.cu's SW_TRACE, flags >> 8). */
static int sw_traced = -1;

int cuda_gemm_sw_trace(struct gpu *g, int on)
{
	gpu_ptr p;
	size_t bytes;
	int r = on ? gpu_module_global(g, "g_sw_trace", &p, &bytes) : 0;
	if (r || (on && (r = gpu_memset(g, p, 0, bytes))))
		return r;
	sw_traced = on ? 0 : -1;
	return 0;
}

int cuda_gemm_sw_trace_read(struct gpu *g, uint64_t *out, size_t n)
{
	gpu_ptr p;
	size_t bytes;
	int r = gpu_module_global(g, "g_sw_trace", &p, &bytes);
	if (r)
		return r;
	if (n * sizeof *out != bytes)
		return -EINVAL;
	return gpu_sync(g) ? -EIO : gpu_download(g, out, p, bytes);
}

/* The swapped kernel's form for M x N x K: the kernel, its tile width nt and tiles, split, ks
 * (2: K halves over a cluster pair), np (2: tiles paired to share their token boxes) and the
 * token box's rows mpad. */
struct sw_form {
	const char *name;
	int nt, tiles, split, ks, np, mpad;
};

/* The K-halves form's clusters of np tiles (2 K halves each): the first width w[i] whose tiles
 * come in whole clusters making one wave of the cap that fit, and not a cluster fewer (so that
 * it spans the SMs as the K-halves form does but for the last GPC's remainder); 1 when f took
 * it. */
static int sw_take_wave(struct sw_form *f, const struct sw_width *w, int n, int N, int np,
			int cap)
{
	for (int i = 0; i < n; i++) {
		const int t = (N + w[i].nt - 1) / w[i].nt;
		if (t % np == 0 && t / np <= cap && t / np >= cap - 1) {
			f->nt = w[i].nt, f->tiles = t, f->np = np, f->name = w[i].name;
			return 1;
		}
	}
	return 0;
}

static struct sw_form sw_form_for(struct gpu *g, int M, int N, int K, int ks2)
{
	const int sms = gemm_sms(g), KB = K / 128;
	const int ti = sw_tile(N, sms);
	struct sw_form f = {sw_tiles[ti].name, sw_tiles[ti].nt, 0, sw_tiles[ti].split, 1, 1,
			    M <= 8 ? 8 : M <= 16 ? 16 : M <= 32 ? 32 : 64};
	for (int i = 0; ks2 && KB >= 8 && i < (int)(sizeof sw_tiles2 / sizeof *sw_tiles2); i++)
		if (2 * ((N + sw_tiles2[i].nt - 1) / sw_tiles2[i].nt) <= sms) {
			f.nt = sw_tiles2[i].nt, f.split = 0, f.ks = 2, f.name = sw_tiles2[i].name;
			break;
		}
	f.tiles = (N + f.nt - 1) / f.nt;
	/* pairs (from 17 rows): each block copies mpad / 2 rows of a token box and multicasts them;
	 * every block of a pair must have its tile */
	if (!f.split && f.ks == 1 && f.tiles % 2 == 0 && sw_paired(f.mpad, 32))
		for (int i = 0; i < (int)(sizeof sw_pairs / sizeof *sw_pairs); i++)
			if (sw_pairs[i].nt == f.nt)
				f.np = 2, f.name = sw_pairs[i].name;
	/* pairs of the K halves (from 33 rows): clusters of 4, one wave of those that fit */
	if (f.ks != 2 || !sw_paired(f.mpad, 64))
		return f;
	if (!sw_take_wave(&f, sw_quads, (int)(sizeof sw_quads / sizeof *sw_quads), N, 2,
			  cuda_gemm_sw_clusters(g, 4)))
		return f;
	/* the quads' fours, switched on, by the same rule over the clusters of 8 that fit; a
	 * quarter of a token box is a multiple of the swizzle's 8 rows from 32-row boxes */
	if (f.mpad >= 32 && env_is_1(&sw_oct_on, "DSV32_GEMM_SW_OCT"))
		sw_take_wave(&f, sw_octs, (int)(sizeof sw_octs / sizeof *sw_octs), N, 4,
			     cuda_gemm_sw_clusters(g, 8));
	return f;
}

const char *cuda_gemm_sw_kernel(struct gpu *g, int M, int N, int K, int ks2)
{
	if (M < 1 || M > 64 || N % 16 || K % 128)
		return NULL;
	return sw_form_for(g, M, N, K, ks2).name;
}

int cuda_gemm_fp8_stream_sw(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx,
			    gpu_ptr y, int M, int N, int K, int ldy, int ks2)
{
	if (M < 1 || M > 64 || N % 16 || K % 128 || ldy < N)
		return -EINVAL;
	const int sms = gemm_sms(g), KB = K / 128;
	const struct sw_form f = sw_form_for(g, M, N, K, ks2);
	const int nt = f.nt, tiles = f.tiles, split = f.split, ks = f.ks, np = f.np;
	int mpad = f.mpad; /* (a kernel argument) */
	const char *name = f.name;
	/* stages a block streams (KS = 2: rank 0's, the larger half) */
	const int nst = ks == 2 ? ((KB + 1) / 2 + 1) / 2 : (KB + 1) / 2;
	/* shared memory: barriers (256 bytes), 1 KB of alignment slack, ns stages of two K blocks
	 * (mpad token rows + nt weight rows each; at least the second token box + 8 KB: wgmma's
	 * 64-row A operand reads past the box, inside the stage; 1 KB multiples), the weight scales
	 * of a block's tiles (<= 3 row blocks each) over its K blocks, the token scales */
	int stage = 2 * (nt * 128 + mpad * 128);
	stage = stage > mpad * 128 + 8192 ? stage : mpad * 128 + 8192;
	stage = (stage + 1023) & ~1023;
	/* (run 34: each rank's half of the token scales only, a ring of 6 stages instead of 4 at
	 * M = 17-32 on 7168 x 16384 / 18432, streamed 3.19 / 3.24 TB/s against run 33's 3.34 /
	 * 3.41: not kept) */
	unsigned grid = ks == 2 ? 2u * (unsigned)tiles : (unsigned)(tiles < sms ? tiles : sms);
	const int ntb = (tiles + (int)grid / ks - 1) / ((int)grid / ks); /* tiles a block */
	int head = 256 + 1024, scl = 4 * M * KB + ntb * 2 * nst * 12;
	int ns = (g->smem_block_optin - head - scl) / stage;
	/* the kernel's SW_MAXSTAGES (K halves: one less, the last full barrier's place holds the
	 * end's) */
	ns = ns > 16 - (ks == 2) ? 16 - (ks == 2) : ns;
	if (stream_ns_env() && ns > stream_ns_env()) /* diagnosis: DSV32_GEMM_STREAM_NS */
		ns = stream_ns_env();
	if (!split) { /* one tile a block: no more stages than it has */
		ns = ns > nst ? nst : ns;
		/* and an even ring when the warpgroups alternate: slot s is then always warpgroup
		 * s % 2's, so a warpgroup never waits on a slot whose previous phase (the other
		 * warpgroup's stage) has not completed — mbarrier parity waits are ambiguous two
		 * phases apart (run 21: DSV32_GEMM_STREAM_NS=3 trapped at M = 8; the default rings of
		 * 7 and 5 stages carried the same race). (s11-2: each warpgroup its own slots, so that
		 * odd rings were safe, 7 stages instead of 6 at M <= 16 and 5 instead of 4 at 17-32,
		 * streamed the same: not kept.) */
		ns = ns > 1 ? ns & ~1 : ns;
	}
	if (ns < 1 || (ns < 2 && nst > 1))
		return -ENOTSUP;
	/* KS = 2: the ring also holds the end's two exchanges (R = nt / 2 floats of 128 threads,
	 * twice: the kernel's xch; K >= 1024 gives two stages or more, which do) */
	if (ks == 2 && ns * stage < 512 * nt)
		return -ENOTSUP;
	int smem = head + ns * stage + scl;
	/* tracing: the kernel's traced twin where the binary has one (SW_ENTRY2T, SW_ENTRY_Q4T) */
	char tname[64];
	int traced = 0;
	if (sw_traced >= 0) {
		snprintf(tname, sizeof tname, "%s_traced", name);
		if ((traced = gpu_kernel_embedded(tname)))
			name = tname;
	}
	void *fn;
	int r = gpu_kernel_smem(g, name, &fn);
	if (r)
		return r;
	CUtensorMap wmap, xmap;
	if ((r = decode_wmap(&wmap, W, N, K, nt)) ||
	    (r = cuda_gemm_tmap_2d(&xmap, x8, M, K, mpad / np)))
		return r;
	int flags = sw_diag();
	if (traced) /* the kernel's SW_TRACE, and the launch's slot from bit 8 */
		flags |= 8 | (sw_traced++ % CUDA_GEMM_SW_TRACE_SLOTS) << 8;
	void *args[] = {&wmap, &xmap, &S, &sx, &y, &M, &N, &K, &ldy, &ns, &mpad, &stage, &flags};
	return launch_pdl(g, fn, grid, 1, 288, (unsigned)smem, args);
}

int cuda_gemm_stream_copy_only(struct gpu *g, gpu_ptr W, gpu_ptr x8, int M, int N, int K)
{
	if (M < 1 || M > 64 || N % 16 || K % 128)
		return -EINVAL;
	return stream_launch(g, 0, 0, 0, 0, W, 0, x8, 0, 0, M, N, K, N, 0, 1, 0, NULL);
}

/* The previous decode kernel (gemm_fp8_decode.cu: 16-byte register loads, ksplit warps per
 * tile, K chunks for matrices >= 32 MB), kept for the benchmark's comparison. */
static struct gemm_split v2_split(const struct gpu *g, int N, int K)
{
	int kb = K / 128;
	struct gemm_split sp = {.ksplit = kb >= 8 ? 8 : kb >= 4 ? 4 : kb >= 2 ? 2 : 1};
	int blocks = (N / 16) / (8 / sp.ksplit);
	int want = g->sm_count * 8;
	sp.chunks = 1;
	while ((size_t)N * K >= (32u << 20) && blocks * sp.chunks * 2 <= want &&
	       kb / (sp.chunks * 2) >= 2 * sp.ksplit)
		sp.chunks *= 2;
	sp.chunk_blocks = (kb + sp.chunks - 1) / sp.chunks;
	return sp;
}

static size_t v2_workspace(const struct gpu *g, int M, int N, int K)
{
	struct gemm_split sp = v2_split(g, N, K);
	return sp.chunks > 1 ? (size_t)sp.chunks * M * N * 4 : 0;
}

size_t cuda_gemm_decode_v2_workspace(const struct gpu *g, int M, int N, int K)
{
	return v2_workspace(g, M, N, K);
}

int cuda_gemm_fp8_decode_v2(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx,
			    gpu_ptr y, int M, int N, int K, int ldy, gpu_ptr ws)
{
	if (M < 1 || M > 64 || N % 16 || K % 128 || ldy < N)
		return -EINVAL;
	static const char *names[] = {"k_gemm_fp8_decode_m1", "k_gemm_fp8_decode_m2",
				      "k_gemm_fp8_decode_m4", "k_gemm_fp8_decode_m8"};
	int v = M <= 8 ? 0 : M <= 16 ? 1 : M <= 32 ? 2 : 3;
	struct gemm_split sp = v2_split(g, N, K);
	if (sp.chunks > 1 && !ws)
		return -EINVAL;
	int tiles_per_block = 8 / sp.ksplit;
	int blocks = (N / 16 + tiles_per_block - 1) / tiles_per_block;
	void *args[] = {&W, &S, &x8, &sx, &y, &M, &N, &K, &ldy, &sp.ksplit, &ws, &sp.chunk_blocks};
	int r = launch_pdl(g, gpu_kernel(g, names[v]), (unsigned)blocks, (unsigned)sp.chunks, 256, 0,
			   args);
	if (r || sp.chunks == 1)
		return r;
	void *rargs[] = {&ws, &y, &sp.chunks, &M, &N, &ldy};
	unsigned rb = (unsigned)(((long long)M * N + 255) / 256);
	return launch_pdl(g, gpu_kernel(g, "k_gemm_chunk_reduce"), rb < 1024 ? rb : 1024, 1, 256, 0,
			  rargs);
}

/* ---- the one-row kernel (gemm_fp8_gemv.cu) ------------------------------------------------- */

#define GV_RING (128 << 10) /* the most weight bytes a block keeps in flight */

static int gemv_bits(void); /* (its switch, below) */

/* Its split: units of 16 rows x chunk_blocks K blocks, one block per SM taking a contiguous
 * range of them. K whole where two units fit the ring (K <= 4096: a unit is then one contiguous
 * bulk copy; run 25 measured copies of a row's 1-1.5 KB at 1.4-1.9 TB/s, of 3.5 KB at 3.76);
 * else the chunk count that minimises the busiest SM's units (ceil(units / SMs)) in bytes, plus
 * 16 KB a unit (its copies' and sums' fixed cost) and 8 KB once (the split tiles' partials and
 * arrival counts), among stages that fit the ring twice. A function of N, K and the SM count
 * only (the summation order never depends on M). */
static struct gemm_split gemv_split(const struct gpu *g, int N, int K)
{
	const int kb = K / 128, tiles = N / 16, sms = gemm_sms(g);
	struct gemm_split best = {1, 1, kb};
	if (2 * 16 * K <= GV_RING)
		return best;
	double best_cost = 1e30;
	for (int c = 2; c <= kb; c++) {
		const int cb = (kb + c - 1) / c, ce = (kb + cb - 1) / cb;
		if (2 * 16 * (cb * 128 + 16) > GV_RING)
			continue;
		const long long units = (long long)tiles * ce, rounds = (units + sms - 1) / sms;
		const double cost = (double)rounds * (cb * 2048.0 + 16384.0) + 8192.0;
		if (cost < best_cost - 1e-9) {
			best_cost = cost;
			best = (struct gemm_split){1, ce, cb};
		}
	}
	return best;
}

/* (room for its at most 8 rows when asked for more) */
static size_t gemv_workspace(const struct gpu *g, int M, int N, int K)
{
	if (N < 16 || K < 128)
		return 0;
	struct gemm_split sp = gemv_split(g, N, K);
	return sp.chunks > 1 ? (size_t)sp.chunks * (M < 8 ? M : 8) * N * 4 : 0;
}

/* The kernel's set of arrival counts for the next launch (consecutive launches take different
 * sets: two GEMMs forked on two streams never share one) */
static int gv_next_slot(void)
{
	static int next_slot;
	pthread_mutex_lock(&gemm_lock);
	int slot = next_slot;
	next_slot = (next_slot + 1) % GV_SLOTS;
	pthread_mutex_unlock(&gemm_lock);
	return slot;
}

/* The one-row kernel: dense (w_tab == 0: W, S, rows = M <= 8 tokens) or grouped (w_tab, s_tab,
 * off, G; rows = max_rows, groups in slices of <= 8 rows); f32: the sums into ws as the one
 * chunk of fp32 partials [rows][N] (for epi_launch) instead of y; off_early (grouped): off
 * was complete before the previous launch started (GV_OFF_EARLY: the slices and the weights
 * without waiting for it). -ENOTSUP: a shape or workspace it does not take. */
static int gemv_launch(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
		       gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int rows, int N,
		       int K, int ldy, gpu_ptr ws, size_t ws_bytes, int f32, int off_early)
{
	if (rows < 1 || (!w_tab && rows > 8) || N % 16 || N < 16 || K % 128 || K < 128 ||
	    ldy < N)
		return -ENOTSUP;
	struct gemm_split sp = gemv_split(g, N, K);
	const int tiles = N / 16;
	/* slices: at most rows / 8 + one a group with rows */
	int slice_cap = w_tab ? rows / 8 + (G < rows ? G : rows) + 1 : 1;
	const size_t need = sp.chunks > 1 || f32 ? (size_t)sp.chunks * rows * N * 4 : 0;
	if ((long long)slice_cap * tiles > GV_TILES || ws_bytes < need || (need && !ws))
		return -ENOTSUP;
	const int stage = 16 * (sp.chunks == 1 ? K : sp.chunk_blocks * 128 + 16);
	const long long units = (long long)slice_cap * tiles * sp.chunks; /* (grouped: a bound) */
	const int sms = gemm_sms(g);
	unsigned grid = (unsigned)(units < sms ? units : sms);
	/* stages: what the ring holds (at least one), no more than a block's units */
	const long long per = (units + grid - 1) / grid;
	int ns = GV_RING / stage;
	ns = ns < 1 ? 1 : ns > GV_MAXSTAGES ? GV_MAXSTAGES : ns;
	ns = per < ns ? (int)per : ns;
	const long long smem = GV_RING_OFF + (long long)ns * stage + (w_tab ? slice_cap * 16 : 0);
	if (smem > g->smem_block_optin - 1024) /* (room for the block scan's static words) */
		return -ENOTSUP;
	int slot = gv_next_slot();
	void *fn;
	int r = gpu_kernel_smem(g, w_tab ? "k_gemm_fp8_gemv_g" : "k_gemm_fp8_gemv", &fn);
	if (r)
		return r;
	int flags = (f32 ? 1 : 0) | (w_tab && off_early ? 2 : 0); /* GV_F32, GV_OFF_EARLY */
	void *args[] = {&W, &S, &x8, &sx, &y, &ws, &rows, &N, &K, &ldy, &sp.chunks, &sp.chunk_blocks,
			&ns, &slot};
	void *gargs[] = {&w_tab, &s_tab, &off, &G, &slice_cap, &x8, &sx, &y, &ws, &rows, &N, &K,
			 &ldy, &sp.chunks, &sp.chunk_blocks, &ns, &slot, &flags};
	return launch_pdl(g, fn, grid, 1, GV_THREADS, (unsigned)smem, w_tab ? gargs : args);
}

int cuda_gemm_fp8_gemv(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
		       int M, int N, int K, int ldy, gpu_ptr ws)
{
	if (M < 1 || M > 8)
		return -EINVAL;
	int r = gemv_launch(g, 0, 0, 0, 0, W, S, x8, sx, y, M, N, K, ldy, ws,
			    ws ? gemv_workspace(g, M, N, K) : 0, 0, 0);
	return r == -ENOTSUP ? -EINVAL : r;
}

/* Grouped GEMMs of at most this many rows (the MoE block's at 1 / 2 / 3 tokens: 9 / 18 / 27) run
 * on the one-row kernel in the fast mode while it is on (cuda_gemm_set_gemv). s15-9 (bench moe
 * --tokens 2,3, two rounds, against 16 rows: the streaming kernel from 2 tokens): 2 tokens
 * 227.0-227.3 -> 212.4-212.6 us (3.31 -> 3.54 TB/s), 3 tokens 317.5-318.3 -> 293.9-294.0
 * (3.47 -> 3.76). From 4 tokens the MoE block takes the token-wide kernel (4.2 TB/s). (At 4
 * tokens the down GEMM's slices x tiles would pass GV_TILES: -ENOTSUP, the streaming kernel.) */
#define GV_GROUPED_ROWS 32

static int grouped_gemv(const struct gpu *g, int max_rows)
{
	return !cuda_gemm_batch_invariant(g) && max_rows <= GV_GROUPED_ROWS && (gemv_bits() & 2);
}

/* ---- grouped (MoE experts) ------------------------------------------------------------------ */

size_t cuda_gemm_fp8_grouped_workspace(const struct gpu *g, int max_rows, int G, int N, int K)
{
	(void)G;
	struct gemm_split sp = cuda_gemm_decode_split(g, N, K), gv = gemv_split(g, N, K);
	size_t st = sp.chunks > 1 ? (size_t)sp.chunks * max_rows * N * 4 : 0;
	/* the one-row kernel's (grouped_gemv): its chunks, or one chunk of fp32 sums */
	size_t r = max_rows < GV_GROUPED_ROWS ? max_rows : GV_GROUPED_ROWS;
	size_t one = (size_t)gv.chunks * r * N * 4;
	return one > st ? one : st;
}

/* The streaming kernel over the groups; h8 != 0: with SwiGLU in the chunk sum (stream_launch). */
static int grouped_stream(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
			  gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K, int ldy,
			  gpu_ptr ws, size_t ws_bytes, int wg, const struct stream_epi *epi)
{
	if (G < 1 || max_rows < 0 || N % 16 || K % 128 || ldy < N || !w_tab || !s_tab || !off) {
		fprintf(stderr, "<3>dsv32: gemm_fp8_grouped: unsupported shape G=%d rows=%d N=%d "
				"K=%d ldy=%d\n", G, max_rows, N, K, ldy);
		return -EINVAL;
	}
	if (max_rows == 0)
		return 0;
	if (ws_bytes < cuda_gemm_fp8_grouped_workspace(g, max_rows, G, N, K))
		return -EINVAL;
	return stream_launch(g, w_tab, s_tab, off, G, 0, 0, x8, sx, y, max_rows, N, K, ldy, ws, 0,
			     wg, epi);
}

int cuda_gemm_fp8_grouped_stream(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
				 gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K,
				 int ldy, gpu_ptr ws, size_t ws_bytes)
{
	return grouped_stream(g, w_tab, s_tab, off, G, x8, sx, y, max_rows, N, K, ldy, ws, ws_bytes,
			      0, NULL);
}

/* Whether cuda_gemm_fp8_grouped runs the wgmma kernel: many rows per group (prefill), from 64
 * rows per group on average (half its 128-row token tile; a guess until the grouped benchmark
 * has measured both); below, the mma.sync kernels (run 3 sent 512 rows over 16 groups to wgmma
 * and the MoE block's decode-size check (T = 64) saw its coarser accumulation). The fast mode:
 * wgmma from 1024 rows (run 12, bench gemm --grouped, 8 experts a token: the streaming kernel's
 * wgmma consumers with the chunks summed apart 3.72 / 3.59 TB/s at 16 / 64 tokens on gate|up
 * against wgmma's 2.92 / 3.38, 3.65 / 3.56 against 2.82 / 3.37 on down; at 256 tokens 3.39 /
 * 3.30 against 3.43 / 3.50). */
static int grouped_wgmma(const struct gpu *g, int max_rows, int G, int N, int ldy)
{
	int wg_fast = !cuda_gemm_batch_invariant(g) && max_rows >= 1024;
	return CUDA_GEMM_WGMMA_GROUPED && (wg_fast || (max_rows > 64 && max_rows >= 64 * G)) &&
	       wgmma_fits(N, ldy);
}

int cuda_gemm_fp8_grouped(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
			  gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K, int ldy,
			  gpu_ptr ws, size_t ws_bytes)
{
	if (grouped_gemv(g, max_rows) && w_tab && s_tab && off && G >= 1) {
		int r = gemv_launch(g, w_tab, s_tab, off, G, 0, 0, x8, sx, y, max_rows, N, K, ldy, ws,
				    ws_bytes, 0, 0);
		if (r != -ENOTSUP)
			return r;
	}
	if (grouped_wgmma(g, max_rows, G, N, ldy)) {
		int r = cuda_gemm_fp8_wgmma_grouped(g, w_tab, s_tab, off, G, x8, sx, y, max_rows, N,
						    K, ldy);
		if (r != -ENOTSUP)
			return r;
	}
	/* below that, the fast mode runs the streaming kernel's wgmma consumers (run 9, 1 token:
	 * 2.94 / 2.38 TB/s against 2.43 / 2.00 for mma.sync and 2.02 / 1.51 for the wgmma grouped
	 * kernel on gate|up / down) */
	return grouped_stream(g, w_tab, s_tab, off, G, x8, sx, y, max_rows, N, K, ldy, ws, ws_bytes,
			      !cuda_gemm_batch_invariant(g), NULL);
}

int cuda_gemm_fp8_grouped_swiglu(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
				 gpu_ptr x8, gpu_ptr sx, gpu_ptr h8, gpu_ptr hs, int max_rows,
				 int N, int K, gpu_ptr ws, size_t ws_bytes, int *one_row)
{
	if (one_row)
		*one_row = 0;
	if (grouped_wgmma(g, max_rows, G, N, N) || !h8 || !hs)
		return -ENOTSUP;
	const struct stream_epi epi = {EPI_SWIGLU, h8, hs, 0, 0, 0, 0};
	if (grouped_gemv(g, max_rows) && N % 256 == 0 && G >= 1 && max_rows >= 1) {
		/* the one-row kernel's fp32 sums, then the SwiGLU step on them as one chunk */
		int r = gemv_launch(g, w_tab, s_tab, off, G, 0, 0, x8, sx, 0, max_rows, N, K, N, ws,
				    ws_bytes, 1, 0);
		if (!r && one_row)
			*one_row = 1;
		if (r != -ENOTSUP)
			return r ? r : epi_launch(g, &epi, ws, 1, max_rows, off + (gpu_ptr)G * 4, N, 0);
	}
	return grouped_stream(g, w_tab, s_tab, off, G, x8, sx, 0, max_rows, N, K, N, ws, ws_bytes,
			      !cuda_gemm_batch_invariant(g), &epi);
}

int cuda_gemm_fp8_grouped_combine(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off,
				  int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int T, int topk,
				  gpu_ptr wts, gpu_ptr perm, int N, int K, gpu_ptr ws,
				  size_t ws_bytes, int off_early)
{
	const int max_rows = T * (topk + 1);
	if (T < 1 || topk < 1 || grouped_wgmma(g, max_rows, G, N, N) || !wts || !perm)
		return -ENOTSUP;
	const struct stream_epi epi = {EPI_COMBINE, 0, 0, wts, perm, T, topk};
	if (grouped_gemv(g, max_rows) && G >= 1) {
		/* the one-row kernel's fp32 sums, then the combine on them as one chunk */
		int r = gemv_launch(g, w_tab, s_tab, off, G, 0, 0, x8, sx, 0, max_rows, N, K, N, ws,
				    ws_bytes, 1, off_early);
		if (r != -ENOTSUP)
			return r ? r : epi_launch(g, &epi, ws, 1, max_rows, off + (gpu_ptr)G * 4, N, y);
	}
	return grouped_stream(g, w_tab, s_tab, off, G, x8, sx, y, max_rows, N, K, N, ws, ws_bytes,
			      !cuda_gemm_batch_invariant(g), &epi);
}

/* DSV32_CUDA_MOE_GEMV_BLOCK (cuda_gemm_set_moe_block): 1 (the default) the MoE block's GEMMs and
 * epilogues at 1-3 tokens in one launch, 0 the four launches */
static int moe_block_on = -1;

void cuda_gemm_set_moe_block(int on) { moe_block_on = on < 0 ? -1 : on != 0; }

/* k_moe_gemv_block's launch: the gate|up split (the two launches' own), the ring's slots */
struct moe_block_plan {
	const char *kernel;
	int threads;
	struct gemm_split a;
	int slot_bytes, ns, slice_cap;
	long long smem;
	size_t ey_at; /* down's sums in the workspace */
};

/* 0 and *p where k_moe_gemv_block runs the block, else -ENOTSUP. Down's K is whole (a unit one
 * contiguous copy of 16 I bytes); where gate|up's stage is 1-2 of those, a slot of the ring is
 * down's stage and gate|up takes two (k_moe_gemv_block), else a slot is the larger stage
 * (k_moe_gemv_block1). r1: one token routed in the block (the _r1 forms: a routing warp more, the
 * token's quantised row and the picks in shared memory; 2: the _r1h forms, their stream held
 * until x is complete). */
static int moe_block_plan(const struct gpu *g, int T, int topk, int G, int D, int I,
			  size_t ws_bytes, int r1, struct moe_block_plan *p)
{
	const int max_rows = T * (topk + 1);
	if (!env_on(&moe_block_on, "DSV32_CUDA_MOE_GEMV_BLOCK") || T < 1 || topk < 1 || G < 1 ||
	    !grouped_gemv(g, max_rows) || D % 128 || D < 128 || I % 128 || I < 128)
		return -ENOTSUP;
	p->a = gemv_split(g, 2 * I, D);
	const struct gemm_split b = gemv_split(g, D, I);
	const int stage_a = 16 * (p->a.chunks == 1 ? D : p->a.chunk_blocks * 128 + 16),
		  stage_b = 16 * I;
	const int two = stage_a > stage_b && stage_a <= 2 * stage_b;
	static const char *const names[2][3] = {
		{"k_moe_gemv_block1", "k_moe_gemv_block1_r1", "k_moe_gemv_block1_r1h"},
		{"k_moe_gemv_block", "k_moe_gemv_block_r1", "k_moe_gemv_block_r1h"}};
	p->kernel = names[two][r1 == 2 ? 2 : r1 != 0];
	p->threads = r1 ? GV_R1_THREADS : GV_THREADS;
	p->slot_bytes = two ? stage_b : stage_a > stage_b ? stage_a : stage_b;
	p->ns = GV_RING / p->slot_bytes;
	p->ns = (p->ns > GV_MAXSTAGES ? GV_MAXSTAGES : p->ns) & (two ? ~1 : ~0);
	p->slice_cap = max_rows / 8 + (G < max_rows ? G : max_rows) + 1;
	p->smem = GV_RING_OFF + (long long)p->ns * p->slot_bytes + p->slice_cap * 16 +
		  (r1 ? GV_R1_SMEM(D) : 0);
	const int tiles = (2 * I > D ? 2 * I : D) / 16;
	/* gate|up's fp32 sums, then down's (apart: see gemm_fp8_gemv.cu) */
	p->ey_at = ((size_t)p->a.chunks * max_rows * 2 * I * 4 + 255) & ~(size_t)255;
	const size_t need = p->ey_at + (size_t)max_rows * D * 4;
	if (b.chunks != 1 || p->ns < (two ? 2 : 1) || (long long)p->slice_cap * tiles > GV_TILES ||
	    ws_bytes < need || p->smem > g->smem_block_optin - 1024)
		return -ENOTSUP;
	return 0;
}

const char *cuda_gemm_fp8_moe_block_kernel(const struct gpu *g, int T, int topk, int G, int D,
					   int I, size_t ws_bytes, int early)
{
	struct moe_block_plan p;
	return moe_block_plan(g, T, topk, G, D, I, ws_bytes, early, &p) ? NULL : p.kernel;
}

/* DSV32_CUDA_MOE_BLOCK_EARLY (cuda_gemm_set_moe_block_early): 1 the one-token block that routes
 * itself on the _r1 forms, 2 on the _r1h forms; 0 (the default) k_moe_gemv_block / _block1 */
static int moe_block_early_on = -1;

void cuda_gemm_set_moe_block_early(int on)
{
	moe_block_early_on = on < 0 ? -1 : on == 2 ? 2 : on != 0;
}

int cuda_gemm_moe_block_early(void)
{
	return env_choice(&moe_block_early_on, "DSV32_CUDA_MOE_BLOCK_EARLY", 2);
}

/* DSV32_CUDA_MOE_BLOCK_ROUTE (cuda_gemm_set_moe_block_route): 1 (the default) one token's
 * block routes itself after k_moe_gate_logits1s, 0 k_moe_gate_route1s routes it */
static int moe_block_route_on = -1;

void cuda_gemm_set_moe_block_route(int on) { moe_block_route_on = on < 0 ? -1 : on != 0; }

/* The shape the block routes itself: one token over 256 experts (moe_route_select256) + the
 * shared one, at most 32 picks */
static int route1_shape(int T, int topk, int G) { return T == 1 && G == 257 && topk <= 32; }

int cuda_gemm_fp8_moe_block_routes(const struct gpu *g, int T, int topk, int G, int D, int I,
				   size_t ws_bytes)
{
	struct moe_block_plan p;
	return route1_shape(T, topk, G) &&
	       env_on(&moe_block_route_on, "DSV32_CUDA_MOE_BLOCK_ROUTE") &&
	       !moe_block_plan(g, T, topk, G, D, I, ws_bytes, cuda_gemm_moe_block_early(), &p);
}

int cuda_gemm_fp8_moe_block_x_ready(struct gpu *g, gpu_ptr *flag)
{
	gpu_ptr p;
	size_t n;
	if (gpu_module_global(g, "gv_xready", &p, &n) || n < GV_SLOTS * sizeof(unsigned))
		return -ENOENT;
	/* a set of its own (two blocks at once on two streams never share a flag) */
	*flag = p + (gpu_ptr)gv_next_slot() * sizeof(unsigned);
	return 0;
}

int cuda_gemm_fp8_moe_block(struct gpu *g, gpu_ptr w13_tab, gpu_ptr s13_tab, gpu_ptr w2_tab,
			    gpu_ptr s2_tab, gpu_ptr off, int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr h8,
			    gpu_ptr hs, gpu_ptr y, int T, int topk, gpu_ptr wts, gpu_ptr perm, int D,
			    int I, gpu_ptr ws, size_t ws_bytes, const struct cuda_moe_route1 *rt)
{
	struct moe_block_plan p;
	/* with x_ready the _r1 forms (form 1) or the _r1h (form 2), which also read x */
	const int early = rt && rt->x_ready ? rt->form : 0;
	const int bad_rt = rt && (!route1_shape(T, topk, G) || !rt->scores ||
				  (rt->x_ready && (early < 1 || early > 2 || !rt->x)));
	if (!ws || bad_rt || moe_block_plan(g, T, topk, G, D, I, ws_bytes, early, &p))
		return -ENOTSUP;
	const struct cuda_moe_route1 none = {0, 0, 0, 0, 0.f, 0, 0, 0, 0, 0};
	const struct cuda_moe_route1 *q = rt ? rt : &none;
	void *fn;
	int r = gpu_kernel_smem(g, p.kernel, &fn);
	if (r)
		return r;
	int max_rows = T * (topk + 1), slot = gv_next_slot();
	gpu_ptr ey = ws + p.ey_at;
	void *args[] = {&w13_tab, &s13_tab, &w2_tab, &s2_tab, &off, &G, &p.slice_cap, &x8, &sx,
			&h8, &hs, &ws, &ey, &y, &wts, &perm, &T, &topk, &max_rows, &D, &I,
			&p.a.chunks, &p.a.chunk_blocks, &p.slot_bytes, &p.ns, &slot,
			(void *)&q->scores, (void *)&q->idx, (void *)&q->counts, (void *)&q->src,
			(void *)&q->route_scale, (void *)&q->topk_group, (void *)&q->norm_topk_prob,
			(void *)&q->x, (void *)&q->x_ready};
	/* one block an SM, all resident: the phases meet at grid-wide arrivals */
	return launch_pdl(g, fn, (unsigned)gemm_sms(g), 1, (unsigned)p.threads, (unsigned)p.smem,
			  args);
}

/* ---- cuBLASLt -------------------------------------------------------------------------- */

static struct cublaslt *lt_of[MAX_GPUS]; /* per GPU ordinal, opened on first use */
static int lt_state[MAX_GPUS];           /* 0 untried, 1 open, < 0 failed (errno) */

static size_t sxT_bytes(int M, int K) { return ((size_t)M * (K / 128) * 4 + 255) / 256 * 256; }

size_t cuda_gemm_fp8_workspace(const struct gpu *g, int M, int N, int K)
{
	size_t lt = sxT_bytes(M, K) + cublaslt_gemm_fp8_workspace(M, N);
	size_t dec = cuda_gemm_decode_workspace(g, M < 64 ? M : 64, N, K);
	return lt > dec ? lt : dec;
}

static struct cublaslt *lt_get(struct gpu *g)
{
	if (g->ordinal < 0 || g->ordinal >= MAX_GPUS)
		return NULL;
	pthread_mutex_lock(&gemm_lock);
	if (lt_state[g->ordinal] == 0) {
		struct err e = {""};
		lt_state[g->ordinal] = cublaslt_open(g, &lt_of[g->ordinal], &e);
		if (lt_state[g->ordinal])
			fprintf(stderr, "<4>dsv32: GPU %d: no cuBLASLt GEMM path: %s\n", g->ordinal,
				e.msg);
		else
			lt_state[g->ordinal] = 1;
	}
	struct cublaslt *lt = lt_state[g->ordinal] == 1 ? lt_of[g->ordinal] : NULL;
	pthread_mutex_unlock(&gemm_lock);
	return lt;
}

int cuda_gemm_fp8_lt(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
		     int M, int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes)
{
	/* cuBLASLt's weight scales have a leading dimension padded to 4 blocks; ours are compact
	 * [N/128, K/128], the same only when K/128 % 4 == 0 (every V3.2 matrix, not the small test
	 * models: run 2 read wrong scales there) */
	if ((K / 128) % 4)
		return -ENOTSUP;
	struct cublaslt *lt = lt_get(g);
	if (!lt)
		return -ENOTSUP;
	size_t st = sxT_bytes(M, K);
	if (M < 1 || K % 128 || ws_bytes < st + cublaslt_gemm_fp8_workspace(M, N) || !ws)
		return -EINVAL;
	/* cuBLASLt reads the activation scales token-contiguous: sxT[K/128, M] = sx^T. */
	int rows = M, cols = K / 128;
	void *args[] = {&sx, &ws, &rows, &cols};
	unsigned blocks = (unsigned)(((long long)rows * cols + 255) / 256);
	int r = gpu_launch(g, gpu_kernel(g, "k_f32_transpose"), blocks < 1024 ? blocks : 1024, 1, 1,
			   256, 1, 1, 0, args);
	if (r)
		return r;
	return cublaslt_gemm_fp8(lt, g, W, S, K / 128, x8, ws, y, M, N, K, ldy, ws + st,
				 ws_bytes - st);
}

/* ---- the dispatch table ------------------------------------------------------------------ */

/* Measured paths, per GPU ordinal and mode (fast or batch-invariant: a measurement in one mode
 * says nothing about the other's candidates), M bucket and shape. */
struct gemm_entry {
	int ordinal, fast, bucket, N, K;
	enum cuda_gemm_path forced; /* cuda_gemm_path_set's path, else NONE: the fastest of t */
	float t[CUDA_GEMM_PATHS];   /* cuda_gemm_tune's times (us; < 0 not timed) */
	int lt_ok;		    /* whether cuBLASLt was a candidate */
};

/* Where the start-up measurement picked the swapped kernel, the dispatch takes it only on
 * matrices of at least swap_on MB (1: all; 0: none), else the fastest other path it measured
 * (bench model --ab compares them in one process); -1: the environment (DSV32_GEMM_SWAP=n) not
 * read yet. Default 64 (session 9: the 7168x16384 o projection, 7168x18432 and up). Bench gemm,
 * TB/s at M = 16 / 32 / 64, "ours" with the 200 MB rule (run 36) against 64 (run 37, sw / sw2 from
 * 8 rows): 7168x16384 3.21 / 3.00 / 2.60 against 3.33 / 3.34 / 3.07; 18432x7168 2.87 / 2.63 /
 * 2.34 against 3.46 / 3.43 / 3.25 (M = 8 3.49 against 3.56); 7168x18432 3.29 / 3.02 / 2.67
 * against 3.39 / 3.38 / 3.14. The step-level --ab was noise both ways (runs 34-35 at 64 MB:
 * -479..+475 us; run 37, DSV32_GEMM_SWAP=200 against 64 at 32K, batch 16 / 32 / 64: +55 / -517 /
 * +396 us). Before: 200 (run 26 --ab at 128K: -34.5 us at batch 16, -514 at batch 64 against
 * none; 64 MB +276 / -328; everywhere (1) run 23 / 25: +196 / +423 us at batch 64, 32K / 128K,
 * though its GEMMs alone are faster). */
static int swap_on = -1;

void cuda_gemm_set_swap(int on) { swap_on = on; }

/* whether the swapped kernel is left out for an N x K matrix */
static int swap_off(int N, int K)
{
	if (swap_on < 0) {
		const int v = env_int("DSV32_GEMM_SWAP", 64);
		swap_on = v >= 0 ? v : 64;
	}
	return !swap_on || (swap_on > 1 && (double)N * K < swap_on * 1048576.0);
}

/* The one-row kernel: bit 0 (1) the dense GEMMs' (CUDA_GEMM_PATH_GEMV: timed by the start-up
 * measurement at M <= 8 in the fast mode while the bit is on, taken where it measured fastest;
 * turned off later, the dispatch takes the fastest other path), bit 1 (2) the grouped
 * GEMMs' of <= GV_GROUPED_ROWS rows in the fast mode. Default 2: runs 26 / 27, bench model --ab
 * at batch 1, none (0) +10..+18 us against grouped only, both (3) +5..+11, though bench gemm has
 * the dense ones faster alone (2240x7168 9.29 against v2 11.44 us, 8192x1536 6.87 / 7.54,
 * 24576x1536 15.04 / 16.23 at M = 1); the one-token MoE block's gate|up 71.4 against 74.3 us,
 * down 43.0 / 44.8. (Run 27: the dense ones with a 64 / 32 KB ring, for a smaller footprint,
 * +27..+35 / +55..+74 us: not kept.) -1: the environment (DSV32_GEMM_GEMV=n) not read yet. */
static int gemv_on = -1;

void cuda_gemm_set_gemv(int on) { gemv_on = on < 0 ? -1 : on & 3; }

static int gemv_bits(void)
{
	if (gemv_on < 0) {
		const int v = env_int("DSV32_GEMM_GEMV", 2);
		gemv_on = v >= 0 ? v & 3 : 2;
	}
	return gemv_on;
}

/* The swapped kernel at one row (bucket 1): always timed by the start-up measurement in the fast
 * mode, taken where it measured fastest only while this switch is on (bench model --ab compares
 * in one process). Its K-halves form's end, since s19 one cluster barrier and short code, made it
 * the fastest at one row on the large matrices (s19-4, bench gemm: 7168x16384 3.76-3.78 TB/s
 * against the dispatch's wg 3.61, 18432x7168 3.89 against v2 3.68); run 22 had it slower in a step
 * than in bench gemm (q_b at one row, 21.4 against ~20 us; q_b is now under DSV32_GEMM_SWAP's
 * 64 MB), which is why one row was left out. Default on: s19-7, bench model --synthetic --layers 8
 * --dense 3 --batches 1 --steps 50 --ab DSV32_GEMM_SW_M1=1, twice: -1.2 / -3.6 us a step at 4K,
 * -11.6 / -13.3 at 32K (2.24 / 2.28 ms); s19-5 (4 layers, 1 dense) +3.0 / -3.1: the noise.
 * -1: the environment (DSV32_GEMM_SW_M1=0/1) not read yet. */
static int sw_m1_on = -1;

void cuda_gemm_set_sw_m1(int on) { sw_m1_on = on < 0 ? -1 : on != 0; }

static int sw_m1(void) { return env_on(&sw_m1_on, "DSV32_GEMM_SW_M1"); }

/* The paths the switches leave out of a measured entry's choice (a bit per path). */
static unsigned paths_off(int N, int K, int bucket)
{
	return (swap_off(N, K) || (bucket == 1 && !sw_m1())
			? 1u << CUDA_GEMM_PATH_STREAM_SW | 1u << CUDA_GEMM_PATH_STREAM_SW2
			: 0) |
	       (gemv_bits() & 1 ? 0 : 1u << CUDA_GEMM_PATH_GEMV);
}

static enum cuda_gemm_path pick(const float *t, int lt_ok, unsigned off, int bucket);

#define MAX_ENTRIES 1024
static struct gemm_entry table[MAX_ENTRIES];
static int n_table;

int cuda_gemm_m_bucket(int M)
{
	if (M <= 1) /* one token (batch-1 decode): its own measurement */
		return 1;
	int b = 8;
	while (b < M && b < (1 << 24))
		b *= 2;
	return b;
}

static struct gemm_entry *entry_find(int ordinal, int fast, int bucket, int N, int K)
{
	for (int i = 0; i < n_table; i++)
		if (table[i].ordinal == ordinal && table[i].fast == fast && table[i].bucket == bucket &&
		    table[i].N == N && table[i].K == K)
			return &table[i];
	return NULL;
}

/* The fast mode's paths where nothing was measured at start-up (cuda_gemm_tune): where run 10's
 * bench gemm (H200, cold L2) measured a path faster than the exact decode kernel (M bucket, N,
 * K; TB/s of weights). The streaming kernel's wgmma consumers with the chunks summed apart
 * (wg_nf): M <= 8 on 7168x16384 / 7168x18432 (3.31-3.42 against v2's 2.90-3.06); M = 16 on the
 * large matrices, 24576x1536 and 32768x512 (3.09-3.27 and 1.67-2.15 against cuBLASLt's
 * 2.28-2.77 and 1.15-2.01); M = 32 everywhere but 24576x1536 (cuBLASLt 2.05); M = 64 on
 * 2112x7168 and 7168x2048. cuBLASLt: M = 32 on 24576x1536, M = 64 on the rest (2.1-2.7 against
 * wgmma consumers' 1.4-2.0), M = 128 but on 32768x512 and 7168x2048 (the wgmma kernel), M = 4096
 * on 2112x7168 and 24576x1536 (18432x7168 and 7168x18432 flip between 0.94x and 1.06x from run
 * to run: left to wgmma, or to the start-up measurement). The exact decode kernel keeps
 * M <= 8 elsewhere and M = 16 on 4096x7168, 2112x7168 and 7168x2048. */
#define LT CUDA_GEMM_PATH_CUBLASLT
#define WG CUDA_GEMM_PATH_STREAM_WG
static const struct {
	int bucket, N, K;
	enum cuda_gemm_path path;
} fast_default[] = {
	{8, 7168, 16384, WG},	{8, 7168, 18432, WG},	 {16, 7168, 16384, WG},
	{16, 18432, 7168, WG},	{16, 7168, 18432, WG},	 {16, 24576, 1536, WG},
	{16, 32768, 512, WG},	{32, 7168, 16384, WG},	 {32, 18432, 7168, WG},
	{32, 7168, 18432, WG},	{32, 4096, 7168, WG},	 {32, 2112, 7168, WG},
	{32, 7168, 2048, WG},	{32, 32768, 512, WG},	 {32, 24576, 1536, LT},
	{64, 2112, 7168, WG},	{64, 7168, 2048, WG},	 {64, 24576, 1536, LT},
	{64, 32768, 512, LT},	{64, 7168, 16384, LT},	 {64, 18432, 7168, LT},
	{64, 7168, 18432, LT},	{64, 4096, 7168, LT},	 {128, 2112, 7168, LT},
	{128, 24576, 1536, LT}, {128, 7168, 16384, LT},	 {128, 18432, 7168, LT},
	{128, 7168, 18432, LT}, {128, 4096, 7168, LT},	 {4096, 2112, 7168, LT},
	{4096, 24576, 1536, LT},
};
#undef LT
#undef WG

static enum cuda_gemm_path fast_path(const struct gpu *g, int M, int N, int K)
{
	if (cuda_gemm_batch_invariant(g))
		return CUDA_GEMM_PATH_NONE;
	int b = cuda_gemm_m_bucket(M > 1 ? M : 2); /* (the table's first bucket, 8, holds M = 1) */
	for (size_t i = 0; i < sizeof fast_default / sizeof *fast_default; i++)
		if (fast_default[i].bucket == b && fast_default[i].N == N && fast_default[i].K == K)
			return fast_default[i].path == CUDA_GEMM_PATH_CUBLASLT && (K / 128) % 4
				       ? CUDA_GEMM_PATH_NONE
				       : fast_default[i].path;
	return CUDA_GEMM_PATH_NONE;
}

enum cuda_gemm_path cuda_gemm_path_for(const struct gpu *g, int M, int N, int K)
{
	int fast = !cuda_gemm_batch_invariant(g);
	pthread_mutex_lock(&gemm_lock);
	struct gemm_entry *e = entry_find(g->ordinal, fast, cuda_gemm_m_bucket(M), N, K);
	if (!e && M <= 1) /* one token, not measured on its own: the 2-8 rows' entry */
		e = entry_find(g->ordinal, fast, cuda_gemm_m_bucket(2), N, K);
	enum cuda_gemm_path p = !e		       ? CUDA_GEMM_PATH_NONE
				: e->forced != CUDA_GEMM_PATH_NONE ? e->forced
								   : pick(e->t, e->lt_ok,
									  paths_off(N, K, e->bucket),
									  e->bucket);
	pthread_mutex_unlock(&gemm_lock);
	if (p == CUDA_GEMM_PATH_NONE)
		p = fast_path(g, M, N, K);
	if ((p == CUDA_GEMM_PATH_STREAM_WG || p == CUDA_GEMM_PATH_STREAM_SW ||
	     p == CUDA_GEMM_PATH_STREAM_SW2) &&
	    (!fast || M > 64))
		p = CUDA_GEMM_PATH_NONE; /* the fast mode's decode path only */
	if (p == CUDA_GEMM_PATH_GEMV && (!fast || M > 8))
		p = CUDA_GEMM_PATH_NONE; /* the fast mode's, at most 8 rows */
	if (p != CUDA_GEMM_PATH_NONE)
		return p;
	/* Unmeasured shapes: ours — the decode kernel for M <= 64 (cuBLASLt streams ~0.35 TB/s at
	 * M = 16..128, issue 9), the wgmma kernel above where its shape contract holds
	 * (CUDA_GEMM_WGMMA_DENSE), else cuBLASLt, else the decode kernel in 64-row pieces. */
	if (M <= 64)
		return CUDA_GEMM_PATH_DECODE;
	return CUDA_GEMM_WGMMA_DENSE && wgmma_fits(N, N) ? CUDA_GEMM_PATH_WGMMA
							 : CUDA_GEMM_PATH_CUBLASLT;
}

/* Records (bucket(M), N, K)'s entry in g's current mode: forced, or the times t (< 0: not
 * timed) to pick from at each dispatch. */
static void path_record(const struct gpu *g, int M, int N, int K, enum cuda_gemm_path forced,
			const float *t, int lt_ok)
{
	int fast = !cuda_gemm_batch_invariant(g);
	pthread_mutex_lock(&gemm_lock);
	int b = cuda_gemm_m_bucket(M);
	struct gemm_entry *e = entry_find(g->ordinal, fast, b, N, K);
	if (!e && n_table < MAX_ENTRIES)
		e = &table[n_table++];
	if (e) {
		*e = (struct gemm_entry){g->ordinal, fast, b, N, K, forced, {0}, lt_ok};
		for (int p = 0; p < CUDA_GEMM_PATHS; p++)
			e->t[p] = t ? t[p] : -1;
	}
	pthread_mutex_unlock(&gemm_lock);
}

void cuda_gemm_path_set(const struct gpu *g, int M, int N, int K, enum cuda_gemm_path path)
{
	path_record(g, M, N, K, path, NULL, 0);
}

int cuda_gemm_fp8(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int M,
		  int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes)
{
	enum cuda_gemm_path p = cuda_gemm_path_for(g, M, N, K);
	if (p == CUDA_GEMM_PATH_WGMMA && wgmma_fits(N, ldy)) {
		int r = cuda_gemm_fp8_wgmma(g, W, S, x8, sx, y, M, N, K, ldy);
		if (r != -ENOTSUP)
			return r;
		p = CUDA_GEMM_PATH_CUBLASLT; /* no tensor-map entry point in this driver */
	}
	if (p == CUDA_GEMM_PATH_CUBLASLT || M > 64) {
		int r = cuda_gemm_fp8_lt(g, W, S, x8, sx, y, M, N, K, ldy, ws, ws_bytes);
		if (r != -ENOTSUP)
			return r;
	}
	/* the decode kernels, 64 rows at a time (their rows do not depend on the others) */
	for (int m0 = 0; m0 < M; m0 += 64) {
		gpu_ptr x = x8 + (size_t)m0 * K, s = sx + (size_t)m0 * (K / 128) * 4,
			yy = y + (size_t)m0 * ldy * 2;
		int m = M - m0 < 64 ? M - m0 : 64;
		const int sw = p == CUDA_GEMM_PATH_STREAM_SW || p == CUDA_GEMM_PATH_STREAM_SW2;
		int r = sw ? cuda_gemm_fp8_stream_sw(g, W, S, x, s, yy, m, N, K, ldy,
						     p == CUDA_GEMM_PATH_STREAM_SW2)
			: p == CUDA_GEMM_PATH_GEMV && m <= 8
				? cuda_gemm_fp8_gemv(g, W, S, x, s, yy, m, N, K, ldy, ws)
				: -ENOTSUP;
		if (r == -EINVAL && p == CUDA_GEMM_PATH_GEMV)
			r = -ENOTSUP; /* a shape it does not take: the decode kernel */
		if (r == -ENOTSUP)
			r = p == CUDA_GEMM_PATH_STREAM_WG || sw
				    ? cuda_gemm_fp8_stream_wg(g, W, S, x, s, yy, m, N, K, ldy, ws, 1)
				    : cuda_gemm_fp8_decode(g, W, S, x, s, yy, m, N, K, ldy, ws);
		if (r)
			return r;
	}
	return 0;
}

/* ---- start-up measurement ---------------------------------------------------------------- */

const char *cuda_gemm_path_name(enum cuda_gemm_path p)
{
	switch (p) {
	case CUDA_GEMM_PATH_DECODE:
		return "dec";
	case CUDA_GEMM_PATH_STREAM_WG:
		return "wg";
	case CUDA_GEMM_PATH_STREAM_SW:
		return "sw";
	case CUDA_GEMM_PATH_STREAM_SW2:
		return "sw2";
	case CUDA_GEMM_PATH_GEMV:
		return "gemv";
	case CUDA_GEMM_PATH_CUBLASLT:
		return "lt";
	case CUDA_GEMM_PATH_WGMMA:
		return "wgmma";
	default:
		return "-";
	}
}

/* 1: cuda_gemm_tune may pick cuBLASLt over our decode kernel when it is faster (M = 32, 64 on
 * most shapes, docs/PERF.md) in the batch-invariant mode too; the fast mode always may. */
#define CUDA_GEMM_LT_FOR_DECODE 0

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

struct tune_args {
	gpu_ptr W, S, x8, sx, y, ws, flush;
	size_t ws_bytes, flush_bytes;
	int M, N, K, ldy;
	const gpu_ptr *Wr, *Sr; /* cuda_gemm_tune_rotate: n_rot copies taken in turn (cold L2) */
	int n_rot, turn;
};

static int run_path(struct gpu *g, struct tune_args *a, enum cuda_gemm_path p)
{
	gpu_ptr W = a->W, S = a->S;
	if (a->n_rot > 0) {
		W = a->Wr[a->turn % a->n_rot], S = a->Sr[a->turn % a->n_rot];
		a->turn++;
	}
	switch (p) {
	case CUDA_GEMM_PATH_DECODE:
		return cuda_gemm_fp8_decode(g, W, S, a->x8, a->sx, a->y, a->M, a->N, a->K, a->ldy,
					    a->ws);
	case CUDA_GEMM_PATH_STREAM_WG:
		return cuda_gemm_fp8_stream_wg(g, W, S, a->x8, a->sx, a->y, a->M, a->N, a->K, a->ldy,
					       a->ws, 1);
	case CUDA_GEMM_PATH_STREAM_SW:
	case CUDA_GEMM_PATH_STREAM_SW2:
		return cuda_gemm_fp8_stream_sw(g, W, S, a->x8, a->sx, a->y, a->M, a->N, a->K, a->ldy,
					       p == CUDA_GEMM_PATH_STREAM_SW2);
	case CUDA_GEMM_PATH_GEMV:
		return cuda_gemm_fp8_gemv(g, W, S, a->x8, a->sx, a->y, a->M, a->N, a->K, a->ldy,
					  a->ws);
	case CUDA_GEMM_PATH_WGMMA:
		return wgmma_fits(a->N, a->ldy) ? cuda_gemm_fp8_wgmma(g, W, S, a->x8, a->sx, a->y,
								      a->M, a->N, a->K, a->ldy)
						: -EINVAL;
	default:
		return cuda_gemm_fp8_lt(g, W, S, a->x8, a->sx, a->y, a->M, a->N, a->K, a->ldy, a->ws,
					a->ws_bytes);
	}
}

/* Microseconds a launch: the fastest of TUNE_TRIES event-timed bursts of TUNE_BURST launches
 * back to back, after a warm-up; < 0 when the path fails. Back to back as a step runs its GEMMs
 * (and a CUDA graph replays them): run 13's single launches from an idle stream counted
 * cuBLASLt's host cost and picked the wgmma consumers at M = 64 where cuBLASLt is 8-18% faster
 * back to back. The minimum, not the median of 5 (run 15 picked the wgmma consumers at 0.93x
 * of cuBLASLt on 32768x512, M = 64): a burst is only ever slowed by noise. */
#define TUNE_BURST 4 /* (s11-5: bursts of 16 timed the same within 1-4% and picked the same) */
#define TUNE_TRIES 9
static float time_path(struct gpu *g, struct tune_args *a, enum cuda_gemm_path p)
{
	if (run_path(g, a, p) || gpu_sync(g))
		return -1;
	CUevent ev[2];
	if (gpu_timing_events(ev))
		return -1;
	float t[TUNE_TRIES], ms = -1;
	int k;
	for (k = 0; k < TUNE_TRIES; k++) {
		if (a->flush)
			cu.cuMemsetD8Async(a->flush, (unsigned char)k, a->flush_bytes, g->stream);
		cu.cuEventRecord(ev[0], g->stream);
		int r = 0;
		for (int b = 0; b < TUNE_BURST && !r; b++)
			r = run_path(g, a, p);
		if (r)
			break;
		cu.cuEventRecord(ev[1], g->stream);
		if (cu_check(cu.cuEventSynchronize(ev[1]), "cuEventSynchronize", __FILE__, __LINE__))
			break;
		cu.cuEventElapsedTime(&t[k], ev[0], ev[1]);
		t[k] /= TUNE_BURST;
	}
	if (k == TUNE_TRIES) {
		qsort(t, TUNE_TRIES, sizeof *t, cmp_float);
		ms = t[0];
	}
	gpu_timing_events_free(ev);
	return ms < 0 ? -1 : ms * 1e3f;
}

/* Where cuBLASLt is a candidate, another path replaces it only when faster by more than this
 * fraction (the noise between runs of the same kernel, run 15: ~2-3%): issue 9's rule is never
 * slower than cuBLASLt (run 15's median-of-5 picked the wgmma consumers at 0.93x of it on
 * 32768x512, M = 64; run 17's "built-in kept within 3%" kept wgmma at 0.87-0.93x of it at
 * M = 4096). */
#define TUNE_MARGIN 0.03f
/* Above 64 rows (bucket 128 and up: the wgmma kernel against cuBLASLt, compute-bound): run 35's
 * start-up tune took wgmma for 7168x18432 at M = 4096, and the same table then timed it at
 * 1,083 us against cuBLASLt's 968-990 (wgmma's own column 1,049): its 4-launch bursts read a
 * wgmma that sustained runs (at the power cap) do not reach; every bench gemm table of runs
 * 28-35 has cuBLASLt at least as fast at M = 4096, wgmma 13-15% faster only at 128 rows on
 * 32768x512. */
#define TUNE_MARGIN_PREFILL 0.08f

/* The fastest timed path of t (us, < 0: not timed) but those in off (a bit per path): cuBLASLt
 * unless beaten by TUNE_MARGIN (TUNE_MARGIN_PREFILL above bucket 64) where it may be chosen
 * (lt_ok); NONE when none ran. */
static enum cuda_gemm_path pick(const float *t, int lt_ok, unsigned off, int bucket)
{
	const float margin = bucket > 64 ? TUNE_MARGIN_PREFILL : TUNE_MARGIN;
	enum cuda_gemm_path best = CUDA_GEMM_PATH_NONE;
	for (int p = 1; p < CUDA_GEMM_PATHS; p++)
		if (t[p] >= 0 && (p != CUDA_GEMM_PATH_CUBLASLT || lt_ok) && !(off >> p & 1) &&
		    (best == CUDA_GEMM_PATH_NONE || t[p] < t[best]))
			best = (enum cuda_gemm_path)p;
	if (best == CUDA_GEMM_PATH_NONE && t[CUDA_GEMM_PATH_CUBLASLT] >= 0)
		best = CUDA_GEMM_PATH_CUBLASLT; /* the only one that runs */
	const float lt_t = t[CUDA_GEMM_PATH_CUBLASLT];
	if (best != CUDA_GEMM_PATH_NONE && best != CUDA_GEMM_PATH_CUBLASLT && lt_ok && lt_t >= 0 &&
	    t[best] > lt_t * (1 - margin))
		best = CUDA_GEMM_PATH_CUBLASLT; /* within the noise of cuBLASLt */
	return best;
}

/* Times each candidate of the current mode at a->M rows and records the times for the bucket
 * (the dispatch picks the fastest of those its switches allow: cuBLASLt unless beaten by
 * TUNE_MARGIN), returns the fastest of all (NONE when no path ran). The swapped kernel is a
 * candidate in the fast mode (at one row only while cuda_gemm_set_sw_m1 is on: the times are
 * recorded either way); the dense one-row kernel at M <= 8 in the
 * fast mode only while cuda_gemm_set_gemv's bit 0 is on (off by default: then not timed, so
 * --ab cannot turn it on in a process started without it). us[CUDA_GEMM_PATHS] (may be NULL): the
 * times, < 0 where a path was not timed or failed. */
static enum cuda_gemm_path tune_shape(struct gpu *g, struct tune_args *a, float *us)
{
	int fast = !cuda_gemm_batch_invariant(g);
	float t[CUDA_GEMM_PATHS];
	for (int p = 0; p < CUDA_GEMM_PATHS; p++)
		t[p] = -1;
	if (a->M <= 64) {
		t[CUDA_GEMM_PATH_DECODE] = time_path(g, a, CUDA_GEMM_PATH_DECODE);
		if (fast)
			t[CUDA_GEMM_PATH_STREAM_WG] = time_path(g, a, CUDA_GEMM_PATH_STREAM_WG);
		if (fast) {
			t[CUDA_GEMM_PATH_STREAM_SW] = time_path(g, a, CUDA_GEMM_PATH_STREAM_SW);
			t[CUDA_GEMM_PATH_STREAM_SW2] = time_path(g, a, CUDA_GEMM_PATH_STREAM_SW2);
		}
		if (fast && a->M <= 8 && (gemv_bits() & 1))
			t[CUDA_GEMM_PATH_GEMV] = time_path(g, a, CUDA_GEMM_PATH_GEMV);
	} else if (wgmma_fits(a->N, a->ldy)) {
		t[CUDA_GEMM_PATH_WGMMA] = time_path(g, a, CUDA_GEMM_PATH_WGMMA);
	}
	/* cuBLASLt 13.1's block-scaled GEMM misses the CPU check (docs/PERF.md: ~1% of outputs
	 * 2+ bf16 ulps off), so for decode in the batch-invariant mode it is chosen only where ours
	 * cannot run; for prefill (M > 64) and in the fast mode the faster one wins (the issue's
	 * rule) */
	int lt_ok = a->M > 64 || fast || CUDA_GEMM_LT_FOR_DECODE;
	t[CUDA_GEMM_PATH_CUBLASLT] = time_path(g, a, CUDA_GEMM_PATH_CUBLASLT);
	enum cuda_gemm_path best = pick(t, lt_ok, 0, a->M);
	if (best != CUDA_GEMM_PATH_NONE)
		path_record(g, a->M, a->N, a->K, CUDA_GEMM_PATH_NONE, t, lt_ok);
	if (us)
		memcpy(us, t, sizeof t);
	return best;
}

int cuda_gemm_tune(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
		   int M, int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes, gpu_ptr flush,
		   size_t flush_bytes, float *us)
{
	struct tune_args a = {W, S, x8, sx, y, ws, flush, ws_bytes, flush_bytes,
			      cuda_gemm_m_bucket(M), N, K, ldy, NULL, NULL, 0, 0};
	return tune_shape(g, &a, us) == CUDA_GEMM_PATH_NONE ? -EIO : 0;
}

int cuda_gemm_tune_rotate(struct gpu *g, const gpu_ptr *W, const gpu_ptr *S, int n, int M,
			  int N, int K, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, gpu_ptr ws,
			  size_t ws_bytes, float *us)
{
	if (n < 1)
		return -EINVAL;
	struct tune_args a = {W[0], S[0], x8, sx, y, ws, 0, ws_bytes, 0, cuda_gemm_m_bucket(M),
			      N, K, N, W, S, n, 0};
	return tune_shape(g, &a, us) == CUDA_GEMM_PATH_NONE ? -EIO : 0;
}

static int gemm_users[MAX_GPUS]; /* cuda_gemm_retain's references, by ordinal */

void cuda_gemm_retain(struct gpu *g)
{
	if (g->ordinal < 0 || g->ordinal >= MAX_GPUS)
		return;
	pthread_mutex_lock(&gemm_lock);
	gemm_users[g->ordinal]++;
	pthread_mutex_unlock(&gemm_lock);
}

void cuda_gemm_close(struct gpu *g)
{
	if (g->ordinal < 0 || g->ordinal >= MAX_GPUS)
		return;
	pthread_mutex_lock(&gemm_lock);
	if (gemm_users[g->ordinal] > 1) { /* another user of this GPU still runs */
		gemm_users[g->ordinal]--;
		pthread_mutex_unlock(&gemm_lock);
		return;
	}
	gemm_users[g->ordinal] = 0;
	if (lt_state[g->ordinal] == 1)
		cublaslt_close(lt_of[g->ordinal]);
	lt_of[g->ordinal] = NULL;
	lt_state[g->ordinal] = 0;
	int j = 0;
	for (int i = 0; i < n_table; i++)
		if (table[i].ordinal != g->ordinal)
			table[j++] = table[i];
	n_table = j;
	pthread_mutex_unlock(&gemm_lock);
}

#endif
