// mma.cuh — warp-level tensor-core and shared-memory primitives shared by the kernels: the
// mma.sync shapes they use (bf16 / fp16 m16n8k16, e4m3 m16n8k32, fp32 accumulators), ldmatrix
// (plain and transposed), cp.async and named barriers. Fragment layouts are PTX's (ISA "Matrix
// fragments for mma.m16n8k16 / m16n8k32"): with g = lane / 4, t = lane % 4, A row-major 16 x K
// (a0: row g, a1: row g + 8, a2/a3: the same rows, the upper half of K), B column-major K x 8
// (b0: column g, the lower half of K; b1: the upper half), C/D c0 c1: row g, columns 2t, 2t + 1;
// c2 c3: row g + 8. Device code only.
#pragma once
#include <stdint.h>

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes of shared memory at addr; volatile keeps the load after the mbarrier wait that made
// them valid (the decode GEMMs' weight fragments, gemm_fp8_stream.cu, gemm_fp8_gemv.cu)
__device__ __forceinline__ uint4 lds128(uint32_t addr)
{
	uint4 r;
	asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
		     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
		     : "r"(addr));
	return r;
}

// barrier `id` (1-15; 0 is __syncthreads') among the first `n` threads of the block (a
// producer/consumer kernel's consumer warps; the producer never joins)
__device__ __forceinline__ void named_bar_sync(int id, int n)
{
	asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// c += A (16xK) * B (Kx8) for the element type TY (a PTX type string) and K
#define MMA_SYNC_F32(SHAPE, TY, c, a0, a1, a2, a3, b0, b1)                                        \
	asm volatile("mma.sync.aligned." SHAPE ".row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, "     \
		     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                        \
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                \
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

// c += A (16x16 bf16) * B (16x8 bf16)
__device__ __forceinline__ void mma_bf16_16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
					       uint32_t a3, uint32_t b0, uint32_t b1)
{
	MMA_SYNC_F32("m16n8k16", "bf16", c, a0, a1, a2, a3, b0, b1);
}

// c += A (16x16 fp16) * B (16x8 fp16)
__device__ __forceinline__ void mma_f16_16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
					      uint32_t a3, uint32_t b0, uint32_t b1)
{
	MMA_SYNC_F32("m16n8k16", "f16", c, a0, a1, a2, a3, b0, b1);
}

// c += A (16x32 e4m3) * B (32x8 e4m3); a register holds 4 consecutive K elements
__device__ __forceinline__ void mma_e4m3_16832(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
					       uint32_t a3, uint32_t b0, uint32_t b1)
{
	MMA_SYNC_F32("m16n8k32", "e4m3", c, a0, a1, a2, a3, b0, b1);
}

// Four 8x8 b16 matrices; lanes 8i .. 8i+7 give the row addresses of matrix i (16 bytes each)
__device__ __forceinline__ void ldsm_x4(uint32_t a, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
		     : "r"(a));
}

// The same, each matrix transposed (rows of the stored matrix become columns of the fragment)
__device__ __forceinline__ void ldsm_x4_t(uint32_t a, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
		     : "r"(a));
}

// Asynchronous global -> shared copies of 16 (L2 only), 8 or 4 bytes; commit; waits
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void *src)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait_group()
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
