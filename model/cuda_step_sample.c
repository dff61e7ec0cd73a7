/*
 * cuda_step_sample.c — a step's tokens drawn on the device (see cuda_step_sample.h).
 */
#include "model/cuda_step_sample.h"

#ifndef DSV32_NO_CUDA
#include <errno.h>
#include <string.h>

#include "driver/cu.h"

static size_t al256(size_t x) { return (x + 255) / 256 * 256; }

int cuda_step_sampler_init(struct gpu *g, struct cuda_step_sampler *s, int rows, int vocab,
			   int64_t hist_ids, struct err *e)
{
	memset(s, 0, sizeof *s);
	size_t pb = (size_t)rows * sizeof *s->h_params, ob = (size_t)rows * sizeof *s->h_out;
	size_t hb = (size_t)hist_ids * sizeof *s->h_hist, wb = cuda_sampler_workspace(g, rows, vocab);
	size_t all = al256(pb) + al256(ob) + al256(hb) + wb;
	int r = gpu_region_reserve(g, &s->region, "sampler", all, e);
	if (!r)
		r = gpu_region_grow(g, &s->region, all, e);
	if (r)
		return r;
	s->params = gpu_region_alloc(&s->region, pb);
	s->out = gpu_region_alloc(&s->region, ob);
	s->hist = gpu_region_alloc(&s->region, hb);
	s->ws = gpu_region_alloc(&s->region, wb);
	s->h_params = gpu_host_alloc(pb);
	s->h_out = gpu_host_alloc(ob);
	s->h_hist = gpu_host_alloc(hb);
	if (!s->params || !s->out || !s->hist || !s->ws || !s->h_params || !s->h_out || !s->h_hist) {
		cuda_step_sampler_free(g, s);
		return err_set(e, -ENOMEM, "cuda backend: no memory for the sampler's %d rows", rows);
	}
	s->rows = rows, s->vocab = vocab, s->hist_ids = hist_ids;
	return 0;
}

void cuda_step_sampler_free(struct gpu *g, struct cuda_step_sampler *s)
{
	gpu_host_free(s->h_params);
	gpu_host_free(s->h_out);
	gpu_host_free(s->h_hist);
	gpu_region_free(g, &s->region);
	memset(s, 0, sizeof *s);
}

/* A sequence's LOGITS rows in st (a drawn one's: its draws in this pass, or none). */
static int64_t logits_rows(const struct backend_seq *q)
{
	int64_t nl = 0;
	for (int64_t j = 0; j < q->n; j++)
		nl += !!(backend_row_flags(q, j) & BACKEND_ROW_LOGITS);
	return nl;
}

int cuda_step_sample_launch(struct gpu *g, struct cuda_step_sampler *s,
			    const struct backend_step *st, struct backend_sample *const *draw,
			    gpu_ptr l32, int64_t ld)
{
	const size_t rb = sizeof *s->h_params, ob = sizeof *s->h_out;
	int n = 0;
	int64_t nh = 0; /* history ids staged */
	for (int64_t i = 0; i < st->n_seqs; i++) {
		const int64_t nl = draw[i] ? logits_rows(&st->seqs[i]) : 0;
		if (!nl)
			continue;
		if (backend_sample_chain(draw[i], nl) != nl) /* (a pass holds a verification whole) */
			return -EINVAL;
		for (const struct backend_sample *q = draw[i]; q; q = q->row2) {
			if (n == s->rows)
				return -E2BIG;
			int64_t np = 0, no = 0; /* the history, only where a penalty reads it */
			if (sampler_params_penalised(q->p)) {
				np = q->n_prompt, no = q->n_output;
				if (nh + np + no > s->hist_ids)
					return -E2BIG;
				memcpy(s->h_hist + nh, q->prompt, (size_t)np * sizeof *s->h_hist);
				memcpy(s->h_hist + nh + np, q->output, (size_t)no * sizeof *s->h_hist);
			}
			cuda_sampler_row_set(&s->h_params[n++], q->p, q->index, nh, np, nh + np, no);
			nh += np + no;
		}
	}
	s->n = n;
	if (!n)
		return 0;
	if (cu_check(cu.cuMemcpyHtoDAsync(s->params, s->h_params, (size_t)n * rb, g->stream),
		     "cuMemcpyHtoDAsync", __FILE__, __LINE__) ||
	    (nh && cu_check(cu.cuMemcpyHtoDAsync(s->hist, s->h_hist, (size_t)nh * sizeof *s->h_hist,
						  g->stream),
			    "cuMemcpyHtoDAsync", __FILE__, __LINE__)))
		return -EIO;
	/* one launch per run of consecutive drawn rows of l32 (the scheduler's steps: one run) */
	int64_t row = 0, run0 = -1;
	int k = 0, k0 = 0;
	for (int64_t i = 0; i <= st->n_seqs; i++) {
		const int64_t nl = i < st->n_seqs ? logits_rows(&st->seqs[i]) : -1;
		if (!nl)
			continue;
		if (nl > 0 && draw[i]) { /* (its nl rows are its nl draws) */
			if (run0 < 0)
				run0 = row, k0 = k;
			k += (int)nl;
		} else if (run0 >= 0) { /* the run [run0, row) ends here */
			int r = cuda_sampler_sample(g, l32 + (size_t)run0 * (size_t)ld * 4, ld,
						    (int)(row - run0), s->vocab, s->params + (size_t)k0 * rb,
						    s->hist, s->out + (size_t)k0 * ob, s->ws);
			if (r)
				return r;
			run0 = -1;
		}
		row += nl;
	}
	if (cu_check(cu.cuMemcpyDtoHAsync(s->h_out, s->out, (size_t)n * ob, g->stream),
		     "cuMemcpyDtoHAsync", __FILE__, __LINE__))
		return -EIO;
	return n;
}

void cuda_step_sample_finish(struct cuda_step_sampler *s, const struct backend_step *st,
			     struct backend_sample *const *draw)
{
	for (int64_t i = 0, k = 0; i < st->n_seqs && k < s->n; i++) {
		if (!draw[i] || !logits_rows(&st->seqs[i]))
			continue;
		for (struct backend_sample *q = draw[i]; q; q = q->row2) {
			const struct cuda_sampler_result *o = &s->h_out[k++];
			s->draws++;
			memset(&q->out, 0, sizeof q->out);
			q->rc = o->err;
			if (o->err)
				continue;
			q->out.token = o->token;
			q->out.logprob = o->logprob;
			q->out.n_top = o->n_top;
			memcpy(q->out.top_ids, o->top_ids, sizeof q->out.top_ids);
			memcpy(q->out.top_logprobs, o->top_logprobs, sizeof q->out.top_logprobs);
		}
	}
	s->n = 0;
}
#endif
