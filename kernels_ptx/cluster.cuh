// cluster.cuh — thread-block-cluster primitives shared by the cluster kernels (the wgmma GEMM's
// multicast clusters, gemm_fp8_wgmma.cu; the swapped decode kernel's clusters,
// gemm_fp8_stream.cu; the few-row top-k over 8 / 16 CTAs, topk.cu; the MLA decode's CTA pair,
// mla_wgmma.cu). PTX ISA 7.8+, sm_90. Device code only.
#pragma once
#include <stdint.h>

// Every thread of every CTA of the cluster: release this CTA's prior writes (shared memory,
// barrier inits) to the cluster and wait until every CTA has arrived. Used at the start (inits
// visible before any remote access) and at the end (no CTA leaves while a peer may still read or
// signal its shared memory).
// cluster_sync in two halves: arrive (releasing this thread's prior writes) as soon as it has
// nothing more to give, wait (acquiring every CTA's) only where it must; each thread once each,
// in that order.
__device__ __forceinline__ void cluster_arrive()
{
	asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait()
{
	asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}

__device__ __forceinline__ void cluster_sync()
{
	cluster_arrive();
	cluster_wait();
}

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank()
{
	uint32_t r;
	asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
	return r;
}

// The shared::cluster address of this CTA's shared address a (32-bit, cvta form) in the
// cluster's CTA `rank` (maybe this one).
__device__ __forceinline__ uint32_t cl_mapa(uint32_t a, uint32_t rank)
{
	uint32_t r;
	asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
	return r;
}

// One arrival on the mbarrier at CTA-relative shared address bar in the cluster's CTA `rank`
// (maybe this one). REL_CLUSTER: released at cluster scope (the arriving thread's prior reads
// and writes ordered before the other CTA's acquiring wait; default: the instruction's own).
template <bool REL_CLUSTER = false>
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank)
{
#define MBAR_ARRIVE_CLUSTER(SEM)                                                                   \
	asm volatile("{\n.reg .b32 ra;\n"                                                        \
		     "mapa.shared::cluster.u32 ra, %0, %1;\n"                                     \
		     "mbarrier.arrive" SEM ".shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),        \
		     "r"(rank)                                                                    \
		     : "memory")
	if (REL_CLUSTER)
		MBAR_ARRIVE_CLUSTER(".release.cluster");
	else
		MBAR_ARRIVE_CLUSTER("");
#undef MBAR_ARRIVE_CLUSTER
}

// 16 bytes into the shared memory of a CTA of the cluster at cluster address addr, completing 16
// bytes of the transaction count of its mbarrier at cluster address bar (no wait here for them
// to land: the receiver waits on bar).
__device__ __forceinline__ void cl_st_async(uint32_t addr, uint4 v, uint32_t bar)
{
	asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(addr),
		     "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
		     : "memory");
}
