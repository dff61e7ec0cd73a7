/*
 * serve.c — the serving loop's bridge between IPC and the scheduler (see serve.h).
 */
#include "boot/serve.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/clock.h"

void serve_init(struct serve *sv, struct engine *en, struct ipc_server *ipc,
		const struct dsv32d_conf *conf)
{
	memset(sv, 0, sizeof *sv);
	sv->en = en;
	sv->ipc = ipc;
	sv->conf = conf;
	sv->next_sid = 1;
	/* Test hook (tests/test_daemon.c): make the Nth engine step fail as a sticky GPU error
	 * would, to check that every request ends with engine_fault and the daemon exits 1. */
	const char *f = getenv("DSV32D_TEST_FAULT_AT_STEP");
	sv->fault_at_step = f ? strtoull(f, NULL, 10) : 0;
}

void serve_free(struct serve *sv)
{
	free(sv->live);
	memset(sv, 0, sizeof *sv);
}

/* ---- the live-request table (small: bounded by max-inflight) ------------------------------ */

static struct serve_req *find_sid(struct serve *sv, uint64_t sid)
{
	for (int64_t i = 0; i < sv->n_live; i++)
		if (sv->live[i].sid == sid)
			return &sv->live[i];
	return NULL;
}

static struct serve_req *find_client_req(struct serve *sv, uint64_t client, uint64_t req_id)
{
	for (int64_t i = 0; i < sv->n_live; i++)
		if (sv->live[i].client == client && sv->live[i].req_id == req_id)
			return &sv->live[i];
	return NULL;
}

static void drop(struct serve *sv, struct serve_req *r)
{
	*r = sv->live[--sv->n_live]; /* order does not matter */
}

static struct serve_req *add_live(struct serve *sv)
{
	if (sv->n_live == sv->cap_live) {
		int64_t cap = sv->cap_live ? sv->cap_live * 2 : 64;
		struct serve_req *l = realloc(sv->live, (size_t)cap * sizeof *l);
		if (!l)
			return NULL;
		sv->live = l;
		sv->cap_live = cap;
	}
	struct serve_req *r = &sv->live[sv->n_live++];
	memset(r, 0, sizeof *r);
	return r;
}

/* ---- requests in ------------------------------------------------------------------------- */

static void reject(struct serve *sv, const struct ipc_item *it, int code, const char *msg)
{
	sv->n_rejected++;
	ipc_server_emit_error(sv->ipc, it->client, it->req_id, code, "%s", msg);
}

/* The typed error for a scheduler or engine rejection. */
static int error_code(int r, enum dsv32_input input)
{
	switch (r) {
	case -ERANGE: return DSV32_E_BAD_TOKEN; /* a prompt or stop id outside the vocabulary */
	case -E2BIG: return DSV32_E_PROMPT_TOO_LONG;
	case -EAGAIN: return DSV32_E_QUEUE_FULL;
	case -ENOMEM: return DSV32_E_QUEUE_FULL;
	default:
		return input == DSV32_INPUT_TOKENS ? DSV32_E_BAD_TOKEN : DSV32_E_BAD_PARAM;
	}
}

static void handle_generate(struct serve *sv, const struct ipc_item *it)
{
	const struct ipc_request *q = it->req;
	const struct dsv32d_conf *cf = sv->conf;
	struct engine *en = sv->en;
	struct err e = {""};
	sv->n_requests++;
	if (q->max_tokens > (uint64_t)cf->max_new_tokens) {
		char msg[128];
		snprintf(msg, sizeof msg, "max_tokens = %u exceeds the server's limit of %lld",
			 q->max_tokens, (long long)cf->max_new_tokens);
		reject(sv, it, DSV32_E_BAD_PARAM, msg);
		return;
	}
	/* prompt ids: tokens checked against the vocabulary, chat rendered, text tokenized */
	struct tokenizer_ids ids = {0};
	enum engine_input kind = q->input == DSV32_INPUT_TOKENS ? ENGINE_INPUT_TOKENS
				 : q->input == DSV32_INPUT_CHAT	 ? ENGINE_INPUT_CHAT
									 : ENGINE_INPUT_TEXT;
	int r = engine_prompt(en, kind, q->text, q->text_len, q->tokens, q->n_tokens,
			      (q->flags & DSV32_GEN_THINKING) != 0, 0, &ids, &e);
	if (r) {
		reject(sv, it, kind == ENGINE_INPUT_TEXT ? DSV32_E_BAD_UTF8 : error_code(r, q->input),
		       e.msg);
		tokenizer_ids_free(&ids);
		return;
	}
	if ((int64_t)ids.n > cf->max_prompt_tokens) {
		char msg[128];
		snprintf(msg, sizeof msg, "the prompt has %zu tokens; the limit is %lld", ids.n,
			 (long long)cf->max_prompt_tokens);
		reject(sv, it, DSV32_E_PROMPT_TOO_LONG, msg);
		tokenizer_ids_free(&ids);
		return;
	}
	struct sched_str stop[DSV32_MAX_STOP];
	int n_stop = q->n_stop < DSV32_MAX_STOP ? (int)q->n_stop : DSV32_MAX_STOP;
	for (int i = 0; i < n_stop; i++)
		stop[i] = (struct sched_str){q->stop[i], q->stop_len[i]};
	struct sched_request rq = {
		.id = sv->next_sid,
		.uid = it->uid,
		.prompt = ids.v,
		.n_prompt = (int64_t)ids.n,
		.seeded = q->seed != 0,
		.max_tokens = q->max_tokens,
		.stop_ids = (const int32_t *)q->stop_tokens,
		.n_stop_ids = (int)q->n_stop_tokens,
		.stop = stop,
		.n_stop = n_stop,
	};
	sampler_params_default(&rq.sampling);
	rq.sampling.temperature = q->temperature;
	rq.sampling.top_k = q->top_k;
	rq.sampling.top_p = q->top_p;
	rq.sampling.min_p = q->min_p;
	rq.sampling.repetition_penalty = q->repetition_penalty;
	rq.sampling.presence_penalty = q->presence_penalty;
	rq.sampling.frequency_penalty = q->frequency_penalty;
	rq.sampling.seed = q->seed;
	/* dsv32.h: logprobs N > 0 = the chosen token's logprob and N alternatives */
	rq.sampling.logprobs = q->logprobs > 0;
	rq.sampling.top_logprobs = q->logprobs > SAMPLER_MAX_LOGPROBS ? SAMPLER_MAX_LOGPROBS
								       : (int)q->logprobs;
	struct serve_req *lr = add_live(sv);
	if (!lr) {
		reject(sv, it, DSV32_E_QUEUE_FULL, "out of memory");
		tokenizer_ids_free(&ids);
		return;
	}
	r = sched_add(en->s, &rq, &e);
	tokenizer_ids_free(&ids);
	if (r) {
		sv->n_live--; /* the slot just added */
		reject(sv, it, error_code(r, q->input), e.msg);
		return;
	}
	*lr = (struct serve_req){.sid = sv->next_sid++, .client = it->client, .req_id = it->req_id,
				 .t_submit_ns = q->t_submit_ns ? q->t_submit_ns : clock_mono_ns(),
				 .n_prompt = rq.n_prompt, .logprobs = q->logprobs > 0};
}

static void handle_stats(struct serve *sv, const struct ipc_item *it)
{
	struct sched_stats st;
	sched_stats(sv->en->s, &st);
	char buf[4096];
	int n = snprintf(buf, sizeof buf,
			 "backend %s\nbackend_mode %s\nkv_pages_total %lld\nkv_pages_used %lld\nkv_pages_free %lld\n"
			 "kv_pages_cached %lld\nkv_bytes %zu\nrunning %lld\nwaiting %lld\n"
			 "prefix_hit_rate %.4f\nprefill_tokens %llu\ndecode_tokens %llu\n"
			 "prefill_tok_s %.1f\ndecode_tok_s %.1f\npreemptions %llu\nsteps %llu\n"
			 "last_step_us %.1f\navg_step_us %.1f\ncontext_limit %lld\nlive_requests %lld\n"
			 "requests %llu\nrejected %llu\nfinished %llu\n"
			 "mtp_drafts %llu\nmtp_drafts_accepted %llu\nmtp_draft_accept_rate %.4f\n",
			 sv->en->backend_name,
			 strcmp(sv->en->backend_name, "cuda") ? "batch-invariant" : backend_cuda_mode(sv->en->be),
			 (long long)st.pages_total, (long long)st.pages_used,
			 (long long)st.pages_free, (long long)st.pages_cached, sv->en->kv_bytes,
			 (long long)st.running, (long long)st.waiting, st.prefix_hit_rate,
			 (unsigned long long)st.prefill_tokens, (unsigned long long)st.decode_tokens,
			 st.prefill_tok_s, st.decode_tok_s, (unsigned long long)st.preemptions,
			 (unsigned long long)st.steps, st.last_step_us, st.avg_step_us,
			 (long long)st.context_limit, (long long)sv->n_live,
			 (unsigned long long)sv->n_requests, (unsigned long long)sv->n_rejected,
			 (unsigned long long)sv->n_finished, (unsigned long long)st.drafts,
			 (unsigned long long)st.drafts_accepted, st.draft_accept_rate);
	if (n > 0 && (size_t)n < sizeof buf)
		n += ipc_server_format_stats(sv->ipc, buf + n, sizeof buf - (size_t)n);
	if (n < 0 || (size_t)n >= sizeof buf)
		n = (int)strlen(buf);
	ipc_server_emit_stats(sv->ipc, it->client, it->req_id, buf, (size_t)n);
}

void serve_item(struct serve *sv, const struct ipc_item *it)
{
	switch (it->type) {
	case IPC_ITEM_GENERATE:
		handle_generate(sv, it);
		ipc_request_free(it->req);
		return;
	case IPC_ITEM_CANCEL: {
		struct serve_req *r = find_client_req(sv, it->client, it->req_id);
		if (r) /* its DONE (cancelled) comes with the next step's events */
			sched_cancel(sv->en->s, r->sid);
		return;
	}
	case IPC_ITEM_STATS:
		handle_stats(sv, it);
		return;
	case IPC_ITEM_GONE: /* free everything of the client now: pages, slots */
		for (int64_t i = 0; i < sv->n_live;) {
			if (sv->live[i].client == it->client) {
				sched_cancel(sv->en->s, sv->live[i].sid);
				drop(sv, &sv->live[i]);
			} else {
				i++;
			}
		}
		return;
	}
}

/* ---- events out -------------------------------------------------------------------------- */

static uint32_t finish_reason(enum sched_finish f)
{
	switch (f) {
	case SCHED_FINISH_STOP: return DSV32_FINISH_STOP;
	case SCHED_FINISH_LENGTH: return DSV32_FINISH_LENGTH;
	case SCHED_FINISH_EOS: return DSV32_FINISH_EOS;
	case SCHED_FINISH_CANCELLED: return DSV32_FINISH_CANCELLED;
	case SCHED_FINISH_CONTEXT_LIMIT: return DSV32_FINISH_CONTEXT_LIMIT;
	}
	return DSV32_FINISH_STOP;
}

/* A client that cannot take an event any more (gone, or its completion ring full: the IPC
 * layer already ended that request with `busy`): stop computing for it. */
static void lost(struct serve *sv, struct serve_req *r)
{
	sched_cancel(sv->en->s, r->sid);
	drop(sv, r);
}

static void forward(struct serve *sv, const struct sched_event *ev)
{
	struct serve_req *r = find_sid(sv, ev->id);
	if (!r) /* a request whose client went away or was cancelled by us */
		return;
	uint64_t t = clock_mono_ns();
	int rc = 0;
	switch (ev->type) {
	case SCHED_EVENT_TOKEN: {
		uint32_t tok = (uint32_t)ev->token;
		struct dsv32_top_logprob top[SAMPLER_MAX_LOGPROBS];
		for (int k = 0; k < ev->n_top; k++)
			top[k] = (struct dsv32_top_logprob){(uint32_t)ev->top_ids[k], ev->top_logprobs[k]};
		if (!r->n_out)
			r->t_first_ns = t;
		r->n_out++;
		r->t_last_ns = t;
		rc = ipc_server_emit_token(sv->ipc, r->client, r->req_id, &tok, 1,
					   r->logprobs ? &ev->logprob : NULL,
					   ev->n_top ? top : NULL, (uint32_t)ev->n_top, ev->text,
					   (uint32_t)ev->text_len);
		break;
	}
	case SCHED_EVENT_FINISH: {
		if (ev->text_len) /* text held back until the end (a partial stop string, ...) */
			rc = ipc_server_emit_token(sv->ipc, r->client, r->req_id, NULL, 0, NULL, NULL, 0,
						   ev->text, (uint32_t)ev->text_len);
		uint64_t ttft = r->n_out ? r->t_first_ns - r->t_submit_ns : 0;
		/* queued: submission to the first step that ran it (the whole wait when it never ran) */
		uint64_t ran = ev->t_admitted_ns ? ev->t_admitted_ns : t;
		uint64_t queued = ran > r->t_submit_ns ? ran - r->t_submit_ns : 0;
		uint64_t per = r->n_out > 1 ? (r->t_last_ns - r->t_first_ns) / (uint64_t)(r->n_out - 1) : 0;
		if (!rc)
			rc = ipc_server_emit_done(sv->ipc, r->client, r->req_id, finish_reason(ev->reason),
						  (uint32_t)ev->n_prompt, (uint32_t)ev->n_output, queued, ttft,
						  per);
		sv->n_finished++;
		drop(sv, r);
		return;
	}
	case SCHED_EVENT_ERROR:
		sv->n_engine_errors++;
		ipc_server_emit_error(sv->ipc, r->client, r->req_id,
				      ev->error == -EDOM ? DSV32_E_ENGINE_FAULT : DSV32_E_BAD_PARAM, "%s",
				      ev->msg ? ev->msg : "request failed");
		drop(sv, r);
		return;
	}
	if (rc) /* -ENOTCONN (gone) or -ENOBUFS (ended with busy by the IPC layer) */
		lost(sv, r);
}

int serve_step(struct serve *sv)
{
	if (!sched_has_work(sv->en->s))
		return 0;
	const struct sched_event *ev;
	int64_t n = 0;
	if (sv->fault_at_step && ++sv->n_steps >= sv->fault_at_step)
		return -EIO;
	int r = sched_step(sv->en->s, &ev, &n);
	for (int64_t i = 0; i < n; i++)
		forward(sv, &ev[i]);
	return r;
}

void serve_fail_all(struct serve *sv, int code, const char *msg)
{
	for (int64_t i = 0; i < sv->n_live; i++)
		ipc_server_emit_error(sv->ipc, sv->live[i].client, sv->live[i].req_id, code, "%s", msg);
	sched_fail_all(sv->en->s, -ECANCELED, msg);
	const struct sched_event *ev;
	int64_t n;
	sched_step(sv->en->s, &ev, &n); /* delivers the scheduler's own ERROR events: dropped */
	sv->n_live = 0;
}
