/*
 * numerics.h — the number formats of DeepSeek-V3.2 (spec §5): bf16, FP8 e4m3 (float8_e4m3fn)
 * and the UE8M0 power-of-two scales, with the exact rounding the reference uses.
 *
 * Header-only and dependency-free: the CPU backend, the checkpoint writer, the tests and the
 * GPU tests' host side all convert through these functions, so there is one definition of
 * each rounding. Conversions to narrower formats round to nearest, ties to even.
 */
#ifndef DSV32_NUMERICS_H
#define DSV32_NUMERICS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define E4M3_MAX 448.0f

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* ---- bf16 --------------------------------------------------------------------------------- */

static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force a quiet mantissa bit */
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even on the dropped 16 bits */
	return (uint16_t)(u >> 16);
}

/* The value an fp32 becomes when stored as bf16 and read back. */
static inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

/* ---- FP8 e4m3 (float8_e4m3fn: bias 7, no infinities, NaN = S.1111.111, max 448) ---------- */

static inline float e4m3_to_f32(uint8_t b)
{
	int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
	float v;
	if (exp == 15 && man == 7)
		return sign ? -NAN : NAN;
	if (exp == 0)
		v = ldexpf((float)man, -9); /* subnormal: man/8 * 2^-6 */
	else
		v = ldexpf((float)(8 + man), exp - 10); /* (1 + man/8) * 2^(exp-7) */
	return sign ? -v : v;
}

/* Round to nearest even; |f| beyond 448 saturates to ±448 (callers clamp first, as the
 * reference does, so saturation only matters for inputs that were never meant to be FP8). */
static inline uint8_t f32_to_e4m3(float f)
{
	if (isnan(f))
		return 0x7f;
	uint8_t sign = signbit(f) ? 0x80 : 0;
	float a = fabsf(f);
	if (a >= E4M3_MAX)
		return sign | 0x7e;
	if (a < 0.015625f) { /* below 2^-6: subnormal grid of 2^-9 (8 steps reach 2^-6 itself) */
		int q = (int)nearbyintf(a * 512.0f);
		return sign | (uint8_t)q; /* q == 8 encodes 2^-6 as exp 1, man 0: the same bits */
	}
	int e;
	float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
	int q = (int)nearbyintf((m * 2.0f - 1.0f) * 8.0f); /* 3 mantissa bits, ties to even */
	int be = e - 1 + 7;
	if (q == 8) {
		q = 0;
		be++;
	}
	if (be > 15 || (be == 15 && q == 7))
		return sign | 0x7e;
	return sign | (uint8_t)(be << 3) | (uint8_t)q;
}

/* ---- UE8M0 scales (spec §5.3) ------------------------------------------------------------- */

/* s = 2^ceil(log2(amax * (1/448))) computed on the fp32 bits exactly as the reference's
 * fast_log2_ceil / fast_pow2 do. amax must already carry the 1e-4 floor. */
static inline float ue8m0_scale(float amax)
{
	uint32_t bits = f32_bits(amax * (1.0f / 448.0f));
	int e = (int)((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffffu) != 0);
	return f32_from_bits((uint32_t)(e + 127) << 23);
}

/* One 1x128 group of act_quant: 128 values (already bf16-representable) to e4m3 codes.
 * Returns the scale; dequantised value = e4m3_to_f32(q[j]) * scale. */
static inline float act_quant_group(const float *x, int n, uint8_t *q)
{
	float amax = 1e-4f;
	for (int j = 0; j < n; j++)
		amax = fmaxf(amax, fabsf(x[j]));
	float s = ue8m0_scale(amax);
	for (int j = 0; j < n; j++) {
		float v = x[j] / s;
		v = fminf(fmaxf(v, -E4M3_MAX), E4M3_MAX);
		q[j] = f32_to_e4m3(v);
	}
	return s;
}

#endif
