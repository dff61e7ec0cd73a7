// wgmma.cuh — Hopper warpgroup MMA primitives (sm_90a) for kernels whose operands sit in shared
// memory in the 128-byte-swizzled canonical layouts: shared-memory matrix descriptors, the
// fence / commit / wait of an MMA group, and a register fence for the asynchronously written
// accumulators. Device code only. Used by gemm_fp8_wgmma.cu, gemm_fp8_stream.cu and mla_wgmma.cu.
//
// 128-byte swizzle: a tile is stored as rows of 128 bytes, 8-row groups ("atoms", 1024 bytes,
// 1024-aligned); 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its row.
#pragma once
#include <stdint.h>

// Descriptor of a K-major tile (rows = M or N, 128 bytes of K each) in the 128-byte swizzle:
// 8-row groups 1024 bytes apart (stride byte offset), leading byte offset unused. A k step of
// 16 bytes x n moves the start address by that much inside the atom (the hardware applies the
// swizzle to the full address), i.e. + n to the descriptor.
__device__ __forceinline__ uint64_t wgd_kmajor(uint32_t addr)
{
	uint64_t d = (uint64_t)((addr & 0x3ffff) >> 4);
	d |= (uint64_t)(1024 >> 4) << 32;
	d |= (uint64_t)1 << 62;
	return d;
}

// Descriptor of an MN-major tile in the 128-byte swizzle (used with the instruction's transpose
// bit): rows = K, each row 64 consecutive 16-bit elements of N (128 bytes), 8-row (k) groups
// sbo bytes apart, 64-wide column blocks of N lbo bytes apart.
__device__ __forceinline__ uint64_t wgd_mnmajor(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
	uint64_t d = (uint64_t)((addr & 0x3ffff) >> 4);
	d |= (uint64_t)((lbo >> 4) & 0x3fff) << 16;
	d |= (uint64_t)((sbo >> 4) & 0x3fff) << 32;
	d |= (uint64_t)1 << 62;
	return d;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Keeps the compiler from moving reads or writes of v across this point (a wgmma accumulator is
// written asynchronously: its registers are only valid after wgmma.wait_group).
__device__ __forceinline__ void wg_reg_fence(float &v) { asm volatile("" : "+f"(v)::"memory"); }

// Ordinary shared-memory stores of this thread made visible to the async proxy (wgmma operand
// reads) — each writing thread, before the barrier that hands the tile over
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
