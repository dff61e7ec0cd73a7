/*
 * cuda_fwd_ops.c — the row ops of the CUDA forward pass (model/cuda_fwd.h): RMSNorm (with the
 * residual add and act_quant fused), act_quant, the FP8 GEMM (cuda_gemm_fp8, in <= 64-row
 * pieces or whole by mode), the bf16 linears (by row count and mode: tensor cores, memory-bound
 * GEMV, the CPU's order), RoPE, Hadamard; the step's scratch (fwd_take) and the dumps.
 *
 * Must not: synchronise (the dumps excepted: they download and wait), allocate outside the
 * arena, decide the op order (cuda_fwd_attn.c, cuda_forward.c).
 */
#include "model/cuda_fwd.h"

#ifndef DSV32_NO_CUDA

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda_gemm.h"
#include "model/numerics.h"

int fwd_mma_rows(const struct fwd *F)
{
	if (F->E->sw->mma_rows > 0)
		return F->E->sw->mma_rows;
	return F->E->batch_invariant ? 1 << 30 : 8;
}

int fwd_fail(const char *what, int r)
{
	fprintf(stderr, "<3>dsv32: cuda forward: %s failed (%d)\n", what, r);
	return r ? r : -EIO;
}

/* 1: name is one of the comma-separated names in list */
static int listed(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; *p;) {
		size_t k = strcspn(p, ",");
		if (k == n && !strncmp(p, name, n))
			return 1;
		p += k + (p[k] == ',');
	}
	return 0;
}

int fwd_skipped(const struct fwd *F, const char *name)
{
	return listed(F->E->sw->skip, name);
}

/* Whether kernel name goes by programmatic dependent launch (where its launcher allows: pdl 1,
 * or 2 for every row count by default): by DSV32_CUDA_FWD_PDL, else only in steps of more than
 * FWD_PDL_ROWS rows (model/cuda_fwd.h) or for pdl 2. */
static int fwd_pdl(const struct fwd *F, const char *name, int pdl)
{
	const struct fwd_switches *sw = F->E->sw;
	return sw->pdl < 0 ? F->T > FWD_PDL_ROWS || pdl == 2
			   : sw->pdl == 2 ? listed(sw->pdl_list, name) : sw->pdl;
}

int fwd_launch(struct fwd *F, const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
	       unsigned smem, void **args, int n_args, int pdl)
{
	if (F->E->sw->skip[0] && fwd_skipped(F, name))
		return 0;
	int r = gpu_launch_as_n(F->g, pdl && fwd_pdl(F, name, pdl), gpu_kernel(F->g, name), gx, gy,
				gz, bx, 1, 1, smem, args, n_args);
	if (r)
		return fwd_fail(name, r);
	fwd_prof_mark(F->g->stream, F->tag ? F->tag : name);
	return 0;
}

/* Arena scratch; 0 when the arena is exhausted (sized at start: a bug, reported). */
gpu_ptr fwd_take(struct fwd *F, size_t bytes)
{
	gpu_ptr p = gpu_arena_push(F->A, bytes ? bytes : 1);
	if (!p)
		fprintf(stderr, "<3>dsv32: cuda forward: scratch arena exhausted (%zu MiB asked, "
				"%zu MiB in use of %zu)\n", bytes >> 20, F->A->top >> 20,
			F->A->region.reserved >> 20);
	return p;
}

/* ---- dumps (tests and tools: synchronous) ---------------------------------------------------- */

/* Rows t0 .. t0+n-1 of a device matrix (row stride ld elements): width values per row (or, for
 * DUMP_I32, up to width entries before the first -1; width < 0: pos + 1 values). */
int fwd_dump_rows(struct fwd *F, const char *name, int64_t layer, gpu_ptr p, enum dump_kind k,
		     int64_t ld, int64_t width, int t0, int n)
{
	const struct backend_dump *d = F->st->dump;
	if (!d)
		return 0;
	size_t esz = k == DUMP_BF16 ? 2 : 4, bytes = (size_t)n * (size_t)ld * esz;
	void *raw = malloc(bytes ? bytes : 1);
	float *row = malloc((size_t)(ld > 0 ? ld : 1) * sizeof *row);
	if (!raw || !row) {
		free(raw), free(row);
		return -ENOMEM;
	}
	int r = gpu_download(F->g, raw, p, bytes);
	for (int i = 0; i < n && !r; i++) {
		int t = t0 + i;
		int64_t w = width < 0 ? F->pos_h[t] + 1 : width;
		if (k == DUMP_I32) {
			const int32_t *v = (const int32_t *)raw + (size_t)i * ld;
			int64_t cnt = 0;
			while (cnt < w && v[cnt] >= 0)
				cnt++;
			d->fn(d->ctx, name, layer, F->seq_h[t], F->pos_h[t], 1, v, cnt);
			continue;
		}
		for (int64_t j = 0; j < w; j++)
			row[j] = k == DUMP_BF16 ? bf16_to_f32(((const uint16_t *)raw)[(size_t)i * ld + j])
						: ((const float *)raw)[(size_t)i * ld + j];
		d->fn(d->ctx, name, layer, F->seq_h[t], F->pos_h[t], 0, row, w);
	}
	free(raw);
	free(row);
	return r;
}

int fwd_dump_all(struct fwd *F, const char *name, int64_t layer, gpu_ptr p, enum dump_kind k,
		    int64_t ld, int64_t width)
{
	return fwd_dump_rows(F, name, layer, p, k, ld, width, 0, F->T);
}

/* ---- ops ------------------------------------------------------------------------------------- */

/* out[t] (stride ldo) = RMSNorm(x[t] (stride ldx) [+ res[t]]), res[t] = bf16(sum) when res;
 * with q: also act_quant of out (codes q, scales qs; ldo == dim). */
int fwd_rmsq(struct fwd *F, gpu_ptr x, int ldx, gpu_ptr res, gpu_ptr w, gpu_ptr out, int ldo,
		   int dim, gpu_ptr q, gpu_ptr qs)
{
	float eps = (float)F->c->rms_norm_eps;
	if (dim > 2048) /* the hidden-size norms: a wider block per row (fewer serial loads) */
		LAUNCH_PDL("k_fwd_rmsnorm_1k", F->T, 1, 1024, 0, &x, &ldx, &res, &w, &out, &ldo, &dim, &eps, &q,
		       &qs);
	else
		LAUNCH_PDL("k_fwd_rmsnorm", F->T, 1, 256, 0, &x, &ldx, &res, &w, &out, &ldo, &dim, &eps, &q, &qs);
	return 0;
}

int fwd_rms(struct fwd *F, gpu_ptr x, int ldx, gpu_ptr res, gpu_ptr w, gpu_ptr out, int ldo,
		  int dim)
{
	return fwd_rmsq(F, x, ldx, res, w, out, ldo, dim, 0, 0);
}

/* The fused per-row chains (kernels_ptx/fwd_fused.cu); DSV32_CUDA_UNFUSED=1 runs the separate
 * kernels instead (the same bits; for diagnosis). */
int fwd_fused(const struct fwd *F)
{
	return !F->E->sw->unfused;
}

/* act_quant (spec §5.3) of rows [rows, K] -> codes [rows, K], scales [rows, K/128]. */
int fwd_quant(struct fwd *F, gpu_ptr x, gpu_ptr q, gpu_ptr s, int rows, int K)
{
	long long ng = (long long)rows * K / 128;
	LAUNCH("k_act_quant", (ng + 7) / 8, 1, 256, 0, &x, &q, &s, &ng);
	return 0;
}

/* y[M, ldy] (bf16) = x8 x W^T (spec §5.4) through cuda_gemm_fp8. In the fast mode M > 64 goes
 * to the prefill path on Mp = fwd_round8(M) rows (buffers have them); otherwise, and where the
 * prefill path cannot take the shape (cuBLASLt needs K/128 % 4 == 0), in 64-row pieces through
 * the decode kernel. */
int fwd_gemm(struct fwd *F, const struct fwd_fp8 *W, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int M,
		   int ldy)
{
	int N = W->out, K = W->in;
	size_t mark = gpu_arena_mark(F->A);
	int r = -ENOTSUP;
	char what[40];
	snprintf(what, sizeof what, "gemm %dx%d", N, K);
	if (M > 64 && LARGE_M(F) &&
	    !(cuda_gemm_path_for(F->g, M, N, K) == CUDA_GEMM_PATH_CUBLASLT && (K / 128) % 4)) {
		int Mp = fwd_round8(M);
		size_t wsb = cuda_gemm_fp8_workspace(F->g, Mp, N, K);
		TAKE(ws, wsb);
		r = cuda_gemm_fp8(F->g, W->w, W->s, x8, sx, y, Mp, N, K, ldy, ws, wsb);
		gpu_arena_release(F->A, mark);
		if (r != -ENOTSUP && r != -EINVAL) { /* else a shape the prefill path refuses: pieces */
			fwd_prof_mark(F->g->stream, what);
			return r ? fwd_fail("cuda_gemm_fp8", r) : 0;
		}
	}
	int piece = M < 64 ? M : 64;
	size_t wsb = cuda_gemm_fp8_workspace(F->g, piece, N, K);
	TAKE(ws, wsb);
	r = 0;
	for (int m0 = 0; m0 < M; m0 += 64) {
		int mm = M - m0 < 64 ? M - m0 : 64;
		r = cuda_gemm_fp8(F->g, W->w, W->s, x8 + (size_t)m0 * K, sx + (size_t)m0 * (K / 128) * 4,
				  y + (size_t)m0 * ldy * 2, mm, N, K, ldy, ws, wsb);
		if (r)
			break;
	}
	gpu_arena_release(F->A, mark);
	fwd_prof_mark(F->g->stream, what);
	return r ? fwd_fail("cuda_gemm_fp8", r) : 0;
}

/* k_fwd_head_mma<WM> (kernels_ptx/lm_head.cu), by log2 of warps along M */
const char *const fwd_head_mma_names[3] = {"k_fwd_head_mma1", "k_fwd_head_mma2", "k_fwd_head_mma4"};

/* y[M, V] = x[M, D] (stride ldx) . W[V, D]^T, bf16 weights, fp32 (y32) or bf16 (y16) out: the
 * tensor cores above MMA_ROWS rows; 1-4 rows at memory speed (batch-invariant mode: in the CPU's
 * order, k_fwd_lin_*; fast mode: k_fwd_gemv*, another fixed order); else the CUDA cores in the
 * CPU's order (k_fwd_bf16_linear). */
int fwd_lin(struct fwd *F, gpu_ptr W, gpu_ptr x, int ldx, gpu_ptr y32, gpu_ptr y16, int ldy,
		  int M, int D, int V)
{
	if (!F->E->batch_invariant && M > 4 && M <= 128 && V >= 1024 && D % 64 == 0 && ldx % 8 == 0) {
		/* the LM head (and eh_proj) of a decode batch: W streamed once, rows on the tensor
		 * cores (k_fwd_mma re-read W per 64 rows without a load pipeline) */
		int v = M <= 32 ? 0 : M <= 64 ? 1 : 2;
		LAUNCH(fwd_head_mma_names[v], (V + 127) / 128, 1, 256, fwd_head_mma_smem(1 << v), &W, &x, &ldx,
		       &y32, &y16, &ldy, &M, &D, &V);
		return 0;
	}
	if (M > MMA_ROWS && V < 1024 && D % 256 == 0 && D / 256 >= 4) {
		/* few outputs (weights_proj: 64): the tensor cores on S = D / 256 K slices as batches
		 * (64 x 64 tiles had one or two blocks in all), partials summed in slice order */
		int mode = 2, out32 = 1, b_row0 = 0, S = D / 256 < 32 ? D / 256 : 32, Kc = D / S;
		int b_hs = Kc, MV = M * V;
		gpu_ptr none = 0; /* no block scales (bf16 weights) */
		long long a_hs = Kc, c_hs = (long long)M * V;
		size_t mark = gpu_arena_mark(F->A);
		TAKE(ws, (size_t)S * M * V * 4);
		LAUNCH3("k_fwd_mma", (V + 63) / 64, (M + 63) / 64, S, 128, &mode, &x, &a_hs, &ldx, &W, &none,
			&b_row0, &b_hs, &D, &ws, &c_hs, &V, &out32, &M, &V, &Kc);
		LAUNCH("k_fwd_ks_reduce", (MV + 255) / 256, 1, 256, 0, &ws, &S, &M, &V, &y32, &y16, &ldy);
		gpu_arena_release(F->A, mark);
		return 0;
	}
	if (M > MMA_ROWS) { /* tensor cores (fp32 sums in another order) */
		int mode = 2, out32 = y32 != 0, b_row0 = 0, b_hs = 0;
		long long a_hs = 0, c_hs = 0;
		gpu_ptr Cp = y32 ? y32 : y16, S = 0;
		LAUNCH3("k_fwd_mma", (V + 63) / 64, (M + 63) / 64, 1, 128, &mode, &x, &a_hs, &ldx, &W, &S,
			&b_row0, &b_hs, &D, &Cp, &c_hs, &ldy, &out32, &M, &V, &D);
		return 0;
	}
	if (M <= 4 && D % 64 == 0 && ldx % 8 == 0 && M * D * 2 <= LIN_STREAM_SMEM && F->E->batch_invariant) {
		/* decode, CPU order at memory speed */
		if (V < 256) /* few outputs (weights_proj): a block per output */
			LAUNCH("k_fwd_lin_row", V, 1, 256, D * 2, &W, &x, &ldx, &y32, &y16, &ldy, &M, &D, &V);
		else
			LAUNCH("k_fwd_lin_stream", (V + 31) / 32, 1, 256, M * D * 2, &W, &x, &ldx, &y32, &y16,
			       &ldy, &M, &D, &V);
		return 0;
	}
	if (M <= 4 && ldx % 8 == 0 && !F->E->batch_invariant) {
		/* decode, fast mode: memory-bound GEMV (run 4: the exact-order kernels streamed the LM
		 * head at 2.4 TB/s, weights_proj in 160 us) */
		if (V < 8 * F->g->sm_count) /* few outputs (weights_proj): K over a block's 8 warps */
			LAUNCH("k_fwd_gemv_ks", V, 1, 256, 0, &W, &x, &ldx, &y32, &y16, &ldy, &M, &D, &V);
		else
			LAUNCH_PDL("k_fwd_gemv", (V + 7) / 8, 1, 256, 0, &W, &x, &ldx, &y32, &y16, &ldy, &M, &D,
			       &V);
		return 0;
	}
	LAUNCH("k_fwd_bf16_linear", (V + 31) / 32, (M + 3) / 4, 256, 0, &W, &x, &ldx, &y32, &y16, &ldy,
	       &M, &D, &V);
	return 0;
}

/* RoPE in place at the rows' positions: heads per row, interleaved (MLA) or half-split. */
int fwd_rope(struct fwd *F, gpu_ptr x, int heads, long long ld_token, int ld_head, int off,
		   int interleaved)
{
	int T = F->T;
	long long rows = (long long)T * heads;
	gpu_ptr cs = F->m->rope_cs;
	LAUNCH("k_rope", (rows + 7) / 8, 1, 256, 0, &x, &F->pos, &cs, &T, &heads, &ld_token, &ld_head,
	       &off, &interleaved);
	return 0;
}

int fwd_hadamard(struct fwd *F, gpu_ptr x, int rows)
{
	int ld = 128;
	float sc = (float)pow(128.0, -0.5);
	LAUNCH("k_hadamard128", (rows + 7) / 8, 1, 256, 0, &x, &ld, &x, &ld, &rows, &sc);
	return 0;
}

#endif
