// scan.cuh — block-wide exclusive prefix sum of one int per thread, for blocks of NT threads
// (a multiple of 32, at most 1024). Device code only.
#pragma once

// Returns the sum of v over the threads before this one; *total gets the block's sum. Every
// thread of the block must call it (it synchronises three times; the scratch is reusable at
// return).
template <int NT> __device__ __forceinline__ int block_exclusive_scan(int v, int *total)
{
	static_assert(NT % 32 == 0 && NT <= 1024, "block of whole warps, at most 1024 threads");
	__shared__ int warp_sums[NT / 32];
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
		int s = lane < NT / 32 ? warp_sums[lane] : 0;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			int y = __shfl_up_sync(0xffffffffu, s, o);
			if (lane >= o)
				s += y;
		}
		if (lane < NT / 32)
			warp_sums[lane] = s; // inclusive
	}
	__syncthreads(); // the scanned warp totals are visible to every warp
	const int before = (warp ? warp_sums[warp - 1] : 0) + x - v;
	*total = warp_sums[NT / 32 - 1];
	__syncthreads(); // warp_sums may be reused by the next call
	return before;
}
