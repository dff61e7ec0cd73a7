// lm_head.cu — logits = fp32(x) · W^T with W bf16 [V, D] (the LM head, spec §3.10; also the
// MTP head). x bf16 [M, D] (the final normed hidden states of the rows that sample), logits fp32
// [M, V]. Memory-bound: W (1.85 GB for the real model) is streamed once for all M rows.
//
// k_lm_head: one warp per output row v; lanes stride D in 8-element (16-byte) chunks; x is
// staged in shared memory as fp32 (M * D * 4 bytes, M <= LM_MAX_M). Launch with
// dynamic smem = M*D*4 and grid = ceil(V / 8) blocks of 256 threads. (tests/gpu/test_gpu_ops.c)
// k_fwd_head_mma1/2/4: the forward's head for 5-128 rows in its fast mode (model/cuda_forward.c
// op_lin): W streamed once, the rows on the tensor cores (below).
#include "common.cuh"

#define LM_MAX_M 8

extern "C" __global__ void __launch_bounds__(256)
k_lm_head(const uint16_t *__restrict__ w, const uint16_t *__restrict__ x,
	  float *__restrict__ logits, int M, int D, int V)
{
	extern __shared__ float xs[]; // [M, D]
	for (int i = threadIdx.x; i < M * D; i += blockDim.x)
		xs[i] = bf16_to_f32(x[i]);
	__syncthreads(); // xs complete before any warp reads it
	const int v = blockIdx.x * 8 + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	if (v >= V)
		return;
	float acc[LM_MAX_M];
#pragma unroll
	for (int m = 0; m < LM_MAX_M; m++)
		acc[m] = 0.f;
	const uint4 *wr = reinterpret_cast<const uint4 *>(w + (size_t)v * D);
	for (int c = lane; c < D / 8; c += 32) {
		const uint4 q = wr[c];
		const uint32_t part[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const float w0 = __uint_as_float(part[k] << 16);
			const float w1 = __uint_as_float(part[k] & 0xffff0000u);
#pragma unroll
			for (int m = 0; m < LM_MAX_M; m++)
				if (m < M)
					acc[m] += w0 * xs[m * D + c * 8 + 2 * k] +
						  w1 * xs[m * D + c * 8 + 2 * k + 1];
		}
	}
	// every lane reduces all LM_MAX_M accumulators (unused ones are zero), then lane 0
	// stores the first M: no divergent shuffles
#pragma unroll
	for (int m = 0; m < LM_MAX_M; m++)
		acc[m] = warp_sum(acc[m]);
	if (lane == 0)
		for (int m = 0; m < M; m++)
			logits[(size_t)m * V + v] = acc[m];
}

// k_fwd_head_mma<WM>: y[m, v] = x[m, :] . W[v, :] for m < M <= 32 WM, fp32 (y32) or bf16 (y16)
// out — the LM head (and MTP eh_proj) of a decode batch or a few prefill rows, where W (1.85 GB
// for the real head) must stream once at HBM speed while the rows ride along on the tensor
// cores. bf16 mma.sync m16n8k16 with fp32 accumulators, K ascending in steps of 16 (a fixed
// order, not the CPU's: the fast mode's numbers). Block: all BM = 32 WM rows x 128 outputs,
// 8 warps as WM (rows, 32 each) x 8 / WM (outputs, 128 WM / 8 each); K in tiles of 64 through a
// 3-stage cp.async ring (the W tile 128 x 64 and the x tile BM x 64, rows padded by 8 bf16 so
// the fragment reads hit distinct banks); x rows >= M are zero (never copied). x bf16 [M, ldx],
// W bf16 [V, D]. D % 64 == 0, ldx % 8 == 0. Grid ceil(V / 128), 256 threads, dynamic shared
// memory HM_STAGES * (BM + 128) * 72 * 2 bytes.
#include "mma.cuh"

#define HM_BN 128
#define HM_BK 64
#define HM_LD (HM_BK + 8)
#define HM_STAGES 3

template <int WM>
__device__ __forceinline__ void head_mma(const uint16_t *__restrict__ W, const uint16_t *__restrict__ x,
					 int ldx, float *__restrict__ y32, uint16_t *__restrict__ y16,
					 int ldy, int M, int D, int V)
{
	constexpr int BM = 32 * WM, WN = 8 / WM, NT = HM_BN / WN / 8; // n8 tiles a warp
	extern __shared__ __align__(16) uint16_t hm_smem[];
	uint16_t *As = hm_smem;                              // [STAGES][BM][HM_LD]
	uint16_t *Bs = hm_smem + HM_STAGES * BM * HM_LD;     // [STAGES][HM_BN][HM_LD]
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int wm = warp / WN, wn = warp % WN, n0 = blockIdx.x * HM_BN;
	const int KT = D / HM_BK;
	// rows >= M stay zero in every stage
	for (int i = tid; i < HM_STAGES * BM * HM_LD; i += 256) {
		const int r = (i / HM_LD) % BM;
		if (r >= M)
			As[i] = 0;
	}
	auto load = [&](int stage, int kt) {
		const int k0 = kt * HM_BK;
		uint16_t *a = As + stage * BM * HM_LD, *b = Bs + stage * HM_BN * HM_LD;
#pragma unroll
		for (int i = tid; i < BM * 8; i += 256) { // 8 chunks of 16 bytes a row
			const int r = i >> 3, c = i & 7;
			if (r < M)
				cp_async16(smem_u32(a + r * HM_LD + c * 8), x + (size_t)r * ldx + k0 + c * 8);
		}
#pragma unroll
		for (int i = tid; i < HM_BN * 8; i += 256) {
			const int r = i >> 3, c = i & 7;
			if (n0 + r < V)
				cp_async16(smem_u32(b + r * HM_LD + c * 8), W + (size_t)(n0 + r) * D + k0 + c * 8);
		}
	};
	float acc[2][NT][4];
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < NT; j++)
			acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
#pragma unroll
	for (int s = 0; s < HM_STAGES - 1; s++) {
		if (s < KT)
			load(s, s);
		cp_async_commit();
	}
	for (int kt = 0; kt < KT; kt++) {
		cp_async_wait_group<HM_STAGES - 2>();
		__syncthreads(); // tile kt is in; every warp is done with the stage refilled below
		if (kt + HM_STAGES - 1 < KT)
			load((kt + HM_STAGES - 1) % HM_STAGES, kt + HM_STAGES - 1);
		cp_async_commit();
		const uint16_t *a = As + (kt % HM_STAGES) * BM * HM_LD + (wm * 32) * HM_LD;
		const uint16_t *b = Bs + (kt % HM_STAGES) * HM_BN * HM_LD + (wn * NT * 8) * HM_LD;
#pragma unroll
		for (int ks = 0; ks < HM_BK; ks += 16) {
			uint32_t af[2][4];
#pragma unroll
			for (int i = 0; i < 2; i++) {
				const uint16_t *ar = a + (i * 16 + g) * HM_LD + ks + 2 * t;
				af[i][0] = *reinterpret_cast<const uint32_t *>(ar);
				af[i][1] = *reinterpret_cast<const uint32_t *>(ar + 8 * HM_LD);
				af[i][2] = *reinterpret_cast<const uint32_t *>(ar + 8);
				af[i][3] = *reinterpret_cast<const uint32_t *>(ar + 8 * HM_LD + 8);
			}
#pragma unroll
			for (int j = 0; j < NT; j++) {
				const uint16_t *br = b + (j * 8 + g) * HM_LD + ks + 2 * t;
				const uint32_t b0 = *reinterpret_cast<const uint32_t *>(br);
				const uint32_t b1 = *reinterpret_cast<const uint32_t *>(br + 8);
#pragma unroll
				for (int i = 0; i < 2; i++)
					mma_bf16_16816(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], b0, b1);
			}
		}
	}
	cp_async_wait_all();
	// c0, c1: row g, columns 2t, 2t+1 of the n8 tile; c2, c3: row g + 8
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < NT; j++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int m = wm * 32 + i * 16 + g + 8 * h;
				if (m >= M)
					continue;
#pragma unroll
				for (int e = 0; e < 2; e++) {
					const int n = n0 + wn * NT * 8 + j * 8 + 2 * t + e;
					if (n >= V)
						continue;
					if (y32)
						y32[(size_t)m * ldy + n] = acc[i][j][2 * h + e];
					else
						y16[(size_t)m * ldy + n] = f32_to_bf16(acc[i][j][2 * h + e]);
				}
			}
}

#define HEAD_MMA(WM)                                                                              \
	extern "C" __global__ void __launch_bounds__(256)                                        \
	k_fwd_head_mma##WM(const uint16_t *__restrict__ W, const uint16_t *__restrict__ x, int ldx, \
			   float *__restrict__ y32, uint16_t *__restrict__ y16, int ldy, int M, int D,  \
			   int V)                                                                   \
	{                                                                                        \
		head_mma<WM>(W, x, ldx, y32, y16, ldy, M, D, V);                                  \
	}
HEAD_MMA(1)
HEAD_MMA(2)
HEAD_MMA(4)
