/*
 * cuda_fwd.h — what the files of the CUDA forward pass share (private to them: model/cuda_forward.c,
 * cuda_fwd_ops.c, cuda_fwd_attn.c, cuda_fwd_ffn.c; the public entry points are in cuda_forward.h).
 *
 * Owns: the step's state (struct fwd: its rows, the uploaded metadata, the profile's tag), the
 * launch / scratch / error macros every op uses, and the ops' prototypes:
 *   cuda_forward.c   the step: metadata, embedding, layers, final norm and head, the decode
 *                    graphs, passes, the profile (fwd_prof_mark);
 *   cuda_fwd_ops.c   the row ops: RMSNorm (+ act_quant), act_quant, FP8 GEMM, bf16 linear,
 *                    RoPE, Hadamard; scratch (fwd_take), dumps;
 *   cuda_fwd_attn.c  one decoder layer (§3.2): the attention block (projections, indexer,
 *                    selection, q absorption, MLA, W_UV, o_proj), then its FFN;
 *   cuda_fwd_ffn.c   the FFN blocks: the dense SwiGLU MLP and the MoE block.
 * Must not: be included outside these files.
 */
#ifndef DSV32_CUDA_FWD_H
#define DSV32_CUDA_FWD_H

#include "model/cuda_forward.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>

#define SCORES_BUDGET ((size_t)256 << 20) /* bytes of indexer scores per row chunk */

/* Rows above which the bf16 products (q absorption, W_UV, bf16 linears) run on the tensor cores
 * (kernels_ptx/fwd_mma.cu, fp32 sums in the MMA's order) instead of the CUDA-core kernels in
 * the CPU's exact order (latency-optimal for a few rows, compute-bound for many): 8 in the fast
 * mode, never in the batch-invariant one. DSV32_CUDA_MMA_ROWS overrides both (tests). */
#define MMA_ROWS fwd_mma_rows(F)

struct fwd;
int fwd_mma_rows(const struct fwd *F);

/* Steps of more rows than this launch the glue kernels by programmatic dependent launch (unless
 * DSV32_CUDA_FWD_PDL says otherwise). Run 18, bench model graphs, every glue kernel plainly
 * against by PDL: batch 1 -32 / -25 / -24 us at 1K / 32K / 128K (no single kernel gained from
 * it), 2: -189 / -152 (1K / 32K), 4: -99 / -224, 8: -36 / -46, 16: -58 / -13. */
#define FWD_PDL_ROWS 16
/* Steps of this many rows or more fork the attention's query branch before the index scores,
 * fewer after them (DSV32_CUDA_FWD_FORK unset). Run 18, before against after: batch 1 +24 / +65
 * us at 32K / 128K, batch 16 -45 / -140. */
#define FWD_FORK_EARLY_ROWS 16
/* One-row steps whose rows have fewer keys than this fork the attention's query branch right
 * after k_fwd_qkv_norms, beside the whole index chain (DSV32_CUDA_QB_EARLY unset). Run 25,
 * bench model --ab DSV32_CUDA_QB_EARLY=1 (then named QB_CAP=132), batch 1: -25.3 us at 32K,
 * +23.0 at 128K (there the top-k is k_topk_cl16, a cluster of 16 CTAs: a whole GPC's SMs). */
#define FWD_QB_EARLY_KEYS 65536
/* From that many keys one-row steps of the fast mode run q_b and the indexer's q_b as one GEMM
 * instead, the absorption forked beside the top-k (DSV32_CUDA_QB_FUSE unset; run 27 --ab
 * DSV32_CUDA_QB_FUSE=1, batch 1: -21.0 / -19.3 us at 64K, -20.0 / -28.6 at 96K, -2.4..-11.4 at
 * 128K in six; +10.0 / -0.9 at 32K, where the early fork stays). */

/* 1: M > 64 rows may go to the large-M GEMM and MoE paths whole (the fast mode). */
#define LARGE_M(F) (!(F)->E->batch_invariant)
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
	int n_keep;                /* main step: rows flagged BACKEND_ROW_KEEP */
	int mtp_kept;              /* MTP step: h_i from the kept rows (fwd_env.kept) */
	int64_t keep_off;          /* this pass's first kept row among the step's */
	int64_t row_off;           /* this pass's first row among the step's (a pipeline stage's
				    * rows in and out: fwd_model.in_x ..) */
	/* device metadata, int32 */
	gpu_ptr tok, pos, slot, nkeys; /* [T] */
	gpu_ptr bt;                /* [T, mb] the row's sequence's block table */
	gpu_ptr lrows, hrows;      /* [n_logits], [n_hidden] row indices */
	gpu_ptr krows;             /* main: [n_keep] the KEEP rows; MTP kept: [T] each row's kept row */
	gpu_ptr up[2];             /* bf16 [T, D] host inputs: MTP h_i, or teacher forcing x, r */
	int ksel;                  /* selected keys per row: min(index_topk, pow2 >= max_n) */
	const char *tag;           /* the profile's name for the next launches (NULL: the kernel's) */
	int side_open;             /* work on the side stream that the engine stream has not joined */
	size_t meta_bytes, o_pos, o_slot, o_nk, o_bt, o_lr, o_hr, o_kr, o_up, up_bytes; /* pinned */
};
#define TAKE(var, bytes)                          \
	gpu_ptr var = fwd_take(F, (size_t)(bytes));   \
	if (!var)                                 \
		return -ENOMEM

/* Launches kernel name (the grid, block bx threads, dynamic shared memory smem, arguments ...)
 * on the step's stream and marks it in the profile; returns from the caller on failure.
 * LAUNCH_PDL: by programmatic dependent launch (fwd_launch), for the kernels that wait in
 * pdl_wait (kernels_ptx/fwd_lin.cuh) before they read an activation or write anything;
 * LAUNCH_PDL_ANY: the same also in steps of few rows (FWD_PDL_ROWS), for the kernels that load
 * their weights before the wait (run 21: faster so at one row, where the others were slower). */
#define LAUNCH_AS(pdl, name, gx, gy, gz, bx, smem, ...)                                          \
	do {                                                                                     \
		void *a_[] = {__VA_ARGS__};                                                      \
		int r_ = fwd_launch(F, name, (unsigned)(gx), (unsigned)(gy), (unsigned)(gz),      \
				    (unsigned)(bx), (unsigned)(smem), a_, GPU_NARGS(a_), pdl);    \
		if (r_)                                                                          \
			return r_;                                                               \
	} while (0)
#define LAUNCH(name, gx, gy, bx, smem, ...) LAUNCH_AS(0, name, gx, gy, 1, bx, smem, __VA_ARGS__)
#define LAUNCH_PDL(name, gx, gy, bx, smem, ...) LAUNCH_AS(1, name, gx, gy, 1, bx, smem, __VA_ARGS__)
#define LAUNCH_PDL_ANY(name, gx, gy, bx, smem, ...) LAUNCH_AS(2, name, gx, gy, 1, bx, smem, __VA_ARGS__)
/* A launch with a z grid dimension, no dynamic shared memory. */
#define LAUNCH3(name, gx, gy, gz, bx, ...) LAUNCH_AS(0, name, gx, gy, gz, bx, 0, __VA_ARGS__)
#define LAUNCH3_PDL(name, gx, gy, gz, bx, ...) LAUNCH_AS(1, name, gx, gy, gz, bx, 0, __VA_ARGS__)

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

static inline int fwd_round8(int x) { return (x + 7) / 8 * 8; }

/* k_fwd_lin_stream's dynamic shared memory limit: 4 rows of 14336 (eh_proj's input) */
#define LIN_STREAM_SMEM (4 * 14336 * 2)

/* k_fwd_head_mma<WM> (kernels_ptx/lm_head.cu): names by log2 of warps along M, and the dynamic
 * shared memory of WM warps. */
extern const char *const fwd_head_mma_names[3];
static inline unsigned fwd_head_mma_smem(int wm) { return 3u * (32u * (unsigned)wm + 128u) * 72u * 2u; }

enum dump_kind { DUMP_BF16, DUMP_F32, DUMP_I32 };

/* cuda_forward.c */
void fwd_prof_mark(void *stream, const char *name);
int fwd_prof_on(void); /* 1: this step is profiled (eager, one stream) */

/* cuda_fwd_ops.c */
int fwd_fail(const char *what, int r);
/* pdl: by programmatic dependent launch (gpu_launch_pdl) where the switch DSV32_CUDA_FWD_PDL lets
 * it (by default in steps of more than one row; else the kernel waits for the previous one
 * whole); a kernel named in DSV32_CUDA_FWD_SKIP is not launched (timing by subtraction);
 * n_args: args' length (gpu_launch_n) */
int fwd_launch(struct fwd *F, const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
	       unsigned smem, void **args, int n_args, int pdl);
gpu_ptr fwd_take(struct fwd *F, size_t bytes);
/* 1: name is one of DSV32_CUDA_FWD_SKIP's comma-separated names (not to be run: timing only) */
int fwd_skipped(const struct fwd *F, const char *name);
int fwd_fused(const struct fwd *F); /* 0: DSV32_CUDA_UNFUSED=1 */
int fwd_dump_rows(struct fwd *F, const char *name, int64_t layer, gpu_ptr p, enum dump_kind k,
		  int64_t ld, int64_t width, int t0, int n);
int fwd_dump_all(struct fwd *F, const char *name, int64_t layer, gpu_ptr p, enum dump_kind k,
		 int64_t ld, int64_t width);
int fwd_rmsq(struct fwd *F, gpu_ptr x, int ldx, gpu_ptr res, gpu_ptr w, gpu_ptr out, int ldo,
	     int dim, gpu_ptr q, gpu_ptr qs);
int fwd_rms(struct fwd *F, gpu_ptr x, int ldx, gpu_ptr res, gpu_ptr w, gpu_ptr out, int ldo,
	    int dim);
int fwd_quant(struct fwd *F, gpu_ptr x, gpu_ptr q, gpu_ptr s, int rows, int K);
int fwd_gemm(struct fwd *F, const struct fwd_fp8 *W, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int M,
	     int ldy);
int fwd_lin(struct fwd *F, gpu_ptr W, gpu_ptr x, int ldx, gpu_ptr y32, gpu_ptr y16, int ldy,
	    int M, int D, int V);
int fwd_rope(struct fwd *F, gpu_ptr x, int heads, long long ld_token, int ld_head, int off,
	     int interleaved);
int fwd_hadamard(struct fwd *F, gpu_ptr x, int rows);

/* cuda_fwd_attn.c; first: 0, or one of these */
int fwd_side_close(struct fwd *F); /* the engine stream waits for the side stream's open work */
#define FWD_FIRST 1       /* the first layer of its stack: the residual stream starts as x */
#define FWD_FIRST_EMBED 2 /* the same with x not yet embedded (from the step's tokens) */
int fwd_layer(struct fwd *F, int64_t layer, const struct fwd_layer *L, gpu_ptr x, gpu_ptr r,
	      int first);

/* cuda_fwd_ffn.c */
int fwd_mlp(struct fwd *F, const struct fwd_fp8 *w13, const struct fwd_fp8 *w2, gpu_ptr f,
	    gpu_ptr f8, gpu_ptr fs, gpu_ptr y, int M);
int fwd_moe(struct fwd *F, int64_t layer, const struct fwd_layer *L, gpu_ptr f, gpu_ptr y);

#endif
#endif
