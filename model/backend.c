/*
 * backend.c — what every backend shares: the validation of a step (see backend.h).
 */
#include "model/backend.h"

#include <errno.h>

#include "model/kv_cache.h"

int backend_validate_step_draw(const struct backend *b, const struct weights *w,
			       const struct backend_step *st, struct backend_sample *const *draw)
{
	const struct dsv32_config *c = b->c;
	if (st->n_seqs < 0 || (st->n_seqs && !st->seqs))
		return -EINVAL;
	if (st->mtp && !w->has_mtp)
		return -EINVAL;
	int64_t vocab = st->mtp ? w->mtp.embed.rows : w->embed.rows, n_sample = 0, n_hist = 0;
	int given = -1; /* MTP step: 1 every sequence gives mtp_hidden, 0 none does */
	for (int64_t i = 0; i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		if (s->n < 0 || (s->n && (!s->tokens || !s->pos || !s->block_table)))
			return -EINVAL;
		int64_t n_logits = 0;
		for (int64_t j = 0; j < s->n; j++)
			n_logits += !!(backend_row_flags(s, j) & BACKEND_ROW_LOGITS);
		const struct backend_sample *d = draw ? draw[i] : NULL;
		if (d && backend_sample_chain(d, n_logits) != n_logits) /* one draw a LOGITS row */
			return -EINVAL;
		/* each draw: a sampler; with a penalty, a history within hist_ids */
		for (const struct backend_sample *q = d; q; q = q->row2) {
			if (++n_sample > b->sample_rows || !q->p)
				return -EINVAL;
			if (sampler_params_penalised(q->p)) {
				if (q->n_prompt < 0 || q->n_output < 0 || (q->n_prompt && !q->prompt) ||
				    (q->n_output && !q->output))
					return -EINVAL;
				n_hist += q->n_prompt + q->n_output;
				if (n_hist > b->hist_ids)
					return -EINVAL;
			}
		}
		if (st->mtp && s->n) { /* h_i given, or kept rows (the backend checks their range) */
			if ((given >= 0 && given != !!s->mtp_hidden) || (!s->mtp_hidden && s->mtp_kept < 0))
				return -EINVAL;
			given = !!s->mtp_hidden;
		}
		for (int64_t j = 0; j < s->n; j++) {
			unsigned fl = backend_row_flags(s, j);
			if (s->tokens[j] < 0 || s->tokens[j] >= vocab || s->pos[j] < 0 ||
			    s->pos[j] >= s->n_blocks * KV_PAGE_TOKENS ||
			    s->pos[j] >= c->max_position_embeddings)
				return -EINVAL;
			if (((fl & BACKEND_ROW_LOGITS) && !s->logits && !d) ||
			    ((fl & BACKEND_ROW_HIDDEN) && !s->hidden) || ((fl & BACKEND_ROW_KEEP) && st->mtp))
				return -EINVAL;
			for (int64_t blk = 0; blk <= s->pos[j] / KV_PAGE_TOKENS; blk++)
				if (s->block_table[blk] < 0 || s->block_table[blk] >= b->n_pages)
					return -EINVAL;
		}
	}
	return 0;
}

int backend_validate_step(const struct backend *b, const struct weights *w,
			  const struct backend_step *st)
{
	return backend_validate_step_draw(b, w, st, NULL);
}

int backend_kept_ok(const struct backend_step *st, int64_t n_kept)
{
	for (int64_t i = 0; st->mtp && i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		if (s->n && !s->mtp_hidden && (s->mtp_kept < 0 || s->mtp_kept > n_kept - s->n))
			return 0;
	}
	return 1;
}
