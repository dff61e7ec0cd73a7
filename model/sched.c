/*
 * sched.c — continuous batching: admission, the step (schedule -> run -> postprocess),
 * preemption, cancellation, stop conditions and events (see sched.h for the rules).
 *
 * Owns: sequences (prompt + output ids, progress, block table, detokenizer, held-back text),
 * the running list (admission order) and the waiting queue (arrival order), per-step scratch
 * sized at init. Must not: touch page contents or the driver; allocate per step except when a
 * sequence's token array, block table or the text arena grows (amortised doubling).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/sched.h"

#include "model/clock.h"

enum seq_state { SEQ_WAITING, SEQ_RUNNING };

struct seq {
	uint64_t id;
	uint64_t arrival;          /* arrival number: waiting order */
	enum seq_state state;
	int32_t *tokens;           /* [cap] prompt then output ids */
	int64_t n_tokens, cap, n_prompt;
	int64_t n_computed;        /* positions whose K/V are in the cache */
	int64_t n_prompt_cached;   /* prompt positions taken from the prefix cache, first admission */
	int admitted_once;
	uint64_t t_admitted_ns;    /* CLOCK_MONOTONIC at the first admission; 0 before */
	int64_t max_tokens;        /* 0 = none */
	int64_t n_emitted;         /* TOKEN events sent */
	struct sampler_params sp;
	int32_t stop_ids[SCHED_MAX_STOP_IDS];
	int n_stop_ids;
	struct stopstr stop;       /* stop strings and the text held back for them */
	int ignore_eos;
	struct kv_seq kv;
	struct detok dt;
	/* MTP drafting (cfg.mtp_draft) */
	int64_t n_mtp;             /* positions whose MTP-layer K/V are in the cache */
	int32_t draft[SCHED_MAX_DRAFTS]; /* the MTP layer's guesses for tokens[n_tokens + j] */
	int n_draft;
	/* this step */
	int64_t rows;              /* scheduled rows (0 = none), the drafts' included */
	int decode;                /* the rows are a decode */
	int verify;                /* the last `verify` rows are drafts (tokens[n_tokens + j]) */
	int accepted;              /* of them, accepted (each draw before it equal to it) */
	int sample;                /* the rows end the uncomputed tokens: a token is drawn */
	int64_t row0, pos0;        /* the first row in the step (its kept rows start there) and
				    * its position */
};

struct sched {
	struct backend *b;
	struct sched_config cfg;
	int64_t vocab, limit;
	int32_t eos;
	struct kv_pages kp;
	struct sampler smp;
	struct seq **running;      /* [max_seqs] admission order */
	int64_t n_running;
	struct seq **waiting;      /* arrival order */
	int64_t n_waiting, cap_waiting;
	uint64_t next_arrival;
	/* step scratch */
	struct seq **sched;        /* [max_seqs] scheduled this step */
	int64_t n_sched;
	struct backend_seq *bseq;  /* [max_seqs] */
	int64_t *pos;              /* [max_batch_tokens] */
	uint8_t *flags;            /* [max_batch_tokens] */
	float *logits;             /* [max_seqs, vocab] */
	struct backend_sample *draw; /* [max_seqs] each scheduled sequence's draw (by the backend:
				      * backend_step_draw, or here from the logits) */
	struct backend_sample **drawp; /* [max_seqs] the backend's draws: &draw[k] or NULL */
	struct backend_sample *draw2; /* [max_seqs, mtp_draft] a verification's draft rows' draws
				       * (the backend's: the chain draw[k].row2 = &draw2[k K], ...) */
	struct sampler_params greedy; /* the MTP steps' drafts (the argmax) */
	float *mtp_h[2];           /* [max_seqs, hidden_size] (mtp_draft > 1): the MTP block's
				    * output, the next MTP step's h (two: one read, one written) */
	int64_t *chain;            /* [max_seqs] (mtp_draft): an MTP step's drafting sequences */
	struct sbuf piece;         /* detok output of one token */
	/* events */
	struct sched_event *ev;
	size_t *ev_text;           /* [cap_ev] offset in text, or SIZE_MAX */
	int64_t n_ev, cap_ev;
	struct sbuf text;
	/* terminal events of cancel / fail_all between steps: the next step delivers them, so
	 * the array a step handed out stays intact while the caller walks it */
	struct sched_event *pend;
	int64_t n_pend, cap_pend;
	/* counters */
	uint64_t preemptions, steps, added, finished, prefill_tokens, decode_tokens;
	uint64_t drafts, drafts_accepted;
	double t_step, t_backend, t_sample, last_step;
};

const char *sched_finish_name(enum sched_finish r)
{
	switch (r) {
	case SCHED_FINISH_STOP: return "stop";
	case SCHED_FINISH_LENGTH: return "length";
	case SCHED_FINISH_EOS: return "eos";
	case SCHED_FINISH_CANCELLED: return "cancelled";
	case SCHED_FINISH_CONTEXT_LIMIT: return "context_limit";
	}
	return "?";
}

static double now_s(const struct sched *s)
{
	struct timespec ts;
	clock_gettime(s->cfg.cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- events ------------------------------------------------------------------------------- */

static struct sched_event *ev_push(struct sched_event **a, int64_t *n, int64_t *cap)
{
	if (*n == *cap) {
		int64_t c = *cap ? *cap * 2 : 256;
		struct sched_event *p = realloc(*a, (size_t)c * sizeof *p);
		ASSERT(p); /* host out of memory */
		*a = p;
		*cap = c;
	}
	struct sched_event *e = &(*a)[(*n)++];
	/* every field but the logprob arrays (read only up to n_top) */
	e->seq = 0;
	e->token = 0;
	e->logprob = 0;
	e->n_top = 0;
	e->text = NULL;
	e->text_len = 0;
	e->reason = SCHED_FINISH_STOP;
	e->n_prompt = e->n_output = e->n_prompt_cached = 0;
	e->t_admitted_ns = 0;
	e->error = 0;
	e->msg = NULL;
	return e;
}

/* An event of the running step. */
static struct sched_event *ev_new(struct sched *s, enum sched_event_type t, uint64_t id)
{
	int64_t cap = s->cap_ev;
	struct sched_event *e = ev_push(&s->ev, &s->n_ev, &s->cap_ev);
	if (s->cap_ev != cap) {
		size_t *tx = realloc(s->ev_text, (size_t)s->cap_ev * sizeof *tx);
		ASSERT(tx);
		s->ev_text = tx;
	}
	e->type = t;
	e->id = id;
	s->ev_text[s->n_ev - 1] = SIZE_MAX;
	return e;
}

/* A terminal event outside a step, delivered first by the next one. */
static struct sched_event *pend_new(struct sched *s, enum sched_event_type t, uint64_t id)
{
	struct sched_event *e = ev_push(&s->pend, &s->n_pend, &s->cap_pend);
	e->type = t;
	e->id = id;
	return e;
}

/* ---- sequences ---------------------------------------------------------------------------- */

static void seq_free(struct seq *q)
{
	if (!q)
		return;
	free(q->tokens);
	stopstr_free(&q->stop);
	kv_seq_free(&q->kv);
	free(q);
}

/* Room for n ids past n_tokens (a token to append, or drafts to verify there). */
static int seq_room(struct seq *q, int64_t n)
{
	if (q->n_tokens + n > q->cap) {
		int64_t cap = q->cap * 2 > q->n_tokens + n ? q->cap * 2 : q->n_tokens + n;
		int32_t *p = realloc(q->tokens, (size_t)cap * sizeof *p);
		if (!p)
			return -ENOMEM;
		q->tokens = p;
		q->cap = cap;
	}
	return 0;
}

static int seq_append(struct seq *q, int32_t t)
{
	if (seq_room(q, 1) < 0)
		return -ENOMEM;
	q->tokens[q->n_tokens++] = t;
	return 0;
}

static void list_remove(struct seq **a, int64_t *n, struct seq *q)
{
	for (int64_t i = 0; i < *n; i++)
		if (a[i] == q) {
			memmove(a + i, a + i + 1, (size_t)(*n - i - 1) * sizeof *a);
			(*n)--;
			return;
		}
	ASSERT(0);
}

/* Into the waiting queue at its arrival place (preempted sequences go back near the front). */
static int waiting_insert(struct sched *s, struct seq *q)
{
	if (s->n_waiting == s->cap_waiting) {
		int64_t cap = s->cap_waiting ? s->cap_waiting * 2 : 64;
		struct seq **w = realloc(s->waiting, (size_t)cap * sizeof *w);
		if (!w)
			return -ENOMEM;
		s->waiting = w;
		s->cap_waiting = cap;
	}
	int64_t i = s->n_waiting;
	while (i > 0 && s->waiting[i - 1]->arrival > q->arrival) {
		s->waiting[i] = s->waiting[i - 1];
		i--;
	}
	s->waiting[i] = q;
	s->n_waiting++;
	q->state = SEQ_WAITING;
	return 0;
}

/* Removes a live sequence from its list and frees it and its pages. */
static void seq_drop(struct sched *s, struct seq *q)
{
	if (q->state == SEQ_RUNNING)
		list_remove(s->running, &s->n_running, q);
	else
		list_remove(s->waiting, &s->n_waiting, q);
	kv_pages_release(&s->kp, &q->kv);
	seq_free(q);
	s->finished++;
}

static struct seq *seq_find(const struct sched *s, uint64_t id)
{
	for (int64_t i = 0; i < s->n_running; i++)
		if (s->running[i]->id == id)
			return s->running[i];
	for (int64_t i = 0; i < s->n_waiting; i++)
		if (s->waiting[i]->id == id)
			return s->waiting[i];
	return NULL;
}

/* ---- init --------------------------------------------------------------------------------- */

int sched_init(struct sched **out, struct backend *b, const struct sched_config *cfg,
	       struct err *e)
{
	*out = NULL;
	if (cfg->max_batch_tokens < 1)
		return err_set(e, -EINVAL, "max_batch_tokens = %lld: must be >= 1",
			       (long long)cfg->max_batch_tokens);
	if (cfg->max_seqs < 1 || cfg->max_seqs > (1 << 20))
		return err_set(e, -EINVAL, "max_seqs = %lld: must be in [1, 2^20]",
			       (long long)cfg->max_seqs);
	if (cfg->max_batch_tokens < cfg->max_seqs)
		return err_set(e, -EINVAL,
			       "max_batch_tokens = %lld < max_seqs = %lld: every running sequence "
			       "must be able to decode in every step",
			       (long long)cfg->max_batch_tokens, (long long)cfg->max_seqs);
	if (cfg->max_context < 0 || cfg->max_waiting < 0)
		return err_set(e, -EINVAL, "max_context and max_waiting must be >= 0");
	if (b->n_pages < 1)
		return err_set(e, -EINVAL, "backend has %lld KV pages", (long long)b->n_pages);
	if (cfg->mtp_draft < 0 || cfg->mtp_draft > SCHED_MAX_DRAFTS)
		return err_set(e, -EINVAL, "mtp_draft = %d: out of range [0, %d]", cfg->mtp_draft,
			       SCHED_MAX_DRAFTS);
	if (cfg->mtp_draft && b->n_layers <= b->c->num_hidden_layers)
		return err_set(e, -EINVAL, "mtp_draft = %d: the model has no MTP layer "
				"(num_nextn_predict_layers = %lld, or its weights are absent)",
			       cfg->mtp_draft, (long long)b->c->num_nextn_predict_layers);
	struct sched *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->b = b;
	s->cfg = *cfg;
	s->vocab = b->c->vocab_size;
	s->eos = (int32_t)b->c->eos_token_id;
	int64_t lim = cfg->max_context ? cfg->max_context : b->c->max_position_embeddings;
	if (lim > b->c->max_position_embeddings)
		lim = b->c->max_position_embeddings;
	if (lim > b->n_pages * KV_PAGE_TOKENS)
		lim = b->n_pages * KV_PAGE_TOKENS;
	s->limit = lim;
	int64_t S = cfg->max_seqs, B = cfg->max_batch_tokens;
	const int64_t K = cfg->mtp_draft, D = b->c->hidden_size;
	int64_t L = (1 + K) * S; /* rows with logits a step (a verification: 1 + its drafts) */
	L = L < B ? L : B;
	int rc = kv_pages_init(&s->kp, b->n_pages);
	if (rc < 0)
		goto fail;
	rc = sampler_init(&s->smp, s->vocab);
	if (rc < 0)
		goto fail;
	sampler_params_default(&s->greedy);
	s->running = calloc((size_t)S, sizeof *s->running);
	s->sched = calloc((size_t)S, sizeof *s->sched);
	s->bseq = calloc((size_t)S, sizeof *s->bseq);
	s->pos = calloc((size_t)B, sizeof *s->pos);
	s->flags = calloc((size_t)B, sizeof *s->flags);
	/* the backend's host memory (CUDA: pinned, the logits download lands in it directly) */
	s->logits = backend_host_alloc(b, (size_t)L * (size_t)s->vocab * sizeof *s->logits);
	s->draw = calloc((size_t)S, sizeof *s->draw);
	s->drawp = calloc((size_t)S, sizeof *s->drawp);
	if (K)
		s->draw2 = calloc((size_t)(S * K), sizeof *s->draw2);
	for (int i = 0; i < 2 && K > 1; i++)
		s->mtp_h[i] = backend_host_alloc(b, (size_t)(S * D) * sizeof *s->mtp_h[i]);
	if (K)
		s->chain = calloc((size_t)S, sizeof *s->chain);
	rc = -ENOMEM;
	if (!s->running || !s->sched || !s->bseq || !s->pos || !s->flags || !s->logits ||
	    !s->draw || !s->drawp || (K && (!s->draw2 || !s->chain)) ||
	    (K > 1 && (!s->mtp_h[0] || !s->mtp_h[1])))
		goto fail;
	*out = s;
	return 0;
fail:
	sched_free(s);
	return err_set(e, rc, "scheduler: %s", rc == -ENOMEM ? "out of memory" : "bad sizes");
}

void sched_free(struct sched *s)
{
	if (!s)
		return;
	for (int64_t i = 0; i < s->n_running; i++)
		seq_free(s->running[i]);
	for (int64_t i = 0; i < s->n_waiting; i++)
		seq_free(s->waiting[i]);
	kv_pages_free(&s->kp);
	sampler_free(&s->smp);
	free(s->running);
	free(s->waiting);
	free(s->sched);
	free(s->bseq);
	free(s->pos);
	free(s->flags);
	if (s->logits)
		backend_host_free(s->b, s->logits);
	free(s->draw);
	free(s->drawp);
	free(s->draw2);
	for (int i = 0; i < 2; i++)
		if (s->mtp_h[i])
			backend_host_free(s->b, s->mtp_h[i]);
	free(s->chain);
	sbuf_free(&s->piece);
	sbuf_free(&s->text);
	free(s->ev);
	free(s->ev_text);
	free(s->pend);
	free(s);
}

/* ---- requests ----------------------------------------------------------------------------- */

static int check_request(const struct sched *s, const struct sched_request *r, struct err *e)
{
	if (seq_find(s, r->id))
		return err_set(e, -EEXIST, "request id %llu is already live",
			       (unsigned long long)r->id);
	if (r->n_prompt < 1 || !r->prompt)
		return err_set(e, -EINVAL, "prompt: empty");
	if (r->n_prompt >= s->limit)
		return err_set(e, -E2BIG,
			       "prompt too long: %lld tokens, the context limit is %lld (prompt "
			       "+ at least one output token)",
			       (long long)r->n_prompt, (long long)s->limit);
	for (int64_t i = 0; i < r->n_prompt; i++)
		if (r->prompt[i] < 0 || r->prompt[i] >= s->vocab)
			return err_set(e, -ERANGE, "prompt[%lld] = %d: token id outside [0, %lld)",
				       (long long)i, r->prompt[i], (long long)s->vocab);
	if (r->max_tokens < 0)
		return err_set(e, -EINVAL, "max_tokens = %lld: must be >= 0 (0 = no limit)",
			       (long long)r->max_tokens);
	int rc = sampler_params_check(&r->sampling, e);
	if (rc < 0)
		return rc;
	if (r->n_stop_ids < 0 || r->n_stop_ids > SCHED_MAX_STOP_IDS ||
	    (r->n_stop_ids && !r->stop_ids))
		return err_set(e, -EINVAL, "stop_token_ids: %d ids, at most %d", r->n_stop_ids,
			       SCHED_MAX_STOP_IDS);
	for (int i = 0; i < r->n_stop_ids; i++)
		if (r->stop_ids[i] < 0 || r->stop_ids[i] >= s->vocab)
			return err_set(e, -ERANGE, "stop_token_ids[%d] = %d: token id outside [0, %lld)", i,
				       r->stop_ids[i], (long long)s->vocab);
	if (r->n_stop < 0 || r->n_stop > SCHED_MAX_STOP_STRINGS || (r->n_stop && !r->stop))
		return err_set(e, -EINVAL, "stop: %d strings, at most %d", r->n_stop,
			       SCHED_MAX_STOP_STRINGS);
	if (r->n_stop && !s->cfg.tok)
		return err_set(e, -EINVAL, "stop: stop strings need a tokenizer");
	for (int i = 0; i < r->n_stop; i++) {
		const struct sched_str *t = &r->stop[i];
		if (t->n < 1 || t->n > SCHED_MAX_STOP_LEN || !t->p)
			return err_set(e, -EINVAL, "stop[%d]: %zu bytes, must be 1..%d", i, t->n,
				       SCHED_MAX_STOP_LEN);
		if (detok_valid_prefix(t->p, t->n) != t->n)
			return err_set(e, -EINVAL, "stop[%d]: invalid UTF-8", i);
	}
	if (s->cfg.max_waiting && s->n_waiting >= s->cfg.max_waiting)
		return err_set(e, -EAGAIN, "queue full: %lld requests waiting",
			       (long long)s->n_waiting);
	return 0;
}

int sched_add(struct sched *s, const struct sched_request *r, struct err *e)
{
	int rc = check_request(s, r, e);
	if (rc < 0)
		return rc;
	struct seq *q = calloc(1, sizeof *q);
	if (!q)
		return err_set(e, -ENOMEM, "out of memory");
	q->id = r->id;
	q->arrival = s->next_arrival++;
	q->cap = r->n_prompt + 16;
	q->tokens = malloc((size_t)q->cap * sizeof *q->tokens);
	const char *sp[SCHED_MAX_STOP_STRINGS];
	size_t sl[SCHED_MAX_STOP_STRINGS];
	for (int i = 0; i < r->n_stop; i++) {
		sp[i] = r->stop[i].p;
		sl[i] = r->stop[i].n;
	}
	if (!q->tokens || stopstr_init(&q->stop, sp, sl, r->n_stop) < 0) {
		seq_free(q);
		return err_set(e, -ENOMEM, "out of memory");
	}
	memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
	q->n_tokens = q->n_prompt = r->n_prompt;
	q->n_draft = 0;
	q->max_tokens = r->max_tokens;
	q->sp = r->sampling;
	if (!r->seeded)
		q->sp.seed = sampler_bits(s->cfg.seed, q->arrival);
	if (r->n_stop_ids)
		memcpy(q->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof *q->stop_ids);
	q->n_stop_ids = r->n_stop_ids;
	q->ignore_eos = r->ignore_eos;
	q->kv.uid = r->uid;
	q->kv.chain_page = -1;
	if (s->cfg.tok)
		detok_init(&q->dt, s->cfg.tok, s->cfg.detok_flags);
	rc = waiting_insert(s, q);
	if (rc < 0) {
		seq_free(q);
		return err_set(e, rc, "out of memory");
	}
	s->added++;
	return 0;
}

int sched_cancel(struct sched *s, uint64_t id)
{
	struct seq *q = seq_find(s, id);
	if (!q)
		return -ENOENT;
	struct sched_event *ev = pend_new(s, SCHED_EVENT_FINISH, id);
	ev->reason = SCHED_FINISH_CANCELLED;
	ev->n_prompt = q->n_prompt;
	ev->n_output = q->n_tokens - q->n_prompt;
	ev->n_prompt_cached = q->n_prompt_cached;
	ev->t_admitted_ns = q->t_admitted_ns;
	seq_drop(s, q);
	return 0;
}

void sched_fail_all(struct sched *s, int code, const char *msg)
{
	while (s->n_running + s->n_waiting > 0) {
		struct seq *q = s->n_running ? s->running[s->n_running - 1]
					     : s->waiting[s->n_waiting - 1];
		struct sched_event *ev = pend_new(s, SCHED_EVENT_ERROR, q->id);
		ev->error = code;
		ev->msg = msg;
		seq_drop(s, q);
	}
}

int sched_has_work(const struct sched *s)
{
	return s->n_running + s->n_waiting > 0 || s->n_pend > 0;
}

/* ---- schedule ----------------------------------------------------------------------------- */

/* Back to the waiting queue, to be recomputed; its output so far is kept. */
static void preempt(struct sched *s, struct seq *q)
{
	ASSERT(q->state == SEQ_RUNNING && q->rows == 0);
	list_remove(s->running, &s->n_running, q);
	kv_pages_release(&s->kp, &q->kv);
	q->n_computed = q->n_mtp = 0;
	q->n_draft = 0;
	int rc = waiting_insert(s, q);
	ASSERT(rc == 0); /* growing the queue fails only when the host is out of memory */
	s->preemptions++;
}

static void add_rows(struct sched *s, struct seq *q, int64_t n, int decode)
{
	q->rows = n;
	q->decode = decode;
	q->verify = q->accepted = 0;
	s->sched[s->n_sched++] = q;
}

/* 1 when draft j of q (the token at tokens[n_tokens + j]) could be used: max_tokens and the
 * context limit leave room for j + 2 more tokens. */
static int draft_usable(const struct sched *s, const struct seq *q, int64_t j)
{
	const int64_t n_out = q->n_tokens - q->n_prompt;
	return (!q->max_tokens || n_out + j + 2 <= q->max_tokens) && q->n_tokens + j + 2 <= s->limit;
}

/* The drafts to verify: rows at tokens[n_tokens + j] for the first v drafts whose tokens could
 * be used and that the budget, token slots and pages allow without preempting anyone; the rest
 * are dropped. Returns v. */
static int draft_rows(struct sched *s, struct seq *q, int64_t budget)
{
	int v = q->n_draft;
	while (v > 0 && (!draft_usable(s, q, v - 1) || v + 1 > budget))
		v--;
	while (v > 0 && (seq_room(q, v) < 0 || kv_pages_reserve(&s->kp, &q->kv, q->n_computed + 1 + v) < 0))
		v--;
	for (int j = 0; j < v; j++)
		q->tokens[q->n_tokens + j] = q->draft[j];
	q->n_draft = 0;
	return v;
}

/* Decodes: one token each (and the drafts to verify), admission order; a missing page
 * preempts the newest running. */
static int64_t schedule_decodes(struct sched *s, int64_t budget)
{
	for (int64_t i = 0; i < s->n_running && budget > 0; i++) {
		struct seq *q = s->running[i];
		if (q->n_tokens - q->n_computed != 1)
			continue;
		const int v = draft_rows(s, q, budget);
		if (v) {
			add_rows(s, q, 1 + v, 1);
			q->verify = v;
			budget -= 1 + v;
			continue;
		}
		int self = 0;
		while (kv_pages_reserve(&s->kp, &q->kv, q->n_computed + 1) < 0) {
			struct seq *v = s->running[s->n_running - 1];
			self = v == q;
			preempt(s, v); /* v comes after q: it has no rows yet */
			if (self)
				break;
		}
		if (self)
			break; /* q was the newest: nothing after it */
		add_rows(s, q, 1, 1);
		budget--;
	}
	return budget;
}

/* Pages for positions [0, q->n_computed + n); returns the n that fits (0: none). Preempts
 * newer sequences without rows in this step; otherwise shrinks n. */
static int64_t fit_chunk(struct sched *s, struct seq *q, int64_t n)
{
	while (kv_pages_reserve(&s->kp, &q->kv, q->n_computed + n) < 0) {
		struct seq *v = s->running[s->n_running - 1];
		if (v != q && v->rows == 0) {
			preempt(s, v);
			continue;
		}
		int64_t fit = (q->kv.n_blocks + kv_pages_available(&s->kp)) * KV_PAGE_TOKENS -
			      q->n_computed;
		if (fit <= 0 || fit >= n)
			return 0; /* no page at all, or the block table could not grow */
		n = fit;
	}
	return n;
}

static int64_t schedule_prefills(struct sched *s, int64_t budget)
{
	for (int64_t i = 0; i < s->n_running && budget > 0; i++) {
		struct seq *q = s->running[i];
		int64_t rem = q->n_tokens - q->n_computed;
		if (q->rows || rem <= 1)
			continue;
		int64_t n = fit_chunk(s, q, rem < budget ? rem : budget);
		if (n > 0) {
			add_rows(s, q, n, 0);
			budget -= n;
		}
	}
	/* Waiting requests, strict arrival order. */
	while (s->n_waiting > 0 && budget > 0 && s->n_running < s->cfg.max_seqs) {
		struct seq *q = s->waiting[0];
		int64_t hit = 0, hit_cached = 0;
		if (s->cfg.prefix_cache)
			kv_pages_peek(&s->kp, q->kv.uid, q->tokens, q->n_tokens, &hit, &hit_cached);
		int64_t start = hit * KV_PAGE_TOKENS, rem = q->n_tokens - start;
		int64_t n = rem < budget ? rem : budget;
		int64_t avail = kv_pages_available(&s->kp) - hit_cached;
		int64_t fit = (hit + avail) * KV_PAGE_TOKENS - start;
		if (fit <= 0)
			break; /* the head waits for pages; later arrivals wait behind it */
		n = fit < n ? fit : n;
		if (s->cfg.prefix_cache) {
			int64_t got = kv_pages_match(&s->kp, &q->kv, q->tokens, q->n_tokens);
			if (got < 0)
				break;
			ASSERT(got == start);
		}
		if (kv_pages_reserve(&s->kp, &q->kv, start + n) < 0) {
			kv_pages_release(&s->kp, &q->kv);
			break;
		}
		memmove(s->waiting, s->waiting + 1, (size_t)(s->n_waiting - 1) * sizeof *s->waiting);
		s->n_waiting--;
		q->state = SEQ_RUNNING;
		q->n_computed = q->n_mtp = start; /* a hit's MTP slots are its publisher's (sched.h) */
		if (!q->admitted_once) {
			q->n_prompt_cached = start;
			q->admitted_once = 1;
			q->t_admitted_ns = clock_mono_ns();
		}
		s->running[s->n_running++] = q;
		add_rows(s, q, n, 0);
		budget -= n;
	}
	return budget;
}

/* ---- postprocess -------------------------------------------------------------------------- */

/* Feeds text to q's stop-string matcher; what is safe to stream becomes the text of the event
 * just created. Returns 1 if a stop string matched (the text before it was released). */
static int stop_scan(struct sched *s, struct seq *q, const char *p, size_t n, int final)
{
	size_t off = s->text.len;
	int hit = stopstr_feed(&q->stop, p, n, final, &s->text);
	ASSERT(!s->text.oom);
	if (s->text.len > off) {
		s->ev_text[s->n_ev - 1] = off;
		s->ev[s->n_ev - 1].text_len = s->text.len - off;
	}
	return hit;
}

static void finish(struct sched *s, struct seq *q, enum sched_finish reason, int flush)
{
	struct sched_event *ev = ev_new(s, SCHED_EVENT_FINISH, q->id);
	ev->reason = reason;
	ev->n_prompt = q->n_prompt;
	ev->n_output = q->n_tokens - q->n_prompt;
	ev->n_prompt_cached = q->n_prompt_cached;
	ev->t_admitted_ns = q->t_admitted_ns;
	if (flush && s->cfg.tok) {
		s->piece.len = 0;
		detok_flush(&q->dt, &s->piece);
		stop_scan(s, q, s->piece.p, s->piece.len, 1);
	}
	q->rows = 0;
	seq_drop(s, q);
}

static int is_stop_id(const struct seq *q, int32_t t)
{
	for (int i = 0; i < q->n_stop_ids; i++)
		if (q->stop_ids[i] == t)
			return 1;
	return 0;
}

/* One sampled token of q: stop checks, append, events. 1 if q lives on, 0 if it was freed. */
static int accept_token(struct sched *s, struct seq *q, const struct sampler_out *o)
{
	int32_t t = o->token;
	if (t == s->eos && !q->ignore_eos) {
		finish(s, q, SCHED_FINISH_EOS, 1);
		return 0;
	}
	if (is_stop_id(q, t)) {
		finish(s, q, SCHED_FINISH_STOP, 1);
		return 0;
	}
	if (seq_append(q, t) < 0) {
		struct sched_event *ev = ev_new(s, SCHED_EVENT_ERROR, q->id);
		ev->error = -ENOMEM;
		ev->msg = "out of memory";
		q->rows = 0;
		seq_drop(s, q);
		return 0;
	}
	struct sched_event *ev = ev_new(s, SCHED_EVENT_TOKEN, q->id);
	ev->seq = q->n_emitted++;
	ev->token = t;
	ev->logprob = o->logprob;
	ev->n_top = o->n_top;
	if (o->n_top) {
		memcpy(ev->top_ids, o->top_ids, (size_t)o->n_top * sizeof *o->top_ids);
		memcpy(ev->top_logprobs, o->top_logprobs, (size_t)o->n_top * sizeof(float));
	}
	int stopped = 0;
	if (s->cfg.tok) {
		s->piece.len = 0;
		if (detok_push(&q->dt, t, &s->piece) < 0)
			s->piece.len = 0; /* an id the tokenizer does not know: no text */
		stopped = stop_scan(s, q, s->piece.p, s->piece.len, 0);
	}
	int64_t n_out = q->n_tokens - q->n_prompt;
	if (stopped)
		finish(s, q, SCHED_FINISH_STOP, 0);
	else if (q->max_tokens && n_out >= q->max_tokens)
		finish(s, q, SCHED_FINISH_LENGTH, 1);
	else if (q->n_tokens >= s->limit)
		finish(s, q, SCHED_FINISH_CONTEXT_LIMIT, 1);
	else
		return 1;
	return 0;
}

/* A draw that failed (sampler_sample's rc): the request ends with an ERROR event. */
static void draw_failed(struct sched *s, struct seq *q, int rc)
{
	struct sched_event *ev = ev_new(s, SCHED_EVENT_ERROR, q->id);
	ev->error = rc;
	ev->msg = rc == -EDOM ? "engine fault: the logits hold NaN or no finite value"
			      : "engine fault: a token of the history is out of range";
	q->rows = 0;
	seq_drop(s, q);
}

/* The draft: the MTP logits' argmax, ties to the lower id (a NaN never wins; a draft only
 * decides how many tokens a step gives, never which). */
static int32_t draft_of(const float *x, int64_t n)
{
	int64_t best = 0;
	for (int64_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return (int32_t)best;
}

/* 1 when the backend draws tokens itself (backend_step_draw) and the scheduler lets it. */
static int backend_draws(const struct sched *s)
{
	return s->b->step_draw && !s->cfg.host_sampling;
}

/* Where sequence n of an MTP step drafts (want: it does): a greedy draw by the backend while it
 * has draws left (draw[n], counted in *n_dev; returns NULL: no logits row here), else its row of
 * s->logits (counted in *n_logits; returned); NULL when it does not draft. */
static float *mtp_draft_at(struct sched *s, int64_t n, int want, int64_t *n_dev, int64_t *n_logits)
{
	const int dev = want && backend_draws(s) && *n_dev < s->b->sample_rows;
	s->draw[n] = (struct backend_sample){.p = &s->greedy};
	s->drawp[n] = dev ? &s->draw[n] : NULL;
	*n_dev += dev;
	if (!want || dev)
		return NULL;
	return s->logits + (*n_logits)++ * s->vocab;
}

/* Runs the MTP step of bseq[0, n) (n_dev of them drawn by the backend), then each drafting
 * sequence's draft (at[k] >= 0: sequence s->sched[at[k]] drafts its draft d): the backend's
 * greedy draw, or the argmax of its logits row (in order). The backend's rc. */
static int mtp_run(struct sched *s, int64_t n, int64_t n_dev, const int64_t *at, int d)
{
	struct backend_step st = {.mtp = 1, .n_seqs = n, .seqs = s->bseq};
	int rc = n_dev ? backend_step_draw(s->b, &st, s->drawp) : backend_step(s->b, &st);
	if (rc < 0)
		return rc;
	for (int64_t k = 0, l = 0; k < n; k++) {
		if (at[k] < 0)
			continue;
		struct seq *q = s->sched[at[k]];
		int32_t t = s->drawp[k] ? (s->draw[k].rc ? -1 : s->draw[k].out.token) /* (NaN: none) */
					: draft_of(s->logits + l++ * s->vocab, s->vocab);
		if (t >= 0)
			q->draft[d] = t, q->n_draft = d + 1;
	}
	return 0;
}

/* mtp_draft > 1: the drafts after the first, one MTP step a depth d: the MTP layer on its own
 * output (s->mtp_h) at position n_computed + d - 1 of each of s->sched[0, n) that drafted d
 * tokens so far and whose next draft could be used, token draft d - 1 (sched.h). The
 * backend's rc. */
static int mtp_chain(struct sched *s, int64_t n)
{
	const int K = s->cfg.mtp_draft;
	const int64_t D = s->b->c->hidden_size;
	for (int d = 1; d < K; d++) {
		int64_t m = 0, n_logits = 0, n_dev = 0;
		for (int64_t k = 0; k < n; k++) {
			struct seq *q = s->sched[k];
			const int64_t p = q->n_computed + d - 1;
			if (q->n_draft != d || !draft_usable(s, q, d) ||
			    kv_pages_reserve(&s->kp, &q->kv, p + 1) < 0)
				continue;
			s->pos[m] = p;
			s->flags[m] = BACKEND_ROW_LOGITS | (d + 1 < K ? BACKEND_ROW_HIDDEN : 0);
			s->bseq[m] = (struct backend_seq){
				.n = 1, .tokens = &q->draft[d - 1], .pos = &s->pos[m],
				.block_table = q->kv.bt, .n_blocks = q->kv.n_blocks, .flags = &s->flags[m],
				.logits = mtp_draft_at(s, m, 1, &n_dev, &n_logits),
				.hidden = s->mtp_h[d & 1] + k * D, .mtp_hidden = s->mtp_h[(d - 1) & 1] + k * D};
			s->chain[m++] = k;
		}
		if (!m)
			break;
		int rc = mtp_run(s, m, n_dev, s->chain, d);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* mtp_draft: the MTP layer at the positions the main step committed, [n_mtp, n_computed) of
 * each scheduled sequence still live (s->sched[k] not NULL; the list is compacted to those it
 * runs), h_i from the rows the main step kept (backend.h) and x_{i+1} from its tokens, and the
 * first drafts of those that drew a token (drawn greedily by the backend where it draws), then
 * the later drafts (mtp_chain). The backend's rc. */
static int mtp_step(struct sched *s)
{
	const int K = s->cfg.mtp_draft;
	const int64_t D = s->b->c->hidden_size;
	int64_t n = 0, row = 0, n_logits = 0, n_dev = 0;
	for (int64_t k = 0; k < s->n_sched; k++) {
		struct seq *q = s->sched[k];
		if (!q || q->n_computed == q->n_mtp)
			continue;
		/* the rows are this step's: kept from row0 on (every row of the step was kept) */
		ASSERT(q->n_mtp == q->pos0 && q->n_tokens > q->n_computed);
		int64_t m = q->n_computed - q->n_mtp;
		int want = q->n_tokens - q->n_computed == 1; /* a drawn token: draft the next */
		for (int64_t j = 0; j < m; j++) {
			s->pos[row + j] = q->n_mtp + j;
			s->flags[row + j] = 0;
		}
		if (want) /* (and its output, the next depth's h) */
			s->flags[row + m - 1] = BACKEND_ROW_LOGITS | (K > 1 ? BACKEND_ROW_HIDDEN : 0);
		s->bseq[n] = (struct backend_seq){
			.n = m, .tokens = q->tokens + q->n_mtp + 1, .pos = s->pos + row,
			.block_table = q->kv.bt, .n_blocks = q->kv.n_blocks, .flags = s->flags + row,
			.logits = mtp_draft_at(s, n, want, &n_dev, &n_logits),
			.hidden = want && K > 1 ? s->mtp_h[0] + n * D : NULL,
			.mtp_hidden = NULL, .mtp_kept = q->row0};
		s->chain[n] = want ? n : -1; /* (the sequences that draft) */
		s->sched[n++] = q;
		row += m;
		q->n_mtp = q->n_computed;
		q->n_draft = 0;
	}
	if (!n)
		return 0;
	int rc = mtp_run(s, n, n_dev, s->chain, 0);
	return rc < 0 || K == 1 ? rc : mtp_chain(s, n);
}

/* ---- the step ----------------------------------------------------------------------------- */

int sched_step(struct sched *s, const struct sched_event **evp, int64_t *np)
{
	double t0 = now_s(s);
	s->n_ev = 0;
	s->text.len = 0;
	for (int64_t i = 0; i < s->n_pend; i++)
		*ev_new(s, s->pend[i].type, s->pend[i].id) = s->pend[i];
	s->n_pend = 0;
	int rc = 0;

	/* schedule */
	s->n_sched = 0;
	int64_t budget = schedule_decodes(s, s->cfg.max_batch_tokens);
	schedule_prefills(s, budget);

	/* run; the backend draws a finished row's token itself where it can (backend_step_draw,
	 * not host_sampling; up to sample_rows a step, the histories of those with a penalty up to
	 * hist_ids ids): that row's logits then never leave it; the others come back and are
	 * drawn here */
	double t1 = t0, t2 = t0;
	int64_t row = 0, n_logits = 0, n_dev = 0, n_hist = 0;
	const int can = backend_draws(s);
	/* mtp_draft: every row's final hidden state kept in the backend, the MTP step's input */
	const uint8_t row_flags = s->cfg.mtp_draft ? BACKEND_ROW_KEEP : 0;
	if (s->n_sched > 0) {
		for (int64_t k = 0; k < s->n_sched; k++) {
			struct seq *q = s->sched[k];
			struct backend_seq *bs = &s->bseq[k];
			int sample = q->sample = q->n_computed + q->rows - q->verify == q->n_tokens;
			const int64_t hist = sampler_params_penalised(&q->sp) ? q->n_tokens : 0;
			/* a verification: 1 + v draws, each one's history one longer (a draft) */
			const int64_t v = q->verify, nd = 1 + v;
			const int64_t hists = hist ? nd * hist + v * (v + 1) / 2 : 0;
			int dev = sample && can && n_dev + nd <= s->b->sample_rows &&
				  n_hist + hists <= s->b->hist_ids;
			for (int64_t j = 0; j < q->rows; j++) {
				s->pos[row + j] = q->n_computed + j;
				s->flags[row + j] = row_flags;
			}
			/* the last row, and with drafts the drawn token's row and theirs: each row's
			 * draw decides the next draft's */
			for (int64_t j = q->rows - 1 - v; sample && j < q->rows; j++)
				s->flags[row + j] |= BACKEND_ROW_LOGITS;
			q->row0 = row;
			q->pos0 = q->n_computed;
			bs->n = q->rows;
			bs->tokens = q->tokens + q->n_computed;
			bs->pos = s->pos + row;
			bs->block_table = q->kv.bt;
			bs->n_blocks = q->kv.n_blocks;
			bs->flags = s->flags + row;
			bs->logits = sample && !dev ? s->logits + n_logits * s->vocab : NULL;
			bs->hidden = NULL;
			bs->mtp_hidden = NULL;
			s->drawp[k] = dev ? &s->draw[k] : NULL;
			s->draw[k] = (struct backend_sample){
				.p = &q->sp, .index = (uint64_t)(q->n_tokens - q->n_prompt),
				.prompt = q->tokens, .n_prompt = q->n_prompt,
				.output = q->tokens + q->n_prompt, .n_output = q->n_tokens - q->n_prompt};
			/* draft j's row: index and history j + 1 further (the chain by the backend) */
			for (int64_t j = 0, K = s->cfg.mtp_draft; j < v; j++) {
				struct backend_sample *d2 = &s->draw2[k * K + j];
				*d2 = s->draw[k];
				d2->row2 = NULL;
				d2->n_output += j + 1;
				d2->index += (uint64_t)(j + 1);
				if (dev)
					(j ? &s->draw2[k * K + j - 1] : &s->draw[k])->row2 = d2;
			}
			row += q->rows;
			n_logits += sample && !dev ? nd : 0;
			n_dev += dev ? nd : 0;
			n_hist += dev ? hists : 0;
		}
		struct backend_step st = {.mtp = 0, .n_seqs = s->n_sched, .seqs = s->bseq};
		t1 = now_s(s);
		rc = n_dev ? backend_step_draw(s->b, &st, s->drawp) : backend_step(s->b, &st);
		t2 = now_s(s);
		if (rc < 0) {
			for (int64_t k = 0; k < s->n_sched; k++)
				s->sched[k]->rows = 0;
			goto out;
		}
	}

	/* postprocess: progress and publication, then sampling, then stop checks */
	/* (a draft's row counts once its token is drawn equal to it, below) */
	for (int64_t k = 0; k < s->n_sched; k++) {
		struct seq *q = s->sched[k];
		q->n_computed += q->rows - q->verify;
		if (q->decode)
			s->decode_tokens += (uint64_t)(q->rows - q->verify);
		else
			s->prefill_tokens += (uint64_t)q->rows;
		if (s->cfg.prefix_cache)
			kv_pages_publish(&s->kp, &q->kv, q->tokens, q->n_computed);
	}
	double t3 = now_s(s);
	for (int64_t k = 0, l = 0; k < s->n_sched; k++) {
		struct seq *q = s->sched[k];
		if (!q->sample)
			continue;
		const int host = !s->drawp[k]; /* else the backend drew every row */
		struct backend_sample *d = &s->draw[k];
		struct backend_sample *d2 = q->verify ? s->draw2 + k * s->cfg.mtp_draft : NULL;
		if (host)
			d->rc = sampler_sample(&s->smp, &q->sp, s->logits + l * s->vocab, d->prompt,
					       d->n_prompt, d->output, d->n_output, d->index, &d->out);
		/* draft j is accepted when the row before it drew it: its row is that token's own,
		 * its K/V stand, and its logits draw the next token (draw2[j]) */
		for (int j = 0; j < q->verify; j++) {
			const struct backend_sample *prev = j ? &d2[j - 1] : d;
			if (prev->rc || prev->out.token != q->tokens[q->n_tokens + j])
				break;
			if (host)
				d2[j].rc = sampler_sample(&s->smp, &q->sp, s->logits + (l + 1 + j) * s->vocab,
							  d2[j].prompt, d2[j].n_prompt, d2[j].output,
							  d2[j].n_output, d2[j].index, &d2[j].out);
			q->accepted++;
		}
		q->n_computed += q->accepted;
		l += host ? 1 + q->verify : 0;
	}
	double t4 = now_s(s);
	for (int64_t k = 0; k < s->n_sched; k++) {
		struct seq *q = s->sched[k];
		const int accepted = q->accepted;
		q->rows = 0;
		q->n_draft = 0;
		if (!q->sample)
			continue;
		s->sched[k] = NULL; /* unless it lives on, below */
		if (s->draw[k].rc < 0) {
			draw_failed(s, q, s->draw[k].rc);
			continue;
		}
		s->drafts += (uint64_t)q->verify;
		s->drafts_accepted += (uint64_t)accepted;
		s->decode_tokens += (uint64_t)accepted;
		int live = accept_token(s, q, &s->draw[k].out);
		for (int j = 0; live && j < accepted; j++) { /* one token more an accepted draft */
			const struct backend_sample *d2 = &s->draw2[k * s->cfg.mtp_draft + j];
			if (d2->rc < 0) {
				draw_failed(s, q, d2->rc);
				live = 0;
			} else {
				live = accept_token(s, q, &d2->out);
			}
		}
		if (live)
			s->sched[k] = q;
	}
	s->t_sample += t4 - t3;
	if (s->cfg.mtp_draft) { /* the main step's tokens are committed: a failure here is a
				 * fault with its events made (sched.h) */
		double t5 = now_s(s);
		rc = mtp_step(s);
		t2 += now_s(s) - t5;
	}
out:;
	if (s->n_sched > 0) { /* steps that only deliver cancel events are not counted */
		double t5 = now_s(s);
		s->steps++;
		s->last_step = t5 - t0;
		s->t_step += t5 - t0;
		s->t_backend += t2 - t1;
	}
	for (int64_t i = 0; i < s->n_ev; i++)
		s->ev[i].text = s->ev_text[i] == SIZE_MAX ? "" : s->text.p + s->ev_text[i];
	*evp = s->ev;
	*np = s->n_ev;
	return rc;
}

/* ---- stats -------------------------------------------------------------------------------- */

void sched_stats(const struct sched *s, struct sched_stats *st)
{
	memset(st, 0, sizeof *st);
	st->running = s->n_running;
	st->waiting = s->n_waiting;
	st->pages_total = s->kp.n_pages;
	st->pages_used = kv_pages_used(&s->kp);
	st->pages_free = s->kp.n_free;
	st->pages_cached = s->kp.n_cached;
	st->prefix_lookup_pages = s->kp.n_lookup_pages;
	st->prefix_hit_pages = s->kp.n_hit_pages;
	st->prefix_hit_rate = s->kp.n_lookup_pages
				      ? (double)s->kp.n_hit_pages / (double)s->kp.n_lookup_pages
				      : 0.0;
	st->prefill_tokens = s->prefill_tokens;
	st->decode_tokens = s->decode_tokens;
	if (s->t_step > 0) {
		st->prefill_tok_s = (double)s->prefill_tokens / s->t_step;
		st->decode_tok_s = (double)s->decode_tokens / s->t_step;
	}
	st->preemptions = s->preemptions;
	st->steps = s->steps;
	st->requests_added = s->added;
	st->requests_finished = s->finished;
	st->last_step_us = s->last_step * 1e6;
	if (s->steps) {
		double n = (double)s->steps;
		st->avg_step_us = s->t_step / n * 1e6;
		st->avg_backend_us = s->t_backend / n * 1e6;
		st->avg_sample_us = s->t_sample / n * 1e6;
		st->avg_sched_us = (s->t_step - s->t_backend - s->t_sample) / n * 1e6;
	}
	st->context_limit = s->limit;
	st->drafts = s->drafts;
	st->drafts_accepted = s->drafts_accepted;
	st->draft_accept_rate = s->drafts ? (double)s->drafts_accepted / (double)s->drafts : 0.0;
}

const struct kv_pages *sched_pages(const struct sched *s) { return &s->kp; }

int64_t sched_kv_seqs(const struct sched *s, const struct kv_seq **out, int64_t max)
{
	int64_t n = 0;
	for (int64_t i = 0; i < s->n_running && n < max; i++)
		out[n++] = &s->running[i]->kv;
	for (int64_t i = 0; i < s->n_waiting && n < max; i++)
		out[n++] = &s->waiting[i]->kv;
	return s->n_running + s->n_waiting;
}
