// tma.cuh — the asynchronous-copy pipeline primitives shared by the TMA kernels (the streaming
// decode GEMM gemm_fp8_stream.cu, the wgmma GEMM gemm_fp8_wgmma.cu, the one-row GEMM
// gemm_fp8_gemv.cu): mbarriers (init, arrive, arrive with expected transaction bytes, arrive once
// a thread's cp.asyncs have landed, a wait that traps after 2 s), 1-D bulk copies with an L2
// eviction policy, 2-D bulk tensor copies (with and without one), the L2 policies, and the
// tensor-map type with the device-side copy of a template map under a new global address (a
// group's weights whose address is only known on the device). PTX ISA 8.x, sm_90. Device code
// only.
#pragma once
#include <stdint.h>

#include "mma.cuh" // smem_u32

// A CUtensorMap (opaque, 128 bytes, 64-byte aligned) without cuda.h in device code.
struct __align__(64) tmap {
	unsigned long long opaque[16];
};

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Blocks until the phase of parity `parity` of the barrier has completed. A fresh barrier is in
// phase 0, so waiting for parity 1 returns at once (the producer's first pass over the ring).
// A wait that has not finished after 2 s (%globaltimer, checked every 4096 tries) is a bug (a
// lost arrival or copy): it traps, so a test fails with a launch error instead of hanging the
// runner. (No printf: a function call in a kernel makes ptxas serialise every wgmma, C7510.)
// ACQ_CLUSTER: the wait acquires at cluster scope (arrivals released by another CTA of the
// cluster, k_mla_decode_wg2); by default the instruction's CTA scope.
template <bool TIMEOUT = true, bool ACQ_CLUSTER = false>
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
	uint32_t done, t0 = 0;
	for (uint32_t tries = 1;; tries++) {
		if (ACQ_CLUSTER)
			asm volatile("{\n.reg .pred p;\n"
				     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
				     "selp.u32 %0, 1, 0, p;\n}\n"
				     : "=r"(done)
				     : "r"(bar), "r"(parity)
				     : "memory");
		else
			asm volatile("{\n.reg .pred p;\n"
				     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
				     "selp.u32 %0, 1, 0, p;\n}\n"
				     : "=r"(done)
				     : "r"(bar), "r"(parity)
				     : "memory");
		if (done)
			return;
		if (TIMEOUT && (tries & 4095) == 0) { // low 32 bits of the ns timer: 4.3 s wrap
			uint32_t now;
			asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(now));
			if (!t0)
				t0 = now | 1;
			else if (now - t0 > 2000000000u)
				__trap();
		}
	}
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One arrival that also expects `bytes` of copy-engine transactions before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
		     : "memory");
}

// One arrival for the calling warp (lane: its lane id), once every lane has reached this point:
// a consumer warp releasing the stage whose reads it has finished.
__device__ __forceinline__ void mbar_arrive_warp(uint32_t bar, int lane)
{
	__syncwarp();
	if (lane == 0)
		mbar_arrive(bar);
}

// An arrival on the mbarrier once this thread's cp.asyncs so far have landed (counted in the
// barrier's expected arrivals: .noinc)
__device__ __forceinline__ void cp_async_arrive(uint32_t bar)
{
	asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// 1-D bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory
// into shared memory at dst, completing on bar, with an L2 eviction policy.
__device__ __forceinline__ void bulk_load_hint(uint32_t dst, const void *src, uint32_t bytes,
					       uint32_t bar, uint64_t policy)
{
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
		     " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
		     "l"(src), "r"(bytes), "r"(bar), "l"(policy)
		     : "memory");
}

// Box (c0 = K byte, c1 = row) of the 2-D tensor map into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *map, uint32_t bar, int c0,
					    int c1)
{
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
		     "l"(map), "r"(bar), "r"(c0), "r"(c1)
		     : "memory");
}

// The same with an L2 eviction policy (l2_evict_first / l2_evict_normal).
__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const void *map, uint32_t bar,
						 int c0, int c1, uint64_t policy)
{
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     ".L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
		     "l"(map), "r"(bar), "r"(c0), "r"(c1), "l"(policy)
		     : "memory");
}

// The same box written to the same CTA-relative shared offset in every CTA of ctamask (bit r:
// the cluster's CTA r), each copy completing on that CTA's barrier at bar's offset.
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const void *map, uint32_t bar, int c0,
					       int c1, uint16_t ctamask)
{
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
		     "l"(map), "r"(bar), "r"(c0), "r"(c1), "h"(ctamask)
		     : "memory");
}

__device__ __forceinline__ uint64_t l2_evict_first()
{
	uint64_t p;
	asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
	return p;
}

__device__ __forceinline__ uint64_t l2_evict_normal()
{
	uint64_t p;
	asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
	return p;
}

// *dst (global) = tmpl with its global address replaced by addr, visible to the tensor-map proxy
// of later copies (release; the user acquires with fence.proxy.tensormap::generic.acquire).
// The whole warp calls it; scratch: a 128-byte-aligned shared tmap.
__device__ __forceinline__ void tmap_store_at(tmap *dst, const tmap &tmpl, unsigned long long addr,
					      tmap *scratch)
{
	if ((threadIdx.x & 31) == 0) {
		*scratch = tmpl;
		asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" ::"r"(
				     smem_u32(scratch)),
			     "l"(addr)
			     : "memory");
	}
	__syncwarp();
	asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu"
		     ".sync.aligned [%0], [%1], 128;" ::"l"(dst),
		     "r"(smem_u32(scratch))
		     : "memory");
}
