/*
 * cuda_gemm_tune.c — the start-up measurement of the FP8 GEMM dispatch (see cuda_gemm_tune.h).
 *
 * Owns: collecting the model's dense GEMM shapes and their weights per layer, the operand rows
 * (scratch arena), the time bound and the log line. The timing and the choice are
 * cuda_gemm_tune_rotate's (model/cuda_gemm.c).
 */
#include "model/cuda_gemm_tune.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/clock.h"
#include "model/cuda_gemm.h"
#include "model/env_knob.h"

#define TUNE_MAX_SHAPES 16
#define TUNE_MIN_BYTES ((size_t)8 << 20) /* smaller matrices keep the defaults */
#define TUNE_MAX_S 5.0                   /* the start-up time bound (incl. loading cuBLASLt) */

struct tune_shape {
	int N, K, n;
	gpu_ptr *W, *S; /* [n_layers] */
};

static const int tune_ms[] = {1, 8, 16, 32, 64, 128, 2048};
#define TUNE_NM ((int)(sizeof tune_ms / sizeof *tune_ms))

/* Adds f (one layer's matrix) to its shape's list. */
static int add_mat(struct tune_shape *sh, int *n_sh, int n_layers, const struct fwd_fp8 *f)
{
	if (!f->w || !f->s || f->out < 16 || f->in < 128 || f->out % 16 || f->in % 128 ||
	    (size_t)f->out * f->in < TUNE_MIN_BYTES)
		return 0;
	int i = 0;
	while (i < *n_sh && !(sh[i].N == f->out && sh[i].K == f->in))
		i++;
	if (i == *n_sh) {
		if (*n_sh == TUNE_MAX_SHAPES)
			return 0;
		sh[i] = (struct tune_shape){f->out, f->in, 0, calloc((size_t)n_layers, sizeof(gpu_ptr)),
					    calloc((size_t)n_layers, sizeof(gpu_ptr))};
		if (!sh[i].W || !sh[i].S) {
			free(sh[i].W), free(sh[i].S);
			return -ENOMEM;
		}
		(*n_sh)++;
	}
	if (sh[i].n < n_layers)
		sh[i].W[sh[i].n] = f->w, sh[i].S[sh[i].n++] = f->s;
	return 0;
}

int cuda_gemm_tune_model(struct gpu *g, const struct fwd_model *m, int n_layers,
			 struct gpu_arena *scratch)
{
	if (env_int("DSV32_GEMM_TUNE", 1) == 0 || n_layers < 1)
		return 0;
	struct tune_shape sh[TUNE_MAX_SHAPES];
	int n_sh = 0, r = 0;
	for (int l = 0; l < n_layers && !r; l++) {
		const struct fwd_layer *L = &m->layers[l];
		const struct fwd_fp8 *mats[9] = {&L->q_b, &L->idx_q_b, &L->o};
		int n = 3;
		if (L->fused_qib) /* q_b and the indexer's q_b as one matrix (DSV32_CUDA_QB_FUSE) */
			mats[n++] = &L->qib;
		if (L->fused_qkv)
			mats[n++] = &L->qkv;
		else
			mats[n++] = &L->q_a, mats[n++] = &L->kv_a, mats[n++] = &L->idx_k;
		if (!L->is_moe)
			mats[n++] = &L->w13, mats[n++] = &L->w2;
		for (int i = 0; i < n && !r; i++)
			r = add_mat(sh, &n_sh, n_layers, mats[i]);
	}
	size_t mark = gpu_arena_mark(scratch);
	const int max_m = tune_ms[TUNE_NM - 1];
	int max_n = 0, max_k = 0;
	size_t ws_bytes = 256;
	for (int i = 0; i < n_sh; i++) {
		max_n = sh[i].N > max_n ? sh[i].N : max_n;
		max_k = sh[i].K > max_k ? sh[i].K : max_k;
		size_t b = cuda_gemm_fp8_workspace(g, max_m, sh[i].N, sh[i].K);
		ws_bytes = b > ws_bytes ? b : ws_bytes;
	}
	gpu_ptr x8 = 0, sx = 0, y = 0, ws = 0;
	if (!r && n_sh) {
		x8 = gpu_arena_push(scratch, (size_t)max_m * max_k);
		sx = gpu_arena_push(scratch, (size_t)max_m * (max_k / 128) * 4);
		y = gpu_arena_push(scratch, (size_t)max_m * max_n * 2);
		ws = gpu_arena_push(scratch, ws_bytes);
		if (!x8 || !sx || !y || !ws)
			r = -ENOMEM;
	}
	/* operands: every x code 1.0 (e4m3 0x38), every activation scale 0x3f3f3f3f (~0.75) */
	if (!r && n_sh &&
	    (cu_check(cu.cuMemsetD8Async(x8, 0x38, (size_t)max_m * max_k, g->stream),
		      "cuMemsetD8Async", __FILE__, __LINE__) ||
	     cu_check(cu.cuMemsetD8Async(sx, 0x3f, (size_t)max_m * (max_k / 128) * 4, g->stream),
		      "cuMemsetD8Async", __FILE__, __LINE__)))
		r = -EIO;
	const int was_invariant = cuda_gemm_batch_invariant(g);
	cuda_gemm_set_batch_invariant(g, 0); /* the fast mode's candidates */
	const double t0 = clock_mono_s();
	char log[2048];
	int len = 0, done = 0;
	for (int i = 0; i < n_sh && !r; i++) {
		len += snprintf(log + len, sizeof log - (size_t)len, " %dx%d", sh[i].N, sh[i].K);
		for (int j = 0; j < TUNE_NM && !r; j++) {
			if (clock_mono_s() - t0 > TUNE_MAX_S)
				break;
			int rj = cuda_gemm_tune_rotate(g, sh[i].W, sh[i].S, sh[i].n, tune_ms[j],
						       sh[i].N, sh[i].K, x8, sx, y, ws, ws_bytes, NULL);
			enum cuda_gemm_path p = cuda_gemm_path_for(g, tune_ms[j], sh[i].N, sh[i].K);
			if (len < (int)sizeof log - 16)
				len += snprintf(log + len, sizeof log - (size_t)len, "%c%s",
						j ? '/' : ' ', rj ? "?" : cuda_gemm_path_name(p));
			done += !rj;
			if (rj != -EIO) /* -EIO: no path ran this one (it keeps the default) */
				r = rj;
		}
	}
	cuda_gemm_set_batch_invariant(g, was_invariant);
	gpu_arena_release(scratch, mark);
	if (n_sh)
		fprintf(stderr,
			"<6>dsv32: GEMM dispatch measured at start-up: %d of %d shape x M-bucket "
			"pairs in %.0f ms (M %d/%d/%d/%d/%d/%d/%d; dec = exact decode kernel, wg = its "
			"wgmma consumers, sw / sw2 = the swapped kernel / its cluster form, gemv = the "
			"one-row kernel, lt = "
			"cuBLASLt, wgmma = the prefill kernel):%s%s\n",
			done, n_sh * TUNE_NM, (clock_mono_s() - t0) * 1e3, tune_ms[0], tune_ms[1],
			tune_ms[2], tune_ms[3], tune_ms[4], tune_ms[5], tune_ms[6], log,
			r ? " (stopped by an error: the rest keep the defaults)" : "");
	for (int i = 0; i < n_sh; i++)
		free(sh[i].W), free(sh[i].S);
	return r;
}

#endif
