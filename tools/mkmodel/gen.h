/*
 * gen.h — the deterministic weight generator of mkmodel, header-only so the tests regenerate
 * the exact bytes mkmodel wrote.
 *
 * Owns: the random stream (xoshiro256** seeded by splitmix64 from --seed and the tensor's
 * name: every tensor has its own stream, independent of write order and sharding) and the
 * value recipes per kind of tensor. Only integer arithmetic feeds the stream; values are made
 * from small integers times powers of two, so every conversion to FP8 / bf16 / fp32 is exact
 * and the same seed gives byte-identical files on every machine.
 * Must not: depend on anything but numerics.h (no I/O, no libm rounding in the stream).
 *
 * Magnitudes (a roughly unit-variance residual stream through pre-norm blocks):
 *   FP8 weights [out, in]: code = e4m3(±k), k uniform in 0..15 (E[k²] = 77.5), block scale
 *     2^-(e or e+1) with e = floor(log2(78·in)/2): real weight rms ≈ 0.9/sqrt(in).
 *   BF16 matrices [rows, in]: k = sum of four 7-bit draws − 254 (|k| <= 254, exact in bf16,
 *     rms 73.9) times 2^-p, p = floor((log2(5461·in)+1)/2): rms ≈ 1/sqrt(in) (embeddings use
 *     in = 1: rms ≈ 1.15).
 *   Norm weights: 1 + j/128, j triangular in [-15, 15]. Biases (indexer k_norm.bias):
 *     j/128. e_score_correction_bias (F32): j/256.
 */
#ifndef DSV32_MKMODEL_GEN_H
#define DSV32_MKMODEL_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "model/numerics.h"

enum gen_kind {
	GEN_FP8,        /* F8_E4M3 weight codes */
	GEN_SCALE,      /* F32 weight_scale_inv, power of two; param = fan-in */
	GEN_BF16,       /* BF16 matrix; param = fan-in (1 for embeddings) */
	GEN_NORM,       /* BF16 norm weight near 1 */
	GEN_BIAS_BF16,  /* BF16 small bias */
	GEN_BIAS_F32,   /* F32 small bias */
};

struct gen {
	uint64_t s[4];
	enum gen_kind kind;
	int shift; /* GEN_SCALE: base exponent e; GEN_BF16: p */
};

static inline uint64_t gen_splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t gen_next(struct gen *g)
{
	uint64_t *s = g->s;
	uint64_t r = s[1] * 5;
	r = ((r << 7) | (r >> 57)) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = (s[3] << 45) | (s[3] >> 19);
	return r;
}

static inline int gen_ilog2(uint64_t x)
{
	int n = -1;
	while (x)
		x >>= 1, n++;
	return n;
}

/* Starts the stream of tensor `name` (FNV-1a of the name mixed with the seed). */
static inline void gen_init(struct gen *g, uint64_t seed, const char *name, enum gen_kind kind,
			    int64_t fan_in)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const unsigned char *c = (const unsigned char *)name; *c; c++)
		h = (h ^ *c) * 0x100000001b3ull;
	uint64_t x = seed ^ (h * 0x9e3779b97f4a7c15ull);
	for (int i = 0; i < 4; i++)
		g->s[i] = gen_splitmix(&x);
	g->kind = kind;
	g->shift = 0;
	if (fan_in < 1)
		fan_in = 1;
	if (kind == GEN_SCALE)
		g->shift = gen_ilog2(78 * (uint64_t)fan_in) / 2;
	if (kind == GEN_BF16)
		g->shift = (gen_ilog2(5461 * (uint64_t)fan_in) + 1) / 2;
}

/* Bytes per element of a kind. */
static inline size_t gen_elem_size(enum gen_kind k)
{
	return k == GEN_FP8 ? 1 : (k == GEN_SCALE || k == GEN_BIAS_F32) ? 4 : 2;
}

/* A triangular integer in [-15, 15] from 8 bits. */
static inline int gen_tri15(uint64_t r) { return (int)(r & 15) - (int)((r >> 4) & 15); }

/* Writes the next n elements of the stream to out (little-endian, the element size of the
 * kind). One 64-bit draw per element, so the bytes do not depend on how the caller chunks. */
static inline void gen_fill(struct gen *g, void *out, size_t n)
{
	uint8_t *o = out;
	for (size_t i = 0; i < n; i++) {
		uint64_t r = gen_next(g);
		uint32_t f;
		uint16_t h;
		switch (g->kind) {
		case GEN_FP8: {
			int k = (int)(r & 15);
			uint8_t code = f32_to_e4m3((float)k); /* exact: integers <= 16 */
			o[i] = k && (r & 16) ? (uint8_t)(code | 0x80) : code;
			break;
		}
		case GEN_SCALE:
			f = (uint32_t)(127 - g->shift - (int)(r & 1)) << 23; /* 2^-(e or e+1) */
			memcpy(o + 4 * i, &f, 4);
			break;
		case GEN_BF16: {
			int k = (int)(r & 127) + (int)((r >> 7) & 127) + (int)((r >> 14) & 127) +
				(int)((r >> 21) & 127) - 254;
			h = f32_to_bf16(ldexpf((float)k, -g->shift)); /* exact: |k| < 256 */
			memcpy(o + 2 * i, &h, 2);
			break;
		}
		case GEN_NORM:
			h = f32_to_bf16(1.0f + (float)gen_tri15(r) / 128.0f);
			memcpy(o + 2 * i, &h, 2);
			break;
		case GEN_BIAS_BF16:
			h = f32_to_bf16((float)gen_tri15(r) / 128.0f);
			memcpy(o + 2 * i, &h, 2);
			break;
		case GEN_BIAS_F32: {
			float v = (float)gen_tri15(r) / 256.0f;
			memcpy(o + 4 * i, &v, 4);
			break;
		}
		}
	}
}

#endif
