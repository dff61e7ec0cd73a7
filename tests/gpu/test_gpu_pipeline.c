/*
 * test_gpu_pipeline.c — the CUDA backend split by layer ranges over stages
 * (backend_cuda_opts.stages, model/cuda_pipeline.c) against the same backend on one GPU: the
 * stages run the same kernels on the same rows, so everything must be the same bits. Here the
 * stages share the one lent GPU (stage_gpu all 0); across GPUs only the copies of the rows
 * between stages differ.
 *
 * On the structured tiny checkpoint (4 layers: 2 dense, 2 MoE, and the MTP layer), with 2
 * stages (layers 0-1 | 2-3 + MTP) and 3 (0 | 1 | 2-3 + MTP), in the batch-invariant and the
 * fast mode, one backend of each kind side by side over the same steps:
 *   - a prefill in chunks of 24 rows (logits and hidden rows of every row), then the same in one
 *     step run in passes of 7 rows (DSV32_CUDA_MAX_ROWS), each stage splitting it alike;
 *   - one-row decode steps, eagerly and replayed from CUDA graphs (each stage its own);
 *   - a decode step of two sequences drawn on the device (backend_step_draw, greedy);
 *   - a main step keeping its rows (BACKEND_ROW_KEEP) and the MTP steps reading them;
 *   - every page of every layer's MLA and indexer pools (page_io: each layer from its stage);
 *   - refusals: a step with a page beyond the pool refused before any stage runs.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include "model/backend.h"
#include "tests/ckpt_helpers.h"

struct two {
	struct backend *one, *pipe; /* the single-GPU backend, the pipeline */
	int64_t V, D;
	int32_t *tok;
	int64_t same, rows; /* rows compared (logits / hidden / draws), rows bit-identical */
};

/* Runs st on both backends (its output buffers: the first backend's; the second's copies at
 * the same offsets of alt, whose buffers are laid out alike) and counts identical rows. */
static void both(struct two *t, struct backend_step *st, struct backend_seq *alt_seqs,
		 const char *what)
{
	int r1 = backend_step(t->one, st);
	struct backend_step st2 = *st;
	st2.seqs = alt_seqs;
	int r2 = backend_step(t->pipe, &st2);
	if (r1 || r2) {
		test_fail(__FILE__, __LINE__, "%s: one GPU %d, pipeline %d", what, r1, r2);
		return;
	}
	for (int64_t i = 0; i < st->n_seqs; i++) {
		const struct backend_seq *a = &st->seqs[i], *b = &alt_seqs[i];
		int64_t nl = 0, nh = 0;
		for (int64_t j = 0; j < a->n; j++) {
			unsigned f = a->flags ? a->flags[j] : j == a->n - 1 ? BACKEND_ROW_LOGITS : 0;
			nl += !!(f & BACKEND_ROW_LOGITS), nh += !!(f & BACKEND_ROW_HIDDEN);
		}
		for (int64_t k = 0; k < nl; k++)
			t->same += !memcmp(a->logits + k * t->V, b->logits + k * t->V, (size_t)t->V * 4);
		for (int64_t k = 0; k < nh; k++)
			t->same += !memcmp(a->hidden + k * t->D, b->hidden + k * t->D, (size_t)t->D * 4);
		t->rows += nl + nh;
	}
}

static void set_both(struct two *t, const char *name, const char *value)
{
	CHECK_EQ_INT(backend_cuda_set_switch(t->one, name, value), 0);
	CHECK_EQ_INT(backend_cuda_set_switch(t->pipe, name, value), 0);
}

/* Rows [p0, p0 + n) of the sequence, flags fl each, outputs into lg / hd (row-major, from 0). */
static struct backend_seq rows(const struct two *t, int64_t p0, int64_t n, int64_t *pos,
			       uint8_t *fl, unsigned flags, const int32_t *bt, int64_t nb, float *lg,
			       float *hd)
{
	for (int64_t i = 0; i < n; i++)
		pos[i] = p0 + i, fl[i] = (uint8_t)flags;
	return (struct backend_seq){n, t->tok + p0, pos, bt, nb, fl, lg, hd, NULL, 0};
}

/* The structured tiny checkpoint (mkmodel --structured) in TMP/name. */
static void tiny_model(struct test_model *m, const char *name)
{
	snprintf(m->dir, sizeof m->dir, "%s/%s", test_tmpdir(), name);
	char cmd[4096];
	snprintf(cmd, sizeof cmd, "%s/mkmodel --config %s/tests/data/numerics_tiny.json --seed 1 "
		 "--tokenizer fallback --structured --out %s >%s.log 2>&1", test_bin_dir(), test_root(),
		 m->dir, m->dir);
	test_model_make(m, cmd);
}

static void pipeline_case(int stages, int invariant)
{
	struct test_model m;
	tiny_model(&m, "pipe_tiny");
	const int64_t T = 160, nb = 4, Lall = m.c.num_hidden_layers + m.c.num_nextn_predict_layers;
	struct err e = {""};
	struct two t = {.V = m.c.vocab_size, .D = m.c.hidden_size};
	struct backend_cuda_opts o1 = {.n_pages = 2 * nb, .batch_invariant = invariant};
	struct backend_cuda_opts o2 = o1;
	o2.stages = stages; /* stage_gpu: all GPU 0 */
	if (backend_cuda_create_opts(&m.c, &m.w, &m.ck, &o1, &t.one, &e) ||
	    backend_cuda_create_opts(&m.c, &m.w, &m.ck, &o2, &t.pipe, &e)) {
		test_fail(__FILE__, __LINE__, "create: %s", e.msg);
		backend_destroy(t.one);
		test_model_free(&m);
		return;
	}
	CHECK_EQ_INT(t.pipe->n_layers, Lall);
	CHECK(t.pipe->n_pages >= 2 * nb);
	CHECK(!strcmp(backend_cuda_mode(t.pipe), invariant ? "batch-invariant" : "fast"));
	REQUIRE(t.tok = malloc((size_t)(T + 1) * sizeof *t.tok));
	uint64_t seed = 5;
	for (int64_t i = 0; i <= T; i++)
		t.tok[i] = (int32_t)(test_rand(&seed) % (uint64_t)t.V);
	int32_t bt[4] = {3, 0, 2, 1}, bt2[4] = {7, 4, 6, 5}; /* two sequences' pages */
	int64_t *pos = malloc((size_t)T * sizeof *pos);
	uint8_t *fl = malloc((size_t)T);
	float *lg[2], *hd[2];
	for (int k = 0; k < 2; k++) {
		lg[k] = malloc((size_t)T * t.V * 4), hd[k] = malloc((size_t)T * t.D * 4);
		REQUIRE(lg[k] && hd[k]);
	}
	REQUIRE(pos && fl);
	const unsigned LH = BACKEND_ROW_LOGITS | BACKEND_ROW_HIDDEN;
	/* every page of both sequences zeroed first (through page_io: the pipeline's routes each
	 * layer to its stage), so slots no step writes compare too */
	size_t pb = t.one->mla_page_bytes > t.one->idx_page_bytes ? t.one->mla_page_bytes
								    : t.one->idx_page_bytes;
	uint8_t *pa = calloc(1, pb), *pp = malloc(pb);
	REQUIRE(pa && pp);
	for (int64_t l = 0; l < Lall; l++)
		for (int pool = 0; pool < 2; pool++)
			for (int64_t pg = 0; pg < 2 * nb; pg++) {
				CHECK_EQ_INT(backend_page_io(t.one, l, (enum backend_pool)pool, pg, pa, 1), 0);
				CHECK_EQ_INT(backend_page_io(t.pipe, l, (enum backend_pool)pool, pg, pa, 1), 0);
			}

	/* prefill [0, 120) in chunks of 24, every row's logits and hidden state */
	for (int64_t a = 0; a < 120; a += 24) {
		struct backend_seq s[2] = {rows(&t, a, 24, pos, fl, LH, bt, nb, lg[0], hd[0]),
					   rows(&t, a, 24, pos, fl, LH, bt, nb, lg[1], hd[1])};
		struct backend_step st = {0, 1, &s[0], NULL};
		both(&t, &st, &s[1], "prefill chunk");
	}
	int64_t same_chunks = t.same, rows_chunks = t.rows;
	/* the same positions again as one step in passes of 7 rows (rewrites the same KV bytes) */
	set_both(&t, "DSV32_CUDA_MAX_ROWS", "7");
	{
		struct backend_seq s[2] = {rows(&t, 0, 120, pos, fl, LH, bt, nb, lg[0], hd[0]),
					   rows(&t, 0, 120, pos, fl, LH, bt, nb, lg[1], hd[1])};
		struct backend_step st = {0, 1, &s[0], NULL};
		both(&t, &st, &s[1], "one step in passes of 7");
	}
	set_both(&t, "DSV32_CUDA_MAX_ROWS", NULL);
	int64_t same_passes = t.same - same_chunks, rows_passes = t.rows - rows_chunks;
	/* decode [120, 136) a row a step: eagerly, then [136, 152) replayed from graphs */
	int64_t c0, r0, c1, r1;
	backend_cuda_graph_stats(t.pipe, &c0, &r0);
	for (int64_t a = 120; a < 152; a++) {
		set_both(&t, "DSV32_CUDA_GRAPHS", a < 136 ? "0" : NULL);
		struct backend_seq s[2] = {rows(&t, a, 1, pos, fl, LH, bt, nb, lg[0], hd[0]),
					   rows(&t, a, 1, pos, fl, LH, bt, nb, lg[1], hd[1])};
		struct backend_step st = {0, 1, &s[0], NULL};
		both(&t, &st, &s[1], "decode");
	}
	backend_cuda_graph_stats(t.pipe, &c1, &r1);
	/* a decode step of two sequences drawn on the device (the second: a 2-row prompt) */
	struct sampler_params sp;
	sampler_params_default(&sp);
	int32_t drawn[2][2] = {{-1, -1}, {-1, -1}};
	for (int k = 0; k < 2; k++) {
		struct backend *b = k ? t.pipe : t.one;
		int64_t p1[1] = {152}, p2[2] = {0, 1};
		struct backend_seq s[2] = {{1, t.tok + 152, p1, bt, nb, NULL, NULL, NULL, NULL, 0},
					   {2, t.tok, p2, bt2, nb, NULL, NULL, NULL, NULL, 0}};
		struct backend_sample d[2] = {{.p = &sp}, {.p = &sp, .index = 1}};
		struct backend_sample *dp[2] = {&d[0], &d[1]};
		struct backend_step st = {0, 2, s, NULL};
		int rc = b->step_draw ? backend_step_draw(b, &st, dp) : -ENOTSUP;
		CHECK_EQ_INT(rc, 0);
		drawn[k][0] = d[0].out.token, drawn[k][1] = d[1].out.token;
	}
	/* a main step keeping its rows, then MTP steps of 8 rows reading them */
	int64_t same_mtp = 0;
	{
		struct backend_seq s[2] = {
			rows(&t, 0, 24, pos, fl, BACKEND_ROW_LOGITS | BACKEND_ROW_KEEP, bt, nb, lg[0], NULL),
			rows(&t, 0, 24, pos, fl, BACKEND_ROW_LOGITS | BACKEND_ROW_KEEP, bt, nb, lg[1], NULL)};
		struct backend_step st = {0, 1, &s[0], NULL};
		both(&t, &st, &s[1], "main step keeping its rows");
		int64_t before = t.same;
		for (int64_t a = 0; a < 24; a += 8) {
			struct backend_seq ms[2] = {
				rows(&t, a, 8, pos, fl, BACKEND_ROW_LOGITS, bt, nb, lg[0], NULL),
				rows(&t, a, 8, pos, fl, BACKEND_ROW_LOGITS, bt, nb, lg[1], NULL)};
			for (int k = 0; k < 2; k++)
				ms[k].tokens = t.tok + a + 1, ms[k].mtp_kept = a;
			struct backend_step st2 = {1, 1, &ms[0], NULL};
			both(&t, &st2, &ms[1], "MTP step from kept rows");
		}
		same_mtp = t.same - before;
	}
	/* every page of every layer's pools (pages 0 .. 2 nb - 1: both sequences') */
	int64_t pages_same = 0, pages = 0;
	for (int64_t l = 0; l < Lall; l++)
		for (int pool = 0; pool < 2; pool++)
			for (int64_t pg = 0; pg < 2 * nb; pg++) {
				size_t n = pool ? t.one->idx_page_bytes : t.one->mla_page_bytes;
				memset(pa, 0xa5, pb), memset(pp, 0x5a, pb);
				int ra = backend_page_io(t.one, l, (enum backend_pool)pool, pg, pa, 0);
				int rp = backend_page_io(t.pipe, l, (enum backend_pool)pool, pg, pp, 0);
				pages_same += !ra && !rp && !memcmp(pa, pp, n);
				pages++;
			}
	CHECK_EQ_INT(backend_page_io(t.pipe, Lall, BACKEND_POOL_MLA, 0, pa, 0), -EINVAL);
	/* refused before any stage runs: a page beyond the pool */
	{
		int32_t bad[1] = {(int32_t)t.pipe->n_pages};
		int64_t p0[1] = {0};
		struct backend_seq s = {1, t.tok, p0, bad, 1, NULL, lg[1], NULL, NULL, 0};
		struct backend_step st = {0, 1, &s, NULL};
		CHECK_EQ_INT(backend_step(t.pipe, &st), -EINVAL);
	}
	printf("    %d stages, %s mode: chunks %lld / %lld rows (logits and hidden), passes of 7 "
	       "%lld / %lld, all %lld / %lld (decode %lld replays), draws %d %d / %d %d, MTP from "
	       "kept rows %lld / 24, pool pages %lld / %lld bit-identical\n",
	       stages, invariant ? "batch-invariant" : "fast", (long long)same_chunks,
	       (long long)rows_chunks, (long long)same_passes, (long long)rows_passes,
	       (long long)t.same, (long long)t.rows, (long long)(r1 - r0), drawn[0][0], drawn[0][1],
	       drawn[1][0], drawn[1][1], (long long)same_mtp, (long long)pages_same,
	       (long long)pages);
	CHECK(t.rows > 0 && t.same == t.rows);
	CHECK(rows_passes == 240 && same_passes == 240);
	CHECK(r1 - r0 >= 12); /* the graphed decode steps replayed (on every stage) */
	CHECK(drawn[0][0] >= 0 && drawn[0][0] == drawn[1][0] && drawn[0][1] == drawn[1][1]);
	CHECK(same_mtp == 24);
	CHECK(pages == Lall * 2 * 2 * nb && pages_same == pages);
	free(pa), free(pp), free(pos), free(fl), free(t.tok);
	for (int k = 0; k < 2; k++)
		free(lg[k]), free(hd[k]);
	backend_destroy(t.pipe);
	backend_destroy(t.one);
	test_model_free(&m);
}

TEST_T(gpu_pipeline, two_stages_invariant, 300)
{
	pipeline_case(2, 1);
}

TEST_T(gpu_pipeline, two_stages_fast, 300)
{
	pipeline_case(2, 0);
}

TEST_T(gpu_pipeline, three_stages_invariant, 300)
{
	pipeline_case(3, 1);
}

TEST_T(gpu_pipeline, refuses_more_stages_than_layers, 120)
{
	struct test_model m;
	tiny_model(&m, "pipe_tiny_refuse");
	struct err e = {""};
	struct backend *b = NULL;
	struct backend_cuda_opts o = {.n_pages = 4, .stages = 5};
	CHECK_EQ_INT(backend_cuda_create_opts(&m.c, &m.w, &m.ck, &o, &b, &e), -EINVAL);
	CHECK(b == NULL && strstr(e.msg, "5 stages for 4 layers"));
	o.stages = 2, o.stage_gpu[1] = 99;
	CHECK_EQ_INT(backend_cuda_create_opts(&m.c, &m.w, &m.ck, &o, &b, &e), -ENODEV);
	CHECK(b == NULL);
	printf("    refused: %s\n", e.msg);
	test_model_free(&m);
}

#endif
