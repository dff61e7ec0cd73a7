/*
 * test_sched.c — the scheduler against a fake backend (a test double, below; never the
 * product): chunking and budgets, decodes first, max_seqs and FCFS, preemption, prefix hits,
 * cancellation everywhere, every stop condition including stop strings split across tokens,
 * validation errors, seeded sampling under load, engine faults, and a randomised workload
 * whose outputs must equal each request run alone.
 *
 * The fake backend models what matters of a real one: the "K/V" it writes at position p is a
 * hash of the entry at p - 1 (read back through the block table) and the token, so each slot
 * stands for the whole prefix, and a row's logits are a function of its slot. A wrong block
 * table, a wrong prefix hit or a page reused while in use changes the tokens that follow, and
 * reading a slot never written is reported. It also checks the backend contract (positions
 * inside the block table, page ids in range, no slot written by two rows of one step) and
 * records each step's shape.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sched.h"
#include "model/tokenizer.h"
#include "tests/test.h"

/* ---- the fake backend ---------------------------------------------------------------------- */

#define FAKE_VOCAB 1024
#define MAX_STEPS_REC 4096

struct step_rec {
	int64_t n_seqs, rows, decode_seqs, logits_rows;
};

struct fake {
	struct backend base;
	struct dsv32_config c;
	uint64_t *kv;        /* [n_pages * 64] slot contents, 0 = never written */
	uint64_t *stamp;     /* [n_pages * 64] step that last wrote the slot */
	int64_t n_steps;
	struct step_rec rec[MAX_STEPS_REC];
	int64_t eos_at;      /* a row at this position puts EOS on top; -1 = never */
	int64_t nan_at;      /* a row at this position gets a NaN logit; -1 = never */
	int fail_next;       /* the next step returns -EIO */
	const int32_t *script; /* script[p]: token the row at position p puts on top (-1 none) */
	int64_t n_script;
	int errors;
};

static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void fake_error(struct fake *f, const char *what, int64_t pos)
{
	if (f->errors++ < 5)
		fprintf(stderr, "fake backend: %s (pos %lld)\n", what, (long long)pos);
}

static int fake_step(struct backend *b, const struct backend_step *s)
{
	struct fake *f = (struct fake *)b;
	if (f->fail_next) {
		f->fail_next = 0;
		return -EIO;
	}
	int64_t id = ++f->n_steps;
	struct step_rec *r = &f->rec[id < MAX_STEPS_REC ? id : 0];
	memset(r, 0, sizeof *r);
	r->n_seqs = s->n_seqs;
	for (int64_t k = 0; k < s->n_seqs; k++) {
		const struct backend_seq *q = &s->seqs[k];
		r->rows += q->n;
		r->decode_seqs += q->n == 1;
		float *lg = q->logits;
		for (int64_t i = 0; i < q->n; i++) {
			int64_t p = q->pos[i];
			if (p < 0 || p >= q->n_blocks * 64) {
				fake_error(f, "position outside the block table", p);
				return -EINVAL;
			}
			int32_t page = q->block_table[p / 64];
			if (page < 0 || page >= b->n_pages) {
				fake_error(f, "page out of range", p);
				return -EINVAL;
			}
			uint64_t prev = 0x1234;
			if (p > 0) {
				int32_t pp = q->block_table[(p - 1) / 64];
				prev = f->kv[(size_t)pp * 64 + (size_t)((p - 1) % 64)];
				if (!prev)
					fake_error(f, "row attends to a position never written", p);
			}
			size_t slot = (size_t)page * 64 + (size_t)(p % 64);
			if (f->stamp[slot] == (uint64_t)id)
				fake_error(f, "slot written twice in one step", p);
			f->stamp[slot] = (uint64_t)id;
			uint64_t v = mix(prev ^ mix((uint64_t)q->tokens[i] + 1000003ull * (uint64_t)p)) | 1;
			f->kv[slot] = v;
			int want = q->flags ? (q->flags[i] & BACKEND_ROW_LOGITS) : i == q->n - 1;
			if (!want)
				continue;
			r->logits_rows++;
			for (int64_t t = 0; t < FAKE_VOCAB; t++)
				lg[t] = (float)(mix(v ^ (uint64_t)t * 0x9e3779b97f4a7c15ull) >> 40) /
					(float)(1 << 24) * 4.0f;
			lg[f->c.eos_token_id] = p == f->eos_at ? 100.0f : -100.0f;
			if (p == f->nan_at)
				lg[7] = NAN;
			if (f->script && p < f->n_script && f->script[p] >= 0)
				lg[f->script[p]] = 200.0f;
			lg += FAKE_VOCAB;
		}
	}
	return 0;
}

static int fake_page_io(struct backend *b, int64_t layer, enum backend_pool pool, int64_t page,
			void *buf, int write)
{
	return -EINVAL;
}

static void fake_destroy(struct backend *b)
{
	struct fake *f = (struct fake *)b;
	free(f->kv);
	free(f->stamp);
	free(f);
}

static const struct backend_ops fake_ops = {"fake", fake_step, fake_page_io, fake_destroy};

static struct fake *fake_new(int64_t n_pages)
{
	struct fake *f = calloc(1, sizeof *f);
	REQUIRE(f);
	f->c.vocab_size = FAKE_VOCAB;
	f->c.max_position_embeddings = 163840;
	f->c.eos_token_id = 1;
	f->base.ops = &fake_ops;
	f->base.c = &f->c;
	f->base.n_layers = 1;
	f->base.n_pages = n_pages;
	f->kv = calloc((size_t)n_pages * 64, sizeof *f->kv);
	f->stamp = calloc((size_t)n_pages * 64, sizeof *f->stamp);
	REQUIRE(f->kv && f->stamp);
	f->eos_at = -1;
	f->nan_at = -1;
	return f;
}

/* ---- driving the scheduler ------------------------------------------------------------------ */

#define MAXREQ 256

struct outcome {
	int32_t tok[2048];
	int64_t n;
	int done;               /* terminal events seen */
	enum sched_event_type last;
	enum sched_finish reason;
	int error;
	int64_t n_prompt_cached, n_output;
	char text[4096];
	size_t text_len;
	int64_t first_step;     /* step of the first token, -1 */
};

struct run {
	struct sched *s;
	struct fake *f;
	struct outcome out[MAXREQ];
	int64_t steps;
};

static void run_init(struct run *r, int64_t n_pages, struct sched_config cfg)
{
	memset(r, 0, sizeof *r);
	r->f = fake_new(n_pages);
	struct err e = {{0}};
	int rc = sched_init(&r->s, &r->f->base, &cfg, &e);
	if (rc)
		test_fail(__FILE__, __LINE__, "sched_init: %s", e.msg);
	REQUIRE(rc == 0);
	for (int i = 0; i < MAXREQ; i++)
		r->out[i].first_step = -1;
}

static void run_free(struct run *r)
{
	sched_free(r->s);
	backend_destroy(&r->f->base);
}

static void check_invariants(struct run *r)
{
	const struct kv_seq *seqs[MAXREQ * 2];
	int64_t n = sched_kv_seqs(r->s, seqs, MAXREQ * 2);
	REQUIRE(n <= MAXREQ * 2);
	struct err e = {{0}};
	int rc = kv_pages_check(sched_pages(r->s), seqs, n, &e);
	if (rc) {
		test_fail(__FILE__, __LINE__, "page invariant: %s", e.msg);
		test_abort_case();
	}
}

static void take_events(struct run *r, const struct sched_event *ev, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		REQUIRE(ev[i].id < MAXREQ);
		struct outcome *o = &r->out[ev[i].id];
		if (o->done) {
			test_fail(__FILE__, __LINE__, "request %llu: event after its terminal event",
				  (unsigned long long)ev[i].id);
			continue;
		}
		if (ev[i].type == SCHED_EVENT_TOKEN) {
			CHECK_EQ_INT(ev[i].seq, o->n);
			REQUIRE(o->n < 2048);
			o->tok[o->n++] = ev[i].token;
			if (o->first_step < 0)
				o->first_step = r->steps;
		} else {
			o->done++;
			o->last = ev[i].type;
			o->reason = ev[i].reason;
			o->error = ev[i].error;
			o->n_prompt_cached = ev[i].n_prompt_cached;
			o->n_output = ev[i].n_output;
		}
		if (ev[i].type != SCHED_EVENT_ERROR && ev[i].text_len) {
			REQUIRE(o->text_len + ev[i].text_len < sizeof o->text);
			memcpy(o->text + o->text_len, ev[i].text, ev[i].text_len);
			o->text_len += ev[i].text_len;
		}
	}
}

static void step_once(struct run *r)
{
	const struct sched_event *ev;
	int64_t n;
	REQUIRE(sched_step(r->s, &ev, &n) == 0);
	r->steps++;
	take_events(r, ev, n);
	check_invariants(r);
	CHECK_EQ_INT(r->f->errors, 0);
}

static void drain(struct run *r)
{
	for (int64_t guard = 0; sched_has_work(r->s); guard++) {
		REQUIRE(guard < 100000);
		step_once(r);
	}
}

static void add(struct run *r, uint64_t id, uint32_t uid, const int32_t *prompt, int64_t n,
		int64_t max_tokens)
{
	struct sched_request q = {0};
	q.id = id;
	q.uid = uid;
	q.prompt = prompt;
	q.n_prompt = n;
	sampler_params_default(&q.sampling);
	q.max_tokens = max_tokens;
	struct err e = {{0}};
	int rc = sched_add(r->s, &q, &e);
	if (rc)
		test_fail(__FILE__, __LINE__, "sched_add %llu: %s", (unsigned long long)id, e.msg);
	REQUIRE(rc == 0);
}

static struct sched_config cfg_of(int64_t budget, int64_t max_seqs, int prefix)
{
	struct sched_config c = {0};
	c.max_batch_tokens = budget;
	c.max_seqs = max_seqs;
	c.prefix_cache = prefix;
	c.seed = 1;
	return c;
}

static void prompt_of(int32_t *t, int64_t n, uint64_t seed)
{
	for (int64_t i = 0; i < n; i++)
		t[i] = 3 + (int32_t)(test_rand(&seed) % (FAKE_VOCAB - 3));
}

/* Every request alone, token by token, big pool, no prefix cache: the reference tokens. */
static void solo(const int32_t *prompt, int64_t n, int64_t max_tokens, struct outcome *ref)
{
	struct run *r = malloc(sizeof *r);
	run_init(r, 256, cfg_of(1, 1, 0));
	add(r, 0, 0, prompt, n, max_tokens);
	drain(r);
	*ref = r->out[0];
	run_free(r);
	free(r);
}

static void same_tokens(const struct outcome *a, const struct outcome *b, uint64_t id)
{
	int same = a->n == b->n && !memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok);
	if (!same)
		test_fail(__FILE__, __LINE__, "request %llu: %lld tokens vs %lld, differ",
			  (unsigned long long)id, (long long)a->n, (long long)b->n);
}

/* ---- tests --------------------------------------------------------------------------------- */

TEST(sched, chunked_prefill_within_budget)
{
	struct run *r = malloc(sizeof *r);
	run_init(r, 64, cfg_of(64, 8, 1));
	int32_t p[300];
	prompt_of(p, 300, 1);
	add(r, 0, 0, p, 300, 5);
	drain(r);
	CHECK_EQ_INT(r->out[0].done, 1);
	CHECK_EQ_INT(r->out[0].reason, SCHED_FINISH_LENGTH);
	CHECK_EQ_INT(r->out[0].n, 5);
	/* 300 = 4 x 64 + 44: five prefill steps, logits only on the last, then 4 decodes */
	CHECK_EQ_INT(r->f->n_steps, 9);
	for (int64_t i = 1; i <= 4; i++) {
		CHECK_EQ_INT(r->f->rec[i].rows, 64);
		CHECK_EQ_INT(r->f->rec[i].logits_rows, 0);
	}
	CHECK_EQ_INT(r->f->rec[5].rows, 44);
	CHECK_EQ_INT(r->f->rec[5].logits_rows, 1);
	struct outcome ref;
	solo(p, 300, 5, &ref);
	same_tokens(&r->out[0], &ref, 0);
	struct sched_stats st;
	sched_stats(r->s, &st);
	CHECK_EQ_INT(st.prefill_tokens, 300);
	CHECK_EQ_INT(st.decode_tokens, 4);
	CHECK_EQ_INT(st.pages_used, 0);
	run_free(r);
	free(r);
}

TEST(sched, decodes_first_then_prefill_chunks)
{
	struct run *r = malloc(sizeof *r);
	run_init(r, 128, cfg_of(32, 8, 0));
	int32_t p[4][10], big[600];
	for (int i = 0; i < 4; i++) {
		prompt_of(p[i], 10, 10 + i);
		add(r, i, 0, p[i], 10, 60);
	}
	step_once(r); /* 40 prompt tokens > 32: three prompts and part of the fourth */
	CHECK_EQ_INT(r->f->rec[1].rows, 32);
	step_once(r);
	prompt_of(big, 600, 99);
	add(r, 4, 0, big, 600, 3);
	int64_t mixed = 0;
	while (!r->out[4].n) {
		step_once(r);
		const struct step_rec *s = &r->f->rec[r->f->n_steps];
		CHECK(s->rows <= 32);
		int64_t live = 0;
		for (int i = 0; i < 4; i++)
			live += !r->out[i].done;
		if (live == 4) { /* all four decode every step, the prefill gets the rest */
			CHECK_EQ_INT(s->decode_seqs, 4);
			mixed += s->rows == 32;
		}
	}
	CHECK(mixed > 10);
	drain(r);
	for (int i = 0; i < 5; i++) {
		struct outcome ref;
		solo(i < 4 ? p[i] : big, i < 4 ? 10 : 600, i < 4 ? 60 : 3, &ref);
		same_tokens(&r->out[i], &ref, (uint64_t)i);
	}
	run_free(r);
	free(r);
}

TEST(sched, max_seqs_and_arrival_order)
{
	struct run *r = malloc(sizeof *r);
	run_init(r, 128, cfg_of(256, 3, 0));
	int32_t p[10][20];
	for (int i = 0; i < 10; i++) {
		prompt_of(p[i], 20, 100 + i);
		add(r, i, 0, p[i], 20, 5 + i);
	}
	while (sched_has_work(r->s)) {
		step_once(r);
		CHECK(r->f->rec[r->f->n_steps].n_seqs <= 3);
		struct sched_stats st;
		sched_stats(r->s, &st);
		CHECK(st.running <= 3);
	}
	for (int i = 1; i < 10; i++)
		CHECK(r->out[i].first_step >= r->out[i - 1].first_step);
	for (int i = 0; i < 10; i++) {
		CHECK_EQ_INT(r->out[i].done, 1);
		CHECK_EQ_INT(r->out[i].n, 5 + i);
	}
	run_free(r);
	free(r);
}

static void preemption_case(int prefix)
{
	/* 8 pages = 512 positions; six requests of 100 + 150 tokens need 24 pages. */
	enum { N = 6 };
	int32_t p[N][100];
	struct run *r = malloc(sizeof *r);
	run_init(r, 8, cfg_of(128, 8, prefix));
	for (int i = 0; i < N; i++) {
		prompt_of(p[i], 100, 200 + (uint64_t)i);
		add(r, i, 0, p[i], 100, 150);
	}
	drain(r);
	struct sched_stats st;
	sched_stats(r->s, &st);
	CHECK(st.preemptions > 0);
	CHECK_EQ_INT(st.pages_used, 0);
	CHECK_EQ_INT(st.running + st.waiting, 0);
	for (int i = 0; i < N; i++) {
		CHECK_EQ_INT(r->out[i].done, 1);
		CHECK_EQ_INT(r->out[i].reason, SCHED_FINISH_LENGTH);
		struct outcome ref;
		solo(p[i], 100, 150, &ref);
		same_tokens(&r->out[i], &ref, (uint64_t)i);
	}
	run_free(r);
	free(r);
}

TEST(sched, preemption_recomputes_to_the_same_tokens)
{
	preemption_case(0);
	preemption_case(1);
}

TEST(sched, prefix_cache_hits_by_identity)
{
	struct run *r = malloc(sizeof *r);
	run_init(r, 64, cfg_of(512, 8, 1));
	int32_t p[200];
	prompt_of(p, 200, 7);
	add(r, 0, 42, p, 200, 70); /* its output crosses into page 4: 270 positions */
	drain(r);
	CHECK_EQ_INT(r->out[0].n_prompt_cached, 0);
	add(r, 1, 42, p, 200, 70);
	add(r, 2, 43, p, 200, 70);
	drain(r);
	CHECK_EQ_INT(r->out[1].n_prompt_cached, 192);
	CHECK_EQ_INT(r->out[2].n_prompt_cached, 0);
	same_tokens(&r->out[1], &r->out[0], 1);
	same_tokens(&r->out[2], &r->out[0], 2);
	/* A follow-up turn: prompt + its output + more: the generated pages hit too. */
	int32_t turn[300];
	memcpy(turn, p, sizeof p);
	memcpy(turn + 200, r->out[0].tok, 70 * sizeof *turn);
	prompt_of(turn + 270, 30, 8);
	add(r, 3, 42, turn, 300, 4);
	drain(r);
	CHECK_EQ_INT(r->out[3].n_prompt_cached, 256);
	struct outcome ref;
	solo(turn, 300, 4, &ref);
	same_tokens(&r->out[3], &ref, 3);
	struct sched_stats st;
	sched_stats(r->s, &st);
	CHECK_EQ_INT(st.prefix_hit_pages, 7);
	CHECK_EQ_INT(st.prefix_lookup_pages, 13);
	CHECK(fabs(st.prefix_hit_rate - 7.0 / 13.0) < 1e-12);
	run_free(r);
	free(r);
}

TEST(sched, cancel_anywhere_frees_everything)
{
	struct run *r = malloc(sizeof *r);
	run_init(r, 32, cfg_of(16, 2, 1));
	int32_t p[4][100];
	for (int i = 0; i < 4; i++) {
		prompt_of(p[i], 100, 300 + (uint64_t)i);
		add(r, i, 0, p[i], 100, 100);
	}
	CHECK_EQ_INT(sched_cancel(r->s, 3), 0); /* waiting, never admitted */
	step_once(r);
	CHECK_EQ_INT(r->out[3].done, 1);
	CHECK_EQ_INT(r->out[3].reason, SCHED_FINISH_CANCELLED);
	CHECK_EQ_INT(sched_cancel(r->s, 0), 0); /* running, mid-prefill */
	CHECK_EQ_INT(sched_cancel(r->s, 0), -ENOENT);
	CHECK_EQ_INT(sched_cancel(r->s, 99), -ENOENT);
	step_once(r);
	CHECK_EQ_INT(r->out[0].reason, SCHED_FINISH_CANCELLED);
	CHECK_EQ_INT(r->out[0].n, 0);
	while (r->out[1].n < 3)
		step_once(r);
	CHECK_EQ_INT(sched_cancel(r->s, 1), 0); /* decoding */
	int64_t n1 = r->out[1].n;
	drain(r);
	CHECK_EQ_INT(r->out[1].done, 1);
	CHECK_EQ_INT(r->out[1].n, n1);
	CHECK_EQ_INT(r->out[1].reason, SCHED_FINISH_CANCELLED);
	CHECK_EQ_INT(r->out[2].reason, SCHED_FINISH_LENGTH);
	struct sched_stats st;
	sched_stats(r->s, &st);
	CHECK_EQ_INT(st.pages_used, 0);
	CHECK_EQ_INT(st.pages_free + st.pages_cached, 32);
	CHECK_EQ_INT(st.requests_finished, 4);
	run_free(r);
	free(r);
}

TEST(sched, stop_eos_ids_length_context)
{
	struct run *r = malloc(sizeof *r);
	struct sched_config c = cfg_of(256, 8, 0);
	c.max_context = 64 + 20;
	run_init(r, 64, c);
	int32_t p[64];
	prompt_of(p, 64, 5);
	/* EOS: the row at position 64 + 4 puts EOS on top: four tokens, then eos */
	r->f->eos_at = 64 + 4;
	add(r, 0, 0, p, 64, 0);
	drain(r);
	CHECK_EQ_INT(r->out[0].reason, SCHED_FINISH_EOS);
	CHECK_EQ_INT(r->out[0].n, 5);
	CHECK_EQ_INT(r->out[0].n_output, 5);
	/* ignore_eos: runs into the context limit (84 = 64 + 20 output tokens) */
	struct sched_request q = {0};
	q.id = 1;
	q.prompt = p;
	q.n_prompt = 64;
	sampler_params_default(&q.sampling);
	q.ignore_eos = 1;
	struct err e;
	REQUIRE(sched_add(r->s, &q, &e) == 0);
	drain(r);
	CHECK_EQ_INT(r->out[1].reason, SCHED_FINISH_CONTEXT_LIMIT);
	CHECK_EQ_INT(r->out[1].n, 20);
	CHECK_EQ_INT(r->out[1].tok[5], 1); /* EOS came through as an ordinary token */
	/* A stop id: the fifth token (from the EOS-free run) stops; it is not emitted. */
	r->f->eos_at = -1;
	add(r, 2, 0, p, 64, 0);
	drain(r);
	int32_t stop_id = r->out[2].tok[4];
	q.id = 3;
	q.ignore_eos = 0;
	q.stop_ids = &stop_id;
	q.n_stop_ids = 1;
	REQUIRE(sched_add(r->s, &q, &e) == 0);
	drain(r);
	CHECK_EQ_INT(r->out[3].reason, SCHED_FINISH_STOP);
	int64_t first = 0;
	while (r->out[2].tok[first] != stop_id)
		first++;
	CHECK_EQ_INT(r->out[3].n, first);
	/* max_tokens */
	add(r, 4, 0, p, 64, 7);
	drain(r);
	CHECK_EQ_INT(r->out[4].reason, SCHED_FINISH_LENGTH);
	CHECK_EQ_INT(r->out[4].n, 7);
	/* max_tokens past the context limit: the limit wins */
	add(r, 5, 0, p, 64, 1000);
	drain(r);
	CHECK_EQ_INT(r->out[5].reason, SCHED_FINISH_CONTEXT_LIMIT);
	run_free(r);
	free(r);
}

TEST(sched, validation_errors_are_typed)
{
	struct run *r = malloc(sizeof *r);
	struct sched_config c = cfg_of(64, 4, 1);
	c.max_waiting = 2;
	run_init(r, 4, c); /* 4 pages: context limit 256 */
	int32_t p[300];
	prompt_of(p, 300, 1);
	struct sched_request q = {0};
	q.id = 1;
	q.prompt = p;
	q.n_prompt = 10;
	sampler_params_default(&q.sampling);
	struct err e = {{0}};
#define EXPECT(code, word)                                  \
	do {                                                \
		memset(&e, 0, sizeof e);                    \
		CHECK_EQ_INT(sched_add(r->s, &q, &e), code); \
		CHECK_CONTAINS(e.msg, word);                \
	} while (0)
	q.n_prompt = 0;
	EXPECT(-EINVAL, "prompt");
	q.n_prompt = 256;
	EXPECT(-E2BIG, "prompt too long");
	q.n_prompt = 255;
	p[17] = FAKE_VOCAB;
	EXPECT(-ERANGE, "prompt[17]");
	p[17] = -3;
	EXPECT(-ERANGE, "prompt[17]");
	p[17] = 5;
	q.sampling.temperature = NAN;
	EXPECT(-EINVAL, "temperature");
	q.sampling.temperature = 1;
	q.sampling.top_p = 0;
	EXPECT(-EINVAL, "top_p");
	q.sampling.top_p = 1;
	q.max_tokens = -1;
	EXPECT(-EINVAL, "max_tokens");
	q.max_tokens = 0;
	int32_t bad_id = 5000;
	q.stop_ids = &bad_id;
	q.n_stop_ids = 1;
	EXPECT(-ERANGE, "stop_token_ids[0]");
	q.n_stop_ids = 0;
	struct sched_str st = {"x", 1};
	q.stop = &st;
	q.n_stop = 1;
	EXPECT(-EINVAL, "tokenizer");
	q.n_stop = 0;
	struct sched_stats ss;
	sched_stats(r->s, &ss);
	CHECK_EQ_INT(ss.waiting, 0);
	REQUIRE(sched_add(r->s, &q, &e) == 0);
	EXPECT(-EEXIST, "already live");
	q.id = 2;
	REQUIRE(sched_add(r->s, &q, &e) == 0);
	q.id = 3;
	EXPECT(-EAGAIN, "queue full");
#undef EXPECT
	drain(r);
	CHECK_EQ_INT(r->out[1].done + r->out[2].done, 2);
	/* A request that needs the whole pool runs alone and ends at the context limit. */
	q.id = 4;
	q.n_prompt = 250;
	REQUIRE(sched_add(r->s, &q, &e) == 0);
	drain(r);
	CHECK_EQ_INT(r->out[4].reason, SCHED_FINISH_CONTEXT_LIMIT);
	CHECK_EQ_INT(r->out[4].n, 6);
	run_free(r);
	free(r);
}

TEST(sched, seeded_sampling_is_batch_and_preemption_invariant)
{
	int32_t p[40][50];
	struct sched_request q = {0};
	sampler_params_default(&q.sampling);
	q.sampling.temperature = 0.8;
	q.sampling.top_p = 0.9;
	q.sampling.top_k = 50;
	q.sampling.seed = 777;
	q.seeded = 1;
	q.max_tokens = 100;
	q.n_prompt = 50;
	struct err e;
	prompt_of(p[0], 50, 1);
	/* alone */
	struct run *a = malloc(sizeof *a);
	run_init(a, 64, cfg_of(1, 1, 0));
	q.prompt = p[0];
	REQUIRE(sched_add(a->s, &q, &e) == 0);
	drain(a);
	/* in a busy batch with a tight pool (preemptions), other seeded and unseeded requests */
	struct run *b = malloc(sizeof *b);
	run_init(b, 12, cfg_of(96, 16, 1));
	for (int i = 1; i < 40; i++) {
		prompt_of(p[i], 50, (uint64_t)i + 1000);
		struct sched_request o = q;
		o.id = (uint64_t)i;
		o.prompt = p[i];
		o.seeded = i % 2;
		o.sampling.seed = (uint64_t)i;
		REQUIRE(sched_add(b->s, &o, &e) == 0);
		if (i == 20) {
			step_once(b);
			step_once(b);
			REQUIRE(sched_add(b->s, &q, &e) == 0); /* id 0 arrives mid-load */
		}
	}
	drain(b);
	struct sched_stats st;
	sched_stats(b->s, &st);
	CHECK(st.preemptions > 0);
	CHECK_EQ_INT(a->out[0].n, 100);
	same_tokens(&b->out[0], &a->out[0], 0);
	run_free(a);
	run_free(b);
	free(a);
	free(b);
}

TEST(sched, engine_fault_and_nan_rows)
{
	struct run *r = malloc(sizeof *r);
	run_init(r, 32, cfg_of(64, 4, 0));
	int32_t p[3][20];
	for (int i = 0; i < 3; i++) {
		prompt_of(p[i], 20, (uint64_t)i);
		add(r, i, 0, p[i], 20, 10);
	}
	r->f->nan_at = 19; /* every prompt's last row: all three end with -EDOM */
	step_once(r);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ_INT(r->out[i].last, SCHED_EVENT_ERROR);
		CHECK_EQ_INT(r->out[i].error, -EDOM);
	}
	r->f->nan_at = -1;
	add(r, 3, 0, p[0], 20, 10);
	add(r, 4, 0, p[1], 20, 10);
	step_once(r);
	r->f->fail_next = 1;
	const struct sched_event *ev;
	int64_t n;
	CHECK_EQ_INT(sched_step(r->s, &ev, &n), -EIO);
	sched_fail_all(r->s, -EIO, "engine fault");
	REQUIRE(sched_has_work(r->s));
	step_once(r);
	CHECK(!sched_has_work(r->s));
	CHECK_EQ_INT(r->out[3].last, SCHED_EVENT_ERROR);
	CHECK_EQ_INT(r->out[4].error, -EIO);
	struct sched_stats st;
	sched_stats(r->s, &st);
	CHECK_EQ_INT(st.pages_used, 0);
	run_free(r);
	free(r);
}

TEST_T(sched, random_workload_matches_solo_runs, 120)
{
	enum { N = 120 };
	static int32_t p[N][400];
	int64_t len[N], maxt[N];
	uint64_t rng = 4242;
	struct run *r = malloc(sizeof *r);
	run_init(r, 24, cfg_of(100, 12, 1));
	int cancelled[N] = {0};
	int next = 0;
	/* shared system prompts so prefix hits happen, two identities */
	int32_t sys[2][256];
	prompt_of(sys[0], 256, 1);
	prompt_of(sys[1], 256, 2);
	for (int64_t t = 0; next < N || sched_has_work(r->s); t++) {
		REQUIRE(t < 200000);
		int k = (int)(test_rand(&rng) % 4);
		for (int j = 0; j < k && next < N; j++, next++) {
			len[next] = 1 + (int64_t)(test_rand(&rng) % 400);
			maxt[next] = 1 + (int64_t)(test_rand(&rng) % 120);
			prompt_of(p[next], len[next], 5000 + (uint64_t)next);
			int64_t shared = (int64_t)(test_rand(&rng) % 257);
			shared = shared < len[next] ? shared : len[next];
			memcpy(p[next], sys[next % 2], (size_t)shared * sizeof(int32_t));
			add(r, (uint64_t)next, (uint32_t)(next % 3), p[next], len[next], maxt[next]);
		}
		if (next > 0 && test_rand(&rng) % 20 == 0) {
			int victim = (int)(test_rand(&rng) % (uint64_t)next);
			if (sched_cancel(r->s, (uint64_t)victim) == 0)
				cancelled[victim] = 1;
		}
		step_once(r);
	}
	struct sched_stats st;
	sched_stats(r->s, &st);
	CHECK(st.preemptions > 0);
	CHECK(st.prefix_hit_pages > 0);
	CHECK_EQ_INT(st.pages_used, 0);
	for (int i = 0; i < N; i++) {
		CHECK_EQ_INT(r->out[i].done, 1);
		if (cancelled[i]) {
			CHECK_EQ_INT(r->out[i].reason, SCHED_FINISH_CANCELLED);
			continue;
		}
		struct outcome ref;
		solo(p[i], len[i], maxt[i], &ref);
		same_tokens(&r->out[i], &ref, (uint64_t)i);
	}
	run_free(r);
	free(r);
}

/* ---- stop strings (the generated mini model's byte-level tokenizer) ------------------------ */

static struct tokenizer *mini_tokenizer(void)
{
	/* The tiny preset with a 1024-token vocabulary and mkmodel's generated byte-level BPE
	 * (ids 3..258 are the 256 bytes): only its tokenizer.json is used. */
	char src[512], cfg[512], dir[512], cmd[4096];
	snprintf(src, sizeof src, "%s/tests/data/tiny_config.json", test_root());
	snprintf(cfg, sizeof cfg, "%s/mini.json", test_tmpdir());
	snprintf(dir, sizeof dir, "%s/mini", test_tmpdir());
	snprintf(cmd, sizeof cmd,
		 "sed 's/\"vocab_size\": 129280/\"vocab_size\": 1024/' %s > %s && "
		 "%s/mkmodel --config %s --seed 1 --tokenizer fallback --out %s >%s.log 2>&1",
		 src, cfg, test_bin_dir(), cfg, dir, dir);
	REQUIRE(system(cmd) == 0);
	struct tokenizer *t = NULL;
	struct err e;
	if (tokenizer_load(&t, dir, &e) < 0)
		test_fail(__FILE__, __LINE__, "tokenizer_load: %s", e.msg);
	REQUIRE(t);
	return t;
}

/* byte -> the id of its single-byte token */
static void byte_ids(const struct tokenizer *t, int32_t *id)
{
	for (int i = 0; i < 256; i++)
		id[i] = -1;
	for (int32_t i = 0; i < (int32_t)tokenizer_n_ids(t); i++) {
		const char *p;
		size_t n;
		if (tokenizer_token_bytes(t, i, &p, &n) == 0 && n == 1 && id[(uint8_t)p[0]] < 0)
			id[(uint8_t)p[0]] = i;
	}
}

/* Runs one request whose output is scripted to be the bytes of `text` (one byte token each),
 * with the given stop strings; returns the outcome. */
static void scripted(const struct tokenizer *tok, const char *text, const char *const *stops,
		     int n_stops, int64_t max_tokens, struct outcome *o)
{
	int32_t id[256];
	byte_ids(tok, id);
	static int32_t script[512];
	int32_t prompt[10] = {40, 41, 42, 43, 44, 45, 46, 47, 48, 49};
	size_t n = strlen(text);
	for (int i = 0; i < 512; i++)
		script[i] = -1;
	for (size_t i = 0; i < n; i++) {
		REQUIRE(id[(uint8_t)text[i]] >= 0);
		script[9 + i] = id[(uint8_t)text[i]];
	}
	struct run *r = malloc(sizeof *r);
	struct sched_config c = cfg_of(64, 4, 0);
	c.tok = tok;
	run_init(r, 16, c);
	r->f->script = script;
	r->f->n_script = 512;
	struct sched_str st[8];
	for (int i = 0; i < n_stops; i++)
		st[i] = (struct sched_str){stops[i], strlen(stops[i])};
	struct sched_request q = {0};
	q.id = 0;
	q.prompt = prompt;
	q.n_prompt = 10;
	sampler_params_default(&q.sampling);
	q.max_tokens = max_tokens;
	q.stop = st;
	q.n_stop = n_stops;
	struct err e;
	REQUIRE(sched_add(r->s, &q, &e) == 0);
	/* Streamed text never shrinks and is always a prefix of the final text: checked by
	 * accumulating and comparing at the end (events are append-only by construction). */
	drain(r);
	*o = r->out[0];
	o->text[o->text_len] = 0;
	run_free(r);
	free(r);
}

TEST_T(sched, stop_strings_split_across_tokens, 60)
{
	struct tokenizer *t = mini_tokenizer();
	struct outcome o;
	const char *stops1[] = {"STOP"};
	scripted(t, "Hello, STxSTOP here", stops1, 1, 0, &o);
	CHECK_EQ_INT(o.reason, SCHED_FINISH_STOP);
	CHECK_EQ_STR(o.text, "Hello, STx");
	CHECK_EQ_INT(o.n, 14); /* the tokens through the 'P' that completed "STOP" */
	/* two stop strings, the earlier match wins; one a prefix of text that never completes */
	const char *stops2[] = {"world", "lo, w"};
	scripted(t, "Hello, world", stops2, 2, 0, &o);
	CHECK_EQ_STR(o.text, "Hel");
	/* a partial stop string at max_tokens is released with the FINISH event */
	scripted(t, "abc STO", stops1, 1, 7, &o);
	CHECK_EQ_INT(o.reason, SCHED_FINISH_LENGTH);
	CHECK_EQ_STR(o.text, "abc STO");
	/* a multi-byte character split across byte tokens, then a stop string made of it */
	const char *stops3[] = {"\xc3\xa9!"};
	scripted(t, "caf\xc3\xa9 ok caf\xc3\xa9!", stops3, 1, 0, &o);
	CHECK_EQ_STR(o.text, "caf\xc3\xa9 ok caf");
	tokenizer_free(t);
}

TEST(sched, newest_is_preempted_oldest_never_waits)
{
	/* 4 pages; three requests of 60 prompt tokens each take one page, then each needs a
	 * second one at position 64: A gets the free page, B takes C's (the newest), C waits. */
	struct run *r = malloc(sizeof *r);
	run_init(r, 4, cfg_of(256, 4, 0));
	int32_t p[3][60];
	for (int i = 0; i < 3; i++) {
		prompt_of(p[i], 60, 50 + (uint64_t)i);
		add(r, i, 0, p[i], 60, 60);
	}
	int64_t last[3] = {-1, -1, -1}, gaps[3] = {0, 0, 0};
	while (sched_has_work(r->s)) {
		int64_t before[3];
		for (int i = 0; i < 3; i++)
			before[i] = r->out[i].n;
		step_once(r);
		for (int i = 0; i < 3; i++)
			if (r->out[i].n > before[i]) {
				gaps[i] += last[i] >= 0 && r->steps - last[i] > 1;
				last[i] = r->steps;
			}
	}
	struct sched_stats st;
	sched_stats(r->s, &st);
	CHECK(st.preemptions >= 1);
	CHECK_EQ_INT(gaps[0], 0);
	CHECK_EQ_INT(gaps[1], 0);
	CHECK(gaps[2] >= 1);
	for (int i = 0; i < 3; i++) {
		struct outcome ref;
		solo(p[i], 60, 60, &ref);
		same_tokens(&r->out[i], &ref, (uint64_t)i);
	}
	run_free(r);
	free(r);
}

TEST(sched, logprobs_ride_on_token_events)
{
	struct fake *f = fake_new(16);
	struct sched_config c = cfg_of(64, 4, 0);
	struct sched *s;
	struct err e = {{0}};
	REQUIRE(sched_init(&s, &f->base, &c, &e) == 0);
	int32_t p[20];
	prompt_of(p, 20, 3);
	struct sched_request q = {0};
	q.prompt = p;
	q.n_prompt = 20;
	sampler_params_default(&q.sampling);
	q.sampling.logprobs = 1;
	q.sampling.top_logprobs = 3;
	q.max_tokens = 4;
	REQUIRE(sched_add(s, &q, &e) == 0);
	int64_t tokens = 0;
	while (sched_has_work(s)) {
		const struct sched_event *ev;
		int64_t n;
		REQUIRE(sched_step(s, &ev, &n) == 0);
		for (int64_t i = 0; i < n; i++) {
			if (ev[i].type != SCHED_EVENT_TOKEN)
				continue;
			tokens++;
			CHECK_EQ_INT(ev[i].n_top, 3);
			CHECK_EQ_INT(ev[i].top_ids[0], ev[i].token); /* greedy: the top alternative */
			CHECK(ev[i].logprob == ev[i].top_logprobs[0]);
			CHECK(ev[i].logprob < 0 && ev[i].top_logprobs[1] <= ev[i].top_logprobs[0]);
		}
	}
	CHECK_EQ_INT(tokens, 4);
	/* a budget below max_seqs is refused */
	struct sched *bad;
	c.max_batch_tokens = 3;
	CHECK_EQ_INT(sched_init(&bad, &f->base, &c, &e), -EINVAL);
	CHECK_CONTAINS(e.msg, "max_batch_tokens");
	sched_free(s);
	backend_destroy(&f->base);
}

/* ---- the stop-string matcher alone --------------------------------------------------------- */

TEST(sched, stopstr_any_chunking_gives_the_one_shot_result)
{
	uint64_t rng = 77;
	for (int round = 0; round < 3000; round++) {
		char text[64], stops[4][6];
		const char *sp[4];
		size_t sl[4];
		int n_stop = 1 + (int)(test_rand(&rng) % 4);
		size_t n = (size_t)(test_rand(&rng) % 40);
		for (size_t i = 0; i < n; i++)
			text[i] = "abc"[test_rand(&rng) % 3];
		for (int k = 0; k < n_stop; k++) {
			sl[k] = 1 + (size_t)(test_rand(&rng) % 5);
			for (size_t i = 0; i < sl[k]; i++)
				stops[k][i] = "abc"[test_rand(&rng) % 3];
			sp[k] = stops[k];
		}
		/* one shot: the occurrence ending first, ties to the longest */
		size_t best = SIZE_MAX, best_end = SIZE_MAX;
		for (int k = 0; k < n_stop; k++)
			for (size_t at = 0; at + sl[k] <= n; at++)
				if (!memcmp(text + at, sp[k], sl[k])) {
					size_t end = at + sl[k];
					if (end < best_end || (end == best_end && at < best))
						best = at, best_end = end;
					break;
				}
		struct stopstr m;
		REQUIRE(stopstr_init(&m, sp, sl, n_stop) == 0);
		struct sbuf out = {0};
		int hit = 0;
		size_t i = 0;
		while (i < n && !hit) {
			size_t c = 1 + (size_t)(test_rand(&rng) % 6);
			c = c < n - i ? c : n - i;
			size_t before = out.len;
			hit = stopstr_feed(&m, text + i, c, 0, &out);
			/* what is released is never taken back: it stays a prefix of the answer */
			CHECK(out.len >= before);
			i += c;
		}
		if (!hit)
			hit = stopstr_feed(&m, NULL, 0, 1, &out);
		CHECK_EQ_INT(hit, best != SIZE_MAX);
		size_t want = best != SIZE_MAX ? best : n;
		if (out.len != want || (want && memcmp(out.p, text, want))) {
			test_fail(__FILE__, __LINE__, "round %d: released %zu bytes, want %zu", round,
				  out.len, want);
			break;
		}
		sbuf_free(&out);
		stopstr_free(&m);
	}
}

TEST(sched, cancel_while_walking_events_keeps_them)
{
	/* The daemon may cancel (a client went away) in the middle of forwarding a step's events:
	 * the array it walks must not change under it. */
	struct run *r = malloc(sizeof *r);
	run_init(r, 64, cfg_of(256, 8, 0));
	int32_t p[6][30];
	for (int i = 0; i < 6; i++) {
		prompt_of(p[i], 30, 600 + (uint64_t)i);
		add(r, i, 0, p[i], 30, 20);
	}
	step_once(r);
	const struct sched_event *ev;
	int64_t n;
	REQUIRE(sched_step(r->s, &ev, &n) == 0);
	REQUIRE(n == 6);
	struct sched_event copy[6];
	memcpy(copy, ev, sizeof copy);
	for (int64_t i = 0; i < n; i++) {
		CHECK_EQ_INT(sched_cancel(r->s, ev[i].id), 0);
		for (int64_t j = i; j < n; j++)
			CHECK(!memcmp(&ev[j], &copy[j], sizeof copy[j]));
	}
	REQUIRE(sched_step(r->s, &ev, &n) == 0);
	CHECK_EQ_INT(n, 6);
	for (int64_t i = 0; i < n; i++)
		CHECK_EQ_INT(ev[i].reason, SCHED_FINISH_CANCELLED);
	CHECK(!sched_has_work(r->s));
	run_free(r);
	free(r);
}
