/*
 * gemm_fp8_limit.h — the error limit of FP8 GEMMs that run on Hopper's warpgroup MMA (our
 * k_gemm_fp8_wgmma, cuBLASLt's block-scaled GEMM) against the CPU's cpu_fp8_linear. Tests only.
 *
 * The hardware: wgmma e4m3 does not add a k32 step's products exactly. Run 1 on the H200
 * matched, to within 15% in the count of bad outputs on two shapes, this model: each k32 step
 * adds its 32 products to the accumulator after aligning all 33 addends to the largest one's
 * exponent and truncating each toward zero to 14 bits below it (DeepSeek-V3 §3.3.2: "limited to
 * retaining around 14 bits"); which is why the kernels promote to fp32 after every 128-wide K
 * block (spec §5.4). mma.sync e4m3 (the decode kernels) shows no such loss.
 *
 * The limit per output (m, n): the error scales with the magnitudes being added, not with the
 * result, so it is bounded by
 *   A[m, n] = Σ_kb |sx[m, kb] · S[n/128, kb]| · Σ_{k in kb} |x8[m, k] · w8[n, k]|
 * times a constant. Per step the 33 truncations each lose less than 2^-13 of the largest
 * addend, so 4 steps lose less than 4 · 33 · 2^-13 ≈ 2^-6 of A (a strict bound). The losses are
 * independent and uniform, so they stay far below that: the model's worst over 10^5 outputs of
 * full-range random operands is 2^-11 of A. The limit is 2^-9 of A (4x that); a layout or
 * scale bug is off by ~2^-3.5 of A or more, so it still fails by a wide margin. An output
 * within 1 bf16 ulp of the CPU's always passes. With realistic operands (wgmma_fill_real) the
 * error relative to the row RMS is also bounded (the model: 7e-4 of the RMS at worst): callers
 * pass rms_limit 2^-8 there.
 */
#ifndef DSV32_GEMM_FP8_LIMIT_H
#define DSV32_GEMM_FP8_LIMIT_H

#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include <stdio.h>

#include "model/cpu_ops.h"
#include "model/cpu_pool.h"

#define GEMM_FP8_HW_LIMIT (1.0 / 512) /* of A, see above */

struct gemm_absum_job {
	const uint8_t *W; /* [N, K] e4m3 */
	const float *S;   /* [ceil(N/128), K/128] */
	const uint8_t *xq;/* [n, K] e4m3 rows */
	const float *sx;  /* [n, K/128] */
	int n, N, K;
	double *A;        /* [n, N] */
};

static inline void gemm_absum_cols(void *arg, int64_t o0, int64_t o1)
{
	struct gemm_absum_job *j = arg;
	const float *lut = cpu_e4m3_table();
	int KB = j->K / 128;
	for (int64_t o = o0; o < o1; o++) {
		const uint8_t *w = j->W + (size_t)o * j->K;
		for (int i = 0; i < j->n; i++) {
			const uint8_t *x = j->xq + (size_t)i * j->K;
			double a = 0;
			for (int kb = 0; kb < KB; kb++) {
				double s = 0;
				for (int k = kb * 128; k < kb * 128 + 128; k++)
					s += fabs((double)lut[x[k]] * lut[w[k]]);
				a += s * fabs((double)j->sx[(size_t)i * KB + kb] *
					      j->S[(o / 128) * KB + kb]);
			}
			j->A[(size_t)i * j->N + o] = a;
		}
	}
}

/* A (above) for n rows of quantised activations against W. */
static inline void gemm_fp8_absum(struct cpu_pool *pool, const uint8_t *W, const float *S, int N,
				  int K, const uint8_t *xq, const float *sx, int n, double *A)
{
	struct gemm_absum_job j = {W, S, xq, sx, n, N, K, A};
	cpu_pool_run(pool, gemm_absum_cols, &j, N, 16);
}

/* got [rows, N] (bf16) against the CPU's ref [rows, N] with the bound A: bad when more than one
 * bf16 ulp away AND more than GEMM_FP8_HW_LIMIT · A away (or, with rms_limit > 0, more than
 * rms_limit of the row's RMS away). Prints the worst ulp, the worst |err| / rms(row) and
 * |err| / A over the outputs more than 1 ulp off, the count, and the first bad output (row ids
 * from row_id, may be NULL). Returns the number of bad outputs. */
static inline int64_t gemm_fp8_count_bad_hw(const float *ref, const uint16_t *got, const double *A,
					    int rows, int N, double rms_limit, const int *row_id,
					    const char *what)
{
	int64_t bad = 0;
	int worst_ulp = 0, first = 1;
	double worst_rms = 0, worst_a = 0;
	for (int m = 0; m < rows; m++) {
		double rms = gpu_row_rms(ref + (size_t)m * N, N);
		for (int n = 0; n < N; n++) {
			size_t i = (size_t)m * N + n;
			int u = bf16_ulps(f32_to_bf16(ref[i]), got[i]);
			worst_ulp = u > worst_ulp ? u : worst_ulp;
			if (u <= 1)
				continue;
			double err = fabs((double)bf16_to_f32(got[i]) - ref[i]);
			double er = err / (rms > 0 ? rms : 1), ea = err / (A[i] > 0 ? A[i] : 1e-300);
			worst_rms = er > worst_rms || isnan(er) ? er : worst_rms;
			worst_a = ea > worst_a || isnan(ea) ? ea : worst_a;
			int b = !(err <= GEMM_FP8_HW_LIMIT * A[i]) || (rms_limit > 0 && !(er <= rms_limit));
			if (b && first) {
				printf("    first bad: row %d col %d: got %g want %g, |err|/rms %.3g, "
				       "|err|/A %.3g\n",
				       row_id ? row_id[m] : m, n, bf16_to_f32(got[i]), ref[i], er, ea);
				first = 0;
			}
			bad += b;
		}
	}
	printf("    %s: worst %d bf16 ulp; beyond 1 ulp: worst |err|/rms(row) %.2g, |err|/A %.2g "
	       "(2^%.1f, limit 2^%.0f); %lld bad\n",
	       what, worst_ulp, worst_rms, worst_a, worst_a > 0 ? log2(worst_a) : -99.0,
	       log2(GEMM_FP8_HW_LIMIT), (long long)bad);
	return bad;
}

#endif
#endif
