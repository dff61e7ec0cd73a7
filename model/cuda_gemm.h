/*
 * cuda_gemm.h — host launchers of the FP8 block-scaled GEMM (spec §5.4): our decode kernel
 * (kernels_ptx/gemm_fp8_*), cuBLASLt's block-scaled path (driver/cublaslt.h), and the per-shape
 * dispatch between them.
 *
 * Owns: choosing the kernel variant, K split and grid for a shape, checking the shape contract
 * (N % 16 == 0, K % 128 == 0, M <= 64 for the decode kernel), the grouped (MoE) entry point, the cuBLASLt handle of each GPU
 * (opened on first use) and the dispatch table: per (M bucket, N, K) which path is faster,
 * measured by cuda_gemm_tune() at start-up (or recorded by a benchmark). Must not: allocate
 * device memory (callers pass workspaces of the sizes asked for here).
 *
 * Threading: one engine thread owns a GPU; the table is guarded by a mutex all the same.
 */
#ifndef DSV32_CUDA_GEMM_H
#define DSV32_CUDA_GEMM_H

#include "driver/gpu.h"

#ifndef DSV32_NO_CUDA
/* The decode kernel's split of a shape (kernels_ptx/gemm_fp8_stream.cu): K is cut into `chunks`
 * chunks of chunk_blocks 128-wide K blocks (chunks > 1 needs a workspace for the fp32 partials,
 * summed in chunk order); ksplit is 1 (the field is the previous kernel's). Depends only on N,
 * K and the GPU's SM count, never on M: so does the summation order of every output. */
struct gemm_split {
	int ksplit, chunks, chunk_blocks;
};
struct gemm_split cuda_gemm_decode_split(const struct gpu *g, int N, int K);
/* Workspace bytes the decode GEMM needs for M tokens (0 when K is not chunked). */
size_t cuda_gemm_decode_workspace(const struct gpu *g, int M, int N, int K);
/* y[M, ldy] (bf16) = x8[M, K] (e4m3, scales sx[M, K/128]) x W8[N, K]^T (e4m3, scales
 * S[N/128, K/128]), fp32 accumulation promoted per 128-block. M <= 64. ws: a workspace of
 * cuda_gemm_decode_workspace() bytes (may be 0 when that is 0). The exact decode kernels: the
 * streaming kernel (bulk tensor copies into shared memory, persistent grid; mma.sync
 * consumers) or the previous one (v2), one of them per shape (cuda_gemm_set_stream); either is
 * batch invariant: row m's result does not depend on M. */
int cuda_gemm_fp8_decode(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
			 int M, int N, int K, int ldy, gpu_ptr ws);
/* The same GEMM on the streaming kernel whatever the shape: wg 0 its mma.sync consumers (exact,
 * as above), 1 its wgmma consumers (native FP8, the fast mode's CUDA_GEMM_PATH_STREAM_WG; within
 * the wgmma limit of tests/gpu/gemm_fp8_limit.h, K chunks summed by a second launch). */
int cuda_gemm_fp8_stream_wg(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx,
			    gpu_ptr y, int M, int N, int K, int ldy, gpu_ptr ws, int wg);
/* The same GEMM on the swapped kernel (k_gemm_fp8_swap_n*, fast mode: the tokens as wgmma's A,
 * tiles of NT weight rows as B, each over the whole of K, so no K chunks, no workspace and one
 * launch; within the wgmma limit; a row's result independent of M). ks2 1: its cluster form
 * where one fits (two blocks a tile twice as wide, each streaming half of K, the halves' sums
 * added through distributed shared memory: half the token bytes a weight byte; K >= 1024; from
 * 33 rows, where one wave of them fits, in pairs sharing their token boxes: clusters of 4, see
 * cuda_gemm_set_sw_pair), else the one-block form. -ENOTSUP where the ring does not fit.
 * M <= 64. */
int cuda_gemm_fp8_stream_sw(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx,
			    gpu_ptr y, int M, int N, int K, int ldy, int ks2);
/* The swapped kernel's pair forms (two tiles of a cluster sharing their token boxes by
 * multicast, where a pair fits: the one-block form, one tile a block, an even number of tiles,
 * M > 8; and the K-halves form's pairs, clusters of 4, where a grid of them is one wave): 1 on,
 * 0 off, -1 DSV32_GEMM_SW_PAIR from the environment, by default from 17 rows (the K-halves
 * form's pairs from 33). Process-wide. */
void cuda_gemm_set_sw_pair(int on);
/* The K-halves form's pairs as fours (clusters of 8, four tiles of a K half sharing its token
 * boxes), where a quad is taken and a one-wave grid of clusters of 8 fits: 1 on, 0 off, -1
 * DSV32_GEMM_SW_OCT from the environment (default off). Process-wide. */
void cuda_gemm_set_sw_oct(int on);
/* How many clusters of `size` (4 or 8) of the swapped kernel's blocks the device holds at once
 * (0: not known). */
int cuda_gemm_sw_clusters(struct gpu *g, int size);
/* The swapped kernel at one row: 1 the dispatch may take it where the start-up measurement timed
 * it fastest (the default), 0 not, -1 DSV32_GEMM_SW_M1 from the environment. Process-wide. */
void cuda_gemm_set_sw_m1(int on);
/* Diagnosis: with tracing on, each launch of cuda_gemm_fp8_stream_sw records every block's
 * timeline (kernels_ptx/gemm_fp8_stream.cu's SW_TRACE points, %globaltimer ns) in slot
 * (launch count since it was turned on) % CUDA_GEMM_SW_TRACE_SLOTS; _read waits for the GPU and
 * copies all slots out: slots x CUDA_GEMM_SW_TRACE_BLOCKS x CUDA_GEMM_SW_TRACE_POINTS values
 * (n must be that; -ENOENT: no module has the buffer). Process-wide, not thread-safe. */
#define CUDA_GEMM_SW_TRACE_SLOTS 8
#define CUDA_GEMM_SW_TRACE_BLOCKS 160
#define CUDA_GEMM_SW_TRACE_POINTS 9
int cuda_gemm_sw_trace(struct gpu *g, int on); /* on: the buffer zeroed first */
int cuda_gemm_sw_trace_read(struct gpu *g, uint64_t *out, size_t n);
/* The kernel cuda_gemm_fp8_stream_sw would launch for M x N x K (ks2 as there; NULL: a shape it
 * refuses), for tests and the benchmark. */
const char *cuda_gemm_sw_kernel(struct gpu *g, int M, int N, int K, int ks2);
/* 1: cuda_gemm_fp8_decode runs the streaming kernel; 0: the previous kernel (v2, below); -1
 * (the default): per shape by measurement (cuda_gemm.c: mostly v2). Process-wide; tests and the
 * benchmark set it. */
void cuda_gemm_set_stream(int on);
/* The GEMM mode of GPU g: on (until set otherwise) = batch invariant (the mma.sync decode
 * kernels for M <= 64 and grouped decode sizes: a row's result independent of M and exact to
 * the CPU's order per 128-block), off = fast (cuBLASLt and wgmma where they measured faster,
 * within the wgmma limit of tests/gpu/gemm_fp8_limit.h). The forward sets it at each step from
 * its own mode. Process-wide per GPU ordinal. */
void cuda_gemm_set_batch_invariant(const struct gpu *g, int on);
int cuda_gemm_batch_invariant(const struct gpu *g);
/* Whether cuda_gemm_fp8_decode runs the streaming kernel (1) or v2 (0) for this shape under the
 * current setting (the benchmark's label of the dispatch). */
int cuda_gemm_decode_streams(int N, int K);
/* The streaming kernel's 16-row MMA tiles per consumer warp: 1 (8 warps) or 2 (4 warps); same
 * numbers either way, the benchmark compares them; 0: the default (1). Process-wide. */
void cuda_gemm_set_stream_rt(int rt);
/* The streaming kernel's consumers, forced: 0 mma.sync, 2 wgmma (native FP8, within the wgmma
 * limit), -1 the caller's choice (default). Process-wide (tests, the benchmark). */
void cuda_gemm_set_stream_wi(int on);
/* Diagnosis of the streaming kernel (tests, benchmark): fused 1 = the K chunks summed by the
 * kernel's last-arriving warps (when its counts have room), 0 = by a second launch, 2 = not
 * summed (the GEMM launch alone; the output is not written: benchmark only), -1 = the
 * default (the kernel for mma.sync consumers, the second launch for wgmma's); k1 1 = one K
 * chunk. */
void cuda_gemm_set_stream_diag(int fused, int k1);
/* The streaming kernel's wgmma consumers (dense, 9-64 rows): 1 = the tokens' scales of a stage
 * by one bulk tensor copy (same values, same arithmetic), 0 = a 4-byte cp.async each, -1 = the
 * environment (DSV32_GEMM_SX_TMA=0 off; default on). Process-wide (tests, the benchmark). */
void cuda_gemm_set_stream_sx_tma(int on);
/* Programmatic dependent launch of the decode GEMMs (default on; DSV32_GEMM_PDL=0 off):
 * process-wide, for benchmarks. */
void cuda_gemm_set_pdl(int on);
/* The streaming kernel's copies alone for this shape (same units, stages and barriers; no
 * arithmetic, nothing written): what the pipeline reaches by itself (benchmark only). */
int cuda_gemm_stream_copy_only(struct gpu *g, gpu_ptr W, gpu_ptr x8, int M, int N, int K);
/* The one-row kernel (kernels_ptx/gemm_fp8_gemv.cu; the fast mode's CUDA_GEMM_PATH_GEMV): the
 * same GEMM for M <= 8 by a persistent block per SM streaming units of 16 weight rows x a K chunk
 * into shared memory with bulk copies; K split only where the rows alone do not spread evenly
 * over the SMs, its chunks then summed by each tile's last-arriving block (no second launch).
 * The decode kernels' arithmetic (exact products, fp32 promotion per K block), its own order:
 * within fp32 summation order of the CPU, batch invariant among M <= 8. ws:
 * cuda_gemm_decode_workspace() bytes. -EINVAL: a shape it does not take
 * (M > 8, N % 16, N > 65536). */
int cuda_gemm_fp8_gemv(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
		       int M, int N, int K, int ldy, gpu_ptr ws);
/* The previous decode kernel (kernels_ptx/gemm_fp8_decode.cu, register loads): the exact
 * decode kernel of most shapes (cuda_gemm_set_stream -1). */
size_t cuda_gemm_decode_v2_workspace(const struct gpu *g, int M, int N, int K);
int cuda_gemm_fp8_decode_v2(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx,
			    gpu_ptr y, int M, int N, int K, int ldy, gpu_ptr ws);

/* A 2-D tensor map over an e4m3 matrix [rows, K] at base (row stride K bytes): boxes of one K
 * block (128 bytes) x box_rows rows, 128-byte swizzle, L2 promotion 256 B, zero fill past the
 * end — the operand maps of the TMA GEMMs (the streaming kernel, model/cuda_gemm_wgmma.c).
 * Encoded maps are kept for reuse (a decode step repeats its GEMMs on the same buffers). 0,
 * -ENOTSUP (no cuTensorMapEncodeTiled in this driver), -EIO. */
int cuda_gemm_tmap_2d(CUtensorMap *m, gpu_ptr base, int rows, int K, int box_rows);

/* ---- cuBLASLt and the dispatch --------------------------------------------------------- */

/* Workspace bytes of cuda_gemm_fp8 / cuda_gemm_fp8_lt for M tokens: the transposed activation
 * scales and cuBLASLt's (cublaslt_gemm_fp8_workspace: 32 MiB and room for y^T), or the decode
 * kernel's chunk partials, whichever is more. */
size_t cuda_gemm_fp8_workspace(const struct gpu *g, int M, int N, int K);

/* The same GEMM as cuda_gemm_fp8_decode through cuBLASLt (weight scales S as
 * weight_scale_inv [ceil(N/128), K/128]; -ENOTSUP unless K/128 % 4 == 0 — true for every V3.2
 * matrix — because cuBLASLt pads the scales' leading dimension to 4).
 * Transposes sx into the workspace first (cuBLASLt reads sx[K/128, M]). 0, -ENOTSUP when
 * cuBLASLt is absent or has no algorithm for the shape, -EINVAL, -EIO. cuBLASLt 13.1 on the
 * H200 refused M = 1, 2, 5, 13 and accepted 8, 16, 32, 64, 128, 256, 4096: a prefill caller
 * pads M to a multiple of 8 (rows of x8/sx/y it owns). */
int cuda_gemm_fp8_lt(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
		     int M, int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes);

enum cuda_gemm_path {
	CUDA_GEMM_PATH_NONE = 0, /* not measured: the default rule applies */
	CUDA_GEMM_PATH_DECODE,   /* the decode kernel (M <= 64) */
	CUDA_GEMM_PATH_CUBLASLT, /* cuBLASLt VEC128 x BLK128x128 */
	CUDA_GEMM_PATH_WGMMA,    /* cuda_gemm_fp8_wgmma (M > 64; model/cuda_gemm_wgmma.h) */
	CUDA_GEMM_PATH_STREAM_WG, /* the streaming kernel's wgmma consumers (M <= 64, fast mode) */
	CUDA_GEMM_PATH_STREAM_SW, /* the swapped kernel, no K split (M <= 64, fast mode) */
	CUDA_GEMM_PATH_STREAM_SW2, /* its cluster form (K halves over two blocks) */
	CUDA_GEMM_PATH_GEMV,	   /* the one-row kernel (M <= 8, fast mode; cuda_gemm_fp8_gemv) */
	CUDA_GEMM_PATHS
};

/* Dispatch bucket of M: 1 (one token: batch-1 decode, measured on its own; without its own entry
 * it takes bucket 8's), 8, 16, 32, 64 (the decode kernel's variants), then powers of two. */
int cuda_gemm_m_bucket(int M);
/* The path cuda_gemm_fp8 takes for (M, N, K) in g's current mode: the measured entry for M's
 * bucket (cuda_gemm_tune, cuda_gemm_path_set), else in the fast mode the per-shape defaults
 * measured by run 10's benchmark (cuda_gemm.c), else the default rule (M <= 64: the exact decode
 * kernel; larger M: the wgmma kernel where N % 64 == 0, else cuBLASLt). STREAM_WG, GEMV never
 * in the batch-invariant mode. A measured entry's pick is made here, among the paths the
 * switches (cuda_gemm_set_swap, cuda_gemm_set_gemv) allow. */
enum cuda_gemm_path cuda_gemm_path_for(const struct gpu *g, int M, int N, int K);
/* The path's short name in the start-up log and the benchmarks ("dec", "wg", "sw", "sw2",
 * "gemv", "lt", "wgmma"; "-" for NONE). */
const char *cuda_gemm_path_name(enum cuda_gemm_path p);
/* Where the start-up measurement picked STREAM_SW / SW2: n >= 2 its pick on matrices of at
 * least n MB (N x K bytes / 2^20), the fastest other path it measured below; 1 its pick
 * everywhere; 0 never; -1: DSV32_GEMM_SWAP=n in the environment, else the default, 64 (session 9;
 * before it, 200: run 26 had the step faster at batch 16 / 64 with it only on the 264 MB dense
 * gate|up; run 23 slower with it everywhere; cuda_gemm.c swap_on). Process-wide (the CUDA
 * forward's switch DSV32_GEMM_SWAP, for in-process A/B). */
void cuda_gemm_set_swap(int on);
/* The one-row kernel in the fast mode: bit 0 (1) for the dense GEMMs at M <= 8
 * (CUDA_GEMM_PATH_GEMV: a candidate of the start-up measurement, taken where it measured
 * fastest; without the bit, where it was measured the dispatch takes the fastest other path: an
 * in-process A/B), bit 1 (2) for the grouped GEMMs of <= 32 rows (the MoE block at 1-3 tokens); 3
 * both, 0 neither; -1: DSV32_GEMM_GEMV=n in the environment, else the default, 2 (grouped only;
 * runs 26 / 27).
 * Process-wide (the CUDA forward's switch DSV32_GEMM_GEMV). */
void cuda_gemm_set_gemv(int on);
/* Records the path for (bucket(M), N, K) in g's current mode, replacing an earlier entry. */
void cuda_gemm_path_set(const struct gpu *g, int M, int N, int K, enum cuda_gemm_path path);
/* Times the candidates of g's current mode on these operands at M = bucket(M) rows (x8/sx/y
 * must hold that many) — M <= 64: the exact decode kernel, in the fast mode also STREAM_WG,
 * from 2 rows STREAM_SW / SW2, at most 8 GEMV; M > 64: the wgmma kernel; cuBLASLt
 * always — the fastest of 9 bursts of 4 launches back to back each after a warm-up (as a step
 * runs them), and records every time for the bucket (the dispatch takes the fastest its
 * switches allow: an in-process A/B); cuBLASLt for M <= 64 in the
 * batch-invariant mode only if CUDA_GEMM_LT_FOR_DECODE (cuda_gemm.c; off: its results miss the
 * CPU check, docs/PERF.md). flush: when non-zero, flush_bytes (>= 64 MB) are rewritten before
 * every timed launch so the 60 MB L2 does not serve the weights (cold, as in a decode step that
 * streams every layer). us (may be NULL): [CUDA_GEMM_PATHS] medians in microseconds by path,
 * < 0 where a path was not timed or cannot run. 0, or -EIO when no path ran. */
int cuda_gemm_tune(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
		   int M, int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes, gpu_ptr flush,
		   size_t flush_bytes, float *us);
/* cuda_gemm_tune over n weights of one shape (W[i], S[i]: e.g. that matrix in every layer),
 * each launch on the next in turn so the L2 serves no repeat when they are many; y row stride
 * N. For the start-up measurement (model/cuda_gemm_tune.c). */
int cuda_gemm_tune_rotate(struct gpu *g, const gpu_ptr *W, const gpu_ptr *S, int n, int M,
			  int N, int K, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, gpu_ptr ws,
			  size_t ws_bytes, float *us);
/* y = the FP8 GEMM by the path above; wgmma falls back to cuBLASLt where it cannot run (ldy
 * odd, no tensor-map entry point), cuBLASLt to the decode kernel (64 rows at a time) where it
 * refuses the shape. ws: cuda_gemm_fp8_workspace(g, M, N, K) bytes. */
int cuda_gemm_fp8(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int M,
		  int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes);
/* Closes g's cuBLASLt handle and forgets its table (before gpu_close): the GPU's state is per
 * ordinal, so where several users of one GPU each took a reference (cuda_gemm_retain: the
 * stages of a pipeline on one GPU, a test's two backends), only the last one's close does. */
void cuda_gemm_close(struct gpu *g);
void cuda_gemm_retain(struct gpu *g);
/* ---- grouped GEMM (MoE experts) ------------------------------------------------------------ */

/* Group e (e = 0 .. G-1) multiplies rows [off[e], off[e+1]) of x8/sx/y by its own weight:
 *   y[r, :N] = x8[r] x W_e^T with W_e = ((uint64_t *)w_tab)[e] (e4m3 [N, K]) and its scales
 *   S_e = ((uint64_t *)s_tab)[e] (fp32 [N/128, K/128]).
 * w_tab, s_tab: device arrays [G] of device addresses; off: device int32 [G + 1] (ascending,
 * off[0] = 0); the counts live on the device (graph capture needs no host sync), max_rows is a
 * host bound on off[G] (rows of x8, sx and y). A group with no rows reads none of its weights.
 * Decode-sized (max_rows <= 64, or < 64 rows per group on average): the streaming kernel
 * (G <= 8192; its group weight maps are made on the device by one small launch first), and
 * then per row the numbers equal the streaming dense kernel's (cuda_gemm_fp8 with
 * cuda_gemm_set_stream(1)) for the same weight, bit for bit;
 * in the fast mode at <= 32 rows with the one-row kernel on (cuda_gemm_set_gemv): its grouped
 * form (kernels_ptx/gemm_fp8_gemv.cu; exact products, fp32 promotion per 128 block);
 * larger: the wgmma kernel (model/cuda_gemm_wgmma.h; promotion per 128 block as well, another
 * summation order and Hopper wgmma's coarser FP8 accumulation; CUDA_GEMM_WGMMA_GROUPED in
 * cuda_gemm.c). ws: cuda_gemm_fp8_grouped_workspace() bytes (the streaming or one-row kernel's). */
size_t cuda_gemm_fp8_grouped_workspace(const struct gpu *g, int max_rows, int G, int N, int K);
int cuda_gemm_fp8_grouped(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
			  gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K, int ldy,
			  gpu_ptr ws, size_t ws_bytes);
/* cuda_gemm_fp8_grouped of fused gate|up weights (N = 2I, gate columns first; I % 128 == 0)
 * with SwiGLU and act_quant in the K-chunk sum (k_gemm_stream_reduce_swiglu): h8 e4m3 [rows, I]
 * and hs fp32 [rows, I/128] = k_moe_swiglu_quant (kernels_ptx/moe_block.cu) of
 * cuda_gemm_fp8_grouped's bf16 output, bit for bit in either mode (the same GEMM kernel and
 * summation order; the bf16 output is never written). -ENOTSUP where cuda_gemm_fp8_grouped would
 * not run the streaming kernel or K is not chunked (the caller runs the GEMM, then the SwiGLU).
 * ws: cuda_gemm_fp8_grouped_workspace() bytes. *one_row (when one_row != NULL): 1 where it ran
 * the one-row kernel (grouped, with off complete before its dependents start: see
 * cuda_gemm_fp8_grouped_combine's off_early), else 0. */
int cuda_gemm_fp8_grouped_swiglu(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
				 gpu_ptr x8, gpu_ptr sx, gpu_ptr h8, gpu_ptr hs, int max_rows,
				 int N, int K, gpu_ptr ws, size_t ws_bytes, int *one_row);
/* cuda_gemm_fp8_grouped of the MoE down projection with the combine in the K-chunk sum
 * (k_gemm_stream_reduce_combine): the rows of x8/sx are the R = T * topk routed rows in
 * expert-sorted order then the T shared-expert rows (max_rows = R + T), and
 *   y[t, :N] = bf16( Σ_k e[perm[t * topk + k]] · wts[t, k] + e[R + t] )
 * (e: the GEMM's bf16 rows; one fp32 multiply and one add each in pick order, no FMA) =
 * k_moe_combine (kernels_ptx/moe_permute.cu) of cuda_gemm_fp8_grouped's output, bit for bit in
 * either mode; y bf16 [T, N]. wts fp32 [T, topk], perm int32 [T * topk]. -ENOTSUP where
 * cuda_gemm_fp8_grouped would not run the streaming kernel or K is not chunked. ws:
 * cuda_gemm_fp8_grouped_workspace(g, R + T, G, N, K) bytes. off_early 1: the caller
 * guarantees that off was complete before the kernel launched just before started (e.g.
 * that kernel is the SwiGLU of a cuda_gemm_fp8_grouped_swiglu that reported *one_row): the
 * one-row kernel then streams its weights while that kernel runs (gemm_fp8_gemv.cu
 * GV_OFF_EARLY); 0: no such guarantee. */
int cuda_gemm_fp8_grouped_combine(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off,
				  int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int T, int topk,
				  gpu_ptr wts, gpu_ptr perm, int N, int K, gpu_ptr ws,
				  size_t ws_bytes, int off_early);
/* The MoE block after its router where both grouped GEMMs run on the one-row kernel (1-3
 * tokens, the fast mode): cuda_gemm_fp8_grouped_swiglu then cuda_gemm_fp8_grouped_combine (the
 * gate|up weights w13 [2I, D], the down weights w2 [D, I], the same rows, offsets and picks) in
 * one launch, k_moe_gemv_block (gemm_fp8_gemv.cu: a persistent grid whose producer streams the
 * down weights straight after the gate|up ones; the SwiGLU and the combine between grid-wide
 * arrivals): the same units and sums, so the same h8, hs and y, bit for bit. ws: room for
 * both GEMMs' fp32 sums apart, cuda_gemm_fp8_grouped_workspace of the one plus the other's
 * (+ 256), else -ENOTSUP. -ENOTSUP where it does not run (another
 * mode or size, DSV32_CUDA_MOE_GEMV_BLOCK=0 / cuda_gemm_set_moe_block(0)): the caller runs
 * the two. */
/* rt (not NULL, T = 1): the block routes its token itself from the scores fp32 [2][G - 1] of
 * k_moe_gate_logits1s (k_moe_gate_route1s without its last block's routing): each of its blocks
 * selects (k_moe_gate_route1s's numbers) and builds its slices, and it writes idx, wts, counts,
 * off, perm and src as that router would. With rt->x_ready (not 0), where that router was
 * launched just before it with the same x_ready: k_moe_gemv_block_r1, each of whose blocks streams
 * the shared expert's gate|up weights from its start, quantises the token's row x (bf16 [D],
 * the router's input; x8 and sx are not read) once the router has set x_ready, computes the
 * shared expert's gate|up while the router runs, then selects (k_moe_gate_route1s's numbers)
 * and builds its slices; it writes idx, wts, counts, off, perm and src as that router would.
 * rt->form 2 (with x_ready): k_moe_gemv_block_r1h, whose stream also waits for x_ready. */
struct cuda_moe_route1 {
	gpu_ptr scores, idx, counts, src;
	float route_scale;
	int topk_group, norm_topk_prob;
	gpu_ptr x, x_ready; /* x_ready: 0, or cuda_gemm_fp8_moe_block_x_ready's, given to the router */
	int form;	    /* with x_ready: 1 the _r1 forms, 2 the _r1h (cuda_gemm_moe_block_early) */
};
/* The flag (u32) k_moe_gate_logits1s sets once x is complete and the one-token block routed in
 * one launch waits for before it reads x (and resets): gv_xready of an arrival-count set taken
 * for it (as a one-row launch takes one). 0, or -ENOENT where the kernels have no such flag.
 * The router given a flag must be followed by the block given the same one (the reset), or,
 * where that launch fails, by a clear of the flag. */
int cuda_gemm_fp8_moe_block_x_ready(struct gpu *g, gpu_ptr *flag);
int cuda_gemm_fp8_moe_block(struct gpu *g, gpu_ptr w13_tab, gpu_ptr s13_tab, gpu_ptr w2_tab,
			    gpu_ptr s2_tab, gpu_ptr off, int G, gpu_ptr x8, gpu_ptr sx, gpu_ptr h8,
			    gpu_ptr hs, gpu_ptr y, int T, int topk, gpu_ptr wts, gpu_ptr perm, int D,
			    int I, gpu_ptr ws, size_t ws_bytes, const struct cuda_moe_route1 *rt);
/* 1 where cuda_gemm_fp8_moe_block runs at these sizes and routes one token itself (T = 1, G - 1
 * = 256 experts, topk <= 32; DSV32_CUDA_MOE_BLOCK_ROUTE=0 / cuda_gemm_set_moe_block_route(0):
 * never), else 0. */
int cuda_gemm_fp8_moe_block_routes(const struct gpu *g, int T, int topk, int G, int D, int I,
				   size_t ws_bytes);
/* Process-wide (-1: DSV32_CUDA_MOE_BLOCK_ROUTE, read at the first call; default 1). */
void cuda_gemm_set_moe_block_route(int on);
/* The kernel cuda_gemm_fp8_moe_block would launch for these sizes (ws_bytes of workspace; early:
 * with an rt that has x_ready, 2 the held forms), or NULL where it would return -ENOTSUP. */
const char *cuda_gemm_fp8_moe_block_kernel(const struct gpu *g, int T, int topk, int G, int D,
					   int I, size_t ws_bytes, int early);
/* Whether the one-token block that routes itself runs on the _r1 forms (rt->x_ready given; the
 * shared expert's gate|up streamed and computed while the router runs; 2: on the _r1h forms,
 * whose stream waits for x to be complete, i.e. starts with the router): process-wide (-1:
 * DSV32_CUDA_MOE_BLOCK_EARLY, read at the first call; default 0: on the H200 the block is ~2 us
 * faster alone but a model step ~4-6 us slower, for 1 (sessions 30-31) and 2 (session 39),
 * docs/PERF.md). */
void cuda_gemm_set_moe_block_early(int on);
int cuda_gemm_moe_block_early(void);
/* Process-wide (-1: DSV32_CUDA_MOE_GEMV_BLOCK, read at the first call; default 1). */
void cuda_gemm_set_moe_block(int on);

/* The streaming kernel whatever max_rows (tests and the benchmark). */
int cuda_gemm_fp8_grouped_stream(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
				 gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K,
				 int ldy, gpu_ptr ws, size_t ws_bytes);
#endif

#endif
