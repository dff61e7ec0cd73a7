/*
 * structured.c — `mkmodel --structured`: test checkpoints whose discrete choices (MoE routing,
 * indexer top-k) have wide margins, so an independent implementation and ours make the same
 * choices even where FP8 rounding makes the rest of the network chaotic (issue 4, spec §10b).
 *
 * Everything starts as the ordinary random weights of gen.h; this file then overwrites a few
 * elements. The residual channels (hidden indices) it reserves:
 *   D-1          CONST: every token's embedding holds 16 here;
 *   D-2          ANCHOR: 16 for anchor tokens (id % 32 == 5), else 0;
 *   D-3-p, p<8   ROUTE p: 8 if the token's routing pattern (a hash of its id) is p, else 0.
 * No output projection writes these channels (o_proj, every down_proj and eh_proj have zero
 * rows there; eh_proj copies the enorm'ed embedding's channel through a 1.0 on its diagonal),
 * so every layer sees the token's own signal, scaled only by the RMSNorms.
 *
 * Routing (mlp.gate of layer l): the random gate weights are scaled by 1/16; column ROUTE p
 * holds +1.5 for the experts of pattern p's set S(l, p) (num_experts_per_tok - 1 experts spread
 * over topk_group - 1 groups, at least two per group), +3.0 for one "lone" expert in another
 * group (picked only if the group limit is ignored) and -1.5 elsewhere. The last expert carries
 * e_score_correction_bias 2.0 and a low score: it is selected only through the bias, and its
 * weight stays small unless the bias leaks into the weights.
 *
 * Indexer (every layer): q_a_proj row 0 reads only CONST (code 448), so c_q[0] dominates; the
 * indexer's wq_b maps c_q[0] to half-split RoPE pair 13 of the rope part (row 13, code 224;
 * row 45 zero) and to the first nope dim (row 64, code 448) of every head; wk row 13 reads only
 * CONST, row 45 is zero, row 64 reads only ANCHOR; weights_proj reads CONST with +1.0. So the
 * index score of key s for query t is dominated by cos((t - s) * inv_freq[13]) (recency: the
 * most recent keys win, with a clear slope at the window edge) plus a large bonus for anchor
 * keys, which every query selects. Must not: touch tensors of unstructured checkpoints.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/numerics.h"
#include "tools/mkmodel/mkmodel.h"

#define N_PATTERNS 8
#define ROPE_PAIR 13  /* half-split pair carrying the recency pattern */

static int64_t ch_const(const struct dsv32_config *c) { return c->hidden_size - 1; }
static int64_t ch_anchor(const struct dsv32_config *c) { return c->hidden_size - 2; }
static int64_t ch_route(const struct dsv32_config *c, int p) { return c->hidden_size - 3 - p; }
static int is_signal(const struct dsv32_config *c, int64_t ch)
{
	return ch >= c->hidden_size - 2 - N_PATTERNS;
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

int structured_pattern(int64_t tok) { return (int)(mix((uint64_t)tok) % N_PATTERNS); }
int structured_is_anchor(int64_t tok) { return tok % 32 == 5; }

/* The routing of pattern p in layer l: sel[e] = 1 for S(l, p), 2 for the lone expert. */
static void route_set(const struct dsv32_config *c, uint64_t seed, int64_t l, int p, uint8_t *sel)
{
	int64_t E = c->n_routed_experts, G = c->n_group, per = E / G;
	int64_t kg = c->topk_group, K = c->num_experts_per_tok;
	memset(sel, 0, (size_t)E);
	int64_t *groups = malloc((size_t)G * sizeof *groups); /* a permutation of 0..G-2 */
	ASSERT(groups);
	for (int64_t g = 0; g < G - 1; g++)
		groups[g] = g;
	uint64_t h = mix(seed ^ mix((uint64_t)l * 131 + (uint64_t)p));
	for (int64_t g = G - 2; g > 0; g--) {
		h = mix(h);
		int64_t j = (int64_t)(h % (uint64_t)(g + 1)), t = groups[g];
		groups[g] = groups[j];
		groups[j] = t;
	}
	/* K - 1 experts over kg - 1 groups (the biased expert's group G-1 is the kg-th) */
	int64_t left = K - 1;
	for (int64_t i = 0; i < kg - 1; i++) {
		int64_t n = left / (kg - 1 - i), off = (int64_t)(mix(h + (uint64_t)i) % (uint64_t)per);
		for (int64_t k = 0; k < n; k++)
			sel[groups[i] * per + (off + k) % per] = 1;
		left -= n;
	}
	if (kg - 1 < G - 1) /* the lone expert, in a group that is not kept */
		sel[groups[kg - 1] * per + (int64_t)(mix(h + 99) % (uint64_t)per)] = 2;
	free(groups);
}

/* Parses "model.layers.L.REST" (L >= 0) or returns -1 with rest = the whole name. */
static int64_t layer_of(const char *name, const char **rest)
{
	long long l;
	int n = 0;
	if (sscanf(name, "model.layers.%lld.%n", &l, &n) == 1 && n > 0) {
		*rest = name + n;
		return l;
	}
	*rest = name;
	return -1;
}

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

static void set_bf16(void *data, int64_t i, float v)
{
	uint16_t h = f32_to_bf16(v);
	memcpy((uint8_t *)data + 2 * i, &h, 2);
}

int structured_check(const struct dsv32_config *c, struct err *e)
{
	int64_t G = c->n_group, kg = c->topk_group, K = c->num_experts_per_tok;
	if (c->hidden_size < 128 || c->qk_rope_head_dim != 64 || c->index_head_dim < 66)
		return err_set(e, -EINVAL, "--structured needs hidden_size >= 128, qk_rope_head_dim 64 "
				       "and index_head_dim > 65");
	if (c->n_routed_experts && (kg < 2 || G < kg + 1 || K - 1 < 2 * (kg - 1) ||
				    K - 1 > (kg - 1) * (c->n_routed_experts / G)))
		return err_set(e, -EINVAL, "--structured needs 2 <= topk_group < n_group and "
				       "2 (topk_group - 1) <= num_experts_per_tok - 1 <= (topk_group - 1) "
				       "x experts per group");
	return 0;
}

void structured_apply(const struct dsv32_config *c, uint64_t seed, const char *name,
		      const int64_t *shape, void *data)
{
	const char *r;
	int64_t l = layer_of(name, &r);
	int64_t D = c->hidden_size;
	uint8_t *w8 = data;
	uint8_t c448 = f32_to_e4m3(448.0f), c224 = f32_to_e4m3(224.0f);

	if (ends_with(r, "embed_tokens.weight")) { /* [V, D] */
		for (int64_t t = 0; t < shape[0]; t++) {
			set_bf16(data, t * D + ch_const(c), 16.0f);
			set_bf16(data, t * D + ch_anchor(c), structured_is_anchor(t) ? 16.0f : 0.0f);
			for (int p = 0; p < N_PATTERNS; p++)
				set_bf16(data, t * D + ch_route(c, p),
					 p == structured_pattern(t) ? 8.0f : 0.0f);
		}
	} else if (ends_with(r, "o_proj.weight") || ends_with(r, "down_proj.weight")) {
		for (int64_t o = 0; o < shape[0]; o++) /* FP8 [D, in]: no write to signal channels */
			if (is_signal(c, o))
				memset(w8 + o * shape[1], 0, (size_t)shape[1]);
	} else if (!strcmp(r, "eh_proj.weight")) { /* bf16 [D, 2D] */
		for (int64_t o = 0; o < D; o++)
			if (is_signal(c, o)) {
				memset((uint8_t *)data + 2 * o * 2 * D, 0, (size_t)(2 * D) * 2);
				set_bf16(data, o * 2 * D + o, 1.0f); /* copies enorm(embedding) */
			}
	} else if (!strcmp(r, "self_attn.q_a_proj.weight")) { /* FP8 [q_lora_rank, D] */
		memset(w8, 0, (size_t)D);
		w8[ch_const(c)] = c448;
	} else if (!strcmp(r, "self_attn.indexer.wq_b.weight")) { /* FP8 [Hi * Di, q_lora_rank] */
		int64_t in = shape[1], Di = c->index_head_dim;
		for (int64_t h = 0; h < c->index_n_heads; h++) {
			w8[(h * Di + ROPE_PAIR) * in] = c224;
			w8[(h * Di + ROPE_PAIR + 32) * in] = 0;
			w8[(h * Di + 64) * in] = c448;
		}
	} else if (!strcmp(r, "self_attn.indexer.wk.weight")) { /* FP8 [Di, D] */
		memset(w8 + ROPE_PAIR * D, 0, (size_t)D);
		w8[ROPE_PAIR * D + ch_const(c)] = c448;
		memset(w8 + (ROPE_PAIR + 32) * D, 0, (size_t)D);
		memset(w8 + 64 * D, 0, (size_t)D);
		w8[64 * D + ch_anchor(c)] = c448;
	} else if (!strcmp(r, "self_attn.indexer.weights_proj.weight")) { /* bf16 [Hi, D] */
		for (int64_t h = 0; h < shape[0]; h++)
			set_bf16(data, h * D + ch_const(c), 1.0f);
	} else if (!strcmp(r, "mlp.gate.weight") && l >= 0) { /* bf16 [E, D] */
		int64_t E = shape[0];
		uint16_t *g = data;
		for (int64_t i = 0; i < E * D; i++) /* background / 16: exact (power of two) */
			set_bf16(data, i, bf16_to_f32(g[i]) * 0.0625f);
		uint8_t *sel = malloc((size_t)E);
		ASSERT(sel);
		for (int p = 0; p < N_PATTERNS; p++) {
			route_set(c, seed, l, p, sel);
			for (int64_t ex = 0; ex < E; ex++)
				set_bf16(data, ex * D + ch_route(c, p),
					 sel[ex] == 1 ? 1.5f : sel[ex] == 2 ? 3.0f : -1.5f);
		}
		free(sel);
	} else if (!strcmp(r, "mlp.gate.e_score_correction_bias")) { /* F32 [E] */
		float b = 2.0f;
		memcpy((uint8_t *)data + 4 * (shape[0] - 1), &b, 4);
	}
}
