/*
 * sampler.c — the sampling function of sampler.h: penalties, temperature, top-k, top-p, min-p,
 * the inverse-CDF draw with the counter-based stream, and raw log-probabilities.
 *
 * Owns: the exact order of every sum and comparison (the header is the contract; the GPU
 * sampler reimplements it). Must not: allocate on the sampling path (scratch is sized at init)
 * or keep state between calls (seen/count are cleared before returning).
 *
 * Candidates are sorted as uint64 keys (~orderable(logit) << 32 | id): ascending keys are
 * logits descending, ties by id ascending — the strict total order of the header. It only
 * decides which ids are kept: top-k is one quickselect, top-p / min-p sort just the prefix one
 * pass bounds, and the draw walks the kept ids in id order (radix-sorted ids).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"

void sampler_params_default(struct sampler_params *p)
{
	memset(p, 0, sizeof *p);
	p->temperature = 0.0;
	p->top_p = 1.0;
	p->repetition_penalty = 1.0;
}

static int range_err(struct err *e, const char *name, double v, const char *range)
{
	return err_set(e, -EINVAL, "sampling parameter %s = %g: must be %s", name, v, range);
}

int sampler_params_check(const struct sampler_params *p, struct err *e)
{
	/* Written so that NaN fails every comparison and lands in the error branch. */
	if (!(p->temperature >= 0.0 && p->temperature <= 100.0))
		return range_err(e, "temperature", p->temperature, "in [0, 100] (0 = greedy)");
	if (p->top_k < 0)
		return err_set(e, -EINVAL, "sampling parameter top_k = %lld: must be >= 0 (0 = off)",
			       (long long)p->top_k);
	if (!(p->top_p > 0.0 && p->top_p <= 1.0))
		return range_err(e, "top_p", p->top_p, "in (0, 1] (1 = off)");
	if (!(p->min_p >= 0.0 && p->min_p <= 1.0))
		return range_err(e, "min_p", p->min_p, "in [0, 1] (0 = off)");
	if (!(p->repetition_penalty > 0.0 && p->repetition_penalty <= 100.0))
		return range_err(e, "repetition_penalty", p->repetition_penalty,
				 "in (0, 100] (1 = off)");
	if (!(p->presence_penalty >= -2.0 && p->presence_penalty <= 2.0))
		return range_err(e, "presence_penalty", p->presence_penalty, "in [-2, 2] (0 = off)");
	if (!(p->frequency_penalty >= -2.0 && p->frequency_penalty <= 2.0))
		return range_err(e, "frequency_penalty", p->frequency_penalty,
				 "in [-2, 2] (0 = off)");
	if (p->logprobs != 0 && p->logprobs != 1)
		return err_set(e, -EINVAL, "sampling parameter logprobs = %d: must be 0 or 1",
			       p->logprobs);
	if (p->top_logprobs < 0 || p->top_logprobs > SAMPLER_MAX_LOGPROBS)
		return err_set(e, -EINVAL, "sampling parameter top_logprobs = %d: must be in [0, %d]",
			       p->top_logprobs, SAMPLER_MAX_LOGPROBS);
	if (p->top_logprobs > 0 && !p->logprobs)
		return err_set(e, -EINVAL,
			       "sampling parameter top_logprobs = %d: needs logprobs = 1",
			       p->top_logprobs);
	return 0;
}

/* ---- the random stream -------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t sampler_bits(uint64_t seed, uint64_t index)
{
	return mix64(mix64(seed) + (index + 1) * 0x9e3779b97f4a7c15ull);
}

double sampler_uniform(uint64_t seed, uint64_t index)
{
	return (double)(sampler_bits(seed, index) >> 11) * 0x1.0p-53;
}

/* ---- scratch ------------------------------------------------------------------------------ */

int sampler_init(struct sampler *s, int64_t vocab)
{
	memset(s, 0, sizeof *s);
	if (vocab <= 0 || vocab > INT32_MAX)
		return -EINVAL;
	s->vocab = vocab;
	s->logits = malloc((size_t)vocab * sizeof *s->logits);
	s->keys = malloc((size_t)vocab * sizeof *s->keys);
	s->q = malloc((size_t)vocab * sizeof *s->q);
	s->ids = malloc((size_t)vocab * sizeof *s->ids);
	s->tmp = malloc((size_t)vocab * sizeof *s->tmp);
	s->count = calloc((size_t)vocab, sizeof *s->count);
	s->seen = calloc((size_t)vocab, sizeof *s->seen);
	if (!s->logits || !s->keys || !s->q || !s->ids || !s->tmp || !s->count || !s->seen) {
		sampler_free(s);
		return -ENOMEM;
	}
	return 0;
}

void sampler_free(struct sampler *s)
{
	free(s->logits);
	free(s->keys);
	free(s->q);
	free(s->ids);
	free(s->tmp);
	free(s->count);
	free(s->seen);
	memset(s, 0, sizeof *s);
}

/* ---- ordering ----------------------------------------------------------------------------- */

/* Key of (logit, id): ascending keys = logit descending, then id ascending. */
static inline uint64_t order_key(float l, int32_t id)
{
	uint32_t u;
	if (l == 0.0f)
		l = 0.0f; /* -0 and +0 are the same logit: tie by id */
	memcpy(&u, &l, 4);
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending with the float */
	return ((uint64_t)~u << 32) | (uint32_t)id;
}

static inline int32_t key_id(uint64_t k) { return (int32_t)(uint32_t)k; }

static inline void swap_u64(uint64_t *a, uint64_t *b)
{
	uint64_t t = *a;
	*a = *b;
	*b = t;
}

/* Median of three to a[lo], then Lomuto-free Hoare partition; returns the pivot's index. */
static int64_t partition(uint64_t *a, int64_t lo, int64_t hi)
{
	int64_t mid = lo + (hi - lo) / 2;
	if (a[mid] < a[lo])
		swap_u64(&a[mid], &a[lo]);
	if (a[hi] < a[lo])
		swap_u64(&a[hi], &a[lo]);
	if (a[hi] < a[mid])
		swap_u64(&a[hi], &a[mid]);
	swap_u64(&a[mid], &a[lo]); /* the median is the pivot, at lo */
	uint64_t pv = a[lo];
	int64_t i = lo, j = hi + 1;
	for (;;) {
		while (a[++i] < pv)
			if (i == hi)
				break;
		while (pv < a[--j])
			;
		if (i >= j)
			break;
		swap_u64(&a[i], &a[j]);
	}
	swap_u64(&a[lo], &a[j]);
	return j;
}

static void sort_u64(uint64_t *a, int64_t lo, int64_t hi)
{
	while (hi - lo > 16) {
		int64_t p = partition(a, lo, hi);
		if (p - lo < hi - p) { /* recurse on the smaller side: O(log n) stack */
			sort_u64(a, lo, p - 1);
			lo = p + 1;
		} else {
			sort_u64(a, p + 1, hi);
			hi = p - 1;
		}
	}
	for (int64_t i = lo + 1; i <= hi; i++) {
		uint64_t v = a[i];
		int64_t j = i;
		for (; j > lo && a[j - 1] > v; j--)
			a[j] = a[j - 1];
		a[j] = v;
	}
}

/* Puts the m smallest keys of a[0..n) first, sorted. Keys are distinct (the id is in them). */
static void partial_sort(uint64_t *a, int64_t n, int64_t m)
{
	int64_t lo = 0, hi = n - 1;
	if (m < n) {
		while (hi > lo) { /* quickselect: a[m-1] ends in its sorted place */
			int64_t p = partition(a, lo, hi);
			if (p == m - 1)
				break;
			if (p < m - 1)
				lo = p + 1;
			else
				hi = p - 1;
		}
	}
	if (m > 1)
		sort_u64(a, 0, m - 1);
}

/* Sorts n ids ascending (a radix sort: ids are < 2^31, and this runs on up to the whole
 * vocabulary). tmp: [n] scratch. */
static void sort_i32_tmp(int32_t *a, int32_t *tmp, int64_t n)
{
	for (int shift = 0; shift < 32; shift += 8) {
		int64_t c[257] = {0};
		for (int64_t i = 0; i < n; i++)
			c[((uint32_t)a[i] >> shift & 0xff) + 1]++;
		if (c[1] == n) /* every id has this byte 0: nothing to move */
			continue;
		for (int k = 0; k < 256; k++)
			c[k + 1] += c[k];
		for (int64_t i = 0; i < n; i++)
			tmp[c[(uint32_t)a[i] >> shift & 0xff]++] = a[i];
		memcpy(a, tmp, (size_t)n * sizeof *a);
	}
}

/* ---- sampling ----------------------------------------------------------------------------- */

static void apply_penalties(struct sampler *s, const struct sampler_params *p,
			    const int32_t *prompt, int64_t n_prompt, const int32_t *output,
			    int64_t n_output)
{
	float *l = s->logits;
	int rep = p->repetition_penalty != 1.0;
	int freq = p->frequency_penalty != 0.0 || p->presence_penalty != 0.0;
	if (!rep && !freq)
		return;
	float r = (float)p->repetition_penalty;
	for (int64_t i = 0; i < n_output; i++)
		s->count[output[i]]++;
	if (rep) {
		for (int64_t i = 0; i < n_prompt; i++)
			s->seen[prompt[i]] = 1;
		for (int64_t i = 0; i < n_output; i++)
			s->seen[output[i]] = 1;
	}
	/* Each id is penalised once: the first time it is met, its marks are cleared. */
	for (int pass = 0; pass < 2; pass++) {
		const int32_t *h = pass ? output : prompt;
		int64_t n = pass ? n_output : n_prompt;
		for (int64_t i = 0; i < n; i++) {
			int32_t id = h[i];
			if (s->seen[id]) {
				l[id] = l[id] > 0.0f ? l[id] / r : l[id] * r;
				s->seen[id] = 0;
			}
			if (pass && s->count[id]) {
				if (freq)
					l[id] = (float)((double)l[id] -
							(double)s->count[id] * p->frequency_penalty -
							p->presence_penalty);
				s->count[id] = 0;
			}
		}
	}
}

static void fill_logprobs(const struct sampler *s, const struct sampler_params *p,
			  const float *logits, struct sampler_out *out)
{
	int64_t V = s->vocab;
	double mx = -INFINITY, sum = 0.0;
	for (int64_t i = 0; i < V; i++)
		if (logits[i] > mx)
			mx = logits[i];
	for (int64_t i = 0; i < V; i++)
		sum += exp((double)logits[i] - mx);
	double lse = mx + log(sum);
	out->logprob = (float)((double)logits[out->token] - lse);
	int n = p->top_logprobs, have = 0;
	uint64_t best[SAMPLER_MAX_LOGPROBS];
	for (int64_t i = 0; i < V && n > 0; i++) {
		uint64_t k = order_key(logits[i], (int32_t)i);
		if (have == n && k >= best[n - 1])
			continue;
		int j = have < n ? have++ : n - 1;
		for (; j > 0 && best[j - 1] > k; j--)
			best[j] = best[j - 1];
		best[j] = k;
	}
	out->n_top = have;
	for (int j = 0; j < have; j++) {
		int32_t id = key_id(best[j]);
		out->top_ids[j] = id;
		out->top_logprobs[j] = (float)((double)logits[id] - lse);
	}
}

/* Quickselect: a[k-1] ends in its sorted place, a[0..k) holds the k smallest keys. */
static void select_k(uint64_t *a, int64_t n, int64_t k)
{
	int64_t lo = 0, hi = n - 1;
	while (hi > lo) {
		int64_t p = partition(a, lo, hi);
		if (p == k - 1)
			break;
		if (p < k - 1)
			lo = p + 1;
		else
			hi = p - 1;
	}
}

/* Inverse CDF over q[0..n) of ids[0..n) (increasing ids): step 7. */
static int32_t walk(const double *q, const int32_t *ids, int64_t n, double u)
{
	double S = 0.0, cum = 0.0;
	int64_t last = 0;
	for (int64_t j = 0; j < n; j++) {
		S += q[j];
		if (q[j] > 0.0)
			last = j;
	}
	double target = u * S;
	for (int64_t j = 0; j < n; j++) {
		cum += q[j];
		if (cum > target)
			return ids[j];
	}
	return ids[last];
}

/* Steps 3-7 of the header on the penalised logits l (lmax: their maximum); returns the id.
 *
 * The order of step 3 only decides which ids are kept. Top-k: one quickselect. Top-p and
 * min-p need the exact cut along the sorted order, but only over a prefix that one pass
 * bounds: the logit bins (they follow the order, so their ids form a prefix) whose mass
 * reaches top_p * Z, with a 1e-9 margin for the different summation order, and for min-p the
 * ids whose exponent is within 1e-9 of log(min_p) (a superset of those kept). Only that
 * prefix is sorted. Plain temperature sorts nothing. */
#define DRAW_BINS 128
#define DRAW_BINS_PER_NAT 4.0
static int32_t draw(struct sampler *s, const struct sampler_params *p, const float *l,
		    double lmax, uint64_t index)
{
	int64_t V = s->vocab, n = 0;
	double T = p->temperature, u = sampler_uniform(p->seed, index);
	int topp = p->top_p < 1.0, minp = p->min_p > 0.0;
	int want_k = p->top_k > 0 && p->top_k < V;
	double *q = s->q;
	int32_t *ids = s->ids;
	if (!want_k && !topp && !minp) { /* every finite id, in id order */
		for (int64_t i = 0; i < V; i++)
			if (l[i] != -INFINITY) {
				q[n] = exp(((double)l[i] - lmax) / T);
				ids[n++] = (int32_t)i;
			}
		return walk(q, ids, n, u);
	}
	for (int64_t i = 0; i < V; i++)
		if (l[i] != -INFINITY)
			s->keys[n++] = order_key(l[i], (int32_t)i);
	int topk = want_k && p->top_k < n; /* top_k >= the finite ids is off */
	int64_t cand = topk ? p->top_k : n;  /* keys[0..cand): the ids step 4 keeps */
	if (topk)
		select_k(s->keys, n, cand);
	int64_t keep = cand;
	if (topp || minp) {
		/* Z over the top-k set in id order, the bins, and the min-p superset */
		double Z = 0.0, mass[DRAW_BINS] = {0};
		int64_t cnt[DRAW_BINS] = {0}, n_minp = 0;
		double xmin = minp ? log(p->min_p) - 1e-9 : 0.0;
		int64_t nv = topk ? cand : V;
		if (topk) {
			for (int64_t j = 0; j < cand; j++)
				ids[j] = key_id(s->keys[j]);
			sort_i32_tmp(ids, s->tmp, cand);
		}
		for (int64_t t = 0; t < nv; t++) {
			int64_t i = topk ? ids[t] : t;
			if (l[i] == -INFINITY)
				continue;
			double x = ((double)l[i] - lmax) / T; /* <= 0 */
			if (minp)
				n_minp += x >= xmin;
			if (topp) {
				double e = exp(x);
				Z += e;
				int b = -x < DRAW_BINS / DRAW_BINS_PER_NAT ? (int)(-x * DRAW_BINS_PER_NAT)
									    : DRAW_BINS - 1;
				mass[b] += e;
				cnt[b]++;
			}
		}
		int64_t m = cand;
		if (topp) {
			double need = p->top_p * Z * (1.0 + 1e-9), cum = 0.0;
			int64_t c = 0;
			for (int b = 0; b < DRAW_BINS; b++) {
				cum += mass[b];
				c += cnt[b];
				if (cum >= need) {
					m = c < m ? c : m;
					break;
				}
			}
		}
		if (minp && n_minp < m)
			m = n_minp; /* >= 1: the first id has x = 0 */
		/* steps 5 and 6 both keep a prefix: the shorter, on the sorted prefix */
		partial_sort(s->keys, cand, m);
		double need = p->top_p * Z, cum = 0.0;
		keep = m;
		for (int64_t j = 0; j < m; j++) {
			double e = exp(((double)l[key_id(s->keys[j])] - lmax) / T);
			if (j > 0 && e < p->min_p) {
				keep = j;
				break;
			}
			cum += e;
			if (topp && cum >= need) {
				keep = j + 1;
				break;
			}
		}
	}
	/* the kept ids keys[0..keep), in id order */
	for (int64_t j = 0; j < keep; j++)
		ids[j] = key_id(s->keys[j]);
	sort_i32_tmp(ids, s->tmp, keep);
	for (int64_t j = 0; j < keep; j++)
		q[j] = exp(((double)l[ids[j]] - lmax) / T);
	return walk(q, ids, keep, u);
}

int sampler_sample(struct sampler *s, const struct sampler_params *p, const float *logits,
		   const int32_t *prompt, int64_t n_prompt, const int32_t *output, int64_t n_output,
		   uint64_t index, struct sampler_out *out)
{
	int64_t V = s->vocab;
	for (int64_t i = 0; i < n_prompt; i++)
		if (prompt[i] < 0 || prompt[i] >= V)
			return -EINVAL;
	for (int64_t i = 0; i < n_output; i++)
		if (output[i] < 0 || output[i] >= V)
			return -EINVAL;
	const float *l = logits; /* penalties work on a copy; without them, on the row itself */
	if (sampler_params_penalised(p)) {
		memcpy(s->logits, logits, (size_t)V * sizeof *logits);
		apply_penalties(s, p, prompt, n_prompt, output, n_output);
		l = s->logits;
	}
	/* One pass: the checks (penalties keep NaN, +inf and -inf as they are) and the argmax,
	 * strict so that ties keep the lowest id. */
	int32_t tok = -1;
	float best = -INFINITY;
	for (int64_t i = 0; i < V; i++) {
		float x = l[i];
		if (x != x || x == INFINITY)
			return -EDOM;
		if (x > best) {
			best = x;
			tok = (int32_t)i;
		}
	}
	if (tok < 0)
		return -EDOM; /* every logit -inf */
	if (p->temperature != 0.0)
		tok = draw(s, p, l, best, index);
	ASSERT(tok >= 0 && tok < V);
	memset(out, 0, sizeof *out);
	out->token = tok;
	if (p->logprobs)
		fill_logprobs(s, p, logits, out);
	return 0;
}
