/*
 * sampler.h — choosing the next token from a row of fp32 logits, and its log-probabilities.
 *
 * Owns: the sampling parameters, their validation, the exact sampling function (below) and the
 * counter-based random numbers it uses. Must not: know about sequences, pages or backends (the
 * scheduler passes the token history), or keep state between calls other than scratch memory.
 *
 * The function, for one row of logits l[0..V) (V = vocab_size), in this order:
 *  1. Penalties, on a copy of the logits (the history = prompt ids + output ids so far):
 *       repetition_penalty r (1 = off): every id that occurs in the prompt or the output gets
 *         l = l / r if l > 0, else l = l * r (the CTRL / HF / vLLM rule);
 *       frequency_penalty f, presence_penalty p (0 = off): every id that occurs c > 0 times in
 *         the output gets l = l - c * f - p (OpenAI's rule; the prompt does not count).
 *  2. temperature == 0: greedy — the id with the largest penalised logit, ties to the lowest id.
 *     Steps 3-6 and the random number are skipped.
 *  3. Order: ids sorted by penalised logit, descending, ties by id ascending (a strict total
 *     order, so every prefix below is unique). Probabilities are unnormalised, in double:
 *       q_i = exp(((double)l_i - (double)l_max) / temperature), so the first id has q = 1.
 *  4. top_k (0 = off): keep the first top_k ids of the order (top_k >= V is off).
 *  5. top_p (1 = off): of the ids kept, keep the shortest prefix of the order whose sum reaches
 *     top_p * Z, where Z is the sum of q over the ids kept by step 4, in id order, and the
 *     prefix sum runs in the sorted order; at least one id.
 *  6. min_p (0 = off): of the ids kept, drop those with q_i < min_p (q_max = 1, so this is the
 *     usual p_i < min_p * p_max; it keeps a prefix too).
 *  7. Draw: u = sampler_uniform(seed, index), index = how many tokens this request has output
 *     before this one (0 for the first). With S the sum of q over the kept ids in id order, the
 *     chosen id is the first kept id, in increasing id order, whose running sum (same order)
 *     exceeds u * S (the last kept id with q > 0 if rounding leaves none) — inverse CDF of the
 *     renormalised distribution. (The order of step 3 only decides which ids are kept, so a
 *     sampler needs no sort for top-k or plain temperature, only for the top-p / min-p cut.)
 * Ids whose logit is -inf have q = 0 and are never chosen unless every id is -inf (an error).
 * A NaN logit from the model is an error (-EDOM): the caller treats it as an engine fault.
 *
 * Reproducibility: the result depends only on the logits, the history, the parameters, the
 * seed and the index — never on batch composition, preemption or which step computed the row.
 * The GPU sampler implements this same function (same order, same sums in double, same
 * sampler_uniform); its exp() may differ from glibc's by an ulp, which can change a draw only
 * when u * S falls within ~1e-16 relative of a boundary.
 *
 * Log-probabilities are of the model's distribution, before penalties, temperature and
 * filters (vLLM's "raw" logprobs): logprob_i = l_i - logsumexp(l) (double math, id order),
 * for the chosen id and for the top_logprobs ids with the largest raw logits (ties: lower id
 * first).
 */
#ifndef DSV32_SAMPLER_H
#define DSV32_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "model/err.h"

#define SAMPLER_MAX_LOGPROBS 20

struct sampler_params {
	double temperature;        /* >= 0, <= 100; 0 = greedy */
	int64_t top_k;             /* >= 0; 0 = off */
	double top_p;              /* (0, 1]; 1 = off */
	double min_p;              /* [0, 1]; 0 = off */
	double repetition_penalty; /* (0, 100]; 1 = off */
	double presence_penalty;   /* [-2, 2]; 0 = off */
	double frequency_penalty;  /* [-2, 2]; 0 = off */
	uint64_t seed;             /* the stream's key (the scheduler fills it for unseeded requests) */
	int logprobs;              /* 0 or 1: report the chosen token's logprob */
	int top_logprobs;          /* 0..SAMPLER_MAX_LOGPROBS alternatives (needs logprobs = 1) */
};

/* Greedy, no penalties, no logprobs: the neutral values of every field. */
void sampler_params_default(struct sampler_params *p);
/* 1 when a penalty is on (step 1 of the header reads the token history), else 0. */
static inline int sampler_params_penalised(const struct sampler_params *p)
{
	return p->repetition_penalty != 1.0 || p->presence_penalty != 0.0 ||
	       p->frequency_penalty != 0.0;
}
/* 0, or -EINVAL with e naming the parameter, its value and the allowed range (NaN included). */
int sampler_params_check(const struct sampler_params *p, struct err *e);

/* The counter-based random stream shared with the GPU sampler. With
 *   mix(z) = splitmix64's finaliser: z ^= z >> 30; z *= 0xbf58476d1ce4e5b9;
 *            z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31   (uint64 wrap-around)
 *   sampler_bits(seed, i) = mix(mix(seed) + (i + 1) * 0x9e3779b97f4a7c15)
 * i.e. output i of splitmix64 started from the state mix(seed), and
 *   sampler_uniform(seed, i) = (sampler_bits(seed, i) >> 11) * 2^-53, in [0, 1). */
uint64_t sampler_bits(uint64_t seed, uint64_t index);
double sampler_uniform(uint64_t seed, uint64_t index);

/* One draw's result. */
struct sampler_out {
	int32_t token;
	float logprob;                              /* logprobs = 1 */
	int n_top;                                  /* = top_logprobs */
	int32_t top_ids[SAMPLER_MAX_LOGPROBS];
	float top_logprobs[SAMPLER_MAX_LOGPROBS];
};

/* Scratch for vocab-sized work; one per thread. */
struct sampler {
	int64_t vocab;
	float *logits;   /* [vocab] penalised copy */
	uint64_t *keys;  /* [vocab] candidates as sort keys (logit order, id) */
	double *q;       /* [vocab] unnormalised probabilities of the kept ids */
	int32_t *ids;    /* [vocab] kept ids in id order */
	int32_t *tmp;    /* [vocab] sort scratch */
	uint32_t *count; /* [vocab] output-token counts, all zero between calls */
	uint8_t *seen;   /* [vocab] prompt/output presence, all zero between calls */
};

int sampler_init(struct sampler *s, int64_t vocab);
void sampler_free(struct sampler *s);

/* Samples one token. logits: [vocab]; prompt [n_prompt] and output [n_output] ids (each in
 * [0, vocab)); index: the stream position, n_output for a request (tests pass others). 0,
 * -EDOM (a NaN or +inf logit, or every logit -inf), or -EINVAL (a history id out of range).
 * The parameters must have passed sampler_params_check. With a penalty on, leaves the
 * penalised logits in s->logits. */
int sampler_sample(struct sampler *s, const struct sampler_params *p, const float *logits,
		   const int32_t *prompt, int64_t n_prompt, const int32_t *output, int64_t n_output,
		   uint64_t index, struct sampler_out *out);

#endif
