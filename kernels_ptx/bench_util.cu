// bench_util.cu — device helpers for benchmarks and GPU tests: deterministic random fill
// (synthetic weights generated on the GPU, never zeros) and the read-bandwidth probe that
// measures the HBM limit each benchmark reports its ratio against.
#include "common.cuh"

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

// k_fill_e4m3: p[i] = a random e4m3 code with |value| <= 448/2^(lim) and never NaN (0x7f/0xff
// are replaced). n bytes, grid-stride, 8 bytes per step.
extern "C" __global__ void k_fill_e4m3(uint8_t *p, long long n, unsigned long long seed)
{
	for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n;
	     i += (long long)gridDim.x * blockDim.x * 8) {
		uint64_t r = mix64(seed + (uint64_t)i * 0x9e3779b97f4a7c15ull);
		for (int k = 0; k < 8 && i + k < n; k++) {
			uint8_t b = (uint8_t)(r >> (8 * k));
			b = (b & 0x80) | ((b & 0x7f) % 0x60); // exponent <= 11: |v| <= 15, no NaN
			p[i + k] = b;
		}
	}
}

// k_fill_e4m3_normal: p[i] = the e4m3 code of N(0, sigma^2) (Box-Muller on two 32-bit draws),
// rounded and saturated as a checkpoint's per-block quantiser does (sigma = 448 / 4.56 puts a
// 128x128 block's expected largest |value| at e4m3's 448: weights drawn like a real checkpoint's
// rather than uniform over the codes). Never NaN (satfinite); zeros only where N(0, sigma^2)
// rounds to one.
extern "C" __global__ void k_fill_e4m3_normal(uint8_t *p, long long n, unsigned long long seed,
					      float sigma)
{
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		uint64_t r = mix64(seed + (uint64_t)i * 0x9e3779b97f4a7c15ull);
		float u1 = ((uint32_t)r + 1.0f) * 2.3283064e-10f; // (0, 1]
		float u2 = (uint32_t)(r >> 32) * 2.3283064e-10f;   // [0, 1)
		p[i] = f32_to_e4m3(sigma * sqrtf(-2.0f * __logf(u1)) * __cosf(6.2831853f * u2));
	}
}

// k_fill_f32_pow2: p[i] = 2^(e) with e uniform in [lo, hi] (block scales).
extern "C" __global__ void k_fill_f32_pow2(float *p, long long n, unsigned long long seed, int lo,
					   int hi)
{
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		uint64_t r = mix64(seed ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull));
		int e = lo + (int)(r % (uint64_t)(hi - lo + 1));
		p[i] = __uint_as_float((uint32_t)(e + 127) << 23);
	}
}

// k_read_bw: XOR of every 16-byte word of p[0 .. n16) into *sink (so nothing is elided).
// Streaming loads, 4 in flight per thread.
extern "C" __global__ void __launch_bounds__(512) k_read_bw(const uint4 *__restrict__ p,
							     long long n16,
							     unsigned long long *sink)
{
	uint32_t x = 0;
	const long long stride = (long long)gridDim.x * blockDim.x;
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	for (; i + 3 * stride < n16; i += 4 * stride) {
		uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
		      d = __ldcs(p + i + 3 * stride);
		x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^
		     d.y ^ d.z ^ d.w;
	}
	for (; i < n16; i += stride) {
		uint4 a = __ldcs(p + i);
		x ^= a.x ^ a.y ^ a.z ^ a.w;
	}
	if (x == 0x12345678u) // practically never: keeps the loads alive without a global write
		atomicAdd(sink, 1ull);
}
