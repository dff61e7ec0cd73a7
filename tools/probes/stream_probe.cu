// stream_probe.cu — how fast the decode GEMM's weight stream can come in, by the layout of the
// weights in HBM and the kind of copy, nothing computed (or only the decode MMAs): the persistent
// grid (one block per SM, units = 128-row tile x K chunk, the host's chunk choice), its ring of
// stages of two K blocks (2 x 16 KB), one producer thread, 8 consumer warps that only release.
// A diagnostic for issue 9 (docs/PERF.md), not part of the engine (CUDA runtime). Build here,
// run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels_ptx \
//        -o /tmp/stream_probe tools/probes/stream_probe.cu -L/usr/local/cuda/lib64/stubs -lcuda
//   /tmp/stream_probe
// Forms: "rowmajor" = the checkpoint's [N][K] e4m3 through a 2-D tensor map, boxes of 128 rows
// x 128 bytes (the kernel's copies: each row gives 128 bytes a box, rows K bytes apart);
// "tiled" = the same bytes stored tile-contiguous ([N/128][K/128][128 rows][128 bytes]: a box is
// 16 KB in a row) through a 4-D tensor map with the same box; "bulk" = the tiled layout by 1-D
// bulk copies (a stage's 32 KB in one copy); "3d" = row-major through a 3-D map, one box of two
// K blocks a stage; "ldg" = a grid-stride 16-byte load reduction over the matrix. Each with or
// without 256-byte L2 promotion, 4 or 6 stages, R-row tiles (56 / 112 / 144: the swapped
// kernel's), "wgmma": consumers that do the decode kernel's MMAs at M <= 8, "+x" / "+S": the token
// boxes / the weight scales by cp.async in each stage, as the kernel's. Each line: us a
// matrix (the mean over 64 launches rotating over matrices that do not fit the L2), TB/s of
// weight bytes, and the SM clock the blocks ran at (clock64 against %globaltimer).
// `stream_probe l2`: instead, 8 / 16 / 32 MB read 64 times a launch (ld.global.cg), so the L2
// serves them: what the L2 can give all the SMs at once (the token-wide MoE GEMM's token rows
// come from there, session 13).
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>
#include "tma.cuh"
#include "wgmma.cuh"

#define BOX 16384

// a box of a 4-D tensor map at coordinates (0, c1, c2, c3)
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, uint32_t bar, int c1,
					    int c2, int c3, uint64_t pol)
{
	asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
		     ".L2::cache_hint [%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(dst),
		     "l"(map), "r"(bar), "r"(0), "r"(c1), "r"(c2), "r"(c3), "l"(pol)
		     : "memory");
}

// clock64 and %globaltimer of thread 0 of each block at its start and end (the SM clock the
// block ran at: the GPU's boost moves it)
__device__ __forceinline__ void stamp(unsigned long long *t, int at)
{
	unsigned long long ns;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
	t[4 * blockIdx.x + 2 * at] = clock64();
	t[4 * blockIdx.x + 2 * at + 1] = ns;
}

// Bytes of a stage of R-row boxes (two K blocks, at least 32 KB, 1 KB multiples)
__host__ __device__ inline int stage_bytes(int R)
{
	const int b = (2 * R * 128 + 1023) / 1024 * 1024;
	return b > 2 * BOX ? b : 2 * BOX;
}

// FORM 0: 2-D row-major boxes (R rows x one K block); 1: 4-D tiled boxes; 2: 1-D bulk over the
// tiled layout; 3: row-major through a 4-D map (bytes, rows, K blocks, 1), one box of R rows x
// two K blocks a stage. ADD (FORM 0, R = 128), what the decode kernel adds to a stage: bit 0 the
// consumer warpgroups compute as its at M <= 8 (per K block 4 wgmma m64n8k32 of their 64 weight
// rows and a token box held in shared memory, wait, promote; else they only release); bit 1 the
// tokens' boxes (8 rows x one K block each, from an L2-resident [8][K] tensor) in the stage's
// copies; bit 2 the weight scales S[tile][kb] by 4-byte cp.async from the producer warp's lanes,
// each lane's arrival counted on the stage's "full" barrier as the kernel's.
template <int FORM, int ADD = 0>
__global__ void __launch_bounds__(288, 1)
	k_stream(const __grid_constant__ CUtensorMap map, const __grid_constant__ CUtensorMap xmap,
		 const uint8_t *w, const float *S, int tiles, int chunks, int chunk_blocks, int KB,
		 int ns, int R, unsigned long long *times, float *sink)
{
	extern __shared__ __align__(1024) uint8_t sm[];
	uint64_t *full = reinterpret_cast<uint64_t *>(sm), *empty = full + 8;
	const uint32_t stage0 = (smem_u32(sm) + 128 + 1023) & ~1023u, SB = stage_bytes(R);
	// after the ring: a token box of 8 rows for the MMAs, the stages' token boxes, their scales
	const uint32_t tok = stage0 + ns * SB, xb0 = tok + 1024, scl = xb0 + ns * 2048;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	if (threadIdx.x == 0) {
		for (int s = 0; s < ns; s++)
			mbar_init(smem_u32(&full[s]), ADD & 4 ? 1 + 32 : 1), mbar_init(smem_u32(&empty[s]), 8);
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	for (int i = threadIdx.x; i < 256; i += blockDim.x) // nonzero e4m3 bytes
		asm volatile("st.shared.u32 [%0], %1;" ::"r"(tok + 4 * i), "r"(0x3a2c1e38u ^ i));
	fence_proxy_async();
	__syncthreads();
	if (threadIdx.x == 0)
		stamp(times, 0);
	const int units = tiles * chunks;
	int s = 0;
	uint32_t ph = 0;
	if (warp == 8) {
		if (!(ADD & 4) && lane != 0)
			return;
		const uint64_t pol = l2_evict_first(), pol_x = l2_evict_normal();
		for (int u = blockIdx.x; u < units; u += gridDim.x) {
			const int chunk = u % chunks, tile = u / chunks;
			const int kb0 = chunk * chunk_blocks, kb1 = min(KB, kb0 + chunk_blocks);
			for (int kb = kb0; kb < kb1; kb += 2) {
				const int nb = min(2, kb1 - kb);
				mbar_wait(smem_u32(&empty[s]), ph ^ 1);
				const uint32_t bar = smem_u32(&full[s]), dst = stage0 + s * SB;
				if (ADD & 4) {
					if (lane < nb)
						cp_async4(scl + 16 * s + 4 * lane, S + (size_t)tile * KB + kb + lane);
					cp_async_arrive(bar);
				}
				if (lane != 0) {
				} else if (FORM == 3) {
					mbar_arrive_expect_tx(bar, 2 * R * 128);
					tma_load_4d(dst, &map, bar, tile * R, kb, 0, pol);
				} else if (FORM == 0) {
					mbar_arrive_expect_tx(bar, nb * R * 128 + (ADD & 2 ? nb * 1024 : 0));
					for (int j = 0; j < nb; j++) {
						tma_load_2d_hint(dst + j * R * 128, &map, bar, (kb + j) * 128,
								 tile * R, pol);
						if (ADD & 2)
							tma_load_2d_hint(xb0 + s * 2048 + j * 1024, &xmap, bar,
									 (kb + j) * 128, 0, pol_x);
					}
				} else {
					mbar_arrive_expect_tx(bar, nb * BOX);
					if (FORM == 2)
						bulk_load_hint(dst, w + ((size_t)tile * KB + kb) * BOX, nb * BOX, bar,
							       pol);
					else
						for (int j = 0; j < nb; j++)
							tma_load_4d(dst + j * BOX, &map, bar, 0, kb + j, tile, pol);
				}
				if (++s == ns)
					s = 0, ph ^= 1;
			}
		}
		return;
	}
	float acc[4] = {0.f, 0.f, 0.f, 0.f}, frag[4];
	for (int u = blockIdx.x; u < units; u += gridDim.x) {
		const int chunk = u % chunks;
		const int kb0 = chunk * chunk_blocks, kb1 = min(KB, kb0 + chunk_blocks);
		for (int kb = kb0; kb < kb1; kb += 2) {
			mbar_wait(smem_u32(&full[s]), ph);
			if (ADD & 1) {
				const uint32_t st = stage0 + s * SB + (warp >> 2) * 64 * 128;
				for (int j = 0; j < min(2, kb1 - kb); j++) {
#pragma unroll
					for (int i = 0; i < 4; i++)
						wg_reg_fence(frag[i]);
					wg_fence();
#pragma unroll
					for (int k = 0; k < 4; k++)
						wgmma_e4m3<8>(frag, wgd_kmajor(st + j * BOX) + 2 * k, wgd_kmajor(tok) + 2 * k,
						       k > 0);
					wg_commit();
					wg_wait0();
#pragma unroll
					for (int i = 0; i < 4; i++)
						wg_reg_fence(frag[i]), acc[i] += frag[i] * 0.5f;
				}
			}
			__syncwarp();
			if (lane == 0)
				mbar_arrive(smem_u32(&empty[s]));
			if (++s == ns)
				s = 0, ph ^= 1;
		}
	}
	if ((ADD & 1) && acc[0] + acc[1] + acc[2] + acc[3] == 1.2345f)
		*sink = acc[0];
	asm volatile("bar.sync 1, 256;" ::: "memory"); // the consumer warps
	if (threadIdx.x == 0)
		stamp(times, 1);
}

__global__ void k_ldg(const uint4 *p, size_t n, unsigned *sink)
{
	unsigned x = 0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint4 v = __ldcs(p + i);
		x ^= v.x ^ v.y ^ v.z ^ v.w;
	}
	if (x == 0x12345678u)
		*sink = x;
}

// the same over n 16-byte words read reps times (word i % n), past L1 (ld.global.cg): with n
// small enough for the L2, what the L2 gives the SMs
__global__ void k_ldg_l2(const uint4 *p, size_t n, int reps, unsigned *sink)
{
	unsigned x = 0;
	const size_t total = n * (size_t)reps;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint4 v = __ldcg(p + i % n);
		x ^= v.x ^ v.y ^ v.z ^ v.w;
	}
	if (x == 0x12345678u)
		*sink = x;
}

// the host's K split (model/cuda_gemm.c cuda_gemm_decode_split)
static void split(int N, int K, int sms, int *chunks, int *cb_out)
{
	int kb = K / 128, tiles = (N + 127) / 128;
	double best = 1e30;
	for (int c = 1; c <= kb && c <= 64; c++) {
		int cb = (kb + c - 1) / c, ce = (kb + cb - 1) / cb;
		long long units = (long long)tiles * ce, rounds = (units + sms - 1) / sms;
		double cost = (double)rounds * (cb + 1.0) + (ce > 1 ? 3.0 : 0.0);
		if (cost < best - 1e-9)
			best = cost, *chunks = ce, *cb_out = cb;
	}
}

#define NMAT 12
#define ITERS 64

// form 0: 2-D [N][K] boxes {128 bytes, R rows}; 1: 4-D tiled {128, 128, 1, 1}; 3: (bytes, rows at
// stride K, K blocks at stride 128, 1) boxes {128, R, 2, 1}
static void encode(CUtensorMap *m, const void *base, int N, int K, int form, int R, int promo)
{
	CUresult r;
	const CUtensorMapL2promotion pr =
		promo ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE;
	if (form == 0) {
		cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)N}, str[1] = {(cuuint64_t)K};
		cuuint32_t box[2] = {128, (cuuint32_t)R}, es[2] = {1, 1};
		r = cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)base, dims, str,
					   box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
					   CU_TENSOR_MAP_SWIZZLE_128B, pr,
					   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	} else if (form == 3) {
		// (a fourth dimension of 1: one copy function for both multi-dimensional forms)
		cuuint64_t dims[4] = {128, (cuuint64_t)N, (cuuint64_t)K / 128, 1};
		cuuint64_t str[3] = {(cuuint64_t)K, 128, (cuuint64_t)N * K};
		cuuint32_t box[4] = {128, (cuuint32_t)R, 2, 1}, es[4] = {1, 1, 1, 1};
		r = cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, (void *)base, dims, str,
					   box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
					   CU_TENSOR_MAP_SWIZZLE_128B, pr,
					   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	} else {
		cuuint64_t dims[4] = {128, 128, (cuuint64_t)K / 128, (cuuint64_t)N / 128};
		cuuint64_t str[3] = {128, BOX, (cuuint64_t)BOX * (K / 128)};
		cuuint32_t box[4] = {128, 128, 1, 1}, es[4] = {1, 1, 1, 1};
		r = cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, (void *)base, dims, str,
					   box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
					   CU_TENSOR_MAP_SWIZZLE_128B, pr,
					   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	}
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "cuTensorMapEncodeTiled (form %d, R %d): %d\n", form, R, (int)r);
		exit(1);
	}
}

// R rows a tile; chunks: K chunks (0: the host's split for 128-row tiles)
static unsigned long long *d_times;
static float *d_sink, *d_scales[NMAT]; // each matrix's weight scales [N / 128][K / 128]
static uint8_t *d_tokens;             // [8][K max] e4m3, L2-resident like a decode step's tokens

typedef void (*stream_fn)(CUtensorMap, CUtensorMap, const uint8_t *, const float *, int, int, int,
			  int, int, int, unsigned long long *, float *);

// add: the decode kernel's additions to a stage (k_stream's ADD; FORM 0 only)
static stream_fn pick(int form, int add)
{
	switch (add) {
	case 1: return k_stream<0, 1>;
	case 2: return k_stream<0, 2>;
	case 4: return k_stream<0, 4>;
	case 6: return k_stream<0, 6>;
	case 7: return k_stream<0, 7>;
	default: break;
	}
	return form == 0 ? k_stream<0> : form == 1 ? k_stream<1> : form == 2 ? k_stream<2> : k_stream<3>;
}

// The mean time of launch(it) over ITERS launches (it = 0 ..), after `warm` unmeasured ones
// (it < 0), in us; a launch error ends the probe.
template <class F> static double launches_us(const char *name, int warm, F launch)
{
	cudaEvent_t e0, e1;
	cudaEventCreate(&e0), cudaEventCreate(&e1);
	for (int it = -warm; it < ITERS; it++) {
		if (it == 0)
			cudaEventRecord(e0);
		launch(it);
	}
	cudaEventRecord(e1);
	cudaError_t err = cudaEventSynchronize(e1);
	if (err != cudaSuccess) {
		fprintf(stderr, "%s: %s\n", name, cudaGetErrorString(err));
		exit(1);
	}
	float ms;
	cudaEventElapsedTime(&ms, e0, e1);
	cudaEventDestroy(e0), cudaEventDestroy(e1);
	return ms * 1e3 / ITERS;
}

static void run(const char *name, int form, int ns, int promo, uint8_t **mats, int N, int K,
		int sms, int R = 128, int chunks = 0, int add = 0)
{
	int cb = K / 128;
	if (!chunks)
		split(N, K, sms, &chunks, &cb);
	else
		cb = (K / 128 + chunks - 1) / chunks;
	const int tiles = N / R, units = tiles * chunks, grid = units < sms ? units : sms;
	CUtensorMap maps[NMAT], xmap;
	for (int i = 0; i < NMAT; i++)
		encode(&maps[i], mats[i], N, K, form, R, promo);
	{ // the tokens: 8 rows of K bytes, boxes of 8 rows x 128 bytes
		cuuint64_t dims[2] = {(cuuint64_t)K, 8}, str[1] = {(cuuint64_t)K};
		cuuint32_t box[2] = {128, 8}, es[2] = {1, 1};
		if (cuTensorMapEncodeTiled(&xmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, d_tokens, dims, str,
					   box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
					   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
					   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
			fprintf(stderr, "token map\n");
			exit(1);
		}
	}
	// the ring, a token box for the MMAs, the stages' token boxes and scales (k_stream)
	const int smem = 128 + 1024 + ns * stage_bytes(R) + 1024 + ns * 2048 + ns * 16;
	const stream_fn kern = pick(form, add);
	cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	const double us = launches_us(name, 8, [&](int it) {
		const int i = (it + 64) % NMAT;
		kern<<<grid, 288, smem>>>(maps[i], xmap, mats[i], d_scales[i], tiles, chunks, cb, K / 128,
					  ns, R, d_times, d_sink);
	});
	const double bytes = (double)N * K;
	unsigned long long t[4 * 132 * 2];
	cudaMemcpy(t, d_times, sizeof(unsigned long long) * 4 * grid, cudaMemcpyDeviceToHost);
	double clk = 0, ns_sum = 0;
	for (int b = 0; b < grid; b++)
		clk += (double)(t[4 * b + 2] - t[4 * b]), ns_sum += (double)(t[4 * b + 3] - t[4 * b + 1]);
	char adds[32];
	snprintf(adds, sizeof adds, "%s%s%s", add & 1 ? " wgmma" : "", add & 2 ? " +x" : "",
		 add & 4 ? " +S" : "");
	printf("%6dx%-6d %-9s R %3d stages %d promo %d grid %3d chunks %2d x %3d %-14s %7.2f us  %.3f "
	       "TB/s  SM %.2f GHz\n",
	       N, K, name, R, ns, promo, grid, chunks, cb, adds, us, bytes / us * 1e-6, clk / ns_sum);
}

static void run_ldg(uint8_t **mats, int N, int K, int sms, unsigned *sink)
{
	const size_t n = (size_t)N * K / 16;
	const double us = launches_us("ldg", 8, [&](int it) {
		k_ldg<<<sms * 4, 512>>>((const uint4 *)mats[(it + 64) % NMAT], n, sink);
	});
	printf("%6dx%-6d %-9s                                %7.2f us  %.3f TB/s\n", N, K, "ldg", us,
	       (double)N * K / us * 1e-6);
}

// ld.global.cg over mb MB of L2-resident data, read 64 times a launch (k_ldg_l2)
static void run_ldg_l2(const uint8_t *p, int mb, int sms, unsigned *sink)
{
	const size_t n = (size_t)mb << 16; // 16-byte words
	const double us = launches_us("ldg.cg", 4, [&](int) {
		k_ldg_l2<<<sms * 4, 512>>>((const uint4 *)p, n, 64, sink);
	});
	printf("ldg.cg %2d MB x 64, L2-resident: %8.1f us  %.3f TB/s\n", mb, us,
	       (double)n * 16 * 64 / us * 1e-6);
}

int main(int argc, char **argv)
{
	const bool l2 = argc > 1 && !strcmp(argv[1], "l2");
	int sms;
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
	const int shapes[3][2] = {{7168, 16384}, {18432, 7168}, {7168, 18432}};
	size_t most = 0;
	for (auto &sh : shapes)
		most = (size_t)sh[0] * sh[1] > most ? (size_t)sh[0] * sh[1] : most;
	uint8_t *mats[NMAT];
	for (int i = 0; i < NMAT; i++) {
		if (cudaMalloc(&mats[i], most) != cudaSuccess) {
			fprintf(stderr, "cudaMalloc failed\n");
			return 1;
		}
		cudaMemset(mats[i], 0x11 * (i + 1), most);
	}
	unsigned *sink;
	cudaMalloc(&sink, 4);
	printf("stream_probe: %d SMs, %d matrices rotated, %d launches each line\n", sms, NMAT, ITERS);
	cudaMalloc(&d_times, sizeof(unsigned long long) * 4 * 132 * 2);
	cudaMalloc(&d_sink, 4);
	for (int i = 0; i < NMAT; i++) { // (N / 128) x (K / 128) scales of the largest, 1.0f
		const size_t n = most / (128 * 128);
		float *h = (float *)malloc(n * 4);
		for (size_t j = 0; j < n; j++)
			h[j] = 1.0f;
		cudaMalloc(&d_scales[i], n * 4);
		cudaMemcpy(d_scales[i], h, n * 4, cudaMemcpyHostToDevice);
		free(h);
	}
	cudaMalloc(&d_tokens, 8 * 18432);
	cudaMemset(d_tokens, 0x38, 8 * 18432);
	if (l2) {
		for (int mb : {8, 16, 32})
			run_ldg_l2(mats[0], mb, sms, sink);
		return 0;
	}
	for (auto &sh : shapes) {
		const int N = sh[0], K = sh[1];
		run_ldg(mats, N, K, sms, sink);
		for (int p = 1; p >= 0; p--) // 256-byte L2 promotion, then none
			run("rowmajor", 0, 4, p, mats, N, K, sms);
		run("rowmajor", 0, 6, 0, mats, N, K, sms);
		run("tiled", 1, 4, 0, mats, N, K, sms);
		run("bulk", 2, 4, 0, mats, N, K, sms);
		run("3d", 3, 4, 0, mats, N, K, sms);
		// the swapped kernel's tiles: one tile a block (56 / 144 rows), or two K halves (112)
		const int r1 = N % 56 == 0 && N / 56 <= sms ? 56 : 144;
		run("rowmajor", 0, 6, 0, mats, N, K, sms, r1, 1);
		if (N % 112 == 0 && 2 * N / 112 <= sms)
			run("rowmajor", 0, 6, 0, mats, N, K, sms, 112, 2);
		// consumers with the decode kernel's wgmmas (the SM clock drops to ~1.8 GHz)
		for (int p = 1; p >= 0; p--)
			run("rowmajor", 0, 4, p, mats, N, K, sms, 128, 0, 1);
		// what else the decode kernel adds to a stage: token boxes, weight scales by cp.async
		for (int add : {2, 4, 6, 7})
			run("rowmajor", 0, 4, 0, mats, N, K, sms, 128, 0, add);
	}
	return 0;
}
