// gemm_fp8_stream.cu — the FP8 block-scaled GEMM for decode (few tokens: weight streaming),
// dense and grouped (MoE experts), spec §5.4:
//   y[m, n] = bf16( Σ_kb ( Σ_{k in kb} x8[m, k] · W8[n, k] ) · sx[m, kb] · S[n / 128, kb] )
// W8 e4m3 [N, K] (row stride K), S fp32 [ceil(N/128), K/128] (weight_scale_inv, multiplied),
// x8 e4m3 [rows, K], sx fp32 [rows, K/128] (UE8M0 act_quant scales), y bf16 [rows, ldy].
// Grouped (w_tab != NULL): group e owns rows [off[e], off[e+1]) and its own W8 = w_tab[e],
// S = s_tab[e] (device addresses); a group without rows is never touched.
//
// Streaming: weights never pass through registers on their way in. One producer thread per
// block issues bulk tensor copies (TMA, cp.async.bulk.tensor.2d, 128-byte swizzle, completion
// counted in bytes on an mbarrier, L2 evict-first for weights) of a stage = two K blocks of a
// unit's 128 weight rows (two 16 KB boxes) plus the same K range of its slice's token rows
// (grouped: in boxes of 8 rows, as many as the slice has; dense: one box of mpad rows; room for
// mpad), into a ring of NS stages (dense: up to 4, grouped: as many as fit, up to 8); the
// consumer warps wait on a stage's "full" barrier, compute, and release it on its "empty"
// barrier. The grid is persistent (one block per SM): block b takes work units b,
// b + gridDim.x, ... and its producer runs ahead across unit boundaries. (Run 1 measured the
// first version, one 1-D bulk copy per 256-byte row piece: ~0.6-0.87 TB/s, bound by the number
// of copies; a box is one copy per 16 KB.) Dense: the weights' and the tokens' tensor maps are
// kernel parameters; grouped: each group's weight map is st_maps[e], written on the device by
// k_stream_group_maps from a host-encoded template.
//
// Work unit = (slice, row tile, K chunk). A slice is <= 64 rows of one group (dense: of x); its
// token box starts at its first row (rows past the slice belong to others or are zero-filled,
// and are computed but never stored). A row tile is 128 weight rows, split among 8 consumer
// warps of one 16-row MMA tile each (RT = 1) or 4 of two (RT = 2: each token fragment read
// from shared memory feeds two MMA tiles). A K chunk is chunk_blocks K blocks;
// chunks = ceil(KB / chunk_blocks) is chosen by the host from N and K only (model/cuda_gemm.c),
// so that units fill the SMs evenly.
//
// Arithmetic: mma.m16n8k32 e4m3 with the weights as A (16 rows of the warp) and 8 tokens as B,
// done as fp16 MMAs on fragments converted once (gemm_fp8_f16.cuh: sm_90 has no e4m3 mma.sync;
// the weight fragment is converted once for all token groups, a token fragment once for RT tiles).
// Lane (g, t) reads bytes [32t, 32t+32) of each 128-byte K block for its rows (g, g+8) and its
// token (g of each group of 8), and MMA step s uses words 2s, 2s+1 of them for A and B alike, so
// both see the same permutation of k and each dot product is complete. Inside one K block the 4
// MMAs accumulate into a fresh fp32 fragment, which is scaled by sx·S and added to the fp32
// accumulator ("promotion" after every 128 products, DeepSeek's 2xAcc).
//
// Summation order (fixed, depends only on N and K): within a chunk, K blocks in increasing
// order; chunks (when more than one) are summed in chunk order from fp32 partials, by the warp
// that finishes the last chunk of its rows (fused) or by k_gemm_stream_reduce. A token's column never mixes with another's (tensor-core outputs are independent
// per row and column), and nothing depends on how many tokens there are or which group a row
// is in: a row's result does not depend on M, on its slice, on RT or on its neighbours (batch
// invariant), and a grouped row equals the dense GEMM of that row with its group's weight.
#include "cluster.cuh"
#include "common.cuh"
#include "gemm_fp8_f16.cuh"
#include "mma.cuh"
#include "moe_epi.cuh"
#include "scan.cuh"
#include "stream_layout.h" // ST_MAXG, ST_COUNTS (the launcher's checks)
#include "tma.cuh"
#include "wgmma.cuh"

#define ST_TR 128      // weight rows per work unit
#define ST_WBOX (ST_TR * 128) // bytes of one weight box: 128 rows x one K block
#define ST_KBS 2       // 128-wide K blocks per stage
#define ST_MAXSTAGES 8
#define ST_SLICE_ROWS 64
#define ST_SCL_BYTES (16 + ST_KBS * 64 * 4) // a stage's promotion scales (see scl0)
// the kernel's flags: ST_FUSED the K chunks summed by the last-arriving warps (else by
// k_gemm_stream_reduce). (Run 12 measured a stage's two K blocks' wgmmas in flight together,
// the first promoted while the second ran: within +-2% of this, so not kept.)
#define ST_FUSED 1
// ST_NO_SX (diagnosis, the benchmark only: wrong results): the tokens' scales not copied, only
// the weights' (what the per-token 4-byte copies of 33-64 rows cost the pipeline)
#define ST_NO_SX 2
// ST_SX_TMA (wgmma consumers, dense): the tokens' scales of a stage by one bulk tensor copy (a
// box of 8 K blocks from kb & ~3 x mpad rows of sx, through smap: kb and kb + 1 for any kb)
// instead of a 4-byte cp.async each (run 34, 7168x16384: +5 / +9 / +14% at M = 16 / 32 / 64,
// -1 / -3% at M = 1 / 8: the host takes it from 9 rows)
#define ST_SX_TMA 4

// The grouped GEMM's weight maps, one per group with rows, written by k_stream_group_maps just
// before the GEMM (module-global: one grouped GEMM at a time per GPU, the engine's one stream).
__device__ tmap st_maps[ST_MAXG];

struct st_slice {
	int e, r0, rows, pad;
};

// a unit whose chunk partials a consumer warp stored: its count index, first row n, rows nr,
// token rows r0 .. r0 + ms - 1 (st < 0: none)
struct st_pend {
	int st, n, nr, r0, ms;
};

__device__ __forceinline__ uint2 lds64(uint32_t addr)
{
	uint2 r;
	asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"(addr));
	return r;
}

__device__ __forceinline__ void sts128(uint32_t addr, uint4 v)
{
	asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y),
		     "r"(v.z), "r"(v.w)
		     : "memory");
}

__device__ __forceinline__ float lds32f(uint32_t addr)
{
	float r;
	asm volatile("ld.shared.f32 %0, [%1];" : "=f"(r) : "r"(addr));
	return r;
}

// The fused chunk sum's fences: release of the warp's partial stores before its arrival count
// (a relaxed atomic), acquire of the other warps' after the count that says "last". An
// acquire-release fence is what that message passing needs (PTX memory model); __threadfence
// is the sequentially consistent fence.sc.gpu.
__device__ __forceinline__ void fence_acq_rel_gpu()
{
	asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// ---- wgmma (the fast mode's consumers, WI = 2): wgmma.cuh's wgmma_e4m3<N> ---------------------

// One K block (4 k32 steps) into a fresh fragment d: N = 8 MG, the token rows the stage has
// room for (a slice with fewer computes columns it never reads: picking N by the slice's rows
// at run time made ptxas serialise the wgmmas, C7520)
template <int MG>
__device__ __forceinline__ void wg_kblock(float *d, uint64_t da, uint64_t db)
{
#pragma unroll
	for (int k = 0; k < 4; k++)
		wgmma_e4m3<MG >= 8 ? 64 : MG >= 4 ? 32 : MG >= 2 ? 16 : 8>(d, da + 2 * k, db + 2 * k,
								  k > 0);
}

// The wgmma consumers' end of a K block: wait for the block's MMA group (wg_kblock_wait), then
// add the fragment of each of the mg_n live token groups, times its promotion factors s[mg]
// (tokens 2t, 2t + 1), to the running fp32 sums (wg_promote); register 4 mg + q is acc[mg][q]'s
// element.
template <int MGA>
__device__ __forceinline__ void wg_kblock_wait(float (&frag)[4 * MGA])
{
	wg_commit();
	wg_wait0();
#pragma unroll
	for (int i = 0; i < 4 * MGA; i++)
		wg_reg_fence(frag[i]);
}

template <int MGA>
__device__ __forceinline__ void wg_promote(float (&acc)[MGA][4], const float (&frag)[4 * MGA],
					   const float (&s)[MGA][2], int mg_n)
{
#pragma unroll
	for (int mg = 0; mg < MGA; mg++) {
		if (mg >= mg_n)
			break;
		acc[mg][0] += frag[4 * mg + 0] * s[mg][0];
		acc[mg][1] += frag[4 * mg + 1] * s[mg][1];
		acc[mg][2] += frag[4 * mg + 2] * s[mg][0];
		acc[mg][3] += frag[4 * mg + 3] * s[mg][1];
	}
}

// ---- the kernel ------------------------------------------------------------------------------

// Arrival counts of the fused chunk sum, one per (slice, row tile, consumer warp); zero when the
// module loads, and each GEMM leaves them zero (the last arrival resets its count). One GEMM at
// a time per GPU uses them (the engine's one stream); the host falls back to
// k_gemm_stream_reduce (fused = 0) when a GEMM has more counts than this.
__device__ unsigned st_count[ST_COUNTS]; // (ST_COUNTS: stream_layout.h)

struct st_unit {
	int e, r0, ms, n0, kb0, kb1, chunk, st; // st: the (slice, tile) index
};

__device__ __forceinline__ st_unit unit_of(const st_slice *sl, int u, int tiles, int chunks,
					   int chunk_blocks, int KB)
{
	st_unit w;
	w.chunk = u % chunks;
	const int rest = u / chunks;
	w.st = rest;
	const int tile = rest % tiles;
	const st_slice s = sl[rest / tiles];
	w.e = s.e, w.r0 = s.r0, w.ms = s.rows;
	w.n0 = tile * ST_TR;
	w.kb0 = w.chunk * chunk_blocks;
	w.kb1 = min(KB, w.kb0 + chunk_blocks);
	return w;
}

// MG: token groups of 8 per slice (slice rows <= 8 * MG; 0: the copy-only probe); RT: 16-row MMA tiles per consumer
// warp, CW = 8 / RT consumer warps (RT = 2 feeds each token fragment to two MMA tiles; same
// 128-row unit, same stage).
// WI = 0: mma.sync consumers (the exact kernels). WI = 2 (the fast mode): the consumers are two
// warpgroups of wgmma m64nNk32 e4m3 (weights = A, 64 rows each; the slice's tokens = B, N = 8,
// 16, 32 or 64), both straight from the copies' swizzled boxes: no conversion, native FP8, but
// wgmma's accumulation inside a k32 step keeps ~14 bits (tests/gpu/gemm_fp8_limit.h), so the
// results are within that limit of the CPU's, not of the mma.sync kernels'. Same promotion per
// K block, same summation order across blocks and chunks. (Run 17 measured wgmma with the
// tokens as A from registers, loaded from global memory a stage ahead, and only weights in the
// ring (7 stages at any M): 0.85-0.97x of these at every M; not kept. Run 13 measured stages of
// one K block, up to 13 of them, for the wgmma consumers: 10-20% slower than two a stage, dense
// and grouped; not kept.)
template <int MG, int RT, int WI>
__device__ __forceinline__ void
gemm_fp8_stream(const tmap *wmap, const tmap *xmap, const tmap *smap,
		const unsigned long long *__restrict__ w_tab,
		const unsigned long long *__restrict__ s_tab, const int *__restrict__ off, int G,
		const float *__restrict__ S, const float *__restrict__ SX, uint16_t *__restrict__ Y,
		float *__restrict__ partial, int rows, int N, int K, int ldy, int chunks,
		int chunk_blocks, int ns, int mpad, int slice_cap, int flags)
{
	const bool fused = flags & ST_FUSED, no_sx = flags & ST_NO_SX;
	constexpr int TR = ST_TR, KBS = ST_KBS, CW = 8 / RT;
	const bool sx_tma = WI == 2 && (flags & ST_SX_TMA) && !w_tab;
	extern __shared__ __align__(1024) uint8_t smem[];
	uint64_t *full = reinterpret_cast<uint64_t *>(smem);
	uint64_t *empty = full + ST_MAXSTAGES; // (the barriers: bytes 0 .. 127)
	st_slice *sl = reinterpret_cast<st_slice *>(smem + 256);
	// after the slice_cap slices: their count and the slice scan's warp totals (the host
	// leaves 3 more slices' room: 12 ints)
	int *n_slices = reinterpret_cast<int *>(sl + slice_cap);
	// the stages, 1024-byte aligned (the 128-byte swizzle's atom); the host adds the slack.
	// Stage: the weight boxes of its K blocks (128 rows x 128 bytes each), then the tokens'
	// (mpad rows x 128 bytes each).
	const uint32_t stage0 =
		(smem_u32(smem) + 256 + (uint32_t)(slice_cap + 3) * sizeof(st_slice) + 1023) & ~1023u;
	const int xbox = mpad * 128, stage_bytes = KBS * (ST_WBOX + xbox);
	// after the stages: two buffers of fp16 token fragments (KBS K blocks x MG groups x 2 KB),
	// used by alternate stages
	const uint32_t fbuf = stage0 + (uint32_t)(ns * stage_bytes);
	const uint32_t fstage = WI == 2 ? 0 : KBS * (MG > 0 ? MG : 1) * 2048;
	// then each stage's promotion scales, copied by the producer warp: S[row block][kb + j] at
	// +4j, sx[r0 + m][kb + j] at +16 + 4 (64 j + m)
	const uint32_t scl0 = fbuf + 2 * fstage;
	// then (ST_SX_TMA) each stage's box of token scales, [mpad rows][8 K blocks] fp32, at
	// sxt0 + stage mpad 32 (128-byte aligned: a bulk tensor copy's destination)
	const uint32_t sxt0 = (scl0 + ST_MAXSTAGES * ST_SCL_BYTES + 127) & ~127u, sxb = mpad * 32;

	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int KB = K >> 7;

	// The next kernel (launched with PDL) may start and load its constants now: it reads this
	// grid's outputs only after its griddepcontrol.wait (this grid complete). (The next grouped
	// GEMM's k_stream_group_maps waits before it rewrites the maps this grid reads.)
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	// Launched with programmatic dependent launch (model/cuda_gemm.c), this grid may start
	// before the previous kernel has finished: what it reads from that kernel's outputs comes
	// after griddepcontrol.wait (a no-op without PDL). Grouped: everything (the offsets, the
	// maps of k_stream_group_maps); dense: the producer waits after it has started the first
	// stages' weight copies (constant data), before any token or scale copy; the consumers
	// read only what the stages bring and write only after that. (Run 17 measured a grouped
	// form that copied its first weights before the wait, its maps in two sets used in turn:
	// ~1 us less a one-token MoE block, and the gate|up GEMM's offsets are not complete then.)
	if (w_tab)
		asm volatile("griddepcontrol.wait;" ::: "memory");
	// the slices: <= 64 rows of one group each, groups without rows left out
	if (!w_tab) {
		if (warp == 0) {
			const int n = (rows + ST_SLICE_ROWS - 1) / ST_SLICE_ROWS;
			for (int i = lane; i < n && i < slice_cap; i += 32)
				sl[i] = st_slice{0, i * ST_SLICE_ROWS,
						 min(ST_SLICE_ROWS, rows - i * ST_SLICE_ROWS), 0};
			if (lane == 0)
				*n_slices = min(n, slice_cap);
		}
	} else {
		// every thread takes one group per pass (one round of loads for G <= 288), a
		// block-wide exclusive scan of the slice counts places each group's slices in order
		int *warp_tot = n_slices + 1; // [blockDim.x / 32]
		int base = 0;
		for (int e0 = 0; e0 < G; e0 += blockDim.x) {
			const int e = e0 + threadIdx.x;
			int o = 0, cnt = 0;
			if (e < G)
				o = off[e], cnt = off[e + 1] - o;
			const int ns_e = (cnt + ST_SLICE_ROWS - 1) / ST_SLICE_ROWS;
			const int incl = warp_inclusive_scan(ns_e);
			if (lane == 31)
				warp_tot[warp] = incl;
			__syncthreads();
			int before = 0, total = 0;
			for (int w2 = 0; w2 < (int)(blockDim.x >> 5); w2++) {
				const int v = warp_tot[w2];
				before += w2 < warp ? v : 0;
				total += v;
			}
			for (int j = 0; j < ns_e; j++) {
				const int at = base + before + incl - ns_e + j;
				if (at < slice_cap)
					sl[at] = st_slice{e, o + j * ST_SLICE_ROWS,
							  min(ST_SLICE_ROWS, cnt - j * ST_SLICE_ROWS), 0};
			}
			base += total;
			__syncthreads(); // warp_tot is reused by the next pass
		}
		if (threadIdx.x == 0)
			*n_slices = min(base, slice_cap);
	}
	if (threadIdx.x == 0) {
		for (int s = 0; s < ns; s++) {
			mbar_init(smem_u32(&full[s]), 1 + 32); // the copies' and the scales' arrivals
			mbar_init(smem_u32(&empty[s]), CW);
		}
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
		asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
	}
	__syncthreads();

	const int tiles = (N + TR - 1) / TR;
	const int units = *n_slices * tiles * chunks;

	if (warp == CW) {
		// ---- producer: stream the stages of this block's units, running ahead ----
		// Lane 0 issues the bulk tensor copies; every lane copies a share of the stage's
		// promotion scales with 4-byte cp.async, whose completion is one more arrival each on
		// the stage's full barrier: the consumers never wait on a global load (run 5: the
		// scale loads each stage, at the memory latency of a saturated HBM, held the
		// consumers to 1.8-2.7 TB/s).
		const uint64_t pol_w = l2_evict_first(), pol_x = l2_evict_normal();
		int s = 0, e_acq = -1;
		uint32_t ph = 0;
		// Dense: the weights of the first stages (up to the ring) before the wait (lane 0
		// arrives on their full barriers expecting the whole stage's bytes; the tokens and the
		// scales follow after the wait, below)
		int pre = 0;
		if (!w_tab) {
			for (int u = blockIdx.x; u < units && pre < ns; u += gridDim.x) {
				const st_unit w = unit_of(sl, u, tiles, chunks, chunk_blocks, KB);
				const int xbytes = xbox; // dense: one token box of mpad rows a K block
				for (int kb = w.kb0; kb < w.kb1 && pre < ns; kb += KBS, pre++) {
					const int nb = min(KBS, w.kb1 - kb);
					if (lane == 0) {
						const uint32_t bar = smem_u32(&full[pre]);
						mbar_arrive_expect_tx(bar, (uint32_t)(nb * (ST_WBOX + xbytes)) +
										   (sx_tma ? sxb : 0));
						for (int j = 0; j < nb; j++)
							tma_load_2d_hint(stage0 + pre * stage_bytes + j * ST_WBOX, wmap,
									 bar, (kb + j) * 128, w.n0, pol_w);
					}
				}
			}
			asm volatile("griddepcontrol.wait;" ::: "memory");
		}
		int q = 0; // stages issued (the first `pre` had their weights issued above)
		// the grouped weight scales' address, loaded a unit ahead
		unsigned long long sp_next = 0;
		if (MG > 0 && blockIdx.x < units)
			sp_next = w_tab ? s_tab[unit_of(sl, blockIdx.x, tiles, chunks, chunk_blocks, KB).e]
					: (unsigned long long)S;
		for (int u = blockIdx.x; u < units; u += gridDim.x) {
			const st_unit w = unit_of(sl, u, tiles, chunks, chunk_blocks, KB);
			const float *Sp = reinterpret_cast<const float *>(sp_next);
			if (MG > 0 && w_tab && u + (int)gridDim.x < units)
				sp_next = s_tab[unit_of(sl, u + gridDim.x, tiles, chunks, chunk_blocks, KB).e];
			const tmap *wm = w_tab ? &st_maps[w.e] : wmap;
			if (lane == 0 && w_tab && w.e != e_acq) {
				// written by k_stream_group_maps through the generic proxy
				asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(wm)
					     : "memory");
				e_acq = w.e;
			}
			// the slice's token rows: grouped in boxes of 8 (only as many as it has: a slice
			// of 2 rows takes 1 KB a K block, not mpad rows); dense one box of mpad rows a K
			// block (the tensor map's box, rows past M zero-filled: one copy, not mpad / 8)
			const int xb = w_tab ? (w.ms + 7) >> 3 : 1, xbytes = w_tab ? xb * 1024 : xbox;
			for (int kb = w.kb0; kb < w.kb1; kb += KBS, q++) {
				const int nb = min(KBS, w.kb1 - kb);
				const bool early = q < pre; // weights already on their way (s == q)
				if (!early)
					mbar_wait(smem_u32(&empty[s]), ph ^ 1);
				const uint32_t bar = smem_u32(&full[s]);
				if (MG > 0) {
					// the scales: items j < nb (the weights'), then nb + j ms + m (the tokens')
					const uint32_t sd = scl0 + s * ST_SCL_BYTES;
					for (int i = lane; i < nb * (no_sx || sx_tma ? 1 : 1 + w.ms); i += 32) {
						if (i < nb) {
							cp_async4(sd + 4 * i, Sp + (size_t)(w.n0 >> 7) * KB + kb + i);
						} else {
							const int r = i - nb, j = r / w.ms, m = r - j * w.ms;
							cp_async4(sd + 16 + 4 * (64 * j + m),
								  SX + (size_t)(w.r0 + m) * KB + kb + j);
						}
					}
				}
				cp_async_arrive(bar); // (at once when this lane copied nothing)
				if (lane == 0) {
					// whole boxes count, rows past N or past the tokens zero-filled included
					if (!early)
						mbar_arrive_expect_tx(bar, (uint32_t)(nb * (ST_WBOX + xbytes)) +
									   (sx_tma ? sxb : 0));
					const uint32_t dst = stage0 + s * stage_bytes;
					if (sx_tma) // columns kb & ~3 .. + 7 (past K/128 zero-filled)
						tma_load_2d_hint(sxt0 + s * sxb, smap, bar, kb & ~3, w.r0, pol_x);
					for (int j = 0; j < nb; j++) {
						if (!early)
							tma_load_2d_hint(dst + j * ST_WBOX, wm, bar, (kb + j) * 128,
									 w.n0, pol_w);
						for (int i = 0; i < xb; i++)
							tma_load_2d_hint(dst + KBS * ST_WBOX + j * xbox + i * 1024, xmap,
									 bar, (kb + j) * 128, w.r0 + 8 * i, pol_x);
					}
				}
				if (++s == ns)
					s = 0, ph ^= 1;
			}
		}
		return;
	}

	// ---- consumers: warp w owns rows n0 + 16 RT w .. + 16 RT - 1 of each unit ----
	constexpr int MGA = MG > 0 ? MG : 1; // array extent
	const int g = lane >> 2, t = lane & 3;
	int s = 0;
	uint32_t ph = 0, it = 0; // it: stages consumed, whose parity picks the fp16 token buffer
	// Fused chunk sum: the warp that stores the last of the chunks' partials of its rows
	// (counted in st_count, which it resets for the next GEMM) sums them in chunk order, as
	// k_gemm_stream_reduce would. No warp waits on the memory system for it: at the end of
	// unit u, before u's partials are stored, a fence makes the warp's stores so far visible
	// (the pending unit's partials, stored a unit ago, so the fence is cheap), the count
	// issued a unit ago is read (resolve: the last arrival sums), and the pending unit is
	// counted (count: an atomic whose result is read a unit later); u becomes pending.
	// (Run 5: a fence and an atomic round trip at each unit's end, at the latency of a
	// saturated HBM, held the consumers back.)
	st_pend pend = {-1, 0, 0, 0, 0}, counted = {-1, 0, 0, 0, 0};
	unsigned cnt_old = 0; // lane 0: the count before counted's arrival
	auto resolve = [&]() {
		if (counted.st < 0)
			return;
		const int last = __shfl_sync(0xffffffffu, (int)(cnt_old == (unsigned)chunks - 1), 0);
		if (last) {
			if (lane == 0)
				st_count[(size_t)counted.st * CW + warp] = 0;
			fence_acq_rel_gpu(); // the other chunks' partials are read after their counts
			for (int i = lane; i < counted.nr * counted.ms; i += 32) {
				const int m = i / counted.nr, row = counted.n + i % counted.nr;
				const size_t r = (size_t)counted.r0 + m;
				const float *p = partial + r * N + row;
				// up to 8 chunks' loads in flight at once (one memory latency, not
				// `chunks`), then added in chunk order
				float sum = 0.f;
				for (int c0 = 0; c0 < chunks; c0 += 8) {
					float v[8];
#pragma unroll
					for (int c = 0; c < 8; c++)
						v[c] = c0 + c < chunks ? __ldcg(p + (size_t)(c0 + c) * rows * N)
								       : 0.f;
#pragma unroll
					for (int c = 0; c < 8; c++)
						if (c0 + c < chunks)
							sum = c0 + c == 0 ? v[c] : sum + v[c];
				}
				Y[r * ldy + row] = f32_to_bf16(sum);
			}
		}
		counted.st = -1;
	};
	auto count = [&]() {
		if (pend.st < 0)
			return;
		if (lane == 0)
			cnt_old = atomicAdd(&st_count[(size_t)pend.st * CW + warp], 1u);
		counted = pend;
		pend.st = -1;
	};
	for (int u = blockIdx.x; u < units; u += gridDim.x) {
		const st_unit w = unit_of(sl, u, tiles, chunks, chunk_blocks, KB);
		const int n = w.n0 + warp * 16 * RT; // this warp's first row
		// N % 16 == 0: each 16-row MMA tile is all in or all out; rt_n of them are in
		const int rt_n = min(RT, max(0, (N - n) >> 4));
		const int mg_n = (w.ms + 7) >> 3;
		// Promotion factors sx[m] * S[row block] of a stage's K blocks for this lane's tokens
		// (2t, 2t + 1 of each group of 8; 0 past the slice), from the stage's scale copies
		// (the unit's 128 rows, and so the warp's, lie in one 128-row scale block)
		float sc[KBS][MGA][2];
		float acc[RT][MGA][4];
		float frag[WI == 2 ? 4 * MGA : 1]; // the wgmma fragment (WI = 2)
#pragma unroll
		for (int rt = 0; rt < RT; rt++)
#pragma unroll
			for (int mg = 0; mg < MGA; mg++)
				acc[rt][mg][0] = acc[rt][mg][1] = acc[rt][mg][2] = acc[rt][mg][3] = 0.f;
		for (int kb = w.kb0; kb < w.kb1; kb += KBS) {
			mbar_wait(smem_u32(&full[s]), ph);
			const uint32_t sd = scl0 + s * ST_SCL_BYTES;
#pragma unroll
			for (int j = 0; j < KBS; j++) {
				const bool ok = MG > 0 && rt_n > 0 && kb + j < w.kb1;
				const float sw = ok ? lds32f(sd + 4 * j) : 0.f;
#pragma unroll
				for (int mg = 0; mg < MGA; mg++) {
					const int m0 = mg * 8 + 2 * t;
					// token m0's scale of K block kb + j, then token m0 + 1's
					const uint32_t a = sx_tma ? sxt0 + s * sxb + 32 * m0 + 4 * ((kb & 3) + j)
								  : sd + 16 + 4 * (64 * j + m0);
					const uint32_t a1 = a + (sx_tma ? 32 : 4);
					sc[j][mg][0] = ok && m0 < w.ms ? lds32f(a) * sw : 0.f;
					sc[j][mg][1] = ok && m0 + 1 < w.ms ? lds32f(a1) * sw : 0.f;
				}
			}
			const uint32_t st = stage0 + s * stage_bytes;
			const uint32_t fb = fbuf + (it & 1) * fstage; // this stage's fp16 token fragments
			const int nb = min(KBS, w.kb1 - kb);
			if (MG > 0 && WI != 2) {
				// The stage's token rows as fp16 fragments, converted once by all consumer
				// warps together: item (j, mg, h, ln) = 8 bytes of token mg * 8 + ln / 4, bytes
				// 32 (ln % 4) + 8h of K block j, stored as 4 f16x2 words at
				// fb + ((j MG + mg) 4 + h) 512 + 16 ln (a lane's 4 loads below are then
				// conflict-free). The box is 128-byte swizzled: 16-byte chunk c of row r sits at
				// c ^ (r % 8).
				const int per_j = mg_n * 128;
				for (int i = threadIdx.x; i < nb * per_j; i += CW * 32) {
					const int j = i / per_j, rest = i - j * per_j;
					const int mg = rest >> 7, h = (rest >> 5) & 3, ln = rest & 31;
					const int r = mg * 8 + (ln >> 2), chunk = 2 * (ln & 3) + (h >> 1);
					const uint2 v = lds64(st + KBS * ST_WBOX + j * xbox + r * 128 +
							      ((chunk ^ (r & 7)) << 4) + (h & 1) * 8);
					uint4 o;
					e4m3x4_f16(v.x, o.x, o.y);
					e4m3x4_f16(v.y, o.z, o.w);
					sts128(fb + ((j * MGA + mg) * 4 + h) * 512 + ln * 16, o);
				}
				named_bar_sync(1, CW * 32); // every warp's conversions are visible
			}
			if constexpr (MG > 0 && WI == 2) {
				// wgmma: warpgroup cw's 64 rows (its warps' 16 each, as the mma.sync
				// consumers') times the tokens; the fragment's register 4 mg + q is
				// acc[0][mg][q]'s element (rows g, g + 8; tokens 2t, 2t + 1 of group mg)
				const uint32_t a0 = st + (warp >> 2) * 64 * 128;
#pragma unroll
				for (int j = 0; j < KBS; j++) {
					if (j >= nb)
						break;
#pragma unroll
					for (int i = 0; i < 4 * MGA; i++)
						wg_reg_fence(frag[i]);
					wg_fence();
					wg_kblock<MG>(frag, wgd_kmajor(a0 + j * ST_WBOX),
						      wgd_kmajor(st + KBS * ST_WBOX + j * xbox));
					wg_kblock_wait<MGA>(frag);
					if (j == nb - 1) {
						// the stage's last MMAs done (its scales were read before them):
						// released before the promotion
						mbar_arrive_warp(smem_u32(&empty[s]), lane);
					}
					wg_promote<MGA>(acc[0], frag, sc[j], mg_n);
				}
			}
			if (MG > 0 && WI != 2 && rt_n > 0) {
				// 128-byte swizzle: 16-byte chunk c of a row r sits at chunk c ^ (r % 8); every
				// row this lane reads has r % 8 == g, and it reads chunks 2t and 2t + 1
				const uint32_t c0 = ((2 * t) ^ g) * 16, c1 = ((2 * t + 1) ^ g) * 16;
				const uint32_t a_addr = st + (warp * 16 * RT + g) * 128;
#pragma unroll
				for (int j = 0; j < KBS; j++) {
					if (j >= nb)
						break;
					// A fragments of the warp's RT tiles: rows g, g + 8 of each, 32 bytes,
					// converted to fp16 once for every token group (gemm_fp8_f16.cuh)
					wfrag af[RT];
#pragma unroll
					for (int rt = 0; rt < RT; rt++) {
						const uint32_t a = a_addr + j * ST_WBOX + rt * 16 * 128;
						wfrag_cvt(af[rt], lds128(a + c0), lds128(a + c1),
							  lds128(a + 8 * 128 + c0), lds128(a + 8 * 128 + c1));
					}
					// per group of 8 tokens: the K block's 8 fp16 MMAs (= its 4 e4m3
					// m16n8k32) into a fresh fragment, then its promotion (groups are
					// independent chains the scheduler interleaves)
#pragma unroll
					for (int mg = 0; mg < MGA; mg++) {
						if (mg >= mg_n)
							break;
						const uint32_t bp = fb + (j * MGA + mg) * 2048 + lane * 16;
						const uint4 q0 = lds128(bp), q1 = lds128(bp + 512),
							    q2 = lds128(bp + 1024), q3 = lds128(bp + 1536);
						// word q of the token slice: (lo, hi) f16x2
						const uint32_t bf[8][2] = {{q0.x, q0.y}, {q0.z, q0.w}, {q1.x, q1.y},
									   {q1.z, q1.w}, {q2.x, q2.y}, {q2.z, q2.w},
									   {q3.x, q3.y}, {q3.z, q3.w}};
						const float s0 = sc[j][mg][0], s1 = sc[j][mg][1];
#pragma unroll
						for (int rt = 0; rt < RT; rt++) {
							if (rt >= rt_n)
								break;
							float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
							for (int q = 0; q < 8; q++)
								mma_w(c, af[rt].g[q][0], af[rt].g[q][1], af[rt].h[q][0],
								      af[rt].h[q][1], bf[q][0], bf[q][1]);
							// c0, c1: row g, tokens 2t, 2t+1 of the group; c2, c3: row g + 8
							acc[rt][mg][0] += c[0] * s0;
							acc[rt][mg][1] += c[1] * s1;
							acc[rt][mg][2] += c[2] * s0;
							acc[rt][mg][3] += c[3] * s1;
						}
					}
				}
			}
			it++;
			if (!(MG > 0 && WI == 2)) // (the wgmma consumers released it above)
				mbar_arrive_warp(smem_u32(&empty[s]), lane);
			if (++s == ns)
				s = 0, ph ^= 1;
		}
		if constexpr (MG == 0) // the copy-only probe: no arithmetic, no output
			continue;
		if (chunks > 1 && fused) {
			// the fused chunk sum's steps for the units before this one (see below)
			fence_acq_rel_gpu();
			__syncwarp();
			resolve();
			count();
		}
#pragma unroll
		for (int rt = 0; rt < RT; rt++) {
			if (rt >= rt_n)
				break;
#pragma unroll
			for (int mg = 0; mg < MG; mg++) {
				if (mg >= mg_n)
					break;
				const int m0 = mg * 8 + 2 * t;
#pragma unroll
				for (int q = 0; q < 4; q++) {
					const int m = m0 + (q & 1), row = n + rt * 16 + g + 8 * (q >> 1);
					if (m >= w.ms)
						continue;
					const size_t r = (size_t)w.r0 + m;
					if (chunks == 1)
						Y[r * ldy + row] = f32_to_bf16(acc[rt][mg][q]);
					else // fp32 partial of this chunk, summed in chunk order below
						partial[((size_t)w.chunk * rows + r) * N + row] = acc[rt][mg][q];
				}
			}
		}
		if (chunks > 1 && fused && rt_n > 0)
			pend = st_pend{w.st, n, 16 * rt_n, w.r0, w.ms};
	}
	if (MG > 0 && chunks > 1 && fused) { // the last unit's count, and its sum when last
		fence_acq_rel_gpu();
		__syncwarp();
		resolve();
		count();
		resolve();
	}
}

#define ST_ENTRY(MG, RT, WI, SUF)                                                                 \
	extern "C" __global__ void __launch_bounds__((8 / RT + 1) * 32, 1)                        \
	k_gemm_fp8_stream_m##MG##_r##RT##SUF(const __grid_constant__ tmap wmap,                \
					const __grid_constant__ tmap xmap,                     \
					const __grid_constant__ tmap smap,                     \
					const unsigned long long *w_tab,                           \
					const unsigned long long *s_tab, const int *off, int G,    \
					const float *S, const float *SX, uint16_t *Y,              \
					float *partial, int rows, int N, int K, int ldy, int chunks, \
					int chunk_blocks, int ns, int mpad, int slice_cap,         \
					int flags)                                                 \
	{                                                                                         \
		gemm_fp8_stream<MG, RT, WI>(&wmap, &xmap, &smap, w_tab, s_tab, off, G, S, SX, Y,     \
					partial,                                                  \
					rows, N, K, ldy, chunks, chunk_blocks, ns, mpad, slice_cap, \
					flags);                                                   \
	}

ST_ENTRY(1, 1, 0, )
ST_ENTRY(2, 1, 0, )
ST_ENTRY(4, 1, 0, )
ST_ENTRY(8, 1, 0, )
ST_ENTRY(1, 2, 0, )
ST_ENTRY(2, 2, 0, )
ST_ENTRY(4, 2, 0, )
ST_ENTRY(8, 2, 0, )
ST_ENTRY(1, 1, 2, _w)
ST_ENTRY(2, 1, 2, _w)
ST_ENTRY(4, 1, 2, _w)
ST_ENTRY(8, 1, 2, _w)
// MG = 0: the pipeline alone (copies, barriers, no MMA, no output) — the benchmark's measure of
// what the copies reach by themselves.
ST_ENTRY(0, 1, 0, )

// ---- the swapped kernel: whole-K weight tiles, no K split (fast mode, dense, M <= 64) ---------
// y[m, n] as gemm_fp8_stream (spec §5.4) with the operands' roles swapped: wgmma m64nNk32 e4m3
// with the tokens as A (64 rows: the M <= 64 token rows, zeros past them) and weight rows as B,
// both from the ring's swizzled boxes. A tile is NT weight rows (a multiple of 8) over the whole
// of K: no K chunks, so no fp32 partials and no chunk-sum launch or arrival counts (run 19: the
// chunk sum's second launch cost 2.2 of 34.4 us at M = 1 on 7168x16384; summed in the kernel it
// was slower). Block b takes tiles b, b + gridDim.x, ... (the host picks NT so that the busiest
// SM streams the fewest rows: one wave where ceil(N / NT) <= SMs). Stage (stage_bytes, from the
// host) = two K blocks: their token boxes (mpad rows x 128 bytes each, at 0 and mpad 128), then
// their weight boxes (NT rows). wgmma's A is 64 rows: rows mpad .. 63 of a token box's operand
// are the bytes after it in the same stage (the next box, the weights; the host makes the stage
// at least mpad 128 + 8 KB), landed with the stage and never stored: an MMA row depends only
// on its own A row, and those rows' results are dropped (rows M .. mpad - 1 are the copy's
// zero fill). So a stage holds mpad token rows, not 64 (run 21 had 64-row slots: 8 KB a K
// block at any M, fewer stages in flight). One producer warp: lane 0 issues the copies (the first
// stages' weights before griddepcontrol.wait, as the streaming kernel); the consumers load the
// weight scales of the block's tiles over its K range, and the token scales, once at the start
// (cp.async, under the first stages' copies). Two consumer
// warpgroups: SPLIT = 0 (one tile a block, NT <= 144) they take alternate stages (warpgroup c
// the stages q = c, c + 2, ...; each stage released by its 4 warps, up to 128 columns as soon as
// its last MMAs completed and its scales were read, before their promotion (s11-2: +2-3% at
// M <= 32 on the 7168-row shapes; 144 columns would spill); the host makes the ring
// even or 1 stage, so each slot has one warpgroup: a parity wait on a slot whose previous phase
// belongs to the other warpgroup could pass before that phase completed) and add their sums at
// the end through the idle ring; SPLIT = 1 (NT = 144 .. 256: a fragment of NT / 2 registers and the
// sums' as many would not fit the 168 registers a thread that 9 warps leave) both take every
// stage, warpgroup c the rows c NT / 2 .. of the tile, and store their own rows. KS = 2 (with
// SPLIT = 0): a cluster of two blocks per tile, rank r streaming the stages of its half of K
// (the first ceil(stages / 2) or the rest): each weight byte then comes with half the token
// bytes of a tile half as wide (the tokens' share of the copies at 33-64 rows); rank 1's sums go
// into rank 0's idle ring through distributed shared memory (st.async, counted on a barrier of
// rank 0's), and rank 0 adds and stores. The end is one cluster barrier, arrived as each thread
// finishes its stages and waited only by rank 1 before it writes into rank 0's ring and by
// every thread before it leaves (s19, traced: the three cluster barriers it replaced cost
// 2.2 us of a 33 us launch at 64 rows after the cluster's last stage, now 1.6), and short code:
// it runs once a block, its instructions fetched cold while HBM is busy (s19: the stores' old
// unrolled address arithmetic took ~1 us even at one row, now 0.16).
// NP = 2 (SPLIT = 0): two tiles n, n + 1 (the blocks of a cluster pair, rank = the tile's
// place; with KS = 2 a cluster of 4, rank = 2 place + K half) stream the same K range and share
// its token boxes: each block copies half of a box's rows (mpad / 2, the token map's box) and
// multicasts them into both blocks' stage, so the L2 serves a token box once a pair.
// NP = 4 (with KS = 2: clusters of 8, rank = 2 place + K half): four tiles of a K half share its
// token boxes, each block copying a quarter of a box's rows (mpad >= 32: a multiple of the
// swizzle's 8 rows), a box served once a four; a stage's slot refilled once all four blocks'
// consumers released it.
// Why: at 33-64 tokens the L2 moves the weights twice (filled from HBM, read by the SMs) and
// the token boxes once a tile: 7168x16384 at M = 64 on 112-row tiles x K halves, 117 + 117 + 67
// MB, 35 us at the ~8.5 TB/s the L2 moves (s13-8's probe) = 3.3 TB/s of weights, as measured
// (18432x7168 on 144-row tiles: 3.48 by that bound, 3.45 measured; paired 3.83 by the bound,
// 3.53-3.55 measured in s17-2, 3.66-3.68 once the outputs were stored as bf16 pairs; the
// K-halves form's pairs, clusters of 4, one wave of the 30 that fit: 3.75 by the bound on both
// 7168-row shapes, 3.55 / 3.64 measured in s18-4). A stage's slot is then refilled only when both
// blocks' consumers have released it: each consumer warp arrives on "empty" in both (count 2x); the pair
// synchronises after the barriers' init and before either block leaves.
//
// Numerics (fast mode): per K block the 4 k32 wgmmas into a fresh fragment, then
// acc += frag · (sx[m, kb] · S[n / 128, kb]) (the streaming kernel's promotion, the same
// products); SPLIT = 0: the two warpgroups' sums added at the end (even stages + odd stages;
// KS = 2: that in each rank, then rank 0's + rank 1's), SPLIT = 1: K blocks in order — a fixed
// order that depends on N and K only, and a row's result
// does not depend on M (the MMA's rows are independent). The token scales (M x K/128) are loaded
// into shared memory once per block. Fragment register 4i + q: token 16 (warp % 4) + g +
// 8 (q >> 1), weight row n0 + cw0 + 8i + 2t + (q & 1) (cw0: the warpgroup's first row of the
// tile, 0 with alternate stages).

// The swapped kernel's ring: up to 16 stages (its barriers fill the 256-byte header), so that
// narrow tiles (small stages) still keep ~100-200 KB of weights in flight a block (run 21: 56-row
// tiles in 7 stages, 98 KB, 2.3 TB/s on 7168x16384; 112-row tiles in 5, 140 KB, 3.4)
#define SW_MAXSTAGES 16
// The swapped kernel's flags, diagnosis (the benchmark only: wrong results): SW_NOMMA no wgmma
// or promotion, SW_NOX no token boxes.
#define SW_NOMMA 2
#define SW_NOX 4
// SW_TRACE: each block's timeline (%globaltimer, ns) into g_sw_trace, the launch's slot flags >> 8
// (mod SW_TRACE_SLOTS; the host counts its launches): where a launch's time goes besides the
// stream (its start, the wait for the previous kernel, the last stage, the end's exchange and
// stores). The points, in the order a block passes them:
#define SW_TRACE 8
enum {
	SWT_START,     // thread 0, the block's first instruction
	SWT_DEPWAIT,   // the producer, past griddepcontrol.wait (the previous kernel complete)
	SWT_SCALES,    // consumer thread 0, the token scales loaded
	SWT_FIRST,     // consumer thread 0, its first stage landed
	SWT_LAST0,     // consumer thread 0 (warpgroup 0), its last stage consumed
	SWT_LAST1,     // consumer thread 128 (warpgroup 1), its last stage consumed
	SWT_EXCHANGED, // consumer thread 0, the sums exchanged (its block's part done, or stores next)
	SWT_END,       // consumer thread 0, past its stores (= SWT_EXCHANGED where it stores none)
	SWT_SM,        // %smid << 8 | the cluster rank
	SWT_POINTS
};
#define SW_TRACE_SLOTS 8
#define SW_TRACE_BLOCKS 160
__device__ unsigned long long g_sw_trace[SW_TRACE_SLOTS * SW_TRACE_BLOCKS * SWT_POINTS];

__device__ __forceinline__ void sw_mark(int flags, int point)
{
	if ((flags & SW_TRACE) && blockIdx.x < SW_TRACE_BLOCKS) {
		unsigned long long v;
		if (point == SWT_SM) {
			uint32_t sm;
			asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
			v = (unsigned long long)sm << 8 | cluster_rank();
		} else {
			asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
		}
		g_sw_trace[((flags >> 8) % SW_TRACE_SLOTS * SW_TRACE_BLOCKS + blockIdx.x) * SWT_POINTS +
			   point] = v;
	}
}

// The end's exchanges move a thread's sums 4 at a time: acc[4i .. 4i + 3] as one 16-byte word,
// and such a word added into them.
__device__ __forceinline__ uint4 acc_word(const float *acc, int i)
{
	return make_uint4(__float_as_uint(acc[4 * i]), __float_as_uint(acc[4 * i + 1]),
			  __float_as_uint(acc[4 * i + 2]), __float_as_uint(acc[4 * i + 3]));
}

__device__ __forceinline__ void acc_add_word(float *acc, int i, uint4 v)
{
	acc[4 * i] += __uint_as_float(v.x), acc[4 * i + 1] += __uint_as_float(v.y);
	acc[4 * i + 2] += __uint_as_float(v.z), acc[4 * i + 3] += __uint_as_float(v.w);
}

template <int NT, bool SPLIT, int KS, int NP, bool TRACE>
__device__ __forceinline__ void gemm_fp8_swap(const tmap *wmap, const tmap *xmap,
					      const float *__restrict__ S,
					      const float *__restrict__ SX, uint16_t *__restrict__ Y,
					      int M, int N, int K, int ldy, int ns, int mpad,
					      int stage_bytes, int flags)
{
	static_assert(KS == 1 || !SPLIT, "a cluster's K halves with alternate stages only");
	static_assert(NP == 1 || ((NP == 2 || (NP == 4 && KS == 2)) && !SPLIT),
		      "pairs (or the K-halves form's fours) of one-tile blocks only");
	constexpr int NW = SPLIT ? NT / 2 : NT, WB = NT * 128, R = NW / 2;
	const int STAGE = stage_bytes, XB = mpad * 128, W0 = ST_KBS * XB; // W0: the weights' offset
	extern __shared__ __align__(1024) uint8_t smem[];
	uint64_t *full = reinterpret_cast<uint64_t *>(smem);
	uint64_t *empty = full + SW_MAXSTAGES;
	const uint32_t stage0 = (smem_u32(smem) + 256 + 1023) & ~1023u;
	const int KB = K >> 7, tiles = (N + NT - 1) / NT;
	// this block's stages [qa, qa + nst) of the tile's (KS = 2: rank r's half of K)
	// the block's cluster rank crank = KS place + r: its K half r (KS = 2) and its tile's place
	// among the NP tiles sharing the token boxes (NP > 1); its peers, the same K range: the
	// ranks KS p + r of the other places p
	const int crank = KS * NP > 1 ? (int)cluster_rank() : 0;
	const int rank = KS == 2 ? (NP > 1 ? crank & 1 : crank) : 0;
	const int place = NP > 1 ? crank / KS : 0;
	const int nall = (KB + ST_KBS - 1) / ST_KBS;
	const int qa = rank * ((nall + 1) / 2), nst = KS == 2 ? (rank ? nall - qa : (nall + 1) / 2) : nall;
	const int tile0 = blockIdx.x / KS, tstep = gridDim.x / KS;
	// after the ring: the weight scales of the block's tiles over its K blocks (wsc: tile i's
	// K block kb0 + k, its b-th row block at 4 (3 (i KBc + k) + b), b < 3: past the tile's last,
	// the last's again, for columns past N, whose weights are zeros), then sx[m][kb] (M x KB)
	const int KBc = nst * ST_KBS, kb0 = qa * ST_KBS, ntb = (tiles + tstep - 1) / tstep;
	// xch: the end's exchanges in the idle ring (KS = 2: R floats a consumer thread of
	// warpgroup 1, then of rank 1's warpgroup 0, R 1024 bytes: the host keeps 2 stages or more)
	const uint32_t wsc = stage0 + (uint32_t)(ns * STAGE), sxs = wsc + ntb * KBc * 12, xch = stage0;
	// KS = 2: rank 0's barrier for rank 1's sums, the last full barrier's place (the host keeps
	// those rings to SW_MAXSTAGES - 1 stages)
	const uint32_t xbar = smem_u32(&full[SW_MAXSTAGES - 1]);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	// a stage released once its last MMAs completed and its scales were read, before their
	// promotion (the 144-column fragments: at the end, which spills no registers)
	constexpr bool EARLY = NW <= 128;
	// SW_TRACE's flags: in the traced twins only (the rest compile as if it did not exist)
	const int tflags = TRACE ? flags : 0;

	asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); // (as gemm_fp8_stream)
	if (threadIdx.x == 0) {
		sw_mark(tflags, SWT_START);
		sw_mark(tflags, SWT_SM);
		for (int s = 0; s < ns; s++) {
			mbar_init(smem_u32(&full[s]), 1); // the copies' (bytes)
			mbar_init(smem_u32(&empty[s]), (SPLIT ? 8 : 4) * NP); // the consuming warps
		}
		if (KS == 2) {
			// rank 0's: the bytes of rank 1's warps that hold token rows (min(M, 64) / 16
			// rounded up; rank 1 does not wait on its own)
			mbar_init(xbar, 1);
			mbar_arrive_expect_tx(xbar, (uint32_t)(min(4, (M + 15) / 16) * 32 * R * 4));
		}
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
		asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
	}
	__syncthreads();
	if constexpr (NP > 1) // the cluster's barriers initialised before its copies or arrivals
		cluster_sync();

	if (warp == 8) {
		// ---- producer: stage Q (the block's Q-th) into slot Q % ns ----
		const uint64_t pol_w = l2_evict_first(), pol_x = l2_evict_normal();
		const int pre = min(ns, nst); // the first tile's first stages: weights before the wait
		const int xbytes = flags & SW_NOX ? 0 : mpad * 128; // a token box's
		// NP > 1: this block's 1 / NP of each token box (rows xoff ..), multicast to the
		// blocks of its K range (ranks KS p + rank)
		const int xoff = place * (mpad / NP);
		uint16_t share_mask = 0;
		for (int p = 0; p < NP; p++)
			share_mask |= (uint16_t)(1u << (KS * p + rank));
		if (lane == 0)
			for (int q = 0; q < pre; q++) {
				const int kb = (qa + q) * ST_KBS, nb = min(ST_KBS, KB - kb);
				const uint32_t bar = smem_u32(&full[q]);
				mbar_arrive_expect_tx(bar, (uint32_t)(nb * (WB + xbytes)));
				for (int j = 0; j < nb; j++)
					tma_load_2d_hint(stage0 + q * STAGE + W0 + j * WB, wmap, bar,
							 (kb + j) * 128, tile0 * NT, pol_w);
			}
		asm volatile("griddepcontrol.wait;" ::: "memory"); // the tokens are the previous kernel's
		if (lane == 0)
			sw_mark(tflags, SWT_DEPWAIT);
		int Q = 0;
		for (int tile = tile0; tile < tiles; tile += tstep) {
			const int n0 = tile * NT;
			for (int q = 0; q < nst; q++, Q++) {
				const int s = Q % ns, kb = (qa + q) * ST_KBS, nb = min(ST_KBS, KB - kb);
				const bool early = Q < pre; // weights already on their way
				const uint32_t bar = smem_u32(&full[s]), st = stage0 + s * STAGE;
				if (!early)
					mbar_wait(smem_u32(&empty[s]), ((Q / ns) & 1) ^ 1);
				if (lane == 0) {
					if (!early) {
						mbar_arrive_expect_tx(bar, (uint32_t)(nb * (WB + xbytes)));
						for (int j = 0; j < nb; j++)
							tma_load_2d_hint(st + W0 + j * WB, wmap, bar, (kb + j) * 128,
									 n0, pol_w);
					}
					for (int j = 0; j < nb && xbytes; j++)
						if (NP > 1)
							tma_load_2d_mc(st + j * XB + xoff * 128, xmap, bar,
								       (kb + j) * 128, xoff, share_mask);
						else
							tma_load_2d_hint(st + j * XB, xmap, bar, (kb + j) * 128,
									 0, pol_x);
				}
			}
		}
		// the consumers' cluster barrier (below), so that no thread leaves first
		if constexpr (KS == 2 || NP > 1)
			cluster_sync();
		return;
	}

	// ---- consumers: warpgroup c = warp / 4 ----
	const int tid = threadIdx.x, c = warp >> 2, g = lane >> 2, t = lane & 3;
	// the weight scales (constants: before the wait), then the token scales, by 4-byte
	// cp.async: a thread's loads all in flight at once (one memory latency, not one per value),
	// under the first stages' copies (s11-3: against a share of each stage's scales copied by
	// the producer's lanes and counted on its full barrier, the 56-row form 2.40 -> 2.66 TB/s,
	// the cluster form +0 .. +1.5% on 7168x16384)
	for (int i = tid; i < ntb * KBc * 3; i += 256) {
		const int ti = i / (KBc * 3), k = i / 3 % KBc, tile = tile0 + ti * tstep;
		const int n0 = tile * NT, b = min((n0 >> 7) + i % 3, (min(n0 + NT, N) - 1) >> 7);
		if (tile < tiles && kb0 + k < KB)
			cp_async4(wsc + 4 * i, S + (size_t)b * KB + kb0 + k);
	}
	asm volatile("griddepcontrol.wait;" ::: "memory"); // sx is the previous kernel's
	for (int i = tid; i < M * KB; i += 256)
		cp_async4(sxs + 4 * i, SX + i);
	cp_async_wait_all();
	named_bar_sync(1, 256);
	if (tid == 0)
		sw_mark(tflags, SWT_SCALES);

	const int m0 = 16 * (warp & 3) + g, m1 = m0 + 8, cw0 = SPLIT ? c * NW : 0;
	// a stage's release: this warp's arrival on "empty" here and (NP > 1) in its peers, whose
	// producers multicast into this block's slot too (lane l < NP - 1: the peer at place + 1 + l)
	auto release = [&](int s) {
		mbar_arrive_warp(smem_u32(&empty[s]), lane);
		if (NP > 1 && lane < NP - 1)
			mbar_arrive_cluster(smem_u32(&empty[s]),
					    (uint32_t)(KS * ((place + 1 + lane) % NP) + rank));
	};
	const bool live = 16 * (warp & 3) < M; // warps whose token rows exist
	int Q = 0;
	for (int tile = tile0; tile < tiles; tile += tstep, Q += nst) {
		const int n0 = tile * NT, r0 = (n0 & 127) + cw0;
		// this tile's weight scales (one tile a block unless SPLIT)
		const uint32_t wt = SPLIT ? wsc + 12 * KBc * (Q / nst) : wsc;
		if (tid == 0 && Q == 0 && (tflags & SW_TRACE)) {
			mbar_wait(smem_u32(&full[0]), 0); // (as the loop's first wait, which then passes)
			sw_mark(tflags, SWT_FIRST);
		}
		float acc[R], frag[R];
#pragma unroll
		for (int i = 0; i < R; i++)
			acc[i] = 0.f;
		for (int q = SPLIT ? 0 : c; q < nst; q += SPLIT ? 1 : 2) {
			const int s = (Q + q) % ns;
			mbar_wait(smem_u32(&full[s]), ((Q + q) / ns) & 1);
			const uint32_t st = stage0 + s * STAGE, sd = wt + 12 * ST_KBS * q;
#pragma unroll
			for (int j = 0; j < ST_KBS; j++) {
				const int kb = (qa + q) * ST_KBS + j;
				if (kb >= KB || (flags & SW_NOMMA))
					break;
#pragma unroll
				for (int i = 0; i < R; i++)
					wg_reg_fence(frag[i]);
				wg_fence();
				const uint64_t da = wgd_kmajor(st + j * XB),
					       db = wgd_kmajor(st + W0 + j * WB + cw0 * 128);
#pragma unroll
				for (int k = 0; k < 4; k++)
					wgmma_e4m3<NW>(frag, da + 2 * k, db + 2 * k, k > 0);
				wg_commit();
				wg_wait0();
#pragma unroll
				for (int i = 0; i < R; i++)
					wg_reg_fence(frag[i]);
				const float x0 = m0 < M ? lds32f(sxs + 4 * (m0 * KB + kb)) : 0.f;
				const float x1 = m1 < M ? lds32f(sxs + 4 * (m1 * KB + kb)) : 0.f;
				const float w0 = lds32f(sd + 12 * j), w1 = lds32f(sd + 12 * j + 4),
					    w2 = lds32f(sd + 12 * j + 8);
				if (EARLY && (j == ST_KBS - 1 || kb + 1 >= KB)) {
					// the stage's last MMAs done and its scales read: released before
					// the promotion
					release(s);
				}
#pragma unroll
				for (int i = 0; i < R / 4; i++) {
					// columns 8i .. 8i + 7 lie in one 128-row scale block (n0 % 8 == 0),
					// the tile's b-th (b <= 2: a tile spans at most 3)
					const int b = (r0 + 8 * i) >> 7;
					const float sw = b == 0 ? w0 : b == 1 ? w1 : w2;
					const float f0 = x0 * sw, f1 = x1 * sw;
					acc[4 * i + 0] += frag[4 * i + 0] * f0;
					acc[4 * i + 1] += frag[4 * i + 1] * f0;
					acc[4 * i + 2] += frag[4 * i + 2] * f1;
					acc[4 * i + 3] += frag[4 * i + 3] * f1;
				}
			}
			if (!EARLY || (flags & SW_NOMMA))
				release(s);
		}
		if (tid == 0)
			sw_mark(tflags, SWT_LAST0);
		else if (tid == 128)
			sw_mark(tflags, SWT_LAST1);
		if constexpr (!SPLIT) {
			// one tile a block (the host's rule), so every stage is consumed now (every copy
			// landed, no wgmma reads the ring): warpgroup 1 hands its sums to warpgroup 0
			// through the ring (xch, 16 bytes a thread at a time, thread-major:
			// conflict-free), which adds them to its own.
			// KS = 2: the cluster's one barrier after the stages (below) arrived here, waited
			// before any block leaves; KS = 1, NP = 2: the pair's barrier first (its blocks'
			// copies into each other's rings and arrivals on each other's barriers all done:
			// none leaves before)
			if constexpr (KS == 2)
				cluster_arrive();
			else if constexpr (NP > 1)
				cluster_sync();
			named_bar_sync(1, 256);
			if (c == 1 && live)
#pragma unroll
				for (int i = 0; i < R / 4; i++)
					sts128(xch + 16 * (i * 128 + tid - 128), acc_word(acc, i));
			named_bar_sync(1, 256);
			if (c == 1) {
				if constexpr (KS == 2)
					cluster_wait();
				return;
			}
			if (live)
#pragma unroll
				for (int i = 0; i < R / 4; i++)
					acc_add_word(acc, i, lds128(xch + 16 * (i * 128 + tid)));
		}
		if constexpr (KS == 2) {
			// one tile a cluster (pair): rank 1's sums into rank 0's ring past rank 0's own
			// exchange (xch + R 512), once every block of the cluster arrived after its
			// stages (rank 0's ring idle), by st.async counted on rank 0's xbar; rank 0
			// adds them (rank 0's + rank 1's, as rank 1 would: the same bits either way)
			const uint32_t rank0 = NP > 1 ? (uint32_t)(crank & ~1) : 0u;
			if (rank == 1) {
				cluster_wait();
				const uint32_t dst = cl_mapa(xch + R * 512 + 16 * tid, rank0),
					       bar = cl_mapa(xbar, rank0);
				if (live)
#pragma unroll
					for (int i = 0; i < R / 4; i++)
						cl_st_async(dst + 16 * 128 * i, acc_word(acc, i), bar);
				if (tid == 0) {
					sw_mark(tflags, SWT_EXCHANGED);
					sw_mark(tflags, SWT_END);
				}
				return;
			}
			mbar_wait(xbar, 0);
			if (live)
#pragma unroll
				for (int i = 0; i < R / 4; i++)
					acc_add_word(acc, i, lds128(xch + R * 512 + 16 * (i * 128 + tid)));
		}
		if (tid == 0)
			sw_mark(tflags, SWT_EXCHANGED);
		if (!live) {
			if constexpr (KS == 2)
				cluster_wait();
			continue;
		}
		// columns n, n + 1 (n even, N even: both or neither past N) as one bf16 pair where y's
		// rows are 4-byte aligned (ldy even), else two halves; a row's address once (the end is
		// code that runs once a block, fetched cold while HBM is busy: kept short, s19)
		const bool two = (ldy & 1) || (reinterpret_cast<uintptr_t>(Y) & 3);
		const int nc = n0 + cw0 + 2 * t, nleft = N - nc; // group i stored where 8 i < nleft
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int m = h ? m1 : m0;
			if (m >= M)
				continue;
			uint16_t *yr = Y + (size_t)m * ldy + nc;
			if (!two) {
#pragma unroll
				for (int i = 0; i < R / 4; i++)
					if (8 * i < nleft)
						*reinterpret_cast<uint32_t *>(yr + 8 * i) =
							bf16x2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
			} else {
#pragma unroll
				for (int i = 0; i < R / 4; i++)
					if (8 * i < nleft) {
						const uint32_t v = bf16x2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
						yr[8 * i] = (uint16_t)v, yr[8 * i + 1] = (uint16_t)(v >> 16);
					}
			}
		}
		if (tid == 0)
			sw_mark(tflags, SWT_END);
		if constexpr (KS == 2)
			cluster_wait();
	}
}

// One entry: k_gemm_fp8_swap_n<NT><SUF>, gemm_fp8_swap<NT, SPLIT, KS, NP, TR>, with the cluster
// dimensions ATTR (empty: none)
#define SW_KERNEL(NT, SUF, SPLIT, KS, NP, TR, ATTR)                                               \
	extern "C" __global__ void ATTR __launch_bounds__(288, 1)                                 \
	k_gemm_fp8_swap_n##NT##SUF(const __grid_constant__ tmap wmap,                             \
				   const __grid_constant__ tmap xmap, const float *S,             \
				   const float *SX, uint16_t *Y, int M, int N, int K, int ldy,    \
				   int ns, int mpad, int stage_bytes, int flags)                   \
	{                                                                                         \
		gemm_fp8_swap<NT, SPLIT, KS, NP, TR>(&wmap, &xmap, S, SX, Y, M, N, K, ldy, ns,    \
						     mpad, stage_bytes, flags);                    \
	}
#define SW_ENTRY(NT, SPLIT, SUF) SW_KERNEL(NT, SUF, SPLIT, 1, 1, false, )
// KS = 2: a cluster of two blocks a tile (its K halves); .._traced: the traced twins (SW_TRACE;
// diagnosis only: tools/check_spills.sh lets them spill a few bytes, their timelines the
// production kernels' within that)
#define SW_ENTRY2(NT) SW_KERNEL(NT, k2, false, 2, 1, false, __cluster_dims__(2, 1, 1))
#define SW_ENTRY2T(NT) SW_KERNEL(NT, k2_traced, false, 2, 1, true, __cluster_dims__(2, 1, 1))
// NP = 2: pairs of tiles sharing their token boxes (clusters of 2)
#define SW_ENTRY_P2(NT) SW_KERNEL(NT, p2, false, 1, 2, false, __cluster_dims__(2, 1, 1))
// KS = 2 and NP = 2: pairs of the K-halves form's pairs (clusters of 4; the H200 holds 30 of
// ~200 KB blocks at once, s18-3: its grid must be <= 30 clusters, model/cuda_gemm.c; 32 streamed
// 2.05-2.14 TB/s on 7168x16384 in s17-2, as two waves)
#define SW_ENTRY_Q4(NT) SW_KERNEL(NT, q4, false, 2, 2, false, __cluster_dims__(4, 1, 1))
#define SW_ENTRY_Q4T(NT) SW_KERNEL(NT, q4_traced, false, 2, 2, true, __cluster_dims__(4, 1, 1))
// KS = 2 and NP = 4: fours of the K-halves form's pairs (clusters of 8; the H200 holds 15 of
// ~200 KB blocks, s18-3: 120 SMs as the quads), each token box served once a four
#define SW_ENTRY_O8(NT) SW_KERNEL(NT, o8, false, 2, 4, false, __cluster_dims__(8, 1, 1))

SW_ENTRY(8, false, )
SW_ENTRY(16, false, )
SW_ENTRY(24, false, )
SW_ENTRY(32, false, )
SW_ENTRY(48, false, )
SW_ENTRY(56, false, )
SW_ENTRY(64, false, )
SW_ENTRY(96, false, )
SW_ENTRY(128, false, )
SW_ENTRY(144, false, )
// rows split between the warpgroups, any number of tiles a block
SW_ENTRY(144, true, s)
SW_ENTRY(192, true, s)
SW_ENTRY(256, true, s)
SW_ENTRY2(16)
SW_ENTRY2(32)
SW_ENTRY2(48)
SW_ENTRY2(64)
SW_ENTRY2(96)
SW_ENTRY2(112)
SW_ENTRY2(128)
SW_ENTRY_P2(16)
SW_ENTRY_P2(32)
SW_ENTRY_P2(48)
SW_ENTRY_P2(56)
SW_ENTRY_P2(64)
SW_ENTRY_P2(96)
SW_ENTRY_P2(128)
SW_ENTRY_P2(144)
SW_ENTRY_Q4(120)
SW_ENTRY_O8(120)
// the traced twins (the widths the 7168-row shapes take)
SW_ENTRY2T(112)
SW_ENTRY2T(128)
SW_ENTRY_Q4T(120)

// st_maps[e] = tmpl with its global address replaced by w_tab[e], for each group e with a weight
// (w_tab[e] != 0; one warp per group, block e; w_tab is constant, so no read of the row offsets).
// Launched with PDL: its blocks are resident while the previous kernel runs, and write the maps
// once it is complete (griddepcontrol.wait: the previous grouped GEMM, which may have let this
// grid start early, still reads the maps until then), so the GEMM after it, which waits for this
// grid, also sees the previous kernel's outputs (the row offsets). The copy to global memory is
// a release of the tensor-map proxy, which the GEMM's producer acquires before its first copy
// through the map.
extern "C" __global__ void __launch_bounds__(32)
k_stream_group_maps(const __grid_constant__ tmap tmpl,
		    const unsigned long long *__restrict__ w_tab, int G)
{
	__shared__ tmap sm;
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	asm volatile("griddepcontrol.wait;" ::: "memory");
	const int e = blockIdx.x;
	if (e < G && e < ST_MAXG && w_tab[e]) // the whole warp alike
		tmap_store_at(&st_maps[e], tmpl, w_tab[e], &sm);
}

// y[r, n] = bf16( Σ_{c = 0 .. chunks-1} partial[c][r][n] ) for r < R, the fixed-order sum of the
// K chunks; R = *rows_dev when given (grouped: off[G], known on the device only), else rows.
// partial: [chunks][rows][N] (N % 4 == 0). A thread takes 4 columns: 16-byte loads of up to 8
// chunks in flight together, then added in chunk order (one memory latency per 8 chunks, not
// one per chunk: the grid is small, a few blocks an SM beside the GEMM's).
extern "C" __global__ void __launch_bounds__(256)
k_gemm_stream_reduce(const float *__restrict__ partial, uint16_t *__restrict__ Y, int chunks,
		     int rows, const int *__restrict__ rows_dev, int N, int ldy)
{
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); // (as the GEMM's)
	asm volatile("griddepcontrol.wait;" ::: "memory"); // the GEMM's partials (PDL launch)
	const int R = rows_dev ? min(rows, *rows_dev) : rows;
	const long long total = (long long)R * N / 4, plane = (long long)rows * N;
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (long long)gridDim.x * blockDim.x) {
		const float *p = partial + 4 * i;
		float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
		for (int c0 = 0; c0 < chunks; c0 += 8) {
			float4 v[8];
#pragma unroll
			for (int c = 0; c < 8; c++)
				if (c0 + c < chunks)
					v[c] = __ldcg(reinterpret_cast<const float4 *>(p + (c0 + c) * plane));
#pragma unroll
			for (int c = 0; c < 8; c++)
				if (c0 + c < chunks) {
					if (c0 + c == 0)
						sum = v[c];
					else
						sum.x += v[c].x, sum.y += v[c].y, sum.z += v[c].z, sum.w += v[c].w;
				}
		}
		const long long r = 4 * i / N, n = 4 * i % N;
		uint16_t *y = Y + r * ldy + n;
		y[0] = f32_to_bf16(sum.x), y[1] = f32_to_bf16(sum.y);
		y[2] = f32_to_bf16(sum.z), y[3] = f32_to_bf16(sum.w);
	}
}

// The decode-sized MoE gate|up GEMM's chunk sum with SwiGLU and act_quant (spec §5.3): for each
// row r < R and each 128 columns of h, moe_epi_swiglu_group (moe_epi.cuh) — k_gemm_stream_reduce's
// sums (same chunk order) then k_moe_swiglu_quant's arithmetic (moe_block.cu), value for value:
// the bits of the GEMM's bf16 output through that kernel. One warp per (row, 128 columns); R as
// in k_gemm_stream_reduce.
extern "C" __global__ void __launch_bounds__(256)
k_gemm_stream_reduce_swiglu(const float *__restrict__ partial, uint8_t *__restrict__ h8,
			    float *__restrict__ hs, int chunks, int rows,
			    const int *__restrict__ rows_dev, int I)
{
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); // (as the GEMM's)
	asm volatile("griddepcontrol.wait;" ::: "memory"); // the GEMM's partials (PDL launch)
	const int R = rows_dev ? min(rows, *rows_dev) : rows;
	const int lane = threadIdx.x & 31;
	const long long plane = (long long)rows * 2 * I, groups = (long long)R * (I / 128);
	for (long long grp = (long long)blockIdx.x * 8 + (threadIdx.x >> 5); grp < groups;
	     grp += (long long)gridDim.x * 8)
		moe_epi_swiglu_group(partial, h8, hs, chunks, plane, grp, I, lane);
}

// The decode-sized MoE down GEMM's chunk sum with the combine (spec §5.3): y[t, d] for each token
// t and column d < N by moe_epi_combine_at (moe_epi.cuh) — k_gemm_stream_reduce's sums then
// k_moe_combine's arithmetic, value for value. A thread an output.
extern "C" __global__ void __launch_bounds__(256)
k_gemm_stream_reduce_combine(const float *__restrict__ partial, uint16_t *__restrict__ Y,
			     const float *__restrict__ w, const int *__restrict__ perm, int chunks,
			     int rows, int N, int T, int K)
{
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); // (as the GEMM's)
	asm volatile("griddepcontrol.wait;" ::: "memory"); // the GEMM's partials (PDL launch)
	const long long plane = (long long)rows * N, total = (long long)T * N;
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (long long)gridDim.x * blockDim.x)
		Y[i] = moe_epi_combine_at(partial, w, perm, chunks, plane, N, T, K, i);
}
