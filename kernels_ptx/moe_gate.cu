// moe_gate.cu — the MoE routing of spec §3.9 on the GPU, the same function as the CPU backend's
// moe_route (model/cpu_moe.c), operation for operation:
//   sc = sigmoid(logit) (in double, rounded to fp32, as the CPU does, so both sides agree to the
//   bit); sel = sc + bias (selection only); group score = the sum of the group's top-2 sel;
//   keep topk_group groups (ties to the lower group id); pick K experts by sel (ties to the lower
//   expert id); weights = sc of the picks, summed in pick order, divided by the sum when
//   norm_topk_prob, times routed_scaling_factor; written in ascending expert id.
//
// k_moe_route: logits fp32 [T, E] (the fp32 router GEMM's output), bias fp32 [E] (or null),
// idx int [T, K], wts fp32 [T, K]. E <= 1024, K <= 32, G <= 64. One block of 256 threads per token;
// the picks are sequential block-wide argmaxes (warp 0 reduces), K of them.
// k_moe_route_w: the same for E = 256, G = 8 (the real model), one warp per token, everything in
// registers (run 3: k_moe_route took 14 us for one token, 109 us for 4096).
#include "common.cuh"

#define GATE_MAX_E 1024
#define GATE_MAX_G 64
#define GATE_MAX_K 32

// (value, index) of the largest v[i] over [0, n) (ties to the lower index), by warp 0; -inf
// entries lose to any number; returns the index (all lanes of warp 0).
__device__ __forceinline__ int warp_argmax(const float *v, int n)
{
	const int lane = threadIdx.x & 31;
	float best = -INFINITY;
	int bi = -1;
	for (int i = lane; i < n; i += 32) // each lane scans ascending: first max kept
		if (bi < 0 || v[i] > best)
			best = v[i], bi = i;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const float ob = __shfl_xor_sync(0xffffffffu, best, o);
		const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
		if (oi >= 0 && (bi < 0 || ob > best || (ob == best && oi < bi)))
			best = ob, bi = oi;
	}
	return bi;
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_route(const float *__restrict__ logits, const float *__restrict__ bias, int E, int G,
	    int topk_group, int K, int norm_topk_prob, float route_scale, int *__restrict__ idx,
	    float *__restrict__ wts)
{
	__shared__ float sc[GATE_MAX_E], sel[GATE_MAX_E], gscore[GATE_MAX_G];
	__shared__ int picks[GATE_MAX_K];
	__shared__ float pw[GATE_MAX_K]; // the picks' weights (shared memory: no local-memory arrays)
	const int t = blockIdx.x, tid = threadIdx.x;
	const float *lg = logits + (size_t)t * E;
	for (int e = tid; e < E; e += blockDim.x) {
		const float s = (float)(1.0 / (1.0 + exp(-(double)lg[e])));
		sc[e] = s;
		sel[e] = bias ? s + bias[e] : s;
	}
	__syncthreads(); // scores complete
	const int per = E / G;
	if (G > 1) {
		if (tid < G) { // the group's top-2 sum, as the CPU: first max, then the best other
			const float *s = sel + tid * per;
			int a = 0;
			for (int i = 1; i < per; i++)
				if (s[i] > s[a])
					a = i;
			int b = -1;
			for (int i = 0; i < per; i++)
				if (i != a && (b < 0 || s[i] > s[b]))
					b = i;
			gscore[tid] = b < 0 ? s[a] : s[a] + s[b];
		}
		__syncthreads(); // group scores complete
		if (tid < 32)
			for (int n = 0; n < topk_group; n++) {
				const int g = warp_argmax(gscore, G);
				__syncwarp();
				if (tid == 0)
					gscore[g] = -INFINITY; // taken: marked so the next argmax skips it
				__syncwarp();
			}
		__syncthreads(); // kept groups are the ones marked -inf
		for (int e = tid; e < E; e += blockDim.x)
			if (gscore[e / per] != -INFINITY)
				sel[e] = -INFINITY;
		__syncthreads(); // masked selection scores complete
	}
	if (tid < 32) {
		for (int n = 0; n < K; n++) {
			const int e = warp_argmax(sel, E);
			__syncwarp();
			if (tid == 0) {
				picks[n] = e;
				sel[e] = -INFINITY; // taken (a pick is never a masked -inf: K <= kept experts)
			}
			__syncwarp();
		}
		if (tid == 0) {
			float sum = 0.f;
			for (int n = 0; n < K; n++) {
				pw[n] = sc[picks[n]];
				sum += pw[n];
			}
			for (int n = 0; n < K; n++) {
				if (norm_topk_prob)
					pw[n] /= sum;
				pw[n] *= route_scale;
			}
			for (int i = 1; i < K; i++) // ascending expert id, weights follow
				for (int j = i; j > 0 && picks[j - 1] > picks[j]; j--) {
					const int ti = picks[j];
					picks[j] = picks[j - 1], picks[j - 1] = ti;
					const float tw = pw[j];
					pw[j] = pw[j - 1], pw[j - 1] = tw;
				}
			for (int n = 0; n < K; n++) {
				idx[(size_t)t * K + n] = picks[n];
				wts[(size_t)t * K + n] = pw[n];
			}
		}
	}
}

// ---- k_moe_route_w: the same routing, one warp per token, for the real shape -------------------
// E = 256 in G = 8 groups of 32 (lane l holds experts 8l .. 8l+7 in registers, so group g is
// lanes 4g .. 4g+3), K <= 32, topk_group <= 8. Every choice is the CPU's: (value, lower index)
// order for the group top-2, the kept groups and the picks; the weights summed in pick order.
// Block of 256 threads = 8 tokens; grid ceil(T / 8). (k_moe_route: the general shape.)

// (v, i) better than (w, j): larger value, ties to the lower index; i < 0 is "none" (worst).
__device__ __forceinline__ bool route_better(float v, int i, float w, int j)
{
	return i >= 0 && (j < 0 || v > w || (v == w && i < j));
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_route_w(const float *__restrict__ logits, const float *__restrict__ bias, int T,
	      int topk_group, int K, int norm_topk_prob, float route_scale, int *__restrict__ idx,
	      float *__restrict__ wts)
{
	const int lane = threadIdx.x & 31;
	const int t = blockIdx.x * 8 + (threadIdx.x >> 5);
	if (t >= T)
		return;
	const float *lg = logits + (size_t)t * 256 + 8 * lane;
	float sc[8], sel[8];
#pragma unroll
	for (int i = 0; i < 8; i++) {
		sc[i] = (float)(1.0 / (1.0 + exp(-(double)lg[i])));
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
