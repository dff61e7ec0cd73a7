/*
 * sched.h — the serving core: continuous batching over a backend (model/backend.h), with paged
 * KV (model/kv_pages.h), prefix caching, chunked prefill, preemption by recomputation, sampling
 * (model/sampler.h) and stop conditions with streaming text (model/detok.h).
 *
 * Owns: requests from admission to their one terminal event; what each step computes; the
 * page accounting behind it; the events the serving loop forwards to clients; the counters of
 * the stats call. Must not: call the driver or touch page contents (the backend does), block,
 * or know about clients beyond their identity (uid) and request ids. Single-threaded: one
 * engine thread calls every function.
 *
 * The serving loop:
 *     sched_init(&s, backend, &cfg, &e);
 *     loop: sched_add(s, &req, &e) for new requests (typed error = reject that request),
 *           sched_cancel(s, id) for cancels and dead clients,
 *           if (sched_has_work(s)) sched_step(s, &ev, &n) and forward ev[0..n),
 *           sched_stats(s, &st) on demand;
 *     a negative sched_step return is an engine fault: sched_fail_all(s, rc, msg), exit.
 *
 * One step = schedule -> run -> postprocess:
 *  schedule  Decodes first: every running sequence with exactly one uncomputed token, in
 *            admission order, while the token budget (max_batch_tokens) lasts. A decode that
 *            needs a page and finds none preempts the most recently admitted running sequence
 *            (possibly itself): its pages are released (full pages stay in the prefix cache)
 *            and it goes back to the waiting queue, keeping prompt + tokens generated so far,
 *            to be recomputed when readmitted (usually from its own cached pages).
 *            Then prefills in arrival order with chunking: running sequences with more than
 *            one uncomputed token (admission order) get min(remaining, budget left) tokens,
 *            preempting later-admitted sequences that have no rows in this step or else
 *            shrinking the chunk to the pages available; then waiting requests in arrival
 *            order (strict FCFS: the head blocks the rest, so nobody starves) while the
 *            budget lasts and fewer than max_seqs run. Admission takes the verified prefix-cache
 *            hit, then pages for its first chunk from free or evictable pages only (admission
 *            never preempts).
 *  run       one backend_step with a row per scheduled token; logits only for rows that
 *            finish their sequence's uncomputed tokens. When the backend draws tokens itself
 *            (backend_step_draw: the CUDA backend, beside the logits), it draws the finished
 *            rows, up to its sample_rows (and hist_ids ids of history for those with a
 *            penalty), and those logits never come back; the others are drawn here
 *            (sampler_sample).
 *  post      full pages are published to the prefix cache; each finished row is sampled
 *            (sampler index = the request's output count, so preemption and batching do not
 *            change a seeded request's tokens), stop conditions are checked and events emitted.
 * MTP drafting (mtp_draft = K, 1..SCHED_MAX_DRAFTS; 0, off, by default): speculative decoding
 *            with the checkpoint's MTP layer (spec §4), up to K drafted tokens a sequence a
 *            step. After the main step and its draws, one MTP step (backend.h) writes the MTP
 *            layer's K/V at every position the main step has just committed (token x_{i+1}
 *            and the main model's final hidden state h_i, which the main step keeps in the
 *            backend for every row: its kept rows, backend.h, so on the GPU h_i never leaves
 *            the device); its logits at a sequence's last position give the first draft, their
 *            argmax (ties to the lower id; a greedy draw by the backend where it draws), for
 *            the token after the one just drawn. With K > 1 the MTP layer then runs again on
 *            its own output, one row a sequence a step: draft j as the token, the MTP block's
 *            output of the step before (backend_seq.hidden of an MTP step) as h, at the next
 *            position, giving draft j + 1 (those MTP-layer slots are rewritten once the main
 *            model has computed their positions). The next decode of that sequence has 1 + v
 *            rows (v <= K drafts that max_tokens, the context limit, the budget and the pages
 *            allow), the drawn token and the drafts, each with logits; draft j is accepted only
 *            if the drafts before it were and the token drawn from the row before it (the
 *            request's own sampler at its own index: greedy, seeded or not; index and history
 *            one further a row) is draft j itself, and each accepted draft's row gives one
 *            more token in the same step. So a request's tokens are exactly those of
 *            mtp_draft = 0 on a batch-invariant backend (the CPU backend, the CUDA backend's
 *            batch_invariant mode); the drafts only decide how many come per step. A rejected
 *            draft's K/V at its position is overwritten by a later step's row there. A
 *            verification's rows are drawn together (the rows after a rejection are drawn and
 *            dropped), by the backend where they all fit its sample_rows and hist_ids, else
 *            here. A prefix-cache hit's MTP-layer slots are those its publisher wrote (the same
 *            tokens, but the slot of the hit's last position saw the publisher's next token or
 *            draft, and a publisher that ended before its MTP step left its last slots
 *            unwritten): they shape later drafts, never tokens (model/kv_pages.h).
 * Deadlock freedom: the context limit is capped at n_pages * 64 tokens and a request whose
 * prompt reaches it is refused at sched_add (-E2BIG), so one sequence always fits once every
 * later-admitted one is preempted; the oldest running sequence is never preempted by a newer
 * one, so it always progresses.
 *
 * Stop conditions, checked on each sampled token in this order:
 *   eos_token_id (unless ignore_eos): FINISH eos; the EOS token is not emitted as a TOKEN;
 *   a stop token id: FINISH stop, the id is not emitted;
 *   otherwise the token is appended and emitted (TOKEN, with the text it releases); then
 *   a stop string in the text: FINISH stop; the TOKEN's text ends before the stop string, which
 *     is never sent (OpenAI semantics). Text that could be the start of a stop string is held
 *     back, so nothing is streamed and then retracted; a stop string split across tokens is
 *     found;
 *   max_tokens output tokens: FINISH length;
 *   prompt + output = context limit: FINISH context_limit.
 * At a finish other than a stop string, text held back (an incomplete character becomes
 * U+FFFD, a partial stop string is released) rides on the FINISH event. Token ids the
 * tokenizer does not know (vocab padding) produce no text.
 *
 * Events of one request: TOKEN events with seq = 0, 1, 2, ... then exactly one FINISH or
 * ERROR. A cancelled request gets FINISH cancelled (delivered by the next sched_step) and
 * nothing after it.
 */
#ifndef DSV32_SCHED_H
#define DSV32_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/detok.h"
#include "model/err.h"
#include "model/json.h"
#include "model/kv_pages.h"
#include "model/sampler.h"
#include "model/stopstr.h"
#include "model/tokenizer.h"

#define SCHED_MAX_STOP_STRINGS 16
#define SCHED_MAX_STOP_LEN 256    /* bytes */
#define SCHED_MAX_STOP_IDS 64
#define SCHED_MAX_DRAFTS 4        /* sched_config.mtp_draft: drafts a sequence a step */

struct sched_config {
	int64_t max_batch_tokens; /* rows per step (decode + prefill), >= max_seqs */
	int64_t max_seqs;         /* running sequences, >= 1 (so every one decodes each step) */
	int64_t max_context;      /* prompt + output tokens; 0 = max_position_embeddings. The
				   * effective limit is also capped at n_pages * 64. */
	int64_t max_waiting;      /* queued (not running) requests; 0 = no limit */
	int prefix_cache;         /* 1 = reuse verified cached pages */
	uint64_t seed;            /* unseeded requests get seeds derived from this */
	const struct tokenizer *tok; /* text of events and stop strings; NULL = no text */
	unsigned detok_flags;     /* 0 or TOKENIZER_SKIP_SPECIAL */
	int cpu_clock;            /* step timings in this thread's CPU time instead of wall time
				   * (benchmarks on shared machines) */
	int host_sampling;        /* 1: every token drawn here from downloaded logits, even where
				   * the backend could draw it (backend_step_draw); the tokens are
				   * the same either way (one sampling function, model/sampler.h) */
	int mtp_draft;            /* K > 0: speculative decoding with the MTP layer, up to K drafts
				   * a sequence a step (above; K <= SCHED_MAX_DRAFTS); the backend
				   * must have it (-EINVAL otherwise) */
};

struct sched_str {
	const char *p;
	size_t n;
};

/* A request; sched_add copies everything it points to. */
struct sched_request {
	uint64_t id;              /* unique among live requests */
	uint32_t uid;             /* client identity (keys the prefix cache) */
	const int32_t *prompt;    /* [n_prompt] ids in [0, vocab_size) */
	int64_t n_prompt;         /* >= 1 */
	struct sampler_params sampling;
	int seeded;               /* 0: sampling.seed is ignored and one is derived */
	int64_t max_tokens;       /* output tokens; 0 = up to the context limit */
	const int32_t *stop_ids;  /* [n_stop_ids] */
	int n_stop_ids;
	const struct sched_str *stop; /* [n_stop] non-empty valid UTF-8 */
	int n_stop;
	int ignore_eos;
};

enum sched_event_type {
	SCHED_EVENT_TOKEN,
	SCHED_EVENT_FINISH,
	SCHED_EVENT_ERROR,
};

enum sched_finish {
	SCHED_FINISH_STOP,
	SCHED_FINISH_LENGTH,
	SCHED_FINISH_EOS,
	SCHED_FINISH_CANCELLED,
	SCHED_FINISH_CONTEXT_LIMIT,
};

struct sched_event {
	enum sched_event_type type;
	uint64_t id;              /* request id */
	/* TOKEN */
	int64_t seq;              /* 0, 1, 2, ... per request */
	int32_t token;
	float logprob;            /* if logprobs */
	int n_top;                /* top_logprobs alternatives */
	int32_t top_ids[SAMPLER_MAX_LOGPROBS];
	float top_logprobs[SAMPLER_MAX_LOGPROBS];
	/* TOKEN and FINISH: UTF-8 text released now (possibly empty), valid until the next
	 * sched_step */
	const char *text;
	size_t text_len;
	/* FINISH */
	enum sched_finish reason;
	int64_t n_prompt, n_output, n_prompt_cached; /* tokens; n_prompt_cached: from the cache */
	uint64_t t_admitted_ns;   /* CLOCK_MONOTONIC when the request first ran (0: never) */
	/* ERROR */
	int error;                /* negative errno */
	const char *msg;          /* static text */
};

struct sched_stats {
	int64_t running, waiting;
	int64_t pages_total, pages_used, pages_free, pages_cached;
	/* full prompt pages looked up at admission (readmissions after preemption included) and
	 * found; hit rate = hit / lookup */
	uint64_t prefix_lookup_pages, prefix_hit_pages;
	double prefix_hit_rate;
	uint64_t prefill_tokens, decode_tokens;  /* computed rows, all steps */
	double prefill_tok_s, decode_tok_s;      /* per second of step time */
	uint64_t preemptions, requests_added, requests_finished;
	uint64_t steps;                          /* steps that ran the backend */
	double last_step_us, avg_step_us;        /* whole step (wall, or CPU with cpu_clock) */
	double avg_sched_us;                     /* bookkeeping: step minus backend and sampling */
	double avg_backend_us, avg_sample_us;   /* sampling here (the backend's draws are in
						 * avg_backend_us) */
	int64_t context_limit;                   /* effective */
	/* mtp_draft: drafted tokens verified and accepted (one token more each) */
	uint64_t drafts, drafts_accepted;
	double draft_accept_rate;                /* accepted / verified, 0 with none */
};

const char *sched_finish_name(enum sched_finish r);

struct sched;

/* b must outlive the scheduler; its n_pages sizes the page pool. 0, or -EINVAL (e says which
 * field), -ENOMEM. */
int sched_init(struct sched **out, struct backend *b, const struct sched_config *cfg,
	       struct err *e);
void sched_free(struct sched *s);

/* Queues a request. 0, or a typed error with e naming the field: -EINVAL (bad parameter or
 * stop string), -ERANGE (a prompt or stop token id outside the vocabulary), -E2BIG (prompt
 * reaches the context limit), -EEXIST (id live), -EAGAIN (waiting queue full), -ENOMEM.
 * Nothing is kept on error. */
int sched_add(struct sched *s, const struct sched_request *r, struct err *e);
/* Ends a live request now and frees its pages: 0 (its FINISH cancelled comes with the next
 * sched_step's events) or -ENOENT. */
int sched_cancel(struct sched *s, uint64_t id);
/* 1 if a step would do anything (running, waiting or undelivered events). */
int sched_has_work(const struct sched *s);
/* One step. *ev / *n: the events, first those of cancels and fail_all since the last step
 * (valid until the next sched_step; sched_add, sched_cancel and sched_fail_all may be called
 * while walking them). 0, or the
 * backend's negative errno (engine fault: nothing of the step is committed, except where the
 * MTP step of mtp_draft fails after the main step's tokens were committed and their events
 * made; the events so far are still returned). A row of logits with a NaN ends that request
 * with ERROR -EDOM. */
int sched_step(struct sched *s, const struct sched_event **ev, int64_t *n);
/* Ends every live request with an ERROR event (code, msg) and frees it; the events come with
 * the next sched_step (which then has no work). For engine faults and shutdown. */
void sched_fail_all(struct sched *s, int code, const char *msg);
void sched_stats(const struct sched *s, struct sched_stats *st);

/* For tests: the page manager and the live sequences' block tables (running first). */
const struct kv_pages *sched_pages(const struct sched *s);
int64_t sched_kv_seqs(const struct sched *s, const struct kv_seq **out, int64_t max);

#endif
