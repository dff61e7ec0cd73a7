// mla_decode.cu — sparse MLA attention of decode rows over the paged FP8 latent cache, in the
// absorbed form (spec §3.7b): for each row b and head h, over the selected keys s in order,
//   score[s] = scale * (q_lat[b,h] . c_kv[s] + q_pe[b,h] . k_pe[s])     (fp32)
//   P = softmax(score) (fp32),  o_lat[b,h] = bf16( Σ_s P[s] c_kv[s] )
// c_kv is dequantised from the 656-byte record (e4m3 x its tile's fp32 scale; exact in bf16),
// k_pe read as bf16. The CPU reference is attn_latent (model/cpu_attn.c); the q_lat absorption
// before and the W_UV projection after are GEMMs.
//
// k_mla_decode: q bf16 [B, H, R + 64] per head [q_lat (R) | q_pe (64)], sel int [B, ld_sel]
// physical slots in key order (-1 ends the list), pool: the layer's MLA records (slot r at
// pool + r * rec_bytes), o_lat bf16 [B, H, R]. R <= 512, H a multiple of 16.
// Grid (H / 16, B, splits), 256 threads: one block = 16 heads of one row and keys_per_split of
// its keys; with more than one split, the partial results go to `part` and k_mla_combine merges
// them (small batches would otherwise leave most SMs idle). Keys go through shared memory
// 16 at a time as bf16; thread (h = tid / 16, c = tid % 16) computes the scores of head h for
// keys c (one dot of R + 64), and owns o_lat[h][c + 16 j] for j < R / 16 in registers, updated
// by an online softmax (running max and sum in fp32). This is the correct first version on
// CUDA cores; the tensor-core version is the next step (docs/PERF.md).
#include "common.cuh"

#define MLA_HEADS 16
#define MLA_KEYS 16
#define MLA_MAXR 512
#define MLA_ROPE 64

extern "C" __global__ void __launch_bounds__(256)
k_mla_decode(const uint16_t *__restrict__ q, const int *__restrict__ sel, int ld_sel,
	     const uint8_t *__restrict__ pool, int rec_bytes, int R, int H, float scale,
	     uint16_t *__restrict__ o_lat, int keys_per_split, float *__restrict__ part)
{
	__shared__ uint16_t qs[MLA_HEADS][MLA_MAXR + MLA_ROPE]; // this block's 16 heads
	// 16 keys, dequantised, bf16; rows padded by 2 elements so the 16 threads of a head, which
	// read 16 different keys at the same d, hit 16 different banks
	__shared__ uint16_t ks[MLA_KEYS][MLA_MAXR + MLA_ROPE + 2];
	__shared__ float ps[MLA_HEADS][MLA_KEYS];               // their probabilities (unnormalised)
	const int b = blockIdx.y, h0 = blockIdx.x * MLA_HEADS, tid = threadIdx.x;
	const int hh = tid / MLA_KEYS, c = tid % MLA_KEYS;
	const int DK = R + MLA_ROPE;
	const int *srow = sel + (size_t)b * ld_sel;
	// this block's keys: [k_begin, k_end) of the row's list (gridDim.z splits of the keys)
	const int k_begin = blockIdx.z * keys_per_split;
	const int k_end = min(ld_sel, k_begin + keys_per_split);

	for (int i = tid; i < MLA_HEADS * DK; i += blockDim.x)
		qs[i / DK][i % DK] = q[((size_t)b * H + h0 + i / DK) * DK + i % DK];

	float o[MLA_MAXR / 16];
#pragma unroll
	for (int j = 0; j < MLA_MAXR / 16; j++)
		o[j] = 0.f;
	float m = -INFINITY, l = 0.f; // running max and sum of head hh (same in its 16 threads)
	for (int k0 = k_begin;; k0 += MLA_KEYS) {
		__syncthreads(); // the previous tile's keys and probabilities are consumed
		const int nk = k0 < k_end ? min(MLA_KEYS, k_end - k0) : 0;
		// dequantise up to 16 keys: c_kv code * tile scale (exact in bf16), k_pe as is
		for (int i = tid; i < MLA_KEYS * DK; i += blockDim.x) {
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
		for (int j = 0; j < MLA_MAXR / 16; j++) {
			if (j * 16 >= R)
				break;
			const int d = c + 16 * j;
			float acc = o[j] * corr;
			for (int kk = 0; kk < valid; kk++)
				acc = fmaf(ps[hh][kk], bf16_to_f32(ks[kk][d]), acc);
			o[j] = acc;
		}
		if (valid < MLA_KEYS)
			break;
	}
	if (gridDim.z > 1) {
		// a split's unnormalised o, its max and sum: k_mla_combine merges the splits
		// part: [B, H, splits] x (R + 2) floats: o[R], m, l
		float *pp = part + (((size_t)b * H + h0 + hh) * gridDim.z + blockIdx.z) * (R + 2);
#pragma unroll
		for (int j = 0; j < MLA_MAXR / 16; j++)
			if (j * 16 < R)
				pp[c + 16 * j] = o[j];
		if (c == 0)
			pp[R] = m, pp[R + 1] = l;
		return;
	}
	const float inv = l > 0.f ? 1.f / l : 0.f;
	uint16_t *out = o_lat + ((size_t)b * H + h0 + hh) * R;
#pragma unroll
	for (int j = 0; j < MLA_MAXR / 16; j++)
		if (j * 16 < R)
			out[c + 16 * j] = f32_to_bf16(o[j] * inv);
}

// Merges the splits of k_mla_decode (FlashDecoding): M = max m_i, L = Σ l_i e^(m_i - M),
// o = Σ o_i e^(m_i - M) / L, in split order. One block per (head, row), R threads.
extern "C" __global__ void __launch_bounds__(512)
k_mla_combine(const float *__restrict__ part, int splits, int R, uint16_t *__restrict__ o_lat)
{
	const size_t bh = blockIdx.x; // b * H + h
	const float *pp = part + bh * splits * (R + 2);
	float M = -INFINITY;
	for (int i = 0; i < splits; i++)
		M = fmaxf(M, pp[(size_t)i * (R + 2) + R]);
	float L = 0.f, acc = 0.f;
	for (int i = 0; i < splits; i++) {
		const float *pi = pp + (size_t)i * (R + 2);
		const float w = pi[R] == -INFINITY ? 0.f : expf(pi[R] - M);
		L += pi[R + 1] * w;
		if ((int)threadIdx.x < R)
			acc += pi[threadIdx.x] * w;
	}
	if ((int)threadIdx.x < R)
		o_lat[bh * R + threadIdx.x] = f32_to_bf16(L > 0.f ? acc / L : 0.f);
}
