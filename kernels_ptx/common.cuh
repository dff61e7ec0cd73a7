// common.cuh — device helpers shared by the kernels: the number formats of spec §5 with the
// same rounding as model/numerics.h (bf16 round-to-nearest-even, e4m3 RNE with saturation,
// UE8M0 power-of-two scales), and warp reductions. Device code only.
#pragma once
#include <stdint.h>

__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

// bf16(lo) | bf16(hi) << 16, each rounded to nearest even (one instruction; the same bits as
// f32_to_bf16 for every non-NaN value).
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi)
{
	uint32_t r;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}

// e4m3 (float8_e4m3fn) code of x, round to nearest even, saturating at ±448.
__device__ __forceinline__ uint8_t f32_to_e4m3(float x)
{
	uint16_t r;
	asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
	return (uint8_t)(r & 0xff);
}

// act_quant's clamp of x / sc for a UE8M0 scale sc given as inv = 1 / sc (exact: sc is a power
// of two, so x * inv is the correctly rounded x / sc), before its e4m3 rounding.
__device__ __forceinline__ float e4m3_scaled(float x, float inv)
{
	return fminf(fmaxf(x * inv, -448.f), 448.f);
}

// Two e4m3 codes packed (lo = a, hi = b).
__device__ __forceinline__ uint16_t f32x2_to_e4m3x2(float a, float b)
{
	uint16_t r;
	asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
	return r;
}

__device__ __forceinline__ float e4m3_to_f32(uint8_t b)
{
	float out;
	uint16_t in = b;
	asm("{ .reg .b32 h2; .reg .f16 lo, hi;\n\t"
	    "cvt.rn.f16x2.e4m3x2 h2, %1;\n\t"
	    "mov.b32 {lo, hi}, h2;\n\t"
	    "cvt.f32.f16 %0, lo; }"
	    : "=f"(out)
	    : "h"(in));
	return out;
}

// 2^ceil(log2(amax / 448)) on the fp32 bits (spec §5.3); amax carries the 1e-4 floor.
__device__ __forceinline__ float ue8m0_scale(float amax)
{
	uint32_t bits = __float_as_uint(amax * (1.0f / 448.0f));
	int e = (int)((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffffu) != 0);
	return __uint_as_float((uint32_t)(e + 127) << 23);
}

// silu(g) = g / (1 + exp(-g)) in fp32: one expression for every SwiGLU below and for the table
// of k_moe_swiglu_quant, so that they give the same bits.
__device__ __forceinline__ float silu_f32(float g) { return __fdiv_rn(g, 1.0f + expf(-g)); }

// h = bf16( silu * u ): the SwiGLU's product, of silu_f32(g) and a bf16-valued u.
__device__ __forceinline__ float swiglu_mul(float silu, float u)
{
	return bf16_to_f32(f32_to_bf16(__fmul_rn(silu, u)));
}

// h = bf16( silu(g) * u ) of bf16-valued g and u in fp32: the SwiGLU of every fused kernel
// (k_moe_swiglu_quant, the SwiGLU epilogues of the grouped GEMMs).
__device__ __forceinline__ float swiglu_bf16v(float g, float u) { return swiglu_mul(silu_f32(g), u); }

// The same of fp32 g and u first rounded to bf16 (a GEMM's gate and up values, as its bf16
// output would hold them).
__device__ __forceinline__ float swiglu_bf16(float g, float u)
{
	return swiglu_bf16v(bf16_to_f32(f32_to_bf16(g)), bf16_to_f32(f32_to_bf16(u)));
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

// act_quant of one 128-wide group held by a warp in registers (spec §5.3): lane l holds the bf16
// values v[k] = x[4l + k]; writes their e4m3 codes to q[4l ..] and returns the group's UE8M0
// scale (every lane gets it). Bit-exact to model/numerics.h act_quant_group.
__device__ __forceinline__ float warp_act_quant128_regs(const float v[4], uint8_t *__restrict__ q,
							int lane)
{
	float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
	amax = fmaxf(warp_max(amax), 1e-4f);
	const float sc = ue8m0_scale(amax);
	// x / sc is exact (sc is a power of two); clamp then round to nearest even
	uint32_t packed = 0;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		float y = fminf(fmaxf(v[k] / sc, -448.f), 448.f);
		packed |= (uint32_t)f32_to_e4m3(y) << (8 * k);
	}
	*reinterpret_cast<uint32_t *>(q + lane * 4) = packed;
	return sc;
}

// The same reading the group from memory: lane l loads x[4l .. 4l+3] (one 8-byte load).
__device__ __forceinline__ float warp_act_quant128(const uint16_t *__restrict__ x,
						   uint8_t *__restrict__ q, int lane)
{
	const uint2 raw = *reinterpret_cast<const uint2 *>(x + lane * 4);
	float v[4] = {bf16_to_f32(raw.x & 0xffff), bf16_to_f32(raw.x >> 16),
		      bf16_to_f32(raw.y & 0xffff), bf16_to_f32(raw.y >> 16)};
	return warp_act_quant128_regs(v, q, lane);
}

// Sylvester Hadamard transform (unscaled, fp32) of a 128-vector held by a warp as v[k] = x[4l + k]
// (spec §3.6 step 4): two butterfly stages inside the lane, five across lanes with shuffles.
__device__ __forceinline__ void warp_hadamard128(float v[4], int lane)
{
	// bits 0,1 of the index: inside the lane
	float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
	v[0] = a0 + a2, v[1] = a1 + a3, v[2] = a0 - a2, v[3] = a1 - a3;
	// bits 2..6: across lanes (lane bit j = index bit j+2); the lane with the bit clear keeps
	// the sum, the other the difference
#pragma unroll
	for (int m = 1; m < 32; m <<= 1) {
#pragma unroll
		for (int k = 0; k < 4; k++) {
			float o = __shfl_xor_sync(0xffffffffu, v[k], m);
			v[k] = (lane & m) ? o - v[k] : v[k] + o;
		}
	}
}

// LayerNorm with bias of a 128-vector held by a warp as v[k] = x[4l + k] (spec §3.6.3):
// mean-subtracted, biased variance, fp32; v gets the fp32 results (the caller rounds).
__device__ __forceinline__ void warp_layernorm128(float v[4], int lane, const float *__restrict__ w,
						  const float *__restrict__ b, float eps)
{
	const float mean = warp_sum(v[0] + v[1] + v[2] + v[3]) * (1.0f / 128.0f);
	float d2 = 0.f;
#pragma unroll
	for (int k = 0; k < 4; k++)
		d2 += (v[k] - mean) * (v[k] - mean);
	const float var = warp_sum(d2) * (1.0f / 128.0f);
	const float inv = rsqrtf(var + eps);
#pragma unroll
	for (int k = 0; k < 4; k++) {
		int i = lane * 4 + k;
		v[k] = (v[k] - mean) * inv * w[i] + b[i];
	}
}

// RMSNorm of one row with the optional fused residual add (spec §3.2) by a block of THREADS
// threads, PER values each (dim <= THREADS * PER): s = fp32(x) [+ fp32(res)],
// out = bf16(w * s / sqrt(mean(s^2) + eps)), res = bf16(s) when res is not null.
template <int THREADS, int PER>
__device__ __forceinline__ void block_rmsnorm_row(const uint16_t *__restrict__ xr,
						  uint16_t *__restrict__ rr, const float *__restrict__ w,
						  uint16_t *__restrict__ orow, int dim, float eps)
{
	float s[PER];
	float ss = 0.f;
#pragma unroll
	for (int k = 0; k < PER; k++) {
		int i = threadIdx.x + k * THREADS;
		s[k] = 0.f;
		if (i < dim) {
			float v = bf16_to_f32(xr[i]);
			if (rr)
				v += bf16_to_f32(rr[i]);
			s[k] = v;
			ss += v * v;
		}
	}
	// block reduction of the sum of squares: warp shuffles, then one value per warp in smem
	__shared__ float part[THREADS / 32];
	ss = warp_sum(ss);
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x >> 5] = ss;
	__syncthreads(); // every warp's partial is in smem before any thread sums them
	float tot = 0.f;
#pragma unroll
	for (int k = 0; k < THREADS / 32; k++)
		tot += part[k];
	const float inv = rsqrtf(tot / (float)dim + eps);
#pragma unroll
	for (int k = 0; k < PER; k++) {
		int i = threadIdx.x + k * THREADS;
		if (i < dim) {
			orow[i] = f32_to_bf16(w[i] * (s[k] * inv));
			if (rr)
				rr[i] = f32_to_bf16(s[k]);
		}
	}
}
