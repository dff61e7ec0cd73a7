/*
 * cmd_bench_model.c — `dsv32 bench model`: the whole model on the GPU at real dimensions
 * (issue 12). With --synthetic no checkpoint is needed: `mkmodel real --header-only` (the
 * mkmodel binary next to this one) writes every tensor's name, dtype and shape with the big
 * tensors left as file holes into a temporary directory, and the CUDA backend generates those
 * on the GPU (model/cuda_synth.h); --model DIR benchmarks a real checkpoint instead.
 *
 *   dsv32 bench model (--synthetic [--layers N] [--dense K] [--seed S] | --model DIR)
 *                     [--batches LIST] [--contexts LIST] [--prompts LIST] [--steps N]
 *                     [--warmup N] [--kv-pages N] [--graphs off|on|both] [--full]
 *                     [--prefill-reps N] [--profile] [--keep] [--daemon] [--batch-invariant]
 *                     [--pageable-logits] [--ab NAME=VALUE]... [--mtp-draft]
 *
 * --batch-invariant: the CUDA backend's batch-invariant mode (backend_cuda_opts; the daemon
 * gets the flag too); without it its fast paths. The "backend:" line says which runs.
 * --mtp-draft with --daemon: dsv32d drafts with the MTP layer (sched_config.mtp_draft); with
 * synthetic weights the drafts are ~never right, so this times what drafting costs. In process:
 * see below.
 * The decode steps' logits go into the backend's own host memory (backend_host_alloc: pinned,
 * the download lands there directly), as the scheduler's do; --pageable-logits: a malloc'd
 * buffer instead (the backend then stages the download through its pinned buffer).
 * --ab NAME=VALUE (up to 8): after each decode point's row, the same steps again (graph mode,
 * or eager with --graphs off) with one of the CUDA forward's switches set (backend_cuda_set_switch:
 * docs/CONFIG.md; e.g. DSV32_CUDA_FWD_SKIP=k_fwd_rmsnorm_1k, timing by subtraction), then with
 * the switch back to the environment's value, one line each with the difference (the default
 * measured right after each variant: run 17 saw the first row ~20 us slower than later ones).
 * In the same process, on the same KV and weights: the A/B is not blurred by another start-up.
 *
 * Decode: for each context x batch (default 1K/32K/128K x 1/16/128, which fits a GPU session's
 * time; --full: issue 12's 1K/8K/32K/128K x 1/16/64/128; a corner whose pages do not fit the KV
 * pool is skipped and said so) every sequence gets its own pages, filled
 * with synthetic KV for positions [0, context) (backend_cuda_kv_fill_synthetic: the real
 * KV-write kernels), then decode steps of one new token per sequence at position = context,
 * logits for every row as the engine asks them: warm-up, then the median of --steps steps
 * (wall time of backend_step, which returns with the logits on the host), eagerly and through
 * CUDA graphs (the switch DSV32_CUDA_GRAPHS=0/1, backend_cuda_set_switch). Printed: step time,
 * per token, per layer (step / main layers), bytes per step, FLOPs per step and the ratio to
 * the HBM roofline (bytes / the streaming read limit measured in the same run, before the
 * backend takes the memory; tools/cli/bench_gpu.h), x_roof, and to the roofline at the measured
 * device-to-device copy bandwidth (read + write bytes over time, the same run), x_copy: issue
 * 12 names the copy bandwidth; the read limit is the stricter of the two (decode only reads).
 *   Bytes per step = weights touched + KV read. Weights: every layer's attention and indexer
 *   projections, the dense FFNs, per MoE layer the router, the shared expert and the distinct
 *   routed experts hit (the expectation under uniform routing, E (1 - (1 - k/E)^B): 163 of 256
 *   at batch 32, 222 at 64; until session 12 batch >= 32 counted all E, 57% more expert bytes
 *   than that at batch 32, so x_roof read 0.88 there), the embedding rows and lm_head; FP8
 *   block scales included. KV, per row and layer: the indexer keys of the whole context
 *   ((ctx + 1) x (index_head_dim + 4)) and min(ctx + 1, index_topk) MLA records. The MTP layer
 *   does not run in a decode step.
 *   FLOPs: 2 x MACs of every projection per row (experts: top-k + shared), the indexer scores
 *   (2 x index heads x index_head_dim x keys), the absorbed MLA over the selected keys
 *   (2 x heads x keys x (2 kv_lora_rank + rope)), lm_head.
 * Prefill: one sequence per prompt length (default 4K, 32K) in chunks of SCHED_CHUNK tokens
 * (the scheduler's per-step token budget, max_batch_tokens, whose default is 2048 in
 * model/engine.c and boot/conf.c), logits for the last row only; tokens/s and TFLOP/s, the
 * median of --prefill-reps runs after a warm-up (one 2048-token chunk).
 * --mtp-draft (in process): after each decode point, the two steps of a drafting decode
 *   (model/sched.h) timed the same way: the verification (two rows a sequence, the token and a
 *   draft, at positions context and context + 1, both with logits, their final hidden rows
 *   kept: BACKEND_ROW_KEEP) and the MTP step (one row a sequence at position context, h_i from
 *   the verification's kept rows, logits: the next draft). Printed: both times, their sum (a
 *   drafting cycle) against the plain step, and the acceptance that cycle needs to pay: a cycle
 *   gives 1 + a tokens a sequence at acceptance a, so it pays above a = cycle / plain - 1.
 * --profile: after each decode point / prompt length, extra eager steps with the switch
 * DSV32_CUDA_PROFILE=1
 * (the forward's GPU time between consecutive ops, model/cuda_forward.h) and the per-op table,
 * on stderr; the timed steps are never profiled.
 * --daemon: starts dsv32d --backend cuda (next to this binary; --synthetic-weights on the
 * header-only checkpoint) on a private socket, connects with the client library and measures
 * the time to first token of 1K and 4K-token prompts (client side: submit to the first token
 * event; the server's own figure beside it) and the streaming rate after the first token; then
 * 16 and 32 sampled requests submitted together (the scheduler's batches; their draws on the
 * GPU unless DSV32_CUDA_DRAW=0): all their tokens over the wall time.
 * It never prints a number it did not measure. Exit: 0, 1 (failure), 2 (usage).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver/gpu.h"
#include "ipc/dsv32.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/cuda_forward.h"
#include "model/kv_cache.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tools/cli/bench_gpu.h"
#include "tools/cli/cli.h"

extern char **environ;

#define SCHED_CHUNK 2048 /* prefill tokens per step: the default max_batch_tokens */
#define MAX_LIST 16

struct opts {
	int synthetic, keep, daemon, batch_invariant, mtp_draft;
	int pageable_logits; /* --pageable-logits: the decode logits malloc'd, not backend_host_alloc */
	const char *ab[8];   /* --ab NAME=VALUE: switch settings timed after each decode point */
	int n_ab;
	const char *model;
	int64_t layers, dense;
	uint64_t seed;
	int64_t batches[MAX_LIST], contexts[MAX_LIST], prompts[MAX_LIST];
	int n_batches, n_contexts, n_prompts;
	int64_t steps, warmup, kv_pages, prefill_reps;
	int graphs; /* decode modes timed: bit 0 eager, bit 1 CUDA graphs */
	int profile; /* --profile: the forward's per-op GPU profile of each point (extra steps) */
	char cmdline[1024]; /* the arguments, for the closing "command:" line */
};

static int usage(void)
{
	fprintf(stderr,
		"usage: dsv32 bench model (--synthetic [--layers N] [--dense K] [--seed S] | --model DIR)\n"
		"                         [--batches LIST] [--contexts LIST] [--prompts LIST] [--steps N]\n"
		"                         [--warmup N] [--kv-pages N] [--graphs off|on|both] [--full]\n"
		"                         [--prefill-reps N] [--profile] [--keep] [--daemon]\n"
		"                         [--batch-invariant] [--pageable-logits] [--ab NAME=VALUE]...\n"
		"                         [--mtp-draft [K]]\n"
		"  --synthetic      header-only checkpoint at the real dimensions (mkmodel real), big\n"
		"                   tensors generated on the GPU; --layers N (default 4) of which --dense K\n"
		"                   (default 1) dense; --seed S (default 1)\n"
		"  --model DIR      a real checkpoint instead\n"
		"  --batches LIST   decode batch sizes (default 1,16,128; --full: 1,16,64,128)\n"
		"  --contexts LIST  decode contexts in tokens (default 1024,32768,131072; --full:\n"
		"                   1024,8192,32768,131072; none: no decode)\n"
		"  --prompts LIST   prefill prompt lengths (default 4096,32768; --daemon: 1024,4096; none)\n"
		"  --steps N        timed decode steps per point (default 10), after --warmup N (default 2)\n"
		"  --prefill-reps N timed prefills per prompt length after a warm-up (default 1)\n"
		"  --profile        after each point, the forward's per-op GPU profile of extra eager\n"
		"                   steps (3 decode steps / one prefill; DSV32_CUDA_PROFILE), on stderr\n"
		"  --kv-pages N     cap the KV pool (default: what GPU memory holds)\n"
		"  --graphs MODE    decode steps eager (off), through CUDA graphs (on) or both (default)\n"
		"  --keep           keep the temporary checkpoint directory\n"
		"  --daemon         time to first token and streaming rate through dsv32d instead\n"
		"  --batch-invariant the CUDA backend's batch-invariant mode (default: its fast paths)\n"
		"  --mtp-draft [K]  with --daemon: dsv32d --mtp-draft K (default 1; speculative decoding\n"
		"                   by the MTP layer; synthetic weights: drafts ~never right, i.e. its\n"
		"                   cost); without: after each decode point, a one-draft decode's two\n"
		"                   steps (verification and MTP step) and the acceptance they need to pay\n"
		"  --pageable-logits the decode logits into malloc'd memory (default: the backend's\n"
		"                   host memory, pinned on CUDA, as the scheduler's)\n"
		"  --ab NAME=VALUE  after each decode point, its steps again with this CUDA forward switch\n"
		"                   (docs/CONFIG.md; up to 8, each on its own line with the difference)\n");
	return 2;
}

/* A non-negative integer in [lo, hi]; prints a message naming the flag and value otherwise. */
static int parse_int(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out)
{
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (errno || end == v || *end) {
		fprintf(stderr, "dsv32 bench model: %s \"%s\": not an integer\n", flag, v);
		return -EINVAL;
	}
	if (x < lo || x > hi) {
		fprintf(stderr, "dsv32 bench model: %s %lld: out of range [%lld, %lld]\n", flag, x,
			(long long)lo, (long long)hi);
		return -ERANGE;
	}
	*out = x;
	return 0;
}

/* "1,16,64" -> values in [lo, hi]; at most MAX_LIST; "none" -> no values. */
static int parse_list(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out, int *n)
{
	*n = 0;
	if (!strcmp(v, "none"))
		return 0;
	char buf[256];
	if (!*v || strlen(v) >= sizeof buf) {
		fprintf(stderr, "dsv32 bench model: %s \"%s\": expected a comma-separated list of integers\n",
			flag, v);
		return -EINVAL;
	}
	strcpy(buf, v);
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (*n == MAX_LIST) {
			fprintf(stderr, "dsv32 bench model: %s \"%s\": more than %d values\n", flag, v, MAX_LIST);
			return -E2BIG;
		}
		int r = parse_int(flag, tok, lo, hi, &out[*n]);
		if (r)
			return r;
		(*n)++;
	}
	if (!*n || v[strlen(v) - 1] == ',' || strstr(v, ",,") || v[0] == ',') {
		fprintf(stderr, "dsv32 bench model: %s \"%s\": expected a comma-separated list of integers\n",
			flag, v);
		return -EINVAL;
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	memset(o, 0, sizeof *o);
	o->layers = 4, o->dense = 1, o->seed = 1, o->steps = 10, o->warmup = 2, o->graphs = 3;
	int have_layers = 0, have_dense = 0, have_prompts = 0;
	/* the default grid fits the GPU session's time; --full is issue 12's */
	const int64_t b[] = {1, 16, 128}, c[] = {1024, 32768, 131072}, p[] = {4096, 32768};
	const int64_t fb[] = {1, 16, 64, 128}, fc[] = {1024, 8192, 32768, 131072};
	memcpy(o->batches, b, sizeof b), o->n_batches = 3;
	memcpy(o->contexts, c, sizeof c), o->n_contexts = 3;
	memcpy(o->prompts, p, sizeof p), o->n_prompts = 2;
	o->prefill_reps = 1;
	int have_batches = 0, have_contexts = 0, full = 0;
	size_t len = 0;
	for (int i = 1; i < argc && len < sizeof o->cmdline; i++)
		len += (size_t)snprintf(o->cmdline + len, sizeof o->cmdline - len, " %s", argv[i]);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int r = 0;
		if (!strcmp(a, "--synthetic")) {
			o->synthetic = 1;
			continue;
		}
		if (!strcmp(a, "--keep")) {
			o->keep = 1;
			continue;
		}
		if (!strcmp(a, "--daemon")) {
			o->daemon = 1;
			continue;
		}
		if (!strcmp(a, "--full")) {
			full = 1;
			continue;
		}
		if (!strcmp(a, "--profile")) {
			o->profile = 1;
			continue;
		}
		if (!strcmp(a, "--batch-invariant")) {
			o->batch_invariant = 1;
			continue;
		}
		if (!strcmp(a, "--mtp-draft")) { /* a count of drafts may follow (default 1) */
			o->mtp_draft = cli_flag_count(argc, argv, &i, 1);
			continue;
		}
		if (!strcmp(a, "--pageable-logits")) {
			o->pageable_logits = 1;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			return usage();
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		int known = !strcmp(a, "--model") || !strcmp(a, "--layers") || !strcmp(a, "--dense") ||
			    !strcmp(a, "--seed") || !strcmp(a, "--batches") || !strcmp(a, "--contexts") ||
			    !strcmp(a, "--prompts") || !strcmp(a, "--steps") || !strcmp(a, "--warmup") ||
			    !strcmp(a, "--kv-pages") || !strcmp(a, "--graphs") ||
			    !strcmp(a, "--prefill-reps") || !strcmp(a, "--ab");
		if (!known) {
			fprintf(stderr, "dsv32 bench model: unknown argument \"%s\"\n", a);
			return usage();
		}
		if (!v) {
			fprintf(stderr, "dsv32 bench model: %s needs a value\n", a);
			return 2;
		}
		i++;
		int64_t x;
		if (!strcmp(a, "--model"))
			o->model = v;
		else if (!strcmp(a, "--layers"))
			r = parse_int(a, v, 1, 61, &o->layers), have_layers = 1;
		else if (!strcmp(a, "--dense"))
			r = parse_int(a, v, 0, 61, &o->dense), have_dense = 1;
		else if (!strcmp(a, "--seed"))
			r = parse_int(a, v, 0, INT64_MAX, &x), o->seed = (uint64_t)x;
		else if (!strcmp(a, "--batches"))
			r = parse_list(a, v, 1, 4096, o->batches, &o->n_batches), have_batches = 1;
		else if (!strcmp(a, "--contexts"))
			r = parse_list(a, v, 1, 1 << 24, o->contexts, &o->n_contexts), have_contexts = 1;
		else if (!strcmp(a, "--prefill-reps"))
			r = parse_int(a, v, 1, 100, &o->prefill_reps);
		else if (!strcmp(a, "--prompts"))
			r = parse_list(a, v, 1, 1 << 24, o->prompts, &o->n_prompts), have_prompts = 1;
		else if (!strcmp(a, "--steps"))
			r = parse_int(a, v, 1, 100000, &o->steps);
		else if (!strcmp(a, "--warmup"))
			r = parse_int(a, v, 0, 1000, &o->warmup);
		else if (!strcmp(a, "--kv-pages"))
			r = parse_int(a, v, 1, INT64_C(1) << 32, &o->kv_pages);
		else if (!strcmp(a, "--ab")) {
			if (strncmp(v, "DSV32_", 6) || !strchr(v, '=') || o->n_ab == 8) {
				fprintf(stderr, "dsv32 bench model: --ab \"%s\": expected DSV32_...=VALUE (at "
						"most 8)\n", v);
				r = -EINVAL;
			} else {
				o->ab[o->n_ab++] = v;
			}
		} else if (!strcmp(a, "--graphs")) {
			o->graphs = !strcmp(v, "off") ? 1 : !strcmp(v, "on") ? 2 : !strcmp(v, "both") ? 3 : 0;
			if (!o->graphs) {
				fprintf(stderr, "dsv32 bench model: --graphs \"%s\": expected off, on or both\n", v);
				r = -EINVAL;
			}
		}
		if (r)
			return 2;
	}
	if (o->synthetic == !!o->model) {
		fprintf(stderr, "dsv32 bench model: give exactly one of --synthetic and --model DIR\n");
		return usage();
	}
	if (o->model && (have_layers || have_dense)) {
		fprintf(stderr, "dsv32 bench model: --layers and --dense describe a synthetic model; "
				"--model %s has its own\n", o->model);
		return 2;
	}
	if (o->dense > o->layers) {
		fprintf(stderr, "dsv32 bench model: --dense %lld exceeds --layers %lld\n",
			(long long)o->dense, (long long)o->layers);
		return 2;
	}
	if (!o->n_batches)
		o->n_contexts = 0; /* --batches none: no decode either */
	if (full && !have_batches)
		memcpy(o->batches, fb, sizeof fb), o->n_batches = 4;
	if (full && !have_contexts)
		memcpy(o->contexts, fc, sizeof fc), o->n_contexts = 4;
	if (o->daemon && !have_prompts) {
		o->prompts[0] = 1024, o->prompts[1] = 4096, o->n_prompts = 2;
	}
	return 0;
}

#ifdef DSV32_NO_CUDA
int bench_model(int argc, char **argv)
{
	struct opts o;
	int r = parse_args(argc, argv, &o);
	if (r)
		return r;
	fprintf(stderr, "dsv32 bench model: this build has no CUDA support (static or no toolkit)\n");
	return 1;
}
#else

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ---- programs next to this one, the temporary checkpoint ----------------------------------- */

/* dir of /proc/self/exe + "/" + name */
static int sibling(const char *name, char *out, size_t n)
{
	char exe[PATH_MAX];
	ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (k <= 0)
		return -errno;
	exe[k] = 0;
	char *slash = strrchr(exe, '/');
	if (!slash)
		return -EINVAL;
	*slash = 0;
	if ((size_t)snprintf(out, n, "%s/%s", exe, name) >= n)
		return -ENAMETOOLONG;
	return access(out, X_OK) ? -errno : 0;
}

/* Runs argv[0] with argv, stdout and stderr inherited; returns its exit status or -errno. */
static int run_wait(char *const *argv)
{
	pid_t pid;
	int r = posix_spawn(&pid, argv[0], NULL, NULL, argv, environ);
	if (r)
		return -r;
	int st;
	if (waitpid(pid, &st, 0) < 0)
		return -errno;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Removes the flat directory mkmodel wrote (files only). */
static void remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (d) {
		struct dirent *ent;
		while ((ent = readdir(d)))
			if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, ".."))
				unlinkat(dirfd(d), ent->d_name, 0);
		closedir(d);
	}
	rmdir(dir);
}

/* TMPDIR/dsv32-bench-XXXXXX with a header-only real-dimension checkpoint. 0 or 1. */
static int make_synthetic(const struct opts *o, char *dir, size_t n)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, n, "%s/dsv32-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		fprintf(stderr, "dsv32 bench model: cannot create %s: %s\n", dir, strerror(errno));
		return 1;
	}
	char mk[PATH_MAX], layers[32], dense[32];
	int r = sibling("mkmodel", mk, sizeof mk);
	if (r) {
		fprintf(stderr, "dsv32 bench model: no mkmodel next to this dsv32 (%s): %s\n", mk,
			strerror(-r));
		rmdir(dir);
		return 1;
	}
	snprintf(layers, sizeof layers, "%lld", (long long)o->layers);
	snprintf(dense, sizeof dense, "%lld", (long long)o->dense);
	char *argv[] = {mk, "real", "--layers", layers, "--dense", dense, "--header-only",
			"--tokenizer", "fallback", "--out", dir, NULL};
	double t0 = now_s();
	r = run_wait(argv);
	if (r) {
		fprintf(stderr, "dsv32 bench model: %s real --layers %s --dense %s --header-only --out %s "
				"failed (status %d)\n", mk, layers, dense, dir, r);
		remove_dir(dir);
		return 1;
	}
	printf("header-only checkpoint: %s (%lld layers, %lld dense) in %.2f s\n", dir,
	       (long long)o->layers, (long long)o->dense, now_s() - t0);
	return 0;
}

/* ---- bytes and FLOPs of a step ------------------------------------------------------------- */

/* bytes of an FP8 [out, in] weight with its fp32 128x128 block scales */
static double fp8_bytes(int64_t out, int64_t in)
{
	return (double)out * (double)in + (double)((out + 127) / 128) * (double)((in + 127) / 128) * 4;
}

struct cost {
	double weights; /* bytes of weights read */
	double kv;      /* bytes of KV cache read */
	double flops;
	double experts; /* distinct routed experts per MoE layer */
};

/* Attention + indexer projections of one layer: bytes, and MACs per row. */
static void attn_proj(const struct dsv32_config *c, double *bytes, double *macs)
{
	const int64_t H = c->hidden_size, nh = c->num_attention_heads;
	int64_t shapes[7][2] = {
		{c->q_lora_rank, H},
		{nh * c->qk_head_dim, c->q_lora_rank},
		{c->kv_lora_rank + c->qk_rope_head_dim, H},
		{nh * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank},
		{H, nh * c->v_head_dim},
		{c->index_n_heads * c->index_head_dim, c->q_lora_rank},
		{c->index_head_dim, H},
	};
	*bytes = 0, *macs = 0;
	for (int i = 0; i < 7; i++) {
		*bytes += fp8_bytes(shapes[i][0], shapes[i][1]);
		*macs += (double)shapes[i][0] * (double)shapes[i][1];
	}
	*bytes += 2.0 * c->index_n_heads * H; /* weights_proj, bf16 */
	*macs += (double)c->index_n_heads * H;
}

/* One decode step of B rows, each at position ctx (ctx + 1 keys). */
static struct cost decode_cost(const struct dsv32_config *c, int64_t B, int64_t ctx)
{
	struct cost k = {0};
	const int64_t H = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
	double ab, am;
	attn_proj(c, &ab, &am);
	const double keys = (double)ctx + 1, nsel = keys < c->index_topk ? keys : (double)c->index_topk;
	k.experts = (double)E * (1 - pow(1 - (double)K / (double)E, (double)B));
	for (int64_t l = 0; l < c->num_hidden_layers; l++) {
		k.weights += ab;
		k.flops += 2.0 * am * B;
		k.kv += B * (keys * (c->index_head_dim + 4) + nsel * (double)c->mla_record_bytes);
		k.flops += B * (2.0 * c->index_n_heads * c->index_head_dim * keys +
				2.0 * c->num_attention_heads * nsel * (2.0 * c->kv_lora_rank + c->qk_rope_head_dim));
		if (config_layer_is_moe(c, l)) {
			const int64_t I = c->moe_intermediate_size;
			k.weights += 2.0 * E * H + 4.0 * E; /* router, bias */
			k.weights += 3 * fp8_bytes(I * c->n_shared_experts, H);
			k.weights += k.experts * 3 * fp8_bytes(I, H);
			k.flops += 2.0 * B * ((double)E * H + 3.0 * I * H * (double)(K + c->n_shared_experts));
		} else {
			const int64_t I = c->intermediate_size;
			k.weights += 3 * fp8_bytes(I, H);
			k.flops += 2.0 * B * 3.0 * I * H;
		}
	}
	k.weights += 2.0 * B * H + 2.0 * c->vocab_size * H; /* embedding rows, lm_head */
	k.flops += 2.0 * B * (double)c->vocab_size * H;
	return k;
}

/* FLOPs of prefilling a P-token prompt (every expert's share by top-k; lm_head on one row). */
static double prefill_flops(const struct dsv32_config *c, int64_t P)
{
	const int64_t H = c->hidden_size, K = c->num_experts_per_tok;
	double ab, am, f = 0;
	attn_proj(c, &ab, &am);
	/* sum over positions p of keys = p + 1, and of min(p + 1, topk) */
	const double sum_keys = (double)P * (P + 1) / 2, T = (double)c->index_topk;
	const double sum_sel = P <= T ? sum_keys : T * (T + 1) / 2 + (double)(P - T) * T;
	for (int64_t l = 0; l < c->num_hidden_layers; l++) {
		f += 2.0 * am * P;
		f += 2.0 * c->index_n_heads * c->index_head_dim * sum_keys +
		     2.0 * c->num_attention_heads * sum_sel * (2.0 * c->kv_lora_rank + c->qk_rope_head_dim);
		if (config_layer_is_moe(c, l))
			f += 2.0 * P * ((double)c->n_routed_experts * H +
					3.0 * c->moe_intermediate_size * H * (double)(K + c->n_shared_experts));
		else
			f += 2.0 * P * 3.0 * c->intermediate_size * H;
	}
	return f + 2.0 * (double)c->vocab_size * H;
}

/* ---- the in-process benchmark -------------------------------------------------------------- */

/* --profile: the forward's per-op profile on (for eager steps only) or back to the
 * environment's setting. */
static void profile_switch(struct backend *be, int on)
{
	if (on) {
		backend_cuda_set_switch(be, "DSV32_CUDA_PROFILE", "1");
		backend_cuda_set_switch(be, "DSV32_CUDA_GRAPHS", "0"); /* it records eager steps only */
	} else {
		backend_cuda_set_switch(be, "DSV32_CUDA_PROFILE", getenv("DSV32_CUDA_PROFILE"));
	}
}

static int step_failed(int r)
{
	if (r == -ENOTSUP)
		fprintf(stderr, "dsv32 bench model: the CUDA backend cannot run the model yet "
				"(backend_step returned -ENOTSUP; its message is above): no timings "
				"printed\n");
	else
		fprintf(stderr, "dsv32 bench model: backend_step failed: %d (%s)\n", r, strerror(-r));
	return 1;
}

/* Warm-up, then the median wall time of o->steps steps st (*med, seconds; t: [o->steps]
 * scratch), eagerly (mode 0) or through CUDA graphs (1; the warm-up includes the capture).
 * 0, or 1 after a failed step (said). */
static int time_steps(const struct opts *o, struct backend *be, const struct backend_step *st,
		      int mode, double *t, double *med)
{
	backend_cuda_set_switch(be, "DSV32_CUDA_GRAPHS", mode ? "1" : "0");
	for (int64_t w = 0; w < o->warmup || w < 1; w++) {
		int r = backend_step(be, st);
		if (r)
			return step_failed(r);
	}
	for (int64_t s = 0; s < o->steps; s++) {
		double t0 = now_s();
		int r = backend_step(be, st);
		t[s] = now_s() - t0;
		if (r)
			return step_failed(r);
	}
	*med = median(t, (int)o->steps);
	return 0;
}

/* --mtp-draft in process: at a decode point of B sequences at position ctx (tokens, pages bt
 * of `blocks` each), a drafting decode's two steps timed like the plain one (whose time is
 * plain): the verification, two rows a sequence (the token, a draft) with logits and their
 * rows kept, then the MTP step on the kept rows, one logits row a sequence. logits holds 2B
 * rows. 0 or 1. */
static int bench_draft_cycle(const struct opts *o, struct backend *be, const int32_t *tokens,
			     int64_t B, int64_t ctx, const int32_t *bt, int64_t blocks, float *logits,
			     int64_t V, double plain, double *t)
{
	int64_t *pos = malloc((size_t)(2 * B) * sizeof *pos);
	int32_t *tok = malloc((size_t)(2 * B) * sizeof *tok);
	uint8_t *fl = malloc((size_t)(2 * B));
	struct backend_seq *v = calloc((size_t)B, sizeof *v), *m = calloc((size_t)B, sizeof *m);
	int rc = !pos || !tok || !fl || !v || !m;
	for (int64_t b = 0; b < B && !rc; b++) {
		tok[2 * b] = tokens[b], tok[2 * b + 1] = tokens[(b + 1) % B]; /* (any draft) */
		pos[2 * b] = ctx, pos[2 * b + 1] = ctx + 1;
		fl[2 * b] = fl[2 * b + 1] = BACKEND_ROW_LOGITS | BACKEND_ROW_KEEP;
		v[b] = (struct backend_seq){.n = 2, .tokens = tok + 2 * b, .pos = pos + 2 * b,
					    .block_table = bt + b * blocks, .n_blocks = blocks,
					    .flags = fl + 2 * b, .logits = logits + (size_t)(2 * b) * V};
		/* position ctx: its token x_{ctx+1} (the draft's row) and h_ctx (kept row 2b) */
		m[b] = (struct backend_seq){.n = 1, .tokens = tok + 2 * b + 1, .pos = pos + 2 * b,
					    .block_table = bt + b * blocks, .n_blocks = blocks,
					    .flags = NULL, .logits = logits + (size_t)b * V,
					    .mtp_hidden = NULL, .mtp_kept = 2 * b};
	}
	struct backend_step vs = {.mtp = 0, .n_seqs = B, .seqs = v}, ms = {.mtp = 1, .n_seqs = B, .seqs = m};
	double med[2][2] = {{0, 0}, {0, 0}}; /* [verification, MTP][eager, graphs] */
	for (int mode = 0; mode < 2 && !rc; mode++) {
		if (!(o->graphs & (1 << mode)))
			continue;
		/* the verification last before the MTP step: the kept rows are its */
		rc = time_steps(o, be, &vs, mode, t, &med[0][mode]);
		if (!rc)
			rc = time_steps(o, be, &ms, mode, t, &med[1][mode]);
	}
	if (!rc) {
		const int g = med[0][1] > 0; /* graphs where timed, as the plain step's time */
		double cycle = med[0][g] + med[1][g];
		printf("        drafting (--mtp-draft, %s): verification %.3f ms (2 rows a sequence), "
		       "MTP step %.3f ms; cycle %.3f ms = %.2fx the plain step: pays above an "
		       "acceptance of %.2f", g ? "graphs" : "eager", med[0][g] * 1e3, med[1][g] * 1e3,
		       cycle * 1e3, cycle / plain, cycle / plain - 1);
		if (g && med[0][0] > 0)
			printf(" (eager: %.3f + %.3f ms)", med[0][0] * 1e3, med[1][0] * 1e3);
		printf("\n");
	}
	free(pos), free(tok), free(fl), free(v), free(m);
	return rc;
}

static int bench_decode(const struct opts *o, const struct dsv32_config *c, struct backend *be,
			double read_tbs, double copy_tbs)
{
	const int64_t V = c->vocab_size, L = c->num_hidden_layers;
	int64_t maxB = 0;
	for (int i = 0; i < o->n_batches; i++)
		maxB = o->batches[i] > maxB ? o->batches[i] : maxB;
	size_t lbytes = (size_t)maxB * (size_t)V * sizeof(float) * (o->mtp_draft ? 2 : 1);
	float *logits = o->pageable_logits ? malloc(lbytes) : backend_host_alloc(be, lbytes);
	int32_t *tokens = malloc((size_t)maxB * sizeof *tokens);
	int64_t *pos = malloc((size_t)maxB * sizeof *pos);
	struct backend_seq *seqs = calloc((size_t)maxB, sizeof *seqs);
	int32_t *bt = NULL;
	double *t = malloc((size_t)o->steps * sizeof *t);
	int rc = 0;
	if (!logits || !tokens || !pos || !seqs || !t) {
		fprintf(stderr, "dsv32 bench model: out of memory for %lld rows of logits\n", (long long)maxB);
		rc = 1;
		goto out;
	}
	for (int64_t b = 0; b < maxB; b++)
		tokens[b] = (int32_t)(mix(o->seed + (uint64_t)b) % (uint64_t)(V - 2)) + 2;
	printf("\ndecode: %lld layers (%lld dense), one new token per sequence at position = context, "
	       "logits for every row (into %s host memory); median of %lld steps after %lld warm-up\n",
	       (long long)L, (long long)c->first_k_dense_replace,
	       o->pageable_logits ? "malloc'd, pageable" : "the backend's, pinned",
	       (long long)o->steps, (long long)o->warmup);
	printf("(eager_ms, graph_ms: step time without and with CUDA graphs; the columns after them "
	       "use the faster)\n");
	printf("%7s %5s | %9s %9s | %9s %9s | %8s %8s %7s | %9s %8s | %10s %7s %7s\n", "context",
	       "batch", "eager_ms", "graph_ms", "tok_us", "layer_us", "wts_GB", "kv_GB", "experts",
	       "GFLOP", "TFLOP/s", "roof_ms", "x_roof", "x_copy");
	for (int ci = 0; ci < o->n_contexts; ci++) {
		/* (pages to position ctx + 1: a drafting decode's second row) */
		const int64_t ctx = o->contexts[ci], last = ctx + !!o->mtp_draft;
		const int64_t blocks = last / KV_PAGE_TOKENS + 1;
		int64_t filled = 0; /* sequences whose KV holds [0, ctx) */
		free(bt);
		bt = malloc((size_t)(maxB * blocks) * sizeof *bt);
		if (!bt) {
			rc = 1;
			goto out;
		}
		for (int64_t i = 0; i < maxB * blocks; i++)
			bt[i] = (int32_t)i; /* sequence b: pages [b * blocks, (b + 1) * blocks) */
		if (last + 1 > c->max_position_embeddings) {
			printf("%7lld       | skipped: past max_position_embeddings %lld\n", (long long)ctx,
			       (long long)c->max_position_embeddings);
			continue;
		}
		for (int bi = 0; bi < o->n_batches; bi++) {
			const int64_t B = o->batches[bi];
			if (B * blocks > be->n_pages) {
				printf("%7lld %5lld | skipped: needs %lld KV pages, the pool has %lld\n",
				       (long long)ctx, (long long)B, (long long)(B * blocks),
				       (long long)be->n_pages);
				continue;
			}
			double tf = now_s();
			struct err e = {""};
			for (; filled < B; filled++) {
				int r = backend_cuda_kv_fill_synthetic(be, bt + filled * blocks, ctx,
								       o->seed + (uint64_t)filled, &e);
				if (r) {
					fprintf(stderr, "dsv32 bench model: synthetic KV fill failed: %s\n", e.msg);
					rc = 1;
					goto out;
				}
			}
			tf = now_s() - tf;
			for (int64_t b = 0; b < B; b++) {
				pos[b] = ctx;
				seqs[b] = (struct backend_seq){
					.n = 1, .tokens = &tokens[b], .pos = &pos[b],
					.block_table = bt + b * blocks, .n_blocks = blocks, .flags = NULL,
					.logits = logits + (size_t)b * (size_t)V,
				};
			}
			struct backend_step st = {.mtp = 0, .n_seqs = B, .seqs = seqs};
			/* eager, then through CUDA graphs (the warm-up of the graph run includes the
			 * capture) */
			double med[2] = {0, 0};
			for (int mode = 0; mode < 2; mode++) {
				if (!(o->graphs & (1 << mode)))
					continue;
				if ((rc = time_steps(o, be, &st, mode, t, &med[mode])))
					goto out;
			}
			if (o->profile) {
				profile_switch(be, 1);
				for (int k = 0; k < 3 && !rc; k++) {
					int r = backend_step(be, &st);
					if (r)
						rc = step_failed(r);
				}
				profile_switch(be, 0);
				if (rc)
					goto out;
			}
			int64_t bad = 0;
			for (size_t i = 0; i < (size_t)B * (size_t)V; i++)
				bad += !isfinite(logits[i]);
			double step = med[0] && (!med[1] || med[0] < med[1]) ? med[0] : med[1];
			struct cost k = decode_cost(c, B, ctx);
			double bytes = k.weights + k.kv, roof = bytes / (read_tbs * 1e12);
			char eager[16] = "-", graph[16] = "-";
			if (med[0])
				snprintf(eager, sizeof eager, "%.3f", med[0] * 1e3);
			if (med[1])
				snprintf(graph, sizeof graph, "%.3f", med[1] * 1e3);
			printf("%7lld %5lld | %9s %9s | %9.2f %9.2f | %8.3f %8.3f %7.1f | %9.1f %8.2f | %10.3f %7.2f %7.2f%s",
			       (long long)ctx, (long long)B, eager, graph, step * 1e6 / (double)B,
			       step * 1e6 / (double)L, k.weights / 1e9, k.kv / 1e9, k.experts,
			       k.flops / 1e9, k.flops / step / 1e12, roof * 1e3, step / roof,
			       step / (bytes / (copy_tbs * 1e12)), bad ? "" : "\n");
			if (bad)
				printf("  <- %lld non-finite logits\n", (long long)bad);
			/* --ab: the same steps with one switch changed, then back */
			const int ab_mode = o->graphs & 2 ? 1 : 0;
			for (int k = 0; k < o->n_ab; k++) {
				char name[64];
				snprintf(name, sizeof name, "%.*s", (int)(strchr(o->ab[k], '=') - o->ab[k]), o->ab[k]);
				if (backend_cuda_set_switch(be, name, strchr(o->ab[k], '=') + 1)) {
					fprintf(stderr, "dsv32 bench model: --ab %s: not a switch of the CUDA "
							"forward (docs/CONFIG.md)\n", o->ab[k]);
					rc = 1;
					goto out;
				}
				double m = 0, m0 = 0;
				rc = time_steps(o, be, &st, ab_mode, t, &m);
				backend_cuda_set_switch(be, name, getenv(name));
				if (!rc) /* the default again right after: drift apart (run 17: ~20 us) */
					rc = time_steps(o, be, &st, ab_mode, t, &m0);
				if (rc)
					goto out;
				printf("        %s_ms %.3f with %s (%+.1f us against the default's %.3f "
				       "measured right after)\n", ab_mode ? "graph" : "eager", m * 1e3, o->ab[k],
				       (m - m0) * 1e6, m0 * 1e3);
			}
			if (o->mtp_draft && (rc = bench_draft_cycle(o, be, tokens, B, ctx, bt, blocks, logits,
								    V, step, t)))
				goto out;
			if (filled == B && tf > 0.01)
				fprintf(stderr, "  (KV fill of %lld sequences x %lld tokens: %.2f s wall)\n",
					(long long)B, (long long)ctx, tf);
			if (o->profile) {
				fprintf(stderr, "profile: decode, context %lld, batch %lld:\n", (long long)ctx,
					(long long)B);
				cuda_forward_profile_print();
			}
		}
	}
out:
	backend_cuda_set_switch(be, "DSV32_CUDA_GRAPHS", getenv("DSV32_CUDA_GRAPHS"));
	if (o->pageable_logits)
		free(logits);
	else if (logits)
		backend_host_free(be, logits);
	free(tokens), free(pos), free(seqs), free(bt), free(t);
	return rc;
}

/* What one row's logits (V fp32) cost to bring to the host, part of every decode step's wall
 * time beside the GPU work: a synchronous copy into pageable memory (the backend's callers pass
 * malloc'd buffers), into pinned memory, and into pinned memory then a host copy; medians of 21. */
static void logits_download_times(struct gpu *g, int64_t V)
{
	size_t bytes = (size_t)V * 4;
	gpu_ptr d = 0;
	float *pg = malloc(bytes), *pn = gpu_host_alloc(bytes);
	double t[3][21];
	if (!pg || !pn || cu_check(cu.cuMemAlloc(&d, bytes), "cuMemAlloc", __FILE__, __LINE__))
		goto out;
	memset(pg, 0, bytes);
	for (int k = 0; k < 21; k++)
		for (int m = 0; m < 3; m++) {
			double t0 = now_s();
			if (cu.cuMemcpyDtoH(m ? (void *)pn : (void *)pg, d, bytes) != CUDA_SUCCESS)
				goto out;
			if (m == 2)
				memcpy(pg, pn, bytes);
			t[m][k] = now_s() - t0;
		}
	for (int m = 0; m < 3; m++)
		t[m][0] = median(t[m], 21);
	printf("logits download (%lld fp32, %.0f KB, one row): pageable %.1f us, pinned %.1f us, "
	       "pinned + host copy %.1f us\n", (long long)V, bytes / 1024.0, t[0][0] * 1e6, t[1][0] * 1e6,
	       t[2][0] * 1e6);
out:
	if (d)
		cu.cuMemFree(d);
	free(pg);
	gpu_host_free(pn);
}

static int bench_prefill(const struct opts *o, const struct dsv32_config *c, struct backend *be)
{
	const int64_t V = c->vocab_size;
	int64_t maxP = 0;
	for (int i = 0; i < o->n_prompts; i++)
		maxP = o->prompts[i] > maxP ? o->prompts[i] : maxP;
	const int64_t blocks = (maxP + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS;
	printf("\nprefill: one sequence, chunks of %d tokens (the scheduler's default step budget), "
	       "logits for the last row; median of %lld after a one-chunk warm-up\n", SCHED_CHUNK,
	       (long long)o->prefill_reps);
	if (blocks > be->n_pages) {
		printf("  skipped: a %lld-token prompt needs %lld KV pages, the pool has %lld\n",
		       (long long)maxP, (long long)blocks, (long long)be->n_pages);
		return 0;
	}
	int32_t *tokens = malloc((size_t)maxP * sizeof *tokens), *bt = malloc((size_t)blocks * sizeof *bt);
	int64_t *pos = malloc((size_t)maxP * sizeof *pos);
	uint8_t *flags = calloc((size_t)maxP, 1);
	float *logits = malloc((size_t)V * sizeof *logits);
	int rc = 0;
	if (!tokens || !bt || !pos || !flags || !logits) {
		rc = 1;
		goto out;
	}
	for (int64_t i = 0; i < maxP; i++)
		pos[i] = i, tokens[i] = (int32_t)(mix(o->seed * 7919 + (uint64_t)i) % (uint64_t)(V - 2)) + 2;
	for (int64_t i = 0; i < blocks; i++)
		bt[i] = (int32_t)i;
	printf("%7s | %10s %10s %9s %9s\n", "prompt", "time_ms", "chunk_ms", "tokens/s", "TFLOP/s");
	for (int pi = -1; pi < o->n_prompts; pi++) {
		const int64_t P = pi < 0 ? (o->prompts[0] < SCHED_CHUNK ? o->prompts[0] : SCHED_CHUNK)
					 : o->prompts[pi];
		double t[101];
		const int reps = pi < 0 ? 1 : (int)o->prefill_reps + (o->profile ? 1 : 0);
		for (int rep = 0; rep < reps; rep++) {
			if (o->profile)
				profile_switch(be, pi >= 0 && rep == reps - 1); /* the extra run */
			double t0 = now_s();
			for (int64_t p0 = 0; p0 < P; p0 += SCHED_CHUNK) {
				int64_t n = P - p0 < SCHED_CHUNK ? P - p0 : SCHED_CHUNK;
				flags[p0 + n - 1] = p0 + n == P ? BACKEND_ROW_LOGITS : 0;
				struct backend_seq s = {
					.n = n, .tokens = tokens + p0, .pos = pos + p0, .block_table = bt,
					.n_blocks = (p0 + n + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS,
					.flags = flags + p0, .logits = logits,
				};
				struct backend_step st = {.mtp = 0, .n_seqs = 1, .seqs = &s};
				int r = backend_step(be, &st);
				flags[p0 + n - 1] = 0;
				if (r) {
					rc = step_failed(r);
					goto out;
				}
			}
			t[rep] = now_s() - t0;
		}
		if (o->profile)
			profile_switch(be, 0);
		if (pi < 0)
			continue; /* warm-up */
		double s = median(t, (int)o->prefill_reps);
		int64_t chunks = (P + SCHED_CHUNK - 1) / SCHED_CHUNK;
		printf("%7lld | %10.2f %10.2f %9.0f %9.2f\n", (long long)P, s * 1e3,
		       s * 1e3 / (double)chunks, (double)P / s, prefill_flops(c, P) / s / 1e12);
		if (o->profile) {
			fprintf(stderr, "profile: prefill of %lld tokens (%lld steps):\n", (long long)P,
				(long long)chunks);
			cuda_forward_profile_print();
		}
	}
out:
	free(tokens), free(bt), free(pos), free(flags), free(logits);
	return rc;
}

static int bench_in_process(const struct opts *o, const char *dir)
{
	struct dsv32_config c;
	struct checkpoint ck;
	struct weights w;
	struct err e = {""};
	int rc = 1;
	if (config_load(&c, dir, &e) || ckpt_open(&ck, dir, &e)) {
		fprintf(stderr, "dsv32 bench model: %s\n", e.msg);
		return 1;
	}
	if (weights_bind(&w, &c, &ck, &e)) {
		fprintf(stderr, "dsv32 bench model: %s\n", e.msg);
		ckpt_close(&ck);
		return 1;
	}
	/* the read limit first: the backend then takes the GPU memory for its KV pool */
	struct gpu g;
	if (gpu_open(&g, 0, &e)) {
		fprintf(stderr, "dsv32 bench model: %s\n", e.msg);
		goto out_w;
	}
	double read_tbs = bench_read_limit(&g, 5), copy_tbs = bench_copy_limit(&g, 5);
	printf("GPU: %s; HBM streaming read (4 GiB): %.3f TB/s; device-to-device copy (2 GiB): %.3f "
	       "TB/s read + write\n", g.name, read_tbs, copy_tbs);
	logits_download_times(&g, c.vocab_size);
	gpu_close(&g);
	if (read_tbs <= 0 || copy_tbs <= 0)
		goto out_w;
	struct backend_cuda_opts bo = {.n_pages = o->kv_pages, .synthetic = o->synthetic, .seed = o->seed,
				       .batch_invariant = o->batch_invariant};
	struct backend *be;
	double t0 = now_s();
	if (backend_cuda_create_opts(&c, &w, &ck, &bo, &be, &e)) {
		fprintf(stderr, "dsv32 bench model: creating the CUDA backend failed: %s\n", e.msg);
		goto out_w;
	}
	printf("backend: %s, %lld layers + %lld MTP, %lld KV pages of 64 tokens, created in %.2f s%s\n"
	       "mode: %s\n",
	       be->ops->name, (long long)c.num_hidden_layers, (long long)c.num_nextn_predict_layers,
	       (long long)be->n_pages, now_s() - t0,
	       o->synthetic ? " (weights generated on the GPU)" : "", backend_cuda_mode(be));
	if (o->mtp_draft && be->n_layers <= c.num_hidden_layers) {
		fprintf(stderr, "dsv32 bench model: --mtp-draft: the model has no MTP layer\n");
		rc = 1;
	} else {
		rc = o->n_contexts ? bench_decode(o, &c, be, read_tbs, copy_tbs) : 0;
	}
	if (!rc && o->n_prompts)
		rc = bench_prefill(o, &c, be);
	if (!rc)
		printf("\ncommand: dsv32 bench model%s (decode bytes = weights touched + KV read; x_roof "
		       "= step / (bytes / the measured read limit); x_copy = step / (bytes / the measured "
		       "copy bandwidth))\n", o->cmdline);
	backend_destroy(be);
out_w:
	weights_free(&w);
	ckpt_close(&ck);
	return rc;
}

/* ---- through the daemon -------------------------------------------------------------------- */

struct daemon {
	pid_t pid;
	char sock[108], log[PATH_MAX];
};

static void show_log(const char *log)
{
	FILE *f = fopen(log, "r");
	if (!f)
		return;
	char line[1024];
	char ring[20][1024];
	int n = 0;
	while (fgets(line, sizeof line, f))
		snprintf(ring[n++ % 20], sizeof ring[0], "%s", line);
	fclose(f);
	for (int i = n > 20 ? n - 20 : 0; i < n; i++)
		fprintf(stderr, "  | %s", ring[i % 20]);
}

static int daemon_start(struct daemon *d, const struct opts *o, const char *model, const char *tmp)
{
	char exe[PATH_MAX], seed[32], socket_dir[PATH_MAX];
	int r = sibling("dsv32d", exe, sizeof exe);
	if (r) {
		fprintf(stderr, "dsv32 bench model: no dsv32d next to this dsv32: %s\n", strerror(-r));
		return 1;
	}
	snprintf(socket_dir, sizeof socket_dir, "%s", tmp);
	if ((size_t)snprintf(d->sock, sizeof d->sock, "%s/bench.sock", socket_dir) >= sizeof d->sock) {
		fprintf(stderr, "dsv32 bench model: socket path under %s too long\n", socket_dir);
		return 1;
	}
	if ((size_t)snprintf(d->log, sizeof d->log, "%s/dsv32d.log", tmp) >= sizeof d->log)
		return 1;
	snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
	char kvp[32];
	snprintf(kvp, sizeof kvp, "%lld", (long long)o->kv_pages);
	char *argv[24];
	int n = 0;
	argv[n++] = exe, argv[n++] = "--model", argv[n++] = (char *)model;
	argv[n++] = "--backend", argv[n++] = "cuda", argv[n++] = "--socket", argv[n++] = d->sock;
	argv[n++] = "--max-prompt-tokens", argv[n++] = "1048576";
	argv[n++] = "--kv-pages", argv[n++] = kvp;
	if (o->synthetic)
		argv[n++] = "--synthetic-weights", argv[n++] = seed;
	if (o->batch_invariant)
		argv[n++] = "--batch-invariant", argv[n++] = "1";
	char drafts[8];
	snprintf(drafts, sizeof drafts, "%d", o->mtp_draft);
	if (o->mtp_draft)
		argv[n++] = "--mtp-draft", argv[n++] = drafts;
	argv[n] = NULL;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	r = posix_spawn(&d->pid, exe, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (r) {
		fprintf(stderr, "dsv32 bench model: cannot start %s: %s\n", exe, strerror(r));
		return 1;
	}
	printf("dsv32d: %s --model %s --backend cuda%s%s%s%s%s (log %s)\n", exe, model,
	       o->synthetic ? " --synthetic-weights " : "", o->synthetic ? seed : "",
	       o->batch_invariant ? " --batch-invariant 1" : "",
	       o->mtp_draft ? " --mtp-draft " : "", o->mtp_draft ? drafts : "", d->log);
	double t0 = now_s();
	for (;;) {
		dsv32_t *h;
		if (dsv32_connect(d->sock, &h) == 0) {
			dsv32_close(h);
			printf("dsv32d ready (loaded, warmed up, serving) after %.2f s\n", now_s() - t0);
			return 0;
		}
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			fprintf(stderr, "dsv32 bench model: dsv32d exited during start-up (%s %d); the end "
					"of its log:\n", WIFEXITED(st) ? "status" : "signal",
				WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			show_log(d->log);
			d->pid = 0;
			return 1;
		}
		if (now_s() - t0 > 600) {
			fprintf(stderr, "dsv32 bench model: dsv32d not serving after 600 s; its log:\n");
			show_log(d->log);
			return 1;
		}
		usleep(50000);
	}
}

static void daemon_stop(struct daemon *d)
{
	if (d->pid <= 0)
		return;
	kill(d->pid, SIGTERM);
	int st;
	double t0 = now_s();
	while (waitpid(d->pid, &st, WNOHANG) != d->pid) {
		if (now_s() - t0 > 60) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
			break;
		}
		usleep(20000);
	}
	d->pid = 0;
}

/* One request of P random tokens, max_tokens gen, greedy. 0 or 1 (message printed). */
static int one_request(dsv32_t *h, uint64_t id, int64_t P, uint32_t gen, uint32_t vocab,
		       double *ttft, double *rate, double *server_ttft, uint32_t *n_out)
{
	uint32_t *toks = malloc((size_t)P * sizeof *toks);
	if (!toks)
		return 1;
	for (int64_t i = 0; i < P; i++) /* the id in the first token: no prefix-cache hit */
		toks[i] = (uint32_t)(mix(id * 1000003 + (uint64_t)i) % (vocab - 2)) + 2;
	struct dsv32_generate_params p;
	dsv32_generate_params_init(&p, id);
	p.input = DSV32_INPUT_TOKENS;
	p.tokens = toks;
	p.n_tokens = (size_t)P;
	p.max_tokens = gen;
	double t0 = now_s(), t_first = 0, t_last = 0;
	int r = dsv32_submit_generate(h, &p);
	free(toks);
	if (r) {
		fprintf(stderr, "dsv32 bench model: submit failed: %s\n", strerror(-r));
		return 1;
	}
	uint32_t got = 0;
	for (;;) {
		struct dsv32_event ev;
		r = dsv32_wait(h, 600000, &ev);
		if (r <= 0) {
			fprintf(stderr, "dsv32 bench model: %s waiting for request %llu\n",
				r == 0 ? "timeout (600 s)" : "connection lost", (unsigned long long)id);
			return 1;
		}
		if (ev.request_id != id)
			continue;
		if (ev.type == DSV32_EVENT_TOKEN) {
			t_last = now_s();
			if (!got)
				t_first = t_last;
			got += ev.token.n_tokens;
		} else if (ev.type == DSV32_EVENT_ERROR) {
			fprintf(stderr, "dsv32 bench model: request failed: %s: %s\n",
				dsv32_error_name(ev.error.code), ev.error.message);
			return 1;
		} else if (ev.type == DSV32_EVENT_DONE) {
			if (!got) {
				fprintf(stderr, "dsv32 bench model: request ended (%s) without a token\n",
					dsv32_finish_name((int)ev.done.reason));
				return 1;
			}
			*ttft = t_first - t0;
			*rate = got > 1 && t_last > t_first ? (got - 1) / (t_last - t_first) : 0;
			*server_ttft = ev.done.ttft_us * 1e-6;
			*n_out = got;
			return 0;
		}
	}
}

/* B requests of P random tokens submitted together (temperature 1, top_p 0.95, seeded; gen new
 * tokens each), answered in one batch: tokens over the wall time from the first submit to the
 * last done event. 0 or 1 (message printed). */
static int batch_requests(dsv32_t *h, uint64_t *id, int B, int64_t P, uint32_t gen,
			  uint32_t vocab, double *tok_s, double *wall)
{
	uint32_t *toks = malloc((size_t)P * sizeof *toks);
	if (!toks)
		return 1;
	double t0 = now_s();
	uint64_t first = *id;
	for (int b = 0; b < B; b++, (*id)++) {
		for (int64_t i = 0; i < P; i++)
			toks[i] = (uint32_t)(mix(*id * 1000003 + (uint64_t)i) % (vocab - 2)) + 2;
		struct dsv32_generate_params p;
		dsv32_generate_params_init(&p, *id);
		p.input = DSV32_INPUT_TOKENS;
		p.tokens = toks;
		p.n_tokens = (size_t)P;
		p.max_tokens = gen;
		p.temperature = 1.0f;
		p.top_p = 0.95f;
		p.seed = *id;
		int r = dsv32_submit_generate(h, &p);
		if (r) {
			fprintf(stderr, "dsv32 bench model: submit failed: %s\n", strerror(-r));
			free(toks);
			return 1;
		}
	}
	free(toks);
	uint64_t got = 0;
	for (int done = 0; done < B;) {
		struct dsv32_event ev;
		int r = dsv32_wait(h, 600000, &ev);
		if (r <= 0 || ev.request_id < first || ev.request_id >= *id ||
		    ev.type == DSV32_EVENT_ERROR) {
			fprintf(stderr, "dsv32 bench model: batch of %d: %s\n", B,
				r == 0 ? "timeout (600 s)" : r < 0 ? "connection lost"
				: ev.type == DSV32_EVENT_ERROR ? ev.error.message : "a stray event");
			return 1;
		}
		if (ev.type == DSV32_EVENT_TOKEN)
			got += ev.token.n_tokens;
		done += ev.type == DSV32_EVENT_DONE;
	}
	*wall = now_s() - t0;
	*tok_s = (double)got / *wall;
	return 0;
}

/* The daemon's MTP drafting counters (its stats' mtp_* lines), printed as they come. */
static void print_draft_stats(dsv32_t *h, uint64_t id)
{
	static char text[1 << 16];
	int r = cli_fetch_stats(h, id, text, sizeof text);
	if (r != 1) {
		printf("\ndsv32d's drafts: no stats (%d%s%s)\n", r, *text ? ": " : "", text);
		return;
	}
	printf("\ndsv32d's drafts (all requests above):");
	for (const char *p = text; (p = strstr(p, "mtp_"));) {
		int len = (int)strcspn(p, "\n");
		printf(" %.*s;", len, p);
		p += len;
	}
	printf("\n");
}

static int bench_daemon(const struct opts *o, const char *model, const char *tmp)
{
	struct dsv32_config c;
	struct err e = {""};
	if (config_load(&c, model, &e)) {
		fprintf(stderr, "dsv32 bench model: %s\n", e.msg);
		return 1;
	}
	struct daemon d = {0};
	if (daemon_start(&d, o, model, tmp)) {
		daemon_stop(&d);
		return 1;
	}
	dsv32_t *h;
	int r = dsv32_connect(d.sock, &h), rc = 0;
	if (r) {
		fprintf(stderr, "dsv32 bench model: connect: %s\n", strerror(-r));
		daemon_stop(&d);
		return 1;
	}
	const uint32_t gen = 64;
	uint64_t id = 1;
	double ttft, rate, sttft;
	uint32_t n_out;
	if (one_request(h, id++, 16, 4, (uint32_t)c.vocab_size, &ttft, &rate, &sttft, &n_out)) {
		rc = 1; /* warm-up */
		goto out;
	}
	printf("\nthrough dsv32d (one request at a time, greedy, %u new tokens; median of 3; TTFT = "
	       "submit to the first token event at the client)\n", gen);
	printf("%7s | %10s %10s | %12s %8s\n", "prompt", "ttft_ms", "server_ms", "stream_tok/s", "tokens");
	for (int pi = 0; pi < o->n_prompts; pi++) {
		double t[3], s[3], rt[3];
		for (int rep = 0; rep < 3; rep++)
			if (one_request(h, id++, o->prompts[pi], gen, (uint32_t)c.vocab_size, &t[rep],
					&rt[rep], &s[rep], &n_out)) {
				rc = 1;
				goto out;
			}
		printf("%7lld | %10.2f %10.2f | %12.1f %8u\n", (long long)o->prompts[pi],
		       median(t, 3) * 1e3, median(s, 3) * 1e3, median(rt, 3), n_out);
	}
	printf("\nthrough dsv32d, requests together (one client; 256-token prompts, temperature 1, "
	       "top_p 0.95, %u new tokens each; median of 3)\n", gen);
	printf("%7s | %10s %12s\n", "batch", "wall_ms", "tokens/s");
	for (int B = 16; B <= 32; B *= 2) {
		double w[3], ts[3];
		for (int rep = 0; rep < 3; rep++)
			if (batch_requests(h, &id, B, 256, gen, (uint32_t)c.vocab_size, &ts[rep], &w[rep])) {
				rc = 1;
				goto out;
			}
		printf("%7d | %10.2f %12.1f\n", B, median(w, 3) * 1e3, median(ts, 3));
	}
	if (o->mtp_draft)
		print_draft_stats(h, id++);
	printf("\ncommand: dsv32 bench model%s (server_ms: the daemon's own submit-to-first-token; "
	       "stream_tok/s: tokens after the first over their arrival time; tokens/s: all the "
	       "batch's tokens over the wall time from its first submit to its last done event)\n",
	       o->cmdline);
out:
	dsv32_close(h);
	daemon_stop(&d);
	return rc;
}

int bench_model(int argc, char **argv)
{
	struct opts o;
	int r = parse_args(argc, argv, &o);
	if (r)
		return r;
	setvbuf(stdout, NULL, _IOLBF, 0); /* every finished row is out even if a timeout kills us */
	char dir[PATH_MAX] = "", tmp[PATH_MAX] = "";
	const char *model = o.model;
	if (o.synthetic) {
		if (make_synthetic(&o, dir, sizeof dir))
			return 1;
		model = dir;
	}
	int rc;
	if (o.daemon) {
		/* the socket and the log live in a directory of their own */
		const char *t = getenv("TMPDIR");
		snprintf(tmp, sizeof tmp, "%s/dsv32-bench-d-XXXXXX", t && *t ? t : "/tmp");
		if (!mkdtemp(tmp)) {
			fprintf(stderr, "dsv32 bench model: cannot create %s: %s\n", tmp, strerror(errno));
			rc = 1;
		} else {
			rc = bench_daemon(&o, model, tmp);
			if (!o.keep)
				remove_dir(tmp);
		}
	} else {
		rc = bench_in_process(&o, model);
	}
	if (o.synthetic && !o.keep)
		remove_dir(dir);
	else if (o.synthetic)
		printf("kept %s\n", dir);
	return rc;
}
#endif
