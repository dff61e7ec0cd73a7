/*
 * cmd_bench_gemm.c — `dsv32 bench gemm`: the FP8 block-scaled GEMMs at DeepSeek-V3.2's real
 * shapes on the GPU, ours side by side with cuBLASLt's block-scaled path (activations
 * VEC128_32F x weights BLK128x128_32F, through model/cuda_gemm.h), against the HBM read limit
 * measured in the same run, and which is faster. "Ours" is what the engine runs: cuda_gemm_fp8,
 * the fast mode's dispatch after the start-up measurement the engine makes (cuda_gemm_tune_rotate
 * per shape and M bucket; --no-tune: the built-in defaults; --shape NxK: that dense shape
 * only, any N x K), its path in the "path" column;
 * beside it each kernel forced: the streaming decode kernel (mma.sync, exact) and the previous
 * register-load kernel "v2" for M <= 64, the streaming kernel's wgmma consumers ("wg", K chunks
 * summed by a second launch; "wg_fu" summed in the kernel), the wgmma kernel above 64 rows
 * (model/cuda_gemm_wgmma.h, the prefill engineer's), and cuBLASLt. The cuBLASLt time includes
 * the transpose of the activation scales it needs.
 *
 * Then the grouped expert GEMM (cuda_gemm_fp8_grouped; --grouped: only that): 256 experts of the
 * real shapes (fused gate|up 4096x7168, down 7168x2048), each token routed to 8 distinct
 * experts at random, and the shared expert as group 256 on every token (the MoE block's
 * layout), tokens per step 1/16/64/256; TB/s of the touched experts' weights
 * (experts with no rows are not read), over 8 routings in turn so the L2 does not serve
 * repeats: the dispatch, and each kernel forced (streaming with mma.sync consumers, wgmma, the
 * streaming kernel's wgmma consumers with the chunks summed apart or in the kernel), and for
 * gate|up the dispatch with SwiGLU in the chunk sum (cuda_gemm_fp8_grouped_swiglu).
 *
 * Weights are synthetic, generated on the GPU (random e4m3 codes, power-of-two block scales,
 * never zeros), and rotated among enough copies (>= 1 GiB in all) that the 60 MB L2 never
 * serves a repeat: every launch streams its weights from HBM. Time = median of trials of
 * CUDA-event-timed launch sequences. --sustain MS: at M = 128 and 4096, ours and cuBLASLt
 * each also launched back to back for about MS ms, the rate and the energy a launch (NVML) at
 * the clocks the power cap leaves a long prefill.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/cublaslt.h"
#include "driver/gpu.h"
#include "model/cuda_gemm.h"
#include "model/cuda_gemm_wgmma.h"
#include "tools/cli/bench_gpu.h"
#include "tools/cli/cli.h"
#include "tools/cli/bench_sort.h"

#ifdef DSV32_NO_CUDA
int bench_gemm(int argc, char **argv)
{
	fprintf(stderr, "dsv32 bench gemm: this build has no CUDA support (static or no toolkit)\n");
	return 1;
}
#else

/* Milliseconds of `reps` runs of fn(i), median of `trials`. */
typedef int (*launch_fn)(struct gpu *g, void *ctx, int i);
static float time_ms(struct gpu *g, launch_fn fn, void *ctx, int reps, int trials)
{
	CUevent ev[2];
	if (gpu_timing_events(ev))
		return -1;
	float t[32], ms = -1;
	trials = trials > 32 ? 32 : trials;
	for (int i = 0; i < reps; i++) /* warm-up: module load, clocks */
		if (fn(g, ctx, i))
			goto out;
	for (int k = 0; k < trials; k++) {
		cu.cuEventRecord(ev[0], g->stream);
		for (int i = 0; i < reps; i++)
			fn(g, ctx, i);
		cu.cuEventRecord(ev[1], g->stream);
		if (cu_check(cu.cuEventSynchronize(ev[1]), "cuEventSynchronize", __FILE__, __LINE__))
			goto out;
		cu.cuEventElapsedTime(&t[k], ev[0], ev[1]);
		t[k] /= (float)reps;
	}
	qsort(t, (size_t)trials, sizeof *t, bench_cmp_float);
	ms = t[trials / 2];
out:
	gpu_timing_events_free(ev);
	return ms;
}

/* --sustain: `fn` launched back to back for about sustain_ms (per_ms a launch, as timed above):
 * ms a launch over that run, and the GPU's energy over it in *mj (NVML; -1 where absent). The
 * timings above start from a GPU idle between shapes, which the power controller lets run
 * above its cap for ~100 ms; a prefill of many layers runs at the capped clocks this sees. */
static float time_sustained(struct gpu *g, launch_fn fn, void *ctx, float per_ms, int sustain_ms,
			    int *launches, long long *mj)
{
	CUevent ev[2];
	float ms = -1;
	int n = per_ms > 0 ? (int)(sustain_ms / per_ms) + 1 : 1;
	n = n > 1000000 ? 1000000 : n;
	*launches = n, *mj = -1;
	if (gpu_timing_events(ev))
		return -1;
	const long long e0 = bench_energy_mj(g);
	cu.cuEventRecord(ev[0], g->stream);
	for (int i = 0; i < n; i++)
		if (fn(g, ctx, i))
			goto out;
	cu.cuEventRecord(ev[1], g->stream);
	if (cu_check(cu.cuEventSynchronize(ev[1]), "cuEventSynchronize", __FILE__, __LINE__))
		goto out;
	const long long e1 = e0 < 0 ? -1 : bench_energy_mj(g);
	*mj = e1 < 0 ? -1 : e1 - e0;
	cu.cuEventElapsedTime(&ms, ev[0], ev[1]);
	ms /= (float)n;
out:
	gpu_timing_events_free(ev);
	return ms;
}

/* One --sustain line: TFLOP/s of the sustained run, its energy a launch and the mean power. */
static void print_sustained(const char *who, float ms, int n, long long mj, double flops)
{
	if (ms <= 0) {
		printf(" %s failed;", who);
		return;
	}
	printf(" %s %.1f us %.0f TFLOP/s", who, ms * 1e3, flops / (ms * 1e-3) / 1e12);
	if (mj > 0)
		printf(" (%.3f J, %.2f pJ/FLOP, %.0f W)", mj / 1e3 / n, mj * 1e-3 / n / flops * 1e12,
		       mj / ((double)ms * n));
	printf(";");
}

struct gemm_ctx {
	gpu_ptr w, s, x, sx, y, ws;
	size_t w_bytes, s_bytes, ws_bytes;
	int copies, M, N, K, ks2;
};

static int launch_gemm(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_fp8_decode(g, c->w + (size_t)k * c->w_bytes, c->s + (size_t)k * c->s_bytes,
				    c->x, c->sx, c->y, c->M, c->N, c->K, c->N, c->ws);
}

static int launch_dispatch(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_fp8(g, c->w + (size_t)k * c->w_bytes, c->s + (size_t)k * c->s_bytes, c->x,
			     c->sx, c->y, c->M, c->N, c->K, c->N, c->ws, c->ws_bytes);
}

static int launch_stream_wg(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_fp8_stream_wg(g, c->w + (size_t)k * c->w_bytes,
				       c->s + (size_t)k * c->s_bytes, c->x, c->sx, c->y, c->M, c->N,
				       c->K, c->N, c->ws, 1);
}

static int launch_stream_sw(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_fp8_stream_sw(g, c->w + (size_t)k * c->w_bytes,
				       c->s + (size_t)k * c->s_bytes, c->x, c->sx, c->y, c->M, c->N,
				       c->K, c->N, c->ks2);
}

static int launch_gemv(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_fp8_gemv(g, c->w + (size_t)k * c->w_bytes, c->s + (size_t)k * c->s_bytes,
				  c->x, c->sx, c->y, c->M, c->N, c->K, c->N, c->ws);
}

static int launch_v2(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_fp8_decode_v2(g, c->w + (size_t)k * c->w_bytes,
				       c->s + (size_t)k * c->s_bytes, c->x, c->sx, c->y, c->M, c->N,
				       c->K, c->N, c->ws);
}

static int launch_copy(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_stream_copy_only(g, c->w + (size_t)k * c->w_bytes, c->x, c->M, c->N, c->K);
}

static int launch_wgmma(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_fp8_wgmma(g, c->w + (size_t)k * c->w_bytes, c->s + (size_t)k * c->s_bytes,
				   c->x, c->sx, c->y, c->M, c->N, c->K, c->N);
}

static int launch_lt(struct gpu *g, void *vctx, int i)
{
	struct gemm_ctx *c = vctx;
	int k = i % c->copies;
	return cuda_gemm_fp8_lt(g, c->w + (size_t)k * c->w_bytes, c->s + (size_t)k * c->s_bytes,
				c->x, c->sx, c->y, c->M, c->N, c->K, c->N, c->ws, c->ws_bytes);
}

/* One swapped-kernel GEMM (M = 8, 7168x2048) completes in form ks (1, 2: the cluster form; 3:
 * the one-row kernel instead, cuda_gemm_fp8_gemv, with its workspace): 1, else 0. */
static int probe_sw(struct gpu *g, int ks)
{
	const int M = 8, N = 7168, K = 2048;
	gpu_ptr w = 0, s = 0, x = 0, sx = 0, y = 0;
	int ok = !cu.cuMemAlloc(&w, (size_t)N * K) &&
		 !cu.cuMemAlloc(&s, (size_t)(N / 128) * (K / 128) * 4) &&
		 !cu.cuMemAlloc(&x, (size_t)M * K) && !cu.cuMemAlloc(&sx, (size_t)M * (K / 128) * 4) &&
		 !cu.cuMemAlloc(&y, (size_t)M * N * 2);
	if (ok) {
		bench_fill_e4m3(g, w, (long long)N * K, 1);
		bench_fill_pow2(g, s, (long long)(N / 128) * (K / 128), 2, -12, -8);
		bench_fill_e4m3(g, x, (long long)M * K, 3);
		bench_fill_pow2(g, sx, (long long)M * (K / 128), 4, -4, 0);
		gpu_ptr ws = 0;
		size_t wsb = cuda_gemm_decode_workspace(g, M, N, K);
		ok = !wsb || !cu.cuMemAlloc(&ws, wsb);
		ok = ok &&
		     !(ks == 3 ? cuda_gemm_fp8_gemv(g, w, s, x, sx, y, M, N, K, N, ws)
			       : cuda_gemm_fp8_stream_sw(g, w, s, x, sx, y, M, N, K, N, ks == 2)) &&
		     !gpu_sync(g);
		if (ok && ws)
			cu.cuMemFree(ws);
	}
	if (ok) /* (after a failure the context is lost: gpu_close frees everything) */
		cu.cuMemFree(w), cu.cuMemFree(s), cu.cuMemFree(x), cu.cuMemFree(sx), cu.cuMemFree(y);
	return ok;
}

/* --no-wgmma: leave the wgmma kernel out (a run that must not depend on it). */
static int no_wgmma;
/* --tune-times: the start-up measurement's times by path under each dense row */
static int tune_times;

/* time_us, TB/s, TFLOP/s of one path, or n/a. */
static void print_path(float ms, double bytes, double flops)
{
	if (ms < 0)
		printf(" %9s %6s %7s", "n/a", "", "");
	else
		printf(" %9.2f %6.3f %7.1f", ms * 1e3, bytes / (ms * 1e-3) / 1e12,
		       flops / (ms * 1e-3) / 1e12);
}

/* ---- grouped expert GEMM -------------------------------------------------------------------- */

#define GB_EXPERTS 256
#define GB_GROUPS (GB_EXPERTS + 1) /* + the shared expert, as the MoE block runs them */
#define GB_TOPK 8
#define GB_ROUTINGS 8

struct grouped_ctx {
	gpu_ptr w_tab, s_tab, off[GB_ROUTINGS], x, sx, y, ws, h8, hs;
	size_t ws_bytes;
	int rows, N, K, mode; /* 0 cuda_gemm_fp8_grouped, 1 streaming (mma.sync), 2 wgmma, 3
			       * streaming with wgmma consumers (cuda_gemm_set_stream_wi 2), 4 the
			       * same with the K chunks summed in the kernel, 5
			       * cuda_gemm_fp8_grouped_swiglu */
};

static int launch_grouped(struct gpu *g, void *vctx, int i)
{
	struct grouped_ctx *c = vctx;
	gpu_ptr off = c->off[i % GB_ROUTINGS];
	if (c->mode == 5)
		return cuda_gemm_fp8_grouped_swiglu(g, c->w_tab, c->s_tab, off, GB_GROUPS, c->x,
						    c->sx, c->h8, c->hs, c->rows, c->N, c->K, c->ws,
						    c->ws_bytes, NULL);
	if (c->mode == 2)
		return cuda_gemm_fp8_wgmma_grouped(g, c->w_tab, c->s_tab, off, GB_GROUPS, c->x,
						   c->sx, c->y, c->rows, c->N, c->K, c->N);
	if (c->mode == 1 || c->mode == 3 || c->mode == 4)
		return cuda_gemm_fp8_grouped_stream(g, c->w_tab, c->s_tab, off, GB_GROUPS, c->x,
						    c->sx, c->y, c->rows, c->N, c->K, c->N, c->ws,
						    c->ws_bytes);
	return cuda_gemm_fp8_grouped(g, c->w_tab, c->s_tab, off, GB_GROUPS, c->x, c->sx, c->y,
				     c->rows, c->N, c->K, c->N, c->ws, c->ws_bytes);
}

static int bench_grouped(struct gpu *g, int trials, double read_tbs)
{
	static const int shapes[][2] = {{4096, 7168}, {7168, 2048}};
	static const int tokens[] = {1, 16, 64, 256};
	printf("\ngrouped expert GEMM: %d experts, %d per token, + the shared expert (group %d, every "
	       "token), routings rotated over %d draws\n",
	       GB_EXPERTS, GB_TOPK, GB_EXPERTS, GB_ROUTINGS);
	printf("%-12s %6s %7s %9s | %9s %6s %7s %5s | %9s %6s %7s | %9s %6s %7s | %9s %6s | %9s "
	       "%6s | %9s %6s\n",
	       "N x K", "tokens", "experts", "touch_MB", "ours_us", "TB/s", "TFLOP/s", "%lim",
	       "stream_us", "TB/s", "TFLOP/s", "wgmma_us", "TB/s", "TFLOP/s", "wg_us", "TB/s",
	       "wg_fu_us", "TB/s", "swiglu_us", "TB/s");
	fflush(stdout);
	uint64_t seed = 12345;
	for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
		struct grouped_ctx c = {.N = shapes[si][0], .K = shapes[si][1]};
		size_t w_bytes = ((size_t)c.N * c.K + 255) / 256 * 256;
		size_t s_bytes = ((size_t)(c.N / 128) * (c.K / 128) * 4 + 255) / 256 * 256;
		gpu_ptr w, s;
		const int max_rows = 256 * (GB_TOPK + 1);
		if (cu_check(cu.cuMemAlloc(&w, w_bytes * GB_GROUPS), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&s, s_bytes * GB_GROUPS), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.w_tab, GB_GROUPS * 8), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.s_tab, GB_GROUPS * 8), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.x, (size_t)max_rows * c.K), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.sx, (size_t)max_rows * (c.K / 128) * 4), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.y, (size_t)max_rows * c.N * 2), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.h8, (size_t)max_rows * c.N / 2), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.hs, (size_t)max_rows * (c.N / 256) * 4 + 4), "cuMemAlloc", __FILE__, __LINE__))
			return 1;
		for (int r = 0; r < GB_ROUTINGS; r++)
			if (cu_check(cu.cuMemAlloc(&c.off[r], (GB_GROUPS + 1) * 4), "cuMemAlloc", __FILE__, __LINE__))
				return 1;
		c.ws_bytes = cuda_gemm_fp8_grouped_workspace(g, max_rows, GB_GROUPS, c.N, c.K);
		c.ws_bytes = c.ws_bytes < 256 ? 256 : c.ws_bytes;
		if (cu_check(cu.cuMemAlloc(&c.ws, c.ws_bytes), "cuMemAlloc", __FILE__, __LINE__))
			return 1;
		uint64_t wt[GB_GROUPS], st[GB_GROUPS];
		for (int e = 0; e < GB_GROUPS; e++)
			wt[e] = w + (size_t)e * w_bytes, st[e] = s + (size_t)e * s_bytes;
		if (gpu_upload(g, c.w_tab, wt, sizeof wt) || gpu_upload(g, c.s_tab, st, sizeof st))
			return 1;
		bench_fill_e4m3(g, w, (long long)(w_bytes * GB_GROUPS), 700 + si);
		bench_fill_pow2(g, s, (long long)(s_bytes * GB_GROUPS / 4), 800 + si, -12, -8);
		bench_fill_e4m3(g, c.x, (long long)max_rows * c.K, 900 + si);
		bench_fill_pow2(g, c.sx, (long long)max_rows * (c.K / 128), 1000 + si, -4, 0);
		for (size_t ti = 0; ti < sizeof tokens / sizeof *tokens; ti++) {
			const int T = tokens[ti];
			c.rows = T * (GB_TOPK + 1);
			double touched = 0; /* groups with rows, averaged over the routings */
			for (int r = 0; r < GB_ROUTINGS; r++) {
				int cnt[GB_GROUPS] = {0}, off[GB_GROUPS + 1];
				cnt[GB_EXPERTS] = T; /* the shared expert: every token */
				for (int t = 0; t < T; t++) {
					int chosen[GB_TOPK];
					for (int k = 0; k < GB_TOPK; k++) {
						int e, dup;
						do {
							seed = seed * 6364136223846793005ull + 1442695040888963407ull;
							e = (int)((seed >> 33) % GB_EXPERTS);
							dup = 0;
							for (int j = 0; j < k; j++)
								dup |= chosen[j] == e;
						} while (dup);
						chosen[k] = e;
						cnt[e]++;
					}
				}
				off[0] = 0;
				for (int e = 0; e < GB_GROUPS; e++) {
					off[e + 1] = off[e] + cnt[e];
					touched += cnt[e] > 0;
				}
				if (gpu_upload(g, c.off[r], off, sizeof off))
					return 1;
			}
			touched /= GB_ROUTINGS;
			double bytes = touched * ((double)c.N * c.K + (double)(c.N / 128) * (c.K / 128) * 4) +
				       (double)c.rows * c.K + (double)c.rows * c.N * 2;
			double flops = 2.0 * c.rows * c.N * c.K;
			int reps = 5 * GB_ROUTINGS;
			float t[6];
			for (c.mode = 0; c.mode < 6; c.mode++) {
				cuda_gemm_set_stream_wi(c.mode == 3 || c.mode == 4 ? 2 : -1);
				cuda_gemm_set_stream_diag(c.mode == 4 ? 1 : -1, 0);
				int run = c.mode < 2 || c.mode == 3 || (c.mode == 2 && !no_wgmma) ||
					  (c.mode == 4 && T <= 16) || (c.mode == 5 && si == 0 && T <= 64);
				t[c.mode] = run ? time_ms(g, launch_grouped, &c, reps, trials) : -1;
			}
			cuda_gemm_set_stream_wi(-1);
			cuda_gemm_set_stream_diag(-1, 0);
			float ms = t[0];
			printf("%5dx%-6d %6d %7.1f %9.1f |", c.N, c.K, T, touched, bytes / 1e6);
			print_path(ms, bytes, flops);
			if (ms >= 0)
				printf(" %4.0f%% |", 100 * bytes / (ms * 1e-3) / 1e12 / read_tbs);
			else
				printf(" %5s |", "");
			print_path(t[1], bytes, flops);
			printf(" |");
			print_path(t[2], bytes, flops);
			printf(" |");
			for (int k = 3; k < 6; k++)
				if (t[k] >= 0)
					printf(" %9.2f %6.3f%s", t[k] * 1e3, bytes / (t[k] * 1e-3) / 1e12,
					       k < 5 ? " |" : "");
				else
					printf(" %9s %6s%s", "n/a", "", k < 5 ? " |" : "");
			printf("\n");
			fflush(stdout);
			if (ms < 0)
				return 1;
		}
		cu.cuMemFree(w), cu.cuMemFree(s), cu.cuMemFree(c.w_tab), cu.cuMemFree(c.s_tab);
		cu.cuMemFree(c.x), cu.cuMemFree(c.sx), cu.cuMemFree(c.y), cu.cuMemFree(c.ws);
		cu.cuMemFree(c.h8), cu.cuMemFree(c.hs);
		for (int r = 0; r < GB_ROUTINGS; r++)
			cu.cuMemFree(c.off[r]);
	}
	printf("\ncommand: dsv32 bench gemm --grouped --trials %d (ours: cuda_gemm_fp8_grouped, the "
	       "fast mode's dispatch; stream: the streaming kernel (mma.sync consumers, the "
	       "batch-invariant mode's); wgmma: cuda_gemm_fp8_wgmma_grouped; wg: the streaming "
	       "kernel with wgmma consumers, K chunks summed by a second launch (the fast mode's "
	       "below 128 rows); wg_fu: the same with the chunks summed in the kernel, tokens <= 16; "
	       "swiglu: cuda_gemm_fp8_grouped_swiglu, gate|up, tokens <= 16 (the same bytes; its "
	       "outputs h8/hs instead of y), tokens <= 64; experts: groups with rows, mean over the routings; touch_MB: their weights + x + y; %%lim: ours against the read limit)\n", trials);
	return 0;
}

/* --sw-trace: 16 launches of the swapped kernel in a row, traced (cuda_gemm_sw_trace: its
 * K-halves forms of 112-128 columns have traced twins); the last CUDA_GEMM_SW_TRACE_SLOTS'
 * timelines appended to f (one row a block: shape, M, ks2, launch, block, then the points less
 * the launch's first start, ns, and the SM << 8 | cluster rank) and summarised on stdout: the
 * means over those launches (but the last) of where each point falls after the launch's median
 * block passed griddepcontrol.wait (the previous launch complete; blocks start earlier, on the
 * SMs the previous one leaves): the median block's, the last block's for the ends, and the
 * launch period (the next one's median wait against this one's). */
static int sw_trace_run(struct gpu *g, struct gemm_ctx *c, FILE *f)
{
	enum { S = CUDA_GEMM_SW_TRACE_SLOTS, B = CUDA_GEMM_SW_TRACE_BLOCKS, P = CUDA_GEMM_SW_TRACE_POINTS };
	static uint64_t tr[S * B * P];
	memset(tr, 0, sizeof tr);
	int r = cuda_gemm_sw_trace(g, 1);
	for (int i = 0; i < 2 * S && !r; i++)
		r = launch_stream_sw(g, c, i);
	cuda_gemm_sw_trace(g, 0);
	if (r || (r = cuda_gemm_sw_trace_read(g, tr, sizeof tr / sizeof *tr)))
		return r;
	/* the blocks of a launch: those whose START is not 0 (the buffer zeroed before) */
	double sum[P] = {0}; /* points 0-7 after the wait, then the period */
	uint64_t dep[S];
	int launches = 0;
	for (int l = 0; l < S; l++) {
		const uint64_t *t = tr + (size_t)l * B * P;
		static uint64_t v[P][B];
		uint64_t s0 = ~0ull;
		int nb = 0;
		for (int b = 0; b < B && t[b * P]; b++, nb++)
			for (int p = 0; p < P; p++)
				v[p][b] = t[b * P + p];
		for (int b = 0; b < nb; b++)
			s0 = v[0][b] < s0 ? v[0][b] : s0;
		for (int b = 0; b < nb && f; b++) {
			fprintf(f, "%dx%d,%d,%d,%d,%d", c->N, c->K, c->M, c->ks2, l, b);
			for (int p = 0; p < P - 1; p++)
				fprintf(f, ",%lld", v[p][b] ? (long long)(v[p][b] - s0) : -1);
			fprintf(f, ",%llu\n", (unsigned long long)v[P - 1][b]);
		}
		if (!nb) /* (a form without a traced twin) */
			return 0;
		for (int p = 0; p < P - 1; p++)
			qsort(v[p], (size_t)nb, sizeof v[p][0], bench_cmp_u64);
		dep[l] = v[1][nb / 2];
		if (l == S - 1)
			continue;
		for (int p = 0; p < P - 1; p++) /* the median block's, the last's for the ends */
			sum[p] += (double)((long long)v[p][p >= 4 ? nb - 1 : nb / 2] - (long long)dep[l]);
		launches++;
	}
	for (int l = 0; l + 1 < S; l++)
		sum[P - 1] += (double)(dep[l + 1] - dep[l]);
	const double d = launches * 1e3; /* ns -> us, the mean */
	printf("  trace %dx%d M=%d ks2=%d (%s), us after the median block's griddepcontrol.wait "
	       "(the median block; the last for last0/last1/exch/end): start %.2f scales %.2f first "
	       "%.2f last0 %.2f last1 %.2f exch %.2f end %.2f | period %.2f\n",
	       c->N, c->K, c->M, c->ks2, cuda_gemm_sw_kernel(g, c->M, c->N, c->K, c->ks2),
	       sum[0] / d, sum[2] / d, sum[3] / d, sum[4] / d, sum[5] / d, sum[6] / d, sum[7] / d,
	       sum[8] / d);
	return 0;
}

int bench_gemm(int argc, char **argv)
{
	int trials = 7, run_dense = 1, run_grouped = 1, tune = 1, only_n = 0, only_k = 0;
	int sustain_ms = 0;
	FILE *trace = NULL;
	no_wgmma = 0, tune_times = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--trials") && i + 1 < argc)
			trials = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--grouped"))
			run_dense = 0;
		else if (!strcmp(argv[i], "--dense"))
			run_grouped = 0;
		else if (!strcmp(argv[i], "--no-wgmma"))
			no_wgmma = 1;
		else if (!strcmp(argv[i], "--tune-times"))
			tune_times = 1;
		else if (!strcmp(argv[i], "--no-tune"))
			tune = 0;
		else if (!strcmp(argv[i], "--sustain") && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
			 atoi(argv[i + 1]) <= 60000)
			sustain_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--shape") && i + 1 < argc &&
			 sscanf(argv[i + 1], "%dx%d", &only_n, &only_k) == 2)
			i++;
		else if (!strcmp(argv[i], "--sw-trace") && i + 1 < argc && !trace) {
			if (!(trace = fopen(argv[++i], "w"))) {
				fprintf(stderr, "dsv32 bench gemm: --sw-trace %s: %s\n", argv[i],
					strerror(errno));
				return 1;
			}
		} else {
			fprintf(stderr, "usage: dsv32 bench gemm [--trials N] [--grouped | --dense] "
					"[--no-wgmma] [--no-tune] [--tune-times] [--shape NxK] "
					"[--sw-trace FILE] [--sustain MS (1 .. 60000)]\n");
			return 2;
		}
	}
	struct gpu g;
	struct err e;
	if (gpu_open(&g, 0, &e)) {
		fprintf(stderr, "dsv32 bench gemm: %s\n", e.msg);
		return 1;
	}
	/* The swapped kernel's forms and the one-row kernel are new: one launch of each on a small
	 * shape first; one that fails is left out (its column n/a) and the GPU reopened, so the rest
	 * still runs. */
	int sw_ok[3] = {0, 0, 0};
	for (int ks = 1; run_dense && ks <= 3; ks++) {
		sw_ok[ks - 1] = (ks != 2 || sw_ok[0]) && probe_sw(&g, ks);
		if (sw_ok[ks - 1])
			continue;
		static const char *const what[] = {"swapped kernel", "swapped kernel's cluster form",
						   "one-row kernel"},
					 *const col[] = {"sw", "sw2", "gemv"};
		fprintf(stderr, "dsv32 bench gemm: the %s failed its probe; column %s left out\n",
			what[ks - 1], col[ks - 1]);
		gpu_close(&g);
		if (gpu_open(&g, 0, &e)) {
			fprintf(stderr, "dsv32 bench gemm: %s\n", e.msg);
			return 1;
		}
	}
	/* The limit: streaming read of 4 GiB. */
	cuda_gemm_set_batch_invariant(&g, 0); /* ours: the fast mode's dispatch */
	double read_tbs = bench_read_limit(&g, trials);
	if (read_tbs <= 0)
		return 1;
	printf("GPU: %s, %d SMs; HBM streaming read (4 GiB): %.3f TB/s; %s\n", g.name,
	       g.sm_count, read_tbs, cublaslt_version());
	if (run_dense)
		printf("\n%-12s %4s | %9s %6s %7s %5s %-6s | %9s %6s %5s | %9s %6s | %9s %6s | %9s "
		       "%6s %7s | %7s %-8s %6s %6s %6s %6s %6s %6s %6s\n",
		       "N x K", "M", "ours_us", "TB/s", "TFLOP/s", "%lim", "path", "stream_us", "TB/s",
		       "split", "v2_us", "TB/s", "wgmma_us", "TB/s", "lt_us", "TB/s", "TFLOP/s",
		       "ours/lt", "faster", "copy", "wg", "wg_fu", "wg_nr", "sw", "sw2", "gemv");
	fflush(stdout);
	/* --shape NxK: that one only (any N % 16 == 0, K % 128 == 0) */
	const int shapes[][2] = {{2112, 7168},	{24576, 1536}, {32768, 512},
				 {7168, 16384}, {18432, 7168}, {7168, 18432},
				 {4096, 7168},	{7168, 2048}};
	const int one[1][2] = {{only_n, only_k}}, (*sh)[2] = only_n ? one : shapes;
	const size_t n_sh = only_n ? 1 : sizeof shapes / sizeof *shapes;
	if (only_n && (only_n % 16 || only_n < 16 || only_k % 128 || only_k < 128)) {
		fprintf(stderr, "dsv32 bench gemm: --shape %dx%d: N %% 16 and K %% 128 must be 0\n",
			only_n, only_k);
		return 2;
	}
	static const int Ms[] = {1, 8, 16, 32, 64, 128, 4096};
	const int max_m = 4096;
	/* every shape's six buffers, freed at the end */
	gpu_ptr kept[6 * sizeof shapes / sizeof *shapes];
	int n_kept = 0;
	int rc_all = 0;
	for (size_t si = 0; run_dense && si < n_sh; si++) {
		struct gemm_ctx c = {.N = sh[si][0], .K = sh[si][1]};
		c.w_bytes = ((size_t)c.N * c.K + 255) / 256 * 256;
		c.s_bytes = ((size_t)(c.N / 128) * (c.K / 128) * 4 + 255) / 256 * 256;
		c.copies = (int)((1ull << 30) / c.w_bytes) + 1;
		if (c.copies < 2)
			c.copies = 2;
		if (cu_check(cu.cuMemAlloc(&c.w, c.w_bytes * c.copies), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.s, c.s_bytes * c.copies), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.x, (size_t)max_m * c.K), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.sx, (size_t)max_m * (c.K / 128) * 4), "cuMemAlloc", __FILE__, __LINE__) ||
		    cu_check(cu.cuMemAlloc(&c.y, (size_t)max_m * c.N * 2), "cuMemAlloc", __FILE__, __LINE__))
			return 1;
		c.ws_bytes = 256;
		for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
			size_t b = cuda_gemm_fp8_workspace(&g, Ms[mi], c.N, c.K);
			c.ws_bytes = b > c.ws_bytes ? b : c.ws_bytes;
			b = Ms[mi] <= 64 ? cuda_gemm_decode_v2_workspace(&g, Ms[mi], c.N, c.K) : 0;
			c.ws_bytes = b > c.ws_bytes ? b : c.ws_bytes;
		}
		if (cu_check(cu.cuMemAlloc(&c.ws, c.ws_bytes), "cuMemAlloc", __FILE__, __LINE__))
			return 1;
		bench_fill_e4m3(&g, c.w, (long long)(c.w_bytes * c.copies), 100 + si);
		bench_fill_pow2(&g, c.s, (long long)(c.s_bytes * c.copies / 4), 200 + si, -12, -8);
		bench_fill_e4m3(&g, c.x, (long long)max_m * c.K, 300 + si);
		bench_fill_pow2(&g, c.sx, (long long)max_m * (c.K / 128), 400 + si, -4, 0);
		gpu_ptr *cw = malloc((size_t)c.copies * sizeof *cw),
			*cs = malloc((size_t)c.copies * sizeof *cs);
		if (!cw || !cs)
			return 1;
		for (int k = 0; k < c.copies; k++)
			cw[k] = c.w + (size_t)k * c.w_bytes, cs[k] = c.s + (size_t)k * c.s_bytes;
		/* Run 33: the first row (M = 1) of each shape after the first read 3-13% below the same
		 * kernel's own column and below the shape run alone (--shape), the more the longer the
		 * previous shape's M = 4096 rows had run at ~1,100 TFLOP/s (the SW power cap) or the
		 * previous shape's buffers had just been freed: a pause for the clocks, and every
		 * shape's buffers kept until the end. */
		if (si > 0)
			usleep(300000);
		for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
			c.M = Ms[mi];
			/* a whole number of turns over the copies, >= 40 launches (>= 8 at big M) */
			int want = c.M >= 1024 ? 8 : 40;
			int reps = c.copies * ((want + c.copies - 1) / c.copies);
			/* ours: the dispatch as the engine runs it (the default kernel choice), after the
			 * start-up measurement the engine makes (cuda_gemm_tune_rotate over the copies:
			 * cold L2) unless --no-tune */
			cuda_gemm_set_stream(-1);
			cuda_gemm_set_stream_rt(0);
			float tus[CUDA_GEMM_PATHS];
			for (int p = 0; p < CUDA_GEMM_PATHS; p++)
				tus[p] = -1;
			if (tune && cuda_gemm_tune_rotate(&g, cw, cs, c.copies, c.M, c.N, c.K, c.x, c.sx,
							  c.y, c.ws, c.ws_bytes, tus))
				rc_all = 1;
			if (tune && tune_times) {
				printf("# tune M=%d (us a launch, the start-up measurement's):", c.M);
				for (int p = 1; p < CUDA_GEMM_PATHS; p++)
					if (tus[p] >= 0)
						printf(" %s %.2f", cuda_gemm_path_name(p), tus[p]);
				printf("\n");
			}
			enum cuda_gemm_path path = cuda_gemm_path_for(&g, c.M, c.N, c.K);
			const char *label = path == CUDA_GEMM_PATH_CUBLASLT	 ? "lt"
					    : path == CUDA_GEMM_PATH_WGMMA	 ? "wgmma"
					    : path == CUDA_GEMM_PATH_STREAM_WG	 ? "wg"
					    : cuda_gemm_decode_streams(c.N, c.K) ? "stream"
										 : "v2";
			label = path == CUDA_GEMM_PATH_STREAM_SW    ? "sw"
				: path == CUDA_GEMM_PATH_STREAM_SW2 ? "sw2"
				: path == CUDA_GEMM_PATH_GEMV	    ? "gemv"
								    : label;
			float ms = path == CUDA_GEMM_PATH_WGMMA && no_wgmma
					   ? -1
					   : time_ms(&g, launch_dispatch, &c, reps, trials);
			float st = -1, v2 = -1, cp = -1, wg = -1, wgs = -1, wfu = -1, wnr = -1, wsw = -1,
			      wsw2 = -1, wgv = -1;
			if (c.M <= 64) {
				cuda_gemm_set_stream(1);
				st = time_ms(&g, launch_gemm, &c, reps, trials);
				cp = time_ms(&g, launch_copy, &c, reps, trials);
				wgs = time_ms(&g, launch_stream_wg, &c, reps, trials);
				cuda_gemm_set_stream_diag(1, 0); /* wgmma consumers, chunks summed fused */
				wfu = time_ms(&g, launch_stream_wg, &c, reps, trials);
				cuda_gemm_set_stream_diag(2, 0); /* the GEMM launch alone, no chunk sum */
				wnr = time_ms(&g, launch_stream_wg, &c, reps, trials);
				cuda_gemm_set_stream_diag(-1, 0);
				cuda_gemm_set_stream(-1);
				v2 = time_ms(&g, launch_v2, &c, reps, trials);
			} else if (!no_wgmma) {
				wg = time_ms(&g, launch_wgmma, &c, reps, trials);
			}
			float lt = time_ms(&g, launch_lt, &c, reps, trials);
			if (c.M <= 64 && sw_ok[0]) { /* last: new kernels */
				wsw = time_ms(&g, launch_stream_sw, &c, reps, trials);
				c.ks2 = 1;
				wsw2 = sw_ok[1] ? time_ms(&g, launch_stream_sw, &c, reps, trials) : -1;
				c.ks2 = 0;
			}
			if (trace && c.M <= 64 && sw_ok[1]) { /* (the traced twins: K-halves forms) */
				c.ks2 = 1;
				if (sw_trace_run(&g, &c, trace))
					fprintf(stderr, "dsv32 bench gemm: --sw-trace failed\n");
				c.ks2 = 0;
			}
			if (c.M <= 8 && sw_ok[2])
				wgv = time_ms(&g, launch_gemv, &c, reps, trials);
			if (ms < 0 && (c.M <= 64 || !no_wgmma))
				rc_all = 1;
			double bytes = (double)c.N * c.K + (double)(c.N / 128) * (c.K / 128) * 4 +
				       (double)c.M * c.K + (double)c.M * c.N * 2;
			double flops = 2.0 * c.M * c.N * c.K;
			struct gemm_split sp = cuda_gemm_decode_split(&g, c.N, c.K);
			char split[16];
			snprintf(split, sizeof split, "c%d", sp.chunks);
			printf("%5dx%-6d %4d |", c.N, c.K, c.M);
			print_path(ms, bytes, flops);
			if (ms >= 0)
				printf(" %4.0f%% %-6s |", 100 * bytes / (ms * 1e-3) / 1e12 / read_tbs,
				       label);
			else
				printf(" %5s %-6s |", "", label);
			if (st >= 0)
				printf(" %9.2f %6.3f %-5s |", st * 1e3, bytes / (st * 1e-3) / 1e12, split);
			else
				printf(" %9s %6s %5s |", "n/a", "", "");
			if (v2 >= 0)
				printf(" %9.2f %6.3f |", v2 * 1e3, bytes / (v2 * 1e-3) / 1e12);
			else
				printf(" %9s %6s |", "n/a", "");
			if (wg >= 0)
				printf(" %9.2f %6.3f |", wg * 1e3, bytes / (wg * 1e-3) / 1e12);
			else
				printf(" %9s %6s |", "n/a", "");
			print_path(lt, bytes, flops);
			if (ms >= 0 && lt >= 0)
				printf(" | %7.2f", lt / ms);
			else
				printf(" | %7s", "n/a");
			if (ms < 0 && lt < 0)
				printf(" %-8s", "none");
			else if (ms >= 0 && path == CUDA_GEMM_PATH_CUBLASLT)
				printf(" %-8s", "same"); /* ours ran cuBLASLt: the ratio is timing noise */
			else
				printf(" %-8s", lt >= 0 && (ms < 0 || lt < ms) ? "cuBLASLt" : "ours");
			const float extra[] = {cp, wgs, wfu, wnr, wsw, wsw2, wgv};
			for (int k = 0; k < 7; k++)
				if (extra[k] >= 0)
					printf(" %6.3f", bytes / (extra[k] * 1e-3) / 1e12);
				else if (c.M <= 64 && (k < 6 || c.M <= 8))
					printf(" %6s", "n/a");
			printf("\n");
			if (sustain_ms && c.M >= 128) { /* at the capped clocks */
				int n_ours = 0, n_lt = 0;
				long long mj_ours = -1, mj_lt = -1;
				float s_ours = ms > 0 ? time_sustained(&g, launch_dispatch, &c, ms,
								       sustain_ms, &n_ours, &mj_ours)
						      : -1;
				usleep(300000);
				float s_lt = lt > 0 ? time_sustained(&g, launch_lt, &c, lt, sustain_ms,
								     &n_lt, &mj_lt)
						    : -1;
				printf("  sustained ~%d ms:", sustain_ms);
				print_sustained("ours", s_ours, n_ours, mj_ours, flops);
				print_sustained("cuBLASLt", s_lt, n_lt, mj_lt, flops);
				printf("\n");
				usleep(300000);
			}
			fflush(stdout); /* rows survive a later failure */
		}
		free(cw);
		free(cs);
		/* (freed after the last shape: see the pause above) */
		const gpu_ptr bufs[] = {c.w, c.s, c.x, c.sx, c.y, c.ws};
		for (int k = 0; k < 6; k++)
			kept[n_kept++] = bufs[k];
	}
	for (int k = 0; k < n_kept; k++)
		cu.cuMemFree(kept[k]);
	char sus_arg[32] = "";
	if (sustain_ms)
		snprintf(sus_arg, sizeof sus_arg, " --sustain %d", sustain_ms);
	if (run_dense)
		printf("\ncommand: dsv32 bench gemm --trials %d%s%s (ours: cuda_gemm_fp8, the dispatch the "
		       "engine runs, %s; path: what it ran (stream / v2: the exact decode kernels, wg: "
		       "the streaming kernel's wgmma consumers, wgmma, lt: cuBLASLt); %%lim: ours "
		       "against the read limit; stream: k_gemm_fp8_stream_m* forced (mma.sync), split: "
		       "its K chunks; v2: k_gemm_fp8_decode_m*; wgmma: cuda_gemm_fp8_wgmma forced; "
		       "copy: TB/s of the streaming kernel's copies alone (no MMA); wg: TB/s of the "
		       "streaming kernel with wgmma consumers, K chunks summed by a second launch (the "
		       "fast mode's STREAM_WG; within the wgmma limit); wg_fu: wg with the chunks "
		       "summed in the kernel; wg_nr: wg's GEMM launch alone, the chunks not summed "
		       "(output invalid: the chunk sum's cost is wg_nr against wg); sw: TB/s of the "
		       "swapped kernel (cuda_gemm_fp8_stream_sw: tokens as wgmma's A, one block per "
		       "NT weight rows over all of K, one launch); sw2: its cluster form (two blocks a "
		       "tile, each half of K; where it fits, else sw again); gemv: TB/s of the one-row "
		       "kernel (cuda_gemm_fp8_gemv, M <= 8: bulk copies of 16-row units, K chunks summed "
		       "by the last-arriving block); cuBLASLt: VEC128_32F x BLK128x128_32F incl. the sx "
		       "transpose; weights rotated over >= 1 GiB; ours/lt = cuBLASLt time / our time, "
		       "> 1: ours faster; faster: which measured faster, \"same\" where ours ran "
		       "cuBLASLt itself (two timings of one path: their ratio is noise); n/a: the path "
		       "cannot run the shape; sustained: at M >= 128, ours and then cuBLASLt launched "
		       "back to back for about --sustain ms each (the power-capped clocks of a long "
		       "prefill), with the GPU's energy a launch from NVML's counter)\n",
		       trials, tune ? "" : " --no-tune", sus_arg,
		       tune ? "after the start-up measurement (cuda_gemm_tune_rotate, cold L2) of each "
			      "shape and M bucket"
			    : "its defaults without the start-up measurement");
	if (run_grouped && bench_grouped(&g, trials, read_tbs))
		rc_all = 1;
	cuda_gemm_close(&g);
	gpu_close(&g);
	if (trace)
		fclose(trace);
	return rc_all;
}
#endif
