// scan.cuh — prefix sums of one int per thread: over a warp, and block-wide (exclusive) for
// blocks of NT threads (a multiple of 32, at most 1024). Device code only.
#pragma once

// The sum of v over the warp's lanes 0 .. this one (every lane of the warp must call it)
__device__ __forceinline__ int warp_inclusive_scan(int v)
{
	const int lane = threadIdx.x & 31;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		const int y = __shfl_up_sync(0xffffffffu, v, o);
		if (lane >= o)
			v += y;
	}
	return v;
}

// Returns the sum of v over the threads before this one; *total gets the block's sum. Every
// thread of the block must call it (it synchronises three times; the scratch is reusable at
// return).
template <int NT> __device__ __forceinline__ int block_exclusive_scan(int v, int *total)
{
	static_assert(NT % 32 == 0 && NT <= 1024, "block of whole warps, at most 1024 threads");
	__shared__ int warp_sums[NT / 32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int x = warp_inclusive_scan(v);
	if (lane == 31)
		warp_sums[warp] = x;
	__syncthreads(); // every warp's total is in smem before warp 0 scans them
	if (warp == 0) {
		const int s = warp_inclusive_scan(lane < NT / 32 ? warp_sums[lane] : 0);
		if (lane < NT / 32)
			warp_sums[lane] = s; // inclusive
	}
	__syncthreads(); // the scanned warp totals are visible to every warp
	const int before = (warp ? warp_sums[warp - 1] : 0) + x - v;
	*total = warp_sums[NT / 32 - 1];
	__syncthreads(); // warp_sums may be reused by the next call
	return before;
}
