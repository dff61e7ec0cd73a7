/*
 * cuda_pipeline.c — the model over several GPUs by layer ranges (backend_cuda_opts.stages;
 * docs/MULTIGPU.md, step 1): one backend to the scheduler, N CUDA backends behind it
 * (model/cuda_stage.h), stage i running main layers [l0[i], l0[i + 1]) on its own GPU.
 *
 * A main step runs the stages in turn over all of its rows: the earlier ones see the rows with
 * no outputs asked (flags 0, no draws) and leave their layer output and residual in the next
 * stage's rows-in planes; the last sees the step as given (logits, hidden and kept rows,
 * draws). An MTP step runs on the last stage alone (the MTP layer and the kept rows are there).
 * Every stage takes the step's passes the same way, so a pass's rows are where the next stage
 * looks for them. The step is validated here first, so a step refused is refused before any
 * stage writes its KV.
 *
 * Pages: one page id indexes every stage's pools (the page manager is the scheduler's, one for
 * all); the pipeline's page count is the smallest stage's. page_io goes to the stage that holds
 * the layer.
 *
 * Must not: change a number. The stages run the single-GPU backend's kernels on the same rows in
 * the same order, so a pipeline's logits, draws and KV bytes are the single GPU's, bit for bit
 * (tests/gpu/test_gpu_forward.c checks it with two stages on one GPU).
 */
#include "model/cuda_stage.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/kv_cache.h"

struct cuda_pipe {
	struct backend base;
	const struct weights *w;
	int n;
	struct backend *st[CUDA_MAX_STAGES];
	int64_t l0[CUDA_MAX_STAGES + 1]; /* stage i: main layers [l0[i], l0[i + 1]) */
	int64_t rows;                    /* rows the rows-in planes hold now */
	uint8_t *zeros;                  /* the earlier stages' row flags: none */
	int64_t n_zeros;
	struct backend_seq *quiet;       /* the earlier stages' view of a step's sequences */
	int64_t n_quiet;
};

static const struct backend_ops pipe_ops;

int cuda_pipeline_stages(const struct backend *b, struct backend **st)
{
	if (!b || b->ops != &pipe_ops)
		return 0;
	const struct cuda_pipe *P = (const struct cuda_pipe *)b;
	for (int i = 0; i < P->n; i++)
		st[i] = P->st[i];
	return P->n;
}

/* Every later stage's rows-in planes hold `rows` rows (grown by doubling; the addresses stay),
 * each earlier stage writing into the next one's. */
static int pipe_rows(struct cuda_pipe *P, int64_t rows, struct err *e)
{
	if (rows <= P->rows)
		return 0;
	if (rows > CUDA_STAGE_MAX_ROWS)
		return err_set(e, -E2BIG, "cuda pipeline: a step of %lld rows (at most %lld)",
			       (long long)rows, (long long)CUDA_STAGE_MAX_ROWS);
	int64_t want = rows < 2 * P->rows ? 2 * P->rows : rows < 64 ? 64 : rows;
	want = want > CUDA_STAGE_MAX_ROWS ? CUDA_STAGE_MAX_ROWS : want;
	for (int i = 1; i < P->n; i++) {
		gpu_ptr x, r;
		int rc = cuda_stage_rows_in(P->st[i], want, cuda_stage_ordinal(P->st[i - 1]), &x, &r, e);
		if (rc)
			return rc;
		cuda_stage_rows_out(P->st[i - 1], x, r);
	}
	P->rows = want;
	return 0;
}

/* The earlier stages' step q: st's rows, no outputs asked. */
static int pipe_quiet(struct cuda_pipe *P, const struct backend_step *st, struct backend_step *q)
{
	int64_t most = 1;
	for (int64_t i = 0; i < st->n_seqs; i++)
		most = st->seqs[i].n > most ? st->seqs[i].n : most;
	if (most > P->n_zeros) {
		free(P->zeros);
		P->n_zeros = 0;
		if (!(P->zeros = calloc((size_t)most, 1)))
			return -ENOMEM;
		P->n_zeros = most;
	}
	if (st->n_seqs > P->n_quiet) {
		struct backend_seq *s = realloc(P->quiet, (size_t)st->n_seqs * sizeof *s);
		if (!s)
			return -ENOMEM;
		P->quiet = s, P->n_quiet = st->n_seqs;
	}
	for (int64_t i = 0; i < st->n_seqs; i++) {
		P->quiet[i] = st->seqs[i];
		P->quiet[i].flags = P->zeros;
		P->quiet[i].logits = P->quiet[i].hidden = NULL;
	}
	*q = *st;
	q->seqs = P->quiet;
	return 0;
}

static int pipe_run(struct backend *b, const struct backend_step *st,
		    struct backend_sample *const *draw)
{
	struct cuda_pipe *P = (struct cuda_pipe *)b;
	int r = draw ? backend_validate_step_draw(b, P->w, st, draw)
		     : backend_validate_step(b, P->w, st);
	if (r)
		return r;
	struct backend *last = P->st[P->n - 1];
	if (!st->mtp) {
		int64_t T = 0;
		for (int64_t i = 0; i < st->n_seqs; i++)
			T += st->seqs[i].n;
		struct backend_step q;
		struct err e = {""};
		if ((r = pipe_rows(P, T, &e)))
			fprintf(stderr, "<3>dsv32: %s\n", e.msg);
		if (r || (r = pipe_quiet(P, st, &q)))
			return r;
		for (int i = 0; i < P->n - 1 && !r; i++) {
			cuda_stage_current(P->st[i]);
			r = backend_step(P->st[i], &q);
		}
		if (r) { /* a failed main step keeps no rows (backend.h): the last stage's dropped by
			  * an empty main step */
			const struct backend_step none = {0};
			cuda_stage_current(last);
			backend_step(last, &none);
			return r;
		}
	}
	cuda_stage_current(last);
	return draw ? backend_step_draw(last, st, draw) : backend_step(last, st);
}

static int pipe_step(struct backend *b, const struct backend_step *st)
{
	return pipe_run(b, st, NULL);
}

static int pipe_step_draw(struct backend *b, const struct backend_step *st,
			  struct backend_sample *const *draw)
{
	return pipe_run(b, st, draw);
}

/* Layer `layer` (main layers, then the MTP layer) is pool layer - l0[i] of stage i. */
static int pipe_page_io(struct backend *b, int64_t layer, enum backend_pool pool, int64_t page,
			void *buf, int write)
{
	struct cuda_pipe *P = (struct cuda_pipe *)b;
	if (layer < 0 || layer >= b->n_layers || page < 0 || page >= b->n_pages)
		return -EINVAL;
	int i = P->n - 1;
	while (i > 0 && layer < P->l0[i])
		i--;
	cuda_stage_current(P->st[i]);
	return backend_page_io(P->st[i], layer - P->l0[i], pool, page, buf, write);
}

/* Host memory: the last stage's (its logits land there). */
static void *pipe_host_alloc(struct backend *b, size_t bytes)
{
	return backend_host_alloc(((struct cuda_pipe *)b)->st[((struct cuda_pipe *)b)->n - 1], bytes);
}

static void pipe_host_free(struct backend *b, void *p)
{
	backend_host_free(((struct cuda_pipe *)b)->st[((struct cuda_pipe *)b)->n - 1], p);
}

static void pipe_destroy(struct backend *b)
{
	struct cuda_pipe *P = (struct cuda_pipe *)b;
	for (int i = P->n - 1; i >= 0; i--)
		backend_destroy(P->st[i]);
	free(P->zeros);
	free(P->quiet);
	free(P);
}

static const struct backend_ops pipe_ops = {"cuda", pipe_step, pipe_page_io, pipe_destroy};

int cuda_pipeline_create(const struct dsv32_config *c, const struct weights *w,
			 const struct checkpoint *ck, const struct backend_cuda_opts *o,
			 struct backend **out, struct err *e)
{
	const int n = o->stages;
	const int64_t Lm = c->num_hidden_layers;
	if (n > CUDA_MAX_STAGES || n > Lm)
		return err_set(e, -EINVAL, "cuda pipeline: %d stages for %lld layers (at most %d "
					   "stages, and at least one layer each)",
			       n, (long long)Lm, CUDA_MAX_STAGES);
	struct cuda_pipe *P = calloc(1, sizeof *P);
	if (!P)
		return err_set(e, -ENOMEM, "out of memory");
	P->base.ops = &pipe_ops;
	P->base.c = c;
	P->base.n_layers = Lm + c->num_nextn_predict_layers;
	P->base.mla_page_bytes = kv_mla_page_bytes(c);
	P->base.idx_page_bytes = kv_index_page_bytes(c);
	P->base.host_alloc = pipe_host_alloc;
	P->base.host_free = pipe_host_free;
	P->w = w;
	for (int i = 0; i <= n; i++)
		P->l0[i] = i * Lm / n;
	int r = 0;
	for (int i = 0; i < n && !r; i++) {
		struct cuda_stage_place pl = {o->stage_gpu[i], P->l0[i], P->l0[i + 1],
					      i ? o->stage_gpu[i - 1] : -1, 0, 0};
		for (int k = i; k < n; k++) /* stages sharing a GPU share its memory */
			if (o->stage_gpu[k] == o->stage_gpu[i]) {
				pl.share++;
				pl.later_bytes += k > i ? cuda_stage_fixed_bytes(c, ck, P->l0[k],
										 P->l0[k + 1],
										 cuda_stage_step_rows(o))
							: 0;
			}
		r = cuda_stage_create(c, w, ck, o, &pl, &P->st[i], e);
		if (!r)
			P->n = i + 1;
	}
	if (r) {
		pipe_destroy(&P->base);
		return r;
	}
	/* the rows-in planes each later stage mapped at creation, linked (nothing more to map) */
	if ((r = pipe_rows(P, cuda_stage_step_rows(o), e))) {
		pipe_destroy(&P->base);
		return r;
	}
	P->base.n_pages = P->st[0]->n_pages;
	for (int i = 1; i < n; i++)
		P->base.n_pages = P->st[i]->n_pages < P->base.n_pages ? P->st[i]->n_pages
								      : P->base.n_pages;
	const struct backend *last = P->st[n - 1];
	if (last->step_draw) {
		P->base.step_draw = pipe_step_draw;
		P->base.sample_rows = last->sample_rows;
		P->base.hist_ids = last->hist_ids;
	}
	char where[160] = "";
	for (int i = 0, k = 0; i < n && k < (int)sizeof where - 32; i++)
		k += snprintf(where + k, sizeof where - (size_t)k, "%s%lld-%lld on GPU %d", i ? ", " : "",
			      (long long)P->l0[i], (long long)P->l0[i + 1] - 1,
			      cuda_stage_ordinal(P->st[i]));
	fprintf(stderr, "<6>dsv32: cuda pipeline of %d stages (layers %s), KV pool %lld pages\n", n,
		where, (long long)P->base.n_pages);
	*out = &P->base;
	return 0;
}

#endif
