// indexer.cu — lightning-indexer scores over the paged FP8 key cache (spec §3.6 step 8):
//   I[b, s] = k_s[s] * Σ_h ReLU( q8[b, h, :] · k8[s, :] ) * w[b, h]      for s < n[b]
//   I[b, s] = -inf                                                          for n[b] <= s < ld
// q8 e4m3 [B, H, 128] (H <= 64), w fp32 [B, H] (the folded head weights w'), keys from the
// layer's indexer pages (page p at pool + p * page_bytes: 64 x 128 e4m3 codes, then 64 fp32
// scales; spec §6.2), block_table int [B, max_blocks] page ids, n int [B] causal key counts
// (pos + 1), scores fp32 [B, ld] (ld >= n; one block column covers 256 keys).
//
// Arithmetic: the e4m3 codes are converted to fp16 (exact: every e4m3 value is an fp16 value)
// and multiplied on the tensor cores with fp32 accumulation (mma m16n8k16), so each dot is
// exact products summed in fp32 — the CPU's semantics up to the order of the fp32 additions.
// (FP8 MMA would be faster but accumulates with reduced precision.)
//
// Layout: block = 4 warps = 256 keys of one query row = 4 pages; warp w takes page
// blockIdx.x * 4 + w. Q (H x 128, fp16) and w sit in shared memory, zero-padded to 64 heads.
// D order: lane (g, t) loads bytes [32t, 32t+32) of key g of an 8-key group; MMA step s uses
// bytes 4s..4s+3 of those for B and the same columns of Q for A — one permutation of the dot
// index for both operands.
#include "common.cuh"

#define IDX_HEADS 64
#define IDX_D 128

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t v)
{
	uint32_t r;
	asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
	return r;
}

__device__ __forceinline__ void mma_f16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
					uint32_t a3, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
		     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(128)
k_indexer_scores(const uint8_t *__restrict__ q8, const float *__restrict__ w, int H,
		 const uint8_t *__restrict__ pool, long long page_bytes,
		 const int *__restrict__ block_table, int max_blocks, const int *__restrict__ n_keys,
		 float *__restrict__ scores, int ld)
{
	__shared__ uint32_t qs[IDX_HEADS][IDX_D / 2]; // fp16 pairs, head-major
	__shared__ float ws[IDX_HEADS];
	const int b = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int g = lane >> 2, t = lane & 3;
	const int n = n_keys[b];
	const int key0 = blockIdx.x * 256 + warp * 64; // this warp's page of keys

	// Q to fp16 in shared memory (rows >= H are zero, their weights zero: no contribution)
	const uint16_t *qb = reinterpret_cast<const uint16_t *>(q8 + (size_t)b * H * IDX_D);
	for (int i = threadIdx.x; i < IDX_HEADS * IDX_D / 2; i += blockDim.x) {
		const int h = i / (IDX_D / 2);
		qs[h][i % (IDX_D / 2)] = h < H ? e4m3x2_to_f16x2(qb[i]) : 0u;
	}
	for (int h = threadIdx.x; h < IDX_HEADS; h += blockDim.x)
		ws[h] = h < H ? w[(size_t)b * H + h] : 0.f;
	__syncthreads(); // Q and w complete before any warp multiplies

	float *out = scores + (size_t)b * ld;
	if (key0 >= n) { // the whole page is past the causal limit
		for (int i = lane; i < 64; i += 32)
			if (key0 + i < ld)
				out[key0 + i] = -INFINITY;
		return;
	}
	const int page = block_table[(size_t)b * max_blocks + key0 / 64];
	const uint8_t *pg = pool + (size_t)page * page_bytes;
	const float *kscale = reinterpret_cast<const float *>(pg + 64 * IDX_D);

	for (int o = 0; o < 8; o++) { // 8 keys at a time
		const uint8_t *kp = pg + (size_t)(o * 8 + g) * IDX_D + 32 * t;
		const uint4 k0 = *reinterpret_cast<const uint4 *>(kp);
		const uint4 k1 = *reinterpret_cast<const uint4 *>(kp + 16);
		const uint32_t kw[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
		float part0 = 0.f, part1 = 0.f; // keys o*8 + 2t, o*8 + 2t + 1 (this lane's head rows)
#pragma unroll
		for (int ht = 0; ht < IDX_HEADS / 16; ht++) {
			float c[4] = {0.f, 0.f, 0.f, 0.f};
			const int h0 = ht * 16 + g;
#pragma unroll
			for (int s = 0; s < 8; s++) {
				const uint32_t b0 = e4m3x2_to_f16x2((uint16_t)(kw[s] & 0xffff));
				const uint32_t b1 = e4m3x2_to_f16x2((uint16_t)(kw[s] >> 16));
				const int col = 16 * t + 2 * s; // fp16-pair index of d = 32t + 4s
				mma_f16(c, qs[h0][col], qs[h0 + 8][col], qs[h0][col + 1], qs[h0 + 8][col + 1],
					b0, b1);
			}
			// c0, c1: head h0, keys 2t, 2t+1; c2, c3: head h0 + 8
			part0 += fmaxf(c[0], 0.f) * ws[h0] + fmaxf(c[2], 0.f) * ws[h0 + 8];
			part1 += fmaxf(c[1], 0.f) * ws[h0] + fmaxf(c[3], 0.f) * ws[h0 + 8];
		}
		// sum over the 8 lanes that share t (g = 0..7: the other head rows)
#pragma unroll
		for (int m = 4; m < 32; m <<= 1) {
			part0 += __shfl_xor_sync(0xffffffffu, part0, m);
			part1 += __shfl_xor_sync(0xffffffffu, part1, m);
		}
		if (g == 0) {
			const int s0 = key0 + o * 8 + 2 * t;
			if (s0 < ld)
				out[s0] = s0 < n ? part0 * kscale[o * 8 + 2 * t] : -INFINITY;
			if (s0 + 1 < ld)
				out[s0 + 1] = s0 + 1 < n ? part1 * kscale[o * 8 + 2 * t + 1] : -INFINITY;
		}
	}
}
