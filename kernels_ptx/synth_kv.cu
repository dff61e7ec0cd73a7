// synth_kv.cu — synthetic KV-cache contents for benchmarks at long contexts (issue 12: `dsv32
// bench model` fills 1K..128K-token contexts without running a prefill). It makes the bf16
// inputs the real KV-write kernels (kv_write.cu) take, so the caches then hold exactly what a
// prefill of random tokens would have written: e4m3 codes with UE8M0 tile scales (spec §6).
//
// k_synth_kv_rows: for the n tokens at positions pos0 .. pos0+n-1 of one sequence (block table
//   bt, 64 positions per page):
//     slots[t] = bt[pos >> 6] * 64 + (pos & 63)        (physical slot, spec §6.3)
//     ckv[t, j], j < R       c_kv, the latent after kv_a_layernorm (unit RMS)
//     kpe[t, j], j < rope    k_pe after RoPE
//     kidx[t, j], j < dk     the indexer key after LayerNorm, RoPE and the orthonormal
//                            Hadamard transform (unit RMS)
//   Each value: k = u0 + u1 + u2 + u3 - 131072 with u_i four 16-bit fields of one 64-bit hash
//   draw of (stream seed, pos * dim + j) (an Irwin-Hall sum: bell-shaped, variance 4/12 of
//   65536^2), times the host's fp32 factor scale = rms * sqrt(3) / 65536, rounded to bf16
//   (RNE). One fp32 multiply of an exact integer: the CPU reproduces every value bit for bit
//   (tests/gpu/test_gpu_synth.c). Values depend on (seed, position), not on the chunking.
// Layout: ckv [n, R], kpe [n, rope], kidx [n, dk] bf16 row-major, slots int [n].
// One block per token; threads stride over the R + rope + dk values of the token.
#include "common.cuh"

__device__ __forceinline__ uint64_t synth_kv_mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

__device__ __forceinline__ uint16_t synth_kv_value(uint64_t seed, uint64_t i, float scale)
{
	const uint64_t r = synth_kv_mix(seed + (i + 1) * 0x9e3779b97f4a7c15ull);
	const int k = (int)(r & 0xffff) + (int)((r >> 16) & 0xffff) + (int)((r >> 32) & 0xffff) +
		      (int)(r >> 48) - 131072;
	return f32_to_bf16((float)k * scale); // |k| < 2^18: exact in fp32, one rounding
}

extern "C" __global__ void __launch_bounds__(128)
k_synth_kv_rows(uint16_t *__restrict__ ckv, uint16_t *__restrict__ kpe, uint16_t *__restrict__ kidx,
		int *__restrict__ slots, const int *__restrict__ bt, long long pos0, int R, int rope,
		int dk, unsigned long long seed_c, unsigned long long seed_p, unsigned long long seed_k,
		float scale_c, float scale_p, float scale_k)
{
	const int t = blockIdx.x;
	const long long pos = pos0 + t;
	if (threadIdx.x == 0)
		slots[t] = bt[pos >> 6] * 64 + (int)(pos & 63);
	for (int j = threadIdx.x; j < R; j += blockDim.x)
		ckv[(size_t)t * R + j] = synth_kv_value(seed_c, (uint64_t)pos * R + j, scale_c);
	for (int j = threadIdx.x; j < rope; j += blockDim.x)
		kpe[(size_t)t * rope + j] = synth_kv_value(seed_p, (uint64_t)pos * rope + j, scale_p);
	for (int j = threadIdx.x; j < dk; j += blockDim.x)
		kidx[(size_t)t * dk + j] = synth_kv_value(seed_k, (uint64_t)pos * dk + j, scale_k);
}
