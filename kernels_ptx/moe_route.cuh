// moe_route.cuh — the MoE routing of one token by a warp and the token permutation, as device
// functions: the bodies of k_moe_route_w (moe_gate.cu) and of k_moe_permute and its many-block
// form (moe_permute.cu); the selection is shared with the fused router of moe_block.cu
// (k_moe_gate_route1), which runs it in its last block, then the permutation in closed form
// (moe_permute_one). Spec §3.9; the numbers are the CPU's (moe_gate.cu's header).
#pragma once
#include "common.cuh"
#include "scan.cuh" // warp_inclusive_scan

#define PERM_CHUNK 128 // most tokens placed per pass of k_moe_permute

// (v, i) better than (w, j): larger value, ties to the lower index; i < 0 is "none" (worst).
__device__ __forceinline__ bool route_better(float v, int i, float w, int j)
{
	return i >= 0 && (j < 0 || v > w || (v == w && i < j));
}

// Order-preserving key of a selection score: key(a) > key(b) iff a > b, equal iff a == b, for
// every non-NaN float (-0 is keyed as +0; the scores are finite or the -inf of a masked group).
__device__ __forceinline__ unsigned route_key(float v)
{
	const unsigned u = __float_as_uint(v == 0.f ? 0.f : v);
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One token's scores fp32 [2][E] (E = 256: the sigmoid scores, then those + the correction
// bias) read through L2 into lane l's sc[i], sel[i] of experts 8l + i: moe_route_select256's
// input
__device__ __forceinline__ void moe_route_load256(const float *scores, int E, float sc[8],
						  float sel[8], int lane)
{
	const float4 *s4 = reinterpret_cast<const float4 *>(scores + 8 * lane);
	const float4 *l4 = reinterpret_cast<const float4 *>(scores + E + 8 * lane);
	const float4 a = __ldcg(s4), b = __ldcg(s4 + 1), c = __ldcg(l4), d = __ldcg(l4 + 1);
	sc[0] = a.x, sc[1] = a.y, sc[2] = a.z, sc[3] = a.w;
	sc[4] = b.x, sc[5] = b.y, sc[6] = b.z, sc[7] = b.w;
	sel[0] = c.x, sel[1] = c.y, sel[2] = c.z, sel[3] = c.w;
	sel[4] = d.x, sel[5] = d.y, sel[6] = d.z, sel[7] = d.w;
}

// The selection of one token by one warp, from its scores (k_moe_route_w, moe_gate.cu,
// documents it): lane l holds sc[i], sel[i] of experts 8l + i (E = 256 in G = 8 groups of 32, so
// group g is lanes 4g .. 4g+3), K <= 32, topk_group <= 8. Every choice is the CPU's: (value,
// lower index) order for the group top-2, the kept groups and the picks; the weights summed in
// pick order. Writes idx[t*K ..], wts[t*K ..] in ascending expert id. Returns lane n's pick
// (n < K, in pick order; other lanes 0x7fffffff).
__device__ __forceinline__ int moe_route_select256(const float sc[8], float sel[8], int t,
						    int topk_group, int K, int norm_topk_prob,
						    float route_scale, int *__restrict__ idx,
						    float *__restrict__ wts)
{
	const int lane = threadIdx.x & 31;
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
	// keep topk_group groups (ties to the lower group id); every lane decides the same (the
	// scan keeps its best value in a register: no dynamically indexed array)
	float gs[8];
#pragma unroll
	for (int g = 0; g < 8; g++)
		gs[g] = __shfl_sync(0xffffffffu, gsc, 4 * g);
	unsigned kept = 0;
	for (int n = 0; n < topk_group; n++) {
		int best = -1;
		float bvg = 0.f;
#pragma unroll
		for (int g = 0; g < 8; g++)
			if (!(kept >> g & 1) && (best < 0 || gs[g] > bvg))
				best = g, bvg = gs[g];
		kept |= 1u << best;
	}
	if (!(kept >> (lane >> 2) & 1))
#pragma unroll
		for (int i = 0; i < 8; i++)
			sel[i] = -INFINITY;
	// K picks by sel (ties to the lower expert id), weights = sc in pick order; lane n keeps
	// pick n. A pick: each lane's best (its first maximum), the warp's largest key (redux), the
	// lowest lane holding it (ballot): lanes hold ascending expert ids, so that is the lowest id
	// of the maximum, as the CPU's scan
	int my_e = 0;
	float my_w = 0.f, sum = 0.f;
	for (int n = 0; n < K; n++) {
		float v = -INFINITY, w = 0.f;
		int li = -1;
#pragma unroll
		for (int i = 0; i < 8; i++)
			if (route_better(sel[i], i, v, li))
				v = sel[i], li = i, w = sc[i];
		const unsigned k = route_key(v);
		const unsigned top = __reduce_max_sync(0xffffffffu, k);
		const int src = __ffs(__ballot_sync(0xffffffffu, k == top)) - 1;
		const int e = 8 * src + __shfl_sync(0xffffffffu, li, src);
		w = __shfl_sync(0xffffffffu, w, src);
		if (lane == src) // taken (a pick is never a masked -inf: K <= kept experts)
#pragma unroll
			for (int i = 0; i < 8; i++)
				if (i == li)
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
	return lane < K ? my_e : 0x7fffffff;
}

// The router score of one logit, as the CPU: sigmoid in double, rounded to fp32.
__device__ __forceinline__ float route_sigmoid(float logit)
{
	return (float)(1.0 / (1.0 + exp(-(double)logit)));
}

// The routing of token t by one warp: the scores (sc, and sel = sc + bias for the selection) of
// lane l's experts 8l .. 8l+7, then moe_route_select256 (logits read through L2, __ldcg).
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
		sc[i] = route_sigmoid(__ldcg(lg + i));
		sel[i] = bias ? sc[i] + bias[8 * lane + i] : sc[i];
	}
	moe_route_select256(sc, sel, t, topk_group, K, norm_topk_prob, route_scale, idx, wts);
}

// k_moe_permute's outputs for one token, by one warp in closed form (the fused routers of
// moe_block.cu): its K picks are distinct and idx holds them ascending, so sorted row n is
// idx[n]'s: perm[n] = n, src = 0, counts[e] = (e picked), offsets[e] = the picks below e,
// offsets[E] = K, offsets[E + 1] = K + 1 (the shared expert's row). E <= 256. mine: lane n's
// pick for n < K, in any order (moe_route_select256's return; other lanes 0x7fffffff): the
// counts and offsets depend on the set only, so no read of idx back through memory.
__device__ __forceinline__ void moe_permute_one(int mine, int K, int E, int *__restrict__ counts,
						int *__restrict__ offsets, int *__restrict__ perm,
						int *__restrict__ src)
{
	const int lane = threadIdx.x & 31;
	int below[8] = {0, 0, 0, 0, 0, 0, 0, 0}, hit[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	for (int n = 0; n < K; n++) {
		const int v = __shfl_sync(0xffffffffu, mine, n);
#pragma unroll
		for (int k = 0; k < 8; k++) {
			below[k] += v < 8 * lane + k;
			hit[k] |= v == 8 * lane + k;
		}
	}
#pragma unroll
	for (int k = 0; k < 8; k++)
		if (8 * lane + k < E) {
			offsets[8 * lane + k] = below[k];
			counts[8 * lane + k] = hit[k];
		}
	if (lane < K)
		perm[lane] = lane, src[lane] = 0;
	if (lane == 0)
		offsets[E] = K, offsets[E + 1] = K + 1;
}

// The exclusive prefix of c[0 .. E) (shared) by warp 0: lane l sums experts [8l, 8l + 8), then
// a warp scan, into base[e] (shared); where counts/offsets are given also counts[e] = c[e],
// offsets[e] = base[e], offsets[E] = the total, offsets[E + 1] = the total + T (the shared
// expert's rows). The caller synchronises before base is read. E <= 256.
__device__ __forceinline__ void perm_prefix(const int *c, int *base, int E, int T,
					    int *__restrict__ counts, int *__restrict__ offsets)
{
	const int tid = threadIdx.x;
	if (tid >= 32)
		return;
	int local = 0;
	for (int k = 0; k < 8; k++)
		local += 8 * tid + k < E ? c[8 * tid + k] : 0;
	const int incl = warp_inclusive_scan(local);
	int run = incl - local;
	for (int k = 0; k < 8; k++)
		if (8 * tid + k < E) {
			const int e = 8 * tid + k;
			base[e] = run;
			if (offsets)
				offsets[e] = run, counts[e] = c[e];
			run += c[e];
		}
	if (tid == 31 && offsets) {
		offsets[E] = incl;
		offsets[E + 1] = incl + T;
	}
}

// The placement of tokens [t_begin, t_end) in token order by the calling block (any multiple
// of 32 threads >= E and >= K), ct tokens a pass (one entry per thread): the rank of (t, n)
// within its expert e = base[e] (rows of e before the pass) + the pass's earlier tokens that hit
// e (a bitmask per expert, hit, and popcounts); the next pass's entry is loaded while this one is
// placed. base and hit are shared; base is advanced past the placed rows. Starts with a barrier
// (base may have just been written).
__device__ __forceinline__ void perm_place(const int *idx, int t_begin, int t_end, int K, int E,
					   int *base, unsigned (*hit)[PERM_CHUNK / 32],
					   int *__restrict__ perm, int *__restrict__ src)
{
	const int tid = threadIdx.x, nt = blockDim.x;
	const int ct = min(PERM_CHUNK, nt / K);
	for (int j = tid; j < E * (PERM_CHUNK / 32); j += nt)
		hit[j / (PERM_CHUNK / 32)][j % (PERM_CHUNK / 32)] = 0;
	int e_next = tid < min(ct, t_end - t_begin) * K ? __ldcg(idx + t_begin * K + tid) : 0;
	for (int t0 = t_begin; t0 < t_end; t0 += ct) {
		const bool has = tid < min(ct, t_end - t0) * K;
		const int e = e_next, tl = tid / K;
		if (t0 + ct < t_end)
			e_next = tid < min(ct, t_end - t0 - ct) * K ? __ldcg(idx + (t0 + ct) * K + tid) : 0;
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

// The body of k_moe_permute (moe_permute.cu, which documents it) for the calling block: any
// multiple of 32 threads >= E and >= K (idx read through L2, __ldcg).
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
	perm_prefix(cnt, base, E, T, counts, offsets);
	perm_place(idx, 0, T, K, E, base, hit, perm, src);
}
