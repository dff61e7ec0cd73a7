// moe_route.cuh — the MoE routing of one token by a warp and the token permutation by one
// block, as device functions: the bodies of k_moe_route_w (moe_gate.cu) and k_moe_permute
// (moe_permute.cu), shared with the fused router of moe_block.cu (k_moe_gate_route_a8), which
// runs both in its last block. Spec §3.9; the numbers are the CPU's (moe_gate.cu's header).
#pragma once
#include "common.cuh"

#define PERM_CHUNK 128 // most tokens placed per pass of k_moe_permute

// (v, i) better than (w, j): larger value, ties to the lower index; i < 0 is "none" (worst).
__device__ __forceinline__ bool route_better(float v, int i, float w, int j)
{
	return i >= 0 && (j < 0 || v > w || (v == w && i < j));
}

// The routing of token t by one warp (k_moe_route_w, moe_gate.cu, documents it): E = 256 in
// G = 8 groups, K <= 32, topk_group <= 8. logits are read through L2 (__ldcg): they may have
// been written by other blocks of this kernel (the fused gate, moe_block.cu) before a fence.
__device__ __forceinline__ void moe_route_warp256(const float *logits,
						  const float *__restrict__ bias, int t,
						  int topk_group, int K, int norm_topk_prob,
						  float route_scale, int *__restrict__ idx,
						  float *__restrict__ wts)
{
	const int lane = threadIdx.x & 31;
	const float *lg = logits + (size_t)t * 256 + 8 * lane;
	float sc[8], sel[8];
#pragma unroll
	for (int i = 0; i < 8; i++) {
		sc[i] = (float)(1.0 / (1.0 + exp(-(double)__ldcg(lg + i))));
		sel[i] = bias ? sc[i] + bias[8 * lane + i] : sc[i];
	}
	// the group's top-2 (CPU: first max, then the best other): the lane's, then across the
	// group's 4 lanes
	float av = -INFINITY, bv = -INFINITY;
	int ai = -1, bi = -1;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		const int e = 8 * lane + i;
		if (route_better(sel[i], e, av, ai)) {
			bv = av, bi = ai;
			av = sel[i], ai = e;
		} else if (route_better(sel[i], e, bv, bi)) {
			bv = sel[i], bi = e;
		}
	}
#pragma unroll
	for (int o = 1; o < 4; o <<= 1) {
		const float oav = __shfl_xor_sync(0xffffffffu, av, o), obv = __shfl_xor_sync(0xffffffffu, bv, o);
		const int oai = __shfl_xor_sync(0xffffffffu, ai, o), obi = __shfl_xor_sync(0xffffffffu, bi, o);
		if (route_better(oav, oai, av, ai)) { // theirs first: second = ours or their second
			if (route_better(av, ai, obv, obi))
				bv = av, bi = ai;
			else
				bv = obv, bi = obi;
			av = oav, ai = oai;
		} else if (route_better(oav, oai, bv, bi)) {
			bv = oav, bi = oai;
		}
	}
	const float gsc = bi < 0 ? av : av + bv; // this lane's group (lane / 4)
	// keep topk_group groups (ties to the lower group id); every lane decides the same
	float gs[8];
#pragma unroll
	for (int g = 0; g < 8; g++)
		gs[g] = __shfl_sync(0xffffffffu, gsc, 4 * g);
	unsigned kept = 0;
	for (int n = 0; n < topk_group; n++) {
		int best = -1;
#pragma unroll
		for (int g = 0; g < 8; g++)
			if (!(kept >> g & 1) && (best < 0 || gs[g] > gs[best]))
				best = g;
		kept |= 1u << best;
	}
	if (!(kept >> (lane >> 2) & 1))
#pragma unroll
		for (int i = 0; i < 8; i++)
			sel[i] = -INFINITY;
	// K picks by sel (ties to the lower expert id), weights = sc in pick order; lane n keeps
	// pick n (every lane reaches the same winner: the order is total)
	int my_e = 0;
	float my_w = 0.f, sum = 0.f;
	for (int n = 0; n < K; n++) {
		float v = -INFINITY, w = 0.f;
		int e = -1;
#pragma unroll
		for (int i = 0; i < 8; i++)
			if (route_better(sel[i], 8 * lane + i, v, e))
				v = sel[i], e = 8 * lane + i, w = sc[i];
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) {
			const float ov = __shfl_xor_sync(0xffffffffu, v, o);
			const int oe = __shfl_xor_sync(0xffffffffu, e, o);
			const float ow = __shfl_xor_sync(0xffffffffu, w, o);
			if (route_better(ov, oe, v, e))
				v = ov, e = oe, w = ow;
		}
#pragma unroll
		for (int i = 0; i < 8; i++) // taken (a pick is never a masked -inf: K <= kept experts)
			if (8 * lane + i == e)
				sel[i] = -INFINITY;
		if (lane == n)
			my_e = e, my_w = w;
		sum += w; // pick order, as the CPU
	}
	if (norm_topk_prob)
		my_w /= sum;
	my_w *= route_scale;
	// ascending expert id, weights follow: pick n goes to its rank among the K ids
	int rank = 0;
	for (int m = 0; m < K; m++)
		rank += __shfl_sync(0xffffffffu, my_e, m) < my_e;
	if (lane < K) {
		idx[(size_t)t * K + rank] = my_e;
		wts[(size_t)t * K + rank] = my_w;
	}
}

// The body of k_moe_permute (moe_permute.cu, which documents it) for the calling block: any
// multiple of 32 threads >= E and >= K. idx is read through L2 (__ldcg), so it may have been
// written by this kernel (the fused gate, moe_block.cu) before a barrier or a fence.
__device__ __forceinline__ void moe_permute_block(const int *idx, int T, int K, int E,
						  int *__restrict__ counts, int *__restrict__ offsets,
						  int *__restrict__ perm, int *__restrict__ src)
{
	__shared__ int cnt[256], base[256];
	__shared__ unsigned hit[256][PERM_CHUNK / 32]; // hit[e]: bit t of the chunk's token t
	const int tid = threadIdx.x, nt = blockDim.x;
	const int n = T * K;
	for (int e = tid; e < E; e += nt)
		cnt[e] = 0;
	__syncthreads(); // counters cleared
	for (int i = tid; i < n; i += nt)
		atomicAdd(&cnt[__ldcg(idx + i)], 1);
	__syncthreads(); // every expert's count is known
	if (tid < 32) { // exclusive prefix: lane l sums experts [8l, 8l + 8), then a warp scan
		int local = 0;
		for (int k = 0; k < 8; k++)
			local += 8 * tid + k < E ? cnt[8 * tid + k] : 0;
		int incl = local;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			const int v = __shfl_up_sync(0xffffffffu, incl, o);
			if (tid >= o)
				incl += v;
		}
		int run = incl - local;
		for (int k = 0; k < 8; k++)
			if (8 * tid + k < E) {
				const int e = 8 * tid + k;
				base[e] = run;
				offsets[e] = run;
				counts[e] = cnt[e];
				run += cnt[e];
			}
		if (tid == 31) {
			offsets[E] = incl;
			offsets[E + 1] = incl + T; // the shared expert's rows
		}
	}
	// placement in token order, ct tokens a pass (one entry per thread): the rank of (t, n)
	// within its expert e = base[e] (rows of e in earlier passes) + the pass's earlier tokens
	// that hit e; the next pass's entry is loaded while this one is placed
	const int ct = min(PERM_CHUNK, nt / K);
	for (int j = tid; j < E * (PERM_CHUNK / 32); j += nt)
		hit[j / (PERM_CHUNK / 32)][j % (PERM_CHUNK / 32)] = 0;
	int e_next = tid < min(ct, T) * K ? __ldcg(idx + tid) : 0;
	for (int t0 = 0; t0 < T; t0 += ct) {
		const bool has = tid < min(ct, T - t0) * K;
		const int e = e_next, tl = tid / K;
		if (t0 + ct < T)
			e_next = tid < min(ct, T - t0 - ct) * K ? __ldcg(idx + (t0 + ct) * K + tid) : 0;
		__syncthreads(); // hit cleared, base[] current
		if (has)
			atomicOr(&hit[e][tl >> 5], 1u << (tl & 31));
		__syncthreads(); // the pass's hits are known
		if (has) {
			int r = base[e];
			for (int w = 0; w < (tl >> 5); w++)
				r += __popc(hit[e][w]);
			r += __popc(hit[e][tl >> 5] & ((1u << (tl & 31)) - 1u));
			perm[t0 * K + tid] = r;
			src[r] = t0 + tl;
		}
		__syncthreads(); // ranks read base[] and hit[] before they change
		if (tid < E) { // thread e advances expert e and clears its hits (nt >= E)
			int c = 0;
			for (int w = 0; w < PERM_CHUNK / 32; w++) {
				c += __popc(hit[tid][w]);
				hit[tid][w] = 0;
			}
			base[tid] += c;
		}
	}
}

