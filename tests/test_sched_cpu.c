/*
 * test_sched_cpu.c — the scheduler driving the real CPU backend on the tiny model
 * (`$DSV32_BIN/mkmodel tiny --seed 1`; the two long runs use its shape with a 1024-token
 * vocabulary to stay fast under ASan), which is batch-invariant bit for bit:
 *   - a prefix-cache hit gives logits bit-identical to a cold run;
 *   - a pool so small that sequences are preempted and recomputed finishes every request with
 *     the greedy tokens of an unconstrained run;
 *   - a seeded sampled request gives the same tokens alone and inside a busy batch.
 * A recorder wraps the CPU backend to keep the logits rows the scheduler asked for (it only
 * copies; every number comes from the CPU backend).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "model/numerics.h"
#include "model/safetensors.h"
#include "model/sched.h"
#include "model/weights.h"
#include "tests/ckpt_helpers.h"
#include "tests/sched_trace.h"
#include "tests/test.h"


/* "tiny": `mkmodel tiny --seed 1`; "mini": the same preset with a 1024-token vocabulary (the
 * lm_head and sampler dominate the tiny model's time at 129280 ids). */
static void model_load(struct test_model *m, const char *preset)
{
	const char *bin = test_bin_dir();
	char cmd[4096];
	snprintf(m->dir, sizeof m->dir, "%s/%s", test_tmpdir(), preset);
	if (!strcmp(preset, "tiny"))
		snprintf(cmd, sizeof cmd,
			 "%s/mkmodel tiny --seed 1 --tokenizer fallback --out %s >%s.log 2>&1", bin,
			 m->dir, m->dir);
	else
		snprintf(cmd, sizeof cmd,
			 "sed 's/\"vocab_size\": 129280/\"vocab_size\": 1024/' "
			 "%s/tests/data/tiny_config.json > %s.json && "
			 "%s/mkmodel --config %s.json --seed 1 --tokenizer fallback --out %s >%s.log 2>&1",
			 test_root(), m->dir, bin, m->dir, m->dir, m->dir);
	test_model_make(m, cmd);
}

/* ---- a recorder around the CPU backend ----------------------------------------------------- */

/* The wrappers below (recorder, drawer, oracle) start with these two members: their pages are
 * the CPU backend's. */
struct wrapped {
	struct backend base;
	struct backend *cpu;
};

static int wrapped_page_io(struct backend *b, int64_t layer, enum backend_pool pool, int64_t page,
			   void *buf, int write)
{
	return backend_page_io(((struct wrapped *)b)->cpu, layer, pool, page, buf, write);
}

struct rec {
	struct backend base;
	struct backend *cpu;
	int64_t vocab;
	float *rows;      /* [cap, vocab] logits rows in the order they were produced */
	int64_t *pos;     /* [cap] their positions */
	int64_t n, cap;
};

static int rec_step(struct backend *b, const struct backend_step *s)
{
	struct rec *r = (struct rec *)b;
	int rc = backend_step(r->cpu, s);
	if (rc < 0 || !r->rows)
		return rc;
	for (int64_t k = 0; k < s->n_seqs; k++) {
		const struct backend_seq *q = &s->seqs[k];
		int64_t l = 0;
		for (int64_t i = 0; i < q->n; i++) {
			int want = q->flags ? (q->flags[i] & BACKEND_ROW_LOGITS) : i == q->n - 1;
			if (!want)
				continue;
			if (r->n < r->cap) {
				memcpy(r->rows + r->n * r->vocab, q->logits + l * r->vocab,
				       (size_t)r->vocab * sizeof(float));
				r->pos[r->n++] = q->pos[i];
			}
			l++;
		}
	}
	return rc;
}

static void rec_destroy(struct backend *b)
{
	struct rec *r = (struct rec *)b;
	backend_destroy(r->cpu);
	free(r->rows);
	free(r->pos);
	free(r);
}

static const struct backend_ops rec_ops = {"recorder+cpu", rec_step, wrapped_page_io,
					   rec_destroy};

static struct rec *rec_new(struct test_model *m, int64_t n_pages, int64_t cap)
{
	struct rec *r = calloc(1, sizeof *r);
	REQUIRE(r);
	struct err e;
	REQUIRE(backend_cpu_create(&m->c, &m->w, n_pages, 2, &r->cpu, &e) == 0);
	r->base = *r->cpu;
	r->base.ops = &rec_ops;
	r->vocab = m->c.vocab_size;
	r->cap = cap;
	if (cap) {
		r->rows = malloc((size_t)cap * (size_t)r->vocab * sizeof(float));
		r->pos = malloc((size_t)cap * sizeof *r->pos);
		REQUIRE(r->rows && r->pos);
	}
	return r;
}

/* ---- driving ------------------------------------------------------------------------------- */

#define MAXREQ 32

struct result {
	int32_t tok[512];
	int64_t n, cached;
	int done;
	enum sched_finish reason;
};

static struct sched *sched_new(struct rec *r, int64_t budget, int64_t max_seqs, int prefix)
{
	struct sched_config c = {0};
	c.max_batch_tokens = budget;
	c.max_seqs = max_seqs;
	c.prefix_cache = prefix;
	c.seed = 9;
	struct sched *s;
	struct err e = {{0}};
	int rc = sched_init(&s, &r->base, &c, &e);
	if (rc)
		test_fail(__FILE__, __LINE__, "sched_init: %s", e.msg);
	REQUIRE(rc == 0);
	return s;
}

static void drain(struct sched *s, struct result *res)
{
	static struct sched_trace t;
	sched_trace_run(s, &t);
	for (int64_t i = 0; i < t.n; i++) {
		const struct sched_event *ev = &t.ev[i];
		REQUIRE(ev->id < MAXREQ);
		struct result *o = &res[ev->id];
		CHECK(!o->done);
		if (ev->type == SCHED_EVENT_TOKEN) {
			CHECK_EQ_INT(ev->seq, o->n);
			REQUIRE(o->n < 512);
			o->tok[o->n++] = ev->token;
		} else {
			CHECK_EQ_INT(ev->type, SCHED_EVENT_FINISH);
			o->done = 1;
			o->reason = ev->reason;
			o->cached = ev->n_prompt_cached;
		}
	}
}

static void add(struct sched *s, uint64_t id, const int32_t *p, int64_t n, int64_t max_tokens,
		const struct sampler_params *sp)
{
	struct sched_request q = {0};
	q.id = id;
	q.uid = 1000;
	q.prompt = p;
	q.n_prompt = n;
	if (sp) {
		q.sampling = *sp;
		q.seeded = 1;
	} else {
		sampler_params_default(&q.sampling);
	}
	q.max_tokens = max_tokens;
	q.ignore_eos = 1; /* random weights: keep lengths fixed */
	struct err e = {{0}};
	int rc = sched_add(s, &q, &e);
	if (rc)
		test_fail(__FILE__, __LINE__, "sched_add: %s", e.msg);
	REQUIRE(rc == 0);
}

static void prompt_of(int32_t *t, int64_t n, int64_t vocab, uint64_t seed)
{
	for (int64_t i = 0; i < n; i++)
		t[i] = 3 + (int32_t)(test_rand(&seed) % (uint64_t)(vocab - 3));
}

static int same(const struct result *a, const struct result *b)
{
	return a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok);
}

TEST_T(sched_cpu, prefix_hit_logits_bit_identical_to_cold, 300)
{
	struct test_model m;
	model_load(&m, "tiny");
	int64_t V = m.c.vocab_size;
	int32_t p[150], other[70];
	prompt_of(p, 150, V, 1);
	prompt_of(other, 70, V, 2);
	/* cold: alone, no prefix cache */
	struct rec *cold = rec_new(&m, 16, 8);
	struct sched *s = sched_new(cold, 64, 4, 0);
	static struct result a[MAXREQ], b[MAXREQ];
	add(s, 0, p, 150, 4, NULL);
	drain(s, a);
	sched_free(s);
	/* warm: a first request publishes the pages; the second, batched with another, hits */
	struct rec *warm = rec_new(&m, 16, 64);
	s = sched_new(warm, 48, 4, 1);
	add(s, 0, p, 150, 1, NULL);
	drain(s, b);
	warm->n = 0;
	add(s, 1, other, 70, 3, NULL);
	add(s, 2, p, 150, 4, NULL);
	drain(s, b);
	CHECK_EQ_INT(b[2].cached, 128);
	REQUIRE(same(&a[0], &b[2]));
	/* the rows of request 2 are those at positions 149..152 (request 1's are < 73) */
	int64_t found = 0;
	for (int64_t i = 0; i < warm->n; i++) {
		int64_t j = warm->pos[i] - 149;
		if (warm->pos[i] < 149)
			continue;
		REQUIRE(j >= 0 && j < cold->n && cold->pos[j] == warm->pos[i]);
		CHECK(!memcmp(warm->rows + i * V, cold->rows + j * V, (size_t)V * sizeof(float)));
		found++;
	}
	CHECK_EQ_INT(found, 4);
	CHECK_EQ_INT(cold->n, 4);
	sched_free(s);
	backend_destroy(&cold->base);
	backend_destroy(&warm->base);
	test_model_free(&m);
}

TEST_T(sched_cpu, preemption_keeps_greedy_tokens, 300)
{
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size;
	enum { N = 5 };
	int32_t p[N][100];
	int64_t len[N] = {100, 60, 90, 30, 75};
	for (int i = 0; i < N; i++)
		prompt_of(p[i], len[i], V, 10 + (uint64_t)i);
	static struct result big[MAXREQ], small[MAXREQ];
	struct rec *r1 = rec_new(&m, 32, 0);
	struct sched *s = sched_new(r1, 256, 8, 0);
	for (int i = 0; i < N; i++)
		add(s, (uint64_t)i, p[i], len[i], 40, NULL);
	drain(s, big);
	sched_free(s);
	backend_destroy(&r1->base);
	/* 4 pages = 256 positions for ~580 positions of demand */
	struct rec *r2 = rec_new(&m, 4, 0);
	s = sched_new(r2, 64, 8, 1);
	for (int i = 0; i < N; i++)
		add(s, (uint64_t)i, p[i], len[i], 40, NULL);
	drain(s, small);
	struct sched_stats st;
	sched_stats(s, &st);
	CHECK(st.preemptions > 0);
	CHECK_EQ_INT(st.pages_used, 0);
	for (int i = 0; i < N; i++) {
		CHECK_EQ_INT(small[i].n, 40);
		if (!same(&big[i], &small[i]))
			test_fail(__FILE__, __LINE__, "request %d: tokens differ after preemption", i);
	}
	sched_free(s);
	backend_destroy(&r2->base);
	test_model_free(&m);
}

TEST_T(sched_cpu, seeded_request_same_alone_and_in_busy_batch, 300)
{
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size;
	struct sampler_params sp;
	sampler_params_default(&sp);
	sp.temperature = 1.0;
	sp.top_p = 0.95;
	sp.seed = 31337;
	int32_t p[8][64];
	for (int i = 0; i < 8; i++)
		prompt_of(p[i], 64, V, 100 + (uint64_t)i);
	static struct result alone[MAXREQ], busy[MAXREQ];
	struct rec *r1 = rec_new(&m, 8, 0);
	struct sched *s = sched_new(r1, 16, 1, 0);
	add(s, 0, p[0], 64, 24, &sp);
	drain(s, alone);
	sched_free(s);
	backend_destroy(&r1->base);
	struct rec *r2 = rec_new(&m, 6, 0);
	s = sched_new(r2, 40, 8, 1);
	for (int i = 1; i < 8; i++) {
		struct sampler_params o = sp;
		o.seed = (uint64_t)i;
		o.temperature = 0.7;
		add(s, (uint64_t)i, p[i], 64, 24, &o);
		if (i == 4)
			add(s, 0, p[0], 64, 24, &sp);
	}
	drain(s, busy);
	struct sched_stats st;
	sched_stats(s, &st);
	CHECK(st.preemptions > 0);
	CHECK_EQ_INT(alone[0].n, 24);
	CHECK(same(&alone[0], &busy[0]));
	int differ = 0; /* the stream is per request: other seeds give other tokens */
	for (int i = 1; i < 8; i++)
		differ += !same(&busy[i], &busy[0]);
	CHECK_EQ_INT(differ, 7);
	sched_free(s);
	backend_destroy(&r2->base);
	test_model_free(&m);
}

/* ---- draws by the backend (backend_step_draw) ---------------------------------------------- */

/* A backend that draws the tokens itself, as the CUDA backend does on the device: the inner
 * backend's (the CPU's, or the oracle's below) logits of each drawn sequence into a buffer of
 * its own, then sampler_sample with each draw's history (a verification: two draws, the
 * second from the second row). Counts the draws it made and the logits rows it handed back. */
struct drawer {
	struct backend base;
	struct backend *cpu; /* (the inner backend) */
	const struct weights *w;
	float *rows; /* [sample_rows, vocab] */
	struct sampler smp;
	int64_t draws, row2_draws, host_rows;
};

static void count_host_rows(struct drawer *d, const struct backend_step *st,
			    struct backend_sample *const *draw)
{
	for (int64_t i = 0; i < st->n_seqs; i++)
		for (int64_t j = 0; j < st->seqs[i].n && !(draw && draw[i]); j++)
			d->host_rows += !!(backend_row_flags(&st->seqs[i], j) & BACKEND_ROW_LOGITS);
}

static int drawer_step(struct backend *b, const struct backend_step *s)
{
	struct drawer *d = (struct drawer *)b;
	count_host_rows(d, s, NULL);
	return backend_step(d->cpu, s);
}

static int drawer_step_draw(struct backend *b, const struct backend_step *st,
			    struct backend_sample *const *draw)
{
	struct drawer *d = (struct drawer *)b;
	int rc = backend_validate_step_draw(b, d->w, st, draw);
	if (rc)
		return rc;
	struct backend_seq seqs[MAXREQ];
	REQUIRE(st->n_seqs <= MAXREQ);
	int64_t V = b->c->vocab_size, k = 0;
	for (int64_t i = 0; i < st->n_seqs; i++) {
		seqs[i] = st->seqs[i];
		seqs[i].logits = draw[i] ? d->rows + k * V : seqs[i].logits;
		k += backend_sample_chain(draw[i], st->seqs[i].n); /* (a row a draw of the chain) */
	}
	struct backend_step s2 = *st;
	s2.seqs = seqs;
	if ((rc = backend_step(d->cpu, &s2)))
		return rc;
	count_host_rows(d, st, draw);
	for (int64_t i = 0; i < st->n_seqs; i++) {
		const float *x = seqs[i].logits;
		for (struct backend_sample *q = draw[i]; q; q = q->row2, x += V) {
			q->rc = sampler_sample(&d->smp, q->p, x, q->prompt, q->n_prompt, q->output,
					       q->n_output, q->index, &q->out);
			d->draws++;
			d->row2_draws += q != draw[i];
		}
	}
	return 0;
}

static void drawer_destroy(struct backend *b)
{
	struct drawer *d = (struct drawer *)b;
	backend_destroy(d->cpu);
	sampler_free(&d->smp);
	free(d->rows);
	free(d);
}

static const struct backend_ops drawer_ops = {"drawer+cpu", drawer_step, wrapped_page_io,
					      drawer_destroy};

/* A drawer around inner (which it destroys), or around a new CPU backend of n_pages when inner
 * is NULL. */
static struct drawer *drawer_around(struct backend *inner, struct test_model *m, int64_t n_pages,
				    int64_t sample_rows, int64_t hist_ids)
{
	struct drawer *d = calloc(1, sizeof *d);
	REQUIRE(d);
	struct err e;
	d->cpu = inner;
	if (!inner)
		REQUIRE(backend_cpu_create(&m->c, &m->w, n_pages, 2, &d->cpu, &e) == 0);
	d->base = *d->cpu;
	d->base.ops = &drawer_ops;
	d->base.step_draw = drawer_step_draw;
	d->base.sample_rows = sample_rows;
	d->base.hist_ids = hist_ids;
	d->w = &m->w;
	d->rows = malloc((size_t)sample_rows * (size_t)m->c.vocab_size * sizeof(float));
	REQUIRE(d->rows && sampler_init(&d->smp, m->c.vocab_size) == 0);
	return d;
}


/* Six requests' sampling: greedy, seeded temperatures with top-k / top-p / min-p, logprobs
 * with alternatives, a penalty (request 5); seeds from seed0. */
static void sampling_mix(struct sampler_params sp[6], uint64_t seed0)
{
	for (int i = 0; i < 6; i++) {
		sampler_params_default(&sp[i]);
		sp[i].seed = seed0 + (uint64_t)i;
	}
	sp[1].temperature = 0.8, sp[1].top_k = 40;
	sp[2].temperature = 1.0, sp[2].top_p = 0.9, sp[2].logprobs = 1, sp[2].top_logprobs = 5;
	sp[3].temperature = 1.3, sp[3].min_p = 0.05;
	sp[4].logprobs = 1, sp[4].top_logprobs = 3;
	sp[5].temperature = 0.9, sp[5].repetition_penalty = 1.2, sp[5].presence_penalty = 0.5;
}

/* Greedy, seeded temperature with top-k / top-p / min-p, a penalty, logprobs with alternatives:
 * the same requests through the backend's draws (sample_rows 8 >= max_seqs: every row, the
 * penalised one with its history) and through the scheduler's own sampling (host_sampling) give
 * the same token events bit for bit; a penalised row whose history does not fit hist_ids, and
 * the finished rows beyond sample_rows, are drawn on the host beside the backend's draws of the
 * others, with the same tokens. */
TEST_T(sched_cpu, backend_draws_equal_host_draws, 300)
{
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size;
	enum { N = 6 };
	int32_t p[N][40];
	struct sampler_params sp[N];
	for (int i = 0; i < N; i++)
		prompt_of(p[i], 40, V, 300 + (uint64_t)i);
	sampling_mix(sp, 77);
	static struct sched_trace host, dev, short_hist, narrow;
	struct sched_trace *tr[4] = {&host, &dev, &short_hist, &narrow};
	int64_t draws[4], host_rows[4];
	for (int run = 0; run < 4; run++) {
		/* run 2: 30 ids of history, less than request 5's prompt */
		struct drawer *d = drawer_around(NULL, &m, 16, run == 3 ? 2 : 8, run == 2 ? 30 : 1 << 20);
		struct sched_config c = {0};
		c.max_batch_tokens = 64;
		c.max_seqs = 8;
		c.seed = 9;
		c.host_sampling = run == 0;
		struct sched *s;
		struct err e = {{0}};
		REQUIRE(sched_init(&s, &d->base, &c, &e) == 0);
		for (int i = 0; i < N; i++)
			add(s, (uint64_t)i, p[i], 40, 12, &sp[i]);
		sched_trace_run(s, tr[run]);
		sched_trace_sort(tr[run]);
		draws[run] = d->draws, host_rows[run] = d->host_rows;
		sched_free(s);
		backend_destroy(&d->base);
	}
	CHECK_EQ_INT(draws[0], 0);             /* host_sampling: never the backend's */
	CHECK_EQ_INT(host_rows[0], N * 12);
	CHECK_EQ_INT(draws[1], N * 12);        /* every token drawn by the backend */
	CHECK_EQ_INT(host_rows[1], 0);
	CHECK_EQ_INT(draws[2], (N - 1) * 12);  /* request 5's history does not fit: on the host */
	CHECK_EQ_INT(host_rows[2], 12);
	CHECK(draws[3] > 0 && host_rows[3] > 0); /* 2 a step: the others on the host */
	CHECK_EQ_INT(draws[3] + host_rows[3], N * 12);
	CHECK_EQ_INT(host.n, N * 13); /* 12 tokens and the finish a request */
	for (int run = 1; run < 4; run++) { /* bit for bit, logprobs included */
		double worst;
		int64_t bad = sched_trace_diff(&host, tr[run], UINT64_MAX, &worst);
		if (bad || worst != 0)
			test_fail(__FILE__, __LINE__, "run %d: %lld token events differ from the host's, "
				  "worst logprob difference %g", run, (long long)bad, worst);
	}
	test_model_free(&m);
}

/* ---- MTP drafting (sched_config.mtp_draft) ------------------------------------------------- */

/* The requests of the drafting tests: sampling_mix's (the penalised one's second draw of a
 * verification has the draft in its history). */
enum { MTP_N = 6, MTP_LEN = 56, MTP_OUT = 20 };

static void mtp_requests(int64_t V, int32_t p[MTP_N][MTP_LEN], struct sampler_params *sp)
{
	for (int i = 0; i < MTP_N; i++)
		prompt_of(p[i], MTP_LEN - 7 * i, V, 500 + (uint64_t)i);
	sampling_mix(sp, 91);
}

static void mtp_run(struct backend *b, int64_t budget, int64_t max_seqs, int draft, int64_t V,
		    struct sched_trace *t, struct sched_stats *st)
{
	int32_t p[MTP_N][MTP_LEN];
	struct sampler_params sp[MTP_N];
	mtp_requests(V, p, sp);
	struct sched_config c = {0};
	c.max_batch_tokens = budget;
	c.max_seqs = max_seqs;
	c.seed = 9;
	c.prefix_cache = 1; /* the preempted come back through their own pages */
	c.mtp_draft = draft;
	struct sched *s;
	struct err e = {{0}};
	int rc = sched_init(&s, b, &c, &e);
	if (rc)
		test_fail(__FILE__, __LINE__, "sched_init: %s", e.msg);
	REQUIRE(rc == 0);
	for (int i = 0; i < MTP_N; i++)
		add(s, (uint64_t)i, p[i], MTP_LEN - 7 * i, MTP_OUT, &sp[i]);
	sched_trace_run(s, t);
	sched_trace_sort(t);
	sched_stats(s, st);
	CHECK_EQ_INT(st->pages_used, 0);
	sched_free(s);
}

static void mtp_same(const struct sched_trace *a, const struct sched_trace *b, const char *what)
{
	double worst;
	int64_t bad = sched_trace_diff(a, b, UINT64_MAX, &worst);
	if (bad || worst != 0)
		test_fail(__FILE__, __LINE__, "%s: %lld token events differ from plain decoding, "
			  "worst logprob difference %g", what, (long long)bad, worst);
}

/* A 150-token prompt, then the same prompt again (its first 128 positions from the prefix
 * cache, their MTP slots the first request's); greedy, 12 tokens each, into res[0], res[1]. */
static void mtp_prefix_run(struct backend *b, int draft, int64_t V, struct result *res)
{
	int32_t p[150];
	prompt_of(p, 150, V, 7);
	struct sched_config c = {.max_batch_tokens = 64, .max_seqs = 2, .seed = 9,
				 .prefix_cache = 1, .mtp_draft = draft};
	struct sched *s;
	struct err e = {{0}};
	REQUIRE(sched_init(&s, b, &c, &e) == 0);
	add(s, 0, p, 150, 12, NULL);
	drain(s, res);
	add(s, 1, p, 150, 12, NULL);
	drain(s, res);
	sched_free(s);
}

/* With the tiny model's own (random) MTP layer: the drafting runs (one draft a step, and three:
 * the MTP layer chained on itself) give plain decoding's token events bit for bit, alone,
 * batched, preempted (a pool of 3 pages for 6 requests), with the backend drawing the rows it
 * may (8 draws a step: verifications' rows and drafts there, the rest on the host), and after a
 * prefix-cache hit. */
TEST_T(sched_cpu, mtp_draft_tokens_equal_plain_decoding, 300)
{
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size;
	static struct sched_trace plain, one, busy, small, drawn;
	struct sched_stats st;
	struct rec *r = rec_new(&m, 16, 0);
	mtp_run(&r->base, 64, 8, 0, V, &plain, &st);
	CHECK_EQ_INT(st.drafts, 0);
	CHECK_EQ_INT(plain.n, MTP_N * (MTP_OUT + 1));
	backend_destroy(&r->base);
	for (int K = 1; K <= 3; K += 2) {
		char what[64];
		r = rec_new(&m, 16, 0);
		mtp_run(&r->base, 64, 1, K, V, &one, &st);
		snprintf(what, sizeof what, "%d draft(s), one at a time", K);
		mtp_same(&plain, &one, what);
		CHECK(st.drafts > 0);
		mtp_run(&r->base, 64, 8, K, V, &busy, &st);
		snprintf(what, sizeof what, "%d draft(s), batched", K);
		mtp_same(&plain, &busy, what);
		backend_destroy(&r->base);
		r = rec_new(&m, 3, 0);
		mtp_run(&r->base, 48, 8, K, V, &small, &st);
		snprintf(what, sizeof what, "%d draft(s), preempted", K);
		mtp_same(&plain, &small, what);
		CHECK(st.preemptions > 0);
		backend_destroy(&r->base);
		struct drawer *d = drawer_around(NULL, &m, 16, 8, 1 << 20);
		mtp_run(&d->base, 64, 8, K, V, &drawn, &st);
		snprintf(what, sizeof what, "%d draft(s), backend draws", K);
		mtp_same(&plain, &drawn, what);
		CHECK(d->draws > 0 && d->row2_draws > 0); /* verifications among them */
		CHECK(d->host_rows > 0); /* (8 draws a step: some verifications on the host) */
		backend_destroy(&d->base);
	}
	static struct result hit_plain[MAXREQ], hit_drafted[MAXREQ];
	r = rec_new(&m, 16, 0);
	mtp_prefix_run(&r->base, 0, V, hit_plain);
	mtp_prefix_run(&r->base, 1, V, hit_drafted);
	backend_destroy(&r->base);
	CHECK_EQ_INT(hit_drafted[1].cached, 128);
	CHECK_EQ_INT(hit_drafted[1].n, 12);
	CHECK(same(&hit_plain[0], &hit_drafted[0]) && same(&hit_plain[1], &hit_drafted[1]));
	CHECK(same(&hit_drafted[0], &hit_drafted[1]));
	/* a model without an MTP layer refuses drafting, naming it */
	r = rec_new(&m, 4, 0);
	r->base.n_layers = m.c.num_hidden_layers;
	struct sched_config c = {.max_batch_tokens = 8, .max_seqs = 2, .mtp_draft = 1};
	struct sched *s;
	struct err e = {{0}};
	CHECK_EQ_INT(sched_init(&s, &r->base, &c, &e), -EINVAL);
	CHECK(strstr(e.msg, "MTP") != NULL);
	backend_destroy(&r->base);
	test_model_free(&m);
}

/* An MTP layer that drafts from a known answer: the CPU backend's MTP step, then each draft row
 * rewritten to peak at the reference's token for it, or, at every `wrong`-th position, at
 * another; requests one at a time (max_seqs 1), each known by its MTP rows starting at 0. */
struct oracle {
	struct backend base;
	struct backend *cpu;
	const struct sched_trace *ref; /* plain decoding's sorted events */
	const int32_t (*prompt)[MTP_LEN];
	int64_t cur, wrong;
};

/* The token at position `pos` of request `id`: its prompt's, else its reference output's. */
static int32_t oracle_token(const struct oracle *o, int64_t id, int64_t pos)
{
	int64_t n_prompt = MTP_LEN - 7 * id;
	if (pos < n_prompt)
		return o->prompt[id][pos];
	for (int64_t i = 0; i < o->ref->n; i++) {
		const struct sched_event *ev = &o->ref->ev[i];
		if (ev->type == SCHED_EVENT_TOKEN && (int64_t)ev->id == id &&
		    ev->seq == pos - n_prompt)
			return ev->token;
	}
	return 0; /* past the reference's end: any draft */
}

static int oracle_step(struct backend *b, const struct backend_step *st)
{
	struct oracle *o = (struct oracle *)b;
	int rc = backend_step(o->cpu, st);
	if (rc || !st->mtp)
		return rc;
	REQUIRE(st->n_seqs == 1);
	const struct backend_seq *q = &st->seqs[0];
	if (q->pos[0] == 0)
		o->cur++;
	int64_t V = b->c->vocab_size, l = 0;
	for (int64_t i = 0; i < q->n; i++) {
		if (!(backend_row_flags(q, i) & BACKEND_ROW_LOGITS))
			continue;
		/* row i at position pos drafts the token at pos + 2 */
		int64_t pos = q->pos[i];
		int32_t t = oracle_token(o, o->cur - 1, pos + 2);
		if (o->wrong && pos % o->wrong == 0)
			t = (t + 1) % (int32_t)V;
		float *x = q->logits + l++ * V;
		for (int64_t v = 0; v < V; v++)
			x[v] = 0;
		x[t] = 1;
	}
	return 0;
}

static void oracle_destroy(struct backend *b)
{
	struct oracle *o = (struct oracle *)b;
	backend_destroy(o->cpu);
	free(o);
}

static const struct backend_ops oracle_ops = {"oracle-mtp+cpu", oracle_step, wrapped_page_io,
					      oracle_destroy};

/* Drafts right at every position, then wrong at every third: the tokens stay plain decoding's,
 * logprobs and alternatives included (the row of an accepted draft draws with the request's
 * index and history one further); every right draft is accepted, so a request's decodes take
 * half the steps with one draft a step, a quarter with three (the MTP layer chained on
 * itself: the oracle answers each chained row too). Both with the draws on the host and by the
 * backend (a drawer around the oracle: every row drawn there, the verifications' draft rows and
 * the drafts included). */
TEST_T(sched_cpu, mtp_draft_accepted_drafts_keep_tokens, 300)
{
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size;
	int32_t p[MTP_N][MTP_LEN];
	struct sampler_params sp[MTP_N];
	mtp_requests(V, p, sp);
	static struct sched_trace plain, right, some;
	struct sched_stats st, st_plain;
	struct rec *r = rec_new(&m, 16, 0);
	mtp_run(&r->base, 64, 1, 0, V, &plain, &st_plain);
	backend_destroy(&r->base);
	for (int run = 0; run < 8; run++) { /* bits: wrong drafts, backend draws, three drafts */
		const int K = run & 4 ? 3 : 1;
		struct oracle *o = calloc(1, sizeof *o);
		REQUIRE(o);
		struct err e;
		REQUIRE(backend_cpu_create(&m.c, &m.w, 16, 2, &o->cpu, &e) == 0);
		o->base = *o->cpu;
		o->base.ops = &oracle_ops;
		o->ref = &plain;
		o->prompt = (const int32_t(*)[MTP_LEN])p;
		o->wrong = run & 1 ? 3 : 0;
		struct drawer *d = run & 2 ? drawer_around(&o->base, &m, 0, 8, 1 << 20) : NULL;
		struct backend *b = d ? &d->base : &o->base;
		char what[96];
		snprintf(what, sizeof what, "%d draft(s), %s%s", K, run & 1 ? "a third wrong" : "all right",
			 d ? ", backend draws" : "");
		mtp_run(b, 64, 1, K, V, run & 1 ? &some : &right, &st);
		mtp_same(&plain, run & 1 ? &some : &right, what);
		CHECK_EQ_INT(o->cur, MTP_N);
		if (d) { /* every logits row drawn by the backend */
			CHECK_EQ_INT(d->host_rows, 0);
			CHECK(d->row2_draws > 0);
		}
		if (!(run & 1)) {
			/* one draft: 9 a request, the 20th token alone (a draft after it would be
			 * past max_tokens): its prefill step, then 1 + 9 x 2 + 1 tokens in 10 steps,
			 * against 20 steps plainly; three: 3 drafts a step four times, then 2 (a third
			 * would be past max_tokens): 14 a request, 1 + 4 x 4 + 3 tokens in 5 steps */
			CHECK_EQ_INT(st.drafts, MTP_N * (K == 1 ? 9 : 14));
			CHECK_EQ_INT(st.drafts_accepted, st.drafts);
			CHECK(st.steps < st_plain.steps * (K == 1 ? 2 : 1) / 3);
		} else {
			CHECK(st.drafts_accepted > 0 && st.drafts_accepted < st.drafts);
		}
		backend_destroy(b);
	}
	test_model_free(&m);
}
