// mla.cuh — number conversions shared by the sparse MLA decode kernels (mla_decode.cu: mma.sync,
// mla_wgmma.cu: wgmma): the fp16 operands they feed the tensor cores (see mla_decode.cu's
// numerics note for the ranges in which these are exact). Device code only.
#pragma once
#include <stdint.h>

// Two e4m3 codes (lo = first element) times a power-of-two scale sc2 (as fp16x2), as fp16x2:
// the code converts exactly, and the product is exact while it stays in fp16's range (scales
// 2^-14 .. 2^7: see the numerics note of mla_decode.cu).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes, uint32_t sc2)
{
	uint32_t r;
	asm("{ .reg .b32 h2;\n\t"
	    "cvt.rn.f16x2.e4m3x2 h2, %1;\n\t"
	    "mul.rn.f16x2 %0, h2, %2; }"
	    : "=r"(r)
	    : "h"((uint16_t)codes), "r"(sc2));
	return r;
}

// Two fp32 as fp16x2 (lo = a), rounded to nearest even
__device__ __forceinline__ uint32_t f32x2_to_f16x2(float a, float b)
{
	uint32_t r;
	asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
	return r;
}

// bf16x2 -> fp16x2 (exact for magnitudes in [2^-14, 65504])
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v)
{
	return f32x2_to_f16x2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

__device__ __forceinline__ float f16_lo(uint32_t v)
{
	float f;
	asm("{ .reg .f16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(f) : "r"(v));
	return f;
}
__device__ __forceinline__ float f16_hi(uint32_t v)
{
	float f;
	asm("{ .reg .f16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi; }" : "=f"(f) : "r"(v));
	return f;
}

// fp16 chunk c (8 elements: dims 8c .. 8c + 7) of a key row from its record rp (spec §6.1:
// R e4m3 codes, R / 128 fp32 tile scales, 64 bf16): for c < R / 8 the latent, codes times their
// 128-wide tile's scale; else the rope part, bf16 -> fp16
__device__ __forceinline__ uint4 mla_record_chunk(const uint8_t *rp, int c, int R)
{
	if (c < R / 8) {
		const uint2 codes = *reinterpret_cast<const uint2 *>(rp + 8 * c);
		const float sc = *reinterpret_cast<const float *>(rp + R + (c >> 4) * 4);
		const uint32_t sc2 = f32x2_to_f16x2(sc, sc);
		return make_uint4(e4m3x2_to_f16x2(codes.x & 0xffff, sc2), e4m3x2_to_f16x2(codes.x >> 16, sc2),
				  e4m3x2_to_f16x2(codes.y & 0xffff, sc2), e4m3x2_to_f16x2(codes.y >> 16, sc2));
	}
	const uint32_t *src = reinterpret_cast<const uint32_t *>(rp + R + R / 32 + 16 * (c - R / 8));
	return make_uint4(bf16x2_to_f16x2(src[0]), bf16x2_to_f16x2(src[1]), bf16x2_to_f16x2(src[2]),
			  bf16x2_to_f16x2(src[3]));
}

// Four e4m3 codes (the bytes of w, b0 first) as two fp16x2, lo = (b0, b1) and hi = (b2, b3), each
// value times 2^-8, by integer operations (no conversion unit): an e4m3 byte s eeee mmm placed as
// the fp16 bits s 0eeee mmm 0000000 is its value over 2^8 (exponent biases 7 and 15; e4m3
// subnormals become fp16 subnormals, also exact). A caller multiplies by its scale times 2^8.
__device__ __forceinline__ void e4m3x4_to_f16x2_m8(uint32_t w, uint32_t &lo, uint32_t &hi)
{
	const uint32_t a = __byte_perm(w, 0, 0x1404), b = __byte_perm(w, 0, 0x3424);
	lo = (a & 0x80008000u) | ((a & 0x7F007F00u) >> 1);
	hi = (b & 0x80008000u) | ((b & 0x7F007F00u) >> 1);
}

__device__ __forceinline__ uint32_t f16x2_mul(uint32_t a, uint32_t b)
{
	uint32_t r;
	asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
	return r;
}
