// indexer.cu — lightning-indexer scores over the paged FP8 key cache (spec §3.6 step 8):
//   I[b, s] = k_s[s] * Σ_h ReLU( q8[b, h, :] · k8[s, :] ) * w[b, h]      for s < n[b]
//   I[b, s] = -inf                                                          for n[b] <= s < ld
// q8 e4m3 [B, H, 128] (H <= 64), w fp32 [B, H] (the folded head weights w'), keys from the
// layer's indexer pages (page p at pool + p * page_bytes: 64 x 128 e4m3 codes, then 64 fp32
// scales; spec §6.2), block_table int [B, max_blocks] page ids, n int [B] causal key counts
// (pos + 1), scores fp32 [B, ld] (ld >= n; one block column covers 256 keys).
//
// Arithmetic: the e4m3 codes are converted to fp16 (exact: every e4m3 value is an fp16 value)
// and multiplied on the tensor cores with fp32 accumulation (mma m16n8k16), so each dot is
// exact products summed in fp32 — the CPU's semantics up to the order of the fp32 additions.
// (k_indexer_scores_fp8 below computes the same products on the same fp16 MMAs, faster.)
//
// Layout: block = 4 warps = 256 keys (4 pages) of one query row; warp w owns head tile w (heads
// 16w .. 16w+15) with its Q fragments in registers (fp16, zero beyond H), runs over all 256 keys,
// and leaves per-key partial sums in shared memory; the four tiles are added in a fixed order.
// D order: lane (g, t) loads bytes [32t, 32t+32) of key g of an 8-key group; MMA step s uses
// bytes 4s..4s+3 of those for B and the same columns of Q for A — one permutation of the dot
// index for both operands.
#include "common.cuh"
#include "gemm_fp8_f16.cuh"
#include "mma.cuh"

#define IDX_HEADS 64
#define IDX_D 128

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t v)
{
	uint32_t r;
	asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
	return r;
}

extern "C" __global__ void __launch_bounds__(128)
k_indexer_scores(const uint8_t *__restrict__ q8, const float *__restrict__ w, int H,
		 const uint8_t *__restrict__ pool, long long page_bytes,
		 const int *__restrict__ block_table, int max_blocks, const int *__restrict__ n_keys,
		 float *__restrict__ scores, int ld)
{
	__shared__ float part[4][256]; // per head tile (warp), per key of the block: Σ ReLU(.)·w
	const int b = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int g = lane >> 2, t = lane & 3;
	const int n = n_keys[b];
	const int key_base = blockIdx.x * 256;
	float *out = scores + (size_t)b * ld;
	if (key_base >= n) { // the whole block is past the causal limit
		for (int i = threadIdx.x; i < 256; i += blockDim.x)
			if (key_base + i < ld)
				out[key_base + i] = -INFINITY;
		return;
	}
	// this warp's head tile: heads 16*warp .. +15; its A fragments (Q as fp16) in registers for
	// all 8 MMA steps, in the same D permutation as the keys below (rows >= H are zero)
	const int h0 = warp * 16 + g;
	const uint16_t *qb = reinterpret_cast<const uint16_t *>(q8 + (size_t)b * H * IDX_D);
	uint32_t qa[8][4];
#pragma unroll
	for (int s = 0; s < 8; s++) {
		const int col = 16 * t + 2 * s; // e4m3 pair index of d = 32t + 4s
		qa[s][0] = h0 < H ? e4m3x2_to_f16x2(qb[(size_t)h0 * (IDX_D / 2) + col]) : 0u;
		qa[s][1] = h0 + 8 < H ? e4m3x2_to_f16x2(qb[(size_t)(h0 + 8) * (IDX_D / 2) + col]) : 0u;
		qa[s][2] = h0 < H ? e4m3x2_to_f16x2(qb[(size_t)h0 * (IDX_D / 2) + col + 1]) : 0u;
		qa[s][3] = h0 + 8 < H ? e4m3x2_to_f16x2(qb[(size_t)(h0 + 8) * (IDX_D / 2) + col + 1]) : 0u;
	}
	const float w_lo = h0 < H ? w[(size_t)b * H + h0] : 0.f;
	const float w_hi = h0 + 8 < H ? w[(size_t)b * H + h0 + 8] : 0.f;

	for (int pgi = 0; pgi < 4; pgi++) { // the block's 4 pages, 64 keys each
		const int key0 = key_base + pgi * 64;
		if (key0 >= n)
			break;
		const int page = block_table[(size_t)b * max_blocks + key0 / 64];
		const uint8_t *pg = pool + (size_t)page * page_bytes;
		for (int o = 0; o < 8; o++) { // 8 keys at a time
			const uint8_t *kp = pg + (size_t)(o * 8 + g) * IDX_D + 32 * t;
			const uint4 k0 = *reinterpret_cast<const uint4 *>(kp);
			const uint4 k1 = *reinterpret_cast<const uint4 *>(kp + 16);
			const uint32_t kw[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
			float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
			for (int s = 0; s < 8; s++)
				mma_f16_16816(c, qa[s][0], qa[s][1], qa[s][2], qa[s][3],
					e4m3x2_to_f16x2((uint16_t)(kw[s] & 0xffff)),
					e4m3x2_to_f16x2((uint16_t)(kw[s] >> 16)));
			// c0, c1: head h0, keys 2t, 2t+1; c2, c3: head h0 + 8
			float p0 = fmaxf(c[0], 0.f) * w_lo + fmaxf(c[2], 0.f) * w_hi;
			float p1 = fmaxf(c[1], 0.f) * w_lo + fmaxf(c[3], 0.f) * w_hi;
#pragma unroll
			for (int m = 4; m < 32; m <<= 1) { // the 8 lanes sharing t hold the tile's heads
				p0 += __shfl_xor_sync(0xffffffffu, p0, m);
				p1 += __shfl_xor_sync(0xffffffffu, p1, m);
			}
			if (g == 0) {
				part[warp][pgi * 64 + o * 8 + 2 * t] = p0;
				part[warp][pgi * 64 + o * 8 + 2 * t + 1] = p1;
			}
		}
	}
	__syncthreads(); // every head tile's partial sums are in shared memory
	for (int i = threadIdx.x; i < 256; i += blockDim.x) {
		const int s = key_base + i;
		if (s >= ld)
			continue;
		if (s >= n) {
			out[s] = -INFINITY;
			continue;
		}
		const int page = block_table[(size_t)b * max_blocks + s / 64];
		const float ks = *reinterpret_cast<const float *>(pool + (size_t)page * page_bytes +
								  64 * IDX_D + (s & 63) * 4);
		out[s] = ((part[0][i] + part[1][i]) + (part[2][i] + part[3][i])) * ks;
	}
}

// ---- k_indexer_scores_fp8: the same scores on FP8 data ------------------------------------------
//
// Same arguments and output as k_indexer_scores, plus keys_per_warp (a multiple of 16, chosen by
// cuda_indexer_scores so that small batches still spread over every SM: at batch 1 x 32K, 16 keys
// a warp -> 512 blocks instead of 32 blocks of 256-key warps, which ran 16 dependent copy rounds
// each and sat at 15 us whatever the context). Grid (ceil(ld / (4 kpw)), B), 128 threads, 3
// blocks an SM (168 registers): warp w of a block owns keys [4 kpw bx + kpw w, +kpw) in groups of
// 16. Each warp streams its groups (the 16 keys' codes and their 16 fp32 scales) through a
// 4-stage cp.async ring in shared memory, 3 groups in flight while one multiplies; its page ids
// sit in lane registers (lane i: its (i+1)-th page), so issuing a copy needs no dependent load.
// (Batch 1 at 128K / 32K runs ~11.0 / 5.7 us in bench attention, ~2.4 TB/s past the launch;
// these were measured and removed: run 25 Q converted to fp16 once and held in registers (no
// conversions of Q a group) 10.97 / 5.99; run 26 8-stage rings (7 groups a warp in flight)
// 11.69 / 6.19; run 27 the 8 head tiles' MMA chains interleaved 11.16 / 5.66 (5.22 against
// 5.92 at 8K only); none moved the step in bench model --ab. Not the conversions, not the copies
// in flight, not the MMA chains: the bound is still open.)
// Keys are the A operand (16 keys), Q the B operand (8 heads a tile; tiles 0-3 held in registers
// as e4m3, 4-7 read from the block's copy in shared memory for each group), so one warp covers all
// 64 heads of its keys and the head sum stays inside the warp.
// The products: sm_90 has no e4m3 mma.sync (ptxas lowers one m16n8k32 e4m3 to 12 e4m3 -> f16
// conversions and two fp16 MMAs, run 5's 2.27 TB/s at 128K x 128 fits that conversion rate), so
// the keys are converted to fp16 once per group for all 8 head tiles (gemm_fp8_f16.cuh: wfrag) and
// each head tile's q words on use (mma_kblock): 32 + 128 conversions a group instead of 384.
// C[key][head] -> ReLU -> x w'[head] -> summed over the 8 head tiles in registers and over the
// quad by two shuffles, then x s_k. D order: lane (g, t) holds bytes [32t, 32t+32) of keys g and
// g+8; k16-step s uses its bytes 4s..4s+3 (gemm_fp8_f16.cuh's word layout) and the same bytes of
// each head's q for B — one permutation of the dot index for both operands.
// Numerics: e4m3 -> fp16 is exact, each 128-term dot is 8 chained fp16 k16 MMAs of exact products
// with fp32 accumulation (the arithmetic the lowered e4m3 MMA did; run 3 measured it within 2^-23
// of Σ|products|), so the scores meet the same limit as k_indexer_scores; ReLU, weights, the head
// sum and s_k in fp32 (spec §3.6 step 8). page_bytes % 16 == 0 (16-byte copies).
#define IDX8_NST 4     // stages of a warp's cp.async ring (16 keys each)
#define IDX8_ROW 144   // bytes per key row in the ring (128 + 16: the 8 lanes of a phase hit 8 slots)
#define IDX8_STAGE (16 * IDX8_ROW + 64) // 16 key rows, then their 16 fp32 scales
#define IDX8_QREG 4  // head tiles whose Q fragments stay in registers

extern "C" __global__ void __launch_bounds__(128, 3)
k_indexer_scores_fp8(const uint8_t *__restrict__ q8, const float *__restrict__ w, int H,
		     const uint8_t *__restrict__ pool, long long page_bytes,
		     const int *__restrict__ block_table, int max_blocks,
		     const int *__restrict__ n_keys, float *__restrict__ scores, int ld, int keys_per_warp)
{
	__shared__ __align__(16) uint8_t ring[4][IDX8_NST][IDX8_STAGE];
	__shared__ __align__(8) float wsh[IDX_HEADS];                 // the row's head weights
	__shared__ __align__(16) uint8_t qsh[IDX_HEADS * IDX8_ROW];     // its q8 rows (padded)
	const int b = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	if (threadIdx.x < IDX_HEADS)
		wsh[threadIdx.x] = (int)threadIdx.x < H ? w[(size_t)b * H + threadIdx.x] : 0.f;
	for (int i = threadIdx.x; i < IDX_HEADS * 8; i += blockDim.x) { // 16-byte chunks, 0 beyond H
		const int h = i >> 3, c = i & 7;
		uint4 v = make_uint4(0, 0, 0, 0);
		if (h < H)
			v = *reinterpret_cast<const uint4 *>(q8 + ((size_t)b * H + h) * IDX_D + 16 * c);
		*reinterpret_cast<uint4 *>(qsh + h * IDX8_ROW + 16 * c) = v;
	}
	const int g = lane >> 2, t = lane & 3;
	const int n = n_keys[b];
	const int kbeg = (blockIdx.x * 4 + warp) * keys_per_warp;
	const int kend = min(ld, kbeg + keys_per_warp);
	const int kval = min(kend, n); // keys [kbeg, kval) are scored, [kval, kend) are -inf
	const int *btr = block_table + (size_t)b * max_blocks;
	// the warp's page ids: lane i holds page (kbeg >> 6) + i (keys_per_warp <= 1024: <= 17 pages),
	// every page of [kbeg, kend) the row's table has, read beside n instead of after it (only
	// those of keys below n are used)
	const int pg = (kbeg >> 6) + lane;
	const int pid = kbeg < kend && pg <= ((kend - 1) >> 6) && pg < max_blocks ? __ldg(btr + pg) : 0;
	__syncthreads(); // weights and q visible (before any warp returns)
	// the top-k (launched with programmatic stream serialisation, cuda_attn.c) may start its
	// blocks once every block of this grid is here; it waits for this grid's completion itself
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	float *out = scores + (size_t)b * ld;
	for (int s = max(kbeg, kval) + lane; s < kend; s += 32)
		out[s] = -INFINITY;
	if (kbeg >= kval)
		return;
	// Q as B of head tile j: head 8j + g, bytes [32t, 32t+32); tiles 0-3 in registers, 4-7 read
	// from shared memory per group (all 8 in registers spill even at 168 registers)
	uint32_t qf[IDX8_QREG][8];
#pragma unroll
	for (int j = 0; j < IDX8_QREG; j++) {
		const uint4 q0 = *reinterpret_cast<const uint4 *>(qsh + (8 * j + g) * IDX8_ROW + 32 * t);
		const uint4 q1 = *reinterpret_cast<const uint4 *>(qsh + (8 * j + g) * IDX8_ROW + 32 * t + 16);
		qf[j][0] = q0.x, qf[j][1] = q0.y, qf[j][2] = q0.z, qf[j][3] = q0.w;
		qf[j][4] = q1.x, qf[j][5] = q1.y, qf[j][6] = q1.z, qf[j][7] = q1.w;
	}
	const int ngr = (kval - kbeg + 15) / 16;
	// issue the copy of group gi (16 keys x 128 B = 128 chunks of 16 B, 4 a lane; lanes 0-3 also
	// the 64 bytes of the 16 scales) into its stage; always one commit, so the group count stays
	// in step. Every lane calls it (the page id comes by shuffle).
	auto issue = [&](int gi) {
		const int k0 = kbeg + 16 * gi;
		const int page = __shfl_sync(0xffffffffu, pid, ((k0 >> 6) - (kbeg >> 6)) & 31);
		if (gi < ngr) {
			const uint8_t *pg = pool + (size_t)page * page_bytes;
			const uint8_t *kp = pg + (size_t)(k0 & 63) * IDX_D;
			uint8_t *st = ring[warp][gi % IDX8_NST];
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const int c = lane + 32 * i, key = c >> 3, off = (c & 7) * 16;
				cp_async16(smem_u32(st + key * IDX8_ROW + off), kp + key * IDX_D + off);
			}
			if (lane < 4)
				cp_async16(smem_u32(st + 16 * IDX8_ROW + 16 * lane), pg + 64 * IDX_D + (k0 & 63) * 4 + 16 * lane);
		}
		cp_async_commit();
	};
#pragma unroll
	for (int i = 0; i < IDX8_NST - 1; i++)
		issue(i);
	for (int gi = 0; gi < ngr; gi++) {
		issue(gi + IDX8_NST - 1);
		cp_async_wait_group<IDX8_NST - 1>();
		__syncwarp(); // every lane's part of group gi is in the ring
		const uint8_t *st = ring[warp][gi % IDX8_NST];
		const uint4 lo0 = *reinterpret_cast<const uint4 *>(st + g * IDX8_ROW + 32 * t);
		const uint4 lo1 = *reinterpret_cast<const uint4 *>(st + g * IDX8_ROW + 32 * t + 16);
		const uint4 hi0 = *reinterpret_cast<const uint4 *>(st + (g + 8) * IDX8_ROW + 32 * t);
		const uint4 hi1 = *reinterpret_cast<const uint4 *>(st + (g + 8) * IDX8_ROW + 32 * t + 16);
		// the 16 keys as fp16 A fragments, converted once for all 8 head tiles (gemm_fp8_f16.cuh:
		// sm_90 lowers an e4m3 mma.sync to these conversions and two fp16 MMAs, every time)
		wfrag kf;
		wfrag_cvt(kf, lo0, lo1, hi0, hi1);
		// head tile j: its 8 chained fp16 k16 steps, then ReLU x w' into the key sums at once (4
		// accumulators live, not 32)
		float p_lo = 0.f, p_hi = 0.f;
#pragma unroll
		for (int j = 0; j < 8; j++) { // heads 8j + 2t, 8j + 2t + 1
			uint4 q0, q1;
			if (j < IDX8_QREG) {
				const int jr = j % IDX8_QREG;
				q0 = make_uint4(qf[jr][0], qf[jr][1], qf[jr][2], qf[jr][3]);
				q1 = make_uint4(qf[jr][4], qf[jr][5], qf[jr][6], qf[jr][7]);
			} else {
				q0 = *reinterpret_cast<const uint4 *>(qsh + (8 * j + g) * IDX8_ROW + 32 * t);
				q1 = *reinterpret_cast<const uint4 *>(qsh + (8 * j + g) * IDX8_ROW + 32 * t + 16);
			}
			float c[4] = {0.f, 0.f, 0.f, 0.f};
			mma_kblock(c, kf, q0, q1);
			const float2 wj = *reinterpret_cast<const float2 *>(wsh + 8 * j + 2 * t);
			p_lo += fmaxf(c[0], 0.f) * wj.x + fmaxf(c[1], 0.f) * wj.y;
			p_hi += fmaxf(c[2], 0.f) * wj.x + fmaxf(c[3], 0.f) * wj.y;
		}
		p_lo += __shfl_xor_sync(0xffffffffu, p_lo, 1);
		p_lo += __shfl_xor_sync(0xffffffffu, p_lo, 2);
		p_hi += __shfl_xor_sync(0xffffffffu, p_hi, 1);
		p_hi += __shfl_xor_sync(0xffffffffu, p_hi, 2);
		const float ks = *reinterpret_cast<const float *>(st + 16 * IDX8_ROW + 4 * (g + 8 * (t & 1)));
		__syncwarp(); // the stage is read: the next issue may overwrite it
		const int sk = kbeg + 16 * gi + g + 8 * (t & 1); // lane t = 0: key g, t = 1: key g + 8
		if (t < 2 && sk < kval) // lane t = 0 writes key g, t = 1 key g + 8
			out[sk] = (t ? p_hi : p_lo) * ks;
	}
	cp_async_wait_all();
}
