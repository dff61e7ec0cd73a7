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
#include "common.cuh"

#define TOPK_THREADS 1024

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

// Exclusive prefix sum over the block (1024 threads); *total gets the sum.
__device__ __forceinline__ int block_exclusive_scan(int v, int *total)
{
	__shared__ int warp_sums[32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int x = v;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		int y = __shfl_up_sync(0xffffffffu, x, o);
		if (lane >= o)
			x += y;
	}
	if (lane == 31)
		warp_sums[warp] = x;
	__syncthreads(); // every warp's total is in smem before warp 0 scans them
	if (warp == 0) {
		int s = warp_sums[lane];
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			int y = __shfl_up_sync(0xffffffffu, s, o);
			if (lane >= o)
				s += y;
		}
		warp_sums[lane] = s; // inclusive
	}
	__syncthreads(); // the scanned warp totals are visible to every warp
	const int before = (warp ? warp_sums[warp - 1] : 0) + x - v;
	*total = warp_sums[31];
	__syncthreads(); // warp_sums may be reused by the next call
	return before;
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
k_topk(const float *__restrict__ scores, int ld, const int *__restrict__ n_keys, int k_max,
       const int *__restrict__ block_table, int max_blocks, int *__restrict__ out_pos,
       int *__restrict__ out_slot)
{
	__shared__ int hist[256];
	__shared__ uint32_t s_prefix;
	__shared__ int s_remaining;
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
	const int eq_before = block_exclusive_scan(eq, &total);
	const int mine_eq = max(0, min(eq, take_eq - eq_before));
	const int out_before = block_exclusive_scan(gt + mine_eq, &total);
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
