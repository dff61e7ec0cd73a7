// moe_gate_ks.cu — the fast mode's MoE router for prefill sizes (T > 64 tokens, E <= 256 experts;
// spec §3.9 "gate"): the logits on the tensor cores in GK_PARTS parts of K, then the routing of
// each token from the parts summed in part order. Launchers: model/cuda_moe.c.
//
// k_moe_gate_logits_ks, _ks64: parts fp32 [GK_PARTS, T, E], part p = x[t, Kp] · W[e, Kp]^T over
//   its D / GK_PARTS columns Kp, the CPU's exact bf16 x bf16 products summed in fp32 by mma.sync
//   m16n8k16 with K ascending in steps of 16 from 0 — as k_moe_gate_logits_mma does over all of
//   K. Why: the 128 x 64 tiles of _mma take x into the SMs once per 64 experts and W once per 128
//   tokens (352 MB at 4096 tokens, ~75-98 us bound by what each SM takes in); here a block holds
//   every expert (N = 256) and a part of K, so x comes in once and W once per 128 tokens (176 MB),
//   with GK_PARTS x the blocks to fill the GPU. A block: BM = 128 (_ks) or 64 (_ks64) tokens x 256
//   experts x one part; 8 warps as BM / 64 (64 tokens each: four m16 tiles) x 512 / BM (experts);
//   K in chunks of 64 through a 4-stage cp.async ring, rows padded to 144 bytes (ldmatrix's row
//   addresses in distinct banks); rows past T or E read a copy of the last one and are never
//   stored. Grid (GK_PARTS, ceil(T / BM)), 256 threads, GK_SMEM(BM) bytes of dynamic shared
//   memory. D % (64 GK_PARTS) == 0, E <= 256, E % 2 == 0. Each output's instructions are the
//   same whatever T and BM, so a logit does not depend on the batch or the form.
// k_moe_route_wsum: k_moe_route_w (moe_gate.cu) on the logits ((p0 + p1) + p2) + p3 of those
//   parts (fp32 adds in part order), which it also writes to logits fp32 [T, 256] (what the
//   other routers leave there); E = 256 in 8 groups, one warp per token, 8 a block.
#include "common.cuh"
#include "mma.cuh"
#include "moe_route.cuh" // route_sigmoid, moe_route_select256

#define GK_PARTS 4  // K parts: fixed, so the fp32 order of a logit is too
#define GK_BN 256   // experts a block (all of them)
#define GK_BK 64    // K columns a stage
#define GK_LD (GK_BK + 8) // bf16 a staged row (144 bytes)
#define GK_STAGES 4
#define GK_SMEM(BM) (GK_STAGES * ((BM) + GK_BN) * GK_LD * 2)

template <int BM>
__device__ __forceinline__ void gate_logits_ks(const uint16_t *__restrict__ W,
					       const uint16_t *__restrict__ x,
					       float *__restrict__ parts, int T, int E, int D)
{
	constexpr int WM = BM / 64, WN = 8 / WM, NT = GK_BN / WN / 8; // n8 tiles a warp
	constexpr uint32_t STAGE = (BM + GK_BN) * GK_LD * 2;           // bytes
	constexpr int NP = (BM + GK_BN) * 8 / 256; // 16-byte pieces a thread a chunk
	extern __shared__ __align__(16) uint16_t gk_smem[]; // [GK_STAGES][BM + GK_BN][GK_LD]
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int wm = warp % WM, wn = warp / WM;
	const int part = blockIdx.x, t0 = blockIdx.y * BM;
	const int dk = D / GK_PARTS, nk = dk / GK_BK;
	const size_t k0 = (size_t)part * dk;
	const uint16_t *src[NP];
	uint32_t dst[NP];
#pragma unroll
	for (int p = 0; p < NP; p++) {
		const int q = tid + 256 * p, row = q >> 3, piece = q & 7;
		src[p] = (row < BM ? x + (size_t)min(t0 + row, T - 1) * D
				   : W + (size_t)min(row - BM, E - 1) * D) + k0 + 8 * piece;
		dst[p] = smem_u32(gk_smem + row * GK_LD + 8 * piece);
	}
	auto issue = [&](int c) { // chunk c into stage c % GK_STAGES; one commit group a chunk
		if (c < nk) {
			const uint32_t so = (uint32_t)(c % GK_STAGES) * STAGE;
#pragma unroll
			for (int p = 0; p < NP; p++)
				cp_async16(dst[p] + so, src[p] + (size_t)c * GK_BK);
		}
		cp_async_commit();
	};
	float acc[4][NT][4] = {};
#pragma unroll
	for (int c = 0; c < GK_STAGES - 1; c++)
		issue(c);
	// ldmatrix row addresses as k_moe_gate_logits_mma's: A (16 x 16 per x4), B (stored [n][k];
	// x4 = two n8 tiles) -> PTX's fragment layouts (mma.cuh)
	const uint32_t a_off = (uint32_t)(((wm * 64 + (lane & 15)) * GK_LD + (lane >> 4) * 8) * 2);
	const uint32_t b_off = (uint32_t)(((BM + wn * NT * 8 + (lane & 7) + ((lane >> 4) << 3)) * GK_LD +
					   ((lane >> 3) & 1) * 8) * 2);
	const uint32_t base = smem_u32(gk_smem);
	for (int c = 0; c < nk; c++) {
		cp_async_wait_group<GK_STAGES - 2>(); // chunk c: mine
		__syncthreads(); // chunk c: everyone's; chunk c - 1 read by all (its stage free)
		issue(c + GK_STAGES - 1);
		const uint32_t st = base + (uint32_t)(c % GK_STAGES) * STAGE;
#pragma unroll
		for (int ks = 0; ks < GK_BK / 16; ks++) {
			uint32_t a[4][4], b[NT][2];
#pragma unroll
			for (int i = 0; i < 4; i++)
				ldsm_x4(st + a_off + (uint32_t)((i * 16 * GK_LD + ks * 16) * 2), a[i][0],
					a[i][1], a[i][2], a[i][3]);
#pragma unroll
			for (int jj = 0; jj < NT / 2; jj++)
				ldsm_x4(st + b_off + (uint32_t)((jj * 16 * GK_LD + ks * 16) * 2),
					b[2 * jj][0], b[2 * jj][1], b[2 * jj + 1][0], b[2 * jj + 1][1]);
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < NT; j++)
					mma_bf16_16816(acc[i][j], a[i][0], a[i][1], a[i][2], a[i][3],
						       b[j][0], b[j][1]);
		}
	}
	cp_async_wait_all();
	// c0 c1: row g, experts 2t, 2t + 1 of the n8 tile; c2 c3: row g + 8
	const int g = lane >> 2, t = lane & 3;
	float *out = parts + (size_t)part * T * E;
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int tok = t0 + wm * 64 + i * 16 + g + 8 * h;
			if (tok >= T)
				continue;
#pragma unroll
			for (int j = 0; j < NT; j++) {
				const int e = wn * NT * 8 + j * 8 + 2 * t;
				if (e < E)
					*reinterpret_cast<float2 *>(out + (size_t)tok * E + e) =
						make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
			}
		}
}

extern "C" __global__ void __launch_bounds__(256, 1)
k_moe_gate_logits_ks(const uint16_t *__restrict__ W, const uint16_t *__restrict__ x,
		     float *__restrict__ parts, int T, int E, int D)
{
	gate_logits_ks<128>(W, x, parts, T, E, D);
}

extern "C" __global__ void __launch_bounds__(256, 1)
k_moe_gate_logits_ks64(const uint16_t *__restrict__ W, const uint16_t *__restrict__ x,
		       float *__restrict__ parts, int T, int E, int D)
{
	gate_logits_ks<64>(W, x, parts, T, E, D);
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_route_wsum(const float *__restrict__ parts, float *__restrict__ logits,
		 const float *__restrict__ bias, int T, int topk_group, int K, int norm_topk_prob,
		 float route_scale, int *__restrict__ idx, float *__restrict__ wts)
{
	const int t = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (t >= T)
		return;
	const size_t plane = (size_t)T * 256, at = (size_t)t * 256 + 8 * lane;
	float4 v[GK_PARTS][2];
#pragma unroll
	for (int p = 0; p < GK_PARTS; p++) {
		v[p][0] = __ldcg(reinterpret_cast<const float4 *>(parts + p * plane + at));
		v[p][1] = __ldcg(reinterpret_cast<const float4 *>(parts + p * plane + at + 4));
	}
	float l[8] = {v[0][0].x, v[0][0].y, v[0][0].z, v[0][0].w,
		      v[0][1].x, v[0][1].y, v[0][1].z, v[0][1].w};
#pragma unroll
	for (int p = 1; p < GK_PARTS; p++) {
		l[0] = __fadd_rn(l[0], v[p][0].x), l[1] = __fadd_rn(l[1], v[p][0].y);
		l[2] = __fadd_rn(l[2], v[p][0].z), l[3] = __fadd_rn(l[3], v[p][0].w);
		l[4] = __fadd_rn(l[4], v[p][1].x), l[5] = __fadd_rn(l[5], v[p][1].y);
		l[6] = __fadd_rn(l[6], v[p][1].z), l[7] = __fadd_rn(l[7], v[p][1].w);
	}
	*reinterpret_cast<float4 *>(logits + at) = make_float4(l[0], l[1], l[2], l[3]);
	*reinterpret_cast<float4 *>(logits + at + 4) = make_float4(l[4], l[5], l[6], l[7]);
	float sc[8], sel[8];
#pragma unroll
	for (int i = 0; i < 8; i++) {
		sc[i] = route_sigmoid(l[i]);
		sel[i] = bias ? sc[i] + bias[8 * lane + i] : sc[i];
	}
	moe_route_select256(sc, sel, t, topk_group, K, norm_topk_prob, route_scale, idx, wts);
}
