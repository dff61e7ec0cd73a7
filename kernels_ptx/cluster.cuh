// cluster.cuh — thread-block-cluster primitives shared by the cluster kernels (the wgmma GEMM's
// multicast clusters, gemm_fp8_wgmma.cu; the few-row top-k over 8 CTAs, topk.cu). PTX ISA 7.8+,
// sm_90. Device code only.
#pragma once
#include <stdint.h>

// Every thread of every CTA of the cluster: release this CTA's prior writes (shared memory,
// barrier inits) to the cluster and wait until every CTA has arrived. Used at the start (inits
// visible before any remote access) and at the end (no CTA leaves while a peer may still read or
// signal its shared memory).
__device__ __forceinline__ void cluster_sync()
{
	asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank()
{
	uint32_t r;
	asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
	return r;
}
