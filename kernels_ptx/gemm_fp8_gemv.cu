// gemm_fp8_gemv.cu — the FP8 block-scaled GEMM of decode at M <= 8 tokens (batch-1 decode's
// projections; model/cuda_gemm.c's CUDA_GEMM_PATH_GEMV), spec §5.4:
//   y[m, n] = bf16( Σ_kb ( Σ_{k in kb} x8[m, k] · W8[n, k] ) · sx[m, kb] · S[n / 128, kb] )
// W8 e4m3 [N, K] (row stride K), S fp32 [N/128, K/128], x8 e4m3 [M, K], sx fp32 [M, K/128],
// y bf16 [M, ldy]; N % 16 == 0, K % 128 == 0. The grouped form (k_gemm_fp8_gemv_g: the MoE
// experts of a one-token step, model/cuda_gemm.c's grouped_gemv) runs each group's rows (in
// slices of <= 8) against that group's weights, the same way.
//
// Why another kernel: at one token a GEMM is a stream of weights with a few microseconds of fixed
// cost, and the small matrices of a decode step (12-38 MB) are all fixed cost at 2-3x their
// floor (run 24, bench gemm M = 1: v2 7.9 / 16.3 us on 2112x7168 / 24576x1536 against floors of
// 3.4 / 8.4): v2's blocks each load one or two K blocks and exit (~48 KB in flight an SM at
// best, less between its waves); the streaming kernel sums its K chunks in a second launch. Here
// a persistent block per SM streams units of 16 weight rows x a K chunk into a ring of shared
// memory with one 1-D bulk copy per row (no tensor map), the first ones issued before
// griddepcontrol.wait (the weights are constants), up to ~128 KB in flight an SM, and the K
// chunks are summed without a second launch.
//
// Work: units u = tile * chunks + c (16 rows, K blocks [c * chunk_blocks, ...)) in that order;
// block b takes the contiguous range [b U / G, (b + 1) U / G) of the U units (G = gridDim.x <=
// the SMs), so no block streams more than one unit above the mean. A tile whose
// chunks all fall in one block's range is summed in registers and written; a tile split between
// blocks (at most the first and the last of a range) has its chunks' partials written to the
// workspace and the block that completes its arrival count sums them. Warps 0-7 consume, warp 8
// produces. A stage holds one unit, row r at r x rs bytes: with K unchunked the unit's 16 rows
// are contiguous in memory and come in ONE bulk copy (rs = K; reads of 8 rows at the same bank
// offset cost 2x wavefronts); chunked, one copy per row (lanes 0-15) and rs = chunk_blocks x 128
// + 16, so lanes of different rows fall in different banks. (Run 25: with a copy per row of
// 1-1.5 KB the kernel streamed 1.4-1.9 TB/s, with 3.5 KB rows 3.76: few large copies an SM.)
//
// Arithmetic (the exact decode kernels', gemm_fp8_decode.cu): consumer warp w takes the unit's
// K blocks j = w, w + 8, ...; per K block the fp16 MMAs of gemm_fp8_f16.cuh on the weights
// converted once (e4m3 -> f16 exact, fp32 accumulation) give a fresh fp32 fragment, promoted by
// sx[m, kb] · S[n/128, kb] into the warp's accumulator; a chunk's partial p_c is the 8 warps'
// sums added in warp order, and y = bf16(((0 + p_0) + p_1) + ...) in chunk order, whether a
// block adds them in registers or the last arrival from the workspace: the same bits whatever
// the grid (a cap), the ranges or M.
#include "common.cuh"
#include "gemm_fp8_f16.cuh"
#include "gemv_layout.h" // GV_CW, GV_THREADS, GV_MAXSTAGES, GV_SLOTS, GV_TILES, the smem offsets
#include "mma.cuh"
#include "moe_epi.cuh"
#include "moe_route.cuh" // one token routed in k_moe_gemv_block
#include "scan.cuh"
#include "tma.cuh"

// GV_TRACE (a diagnosis build: make BUILD=build-trace NVCC_EXTRA=-DGV_TRACE): k_moe_gemv_block
// stamps %globaltimer at its steps into gv_trace[block][GV_TR_N] (ns; dsv32 bench moe prints
// the timeline across the blocks). Steps: 0 entry; 1 the consumers past the wait, slices built;
// 2 the first gate|up stage full; 3 the gate|up units done; 4 the first arrival passed; 5 the
// SwiGLU done; 6 the second arrival passed; 7 the first down stage full; 8 the down units done;
// 9 the third arrival passed; 10 the combine done; 11 the producer's last gate|up copy issued;
// 12 its last down copy issued; one token routed in the block (R1): 13 the token's row
// quantised, 14 the shared expert's gate|up units done; 15 holds the block's SM (%smid), not a
// time.
#define GV_TR_N 16
#ifdef GV_TRACE
__device__ unsigned long long gv_trace[1024 * GV_TR_N];
__device__ __forceinline__ void gv_stamp(int i)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	gv_trace[blockIdx.x * GV_TR_N + i] = t;
}
#define GV_STAMP(cond, i)                                                                          \
	do {                                                                                       \
		if (cond)                                                                          \
			gv_stamp(i);                                                               \
	} while (0)
// step 15: the block's SM
__device__ __forceinline__ void gv_stamp_sm(void)
{
	unsigned sm;
	asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
	gv_trace[blockIdx.x * GV_TR_N + 15] = sm;
}
#define GV_STAMP_SM(cond)                                                                          \
	do {                                                                                       \
		if (cond)                                                                          \
			gv_stamp_sm();                                                             \
	} while (0)
#else
#define GV_STAMP(cond, i) ((void)0)
#define GV_STAMP_SM(cond) ((void)0)
#endif

// Arrival counts of the chunk sums, [slot][tile]: zero when the module loads, and each GEMM
// leaves them zero (the last arrival resets its count). The host gives consecutive launches
// different slots, so GEMMs running at once on two streams (a fork) never share a count.
__device__ unsigned gv_count[GV_SLOTS * GV_TILES];

// a grouped GEMM's slice: rows r0 .. r0 + rows - 1 (<= 8) of group e
struct gv_slice {
	int e, r0, rows, pad;
};

// GROUPED: group e multiplies rows [off[e], off[e + 1]) of X by W_e = w_tab[e] (scales s_tab[e]),
// in slices of <= 8 rows (the slice list built by every block from off, after
// griddepcontrol.wait: the offsets are the previous kernel's); M is then the row bound of X, y
// and the partials (max_rows) and the smem holds slice_cap slices. Else one slice of M rows.
// flags & GV_F32: y is not written; the sums go to partial[0][row][n] in fp32 (for
// model/cuda_gemm.c's epilogue kernels k_gemm_stream_reduce_swiglu / _combine with one chunk).
#define GV_F32 1
// flags & GV_OFF_EARLY (GROUPED): off was complete before the previous kernel started (the
// caller's guarantee: model/cuda_moe.c's down GEMM at 1-3 tokens, two launches after the router,
// behind a gate|up GEMM of this kernel, which lets its dependents start only after its own
// griddepcontrol.wait). The slices are then built and the weights streamed at once, while the
// previous kernel (the SwiGLU) still runs; the consumers wait for it before reading X.
#define GV_OFF_EARLY 2

// The converted weight fragment of K block j of the stage at st (rows at rs bytes): lane (g, t)
// reads bytes [32t, 32t + 32) of rows g and g + 8
__device__ __forceinline__ wfrag gv_wfrag(uint32_t st, int rs, int j)
{
	const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	const uint32_t a = st + (uint32_t)(g * rs + j * 128 + 32 * t);
	wfrag af;
	wfrag_cvt(af, lds128(a), lds128(a + 16), lds128(a + 8 * rs), lds128(a + 8 * rs + 16));
	return af;
}

// One GEMM as the unit loops see it: dense (W, S) or grouped (w_tab, s_tab over the slices);
// flags: GV_F32 (the sums to partial[0] in fp32, not y).
struct gv_op {
	const uint8_t *W;
	const float *S;
	const unsigned long long *w_tab, *s_tab;
	const uint8_t *X;
	const float *SX;
	uint16_t *Y;
	float *partial;
	int M, N, K, ldy, chunks, chunk_blocks, flags;
};

// A GEMM's unit geometry (computed once, at the kernel's start): K blocks, a stage row's bytes,
// a unit's bytes in a stage, 16-row tiles, units a slice
struct gv_geom {
	int KB, rs, stage, tiles, per_slice;
};

__device__ __forceinline__ gv_geom gv_geom_of(const gv_op &o)
{
	const int KB = o.K >> 7, rs = o.chunks == 1 ? o.K : o.chunk_blocks * 128 + 16;
	const int stage = 16 * rs, tiles = o.N >> 4;
	return gv_geom{KB, rs, stage, tiles, tiles * o.chunks};
}

// The ring of a block: ns slots of slot_bytes from stage0, a unit in SPAN consecutive slots (its
// first slot's full barrier counts its bytes; the others' complete on the producer's arrival, so
// that every slot's barriers complete once a turn of the ring), s / ph the next slot and its
// phase — the producer's and the consumers' own copies.
struct gv_ring {
	uint32_t stage0;
	int slot_bytes, ns;
	uint64_t *full, *empty;
	int s;
	uint32_t ph;
};

template <int SPAN> __device__ __forceinline__ void gv_ring_next(gv_ring &r)
{
	r.s += SPAN;
	if (r.s == r.ns)
		r.s = 0, r.ph ^= 1;
}

// The grouped GEMM's slices from the offsets (every thread of the block; the caller syncs)
__device__ __forceinline__ int gv_build_slices(const int *__restrict__ off, int G, int slice_cap,
					       gv_slice *sl)
{
	int base = 0;
	for (int e0 = 0; e0 < G; e0 += GV_THREADS) {
		const int e = e0 + threadIdx.x;
		int o = 0, cnt = 0;
		if (e < G)
			o = __ldcg(&off[e]), cnt = __ldcg(&off[e + 1]) - o;
		const int k = (cnt + 7) >> 3;
		int total;
		const int at = base + block_exclusive_scan<GV_THREADS>(k, &total);
		for (int j = 0; j < k && at + j < slice_cap; j++)
			sl[at + j] = gv_slice{e, o + 8 * j, min(8, cnt - 8 * j), 0};
		base += total;
	}
	return min(base, slice_cap);
}

// The producer warp: units [u0, u1)'s weight rows into the ring. It reads only the weights
// (constants) and writes only this block's shared memory.
template <bool GROUPED, int SPAN>
__device__ __forceinline__ void gv_produce(const gv_op &o, const gv_geom &ge, const gv_slice *sl,
					   int u0, int u1, gv_ring &r, int lane)
{
	const int KB = ge.KB, chunks = o.chunks, chunk_blocks = o.chunk_blocks, rs = ge.rs;
	const int per_slice = ge.per_slice;
	const uint64_t pol = l2_evict_first();
	int e_cur = -1;
	const uint8_t *Wg = o.W;
	for (int u = u0; u < u1; u++) {
		const int sidx = u / per_slice, rest = u % per_slice;
		const int tile = rest / chunks, kb0 = (rest % chunks) * chunk_blocks;
		const int nb = min(chunk_blocks, KB - kb0);
		if (GROUPED && sl[sidx].e != e_cur) {
			e_cur = sl[sidx].e;
			Wg = reinterpret_cast<const uint8_t *>(o.w_tab[e_cur]);
		}
		const int s = r.s;
		mbar_wait(smem_u32(&r.empty[s]), r.ph ^ 1); // (a fresh barrier: returns at once)
		if (SPAN == 2)
			mbar_wait(smem_u32(&r.empty[s + 1]), r.ph ^ 1);
		if (lane == 0) {
			mbar_arrive_expect_tx(smem_u32(&r.full[s]), (uint32_t)(16 * nb * 128));
			if (SPAN == 2)
				mbar_arrive(smem_u32(&r.full[s + 1]));
		}
		__syncwarp();
		if (chunks == 1 && lane == 0) // the 16 rows, contiguous
			bulk_load_hint(r.stage0 + (uint32_t)(s * r.slot_bytes),
				       Wg + (size_t)tile * 16 * o.K, (uint32_t)(16 * o.K),
				       smem_u32(&r.full[s]), pol);
		else if (chunks > 1 && lane < 16)
			bulk_load_hint(r.stage0 + (uint32_t)(s * r.slot_bytes + lane * rs),
				       Wg + (size_t)(tile * 16 + lane) * o.K + (size_t)kb0 * 128,
				       (uint32_t)(nb * 128), smem_u32(&r.full[s]), pol);
		gv_ring_next<SPAN>(r);
	}
}

// The consumer warps: units [u0, u1) (see the top of the file). red: the two sets of the warps'
// unit sums; last_flag: the two sets' last-arrival flags; slot: the arrival counts' set. SRC:
// where X and SX are (kblock_load's KB_NC, KB_OWN: written by this grid, k_moe_gemv_block's down
// phase; KB_SMEM: one token's row in this block's shared memory, every slice's row the same).
template <bool GROUPED, int SPAN, int SRC = KB_NC>
__device__ __forceinline__ void gv_consume(const gv_op &o, const gv_geom &ge, const gv_slice *sl,
					   int u0, int u1, gv_ring &r, float *red, int *last_flag,
					   int slot, int warp, int lane, int stamp = -1)
{
	const int KB = ge.KB, K = o.K, N = o.N, M = o.M, chunks = o.chunks;
	const int chunk_blocks = o.chunk_blocks, rs = ge.rs;
	const int tiles = ge.tiles, per_slice = ge.per_slice;
	const int g = lane >> 2, t = lane & 3;
	const int row = threadIdx.x & 15, m = threadIdx.x >> 4; // the sums' (threads 0-127)
	const bool f32_out = o.flags & GV_F32;
	float tot = 0.f; // (row, m)'s chunks so far of the current tile
	int e_cur = -1;
	const float *Sg = o.S;
	// unit u's slice, tile and chunk, advanced a unit at a time (no division a unit)
	int sidx = u0 / per_slice, tile = u0 % per_slice / chunks, c = u0 % chunks;
	for (int u = u0; u < u1; u++, c = c + 1 < chunks ? c + 1 : 0,
		 tile = c ? tile : tile + 1 < tiles ? tile + 1 : 0, sidx += !c && !tile) {
		const int kb0 = c * chunk_blocks;
		const int nb = min(chunk_blocks, KB - kb0), n0 = tile * 16;
		const gv_slice sv = GROUPED ? sl[sidx] : gv_slice{0, 0, M, 0};
		if (GROUPED && sv.e != e_cur) {
			e_cur = sv.e;
			Sg = reinterpret_cast<const float *>(o.s_tab[e_cur]);
		}
		const float *s_row = Sg + (size_t)(n0 >> 7) * KB;
		const size_t r0 = SRC == KB_SMEM ? 0 : (size_t)sv.r0;
		const uint8_t *Xs = o.X + r0 * K;
		const float *SXs = o.SX + r0 * KB;
		float acc[4] = {0.f, 0.f, 0.f, 0.f};
		const int s = r.s;
		mbar_wait(smem_u32(&r.full[s]), r.ph);
		GV_STAMP(stamp >= 0 && u == u0 && threadIdx.x == 0, stamp); // (GV_TRACE: the first)
		const uint32_t st = r.stage0 + (uint32_t)(s * r.slot_bytes);
		// the warp's K blocks j = warp, warp + GV_CW, ...: two at a time, so that their MMA
		// chains (8 dependent MMAs each) overlap; promoted in order, the same sums
		int j = warp;
		for (; j + GV_CW < nb; j += 2 * GV_CW) {
			const wfrag a0 = gv_wfrag(st, rs, j), a1 = gv_wfrag(st, rs, j + GV_CW);
			kblock_tok t0, t1;
			kblock_load<SRC>(t0, Xs, SXs, sv.rows, K, kb0 + j, 0);
			kblock_load<SRC>(t1, Xs, SXs, sv.rows, K, kb0 + j + GV_CW, 0);
			const float w0 = s_row[kb0 + j], w1 = s_row[kb0 + j + GV_CW];
			float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
			mma_kblock(c0, a0, t0.b0, t0.b1);
			mma_kblock(c1, a1, t1.b0, t1.b1);
			kblock_promote_c(acc, c0, t0, w0);
			kblock_promote_c(acc, c1, t1, w1);
		}
		if (j < nb)
			kblock_promote<SRC>(acc, gv_wfrag(st, rs, j), Xs, SXs, sv.rows, K, kb0 + j, 0,
				       s_row[kb0 + j]);
		// this warp's reads of the stage are done (the arrival releases them)
		mbar_arrive_warp(smem_u32(&r.empty[s]), lane);
		if (SPAN == 2)
			mbar_arrive_warp(smem_u32(&r.empty[s + 1]), lane);
		gv_ring_next<SPAN>(r);
		const int set = u & 1;
		float *rd = red + (set * GV_CW + warp) * 128;
		rd[g * 8 + 2 * t] = acc[0];
		rd[g * 8 + 2 * t + 1] = acc[1];
		rd[(g + 8) * 8 + 2 * t] = acc[2];
		rd[(g + 8) * 8 + 2 * t + 1] = acc[3];
		// every warp's sums are in; the other set is free (its readers passed this barrier)
		named_bar_sync(1, GV_CW * 32);
		if (threadIdx.x >= 128)
			continue;
		float p = 0.f; // the chunk's partial
		for (int w = 0; w < GV_CW; w++)
			p += red[(set * GV_CW + w) * 128 + row * 8 + m];
		const int n = n0 + row, yr = sv.r0 + m; // output column, row
		const bool live = m < sv.rows;
		const int first = (sidx * tiles + tile) * chunks, end = first + chunks; // the tile's
		if (first >= u0 && end <= u1) { // the whole tile here: in registers
			tot = c == 0 ? 0.f + p : tot + p;
			if (c == chunks - 1 && live) {
				if (f32_out)
					o.partial[(size_t)yr * N + n] = tot;
				else
					o.Y[(size_t)yr * o.ldy + n] = f32_to_bf16(tot);
			}
			continue;
		}
		// split between blocks: the partial, and at this range's last unit of the tile the
		// arrival count; the block completing it sums every chunk in order
		if (live)
			o.partial[((size_t)c * M + yr) * N + n] = p;
		if (c != chunks - 1 && u != u1 - 1)
			continue;
		__threadfence();
		named_bar_sync(2, 128);
		if (threadIdx.x == 0) {
			const unsigned mine = (unsigned)(u + 1 - max(first, u0));
			unsigned *cnt = &gv_count[(size_t)slot * GV_TILES + sidx * tiles + tile];
			const int last = atomicAdd(cnt, mine) + mine == (unsigned)chunks;
			if (last)
				*cnt = 0; // every chunk has arrived: zero for the next GEMM
			last_flag[set] = last;
		}
		named_bar_sync(2, 128);
		if (!last_flag[set] || !live)
			continue;
		__threadfence();
		float sum = 0.f;
		for (int k = 0; k < chunks; k++)
			sum += __ldcg(&o.partial[((size_t)k * M + yr) * N + n]);
		if (f32_out) // (chunk 0's partial of this output, read above, is no longer needed)
			o.partial[(size_t)yr * N + n] = sum;
		else
			o.Y[(size_t)yr * o.ldy + n] = f32_to_bf16(sum);
	}
}

// (the dynamic shared memory)
extern __shared__ __align__(128) uint8_t smem[];

// shared memory of a block: the barriers (256 bytes), two sets of the warps' unit sums (8 KB),
// the last-arrival flags (128 bytes), the ring, then (GROUPED) the slices (GV_RED_OFF,
// GV_FLAG_OFF, GV_RING_OFF: gemv_layout.h)

// The ring's barriers, initialised by thread 0 (the caller syncs)
__device__ __forceinline__ gv_ring gv_ring_init(uint8_t *smem, int slot_bytes, int ns)
{
	gv_ring r;
	r.full = reinterpret_cast<uint64_t *>(smem);
	r.empty = r.full + GV_MAXSTAGES;
	r.stage0 = smem_u32(smem) + GV_RING_OFF;
	r.slot_bytes = slot_bytes, r.ns = ns, r.s = 0, r.ph = 0;
	if (threadIdx.x == 0) {
		for (int s = 0; s < ns; s++) {
			mbar_init(smem_u32(&r.full[s]), 1);
			mbar_init(smem_u32(&r.empty[s]), GV_CW);
		}
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
		asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
	}
	return r;
}

// this block's units [u0, u1) of U
__device__ __forceinline__ void gv_range(int U, int &u0, int &u1)
{
	u0 = (int)((long long)blockIdx.x * U / gridDim.x);
	u1 = (int)((long long)(blockIdx.x + 1) * U / gridDim.x);
}

template <bool GROUPED>
__device__ __forceinline__ void gemm_fp8_gemv(const gv_op &o, const int *__restrict__ off, int G,
					      int slice_cap, int ns, int slot)
{
	float *red = reinterpret_cast<float *>(smem + GV_RED_OFF); // [2][GV_CW][16 rows][8 tokens]
	int *last_flag = reinterpret_cast<int *>(smem + GV_FLAG_OFF); // [2]
	const gv_geom ge = gv_geom_of(o);
	gv_slice *sl = reinterpret_cast<gv_slice *>(smem + GV_RING_OFF + ns * ge.stage);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

	// the next kernel (launched with PDL) may start and load its constants now; it reads this
	// grid's outputs only after its griddepcontrol.wait (this grid complete). GROUPED without
	// GV_OFF_EARLY: only once the offsets' writer is complete (below), so that a kernel two
	// launches on may read them without a wait (GV_OFF_EARLY)
	const bool early = GROUPED && (o.flags & GV_OFF_EARLY);
	if (!GROUPED || early)
		asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	gv_ring r = gv_ring_init(smem, ge.stage, ns);
	int n_slices = 1;
	if (GROUPED) {
		if (!early) {
			asm volatile("griddepcontrol.wait;" ::: "memory"); // the offsets
			asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
		}
		n_slices = gv_build_slices(off, G, slice_cap, sl);
	}
	__syncthreads(); // the barriers initialised, the slices written

	int u0, u1;
	gv_range(n_slices * ge.per_slice, u0, u1);
	if (warp == GV_CW) {
		// the producer. Dense: no griddepcontrol.wait (the weights are constants)
		gv_produce<GROUPED, 1>(o, ge, sl, u0, u1, r, lane);
		return;
	}
	// the consumers: the tokens and their scales are the previous kernel's outputs, and y /
	// the partials may still be read by it (PDL)
	if (!GROUPED || early)
		asm volatile("griddepcontrol.wait;" ::: "memory");
	gv_consume<GROUPED, 1>(o, ge, sl, u0, u1, r, red, last_flag, slot, warp, lane);
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 1)
k_gemm_fp8_gemv(const uint8_t *W, const float *S, const uint8_t *X, const float *SX, uint16_t *Y,
		float *partial, int M, int N, int K, int ldy, int chunks, int chunk_blocks, int ns,
		int slot)
{
	const gv_op o = {W, S, nullptr, nullptr, X, SX, Y, partial, M, N, K, ldy, chunks,
			 chunk_blocks, 0};
	gemm_fp8_gemv<false>(o, nullptr, 0, 0, ns, slot);
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 1)
k_gemm_fp8_gemv_g(const unsigned long long *w_tab, const unsigned long long *s_tab,
		  const int *off, int G, int slice_cap, const uint8_t *X, const float *SX,
		  uint16_t *Y, float *partial, int max_rows, int N, int K, int ldy, int chunks,
		  int chunk_blocks, int ns, int slot, int flags)
{
	const gv_op o = {nullptr, nullptr, w_tab, s_tab, X, SX, Y, partial, max_rows, N, K, ldy,
			 chunks, chunk_blocks, flags};
	gemm_fp8_gemv<true>(o, off, G, slice_cap, ns, slot);
}

// ---- the MoE block of 1-3 tokens after its router, in one launch ------------------------------
// k_moe_gemv_block: what cuda_gemm_fp8_grouped_swiglu and cuda_gemm_fp8_grouped_combine do on
// this kernel (the gate|up GEMM's fp32 sums, k_gemm_stream_reduce_swiglu, the down GEMM's fp32
// sums, k_gemm_stream_reduce_combine: four launches), as four phases of one persistent grid
// (one block an SM, every block resident) meeting at grid-wide arrivals:
//   A  gate|up: the units of W13 (N = 2I, K = D in `chunks` chunks) into gu[chunk][row][2I]
//   S  SwiGLU + act_quant of gu[0] into h8 / hs (moe_epi_swiglu_group, a warp a group)
//   B  down: the units of W2 (N = D, K = I whole) into ey[row][D]
//   C  the combine into y (moe_epi_combine_at, a thread an output)
// gu and ey do not overlap: S reads gu and C ey through the L1, which must not hold a line
// from before the other blocks wrote it (the split tiles' sums read with ld.global.cg).
// The same units, sums and orders as the four launches: the same bits. Why: between the two
// GEMMs a block's ring drained and the next kernel's block refilled it from nothing; here the
// producer warp streams B's weights (constants) straight after A's, while the consumers finish A
// and pass S, so each SM's HBM stream runs on through the seam. A's stages (16 rows of
// chunk_blocks x 128 + 16 bytes) take two slots of the ring, B's (16 rows of I bytes, one
// contiguous copy) one where 16 I < A's stage <= 2 x 16 I (k_moe_gemv_block), else both one
// slot of the larger (k_moe_gemv_block1: small models).
// scores (not null, T = 1): the router before was k_moe_gate_logits1s (moe_block.cu: the logits,
// scores and quantised rows, no routing); each block routes the token itself (gv_route_one)
// instead of reading the offsets, ~2 us sooner than k_moe_gate_route1s's last block (s23): in
// k_moe_gemv_block / _block1 warp 0 after the griddepcontrol.wait, the shared expert's slice
// last; in the R1 forms (DSV32_CUDA_MOE_BLOCK_EARLY=1, model/cuda_moe.c) as below.
// R1 (k_moe_gemv_block_r1, k_moe_gemv_block1_r1; T = 1): the router before was
// k_moe_gate_logits1s (its quantised rows not read here), which sets *x_ready
// (a gv_xready flag, st.release) once past its griddepcontrol.wait: the token's row x (its
// input, the kernel before's output) is then complete. Each block's producer streams the shared
// expert's gate|up units (slice 0: known without the routing, the weights constants) from its
// start; its consumers wait for x_ready (ld.acquire), quantise x into shared memory (the
// router's gate1_quant_rows numbers: warp_act_quant128_regs) and compute those units while the
// router still runs; a routing warp waits for the router (griddepcontrol.wait), routes the token
// (gv_route_one: slices 1 .. K) and lets the producer and the consumers on to the routed
// experts. Block 0 sets *x_ready back to 0 after the first grid-wide arrival (every block has
// read it). HOLD (k_moe_gemv_block_r1h, _block1_r1h; DSV32_CUDA_MOE_BLOCK_EARLY=2): the
// producer too waits for x_ready before it streams (session 30: the R1 blocks, resident by PDL
// while the kernels before the router still run, streaming the shared expert's weights beside
// them cost the H200's model step ~6 us; held, the stream starts with the router).
// Without R1 the slices come from the offsets (the routing in the previous kernels), the shared
// expert (group G - 1) last.
// The grid-wide arrival: gv_gbar[slot] (the host's set, as gv_count's), each block adding 1 and
// block 0 0x80000000 - (grid - 1): its top bit flips when every block has arrived, and never
// needs a reset.
__device__ unsigned gv_gbar[GV_SLOTS];
// R1's x_ready flags (the host's set, as gv_gbar's; zero when the module loads)
__device__ unsigned gv_xready[GV_SLOTS];

// Every consumer thread of every block: the writes before it are seen by the reads after it
// (the block's writes ordered before thread 0's release by the CTA barrier; the others' reads
// after its acquire by the second)
__device__ __forceinline__ void gv_grid_sync(unsigned *bar)
{
	named_bar_sync(1, GV_CW * 32);
	if (threadIdx.x == 0) {
		const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
		unsigned old, now;
		asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;"
			     : "=r"(old)
			     : "l"(bar), "r"(add)
			     : "memory");
		do
			asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(bar) : "memory");
		while (((old ^ now) & 0x80000000u) == 0);
	}
	named_bar_sync(1, GV_CW * 32);
}

// One token's routing in each block of k_moe_gemv_block (after k_moe_gate_logits1s: its scores,
// no routing): warp 0 (R1: the routing warp) selects from scores fp32 [2][E] (moe_route_select256,
// E = 256 in 8 groups: k_moe_gate_route1s's last block's numbers) into idx_s / wts_s (shared)
// and writes the routed slices sl[0 .. K-1] (the K picks ascending, a row each at row n; the
// shared expert's, row K, is the caller's); block 0 also writes the routing, as that last block
// (idx, wts, counts, off, perm, src: moe_permute_one), read by the other blocks after the first
// grid-wide arrival.
__device__ __forceinline__ void gv_route_one(const float *scores, int E, int topk_group, int K,
					     int norm_topk_prob, float route_scale, int *idx,
					     float *wts, int *counts, int *off, int *perm, int *src,
					     gv_slice *sl, int *idx_s, float *wts_s, int lane)
{
	float sc[8], sel[8];
	moe_route_load256(scores, E, sc, sel, lane);
	const int pick = moe_route_select256(sc, sel, 0, topk_group, K, norm_topk_prob, route_scale,
					     idx_s, wts_s);
	__syncwarp();
	if (lane < K)
		sl[lane] = gv_slice{idx_s[lane], lane, 1, 0};
	if (blockIdx.x == 0) {
		if (lane < K)
			idx[lane] = idx_s[lane], wts[lane] = wts_s[lane];
		moe_permute_one(pick, K, E, counts, off, perm, src);
	}
}

// The consumers of R1: the token's row x (bf16 [D], complete: see above) quantised into xq (e4m3
// [D]) and sxq (fp32 [D / 128]) in shared memory, a warp a 128-column group; a warp's first
// GV_QROW groups loaded before any is quantised (one trip to L2, not one a group)
#define GV_QROW 8
__device__ __forceinline__ void gv_quant_group(uint2 raw, int gi, uint8_t *xq, float *sxq, int lane)
{
	const float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
			    __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u)};
	const float sc = warp_act_quant128_regs(v, xq + gi * 128, lane);
	if (lane == 0)
		sxq[gi] = sc;
}

__device__ __forceinline__ void gv_quant_row(const uint16_t *x, int D, uint8_t *xq, float *sxq,
					     int warp, int lane)
{
	const int ng = D / 128;
	uint2 raw[GV_QROW];
#pragma unroll
	for (int m = 0; m < GV_QROW; m++)
		if (warp + m * GV_CW < ng)
			raw[m] = __ldcg(reinterpret_cast<const uint2 *>(x + (warp + m * GV_CW) * 128) +
					lane);
#pragma unroll
	for (int m = 0; m < GV_QROW; m++)
		if (warp + m * GV_CW < ng)
			gv_quant_group(raw[m], warp + m * GV_CW, xq, sxq, lane);
	for (int gi = warp + GV_QROW * GV_CW; gi < ng; gi += GV_CW)
		gv_quant_group(__ldcg(reinterpret_cast<const uint2 *>(x + gi * 128) + lane), gi, xq,
			       sxq, lane);
}

// Until *flag is set (ld.acquire.gpu: what its setter wrote before setting it is then visible).
__device__ __forceinline__ void gv_wait_set(const unsigned *flag)
{
	unsigned v;
	do
		asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
	while (v == 0);
}

// SPAN_A: the slots a gate|up stage takes (2: the ring's slots are down's stages; 1: slots of
// the larger of the two stages, where gate|up's is not between 1 and 2 of down's). R1: one
// token routed here (above).
template <int SPAN_A, bool R1, bool HOLD = false>
__device__ __forceinline__ void
moe_gemv_block(const unsigned long long *w13_tab, const unsigned long long *s13_tab,
	       const unsigned long long *w2_tab, const unsigned long long *s2_tab, int *off,
	       int G, int slice_cap, const uint8_t *X, const float *SX, uint8_t *h8, float *hs,
	       float *gu, float *ey, uint16_t *y, float *wts, int *perm, int T, int topk,
	       int max_rows, int D, int I, int chunks, int chunk_blocks, int slot_bytes, int ns,
	       int slot, const float *scores, int *idx, int *counts, int *src, float route_scale,
	       int topk_group, int norm_topk_prob, const uint16_t *x, unsigned *x_ready)
{
	static_assert(R1 || !HOLD, "the stream held for x_ready: the R1 forms only");
	float *red = reinterpret_cast<float *>(smem + GV_RED_OFF);
	int *last_flag = reinterpret_cast<int *>(smem + GV_FLAG_OFF);
	gv_slice *sl = reinterpret_cast<gv_slice *>(smem + GV_RING_OFF + ns * slot_bytes);
	// R1: the routing warp's picks, then the token's quantised row (gemv_layout.h)
	int *pick_i = reinterpret_cast<int *>(sl + slice_cap);
	uint8_t *xq = reinterpret_cast<uint8_t *>(pick_i) + GV_R1_PICKS;
	float *sxq = reinterpret_cast<float *>(xq + D);
	const gv_op a = {nullptr, nullptr, w13_tab, s13_tab, R1 ? xq : X, R1 ? sxq : SX, nullptr,
			 gu, max_rows, 2 * I, D, 2 * I, chunks, chunk_blocks, GV_F32};
	const gv_op b = {nullptr, nullptr, w2_tab, s2_tab, h8, hs, nullptr, ey, max_rows, D, I, D,
			 1, I / 128, GV_F32};
	const gv_geom ga = gv_geom_of(a), gb = gv_geom_of(b);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int all = (GV_CW + 2) * 32; // R1: the block (named barrier 3: the routed slices)
	GV_STAMP(threadIdx.x == 0, 0);
	GV_STAMP_SM(threadIdx.x == 0);
	gv_ring r = gv_ring_init(smem, slot_bytes, ns);
	int n_slices = topk + 1;
	if (R1) {
		if (threadIdx.x == 0)
			sl[0] = gv_slice{G - 1, topk, 1, 0}; // the shared expert, row K
	} else {
		asm volatile("griddepcontrol.wait;" ::: "memory"); // the router's offsets and rows
		asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
		if (!scores) {
			n_slices = gv_build_slices(off, G, slice_cap, sl);
		} else if (warp == 0) { // its scores only (k_moe_gate_logits1s)
			gv_route_one(scores, G - 1, topk_group, topk, norm_topk_prob, route_scale, idx,
				     wts, counts, off, perm, src, sl, reinterpret_cast<int *>(red),
				     red + 32, lane);
			if (lane == 0)
				sl[topk] = gv_slice{G - 1, topk, 1, 0}; // the shared expert, row K
		}
	}
	__syncthreads(); // the barriers initialised, the slices (R1: the shared one) written
	GV_STAMP(!R1 && threadIdx.x == 0, 1);

	// gate|up's units: R1 the shared expert's [a0, a1) (its units split over the blocks), then
	// the routed [c0, c1): the rest of the block's share [t0, t1) of them all (c0 = P + t0 - a0,
	// c1 = P + t1 - a1 for P = per_slice, contiguous and ascending in the block: the integers in
	// (b U / G, (b + 1) U / G] are at least those in (b P / G, (b + 1) P / G] for U = (K + 1) P),
	// so a block streams as many units as without the split; else all of them [a0, a1)
	int a0, a1, c0 = 0, c1 = 0, b0, b1;
	gv_range((R1 ? 1 : n_slices) * ga.per_slice, a0, a1);
	if (R1) {
		int t0, t1;
		gv_range(n_slices * ga.per_slice, t0, t1);
		c0 = ga.per_slice + t0 - a0, c1 = ga.per_slice + t1 - a1;
	}
	gv_range(n_slices * gb.per_slice, b0, b1);
	if (warp == GV_CW) {
		if (HOLD) { // x complete (the router past its wait) before the first copy
			if (lane == 0)
				gv_wait_set(x_ready);
			__syncwarp();
		}
		gv_produce<true, SPAN_A>(a, ga, sl, a0, a1, r, lane);
		if (R1) {
			named_bar_sync(3, all); // the routed slices
			gv_produce<true, SPAN_A>(a, ga, sl, c0, c1, r, lane);
		}
		GV_STAMP(lane == 0, 11);
		gv_produce<true, 1>(b, gb, sl, b0, b1, r, lane);
		GV_STAMP(lane == 0, 12);
		return;
	}
	if (R1 && warp == GV_CW + 1) { // the routing warp
		asm volatile("griddepcontrol.wait;" ::: "memory"); // the router's scores
		asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
		gv_route_one(scores, G - 1, topk_group, topk, norm_topk_prob, route_scale, idx, wts,
			     counts, off, perm, src, sl + 1, pick_i,
			     reinterpret_cast<float *>(pick_i) + 32, lane);
		__threadfence(); // (block 0: the routing before the consumers' first arrival)
		__syncwarp();
		GV_STAMP(lane == 0, 1);
		asm volatile("bar.arrive 3, %0;" ::"r"(all) : "memory");
		return;
	}
	if (R1) {
		if (threadIdx.x == 0) // x complete (the router past its wait)
			gv_wait_set(x_ready);
		named_bar_sync(1, GV_CW * 32);
		gv_quant_row(x, D, xq, sxq, warp, lane);
		named_bar_sync(1, GV_CW * 32);
		GV_STAMP(threadIdx.x == 0, 13);
		gv_consume<true, SPAN_A, KB_SMEM>(a, ga, sl, a0, a1, r, red, last_flag, slot, warp,
						  lane, 2);
		GV_STAMP(threadIdx.x == 0, 14);
		named_bar_sync(3, all); // the routed slices
		gv_consume<true, SPAN_A, KB_SMEM>(a, ga, sl, c0, c1, r, red, last_flag, slot, warp,
						  lane);
	} else {
		gv_consume<true, SPAN_A>(a, ga, sl, a0, a1, r, red, last_flag, slot, warp, lane, 2);
	}
	GV_STAMP(threadIdx.x == 0, 3);
	gv_grid_sync(&gv_gbar[slot]);
	GV_STAMP(threadIdx.x == 0, 4);
	if (R1 && blockIdx.x == 0 && threadIdx.x == 0)
		*x_ready = 0; // (every block read it before the arrival)
	// S: the rows R + T = off[G] of h, a warp a (row, 128 columns) group
	const long long groups = (long long)__ldcg(&off[G]) * (I / 128);
	for (long long grp = (long long)blockIdx.x * GV_CW + warp; grp < groups;
	     grp += (long long)gridDim.x * GV_CW)
		moe_epi_swiglu_group(gu, h8, hs, 1, 0, grp, I, lane);
	GV_STAMP(threadIdx.x == 0, 5);
	gv_grid_sync(&gv_gbar[slot]);
	GV_STAMP(threadIdx.x == 0, 6);
	gv_consume<true, 1, KB_OWN>(b, gb, sl, b0, b1, r, red, last_flag, slot, warp, lane, 7);
	GV_STAMP(threadIdx.x == 0, 8);
	gv_grid_sync(&gv_gbar[slot]);
	GV_STAMP(threadIdx.x == 0, 9);
	// C: y[t, d], a thread an output
	const long long total = (long long)T * D;
	for (long long i = (long long)blockIdx.x * (GV_CW * 32) + threadIdx.x; i < total;
	     i += (long long)gridDim.x * (GV_CW * 32))
		y[i] = moe_epi_combine_at(ey, wts, perm, 1, 0, D, T, topk, i);
	GV_STAMP(threadIdx.x == 0, 10);
}

#define MOE_GEMV_BLOCK_ARGS                                                                    \
	const unsigned long long *w13_tab, const unsigned long long *s13_tab,                \
		const unsigned long long *w2_tab, const unsigned long long *s2_tab, int *off, \
		int G, int slice_cap, const uint8_t *X, const float *SX, uint8_t *h8,        \
		float *hs, float *gu, float *ey, uint16_t *y, float *wts, int *perm, int T,  \
		int topk, int max_rows, int D, int I, int chunks, int chunk_blocks,          \
		int slot_bytes, int ns, int slot, const float *scores, int *idx,             \
		int *counts, int *src, float route_scale, int topk_group, int norm_topk_prob, \
		const uint16_t *x, unsigned *x_ready
#define MOE_GEMV_BLOCK_PASS                                                                     \
	w13_tab, s13_tab, w2_tab, s2_tab, off, G, slice_cap, X, SX, h8, hs, gu, ey, y, wts,    \
		perm, T, topk, max_rows, D, I, chunks, chunk_blocks, slot_bytes, ns, slot,     \
		scores, idx, counts, src, route_scale, topk_group, norm_topk_prob, x, x_ready

extern "C" __global__ void __launch_bounds__(GV_THREADS, 1) k_moe_gemv_block(MOE_GEMV_BLOCK_ARGS)
{
	moe_gemv_block<2, false>(MOE_GEMV_BLOCK_PASS);
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 1) k_moe_gemv_block1(MOE_GEMV_BLOCK_ARGS)
{
	moe_gemv_block<1, false>(MOE_GEMV_BLOCK_PASS);
}

extern "C" __global__ void __launch_bounds__(GV_R1_THREADS, 1)
k_moe_gemv_block_r1(MOE_GEMV_BLOCK_ARGS)
{
	moe_gemv_block<2, true>(MOE_GEMV_BLOCK_PASS);
}

extern "C" __global__ void __launch_bounds__(GV_R1_THREADS, 1)
k_moe_gemv_block1_r1(MOE_GEMV_BLOCK_ARGS)
{
	moe_gemv_block<1, true>(MOE_GEMV_BLOCK_PASS);
}

extern "C" __global__ void __launch_bounds__(GV_R1_THREADS, 1)
k_moe_gemv_block_r1h(MOE_GEMV_BLOCK_ARGS)
{
	moe_gemv_block<2, true, true>(MOE_GEMV_BLOCK_PASS);
}

extern "C" __global__ void __launch_bounds__(GV_R1_THREADS, 1)
k_moe_gemv_block1_r1h(MOE_GEMV_BLOCK_ARGS)
{
	moe_gemv_block<1, true, true>(MOE_GEMV_BLOCK_PASS);
}
