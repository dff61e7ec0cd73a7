/*
 * rope.c — YaRN frequency table and the two rotation layouts (see rope.h).
 *
 * The reference computes the frequencies in fp32 tensors with the correction range from
 * Python floats (double); the same split is kept here so angles agree bit for bit at long
 * positions (Appendix A note).
 */
#include "model/rope.h"

#include <math.h>

#include "model/cpu_mutation.h"
#include "model/numerics.h"

static double correction_dim(double rotations, double dim, double base, double max_len)
{
	return dim * log(max_len / (rotations * 2 * M_PI)) / (2 * log(base));
}

void rope_inv_freq(const struct dsv32_config *c, float *inv, int *low_out, int *high_out)
{
	int64_t dim = c->qk_rope_head_dim, half = dim / 2;
	double base = c->rope_theta;
	double orig = (double)c->rope_scaling.original_max_position_embeddings;
	int low = (int)floor(correction_dim(c->rope_scaling.beta_fast, (double)dim, base, orig));
	int high = (int)ceil(correction_dim(c->rope_scaling.beta_slow, (double)dim, base, orig));
	if (low < 0)
		low = 0;
	if (high > dim - 1)
		high = (int)dim - 1;
	float lo = (float)low, hi = (float)high;
	if (low == high)
		hi += 0.001f;
	float factor = (float)c->rope_scaling.factor;
	for (int64_t i = 0; i < half; i++) {
		float e = (float)(2 * i) / (float)dim;
		float f = 1.0f / powf((float)base, e);
		float ramp = ((float)i - lo) / (hi - lo);
		ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
		float smooth = cpu_mutated(CPU_MUTATION_NO_YARN) ? 1.0f : 1.0f - ramp;
		inv[i] = f / factor * (1.0f - smooth) + f * smooth;
	}
	if (low_out)
		*low_out = low;
	if (high_out)
		*high_out = high;
}

void rope_cos_sin(const float *inv, int64_t half, int64_t pos, float *cos_, float *sin_)
{
	for (int64_t i = 0; i < half; i++) {
		float angle = (float)pos * inv[i];
		cos_[i] = cosf(angle);
		sin_[i] = sinf(angle);
	}
}

void rope_apply_interleaved(float *x, const float *cos_, const float *sin_, int64_t half)
{
	for (int64_t i = 0; i < half; i++) {
		float a = x[2 * i], b = x[2 * i + 1];
		x[2 * i] = bf16_round(a * cos_[i] - b * sin_[i]);
		x[2 * i + 1] = bf16_round(a * sin_[i] + b * cos_[i]);
	}
}

void rope_apply_halfsplit(float *x, const float *cos_, const float *sin_, int64_t half)
{
	for (int64_t i = 0; i < half; i++) {
		float a = x[i], b = x[i + half];
		x[i] = bf16_round(a * cos_[i] - b * sin_[i]);
		x[i + half] = bf16_round(a * sin_[i] + b * cos_[i]);
	}
}
