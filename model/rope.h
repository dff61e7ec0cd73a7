/*
 * rope.h — YaRN rotary embeddings of DeepSeek-V3.2 (spec §3.4, Appendix A).
 *
 * Owns: the inverse-frequency table (fp32, computed like the reference's
 * precompute_freqs_cis, YaRN always on), the per-position cos/sin, and the two rotation
 * layouts: interleaved pairs (x[2i], x[2i+1]) for MLA and half-split pairs (x[i], x[i+d/2])
 * for the lightning indexer. Must not: know where the rope slice sits in a head (callers pass
 * the slice).
 */
#ifndef DSV32_ROPE_H
#define DSV32_ROPE_H

#include <stdint.h>

#include "model/config.h"

/* inv: [qk_rope_head_dim / 2]. Returns the correction range (low, high) through the
 * pointers if non-NULL (low = 10, high = 23 for the real config). */
void rope_inv_freq(const struct dsv32_config *c, float *inv, int *low, int *high);

/* cos/sin of the angle pos * inv[i] (fp32 product). cos, sin: [half] */
void rope_cos_sin(const float *inv, int64_t half, int64_t pos, float *cos_, float *sin_);

/* Rotations, fp32 math, bf16 out, in place. x: [2 * half] */
void rope_apply_interleaved(float *x, const float *cos_, const float *sin_, int64_t half);
void rope_apply_halfsplit(float *x, const float *cos_, const float *sin_, int64_t half);

#endif
