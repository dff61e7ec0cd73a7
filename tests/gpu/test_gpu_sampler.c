/*
 * test_gpu_sampler.c — the GPU sampler (kernels_ptx/sampler.cu) against model/sampler.c's
 * sampler_sample on the same rows: the random stream bit for bit, then many rows of fresh
 * random logits (realistic spread: a Gaussian bulk, a head of peaks, ties, masked ids) at the
 * real vocabulary and at small ones, every parameter class (greedy, temperature, top-k, top-p,
 * min-p, their mixes, penalties with histories, logprobs), many seeds and indices: the tokens
 * must be the same for every row, logprobs within 1e-5, errors the same. Then the time per
 * row at vocab 129280 (printed; never fails on timing).
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include <time.h>

#include "model/cuda_sampler.h"

#define VOCAB 129280

static double gauss(uint64_t *s)
{
	double u1 = ((test_rand(s) >> 11) + 1) * 0x1.0p-53, u2 = (test_rand(s) >> 11) * 0x1.0p-53;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static double unif(uint64_t *s) { return (test_rand(s) >> 11) * 0x1.0p-53; }

/* One row of logits: kind 0 realistic (bulk N(0, sd) + peaks), 1 flat (small sd, no peaks:
 * large top-p sets), 2 quantised to 1/8 (many ties), 3 realistic with 2% of ids -inf. */
static void fill_logits(float *l, int V, int kind, uint64_t *s)
{
	double sd = kind == 1 ? 0.3 + unif(s) : 1.0 + 2.0 * unif(s);
	for (int i = 0; i < V; i++)
		l[i] = (float)(sd * gauss(s));
	if (kind != 1) {
		int peaks = 1 + (int)(test_rand(s) % 40);
		for (int j = 0; j < peaks; j++)
			l[test_rand(s) % V] = (float)(6.0 + 14.0 * unif(s));
	}
	if (kind == 2)
		for (int i = 0; i < V; i++)
			l[i] = roundf(l[i] * 8.0f) / 8.0f;
	if (kind == 3)
		for (int i = 0; i < V; i++)
			if (test_rand(s) % 50 == 0)
				l[i] = -INFINITY;
}

/* Parameters of class c (see names[]), random within the class. */
static const char *const names[] = {"greedy",   "temperature", "top_k",   "top_p",   "min_p",
				    "k+p+minp", "penalties",   "pen+greedy", "hot/cold"};
#define N_CLASSES 9

static void fill_params(struct sampler_params *p, int c, int V, uint64_t *s)
{
	static const double temps[] = {0.3, 0.7, 1.0, 1.3};
	static const int64_t ks[] = {1, 2, 10, 40, 1000, 50000};
	static const double ps[] = {0.3, 0.8, 0.9, 0.95, 0.99, 0.999};
	static const double mps[] = {0.001, 0.05, 0.2, 0.9, 1.0};
	sampler_params_default(p);
	p->seed = test_rand(s);
	if (c != 0 && c != 7)
		p->temperature = temps[test_rand(s) % 4];
	if (c == 2 || c == 5)
		p->top_k = ks[test_rand(s) % 6] + (test_rand(s) % 8 == 0 ? V : 0);
	if (c == 3 || c == 5 || (c == 6 && test_rand(s) % 2))
		p->top_p = ps[test_rand(s) % 6];
	if (c == 4 || (c == 5 && test_rand(s) % 2))
		p->min_p = mps[test_rand(s) % 5];
	if (c == 6 || c == 7) {
		static const double reps[] = {1.0, 1.1, 0.9, 1.5, 3.0};
		p->repetition_penalty = reps[test_rand(s) % 5];
		p->frequency_penalty = (double)(int)(test_rand(s) % 9) * 0.25 - 1.0;
		p->presence_penalty = (double)(int)(test_rand(s) % 9) * 0.25 - 1.0;
	}
	if (c == 8) { /* very hot (flat, huge kept sets) or very cold (q underflows) */
		static const double t8[] = {0.01, 0.05, 2.0, 5.0, 100.0};
		p->temperature = t8[test_rand(s) % 5];
		if (test_rand(s) % 2)
			p->top_p = ps[test_rand(s) % 6];
	}
	if (test_rand(s) % 3 == 0) {
		p->logprobs = 1;
		p->top_logprobs = (int)(test_rand(s) % (SAMPLER_MAX_LOGPROBS + 1));
	}
}

struct batch {
	int rows, V;
	float *logits;                  /* [rows, V] */
	struct sampler_params *p;       /* [rows] */
	struct cuda_sampler_row *r;     /* [rows] */
	int32_t *hist;                  /* [n_hist] */
	int64_t n_hist;
	uint64_t *index;                /* [rows] */
	int *cls;                       /* [rows] */
};

/* Logits of `kind` (fill_logits; -1: a random kind per row). Histories: prompt 0..300 ids, output 0..100, drawn often from the row's top ids so that
 * the penalties move the choice. */
static void fill_batch(struct batch *b, int rows, int V, int kind, uint64_t *s)
{
	b->rows = rows;
	b->V = V;
	b->logits = malloc((size_t)rows * V * 4);
	b->p = malloc(rows * sizeof *b->p);
	b->r = malloc(rows * sizeof *b->r);
	b->index = malloc(rows * sizeof *b->index);
	b->cls = malloc(rows * sizeof *b->cls);
	b->hist = malloc((size_t)rows * 400 * 4);
	b->n_hist = 0;
	for (int i = 0; i < rows; i++) {
		float *l = b->logits + (size_t)i * V;
		fill_logits(l, V, kind >= 0 ? kind : (int)(test_rand(s) % 4), s);
		b->cls[i] = i % N_CLASSES;
		fill_params(&b->p[i], b->cls[i], V, s);
		int pen = b->cls[i] == 6 || b->cls[i] == 7;
		int64_t np = pen ? (int64_t)(test_rand(s) % 301) : 0;
		int64_t no = pen ? (int64_t)(test_rand(s) % 101) : (int64_t)(test_rand(s) % 3);
		int64_t off = b->n_hist;
		int32_t best = 0;
		for (int j = 1; j < V; j++)
			best = l[j] > l[best] ? j : best;
		for (int64_t j = 0; j < np + no; j++) {
			int32_t id = (int32_t)(test_rand(s) % V);
			if (test_rand(s) % 4 == 0)
				id = (int32_t)((best + test_rand(s) % 3) % V);
			b->hist[b->n_hist++] = id;
		}
		b->index[i] = test_rand(s) % 4 ? test_rand(s) % 5000 : test_rand(s);
		cuda_sampler_row_set(&b->r[i], &b->p[i], b->index[i], off, np, off + np, no);
	}
	if (!b->n_hist)
		b->hist[b->n_hist++] = 0;
}

static void free_batch(struct batch *b)
{
	free(b->logits), free(b->p), free(b->r), free(b->index), free(b->cls), free(b->hist);
}

struct dev_batch {
	gpu_ptr logits, params, hist, out, ws;
	size_t ws_bytes;
};

static void upload_batch(struct gpu *g, const struct batch *b, struct dev_batch *d)
{
	d->logits = gpu_test_alloc((size_t)b->rows * b->V * 4);
	d->params = gpu_test_alloc(b->rows * sizeof *b->r);
	d->hist = gpu_test_alloc((size_t)b->n_hist * 4);
	d->out = gpu_test_alloc(b->rows * sizeof(struct cuda_sampler_result));
	d->ws_bytes = cuda_sampler_workspace(g, b->rows, b->V);
	d->ws = gpu_test_alloc(d->ws_bytes);
	REQUIRE(gpu_upload(g, d->logits, b->logits, (size_t)b->rows * b->V * 4) == 0);
	REQUIRE(gpu_upload(g, d->params, b->r, b->rows * sizeof *b->r) == 0);
	REQUIRE(gpu_upload(g, d->hist, b->hist, (size_t)b->n_hist * 4) == 0);
}

static void free_dev(struct dev_batch *d)
{
	gpu_ptr p[] = {d->logits, d->params, d->hist, d->out, d->ws};
	for (int i = 0; i < 5; i++)
		REQUIRE(cu_check(cu.cuMemFree(p[i]), "cuMemFree", __FILE__, __LINE__) == 0);
}

static int same_lp(float a, float b) { return a == b || fabsf(a - b) <= 1e-5f; } /* -inf too */

/* Runs the batch on the CPU and twice on the GPU (outputs and workspace poisoned first):
 * mode 0 every sum serial, mode 1 the fast path with its self-check (diag[0]: rows whose fast
 * and serial decisions differ, diag[1]: fallbacks). Returns the differing rows of both modes,
 * adds them to bad[mode][class]. */
static int64_t compare_batch(struct gpu *g, const struct batch *b, int64_t bad[2][N_CLASSES],
			     int64_t *seen, uint64_t *diag)
{
	struct dev_batch d;
	upload_batch(g, b, &d);
	size_t ob = b->rows * sizeof(struct cuda_sampler_result);
	struct cuda_sampler_result *res = malloc(ob);
	struct sampler_out *cpu = malloc(b->rows * sizeof *cpu);
	int *rc = malloc(b->rows * sizeof *rc);
	struct sampler s;
	REQUIRE(sampler_init(&s, b->V) == 0);
	for (int i = 0; i < b->rows; i++) {
		const struct cuda_sampler_row *r = &b->r[i];
		rc[i] = sampler_sample(&s, &b->p[i], b->logits + (size_t)i * b->V,
				       b->hist + r->prompt_off, r->n_prompt,
				       b->hist + r->output_off, r->n_output, b->index[i], &cpu[i]);
		seen[b->cls[i]]++;
	}
	sampler_free(&s);
	gpu_ptr ddiag = gpu_test_alloc(16);
	int64_t diff = 0;
	for (int mode = 0; mode < 2; mode++) {
		int flags = mode ? CUDA_SAMPLER_FAST | CUDA_SAMPLER_VERIFY : 0;
		gpu_test_poison(g, d.out, ob);
		gpu_test_poison(g, d.ws, d.ws_bytes);
		REQUIRE(gpu_memset(g, ddiag, 0, 16) == 0);
		REQUIRE(cuda_sampler_sample_flags(g, d.logits, b->V, b->rows, b->V, d.params, d.hist,
						  d.out, d.ws, flags, ddiag) == 0);
		REQUIRE(gpu_sync(g) == 0);
		REQUIRE(gpu_download(g, res, d.out, ob) == 0);
		uint64_t dg[2];
		REQUIRE(gpu_download(g, dg, ddiag, 16) == 0);
		if (mode) {
			diag[0] += dg[0];
			diag[1] += dg[1];
		} else {
			CHECK(dg[0] == 0 && dg[1] == 0);
		}
		for (int i = 0; i < b->rows; i++) {
			const struct sampler_out *o = &cpu[i];
			const struct cuda_sampler_result *x = &res[i];
			int ok = rc[i] == x->err;
			if (ok && rc[i] == 0) {
				ok = o->token == x->token;
				if (ok && b->p[i].logprobs) {
					ok = same_lp(o->logprob, x->logprob) && o->n_top == x->n_top;
					for (int j = 0; ok && j < o->n_top; j++)
						ok = o->top_ids[j] == x->top_ids[j] &&
						     same_lp(o->top_logprobs[j], x->top_logprobs[j]);
				}
			}
			if (ok)
				continue;
			if (diff < 10)
				printf("    differ (%s sums): V=%d row %d (%s, T=%g k=%lld p=%g "
				       "minp=%g rep=%g): cpu %d/%d lp %g, gpu %d/%d lp %g\n",
				       mode ? "fast" : "serial", b->V, i, names[b->cls[i]],
				       b->p[i].temperature, (long long)b->p[i].top_k, b->p[i].top_p,
				       b->p[i].min_p, b->p[i].repetition_penalty, rc[i],
				       rc[i] ? -1 : o->token, rc[i] ? 0.0 : o->logprob, x->err,
				       x->token, x->logprob);
			diff++;
			bad[mode][b->cls[i]]++;
		}
	}
	REQUIRE(cu_check(cu.cuMemFree(ddiag), "cuMemFree", __FILE__, __LINE__) == 0);
	free(res), free(cpu), free(rc);
	free_dev(&d);
	return diff;
}

TEST(gpu_sampler, stream_bit_exact)
{
	struct gpu g;
	gpu_test_open(&g);
	const int n = 1 << 20;
	uint64_t *seed = malloc(n * 8), *index = malloc(n * 8), *bits = malloc(n * 8), s = 4242;
	for (int i = 0; i < n; i++) {
		seed[i] = i < 64 ? (i % 2 ? UINT64_MAX - (uint64_t)i : (uint64_t)i) : test_rand(&s);
		index[i] = i % 3 == 0 ? (uint64_t)(i % 1000) : i % 3 == 1 ? test_rand(&s)
								   : UINT64_MAX - (uint64_t)(i % 7);
	}
	gpu_ptr ds = gpu_test_alloc(n * 8), di = gpu_test_alloc(n * 8), db = gpu_test_alloc(n * 8);
	REQUIRE(gpu_upload(&g, ds, seed, n * 8) == 0);
	REQUIRE(gpu_upload(&g, di, index, n * 8) == 0);
	gpu_test_poison(&g, db, n * 8);
	REQUIRE(cuda_sampler_bits(&g, ds, di, db, n) == 0);
	REQUIRE(gpu_download(&g, bits, db, n * 8) == 0);
	int64_t bad = 0;
	for (int i = 0; i < n; i++)
		bad += bits[i] != sampler_bits(seed[i], index[i]);
	printf("    %d (seed, index) pairs: %lld differ\n", n, (long long)bad);
	CHECK(bad == 0);
	free(seed), free(index), free(bits);
	gpu_close(&g);
}

TEST_T(gpu_sampler, same_token_as_cpu, 150)
{
	struct gpu g;
	gpu_test_open(&g);
	uint64_t s = 777;
	int64_t bad[2][N_CLASSES] = {{0}}, seen[N_CLASSES] = {0}, diff = 0, rows = 0;
	uint64_t diag[2] = {0, 0};
	static const int vocabs[] = {VOCAB, VOCAB, VOCAB, 1, 7, 50, 1000, 4099, 32000};
	for (int v = 0; v < 9; v++) {
		int V = vocabs[v], R = V == VOCAB ? 2 * g.sm_count + 7 : 150;
		struct batch b;
		fill_batch(&b, R, V, -1, &s);
		diff += compare_batch(&g, &b, bad, seen, diag);
		rows += R;
		free_batch(&b);
	}
	printf("    class        rows  differ (serial sums)  differ (fast sums)\n");
	for (int c = 0; c < N_CLASSES; c++)
		printf("    %-12s %5lld  %5lld                 %5lld\n", names[c], (long long)seen[c],
		       (long long)bad[0][c], (long long)bad[1][c]);
	printf("    total: %lld rows, %lld row results differ from the CPU sampler; fast path: "
	       "%llu rows disagree with its serial sums, %llu fell back to them\n",
	       (long long)rows, (long long)diff, (unsigned long long)diag[0],
	       (unsigned long long)diag[1]);
	CHECK(diff == 0);
	CHECK(diag[0] == 0);
	gpu_close(&g);
}

/* A small case for compute-sanitizer (memcheck, racecheck): every class at small vocabs. */
TEST_T(gpu_sampler, small_vocabs, 120)
{
	struct gpu g;
	gpu_test_open(&g);
	uint64_t s = 31337;
	int64_t bad[2][N_CLASSES] = {{0}}, seen[N_CLASSES] = {0}, diff = 0;
	uint64_t diag[2] = {0, 0};
	static const int vocabs[] = {3, 300, 2500, 5000};
	for (int v = 0; v < 4; v++) {
		struct batch b;
		fill_batch(&b, 2 * N_CLASSES, vocabs[v], -1, &s);
		diff += compare_batch(&g, &b, bad, seen, diag);
		free_batch(&b);
	}
	CHECK(diff == 0);
	CHECK(diag[0] == 0);
	gpu_close(&g);
}

TEST(gpu_sampler, errors_per_row)
{
	struct gpu g;
	gpu_test_open(&g);
	uint64_t s = 99;
	struct batch b;
	fill_batch(&b, 12, 5000, -1, &s);
	for (int i = 0; i < 12; i++) {
		float *l = b.logits + (size_t)i * 5000;
		int k = i % 4;
		if (k == 0)
			l[test_rand(&s) % 5000] = NAN;
		else if (k == 1)
			l[test_rand(&s) % 5000] = INFINITY;
		else if (k == 2)
			for (int j = 0; j < 5000; j++)
				l[j] = -INFINITY;
	}
	/* row 3, 7, 11 stay valid; make row 7's history out of range */
	b.r[7].n_output = 1;
	b.r[7].output_off = b.n_hist;
	b.hist[b.n_hist++] = 5000;
	int64_t bad[2][N_CLASSES] = {{0}}, seen[N_CLASSES] = {0};
	uint64_t diag[2] = {0, 0};
	CHECK(compare_batch(&g, &b, bad, seen, diag) == 0);
	free_batch(&b);
	gpu_close(&g);
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Time per launch for R rows of one class at vocab 129280; the CPU sampler's time per row on
 * the same rows beside it. */
static void time_class(struct gpu *g, const char *what, int R, int kind, double T, double top_p)
{
	uint64_t s = 5150 + (uint64_t)R;
	struct batch b;
	fill_batch(&b, R, VOCAB, kind, &s);
	for (int i = 0; i < R; i++) {
		sampler_params_default(&b.p[i]);
		b.p[i].temperature = T;
		b.p[i].top_p = top_p;
		b.p[i].seed = test_rand(&s);
		cuda_sampler_row_set(&b.r[i], &b.p[i], (uint64_t)i, 0, 0, 0, 0);
	}
	struct dev_batch d;
	upload_batch(g, &b, &d);
	double gms[2];
	for (int mode = 0; mode < 2; mode++) {
		int flags = mode ? 0 : CUDA_SAMPLER_FAST;
		for (int w = 0; w < 2; w++)
			REQUIRE(cuda_sampler_sample_flags(g, d.logits, VOCAB, R, VOCAB, d.params,
							  d.hist, d.out, d.ws, flags, 0) == 0);
		REQUIRE(gpu_sync(g) == 0);
		const int reps = 5;
		double t0 = now_ms();
		for (int w = 0; w < reps; w++)
			REQUIRE(cuda_sampler_sample_flags(g, d.logits, VOCAB, R, VOCAB, d.params,
							  d.hist, d.out, d.ws, flags, 0) == 0);
		REQUIRE(gpu_sync(g) == 0);
		gms[mode] = (now_ms() - t0) / reps;
	}
	struct sampler cs;
	REQUIRE(sampler_init(&cs, VOCAB) == 0);
	struct sampler_out o;
	int nc = R < 16 ? R : 16;
	double t0 = now_ms();
	for (int i = 0; i < nc; i++)
		REQUIRE(sampler_sample(&cs, &b.p[i], b.logits + (size_t)i * VOCAB, NULL, 0, NULL, 0,
				       (uint64_t)i, &o) == 0);
	double cms = (now_ms() - t0) / nc;
	sampler_free(&cs);
	printf("    %-26s rows %3d: GPU fast %7.3f ms a launch (%7.4f a row), serial sums %7.3f "
	       "ms (%7.4f a row); CPU %7.3f ms a row\n",
	       what, R, gms[0], gms[0] / R, gms[1], gms[1] / R, cms);
	free_dev(&d);
	free_batch(&b);
}

TEST_T(gpu_sampler, time_per_row, 120)
{
	struct gpu g;
	gpu_test_open(&g);
	int rows[] = {1, g.sm_count, 2 * g.sm_count};
	for (int k = 0; k < 3; k++) {
		time_class(&g, "greedy", rows[k], 0, 0.0, 1.0);
		time_class(&g, "temperature 1", rows[k], 0, 1.0, 1.0);
		time_class(&g, "top_p 0.9, T 1", rows[k], 0, 1.0, 0.9);
		time_class(&g, "top_p 0.9, T 1, flat row", rows[k], 1, 1.0, 0.9);
	}
	gpu_close(&g);
}

#endif
