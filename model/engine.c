/*
 * engine.c — open a model for serving, prompts from requests, warm-up (see engine.h).
 */
#include "model/engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver/cu.h"
#include "model/chat.h"
#include "model/clock.h"
#include "model/kv_cache.h"

static void progress(const struct engine_opts *o, const char *stage)
{
	if (o->progress)
		o->progress(o->progress_ctx, stage);
}

/* Pages of 64 tokens for every layer's MLA and indexer pools that fit the memory bound. */
static int64_t pages_for(const struct dsv32_config *c, const struct engine_opts *o,
			 size_t *page_bytes)
{
	int64_t layers = c->num_hidden_layers + c->num_nextn_predict_layers;
	*page_bytes = (size_t)layers * (kv_mla_page_bytes(c) + kv_index_page_bytes(c));
	if (o->kv_pages > 0)
		return o->kv_pages;
	int64_t fit = (int64_t)(((size_t)o->host_memory_mb << 20) / *page_bytes);
	return fit < ENGINE_DEFAULT_PAGES ? fit : ENGINE_DEFAULT_PAGES;
}

int engine_open(struct engine *en, const struct engine_opts *o, struct err *e)
{
	memset(en, 0, sizeof *en);
	double t0 = clock_mono_s();
	int r;
	if (o->synthetic_weights && (!o->backend || strcmp(o->backend, "cuda")))
		return err_set(e, -EINVAL, "synthetic weights (seed %llu) need the cuda backend, not \"%s\"",
			       (unsigned long long)o->synthetic_seed, o->backend ? o->backend : "auto");
	progress(o, "reading config.json");
	if ((r = config_load(&en->c, o->model_dir, e)))
		return r;
	progress(o, "mapping the checkpoint");
	if ((r = ckpt_open(&en->ck, o->model_dir, e)))
		return r;
	progress(o, "binding tensors");
	if ((r = weights_bind(&en->w, &en->c, &en->ck, e)))
		goto err_ckpt;
	progress(o, "loading the tokenizer");
	if ((r = tokenizer_load(&en->tok, o->model_dir, e)))
		goto err_weights;
	const char *want = o->backend ? o->backend : "auto";
	if (strcmp(want, "cpu") && strcmp(want, "cuda") && strcmp(want, "auto")) {
		r = err_set(e, -EINVAL, "unknown backend \"%s\" (cpu, cuda or auto)", want);
		goto err_tok;
	}
	/* "auto": the GPU when the driver finds one and the CUDA backend takes the model, else
	 * the CPU backend, saying why */
	int try_cuda = !strcmp(want, "cuda");
	if (!strcmp(want, "auto")) {
		struct err why = {""};
		if (cu_load(&why) == 0)
			try_cuda = 1;
		else
			fprintf(stderr, "<6>dsv32: backend auto: %s; using the CPU backend\n", why.msg);
	}
	if (try_cuda) {
		progress(o, o->synthetic_weights ? "uploading the weights to the GPU, generating the "
						   "synthetic ones there"
						 : "uploading the weights to the GPU");
		en->backend_name = "cuda";
		struct backend_cuda_opts co = {.n_pages = o->kv_pages,
					       .synthetic = o->synthetic_weights,
					       .seed = o->synthetic_seed,
					       .batch_invariant = o->batch_invariant,
					       .stages = o->gpus,
					       .step_rows = o->max_batch_tokens};
		for (int i = 0; i < CUDA_MAX_STAGES; i++)
			co.stage_gpu[i] = i;
		r = backend_cuda_create_opts(&en->c, &en->w, &en->ck, &co, &en->be, e);
		if (r && strcmp(want, "auto"))
			goto err_tok;
		if (r) {
			fprintf(stderr, "<4>dsv32: backend auto: the CUDA backend failed (%s); using "
					"the CPU backend\n", e->msg);
			try_cuda = 0;
		} else {
			en->kv_pages = en->be->n_pages;
			en->kv_bytes = (size_t)en->kv_pages * (size_t)en->be->n_layers *
				       (en->be->mla_page_bytes + en->be->idx_page_bytes);
		}
	}
	if (!try_cuda) {
		en->backend_name = "cpu";
		size_t page_bytes;
		en->kv_pages = pages_for(&en->c, o, &page_bytes);
		en->kv_bytes = (size_t)en->kv_pages * page_bytes;
		if (en->kv_pages < 1) {
			r = err_set(e, -ENOMEM, "host-memory-mb = %lld MB holds no KV page of %zu bytes",
				    (long long)o->host_memory_mb, page_bytes);
			goto err_tok;
		}
		int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
		progress(o, "starting the CPU backend");
		if ((r = backend_cpu_create(&en->c, &en->w, en->kv_pages, threads < 1 ? 1 : threads,
					    &en->be, e)))
			goto err_tok;
	}
	struct sched_config sc = {
		.max_batch_tokens = o->max_batch_tokens > 0 ? o->max_batch_tokens : 2048,
		.max_seqs = o->max_seqs > 0 ? o->max_seqs : 64,
		.max_context = o->max_context,
		.prefix_cache = 1,
		.seed = 0x5eed,
		.mtp_draft = o->mtp_draft,
		.tok = en->tok,
	};
	if ((r = sched_init(&en->s, en->be, &sc, e)))
		goto err_backend;
	en->load_s = clock_mono_s() - t0;
	return 0;

err_backend:
	backend_destroy(en->be);
err_tok:
	tokenizer_free(en->tok);
err_weights:
	weights_free(&en->w);
err_ckpt:
	ckpt_close(&en->ck);
	return r;
}

void engine_close(struct engine *en)
{
	sched_free(en->s);
	backend_destroy(en->be);
	tokenizer_free(en->tok);
	weights_free(&en->w);
	ckpt_close(&en->ck);
	memset(en, 0, sizeof *en);
}

static int prompt_chat(const struct engine *en, const char *text, size_t len, int thinking,
		       struct tokenizer_ids *out, struct err *e)
{
	struct chat_opts co = chat_opts_default(thinking ? CHAT_MODE_THINKING : CHAT_MODE_CHAT);
	struct chat_prompt p;
	int r = chat_encode_json(&p, text, len, &co, e);
	if (r)
		return r;
	/* special tokens only inside template segments, so message content cannot inject
	 * "<｜User｜>" and friends; the text between them is one run, as the reference sees it */
	struct tokenizer_span *allow = malloc((p.n_seg + 1) * sizeof *allow);
	size_t n_allow = 0;
	if (!allow) {
		chat_prompt_free(&p);
		return err_set(e, -ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < p.n_seg; i++) {
		if (!p.seg[i].allow_special)
			continue;
		if (n_allow && allow[n_allow - 1].off + allow[n_allow - 1].len == p.seg[i].off)
			allow[n_allow - 1].len += p.seg[i].len; /* adjacent template segments merge */
		else
			allow[n_allow++] = (struct tokenizer_span){p.seg[i].off, p.seg[i].len};
	}
	r = tokenizer_encode_spans(en->tok, p.text, p.len, allow, n_allow, 0, out);
	if (r)
		err_set(e, r, "tokenizing the rendered chat failed");
	free(allow);
	chat_prompt_free(&p);
	return r;
}

int engine_prompt(const struct engine *en, enum engine_input kind, const char *text, size_t len,
		  const uint32_t *ids, size_t n_ids, int thinking, int allow_special,
		  struct tokenizer_ids *out, struct err *e)
{
	size_t before = out->n;
	int r = 0;
	switch (kind) {
	case ENGINE_INPUT_TEXT:
		r = tokenizer_encode(en->tok, text, len,
				     TOKENIZER_STRICT_UTF8 | (allow_special ? TOKENIZER_SPECIAL : 0), out);
		if (r == -EILSEQ)
			return err_set(e, -EINVAL, "the prompt text is not valid UTF-8");
		if (r)
			return err_set(e, r, "tokenizing the prompt failed");
		break;
	case ENGINE_INPUT_CHAT:
		if ((r = prompt_chat(en, text, len, thinking, out, e)))
			return r;
		break;
	case ENGINE_INPUT_TOKENS:
		for (size_t i = 0; i < n_ids; i++)
			if (ids[i] >= (uint64_t)en->c.vocab_size)
				return err_set(e, -EINVAL, "token id %u at index %zu is outside the vocabulary (size %lld)",
					       ids[i], i, (long long)en->c.vocab_size);
		for (size_t i = 0; i < n_ids; i++) {
			if (out->n == out->cap) {
				size_t cap = out->cap ? out->cap * 2 : 64;
				int32_t *v = realloc(out->v, cap * sizeof *v);
				if (!v)
					return err_set(e, -ENOMEM, "out of memory");
				out->v = v;
				out->cap = cap;
			}
			out->v[out->n++] = (int32_t)ids[i];
		}
		break;
	}
	if (out->n == before)
		return err_set(e, -EINVAL, "the prompt is empty");
	return 0;
}

int engine_warmup(struct engine *en, struct err *e)
{
	int32_t prompt[2] = {(int32_t)en->c.bos_token_id, (int32_t)en->c.bos_token_id};
	struct sched_request rq = {.id = UINT64_MAX, .prompt = prompt, .n_prompt = 2,
				   .max_tokens = 1, .ignore_eos = 1};
	sampler_params_default(&rq.sampling);
	int r = sched_add(en->s, &rq, e);
	if (r)
		return r;
	int finished = 0;
	while (!finished && sched_has_work(en->s)) {
		const struct sched_event *ev;
		int64_t n;
		if ((r = sched_step(en->s, &ev, &n)))
			return err_set(e, r, "warm-up step failed in the backend");
		for (int64_t i = 0; i < n; i++) {
			if (ev[i].type == SCHED_EVENT_ERROR)
				return err_set(e, ev[i].error, "warm-up request failed: %s", ev[i].msg);
			if (ev[i].type == SCHED_EVENT_FINISH)
				finished = 1;
		}
	}
	return finished ? 0 : err_set(e, -EIO, "warm-up request did not finish");
}
