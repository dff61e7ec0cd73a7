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

// wgmma m64nNk32 e4m3 with f32 accumulators d[] (a function's float *d): d (+)= A[64x32] .
// B[Nx32]^T, both K-major in 128B-swizzled smem (descriptors da, db, in scope); accumulate = 0
// overwrites d (the fragment starts at zero), 1 adds. regs: the fragment's operand list "%0, ..",
// ia, ib, ic: the operand numbers of da, db, accumulate (after the fragment's); the rest: the
// fragment's constraints (WG_D8 each 8 registers).
// The fragment operand lists of WGMMA_E4M3: WG_Rn = "%0, .., %(n-1)" (n = 8 .. 96 in steps of 8)
#define WG_R8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define WG_R16 WG_R8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_R24 WG_R16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define WG_R32 WG_R24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_R40 WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define WG_R48 WG_R40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define WG_R56 WG_R48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define WG_R64 WG_R56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_R72 WG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define WG_R80 WG_R72 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define WG_R88 WG_R80 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define WG_R96 WG_R88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_D8(i)                                                                                 \
	"+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),   \
		"+f"(d[i + 6]), "+f"(d[i + 7])
#define WGMMA_E4M3(n, regs, ia, ib, ic, ...)                                                  \
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ic ", 0;\n"                       \
		     "wgmma.mma_async.sync.aligned.m64n" #n "k32.f32.e4m3.e4m3 {" regs "}, %" #ia   \
		     ", %" #ib ", p, 1, 1;\n}\n"                                                  \
		     : __VA_ARGS__                                                             \
		     : "l"(da), "l"(db), "r"(accumulate))

// The widths the kernels and probes use, by width: wgmma_e4m3<N>(d, da, db, accumulate) is
// WGMMA_E4M3 of width N on d[0 .. N/2 - 1] (the odd multiples of 8 end in a 4-register group,
// WG_D4); a width not specialised below does not compile.
#define WG_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float *d, uint64_t da, uint64_t db, int accumulate);
#define WGMMA_E4M3_FN(n, regs, ia, ib, ic, ...)                                               \
	template <>                                                                            \
	__device__ __forceinline__ void wgmma_e4m3<n>(float *d, uint64_t da, uint64_t db,      \
						      int accumulate)                          \
	{                                                                                      \
		WGMMA_E4M3(n, regs, ia, ib, ic, __VA_ARGS__);                                   \
	}
#define WG_D8x4(i) WG_D8(i), WG_D8(i + 8), WG_D8(i + 16), WG_D8(i + 24)
WGMMA_E4M3_FN(8, "%0, %1, %2, %3", 4, 5, 6, WG_D4(0))
WGMMA_E4M3_FN(16, WG_R8, 8, 9, 10, WG_D8(0))
WGMMA_E4M3_FN(24, WG_R8 ", %8, %9, %10, %11", 12, 13, 14, WG_D8(0), WG_D4(8))
WGMMA_E4M3_FN(32, WG_R16, 16, 17, 18, WG_D8(0), WG_D8(8))
WGMMA_E4M3_FN(48, WG_R24, 24, 25, 26, WG_D8(0), WG_D8(8), WG_D8(16))
WGMMA_E4M3_FN(56, WG_R24 ", %24, %25, %26, %27", 28, 29, 30, WG_D8(0), WG_D8(8), WG_D8(16),
	      WG_D4(24))
WGMMA_E4M3_FN(64, WG_R32, 32, 33, 34, WG_D8x4(0))
WGMMA_E4M3_FN(72, WG_R32 ", %32, %33, %34, %35", 36, 37, 38, WG_D8x4(0), WG_D4(32))
WGMMA_E4M3_FN(80, WG_R40, 40, 41, 42, WG_D8x4(0), WG_D8(32))
WGMMA_E4M3_FN(96, WG_R48, 48, 49, 50, WG_D8x4(0), WG_D8(32), WG_D8(40))
WGMMA_E4M3_FN(112, WG_R56, 56, 57, 58, WG_D8x4(0), WG_D8(32), WG_D8(40), WG_D8(48))
WGMMA_E4M3_FN(120, WG_R56 ", %56, %57, %58, %59", 60, 61, 62, WG_D8x4(0), WG_D8(32), WG_D8(40),
	      WG_D8(48), WG_D4(56))
WGMMA_E4M3_FN(128, WG_R64, 64, 65, 66, WG_D8x4(0), WG_D8x4(32))
WGMMA_E4M3_FN(144, WG_R72, 72, 73, 74, WG_D8x4(0), WG_D8x4(32), WG_D8(64))
WGMMA_E4M3_FN(192, WG_R96, 96, 97, 98, WG_D8x4(0), WG_D8x4(32), WG_D8x4(64))

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Keeps the compiler from moving reads or writes of v across this point (a wgmma accumulator is
// written asynchronously: its registers are only valid after wgmma.wait_group).
__device__ __forceinline__ void wg_reg_fence(float &v) { asm volatile("" : "+f"(v)::"memory"); }

// Ordinary shared-memory stores of this thread made visible to the async proxy (wgmma operand
// reads) — each writing thread, before the barrier that hands the tile over
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
