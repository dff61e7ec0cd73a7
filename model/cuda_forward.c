/*
 * cuda_forward.c — the forward pass on the GPU (see cuda_forward.h): the CPU backend's
 * layer_forward (model/cpu_backend.c) op for op, one kernel launch per step, all on the
 * engine stream.
 *
 * Reads like the CPU version: the step's rows and metadata, the ops (norm, act_quant, FP8 GEMM,
 * bf16 linear, RoPE, Hadamard), one decoder layer (§3.2-§3.9), the MoE block, the MTP input
 * (§4), the step (embedding, layers, final norm, head §3.10). Activations are bf16 on the
 * device, rounded where the CPU rounds; the per-row state of the CPU (the causal key count
 * pos + 1, the row's block table, its physical slot) is uploaded once per step.
 *
 * Buffers have Tp = round_up(T, 8) rows, so a GEMM may run on the padded row count (cuBLASLt
 * refuses M that is not a multiple of 8); rows T .. Tp-1 hold garbage that no real row reads.
 * Synchronisation: none inside the layer loop; the final downloads (logits, hidden rows) wait.
 * Dumps (st->dump) download after each named op and wait: they are for tests and tools.
 *
 * Two modes (fwd_env.batch_invariant, backend_cuda_opts):
 *   fast (the default): GEMMs of M > 64 rows through cuda_gemm_fp8's prefill paths (wgmma /
 *     cuBLASLt), the GEMM dispatch's fast mode below (cuda_gemm_set_batch_invariant: cuBLASLt
 *     where it measured faster), the MoE block on all the step's rows at once (CUDA_MOE_FAST:
 *     the wgmma grouped GEMMs); bf16 products
 *     on the tensor cores above 8 rows (fwd_mma.cu), the memory-bound GEMV for 1-4 rows, the
 *     CUDA cores in the CPU's order for 5-8. Where it departs from the CPU: the large-M GEMMs'
 *     fp32 accumulation (~2^-12 relative) flips FP8 re-quantisations downstream (run 7:
 *     teacher-forced layer outputs median 3.6e-2 from the CPU, experts differ on 4 of 600
 *     (layer, row); end-to-end logits within issue 12's limits), and a row's numbers depend
 *     on the row count of its step.
 *   batch-invariant: GEMMs and the MoE block in pieces of <= 64 rows through the decode
 *     kernels (one kernel per shape for every M: a row's result does not depend on M), every
 *     bf16 product on the CUDA cores in the CPU's order (bit-identical to the CPU backend's),
 *     the selection width always index_topk, the sparse attention with a decode row's key
 *     splits for every row count; the like-with-like tests run in this mode.
 * A step larger than the scratch arena holds runs in passes (cuda_forward_step); decode-sized
 * steps (<= 64 rows, no dumps, no hidden rows, not MTP) replay captured CUDA graphs. Switches
 * for diagnosis: DSV32_CUDA_GRAPHS=0, DSV32_CUDA_UNFUSED=1, DSV32_CUDA_MLA_FP32=1,
 * DSV32_CUDA_PROFILE=1, DSV32_CUDA_MOE_DENSE=1, DSV32_CUDA_MMA_ROWS=N.
 */
#include "model/cuda_forward.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda_attn.h"
#include "model/cuda_gemm.h"
#include "model/kv_cache.h"
#include "model/numerics.h"


#define SCORES_BUDGET ((size_t)256 << 20) /* bytes of indexer scores per row chunk */

/* Rows above which the bf16 products (q absorption, W_UV, bf16 linears) run on the tensor cores
 * (kernels_ptx/fwd_mma.cu, fp32 sums in the MMA's order) instead of the CUDA-core kernels in
 * the CPU's exact order (latency-optimal for a few rows, compute-bound for many): 8 in the fast
 * mode, never in the batch-invariant one. DSV32_CUDA_MMA_ROWS overrides both (tests). */
#define MMA_ROWS mma_rows(F)

struct fwd;
static int mma_rows(const struct fwd *F);

/* 1: M > 64 rows may go to the large-M GEMM and MoE paths whole (the fast mode). */
#define LARGE_M(F) (!(F)->E->batch_invariant)

/* ---- profile (DSV32_CUDA_PROFILE=1, eager steps only): GPU time between consecutive ops ---- */

#define PROF_EVENTS 4096
#define PROF_NAMES 128

static struct {
	int on, n_ev;
	CUevent ev[PROF_EVENTS];
	char ev_name[PROF_EVENTS][40];
	struct {
		char name[40];
		double ms;
		long n;
	} t[PROF_NAMES];
	int n_t;
	long steps;
} prof;

static void prof_mark(void *stream, const char *name)
{
	if (!prof.on || prof.n_ev >= PROF_EVENTS)
		return;
	if (!prof.ev[prof.n_ev])
		cu.cuEventCreate(&prof.ev[prof.n_ev], 0);
	snprintf(prof.ev_name[prof.n_ev], sizeof prof.ev_name[0], "%s", name);
	cu.cuEventRecord(prof.ev[prof.n_ev++], stream);
}

/* Waits for the step, adds each op's time to its name's total. */
static void prof_step_end(void)
{
	if (!prof.on || prof.n_ev < 2)
		return;
	cu.cuEventSynchronize(prof.ev[prof.n_ev - 1]);
	for (int i = 1; i < prof.n_ev; i++) {
		float ms = 0;
		cu.cuEventElapsedTime(&ms, prof.ev[i - 1], prof.ev[i]);
		int k = 0;
		while (k < prof.n_t && strcmp(prof.t[k].name, prof.ev_name[i]))
			k++;
		if (k == prof.n_t && prof.n_t < PROF_NAMES)
			snprintf(prof.t[prof.n_t++].name, sizeof prof.t[0].name, "%s", prof.ev_name[i]);
		if (k < prof.n_t)
			prof.t[k].ms += ms, prof.t[k].n++;
	}
	prof.steps++;
	prof.n_ev = 0;
}

void cuda_forward_profile_print(void)
{
	if (!prof.steps)
		return;
	double total = 0;
	for (int k = 0; k < prof.n_t; k++)
		total += prof.t[k].ms;
	fprintf(stderr, "cuda forward profile: %ld steps, %.3f ms GPU per step (time between "
			"consecutive ops, launch gaps included)\n", prof.steps, total / prof.steps);
	for (int done = 0; done < prof.n_t; done++) { /* by total time, largest first */
		int best = -1;
		for (int k = 0; k < prof.n_t; k++)
			if (prof.t[k].n >= 0 && (best < 0 || prof.t[k].ms > prof.t[best].ms))
				best = k;
		fprintf(stderr, "  %-36s %9.1f us/step %6ld calls/step %9.2f us/call %5.1f%%\n",
			prof.t[best].name, prof.t[best].ms * 1e3 / prof.steps,
			prof.t[best].n / prof.steps, prof.t[best].ms * 1e3 / prof.t[best].n,
			100.0 * prof.t[best].ms / total);
		prof.t[best].n = -1;
	}
	memset(prof.t, 0, sizeof prof.t);
	prof.n_t = 0, prof.steps = 0;
}

/* ---- the step's rows ------------------------------------------------------------------------ */

struct fwd {
	const struct fwd_env *E;
	struct gpu *g;
	struct gpu_arena *A;
	const struct dsv32_config *c;
	const struct fwd_model *m;
	const struct backend_step *st;
	int T, Tp;                 /* rows, rows rounded up to 8 */
	int64_t *pos_h, *seq_h;    /* [T] host copies for dumps */
	int mb;                    /* block-table columns per row: max(pos) / 64 + 1 */
	int max_n;                 /* max(pos) + 1: the longest causal key list */
	int n_logits, n_hidden;
	/* device metadata, int32 */
	gpu_ptr tok, pos, slot, nkeys; /* [T] */
	gpu_ptr bt;                /* [T, mb] the row's sequence's block table */
	gpu_ptr lrows, hrows;      /* [n_logits], [n_hidden] row indices */
	gpu_ptr up[2];             /* bf16 [T, D] host inputs: MTP h_i, or teacher forcing x, r */
	int ksel;                  /* selected keys per row: min(index_topk, pow2 >= max_n) */
	const char *tag;           /* the profile's name for the next launches (NULL: the kernel's) */
	size_t meta_bytes, o_pos, o_slot, o_nk, o_bt, o_lr, o_hr, o_up, up_bytes; /* pinned layout */
};

static int mma_rows(const struct fwd *F)
{
	const char *v = getenv("DSV32_CUDA_MMA_ROWS");
	if (v && atoi(v) > 0)
		return atoi(v);
	return F->E->batch_invariant ? 1 << 30 : 8;
}

static int fwd_fail(const char *what, int r)
{
	fprintf(stderr, "<3>dsv32: cuda forward: %s failed (%d)\n", what, r);
	return r ? r : -EIO;
}

/* Arena scratch; 0 when the arena is exhausted (sized at start: a bug, reported). */
static gpu_ptr take(struct fwd *F, size_t bytes)
{
	gpu_ptr p = gpu_arena_push(F->A, bytes ? bytes : 1);
	if (!p)
		fprintf(stderr, "<3>dsv32: cuda forward: scratch arena exhausted (%zu MiB asked, "
				"%zu MiB in use of %zu)\n", bytes >> 20, F->A->top >> 20,
			F->A->region.reserved >> 20);
	return p;
}

#define TAKE(var, bytes)                          \
	gpu_ptr var = take(F, (size_t)(bytes));   \
	if (!var)                                 \
		return -ENOMEM

#define LAUNCH(name, gx, gy, bx, smem, ...)                                                      \
	do {                                                                                     \
		void *a_[] = {__VA_ARGS__};                                                      \
		int r_ = gpu_launch(F->g, gpu_kernel(F->g, name), (unsigned)(gx), (unsigned)(gy), \
				    1, (unsigned)(bx), 1, 1, (unsigned)(smem), a_);              \
		if (r_)                                                                          \
			return fwd_fail(name, r_);                                               \
		prof_mark(F->g->stream, F->tag ? F->tag : name);                                \
	} while (0)

/* A launch with a z grid dimension, no dynamic shared memory. */
#define LAUNCH3(name, gx, gy, gz, bx, ...)                                                       \
	do {                                                                                     \
		void *a_[] = {__VA_ARGS__};                                                      \
		int r_ = gpu_launch(F->g, gpu_kernel(F->g, name), (unsigned)(gx), (unsigned)(gy), \
				    (unsigned)(gz), (unsigned)(bx), 1, 1, 0, a_);                \
		if (r_)                                                                          \
			return fwd_fail(name, r_);                                               \
		prof_mark(F->g->stream, F->tag ? F->tag : name);                                \
	} while (0)

#define TRY(call)                  \
	do {                       \
		int r_ = (call);   \
		if (r_)            \
			return r_; \
	} while (0)

/* TRY with the launches of call named tag in the profile (ops sharing a kernel apart). */
#define TRY_TAG(name_, call)               \
	do {                               \
		F->tag = (name_);          \
		int r_ = (call);           \
		F->tag = NULL;             \
		if (r_)                    \
			return r_;         \
	} while (0)

static int round8(int x) { return (x + 7) / 8 * 8; }

/* ---- dumps (tests and tools: synchronous) ---------------------------------------------------- */

enum dump_kind { DUMP_BF16, DUMP_F32, DUMP_I32 };

/* Rows t0 .. t0+n-1 of a device matrix (row stride ld elements): width values per row (or, for
 * DUMP_I32, up to width entries before the first -1; width < 0: pos + 1 values). */
static int dump_rows(struct fwd *F, const char *name, int64_t layer, gpu_ptr p, enum dump_kind k,
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

static int dump_all(struct fwd *F, const char *name, int64_t layer, gpu_ptr p, enum dump_kind k,
		    int64_t ld, int64_t width)
{
	return dump_rows(F, name, layer, p, k, ld, width, 0, F->T);
}

/* ---- ops ------------------------------------------------------------------------------------- */

/* out[t] (stride ldo) = RMSNorm(x[t] (stride ldx) [+ res[t]]), res[t] = bf16(sum) when res;
 * with q: also act_quant of out (codes q, scales qs; ldo == dim). */
static int op_rmsq(struct fwd *F, gpu_ptr x, int ldx, gpu_ptr res, gpu_ptr w, gpu_ptr out, int ldo,
		   int dim, gpu_ptr q, gpu_ptr qs)
{
	float eps = (float)F->c->rms_norm_eps;
	if (dim > 2048) /* the hidden-size norms: a wider block per row (fewer serial loads) */
		LAUNCH("k_fwd_rmsnorm_1k", F->T, 1, 1024, 0, &x, &ldx, &res, &w, &out, &ldo, &dim, &eps, &q,
		       &qs);
	else
		LAUNCH("k_fwd_rmsnorm", F->T, 1, 256, 0, &x, &ldx, &res, &w, &out, &ldo, &dim, &eps, &q, &qs);
	return 0;
}

static int op_rms(struct fwd *F, gpu_ptr x, int ldx, gpu_ptr res, gpu_ptr w, gpu_ptr out, int ldo,
		  int dim)
{
	return op_rmsq(F, x, ldx, res, w, out, ldo, dim, 0, 0);
}

/* The fused per-row chains (kernels_ptx/fwd_fused.cu); DSV32_CUDA_UNFUSED=1 runs the separate
 * kernels instead (the same bits; for diagnosis). */
static int fused(void)
{
	const char *v = getenv("DSV32_CUDA_UNFUSED");
	return !(v && *v == '1');
}

/* act_quant (spec §5.3) of rows [rows, K] -> codes [rows, K], scales [rows, K/128]. */
static int op_quant(struct fwd *F, gpu_ptr x, gpu_ptr q, gpu_ptr s, int rows, int K)
{
	long long ng = (long long)rows * K / 128;
	LAUNCH("k_act_quant", (ng + 7) / 8, 1, 256, 0, &x, &q, &s, &ng);
	return 0;
}

/* y[M, ldy] (bf16) = x8 x W^T (spec §5.4) through cuda_gemm_fp8. In the fast mode M > 64 goes
 * to the prefill path on Mp = round8(M) rows (buffers have them); otherwise, and where the
 * prefill path cannot take the shape (cuBLASLt needs K/128 % 4 == 0), in 64-row pieces through
 * the decode kernel. */
static int op_gemm(struct fwd *F, const struct fwd_fp8 *W, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int M,
		   int ldy)
{
	int N = W->out, K = W->in;
	size_t mark = gpu_arena_mark(F->A);
	int r = -ENOTSUP;
	char what[40];
	snprintf(what, sizeof what, "gemm %dx%d", N, K);
	if (M > 64 && LARGE_M(F) &&
	    !(cuda_gemm_path_for(F->g, M, N, K) == CUDA_GEMM_PATH_CUBLASLT && (K / 128) % 4)) {
		int Mp = round8(M);
		size_t wsb = cuda_gemm_fp8_workspace(F->g, Mp, N, K);
		TAKE(ws, wsb);
		r = cuda_gemm_fp8(F->g, W->w, W->s, x8, sx, y, Mp, N, K, ldy, ws, wsb);
		gpu_arena_release(F->A, mark);
		if (r != -ENOTSUP && r != -EINVAL) { /* else a shape the prefill path refuses: pieces */
			prof_mark(F->g->stream, what);
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
	prof_mark(F->g->stream, what);
	return r ? fwd_fail("cuda_gemm_fp8", r) : 0;
}

/* y[M, V] = x[M, D] (stride ldx) . W[V, D]^T, bf16 weights, fp32 (y32) or bf16 (y16) out: the
 * tensor cores above MMA_ROWS rows; 1-4 rows at memory speed (batch-invariant mode: in the CPU's
 * order, k_fwd_lin_*; fast mode: k_fwd_gemv*, another fixed order); else the CUDA cores in the
 * CPU's order (k_fwd_bf16_linear). */
/* k_fwd_lin_stream's dynamic shared memory limit: 4 rows of 14336 (eh_proj's input) */
#define LIN_STREAM_SMEM (4 * 14336 * 2)

/* k_fwd_head_mma<WM> (kernels_ptx/lm_head.cu): its dynamic shared memory by warps along M. */
static const char *const head_mma_names[3] = {"k_fwd_head_mma1", "k_fwd_head_mma2", "k_fwd_head_mma4"};
static unsigned head_mma_smem(int wm) { return 3u * (32u * (unsigned)wm + 128u) * 72u * 2u; }

static int op_lin(struct fwd *F, gpu_ptr W, gpu_ptr x, int ldx, gpu_ptr y32, gpu_ptr y16, int ldy,
		  int M, int D, int V)
{
	if (!F->E->batch_invariant && M > 4 && M <= 128 && V >= 1024 && D % 64 == 0 && ldx % 8 == 0) {
		/* the LM head (and eh_proj) of a decode batch: W streamed once, rows on the tensor
		 * cores (k_fwd_mma re-read W per 64 rows without a load pipeline) */
		int v = M <= 32 ? 0 : M <= 64 ? 1 : 2;
		LAUNCH(head_mma_names[v], (V + 127) / 128, 1, 256, head_mma_smem(1 << v), &W, &x, &ldx,
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
			LAUNCH("k_fwd_gemv", (V + 7) / 8, 1, 256, 0, &W, &x, &ldx, &y32, &y16, &ldy, &M, &D,
			       &V);
		return 0;
	}
	LAUNCH("k_fwd_bf16_linear", (V + 31) / 32, (M + 3) / 4, 256, 0, &W, &x, &ldx, &y32, &y16, &ldy,
	       &M, &D, &V);
	return 0;
}

/* RoPE in place at the rows' positions: heads per row, interleaved (MLA) or half-split. */
static int op_rope(struct fwd *F, gpu_ptr x, int heads, long long ld_token, int ld_head, int off,
		   int interleaved)
{
	int T = F->T;
	long long rows = (long long)T * heads;
	gpu_ptr cs = F->m->rope_cs;
	LAUNCH("k_rope", (rows + 7) / 8, 1, 256, 0, &x, &F->pos, &cs, &T, &heads, &ld_token, &ld_head,
	       &off, &interleaved);
	return 0;
}

static int op_hadamard(struct fwd *F, gpu_ptr x, int rows)
{
	int ld = 128;
	float sc = (float)pow(128.0, -0.5);
	LAUNCH("k_hadamard128", (rows + 7) / 8, 1, 256, 0, &x, &ld, &x, &ld, &rows, &sc);
	return 0;
}

/* Dense SwiGLU MLP (cpu_moe.c mlp_forward): y[M, D] = W2(bf16(silu(g) * u)), [g | u] = W13 f. */
static int op_mlp(struct fwd *F, const struct fwd_fp8 *w13, const struct fwd_fp8 *w2, gpu_ptr f,
		  gpu_ptr y, int M)
{
	int D = w13->in, inter = w13->out / 2, Mp = round8(M);
	size_t mark = gpu_arena_mark(F->A);
	TAKE(f8, (size_t)Mp * D);
	TAKE(fs, (size_t)Mp * (D / 128) * 4);
	TAKE(gu, (size_t)Mp * 2 * inter * 2);         /* bf16 [Mp, 2 * inter] */
	TAKE(h, (size_t)Mp * inter * 2);              /* bf16 [Mp, inter] */
	TAKE(h8, (size_t)Mp * inter);
	TAKE(hs, (size_t)Mp * (inter / 128) * 4);
	TRY(op_quant(F, f, f8, fs, M, D));
	TRY(op_gemm(F, w13, f8, fs, gu, M, 2 * inter));
	long long n = (long long)M * inter;
	long long blocks = (n + 255) / 256;
	LAUNCH("k_swiglu", blocks < 4096 ? blocks : 4096, 1, 256, 0, &gu, &h, &inter, &n);
	TRY(op_quant(F, h, h8, hs, M, inter));
	TRY(op_gemm(F, w2, h8, hs, y, M, w2->out));
	gpu_arena_release(F->A, mark);
	return 0;
}

/* ---- the MoE block (spec §3.9) ---------------------------------------------------------------- */

/* y[T, D] = MoE(f) through cuda_moe_forward (model/cuda_moe.c), or, when its tables are not
 * built (DSV32_CUDA_MOE_DENSE=1, a diagnosis switch), by running every expert on every row and
 * combining the picks (the same numbers per row, E times the work). logits fp32 [T, E], idx int
 * [T, K], wts fp32 [T, K]: the routing (for the dumps). */
static int op_moe(struct fwd *F, int64_t layer, const struct fwd_layer *L, gpu_ptr f, gpu_ptr y)
{
	const struct dsv32_config *c = F->c;
	int T = F->T, D = (int)c->hidden_size, E = (int)c->n_routed_experts;
	int K = (int)c->num_experts_per_tok;
	size_t mark = gpu_arena_mark(F->A);
	TAKE(logits, (size_t)F->Tp * E * 4);
	TAKE(idx, (size_t)F->Tp * K * 4);
	TAKE(wts, (size_t)F->Tp * K * 4);
	if (L->moe_ready) {
		int piece = LARGE_M(F) ? T : 64; /* the modes: see the file's header */
		for (int t0 = 0; t0 < T; t0 += piece) {
			int n = T - t0 < piece ? T - t0 : piece;
			struct cuda_moe_trace tr = {logits + (size_t)t0 * E * 4, idx + (size_t)t0 * K * 4,
						    wts + (size_t)t0 * K * 4};
			int r = cuda_moe_forward(F->g, F->A, c, &L->moe, f + (size_t)t0 * D * 2,
						 y + (size_t)t0 * D * 2, n, F->st->dump ? &tr : NULL,
						 LARGE_M(F) ? CUDA_MOE_FAST : 0);
			if (r)
				return fwd_fail("cuda_moe_forward", r);
		}
		prof_mark(F->g->stream, "moe block");
	} else {
		int G = (int)c->n_group, tg = (int)c->topk_group, norm = c->norm_topk_prob;
		float rs = (float)c->routed_scaling_factor;
		TRY(op_lin(F, L->gate, f, D, logits, 0, E, T, D, E));
		gpu_ptr bias = L->gate_bias;
		LAUNCH("k_moe_route", T, 1, 256, 0, &logits, &bias, &E, &G, &tg, &K, &norm, &rs, &idx,
		       &wts);
		TAKE(sh, (size_t)F->Tp * D * 2);
		TRY(op_mlp(F, &L->sh13, &L->sh2, f, sh, T));
		/* every expert on every row: [E, T, D] (+ 8 rows: the last GEMM may write Tp rows) */
		TAKE(ex, ((size_t)E * T + 8) * D * 2);
		for (int e = 0; e < E; e++)
			TRY(op_mlp(F, &L->ex13[e], &L->ex2[e], f, ex + (size_t)e * T * D * 2, T));
		TAKE(perm, (size_t)T * K * 4);
		LAUNCH("k_fwd_dense_perm", (T * K + 255) / 256, 1, 256, 0, &idx, &perm, &T, &K);
		long long blocks = ((long long)T * D + 255) / 256;
		LAUNCH("k_moe_combine", blocks < 4096 ? blocks : 4096, 1, 256, 0, &ex, &wts, &perm, &sh, &y,
		       &T, &K, &D);
	}
	if (F->st->dump) {
		TRY(dump_all(F, "ffn_moe_logits", layer, logits, DUMP_F32, E, E));
		TRY(dump_all(F, "ffn_moe_topk", layer, idx, DUMP_I32, K, K));
		TRY(dump_all(F, "ffn_moe_weights", layer, wts, DUMP_F32, K, K));
		TRY(dump_all(F, "ffn_moe_out", layer, y, DUMP_BF16, D, D));
	}
	gpu_arena_release(F->A, mark);
	return 0;
}

/* ---- one decoder layer (§3.2) ------------------------------------------------------------------ */

/* The layer's pools: MLA records (slot s at + s * record bytes) and indexer pages. */
static gpu_ptr pool_mla(const struct fwd *F, int64_t layer)
{
	const struct backend *b = F->E->base;
	return F->E->kv_base + (size_t)layer * b->n_pages * b->mla_page_bytes;
}

static gpu_ptr pool_idx(const struct fwd *F, int64_t layer)
{
	const struct backend *b = F->E->base;
	return F->E->kv_base + (size_t)b->n_layers * b->n_pages * b->mla_page_bytes +
	       (size_t)layer * b->n_pages * b->idx_page_bytes;
}

/* Index scores over positions 0..pos of each row's sequence and the top-k (§3.6.8-10): sel_pos /
 * sel_slot int [T, ksel] ascending, -1 padded. Dense (no scores) when no row has more than
 * index_topk keys. Rows go in chunks so the scores stay within SCORES_BUDGET. */
static int op_select(struct fwd *F, int64_t layer, gpu_ptr iq8, gpu_ptr iw, gpu_ptr sel_pos,
		     gpu_ptr sel_slot, int ksel)
{
	const struct dsv32_config *c = F->c;
	int Hi = (int)c->index_n_heads, mb = F->mb, ld = F->mb * 64;
	int need = F->max_n > c->index_topk || F->st->dump;
	long long pb = (long long)F->E->base->idx_page_bytes;
	gpu_ptr pool = pool_idx(F, layer);
	int chunk = (int)(SCORES_BUDGET / ((size_t)ld * 4));
	chunk = chunk < 1 ? 1 : chunk > F->T ? F->T : chunk;
	size_t mark = gpu_arena_mark(F->A);
	gpu_ptr scores = 0;
	if (need) {
		scores = take(F, (size_t)chunk * ld * 4);
		if (!scores)
			return -ENOMEM;
	}
	for (int t0 = 0; t0 < F->T; t0 += chunk) {
		int n = F->T - t0 < chunk ? F->T - t0 : chunk;
		gpu_ptr q = iq8 + (size_t)t0 * Hi * 128, w = iw + (size_t)t0 * Hi * 4;
		gpu_ptr bt = F->bt + (size_t)t0 * mb * 4, nk = F->nkeys + (size_t)t0 * 4;
		gpu_ptr op = sel_pos + (size_t)t0 * ksel * 4, os = sel_slot + (size_t)t0 * ksel * 4;
		if (need) {
			/* FP8 tensor cores (k_indexer_scores_fp8; run 5: 2.27 TB/s at 128K x 128, the
			 * dots within 2^-23 of sum |q k|, as the fp32-exact k_indexer_scores) */
			int r = cuda_indexer_scores(F->g, q, w, Hi, pool, pb, bt, mb, nk, scores, ld, n);
			if (r)
				return fwd_fail("cuda_indexer_scores", r);
			prof_mark(F->g->stream, "indexer scores");
			TRY(dump_rows(F, "idx_scores", layer, scores, DUMP_F32, ld, -1, t0, n));
		}
		int r = cuda_indexer_topk(F->g, scores, ld, nk, ksel, bt, mb, op, os, n);
		if (r)
			return fwd_fail("cuda_indexer_topk", r);
		prof_mark(F->g->stream, "indexer topk");
	}
	gpu_arena_release(F->A, mark);
	return dump_all(F, "idx_topk", layer, sel_pos, DUMP_I32, ksel, ksel);
}

/* x [Tp, D] the layer input (the embedding when first), r [Tp, D] the residual stream. On
 * return x holds the layer's FFN output. */
static int fwd_layer(struct fwd *F, int64_t layer, const struct fwd_layer *L, gpu_ptr x, gpu_ptr r,
		     int first)
{
	const struct dsv32_config *c = F->c;
	/* (not const: the kernels take their addresses) */
	int T = F->T, Tp = F->Tp, D = (int)c->hidden_size;
	int H = (int)c->num_attention_heads, dq = (int)c->qk_head_dim;
	int nope = (int)c->qk_nope_head_dim, rope = (int)c->qk_rope_head_dim;
	int Rk = (int)c->kv_lora_rank, qlr = (int)c->q_lora_rank, dv = (int)c->v_head_dim;
	int Hi = (int)c->index_n_heads, Hpad = (H + 15) / 16 * 16;
	int Nq = qlr + 128 + Rk + rope, kvo = qlr + 128; /* [q_a | idx wk | kv_a] */
	size_t mark = gpu_arena_mark(F->A);

	/* attention norm with the fused residual add: r = bf16(x + r), a = RMSNorm(x + r) */
	TAKE(a, (size_t)Tp * D * 2);          /* bf16 [Tp, D] attn_norm */
	TAKE(a8, (size_t)Tp * D);             /* e4m3 [Tp, D] */
	TAKE(as, (size_t)Tp * (D / 128) * 4); /* fp32 [Tp, D/128] */
	const int fuse = fused();
	gpu_ptr cs = F->m->rope_cs;
	if (first && cu_check(cu.cuMemcpyDtoDAsync(r, x, (size_t)T * D * 2, F->g->stream),
			      "cuMemcpyDtoDAsync", __FILE__, __LINE__))
		return -EIO;
	TRY(op_rmsq(F, x, D, first ? 0 : r, L->attn_norm, a, D, D, fuse ? a8 : 0, fuse ? as : 0));
	if (!fuse)
		TRY(op_quant(F, a, a8, as, T, D));
	TRY(dump_all(F, "attn_norm", layer, a, DUMP_BF16, D, D));

	/* the projections of a (§3.3, §3.6.2): [q_a | indexer wk | kv_a] = a W^T, one GEMM when the
	 * three are placed as one matrix */
	TAKE(yq, (size_t)Tp * Nq * 2);        /* bf16 [Tp, q_lora_rank | 128 | kv_lora_rank | rope] */
	if (L->fused_qkv) {
		TRY(op_gemm(F, &L->qkv, a8, as, yq, T, Nq));
	} else {
		TRY(op_gemm(F, &L->q_a, a8, as, yq, T, Nq));
		TRY(op_gemm(F, &L->idx_k, a8, as, yq + (size_t)qlr * 2, T, Nq));
		TRY(op_gemm(F, &L->kv_a, a8, as, yq + (size_t)kvo * 2, T, Nq));
	}
	TAKE(cq, (size_t)Tp * qlr * 2);       /* bf16 [Tp, q_lora_rank] q_cmpr */
	TAKE(ckv, (size_t)Tp * Rk * 2);       /* bf16 [Tp, kv_lora_rank] kv_cmpr (pre-FP8) */
	gpu_ptr kpe = yq + (size_t)(kvo + Rk) * 2; /* bf16 [Tp, rope] in yq's rows */
	gpu_ptr ikr = yq + (size_t)qlr * 2;   /* bf16 [Tp, 128] indexer wk output, in yq's rows */
	TAKE(cq8, (size_t)Tp * qlr);
	TAKE(cqs, (size_t)Tp * (qlr / 128) * 4);
	TAKE(ik, (size_t)Tp * 128 * 2);       /* bf16 [Tp, 128] idx_k */
	float eps = (float)c->rms_norm_eps, had = (float)pow(128.0, -0.5);
	if (fuse) { /* q_norm + act_quant; kv_norm, k_pe RoPE, MLA record; indexer key and its
		     * cache write: one launch */
		gpu_ptr pm = pool_mla(F, layer), pi = pool_idx(F, layer), qnw = L->q_norm;
		gpu_ptr kvnw = L->kv_norm, inw = L->idx_k_norm_w, inb = L->idx_k_norm_b;
		int rec = (int)c->mla_record_bytes;
		long long pb = (long long)F->E->base->idx_page_bytes;
		LAUNCH("k_fwd_qkv_norms", 2 * T + (T + 7) / 8, 1, 256, 0, &yq, &Nq, &T, &eps, &qnw, &cq,
		       &qlr, &cq8, &cqs, &kvo, &kvnw, &ckv, &Rk, &F->pos, &cs, &F->slot, &pm, &rec, &inw,
		       &inb, &ik, &pi, &pb, &had);
	} else {
		TRY(op_rms(F, yq, Nq, 0, L->q_norm, cq, qlr, qlr));
		TRY(op_quant(F, cq, cq8, cqs, T, qlr));
		TRY(op_rms(F, yq + (size_t)kvo * 2, Nq, 0, L->kv_norm, ckv, Rk, Rk));
		TRY(op_rope(F, yq, 1, Nq, 0, kvo + Rk, 1));
	}
	TAKE(q, (size_t)Tp * H * dq * 2);     /* bf16 [Tp, H, nope | rope] */
	TRY(op_gemm(F, &L->q_b, cq8, cqs, q, T, H * dq));
	const int absorb_cc = T <= MMA_ROWS; /* q absorption on the CUDA cores (below) */
	if (!(fuse && absorb_cc)) /* else the q absorption rotates q_pe as it copies it */
		TRY(op_rope(F, q, H, (long long)H * dq, dq, nope, 1));
	TRY(dump_all(F, "q_cmpr", layer, cq, DUMP_BF16, qlr, qlr));
	TRY(dump_all(F, "kv_cmpr", layer, ckv, DUMP_BF16, Rk, Rk));
	TRY(dump_all(F, "k_pe", layer, kpe, DUMP_BF16, Nq, rope));

	/* lightning indexer projections (§3.6.1-7) */
	TAKE(iq, (size_t)Tp * Hi * 128 * 2);  /* bf16 [Tp, Hi, 128] idx_q */
	TAKE(iq8, (size_t)Tp * Hi * 128);     /* e4m3 */
	TAKE(iqs, (size_t)Tp * Hi * 4);       /* fp32 [Tp, Hi] s_q */
	TAKE(iw, (size_t)Tp * Hi * 4);        /* fp32 [Tp, Hi] idx_w */
	TRY(op_gemm(F, &L->idx_q_b, cq8, cqs, iq, T, Hi * 128));
	float hs = (float)pow((double)Hi, -0.5), ds = had;
	gpu_ptr nw = L->idx_k_norm_w, nb = L->idx_k_norm_b;
	/* a decode step in the fast mode: weights_proj inside the query kernel (op_lin would run
	 * k_fwd_gemv_ks: the same numbers, one launch more) */
	const int qw = fuse && !F->E->batch_invariant && T <= 4 && D % 8 == 0 && Hi < 8 * F->g->sm_count;
	if (!qw)
		TRY_TAG("weights_proj", op_lin(F, L->idx_wproj, a, D, iw, 0, Hi, T, D, Hi));
	if (qw) { /* q: RoPE, Hadamard, act_quant, w' with w = weights_proj (the key: above) */
		gpu_ptr wp = L->idx_wproj;
		LAUNCH("k_fwd_idx_qw", T * Hi, 1, 256, 0, &iq, &iq8, &iw, &F->pos, &cs, &Hi, &had, &hs, &ds,
		       &wp, &a, &D, &D);
	} else if (fuse) { /* q: RoPE, Hadamard, act_quant, w' (the key is done, above) */
		int rows = T * Hi;
		LAUNCH("k_fwd_idx_q", (rows + 7) / 8, 1, 256, 0, &iq, &iq8, &iw, &F->pos, &cs,
		       &Hi, &rows, &had, &hs, &ds);
	} else {
		TRY(op_rope(F, iq, Hi, (long long)Hi * 128, 128, 0, 0));
		TRY(op_hadamard(F, iq, T * Hi));
		TRY(op_quant(F, iq, iq8, iqs, T * Hi, 128));
		int n = T * Hi;
		LAUNCH("k_fwd_idx_weights", (n + 255) / 256, 1, 256, 0, &iw, &iqs, &n, &hs, &ds);
		LAUNCH("k_layernorm128", (T + 7) / 8, 1, 256, 0, &ikr, &Nq, &nw, &nb, &ik, &T, &eps);
		TRY(op_rope(F, ik, 1, 128, 0, 0, 0));
		TRY(op_hadamard(F, ik, T));
	}
	TRY(dump_all(F, "idx_q", layer, iq, DUMP_BF16, Hi * 128, Hi * 128));
	TRY(dump_all(F, "idx_k", layer, ik, DUMP_BF16, 128, 128));
	TRY(dump_all(F, "idx_w", layer, iw, DUMP_F32, Hi, Hi));

	/* cache writes for every row before any row attends (done above when fused) */
	if (!fuse) {
		gpu_ptr pm = pool_mla(F, layer), pi = pool_idx(F, layer);
		int rec = (int)c->mla_record_bytes, ld128 = 128;
		long long pb = (long long)F->E->base->idx_page_bytes;
		LAUNCH("k_kv_mla_write", T, 1, 32 * (Rk / 128 + 1), 0, &ckv, &Rk, &kpe, &Nq, &F->slot, &pm,
		       &Rk, &rope, &rec);
		LAUNCH("k_kv_index_write", (T + 7) / 8, 1, 256, 0, &ik, &ld128, &F->slot, &pi, &pb, &T);
	}

	/* sparse attention: selection, q absorption, MLA over the selected slots, W_UV */
	int ksel = F->ksel;
	TAKE(sel_pos, (size_t)Tp * ksel * 4);
	TAKE(sel_slot, (size_t)Tp * ksel * 4);
	TRY(op_select(F, layer, iq8, iw, sel_pos, sel_slot, ksel));
	TAKE(qf, (size_t)Tp * Hpad * (Rk + rope) * 2); /* bf16 [Tp, Hpad, q_lat | q_pe] */
	if (Hpad > H && cu_check(cu.cuMemsetD8Async(qf, 0, (size_t)T * Hpad * (Rk + rope) * 2,
						    F->g->stream), "cuMemsetD8Async", __FILE__, __LINE__))
		return -EIO;
	gpu_ptr kvb_w = L->kv_b.w, kvb_s = L->kv_b.s;
	if (!absorb_cc) {
		int mode = 0, lda = H * dq, b_hs = nope + dv, b_row0 = 0, ldc = Hpad * (Rk + rope), out32 = 0;
		long long a_hs = dq, c_hs = Rk + rope;
		F->tag = "q absorb (mma)";
		LAUNCH3("k_fwd_mma", Rk / 64, (T + 63) / 64, H, 128, &mode, &q, &a_hs, &lda, &kvb_w, &kvb_s,
			&b_row0, &b_hs, &Rk, &qf, &c_hs, &ldc, &out32, &T, &Rk, &nope);
		F->tag = NULL;
	} else { /* rows a block: the step's, up to 8 */
		static const char *names[] = {"k_fwd_q_absorb1", "k_fwd_q_absorb2", "k_fwd_q_absorb4",
					      "k_fwd_q_absorb8"};
		int v = T <= 1 ? 0 : T <= 2 ? 1 : T <= 4 ? 2 : 3, rows = 1 << v;
		gpu_ptr qcs = fuse ? cs : 0; /* RoPE of q_pe here (fused) or done above */
		LAUNCH3(names[v], H, (T + rows - 1) / rows, Rk / 128, 128, &q, &kvb_w, &kvb_s, &qf, &T,
			&H, &Hpad, &nope, &rope, &dv, &Rk, &F->pos, &qcs);
	}
	TRY(dump_all(F, "q", layer, q, DUMP_BF16, H * dq, H * dq));
	if (F->st->dump) { /* q_lat [H, R] per row, out of qf's [Hpad, R + rope] */
		size_t n = (size_t)T * Hpad * (Rk + rope);
		uint16_t *h = malloc(n * 2);
		float *row = malloc((size_t)H * Rk * sizeof *row);
		int rr = !h || !row ? -ENOMEM : gpu_download(F->g, h, qf, n * 2);
		for (int t = 0; t < T && !rr; t++) {
			for (int hh = 0; hh < H; hh++)
				for (int i = 0; i < Rk; i++)
					row[hh * Rk + i] = bf16_to_f32(h[((size_t)t * Hpad + hh) * (Rk + rope) + i]);
			F->st->dump->fn(F->st->dump->ctx, "q_lat", layer, F->seq_h[t], F->pos_h[t], 0, row,
					(int64_t)H * Rk);
		}
		free(h);
		free(row);
		TRY(rr);
	}
	TAKE(olat, (size_t)Tp * Hpad * Rk * 2); /* bf16 [Tp, Hpad, R] */
	const char *mla32 = getenv("DSV32_CUDA_MLA_FP32"); /* diagnosis: kernels_ptx/fwd_mla_fp32.cu */
	if (mla32 && *mla32 == '1') {
		gpu_ptr pm = pool_mla(F, layer);
		int rec = (int)c->mla_record_bytes;
		float scale = c->softmax_scale;
		LAUNCH("k_fwd_mla_fp32", Hpad / 16, T, 256, 0, &qf, &sel_slot, &ksel, &pm, &rec, &Rk, &Hpad,
		       &scale, &olat);
	} else if (!F->E->batch_invariant) {
		size_t wsb = cuda_mla_decode_workspace(F->g, T, Hpad, Rk, ksel);
		gpu_ptr ws = 0;
		if (wsb && !(ws = take(F, wsb)))
			return -ENOMEM;
		int rc = cuda_mla_decode(F->g, qf, sel_slot, ksel, pool_mla(F, layer), (int)c->mla_record_bytes,
					 Rk, Hpad, T, c->softmax_scale, olat, ws);
		if (rc)
			return fwd_fail("cuda_mla_decode", rc);
		prof_mark(F->g->stream, "mla decode");
	} else {
		/* batch-invariant: the key splits a decode row gets (cuda_mla_decode_splits at one
		 * row) for every row count, in pieces of 32 rows (the split partials' workspace: 135
		 * MB at the real dimensions, within fwd_max_rows' fixed part) */
		int splits = cuda_mla_decode_splits(F->g, 1, Hpad, ksel);
		int piece = T < 32 ? T : 32;
		gpu_ptr ws = 0;
		if (splits > 1 && !(ws = take(F, (size_t)piece * Hpad * splits * (Rk + 2) * 4)))
			return -ENOMEM;
		for (int t0 = 0; t0 < T; t0 += piece) {
			int n = T - t0 < piece ? T - t0 : piece;
			int rc = cuda_mla_decode_diag(F->g, qf + (size_t)t0 * Hpad * (Rk + rope) * 2,
						      sel_slot + (size_t)t0 * ksel * 4, ksel, pool_mla(F, layer),
						      (int)c->mla_record_bytes, Rk, Hpad, n, c->softmax_scale,
						      olat + (size_t)t0 * Hpad * Rk * 2, ws, splits << 8);
			if (rc)
				return fwd_fail("cuda_mla_decode_diag", rc);
		}
		prof_mark(F->g->stream, "mla decode");
	}
	TAKE(o, (size_t)Tp * H * dv * 2);     /* bf16 [Tp, H * v_head_dim] attn_o */
	TAKE(o8, (size_t)Tp * H * dv);        /* its act_quant: e4m3 codes, fp32 scales */
	TAKE(os, (size_t)Tp * (H * dv / 128) * 4);
	int o_quantised = 0;
	if (T > MMA_ROWS) {
		int mode = 1, lda = Hpad * Rk, b_row0 = nope, b_hs = nope + dv, ldc = H * dv, out32 = 0;
		long long a_hs = Rk, c_hs = dv;
		F->tag = "uv (mma)";
		LAUNCH3("k_fwd_mma", (dv + 63) / 64, (T + 63) / 64, H, 128, &mode, &olat, &a_hs, &lda, &kvb_w,
			&kvb_s, &b_row0, &b_hs, &Rk, &o, &c_hs, &ldc, &out32, &T, &dv, &Rk);
		F->tag = NULL;
	} else if (T == 1 && fuse && dv == 128 && Rk <= 512) { /* a decode row, o's act_quant fused */
		LAUNCH("k_fwd_uv1_q", H, 1, 512, 0, &olat, &kvb_w, &kvb_s, &o, &o8, &os, &H, &Hpad, &nope, &dv,
		       &Rk);
		o_quantised = 1;
	} else if (T == 1) { /* a decode row: one row a block */
		LAUNCH3("k_fwd_uv1", H, 1, (dv + 31) / 32, 256, &olat, &kvb_w, &kvb_s, &o, &T, &H, &Hpad,
			&nope, &dv, &Rk);
	} else {
		LAUNCH3("k_fwd_uv4", H, (T + 3) / 4, (dv + 31) / 32, 256, &olat, &kvb_w, &kvb_s, &o, &T, &H,
			&Hpad, &nope, &dv, &Rk);
	}
	TRY(dump_all(F, "attn_o", layer, o, DUMP_BF16, H * dv, H * dv));
	TAKE(ao, (size_t)Tp * D * 2);         /* bf16 [Tp, D] attn_out */
	if (!o_quantised)
		TRY(op_quant(F, o, o8, os, T, H * dv));
	TRY(op_gemm(F, &L->o, o8, os, ao, T, D));
	TRY(dump_all(F, "attn_out", layer, ao, DUMP_BF16, D, D));

	/* FFN: r = bf16(attn_out + r), f = RMSNorm(attn_out + r); x = FFN(f) */
	TAKE(f, (size_t)Tp * D * 2);          /* bf16 [Tp, D] ffn_norm */
	TRY(op_rms(F, ao, D, r, L->ffn_norm, f, D, D));
	TRY(dump_all(F, "ffn_norm", layer, f, DUMP_BF16, D, D));
	if (L->is_moe) {
		TRY(op_moe(F, layer, L, f, x));
	} else {
		TRY(op_mlp(F, &L->w13, &L->w2, f, x, T));
		TRY(dump_all(F, "ffn_out", layer, x, DUMP_BF16, D, D));
	}
	gpu_arena_release(F->A, mark);
	return 0;
}

/* ---- the step's metadata ------------------------------------------------------------------------ */

static int row_flags(const struct backend_seq *s, int64_t j)
{
	return s->flags ? s->flags[j] : (j == s->n - 1 ? BACKEND_ROW_LOGITS : 0);
}

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Counts the rows, fills the host copies and uploads the metadata (and up to two [T, D] float
 * inputs, as bf16) in one copy. Returns 0 with F->T = 0 for an empty step. */
static int fwd_begin(struct fwd *F, const struct fwd_env *E, const struct backend_step *st,
		     const float *in0, const float *in1)
{
	const struct dsv32_config *c = E->c;
	memset(F, 0, sizeof *F);
	F->E = E, F->g = E->g, F->A = E->arena, F->c = c, F->m = E->m, F->st = st;
	/* the GEMM dispatch follows the step's mode (sticky per GPU: set at every step) */
	cuda_gemm_set_batch_invariant(E->g, E->batch_invariant);
	int64_t T = 0;
	for (int64_t i = 0; i < st->n_seqs; i++)
		T += st->seqs[i].n;
	if (T == 0)
		return 0;
	if (T > 65535)
		return -EINVAL; /* grid y of the per-row kernels */
	F->T = (int)T, F->Tp = round8((int)T);
	F->pos_h = malloc((size_t)T * sizeof *F->pos_h);
	F->seq_h = malloc((size_t)T * sizeof *F->seq_h);
	if (!F->pos_h || !F->seq_h)
		return -ENOMEM;
	int64_t maxp = 0;
	for (int64_t i = 0, t = 0; i < st->n_seqs; i++)
		for (int64_t j = 0; j < st->seqs[i].n; j++, t++) {
			F->pos_h[t] = st->seqs[i].pos[j];
			F->seq_h[t] = i;
			maxp = F->pos_h[t] > maxp ? F->pos_h[t] : maxp;
			if (F->pos_h[t] >= F->m->rope_max_pos)
				return -EINVAL;
			int fl = row_flags(&st->seqs[i], j);
			F->n_logits += !!(fl & BACKEND_ROW_LOGITS);
			F->n_hidden += !!(fl & BACKEND_ROW_HIDDEN);
		}
	/* block-table columns and the selection width rounded up to powers of two, so a captured
	 * decode graph serves many steps (scores past a row's keys are -inf, lists -1 padded); the
	 * batch-invariant mode always selects index_topk wide (the attention's work per row then
	 * never depends on the step's longest row) */
	int64_t mb = 1, ks = 1;
	while (mb < maxp / KV_PAGE_TOKENS + 1)
		mb *= 2;
	while (ks < maxp + 1)
		ks *= 2;
	F->mb = (int)mb;
	F->max_n = (int)(maxp + 1);
	F->ksel = (int)(ks < c->index_topk && !E->batch_invariant ? ks : c->index_topk);
	int64_t D = c->hidden_size;
	/* pinned layout: tok, pos, slot, nkeys [T]; bt [T, mb]; lrows, hrows; then bf16 inputs */
	size_t o_tok = 0, o_pos = al256(T * 4), o_slot = o_pos + al256(T * 4);
	size_t o_nk = o_slot + al256(T * 4), o_bt = o_nk + al256(T * 4);
	size_t o_lr = o_bt + al256((size_t)T * F->mb * 4), o_hr = o_lr + al256((size_t)F->n_logits * 4 + 4);
	size_t o_up = o_hr + al256((size_t)F->n_hidden * 4 + 4);
	size_t up_bytes = al256((size_t)T * D * 2);
	int n_up = st->mtp ? 1 : (in0 ? 1 : 0) + (in1 ? 1 : 0);
	size_t total = o_up + (size_t)n_up * up_bytes;
	if (*E->pinned_bytes < total) {
		gpu_host_free(*E->pinned);
		*E->pinned_bytes = 0;
		if (!(*E->pinned = gpu_host_alloc(total)))
			return -ENOMEM;
		*E->pinned_bytes = total;
	}
	uint8_t *h = *E->pinned;
	int32_t *tok = (int32_t *)(h + o_tok), *pos = (int32_t *)(h + o_pos);
	int32_t *slot = (int32_t *)(h + o_slot), *nk = (int32_t *)(h + o_nk);
	int32_t *bt = (int32_t *)(h + o_bt), *lr = (int32_t *)(h + o_lr), *hr = (int32_t *)(h + o_hr);
	uint16_t *up = (uint16_t *)(h + o_up);
	int nl = 0, nh = 0;
	for (int64_t i = 0, t = 0; i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		for (int64_t j = 0; j < s->n; j++, t++) {
			int64_t p = s->pos[j];
			tok[t] = s->tokens[j];
			pos[t] = (int32_t)p;
			slot[t] = s->block_table[p / KV_PAGE_TOKENS] * KV_PAGE_TOKENS + (int32_t)(p % KV_PAGE_TOKENS);
			nk[t] = (int32_t)(p + 1);
			for (int b = 0; b < F->mb; b++)
				bt[t * F->mb + b] = b < s->n_blocks ? s->block_table[b] : 0;
			int fl = row_flags(s, j);
			if (fl & BACKEND_ROW_LOGITS)
				lr[nl++] = (int32_t)t;
			if (fl & BACKEND_ROW_HIDDEN)
				hr[nh++] = (int32_t)t;
			if (st->mtp)
				for (int64_t d = 0; d < D; d++)
					up[t * D + d] = f32_to_bf16(s->mtp_hidden[j * D + d]);
		}
	}
	for (int k = 0, u = 0; k < 2 && !st->mtp; k++) {
		const float *in = k ? in1 : in0;
		if (!in)
			continue;
		uint16_t *dst = (uint16_t *)((uint8_t *)up + (size_t)u++ * up_bytes);
		for (int64_t i = 0; i < T * D; i++)
			dst[i] = f32_to_bf16(in[i]);
	}
	F->meta_bytes = total, F->o_pos = o_pos, F->o_slot = o_slot, F->o_nk = o_nk, F->o_bt = o_bt;
	F->o_lr = o_lr, F->o_hr = o_hr, F->o_up = o_up, F->up_bytes = up_bytes;
	/* the shared-memory limit of the mode's few-row product kernels (head_mma in the fast mode,
	 * lin_stream in the invariant one; a function attribute: set here, outside any capture) */
	for (int v = 0; v < 4; v++) {
		if (F->E->batch_invariant != (v == 3))
			continue;
		void *fn = gpu_kernel(F->g, v < 3 ? head_mma_names[v] : "k_fwd_lin_stream");
		int smem = v < 3 ? (int)head_mma_smem(1 << v) : LIN_STREAM_SMEM;
		if (!fn || cu_check(cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
							  smem),
				    "cuFuncSetAttribute", __FILE__, __LINE__))
			return -EIO;
	}
	return 0;
}

/* The step's one metadata upload (pinned -> device, on the stream: a node of a captured graph). */
static int fwd_upload(struct fwd *F)
{
	TAKE(dev, F->meta_bytes);
	if (cu_check(cu.cuMemcpyHtoDAsync(dev, *F->E->pinned, F->meta_bytes, F->g->stream),
		     "cuMemcpyHtoDAsync", __FILE__, __LINE__))
		return -EIO;
	F->tok = dev, F->pos = dev + F->o_pos, F->slot = dev + F->o_slot, F->nkeys = dev + F->o_nk;
	F->bt = dev + F->o_bt, F->lrows = dev + F->o_lr, F->hrows = dev + F->o_hr;
	F->up[0] = dev + F->o_up, F->up[1] = dev + F->o_up + F->up_bytes;
	return 0;
}

static void fwd_end(struct fwd *F)
{
	free(F->pos_h);
	free(F->seq_h);
}

/* ---- the step ---------------------------------------------------------------------------------- */

/* Downloads rows idx (device int32 [n]) of src bf16 [T, D] as floats into dst [n, D]. */
static int gather_download(struct fwd *F, gpu_ptr src, gpu_ptr idx, int n, int D, float *dst)
{
	size_t mark = gpu_arena_mark(F->A);
	TAKE(g, (size_t)n * D * 2);
	LAUNCH("k_moe_gather", n, 1, 256, 0, &src, &idx, &g, &D);
	uint16_t *h = malloc((size_t)n * D * 2);
	if (!h)
		return -ENOMEM;
	int r = gpu_download(F->g, h, g, (size_t)n * D * 2);
	for (size_t i = 0; !r && i < (size_t)n * D; i++)
		dst[i] = bf16_to_f32(h[i]);
	free(h);
	gpu_arena_release(F->A, mark);
	return r;
}

/* Everything of a step on the device, up to the final normed rows (*out, and r = the MTP
 * block's output) and the logits of the flagged rows (*l32: fp32 [n_logits, V], 0 if none).
 * No synchronisation unless dumping: this is what a decode graph captures. */
static int step_device(struct fwd *F, gpu_ptr *out_p, gpu_ptr *r_p, gpu_ptr *l32_p)
{
	const struct dsv32_config *c = F->c;
	const struct fwd_model *m = F->m;
	const struct backend_step *st = F->st;
	int T = F->T, D = (int)c->hidden_size, V = (int)c->vocab_size;
	int64_t Lm = c->num_hidden_layers;
	TRY(fwd_upload(F));
	TAKE(x, (size_t)F->Tp * D * 2); /* bf16 [Tp, D] layer input / output */
	TAKE(r, (size_t)F->Tp * D * 2); /* bf16 [Tp, D] residual stream */
	gpu_ptr norm, head;
	if (!st->mtp) {
		gpu_ptr emb = m->embed;
		LAUNCH("k_embed", T, 1, 256, 0, &emb, &F->tok, &x, &D);
		TRY(dump_all(F, "embed", -1, x, DUMP_BF16, D, D));
		for (int64_t l = 0; l < Lm; l++)
			TRY(fwd_layer(F, l, &m->layers[l], x, r, l == 0));
		norm = m->norm, head = m->lm_head;
	} else {
		/* MTP input (§4): x = eh_proj([enorm(embed(x_{i+1})) ; hnorm(h_i)]) */
		TAKE(e, (size_t)F->Tp * D * 2);
		TAKE(cat, (size_t)F->Tp * 2 * D * 2); /* bf16 [Tp, 2D] */
		gpu_ptr emb = m->mtp_embed;
		LAUNCH("k_embed", T, 1, 256, 0, &emb, &F->tok, &e, &D);
		TRY(op_rms(F, e, D, 0, m->enorm, cat, 2 * D, D));
		TRY(op_rms(F, F->up[0], D, 0, m->hnorm, cat + (size_t)D * 2, 2 * D, D));
		TRY(dump_all(F, "mtp_cat", Lm, cat, DUMP_BF16, 2 * D, 2 * D));
		TRY_TAG("eh_proj", op_lin(F, m->eh_proj, cat, 2 * D, 0, x, D, T, 2 * D, D));
		TRY(dump_all(F, "mtp_eh_proj", Lm, x, DUMP_BF16, D, D));
		TRY(fwd_layer(F, Lm, &m->layers[Lm], x, r, 1));
		norm = m->head_norm, head = m->mtp_head;
	}
	/* final norm of the fp32 sum x + r: out = RMSNorm, r = bf16(x + r) (the MTP block's output) */
	TAKE(out, (size_t)F->Tp * D * 2);
	TRY(op_rms(F, x, D, r, norm, out, D, D));
	TRY(dump_all(F, "result_norm", st->mtp ? Lm : -1, out, DUMP_BF16, D, D));
	*out_p = out, *r_p = r, *l32_p = 0;
	if (F->n_logits) {
		int nl = F->n_logits;
		gpu_ptr hr = out; /* every row asks for logits (decode): they are in order already */
		if (nl < T) {
			hr = take(F, (size_t)nl * D * 2);
			if (!hr)
				return -ENOMEM;
			LAUNCH("k_moe_gather", nl, 1, 256, 0, &out, &F->lrows, &hr, &D);
		}
		TAKE(l32, (size_t)nl * V * 4);
		TRY_TAG("lm head", op_lin(F, head, hr, D, l32, 0, V, nl, D, V));
		*l32_p = l32;
	}
	return 0;
}

/* The step's outputs to the callers' buffers, in row order: the logits (downloaded from l32)
 * and the hidden rows (gathered from out, or r for MTP). Waits for the step. */
static int step_finish(struct fwd *F, gpu_ptr out, gpu_ptr r, gpu_ptr l32)
{
	const struct backend_step *st = F->st;
	int D = (int)F->c->hidden_size, V = (int)F->c->vocab_size;
	float *hid = NULL;
	int rc = 0;
	if (F->n_hidden) {
		hid = malloc((size_t)F->n_hidden * D * sizeof *hid);
		rc = hid ? gather_download(F, st->mtp ? r : out, F->hrows, F->n_hidden, D, hid) : -ENOMEM;
	}
	/* the logits straight into each sequence's buffer: its flagged rows are consecutive rows
	 * of l32 (row order), and its buffer holds them in that order (was: a fresh host buffer
	 * for all and a copy per row; run 9: ~55 ms of a 69 ms batch-128 step, page faults and
	 * copies of 66 MB) */
	for (int64_t i = 0, kl = 0; !rc && F->n_logits && i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		int64_t nl = 0;
		for (int64_t j = 0; j < s->n; j++)
			nl += !!(row_flags(s, j) & BACKEND_ROW_LOGITS);
		if (nl && cu_check(cu.cuMemcpyDtoHAsync(s->logits, l32 + (size_t)kl * V * 4,
							(size_t)nl * V * 4, F->g->stream),
				   "cuMemcpyDtoHAsync", __FILE__, __LINE__))
			rc = -EIO;
		kl += nl;
	}
	if (!rc && (F->n_logits || !F->n_hidden))
		rc = gpu_sync(F->g); /* the step (and its downloads) complete when it returns */
	for (int64_t i = 0, kh = 0; !rc && F->n_hidden && i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		int64_t nh = 0;
		for (int64_t j = 0; j < s->n; j++)
			if (row_flags(s, j) & BACKEND_ROW_HIDDEN)
				memcpy(s->hidden + nh++ * D, hid + kh++ * D, (size_t)D * sizeof *hid);
	}
	free(hid);
	return rc;
}

/* ---- decode graphs ------------------------------------------------------------------------------ */

/* A captured step: valid for every step with the same shape (rows, block-table columns,
 * selection width, whether scores run, logits rows) and mode, the same pinned staging buffer
 * and the same arena top (its scratch addresses are baked in). */
struct fwd_graph {
	int T, mb, ksel, need, nl, inv;
	void *pinned;
	size_t top;
	CUgraphExec exec;
	gpu_ptr out, r, l32;
	unsigned long long used;
};

struct fwd_graphs {
	struct fwd_graph g[FWD_MAX_GRAPHS];
	int n;
	unsigned long long clock;
	int off;                  /* capture failed once: eager from then on */
	int64_t captures, replays;
};

struct fwd_graphs *cuda_forward_graphs_new(void)
{
	return calloc(1, sizeof(struct fwd_graphs));
}

void cuda_forward_graphs_free(struct fwd_graphs *G)
{
	if (!G)
		return;
	for (int i = 0; i < G->n; i++)
		cu.cuGraphExecDestroy(G->g[i].exec);
	free(G);
}

void cuda_forward_graphs_stats(const struct fwd_graphs *G, int64_t *captures, int64_t *replays)
{
	*captures = G ? G->captures : 0;
	*replays = G ? G->replays : 0;
}

/* Replays the step's graph, capturing it first if none fits. 1: not eligible (the caller runs
 * the step eagerly), 0: done (outputs at *out, *r, *l32), < 0: error. */
static int step_graph(struct fwd *F, gpu_ptr *out, gpu_ptr *r, gpu_ptr *l32)
{
	struct fwd_graphs *G = F->E->graphs;
	const struct backend_step *st = F->st;
	if (!G || G->off || st->dump || st->mtp || F->n_hidden || F->T > FWD_GRAPH_MAX_ROWS)
		return 1;
	int need = F->max_n > F->c->index_topk;
	size_t top = F->A->top;
	struct fwd_graph *hit = NULL;
	for (int i = 0; i < G->n && !hit; i++) {
		struct fwd_graph *x = &G->g[i];
		if (x->T == F->T && x->mb == F->mb && x->ksel == F->ksel && x->need == need &&
		    x->nl == F->n_logits && x->inv == F->E->batch_invariant &&
		    x->pinned == *F->E->pinned && x->top == top)
			hit = x;
	}
	if (!hit) {
		if (G->n == FWD_MAX_GRAPHS) { /* evict the least recently used */
			int lru = 0;
			for (int i = 1; i < G->n; i++)
				if (G->g[i].used < G->g[lru].used)
					lru = i;
			cu.cuGraphExecDestroy(G->g[lru].exec);
			G->g[lru] = G->g[--G->n];
		}
		CUgraph graph = NULL;
		CUgraphExec exec = NULL;
		struct fwd_graph x = {F->T, F->mb, F->ksel, need, F->n_logits, F->E->batch_invariant,
				      *F->E->pinned, top, NULL, 0, 0, 0, 0};
		if (cu_check(cu.cuStreamBeginCapture(F->g->stream, CU_STREAM_CAPTURE_MODE_RELAXED),
			     "cuStreamBeginCapture", __FILE__, __LINE__))
			return G->off = 1;
		int rc = step_device(F, &x.out, &x.r, &x.l32);
		CUresult er = cu.cuStreamEndCapture(F->g->stream, &graph);
		if (!rc && er == CUDA_SUCCESS)
			er = cu.cuGraphInstantiateWithFlags(&exec, graph, 0);
		if (graph)
			cu.cuGraphDestroy(graph);
		gpu_arena_release(F->A, top); /* the replay uses the same addresses */
		if (rc || er != CUDA_SUCCESS) {
			fprintf(stderr, "<4>dsv32: cuda forward: decode graph capture failed (%d, CUresult "
					"%d): steps run eagerly from now on\n", rc, (int)er);
			if (exec)
				cu.cuGraphExecDestroy(exec);
			G->off = 1;
			return 1;
		}
		x.exec = exec;
		G->g[G->n] = x;
		hit = &G->g[G->n++];
		G->captures++;
	} else {
		G->replays++;
	}
	hit->used = ++G->clock;
	if (cu_check(cu.cuGraphLaunch(hit->exec, F->g->stream), "cuGraphLaunch", __FILE__, __LINE__))
		return -EIO;
	*out = hit->out, *r = hit->r, *l32 = hit->l32;
	return 0;
}

/* Rows one pass can hold in the arena: the scratch of one layer per row (the largest buffers
 * live at once in fwd_layer and its FFN), the step's own per-row buffers and a fixed part (GEMM
 * and attention workspaces, the indexer scores), with a quarter of margin. */
static int64_t fwd_max_rows(const struct fwd_env *E)
{
	const struct dsv32_config *c = E->c;
	int64_t D = c->hidden_size, H = c->num_attention_heads, Hpad = (H + 15) / 16 * 16;
	int64_t Rk = c->kv_lora_rank, rope = c->qk_rope_head_dim, qlr = c->q_lora_rank;
	int64_t Hi = c->index_n_heads, dv = c->v_head_dim, Nq = qlr + 128 + Rk + rope;
	size_t row = (size_t)(5 * D + 3 * Nq + 4 * qlr + 2 * Rk + 2 * H * c->qk_head_dim +
			      3 * Hi * 128 + 8 * Hi + 512 + 8 * c->index_topk +
			      2 * Hpad * (Rk + rope) + 2 * Hpad * Rk + 3 * H * dv + 4 * D);
	size_t ffn = (size_t)(3 * D + 8 * c->intermediate_size);
	if (c->n_routed_experts) {
		size_t moe = cuda_moe_scratch_bytes(E->g, c, 1024) / 1024 + 1;
		ffn = moe > ffn ? moe : ffn;
	}
	row += ffn + (size_t)6 * D + 64 + 4 * 2048; /* x, r, out; metadata incl. a 128K block table */
	const char *cap = getenv("DSV32_CUDA_MAX_ROWS"); /* tests: force passes on small models */
	if (cap && atoll(cap) > 0)
		return atoll(cap);
	size_t fixed = SCORES_BUDGET + ((size_t)128 << 20);
	size_t have = E->arena->region.reserved - E->arena->top;
	if (have <= fixed)
		return 1;
	int64_t n = (int64_t)((have - fixed) / (row + row / 4));
	return n < 1 ? 1 : n > 65535 ? 65535 : n;
}

static int step_pass(const struct fwd_env *E, const struct backend_step *st)
{
	struct fwd F;
	size_t mark = gpu_arena_mark(E->arena);
	int r = fwd_begin(&F, E, st, NULL, NULL);
	if (!r && F.T) {
		gpu_ptr out = 0, res = 0, l32 = 0;
		r = step_graph(&F, &out, &res, &l32);
		if (r == 1) {
			const char *pv = getenv("DSV32_CUDA_PROFILE");
			prof.on = pv && *pv == '1' && !st->dump;
			prof_mark(E->g->stream, "step start");
			r = step_device(&F, &out, &res, &l32);
			prof_step_end();
			prof.on = 0;
		}
		if (!r)
			r = step_finish(&F, out, res, l32);
	}
	if (r)
		gpu_sync(E->g); /* nothing of this step may still run when the arena is reused */
	gpu_arena_release(E->arena, mark);
	fwd_end(&F);
	return r;
}

/* A step larger than the arena holds runs as consecutive passes over its rows in order (pass
 * k: rows [k * max, (k + 1) * max) of the step's row order), each a complete step of its own:
 * a sequence's rows are in position order, so every row still finds the keys of the rows
 * before it in the cache, as in chunked prefill. Sequence indices are kept (sequences with no
 * rows in a pass have n = 0), so dumps name the same sequences. */
int cuda_forward_step(const struct fwd_env *E, const struct backend_step *st)
{
	if (st->mtp && !E->m->has_mtp)
		return -EINVAL;
	int64_t T = 0, max = fwd_max_rows(E);
	for (int64_t i = 0; i < st->n_seqs; i++)
		T += st->seqs[i].n;
	if (T <= max)
		return step_pass(E, st);
	const struct dsv32_config *c = E->c;
	int64_t n = st->n_seqs, V = c->vocab_size, D = c->hidden_size;
	struct backend_seq *sub = calloc((size_t)n, sizeof *sub);
	uint8_t **fl = calloc((size_t)n, sizeof *fl);
	int64_t *done_l = calloc((size_t)n, sizeof *done_l), *done_h = calloc((size_t)n, sizeof *done_h);
	int r = sub && fl && done_l && done_h ? 0 : -ENOMEM;
	for (int64_t i = 0; i < n && !r; i++) { /* explicit flags (NULL means "the last row") */
		const struct backend_seq *s = &st->seqs[i];
		fl[i] = malloc((size_t)(s->n ? s->n : 1));
		if (!fl[i]) {
			r = -ENOMEM;
			break;
		}
		for (int64_t j = 0; j < s->n; j++)
			fl[i][j] = s->flags ? s->flags[j] : (j == s->n - 1 ? BACKEND_ROW_LOGITS : 0);
	}
	for (int64_t t0 = 0; t0 < T && !r; t0 += max) {
		int64_t base = 0; /* global index of sequence i's first row */
		for (int64_t i = 0; i < n; i++) {
			const struct backend_seq *s = &st->seqs[i];
			int64_t a = t0 - base, b = t0 + max - base;
			a = a < 0 ? 0 : a > s->n ? s->n : a;
			b = b < 0 ? 0 : b > s->n ? s->n : b;
			sub[i] = *s;
			sub[i].n = b - a;
			sub[i].tokens = s->tokens + a;
			sub[i].pos = s->pos + a;
			sub[i].flags = fl[i] + a;
			sub[i].logits = s->logits ? s->logits + done_l[i] * V : NULL;
			sub[i].hidden = s->hidden ? s->hidden + done_h[i] * D : NULL;
			sub[i].mtp_hidden = s->mtp_hidden ? s->mtp_hidden + a * D : NULL;
			for (int64_t j = a; j < b; j++) {
				done_l[i] += !!(fl[i][j] & BACKEND_ROW_LOGITS);
				done_h[i] += !!(fl[i][j] & BACKEND_ROW_HIDDEN);
			}
			base += s->n;
		}
		struct backend_step part = *st;
		part.seqs = sub;
		r = step_pass(E, &part);
	}
	for (int64_t i = 0; fl && i < n; i++)
		free(fl[i]);
	free(fl), free(sub), free(done_l), free(done_h);
	return r;
}

int cuda_forward_layer(const struct fwd_env *E, int64_t layer, const struct backend_step *st,
		       float *x, float *r)
{
	const struct dsv32_config *c = E->c;
	if (layer < 0 || layer > c->num_hidden_layers || st->mtp ||
	    (layer == c->num_hidden_layers && !E->m->has_mtp))
		return -EINVAL;
	struct fwd F;
	size_t mark = gpu_arena_mark(E->arena);
	int rc = fwd_begin(&F, E, st, x, r);
	if (!rc && F.T)
		rc = fwd_upload(&F);
	if (!rc && F.T) {
		int D = (int)c->hidden_size, T = F.T;
		int first = layer == 0 || layer == c->num_hidden_layers;
		gpu_ptr dx = take(&F, (size_t)F.Tp * D * 2), dr = take(&F, (size_t)F.Tp * D * 2);
		rc = !dx || !dr ? -ENOMEM : 0;
		if (!rc && !cu_check(cu.cuMemcpyDtoDAsync(dx, F.up[0], (size_t)T * D * 2, E->g->stream),
				     "cuMemcpyDtoDAsync", __FILE__, __LINE__) &&
		    !cu_check(cu.cuMemcpyDtoDAsync(dr, F.up[1], (size_t)T * D * 2, E->g->stream),
			      "cuMemcpyDtoDAsync", __FILE__, __LINE__))
			rc = fwd_layer(&F, layer, &E->m->layers[layer], dx, dr, first);
		else if (!rc)
			rc = -EIO;
		uint16_t *h = rc ? NULL : malloc((size_t)T * D * 2 * 2);
		if (!rc && !h)
			rc = -ENOMEM;
		if (!rc)
			rc = gpu_download(E->g, h, dx, (size_t)T * D * 2);
		if (!rc)
			rc = gpu_download(E->g, h + (size_t)T * D, dr, (size_t)T * D * 2);
		for (size_t i = 0; !rc && i < (size_t)T * D; i++) {
			x[i] = bf16_to_f32(h[i]);
			r[i] = bf16_to_f32(h[(size_t)T * D + i]);
		}
		free(h);
	}
	if (rc)
		gpu_sync(E->g);
	gpu_arena_release(E->arena, mark);
	fwd_end(&F);
	return rc;
}

#endif
