/*
 * test_gpu_draw.c — the scheduler's tokens drawn on the device (backend_step_draw: the GPU
 * sampler beside the logits, model/cuda_step_sample.h) against the same scheduler sampling the
 * downloaded logits itself (sched_config.host_sampling), on the CUDA backend's batch-invariant
 * mode (a row's logits are the same bits in both runs) with the tiny model's 129280 ids, one
 * request with penalties (its prompt and output uploaded as its history): every token the same, logprobs within 1e-5 (the GPU's exp / log may differ from glibc's by an ulp:
 * test_gpu_sampler.c), the same alternatives; the draws really ran on the device (counted);
 * a draw the backend must refuse (a history it is not given, two logits rows with one draw,
 * one row with two) is refused; two rows with two draws (a verification) are taken.
 * And the scheduler's MTP drafting (sched_config.mtp_draft: the CUDA backend's MTP steps fed
 * the main steps' hidden rows, drafts and verifications drawn on the device; one draft a step
 * and three, also in passes) gives the same events, every logits row drawn on the device.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include <string.h>

#include "model/backend.h"
#include "model/sched.h"
#include "tests/ckpt_helpers.h"
#include "tests/sched_trace.h"

#define NREQ 7 /* request 3 with penalties: its history goes to the device */
#define NTOK 12

static void run(struct backend *b, int host, const struct sampler_params *sp,
		int32_t (*p)[48], struct sched_trace *t, int mtp_draft, struct sched_stats *st)
{
	struct sched_config c = {0};
	c.max_batch_tokens = 96;
	c.max_seqs = 8;
	c.seed = 5;
	c.host_sampling = host;
	c.mtp_draft = mtp_draft;
	struct sched *s;
	struct err e = {""};
	REQUIRE(sched_init(&s, b, &c, &e) == 0);
	for (int i = 0; i < NREQ; i++) {
		struct sched_request q = {0};
		q.id = (uint64_t)i;
		q.uid = 1;
		q.prompt = p[i];
		q.n_prompt = 48;
		q.sampling = sp[i];
		q.seeded = 1;
		q.max_tokens = NTOK;
		q.ignore_eos = 1;
		REQUIRE(sched_add(s, &q, &e) == 0);
	}
	sched_trace_run(s, t);
	if (st)
		sched_stats(s, st);
	sched_free(s);
	sched_trace_sort(t);
}

TEST_T(gpu_draw, device_draws_equal_host_draws, 120)
{
	struct test_model m;
	snprintf(m.dir, sizeof m.dir, "%s/draw_tiny", test_tmpdir());
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "%s/mkmodel tiny --seed 1 --tokenizer fallback --out %s >%s.log 2>&1",
		 test_bin_dir(), m.dir, m.dir);
	test_model_make(&m, cmd);
	struct backend_cuda_opts o = {.n_pages = 32, .batch_invariant = 1};
	struct backend *b;
	struct err e = {""};
	if (backend_cuda_create_opts(&m.c, &m.w, &m.ck, &o, &b, &e)) {
		test_fail(__FILE__, __LINE__, "backend_cuda_create_opts: %s", e.msg);
		test_abort_case();
	}
	REQUIRE(b->step_draw && b->sample_rows >= 8);
	int64_t V = m.c.vocab_size;
	static int32_t p[NREQ][48];
	uint64_t seed = 11;
	for (int i = 0; i < NREQ; i++)
		for (int j = 0; j < 48; j++)
			p[i][j] = 3 + (int32_t)(test_rand(&seed) % (uint64_t)(V - 3));
	struct sampler_params sp[NREQ];
	for (int i = 0; i < NREQ; i++) {
		sampler_params_default(&sp[i]);
		sp[i].seed = 100 + (uint64_t)i;
	}
	sp[1].temperature = 0.8, sp[1].top_k = 50;
	sp[2].temperature = 1.0, sp[2].top_p = 0.9, sp[2].logprobs = 1, sp[2].top_logprobs = 5;
	sp[3].temperature = 0.9, sp[3].repetition_penalty = 1.3, sp[3].frequency_penalty = 0.4,
	sp[3].logprobs = 1;
	sp[4].logprobs = 1, sp[4].top_logprobs = 20;
	sp[5].temperature = 0.7, sp[5].top_k = 20, sp[5].top_p = 0.8, sp[5].logprobs = 1;
	sp[6].temperature = 1.2, sp[6].min_p = 0.02;
	static struct sched_trace host, dev;
	run(b, 1, sp, p, &host, 0, NULL);
	int64_t d0 = backend_cuda_draws(b);
	run(b, 0, sp, p, &dev, 0, NULL);
	int64_t drawn = backend_cuda_draws(b) - d0;
	CHECK_EQ_INT(d0, 0);
	CHECK_EQ_INT(drawn, NREQ * NTOK);
	CHECK_EQ_INT(host.n, NREQ * (NTOK + 1)); /* the tokens and the finish of each */
	double worst;
	int64_t bad = sched_trace_diff(&host, &dev, UINT64_MAX, &worst);
	printf("    %lld events of %d requests (greedy, temperature, top-k, top-p, min-p, a penalty, "
	       "logprobs): %lld token events differ, worst logprob difference %.2e\n",
	       (long long)host.n, NREQ, (long long)bad, worst);
	CHECK_EQ_INT(bad, 0);
	CHECK(worst <= 1e-5);

	/* draws the backend refuses: a penalty without its history, two logits rows */
	int32_t tok[2] = {5, 6}, bt[1] = {0};
	int64_t pos[2] = {0, 1};
	uint8_t fl[2] = {BACKEND_ROW_LOGITS, BACKEND_ROW_LOGITS};
	struct sampler_params pen;
	sampler_params_default(&pen);
	pen.repetition_penalty = 1.1;
	struct backend_sample ds = {.p = &pen, .n_prompt = 3}; /* (prompt NULL) */
	struct backend_sample *dp[1] = {&ds};
	struct backend_seq s1 = {.n = 1, .tokens = tok, .pos = pos, .block_table = bt, .n_blocks = 1};
	struct backend_step st = {.mtp = 0, .n_seqs = 1, .seqs = &s1};
	CHECK_EQ_INT(backend_step_draw(b, &st, dp), -EINVAL);
	sampler_params_default(&pen);
	s1.n = 2, s1.flags = fl;
	CHECK_EQ_INT(backend_step_draw(b, &st, dp), -EINVAL);
	struct backend_sample ds2 = {.p = &pen}; /* two rows, two draws: taken */
	ds.row2 = &ds2;
	CHECK_EQ_INT(backend_step_draw(b, &st, dp), 0);
	CHECK_EQ_INT(ds.rc, 0);
	CHECK_EQ_INT(ds2.rc, 0);
	CHECK(ds2.out.token >= 0 && ds2.out.token < V);
	s1.n = 1, s1.flags = NULL; /* one row, two draws: refused */
	CHECK_EQ_INT(backend_step_draw(b, &st, dp), -EINVAL);
	ds.row2 = NULL; /* and the one draw on one row is taken */
	CHECK_EQ_INT(backend_step_draw(b, &st, dp), 0);
	CHECK_EQ_INT(ds.rc, 0);
	CHECK(ds.out.token >= 0 && ds.out.token < V);

	/* MTP drafting: the same events as the host's plain run, every row drawn on the device:
	 * each token's first draw, each verification's second row, each draft (greedy) */
	static struct sched_trace drafted;
	struct sched_stats sst;
	int64_t d1 = backend_cuda_draws(b);
	run(b, 0, sp, p, &drafted, 1, &sst);
	drawn = backend_cuda_draws(b) - d1;
	printf("    MTP drafting: %lld draws on the device\n", (long long)drawn);
	CHECK(drawn >= NREQ * NTOK - (int64_t)sst.drafts_accepted + 2 * (int64_t)sst.drafts);
	bad = sched_trace_diff(&host, &drafted, UINT64_MAX, &worst);
	printf("    MTP drafting: %llu drafts verified, %llu accepted, %llu steps; %lld token events "
	       "differ, worst logprob difference %.2e\n", (unsigned long long)sst.drafts,
	       (unsigned long long)sst.drafts_accepted, (unsigned long long)sst.steps,
	       (long long)bad, worst);
	CHECK_EQ_INT(bad, 0);
	CHECK(worst <= 1e-5);
	CHECK(sst.drafts > 0);
	/* again in passes of 5 rows (DSV32_CUDA_MAX_ROWS=5): a pass boundary between a
	 * verification's two rows moves before them (their draws are made together), and the
	 * kept rows of a step come from all its passes */
	REQUIRE(backend_cuda_set_switch(b, "DSV32_CUDA_MAX_ROWS", "5") == 0);
	static struct sched_trace passes;
	run(b, 0, sp, p, &passes, 1, &sst);
	REQUIRE(backend_cuda_set_switch(b, "DSV32_CUDA_MAX_ROWS", NULL) == 0);
	bad = sched_trace_diff(&host, &passes, UINT64_MAX, &worst);
	printf("    MTP drafting in passes of 5 rows: %llu drafts verified; %lld token events differ, "
	       "worst logprob difference %.2e\n", (unsigned long long)sst.drafts, (long long)bad,
	       worst);
	CHECK_EQ_INT(bad, 0);
	CHECK(worst <= 1e-5);
	/* three drafts a step (the MTP layer chained on its own output; verifications of up to
	 * four rows drawn on the device), alone and in passes of 6 rows (a boundary inside a
	 * verification moves before its rows) */
	for (int k = 0; k < 2; k++) {
		static struct sched_trace three;
		if (k)
			REQUIRE(backend_cuda_set_switch(b, "DSV32_CUDA_MAX_ROWS", "6") == 0);
		run(b, 0, sp, p, &three, 3, &sst);
		REQUIRE(backend_cuda_set_switch(b, "DSV32_CUDA_MAX_ROWS", NULL) == 0);
		bad = sched_trace_diff(&host, &three, UINT64_MAX, &worst);
		printf("    MTP drafting, three drafts a step%s: %llu drafts verified, %llu steps; %lld "
		       "token events differ, worst logprob difference %.2e\n",
		       k ? " in passes of 6 rows" : "", (unsigned long long)sst.drafts,
		       (unsigned long long)sst.steps, (long long)bad, worst);
		CHECK_EQ_INT(bad, 0);
		CHECK(worst <= 1e-5);
	}
	backend_destroy(b);
	test_model_free(&m);
}

#endif
