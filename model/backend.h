/*
 * backend.h — the one interface every forward-pass backend implements (DESIGN.md §1): the CPU
 * reference (model/cpu_backend.c) now, the CUDA backend later. The scheduler drives it.
 *
 * A step is, for each sequence, its new tokens, their absolute positions, its block table and
 * which rows need logits (and/or their final hidden state). The backend owns the KV pools: per
 * layer (main layers 0..L-1 and the MTP layer L) one MLA pool and one indexer pool, both of
 * n_pages pages of KV_PAGE_TOKENS = 64 tokens, in the byte layouts of model/kv_cache.h (spec
 * §6). One page id indexes the page of every layer's pools. The caller owns page allocation:
 * positions [64 b, 64 b + 64) of a sequence live in page block_table[b].
 *
 * Contract of step(): every row's K/V (MLA record and indexer key) is written into its page
 * before any row attends, and attention reads keys only from the cache, for positions
 * 0..pos of the row's own sequence. So a row sees exactly the bytes a later step would, the
 * cache must already hold positions below the step's rows (written by earlier steps or
 * earlier rows of this step), and, on the CPU backend, a row's numbers are bit-identical
 * however the tokens are chunked or batched (batch invariance).
 *
 * A backend runs one step at a time: its callers (the engine thread, a tool) serialise steps.
 *
 * MTP (spec §4): a step with mtp = 1 runs the MTP layer instead of the main model. Row i then
 * carries token x_{i+1} (the token after position pos[i]), position pos[i], and mtp_hidden[i]
 * = h_i, the main model's final normed hidden state at pos[i] (a row flagged
 * BACKEND_ROW_HIDDEN of an earlier main step). It writes the MTP layer's caches at pos[i] and
 * returns the draft logits for x_{i+2}. The MTP layer's caches lag the main ones by one
 * position, because x_{i+1} must be known.
 *
 * Kept rows (drafting): h_i need not leave the backend. A main step keeps the final hidden state
 * of its rows flagged BACKEND_ROW_KEEP (in row order, replacing what the previous main step
 * kept; a main step without such rows, or a failed one, keeps none), and an MTP step whose
 * sequences give no mtp_hidden reads h_i from those rows instead (backend_seq.mtp_kept). MTP
 * steps leave the kept rows as they are. Given and kept h_i give the same bits.
 */
#ifndef DSV32_BACKEND_H
#define DSV32_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/config.h"
#include "model/err.h"
#include "model/safetensors.h"
#include "model/sampler.h"
#include "model/weights.h"

#define BACKEND_ROW_LOGITS 1u /* write this row's fp32 logits [vocab_size] */
#define BACKEND_ROW_HIDDEN 2u /* write this row's final hidden state [hidden_size] */
#define BACKEND_ROW_KEEP 4u   /* main step: keep this row's final hidden state in the backend
			       * (the MTP step's input, see "Kept rows" above) */

/* A token drawn by the backend (backend_step_draw): sampler_sample (model/sampler.h) on the
 * sequence's one LOGITS row. */
struct backend_sample {
	const struct sampler_params *p; /* passed sampler_params_check */
	uint64_t index;                 /* the stream position (sampler_sample's index) */
	const int32_t *prompt, *output; /* the token history, read only with a penalty on: */
	int64_t n_prompt, n_output;     /* n_prompt + n_output ids count against hist_ids */
	struct sampler_out out;         /* out: the draw */
	int rc;                         /* out: 0, -EDOM (a NaN or +inf logit, or every logit
					 * -inf: an engine fault), -EINVAL (a history id out of
					 * range) */
	struct backend_sample *row2;    /* NULL, or the draw from the sequence's next LOGITS row
					 * (an MTP verification: its own index and history; drawn
					 * whatever the row before gives), and so on: a chain of one
					 * draw per LOGITS row */
};

struct backend_seq {
	int64_t n;                  /* new rows of this sequence in the step */
	const int32_t *tokens;      /* [n] ids (MTP step: the next token x_{i+1}) */
	const int64_t *pos;         /* [n] absolute positions, each < 64 * n_blocks */
	const int32_t *block_table; /* [n_blocks] page ids */
	int64_t n_blocks;
	const uint8_t *flags;       /* [n] BACKEND_ROW_* bits, or NULL = logits of the last row */
	float *logits;              /* [rows flagged LOGITS, vocab_size] out, in row order */
	float *hidden;              /* [rows flagged HIDDEN, hidden_size] out (bf16 values): main
				     * step: the final normed state fed to lm_head; MTP step: the
				     * MTP block's output before shared_head.norm */
	const float *mtp_hidden;    /* MTP step only: [n, hidden_size] h_i (bf16 values), or NULL:
				     * row j's h_i is the latest main step's kept row
				     * mtp_kept + j (every sequence of the step gives mtp_hidden,
				     * or none does) */
	int64_t mtp_kept;
};

/* Named intermediates, one call per row, under the names the CPU code uses (ggml-style):
 *   model level (layer -1): embed, result_norm (the MTP step tags result_norm with its layer);
 *   per layer: attn_norm, q_cmpr (c_q), q (per head nope | rope, post-RoPE), kv_cmpr (c_kv before
 *   FP8), k_pe, idx_q, idx_k (after RoPE + Hadamard, before FP8), idx_w (w' with s_q folded in),
 *   idx_scores (positions 0..pos), idx_topk (int32, ascending), q_lat (absorbed form), attn_o
 *   (o_proj input), attn_out, ffn_norm, ffn_out (dense) or ffn_moe_logits, ffn_moe_topk (int32,
 *   ascending), ffn_moe_weights, ffn_moe_out; MTP layer also mtp_cat, mtp_eh_proj.
 * layer = -1 for model-level tensors; data: n values, float (is_int = 0) or int32 (is_int = 1). */
struct backend_dump {
	void (*fn)(void *ctx, const char *name, int64_t layer, int64_t seq, int64_t pos,
		   int is_int, const void *data, int64_t n);
	void *ctx;
};

struct backend_step {
	int mtp;                        /* 0: main model, 1: the MTP layer */
	int64_t n_seqs;
	const struct backend_seq *seqs; /* [n_seqs]; pages written by two rows must differ */
	const struct backend_dump *dump; /* NULL: no dumps */
};

enum backend_pool { BACKEND_POOL_MLA, BACKEND_POOL_INDEX };

struct backend;

struct backend_ops {
	const char *name;
	/* 0, or -EINVAL for an invalid step (token out of range, position outside the block
	 * table, page id out of range, MTP without MTP weights) with nothing computed. */
	int (*step)(struct backend *b, const struct backend_step *s);
	/* Copies one page of one layer's pool out of (write = 0) or into (write = 1) buf, which
	 * holds mla_page_bytes or idx_page_bytes. For tests and tools. 0 or -EINVAL. */
	int (*page_io)(struct backend *b, int64_t layer, enum backend_pool pool, int64_t page,
		       void *buf, int write);
	void (*destroy)(struct backend *b);
};

struct backend {
	const struct backend_ops *ops;
	const struct dsv32_config *c;
	int64_t n_layers;        /* pools of each kind: num_hidden_layers + MTP layers */
	int64_t n_pages;
	size_t mla_page_bytes;   /* 64 * mla_record_bytes */
	size_t idx_page_bytes;   /* 64 * (index_head_dim + 4) */

	/* Optional (NULL: malloc / free): host memory the backend fills fastest from a step — the
	 * CUDA backend's is pinned, so the logits download lands in it directly instead of going
	 * through a staging buffer. Callers go through backend_host_alloc / backend_host_free. */
	void *(*host_alloc)(struct backend *b, size_t bytes);
	void (*host_free)(struct backend *b, void *p);
	/* Optional (NULL, sample_rows 0: the caller samples the logits): a step that also draws the
	 * token of every sequence i with draw[i] != NULL, each with exactly one LOGITS row (one
	 * per draw of the chain draw[i], draw[i]->row2, ...), at most sample_rows draws in all,
	 * their histories (draws with a penalty) at most hist_ids ids in all (the CUDA backend: on
	 * the device, beside the logits, which then never leave it: such a sequence's logits may
	 * be NULL, a buffer given is left undefined). Otherwise step's contract; -EINVAL also for
	 * draws that break these rules. Callers go through backend_step_draw. */
	int (*step_draw)(struct backend *b, const struct backend_step *s,
			 struct backend_sample *const *draw);
	int64_t sample_rows, hist_ids;
};

/* The draws of the chain d, d->row2, ... (one a LOGITS row), counted up to max + 1 at most (a
 * cycle stops there); 0 for d NULL. */
static inline int64_t backend_sample_chain(const struct backend_sample *d, int64_t max)
{
	int64_t n = 0;
	for (; d && n <= max; d = d->row2)
		n++;
	return n;
}

/* Row j's BACKEND_ROW_* bits (flags NULL: LOGITS on the last row). */
static inline unsigned backend_row_flags(const struct backend_seq *s, int64_t j)
{
	return s->flags ? s->flags[j] : (j == s->n - 1 ? BACKEND_ROW_LOGITS : 0);
}

static inline int backend_step(struct backend *b, const struct backend_step *s)
{
	return b->ops->step(b, s);
}

static inline int backend_step_draw(struct backend *b, const struct backend_step *s,
				    struct backend_sample *const *draw)
{
	return b->step_draw(b, s, draw);
}

static inline int backend_page_io(struct backend *b, int64_t layer, enum backend_pool pool,
				  int64_t page, void *buf, int write)
{
	return b->ops->page_io(b, layer, pool, page, buf, write);
}

/* Host memory for a step's output buffers (backend_seq.logits / hidden): the backend's own kind
 * where it has one (see struct backend), else malloc. NULL when out of memory. Free it with
 * backend_host_free, before the backend is destroyed. */
static inline void *backend_host_alloc(struct backend *b, size_t bytes)
{
	return b->host_alloc ? b->host_alloc(b, bytes) : malloc(bytes);
}

static inline void backend_host_free(struct backend *b, void *p)
{
	if (b->host_free)
		b->host_free(b, p);
	else
		free(p);
}

static inline void backend_destroy(struct backend *b)
{
	if (b)
		b->ops->destroy(b);
}

/* The CPU reference backend. c and w must outlive it. n_threads >= 1 (matmul columns, heads
 * and key positions are split across threads; results do not depend on n_threads). */
int backend_cpu_create(const struct dsv32_config *c, const struct weights *w, int64_t n_pages,
		       int n_threads, struct backend **out, struct err *e);

/* The CUDA backend (model/cuda_backend.c): uploads every tensor of ck, sizes the KV pool from
 * the GPU memory left (n_pages > 0 caps it) and reports pools and upload rate. Its step runs the
 * forward on the GPU (model/cuda_forward.c), the CPU backend's ops in the CPU's order. */
int backend_cuda_create(const struct dsv32_config *c, const struct weights *w,
			const struct checkpoint *ck, int64_t n_pages, struct backend **out,
			struct err *e);

#define CUDA_MAX_STAGES 8

/* The CUDA backend with options. synthetic = 1: ck may be a header-only checkpoint (`mkmodel
 * real --header-only`); the tensors it leaves as holes (model/cuda_synth.h) are generated on the
 * GPU from seed instead of read, the others are read from ck. n_pages as above. */
struct backend_cuda_opts {
	int64_t n_pages;
	int synthetic;
	uint64_t seed;
	/* 1: the batch-invariant mode: a row's numbers do not depend on the step's other rows or
	 * its row count (GEMMs and the MoE block in pieces of <= 64 rows through the decode
	 * kernels, every bf16 product on the CUDA cores in the CPU's order, the full selection
	 * width); 0 (default): the fast paths, whose large-M GEMMs and MoE block depart from the
	 * CPU by their accumulation order (model/cuda_forward.c says where). The environment
	 * variable DSV32_CUDA_BATCH_INVARIANT=1 / 0 overrides it (read when the backend is
	 * created). */
	int batch_invariant;
	/* GPUs (model/cuda_pipeline.c). stages <= 1: the whole model on GPU stage_gpu[0] (0 unless
	 * set). stages = N > 1: a pipeline: the main layers split into N consecutive ranges of
	 * (nearly) equal counts, range i on GPU stage_gpu[i] with its layers' weights and KV
	 * pools, the embedding on the first, the final norm, lm_head and the MTP layer on the
	 * last; each step runs the stages in turn, the rows (layer output and residual) handed
	 * from one GPU to the next. The same numbers as one GPU (the same kernels on the same
	 * rows); one scheduler, one page manager. Stages may share a GPU (tests). */
	int stages;
	int stage_gpu[CUDA_MAX_STAGES];
	/* The most rows a step will have (the scheduler's token budget; 0: 8192): a pipeline maps
	 * the planes that hand a step's rows between GPUs for that many when it is created, before
	 * the KV pools take what is left (a larger step maps more then). */
	int64_t step_rows;
};
int backend_cuda_create_opts(const struct dsv32_config *c, const struct weights *w,
			     const struct checkpoint *ck, const struct backend_cuda_opts *o,
			     struct backend **out, struct err *e);

/* The mode a CUDA backend's steps run in now (backend_cuda_opts.batch_invariant and the
 * environment override): "fast" or "batch-invariant"; "not cuda" for another backend. */
const char *backend_cuda_mode(const struct backend *b);

/* Sets the mode of a CUDA backend's later steps (1: batch-invariant; tests run both modes on
 * one cache). Returns the mode it replaces, or -ENOTSUP for another backend. */
int backend_cuda_set_batch_invariant(struct backend *b, int on);

/* Sets one of the CUDA forward's diagnosis switches (the environment variables of
 * docs/CONFIG.md, read when the backend is created: DSV32_CUDA_GRAPHS, _UNFUSED, _FWD_PDL,
 * _FWD_FORK, _LOGITS_STAGED, _MMA_ROWS, _MLA_FP32, _PROFILE, _MAX_ROWS, _FWD_SKIP; DSV32_TOPK_MODE)
 * for the later
 * steps, value as the variable's (NULL: the default); for tests and tools that flip them at run
 * time. 0, -EINVAL (not a switch), -ENOTSUP (not a CUDA backend). */
int backend_cuda_set_switch(struct backend *b, const char *name, const char *value);

/* Tokens a CUDA backend has drawn on the device (backend_step_draw) since its creation, or
 * -ENOTSUP for another backend. */
int64_t backend_cuda_draws(const struct backend *b);

/* Decode steps a CUDA backend has captured as CUDA graphs and replayed since its creation (tests:
 * that a shape replays). 0, or -ENOTSUP (both counts 0) for another backend. */
int backend_cuda_graph_stats(const struct backend *b, int64_t *captures, int64_t *replays);

/* Benchmarks (CUDA backend only): fills positions [0, n_tokens) of the sequence whose block
 * table is bt (ceil(n_tokens / 64) pages) in every layer's MLA and indexer pools with valid
 * synthetic records (random latent, rope and indexer keys quantised by the real KV-write
 * kernels), as if a prompt of n_tokens had been prefilled. 0, -EINVAL, -ENOTSUP (not CUDA). */
int backend_cuda_kv_fill_synthetic(struct backend *b, const int32_t *bt, int64_t n_tokens,
				   uint64_t seed, struct err *e);

/* Checks a step against the backend's pools and weights (token ids, positions inside the
 * block table, page ids, output buffers, MTP weights): 0 or -EINVAL. Every backend calls it
 * before computing anything. */
int backend_validate_step(const struct backend *b, const struct weights *w,
			  const struct backend_step *st);
/* backend_validate_step for a step with draws (backend.step_draw): also each draw's rules (one
 * LOGITS row a draw of its row2 chain, at most sample_rows, histories of at most hist_ids ids),
 * and a
 * drawn sequence may have no logits buffer. The range of an MTP step's kept rows is the
 * backend's to check (backend_kept_ok). */
int backend_validate_step_draw(const struct backend *b, const struct weights *w,
			       const struct backend_step *st, struct backend_sample *const *draw);
/* 1 when every sequence of an MTP step without mtp_hidden reads kept rows [mtp_kept, mtp_kept +
 * n) within the n_kept rows the backend holds (a step with mtp_hidden: 1). */
int backend_kept_ok(const struct backend_step *st, int64_t n_kept);

/* Test switch: 1 = use the naive attention form (§3.7a) instead of the absorbed one. */
void backend_cpu_set_naive_attention(struct backend *b, int on);

/* Test-only (issue 4, teacher forcing against the oracle's per-layer dumps): decoder layer
 * `layer` (0 .. num_hidden_layers; the last is the MTP layer) alone on the rows of st (mtp = 0;
 * flags should ask for no outputs). x [T, hidden]: the layer's input (the embedding, the
 * previous layer's FFN output, or the MTP eh_proj output), r [T, hidden]: the residual (unused
 * for layer 0 and the MTP layer). Writes the layer's KV caches for the rows, attends over the
 * cache like a step; on return x = the layer's FFN output and r = its residual. 0 or -EINVAL. */
int backend_cpu_layer_step(struct backend *b, int64_t layer, const struct backend_step *st,
			   float *x, float *r);
/* The same on the CUDA backend (x and r go up as bf16 and come back as bf16 values); -ENOTSUP in
 * a build without CUDA. */
int backend_cuda_layer_step(struct backend *b, int64_t layer, const struct backend_step *st,
			    float *x, float *r);

#endif
