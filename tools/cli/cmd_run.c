/*
 * cmd_run.c — `dsv32 run --model DIR [--prompt TEXT] [--max-tokens N] [--raw] [--thinking]`
 * [--mtp-draft [K]]:
 * the main job offline, in this process: open the engine (the same code the daemon serves
 * with), render the prompt as a chat turn (or take it raw), and stream the generated text and
 * token ids to stdout, with the numbers at the end. `make run` calls it on the tiny model.
 * --mtp-draft [K]: speculative decoding with the MTP layer, up to K drafts a step (default 1;
 * model/sched.h; the same tokens), the drafts verified and accepted printed at the end.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/engine.h"
#include "model/clock.h"
#include "model/json.h"
#include "tools/cli/cli.h"

static int usage(void)
{
	fprintf(stderr, "usage: dsv32 run --model DIR [--prompt TEXT] [--max-tokens N] [--raw] "
			"[--thinking] [--temperature T] [--seed N] [--threads N] [--mtp-draft [K]]\n");
	return 2;
}

int cmd_run(int argc, char **argv)
{
	const char *model = NULL, *prompt = "Write a haiku about the sea.";
	int64_t max_tokens = 32, seed = 0;
	int raw = 0, thinking = 0, threads = 0, mtp_draft = 0;
	double temperature = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--model") && v)
			model = v, i++;
		else if (!strcmp(a, "--prompt") && v)
			prompt = v, i++;
		else if (!strcmp(a, "--max-tokens") && v)
			max_tokens = atoll(v), i++;
		else if (!strcmp(a, "--temperature") && v)
			temperature = atof(v), i++;
		else if (!strcmp(a, "--seed") && v)
			seed = atoll(v), i++;
		else if (!strcmp(a, "--threads") && v)
			threads = atoi(v), i++;
		else if (!strcmp(a, "--raw"))
			raw = 1;
		else if (!strcmp(a, "--thinking"))
			thinking = 1;
		else if (!strcmp(a, "--mtp-draft")) /* a count of drafts may follow (default 1) */
			mtp_draft = cli_flag_count(argc, argv, &i, 1);
		else
			return usage();
	}
	if (!model || max_tokens < 1)
		return usage();
	struct engine_opts o = {.model_dir = model, .backend = "cpu", .threads = threads,
				.host_memory_mb = 1024, .kv_pages = 256, .mtp_draft = mtp_draft};
	struct engine en;
	struct err e;
	if (engine_open(&en, &o, &e)) {
		fprintf(stderr, "dsv32 run: %s\n", e.msg);
		return 1;
	}
	printf("model %s: %lld layers + %lld MTP, hidden %lld, %lld experts; backend %s, %lld KV pages; loaded in %.2f s\n",
	       model, (long long)en.c.num_hidden_layers, (long long)en.c.num_nextn_predict_layers,
	       (long long)en.c.hidden_size, (long long)en.c.n_routed_experts, en.backend_name,
	       (long long)en.kv_pages, en.load_s);

	/* the prompt: one user turn in the V3.2 chat encoding, or the raw text */
	struct tokenizer_ids ids = {0};
	struct sbuf msgs = {0};
	int r;
	if (raw) {
		r = engine_prompt(&en, ENGINE_INPUT_TEXT, prompt, strlen(prompt), NULL, 0, 0, 0, &ids, &e);
	} else {
		sbuf_puts(&msgs, "[{\"role\": \"user\", \"content\": ");
		json_write_str(&msgs, prompt, strlen(prompt), 0);
		sbuf_puts(&msgs, "}]");
		r = engine_prompt(&en, ENGINE_INPUT_CHAT, msgs.p, msgs.len, NULL, 0, thinking, 0, &ids, &e);
	}
	sbuf_free(&msgs);
	if (r) {
		fprintf(stderr, "dsv32 run: %s\n", e.msg);
		engine_close(&en);
		return 1;
	}
	struct sched_request rq = {.id = 1, .prompt = ids.v, .n_prompt = (int64_t)ids.n,
				   .max_tokens = max_tokens, .seeded = seed != 0};
	sampler_params_default(&rq.sampling);
	rq.sampling.temperature = temperature;
	rq.sampling.seed = (uint64_t)seed;
	if (sched_add(en.s, &rq, &e)) {
		fprintf(stderr, "dsv32 run: %s\n", e.msg);
		tokenizer_ids_free(&ids);
		engine_close(&en);
		return 1;
	}
	printf("prompt: %zu tokens\n--- generated text\n", ids.n);
	fflush(stdout);
	int32_t *out = malloc((size_t)max_tokens * sizeof *out);
	int64_t n_out = 0;
	double t0 = clock_mono_s(), t_first = 0;
	const char *reason = "?";
	int done = 0;
	while (!done && sched_has_work(en.s)) {
		const struct sched_event *ev;
		int64_t n;
		if ((r = sched_step(en.s, &ev, &n))) {
			fprintf(stderr, "dsv32 run: engine fault %d\n", r);
			break;
		}
		for (int64_t i = 0; i < n; i++) {
			if (ev[i].text_len)
				fwrite(ev[i].text, 1, ev[i].text_len, stdout);
			if (ev[i].type == SCHED_EVENT_TOKEN) {
				if (!n_out)
					t_first = clock_mono_s() - t0;
				if (n_out < max_tokens)
					out[n_out++] = ev[i].token;
			} else if (ev[i].type == SCHED_EVENT_FINISH) {
				reason = sched_finish_name(ev[i].reason);
				done = 1;
			} else {
				fprintf(stderr, "\ndsv32 run: %s\n", ev[i].msg);
				r = ev[i].error;
				done = 1;
			}
		}
		fflush(stdout);
	}
	double dt = clock_mono_s() - t0;
	printf("\n--- %lld tokens (%s):", (long long)n_out, reason);
	for (int64_t i = 0; i < n_out; i++)
		printf(" %d", out[i]);
	printf("\nprefill %zu tokens + first token in %.3f s; %.1f tokens/s decode\n", ids.n, t_first,
	       n_out > 1 ? (double)(n_out - 1) / (dt - t_first) : 0.0);
	if (mtp_draft) {
		struct sched_stats st;
		sched_stats(en.s, &st);
		printf("MTP drafts: %llu verified, %llu accepted (%.1f%%), %llu steps\n",
		       (unsigned long long)st.drafts, (unsigned long long)st.drafts_accepted,
		       st.draft_accept_rate * 100, (unsigned long long)st.steps);
	}
	free(out);
	tokenizer_ids_free(&ids);
	engine_close(&en);
	return r ? 1 : 0;
}
