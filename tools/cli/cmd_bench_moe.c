/*
 * cmd_bench_moe.c — `dsv32 bench moe`: the MoE block on the GPU (model/cuda_moe.h) at
 * DeepSeek-V3.2's real dims (hidden 7168, expert width 2048, 256 routed experts of which 8 per
 * token in 4 of 8 groups, one shared expert) for 1 to 4096 tokens per step: the time of the
 * block and of each stage, the bytes of weights it touches (the experts hit, counted from the
 * device's routing after the timed runs, plus the shared expert and the router), TB/s against
 * the HBM read limit measured in the same run and TFLOP/s against the H200's FP8 dense peak.
 * The shared expert runs inside the grouped GEMMs (one more group), so w13 / w2 include it.
 *
 * Weights are synthetic, generated on the GPU (random e4m3 codes, power-of-two block scales);
 * the router weight and the inputs are random bf16 from the host, so routing is random (about
 * every expert is hit from 64 tokens on). --hot N (N >= 8): a routing bias of +1 on experts
 * 0 .. N-1, so every token picks 8 of those N (the skewed routing of a model whose tokens agree:
 * fewer experts, many rows each). The block runs in the engine's fast mode (the GEMMs' fast
 * dispatch; the router logits on the tensor cores above 64 tokens); --exact: the
 * batch-invariant mode (cuda_gemm_set_batch_invariant: the exact decode kernels up to 64 tokens,
 * the exact router logits). DSV32_CUDA_UNFUSED=1: the block's separate kernels
 * (CUDA_MOE_UNFUSED). The 256 experts take 11.3 GB: even one token's 8 experts (352 MB)
 * exceed the 60 MB L2, so repeats stream the expert weights from HBM. The router (3.7 MB) and
 * the shared expert (44 MB) would fit it, so the runs rotate over --layers N layers (default 4),
 * each with its own router and shared expert (the routed experts' weights are common: even one
 * token's exceed the L2): like the model's consecutive layers, a run finds none of its own
 * router's or shared expert's bytes left in L2 by the run before (--layers 1: the same layer
 * every run, as before session 18).
 * Time = median of trials of CUDA-event-timed launch sequences: the block launched eagerly and
 * replayed from a CUDA graph (the engine's decode steps run graphs), each stage alone replayed
 * from a graph (eagerly a one-kernel stage measured the host's launch rate). --tokens: the token
 * counts to run (default 1 .. 4096). --ranks N (2 .. 8): then each of N ranks' share under expert
 * parallelism (cuda_moe_forward_rank: the rank's experts of moe_rank_experts, the shared expert
 * on rank 0, an fp32 share; docs/MULTIGPU.md step 3) graph-replayed alone on this GPU, as it
 * would run on its own: its time, the weights it touches (its experts hit, the router, the
 * shared expert on rank 0) and the slowest rank, which bounds an EP step's MoE layer (the
 * all-reduce of the shares not included).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/gpu.h"
#include "model/config.h"
#include "model/cpu_moe.h" /* moe_rank_experts */
#include "model/cuda_gemm.h"
#include "model/cuda_moe.h"
#include "model/numerics.h"
#include "tools/cli/bench_gpu.h"
#include "tools/cli/cli.h"
#include "tools/cli/bench_sort.h"

int bench_moe(int argc, char **argv);

#ifdef DSV32_NO_CUDA
int bench_moe(int argc, char **argv)
{
	fprintf(stderr, "dsv32 bench moe: this build has no CUDA support (static or no toolkit)\n");
	return 1;
}
#else

/* --layers at most: each has its own router and shared expert (~48 MB) */
#define MAX_LAYERS 8
/* --ranks at most (a node's GPUs) */
#define MAX_RANKS 8

struct moe_bench {
	struct gpu *g;
	struct gpu_arena *a;
	const struct dsv32_config *c;
	const struct cuda_moe_layer *L; /* [nl], run in turn */
	int nl, next;
	const struct cuda_moe_trace *tr;
	gpu_ptr x, y;
	int T;
	unsigned stages; /* with CUDA_MOE_UNFUSED under DSV32_CUDA_UNFUSED=1 */
	int rank_share;  /* L are a rank's layers: cuda_moe_forward_rank into y (fp32) */
};

static int run_stages(struct moe_bench *b)
{
	const struct cuda_moe_layer *L = &b->L[b->next];
	b->next = (b->next + 1) % b->nl;
	if (b->rank_share)
		return cuda_moe_forward_rank(b->g, b->a, b->c, L, b->x, b->y, b->T, b->tr,
					     b->stages & CUDA_MOE_UNFUSED);
	return cuda_moe_forward_stages(b->g, b->a, b->c, L, b->x, b->y, b->T, b->tr, NULL,
				       b->stages);
}

/* Milliseconds per run of `reps` back-to-back runs, median of `trials`; < 0 on failure.
 * graph: the reps captured once into a CUDA graph, each trial `replays` replays of it back to
 * back (the GPU's time, as the engine's decode steps run, without the host's launch cost:
 * eagerly, a stage of one small kernel measures the host's ~5 us a launch, run 10); else
 * launched eagerly each trial. mj (not NULL): the GPU's energy over the timed trials, mJ
 * (NVML's counter; -1 where not known). */
static float time_ms_mj(struct moe_bench *b, int reps, int trials, int graph, int replays,
			long long *mj)
{
	CUevent ev[2];
	CUgraph gr = NULL;
	CUgraphExec exec = NULL;
	float t[32], ms = -1;
	if (gpu_timing_events(ev))
		return -1;
	trials = trials > 32 ? 32 : trials < 1 ? 1 : trials;
	if (run_stages(b) || gpu_sync(b->g)) /* warm-up */
		goto out;
	if (graph) {
		if (cu_check(cu.cuStreamBeginCapture(b->g->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
			     "cuStreamBeginCapture", __FILE__, __LINE__))
			goto out;
		int crc = 0;
		for (int i = 0; i < reps && !crc; i++)
			crc = run_stages(b);
		if (cu_check(cu.cuStreamEndCapture(b->g->stream, &gr), "cuStreamEndCapture", __FILE__,
			     __LINE__) || crc ||
		    cu_check(cu.cuGraphInstantiateWithFlags(&exec, gr, 0), "cuGraphInstantiateWithFlags",
			     __FILE__, __LINE__) ||
		    cu_check(cu.cuGraphLaunch(exec, b->g->stream), "cuGraphLaunch", __FILE__, __LINE__) ||
		    gpu_sync(b->g)) /* (its first replay uploads the graph) */
			goto out;
	}
	const long long e0 = mj ? bench_energy_mj(b->g) : -1;
	for (int k = 0; k < trials; k++) {
		cu.cuEventRecord(ev[0], b->g->stream);
		if (graph) {
			for (int i = 0; i < replays; i++)
				if (cu_check(cu.cuGraphLaunch(exec, b->g->stream), "cuGraphLaunch",
					     __FILE__, __LINE__))
					goto out;
		} else {
			for (int i = 0; i < reps; i++)
				if (run_stages(b))
					goto out;
		}
		cu.cuEventRecord(ev[1], b->g->stream);
		if (cu_check(cu.cuEventSynchronize(ev[1]), "cuEventSynchronize", __FILE__, __LINE__))
			goto out;
		cu.cuEventElapsedTime(&t[k], ev[0], ev[1]);
		t[k] /= (float)reps * (float)(graph ? replays : 1);
	}
	if (mj) {
		const long long e1 = e0 < 0 ? -1 : bench_energy_mj(b->g);
		*mj = e1 < 0 ? -1 : e1 - e0;
	}
	qsort(t, (size_t)trials, sizeof *t, bench_cmp_float);
	ms = t[trials / 2];
out:
	if (exec)
		cu.cuGraphExecDestroy(exec);
	if (gr)
		cu.cuGraphDestroy(gr);
	gpu_timing_events_free(ev);
	return ms;
}

static float time_ms(struct moe_bench *b, int reps, int trials, int graph, int replays)
{
	return time_ms_mj(b, reps, trials, graph, replays, NULL);
}

/* Random bf16 ~ U(-amp, amp) (xorshift), uploaded to a new device buffer. */
static gpu_ptr upload_bf16(struct gpu *g, size_t n, float amp, unsigned long long seed)
{
	uint16_t *h = malloc(n * 2);
	gpu_ptr d = 0;
	if (!h)
		return 0;
	unsigned long long s = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < n; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		float u = (float)((s >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
		h[i] = f32_to_bf16(u * amp);
	}
	if (cu_check(cu.cuMemAlloc(&d, n * 2), "cuMemAlloc", __FILE__, __LINE__) ||
	    gpu_upload(g, d, h, n * 2))
		d = 0;
	free(h);
	return d;
}

static gpu_ptr dev_alloc(size_t bytes)
{
	gpu_ptr p = 0;
	return cu_check(cu.cuMemAlloc(&p, bytes), "cuMemAlloc", __FILE__, __LINE__) ? 0 : p;
}

/* A diagnosis build's timeline (make NVCC_EXTRA=-DGV_TRACE: the one-launch MoE block stamps
 * its steps, gemm_fp8_gemv.cu's gv_trace): the graph-replayed block once more, then each step's
 * time after the first block's entry, min / median / max over the blocks that stamped it. */
static void print_trace(struct moe_bench *b, int reps)
{
	enum { STEPS = 16, MAX_BLOCKS = 1024 };
	static const char *const names[] = {
		"entry", "slices built", "first gate|up stage", "gate|up done", "arrival 1 passed",
		"SwiGLU done", "arrival 2 passed", "first down stage", "down done", "arrival 3 passed",
		"combine done", "producer: last gate|up copy", "producer: last down copy",
		"x quantised (routes)", "shared gate|up done (routes)"};
	gpu_ptr p;
	size_t n;
	if (gpu_module_global(b->g, "gv_trace", &p, &n) || n < (size_t)MAX_BLOCKS * STEPS * 8)
		return;
	static unsigned long long t[MAX_BLOCKS * STEPS];
	if (gpu_memset(b->g, p, 0, sizeof t) || time_ms(b, reps, 1, 1, 1) < 0 ||
	    gpu_download(b->g, t, p, sizeof t))
		return;
	unsigned long long t0 = ~0ull;
	for (int k = 0; k < MAX_BLOCKS; k++)
		if (t[k * STEPS] && t[k * STEPS] < t0)
			t0 = t[k * STEPS];
	if (t0 == ~0ull) /* no block stamped its entry */
		return;
	printf("  trace (GV_TRACE build; us after the first block's entry: min / median / max over "
	       "the blocks):\n");
	for (int i = 0; i < (int)(sizeof names / sizeof *names); i++) {
		static double v[MAX_BLOCKS];
		int m = 0;
		for (int k = 0; k < MAX_BLOCKS; k++)
			if (t[k * STEPS + i] >= t0)
				v[m++] = (double)(t[k * STEPS + i] - t0) / 1e3;
		if (!m)
			continue;
		qsort(v, (size_t)m, sizeof *v, bench_cmp_double);
		printf("    %-28s %8.2f %8.2f %8.2f  (%d blocks)\n", names[i], v[0], v[m / 2], v[m - 1], m);
	}
	/* each block's gate|up done (step 3) by its SM (step 15), in SM order */
	static double by_sm[MAX_BLOCKS];
	for (int sm = 0; sm < MAX_BLOCKS; sm++)
		by_sm[sm] = -1;
	for (int k = 0; k < MAX_BLOCKS; k++)
		if (t[k * STEPS] && t[k * STEPS + 15] < MAX_BLOCKS && t[k * STEPS + 3] >= t0)
			by_sm[t[k * STEPS + 15]] = (double)(t[k * STEPS + 3] - t0) / 1e3;
	printf("  gate|up done by SM (smid: us):");
	for (int sm = 0, n = 0; sm < MAX_BLOCKS; sm++)
		if (by_sm[sm] >= 0)
			printf("%s%3d: %5.1f", n++ % 10 ? "  " : "\n    ", sm, by_sm[sm]);
	printf("\n");
}

/* One stage's line: time, bytes and flops it moves/does. */
static void print_part(const char *name, float ms, double bytes, double flops, double read_tbs,
		       double peak)
{
	if (ms < 0) {
		printf("  %-8s %10s\n", name, "failed");
		return;
	}
	double s = ms * 1e-3;
	printf("  %-8s %10.1f us", name, ms * 1e3);
	if (bytes > 0)
		printf("  %7.3f TB/s (%4.0f%% of read)", bytes / s / 1e12, 100.0 * bytes / s / 1e12 / read_tbs);
	else
		printf("  %28s", "");
	if (flops > 0)
		printf("  %7.1f TFLOP/s", flops / s / 1e12);
	if (flops > 0 && peak > 0)
		printf(" (%4.1f%% of FP8 peak)", 100.0 * flops / s / 1e12 / peak);
	printf("\n");
}

/* --weights: uniform over the e4m3 codes up to 15 (the default; block scales 2^-12 .. 2^-9) or
 * drawn like a checkpoint's (normal: N(0, 98^2) rounded to e4m3, a block's largest near 448;
 * block scales 2^-17 .. 2^-14, the outputs of the same size). Same bytes and FLOPs either way;
 * the tensor cores' power is what may differ. */
static int weights_normal;

static int fill_weights(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed)
{
	return weights_normal ? bench_fill_e4m3_normal(g, p, n, seed, 448.0f / 4.56f)
			      : bench_fill_e4m3(g, p, n, seed);
}

static int fill_scales(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed)
{
	return weights_normal ? bench_fill_pow2(g, p, n, seed, -17, -14)
			      : bench_fill_pow2(g, p, n, seed, -12, -9);
}

/* --ranks: each rank's share of the block at b's T (b: the whole block's setup, after its runs
 * left the routing of its last layer in b->tr), graph-replayed, over the same layers in turn;
 * the weights a rank touches: its experts that the routing of every layer hits (mean over the
 * layers), the router, the shared expert on rank 0. 0, or 1 when a rank failed. */
static int bench_ranks(struct moe_bench *b, struct cuda_moe_layer (*LR)[MAX_LAYERS], int ranks,
		       int reps, int trials, double exp_bytes, double sh_bytes, double gate_bytes,
		       double read_tbs)
{
	const int E = (int)b->c->n_routed_experts, K = (int)b->c->num_experts_per_tok, T = b->T;
	int32_t *idx = malloc((size_t)T * K * 4);
	if (!idx)
		return 1;
	printf("  expert parallelism, %d ranks (each rank's fp32 share alone, graph-replayed):\n",
	       ranks);
	float slowest = 0;
	int rc = 0;
	for (int r = 0; r < ranks; r++) {
		int64_t e0, e1;
		moe_rank_experts(E, r, ranks, &e0, &e1);
		struct moe_bench rb = *b;
		rb.L = LR[r], rb.next = 0, rb.rank_share = 1, rb.stages = CUDA_MOE_ALL | (b->stages & CUDA_MOE_UNFUSED);
		float ms = time_ms(&rb, reps, trials, 1, 1);
		double hit = 0; /* the rank's experts hit, mean over the layers */
		for (int l = 0; l < b->nl && ms > 0; l++) {
			rb.next = l;
			if (run_stages(&rb) || gpu_sync(rb.g) ||
			    gpu_download(rb.g, idx, rb.tr->idx, (size_t)T * K * 4)) {
				ms = -1;
				break;
			}
			unsigned char seen[256] = {0};
			for (int i = 0; i < T * K; i++)
				if (idx[i] >= e0 && idx[i] < e1 && !seen[idx[i]])
					seen[idx[i]] = 1, hit += 1.0 / b->nl;
		}
		char what[64];
		snprintf(what, sizeof what, "rank %d (experts %lld .. %lld, %.2f hit)", r, (long long)e0,
			 (long long)e1 - 1, hit);
		print_part(what, ms, hit * exp_bytes + gate_bytes + (r == 0 ? sh_bytes : 0), 0,
			   read_tbs, 0);
		slowest = ms > slowest ? ms : slowest;
		rc |= ms < 0;
	}
	printf("    slowest rank %.1f us (the all-reduce of the shares not included)\n",
	       slowest * 1e3);
	free(idx);
	return rc;
}

int bench_moe(int argc, char **argv)
{
	int trials = 5, hot = 0, exact = 0, sustain_ms = 0, nl = 4, ranks = 0;
	weights_normal = 0;
	const char *uf = getenv("DSV32_CUDA_UNFUSED");
	const unsigned mode = uf && *uf == '1' ? CUDA_MOE_UNFUSED : 0;
	const char *tokens = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--trials") && i + 1 < argc)
			trials = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = argv[++i];
		else if (!strcmp(argv[i], "--hot") && i + 1 < argc && atoi(argv[i + 1]) >= 8 &&
			 atoi(argv[i + 1]) <= 128)
			hot = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--layers") && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
			 atoi(argv[i + 1]) <= MAX_LAYERS)
			nl = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--exact"))
			exact = 1;
		else if (!strcmp(argv[i], "--ranks") && i + 1 < argc && atoi(argv[i + 1]) >= 2 &&
			 atoi(argv[i + 1]) <= MAX_RANKS)
			ranks = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--weights") && i + 1 < argc &&
			 (!strcmp(argv[i + 1], "codes") || !strcmp(argv[i + 1], "normal")))
			weights_normal = !strcmp(argv[++i], "normal");
		else if (!strcmp(argv[i], "--sustain") && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
			 atoi(argv[i + 1]) <= 60000)
			sustain_ms = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: dsv32 bench moe [--trials N] [--hot N (8 .. 128)] "
					"[--exact] [--tokens T1,T2,.. (1 .. 4096)] [--sustain MS (1 .. "
					"60000)] [--layers N (1 .. %d)] [--weights codes|normal] "
					"[--ranks N (2 .. %d)]\n",
				MAX_LAYERS, MAX_RANKS);
			return 2;
		}
	}
	struct dsv32_config c = {.hidden_size = 7168, .moe_intermediate_size = 2048,
				 .n_routed_experts = 256, .n_shared_experts = 1,
				 .num_experts_per_tok = 8, .n_group = 8, .topk_group = 4,
				 .norm_topk_prob = 1, .routed_scaling_factor = 2.5};
	const int D = 7168, I = 2048, E = 256, K = 8, Ish = 2048, max_T = 4096;
	struct gpu g;
	struct err e = {""};
	if (gpu_open(&g, 0, &e)) {
		fprintf(stderr, "dsv32 bench moe: %s\n", e.msg);
		return 1;
	}
	cuda_gemm_set_batch_invariant(&g, exact);
	double read_tbs = bench_read_limit(&g, trials);
	if (read_tbs <= 0)
		return 1;
	double mhz;
	const double peak = bench_tensor_peak(&g, 1, &mhz);
	printf("GPU: %s, %d SMs; HBM streaming read (4 GiB): %.3f TB/s; FP8 dense peak %.0f TFLOP/s "
	       "(8192 FLOP a clock an SM at %.0f MHz; 0: not known here)\n",
	       g.name, g.sm_count, read_tbs, peak, mhz);

	/* weights: all experts' fused gate|up then all down_proj, one allocation each (common to
	 * the layers); each layer's router and shared expert its own (layer 0: the seeds of the
	 * one-layer bench) */
	const size_t n13 = (size_t)2 * I * D, n2 = (size_t)D * I;
	const size_t ns13 = (size_t)(2 * I / 128) * (D / 128) * 4, ns2 = (size_t)(D / 128) * (I / 128) * 4;
	const size_t nsh13 = (size_t)2 * Ish * D, nsh2 = (size_t)D * Ish;
	const long long nss13 = (long long)(2 * Ish / 128) * (D / 128), nss2 = (D / 128) * (Ish / 128);
	gpu_ptr w13 = dev_alloc(n13 * E), w2 = dev_alloc(n2 * E), s13 = dev_alloc(ns13 * E),
		s2 = dev_alloc(ns2 * E), bias = dev_alloc((size_t)E * 4);
	gpu_ptr x = upload_bf16(&g, (size_t)max_T * D, 1.0f, 12);
	gpu_ptr y = dev_alloc((size_t)max_T * D * 4); /* bf16, or a rank's fp32 share */
	struct cuda_moe_trace tr = {dev_alloc((size_t)max_T * E * 4), dev_alloc((size_t)max_T * K * 4),
				    dev_alloc((size_t)max_T * K * 4)};
	if (!w13 || !w2 || !s13 || !s2 || !bias || !x || !y || !tr.logits || !tr.idx || !tr.wts) {
		fprintf(stderr, "dsv32 bench moe: device allocation failed\n");
		return 1;
	}
	if (fill_weights(&g, w13, (long long)(n13 * E), 21) ||
	    fill_weights(&g, w2, (long long)(n2 * E), 22) ||
	    fill_scales(&g, s13, (long long)(ns13 / 4 * E), 25) ||
	    fill_scales(&g, s2, (long long)(ns2 / 4 * E), 26) ||
	    gpu_memset(&g, bias, 0, (size_t)E * 4)) {
		fprintf(stderr, "dsv32 bench moe: filling the weights failed\n");
		return 1;
	}
	if (hot) { /* +1 on experts 0 .. hot-1: their groups win, then they win the picks */
		float hb[256] = {0};
		for (int k = 0; k < hot; k++)
			hb[k] = 1.0f;
		if (gpu_upload(&g, bias, hb, (size_t)E * 4))
			return 1;
		printf("routing skewed: bias +1 on experts 0..%d (every token picks 8 of them)\n", hot - 1);
	}
	gpu_ptr *t13 = malloc((size_t)E * sizeof *t13), *ts13 = malloc((size_t)E * sizeof *ts13),
		*t2 = malloc((size_t)E * sizeof *t2), *ts2 = malloc((size_t)E * sizeof *ts2);
	int32_t *idx = malloc((size_t)max_T * K * 4);
	if (!t13 || !ts13 || !t2 || !ts2 || !idx)
		return 1;
	for (int k = 0; k < E; k++) {
		t13[k] = w13 + n13 * k, ts13[k] = s13 + ns13 * k;
		t2[k] = w2 + n2 * k, ts2[k] = s2 + ns2 * k;
	}
	struct gpu_region reg;
	struct gpu_arena arena;
	struct cuda_moe_layer L[MAX_LAYERS], LR[MAX_RANKS][MAX_LAYERS];
	if (gpu_region_reserve(&g, &reg, "bench-moe", (size_t)64 << 20, &e) ||
	    gpu_region_grow(&g, &reg, (size_t)2 << 20, &e)) {
		fprintf(stderr, "dsv32 bench moe: %s\n", e.msg);
		return 1;
	}
	for (int l = 0; l < nl; l++) {
		const unsigned long long sd = 100ull * l; /* layer l's seeds */
		gpu_ptr gate = upload_bf16(&g, (size_t)E * D, 0.05f, 11 + sd), sh13 = dev_alloc(nsh13),
			sh2 = dev_alloc(nsh2), shs13 = dev_alloc((size_t)nss13 * 4),
			shs2 = dev_alloc((size_t)nss2 * 4);
		if (!gate || !sh13 || !sh2 || !shs13 || !shs2 ||
		    fill_weights(&g, sh13, (long long)nsh13, 23 + sd) ||
		    fill_weights(&g, sh2, (long long)nsh2, 24 + sd) ||
		    fill_scales(&g, shs13, nss13, 27 + sd) || fill_scales(&g, shs2, nss2, 28 + sd)) {
			fprintf(stderr, "dsv32 bench moe: layer %d's router or shared expert failed\n", l);
			return 1;
		}
		struct cuda_fp8_mat m13 = {sh13, shs13, 2 * Ish, D}, m2 = {sh2, shs2, D, Ish};
		if (cuda_moe_layer_init(&g, &reg, &c, gate, bias, t13, ts13, t2, ts2, m13, m2, &L[l],
					&e)) {
			fprintf(stderr, "dsv32 bench moe: %s\n", e.msg);
			return 1;
		}
		for (int r = 0; r < ranks; r++) { /* rank r's layer l: its experts' addresses only */
			int64_t e0, e1;
			moe_rank_experts(E, r, ranks, &e0, &e1);
			if (cuda_moe_layer_init_rank(&g, &reg, &c, gate, bias, t13 + e0, ts13 + e0,
						     t2 + e0, ts2 + e0, m13, m2, r, ranks, &LR[r][l],
						     &e)) {
				fprintf(stderr, "dsv32 bench moe: %s\n", e.msg);
				return 1;
			}
		}
	}
	if (gpu_arena_init(&g, &arena, cuda_moe_scratch_bytes(&g, &c, max_T), &e)) {
		fprintf(stderr, "dsv32 bench moe: %s\n", e.msg);
		return 1;
	}
	if (nl > 1)
		printf("%d layers in turn (each its own router and shared expert; the routed experts "
		       "common)\n", nl);

	const double exp_bytes = (double)n13 + n2 + ns13 + ns2; /* one expert's weights + scales */
	const double sh_bytes = 3.0 * Ish * D + (double)(2 * Ish / 128) * (D / 128) * 4 +
				(double)(D / 128) * (Ish / 128) * 4;
	const double sh13_bytes = 2.0 * Ish * D + (double)(2 * Ish / 128) * (D / 128) * 4;
	const double gate_bytes = (double)E * D * 2;
	int Ts[16] = {1, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096}, nT = 10;
	if (tokens) {
		nT = 0;
		for (const char *p = tokens; *p && nT < 16; p++) {
			int v = atoi(p);
			if (v < 1 || v > max_T) {
				fprintf(stderr, "dsv32 bench moe: --tokens: %d is outside 1 .. %d\n", v, max_T);
				return 2;
			}
			Ts[nT++] = v;
			while (p[1] && *p != ',')
				p++;
		}
	}
	int rc_all = 0;
	for (int ti = 0; ti < nT; ti++) {
		const int T = Ts[ti];
		struct moe_bench b = {&g, &arena, &c, L, nl, 0, &tr, x, y, T, CUDA_MOE_ALL | mode, 0};
		const int reps = T >= 1024 ? 3 : T >= 128 ? 8 : 20; /* (the whole bench under a minute) */
		float block = time_ms(&b, reps, trials, 0, 1), block_graph = time_ms(&b, reps, trials, 1, 1);
		/* --sustain: the graph replayed for about that long at once (the clocks the power cap
		 * leaves a long prefill, where the runs above start from an idle GPU) */
		const int replays = block_graph > 0 ? (int)(sustain_ms / (block_graph * reps)) + 1 : 1;
		long long sus_mj = -1;
		float block_sus = sustain_ms > 0 && block_graph > 0
					  ? time_ms_mj(&b, reps, 1, 1, replays, &sus_mj)
					  : -1;
		/* the experts the timed runs hit, from the device's routing: each layer's (their
		 * routers differ) run once more, the mean of their counts (the runs rotate over the
		 * layers); the rows per expert below are the last layer's */
		double distinct = 0;
		int bad = block < 0;
		for (int l = 0; l < nl && !bad; l++) {
			b.next = l;
			bad = run_stages(&b) || gpu_sync(&g) ||
			      gpu_download(&g, idx, tr.idx, (size_t)T * K * 4);
			unsigned char hit[256] = {0};
			for (int i = 0; i < T * K && !bad; i++)
				if (idx[i] >= 0 && idx[i] < E && !hit[idx[i]])
					hit[idx[i]] = 1, distinct += 1.0 / nl;
		}
		if (bad) {
			printf("T=%d: the block failed\n", T);
			rc_all = 1;
			continue;
		}
		const double R = (double)T * K;
		const double f13 = 2.0 * R * 2 * I * D, f2 = 2.0 * R * D * I;
		const double fsh = 2.0 * T * 3.0 * Ish * D, fgate = 2.0 * T * E * D;
		const double touched = distinct * exp_bytes + sh_bytes + gate_bytes;
		/* rows per expert; the grouped GEMMs' token tiles over them and the shared expert's T
		 * rows (128-row tiles, their 64-row halves, rows rounded up to 16: the token-wide form)
		 * against the R + T rows */
		int most = 0, least = T * K;
		long long t128 = (T + 127) / 128, t64 = (T + 63) / 64, r16 = (T + 15) / 16 * 16;
		for (int e2 = 0; e2 < E; e2++) {
			int n = 0;
			for (int i = 0; i < T * K; i++)
				n += idx[i] == e2;
			most = n > most ? n : most;
			least = n && n < least ? n : least;
			t128 += (n + 127) / 128, t64 += (n + 63) / 64, r16 += (n + 15) / 16 * 16;
		}
		printf("\nT=%d tokens: %d rows routed to %.2f distinct experts (at most %d rows one); "
		       "weights touched %.1f MB (experts %.1f MB, shared %.1f MB, router %.1f MB)\n",
		       T, T * K, distinct, most, touched / 1e6, distinct * exp_bytes / 1e6,
		       sh_bytes / 1e6, gate_bytes / 1e6);
		printf("  (%s)\n", cuda_moe_path(&g, &c, T, mode));
		const double rt = R + T;
		printf("  rows per expert hit %d .. %d; token tiles: %lld of 128 rows = %.2fx the %.0f "
		       "rows (64-row halves %.2fx), rows rounded up to 16 %.2fx\n",
		       least, most, t128, t128 * 128 / rt, rt, t64 * 64 / rt, r16 / rt);
		print_part("block", block, touched, f13 + f2 + fsh + fgate, read_tbs, peak);
		print_part("graph", block_graph, touched, f13 + f2 + fsh + fgate, read_tbs, peak);
		print_trace(&b, reps);
		if (sustain_ms > 0) {
			char what[32];
			snprintf(what, sizeof what, "sus%d", reps * replays);
			print_part(what, block_sus, touched, f13 + f2 + fsh + fgate, read_tbs, peak);
			/* the energy of those runs (NVML's counter, mJ steps): J a block, mean W */
			if (sus_mj > 0 && block_sus > 0)
				printf("  energy      %7.3f J a block (%.0f W over the %d sustained runs; "
				       "NVML)\n",
				       sus_mj / 1e3 / (reps * replays),
				       sus_mj / (block_sus * reps * replays), reps * replays);
		}
		printf("  stages alone, graph-replayed (weights, or for gather/swiglu/combine bytes read + "
		       "written):\n");
		static const struct {
			const char *name;
			unsigned stages;
		} parts[] = {{"gate", CUDA_MOE_GATE},     {"route", CUDA_MOE_ROUTE},
			     {"permute", CUDA_MOE_PERMUTE},
			     {"gather", CUDA_MOE_GATHER}, {"w13", CUDA_MOE_W13},
			     {"swiglu", CUDA_MOE_SWIGLU}, {"w2", CUDA_MOE_W2},
			     {"combine", CUDA_MOE_COMBINE}};
		float sum = 0;
		for (size_t p = 0; p < sizeof parts / sizeof *parts; p++) {
			b.stages = parts[p].stages | mode;
			float ms = time_ms(&b, reps, trials, 1, 1);
			double by = 0, fl = 0;
			switch (parts[p].stages) {
			case CUDA_MOE_GATE: by = gate_bytes, fl = fgate; break;
			/* the grouped GEMMs include the shared expert (one more group) */
			case CUDA_MOE_W13:
				by = distinct * ((double)n13 + ns13) + sh13_bytes, fl = f13 + 2 * fsh / 3;
				break;
			case CUDA_MOE_W2:
				by = distinct * ((double)n2 + ns2) + (sh_bytes - sh13_bytes), fl = f2 + fsh / 3;
				break;
			/* the memory-bound stages: bytes read + written */
			/* x read once, R + T rows written (k_moe_quant_scatter) */
			case CUDA_MOE_GATHER: by = 2.0 * T * D + (double)(R + T) * D; break;
			case CUDA_MOE_SWIGLU: by = (R + T) * (2.0 * I * 2 + I); break;
			case CUDA_MOE_COMBINE: by = R * (double)D * 2 + 4.0 * T * D; break;
			default: break;
			}
			print_part(parts[p].name, ms, by, fl, read_tbs, peak);
			sum += ms > 0 ? ms : 0;
			rc_all |= ms < 0;
		}
		printf("  (stages sum %.1f us; block %.1f us eager, %.1f us graph-replayed)\n", sum * 1e3,
		       block * 1e3, block_graph * 1e3);
		if (ranks)
			rc_all |= bench_ranks(&b, LR, ranks, reps, trials, exp_bytes, sh_bytes,
					      gate_bytes, read_tbs);
	}
	char hot_arg[160] = "";
	if (hot)
		snprintf(hot_arg, sizeof hot_arg, " --hot %d", hot);
	if (exact)
		snprintf(hot_arg + strlen(hot_arg), sizeof hot_arg - strlen(hot_arg), " --exact");
	if (tokens)
		snprintf(hot_arg + strlen(hot_arg), sizeof hot_arg - strlen(hot_arg), " --tokens %.100s",
			 tokens);
	if (sustain_ms)
		snprintf(hot_arg + strlen(hot_arg), sizeof hot_arg - strlen(hot_arg), " --sustain %d",
			 sustain_ms);
	snprintf(hot_arg + strlen(hot_arg), sizeof hot_arg - strlen(hot_arg), " --layers %d%s", nl,
		 weights_normal ? " --weights normal" : "");
	if (ranks)
		snprintf(hot_arg + strlen(hot_arg), sizeof hot_arg - strlen(hot_arg), " --ranks %d",
			 ranks);
	printf("\ncommand: %sdsv32 bench moe --trials %d%s (block: cuda_moe_forward launched "
	       "eagerly, "
	       "graph: the same captured into a CUDA graph and replayed; susN: N runs replayed "
	       "back to back for about the --sustain time (power-capped clocks), energy: the GPU's "
	       "over those runs (NVML); stages timed alone, "
	       "graph-replayed, on the data of a full run; TB/s of the weights each touches; FLOPs "
	       "2*rows*N*K per GEMM, the block's include the router)\n",
	       mode ? "DSV32_CUDA_UNFUSED=1 " : "", trials, hot_arg);
	cuda_gemm_close(&g);
	gpu_close(&g);
	return rc_all;
}
#endif
