// fwd_mla_fp32.cu — a diagnosis variant of the sparse MLA decode for the CUDA forward
// (model/cuda_forward.c, DSV32_CUDA_MLA_FP32=1): the absorbed form's latent core (spec §3.7b)
// with fp32 probabilities throughout, as the CPU's attn_latent (model/cpu_attn.c) computes it —
// the production kernel (kernels_ptx/mla_decode.cu) rounds P to bf16 before P V. This is the
// project's first CUDA-core MLA kernel (commit 85fb626) without its key splits: one block per
// 16 heads of a row, all of the row's keys. Slow; for measuring how much of the GPU-vs-CPU
// difference of a layer is that rounding.
//
//   score[s] = scale * (q_lat . c_kv[s] + q_pe . k_pe[s]),  P = softmax(score) (fp32, online),
//   o_lat = bf16( sum_s P[s] c_kv[s] ).
// q bf16 [B, H, R + 64], sel int [B, ld_sel] physical slots (-1 ends the list), pool: the
// layer's MLA records (slot r at pool + r * rec_bytes), o_lat bf16 [B, H, R]. R <= 512, H % 16
// == 0. Grid (H / 16, B), 256 threads.
#include "common.cuh"

#define FMLA_HEADS 16
#define FMLA_KEYS 16
#define FMLA_MAXR 512
#define FMLA_ROPE 64

extern "C" __global__ void __launch_bounds__(256)
k_fwd_mla_fp32(const uint16_t *__restrict__ q, const int *__restrict__ sel, int ld_sel,
	       const uint8_t *__restrict__ pool, int rec_bytes, int R, int H, float scale,
	       uint16_t *__restrict__ o_lat)
{
	__shared__ uint16_t qs[FMLA_HEADS][FMLA_MAXR + FMLA_ROPE]; // this block's 16 heads
	// 16 keys, dequantised, bf16; rows padded by 2 elements so the 16 threads of a head, which
	// read 16 different keys at the same d, hit 16 different banks
	__shared__ uint16_t ks[FMLA_KEYS][FMLA_MAXR + FMLA_ROPE + 2];
	__shared__ float ps[FMLA_HEADS][FMLA_KEYS];               // their probabilities (unnormalised)
	const int b = blockIdx.y, h0 = blockIdx.x * FMLA_HEADS, tid = threadIdx.x;
	const int hh = tid / FMLA_KEYS, c = tid % FMLA_KEYS;
	const int DK = R + FMLA_ROPE;
	const int *srow = sel + (size_t)b * ld_sel;
	const int k_begin = 0, k_end = ld_sel;

	for (int i = tid; i < FMLA_HEADS * DK; i += blockDim.x)
		qs[i / DK][i % DK] = q[((size_t)b * H + h0 + i / DK) * DK + i % DK];

	float o[FMLA_MAXR / 16];
#pragma unroll
	for (int j = 0; j < FMLA_MAXR / 16; j++)
		o[j] = 0.f;
	float m = -INFINITY, l = 0.f; // running max and sum of head hh (same in its 16 threads)
	for (int k0 = k_begin;; k0 += FMLA_KEYS) {
		__syncthreads(); // the previous tile's keys and probabilities are consumed
		const int nk = k0 < k_end ? min(FMLA_KEYS, k_end - k0) : 0;
		// dequantise up to 16 keys: c_kv code * tile scale (exact in bf16), k_pe as is
		for (int i = tid; i < FMLA_KEYS * DK; i += blockDim.x) {
			const int kk = i / DK, d = i % DK;
			const int slot = kk < nk ? srow[k0 + kk] : -1;
			uint16_t v = 0;
			if (slot >= 0) {
				const uint8_t *rec = pool + (size_t)slot * rec_bytes;
				if (d < R) {
					const float sc = *reinterpret_cast<const float *>(rec + R + (d >> 7) * 4);
					v = f32_to_bf16(e4m3_to_f32(rec[d]) * sc);
				} else {
					v = *reinterpret_cast<const uint16_t *>(rec + R + (R >> 7) * 4 + 2 * (d - R));
				}
			}
			ks[kk][d] = v;
		}
		__syncthreads(); // keys in shared memory
		// how many of the 16 are valid (the list ends at the first -1)
		int valid = 0;
		while (valid < nk && srow[k0 + valid] >= 0)
			valid++;
		if (valid == 0)
			break;
		float s = -INFINITY;
		if (c < valid) {
			float acc = 0.f;
			for (int d = 0; d < DK; d++)
				acc = fmaf(bf16_to_f32(qs[hh][d]), bf16_to_f32(ks[c][d]), acc);
			s = acc * scale;
		}
		// online softmax over the 16 threads of head hh (they share a 16-lane half warp)
		float tmax = s;
#pragma unroll
		for (int o2 = 8; o2 > 0; o2 >>= 1)
			tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o2));
		const float mnew = fmaxf(m, tmax);
		const float p = c < valid ? expf(s - mnew) : 0.f;
		const float corr = m == -INFINITY ? 0.f : expf(m - mnew);
		float psum = p;
#pragma unroll
		for (int o2 = 8; o2 > 0; o2 >>= 1)
			psum += __shfl_xor_sync(0xffffffffu, psum, o2);
		l = l * corr + psum;
		m = mnew;
		ps[hh][c] = p;
		__syncthreads(); // every head's probabilities are visible
#pragma unroll
		for (int j = 0; j < FMLA_MAXR / 16; j++) {
			if (j * 16 >= R)
				break;
			const int d = c + 16 * j;
			float acc = o[j] * corr;
			for (int kk = 0; kk < valid; kk++)
				acc = fmaf(ps[hh][kk], bf16_to_f32(ks[kk][d]), acc);
			o[j] = acc;
		}
		if (valid < FMLA_KEYS)
			break;
	}
	const float inv = l > 0.f ? 1.f / l : 0.f;
	uint16_t *out = o_lat + ((size_t)b * H + h0 + hh) * R;
#pragma unroll
	for (int j = 0; j < FMLA_MAXR / 16; j++)
		if (j * 16 < R)
			out[c + 16 * j] = f32_to_bf16(o[j] * inv);
}

