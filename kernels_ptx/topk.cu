// topk.cu — the indexer's top-k selection (spec §3.6 step 10): for each query row, the
// k = min(k_max, n) highest scores among positions 0..n-1, exactly the set a full sort gives with
// ties to the lower position (NaN ranks lowest, -0 equals +0), emitted in ascending position
// order as positions and/or physical slots (block_table[pos / 64] * 64 + pos % 64, the FlashMLA
// convention), -1 after the k-th.
//
// k_topk: scores fp32 [B, ld], n int [B], block_table int [B, max_blocks], out_pos / out_slot
// int [B, k_max] (either may be null). One block of 1024 threads per row.
// Method: a radix select on a 32-bit order key (4 passes of 8 bits from the top, shared-memory
// histograms) finds the k-th key T and how many keys equal to T to take; then one ordered pass
// over contiguous per-thread chunks takes every key > T and the first equals in position order,
// and block prefix sums place them, so the output is already sorted by position.
// The other kernels below compute the same function: k_topk_select (a block a row, two reads),
// k_topk_cl8 / k_topk_cl16 / k_topk_cl4 (a row over a cluster of 8 / 16 / 4 CTAs of 1024 threads).
#include "cluster.cuh"
#include "common.cuh"
#include "scan.cuh"
#include "tma.cuh" // mbarriers

#define TOPK_THREADS 1024

// The kernels are launched as programmatic dependents of the scores kernel (cuda_attn.c): wait
// for the grids before them to complete and their writes to be visible (a no-op in an ordinary
// launch); then let the kernel after them start its blocks (the MLA decode where it is their
// programmatic dependent, DSV32_MLA_PDL: it waits for this grid's completion itself; a no-op for
// an ordinary launch after them).
__device__ __forceinline__ void topk_wait_inputs()
{
	asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
}

// Larger score -> larger key; NaN -> 0 (lowest); -0 and +0 the same.
__device__ __forceinline__ uint32_t order_key(float x)
{
	if (x != x)
		return 0u;
	if (x == 0.f)
		x = 0.f;
	uint32_t u = __float_as_uint(x);
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
k_topk(const float *__restrict__ scores, int ld, const int *__restrict__ n_keys, int k_max,
       const int *__restrict__ block_table, int max_blocks, int *__restrict__ out_pos,
       int *__restrict__ out_slot)
{
	__shared__ int hist[256];
	__shared__ uint32_t s_prefix;
	__shared__ int s_remaining;
	topk_wait_inputs();
	const int b = blockIdx.x, tid = threadIdx.x;
	const int n = n_keys[b];
	const int k = n < k_max ? n : k_max;
	const float *row = scores + (size_t)b * ld;
	const int *bt = block_table ? block_table + (size_t)b * max_blocks : nullptr;

	uint32_t T = 0;   // the k-th largest key
	int take_eq = k;  // how many keys equal to T are taken (all of them when k = n)
	if (k < n) {
		uint32_t prefix = 0, mask = 0;
		int remaining = k;
		for (int pass = 0; pass < 4; pass++) {
			const int shift = 24 - 8 * pass;
			for (int i = tid; i < 256; i += TOPK_THREADS)
				hist[i] = 0;
			__syncthreads(); // histogram cleared before counting
			for (int i = tid; i < n; i += TOPK_THREADS) {
				const uint32_t key = order_key(row[i]);
				if ((key & mask) == prefix)
					atomicAdd(&hist[(key >> shift) & 255], 1);
			}
			__syncthreads(); // counts complete before the scan
			if (tid == 0) {
				int cum = 0, bin = 255;
				for (; bin > 0; bin--) {
					if (cum + hist[bin] >= remaining)
						break;
					cum += hist[bin];
				}
				s_prefix = prefix | ((uint32_t)bin << shift);
				s_remaining = remaining - cum;
			}
			__syncthreads(); // the chosen bin is visible to every thread
			prefix = s_prefix;
			remaining = s_remaining;
			mask |= 255u << shift;
		}
		T = prefix;
		take_eq = remaining;
	}

	// ordered selection: thread tid owns positions [tid*chunk, (tid+1)*chunk)
	const int chunk = (n + TOPK_THREADS - 1) / TOPK_THREADS;
	const int lo = min(n, tid * chunk), hi = min(n, lo + chunk);
	int gt = 0, eq = 0;
	if (k < n)
		for (int i = lo; i < hi; i++) {
			const uint32_t key = order_key(row[i]);
			gt += key > T;
			eq += key == T;
		}
	else
		gt = hi - lo; // everything is selected
	int total;
	const int eq_before = block_exclusive_scan<TOPK_THREADS>(eq, &total);
	const int mine_eq = max(0, min(eq, take_eq - eq_before));
	const int out_before = block_exclusive_scan<TOPK_THREADS>(gt + mine_eq, &total);
	int o = out_before, eq_seen = 0;
	for (int i = lo; i < hi; i++) {
		bool sel;
		if (k < n) {
			const uint32_t key = order_key(row[i]);
			sel = key > T || (key == T && eq_seen++ < mine_eq);
		} else {
			sel = true;
		}
		if (sel) {
			if (out_pos)
				out_pos[(size_t)b * k_max + o] = i;
			if (out_slot)
				out_slot[(size_t)b * k_max + o] = bt[i >> 6] * 64 + (i & 63);
			o++;
		}
	}
	for (int i = k + tid; i < k_max; i += TOPK_THREADS) {
		if (out_pos)
			out_pos[(size_t)b * k_max + i] = -1;
		if (out_slot)
			out_slot[(size_t)b * k_max + i] = -1;
	}
}

// ---- k_topk_select: the same function in two reads of the row ---------------------------------
//
// k_topk_select: the arguments of k_topk; one block of 1024 threads per row, dynamic shared
// memory topk_smem_bytes(ld) (model/cuda_attn.c): 8 copies of a 2048-bin histogram, a candidate
// list of TOPK_CAND (key, position) pairs and two bitmaps of the row (selected; equal to the
// threshold).
//   A (first): a sample of the row (one group of 64 positions in 8) gives a threshold T0 about
//     1.5 k keys down; one read appends every key >= T0 to the candidate list; when their
//     count is in [k, TOPK_CAND] the selection is exact among them (three radix rounds in shared
//     memory), else B:
//   B, pass 1 (one read): histogram of the top 11 bits of the order key (sign, exponent, 2 mantissa
//     bits); lane l counts into copy l % 8 (rows with many equal scores — ReLU zeros — would
//     otherwise serialise on one shared-memory address), the copies are added, and a block
//     suffix scan finds the bin B holding the k-th key;
//   B, pass 2 (one read): keys above bin B set their bit in the selected bitmap, keys in bin B are
//     appended to the candidate list (one atomic per warp: ballot, popc);
//   the candidates: radix rounds of 11 and 10 bits in shared memory give the k-th key T and how
//     many keys equal to T to take; candidates > T set their selected bit, == T their equal bit
//     (when the candidates overflow the list, the rounds and the marking read the row instead);
//   output: each thread owns consecutive bitmap words; block prefix sums of the selected bits
//     and of the equal bits (the first take_eq in position order) place every position, so the
//     output is in ascending position order, as k_topk's.
// Loads are float4 (when ld % 4 == 0), four in flight per thread.
#define TOPK_CAND 8192
#define TOPK_BINS 2048
#define TOPK_COPIES 8
#define TOPK_CSTRIDE (TOPK_BINS + 1) // copies on different banks
#define TOPK_STRIDE 8                // the sample: one group of 64 positions in 8

__device__ __forceinline__ void topk_load4(const float *__restrict__ row, int n, int vec, int i4, uint32_t key[4],
					   bool ok[4])
{
	if (vec) {
		const float4 v = __ldg(reinterpret_cast<const float4 *>(row) + i4);
		key[0] = order_key(v.x), key[1] = order_key(v.y), key[2] = order_key(v.z), key[3] = order_key(v.w);
	} else {
#pragma unroll
		for (int e = 0; e < 4; e++)
			key[e] = 4 * i4 + e < n ? order_key(__ldg(row + 4 * i4 + e)) : 0u;
	}
#pragma unroll
	for (int e = 0; e < 4; e++)
		ok[e] = 4 * i4 + e < n;
}

// Loads the float4 groups i0 + u * 1024 (u < 4) of the row that exist (others: ok = false).
__device__ __forceinline__ void topk_load16(const float *__restrict__ row, int n, int n4, int vec, int i0,
					    uint32_t key[4][4], bool ok[4][4])
{
#pragma unroll
	for (int u = 0; u < 4; u++)
		if (i0 + u * TOPK_THREADS < n4)
			topk_load4(row, n, vec, i0 + u * TOPK_THREADS, key[u], ok[u]);
		else
			ok[u][0] = ok[u][1] = ok[u][2] = ok[u][3] = false;
}

// Runs f(ok, key, pos) for the order keys of the row, 16 a thread per trip (topk_load16); the
// loop runs while the warp's first lane has work, so every lane of a warp takes the same trips
// and f may use warp-collective operations.
template <typename F>
__device__ __forceinline__ void topk_for_each16(const float *__restrict__ row, int n, int n4, int vec, F f)
{
	const int lane = threadIdx.x & 31;
	for (int i0 = threadIdx.x; i0 - lane < n4; i0 += 4 * TOPK_THREADS) {
		uint32_t key[4][4];
		bool ok[4][4];
		topk_load16(row, n, n4, vec, i0, key, ok);
#pragma unroll
		for (int u = 0; u < 4; u++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				f(ok[u][e], key[u][e], 4 * (i0 + u * TOPK_THREADS) + e);
	}
}

// Thread j owns bins [per*(1023-j), +per) (thread 0 the highest); finds the bin where the count
// from the top reaches `rem`: *bin_out and *rem_out (rem minus the keys above that bin).
// The scan over the 1024 threads: within each warp by shuffles, then every warp scans the 32
// warp totals itself (one barrier; a block scan takes three).
__device__ __forceinline__ void topk_find_bin(const int *hist, int per, int rem, int *bin_out, int *rem_out)
{
	static_assert(TOPK_THREADS == 32 * 32, "a lane per warp");
	__shared__ int wsum[TOPK_THREADS / 32];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int lo = per * (TOPK_THREADS - 1 - tid);
	int local = 0;
	for (int i = 0; i < per; i++)
		local += hist[lo + i];
	const int x = warp_inclusive_scan(local);
	if (lane == 31)
		wsum[warp] = x;
	__syncthreads(); // every warp's total
	const int w_i = wsum[lane], ws = warp_inclusive_scan(w_i); // over warps 0 .. lane
	int above = __shfl_sync(0xffffffffu, ws - w_i, warp) + x - local;
	if (above < rem && above + local >= rem) {
		for (int bb = lo + per - 1; bb >= lo; bb--) {
			if (above + hist[bb] >= rem) {
				*bin_out = bb;
				*rem_out = rem - above;
				break;
			}
			above += hist[bb];
		}
	}
	__syncthreads(); // the bin is visible (and wsum read by all before a next call writes it)
}

// Adds the TOPK_COPIES copies of the histogram into copy 0 (each bin read and written by one
// thread); synchronises after.
__device__ __forceinline__ void topk_merge_copies(int *hist)
{
	for (int i = threadIdx.x; i < TOPK_BINS; i += TOPK_THREADS) {
		int sum = 0;
		for (int c = 0; c < TOPK_COPIES; c++)
			sum += hist[c * TOPK_CSTRIDE + i];
		hist[i] = sum;
	}
	__syncthreads(); // totals complete
}

// Appends (key, pos) to the candidate list where cand holds: one atomic per warp (ballot, popc).
// Every lane of the warp must call it; entries beyond TOPK_CAND are counted, not stored.
__device__ __forceinline__ void topk_append(bool cand, uint32_t key, int pos, int *ncand,
					    uint32_t *cand_key, int *cand_pos, int lane)
{
	const uint32_t m = __ballot_sync(0xffffffffu, cand);
	if (!m)
		return;
	int base = 0;
	if (lane == __ffs(m) - 1)
		base = atomicAdd(ncand, __popc(m));
	base = __shfl_sync(0xffffffffu, base, __ffs(m) - 1);
	const int c = base + __popc(m & ((1u << lane) - 1));
	if (cand && c < TOPK_CAND)
		cand_key[c] = key, cand_pos[c] = pos;
}

// Radix rounds r0 .. 2 of the select (digits: round 0 = bits 31..21, 1 = bits 20..10, 2 = bits
// 9..0): refines (prefix, mask) to the rem-th largest of the keys keys[0 .. nkeys) matching
// them, or of the row's order keys when keys is null; rem becomes how many keys equal to the
// result to take. hist: >= 2048 ints. Every thread of the block must call it.
__device__ __forceinline__ void topk_rounds(const uint32_t *keys, int nkeys, const float *__restrict__ row,
					    int n, int r0, uint32_t &prefix, uint32_t &mask, int &rem,
					    int *hist, int *s_bin, int *s_rem)
{
	const int tid = threadIdx.x;
	for (int round = r0; round < 3; round++) {
		const int shift = round == 0 ? 21 : round == 1 ? 10 : 0, nb = round == 2 ? 1024 : 2048;
		for (int i = tid; i < nb; i += TOPK_THREADS)
			hist[i] = 0;
		__syncthreads(); // cleared
		if (keys) {
			for (int c = tid; c < nkeys; c += TOPK_THREADS)
				if ((keys[c] & mask) == prefix)
					atomicAdd(&hist[(keys[c] >> shift) & (nb - 1)], 1);
		} else {
			for (int i = tid; i < n; i += TOPK_THREADS) {
				const uint32_t key = order_key(row[i]);
				if ((key & mask) == prefix)
					atomicAdd(&hist[(key >> shift) & (nb - 1)], 1);
			}
		}
		__syncthreads(); // counts complete
		topk_find_bin(hist, nb / TOPK_THREADS, rem, s_bin, s_rem);
		prefix |= (uint32_t)*s_bin << shift;
		mask |= (uint32_t)(nb - 1) << shift;
		rem = *s_rem;
	}
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
k_topk_select(const float *__restrict__ scores, int ld, const int *__restrict__ n_keys, int k_max,
	      const int *__restrict__ block_table, int max_blocks, int *__restrict__ out_pos,
	      int *__restrict__ out_slot)
{
	extern __shared__ __align__(16) uint8_t topk_smem[];
	int *hist = reinterpret_cast<int *>(topk_smem);                          // [COPIES][CSTRIDE]
	uint32_t *cand_key = reinterpret_cast<uint32_t *>(hist + TOPK_COPIES * TOPK_CSTRIDE); // [CAND]
	int *cand_pos = reinterpret_cast<int *>(cand_key + TOPK_CAND);            // [CAND]
	const int W = (ld + 31) / 32;                                             // bitmap words
	uint32_t *selb = reinterpret_cast<uint32_t *>(cand_pos + TOPK_CAND);      // [W]
	uint32_t *eqb = selb + W;                                                 // [W]
	__shared__ int s_bin, s_rem, s_ncand;
	topk_wait_inputs();

	const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
	const int n = n_keys[b];
	const int k = n < k_max ? n : k_max;
	const float *row = scores + (size_t)b * ld;
	const int *bt = block_table ? block_table + (size_t)b * max_blocks : nullptr;
	int *op = out_pos ? out_pos + (size_t)b * k_max : nullptr;
	int *os = out_slot ? out_slot + (size_t)b * k_max : nullptr;
	for (int i = k + tid; i < k_max; i += TOPK_THREADS) {
		if (op)
			op[i] = -1;
		if (os)
			os[i] = -1;
	}
	if (k >= n) { // every key is selected, in order
		for (int i = tid; i < n; i += TOPK_THREADS) {
			if (op)
				op[i] = i;
			if (os)
				os[i] = bt[i >> 6] * 64 + (i & 63);
		}
		return;
	}
	const int vec = (ld & 3) == 0;
	const int n4 = (n + 3) / 4, nw = (n + 31) / 32;
	for (int i = tid; i < TOPK_COPIES * TOPK_CSTRIDE; i += TOPK_THREADS)
		hist[i] = 0;
	for (int i = tid; i < nw; i += TOPK_THREADS)
		selb[i] = 0, eqb[i] = 0;
	if (tid == 0)
		s_ncand = 0;
	__syncthreads(); // cleared
	int *myhist = hist + (lane & (TOPK_COPIES - 1)) * TOPK_CSTRIDE;

	// ---- A: threshold from a sample, one pass of compares -------------------------------------
	// Sample: every TOPK_STRIDE-th group of 64 positions (all of them when n <= 16384), keys
	// kept in the candidate area (16384 words). T0 = the sample's r-th largest key with
	// r = 1.5 k (sample / n) + 8, so about 1.5 k keys of the row are >= T0; the pass then
	// appends every key >= T0. Exact whenever k <= that count <= TOPK_CAND (checked), else B.
	uint32_t *samp = cand_key; // [2 * TOPK_CAND]
	const int ngroups = (n + 63) / 64;
	const int stride = n <= 2 * TOPK_CAND ? 1 : TOPK_STRIDE;
	const int sgroups = min((ngroups + stride - 1) / stride, 2 * TOPK_CAND / 64);
	int nsv = 0; // valid sampled positions
	for (int j = tid; j < sgroups * 16; j += TOPK_THREADS) {
		const int g = (j >> 4) * stride, i4 = g * 16 + (j & 15);
		uint32_t key[4] = {0u, 0u, 0u, 0u};
		bool ok[4] = {false, false, false, false};
		if (i4 < n4) // (the last group may end before n)
			topk_load4(row, n, vec, i4, key, ok);
#pragma unroll
		for (int e = 0; e < 4; e++) {
			samp[4 * j + e] = ok[e] ? key[e] : 0u;
			if (ok[e])
				atomicAdd(&myhist[key[e] >> 21], 1), nsv++;
		}
	}
	int tot;
	block_exclusive_scan<TOPK_THREADS>(nsv, &tot);
	nsv = tot;
	topk_merge_copies(hist); // the sample's histogram
	const long long rr = (long long)k * 3 * nsv / (2LL * n) + 8;
	bool sampled = rr <= nsv;
	uint32_t T0 = 0;
	if (sampled) {
		const int r = (int)rr;
		topk_find_bin(hist, TOPK_BINS / TOPK_THREADS, r, &s_bin, &s_rem);
		uint32_t prefix = (uint32_t)s_bin << 21, mask = 0xffe00000u;
		int rem = s_rem;
		topk_rounds(samp, sgroups * 64, row, n, 1, prefix, mask, rem, hist, &s_bin, &s_rem);
		T0 = prefix;
		// the pass: keys >= T0 -> candidates; the loop runs while the warp's first lane has
		// work, so all lanes take the same trips
		if (vec) {
			// float compares against T0's float (order_key is monotonic; NaN, key 0, is never
			// >= a T0 above 0 and compares false; T0 = 0 takes everything), an 8-bit mask a
			// thread, one atomic a warp, the next 8 floats loaded before these 8 are examined
			const uint32_t tb = (T0 & 0x80000000u) ? (T0 & 0x7fffffffu) : ~T0;
			const float t0f = __uint_as_float(tb);
			const bool all = T0 == 0u;
			float4 cur[2];
#pragma unroll
			for (int u = 0; u < 2; u++)
				cur[u] = tid + u * TOPK_THREADS < n4 ? __ldg(reinterpret_cast<const float4 *>(row) + tid + u * TOPK_THREADS)
								     : make_float4(0.f, 0.f, 0.f, 0.f);
			for (int i0 = tid; i0 - lane < n4; i0 += 2 * TOPK_THREADS) {
				float4 nxt[2];
#pragma unroll
				for (int u = 0; u < 2; u++) {
					const int j = i0 + 2 * TOPK_THREADS + u * TOPK_THREADS;
					nxt[u] = j < n4 ? __ldg(reinterpret_cast<const float4 *>(row) + j) : make_float4(0.f, 0.f, 0.f, 0.f);
				}
				uint32_t cm = 0;
#pragma unroll
				for (int u = 0; u < 2; u++) {
					const float x[4] = {cur[u].x, cur[u].y, cur[u].z, cur[u].w};
#pragma unroll
					for (int e = 0; e < 4; e++)
						if (4 * (i0 + u * TOPK_THREADS) + e < n && (all || x[e] >= t0f))
							cm |= 1u << (4 * u + e);
				}
				// warp-aggregated append of this thread's __popc(cm) candidates
				const int cnt = __popc(cm);
				const int incl = warp_inclusive_scan(cnt);
				const int wtot = __shfl_sync(0xffffffffu, incl, 31);
				if (wtot) {
					int base = 0;
					if (lane == 31)
						base = atomicAdd(&s_ncand, wtot);
					base = __shfl_sync(0xffffffffu, base, 31) + incl - cnt;
#pragma unroll
					for (int u = 0; u < 2; u++) {
						const float x[4] = {cur[u].x, cur[u].y, cur[u].z, cur[u].w};
#pragma unroll
						for (int e = 0; e < 4; e++)
							if ((cm >> (4 * u + e)) & 1) {
								if (base < TOPK_CAND)
									cand_key[base] = order_key(x[e]),
									cand_pos[base] = 4 * (i0 + u * TOPK_THREADS) + e;
								base++;
							}
					}
				}
				cur[0] = nxt[0], cur[1] = nxt[1];
			}
		} else {
			topk_for_each16(row, n, n4, vec, [&](bool ok, uint32_t key, int pos) {
				topk_append(ok && key >= T0, key, pos, &s_ncand, cand_key, cand_pos, lane);
			});
		}
		__syncthreads(); // candidates complete (and every read of the sample done)
		sampled = s_ncand >= k && s_ncand <= TOPK_CAND;
	}

	uint32_t bin = 0, prefix = 0, mask = 0;
	int rem = k, first_round = 0;
	if (!sampled) {
		// ---- B: exact two-pass method ------------------------------------------------------
		for (int i = tid; i < TOPK_COPIES * TOPK_CSTRIDE; i += TOPK_THREADS)
			hist[i] = 0;
		__syncthreads(); // everyone has read s_ncand; hist cleared
		if (tid == 0)
			s_ncand = 0;
		// pass 1: histogram of the top 11 bits, lane l into copy l % 8
		topk_for_each16(row, n, n4, vec, [&](bool ok, uint32_t key, int pos) {
			if (ok)
				atomicAdd(&myhist[key >> 21], 1);
		});
		__syncthreads(); // every copy complete
		topk_merge_copies(hist);
		topk_find_bin(hist, TOPK_BINS / TOPK_THREADS, k, &s_bin, &s_rem);
		bin = (uint32_t)s_bin;
		rem = s_rem;
		// pass 2: above the bin -> selected; in the bin -> candidates (warp-aggregated append)
		topk_for_each16(row, n, n4, vec, [&](bool ok, uint32_t key, int pos) {
			const uint32_t kb = key >> 21;
			if (ok && kb > bin)
				atomicOr(&selb[pos >> 5], 1u << (pos & 31));
			topk_append(ok && kb == bin, key, pos, &s_ncand, cand_key, cand_pos, lane);
		});
		__syncthreads(); // bitmaps and candidates complete
		prefix = bin << 21, mask = 0xffe00000u, first_round = 1;
	}
	const int ncand = s_ncand;
	const bool in_smem = ncand <= TOPK_CAND;

	// the k-th key T among the candidates (or the row, after an overflow): rounds of 11 bits
	// (31..21, A only), 11 bits (20..10) and 10 bits (9..0)
	topk_rounds(in_smem ? cand_key : nullptr, ncand, row, n, first_round, prefix, mask, rem, hist, &s_bin,
		    &s_rem);
	const uint32_t T = prefix;
	const int take_eq = rem;
	// mark the candidates: > T selected, == T equal (B's keys above the bin are marked already)
	if (in_smem) {
		for (int c = tid; c < ncand; c += TOPK_THREADS) {
			const uint32_t key = cand_key[c];
			const int pos = cand_pos[c];
			if (key > T)
				atomicOr(&selb[pos >> 5], 1u << (pos & 31));
			else if (key == T)
				atomicOr(&eqb[pos >> 5], 1u << (pos & 31));
		}
	} else {
		for (int pos = tid; pos < n; pos += TOPK_THREADS) {
			const uint32_t key = order_key(row[pos]);
			if ((key >> 21) != bin)
				continue;
			if (key > T)
				atomicOr(&selb[pos >> 5], 1u << (pos & 31));
			else if (key == T)
				atomicOr(&eqb[pos >> 5], 1u << (pos & 31));
		}
	}
	__syncthreads(); // bitmaps final

	// output: thread tid owns words [tid*wpt, (tid+1)*wpt)
	const int wpt = (nw + TOPK_THREADS - 1) / TOPK_THREADS;
	const int w0 = min(nw, tid * wpt), w1 = min(nw, w0 + wpt);
	int gt = 0, eq = 0;
	for (int w = w0; w < w1; w++)
		gt += __popc(selb[w]), eq += __popc(eqb[w]);
	int total;
	const int eq_before = block_exclusive_scan<TOPK_THREADS>(eq, &total);
	const int mine_eq = max(0, min(eq, take_eq - eq_before));
	const int out_before = block_exclusive_scan<TOPK_THREADS>(gt + mine_eq, &total);
	int o = out_before, eq_seen = 0;
	for (int w = w0; w < w1; w++) {
		uint32_t s = selb[w], e = eqb[w];
		while (s | e) {
			const int bit = __ffs(s | e) - 1;
			const uint32_t m1 = 1u << bit;
			bool take = (s & m1) != 0;
			if (!take && eq_seen < mine_eq)
				take = true, eq_seen++;
			s &= ~m1, e &= ~m1;
			if (take) {
				const int pos = 32 * w + bit;
				if (op)
					op[o] = pos;
				if (os)
					os[o] = bt[pos >> 6] * 64 + (pos & 63);
				o++;
			}
		}
	}
}

// ---- k_topk_cl8 / k_topk_cl16 / k_topk_cl4: the same function for few rows, over a cluster -----
//
// Grid (CL, B), a cluster of CL CTAs a row (k_topk_cl8 / cl16 / cl4: 8 / 16 / 4 CTAs of 1024
// threads). CTA r owns positions [r S, r S + S) of the row, S = ceil(ld / CL) rounded up to 64 (so the
// slices follow ld, not n: the reads of the scores, of n and of the slice's block-table entries are
// all in flight at once); positions >= n are read but never counted. The slice is read once into
// shared memory as order keys (float4 loads when ld % 4 == 0), with round 0's histogram.
// Rounds: 11 bits (31..21), 11 (20..10), 10 (9..0) of the order key, over the keys that match the
// prefix so far (round r > 0 counts them four a thread a trip; a warp without one skips the
// histogram); each ends when the chosen bin is taken whole or the key is complete. A round's
// exchange: each CTA's warp 0 sends its 64 bucket sums (32 bins each), then its 32 bins of the
// chosen bucket, into every CTA's inbox for that round and step (cl_st_async, 16 bytes a store,
// completing on the receiver's mbarrier, which expects CL x 256 / CL x 128 bytes) and waits on its
// own; all CTAs then compute the same bin, and the same data give every CTA's count of keys above
// the chosen bin and in it, so after the last round each CTA knows every CTA's count of selected
// and equal keys. No cluster barrier in the rounds or at the end (no CTA reads another's memory;
// every store into a CTA lands before it goes on): one, started before the wait for the scores
// with the mbarriers' setup and waited for before the first send. The block table and n are read
// before the wait too (inputs of the scores kernel, written before it ran), the slots then need no
// dependent global load. Output: thread t owns the slice's positions [4 t c4, 4 (t + 1) c4), so
// thread order is position order; its counts of keys above and equal, packed (gt << 16 | eq), by one
// block scan give where its selections go (keys above the prefix, and the first take_eq equal to it
// in position order: ties to the lower position), so the output is in ascending position order.
// Shared memory (dynamic, topk_cl_smem_bytes in cuda_attn.c): two histograms of 2048 bins, two
// sets of 64 bucket sums, the slice's S keys, its S / 64 + 1 block-table entries, then (16-byte
// aligned) three rounds' inboxes of CL x 96 ints. S <= 32704 (the packed counts fit an int).
// Run 22 (bench attention, batch 1): 9.30 / 9.25 us at 32K (cl8 / cl16 of 512 threads), 14.35 / 12.51 at 128K;
// k_topk_cluster (every thread of 8 CTAs summing all 8 histograms a round through distributed
// shared memory, a warp-serial output) 15.51 / 22.03, the pulled exchange with cluster barriers
// 9.38 / 12.74, the first form of this kernel (pulled, warp-serial output and counts) 10.14 / 14.57.
// stop (benchmarks only; 0 otherwise): return after the load (1), the first round (2), the rounds
// (3) — the output is then incomplete.

// hist[bin] += 1 where ok, one atomic for the warp when all its lanes hold the same bin (rows of
// equal scores); every lane of the warp calls it
__device__ __forceinline__ void cl_hist_add(int *hist, uint32_t bin, bool ok, int lane)
{
	const uint32_t b0 = __shfl_sync(0xffffffffu, bin, 0);
	if (__all_sync(0xffffffffu, ok && bin == b0)) {
		if (lane == 0)
			atomicAdd(&hist[b0], 32);
	} else if (ok) {
		atomicAdd(&hist[bin], 1);
	}
}

// 64 bucket sums of a histogram of nb bins (warp w: buckets w, w + 32); the caller synchronises
template <int NT> __device__ __forceinline__ void tcl_buckets(const int *hist, int *bsum, int nb)
{
	const int lane = threadIdx.x & 31;
	for (int j = threadIdx.x >> 5; j < nb / 32; j += NT / 32) {
		int v = hist[32 * j + lane];
#pragma unroll
		for (int o = 16; o; o >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, o);
		if (!lane)
			bsum[j] = v;
	}
}

template <int CL, int NT>
__device__ __forceinline__ void topk_cl_body(const float *__restrict__ scores, int ld, const int *__restrict__ n_keys,
					     int k_max, const int *__restrict__ block_table, int max_blocks,
					     int *__restrict__ out_pos, int *__restrict__ out_slot, int stop)
{
	static_assert(NT % 32 == 0 && NT <= 1024, "whole warps");
	extern __shared__ __align__(16) uint8_t tcl_smem[];
	const int S = ((ld + CL - 1) / CL + 63) / 64 * 64;
	int *hbuf = reinterpret_cast<int *>(tcl_smem);   // [2][2048] this CTA's counts
	int *bsum = hbuf + 2 * TOPK_BINS;                 // [2][64] their bucket sums
	uint32_t *keys = reinterpret_cast<uint32_t *>(bsum + 128); // [S]
	int *pages = reinterpret_cast<int *>(keys + S);   // [S / 64 + 1]
	// each round's inbox, 16-byte aligned: [round][source CTA][64 bucket sums, 32 bins]
	int *inbox = reinterpret_cast<int *>(tcl_smem + ((2 * TOPK_BINS + 128 + S + S / 64 + 1) * 4 + 15) / 16 * 16);
	__shared__ __align__(8) uint64_t s_bar[6]; // round r's bucket sums (2r), bins (2r + 1)
	// warp 0's round results: bin, what is left to take, done; every CTA's keys above the prefix
	// so far (accumulated) and equal to it
	__shared__ int s_bin, s_rem, s_done, s_gt[CL], s_eq[CL], s_wcnt[2][32];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, b = blockIdx.y;
	const uint32_t r = cluster_rank();
	const int lo = min(ld, (int)r * S), hi = min(ld, lo + S);
	const int *bt = block_table ? block_table + (size_t)b * max_blocks : nullptr;
	// before the wait: n, the slice's pages, the histograms cleared (none is written by the
	// scores kernel)
	const int n = n_keys[b];
	if (bt)
		for (int i = tid; i < (hi - lo + 63) / 64 && lo / 64 + i < max_blocks; i += NT)
			pages[i] = __ldg(bt + lo / 64 + i);
	for (int i = tid; i < 2 * TOPK_BINS; i += NT)
		hbuf[i] = 0;
	if (tid < CL)
		s_gt[tid] = 0;
	const int k = n < k_max ? n : k_max;
	if (k < n) {
		// the inboxes' barriers, each expecting its bytes from the CL CTAs (one phase each); the
		// others send once past the cluster barrier this arrival starts (its wait comes before the
		// first send); still before the wait for the scores
		if (tid == 0) {
			for (int i = 0; i < 6; i++)
				mbar_init(smem_u32(&s_bar[i]), 1);
			asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
			for (int i = 0; i < 3; i++) {
				mbar_arrive_expect_tx(smem_u32(&s_bar[2 * i]), CL * 64 * 4);
				mbar_arrive_expect_tx(smem_u32(&s_bar[2 * i + 1]), CL * 32 * 4);
			}
		}
		asm volatile("barrier.cluster.arrive;" ::: "memory"); // (release: the inits, the expectations)
	}
	topk_wait_inputs();
	const int len = max(0, min(hi, n) - lo); // the slice's counted positions [lo, lo + len)
	const float *row = scores + (size_t)b * ld;
	int *op = out_pos ? out_pos + (size_t)b * k_max : nullptr;
	int *os = out_slot ? out_slot + (size_t)b * k_max : nullptr;
	for (int i = k + (int)r * NT + tid; i < k_max; i += CL * NT) {
		if (op)
			op[i] = -1;
		if (os)
			os[i] = -1;
	}
	__syncthreads(); // pages and cleared histograms visible
	if (k >= n) { // every key is selected, in order (no cluster exchange)
		for (int i = tid; i < len; i += NT) {
			if (op)
				op[lo + i] = lo + i;
			if (os)
				os[lo + i] = pages[i >> 6] * 64 + (i & 63);
		}
		return;
	}
	// the slice as order keys (float4 loads when ld % 4 == 0, 4 a thread in flight); round 0's
	// histogram (bits 31..21) of the counted ones
	int *h0 = hbuf;
	if ((ld & 3) == 0) {
		const float4 *row4 = reinterpret_cast<const float4 *>(row + lo);
		const int n4 = (hi - lo + 3) / 4;
		for (int base = 0; base < n4; base += 4 * NT) {
			float4 v[4];
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int j = base + u * NT + tid;
				v[u] = j < n4 ? __ldg(row4 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
			}
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int j = base + u * NT + tid;
				if (base + u * NT + (tid & ~31) >= n4)
					break; // (the whole warp)
				const uint32_t kk[4] = {order_key(v[u].x), order_key(v[u].y), order_key(v[u].z),
							order_key(v[u].w)};
				if (j < n4)
					*reinterpret_cast<uint4 *>(keys + 4 * j) = make_uint4(kk[0], kk[1], kk[2], kk[3]);
#pragma unroll
				for (int e = 0; e < 4; e++)
					cl_hist_add(h0, kk[e] >> 21, 4 * j + e < len, lane);
			}
		}
	} else {
		for (int base = 0; base < hi - lo; base += 8 * NT) {
			float v[8];
#pragma unroll
			for (int u = 0; u < 8; u++) {
				const int i = base + u * NT + tid;
				v[u] = lo + i < hi ? __ldg(row + lo + i) : 0.f;
			}
#pragma unroll
			for (int u = 0; u < 8; u++) {
				const int i = base + u * NT + tid;
				if (base + u * NT + (tid & ~31) >= hi - lo)
					break; // (the whole warp)
				const uint32_t key = order_key(v[u]);
				if (lo + i < hi)
					keys[i] = key;
				cl_hist_add(h0, key >> 21, i < len, lane);
			}
		}
	}
	__syncthreads(); // keys and round 0's histogram complete
	if (stop == 1) {
		asm volatile("barrier.cluster.wait;" ::: "memory");
		return;
	}
	uint32_t prefix = 0, mask = 0;
	int rem = k;
	for (int round = 0;; round++) {
		const int shift = round == 0 ? 21 : round == 1 ? 10 : 0, nb = round == 2 ? 1024 : 2048;
		int *hist = hbuf + (round & 1) * TOPK_BINS, *bs = bsum + (round & 1) * 64;
		if (round) { // this round's histogram: the keys matching the prefix so far, 4 a thread a
			     // trip (the warp's trips alike), warps without one skipped
			const uint4 *k4 = reinterpret_cast<const uint4 *>(keys);
			for (int j = tid; 4 * (j - lane) < len; j += NT) {
				const uint4 v = 4 * j < len ? k4[j] : make_uint4(0u, 0u, 0u, 0u);
				const uint32_t kk[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const bool ok = 4 * j + e < len && (kk[e] & mask) == prefix;
					if (__any_sync(0xffffffffu, ok))
						cl_hist_add(hist, (kk[e] >> shift) & (nb - 1), ok, lane);
				}
			}
			__syncthreads(); // counts complete
		}
		tcl_buckets<NT>(hist, bs, nb);
		if (round == 0) // every CTA's barriers initialised
			asm volatile("barrier.cluster.wait;" ::: "memory");
		__syncthreads(); // the bucket sums complete
		int *ib = inbox + round * CL * 96; // this round's inbox, source c at ib + 96 c
		if (warp == 0) {
			// this CTA's bucket sums into every CTA's inbox (its own included)
			for (int i = lane; i < CL * 16; i += 32) {
				const uint32_t c = (uint32_t)i >> 4, q = (uint32_t)i & 15;
				cl_st_async(cl_mapa(smem_u32(ib + 96 * r + 4 * q), c), *reinterpret_cast<const uint4 *>(bs + 4 * q),
					    cl_mapa(smem_u32(&s_bar[2 * round]), c));
			}
			mbar_wait(smem_u32(&s_bar[2 * round]), 0);
			// buckets from the top: lane l holds buckets nbk-1-2l (A) and nbk-2-2l (B)
			const int nbk = nb / 32, jA = nbk - 1 - 2 * lane, jB = jA - 1;
			int vA[CL], vB[CL], tA = 0, tB = 0;
#pragma unroll
			for (int c = 0; c < CL; c++) {
				vA[c] = jA < 0 ? 0 : ib[96 * c + jA];
				vB[c] = jB < 0 ? 0 : ib[96 * c + jB];
			}
#pragma unroll
			for (int c = 0; c < CL; c++)
				tA += vA[c], tB += vB[c];
			const int cum = warp_inclusive_scan(tA + tB);
			const int L = __ffs(__ballot_sync(0xffffffffu, cum >= rem)) - 1; // the lane with the bucket
			const int above_l = cum - tA - tB;
			const bool inA = above_l + tA >= rem;
			const int src = __shfl_sync(0xffffffffu, inA ? 0 : 1, L);
			const int J = __shfl_sync(0xffffffffu, src ? jB : jA, L);
			const int above = __shfl_sync(0xffffffffu, src ? above_l + tA : above_l, L);
			// every CTA's keys in the buckets above J (lanes before L, and A of lane L if J = B)
			int gt_c[CL];
#pragma unroll
			for (int c = 0; c < CL; c++)
				gt_c[c] = (int)__reduce_add_sync(0xffffffffu, (unsigned)(lane < L ? vA[c] + vB[c]
										 : lane == L && src ? vA[c] : 0));
			// this CTA's bins of bucket J into every CTA's inbox
			for (int i = lane; i < CL * 8; i += 32) {
				const uint32_t c = (uint32_t)i >> 3, q = (uint32_t)i & 7;
				cl_st_async(cl_mapa(smem_u32(ib + 96 * r + 64 + 4 * q), c),
					    *reinterpret_cast<const uint4 *>(hist + 32 * J + 4 * q),
					    cl_mapa(smem_u32(&s_bar[2 * round + 1]), c));
			}
			mbar_wait(smem_u32(&s_bar[2 * round + 1]), 0);
			// the bins of bucket J from the top: lane l holds bin 32 J + 31 - l
			int f[CL], tf = 0;
#pragma unroll
			for (int c = 0; c < CL; c++)
				f[c] = ib[96 * c + 64 + 31 - lane];
#pragma unroll
			for (int c = 0; c < CL; c++)
				tf += f[c];
			const int cumf = warp_inclusive_scan(tf);
			const int rem1 = rem - above;
			const int L2 = __ffs(__ballot_sync(0xffffffffu, cumf >= rem1)) - 1;
			const int in_bin = __shfl_sync(0xffffffffu, tf, L2);
			const int rem2 = rem1 - __shfl_sync(0xffffffffu, cumf - tf, L2);
#pragma unroll
			for (int c = 0; c < CL; c++) {
				gt_c[c] += (int)__reduce_add_sync(0xffffffffu, (unsigned)(lane < L2 ? f[c] : 0));
				const int eq = __shfl_sync(0xffffffffu, f[c], L2);
				if (lane == c)
					s_gt[c] += gt_c[c], s_eq[c] = eq;
			}
			if (!lane) {
				s_bin = 32 * J + 31 - L2;
				s_rem = rem2;
				s_done = round == 2 || in_bin == rem2; // the key is complete, or the bin taken whole
			}
		} else if (round == 1) {
			// round 2's buffers (round 0's; only this CTA reads them)
			for (int i = tid - 32; i < 1024; i += NT - 32)
				hbuf[i] = 0;
		}
		__syncthreads(); // the round's results visible
		prefix |= (uint32_t)s_bin << shift;
		mask |= (uint32_t)(nb - 1) << shift;
		rem = s_rem;
		if (s_done || (stop == 2 && round == 0))
			break;
	}
	// no last cluster barrier: no CTA reads another's shared memory, and every store into this
	// one's inboxes has landed (it waited for them)
	if (stop == 2 || stop == 3)
		return;
	// keys with (key & mask) > prefix are selected, and the first take_eq with (key & mask) ==
	// prefix; the CTAs before this one: their selections and the equal keys they took
	const int take_eq = rem;
	int cta_out = 0, cta_eq = 0;
#pragma unroll
	for (int c = 0; c < CL; c++)
		if ((uint32_t)c < r) {
			cta_out += s_gt[c] + max(0, min(s_eq[c], take_eq - cta_eq));
			cta_eq += s_eq[c];
		}
	const int cta_take = max(0, min(s_eq[r], take_eq - cta_eq)); // equal keys this CTA takes
	// output: thread t owns the slice's positions [4 t c4, 4 (t + 1) c4), so thread order is
	// position order: its counts of keys above and equal (packed gt << 16 | eq: a slice has
	// at most 32704 keys, cuda_attn.c, so no sum leaves its half or the int) by one block
	// scan give where its selections go and how many of the CTA's equal keys come before
	// its own
	const uint4 *k4 = reinterpret_cast<const uint4 *>(keys);
	const int c4 = (len + 4 * NT - 1) / (4 * NT), j0 = tid * c4;
	int packed = 0;
	for (int j = j0; j < j0 + c4 && 4 * j < len; j++) {
		const uint4 v = k4[j];
		const uint32_t kk[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
		for (int e = 0; e < 4; e++)
			if (4 * j + e < len)
				packed += ((kk[e] & mask) > prefix ? 1 << 16 : 0) + ((kk[e] & mask) == prefix);
	}
	const int incl = warp_inclusive_scan(packed);
	if (lane == 31)
		s_wcnt[0][warp] = incl;
	__syncthreads(); // every warp's total
	const int wv = lane < NT / 32 ? s_wcnt[0][lane] : 0, wi = warp_inclusive_scan(wv);
	const int before = __shfl_sync(0xffffffffu, wi - wv, warp) + incl - packed;
	int e_idx = before & 0xffff; // the CTA's equal keys before this thread's
	int o = cta_out + (before >> 16) + min(e_idx, cta_take);
	for (int j = j0; j < j0 + c4 && 4 * j < len; j++) {
		const uint4 v = k4[j];
		const uint32_t kk[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int i = 4 * j + e;
			const uint32_t km = kk[e] & mask;
			bool sel = false;
			if (i < len && km == prefix)
				sel = e_idx++ < cta_take;
			else if (i < len)
				sel = km > prefix;
			if (sel) {
				if (op)
					op[o] = lo + i;
				if (os)
					os[o] = pages[i >> 6] * 64 + (i & 63);
				o++;
			}
		}
	}
}

extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(1024, 1)
k_topk_cl8(const float *__restrict__ scores, int ld, const int *__restrict__ n_keys, int k_max,
	   const int *__restrict__ block_table, int max_blocks, int *__restrict__ out_pos, int *__restrict__ out_slot,
	   int stop)
{
	topk_cl_body<8, 1024>(scores, ld, n_keys, k_max, block_table, max_blocks, out_pos, out_slot, stop);
}

// k_topk_cl4: a row over 4 CTAs of 1024 threads (ld <= 130816: the few-row batches, whose
// clusters of 8 do not all fit the GPCs at once; run 25 at 16 rows: 9.84 / 7.02 us at 32K / 8K
// against k_topk_cl8's 16.71 / 11.05)
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(1024, 1)
k_topk_cl4(const float *__restrict__ scores, int ld, const int *__restrict__ n_keys, int k_max,
	   const int *__restrict__ block_table, int max_blocks, int *__restrict__ out_pos, int *__restrict__ out_slot,
	   int stop)
{
	topk_cl_body<4, 1024>(scores, ld, n_keys, k_max, block_table, max_blocks, out_pos, out_slot, stop);
}

// k_topk_cl16: 16 CTAs of 1024 threads (run 25, batch 1 at 128K: 11.00 us against 11.83 with 512
// threads, the form removed)
extern "C" __global__ void __cluster_dims__(16, 1, 1) __launch_bounds__(1024, 1)
k_topk_cl16(const float *__restrict__ scores, int ld, const int *__restrict__ n_keys, int k_max,
	    const int *__restrict__ block_table, int max_blocks, int *__restrict__ out_pos, int *__restrict__ out_slot,
	    int stop)
{
	topk_cl_body<16, 1024>(scores, ld, n_keys, k_max, block_table, max_blocks, out_pos, out_slot, stop);
}
