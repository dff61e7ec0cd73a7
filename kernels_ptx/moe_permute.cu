// moe_permute.cu — token permutation by expert and the weighted combine of the MoE block
// (spec §3.9), deterministic and exact.
//
// k_moe_permute: idx int [T, K] (each token's K experts) -> counts int [E], offsets int [E + 1]
//   (exclusive prefix of counts), perm int [T * K]: perm[t*K + n] = the row of (t, n) in the
//   expert-sorted order, where within an expert the rows are in ascending t (the CPU's order),
//   and src int [T * K]: the token of each sorted row. One block of 256 threads: thread e counts
//   expert e and places its rows by one ordered scan of idx (E <= 256).
// k_moe_gather: x bf16 [T, D] -> xs bf16 [T*K, D], xs[r] = x[src[r]]; one block per sorted row,
//   16-byte copies (D % 8 == 0).
// k_moe_combine: y[t, d] = bf16( Σ_n ex[perm[t*K+n], d] * w[t, n] + sh[t, d] ) with the picks in
//   the order of idx (ascending expert id), one fp32 multiply and one fp32 add each, no FMA
//   contraction: bit-identical to the CPU's moe_combine. ex bf16 [T*K, D] (expert outputs in
//   sorted order), w fp32 [T, K], sh bf16 [T, D], y bf16 [T, D]. Grid-stride over T * D.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
k_moe_permute(const int *__restrict__ idx, int T, int K, int E, int *__restrict__ counts,
	      int *__restrict__ offsets, int *__restrict__ perm, int *__restrict__ src)
{
	__shared__ int cnt[256], off[257];
	const int e = threadIdx.x;
	const int n = T * K;
	if (e < E) {
		int c = 0;
		for (int i = 0; i < n; i++)
			c += idx[i] == e;
		cnt[e] = c;
	}
	__syncthreads(); // every expert's count is known
	if (e == 0) {
		off[0] = 0;
		for (int k = 0; k < E; k++)
			off[k + 1] = off[k] + cnt[k];
	}
	__syncthreads(); // offsets known
	if (e < E) {
		int r = off[e];
		for (int i = 0; i < n; i++) // ascending (t, n): rows of expert e in token order
			if (idx[i] == e) {
				perm[i] = r;
				src[r] = i / K;
				r++;
			}
		counts[e] = cnt[e];
		offsets[e] = off[e];
	}
	if (e == 0)
		offsets[E] = off[E];
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
