/*
 * cpu_ops.c — norms, FP8/bf16 linears, SwiGLU, Hadamard and embedding for the CPU backend.
 * See cpu_ops.h for the rounding and ordering rules every op follows.
 */
#include "model/cpu_ops.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/cpu_mutation.h"
#include "model/err.h"
#include "model/numerics.h"

/* ---- tables and the one dot product ---------------------------------------------------- */

static float e4m3_lut[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static void e4m3_lut_init(void)
{
	for (int i = 0; i < 256; i++)
		e4m3_lut[i] = e4m3_to_f32((uint8_t)i);
}

const float *cpu_e4m3_table(void)
{
	pthread_once(&e4m3_once, e4m3_lut_init);
	return e4m3_lut;
}

/* Eight fp32 lanes held as two 4-wide vectors (native SSE/NEON width, so they stay in
 * registers); the vector extensions only make the lanes explicit: lane j does the same
 * sequential sum as the scalar definition in cpu_ops.h. */
typedef float v4f __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

/* Adds the tail k = n8 .. n-1 into lane k mod 8, then sums the lanes in the fixed tree. */
static float lanes_sum(const v4f *lo, const v4f *hi, const float *a, const float *b,
		       const uint16_t *bw, int64_t n8, int64_t n)
{
	float l[8];
	memcpy(l, lo, 16);
	memcpy(l + 4, hi, 16);
	for (int64_t k = n8; k < n; k++)
		l[k & 7] += a[k] * (b ? b[k] : bf16_to_f32(bw[k]));
	return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

float cpu_dot(const float *a, const float *b, int64_t n)
{
	v4f lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};
	int64_t k = 0;
	for (; k + 8 <= n; k += 8) {
		v4f a0, a1, b0, b1;
		memcpy(&a0, a + k, 16);
		memcpy(&a1, a + k + 4, 16);
		memcpy(&b0, b + k, 16);
		memcpy(&b1, b + k + 4, 16);
		lo += a0 * b0;
		hi += a1 * b1;
	}
	return lanes_sum(&lo, &hi, a, b, NULL, k, n);
}

/* bf16 -> fp32 of four weights: the 16 bits become the high half (exact). */
static v4f bf16x4(const uint16_t *w)
{
	v4u u = {(uint32_t)w[0] << 16, (uint32_t)w[1] << 16, (uint32_t)w[2] << 16,
		 (uint32_t)w[3] << 16};
	v4f f;
	memcpy(&f, &u, 16);
	return f;
}

float cpu_dot_bf16(const float *a, const uint16_t *w, int64_t n)
{
	v4f lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};
	int64_t k = 0;
	for (; k + 8 <= n; k += 8) {
		v4f a0, a1;
		memcpy(&a0, a + k, 16);
		memcpy(&a1, a + k + 4, 16);
		lo += a0 * bf16x4(w + k);
		hi += a1 * bf16x4(w + k + 4);
	}
	return lanes_sum(&lo, &hi, a, NULL, w, k, n);
}

/* ---- embedding and norms ----------------------------------------------------------------- */

void cpu_embed(const struct bf16_mat *E, const int32_t *tokens, int64_t T, float *h)
{
	for (int64_t t = 0; t < T; t++) {
		ASSERT(tokens[t] >= 0 && tokens[t] < E->rows);
		const uint16_t *row = E->w + (size_t)tokens[t] * (size_t)E->cols; /* [cols] */
		for (int64_t i = 0; i < E->cols; i++)
			h[t * E->cols + i] = bf16_to_f32(row[i]);
	}
}

void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
	float ss = cpu_dot(x, x, n);
	float inv = 1.0f / sqrtf(ss / (float)n + eps);
	for (int64_t i = 0; i < n; i++)
		out[i] = bf16_round(w[i] * (x[i] * inv));
}

void cpu_add_rmsnorm(float *out, const float *x, float *r, const float *w, int64_t n, float eps)
{
	float *s = malloc((size_t)n * sizeof *s); /* [n] fp32 sum, normalised unrounded */
	ASSERT(s);
	for (int64_t i = 0; i < n; i++)
		s[i] = x[i] + r[i];
	for (int64_t i = 0; i < n; i++)
		r[i] = bf16_round(s[i]);
	cpu_rmsnorm(out, s, w, n, eps);
	free(s);
}

void cpu_layernorm(float *out, const float *x, const float *w, const float *b, int64_t n,
		   float eps)
{
	float sum = 0;
	for (int64_t i = 0; i < n; i++)
		sum += x[i];
	float mean = sum / (float)n;
	float var = 0;
	for (int64_t i = 0; i < n; i++)
		var += (x[i] - mean) * (x[i] - mean);
	var /= (float)n;
	float inv = 1.0f / sqrtf(var + eps);
	for (int64_t i = 0; i < n; i++)
		out[i] = bf16_round((x[i] - mean) * inv * w[i] + b[i]);
}

float cpu_weight_scale(float scale_inv)
{
	/* weight_scale_inv is multiplied (spec §5.2, pitfall 4) */
	return cpu_mutated(CPU_MUTATION_DIVIDE_SCALE_INV) ? 1.0f / scale_inv : scale_inv;
}

/* Columns per thread below which a wake-up costs more than it saves (~64K multiply-adds). */
static int64_t min_cols(int64_t in, int64_t T) { return 1 + ((int64_t)1 << 16) / (in * T); }

/* ---- FP8 linear ------------------------------------------------------------------------ */

void cpu_act_quant(const float *x, int64_t n, uint8_t *q, float *s)
{
	for (int64_t k = 0, g = 0; k < n; k += CPU_QBLOCK, g++) {
		int64_t len = n - k < CPU_QBLOCK ? n - k : CPU_QBLOCK;
		s[g] = act_quant_group(x + k, (int)len, q + k);
	}
}

struct fp8_job {
	const struct fp8_linear *W;
	const float *xq;  /* [T, in] e4m3 values of the quantised rows (codes decoded) */
	const float *xs;  /* [T, nkb] activation scales */
	int64_t T;
	float *y;         /* [T, out] */
};

static void fp8_cols(void *a, int64_t o0, int64_t o1)
{
	struct fp8_job *j = a;
	const struct fp8_linear *W = j->W;
	const float *lut = cpu_e4m3_table();
	int64_t in = W->in, nkb = (in + CPU_QBLOCK - 1) / CPU_QBLOCK;
	float *wrow = malloc((size_t)in * sizeof *wrow); /* [in] decoded codes of one output row */
	float *ws = malloc((size_t)nkb * sizeof *ws);    /* [nkb] its block scales */
	ASSERT(wrow && ws);
	for (int64_t o = o0; o < o1; o++) {
		const uint8_t *w8 = W->w + (size_t)o * (size_t)in;
		for (int64_t k = 0; k < in; k++)
			wrow[k] = lut[w8[k]];
		for (int64_t kb = 0; kb < nkb; kb++)
			ws[kb] = cpu_weight_scale(W->scale[(o / CPU_QBLOCK) * nkb + kb]);
		for (int64_t t = 0; t < j->T; t++) {
			const float *xq = j->xq + t * in, *xs = j->xs + t * nkb;
			float y = 0;
			for (int64_t kb = 0; kb < nkb; kb++) {
				int64_t k = kb * CPU_QBLOCK;
				int64_t len = in - k < CPU_QBLOCK ? in - k : CPU_QBLOCK;
				float acc = cpu_dot(xq + k, wrow + k, len); /* one 128-block, promoted */
				y += acc * (xs[kb] * ws[kb]);
			}
			j->y[t * W->out + o] = bf16_round(y);
		}
	}
	free(wrow);
	free(ws);
}

void cpu_fp8_linear(struct cpu_pool *p, const struct fp8_linear *W, const float *x, int64_t T,
		    float *y)
{
	const float *lut = cpu_e4m3_table();
	int64_t in = W->in, nkb = (in + CPU_QBLOCK - 1) / CPU_QBLOCK;
	uint8_t *q = malloc((size_t)in);                       /* [in] codes of one row */
	float *xq = malloc((size_t)(T * in) * sizeof *xq);     /* [T, in] */
	float *xs = malloc((size_t)(T * nkb) * sizeof *xs);    /* [T, nkb] */
	ASSERT(q && xq && xs);
	for (int64_t t = 0; t < T; t++) {
		cpu_act_quant(x + t * in, in, q, xs + t * nkb);
		for (int64_t k = 0; k < in; k++)
			xq[t * in + k] = lut[q[k]];
	}
	struct fp8_job j = {W, xq, xs, T, y};
	cpu_pool_run(p, fp8_cols, &j, W->out, min_cols(in, T));
	free(q);
	free(xq);
	free(xs);
}

/* ---- bf16 linear ----------------------------------------------------------------------- */

struct bf16_job {
	const struct bf16_mat *W;
	const float *x; /* [T, cols] */
	int64_t T;
	float *y;       /* [T, rows] */
	int round_bf16;
};

static void bf16_cols(void *a, int64_t o0, int64_t o1)
{
	struct bf16_job *j = a;
	int64_t in = j->W->cols;
	for (int64_t o = o0; o < o1; o++) {
		const uint16_t *w = j->W->w + (size_t)o * (size_t)in; /* [in] */
		for (int64_t t = 0; t < j->T; t++) {
			float v = cpu_dot_bf16(j->x + t * in, w, in);
			j->y[t * j->W->rows + o] = j->round_bf16 ? bf16_round(v) : v;
		}
	}
}

void cpu_bf16_linear(struct cpu_pool *p, const struct bf16_mat *W, const float *x, int64_t T,
		     float *y, int round_bf16)
{
	struct bf16_job j = {W, x, T, y, round_bf16};
	cpu_pool_run(p, bf16_cols, &j, W->rows, min_cols(W->cols, T));
}

/* ---- SwiGLU and Hadamard --------------------------------------------------------------- */

void cpu_swiglu(float *out, const float *g, const float *u, int64_t n)
{
	if (cpu_mutated(CPU_MUTATION_SILU_ON_UP)) {
		const float *t = g;
		g = u, u = t;
	}
	for (int64_t i = 0; i < n; i++) {
		float silu = g[i] / (1.0f + expf(-g[i]));
		out[i] = bf16_round(silu * u[i]);
	}
}

void cpu_hadamard(float *x, int64_t n)
{
	ASSERT(n > 0 && (n & (n - 1)) == 0);
	/* In-place butterflies: after the pass of width h, x[i] holds sums over the bits below
	 * 2h, so the result is x . H with H[i][j] = (-1)^popcount(i & j) (Sylvester order). */
	for (int64_t h = 1; h < n; h *= 2)
		for (int64_t i = 0; i < n; i += 2 * h)
			for (int64_t k = i; k < i + h; k++) {
				float a = x[k], b = x[k + h];
				x[k] = a + b;
				x[k + h] = a - b;
			}
	float scale = (float)pow((double)n, -0.5); /* the Python float n**-0.5, used as fp32 */
	for (int64_t i = 0; i < n; i++)
		x[i] = bf16_round(x[i] * scale);
}
