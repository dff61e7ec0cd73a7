// wgmma_ss_probe.cu — how fast the token-wide grouped GEMM's MMA pattern can run with its operands
// already in shared memory: no copies, no barriers between warpgroups, one A tile (256 weight
// rows x 128 K bytes) and one B tile (NN token rows x 128 K bytes) reused every "K block".
// A diagnostic for issue 11 (docs/PERF.md, session 9), not part of the engine (it uses the CUDA
// runtime). Build here, run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels_ptx -o /tmp/wgmma_ss_probe tools/probes/wgmma_ss_probe.cu
//   /tmp/wgmma_ss_probe
// Each line: the form, cycles per K block per consumer warpgroup (clock64 in the kernel), the
// GPU's TFLOP/s (132 CTAs x 2 consumer warpgroups; the "3 warpgroups" forms 3, one 64-row chain
// each: a 192-row item, session 10) and its ratio to the dense FP8 peak at the measured clock
// (8192 FLOP a cycle an SM).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include "mma.cuh" // smem_u32
#include "wgmma.cuh"

// The operands: bytes of e4m3 values in [-2, 2] (no NaN codes) for the A tile (32 KB) and the
// NN-row B tile at base, the scales (4 (NN + 16) floats) at sc_s all 1; then visible to wgmma.
__device__ void fill_operands(uint32_t base, int NN, uint32_t sc_s)
{
	for (int i = threadIdx.x; i < (32768 + NN * 128) / 4; i += blockDim.x) {
		uint32_t h = (uint32_t)i * 2654435761u ^ 0x9e3779b9u;
		h &= 0x3f3f3f3fu; // exponent <= 7: |x| < 2
		asm volatile("st.shared.u32 [%0], %1;" ::"r"(base + 4 * i), "r"(h));
	}
	for (int i = threadIdx.x; i < 4 * (NN + 16); i += blockDim.x)
		asm volatile("st.shared.f32 [%0], %1;" ::"r"(sc_s + 4 * i), "f"(1.0f));
	fence_proxy_async();
	__syncthreads();
}

// MODE 0: per K block two chains, each 4 MMAs into a fresh fragment, wait, promote (the
// token-wide kernel's consumer); 1: the MMAs straight into the accumulators, a wait after each
// chain, no promotion; 3: as 1 with one wait a K block (after both chains); 4: as 0 with the two
// warpgroups' chains issued in turn (ping-pong: named barrier 1 hands the MMA turn to warpgroup
// 2, barrier 2 back to 1), so one promotes while the other's MMAs run; 9: as 0 with the chain's
// scale products (sx * sw, as a scale warp could store them, laid out per thread) loaded into
// registers before its wait, so the promotion is FFMAs only.
template <int NN, int MODE>
__global__ void __launch_bounds__(384, 1) probe(int iters, long long *cycles, float *sink)
{
	extern __shared__ __align__(1024) uint8_t sm[];
	const uint32_t a_s = (smem_u32(sm) + 1023) & ~1023u, b_s = a_s + 32768, sc_s = b_s + NN * 128;
	fill_operands(a_s, NN, sc_s);
	const int wg = threadIdx.x >> 7, q = threadIdx.x & 3;
	if (wg == 0) {
		asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
		return;
	}
	asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
	const int cw = wg - 1;
	float acc0[NN / 2], acc1[NN / 2], f0[NN / 2];
#pragma unroll
	for (int i = 0; i < NN / 2; i++)
		acc0[i] = acc1[i] = 0.f;
	const uint64_t da = wgd_kmajor(a_s + cw * 64 * 128), db = wgd_kmajor(b_s);
	const uint64_t da1 = da + ((uint64_t)(16384) >> 4);
	long long t0 = clock64();
	for (int it = 0; it < iters; it++) {
#pragma unroll
		for (int c = 0; c < 2; c++) {
			float *acc = c ? acc1 : acc0;
			const uint64_t a = c ? da1 : da;
#pragma unroll
			for (int i = 0; i < NN / 2; i++)
				wg_reg_fence(f0[i]);
			if (MODE == 4 && (cw == 1 || it > 0 || c > 0)) // my turn
				asm volatile("bar.sync %0, 256;" ::"r"(cw == 0 ? 2 : 1) : "memory");
			wg_fence();
#pragma unroll
			for (int k = 0; k < 4; k++)
				wgmma_e4m3<NN>(MODE == 1 || MODE == 3 ? acc : f0, a + 2 * k, db + 2 * k, MODE == 1 || MODE == 3 || k > 0);
			wg_commit();
			// MODE 9: the promotion's scale products into registers while the MMAs run
			constexpr int NP = MODE == 9 ? NN / 4 : 4;
			float pre[NP];
			if (MODE == 9) {
#pragma unroll
				for (int j = 0; j < NP; j += 4)
					asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
						     : "=f"(pre[j]), "=f"(pre[j + 1]), "=f"(pre[j + 2]), "=f"(pre[j + 3])
						     : "r"(sc_s + 4 * (q * (NN / 4 + 4) + j)));
			}
			if (MODE == 4) // the other's turn
				asm volatile("bar.arrive %0, 256;" ::"r"(cw == 0 ? 1 : 2) : "memory");
			if (MODE == 3 && c == 0)
				continue;
			wg_wait0();
#pragma unroll
			for (int i = 0; i < NN / 2; i++)
				wg_reg_fence(f0[i]);
			if (MODE == 0 || MODE == 4) {
#pragma unroll
				for (int j = 0; j < NN / 8; j++) {
					float x0, x1;
					asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
						     : "=f"(x0), "=f"(x1)
						     : "r"(sc_s + 4 * (8 * j + 2 * q)));
					const float s0 = x0 * 0.5f, s1 = x1 * 0.5f;
					acc[4 * j + 0] = fmaf(f0[4 * j + 0], s0, acc[4 * j + 0]);
					acc[4 * j + 1] = fmaf(f0[4 * j + 1], s1, acc[4 * j + 1]);
					acc[4 * j + 2] = fmaf(f0[4 * j + 2], s0, acc[4 * j + 2]);
					acc[4 * j + 3] = fmaf(f0[4 * j + 3], s1, acc[4 * j + 3]);
				}
			}
			if (MODE == 9) {
#pragma unroll
				for (int j = 0; j < NP / 2; j++) {
					acc[4 * j + 0] = fmaf(f0[4 * j + 0], pre[2 * j], acc[4 * j + 0]);
					acc[4 * j + 1] = fmaf(f0[4 * j + 1], pre[2 * j + 1], acc[4 * j + 1]);
					acc[4 * j + 2] = fmaf(f0[4 * j + 2], pre[2 * j], acc[4 * j + 2]);
					acc[4 * j + 3] = fmaf(f0[4 * j + 3], pre[2 * j + 1], acc[4 * j + 3]);
				}
			}
		}
	}
	wg_wait0();
	if (MODE == 4 && cw == 0) // warpgroup 2's last hand-over
		asm volatile("bar.sync 2, 256;" ::: "memory");
	long long t1 = clock64();
	float s = 0.f;
#pragma unroll
	for (int i = 0; i < NN / 2; i++)
		s += acc0[i] + acc1[i];
	if (s == 12345.f)
		sink[threadIdx.x] = s;
	if ((threadIdx.x & 127) == 0)
		cycles[blockIdx.x * 2 + cw] = t1 - t0;
}

// Three consumer warpgroups (512 threads: warpgroup 0 idle at 24 registers, the consumers at
// 160), one chain each a K block: 4 MMAs of its 64 rows into a fresh fragment, wait, promote
// (PRE 0: LDS + FMUL + FFMA as MODE 0; 1: the scale products loaded before the wait, as MODE 9).
// Three chains in flight an SM instead of two; an item would be 192 weight rows.
template <int NN, int PRE>
__global__ void __launch_bounds__(512, 1) probe3(int iters, long long *cycles, float *sink)
{
	extern __shared__ __align__(1024) uint8_t sm[];
	const uint32_t a_s = (smem_u32(sm) + 1023) & ~1023u, b_s = a_s + 32768, sc_s = b_s + NN * 128;
	fill_operands(a_s, NN, sc_s);
	const int wg = threadIdx.x >> 7, q = threadIdx.x & 3;
	if (wg == 0) {
		asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
		return;
	}
	asm volatile("setmaxnreg.inc.sync.aligned.u32 160;");
	const int cw = wg - 1;
	float acc[NN / 2], f0[NN / 2];
#pragma unroll
	for (int i = 0; i < NN / 2; i++)
		acc[i] = 0.f;
	const uint64_t da = wgd_kmajor(a_s + cw * 64 * 128), db = wgd_kmajor(b_s);
	long long t0 = clock64();
	for (int it = 0; it < iters; it++) {
#pragma unroll
		for (int i = 0; i < NN / 2; i++)
			wg_reg_fence(f0[i]);
		wg_fence();
#pragma unroll
		for (int k = 0; k < 4; k++)
			wgmma_e4m3<NN>(f0, da + 2 * k, db + 2 * k, k > 0);
		wg_commit();
		constexpr int NP = PRE ? NN / 4 : 4;
		float pre[NP];
		if (PRE) {
#pragma unroll
			for (int j = 0; j < NP; j += 4)
				asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
					     : "=f"(pre[j]), "=f"(pre[j + 1]), "=f"(pre[j + 2]), "=f"(pre[j + 3])
					     : "r"(sc_s + 4 * (q * (NN / 4 + 4) + j)));
		}
		wg_wait0();
#pragma unroll
		for (int i = 0; i < NN / 2; i++)
			wg_reg_fence(f0[i]);
#pragma unroll
		for (int j = 0; j < NN / 8; j++) {
			float s0, s1;
			if (PRE) {
				s0 = pre[2 * j], s1 = pre[2 * j + 1];
			} else {
				float x0, x1;
				asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
					     : "=f"(x0), "=f"(x1)
					     : "r"(sc_s + 4 * (8 * j + 2 * q)));
				s0 = x0 * 0.5f, s1 = x1 * 0.5f;
			}
			acc[4 * j + 0] = fmaf(f0[4 * j + 0], s0, acc[4 * j + 0]);
			acc[4 * j + 1] = fmaf(f0[4 * j + 1], s1, acc[4 * j + 1]);
			acc[4 * j + 2] = fmaf(f0[4 * j + 2], s0, acc[4 * j + 2]);
			acc[4 * j + 3] = fmaf(f0[4 * j + 3], s1, acc[4 * j + 3]);
		}
	}
	long long t1 = clock64();
	float s = 0.f;
#pragma unroll
	for (int i = 0; i < NN / 2; i++)
		s += acc[i];
	if (s == 12345.f)
		sink[threadIdx.x] = s;
	if ((threadIdx.x & 127) == 0)
		cycles[blockIdx.x * 3 + cw] = t1 - t0;
}

// nwg consumer warpgroups a block (plus the idle warpgroup 0), chains of them each a K block
template <int NN>
static void run_k(void (*kern)(int, long long *, float *), const char *name, int iters,
		  int nwg = 2, int chains = 2)
{
	const int blocks = 132, smem = 32768 + NN * 128 + 4 * (NN + 16) * 4 + 2048;
	long long *cyc;
	float *sink;
	cudaMalloc(&cyc, blocks * nwg * sizeof(long long));
	cudaMalloc(&sink, 512 * 4);
	cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	const int threads = 128 * (nwg + 1);
	kern<<<blocks, threads, smem>>>(iters / 10, cyc, sink); // warm-up
	cudaEvent_t e0, e1;
	cudaEventCreate(&e0), cudaEventCreate(&e1);
	cudaEventRecord(e0);
	kern<<<blocks, threads, smem>>>(iters, cyc, sink);
	cudaEventRecord(e1);
	cudaError_t err = cudaEventSynchronize(e1);
	if (err != cudaSuccess) {
		printf("%s: %s\n", name, cudaGetErrorString(err));
		return;
	}
	float ms;
	cudaEventElapsedTime(&ms, e0, e1);
	long long h[132 * 3], mx = 0;
	cudaMemcpy(h, cyc, sizeof(long long) * blocks * nwg, cudaMemcpyDeviceToHost);
	for (int i = 0; i < blocks * nwg; i++)
		mx = h[i] > mx ? h[i] : mx;
	const double flop = 2.0 * blocks * nwg * chains * (double)iters * 64 * NN * 128;
	const double tf = flop / (ms * 1e-3) / 1e12, ghz = mx / (ms * 1e-3) / 1e9;
	// MMA cycles a K block: nwg x chains chains of 64 x NN x 128 an SM
	const double ideal = (double)nwg * chains * 64 * NN * 128 * 2 / 8192;
	printf("%-34s NN=%3d  %7.0f cycles/K block (ideal %4.0f, %4.1f%%)  %6.1f TFLOP/s  clock %.2f GHz\n",
	       name, NN, (double)mx / iters, ideal, 100.0 * ideal / ((double)mx / iters), tf, ghz);
	cudaFree(cyc), cudaFree(sink);
}

template <int NN, int MODE>
static void run(const char *name, int iters)
{
	run_k<NN>(probe<NN, MODE>, name, iters);
}

int main()
{
	const int iters = 20000;
	run<144, 0>("chains + wait + promote", iters);
	run<128, 0>("chains + wait + promote", iters);
	run<96, 0>("chains + wait + promote", iters);
	run<144, 1>("chains + wait, no promote", iters);
	run<128, 1>("chains + wait, no promote", iters);
	run<144, 3>("one wait a K block, no promote", iters);
	run<144, 4>("ping-pong chains + wait + promote", iters);
	run<128, 4>("ping-pong chains + wait + promote", iters);
	run<96, 9>("scale products preloaded", iters);
	run<128, 9>("scale products preloaded", iters);
	run_k<128>(probe3<128, 0>, "3 warpgroups, one chain each", iters, 3, 1);
	run_k<112>(probe3<112, 0>, "3 warpgroups, one chain each", iters, 3, 1);
	run_k<96>(probe3<96, 0>, "3 warpgroups, one chain each", iters, 3, 1);
	run_k<96>(probe3<96, 1>, "3 warpgroups, products preloaded", iters, 3, 1);
	run_k<112>(probe3<112, 1>, "3 warpgroups, products preloaded", iters, 3, 1);
	return 0;
}
