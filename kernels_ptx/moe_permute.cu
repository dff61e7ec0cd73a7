// moe_permute.cu — token permutation by expert and the weighted combine of the MoE block
// (spec §3.9), deterministic and exact.
//
// k_moe_permute: idx int [T, K] (each token's K experts) -> counts int [E], offsets int [E + 2]
//   (exclusive prefix of counts; offsets[E] = T * K and offsets[E + 1] = T * K + T: the T rows
//   after the routed ones are group E of the block's grouped GEMMs, the shared expert),
//   perm int [T * K]: perm[t*K + n] = the row of (t, n) in the expert-sorted order, where
//   within an expert the rows are in ascending t (the CPU's order), and src int [T * K]: the
//   token of each sorted row. One block (a multiple of 32 threads, >= E and >= K; 1024 in
//   model/cuda_moe.c), E <= 256, each token's K experts distinct: a
//   shared-memory histogram, a warp scan for the offsets, then the tokens in passes of
//   min(PERM_CHUNK, threads / K), one entry per thread: a bitmask per expert of the pass's tokens
//   that hit it gives each row its rank by popcounts. (The body is moe_permute_block,
//   moe_route.cuh, which the fused router of moe_block.cu runs too.) k_moe_permute_count +
//   k_moe_permute_place: the same over many blocks (see below).
// k_moe_rank_picks: one rank's view of the picks under expert parallelism (docs/MULTIGPU.md
//   step 3): idx int [T * K] (experts in [0, E)) -> ridx int [T * K]: a pick of the rank's own
//   experts [e0, e1) becomes K + e - e0, any other pick n of its token becomes n. k_moe_permute
//   over the K + e1 - e0 virtual experts of ridx then sorts the other ranks' picks first (rows
//   [0, offsets[K]): K groups no GEMM runs) and the rank's experts after them, expert e0 + j as
//   group K + j (so offsets + K are the grouped GEMMs' offsets over the rank's experts, then the
//   shared expert); each token's picks stay distinct, as k_moe_permute needs. Grid-stride.
// k_moe_gather: x bf16 [T, D] -> xs bf16 [T*K, D], xs[r] = x[src[r]]; one block per sorted row,
//   16-byte copies (D % 8 == 0).
// k_moe_combine: y[t, d] = bf16( Σ_n ex[perm[t*K+n], d] * w[t, n] + sh[t, d] ) with the picks in
//   the order of idx (ascending expert id), one fp32 multiply and one fp32 add each, no FMA
//   contraction: bit-identical to the CPU's moe_combine. ex bf16 [T*K, D] (expert outputs in
//   sorted order), w fp32 [T, K], sh bf16 [T, D], y bf16 [T, D]. Grid-stride over T * D.
#include "moe_route.cuh" // moe_permute_block: the body of k_moe_permute

extern "C" __global__ void __launch_bounds__(256)
k_moe_rank_picks(const int *__restrict__ idx, int n, int K, int e0, int e1, int *__restrict__ ridx)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
		const int e = idx[i];
		ridx[i] = e >= e0 && e < e1 ? K + e - e0 : i % K;
	}
}

extern "C" __global__ void __launch_bounds__(1024)
k_moe_permute(const int *__restrict__ idx, int T, int K, int E, int *__restrict__ counts,
	      int *__restrict__ offsets, int *__restrict__ perm, int *__restrict__ src)
{
	moe_permute_block(idx, T, K, E, counts, offsets, perm, src);
}

// k_moe_permute_count + k_moe_permute_place: the same outputs over many blocks (prefill sizes;
// run 10: k_moe_permute took 67 us for 4096 tokens on its one block). Block b takes tokens
// [PERM_TOKENS b, PERM_TOKENS (b + 1)); grid NB = ceil(T / PERM_TOKENS) for both. count: bcnt
// int [NB, E], block b's rows per expert (a shared-memory histogram, 256 threads). place (1024
// threads): the totals per expert and the rows of the blocks before b (a pass over bcnt), the
// prefix (block 0 writes counts and offsets), then block b's tokens placed as k_moe_permute
// places them (perm_place, one pass of PERM_TOKENS tokens for K <= 8). E <= 256.
#define PERM_TOKENS 128
extern "C" __global__ void __launch_bounds__(256)
k_moe_permute_count(const int *__restrict__ idx, int T, int K, int E, int *__restrict__ bcnt)
{
	__shared__ int cnt[256];
	const int tid = threadIdx.x, b = blockIdx.x;
	for (int e = tid; e < E; e += 256)
		cnt[e] = 0;
	__syncthreads();
	const int n = (min(T, PERM_TOKENS * (b + 1)) - PERM_TOKENS * b) * K;
	for (int i = tid; i < n; i += 256)
		atomicAdd(&cnt[idx[PERM_TOKENS * b * K + i]], 1);
	__syncthreads();
	for (int e = tid; e < E; e += 256)
		bcnt[(size_t)b * E + e] = cnt[e];
}

extern "C" __global__ void __launch_bounds__(1024)
k_moe_permute_place(const int *__restrict__ idx, int T, int K, int E,
		    const int *__restrict__ bcnt, int *__restrict__ counts,
		    int *__restrict__ offsets, int *__restrict__ perm, int *__restrict__ src)
{
	__shared__ int tot[256], before[256], base[256];
	__shared__ unsigned hit[256][PERM_CHUNK / 32];
	const int tid = threadIdx.x, b = blockIdx.x, nb = gridDim.x;
	if (tid < E) {
		int t = 0, bf = 0;
		for (int k = 0; k < nb; k++) {
			const int v = bcnt[(size_t)k * E + tid];
			t += v;
			bf += k < b ? v : 0;
		}
		tot[tid] = t, before[tid] = bf;
	}
	__syncthreads(); // totals known
	perm_prefix(tot, base, E, T, b == 0 ? counts : nullptr, b == 0 ? offsets : nullptr);
	__syncthreads(); // base = the expert's first row
	if (tid < E)
		base[tid] += before[tid]; // + the rows of the blocks before this one
	perm_place(idx, PERM_TOKENS * b, min(T, PERM_TOKENS * (b + 1)), K, E, base, hit, perm, src);
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_gather(const uint16_t *__restrict__ x, const int *__restrict__ src, uint16_t *__restrict__ xs,
	     int D)
{
	const int r = blockIdx.x;
	const uint4 *from = reinterpret_cast<const uint4 *>(x + (size_t)src[r] * D);
	uint4 *to = reinterpret_cast<uint4 *>(xs + (size_t)r * D);
	for (int i = threadIdx.x; i < D / 8; i += blockDim.x)
		to[i] = from[i];
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_combine(const uint16_t *__restrict__ ex, const float *__restrict__ w,
	      const int *__restrict__ perm, const uint16_t *__restrict__ sh, uint16_t *__restrict__ y,
	      int T, int K, int D)
{
	const long long total = (long long)T * D;
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (long long)gridDim.x * blockDim.x) {
		const int t = (int)(i / D), d = (int)(i % D);
		float acc = 0.f;
		for (int k = 0; k < K; k++) {
			const float v = bf16_to_f32(ex[(size_t)perm[t * K + k] * D + d]);
			acc = __fadd_rn(acc, __fmul_rn(v, w[(size_t)t * K + k]));
		}
		y[i] = f32_to_bf16(__fadd_rn(acc, bf16_to_f32(sh[i])));
	}
}
