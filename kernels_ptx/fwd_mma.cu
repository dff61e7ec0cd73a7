// fwd_mma.cu — the CUDA forward's bf16 products on the tensor cores for many token rows
// (prefill chunks, large decode batches), where the CUDA-core kernels of fwd_glue.cu (exact in
// the CPU's summation order, latency-optimal for a few rows) would be compute-bound:
//   mode 0: q absorption   q_lat[t, h, :] = bf16( q_nope[t, h, :] . W_UK_h )  (absorbed_heads,
//           model/cpu_attn.c), W_UK_h = kv_b rows h*(nope+dv) + d, e4m3 x block scale;
//   mode 1: W_UV           o[t, h*dv + n] = bf16( o_lat[t, h, :] . W_UV_h[n, :] )  (same);
//   mode 2: bf16 linear    y[t, n] = x[t, :] . W[n, :], fp32 or bf16 out (cpu_bf16_linear); batch
//           z reads W from W + z * b_hs (K-split partials: z = split, A, W and C offset by z).
// Numerics: the dequantised weights (e4m3 x a power-of-two scale) are exact in bf16, the
// activations are bf16 already, products are exact in fp32 and summed in fp32 by mma.sync
// m16n8k16 (bf16 in, fp32 accumulate): the CPU's result up to the order of the fp32 additions.
//
// Mode 0 also copies q_pe (A columns K .. K + c_hs - N) into C columns N .. (the MLA query layout).
// C[m, n] = sum_k A[m, k] B[n, k] for one batch z (the head in modes 0/1): A bf16 row m at
// A + z * a_hs + m * lda; B by mode (above); out rows at C + z * c_hs + m * ldc (elements).
// Tiles: 64 rows x 64 columns per block, K in chunks of 64 through shared memory (B stored
// [n][k], dequantised to bf16), 4 warps of 16 rows x 64 columns (8 mma n-tiles each).
// Grid (ceil(N / 64), ceil(M / 64), batches), 128 threads. K % 64 == 0 or K < 64 with K % 16 == 0.
#include "common.cuh"
#include "mma.cuh"

#define MM_T 64
#define MM_KC 64
#define MM_PAD 8

extern "C" __global__ void __launch_bounds__(128)
k_fwd_mma(int mode, const uint16_t *__restrict__ A, long long a_hs, int lda,
	  const void *__restrict__ B, const float *__restrict__ S, int b_row0, int b_hs, int ldb,
	  void *__restrict__ C, long long c_hs, int ldc, int out_f32, int M, int N, int K)
{
	__shared__ __align__(16) uint16_t As[MM_T][MM_KC + MM_PAD];
	__shared__ __align__(16) uint16_t Bs[MM_T][MM_KC + MM_PAD];
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int n0 = blockIdx.x * MM_T, m0 = blockIdx.y * MM_T, z = blockIdx.z;
	const uint16_t *Az = A + (size_t)z * a_hs;
	const int kc = K < MM_KC ? K : MM_KC; // K chunk (K % kc == 0)
	const int nkb = ldb / 128;            // scale blocks per kv_b row (modes 0, 1)
	if (mode == 0 && blockIdx.x == 0) {   // q_pe (A columns K ..) to C columns N .. (c_hs - N)
		const int rope = (int)c_hs - N;
		for (int i = tid; i < MM_T * rope; i += blockDim.x) {
			const int r = i / rope, d = i % rope;
			if (m0 + r < M)
				((uint16_t *)C)[(size_t)z * c_hs + (size_t)(m0 + r) * ldc + N + d] =
					Az[(size_t)(m0 + r) * lda + K + d];
		}
	}
	float acc[8][4];
#pragma unroll
	for (int i = 0; i < 8; i++)
		acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
	for (int k0 = 0; k0 < K; k0 += kc) {
		__syncthreads(); // the previous chunk is consumed
		for (int i = tid; i < MM_T * (kc / 8); i += blockDim.x) { // A: 8 bf16 per load
			const int r = i / (kc / 8), c = i % (kc / 8);
			uint4 v = make_uint4(0u, 0u, 0u, 0u);
			if (m0 + r < M)
				v = *reinterpret_cast<const uint4 *>(Az + (size_t)(m0 + r) * lda + k0 + c * 8);
			*reinterpret_cast<uint4 *>(&As[r][c * 8]) = v;
		}
		if (mode == 2) { // bf16 W[n, k]
			const uint16_t *W = (const uint16_t *)B;
			for (int i = tid; i < MM_T * (kc / 8); i += blockDim.x) {
				const int r = i / (kc / 8), c = i % (kc / 8);
				uint4 v = make_uint4(0u, 0u, 0u, 0u);
				if (n0 + r < N)
					v = *reinterpret_cast<const uint4 *>(W + (size_t)z * b_hs + (size_t)(n0 + r) * ldb +
									     k0 + c * 8);
				*reinterpret_cast<uint4 *>(&Bs[r][c * 8]) = v;
			}
		} else if (mode == 1) { // e4m3 W_UV rows n (kv_b row b_row0 + z*b_hs + n), columns k
			const uint8_t *W = (const uint8_t *)B;
			for (int i = tid; i < MM_T * (kc / 16); i += blockDim.x) {
				const int r = i / (kc / 16), c = i % (kc / 16);
				uint16_t h[16];
				if (n0 + r < N) {
					const int row = b_row0 + z * b_hs + n0 + r;
					const uint4 v = *reinterpret_cast<const uint4 *>(W + (size_t)row * ldb + k0 + c * 16);
					const float sc = S[(row / 128) * nkb + (k0 + c * 16) / 128];
					const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
					for (int e = 0; e < 16; e++)
						h[e] = f32_to_bf16(e4m3_to_f32((uint8_t)(wv[e / 4] >> (8 * (e % 4)))) * sc);
				} else {
#pragma unroll
					for (int e = 0; e < 16; e++)
						h[e] = 0;
				}
#pragma unroll
				for (int e = 0; e < 16; e++)
					Bs[r][c * 16 + e] = h[e];
			}
		} else { // mode 0: e4m3 W_UK rows k (kv_b row b_row0 + z*b_hs + k), columns n: transpose
			const uint8_t *W = (const uint8_t *)B;
			for (int i = tid; i < kc * (MM_T / 16); i += blockDim.x) {
				const int kk = i / (MM_T / 16), c = i % (MM_T / 16);
				const int row = b_row0 + z * b_hs + k0 + kk, n = n0 + c * 16;
				if (n < N) {
					const uint4 v = *reinterpret_cast<const uint4 *>(W + (size_t)row * ldb + n);
					const float sc = S[(row / 128) * nkb + n / 128];
					const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
					for (int e = 0; e < 16; e++)
						Bs[c * 16 + e][kk] = f32_to_bf16(
							e4m3_to_f32((uint8_t)(wv[e / 4] >> (8 * (e % 4)))) * sc);
				} else {
#pragma unroll
					for (int e = 0; e < 16; e++)
						Bs[c * 16 + e][kk] = 0;
				}
			}
		}
		__syncthreads(); // both tiles are staged
#pragma unroll
		for (int ks = 0; ks < MM_KC; ks += 16) {
			if (ks >= kc)
				break;
			const int r = warp * 16 + g;
			const uint32_t a0 = *reinterpret_cast<const uint32_t *>(&As[r][ks + 2 * t]);
			const uint32_t a1 = *reinterpret_cast<const uint32_t *>(&As[r + 8][ks + 2 * t]);
			const uint32_t a2 = *reinterpret_cast<const uint32_t *>(&As[r][ks + 2 * t + 8]);
			const uint32_t a3 = *reinterpret_cast<const uint32_t *>(&As[r + 8][ks + 2 * t + 8]);
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
				const uint32_t b0 = *reinterpret_cast<const uint32_t *>(&Bs[nt * 8 + g][ks + 2 * t]);
				const uint32_t b1 = *reinterpret_cast<const uint32_t *>(&Bs[nt * 8 + g][ks + 2 * t + 8]);
				mma_bf16_16816(acc[nt], a0, a1, a2, a3, b0, b1);
			}
		}
	}
	// c0, c1: row g, columns 2t, 2t+1 of the n-tile; c2, c3: row g + 8
#pragma unroll
	for (int nt = 0; nt < 8; nt++)
#pragma unroll
		for (int h2 = 0; h2 < 2; h2++) {
			const int m = m0 + warp * 16 + g + 8 * h2;
			if (m >= M)
				continue;
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int n = n0 + nt * 8 + 2 * t + e;
				if (n >= N)
					continue;
				const size_t off = (size_t)z * c_hs + (size_t)m * ldc + n;
				if (out_f32)
					((float *)C)[off] = acc[nt][2 * h2 + e];
				else
					((uint16_t *)C)[off] = f32_to_bf16(acc[nt][2 * h2 + e]);
			}
		}
}

// y[m, n] = sum over s < S, in order, of ws[s, m, n] (the K-split partials of mode 2, fp32
// [S, M, N]); y32 fp32 or (y32 null) y16 bf16, row stride ldy. Grid covers M * N, 256 threads.
extern "C" __global__ void __launch_bounds__(256)
k_fwd_ks_reduce(const float *__restrict__ ws, int S, int M, int N, float *__restrict__ y32,
		uint16_t *__restrict__ y16, int ldy)
{
	const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= (long long)M * N)
		return;
	float t = ws[i];
	for (int s = 1; s < S; s++)
		t += ws[(size_t)s * M * N + i];
	const int m = (int)(i / N), n = (int)(i % N);
	if (y32)
		y32[(size_t)m * ldy + n] = t;
	else
		y16[(size_t)m * ldy + n] = f32_to_bf16(t);
}
