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
