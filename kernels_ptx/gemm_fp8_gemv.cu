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
#include "mma.cuh"
#include "scan.cuh"
#include "tma.cuh"

#define GV_CW 8		 // consumer warps
#define GV_THREADS ((GV_CW + 1) * 32)
#define GV_MAXSTAGES 16	 // the barriers' room (256 bytes)
#define GV_SLOTS 16	 // arrival-count sets, taken in turn by the host's launches
#define GV_TILES 16384	 // (slice, 16-row tile) pairs a set counts

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

template <bool GROUPED>
__device__ __forceinline__ void
gemm_fp8_gemv(const uint8_t *__restrict__ W, const float *__restrict__ S,
	      const unsigned long long *__restrict__ w_tab, const unsigned long long *__restrict__ s_tab,
	      const int *__restrict__ off, int G, int slice_cap, const uint8_t *__restrict__ X,
	      const float *__restrict__ SX, uint16_t *__restrict__ Y, float *__restrict__ partial,
	      int M, int N, int K, int ldy, int chunks, int chunk_blocks, int ns, int slot, int flags)
{
	// shared memory: the barriers (256 bytes), two sets of the warps' unit sums (8 KB), the
	// last-arrival flags (128 bytes), the stages of 16 x rs bytes, then (GROUPED) the slices
	extern __shared__ __align__(128) uint8_t smem[];
	uint64_t *full = reinterpret_cast<uint64_t *>(smem);
	uint64_t *empty = full + GV_MAXSTAGES;
	float *red = reinterpret_cast<float *>(smem + 256); // [2][GV_CW][16 rows][8 tokens]
	int *last_flag = reinterpret_cast<int *>(smem + 256 + 2 * GV_CW * 128 * 4); // [2]
	const uint32_t stage0 = smem_u32(smem) + 256 + 2 * GV_CW * 128 * 4 + 128;
	const int KB = K >> 7, rs = chunks == 1 ? K : chunk_blocks * 128 + 16, stage_bytes = 16 * rs;
	gv_slice *sl = reinterpret_cast<gv_slice *>(smem + 256 + 2 * GV_CW * 128 * 4 + 128 +
						      ns * stage_bytes);
	const int tiles = N >> 4, per_slice = tiles * chunks;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

	// the next kernel (launched with PDL) may start and load its constants now; it reads this
	// grid's outputs only after its griddepcontrol.wait (this grid complete). GROUPED without
	// GV_OFF_EARLY: only once the offsets' writer is complete (below), so that a kernel two
	// launches on may read them without a wait (GV_OFF_EARLY)
	const bool early = GROUPED && (flags & GV_OFF_EARLY);
	if (!GROUPED || early)
		asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	if (threadIdx.x == 0) {
		for (int s = 0; s < ns; s++) {
			mbar_init(smem_u32(&full[s]), 1);
			mbar_init(smem_u32(&empty[s]), GV_CW);
		}
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
		asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
	}
	int n_slices = 1;
	if (GROUPED) {
		if (!early) {
			asm volatile("griddepcontrol.wait;" ::: "memory"); // the offsets
			asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
		}
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
		n_slices = min(base, slice_cap);
	}
	__syncthreads(); // the barriers initialised, the slices written

	// this block's units [u0, u1) of slice * per_slice + tile * chunks + chunk
	const int units = n_slices * per_slice;
	const int u0 = (int)((long long)blockIdx.x * units / gridDim.x);
	const int u1 = (int)((long long)(blockIdx.x + 1) * units / gridDim.x);

	if (warp == GV_CW) {
		// ---- producer: the units' weight rows, ns stages ahead. Dense: no
		// griddepcontrol.wait (it reads only the weights, constants, and writes only this
		// block's shared memory) ----
		const uint64_t pol = l2_evict_first();
		int s = 0, e_cur = -1;
		uint32_t ph = 0;
		const uint8_t *Wg = W;
		for (int u = u0; u < u1; u++) {
			const int sidx = u / per_slice, rest = u % per_slice;
			const int tile = rest / chunks, kb0 = (rest % chunks) * chunk_blocks;
			const int nb = min(chunk_blocks, KB - kb0);
			if (GROUPED && sl[sidx].e != e_cur) {
				e_cur = sl[sidx].e;
				Wg = reinterpret_cast<const uint8_t *>(w_tab[e_cur]);
			}
			mbar_wait(smem_u32(&empty[s]), ph ^ 1); // (a fresh barrier: returns at once)
			if (lane == 0)
				mbar_arrive_expect_tx(smem_u32(&full[s]), (uint32_t)(16 * nb * 128));
			__syncwarp();
			if (chunks == 1 && lane == 0) // the 16 rows, contiguous
				bulk_load_hint(stage0 + (uint32_t)(s * stage_bytes),
					       Wg + (size_t)tile * 16 * K, (uint32_t)(16 * K),
					       smem_u32(&full[s]), pol);
			else if (chunks > 1 && lane < 16)
				bulk_load_hint(stage0 + (uint32_t)(s * stage_bytes + lane * rs),
					       Wg + (size_t)(tile * 16 + lane) * K + (size_t)kb0 * 128,
					       (uint32_t)(nb * 128), smem_u32(&full[s]), pol);
			if (++s == ns)
				s = 0, ph ^= 1;
		}
		return;
	}

	// ---- consumers ----
	// the tokens and their scales are the previous kernel's outputs, and y / the partials may
	// still be read by it (PDL)
	if (!GROUPED || early)
		asm volatile("griddepcontrol.wait;" ::: "memory");
	const int g = lane >> 2, t = lane & 3;
	const int row = threadIdx.x & 15, m = threadIdx.x >> 4; // the sums' (threads 0-127)
	const bool f32_out = flags & GV_F32;
	float tot = 0.f; // (row, m)'s chunks so far of the current tile
	int s = 0, e_cur = -1;
	uint32_t ph = 0;
	const float *Sg = S;
	// unit u's slice, tile and chunk, advanced a unit at a time (no division a unit)
	int sidx = u0 / per_slice, tile = u0 % per_slice / chunks, c = u0 % chunks;
	for (int u = u0; u < u1; u++, c = c + 1 < chunks ? c + 1 : 0,
		 tile = c ? tile : tile + 1 < tiles ? tile + 1 : 0, sidx += !c && !tile) {
		const int kb0 = c * chunk_blocks;
		const int nb = min(chunk_blocks, KB - kb0), n0 = tile * 16;
		const gv_slice sv = GROUPED ? sl[sidx] : gv_slice{0, 0, M, 0};
		if (GROUPED && sv.e != e_cur) {
			e_cur = sv.e;
			Sg = reinterpret_cast<const float *>(s_tab[e_cur]);
		}
		const float *s_row = Sg + (size_t)(n0 >> 7) * KB;
		const uint8_t *Xs = X + (size_t)sv.r0 * K;
		const float *SXs = SX + (size_t)sv.r0 * KB;
		float acc[4] = {0.f, 0.f, 0.f, 0.f};
		mbar_wait(smem_u32(&full[s]), ph);
		const uint32_t st = stage0 + (uint32_t)(s * stage_bytes);
		// the warp's K blocks j = warp, warp + GV_CW, ...: two at a time, so that their MMA
		// chains (8 dependent MMAs each) overlap; promoted in order, the same sums
		int j = warp;
		for (; j + GV_CW < nb; j += 2 * GV_CW) {
			const wfrag a0 = gv_wfrag(st, rs, j), a1 = gv_wfrag(st, rs, j + GV_CW);
			kblock_tok t0, t1;
			kblock_load(t0, Xs, SXs, sv.rows, K, kb0 + j, 0);
			kblock_load(t1, Xs, SXs, sv.rows, K, kb0 + j + GV_CW, 0);
			const float w0 = s_row[kb0 + j], w1 = s_row[kb0 + j + GV_CW];
			float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
			mma_kblock(c0, a0, t0.b0, t0.b1);
			mma_kblock(c1, a1, t1.b0, t1.b1);
			kblock_promote_c(acc, c0, t0, w0);
			kblock_promote_c(acc, c1, t1, w1);
		}
		if (j < nb)
			kblock_promote(acc, gv_wfrag(st, rs, j), Xs, SXs, sv.rows, K, kb0 + j, 0,
				       s_row[kb0 + j]);
		// this warp's reads of the stage are done (the arrival releases them)
		mbar_arrive_warp(smem_u32(&empty[s]), lane);
		if (++s == ns)
			s = 0, ph ^= 1;
		const int set = u & 1;
		float *r = red + (set * GV_CW + warp) * 128;
		r[g * 8 + 2 * t] = acc[0];
		r[g * 8 + 2 * t + 1] = acc[1];
		r[(g + 8) * 8 + 2 * t] = acc[2];
		r[(g + 8) * 8 + 2 * t + 1] = acc[3];
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
					partial[(size_t)yr * N + n] = tot;
				else
					Y[(size_t)yr * ldy + n] = f32_to_bf16(tot);
			}
			continue;
		}
		// split between blocks: the partial, and at this range's last unit of the tile the
		// arrival count; the block completing it sums every chunk in order
		if (live)
			partial[((size_t)c * M + yr) * N + n] = p;
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
			sum += __ldcg(&partial[((size_t)k * M + yr) * N + n]);
		if (f32_out) // (chunk 0's partial of this output, read above, is no longer needed)
			partial[(size_t)yr * N + n] = sum;
		else
			Y[(size_t)yr * ldy + n] = f32_to_bf16(sum);
	}
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 1)
k_gemm_fp8_gemv(const uint8_t *W, const float *S, const uint8_t *X, const float *SX, uint16_t *Y,
		float *partial, int M, int N, int K, int ldy, int chunks, int chunk_blocks, int ns,
		int slot)
{
	gemm_fp8_gemv<false>(W, S, nullptr, nullptr, nullptr, 0, 0, X, SX, Y, partial, M, N, K, ldy,
			     chunks, chunk_blocks, ns, slot, 0);
}

extern "C" __global__ void __launch_bounds__(GV_THREADS, 1)
k_gemm_fp8_gemv_g(const unsigned long long *w_tab, const unsigned long long *s_tab,
		  const int *off, int G, int slice_cap, const uint8_t *X, const float *SX,
		  uint16_t *Y, float *partial, int max_rows, int N, int K, int ldy, int chunks,
		  int chunk_blocks, int ns, int slot, int flags)
{
	gemm_fp8_gemv<true>(nullptr, nullptr, w_tab, s_tab, off, G, slice_cap, X, SX, Y, partial,
			    max_rows, N, K, ldy, chunks, chunk_blocks, ns, slot, flags);
}
