// cluster_probe.cu — how many thread-block clusters of 2 / 4 / 8 blocks of a given dynamic
// shared-memory size the H200 holds at once: cudaOccupancyMaxActiveClusters, and a check by
// launch (each block spins ~100 us and records its start and end on %globaltimer; a block that
// started after the first block ended was not resident in the first wave). A diagnostic for
// issue 9 (the swapped decode GEMM's clusters of 4, docs/PERF.md session 18), not part of the
// engine (CUDA runtime). Build here, run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cluster_probe \
//        tools/probes/cluster_probe.cu
//   /tmp/cluster_probe
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

__device__ __forceinline__ unsigned long long gtime()
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__global__ void k_spin(unsigned long long *t, int *sm)
{
	extern __shared__ unsigned char smem[];
	const unsigned long long t0 = gtime();
	if (threadIdx.x == 0)
		smem[0] = 1;
	while (gtime() - t0 < 100000) // 100 us
		;
	if (threadIdx.x == 0) {
		unsigned s;
		asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
		t[2 * blockIdx.x] = t0, t[2 * blockIdx.x + 1] = gtime(), sm[blockIdx.x] = (int)s;
	}
}

int main()
{
	cudaDeviceProp p;
	cudaGetDeviceProperties(&p, 0);
	printf("%s: %d SMs, opt-in smem %zu\n", p.name, p.multiProcessorCount, p.sharedMemPerBlockOptin);
	cudaFuncSetAttribute(k_spin, cudaFuncAttributeMaxDynamicSharedMemorySize,
			     (int)p.sharedMemPerBlockOptin);
	cudaFuncSetAttribute(k_spin, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
	unsigned long long *t;
	int *sm;
	cudaMalloc(&t, 2 * 1024 * 8);
	cudaMalloc(&sm, 1024 * 4);
	const int sizes[] = {2, 4, 8}, smems[] = {64 << 10, 100 << 10, 120 << 10, 200 << 10, 227 << 10};
	for (int cs : sizes)
		for (int sb : smems) {
			if (sb > (int)p.sharedMemPerBlockOptin)
				sb = (int)p.sharedMemPerBlockOptin;
			cudaLaunchConfig_t cfg = {};
			cudaLaunchAttribute at[1];
			at[0].id = cudaLaunchAttributeClusterDimension;
			at[0].val.clusterDim.x = cs, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
			cfg.attrs = at, cfg.numAttrs = 1;
			cfg.blockDim = dim3(288), cfg.dynamicSmemBytes = (size_t)sb;
			const int want = 132 / cs; // clusters of a one-wave grid over every SM
			cfg.gridDim = dim3(want * cs);
			int nc = -1;
			cudaError_t e = cudaOccupancyMaxActiveClusters(&nc, k_spin, &cfg);
			// the launch: how many of `want` clusters started in the first wave
			cudaMemset(t, 0, 2 * 1024 * 8);
			cudaError_t el = cudaLaunchKernelEx(&cfg, k_spin, t, sm);
			cudaDeviceSynchronize();
			unsigned long long h[2 * 1024];
			int hs[1024];
			cudaMemcpy(h, t, sizeof h, cudaMemcpyDeviceToHost);
			cudaMemcpy(hs, sm, sizeof hs, cudaMemcpyDeviceToHost);
			unsigned long long first_end = ~0ull, t0 = ~0ull, tend = 0;
			for (int b = 0; b < want * cs; b++) {
				first_end = h[2 * b + 1] < first_end ? h[2 * b + 1] : first_end;
				t0 = h[2 * b] < t0 ? h[2 * b] : t0;
				tend = h[2 * b + 1] > tend ? h[2 * b + 1] : tend;
			}
			int wave1 = 0;
			for (int b = 0; b < want * cs; b++)
				wave1 += h[2 * b] < first_end;
			printf("cluster %d, smem %3d KB: max active clusters %3d (%s); launched %d clusters "
			       "(%s): %d of %d blocks in the first wave, all done in %.0f us\n",
			       cs, sb >> 10, nc, cudaGetErrorString(e), want, cudaGetErrorString(el),
			       wave1, want * cs, (tend - t0) / 1e3);
		}
	return 0;
}
