// gemm_fp8_wgmma.cu — FP8 block-scaled GEMM for many tokens (prefill, MoE prefill) on Hopper's
// warpgroup MMA, spec §5.4:
//   y[m, n] = bf16( Σ_kb ( Σ_{k in kb} x8[m, k] · W8[n, k] ) · (sx[m, kb] · S[n / 128, kb]) )
// x8 e4m3 [M, K] (row stride K), sx fp32 [M, K/128] (UE8M0 act_quant scales), W8 e4m3 [N, K]
// (row stride K), S fp32 [ceil(N/128), K/128] (weight_scale_inv, multiplied), y bf16 [M, ldy].
// Contract (checked by the launcher, model/cuda_gemm_wgmma.c): K % 128 == 0, N % 64 == 0,
// ldy even and >= N (ST variants: ldy % 8 == 0); any M.
//
// Structure (DeepGEMM-like, one CTA per SM, persistent):
//   - 3 warpgroups of 128 threads. Warpgroup 0 is the producer: one thread issues the bulk
//     tensor copies (TMA, cp.async.bulk.tensor.2d, 128-byte swizzle) of a 128 x 128 x8 tile
//     (tokens x K bytes) and a BN x 128 W8 tile into stage s of a STAGES-deep ring, completing
//     on the stage's "full" mbarrier (transaction bytes). Rows past the end of x8 or W8 are
//     zero-filled by the copy engine. It gives its registers away (setmaxnreg.dec).
//   - Warpgroups 1 and 2 are the consumers, tokens [0, 64) and [64, 128) of the tile. Per
//     128-wide K block: wait "full", 4 x wgmma m64nBNk32 (e4m3 x e4m3 -> f32) into a fragment
//     that the first one zeroes, commit, wait for completion, release the stage (one arrival
//     per warp on its "empty" mbarrier), then promote: acc += frag · (sx[m, kb] · S[n/128, kb])
//     in fp32 (DeepSeek's 2xAcc: the tensor cores' limited-precision accumulation never spans
//     more than 128 products). The scales of the next K block are loaded one block ahead.
//   - Epilogue: acc -> bf16 (round to nearest even), masked to rows < the tile's row end and
//     columns < N, stored from registers as bf16 pairs; or (ST variants) through stmatrix into a
//     swizzled staging buffer and out as whole 16-byte chunks (two 256-byte row segments per
//     warp store: run 4, 1.5x on K = 512 where the pair stores were the bound).
//   - Tiles (128 tokens x BN weight rows) are walked by the persistent CTAs in the order
//     tile = blockIdx.x + i·gridDim.x with the token tile fastest, so the CTAs running at one
//     time share a few weight tiles and stream through x8 (which stays in L2 for M·K <= ~40 MB),
//     or (flags bits 8..15) in bands of that many weight tiles with the weight tile fastest.
//   - Variants: BN = 128, 192, or 256 (two m64n128k32 halves per K block into one fragment,
//     each promoted with its weight-scale block: a quarter fewer bytes into each SM per FLOP,
//     which bounds the long-K shapes — run 3's copy-only diagnostic took 80-85% of the time);
//     SS: a producer warp stages each stage's scales in shared memory (arriving on "full"), so
//     the consumers never wait on global loads; flags: skew (warpgroup 1 starts after warpgroup
//     0's first MMAs), timing diagnostics (no stores / no MMAs).
//   - Cluster variant (MC = 2, plain form): two CTAs take consecutive token tiles of the same
//     weight tile; each copies BN/2 weight rows and multicasts them into both CTAs' stage, so
//     L2 serves a weight tile once per pair. A stage may be refilled only when the consumers of
//     both CTAs have released it: each consumer warp arrives on "empty" in both CTAs (count 16),
//     and the CTAs of a cluster synchronise after barrier init and before leaving.
//
// Numerics: per output, per K block, the 128 products are summed by the tensor core (4 k32
// steps; each aligns its 32 products and the accumulator to the largest and keeps ~14 bits —
// measured, tests/gpu/gemm_fp8_limit.h), then scaled and added in K-block order with one fma
// each — the CPU's order except inside a block, and independent of M, of the tile position
// and of the other rows (batch-invariant for a given variant).
//
// SwiGLU form (k_gemm_fp8_wgmma_grouped_n256_ss_sw, the MoE block's gate|up at prefill sizes):
// the grouped form over fused W13_e [2I, K] whose tile pairs the gate rows [n0, n0 + 128) with
// the up rows [I + n0, ..) as its two 128-row halves, and whose epilogue computes
// h = bf16( silu(bf16 g) * bf16 u ) and its act_quant per 128 columns (spec §5.3) in registers:
// it writes the down projection's input h8 e4m3 [rows, I] and scales hs [rows, I / 128] instead
// of gu bf16 [rows, 2I] (k_moe_swiglu_quant's numbers exactly, on this GEMM's outputs).
//
// Grouped form (MoE experts, k_gemm_fp8_wgmma_grouped): group e multiplies rows
// [off[e], off[e+1]) of x8 by its own weight W_e = w_tab[e] (scales s_tab[e]). The counts live
// on the device, so the tiles are found on the device: each CTA walks the same global tile index
// sequence and maps it to (group, token tile, weight tile) by scanning off[] (groups in order,
// token tile fastest inside a group, then weight tile). x8 has one tensor map over all rows; a
// tile's rows past its group's end belong to the next group (or are zero-filled past max_rows)
// and are computed but never stored. Each group's W8 needs its own tensor map, and its address
// is on the device: k_wgmma_group_maps (one warp per non-empty group) copies a host-encoded
// template into shared memory, replaces its global address (tensormap.replace) and copies it to
// g_group_maps[e] in global memory with a release fence of the tensor-map proxy; the GEMM's
// producer acquires it (fence.proxy.tensormap::generic.acquire) before its first copy. The
// table is module-global: one grouped GEMM at a time per GPU (the engine's one stream).
// Paired grouped forms (_mc2, clusters of 2 CTAs, a cluster's item two tiles of one group): two
// token tiles of one weight tile (each CTA copies half the weight tile, BN / 2 rows, and
// multicasts it), or, for a group's odd last token tile, that tile with two weight tiles (each
// CTA copies 64 of the 128 token rows for both): fewer bytes into the SMs, which bound these
// GEMMs at prefill sizes (run 10), for the same outputs.
// Token-wide grouped form (k_gemm_fp8_tw_grouped, at the end of this file): the weights as
// wgmma's A and a chunk of up to 144 of a group's token rows as N, so an expert's weight tile
// is read once per chunk rather than once per 128-token tile (the MoE gate|up GEMM's default).
#include "common.cuh" // bf16 / e4m3 / UE8M0 rounding (the SwiGLU epilogue)
#include "cluster.cuh" // cluster_sync, cluster_rank, mbar_arrive_cluster
#include "tma.cuh" // mbarriers, bulk tensor copies (tma_load_2d_mc), the tmap type, smem_u32
#include "wgmma.cuh" // descriptors (wgd_kmajor: tiles 1024-aligned, + 2 a k32 step), fences
#include "wgmma_layout.h" // WG_BM, WG_BK, WG_THREADS, WG_MAX_GROUPS, the variants' smem, TW_*
// kernel flags (model/cuda_gemm_wgmma.h): skewed consumer warpgroups; timing diagnostics
#define WG_SKEW 1
#define WG_DIAG_NOSTORE 2
#define WG_DIAG_NOMMA 4
// bits 8..15: the raster band (weight tiles per band; 0: token tile fastest over all of M)

__device__ tmap g_group_maps[WG_MAX_GROUPS];

// ---- PTX wrappers beyond tma.cuh's -----------------------------------------------------------

__device__ __forceinline__ void tmap_prefetch(const void *map)
{
	asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// A shared-memory load that stays after the barrier wait before it (volatile, memory clobber).
__device__ __forceinline__ float lds_f32(uint32_t addr)
{
	float v;
	asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
	return v;
}

// Four 8x8 bf16 matrices from the MMA fragment layout (thread t: row t/4, columns 2(t%4), +1 of
// each) to shared memory; lane l gives the address of row l%8 of matrix l/8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
					    uint32_t r3)
{
	asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
		     "r"(r0), "r"(r1), "r"(r2), "r"(r3)
		     : "memory");
}

// The same with each matrix transposed on the way (thread t's pair: row t/4, columns 2(t%4), +1
// of each matrix; the lane's address takes row l%8 of matrix l/8 of the transposed matrices).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1,
						  uint32_t r2, uint32_t r3)
{
	asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
			     addr),
		     "r"(r0), "r"(r1), "r"(r2), "r"(r3)
		     : "memory");
}

// Barriers of stage s: bars = base of full[STAGES], then empty[STAGES] (8 bytes each).
#define FULL(s) (bars + (uint32_t)(s) * 8)
#define EMPTY(s) (bars + (uint32_t)(STAGES + (s)) * 8)

// ---- the GEMM ----------------------------------------------------------------------------------

template <int BN, int STAGES, bool ST = false> struct wg_cfg {
	static constexpr uint32_t A_BYTES = WG_BM * WG_BK; // x8 tile [128 tokens][128 K bytes]
	static constexpr uint32_t B_BYTES = BN * WG_BK;    // W8 tile [BN rows][128 K bytes]
	// scales of a stage (SS variants): sx of the tile's 128 rows, then the 2 weight scales
	static constexpr uint32_t SC_BYTES = WG_SC_BYTES;
	// STAGES x A, STAGES x B, 2 x STAGES barriers, STAGES x scales; +1024 so the tiles can be
	// 1024-aligned
	// ST variants: each consumer warpgroup's 64 x BN bf16 outputs staged for the stores, as
	// boxes of 64 columns (128 bytes a row) with the 128-byte swizzle
	// (BN = 256: 64 columns at a time, in 4 rounds, so the 4 stages still fit)
	static constexpr int ST_COLS = BN > 128 ? 64 : BN;
	static constexpr uint32_t ST_BYTES = ST ? 2 * 64 * ST_COLS * 2 : 0;
	static constexpr uint32_t SMEM = STAGES * (A_BYTES + B_BYTES) + ST_BYTES + 2 * STAGES * 8 +
					 STAGES * SC_BYTES + 1024;
};

// Where one tile lives: token rows [row0, row0 + 128) of x8 (stored only below row_end), weight
// rows [n0, n0 + BN), its weight tensor map and scales.
struct wg_tile {
	int row0, row_end, n0;
	const void *bmap;
	const float *S; // [ceil(N/128), K/128]
	// grouped SwiGLU form in clusters of 2 (paired): 1 = the two CTAs take two token tiles of
	// one weight tile (each copies half of the weight tile for both), 2 = one token tile and
	// two weight tiles (each copies 64 of the 128 token rows for both)
	int pair;
};

// The tile walker: plain form (M x N tiles, token tile fastest) or grouped (groups in order,
// each its token tiles x N tiles, token tile fastest). Every thread that walks keeps its own
// copy; all of them see the same sequence for the same blockIdx.
struct wg_sched {
	// plain: token tiles go in groups of MC (a cluster's CTAs), the CTA of rank `rank` takes
	// the rank-th tile of its cluster's group
	int m_groups, mc, rank;
	int raster; // 0: token tile fastest; > 0: bands of `raster` weight tiles, weight tile fastest
	long long total;
	// grouped
	const int *off;
	const unsigned long long *s_tab;
	int G, e;
	long long base; // first global tile index of group e
};

template <int BN, int MC>
__device__ __forceinline__ bool wg_group_tile_at(wg_sched &sc, long long t, int n_tiles,
						 wg_tile &tl);

// BN here: the output columns of a tile (the SwiGLU form: 128 of the 256 weight rows it loads)
template <int BN, bool GROUPED, int MC = 1>
__device__ __forceinline__ bool wg_tile_at(wg_sched &sc, long long t, int M, int N,
					   const void *bmap, const float *S, wg_tile &tl)
{
	const int n_tiles = (N + BN - 1) / BN;
	if constexpr (!GROUPED) {
		if (t >= sc.total)
			return false;
		int mg, nb;
		if (sc.raster) {
			// bands of `raster` weight tiles; inside a band the weight tile is fastest, so
			// the CTAs running at one time share a few token tiles and a few weight tiles
			const long long band = (long long)sc.m_groups * sc.raster;
			const int b = (int)(t / band), in = (int)(t % band);
			const int n_first = b * sc.raster, gn = min(sc.raster, n_tiles - n_first);
			mg = in / gn, nb = n_first + in % gn;
		} else {
			mg = (int)(t % sc.m_groups), nb = (int)(t / sc.m_groups);
		}
		tl.row0 = (mg * sc.mc + sc.rank) * WG_BM, tl.row_end = M, tl.n0 = nb * BN;
		tl.bmap = bmap, tl.S = S;
		return true;
	} else {
		return wg_group_tile_at<BN, MC>(sc, t, n_tiles, tl);
	}
}

// The grouped walker; t only grows, so the group pointer only moves forward. MC = 2 (the paired
// SwiGLU form, clusters of 2 CTAs, t the cluster's item): a group of mt token tiles gives
// mt / 2 pairs of token tiles for each weight tile (pair 1; the CTA of rank r takes token tile
// 2 p + r), then, for an odd mt, its last token tile with the weight tiles in pairs (pair 2;
// rank r takes weight tile 2 q + r; n_tiles even).
template <int BN, int MC>
__device__ __forceinline__ bool wg_group_tile_at(wg_sched &sc, long long t, int n_tiles,
						 wg_tile &tl)
{
	while (sc.e < sc.G) {
		const int r0 = __ldg(sc.off + sc.e), r1 = __ldg(sc.off + sc.e + 1);
		const int mt = (r1 - r0 + WG_BM - 1) / WG_BM;
		const long long cnt = MC == 1 ? (long long)mt * n_tiles
					      : (long long)(mt / 2) * n_tiles + (mt & 1) * (n_tiles / 2);
		if (t < sc.base + cnt) {
			const int local = t - sc.base;
			if constexpr (MC == 1) {
				tl.row0 = r0 + (local % mt) * WG_BM;
				tl.n0 = (local / mt) * BN;
				tl.pair = 0;
			} else {
				const int mp = mt / 2;
				if (local < mp * n_tiles) {
					tl.row0 = r0 + (2 * (local % mp) + sc.rank) * WG_BM;
					tl.n0 = (local / mp) * BN;
					tl.pair = 1;
				} else {
					tl.row0 = r0 + (mt - 1) * WG_BM;
					tl.n0 = (2 * (local - mp * n_tiles) + sc.rank) * BN;
					tl.pair = 2;
				}
			}
			tl.row_end = r1;
			tl.bmap = &g_group_maps[sc.e];
			tl.S = reinterpret_cast<const float *>(__ldg(sc.s_tab + sc.e));
			return true;
		}
		sc.base += cnt;
		sc.e++;
	}
	return false;
}

// A consumer warp releases a stage: one arrival on its "empty" barrier in every CTA of the
// cluster (the producers there multicast into our smem too).
template <int MC> __device__ __forceinline__ void release(uint32_t empty_bar, int lane)
{
	if (MC == 1) {
		if (lane == 0)
			mbar_arrive(empty_bar);
	} else if (lane < MC) {
		mbar_arrive_cluster(empty_bar, (uint32_t)lane);
	}
}

// SS variants: warp 1 of the producer warpgroup loads each stage's scales into shared memory
// (lane l: rows 4l .. 4l+3 of the tile; lane 0 also the weight scales of blocks b0, b1) and
// arrives on the stage's "full" barrier (32 arrivals beside the copy producer's), so the
// consumers never wait on a global load. The loads are issued before the wait for the stage to
// be free, so their latency overlaps it.
template <int BN, int STAGES, bool GROUPED, int MC, bool SW>
__device__ __forceinline__ void wg_scales(wg_sched &sc, long long t0, long long dt,
					  const tmap *mB, const float *sx, const float *S, int M,
					  int N, int KB, uint32_t bars, uint32_t scl)
{
	typedef wg_cfg<BN, STAGES> C;
	const int lane = threadIdx.x & 31;
	const int NB = (N + 127) / 128;
	int s = 0;
	uint32_t ph = 0;
	wg_tile tl;
	for (long long t = t0; wg_tile_at<SW ? 128 : BN, GROUPED, MC>(sc, t, M, N, mB, S, tl); t += dt) {
		// (this warp has 40 registers: one pointer per operand, small offsets)
		// SW: the gate rows' block b0 and the up rows' block b0 + N / 128 (N = the width I)
		const int b0 = tl.n0 / 128, db = SW ? NB * KB : (min(b0 + 1, NB - 1) - b0) * KB;
		const float *w0 = tl.S + (size_t)b0 * KB;
		const int r = min(tl.row0 + 4 * lane, M - 1); // rows past M read row M-1 (never stored)
		const float *x0 = sx + (size_t)r * KB;
		const int d1 = (min(r + 1, M - 1) - r) * KB, d2 = (min(r + 2, M - 1) - r) * KB,
			  d3 = (min(r + 3, M - 1) - r) * KB;
		for (int kb = 0; kb < KB; kb++) {
			const float v0 = __ldg(x0 + kb), v1 = __ldg(x0 + kb + d1),
				    v2 = __ldg(x0 + kb + d2), v3 = __ldg(x0 + kb + d3);
			float a = 0.f, b = 0.f;
			if (lane == 0)
				a = __ldg(w0 + kb), b = __ldg(w0 + kb + db);
			mbar_wait<false>(EMPTY(s), ph ^ 1); // the consumers have read its scales
			const uint32_t dst = scl + s * C::SC_BYTES;
			asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(dst + 16 * lane),
				     "f"(v0), "f"(v1), "f"(v2), "f"(v3)
				     : "memory");
			if (lane == 0)
				asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(dst + 512), "f"(a),
					     "f"(b)
					     : "memory");
			mbar_arrive(FULL(s)); // release: the stores are seen by whoever waits on it
			if (++s == STAGES)
				s = 0, ph ^= 1;
		}
	}
}

// The producer thread: every copy of every stage, in the consumers' order.
template <int BN, int STAGES, bool GROUPED, int MC, bool SW>
__device__ __forceinline__ void wg_produce(wg_sched &sc, long long t0, long long dt,
					   const tmap *mA, const tmap *mB, const float *S, int M,
					   int N, int KB, uint32_t a_smem, uint32_t b_smem,
					   uint32_t bars, const tmap *mA64)
{
	typedef wg_cfg<BN, STAGES> C;
	{
		int s = 0;
		uint32_t ph = 0;
		int e_acq = -1;
		wg_tile tl;
		for (long long t = t0; wg_tile_at<SW ? 128 : BN, GROUPED, MC>(sc, t, M, N, mB, S, tl);
		     t += dt) {
			if (GROUPED && sc.e != e_acq) {
				// the map was written by k_wgmma_group_maps through the generic proxy
				asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(
						     tl.bmap)
					     : "memory");
				e_acq = sc.e;
			}
			for (int kb = 0; kb < KB; kb++) {
				mbar_wait<false>(EMPTY(s), ph ^ 1); // the consumers released it
				// all of A and B land in this CTA's stage: our A, and B from every CTA
				// of the cluster (each multicasts its BN / MC rows to all of them)
				mbar_arrive_expect_tx(FULL(s), C::A_BYTES + C::B_BYTES);
				// (a cluster's tile past M, none of whose rows is stored, reads rows from
				// 0 rather than a box wholly out of bounds)
				constexpr bool PAIRED = GROUPED && MC == 2;
				// paired: the weight tile as two boxes of BN / 2 rows, n0.. and n1.. (SW:
				// the gate rows, then the up rows N + n0..)
				const int n1 = SW ? N + tl.n0 : tl.n0 + BN / 2;
				if (PAIRED && tl.pair == 2) { // token rows 64 rank.. (mA64), to both CTAs
					const int ar = tl.row0 + 64 * sc.rank;
					tma_load_2d_mc(a_smem + s * C::A_BYTES + sc.rank * (C::A_BYTES / 2), mA64,
						       FULL(s), kb * WG_BK, ar < M ? ar : 0, 3);
				} else {
					tma_load_2d(a_smem + s * C::A_BYTES, mA, FULL(s), kb * WG_BK,
						    tl.row0 < M ? tl.row0 : 0);
				}
				if (PAIRED && tl.pair == 1) { // rank 0 the box n0, rank 1 the box n1
					tma_load_2d_mc(b_smem + s * C::B_BYTES + sc.rank * (C::B_BYTES / 2),
						       tl.bmap, FULL(s), kb * WG_BK, sc.rank ? n1 : tl.n0, 3);
				} else if (SW || PAIRED) { // boxes n0.. and n1.. (SW: of 128 rows)
					tma_load_2d(b_smem + s * C::B_BYTES, tl.bmap, FULL(s), kb * WG_BK,
						    tl.n0);
					tma_load_2d(b_smem + s * C::B_BYTES + C::B_BYTES / 2, tl.bmap, FULL(s),
						    kb * WG_BK, n1);
				} else if (MC == 1)
					tma_load_2d(b_smem + s * C::B_BYTES, tl.bmap, FULL(s), kb * WG_BK,
						    tl.n0);
				else
					tma_load_2d_mc(b_smem + s * C::B_BYTES +
							       sc.rank * (C::B_BYTES / MC),
						       tl.bmap, FULL(s), kb * WG_BK,
						       tl.n0 + sc.rank * (BN / MC), (1 << MC) - 1);
				if (++s == STAGES)
					s = 0, ph ^= 1;
			}
		}
	}
}

// ST epilogue of one consumer warpgroup: its 64 x BN outputs -> bf16 -> stmatrix into its
// staging buffer stg (boxes of 64 columns, 128-byte rows, 16-byte chunk c of row r at chunk
// c ^ (r % 8): conflict-free for stmatrix's 8 rows and for the row reads), then each thread
// copies 16-byte chunks to y, a warp writing two whole 256-byte row segments per instruction
// (masked to the tile's rows and to N; needs ldy % 8 == 0). Named barrier 2 + cw orders the
// previous round's reads before the writes and the writes before the reads. The buffer holds
// CW columns: the tile goes in BN / CW rounds.
template <int CW>
__device__ __forceinline__ void wg_store_round(const float *acc, uint32_t stg, const wg_tile &tl,
					       int c0, int cw, int wi, int lane, uint16_t *y, int N,
					       int ldy);

template <int BN, int CW>
__device__ __forceinline__ void wg_store_staged(const float *acc, uint32_t stg, const wg_tile &tl,
						int cw, int wi, int lane, uint16_t *y, int N, int ldy)
{
#pragma unroll
	for (int c0 = 0; c0 < BN; c0 += CW)
		wg_store_round<CW>(acc + c0 / 2, stg, tl, c0, cw, wi, lane, y, N, ldy);
}

template <int CW>
__device__ __forceinline__ void wg_store_round(const float *acc, uint32_t stg, const wg_tile &tl,
					       int c0, int cw, int wi, int lane, uint16_t *y, int N,
					       int ldy)
{
	const int bar = 2 + cw;
	asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory");
	const int mi = lane >> 3, rr = lane & 7;
	const int row = wi * 16 + (mi & 1) * 8 + rr; // this lane's stmatrix row address
#pragma unroll
	for (int jp = 0; jp < CW / 16; jp++) {
		const int col = (2 * jp + (mi >> 1)) * 8;
		const uint32_t addr = stg + (col / 64) * (64 * 128) + row * 128 +
				      ((((col % 64) / 8) ^ (row & 7)) * 16);
		stmatrix_x4(addr, bf16x2(acc[8 * jp + 0], acc[8 * jp + 1]),
			    bf16x2(acc[8 * jp + 2], acc[8 * jp + 3]),
			    bf16x2(acc[8 * jp + 4], acc[8 * jp + 5]),
			    bf16x2(acc[8 * jp + 6], acc[8 * jp + 7]));
	}
	asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory");
	const int tid = threadIdx.x & 127;
	constexpr int CH = CW / 8; // 16-byte chunks of a row
#pragma unroll
	for (int k = 0; k < 64 * CH / 128; k++) {
		const int i = tid + 128 * k, r = i / CH, ch = i % CH;
		const uint32_t src = stg + (ch / 8) * (64 * 128) + r * 128 + (((ch % 8) ^ (r & 7)) * 16);
		uint32_t v0, v1, v2, v3;
		asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
			     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
			     : "r"(src)
			     : "memory");
		const int grow = tl.row0 + cw * 64 + r, gcol = tl.n0 + c0 + ch * 8;
		if (grow < tl.row_end && gcol < N)
			asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(
					     y + (size_t)grow * ldy + gcol),
				     "r"(v0), "r"(v1), "r"(v2), "r"(v3)
				     : "memory");
	}
}

// SW epilogue (BN = 256 of the SwiGLU form): acc[0 .. 63] hold the gate columns n0 + 8j + cq
// + {0, 1} (j < 16) of rows r_lo (registers 4j, 4j+1) and r_lo + 8 (4j+2, 4j+3), acc[64 ..] the
// up columns alike. Each output is rounded to bf16 as the GEMM's would be, then
// h = bf16( silu(g) * u ) and act_quant over the 128 columns of the tile (one UE8M0 scale a row:
// the row's 128 values are held by the 4 lanes of a quad) -> h8 e4m3 [rows, N] at column n0,
// hs fp32 [rows, N / 128] at n0 / 128: k_moe_swiglu_quant's arithmetic (moe_block.cu), value for
// value, so the bits are those of this GEMM's bf16 output through that kernel.
// ST (the _st kernels): the codes staged in the warpgroup's 64 x 128-byte buffer stg (16-byte
// chunk c of row r at chunk c ^ (r % 8): conflict-free for the pair writes and the row reads),
// then stored as whole 16-byte chunks (the same bytes; named barrier 2 + cw as wg_store_round).
template <bool ST>
__device__ __forceinline__ void wg_store_swiglu(float *acc, const wg_tile &tl, int r_lo, int cq,
						int lane, uint8_t *h8, float *hs, int N, uint32_t stg,
						int cw)
{
	float amax[2] = {0.f, 0.f}; // rows r_lo, r_lo + 8
#pragma unroll
	for (int i = 0; i < 64; i++) {
		acc[i] = swiglu_bf16(acc[i], acc[64 + i]);
		amax[(i >> 1) & 1] = fmaxf(amax[(i >> 1) & 1], fabsf(acc[i]));
	}
	// sc: a power of two, 2^-22 .. 2^120 here (or inf), so 1 / sc is exact and x * (1 / sc) is
	// the correctly rounded x / sc: the same codes as the division, a multiply each
	float sc[2], inv[2];
#pragma unroll
	for (int h = 0; h < 2; h++) {
		amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
		amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
		sc[h] = ue8m0_scale(fmaxf(amax[h], 1e-4f));
		inv[h] = 1.0f / sc[h];
	}
	const int KBo = N / 128;
	if constexpr (ST)
		asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory"); // last tile's reads done
#pragma unroll
	for (int h = 0; h < 2; h++) {
		const int row = tl.row0 + r_lo + 8 * h;
		if (!ST && row >= tl.row_end)
			continue;
		uint8_t *q = h8 + (size_t)row * N + tl.n0 + cq;
		const int sr = r_lo - 64 * cw + 8 * h; // the row in the warpgroup's buffer
#pragma unroll
		for (int j = 0; j < 16; j++) {
			const float a = e4m3_scaled(acc[4 * j + 2 * h], inv[h]);
			const float b = e4m3_scaled(acc[4 * j + 2 * h + 1], inv[h]);
			const uint16_t pr = (uint16_t)(f32_to_e4m3(a) | (uint32_t)f32_to_e4m3(b) << 8);
			if constexpr (ST)
				asm volatile("st.shared.u16 [%0], %1;" ::"r"(
						     stg + sr * 128 + (((j >> 1) ^ (sr & 7)) * 16) +
						     8 * (j & 1) + cq),
					     "h"(pr)
					     : "memory");
			else
				*reinterpret_cast<uint16_t *>(q + 8 * j) = pr;
		}
		if ((lane & 3) == 0 && row < tl.row_end)
			hs[(size_t)row * KBo + tl.n0 / 128] = sc[h];
	}
	if constexpr (ST) {
		asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
		const int tid = threadIdx.x & 127;
#pragma unroll
		for (int k = 0; k < 4; k++) { // 64 rows x 8 chunks
			const int i = tid + 128 * k, r = i >> 3, ch = i & 7;
			const int row = tl.row0 + 64 * cw + r;
			uint32_t v0, v1, v2, v3;
			asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
				     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
				     : "r"(stg + r * 128 + ((ch ^ (r & 7)) * 16))
				     : "memory");
			if (row < tl.row_end)
				asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(
						     h8 + (size_t)row * N + tl.n0 + 16 * ch),
					     "r"(v0), "r"(v1), "r"(v2), "r"(v3)
					     : "memory");
		}
	}
}

// The consumer warpgroups: warpgroup cw computes tokens [64 cw, 64 cw + 64) of each tile.
template <int BN, int STAGES, bool GROUPED, int MC, bool SS, bool ST, bool SW>
__device__ __forceinline__ void wg_consume(wg_sched &sc, long long t0, long long dt,
					   const tmap *mB, const float *sx, const float *S,
					   uint16_t *y, int M, int N, int KB, int ldy,
					   uint32_t a_smem, uint32_t b_smem, uint32_t bars,
					   uint32_t scl, uint32_t stg, int flags, uint8_t *h8,
					   float *hs)
{
	typedef wg_cfg<BN, STAGES, ST> C;
	const int cw = (threadIdx.x >> 7) - 1;
	// flags & WG_SKEW: warpgroup 1 issues its first MMAs only after warpgroup 0's first have completed
	// (named barrier 1), so from then on each promotes while the other's MMAs run, instead
	// of both promoting at once with the tensor cores idle (they stay out of step: the tensor
	// cores take the two warpgroups' MMAs in turn).
	// (Not for BN = 192 with the scales from global memory: no registers left for it.)
	bool first = (BN == 128 || SS) && (flags & WG_SKEW);
	// diagnostics (timing only, the output is wrong): no MMAs / no stores
	const bool no_mma = (BN == 128 || SS) && (flags & WG_DIAG_NOMMA);
	const bool no_store = (BN == 128 || SS) && (flags & WG_DIAG_NOSTORE);
	const int wi = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
	// fragment layout of wgmma m64nN (f32): register 4j + {0,1} holds row r_lo, columns
	// 8j + 2(lane % 4) + {0,1}; register 4j + {2,3} the same columns of row r_lo + 8.
	const int r_lo = cw * 64 + wi * 16 + (lane >> 2);
	const int cq = (lane & 3) * 2;
	// BN = 256: two halves of 128 columns per K block, each m64n128k32 into the one fragment,
	// waited for and promoted before the next (acc 128 + frag 64 registers)
	constexpr int FN = BN > 192 ? 128 : BN; // columns per MMA
	constexpr int NH = BN / FN;             // halves
	constexpr int NR = BN / 2, FR = FN / 2;
	float frag[FR], acc[NR];
#pragma unroll
	for (int i = 0; i < FR; i++)
		frag[i] = 0.f;
	int s = 0;
	uint32_t ph = 0;
	wg_tile tl;
	for (long long t = t0; wg_tile_at<SW ? 128 : BN, GROUPED, MC>(sc, t, M, N, mB, S, tl); t += dt) {
#pragma unroll
		for (int i = 0; i < NR; i++)
			acc[i] = 0.f;
		const int gm_lo = tl.row0 + r_lo, gm_hi = gm_lo + 8;
		// weight-scale blocks of the tile: b0 = n0 / 128 and, when BN > 128 or the tile
		// straddles a 128 boundary, b0 + 1 from column jb * 8 of the tile on
		const int NB = (N + 127) / 128;
		const int b0 = tl.n0 / 128;
		const int b1 = min(b0 + 1, NB - 1);
		const int jb = ((b0 + 1) * 128 - tl.n0) / 8;
		// not SS: scale rows read from global, a block ahead (rows past M read row M-1:
		// their outputs are never stored)
		const float *sx_lo = sx + (size_t)min(gm_lo, M - 1) * KB;
		const float *sx_hi = sx + (size_t)min(gm_hi, M - 1) * KB;
		const float *w0 = tl.S + (size_t)b0 * KB, *w1 = tl.S + (size_t)b1 * KB;
		float nx_lo = 0.f, nx_hi = 0.f, nw0 = 0.f, nw1 = 0.f;
		if constexpr (!SS)
			nx_lo = __ldg(sx_lo), nx_hi = __ldg(sx_hi), nw0 = __ldg(w0), nw1 = __ldg(w1);
		const uint64_t da0 = wgd_kmajor(a_smem + cw * 64 * WG_BK);
		const uint64_t db0 = wgd_kmajor(b_smem);
		// When none of this warpgroup's rows is stored (a group's or M's last tile) it skips
		// the MMAs but still takes part in every stage's handshake; its wait on "full" keeps
		// its arrivals on "empty" in step with the stage's phase. (Not for BN = 192 / 256
		// except the SwiGLU form: their fragment and accumulators leave no registers for it;
		// the SwiGLU form needs it at prefill chunks of 2048 tokens, ~64 rows an expert.)
		const bool active = ((BN > 128 && !SW) || tl.row0 + cw * 64 < tl.row_end) && !no_mma;
		for (int kb = 0; kb < KB; kb++) {
			if (first && cw == 1) {
				asm volatile("bar.sync 1, 256;" ::: "memory");
				first = false;
			}
			float x_lo = nx_lo, x_hi = nx_hi, cw0 = nw0, cw1 = nw1;
			if (!SS && kb + 1 < KB) { // the next block's scales, a block ahead
				nx_lo = __ldg(sx_lo + kb + 1), nx_hi = __ldg(sx_hi + kb + 1);
				nw0 = __ldg(w0 + kb + 1), nw1 = __ldg(w1 + kb + 1);
			}
			mbar_wait(FULL(s), ph); // the copies (and SS: the scales) of this stage landed
			if (SS && active) { // read before the stage is released
				const uint32_t sc_s = scl + s * C::SC_BYTES;
				x_lo = lds_f32(sc_s + 4 * r_lo), x_hi = lds_f32(sc_s + 4 * (r_lo + 8));
				cw0 = lds_f32(sc_s + 512), cw1 = lds_f32(sc_s + 516);
			}
			if (!active) {
				release<MC>(EMPTY(s), lane);
				if (first) { // warpgroup 0 (warpgroup 1 cleared it above)
					asm volatile("bar.arrive 1, 256;" ::: "memory");
					first = false;
				}
				if (++s == STAGES)
					s = 0, ph ^= 1;
				continue;
			}
			const uint64_t da = da0 + ((uint64_t)(s * C::A_BYTES) >> 4);
			const uint64_t db = db0 + ((uint64_t)(s * C::B_BYTES) >> 4);
			// promotion: the scale product first (x scale · weight scale), as the CPU
			const float s_lo0 = x_lo * cw0, s_hi0 = x_hi * cw0;
			const float s_lo1 = x_lo * cw1, s_hi1 = x_hi * cw1;
#pragma unroll
			for (int h = 0; h < NH; h++) {
#pragma unroll
				for (int i = 0; i < FR; i++)
					wg_reg_fence(frag[i]);
				wg_fence(); // the promotion's reads of frag before the MMAs write it
				// k32 steps: +32 bytes = +2 in the descriptor; half h: rows 128h of B
#pragma unroll
				for (int k = 0; k < WG_BK / 32; k++)
					wgmma_e4m3<FN>(frag, da + 2 * k,
						       db + ((uint64_t)(h * FN * WG_BK) >> 4) + 2 * k, k > 0);
				wg_commit();
				wg_wait0();
#pragma unroll
				for (int i = 0; i < FR; i++)
					wg_reg_fence(frag[i]);
				if (h == NH - 1) {
					// the stage's smem has been read by this warp's MMAs: release it
					release<MC>(EMPTY(s), lane);
					if (first) { // warpgroup 0 after its first MMAs: 1 may start
						asm volatile("bar.arrive 1, 256;" ::: "memory");
						first = false;
					}
					if (++s == STAGES)
						s = 0, ph ^= 1;
				}
#pragma unroll
				for (int j = 0; j < FN / 8; j++) {
					// BN = 192: weight-scale block b1 from column 8 jb; BN = 256: half 1
					const bool second = NH > 1 ? h == 1 : BN > 128 ? j >= jb : false;
					const float sl = second ? s_lo1 : s_lo0, sh = second ? s_hi1 : s_hi0;
					float *a = acc + h * FR + 4 * j;
					a[0] = fmaf(frag[4 * j + 0], sl, a[0]);
					a[1] = fmaf(frag[4 * j + 1], sl, a[1]);
					a[2] = fmaf(frag[4 * j + 2], sh, a[2]);
					a[3] = fmaf(frag[4 * j + 3], sh, a[3]);
				}
			}
		}
		if constexpr (SW) {
			if (!no_store)
				wg_store_swiglu<ST>(acc, tl, r_lo, cq, lane, h8, hs, N,
						    stg + cw * (64 * C::ST_COLS * 2), cw);
			continue;
		}
		if constexpr (ST) {
			if (active && !no_store)
				wg_store_staged<BN, C::ST_COLS>(acc, stg + cw * (64 * C::ST_COLS * 2), tl,
								cw, wi, lane, y, N, ldy);
			continue;
		}
		// epilogue: bf16 pairs, masked to the tile's rows and to N
		uint16_t *y_lo = y + (size_t)gm_lo * ldy, *y_hi = y + (size_t)gm_hi * ldy;
		const bool ok_lo = gm_lo < tl.row_end && !no_store, ok_hi = gm_hi < tl.row_end && !no_store;
#pragma unroll
		for (int j = 0; j < BN / 8; j++) {
			const int col = tl.n0 + 8 * j + cq;
			if (col < N) {
				if (ok_lo)
					*reinterpret_cast<uint32_t *>(y_lo + col) =
						bf16x2(acc[4 * j + 0], acc[4 * j + 1]);
				if (ok_hi)
					*reinterpret_cast<uint32_t *>(y_hi + col) =
						bf16x2(acc[4 * j + 2], acc[4 * j + 3]);
			}
		}
	}
}

// The whole kernel; see the file header. M: rows of x8 (the plain form's token count, the
// grouped form's max_rows). mB / S: the plain form's weight map and scales (unused grouped).
template <int BN, int STAGES, bool GROUPED, int MC, bool SS, bool ST, bool SW = false>
__device__ __forceinline__ void wgmma_gemm(const tmap *mA, const tmap *mB, const float *sx,
					   const float *S, const unsigned long long *s_tab,
					   const int *off, int G, uint16_t *y, int M, int N, int K,
					   int ldy, int flags, uint8_t *h8 = nullptr,
					   float *hs = nullptr, const tmap *mA64 = nullptr)
{
	typedef wg_cfg<BN, STAGES, ST> C;
	// the launcher's numbers (wgmma_layout.h)
	static_assert(STAGES == WG_STAGES(BN, ST) && C::ST_COLS == WG_ST_COLS(BN) &&
			      C::SMEM == WG_SMEM(BN, ST),
		      "wgmma_gemm: the layout differs from wgmma_layout.h's");
	extern __shared__ uint8_t smem_raw[];
	const uint32_t raw = smem_u32(smem_raw);
	const uint32_t base = (raw + 1023) & ~1023u; // 128-byte swizzle atoms are 1024-aligned
	const uint32_t a_smem = base, b_smem = base + STAGES * C::A_BYTES;
	const uint32_t stg = b_smem + STAGES * C::B_BYTES;  // [2][64 x BN bf16] (ST)
	const uint32_t bars = stg + C::ST_BYTES;             // full[STAGES], then empty[STAGES]
	const uint32_t scl = bars + 2 * STAGES * 8;          // [STAGES][SC_BYTES] (SS)

	const int wg = threadIdx.x >> 7;
	const int KB = K / WG_BK;
	wg_sched sc = {};
	sc.mc = MC, sc.rank = MC > 1 ? (int)cluster_rank() : 0;
	sc.raster = GROUPED ? 0 : (flags >> 8) & 0xff;
	sc.m_groups = ((M + WG_BM - 1) / WG_BM + MC - 1) / MC;
	sc.total = (long long)sc.m_groups * ((N + BN - 1) / BN);
	sc.off = off, sc.s_tab = s_tab, sc.G = G;
	// the walk: this CTA's cluster, in steps of the number of clusters
	const long long t0 = blockIdx.x / MC, dt = gridDim.x / MC;

	if (threadIdx.x == 0) {
		for (int s = 0; s < STAGES; s++) {
			// the producer's arrive.expect_tx (+ the copy bytes), SS: + 32 scale lanes
			mbar_init(FULL(s), SS ? 33 : 1);
			mbar_init(EMPTY(s), 8 * MC); // each consumer warp of each CTA of the cluster
		}
		// make the initialised barriers visible to the copy engine (async proxy) and, for
		// clusters, to the other CTAs
		asm volatile("fence.proxy.async.shared::cta;\nfence.mbarrier_init.release.cluster;" ::
				     : "memory");
		tmap_prefetch(mA);
		if (!GROUPED)
			tmap_prefetch(mB);
		if (mA64)
			tmap_prefetch(mA64);
	}
	if (MC > 1)
		cluster_sync();
	else
		__syncthreads();

	if (wg == 0) {
		// ---- producer: one thread issues every copy ----
		// registers: 128 x P + 256 x C <= 64K; BN = 192's fragment and accumulators need
		// C = 232, BN = 128 leaves room for the producer warps (the scale warp's pointers)
		// (BN = 256: acc 128 + frag 64, C = 224 leaves the producer warps 56)
		if constexpr (BN == 256)
			asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
		else if constexpr (BN > 128)
			asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
		else
			asm volatile("setmaxnreg.dec.sync.aligned.u32 88;");
		if (threadIdx.x == 0)
			wg_produce<BN, STAGES, GROUPED, MC, SW>(sc, t0, dt, mA, mB, S, M, N, KB, a_smem,
								b_smem, bars, mA64);
		else if (SS && (threadIdx.x >> 5) == 1)
			wg_scales<BN, STAGES, GROUPED, MC, SW>(sc, t0, dt, mB, sx, S, M, N, KB, bars,
							       scl);
	} else {
		if constexpr (BN == 256)
			asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
		else if constexpr (BN > 128)
			asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
		else
			asm volatile("setmaxnreg.inc.sync.aligned.u32 208;");
		wg_consume<BN, STAGES, GROUPED, MC, SS, ST, SW>(sc, t0, dt, mB, sx, S, y, M, N, KB,
								ldy, a_smem, b_smem, bars, scl, stg,
								flags, h8, hs);
	}
	if (MC > 1)
		cluster_sync();
}

// ---- entry points ------------------------------------------------------------------------------
// k_gemm_fp8_wgmma_n{128,192}: the plain form, BN = 128 or 192 weight rows per tile.
// k_gemm_fp8_wgmma_mc2_n{128,192}: the same in clusters of 2 CTAs (consecutive token tiles, the
// same weight tile): each CTA copies half of the weight tile and multicasts it to both, so L2
// serves each weight tile once per pair. Grid even.
// Grid: min(tiles, SMs) persistent CTAs of 384 threads; dynamic smem wg_cfg<BN, STAGES>::SMEM.
#define WG_PLAIN(name, bn, stages, mc, ss, attr, st)                                           \
	extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) attr name(                  \
		const __grid_constant__ tmap mA, const __grid_constant__ tmap mB,              \
		const float *__restrict__ sx, const float *__restrict__ S, uint16_t *__restrict__ y, \
		int M, int N, int K, int ldy, int flags)                                        \
	{                                                                                      \
		wgmma_gemm<bn, stages, false, mc, ss, st>(&mA, &mB, sx, S, nullptr, nullptr, 0, y,  \
							  M, N, K, ldy, flags);                 \
	}
// k_gemm_fp8_wgmma_grouped_n{128,192}: the grouped form; the weight maps come from
// g_group_maps (k_wgmma_group_maps, launched just before), the scales from s_tab.
#define WG_GROUPED(name, bn, stages, ss, st)                                                   \
	extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)                             \
		name(const __grid_constant__ tmap mA, const float *__restrict__ sx,              \
		     const unsigned long long *__restrict__ s_tab, const int *__restrict__ off,  \
		     int G, uint16_t *__restrict__ y, int max_rows, int N, int K, int ldy,       \
		     int flags)                                                                  \
	{                                                                                      \
		wgmma_gemm<bn, stages, true, 1, ss, st>(&mA, nullptr, sx, nullptr, s_tab, off, G, y, \
						    max_rows, N, K, ldy, flags);                \
	}

// _ss: the scales come through shared memory (wg_scales) instead of per-thread global loads
// (grouped: BN = 128 only; with BN = 192 the scale warp has too few registers).
#define NO_ATTR
#define CLUSTER2 __cluster_dims__(2, 1, 1)
WG_PLAIN(k_gemm_fp8_wgmma_n128, 128, 6, 1, false, NO_ATTR, false)
WG_PLAIN(k_gemm_fp8_wgmma_n192, 192, 5, 1, false, NO_ATTR, false)
WG_PLAIN(k_gemm_fp8_wgmma_mc2_n128, 128, 6, 2, false, CLUSTER2, false)
WG_PLAIN(k_gemm_fp8_wgmma_mc2_n192, 192, 5, 2, false, CLUSTER2, false)
WG_PLAIN(k_gemm_fp8_wgmma_n128_ss, 128, 6, 1, true, NO_ATTR, false)
WG_PLAIN(k_gemm_fp8_wgmma_n192_ss, 192, 5, 1, true, NO_ATTR, false)
WG_PLAIN(k_gemm_fp8_wgmma_mc2_n128_ss, 128, 6, 2, true, CLUSTER2, false)
WG_GROUPED(k_gemm_fp8_wgmma_grouped_n128, 128, 6, false, false)
WG_GROUPED(k_gemm_fp8_wgmma_grouped_n192, 192, 5, false, false)
WG_GROUPED(k_gemm_fp8_wgmma_grouped_n128_ss, 128, 6, true, false)
// _st: the outputs staged in shared memory and stored as whole 16-byte chunks (wg_store_staged);
// 5 stages to make room (ldy % 8 == 0)
WG_PLAIN(k_gemm_fp8_wgmma_n128_ss_st, 128, 5, 1, true, NO_ATTR, true)
WG_PLAIN(k_gemm_fp8_wgmma_mc2_n128_ss_st, 128, 5, 2, true, CLUSTER2, true)
WG_GROUPED(k_gemm_fp8_wgmma_grouped_n128_ss_st, 128, 5, true, true)
// _n256: 128 tokens x 256 weight rows per tile (48 KB a stage, 4 stages): a quarter fewer bytes
// into each SM per FLOP than 128 x 128 (run 3: the load pipeline alone took 80-85% of the time)
WG_PLAIN(k_gemm_fp8_wgmma_n256_ss, 256, 4, 1, true, NO_ATTR, false)
WG_PLAIN(k_gemm_fp8_wgmma_mc2_n256_ss, 256, 4, 2, true, CLUSTER2, false)
WG_PLAIN(k_gemm_fp8_wgmma_n256_ss_st, 256, 4, 1, true, NO_ATTR, true)
WG_PLAIN(k_gemm_fp8_wgmma_mc2_n256_ss_st, 256, 4, 2, true, CLUSTER2, true)
WG_GROUPED(k_gemm_fp8_wgmma_grouped_n256_ss, 256, 4, true, false)
WG_GROUPED(k_gemm_fp8_wgmma_grouped_n256_ss_st, 256, 4, true, true)
// _mc2 (paired): the grouped forms in clusters of 2 CTAs (see the SwiGLU form's below; the
// weight maps have boxes of BN / 2 rows); N % (2 BN) == 0, grid even. mA64: the token rows as
// boxes of 64.
#define WG_GROUPED_MC2(name, bn, stages)                                                      \
	extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) CLUSTER2                     \
		name(const __grid_constant__ tmap mA, const float *__restrict__ sx,              \
		     const unsigned long long *__restrict__ s_tab, const int *__restrict__ off,  \
		     int G, uint16_t *__restrict__ y, int max_rows, int N, int K, int ldy,       \
		     int flags, const __grid_constant__ tmap mA64)                               \
	{                                                                                      \
		wgmma_gemm<bn, stages, true, 2, true, true>(&mA, nullptr, sx, nullptr, s_tab, off, G, \
							  y, max_rows, N, K, ldy, flags, nullptr, \
							  nullptr, &mA64);                      \
	}
WG_GROUPED_MC2(k_gemm_fp8_wgmma_grouped_n128_ss_st_mc2, 128, 5)
WG_GROUPED_MC2(k_gemm_fp8_wgmma_grouped_n256_ss_st_mc2, 256, 4)
// k_gemm_fp8_wgmma_grouped_n256_ss_sw: the MoE gate|up GEMM with SwiGLU and act_quant fused
// (the SwiGLU form, see the file header): W_e fused [2N, K] (gate rows, then up rows), a tile =
// 128 tokens x the gate rows [n0, n0 + 128) and the up rows [N + n0, ..) (two boxes of 128 rows
// into the 256-row stage), output h8 e4m3 [rows, N], hs fp32 [rows, N / 128]. N % 128 == 0.
// _mc2 (paired): clusters of 2 CTAs (wg_group_tile_at, MC = 2): two token tiles of one weight
// tile share its copy (each CTA copies the gate or the up box for both), a group's odd last token
// tile is shared by two weight tiles (each CTA copies 64 of its rows for both, through mA64, a
// map of 64-row boxes): run 10 measured the gate|up GEMM bound by the bytes into the SMs, and
// at 4096 tokens about half the experts have a second, mostly empty token tile that re-read the
// whole weight tile. N % 256 == 0; grid even; the same outputs, bit for bit.
#define WG_SW_ARGS                                                                              \
	const __grid_constant__ tmap mA, const float *__restrict__ sx,                           \
		const unsigned long long *__restrict__ s_tab, const int *__restrict__ off, int G,  \
		uint8_t *__restrict__ h8, float *__restrict__ hs, int max_rows, int N, int K, int flags
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
	k_gemm_fp8_wgmma_grouped_n256_ss_sw(WG_SW_ARGS)
{
	wgmma_gemm<256, 4, true, 1, true, false, true>(&mA, nullptr, sx, nullptr, s_tab, off, G,
						       nullptr, max_rows, N, K, N, flags, h8, hs);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) CLUSTER2
	k_gemm_fp8_wgmma_grouped_n256_ss_sw_mc2(WG_SW_ARGS, const __grid_constant__ tmap mA64)
{
	wgmma_gemm<256, 4, true, 2, true, false, true>(&mA, nullptr, sx, nullptr, s_tab, off, G,
						       nullptr, max_rows, N, K, N, flags, h8, hs,
						       &mA64);
}

// _st: the same with the codes staged in shared memory and stored as 16-byte chunks
// (wg_store_swiglu<true>; the ST buffers, 16 KB; h8 16-byte aligned); the same bytes.
extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
	k_gemm_fp8_wgmma_grouped_n256_ss_sw_st(WG_SW_ARGS)
{
	wgmma_gemm<256, 4, true, 1, true, true, true>(&mA, nullptr, sx, nullptr, s_tab, off, G,
						      nullptr, max_rows, N, K, N, flags, h8, hs);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) CLUSTER2
	k_gemm_fp8_wgmma_grouped_n256_ss_sw_st_mc2(WG_SW_ARGS, const __grid_constant__ tmap mA64)
{
	wgmma_gemm<256, 4, true, 2, true, true, true>(&mA, nullptr, sx, nullptr, s_tab, off, G,
						      nullptr, max_rows, N, K, N, flags, h8, hs,
						      &mA64);
}

// k_wgmma_group_maps: g_group_maps[e] = tmpl with its global address replaced by w_tab[e], for
// every group e < G with rows (off[e+1] > off[e]). Grid G, one warp each. The template is a W8
// map encoded on the host with the right dims/strides/box (any valid address).
extern "C" __global__ void __launch_bounds__(32)
k_wgmma_group_maps(const __grid_constant__ tmap tmpl, const unsigned long long *__restrict__ w_tab,
		   const int *__restrict__ off, int G)
{
	__shared__ __align__(128) tmap sm;
	const int e = blockIdx.x;
	if (e >= G || off[e + 1] == off[e])
		return; // the whole warp leaves together
	tmap_store_at(&g_group_maps[e], tmpl, w_tab[e], &sm);
}

// ---- token-wide grouped form (MoE experts at prefill sizes) ------------------------------------
// k_gemm_fp8_tw_grouped: the grouped GEMM with the weights as wgmma's A and a chunk of a group's
// token rows as its N. y[r, n] = bf16( Σ_kb (Σ_k x8[r, k] W_e[n, k]) · (sx[r, kb] · S_e[n/128, kb]) )
// for the rows r of group e (rows off[e] .. off[e+1]), as the plain grouped form, value for value.
//
// Why: the grouped GEMMs are bound by the bytes each SM takes in (run 32, ncu: 5.7 TB/s into the
// SMs, consumers waiting on their stages a third of the time, the ring full of loads; multicast
// and L2 prefetch did not help). With 128-token tiles an expert of 129-256 rows takes two token
// tiles and so its weight tile twice (48 KB a K block each); here an item is 256 weight rows x
// up to TW_N tokens, so such an expert (up to TW_N rows) takes its weight tile once (32 KB + its
// rows x 128 B a K block): ~30% fewer bytes into the SMs per useful FLOP at 4096 tokens.
// Run 34 (bench moe, the MoE gate|up GEMM): 2,832-2,876 us against the SwiGLU tile form's
// 3,389-3,412 at 4096 tokens (+ k_moe_swiglu_quant, 233 us), 1,831-1,843 against 2,534-2,585 at 512.
//
// Items: a group of c rows is cut into nch = ceil(c / TW_N) chunks of rc = round16(ceil(c / nch))
// rows (the last one shorter); an item is (group, weight tile of 256 rows, chunk), the chunk
// fastest, drawn by the persistent CTAs (the item schedule, below). NN = the chunk's rows
// rounded up to 16 is the wgmma N (a switch over the 9 widths); rows past the chunk are read
// (the next group's, or zeros past x8) and computed but never stored.
// Warps: warpgroup 0 = the producer thread (TMA: the weight tile as two boxes of 128 rows from
// the group's map g_group_maps[e] (k_wgmma_group_maps), the chunk's rows as NN / 16 boxes of 16
// rows) and three scale warps (the products sx[r, kb] · S of the chunk's rows and the two
// weight-scale blocks, laid out per consumer thread group, into the stage's scale slot), all
// arriving on the stage's "full" barrier; warpgroups 1 and 2 the consumers: warpgroup cw takes
// weight rows [64 cw, 64 cw + 64) of each box (two m64 chains), per K block: 4 x wgmma
// m64nNNk32 into a fresh fragment, wait, promote with the products (the CPU's order: the scale
// product first, then one fma), the second box the same; release.
// Registers: two accumulators + one fragment of NN / 2 each (TW_N = 144: 216).
// TW_N (token rows an item at most), TW_STAGES, TW_W_BYTES (256 weight rows x 128 K bytes),
// TW_X_BYTES, TW_SC_BYTES (a stage's scale products: both boxes' sx[token] · sw laid out per
// consumer thread group, tw_pre_at), TW_QSLOTS (the item queue's slots, tw_next_item),
// TW_EP_WARP (a consumer warp's 1 KB of the 8 KB epilogue tile, tw_store) and TW_SMEM:
// wgmma_layout.h
#define TW_PQ (TW_N / 4 + 4) // floats a thread group q (its 2 x TW_N / 8, + 4: banks)
#define TW_PB (4 * TW_PQ)    // floats a box
static_assert(TW_N % 16 == 0 && TW_SC_BYTES >= 2 * TW_PB * 4, "the token-wide stage layout");
// kernel flags (DSV32_CUDA_TW_FLAGS, diagnosis): no stores (timing; the promotions then go too,
// as dead code)
#define TW_DIAG_NOSTORE 2
#define TW_STATIC 16 // the items in steps of the grid instead of drawn from g_tw_next

// One item: group e's chunk of rows [row0, row0 + rows) x weight rows [n0, n0 + 256).
struct tw_item {
	int e, row0, rows, n0;
};

// The item walker (every walking thread keeps its own copy; the same sequence for the same
// blockIdx): t only grows, so the group only moves forward.
struct tw_sched {
	const int *off;
	int G, NT; // groups, items of weight tiles a chunk of a group
	int tmul, toff; // an item's tile index is it x tmul + toff (MC2: 2, the CTA's rank)
	int e;
	int base; // first item of group e
};

__device__ __forceinline__ bool tw_item_at(tw_sched &sc, int t, tw_item &it)
{
	while (sc.e < sc.G) {
		const int r0 = __ldg(sc.off + sc.e), c = __ldg(sc.off + sc.e + 1) - r0;
		const int nch = (c + TW_N - 1) / TW_N;
		const int cnt = nch * sc.NT;
		if (t < sc.base + cnt) {
			const int local = t - sc.base;
			const int rc = ((c + nch - 1) / nch + 15) & ~15, ch = local % nch;
			it.e = sc.e, it.n0 = ((local / nch) * sc.tmul + sc.toff) * 256;
			it.row0 = r0 + ch * rc, it.rows = min(rc, c - ch * rc);
			return true;
		}
		sc.base += cnt;
		sc.e++;
	}
	return false;
}

// Barriers of stage s (base bars): full[TW_STAGES], then empty[TW_STAGES]; the item queue's
// qfull[TW_QSLOTS], qempty[TW_QSLOTS], then its slots (an int each).
#define TW_FULL(s) (bars + (uint32_t)(s) * 8)
#define TW_EMPTY(s) (bars + (uint32_t)(TW_STAGES + (s)) * 8)
#define TW_QFULL(i) (bars + (uint32_t)(2 * TW_STAGES + (i)) * 8)
#define TW_QEMPTY(i) (bars + (uint32_t)(2 * TW_STAGES + TW_QSLOTS + (i)) * 8)
#define TW_QSLOT(i) (bars + (uint32_t)(2 * TW_STAGES + 2 * TW_QSLOTS) * 8 + 4 * (uint32_t)(i))

// The item schedule. The copy thread posts each item index t it takes in the queue (slot i %
// TW_QSLOTS, completing qfull; a slot is reused once the 3 scale warps and the 8 consumer warps
// have read it, qempty), and the other walkers take the same indices in the same order. t is
// drawn from g_tw_next, so a CTA that finishes early takes the next item (the items differ in
// size, 16-144 token rows): s13-3, bench moe, the gate|up GEMM 2,485-2,624 us against
// 2,618-2,712 at 4096 tokens, 1,958-1,979 against 2,083-2,120 at 2048, 1,764 against 1,809-1,822
// at 512 (ncu, s13-2: the SMs had been idle 5.4% of the gate|up GEMM's cycles, 2.7% of the
// down GEMM's). TW_STATIC (diagnosis): t = blockIdx.x + i gridDim.x. Either way a CTA's indices
// only grow (tw_item_at). The first index past the last item ends every walker. After its last
// draw each CTA counts itself in g_tw_done; the last one resets both counters for the next
// launch (one token-wide GEMM at a time per GPU, as g_group_maps).
__device__ int g_tw_next;
__device__ unsigned g_tw_done;

// The clusters' item queue (k_gemm_fp8_tw_grouped_mc2): the leader (rank 0) posts each index it
// draws in its own slot and, by st.async completing 4 bytes on the peer's qfull, in the peer's;
// the peer's readers arrive on the leader's qempty (so it counts both CTAs' 11 readers and the
// peer's copy thread: 23).
__device__ __forceinline__ void tw_post_peer(uint32_t bars, int qs, int t)
{
	asm volatile("{\n.reg .b32 rb, rs;\n"
		     "mapa.shared::cluster.u32 rb, %0, 1;\n"
		     "mapa.shared::cluster.u32 rs, %1, 1;\n"
		     "mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [rb], 4;\n"
		     "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [rs], %2, [rb];\n}\n" ::"r"(
			     TW_QFULL(qs)),
		     "r"(TW_QSLOT(qs)), "r"(t)
		     : "memory");
}

// The index in queue slot qs once it is posted (PEER: the cluster's rank 1, whose slots the
// leader fills; the caller arrives on qempty).
template <bool PEER>
__device__ __forceinline__ int tw_slot_read(uint32_t bars, int qs, uint32_t qph)
{
	mbar_wait<true, PEER>(TW_QFULL(qs), qph);
	int t;
	asm volatile("ld.shared.s32 %0, [%1];" : "=r"(t) : "r"(TW_QSLOT(qs)) : "memory");
	return t;
}

// A reader's next item index (every lane of the calling warp; PEER as tw_slot_read).
template <bool PEER = false>
__device__ __forceinline__ int tw_next_item(uint32_t bars, int &qs, uint32_t &qph, int lane)
{
	const int t = tw_slot_read<PEER>(bars, qs, qph);
	if (PEER) {
		__syncwarp();
		if (lane == 0)
			mbar_arrive_cluster<true>(TW_QEMPTY(qs), 0);
	} else {
		mbar_arrive_warp(TW_QEMPTY(qs), lane);
	}
	if (++qs == TW_QSLOTS)
		qs = 0, qph ^= 1;
	return t;
}

// Every reader's next index: the peer's readers through the leader's queue.
template <int MC>
__device__ __forceinline__ int tw_next(uint32_t bars, int &qs, uint32_t &qph, int lane,
				       uint32_t rank)
{
	return MC == 2 && rank == 1 ? tw_next_item<true>(bars, qs, qph, lane)
				    : tw_next_item<false>(bars, qs, qph, lane);
}

// The index of token t's scale product of box b in a stage's scale slot: thread group
// q = (t % 8) / 2 reads its 2 x NN / 8 products (tokens 8j + 2q, + 1) contiguously.
__device__ __forceinline__ int tw_pre_at(int b, int t)
{
	return b * TW_PB + ((t & 7) >> 1) * TW_PQ + 2 * (t >> 3) + (t & 1);
}

// One chain of a consumer warpgroup: frag = A[64 x 128] . B[NN x 128]^T over the stage's K
// block (4 k32 steps), then acc += frag · p (thread: columns 8j + 2q, + 1), p the products
// sx[token] · sw (the CPU's order: the scale product first, then one fma) the scale warps
// stored; pq = this thread's products of the box: the first NP of them loaded while the MMAs
// run, the rest after the wait. (Session 9: with the scales loaded and multiplied after the
// wait, the consumers' promotion stalled on the loads; bench moe at 4096 tokens ~2% slower.)
template <int NN>
__device__ __forceinline__ void tw_chain(float *acc, float *frag, uint64_t da, uint64_t db,
					     uint32_t pq)
{
	constexpr int NP = NN >= 144 ? 8 : NN >= 128 ? 24 : NN / 4; // (the registers: no spill)
#pragma unroll
	for (int i = 0; i < NN / 2; i++)
		wg_reg_fence(frag[i]);
	wg_fence();
#pragma unroll
	for (int k = 0; k < 4; k++)
		wgmma_e4m3<NN>(frag, da + 2 * k, db + 2 * k, k > 0);
	wg_commit();
	float p[NN / 4];
#pragma unroll
	for (int j = 0; j < NP; j += 4)
		asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
			     : "=f"(p[j]), "=f"(p[j + 1]), "=f"(p[j + 2]), "=f"(p[j + 3])
			     : "r"(pq + 4 * j)
			     : "memory");
	wg_wait0();
#pragma unroll
	for (int i = 0; i < NN / 2; i++)
		wg_reg_fence(frag[i]);
#pragma unroll
	for (int j = 0; j < NN / 8; j++) {
		if (2 * j >= NP && (2 * j) % 4 == 0)
			asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
				     : "=f"(p[2 * j]), "=f"(p[2 * j + 1]), "=f"(p[2 * j + 2]),
				       "=f"(p[2 * j + 3])
				     : "r"(pq + 8 * j)
				     : "memory");
		acc[4 * j + 0] = fmaf(frag[4 * j + 0], p[2 * j], acc[4 * j + 0]);
		acc[4 * j + 1] = fmaf(frag[4 * j + 1], p[2 * j + 1], acc[4 * j + 1]);
		acc[4 * j + 2] = fmaf(frag[4 * j + 2], p[2 * j], acc[4 * j + 2]);
		acc[4 * j + 3] = fmaf(frag[4 * j + 3], p[2 * j + 1], acc[4 * j + 3]);
	}
}

// The consumers' epilogue: y[row0 + t][n0 .. n0 + 255] for the chunk's tokens t < rows, as bf16,
// 16 tokens a round. Each consumer warp's two fragments (its 16 weight rows of each box x 16
// tokens: registers 8jp + 0, 1 rows lane / 4, tokens 16jp + 2q, + 1; + 2, 3 row + 8; + 4 .. 7 the
// same for tokens + 8) -> bf16 pairs -> stmatrix.trans into the 8 KB epilogue tile as 16 token
// rows of the item's 256 outputs (512 bytes a row; 16-byte chunk c of row t at c ^ (t % 8):
// conflict-free both ways); then warp w copies rows 2w and 2w + 1 to y, 512 contiguous bytes a
// store instruction (four whole 128-byte lines). Two named barriers (1: the 256 consumer
// threads) a round. s25-6 (bench moe, 4096 tokens, two rounds): block 4,637 / 4,644 us against
// 4,735 / 4,764 with each warp storing its own 16 x 16 piece (sixteen 32-byte sectors of 16 rows
// a store instruction: the L1's store transactions bounded that epilogue), w13 2,502 / 2,543
// against 2,613 / 2,603, w2 1,528 / 1,460 against 1,595 / 1,595. (The piecewise form had replaced
// the fragment's own 2-byte stores in s13-1: down 1,572 / 1,592 us against 1,742 / 1,794.)
// The stores are predicated in their asm (a branch there made ptxas spill). Needs ldy % 8 == 0
// and y 16-byte aligned (the launcher checks).
template <int NN>
__device__ __forceinline__ void tw_store(const float *acc0, const float *acc1, const tw_item &it,
					 int cw, int wi, int lane, uint32_t ep, uint16_t *y, int ldy)
{
	const int m = lane >> 3, tl = (m >> 1) * 8 + (lane & 7); // stmatrix: matrix m, token row tl
	const int c0 = cw * 8 + wi * 2 + (m & 1);                 // chain 0's chunk; chain 1: + 16
	const uint32_t wa0 = ep + (uint32_t)(tl * 512 + ((c0 ^ (tl & 7)) * 16));
	const uint32_t wa1 = ep + (uint32_t)(tl * 512 + (((c0 + 16) ^ (tl & 7)) * 16));
	const int w = cw * 4 + wi;
#pragma unroll
	for (int jp = 0; jp < NN / 16; jp++) {
		stmatrix_x4_trans(wa0, bf16x2(acc0[8 * jp + 0], acc0[8 * jp + 1]),
				  bf16x2(acc0[8 * jp + 2], acc0[8 * jp + 3]),
				  bf16x2(acc0[8 * jp + 4], acc0[8 * jp + 5]),
				  bf16x2(acc0[8 * jp + 6], acc0[8 * jp + 7]));
		stmatrix_x4_trans(wa1, bf16x2(acc1[8 * jp + 0], acc1[8 * jp + 1]),
				  bf16x2(acc1[8 * jp + 2], acc1[8 * jp + 3]),
				  bf16x2(acc1[8 * jp + 4], acc1[8 * jp + 5]),
				  bf16x2(acc1[8 * jp + 6], acc1[8 * jp + 7]));
		named_bar_sync(1, 256); // the round's 16 rows are in
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int t = 2 * w + h;
			const uint4 v = lds128(ep + (uint32_t)(t * 512 + ((lane ^ (t & 7)) * 16)));
			asm volatile("{\n.reg .pred p;\nsetp.lt.s32 p, %5, %6;\n"
				     "@p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(
					     y + (size_t)(it.row0 + 16 * jp + t) * ldy + it.n0 + 8 * lane),
				     "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(16 * jp + t),
				     "r"(it.rows)
				     : "memory");
		}
		named_bar_sync(1, 256); // the round's reads are done before the next round's writes
	}
}

// The shared-memory regions (addresses): the stages' weight tiles, token rows and scale
// products, the epilogue tile.
struct tw_smem {
	uint32_t w, x, scl, ep;
};

// The consumers' item of width NN: every K block, then the bf16 stores of the chunk's rows.
template <int NN, int MC>
__device__ __forceinline__ void tw_consume_item(const tw_item &it, int KB, const tw_smem &m,
						uint32_t bars, int &s, uint32_t &ph, uint16_t *y,
						int ldy, int flags, uint32_t rank)
{
	const int cw = (threadIdx.x >> 7) - 1, wi = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
	const int q = lane & 3;
	float acc0[NN / 2], acc1[NN / 2], frag[NN / 2];
#pragma unroll
	for (int i = 0; i < NN / 2; i++)
		acc0[i] = 0.f, acc1[i] = 0.f;
	const uint64_t da0 = wgd_kmajor(m.w + cw * 64 * 128), db0 = wgd_kmajor(m.x);
	for (int kb = 0; kb < KB; kb++) {
		mbar_wait(TW_FULL(s), ph);
		const uint32_t sc_s = m.scl + s * TW_SC_BYTES;
		const uint64_t da = da0 + ((uint64_t)(s * TW_W_BYTES) >> 4);
		const uint64_t db = db0 + ((uint64_t)(s * TW_X_BYTES) >> 4);
		const uint64_t da1 = da + ((uint64_t)(TW_W_BYTES / 2) >> 4);
		const uint32_t pq = sc_s + 4 * q * TW_PQ;
		tw_chain<NN>(acc0, frag, da, db, pq);
		tw_chain<NN>(acc1, frag, da1, db, pq + 4 * TW_PB);
		if (lane == 0) { // this warp's MMAs and scale reads are done
			mbar_arrive(TW_EMPTY(s));
			if (MC == 2) // (the peer's copies write this CTA's stage too)
				mbar_arrive_cluster(TW_EMPTY(s), rank ^ 1);
		}
		if (++s == TW_STAGES)
			s = 0, ph ^= 1;
	}
	if (flags & TW_DIAG_NOSTORE)
		return;
	tw_store<NN>(acc0, acc1, it, cw, wi, lane, m.ep, y, ldy);
}

// The token-wide kernels' body. MC = 2 (k_gemm_fp8_tw_grouped_mc2, clusters of 2): a cluster's
// item is the two weight tiles 2p, 2p + 1 of one chunk (CTA r the tile 2p + r), each CTA copying
// its own weight tile and every other token box of the chunk (boxes j = r mod 2) multicast into
// both CTAs' stage, so the L2 serves the chunk's token rows once a pair; a stage is refilled once
// the consumer warps of both CTAs have released it ("empty" counts 16); the leader draws the
// items and posts them to both CTAs' queues (tw_post_peer).
template <int MC>
__device__ __forceinline__ void tw_grouped(const tmap &mX, const float *__restrict__ sx,
					   const unsigned long long *__restrict__ s_tab,
					   const int *__restrict__ off, int G, uint16_t *__restrict__ y,
					   int max_rows, int N, int K, int ldy, int flags)
{
	extern __shared__ uint8_t tw_smem_raw[];
	const uint32_t base = (smem_u32(tw_smem_raw) + 1023) & ~1023u;
	const uint32_t w_smem = base, x_smem = w_smem + TW_STAGES * TW_W_BYTES;
	const uint32_t scl = x_smem + TW_STAGES * TW_X_BYTES;
	const uint32_t ep = scl + TW_STAGES * TW_SC_BYTES; // the epilogue tile, 8 x TW_EP_WARP
	const uint32_t bars = ep + 8 * TW_EP_WARP;
	const int KB = K / 128;
	const uint32_t rank = MC == 2 ? cluster_rank() : 0;
	tw_sched sc = {off, G, N / 256 / MC, MC, (int)rank, 0, 0};
	const int t0 = blockIdx.x / MC, dt = gridDim.x / MC;
	if (threadIdx.x == 0) {
		for (int s = 0; s < TW_STAGES; s++) {
			mbar_init(TW_FULL(s), 97);      // the copy producer + 96 scale threads
			mbar_init(TW_EMPTY(s), 8 * MC); // each consumer warp (MC2: of both CTAs)
		}
		for (int i = 0; i < TW_QSLOTS; i++) {
			mbar_init(TW_QFULL(i), 1);
			// the scale warps and the consumer warps (the leader of a cluster: + the peer's,
			// and its copy thread)
			mbar_init(TW_QEMPTY(i), MC == 2 && rank == 0 ? 23 : 11);
		}
		asm volatile("fence.proxy.async.shared::cta;\nfence.mbarrier_init.release.cluster;" ::
				     : "memory");
		tmap_prefetch(&mX);
	}
	__syncthreads();
	if (MC == 2)
		cluster_sync(); // both CTAs' barriers initialised before any copy or remote arrival
	const int wg = threadIdx.x >> 7;
	tw_item it;
	if (wg == 0) {
		// registers: 128 x 40 + 256 x 232 = 64512 = the launch's 168 x 384
		asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
		int s = 0, e_acq = -1;
		uint32_t ph = 0;
		if (threadIdx.x == 0) { // the copies, and the item schedule
			int qs = 0;
			uint32_t qph = 0;
			for (int i = 0;; i++) {
				int t;
				if (MC == 2 && rank == 1) { // the leader's index, as the peer's readers take it
					t = tw_slot_read<true>(bars, qs, qph);
					mbar_arrive_cluster<true>(TW_QEMPTY(qs), 0);
				} else {
					t = flags & TW_STATIC ? t0 + i * dt : atomicAdd(&g_tw_next, 1);
					mbar_wait<false, MC == 2>(TW_QEMPTY(qs), qph ^ 1);
					asm volatile("st.shared.s32 [%0], %1;" ::"r"(TW_QSLOT(qs)), "r"(t)
						     : "memory");
					mbar_arrive(TW_QFULL(qs));
					if (MC == 2)
						tw_post_peer(bars, qs, t);
				}
				if (++qs == TW_QSLOTS)
					qs = 0, qph ^= 1;
				if (!tw_item_at(sc, t, it))
					break;
				const tmap *wm = &g_group_maps[it.e];
				if (it.e != e_acq) { // written by k_wgmma_group_maps (generic proxy)
					asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(
							     wm)
						     : "memory");
					e_acq = it.e;
				}
				const int nb = (it.rows + 15) / 16;
				for (int kb = 0; kb < KB; kb++) {
					mbar_wait<false>(TW_EMPTY(s), ph ^ 1);
					mbar_arrive_expect_tx(TW_FULL(s), TW_W_BYTES + nb * 2048);
					const uint32_t w = w_smem + s * TW_W_BYTES;
					tma_load_2d(w, wm, TW_FULL(s), kb * 128, it.n0);
					tma_load_2d(w + TW_W_BYTES / 2, wm, TW_FULL(s), kb * 128, it.n0 + 128);
					for (int j = 0; j < nb; j++) {
						const int r = it.row0 + 16 * j;
						const uint32_t xd = x_smem + s * TW_X_BYTES + j * 2048;
						if (MC == 1)
							tma_load_2d(xd, &mX, TW_FULL(s), kb * 128,
								    r < max_rows ? r : 0);
						else if ((j & 1) == (int)rank)
							tma_load_2d_mc(xd, &mX, TW_FULL(s), kb * 128,
								       r < max_rows ? r : 0, 3);
					}
					if (++s == TW_STAGES)
						s = 0, ph ^= 1;
				}
			}
			if (!(flags & TW_STATIC) && rank == 0) { // this CTA's draws are over
				__threadfence();
				if (atomicAdd(&g_tw_done, 1u) == gridDim.x / MC - 1)
					g_tw_next = 0, g_tw_done = 0;
			}
		} else if (threadIdx.x >= 32) { // the scales: warps 1-3, rows L + 96 i
			const int L = threadIdx.x - 32;
			int qs = 0;
			uint32_t qph = 0;
			for (;;) {
				if (!tw_item_at(sc, tw_next<MC>(bars, qs, qph, threadIdx.x & 31, rank), it))
					break;
				const float *Se = reinterpret_cast<const float *>(__ldg(s_tab + it.e));
				const float *w0 = Se + (size_t)(it.n0 / 128) * KB;
				for (int kb = 0; kb < KB; kb++) {
					float v[2];
#pragma unroll
					for (int i = 0; i < 2; i++) {
						const int r = min(it.row0 + L + 96 * i, max_rows - 1);
						v[i] = L + 96 * i < TW_N ? __ldg(sx + (size_t)r * KB + kb) : 0.f;
					}
					const float a = __ldg(w0 + kb), b = __ldg(w0 + KB + kb);
					mbar_wait<false>(TW_EMPTY(s), ph ^ 1);
					const uint32_t dst = scl + s * TW_SC_BYTES;
#pragma unroll
					for (int i = 0; i < 2; i++) {
						const int t = L + 96 * i;
						if (t >= TW_N)
							continue;
						const float pa = v[i] * a, pb = v[i] * b; // the CPU's products
						asm volatile("st.shared.f32 [%0], %1;" ::"r"(
								     dst + 4 * tw_pre_at(0, t)),
							     "f"(pa)
							     : "memory");
						asm volatile("st.shared.f32 [%0], %1;" ::"r"(
								     dst + 4 * tw_pre_at(1, t)),
							     "f"(pb)
							     : "memory");
					}
					mbar_arrive(TW_FULL(s));
					if (++s == TW_STAGES)
						s = 0, ph ^= 1;
				}
			}
		}
	} else {
		asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
		const tw_smem m = {w_smem, x_smem, scl, ep};
		int s = 0, qs = 0;
		uint32_t ph = 0, qph = 0;
		for (;;) {
			if (!tw_item_at(sc, tw_next<MC>(bars, qs, qph, threadIdx.x & 31, rank), it))
				break;
			switch ((it.rows + 15) / 16) {
			case 1: tw_consume_item<16, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			case 2: tw_consume_item<32, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			case 3: tw_consume_item<48, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			case 4: tw_consume_item<64, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			case 5: tw_consume_item<80, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			case 6: tw_consume_item<96, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			case 7: tw_consume_item<112, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			case 8: tw_consume_item<128, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			default: tw_consume_item<144, MC>(it, KB, m, bars, s, ph, y, ldy, flags, rank); break;
			}
		}
	}
	if (MC == 2)
		cluster_sync(); // no CTA leaves while its peer may still copy into it or arrive on it
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
k_gemm_fp8_tw_grouped(const __grid_constant__ tmap mX, const float *__restrict__ sx,
		      const unsigned long long *__restrict__ s_tab, const int *__restrict__ off,
		      int G, uint16_t *__restrict__ y, int max_rows, int N, int K, int ldy, int flags)
{
	tw_grouped<1>(mX, sx, s_tab, off, G, y, max_rows, N, K, ldy, flags);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) CLUSTER2
k_gemm_fp8_tw_grouped_mc2(const __grid_constant__ tmap mX, const float *__restrict__ sx,
			  const unsigned long long *__restrict__ s_tab, const int *__restrict__ off,
			  int G, uint16_t *__restrict__ y, int max_rows, int N, int K, int ldy,
			  int flags)
{
	tw_grouped<2>(mX, sx, s_tab, off, G, y, max_rows, N, K, ldy, flags);
}
