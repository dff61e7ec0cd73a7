/*
 * test_sampler.c — the sampler: parameter validation, the random stream's test vectors, greedy
 * ties, penalties, logprobs, and chi-square goodness of fit of every filter against an
 * independent reference of the distribution sampler.h defines.
 *
 * Chi-square: each setting draws N tokens with fixed seeds (deterministic) and compares the
 * counts with N * p_i; the statistic must stay below the critical value at significance
 * alpha = 1e-4 (Wilson-Hilferty approximation of the chi-square quantile). Categories with
 * N * p_i < 5 are pooled into one. Ids the filters drop must never be drawn.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"
#include "tests/test.h"

/* ---- validation --------------------------------------------------------------------------- */

static void expect_bad(const struct sampler_params *p, const char *name)
{
	struct err e = {{0}};
	CHECK_EQ_INT(sampler_params_check(p, &e), -EINVAL);
	CHECK_CONTAINS(e.msg, name);
}

TEST(sampler, params_validation)
{
	struct sampler_params d, p;
	sampler_params_default(&d);
	struct err e = {{0}};
	CHECK_EQ_INT(sampler_params_check(&d, &e), 0);
	double nan = NAN;
#define BAD(field, v, name) \
	do { p = d; p.field = v; expect_bad(&p, name); } while (0)
	BAD(temperature, nan, "temperature");
	BAD(temperature, -0.5, "temperature");
	BAD(temperature, INFINITY, "temperature");
	BAD(temperature, 101, "temperature");
	BAD(top_k, -1, "top_k");
	BAD(top_p, nan, "top_p");
	BAD(top_p, 0.0, "top_p");
	BAD(top_p, 1.5, "top_p");
	BAD(top_p, -0.1, "top_p");
	BAD(min_p, nan, "min_p");
	BAD(min_p, -0.1, "min_p");
	BAD(min_p, 1.01, "min_p");
	BAD(repetition_penalty, nan, "repetition_penalty");
	BAD(repetition_penalty, 0.0, "repetition_penalty");
	BAD(repetition_penalty, -1.0, "repetition_penalty");
	BAD(presence_penalty, nan, "presence_penalty");
	BAD(presence_penalty, 2.5, "presence_penalty");
	BAD(frequency_penalty, nan, "frequency_penalty");
	BAD(frequency_penalty, -3.0, "frequency_penalty");
	BAD(logprobs, 2, "logprobs");
	BAD(top_logprobs, -1, "top_logprobs");
	BAD(top_logprobs, SAMPLER_MAX_LOGPROBS + 1, "top_logprobs");
	BAD(top_logprobs, 3, "top_logprobs"); /* without logprobs = 1 */
#undef BAD
	p = d;
	p.temperature = 0.7;
	p.top_k = 1000000;
	p.top_p = 1.0;
	p.min_p = 1.0;
	p.repetition_penalty = 100;
	p.presence_penalty = -2;
	p.frequency_penalty = 2;
	p.logprobs = 1;
	p.top_logprobs = SAMPLER_MAX_LOGPROBS;
	CHECK_EQ_INT(sampler_params_check(&p, &e), 0);
}

/* ---- the stream ---------------------------------------------------------------------------- */

TEST(sampler, stream_vectors)
{
	/* Computed independently (Python, arbitrary-precision ints masked to 64 bits). The first
	 * is splitmix64's well-known first output from state 0. */
	CHECK(sampler_bits(0, 0) == 0xe220a8397b1dcdafull);
	CHECK(sampler_bits(0, 1) == 0x6e789e6aa1b965f4ull);
	CHECK(sampler_bits(1, 0) == 0xbfef8030ddc2d772ull);
	CHECK(sampler_bits(12345, 678) == 0xbb6c3ccec7076343ull);
	CHECK(sampler_bits(UINT64_MAX, UINT64_MAX - 1) == 0x37bbcbaf20495954ull);
	CHECK(sampler_uniform(0, 0) == 0.8833108082136426);
	CHECK(sampler_uniform(12345, 678) == 0.7321203236415648);
	double mean = 0;
	for (uint64_t i = 0; i < 100000; i++) {
		double u = sampler_uniform(7, i);
		REQUIRE(u >= 0.0 && u < 1.0);
		mean += u;
	}
	mean /= 100000;
	CHECK(fabs(mean - 0.5) < 0.005); /* sd of the mean = 0.00091 */
}

/* ---- greedy, penalties, logprobs, errors ----------------------------------------------------- */

TEST(sampler, greedy_ties_lowest_id)
{
	struct sampler s;
	REQUIRE(sampler_init(&s, 8) == 0);
	struct sampler_params p;
	sampler_params_default(&p);
	float l[8] = {0, 3, 1, 3, -INFINITY, 3, 2, 0};
	struct sampler_out o;
	REQUIRE(sampler_sample(&s, &p, l, NULL, 0, NULL, 0, 0, &o) == 0);
	CHECK_EQ_INT(o.token, 1);
	float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -5, -6};
	REQUIRE(sampler_sample(&s, &p, m, NULL, 0, NULL, 0, 0, &o) == 0);
	CHECK_EQ_INT(o.token, 6);
	/* top_k = 1 with temperature is greedy too */
	p.temperature = 1.0;
	p.top_k = 1;
	for (uint64_t i = 0; i < 50; i++) {
		REQUIRE(sampler_sample(&s, &p, l, NULL, 0, NULL, 0, i, &o) == 0);
		CHECK_EQ_INT(o.token, 1);
	}
	sampler_free(&s);
}

TEST(sampler, bad_logits_and_history)
{
	struct sampler s;
	REQUIRE(sampler_init(&s, 4) == 0);
	struct sampler_params p;
	sampler_params_default(&p);
	struct sampler_out o;
	float a[4] = {0, NAN, 1, 2};
	CHECK_EQ_INT(sampler_sample(&s, &p, a, NULL, 0, NULL, 0, 0, &o), -EDOM);
	float b[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
	CHECK_EQ_INT(sampler_sample(&s, &p, b, NULL, 0, NULL, 0, 0, &o), -EDOM);
	float c[4] = {0, INFINITY, 1, 2};
	CHECK_EQ_INT(sampler_sample(&s, &p, c, NULL, 0, NULL, 0, 0, &o), -EDOM);
	float d[4] = {0, 1, 2, 3};
	int32_t bad[1] = {4}, neg[1] = {-1};
	CHECK_EQ_INT(sampler_sample(&s, &p, d, bad, 1, NULL, 0, 0, &o), -EINVAL);
	CHECK_EQ_INT(sampler_sample(&s, &p, d, NULL, 0, neg, 1, 1, &o), -EINVAL);
	sampler_free(&s);
}

TEST(sampler, penalties_exact)
{
	struct sampler s;
	REQUIRE(sampler_init(&s, 6) == 0);
	struct sampler_params p;
	sampler_params_default(&p);
	p.repetition_penalty = 2.0;
	p.presence_penalty = 0.5;
	p.frequency_penalty = 0.25;
	float l[6] = {4, -4, 4, -4, 1, 1};
	int32_t prompt[3] = {0, 1, 0};
	int32_t out[4] = {2, 3, 2, 0};
	struct sampler_out o;
	REQUIRE(sampler_sample(&s, &p, l, prompt, 3, out, 4, 4, &o) == 0);
	/* id 0: in prompt and output once: 4/2 - 0.25 - 0.5 */
	CHECK(s.logits[0] == 1.25f);
	CHECK(s.logits[1] == -8.0f);           /* prompt only: repetition */
	CHECK(s.logits[2] == 2.0f - 0.5f - 0.5f); /* output twice */
	CHECK(s.logits[3] == -8.0f - 0.25f - 0.5f);
	CHECK(s.logits[4] == 1.0f && s.logits[5] == 1.0f);
	CHECK_EQ_INT(o.token, 0); /* greedy over the penalised row: 1.25 > 1 */
	/* the scratch is clean afterwards: the same call again gives the same row */
	REQUIRE(sampler_sample(&s, &p, l, prompt, 3, out, 4, 4, &o) == 0);
	CHECK(s.logits[0] == 1.25f && s.logits[2] == 1.0f);
	p.repetition_penalty = 1.0;
	p.presence_penalty = 0;
	p.frequency_penalty = 0;
	REQUIRE(sampler_sample(&s, &p, l, prompt, 3, out, 4, 4, &o) == 0);
	CHECK_EQ_INT(o.token, 0); /* raw row: ids 0 and 2 tie at 4, the lower wins */
	sampler_free(&s);
}

TEST(sampler, logprobs)
{
	enum { V = 40 };
	struct sampler s;
	REQUIRE(sampler_init(&s, V) == 0);
	float l[V];
	for (int i = 0; i < V; i++)
		l[i] = (float)((i * 7) % 11) * 0.5f; /* many ties */
	double mx = 5.0, sum = 0;
	for (int i = 0; i < V; i++)
		sum += exp(l[i] - mx);
	double lse = mx + log(sum);
	struct sampler_params p;
	sampler_params_default(&p);
	p.logprobs = 1;
	p.top_logprobs = 5;
	p.repetition_penalty = 3.0; /* logprobs ignore penalties */
	int32_t hist[1] = {3};
	struct sampler_out o;
	REQUIRE(sampler_sample(&s, &p, l, hist, 1, NULL, 0, 0, &o) == 0);
	CHECK(fabs(o.logprob - (l[o.token] - lse)) < 1e-5);
	CHECK_EQ_INT(o.n_top, 5);
	/* value 5.0 at ids with (7i) % 11 == 10: i = 3, 14, 25, 36; then 4.5 at i = 6 */
	int32_t want[5] = {3, 14, 25, 36, 6};
	for (int j = 0; j < 5; j++) {
		CHECK_EQ_INT(o.top_ids[j], want[j]);
		CHECK(fabs(o.top_logprobs[j] - (l[want[j]] - lse)) < 1e-5);
	}
	CHECK_EQ_INT(o.token, 14); /* greedy after penalising id 3 */
	sampler_free(&s);
}

/* ---- distributions ------------------------------------------------------------------------- */

/* The distribution of sampler.h, written the slow obvious way. p: [V] out. */
static void reference(const float *l, int V, const struct sampler_params *sp, double *p)
{
	int *ord = malloc((size_t)V * sizeof *ord);
	for (int i = 0; i < V; i++)
		ord[i] = i;
	for (int i = 1; i < V; i++) /* insertion sort: logit desc, id asc */
		for (int j = i; j > 0; j--) {
			int a = ord[j - 1], b = ord[j];
			if (l[b] > l[a] || (l[b] == l[a] && b < a)) {
				ord[j - 1] = b;
				ord[j] = a;
			} else {
				break;
			}
		}
	double T = sp->temperature, lmax = l[ord[0]];
	int keep = V;
	if (sp->top_k > 0 && sp->top_k < keep)
		keep = (int)sp->top_k;
	double Z = 0; /* over the top-k set, in id order */
	char *in = calloc((size_t)V, 1);
	for (int j = 0; j < keep; j++)
		in[ord[j]] = 1;
	for (int i = 0; i < V; i++)
		if (in[i])
			Z += exp((l[i] - lmax) / T);
	free(in);
	if (sp->top_p < 1.0) {
		double cum = 0;
		int j = 0;
		while (j < keep) {
			cum += exp((l[ord[j]] - lmax) / T);
			j++;
			if (cum >= sp->top_p * Z)
				break;
		}
		keep = j;
	}
	int j = 1;
	while (j < keep && exp((l[ord[j]] - lmax) / T) >= sp->min_p)
		j++;
	keep = j;
	double S = 0;
	for (int i = 0; i < V; i++)
		p[i] = 0;
	for (int k = 0; k < keep; k++)
		S += exp((l[ord[k]] - lmax) / T);
	for (int k = 0; k < keep; k++)
		p[ord[k]] = exp((l[ord[k]] - lmax) / T) / S;
	free(ord);
}

/* Upper alpha = 1e-4 quantile of chi-square(df), Wilson-Hilferty. */
static double chi2_crit(int df)
{
	double z = 3.7190, a = 2.0 / (9.0 * df);
	double t = 1.0 - a + z * sqrt(a);
	return df * t * t * t;
}

/* Draws N tokens (seed varies with draw k when vary_seed, else the index does), checks them
 * against reference(). */
static void fit(const float *l, int V, const struct sampler_params *sp0, int N, int vary_seed)
{
	struct sampler s;
	REQUIRE(sampler_init(&s, V) == 0);
	double *p = malloc((size_t)V * sizeof *p);
	int64_t *cnt = calloc((size_t)V, sizeof *cnt);
	reference(l, V, sp0, p);
	struct sampler_params sp = *sp0;
	for (int k = 0; k < N; k++) {
		struct sampler_out o;
		if (vary_seed)
			sp.seed = 1000003ull * (uint64_t)k + 17;
		REQUIRE(sampler_sample(&s, &sp, l, NULL, 0, NULL, 0,
				       vary_seed ? 0 : (uint64_t)k, &o) == 0);
		REQUIRE(o.token >= 0 && o.token < V);
		cnt[o.token]++;
	}
	double chi = 0, pool_e = 0, pool_o = 0;
	int df = -1, zero_bad = 0;
	for (int i = 0; i < V; i++) {
		double ex = p[i] * N;
		if (p[i] == 0) {
			zero_bad += cnt[i] != 0;
			continue;
		}
		if (ex < 5) {
			pool_e += ex;
			pool_o += (double)cnt[i];
			continue;
		}
		chi += ((double)cnt[i] - ex) * ((double)cnt[i] - ex) / ex;
		df++;
	}
	if (pool_e > 0) {
		chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
		df++;
	}
	CHECK_EQ_INT(zero_bad, 0);
	if (df >= 1) {
		if (!(chi < chi2_crit(df)))
			test_fail(__FILE__, __LINE__, "chi-square %.1f >= %.1f (df %d, T %g k %lld p %g min_p %g)",
				  chi, chi2_crit(df), df, sp0->temperature, (long long)sp0->top_k,
				  sp0->top_p, sp0->min_p);
	}
	free(p);
	free(cnt);
	sampler_free(&s);
}

static const float small_logits[12] = {1.0f, 2.5f, 0.3f, 2.5f, -1.0f, 1.7f,
				       0.0f, 3.1f, -2.0f, 0.9f, 1.2f, -0.4f};

TEST_T(sampler, chi_square_small_vocab, 120)
{
	struct sampler_params base;
	sampler_params_default(&base);
	struct {
		double T;
		int64_t k;
		double top_p, min_p;
	} set[] = {
		{1.0, 0, 1.0, 0.0},  {0.7, 0, 1.0, 0.0},  {2.0, 0, 1.0, 0.0},
		{1.0, 5, 1.0, 0.0},  {1.0, 0, 0.8, 0.0},  {1.0, 0, 1.0, 0.1},
		{0.8, 6, 0.9, 0.05}, {1.3, 3, 0.5, 0.0},  {1.0, 0, 0.95, 0.2},
	};
	for (size_t i = 0; i < sizeof set / sizeof *set; i++) {
		struct sampler_params sp = base;
		sp.temperature = set[i].T;
		sp.top_k = set[i].k;
		sp.top_p = set[i].top_p;
		sp.min_p = set[i].min_p;
		sp.seed = 42 + i;
		fit(small_logits, 12, &sp, 60000, 0); /* one seed, index varies */
		fit(small_logits, 12, &sp, 20000, 1); /* seed varies, index 0 */
	}
}

TEST_T(sampler, chi_square_large_vocab, 120)
{
	/* 1000 ids: top-p needs more than the first 256 candidates (the growing prefix). */
	enum { V = 1000 };
	static float l[V];
	uint64_t r = 99;
	for (int i = 0; i < V; i++)
		l[i] = (float)((double)(test_rand(&r) >> 40) / (double)(1 << 24) * 2.0);
	struct sampler_params sp;
	sampler_params_default(&sp);
	sp.temperature = 1.0;
	sp.top_p = 0.9;
	sp.seed = 5;
	fit(l, V, &sp, 20000, 0);
	sp.top_p = 1.0;
	sp.min_p = 0.5; /* keeps roughly the upper half: also past 256 */
	fit(l, V, &sp, 20000, 0);
	sp.min_p = 0.0;
	sp.top_k = 300;
	sp.top_p = 0.7;
	fit(l, V, &sp, 20000, 0);
}

TEST(sampler, reproducible_by_seed_and_index)
{
	enum { V = 300 };
	static float l[V];
	for (int i = 0; i < V; i++)
		l[i] = (float)((i * 37) % 101) / 25.0f;
	struct sampler a, b;
	REQUIRE(sampler_init(&a, V) == 0 && sampler_init(&b, V) == 0);
	struct sampler_params sp;
	sampler_params_default(&sp);
	sp.temperature = 0.9;
	sp.top_p = 0.95;
	sp.seed = 1234;
	int32_t first[64];
	struct sampler_out o;
	for (int i = 0; i < 64; i++) {
		REQUIRE(sampler_sample(&a, &sp, l, NULL, 0, NULL, 0, (uint64_t)i, &o) == 0);
		first[i] = o.token;
	}
	/* Another sampler, reverse order, other seeds in between: same tokens. */
	for (int i = 63; i >= 0; i--) {
		struct sampler_params other = sp;
		other.seed = 99;
		REQUIRE(sampler_sample(&b, &other, l, NULL, 0, NULL, 0, (uint64_t)i, &o) == 0);
		REQUIRE(sampler_sample(&b, &sp, l, NULL, 0, NULL, 0, (uint64_t)i, &o) == 0);
		CHECK_EQ_INT(o.token, first[i]);
	}
	sampler_free(&a);
	sampler_free(&b);
}

/* The draw itself, the slow obvious way: the kept set from reference(), then step 7. */
static int32_t reference_draw(const float *l, int V, const struct sampler_params *sp,
			      uint64_t index)
{
	double *p = malloc((size_t)V * sizeof *p);
	reference(l, V, sp, p); /* kept ids with q > 0 have p > 0 */
	double lmax = -INFINITY, S = 0, cum = 0;
	for (int i = 0; i < V; i++)
		if (l[i] > lmax)
			lmax = l[i];
	int32_t last = -1;
	for (int i = 0; i < V; i++)
		if (p[i] > 0) {
			S += exp(((double)l[i] - lmax) / sp->temperature);
			last = i;
		}
	double target = sampler_uniform(sp->seed, index) * S;
	int32_t tok = last;
	for (int i = 0; i < V; i++)
		if (p[i] > 0) {
			cum += exp(((double)l[i] - lmax) / sp->temperature);
			if (cum > target) {
				tok = i;
				break;
			}
		}
	free(p);
	return tok;
}

TEST_T(sampler, exact_draws_match_the_definition, 60)
{
	/* Not just the distribution: the very token of each (seed, index), as the GPU sampler
	 * must reproduce it. */
	enum { V = 300 };
	static float l[V];
	uint64_t r = 3;
	for (int i = 0; i < V; i++)
		l[i] = (float)((double)(test_rand(&r) >> 40) / (double)(1 << 24) * 6.0 - 3.0);
	l[17] = l[18]; /* a tie */
	struct sampler s;
	REQUIRE(sampler_init(&s, V) == 0);
	struct {
		double T, top_p, min_p;
		int64_t k;
	} set[] = {{1, 1, 0, 0}, {0.6, 0.9, 0, 0}, {1.5, 1, 0.2, 0}, {1, 0.8, 0.05, 40},
		   {2, 0.99, 0, 0}, {0.3, 1, 0, 7}};
	int64_t mismatches = 0;
	for (size_t k = 0; k < sizeof set / sizeof *set; k++) {
		struct sampler_params sp;
		sampler_params_default(&sp);
		sp.temperature = set[k].T;
		sp.top_p = set[k].top_p;
		sp.min_p = set[k].min_p;
		sp.top_k = set[k].k;
		for (uint64_t i = 0; i < 500; i++) {
			sp.seed = 1000 + i % 7;
			struct sampler_out o;
			REQUIRE(sampler_sample(&s, &sp, l, NULL, 0, NULL, 0, i, &o) == 0);
			mismatches += o.token != reference_draw(l, V, &sp, i);
		}
	}
	/* -inf logits, and a top_k that only they make >= the finite ids (so it is off) */
	for (int i = 0; i < V; i += 5)
		l[i] = -INFINITY;
	struct sampler_params sp;
	sampler_params_default(&sp);
	sp.temperature = 0.8;
	sp.top_p = 0.9;
	sp.top_k = V - 10;
	for (uint64_t i = 0; i < 300; i++) {
		struct sampler_out o;
		REQUIRE(sampler_sample(&s, &sp, l, NULL, 0, NULL, 0, i, &o) == 0);
		mismatches += o.token != reference_draw(l, V, &sp, i);
		CHECK(o.token % 5 != 0);
	}
	CHECK_EQ_INT(mismatches, 0);
	sampler_free(&s);
}
