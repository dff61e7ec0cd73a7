/*
 * cmd_bench_sched.c — `dsv32 bench sched`: the scheduler's own cost per step, with a fake
 * backend (no model; its step only writes one peaked logits row per sampled sequence) and,
 * separately, the sampler's cost per token at the real vocabulary.
 *
 *   dsv32 bench sched [--seqs N] [--steps N] [--prompt N] [--gen N] [--budget N]
 *                     [--vocab N] [--pages N] [--tokenizer DIR|FILE] [--stop STR]
 *
 * Workload: N sequences kept running (default 256): each has a prompt of --prompt tokens
 * whose first 64 are shared per identity (4 identities, so prefix hits happen), a stop token
 * id and max_tokens drawn from [gen/2, 3 gen/2); each finished request is replaced at once
 * (admission, prefix match, a prefill chunk, page accounting and frees are all in the loop).
 * With --tokenizer every token goes through the streaming detokenizer and the stop-string
 * matcher (--stop, default "\n\nUser:"). Timings are this thread's CPU time (the machines are
 * shared). "bookkeeping" = step - fake backend - sampling: admission, page accounting, block
 * tables, building the step, publishing, stop checks, events. Target: <= 20 us per step at 256
 * running sequences on one core. Asserts nothing.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/sched.h"
#include "model/tokenizer.h"
#include "tools/cli/cli.h"

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ---- the fake backend: peaked logits, no model --------------------------------------------- */

struct fake {
	struct backend base;
	struct dsv32_config c;
	int32_t lo, span; /* tokens drawn from [lo, lo + span) */
};

static int fake_step(struct backend *b, const struct backend_step *s)
{
	struct fake *f = (struct fake *)b;
	int64_t V = f->c.vocab_size;
	for (int64_t k = 0; k < s->n_seqs; k++) {
		const struct backend_seq *q = &s->seqs[k];
		float *lg = q->logits;
		for (int64_t i = 0; i < q->n; i++) {
			if (!(q->flags[i] & BACKEND_ROW_LOGITS))
				continue;
			memset(lg, 0, (size_t)V * sizeof *lg);
			uint64_t h = mix((uint64_t)q->pos[i] * 131 + (uint64_t)q->tokens[i]);
			lg[f->lo + (int64_t)(h % (uint64_t)f->span)] = 10.0f;
			lg += V;
		}
	}
	return 0;
}

static int fake_io(struct backend *b, int64_t l, enum backend_pool p, int64_t pg, void *buf, int w)
{
	return -EINVAL;
}

static void fake_destroy(struct backend *b) { (void)b; }

static const struct backend_ops fake_ops = {"fake", fake_step, fake_io, fake_destroy};

/* ---- the sampler at the real vocabulary ---------------------------------------------------- */

/* Times one setting on row l: CPU microseconds per call. */
static double time_setting(struct sampler *smp, const struct sampler_params *p, const float *l,
			   const int32_t *hist, int64_t n_hist)
{
	struct sampler_out o;
	int n = 0;
	double t0 = cpu_now(), t;
	do {
		for (int j = 0; j < 10; j++, n++)
			sampler_sample(smp, p, l, hist, n_hist, hist + n_hist, n_hist, (uint64_t)n, &o);
		t = cpu_now() - t0;
	} while (t < 0.2);
	return t / n * 1e6;
}

static void bench_sampler(int64_t V)
{
	struct sampler smp;
	if (sampler_init(&smp, V) < 0)
		return;
	float *peaked = malloc((size_t)V * sizeof *peaked), *flat = malloc((size_t)V * sizeof *flat);
	int32_t hist[512];
	uint64_t r = 1;
	/* peaked: a model-like row, p ~ rank^-1.5 over a random permutation of the ids (top-p 0.95
	 * keeps a few hundred); flat: a sum of 3 uniforms times 5 (tens of thousands). */
	for (int64_t i = 0; i < V; i++) {
		double u = 0;
		for (int j = 0; j < 3; j++)
			u += (double)(mix(++r) >> 11) * 0x1.0p-53;
		flat[i] = (float)((u - 1.5) * 5.0);
		peaked[i] = 0;
	}
	for (int64_t rank = 0; rank < V; rank++) { /* place ranks by a multiplicative permutation */
		int64_t id = (int64_t)(((uint64_t)rank * 2654435761ull) % (uint64_t)V);
		peaked[id] = (float)(-1.5 * log((double)(rank + 1)));
	}
	for (int i = 0; i < 512; i++)
		hist[i] = (int32_t)(mix(++r) % (uint64_t)V);
	struct {
		const char *name;
		double T, top_p, min_p, rep;
		int64_t top_k;
		int logprobs;
	} set[] = {
		{"greedy", 0, 1, 0, 1, 0, 0},
		{"greedy + rep 1.1 over 512 ids", 0, 1, 0, 1.1, 0, 0},
		{"greedy + 5 top logprobs", 0, 1, 0, 1, 0, 1},
		{"T=1 top_p=0.95 (card default)", 1, 0.95, 0, 1, 0, 0},
		{"T=0.7 top_k=50", 0.7, 1, 0, 1, 50, 0},
		{"T=1 min_p=0.05", 1, 1, 0.05, 1, 0, 0},
		{"T=1 (no filter)", 1, 1, 0, 1, 0, 0},
	};
	printf("sampler, vocab %lld, CPU time per token: model-like row / flat row\n", (long long)V);
	for (size_t k = 0; k < sizeof set / sizeof *set; k++) {
		struct sampler_params p;
		sampler_params_default(&p);
		p.temperature = set[k].T;
		p.top_p = set[k].top_p;
		p.min_p = set[k].min_p;
		p.top_k = set[k].top_k;
		p.repetition_penalty = set[k].rep;
		p.logprobs = set[k].logprobs;
		p.top_logprobs = set[k].logprobs ? 5 : 0;
		int64_t nh = set[k].rep != 1 ? 256 : 0;
		printf("  %-32s %9.1f us %9.1f us\n", set[k].name,
		       time_setting(&smp, &p, peaked, hist, nh), time_setting(&smp, &p, flat, hist, nh));
	}
	free(peaked);
	free(flat);
	sampler_free(&smp);
}

/* ---- the scheduler ------------------------------------------------------------------------- */

struct load {
	int64_t prompt, gen, vocab;
	uint64_t next_id, rng;
	int32_t *buf;
	struct sched_str stop;
	int has_stop;
};

static int add_one(struct sched *s, struct load *L)
{
	uint64_t id = L->next_id++;
	uint32_t uid = (uint32_t)(id % 4);
	for (int64_t i = 0; i < L->prompt; i++) /* 64 shared per identity, then unique */
		L->buf[i] = 3 + (int32_t)(mix(i < 64 ? uid * 1000 + (uint64_t)i : id * 100003 + (uint64_t)i) %
					  (uint64_t)(L->vocab - 3));
	struct sched_request q = {0};
	q.id = id;
	q.uid = uid;
	q.prompt = L->buf;
	q.n_prompt = L->prompt;
	sampler_params_default(&q.sampling);
	q.max_tokens = L->gen / 2 + (int64_t)(mix(++L->rng) % (uint64_t)L->gen);
	int32_t stop_id = 2;
	q.stop_ids = &stop_id;
	q.n_stop_ids = 1;
	q.stop = &L->stop;
	q.n_stop = L->has_stop;
	struct err e;
	int rc = sched_add(s, &q, &e);
	if (rc < 0)
		fprintf(stderr, "bench sched: add: %s\n", e.msg);
	return rc;
}

int bench_sched(int argc, char **argv)
{
	int64_t seqs = 256, steps = 3000, prompt = 128, gen = 256, budget = 2048, vocab = 1024,
		pages = 0;
	const char *tpath = NULL, *stop = "\n\nUser:";
	for (int i = 1; i < argc; i += 2) { /* every flag takes a value */
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			goto usage;
		if (!strcmp(a, "--seqs"))
			seqs = atoll(v);
		else if (!strcmp(a, "--steps"))
			steps = atoll(v);
		else if (!strcmp(a, "--prompt"))
			prompt = atoll(v);
		else if (!strcmp(a, "--gen"))
			gen = atoll(v);
		else if (!strcmp(a, "--budget"))
			budget = atoll(v);
		else if (!strcmp(a, "--vocab"))
			vocab = atoll(v);
		else if (!strcmp(a, "--pages"))
			pages = atoll(v);
		else if (!strcmp(a, "--tokenizer"))
			tpath = v;
		else if (!strcmp(a, "--stop"))
			stop = v;
		else
			goto usage;
	}
	if (seqs < 1 || steps < 1 || prompt < 65 || gen < 2 || budget < 1 || vocab < 300)
		goto usage;
	if (!pages) /* room for every sequence at its longest, plus a little cache */
		pages = seqs * kv_pages_for(prompt + gen * 3 / 2) + seqs / 4 + 8;

	struct tokenizer *tok = NULL;
	if (tpath) {
		struct err e;
		if (tokenizer_load(&tok, tpath, &e) < 0) {
			fprintf(stderr, "bench sched: %s\n", e.msg);
			return 1;
		}
	}
	static struct fake f;
	f.c.vocab_size = vocab;
	f.c.max_position_embeddings = 163840;
	f.c.eos_token_id = 1;
	f.base.ops = &fake_ops;
	f.base.c = &f.c;
	f.base.n_layers = 1;
	f.base.n_pages = pages;
	/* ids that decode to ordinary text with DeepSeek's tokenizer and with the fallback one */
	f.lo = 3;
	f.span = (int32_t)(vocab - 3 < 256 ? vocab - 3 : 256);

	struct sched_config cfg = {0};
	cfg.max_batch_tokens = budget;
	cfg.max_seqs = seqs;
	cfg.prefix_cache = 1;
	cfg.seed = 1;
	cfg.tok = tok;
	cfg.cpu_clock = 1;
	struct sched *s;
	struct err e;
	if (sched_init(&s, &f.base, &cfg, &e) < 0) {
		fprintf(stderr, "bench sched: %s\n", e.msg);
		return 1;
	}
	struct load L = {prompt, gen, vocab, 0, 7, malloc((size_t)prompt * sizeof(int32_t)),
			 {stop, strlen(stop)}, tok != NULL};
	for (int64_t i = 0; i < seqs; i++)
		if (add_one(s, &L) < 0)
			return 1;

	/* warm up: everything admitted and past its prompt, a few hundred steps of churn */
	const struct sched_event *ev;
	int64_t n;
	int64_t finished = 0, tokens = 0, warm = 300;
	struct sched_stats a, b;
	double t0 = 0, wall0 = 0;
	for (int64_t it = 0; it < warm + steps; it++) {
		if (it == warm) {
			sched_stats(s, &a);
			t0 = cpu_now();
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			wall0 = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
			finished = tokens = 0;
		}
		if (sched_step(s, &ev, &n) < 0)
			return 1;
		for (int64_t k = 0; k < n; k++) {
			tokens += ev[k].type == SCHED_EVENT_TOKEN;
			if (ev[k].type != SCHED_EVENT_TOKEN) {
				finished++;
				if (add_one(s, &L) < 0)
					return 1;
			}
		}
	}
	double cpu = cpu_now() - t0;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	double wall = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 - wall0;
	sched_stats(s, &b);
	double ns = (double)(b.steps - a.steps);
#define DELTA(f) (b.f * (double)b.steps - a.f * (double)a.steps) / ns
	double step_us = DELTA(avg_step_us), back_us = DELTA(avg_backend_us),
	       samp_us = DELTA(avg_sample_us), book_us = DELTA(avg_sched_us);
#undef DELTA
	double rows = (double)((b.prefill_tokens + b.decode_tokens) -
			       (a.prefill_tokens + a.decode_tokens)) / ns;
	printf("dsv32 bench sched --seqs %lld --steps %lld --prompt %lld --gen %lld --budget %lld "
	       "--vocab %lld --pages %lld%s%s\n",
	       (long long)seqs, (long long)steps, (long long)prompt, (long long)gen,
	       (long long)budget, (long long)vocab, (long long)pages, tpath ? " --tokenizer " : "",
	       tpath ? tpath : "");
	printf("steady state: %lld running, %.1f rows/step (%.1f decode), %.2f requests finished "
	       "and admitted per step, %lld preemptions, prefix hit rate %.1f%%, %lld/%lld pages "
	       "used/cached\n",
	       (long long)b.running, rows,
	       (double)(b.decode_tokens - a.decode_tokens) / ns, (double)finished / ns,
	       (long long)(b.preemptions - a.preemptions), b.prefix_hit_rate * 100,
	       (long long)b.pages_used, (long long)b.pages_cached);
	printf("per step (CPU time, one core): bookkeeping %.2f us (%.1f ns per row), sampling "
	       "%.2f us, fake backend %.2f us, whole step %.2f us; target bookkeeping <= 20 us: "
	       "%.2fx\n",
	       book_us, book_us * 1e3 / rows, samp_us, back_us, step_us, book_us / 20.0);
	/* The step reads the clock 6 times; this thread's CPU clock is a system call (the
	 * daemon's wall clock is not): measure that share so it can be told apart. */
	double c0 = cpu_now();
	for (int k = 0; k < 10000; k++)
		(void)cpu_now();
	double clock_us = (cpu_now() - c0) / 10000 * 1e6;
	printf("of which the step's 6 reads of the CPU clock: %.2f us (%.0f ns each; the daemon's "
	       "wall clock reads are vDSO)\n", 6 * clock_us, clock_us * 1e3);
	printf("loop: %.0f steps/s CPU, %.0f tokens/s CPU (wall %.2f s for %.2f s CPU)\n",
	       ns / cpu, (double)tokens / cpu, wall, cpu);
	sched_free(s);
	free(L.buf);
	if (tok)
		tokenizer_free(tok);
	bench_sampler(129280);
	return 0;
usage:
	fprintf(stderr, "usage: dsv32 bench sched [--seqs N] [--steps N] [--prompt N>64] [--gen N] "
			"[--budget N] [--vocab N>=300] [--pages N] [--tokenizer DIR|FILE] [--stop STR]\n");
	return 2;
}
