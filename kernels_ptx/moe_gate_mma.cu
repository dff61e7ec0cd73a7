// moe_gate_mma.cu — the fast mode's MoE router logits for many tokens on the tensor cores (spec
// §3.9 "gate"; model/cuda_moe.c, when the GEMMs are not batch-invariant: the _ks forms from 17
// tokens on the real routing shape, the _mma forms above 64 tokens on other shapes), and the
// routing of their parts. The exact kernels (the CPU's fp32 order) are moe_block.cu's.
//
// Every form here multiplies the same products as the exact kernels (bf16 x bf16, exact in fp32)
// and sums them in fp32 by mma.sync m16n8k16 with K ascending in steps of 16 from the start of
// its K range — not the CPU's order, so a logit departs from the CPU's by fp32 rounding only (the
// routing is the CPU's for these logits). Each output's sums are the same instructions whatever
// T or the tile, so the logits do not depend on the batch, and the tiles of one form give the
// same bits.
// k_moe_gate_logits_mma, _mma64: logits fp32 [T, E] over all of K; BM = 128 / 64 tokens x 64
//   experts a block, grid (ceil(E / 64), ceil(T / BM)) (a token tile's expert tiles are
//   neighbours, so x comes from HBM about once), a ring of 8 / 12 stages (~220 KB: run 17
//   measured 4 stages at ~90 us for any T from 128 to 4096, each SM's block bound by the bytes
//   in flight over the memory latency). D % 64 == 0, E % 2 == 0.
// k_moe_gate_logits_ks, _ks64: parts fp32 [P, T, E], part p over its D / P columns of K (P =
//   gridDim.x: the host's 4 above 64 tokens, D / 256 at 17-64). Why: the 64-expert tiles take x
//   into the SMs once per 64 experts and W once per 128 tokens (352 MB at 4096 tokens); here a
//   block holds every expert (E <= 256) and a part of K, so x comes in once and W once per BM
//   tokens (176 MB at BM = 128), with P x the blocks to fill the GPU (at decode sizes, 28 blocks
//   instead of the exact kernels' long FMA chains). BM = 128 / 64 tokens x 256 experts a block,
//   grid (P, ceil(T / BM)), a 4-stage ring. D % (64 P) == 0, E <= 256, E % 2 == 0.
// k_moe_route_wsum: k_moe_route_w (moe_gate.cu) on the logits (((p0 + p1) + p2) + ...) of those
//   P parts (fp32 adds in part order), which it also writes to logits fp32 [T, 256] (what the
//   other routers leave there); E = 256 in 8 groups, one warp per token, 8 a block.
// The logit kernels: 256 threads as 8 warps of TW tokens (TW / 16 m16 tiles) x BN / (8 BM / TW)
// experts, K in chunks of 64 through a cp.async ring, rows padded to 144 bytes (ldmatrix's row
// addresses in distinct banks); rows past T or E read a copy of the last one and are never
// stored. GM_SMEM(BM, BN, S) bytes of dynamic shared memory.
#include "common.cuh"
#include "mma.cuh"
#include "moe_route.cuh" // route_sigmoid, moe_route_select256

#define GM_BK 64              // K columns a stage
#define GM_LD (GM_BK + 8)     // bf16 a staged row (144 bytes)
#define GM_SMEM(BM, BN, S) ((S) * ((BM) + (BN)) * GM_LD * 2)

// out[t, e] (row stride E) for the block's BM tokens from t0 x BN experts from e0, over K columns
// [k0, k0 + dk) of x [T, D] and W [E, D]; S ring stages, TW tokens a warp.
template <int BM, int BN, int TW, int S>
__device__ __forceinline__ void gate_logits_tc(const uint16_t *__restrict__ W,
					       const uint16_t *__restrict__ x, float *__restrict__ out,
					       int T, int E, int D, int t0, int e0, int k0, int dk)
{
	constexpr int MT = TW / 16, WM = BM / TW, WN = 8 / WM, NT = BN / WN / 8; // tiles a warp
	constexpr uint32_t STAGE = (BM + BN) * GM_LD * 2;                       // bytes
	constexpr int NP = (BM + BN) * 8 / 256; // 16-byte pieces a thread a chunk
	extern __shared__ __align__(16) uint16_t gm_smem[]; // [S][BM + BN][GM_LD]
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int wm = warp % WM, wn = warp / WM;
	const int nk = dk / GM_BK;
	const uint16_t *src[NP];
	uint32_t dst[NP];
#pragma unroll
	for (int p = 0; p < NP; p++) {
		const int q = tid + 256 * p, row = q >> 3, piece = q & 7;
		src[p] = (row < BM ? x + (size_t)min(t0 + row, T - 1) * D
				   : W + (size_t)min(e0 + row - BM, E - 1) * D) + k0 + 8 * piece;
		dst[p] = smem_u32(gm_smem + row * GM_LD + 8 * piece);
	}
	auto issue = [&](int c) { // chunk c into stage c % S; one commit group a chunk
		if (c < nk) {
			const uint32_t so = (uint32_t)(c % S) * STAGE;
#pragma unroll
			for (int p = 0; p < NP; p++)
				cp_async16(dst[p] + so, src[p] + (size_t)c * GM_BK);
		}
		cp_async_commit();
	};
	float acc[MT][NT][4] = {};
#pragma unroll
	for (int c = 0; c < S - 1; c++)
		issue(c);
	// ldmatrix row addresses: A (16 x 16 per x4: lanes 0-15 rows at k 0, 16-31 at k 8), B
	// (stored [n][k]; x4 = two n8 tiles: lanes 0-7 / 8-15 the first tile's k 0 / 8, 16-31 the
	// second's) -> a0..a3 and b0 b1 of two tiles, PTX's fragment layouts (mma.cuh)
	const uint32_t a_off = (uint32_t)(((wm * TW + (lane & 15)) * GM_LD + (lane >> 4) * 8) * 2);
	const uint32_t b_off = (uint32_t)(((BM + wn * NT * 8 + (lane & 7) + ((lane >> 4) << 3)) * GM_LD +
					   ((lane >> 3) & 1) * 8) * 2);
	const uint32_t base = smem_u32(gm_smem);
	for (int c = 0; c < nk; c++) {
		cp_async_wait_group<S - 2>(); // chunk c: mine
		__syncthreads(); // chunk c: everyone's; chunk c - 1 read by all (its stage free)
		issue(c + S - 1);
		const uint32_t st = base + (uint32_t)(c % S) * STAGE;
#pragma unroll
		for (int ks = 0; ks < GM_BK / 16; ks++) {
			uint32_t a[MT][4], b[NT][2];
#pragma unroll
			for (int i = 0; i < MT; i++)
				ldsm_x4(st + a_off + (uint32_t)((i * 16 * GM_LD + ks * 16) * 2), a[i][0],
					a[i][1], a[i][2], a[i][3]);
#pragma unroll
			for (int jj = 0; jj < NT / 2; jj++)
				ldsm_x4(st + b_off + (uint32_t)((jj * 16 * GM_LD + ks * 16) * 2),
					b[2 * jj][0], b[2 * jj][1], b[2 * jj + 1][0], b[2 * jj + 1][1]);
#pragma unroll
			for (int i = 0; i < MT; i++)
#pragma unroll
				for (int j = 0; j < NT; j++)
					mma_bf16_16816(acc[i][j], a[i][0], a[i][1], a[i][2], a[i][3],
						       b[j][0], b[j][1]);
		}
	}
	cp_async_wait_all();
	// c0 c1: row g, experts 2t, 2t + 1 of the n8 tile; c2 c3: row g + 8
	const int g = lane >> 2, t = lane & 3;
#pragma unroll
	for (int i = 0; i < MT; i++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int tok = t0 + wm * TW + i * 16 + g + 8 * h;
			if (tok >= T)
				continue;
#pragma unroll
			for (int j = 0; j < NT; j++) {
				const int e = e0 + wn * NT * 8 + j * 8 + 2 * t;
				if (e < E)
					*reinterpret_cast<float2 *>(out + (size_t)tok * E + e) =
						make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
			}
		}
}

// the 64-expert tiles over all of K (8 / 12 stages)
#define GATE_MMA_KERNEL(name, BM, S)                                                              \
	extern "C" __global__ void __launch_bounds__(256, 1) name(                               \
		const uint16_t *__restrict__ W, const uint16_t *__restrict__ x,                   \
		float *__restrict__ logits, int T, int E, int D)                                  \
	{                                                                                       \
		gate_logits_tc<BM, 64, 32, S>(W, x, logits, T, E, D, blockIdx.y * BM,             \
					      blockIdx.x * 64, 0, D);                              \
	}
GATE_MMA_KERNEL(k_moe_gate_logits_mma, 128, 8)
GATE_MMA_KERNEL(k_moe_gate_logits_mma64, 64, 12)

// every expert, part blockIdx.x of gridDim.x of K (4 stages)
#define GATE_KS_KERNEL(name, BM)                                                                  \
	extern "C" __global__ void __launch_bounds__(256, 1) name(                               \
		const uint16_t *__restrict__ W, const uint16_t *__restrict__ x,                   \
		float *__restrict__ parts, int T, int E, int D)                                   \
	{                                                                                       \
		const int dk = D / (int)gridDim.x;                                                \
		gate_logits_tc<BM, 256, 64, 4>(W, x, parts + (size_t)blockIdx.x * T * E, T, E, D, \
					       blockIdx.y * BM, 0, blockIdx.x * dk, dk);          \
	}
GATE_KS_KERNEL(k_moe_gate_logits_ks, 128)
GATE_KS_KERNEL(k_moe_gate_logits_ks64, 64)

extern "C" __global__ void __launch_bounds__(256)
k_moe_route_wsum(const float *__restrict__ parts, int nparts, float *__restrict__ logits,
		 const float *__restrict__ bias, int T, int topk_group, int K, int norm_topk_prob,
		 float route_scale, int *__restrict__ idx, float *__restrict__ wts)
{
	const int t = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (t >= T)
		return;
	const size_t plane = (size_t)T * 256, at = (size_t)t * 256 + 8 * lane;
	float l[8];
	// four parts' loads in flight at a time, added in part order
	for (int p0 = 0; p0 < nparts; p0 += 4) {
		float4 v[4][2];
#pragma unroll
		for (int q = 0; q < 4; q++)
			if (p0 + q < nparts) {
				const float *src = parts + (p0 + q) * plane + at;
				v[q][0] = __ldcg(reinterpret_cast<const float4 *>(src));
				v[q][1] = __ldcg(reinterpret_cast<const float4 *>(src + 4));
			}
#pragma unroll
		for (int q = 0; q < 4; q++) {
			if (p0 + q >= nparts)
				break;
			const float w[8] = {v[q][0].x, v[q][0].y, v[q][0].z, v[q][0].w,
					    v[q][1].x, v[q][1].y, v[q][1].z, v[q][1].w};
#pragma unroll
			for (int i = 0; i < 8; i++)
				l[i] = p0 + q == 0 ? w[i] : __fadd_rn(l[i], w[i]);
		}
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
