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
#include "moe_route.cuh" // route_sigmoid; moe_route_warp256: the body of k_moe_route_w

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
		const float s = route_sigmoid(lg[e]);
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

extern "C" __global__ void __launch_bounds__(256)
k_moe_route_w(const float *__restrict__ logits, const float *__restrict__ bias, int T,
	      int topk_group, int K, int norm_topk_prob, float route_scale, int *__restrict__ idx,
	      float *__restrict__ wts)
{
	const int t = blockIdx.x * 8 + (threadIdx.x >> 5);
	if (t < T)
		moe_route_warp256(logits, bias, t, topk_group, K, norm_topk_prob, route_scale, idx, wts);
}
