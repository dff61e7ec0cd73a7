/*
 * test_gpu_forward.c — the CUDA backend's whole forward (model/cuda_forward.c) against the CPU
 * backend, like with like (issue 12), on structured checkpoints (mkmodel --structured: the
 * tiny config and the wider one of tests/data/numerics_*.json) with contexts longer than
 * 2 x index_topk, so the sparse path runs. Like with like runs in the backend's batch-invariant
 * mode (backend_cuda_opts.batch_invariant):
 *   - each layer alone on the same input (teacher forcing, MTP layer included): the layer output
 *     within median relative L2 1e-2, routed expert sets identical for every row, indexer top-k
 *     sets identical on >= 90% of rows and none more than 2 keys off; every other dumped
 *     intermediate is compared and printed (diagnosis); the fused per-row kernels give the same
 *     bits as the separate ones;
 *   - end to end, prefill in chunks: expert sets identical for every token and layer, top-k as
 *     above, logits median relative L2 <= 0.2, p90 <= 0.3, argmax agreement >= 0.7; the same
 *     logits limits for the whole sequence as one step that the backend runs in passes;
 *   - end to end, token-by-token decode of one sequence mixed in the same steps with another
 *     sequence's 16-row prefill chunks: the same logits limits for both;
 *   - decode one token per step eagerly and through captured CUDA graphs: bit-identical, both
 *     timed;
 *   - steps with hidden rows (2 rows, a verification's shape) and MTP steps of 16 rows,
 *     eagerly and through graphs: the same bits;
 *   - the MTP step (spec §4) on the CPU's hidden states: the same logits limits; on the main
 *     step's rows kept on the device (BACKEND_ROW_KEEP) against the same rows given: the same
 *     bits, replayed and eager;
 *   - batch invariance: every row of the token-by-token decode and of the 16-row chunks
 *     bit-identical to the same row of the chunked prefill.
 * The fast mode (the default; large-M GEMM and MoE paths) departs from the CPU by its
 * accumulation order: its own case checks the end-to-end logits limits on steps of more than
 * 64 rows, and the teacher-forced cases print its layer numbers beside the invariant mode's
 * (informational: the fast path's departure).
 * mkmodel comes from $DSV32_BIN, else the directory of this executable, else build/.
 */
#include "tests/gpu/gpu_harness.h"

#ifndef DSV32_NO_CUDA

#include <time.h>

#include "model/backend.h"
#include "model/cpu_ops.h"
#include "model/cuda_forward.h"
#include "model/fileio.h"
#include "tests/ckpt_helpers.h"
#include "tests/oracle/numerics_check.h"

/* ---- models ------------------------------------------------------------------------------------ */

static void load_structured(struct test_model *m, const char *name)
{
	char cmd[4096];
	snprintf(m->dir, sizeof m->dir, "%s/%s", test_tmpdir(), name);
	snprintf(cmd, sizeof cmd, "%s/mkmodel --config %s/tests/data/numerics_%s.json --seed 1 "
		 "--tokenizer fallback --structured --out %s >%s.log 2>&1", test_bin_dir(), test_root(), name,
		 m->dir, m->dir);
	test_model_make(m, cmd);
}

/* Output buffers start as NaN, so a row the backend never wrote cannot pass. */
/* One of the CUDA forward's switches (backend_cuda_set_switch; value NULL: its default). */
static void set_switch(struct backend *b, const char *name, const char *value)
{
	REQUIRE(backend_cuda_set_switch(b, name, value) == 0);
}

static void gpu_fill_nan(float *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = NAN;
}

/* ---- statistics: tests/oracle/numerics_check.h (nc_rel_l2, nc_pct, nc_argmax, nc_set_diff) ---- */

/* Logits of rows [n, V] against the reference: median and p90 relative L2, argmax agreement. */
static void check_logits(const char *what, const float *got, const float *ref, int64_t n, int64_t V)
{
	double *e = malloc((size_t)n * sizeof *e);
	REQUIRE(e);
	int64_t agree = 0, worst = 0;
	for (int64_t t = 0; t < n; t++) {
		e[t] = nc_rel_l2(got + t * V, ref + t * V, V);
		if (e[t] > e[worst])
			worst = t;
		agree += nc_argmax(got + t * V, V) == nc_argmax(ref + t * V, V);
	}
	double w = e[worst];
	double med = nc_pct(e, n, 50), p90 = nc_pct(e, n, 90), ag = (double)agree / (double)n;
	printf("    %s: %lld rows, logits rel L2 median %.4f (limit 0.2) p90 %.4f (0.3) worst %.4f at "
	       "row %lld, argmax agreement %.3f (>= 0.7)\n", what, (long long)n, med, p90, w,
	       (long long)worst, ag);
	CHECK(med <= 0.2);
	CHECK(p90 <= 0.3);
	CHECK(ag >= 0.7);
	free(e);
}

/* ---- dumps ------------------------------------------------------------------------------------- */

struct dump_rec {
	char name[24];
	int64_t layer, seq, pos, n;
	int is_int;
	float *f;
	int32_t *i;
};

struct dumps {
	int64_t n, cap;
	struct dump_rec *r;
};

static void dump_cb(void *ctx, const char *name, int64_t layer, int64_t seq, int64_t pos, int is_int,
		    const void *data, int64_t n)
{
	struct dumps *d = ctx;
	if (d->n == d->cap) {
		d->cap = d->cap ? 2 * d->cap : 1024;
		d->r = realloc(d->r, (size_t)d->cap * sizeof *d->r);
		REQUIRE(d->r);
	}
	struct dump_rec *r = &d->r[d->n++];
	memset(r, 0, sizeof *r);
	snprintf(r->name, sizeof r->name, "%s", name);
	r->layer = layer, r->seq = seq, r->pos = pos, r->n = n, r->is_int = is_int;
	if (is_int) {
		r->i = malloc((size_t)(n ? n : 1) * 4);
		REQUIRE(r->i);
		memcpy(r->i, data, (size_t)n * 4);
	} else {
		r->f = malloc((size_t)(n ? n : 1) * 4);
		REQUIRE(r->f);
		memcpy(r->f, data, (size_t)n * 4);
	}
}

static void dumps_free(struct dumps *d)
{
	for (int64_t i = 0; i < d->n; i++)
		free(d->r[i].f), free(d->r[i].i);
	free(d->r);
	memset(d, 0, sizeof *d);
}

static const struct dump_rec *dump_find(const struct dumps *d, const char *name, int64_t layer,
					int64_t seq, int64_t pos)
{
	for (int64_t i = 0; i < d->n; i++) {
		const struct dump_rec *r = &d->r[i];
		if (r->layer == layer && r->seq == seq && r->pos == pos && !strcmp(r->name, name))
			return r;
	}
	return NULL;
}

/* Routing and selection agreement of every (layer, row) the CPU dumped. */
struct sets_stat {
	int64_t ex_rows, ex_same, ex_missing;
	int64_t tk_rows, tk_same, tk_worst, tk_missing;
};

static void compare_sets(const struct dumps *cpu, const struct dumps *gpu, struct sets_stat *s)
{
	for (int64_t i = 0; i < cpu->n; i++) {
		const struct dump_rec *c = &cpu->r[i];
		int ex = !strcmp(c->name, "ffn_moe_topk"), tk = !strcmp(c->name, "idx_topk");
		if (!ex && !tk)
			continue;
		const struct dump_rec *g = dump_find(gpu, c->name, c->layer, c->seq, c->pos);
		if (ex) {
			s->ex_rows++;
			if (!g) {
				s->ex_missing++;
				continue;
			}
			int64_t dd = nc_set_diff(c->i, c->n, g->i, g->n);
			if (dd && s->ex_rows - s->ex_same <= 3 + s->ex_missing)
				printf("    experts differ: layer %lld pos %lld: cpu [%d %d ..] gpu [%d %d ..]\n",
				       (long long)c->layer, (long long)c->pos, c->i[0], c->n > 1 ? c->i[1] : -1,
				       g->i[0], g->n > 1 ? g->i[1] : -1);
			s->ex_same += dd == 0;
		} else {
			s->tk_rows++;
			if (!g) {
				s->tk_missing++;
				continue;
			}
			int64_t dd = nc_set_diff(c->i, c->n, g->i, g->n);
			s->tk_same += dd == 0;
			s->tk_worst = dd > s->tk_worst ? dd : s->tk_worst;
		}
	}
}

static void check_sets(const char *what, const struct sets_stat *s, int have_moe)
{
	printf("    %s: experts identical on %lld of %lld (layer, row) (%lld not dumped by the GPU); "
	       "index top-k identical on %lld of %lld rows (%.3f, >= 0.9), worst row %lld keys off "
	       "(<= 2), %lld not dumped\n", what, (long long)s->ex_same, (long long)s->ex_rows,
	       (long long)s->ex_missing, (long long)s->tk_same, (long long)s->tk_rows,
	       s->tk_rows ? (double)s->tk_same / (double)s->tk_rows : 0.0, (long long)s->tk_worst,
	       (long long)s->tk_missing);
	if (have_moe)
		CHECK(s->ex_rows > 0);
	CHECK(s->ex_same == s->ex_rows);
	CHECK(s->tk_rows > 0);
	CHECK(s->tk_missing == 0);
	CHECK(s->tk_same >= 0.9 * (double)s->tk_rows);
	CHECK(s->tk_worst <= 2);
}

/* Every float intermediate both dumped: per-row relative L2, median and worst (diagnosis). */
static void compare_floats(const struct dumps *cpu, const struct dumps *gpu, int64_t layer)
{
	static const char *names[] = {"attn_norm", "q_cmpr", "q", "kv_cmpr", "k_pe", "idx_q", "idx_k",
				      "idx_w", "idx_scores", "q_lat", "attn_o", "attn_out", "ffn_norm",
				      "ffn_out", "ffn_moe_logits", "ffn_moe_weights", "ffn_moe_out"};
	for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
		double *e = malloc((size_t)(cpu->n ? cpu->n : 1) * sizeof *e);
		REQUIRE(e);
		int64_t n = 0, missing = 0, worst_pos = -1;
		double worst = 0;
		for (int64_t i = 0; i < cpu->n; i++) {
			const struct dump_rec *c = &cpu->r[i];
			if (c->layer != layer || strcmp(c->name, names[k]))
				continue;
			const struct dump_rec *g = dump_find(gpu, c->name, c->layer, c->seq, c->pos);
			if (!g || g->n != c->n) {
				missing++;
				continue;
			}
			e[n] = nc_rel_l2(g->f, c->f, c->n);
			if (e[n] > worst || worst_pos < 0)
				worst = e[n], worst_pos = c->pos;
			n++;
		}
		if (n || missing)
			printf("      layer %lld %-16s rows %4lld: rel L2 median %.2e worst %.2e (pos %lld)%s\n",
			       (long long)layer, names[k], (long long)n, nc_pct(e, n, 50), worst,
			       (long long)worst_pos, missing ? " (GPU rows missing or of another width)" : "");
		free(e);
	}
}

/* ---- backends ---------------------------------------------------------------------------------- */

struct pair {
	struct test_model m;
	struct backend *cpu, *gpu;
	int64_t T, V, D, L;
	int32_t *tok;
};

static void pair_open(struct pair *p, const char *name, int64_t T, int64_t n_pages, int invariant)
{
	memset(p, 0, sizeof *p);
	load_structured(&p->m, name);
	struct err e = {""};
	REQUIRE(backend_cpu_create(&p->m.c, &p->m.w, n_pages, 4, &p->cpu, &e) == 0);
	struct backend_cuda_opts o = {.n_pages = n_pages, .batch_invariant = invariant};
	if (backend_cuda_create_opts(&p->m.c, &p->m.w, &p->m.ck, &o, &p->gpu, &e)) {
		test_fail(__FILE__, __LINE__, "backend_cuda_create_opts: %s", e.msg);
		test_abort_case();
	}
	p->T = T, p->V = p->m.c.vocab_size, p->D = p->m.c.hidden_size, p->L = p->m.c.num_hidden_layers;
	p->tok = malloc((size_t)T * sizeof *p->tok);
	REQUIRE(p->tok);
	uint64_t seed = 77;
	for (int64_t t = 0; t < T; t++)
		p->tok[t] = (int32_t)(test_rand(&seed) % (uint64_t)p->V);
	printf("    model %s: %lld layers, hidden %lld, index_topk %lld, context %lld tokens; GPU mode: "
	       "%s\n", name, (long long)p->L, (long long)p->D, (long long)p->m.c.index_topk,
	       (long long)T, backend_cuda_mode(p->gpu));
}

static void pair_close(struct pair *p)
{
	backend_destroy(p->cpu);
	backend_destroy(p->gpu);
	free(p->tok);
	test_model_free(&p->m);
}

/* Rows [p0, p0 + n) of one sequence, every row flagged fl; outputs at logits/hidden + p0 rows. */
static void seq_rows(struct backend_seq *s, const struct pair *p, int64_t p0, int64_t n, int64_t *pos,
		     uint8_t *fl, unsigned flags, const int32_t *bt, int64_t nb, float *logits, float *hidden)
{
	for (int64_t i = 0; i < n; i++)
		pos[i] = p0 + i, fl[i] = (uint8_t)flags;
	*s = (struct backend_seq){n, p->tok + p0, pos, bt, nb, fl,
				  logits ? logits + p0 * p->V : NULL, hidden ? hidden + p0 * p->D : NULL,
				  NULL, 0};
}

/* Steps of n rows over positions [p0, p1) of one sequence (pages bt), every row flagged logits
 * and hidden, run eagerly and then through captured graphs (DSV32_CUDA_GRAPHS=0 / 1): the
 * logits and the hidden rows must be the same bits. mtp_hidden: NULL for main steps, else the
 * MTP step's input rows h_i for position i (tokens x_{i+1}). The shapes of a drafting step:
 * main steps of 2 rows with hidden rows (a verification), MTP steps. */
static void graphs_with_hidden_rows(const char *what, struct pair *p, int64_t p0, int64_t p1, int64_t n,
				    const int32_t *bt, int64_t nb, const float *mtp_hidden)
{
	int64_t V = p->V, D = p->D, R = p1 - p0;
	float *lg[2], *hd[2];
	for (int k = 0; k < 2; k++) {
		lg[k] = malloc((size_t)R * V * 4), hd[k] = malloc((size_t)R * D * 4);
		REQUIRE(lg[k] && hd[k]);
		gpu_fill_nan(lg[k], R * V), gpu_fill_nan(hd[k], R * D);
	}
	int64_t *pos = malloc((size_t)n * sizeof *pos);
	uint8_t *fl = malloc((size_t)n);
	REQUIRE(pos && fl);
	int64_t replays0 = 0, replays1 = 0, captures = 0;
	for (int mode = 0; mode < 2; mode++) {
		set_switch(p->gpu, "DSV32_CUDA_GRAPHS", mode ? "1" : "0");
		if (mode)
			backend_cuda_graph_stats(p->gpu, &captures, &replays0);
		for (int64_t a = p0; a < p1; a += n) {
			int64_t m = p1 - a < n ? p1 - a : n;
			struct backend_seq s;
			seq_rows(&s, p, a, m, pos, fl, BACKEND_ROW_LOGITS | BACKEND_ROW_HIDDEN, bt, nb, NULL, NULL);
			if (mtp_hidden)
				s.tokens = p->tok + a + 1, s.mtp_hidden = mtp_hidden + a * D;
			s.logits = lg[mode] + (a - p0) * V, s.hidden = hd[mode] + (a - p0) * D;
			struct backend_step st = {mtp_hidden != NULL, 1, &s, NULL};
			int rc = backend_step(p->gpu, &st);
			if (rc) {
				test_fail(__FILE__, __LINE__, "%s: step at %lld (%s) = %d", what, (long long)a,
					  mode ? "graphs" : "eager", rc);
				break;
			}
		}
	}
	backend_cuda_graph_stats(p->gpu, &captures, &replays1);
	set_switch(p->gpu, "DSV32_CUDA_GRAPHS", NULL);
	int64_t same_l = 0, same_h = 0;
	for (int64_t t = 0; t < R; t++) {
		same_l += !memcmp(lg[0] + t * V, lg[1] + t * V, (size_t)V * 4);
		same_h += !memcmp(hd[0] + t * D, hd[1] + t * D, (size_t)D * 4);
	}
	printf("    %s, steps of %lld rows: eager vs graphs (%lld replays): logits %lld of %lld rows, "
	       "hidden rows %lld of %lld bit-identical\n", what, (long long)n,
	       (long long)(replays1 - replays0), (long long)same_l, (long long)R, (long long)same_h,
	       (long long)R);
	CHECK(same_l == R && same_h == R);
	CHECK(replays1 - replays0 >= (R + n - 1) / n - 2); /* (the first of each shape captures) */
	for (int k = 0; k < 2; k++)
		free(lg[k]), free(hd[k]);
	free(pos), free(fl);
}

/* h_i kept on the device (BACKEND_ROW_KEEP, backend.h) against the same h_i downloaded and
 * given back (mtp_hidden): a main step over positions [p0, p1) keeps its rows (and returns
 * them), then MTP steps of 16 rows over the same positions read them given, kept through graphs
 * (the default) and kept eagerly; then the main step again in passes of 7 rows
 * (DSV32_CUDA_MAX_ROWS=7: each pass keeps its rows after the earlier passes') and the MTP steps
 * from its kept rows in passes of 7 rows too (each pass reads its own rows' h_i): the same
 * logits, bit for bit (batch-invariant mode). */
static void kept_rows_equal_given(const char *name, struct pair *p, int64_t p0, int64_t p1,
				  const int32_t *bt, int64_t nb)
{
	int64_t V = p->V, D = p->D, R = p1 - p0;
	float *hid = malloc((size_t)R * D * 4), *lm = malloc((size_t)R * V * 4), *lg[4];
	int64_t *pos = malloc((size_t)R * sizeof *pos);
	uint8_t *fl = malloc((size_t)R);
	REQUIRE(hid && lm && pos && fl);
	for (int k = 0; k < 4; k++) {
		REQUIRE(lg[k] = malloc((size_t)R * V * 4));
		gpu_fill_nan(lg[k], R * V);
	}
	struct backend_seq s;
	seq_rows(&s, p, p0, R, pos, fl, BACKEND_ROW_LOGITS | BACKEND_ROW_HIDDEN | BACKEND_ROW_KEEP, bt,
		 nb, NULL, NULL);
	s.logits = lm, s.hidden = hid;
	struct backend_step st = {0, 1, &s, NULL};
	REQUIRE(backend_step(p->gpu, &st) == 0);
	int rc = 0;
	for (int k = 0; k < 4 && !rc; k++) { /* given; kept, graphs; kept, eager; kept in passes */
		set_switch(p->gpu, "DSV32_CUDA_GRAPHS", k == 2 ? "0" : NULL);
		if (k == 3) { /* (passes of 7 rows for the MTP steps below too) */
			set_switch(p->gpu, "DSV32_CUDA_MAX_ROWS", "7");
			seq_rows(&s, p, p0, R, pos, fl, BACKEND_ROW_LOGITS | BACKEND_ROW_KEEP, bt, nb, NULL,
				 NULL);
			s.logits = lm;
			rc = backend_step(p->gpu, &st);
		}
		for (int64_t a = p0; a < p1 && !rc; a += 16) {
			int64_t m = p1 - a < 16 ? p1 - a : 16;
			seq_rows(&s, p, a, m, pos, fl, BACKEND_ROW_LOGITS, bt, nb, NULL, NULL);
			s.tokens = p->tok + a + 1, s.logits = lg[k] + (a - p0) * V;
			s.mtp_hidden = k ? NULL : hid + (a - p0) * D, s.mtp_kept = a - p0;
			struct backend_step ms = {1, 1, &s, NULL};
			rc = backend_step(p->gpu, &ms);
		}
	}
	set_switch(p->gpu, "DSV32_CUDA_GRAPHS", NULL);
	set_switch(p->gpu, "DSV32_CUDA_MAX_ROWS", NULL);
	int64_t same[3] = {0, 0, 0};
	for (int k = 1; k < 4; k++)
		for (int64_t t = 0; t < R; t++)
			same[k - 1] += !memcmp(lg[0] + t * V, lg[k] + t * V, (size_t)V * 4);
	printf("    %s MTP steps of 16 rows from kept rows vs given h_i: %lld (graphs), %lld (eager), "
	       "%lld (kept and read in passes of 7 rows) of %lld rows bit-identical (rc %d)\n",
	       name, (long long)same[0], (long long)same[1], (long long)same[2], (long long)R, rc);
	CHECK(rc == 0 && same[0] == R && same[1] == R && same[2] == R);
	for (int k = 0; k < 4; k++)
		free(lg[k]);
	free(hid), free(lm), free(pos), free(fl);
}

/* ---- the cases -------------------------------------------------------------------------------- */

/* Teacher forcing: the CPU's layer input for layer l goes to both backends' layer step. */
static void teacher_forcing(const char *name, int64_t T)
{
	struct pair p;
	int64_t nb = (T + 63) / 64;
	pair_open(&p, name, T, nb, 1);
	int64_t D = p.D, L = p.L;
	int32_t *bt = malloc((size_t)nb * sizeof *bt);
	for (int64_t i = 0; i < nb; i++)
		bt[i] = (int32_t)(nb - 1 - i); /* pages out of order */
	int64_t *pos = malloc((size_t)T * sizeof *pos);
	uint8_t *fl = calloc((size_t)T, 1);
	float *x = malloc((size_t)T * D * 4), *r = calloc((size_t)T * D, 4);
	float *gx = malloc((size_t)T * D * 4), *gr = malloc((size_t)T * D * 4);
	float *x_in = malloc((size_t)T * D * 4), *r_in = malloc((size_t)T * D * 4);
	double *e = malloc((size_t)T * sizeof *e);
	REQUIRE(bt && pos && fl && x && r && gx && gr && x_in && r_in && e);
	cpu_embed(&p.m.w.embed, p.tok, T, x);
	struct backend_seq s;
	seq_rows(&s, &p, 0, T, pos, fl, 0, bt, nb, NULL, NULL);
	struct sets_stat all = {0};
	int64_t n_layers = L + (p.m.w.has_mtp ? 1 : 0);
	for (int64_t l = 0; l < n_layers; l++) {
		struct dumps dc = {0}, dg = {0};
		struct backend_dump cd = {dump_cb, &dc}, gd = {dump_cb, &dg};
		struct backend_step stc = {0, 1, &s, &cd}, stg = {0, 1, &s, &gd};
		memcpy(gx, x, (size_t)T * D * 4);
		memcpy(gr, r, (size_t)T * D * 4);
		memcpy(x_in, x, (size_t)T * D * 4);
		memcpy(r_in, r, (size_t)T * D * 4);
		REQUIRE(backend_cpu_layer_step(p.cpu, l, &stc, x, r) == 0);
		int rc = backend_cuda_layer_step(p.gpu, l, &stg, gx, gr);
		if (rc) {
			test_fail(__FILE__, __LINE__, "backend_cuda_layer_step(layer %lld) = %d", (long long)l, rc);
			dumps_free(&dc), dumps_free(&dg);
			break;
		}
		{ /* the same layer through the separate kernels (DSV32_CUDA_UNFUSED=1): same bits */
			float *ux = malloc((size_t)T * D * 4), *ur = malloc((size_t)T * D * 4);
			REQUIRE(ux && ur);
			memcpy(ux, x_in, (size_t)T * D * 4);
			memcpy(ur, r_in, (size_t)T * D * 4);
			set_switch(p.gpu, "DSV32_CUDA_UNFUSED", "1");
			struct backend_step stu = {0, 1, &s, NULL};
			int ru = backend_cuda_layer_step(p.gpu, l, &stu, ux, ur);
			set_switch(p.gpu, "DSV32_CUDA_UNFUSED", NULL);
			int64_t same = 0;
			for (int64_t t = 0; t < T; t++)
				same += !memcmp(ux + t * D, gx + t * D, (size_t)D * 4) &&
					!memcmp(ur + t * D, gr + t * D, (size_t)D * 4);
			printf("    %s layer %lld: fused kernels vs separate ones: %lld of %lld rows "
			       "bit-identical (rc %d)\n", name, (long long)l, (long long)same, (long long)T, ru);
			CHECK(ru == 0 && same == T);
			/* the decode-sized fusions (q_pe RoPE in the q absorption, weights_proj in the
			 * indexer query kernel, W_UV's act_quant) on the first 1, 3 and 5 rows, fast mode
			 * (at 5 the MoE block's token-wide GEMMs against the wgmma tile form's) */
			for (int64_t nr = 1; nr <= 5; nr += 2) {
				float *fx = malloc((size_t)nr * D * 4), *fr = malloc((size_t)nr * D * 4);
				REQUIRE(fx && fr);
				struct backend_seq s1 = s;
				s1.n = nr;
				struct backend_step st1 = {0, 1, &s1, NULL};
				int was = backend_cuda_set_batch_invariant(p.gpu, 0);
				memcpy(ux, x_in, (size_t)nr * D * 4), memcpy(ur, r_in, (size_t)nr * D * 4);
				int r1 = backend_cuda_layer_step(p.gpu, l, &st1, ux, ur);
				memcpy(fx, x_in, (size_t)nr * D * 4), memcpy(fr, r_in, (size_t)nr * D * 4);
				set_switch(p.gpu, "DSV32_CUDA_UNFUSED", "1");
				int r2 = backend_cuda_layer_step(p.gpu, l, &st1, fx, fr);
				set_switch(p.gpu, "DSV32_CUDA_UNFUSED", NULL);
				backend_cuda_set_batch_invariant(p.gpu, was);
				int eq = !memcmp(ux, fx, (size_t)nr * D * 4) && !memcmp(ur, fr, (size_t)nr * D * 4);
				printf("    %s layer %lld, %lld row(s), fast mode: fused kernels vs separate ones "
				       "%s (rc %d %d)\n", name, (long long)l, (long long)nr,
				       eq ? "bit-identical" : "DIFFER", r1, r2);
				CHECK(r1 == 0 && r2 == 0 && eq);
				free(fx), free(fr);
			}
			/* and with every bf16 product on the tensor cores (the fast mode's path above 8
			 * rows; the invariant mode runs them on the CUDA cores in the CPU's order): they
			 * differ only in the fp32 order of the sums */
			memcpy(ux, x_in, (size_t)T * D * 4);
			memcpy(ur, r_in, (size_t)T * D * 4);
			set_switch(p.gpu, "DSV32_CUDA_MMA_ROWS", "1");
			ru = backend_cuda_layer_step(p.gpu, l, &stu, ux, ur);
			set_switch(p.gpu, "DSV32_CUDA_MMA_ROWS", NULL);
			double *em = malloc((size_t)T * sizeof *em);
			REQUIRE(em);
			for (int64_t t = 0; t < T; t++)
				em[t] = nc_rel_l2(gx + t * D, ux + t * D, D);
			double mmed = nc_pct(em, T, 50), mmax = nc_pct(em, T, 100);
			printf("    %s layer %lld: tensor-core products vs CUDA-core (CPU order): output rel "
			       "L2 median %.2e max %.2e (rc %d)\n", name, (long long)l, mmed, mmax, ru);
			CHECK(ru == 0 && mmed <= 1e-2);
			/* the fast mode on the same input: its departure from the CPU, printed only */
			memcpy(ux, x_in, (size_t)T * D * 4);
			memcpy(ur, r_in, (size_t)T * D * 4);
			struct dumps df = {0};
			struct backend_dump fd = {dump_cb, &df};
			struct backend_step stf = {0, 1, &s, &fd};
			int was = backend_cuda_set_batch_invariant(p.gpu, 0);
			ru = backend_cuda_layer_step(p.gpu, l, &stf, ux, ur);
			backend_cuda_set_batch_invariant(p.gpu, was);
			for (int64_t t = 0; t < T; t++)
				em[t] = nc_rel_l2(ux + t * D, x + t * D, D);
			struct sets_stat fs = {0};
			compare_sets(&dc, &df, &fs);
			printf("    %s layer %lld: fast mode (informational, its departure from the CPU): "
			       "output rel L2 median %.2e p90 %.2e max %.2e; experts %lld/%lld identical, "
			       "top-k %lld/%lld identical, worst %lld keys off (rc %d)\n", name, (long long)l,
			       nc_pct(em, T, 50), nc_pct(em, T, 90), nc_pct(em, T, 100),
			       (long long)fs.ex_same, (long long)fs.ex_rows, (long long)fs.tk_same,
			       (long long)fs.tk_rows, (long long)fs.tk_worst, ru);
			CHECK(ru == 0);
			dumps_free(&df);
			free(em);
			free(ux), free(ur);
		}
		int64_t worst = 0;
		for (int64_t t = 0; t < T; t++) {
			e[t] = nc_rel_l2(gx + t * D, x + t * D, D);
			if (e[t] > e[worst])
				worst = t;
		}
		double w = e[worst], med = nc_pct(e, T, 50), p90 = nc_pct(e, T, 90);
		struct sets_stat st = {0};
		compare_sets(&dc, &dg, &st);
		printf("    %s layer %lld%s (teacher forced): output rel L2 median %.2e (limit 1e-2) p90 "
		       "%.2e worst %.2e at row %lld; experts %lld/%lld identical, top-k %lld/%lld "
		       "identical, worst %lld keys off\n", name, (long long)l, l == L ? " (MTP)" : "",
		       med, p90, w, (long long)worst, (long long)st.ex_same, (long long)st.ex_rows,
		       (long long)st.tk_same, (long long)st.tk_rows, (long long)st.tk_worst);
		if (!(med <= 1e-2) || st.ex_same != st.ex_rows || st.tk_worst > 2 || l == 0)
			compare_floats(&dc, &dg, l);
		CHECK(med <= 1e-2);
		all.ex_rows += st.ex_rows, all.ex_same += st.ex_same, all.ex_missing += st.ex_missing;
		all.tk_rows += st.tk_rows, all.tk_same += st.tk_same, all.tk_missing += st.tk_missing;
		all.tk_worst = st.tk_worst > all.tk_worst ? st.tk_worst : all.tk_worst;
		dumps_free(&dc), dumps_free(&dg);
		/* the next layer's input is the CPU's (teacher forcing); the MTP layer takes the last
		 * main layer's output as its input (any input serves a like-with-like check) */
	}
	check_sets("teacher forced, all layers", &all, 1);
	free(bt), free(pos), free(fl), free(x), free(r), free(gx), free(gr), free(x_in), free(r_in), free(e);
	pair_close(&p);
}

/* End to end: CPU full prefill; GPU chunked prefill (dumps), then decode mixed with chunks. */
static void end_to_end(const char *name, int64_t T, int64_t chunk)
{
	struct pair p;
	int64_t nb = (T + 63) / 64;
	pair_open(&p, name, T, 3 * nb, 1);
	int64_t V = p.V, D = p.D;
	int32_t *bt = malloc((size_t)3 * nb * sizeof *bt); /* seq A, B, C: 3 disjoint page sets */
	for (int64_t i = 0; i < 3 * nb; i++)
		bt[i] = (int32_t)((i * 7 + 3) % (3 * nb)); /* a permutation when 3 * nb % 7 != 0 */
	REQUIRE((3 * nb) % 7 != 0);
	int64_t *pos = malloc((size_t)T * 3 * sizeof *pos);
	uint8_t *fl = malloc((size_t)T * 3);
	float *ref = malloc((size_t)T * V * 4), *hid = malloc((size_t)T * D * 4);
	float *ga = malloc((size_t)T * V * 4), *gb = malloc((size_t)T * V * 4), *gc = malloc((size_t)T * V * 4);
	REQUIRE(bt && pos && fl && ref && hid && ga && gb && gc);
	gpu_fill_nan(ga, T * V), gpu_fill_nan(gb, T * V), gpu_fill_nan(gc, T * V);

	/* CPU: the whole sequence in one step, logits and hidden state of every row, dumps */
	struct dumps dc = {0}, dg = {0};
	struct backend_dump cd = {dump_cb, &dc}, gd = {dump_cb, &dg};
	struct backend_seq s[2];
	seq_rows(&s[0], &p, 0, T, pos, fl, BACKEND_ROW_LOGITS | BACKEND_ROW_HIDDEN, bt, nb, ref, hid);
	struct backend_step st = {0, 1, s, &cd};
	REQUIRE(backend_step(p.cpu, &st) == 0);

	/* GPU A: chunked prefill with dumps */
	for (int64_t p0 = 0; p0 < T; p0 += chunk) {
		int64_t n = T - p0 < chunk ? T - p0 : chunk;
		seq_rows(&s[0], &p, p0, n, pos, fl, BACKEND_ROW_LOGITS, bt, nb, ga, NULL);
		struct backend_step sg = {0, 1, s, &gd};
		int rc = backend_step(p.gpu, &sg);
		if (rc) {
			test_fail(__FILE__, __LINE__, "cuda step (rows %lld..%lld) = %d", (long long)p0,
				  (long long)(p0 + n), rc);
			test_abort_case();
		}
	}
	struct sets_stat ss = {0};
	compare_sets(&dc, &dg, &ss);
	char what[128];
	snprintf(what, sizeof what, "%s e2e prefill in chunks of %lld", name, (long long)chunk);
	check_sets(what, &ss, 1);
	check_logits(what, ga, ref, T, V);
	if (ss.ex_same != ss.ex_rows)
		for (int64_t l = 0; l < p.L; l++)
			compare_floats(&dc, &dg, l);
	dumps_free(&dc), dumps_free(&dg);

	/* GPU A again: the whole sequence as one step, run by the backend in passes of 37 rows
	 * (what a step larger than the scratch arena does) */
	{
		float *gs = malloc((size_t)T * V * 4);
		REQUIRE(gs);
		gpu_fill_nan(gs, T * V);
		set_switch(p.gpu, "DSV32_CUDA_MAX_ROWS", "37");
		seq_rows(&s[0], &p, 0, T, pos, fl, BACKEND_ROW_LOGITS, bt, nb, gs, NULL);
		struct backend_step sg = {0, 1, s, NULL};
		int rc = backend_step(p.gpu, &sg);
		set_switch(p.gpu, "DSV32_CUDA_MAX_ROWS", NULL);
		if (rc)
			test_fail(__FILE__, __LINE__, "cuda step in passes = %d", rc);
		snprintf(what, sizeof what, "%s e2e one step of %lld rows in passes of 37", name, (long long)T);
		check_logits(what, gs, ref, T, V);
		free(gs);
	}

	/* GPU B (token by token) and C (16-row chunks) in the same steps */
	int64_t pc = 0;
	for (int64_t pb = 0; pb < T; pb++) {
		int64_t ns = 1;
		seq_rows(&s[0], &p, pb, 1, pos + T, fl + T, BACKEND_ROW_LOGITS, bt + nb, nb, gb, NULL);
		if (pc < T && pb % 4 == 0) {
			int64_t n = T - pc < 16 ? T - pc : 16;
			seq_rows(&s[1], &p, pc, n, pos + 2 * T, fl + 2 * T, BACKEND_ROW_LOGITS, bt + 2 * nb, nb,
				 gc, NULL);
			pc += n, ns = 2;
		}
		struct backend_step sg = {0, ns, s, NULL};
		int rc = backend_step(p.gpu, &sg);
		if (rc) {
			test_fail(__FILE__, __LINE__, "cuda mixed step (decode row %lld) = %d", (long long)pb, rc);
			test_abort_case();
		}
	}
	while (pc < T) {
		int64_t n = T - pc < 16 ? T - pc : 16;
		seq_rows(&s[0], &p, pc, n, pos + 2 * T, fl + 2 * T, BACKEND_ROW_LOGITS, bt + 2 * nb, nb, gc, NULL);
		struct backend_step sg = {0, 1, s, NULL};
		REQUIRE(backend_step(p.gpu, &sg) == 0);
		pc += n;
	}
	snprintf(what, sizeof what, "%s e2e token-by-token decode (mixed steps)", name);
	check_logits(what, gb, ref, T, V);
	snprintf(what, sizeof what, "%s e2e 16-row chunks (mixed steps)", name);
	check_logits(what, gc, ref, T, V);
	{ /* GPU D: seq B's last 48 positions again one token per step, eagerly and then through
	   * captured graphs (DSV32_CUDA_GRAPHS=0 / 1): the same bits, and the step times */
		int64_t d0 = T - 48;
		float *ge = malloc((size_t)T * V * 4), *gg = malloc((size_t)T * V * 4);
		REQUIRE(ge && gg);
		gpu_fill_nan(ge, T * V), gpu_fill_nan(gg, T * V);
		double us[2] = {0, 0};
		for (int mode = 0; mode < 2; mode++) {
			set_switch(p.gpu, "DSV32_CUDA_GRAPHS", mode ? "1" : "0");
			struct timespec a, b;
			clock_gettime(CLOCK_MONOTONIC, &a);
			for (int64_t pb = d0; pb < T; pb++) {
				seq_rows(&s[0], &p, pb, 1, pos + T, fl + T, BACKEND_ROW_LOGITS, bt + nb, nb,
					 mode ? gg : ge, NULL);
				struct backend_step sg = {0, 1, s, NULL};
				int rc = backend_step(p.gpu, &sg);
				if (rc) {
					test_fail(__FILE__, __LINE__, "cuda decode step (%s, row %lld) = %d",
						  mode ? "graphs" : "eager", (long long)pb, rc);
					break;
				}
			}
			clock_gettime(CLOCK_MONOTONIC, &b);
			us[mode] = ((double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) * 1e-3) / (double)(T - d0);
		}
		set_switch(p.gpu, "DSV32_CUDA_GRAPHS", NULL);
		int64_t same = 0, first = -1;
		for (int64_t t = d0; t < T; t++) {
			int eq = !memcmp(gg + t * V, ge + t * V, (size_t)V * 4);
			same += eq;
			if (!eq && first < 0)
				first = t;
		}
		printf("    %s decode one token per step: eager %.1f us/step, graphs %.1f us/step (%.2fx); "
		       "%lld of %lld rows bit-identical (first differing row %lld)\n", name, us[0], us[1],
		       us[1] > 0 ? us[0] / us[1] : 0.0, (long long)same, (long long)(T - d0), (long long)first);
		CHECK(same == T - d0);
		snprintf(what, sizeof what, "%s e2e decode through graphs (last 48 rows)", name);
		check_logits(what, gg + d0 * V, ref + d0 * V, T - d0, V);
		free(ge), free(gg);
	}
	snprintf(what, sizeof what, "%s decode with hidden rows", name);
	graphs_with_hidden_rows(what, &p, T - 32, T, 2, bt + nb, nb, NULL);
	for (int k = 0; k < 2; k++) { /* batch invariance: B's and C's rows are A's bits */
		const float *g = k ? gc : gb;
		double *e = malloc((size_t)T * sizeof *e);
		REQUIRE(e);
		int64_t same = 0, first = -1;
		for (int64_t t = 0; t < T; t++) {
			e[t] = nc_rel_l2(g + t * V, ga + t * V, V);
			int eq = !memcmp(g + t * V, ga + t * V, (size_t)V * 4);
			same += eq;
			if (!eq && first < 0)
				first = t;
		}
		printf("    %s batch invariance: GPU %s vs GPU prefill in chunks of %lld: %lld of %lld rows "
		       "bit-identical (first differing row %lld; rel L2 median %.2e p90 %.2e)\n", name,
		       k ? "16-row chunks mixed with decode rows" : "token-by-token decode (mixed steps)",
		       (long long)chunk, (long long)same, (long long)T, (long long)first, nc_pct(e, T, 50),
		       nc_pct(e, T, 90));
		CHECK(same == T);
		free(e);
	}

	/* MTP (spec §4): rows i = 0..T-2 carry x_{i+1}, pos i, h_i (the CPU's hidden states) */
	if (p.m.w.has_mtp) {
		int64_t n = T - 1;
		float *mref = malloc((size_t)n * V * 4), *mg = malloc((size_t)n * V * 4);
		REQUIRE(mref && mg);
		gpu_fill_nan(mg, n * V);
		for (int64_t i = 0; i < n; i++)
			pos[i] = i, fl[i] = BACKEND_ROW_LOGITS;
		struct backend_seq ms = {n, p.tok + 1, pos, bt, nb, fl, mref, NULL, hid, 0};
		struct backend_step mst = {1, 1, &ms, NULL};
		REQUIRE(backend_step(p.cpu, &mst) == 0);
		ms.logits = mg;
		int rc = backend_step(p.gpu, &mst);
		if (rc)
			test_fail(__FILE__, __LINE__, "cuda MTP step = %d", rc);
		else {
			snprintf(what, sizeof what, "%s MTP step", name);
			check_logits(what, mg, mref, n, V);
		}
		snprintf(what, sizeof what, "%s MTP steps", name);
		graphs_with_hidden_rows(what, &p, n - 48, n, 16, bt, nb, hid);
		kept_rows_equal_given(name, &p, n - 48, n, bt, nb);
		free(mref), free(mg);
	}
	free(bt), free(pos), free(fl), free(ref), free(hid), free(ga), free(gb), free(gc);
	pair_close(&p);
}

TEST_T(gpu_forward, teacher_forced_layers_tiny, 300)
{
	teacher_forcing("tiny", 200); /* index_topk 64: > 2 x 64 keys */
}

/* The same with the diagnosis attention kernel (fp32 probabilities, as the CPU): how much of a
 * layer's difference is the production kernel's bf16 P (DSV32_CUDA_MLA_FP32=1). */
TEST_T(gpu_forward, teacher_forced_layers_tiny_fp32_attention, 300)
{
	setenv("DSV32_CUDA_MLA_FP32", "1", 1); /* read when the backend is created */
	teacher_forcing("tiny", 200);
	unsetenv("DSV32_CUDA_MLA_FP32");
}

TEST_T(gpu_forward, teacher_forced_layers_wide, 300)
{
	teacher_forcing("wide", 160); /* index_topk 48 */
}

TEST_T(gpu_forward, end_to_end_tiny, 600)
{
	end_to_end("tiny", 200, 48);
}

TEST_T(gpu_forward, end_to_end_wide, 600)
{
	end_to_end("wide", 160, 70);
}

/* The fast mode end to end: the whole sequence as one step (T > 64 rows: the large-M GEMM and
 * MoE paths), then in two chunks, each against the CPU with the limits above; its expert and
 * top-k agreement printed (informational: the fast path's departure), and its rows against
 * the batch-invariant mode's. */
static void fast_mode(const char *name, int64_t T)
{
	struct pair p;
	int64_t nb = (T + 63) / 64;
	pair_open(&p, name, T, nb, 0);
	int64_t V = p.V;
	int32_t *bt = malloc((size_t)nb * sizeof *bt);
	int64_t *pos = malloc((size_t)T * sizeof *pos);
	uint8_t *fl = malloc((size_t)T);
	float *ref = malloc((size_t)T * V * 4), *g1 = malloc((size_t)T * V * 4);
	float *g2 = malloc((size_t)T * V * 4), *gi = malloc((size_t)T * V * 4);
	REQUIRE(bt && pos && fl && ref && g1 && g2 && gi);
	for (int64_t i = 0; i < nb; i++)
		bt[i] = (int32_t)(nb - 1 - i); /* pages out of order (a permutation for any nb) */
	gpu_fill_nan(g1, T * V), gpu_fill_nan(g2, T * V), gpu_fill_nan(gi, T * V);
	struct dumps dc = {0}, dg = {0};
	struct backend_dump cd = {dump_cb, &dc}, gd = {dump_cb, &dg};
	struct backend_seq s;
	seq_rows(&s, &p, 0, T, pos, fl, BACKEND_ROW_LOGITS, bt, nb, ref, NULL);
	struct backend_step st = {0, 1, &s, &cd};
	REQUIRE(backend_step(p.cpu, &st) == 0);
	char what[160];
	/* one step of T rows, with dumps (the sets) */
	seq_rows(&s, &p, 0, T, pos, fl, BACKEND_ROW_LOGITS, bt, nb, g1, NULL);
	struct backend_step sg = {0, 1, &s, &gd};
	int rc = backend_step(p.gpu, &sg);
	CHECK_EQ_INT(rc, 0);
	struct sets_stat ss = {0};
	compare_sets(&dc, &dg, &ss);
	printf("    %s fast mode, one step of %lld rows: experts identical on %lld of %lld (layer, "
	       "row), index top-k on %lld of %lld rows, worst %lld keys off (informational)\n", name,
	       (long long)T, (long long)ss.ex_same, (long long)ss.ex_rows, (long long)ss.tk_same,
	       (long long)ss.tk_rows, (long long)ss.tk_worst);
	snprintf(what, sizeof what, "%s fast mode, one step of %lld rows", name, (long long)T);
	check_logits(what, g1, ref, T, V);
	dumps_free(&dc), dumps_free(&dg);
	/* two chunks (the second attends to the first's cache) */
	int64_t h = T / 2;
	seq_rows(&s, &p, 0, h, pos, fl, BACKEND_ROW_LOGITS, bt, nb, g2, NULL);
	struct backend_step s2 = {0, 1, &s, NULL};
	CHECK_EQ_INT(backend_step(p.gpu, &s2), 0);
	seq_rows(&s, &p, h, T - h, pos, fl, BACKEND_ROW_LOGITS, bt, nb, g2, NULL);
	CHECK_EQ_INT(backend_step(p.gpu, &s2), 0);
	snprintf(what, sizeof what, "%s fast mode, chunks of %lld and %lld rows", name, (long long)h,
		 (long long)(T - h));
	check_logits(what, g2, ref, T, V);
	/* the batch-invariant mode on the same backend: how far the fast rows are from it */
	backend_cuda_set_batch_invariant(p.gpu, 1);
	seq_rows(&s, &p, 0, T, pos, fl, BACKEND_ROW_LOGITS, bt, nb, gi, NULL);
	CHECK_EQ_INT(backend_step(p.gpu, &s2), 0);
	backend_cuda_set_batch_invariant(p.gpu, 0);
	snprintf(what, sizeof what, "%s batch-invariant mode (same backend, mode switch)", name);
	check_logits(what, gi, ref, T, V);
	double *e = malloc((size_t)T * sizeof *e);
	REQUIRE(e);
	for (int64_t t = 0; t < T; t++)
		e[t] = nc_rel_l2(g1 + t * V, gi + t * V, V);
	printf("    %s fast vs batch-invariant logits: rel L2 median %.2e p90 %.2e (informational)\n",
	       name, nc_pct(e, T, 50), nc_pct(e, T, 90));
	free(e);
	/* decode-sized steps of 1, 2 and 3 rows over the last 48 positions (the few-row kernels:
	 * q absorption by 1, 2 and 4 rows a block, W_UV by 1 and 4, the 1-4 row products), in both
	 * modes: the fast one within the limits, the invariant one bit-identical to its one-step
	 * rows above */
	int64_t d0 = T - 48;
	for (int inv = 0; inv < 2; inv++) {
		float *gd = malloc((size_t)T * V * 4);
		REQUIRE(gd);
		gpu_fill_nan(gd, T * V);
		backend_cuda_set_batch_invariant(p.gpu, inv);
		for (int64_t p0 = d0, k = 0; p0 < T; k++) {
			int64_t n = 1 + k % 3;
			n = n < T - p0 ? n : T - p0;
			seq_rows(&s, &p, p0, n, pos, fl, BACKEND_ROW_LOGITS, bt, nb, gd, NULL);
			rc = backend_step(p.gpu, &s2);
			if (rc) {
				test_fail(__FILE__, __LINE__, "decode step of %lld rows at %lld = %d",
					  (long long)n, (long long)p0, rc);
				break;
			}
			p0 += n;
		}
		backend_cuda_set_batch_invariant(p.gpu, 0);
		snprintf(what, sizeof what, "%s %s mode, steps of 1-3 rows (last 48 positions)", name,
			 inv ? "batch-invariant" : "fast");
		check_logits(what, gd + d0 * V, ref + d0 * V, T - d0, V);
		if (inv) {
			int64_t same = 0;
			for (int64_t t = d0; t < T; t++)
				same += !memcmp(gd + t * V, gi + t * V, (size_t)V * 4);
			printf("    %s batch invariance: steps of 1-3 rows vs one step of %lld rows: %lld of "
			       "%lld rows bit-identical\n", name, (long long)T, (long long)same,
			       (long long)(T - d0));
			CHECK(same == T - d0);
		}
		{ /* the last position again as a one-row step, eagerly (a replayed graph would not
		   * see the switches): with the fused kernels, the separate ones (DSV32_CUDA_UNFUSED=1:
		   * k_embed and the residual copy, the unfused norms, the separate SwiGLU and
		   * act_quant), no programmatic dependent launch (DSV32_CUDA_FWD_PDL=0), no side
		   * stream (DSV32_CUDA_FWD_FORK=0) or forked before the scores (=3), the query
		   * branch forked after the scores instead of after the norms (DSV32_CUDA_QB_EARLY=0;
		   * this context's default is after the norms), programmatic launches at one row too
		   * (DSV32_CUDA_FWD_PDL=1), the logits (into a malloc'd buffer) through the
		   * pinned staging buffer (the default there) or straight in (DSV32_CUDA_LOGITS_STAGED=0),
		   * and into the backend's pinned host memory (backend_host_alloc), straight in (the
		   * default there) or staged (DSV32_CUDA_LOGITS_STAGED=1): the same bits. And q_b with
		   * the indexer's q_b as one GEMM (DSV32_CUDA_QB_FUSE=1, fast mode only: its K split
		   * may differ from the parts', so within rel L2 0.1 of the default's logits; in the
		   * batch-invariant mode it does not apply: the same bits) */
			enum { NS = 11, NP = 9, FUSE = 7 }; /* settings; the first NP into malloc'd buffers */
			static const char *sw[NS] = {NULL, "DSV32_CUDA_UNFUSED=1", "DSV32_CUDA_FWD_PDL=0",
						     "DSV32_CUDA_FWD_PDL=1", "DSV32_CUDA_FWD_FORK=0",
						     "DSV32_CUDA_FWD_FORK=3", "DSV32_CUDA_QB_EARLY=0",
						     "DSV32_CUDA_QB_FUSE=1",
						     "DSV32_CUDA_LOGITS_STAGED=0", NULL,
						     "DSV32_CUDA_LOGITS_STAGED=1"};
			float *lf = malloc((size_t)NS * V * 4);
			float *pin = backend_host_alloc(p.gpu, (size_t)(NS - NP) * V * 4);
			REQUIRE(lf && pin);
			gpu_fill_nan(lf, NS * V);
			gpu_fill_nan(pin, (NS - NP) * V);
			backend_cuda_set_batch_invariant(p.gpu, inv);
			set_switch(p.gpu, "DSV32_CUDA_GRAPHS", "0");
			for (int u = 0; u < NS; u++) {
				char var[32];
				if (sw[u]) {
					snprintf(var, sizeof var, "%s", sw[u]);
					var[strcspn(var, "=")] = 0;
					set_switch(p.gpu, var, strchr(sw[u], '=') + 1);
				}
				seq_rows(&s, &p, T - 1, 1, pos, fl, BACKEND_ROW_LOGITS, bt, nb, NULL, NULL);
				s.logits = u < NP ? lf + u * V : pin + (u - NP) * V;
				int ru = backend_step(p.gpu, &s2);
				if (sw[u])
					set_switch(p.gpu, var, NULL);
				if (u >= NP)
					memcpy(lf + u * V, s.logits, (size_t)V * 4);
				int eq = !memcmp(lf, lf + u * V, (size_t)V * 4);
				if (u == FUSE && !inv) {
					double d = nc_rel_l2(lf + u * V, lf, V);
					printf("    %s fast mode, one-row step: %s vs the default: logits rel L2 %.2e "
					       "(limit 0.1; rc %d)\n", name, sw[u], d, ru);
					CHECK(ru == 0 && d <= 0.1);
					continue;
				}
				if (u)
					printf("    %s %s mode, one-row step: %s%s vs the default %s (rc %d)\n", name,
					       inv ? "batch-invariant" : "fast",
					       u >= NP ? "logits into backend_host_alloc memory, " : "",
					       sw[u] ? sw[u] : "", eq ? "bit-identical" : "DIFFER", ru);
				CHECK(ru == 0 && eq);
			}
			backend_host_free(p.gpu, pin);
			set_switch(p.gpu, "DSV32_CUDA_GRAPHS", NULL);
			backend_cuda_set_batch_invariant(p.gpu, 0);
			free(lf);
		}
		free(gd);
	}
	free(bt), free(pos), free(fl), free(ref), free(g1), free(g2), free(gi);
	pair_close(&p);
}

TEST_T(gpu_forward, fast_mode_tiny, 300)
{
	fast_mode("tiny", 200);
}

TEST_T(gpu_forward, fast_mode_wide, 300)
{
	fast_mode("wide", 160);
}

/* The bf16 products of the forward (fwd_glue.cu, lm_head.cu) on their own against
 * cpu_bf16_linear on random data, V = 1031 outputs (not a multiple of any tile), D = 1024:
 * the CPU-order kernels (k_fwd_lin_stream, k_fwd_lin_row; 1-4 rows) bit-identical; the
 * fixed-order ones (k_fwd_gemv, k_fwd_gemv_ks; k_fwd_head_mma1/2/4 for 5-128 rows) within
 * 1e-5 of each row's RMS (fp32 summation order only). Outputs poisoned first. */
TEST_T(gpu_forward, bf16_products, 120)
{
	struct gpu g;
	gpu_test_open(&g);
	const int V = 1031, D = 1024, MM = 128;
	uint64_t seed = 4242;
	uint16_t *W, *xh;
	gpu_ptr dW = gpu_test_rand_bf16(&g, (size_t)V * D, 0.05f, &seed, &W);
	gpu_ptr dx = gpu_test_rand_bf16(&g, (size_t)MM * D, 2.0f, &seed, &xh);
	float *x = malloc((size_t)MM * D * 4), *ref = malloc((size_t)MM * V * 4);
	float *got = malloc((size_t)MM * V * 4);
	REQUIRE(x && ref && got);
	for (size_t i = 0; i < (size_t)MM * D; i++)
		x[i] = bf16_to_f32(xh[i]);
	struct bf16_mat Wm = {W, V, D};
	cpu_bf16_linear(NULL, &Wm, x, MM, ref, 0);
	gpu_ptr dy = gpu_test_alloc((size_t)MM * V * 4), none = 0;
	static const struct {
		const char *name;
		int exact, grid_div, smem, m[5];
	} k[] = {
		{"k_fwd_lin_stream", 1, 32, 4 * 1024 * 2, {1, 2, 3, 4, 0}},
		{"k_fwd_lin_row", 1, 0, 2 * 1024, {1, 2, 3, 4, 0}},
		{"k_fwd_gemv", 0, 8, 0, {1, 2, 3, 4, 0}},
		{"k_fwd_gemv_ks", 0, 0, 0, {1, 2, 3, 4, 0}},
		{"k_fwd_head_mma1", 0, 128, 3 * (32 + 128) * 72 * 2, {5, 17, 32, 0, 0}},
		{"k_fwd_head_mma2", 0, 128, 3 * (64 + 128) * 72 * 2, {33, 64, 0, 0, 0}},
		{"k_fwd_head_mma4", 0, 128, 3 * (128 + 128) * 72 * 2, {65, 100, 128, 0, 0}},
	};
	for (size_t ki = 0; ki < sizeof k / sizeof *k; ki++) {
		void *fn;
		REQUIRE(gpu_kernel_smem(&g, k[ki].name, &fn) == 0);
		for (int mi = 0; mi < 5 && k[ki].m[mi]; mi++) {
			int M = k[ki].m[mi], ldx = D, ldy = V, d = D, v = V;
			gpu_test_poison(&g, dy, (size_t)MM * V * 4);
			void *args[] = {&dW, &dx, &ldx, &dy, &none, &ldy, &M, &d, &v};
			unsigned grid = k[ki].grid_div ? (unsigned)((V + k[ki].grid_div - 1) / k[ki].grid_div)
						       : (unsigned)V;
			REQUIRE(gpu_launch(&g, fn, grid, 1, 1, 256, 1, 1, (unsigned)k[ki].smem, args) == 0);
			REQUIRE(gpu_download(&g, got, dy, (size_t)M * V * 4) == 0);
			int64_t differ = 0, worst_i = 0;
			double worst = 0;
			for (int r = 0; r < M; r++) {
				double rms = gpu_row_rms(ref + (size_t)r * V, V);
				for (int i = 0; i < V; i++) {
					float a = got[(size_t)r * V + i], b = ref[(size_t)r * V + i];
					differ += memcmp(&a, &b, 4) != 0;
					double e = fabs((double)a - b) / rms;
					if (!(e <= worst))
						worst = isnan(e) ? INFINITY : e, worst_i = (int64_t)r * V + i;
				}
			}
			printf("    %s M=%d: %lld of %lld outputs differ from cpu_bf16_linear's bits, worst "
			       "|err|/rms(row) %.3g at %lld%s\n", k[ki].name, M, (long long)differ,
			       (long long)M * V, worst, (long long)worst_i,
			       k[ki].exact ? " (must be bit-identical)" : " (limit 1e-5)");
			if (k[ki].exact)
				CHECK(differ == 0);
			else
				CHECK(worst < 1e-5);
		}
	}
	/* k_fwd_mma mode 2 on K slices as batches + k_fwd_ks_reduce (op_lin's path for few outputs,
	 * weights_proj, above 8 rows): S = 4 slices of 256 */
	for (int M = 9; M <= MM; M += MM - 9) {
		int mode = 2, out32 = 1, b_row0 = 0, S = 4, Kc = D / S, b_hs = Kc, ldx = D, ldy = V, v = V;
		int d = D, MV = M * V;
		long long a_hs = Kc, c_hs = (long long)M * V;
		gpu_ptr ws = gpu_test_alloc((size_t)S * M * V * 4);
		gpu_test_poison(&g, dy, (size_t)MM * V * 4);
		void *a1[] = {&mode, &dx, &a_hs, &ldx, &dW, &none, &b_row0, &b_hs, &d, &ws, &c_hs, &v,
			      &out32, &M, &v, &Kc};
		REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_fwd_mma"), (V + 63) / 64, (M + 63) / 64, S, 128, 1, 1,
				   0, a1) == 0);
		void *a2[] = {&ws, &S, &M, &v, &dy, &none, &ldy};
		REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_fwd_ks_reduce"), (MV + 255) / 256, 1, 1, 256, 1, 1, 0,
				   a2) == 0);
		REQUIRE(gpu_download(&g, got, dy, (size_t)M * V * 4) == 0);
		double worst = 0;
		for (int r = 0; r < M; r++) {
			double rms = gpu_row_rms(ref + (size_t)r * V, V);
			for (int i = 0; i < V; i++) {
				double e = fabs((double)got[(size_t)r * V + i] - ref[(size_t)r * V + i]) / rms;
				if (!(e <= worst))
					worst = isnan(e) ? INFINITY : e;
			}
		}
		printf("    k_fwd_mma in %d K slices + k_fwd_ks_reduce M=%d: worst |err|/rms(row) %.3g "
		       "(limit 1e-5)\n", S, M, worst);
		CHECK(worst < 1e-5);
		cu.cuMemFree(ws);
	}
	free(W), free(xh), free(x), free(ref), free(got);
	gpu_close(&g);
}

/* k_fwd_uv1_qh (W_UV of one decode row with o_proj's act_quant fused, dv = 128: the real
 * model's shape, which the structured models above do not have; one block a head, a thread an
 * output) against its parts, k_fwd_uv1 then k_act_quant, on random
 * e4m3 kv_b rows, non-power-of-two block scales and o_lat: o, its codes and its scales
 * bit-identical. */
TEST_T(gpu_forward, uv_quant_fused, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	int H = 8, Hpad = 16, nope = 128, dv = 128, R = 512, T = 1;
	size_t wrows = (size_t)H * (nope + dv), nw = wrows * R, ns = wrows / 128 * (R / 128);
	uint64_t seed = 77;
	uint8_t *w = malloc(nw);
	float *sc = malloc(ns * 4);
	uint16_t *ol = malloc((size_t)Hpad * R * 2);
	REQUIRE(w && sc && ol);
	for (size_t i = 0; i < nw; i++) {
		w[i] = (uint8_t)(test_rand(&seed) >> 56);
		if ((w[i] & 0x7f) == 0x7f)
			w[i] &= 0xfe; /* not a NaN code */
	}
	for (size_t i = 0; i < ns; i++) /* not powers of two: the scale's product rounds */
		sc[i] = ldexpf(1.0f + (float)(test_rand(&seed) >> 40) * 0x1p-24f, (int)(test_rand(&seed) % 9) - 12);
	fill_bf16(ol, (size_t)Hpad * R, 1.0f, &seed);
	gpu_ptr dw = gpu_test_alloc(nw), ds = gpu_test_alloc(ns * 4), dol = gpu_test_alloc((size_t)Hpad * R * 2);
	gpu_ptr o1 = gpu_test_alloc((size_t)H * dv * 2), q1 = gpu_test_alloc((size_t)H * dv), s1 = gpu_test_alloc((size_t)H * 4);
	gpu_ptr o2 = gpu_test_alloc((size_t)H * dv * 2), q2 = gpu_test_alloc((size_t)H * dv), s2 = gpu_test_alloc((size_t)H * 4);
	REQUIRE(gpu_upload(&g, dw, w, nw) == 0);
	REQUIRE(gpu_upload(&g, ds, sc, ns * 4) == 0);
	REQUIRE(gpu_upload(&g, dol, ol, (size_t)Hpad * R * 2) == 0);
	gpu_test_poison(&g, o1, (size_t)H * dv * 2), gpu_test_poison(&g, q1, (size_t)H * dv);
	gpu_test_poison(&g, s1, (size_t)H * 4);
	void *a1[] = {&dol, &dw, &ds, &o1, &T, &H, &Hpad, &nope, &dv, &R};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_fwd_uv1"), H, 1, dv / 32, 256, 1, 1, 0, a1) == 0);
	long long ng = H * dv / 128;
	void *a2[] = {&o1, &q1, &s1, &ng};
	REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_act_quant"), (unsigned)((ng + 7) / 8), 1, 1, 256, 1, 1, 0,
			   a2) == 0);
	uint8_t *h1 = malloc((size_t)H * dv * 4), *h2 = malloc((size_t)H * dv * 4);
	REQUIRE(h1 && h2);
	{
		const char *name = "k_fwd_uv1_qh";
		void *fn;
		REQUIRE(gpu_kernel_smem(&g, name, &fn) == 0);
		gpu_test_poison(&g, o2, (size_t)H * dv * 2), gpu_test_poison(&g, q2, (size_t)H * dv);
		gpu_test_poison(&g, s2, (size_t)H * 4);
		void *a3[] = {&dol, &dw, &ds, &o2, &q2, &s2, &H, &Hpad, &nope, &dv, &R};
		REQUIRE(gpu_launch(&g, fn, H, 1, 1, 128, 1, 1, FWD_UVH_SMEM, a3) == 0);
		REQUIRE(gpu_download(&g, h1, o1, (size_t)H * dv * 2) == 0);
		REQUIRE(gpu_download(&g, h2, o2, (size_t)H * dv * 2) == 0);
		int same_o = !memcmp(h1, h2, (size_t)H * dv * 2), first = -1;
		for (int i = 0; i < H * dv && first < 0; i++)
			if (((uint16_t *)h1)[i] != ((uint16_t *)h2)[i])
				first = i;
		REQUIRE(gpu_download(&g, h1, q1, (size_t)H * dv) == 0);
		REQUIRE(gpu_download(&g, h2, q2, (size_t)H * dv) == 0);
		int same_q = !memcmp(h1, h2, (size_t)H * dv);
		REQUIRE(gpu_download(&g, h1, s1, (size_t)H * 4) == 0);
		REQUIRE(gpu_download(&g, h2, s2, (size_t)H * 4) == 0);
		int same_s = !memcmp(h1, h2, (size_t)H * 4);
		float s0;
		memcpy(&s0, h1, 4);
		printf("    %s vs k_fwd_uv1 + k_act_quant (H %d, dv %d, R %d): o %s (first differing "
		       "output %d), codes %s, scales %s (head 0 scale %g)\n", name, H, dv, R,
		       same_o ? "identical" : "DIFFER", first, same_q ? "identical" : "DIFFER",
		       same_s ? "identical" : "DIFFER", s0);
		CHECK(same_o && same_q && same_s);
		CHECK(isfinite(s0) && s0 > 0);
	}
	free(w), free(sc), free(ol), free(h1), free(h2);
	gpu_close(&g);
}

/* k_fwd_q_absorb1h (a decode row's q absorption one block a head, a thread four columns) against
 * k_fwd_q_absorb2 (on that one row) at the real model's head shape (nope 128, rope 64, R 512; 16 heads) on random
 * e4m3 kv_b rows (no NaN codes), non-power-of-two block scales and q, with the RoPE of q_pe (cs)
 * and without: qf and the rotated q bit-identical. */
TEST_T(gpu_forward, q_absorb_head, 60)
{
	struct gpu g;
	gpu_test_open(&g);
	int H = 16, Hpad = 16, nope = 128, rope = 64, dv = 128, R = 512, T = 1, dq = nope + rope;
	size_t wrows = (size_t)H * (nope + dv), nw = wrows * R, ns = wrows / 128 * (R / 128);
	size_t nq = (size_t)H * dq, nf = (size_t)Hpad * (R + rope), ncs = (size_t)64 * 32 * 2;
	uint64_t seed = 91;
	uint8_t *w = malloc(nw);
	float *sc = malloc(ns * 4), *cs = malloc(ncs * 4);
	uint16_t *q = malloc(nq * 2);
	uint8_t *h1 = malloc(nf * 2), *h2 = malloc(nf * 2);
	REQUIRE(w && sc && cs && q && h1 && h2);
	for (size_t i = 0; i < nw; i++) {
		w[i] = (uint8_t)(test_rand(&seed) >> 56);
		if ((w[i] & 0x7f) == 0x7f)
			w[i] &= 0xfe; /* not a NaN code */
	}
	for (size_t i = 0; i < ns; i++)
		sc[i] = ldexpf(1.0f + (float)(test_rand(&seed) >> 40) * 0x1p-24f, (int)(test_rand(&seed) % 9) - 12);
	for (size_t i = 0; i < ncs; i++)
		cs[i] = (float)((double)(test_rand(&seed) >> 11) * 0x1p-53 * 2.0 - 1.0);
	fill_bf16(q, nq, 1.0f, &seed);
	int p37 = 37;
	gpu_ptr dw = gpu_test_alloc(nw), ds = gpu_test_alloc(ns * 4), dcs = gpu_test_alloc(ncs * 4);
	gpu_ptr dpos = gpu_test_alloc(4), dq1 = gpu_test_alloc(nq * 2), dq2 = gpu_test_alloc(nq * 2);
	gpu_ptr f1 = gpu_test_alloc(nf * 2), f2 = gpu_test_alloc(nf * 2);
	REQUIRE(gpu_upload(&g, dw, w, nw) == 0);
	REQUIRE(gpu_upload(&g, ds, sc, ns * 4) == 0);
	REQUIRE(gpu_upload(&g, dcs, cs, ncs * 4) == 0);
	REQUIRE(gpu_upload(&g, dpos, &p37, 4) == 0);
	void *fh;
	REQUIRE(gpu_kernel_smem(&g, "k_fwd_q_absorb1h", &fh) == 0);
	for (int rot = 0; rot < 2; rot++) {
		gpu_ptr c = rot ? dcs : 0;
		REQUIRE(gpu_upload(&g, dq1, q, nq * 2) == 0);
		REQUIRE(gpu_upload(&g, dq2, q, nq * 2) == 0);
		gpu_test_poison(&g, f1, nf * 2), gpu_test_poison(&g, f2, nf * 2);
		void *a1[] = {&dq1, &dw, &ds, &f1, &T, &H, &Hpad, &nope, &rope, &dv, &R, &dpos, &c};
		REQUIRE(gpu_launch(&g, gpu_kernel(&g, "k_fwd_q_absorb2"), H, 1, R / 128, 128, 1, 1, 0, a1) == 0);
		void *a2[] = {&dq2, &dw, &ds, &f2, &T, &H, &Hpad, &nope, &rope, &dv, &R, &dpos, &c};
		REQUIRE(gpu_launch(&g, fh, H, 1, 1, R / 4, 1, 1, FWD_QAH_SMEM, a2) == 0);
		REQUIRE(gpu_download(&g, h1, f1, nf * 2) == 0);
		REQUIRE(gpu_download(&g, h2, f2, nf * 2) == 0);
		int first = -1;
		for (size_t i = 0; i < nf && first < 0; i++)
			if (((uint16_t *)h1)[i] != ((uint16_t *)h2)[i])
				first = (int)i;
		int finite = 1;
		for (int h = 0; h < H; h++)
			for (int i = 0; i < R + rope; i++)
				finite &= isfinite(bf16_to_f32(((uint16_t *)h2)[(size_t)h * (R + rope) + i]));
		REQUIRE(gpu_download(&g, h1, dq1, nq * 2) == 0);
		REQUIRE(gpu_download(&g, h2, dq2, nq * 2) == 0);
		int same_q = !memcmp(h1, h2, nq * 2);
		printf("    k_fwd_q_absorb1h vs k_fwd_q_absorb2 (H %d, nope %d, rope %d, R %d, RoPE %s): qf %s "
		       "(first differing element %d), q %s\n", H, nope, rope, R, rot ? "on" : "off",
		       first < 0 ? "identical" : "DIFFER", first, same_q ? "identical" : "DIFFER");
		CHECK(first < 0 && same_q && finite);
	}
	free(w), free(sc), free(cs), free(q), free(h1), free(h2);
	gpu_close(&g);
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int64_t count_finite(const float *x, int64_t n)
{
	int64_t k = 0;
	for (int64_t i = 0; i < n; i++)
		k += isfinite(x[i]);
	return k;
}

/* Real dimensions (mkmodel real --layers 2 --dense 1: one dense and one MoE layer, MTP, the
 * real vocabulary) with synthetic weights made on the GPU: a 300-token prefill step and decode
 * steps eagerly and through graphs, timed; finite logits, graphs bit-identical to eager. No CPU
 * reference (the CPU would read the header-only file's holes). */
TEST_T(gpu_forward, real_dims_synthetic_timing, 300)
{
	struct test_model m;
	char cmd[4096];
	snprintf(m.dir, sizeof m.dir, "%s/real2", test_tmpdir());
	snprintf(cmd, sizeof cmd, "%s/mkmodel real --layers 2 --dense 1 --header-only --tokenizer "
		 "fallback --out %s >%s.log 2>&1", test_bin_dir(), m.dir, m.dir);
	test_model_make(&m, cmd);
	struct backend *b;
	struct err e = {""};
	struct backend_cuda_opts o = {.n_pages = 8, .synthetic = 1, .seed = 7};
	double t0 = now_us();
	if (backend_cuda_create_opts(&m.c, &m.w, &m.ck, &o, &b, &e)) {
		test_fail(__FILE__, __LINE__, "backend_cuda_create_opts: %s", e.msg);
		test_abort_case();
	}
	double t_create = now_us() - t0;
	int64_t V = m.c.vocab_size, P = 300, ND = 16;
	int32_t bt[8] = {5, 2, 7, 0, 1, 3, 6, 4}, *tok = malloc((size_t)(P + ND) * 4);
	int64_t *pos = malloc((size_t)(P + ND) * 8);
	uint8_t *fl = calloc((size_t)(P + ND), 1);
	float *lg = malloc((size_t)ND * 2 * V * 4);
	REQUIRE(tok && pos && fl && lg);
	uint64_t seed = 5;
	for (int64_t i = 0; i < P + ND; i++)
		tok[i] = (int32_t)(test_rand(&seed) % (uint64_t)V), pos[i] = i;
	fl[P - 1] = BACKEND_ROW_LOGITS;
	struct backend_seq s = {P, tok, pos, bt, 8, fl, lg, NULL, NULL, 0};
	struct backend_step st = {0, 1, &s, NULL};
	t0 = now_us();
	int rc = backend_step(b, &st);
	double t_pre = now_us() - t0;
	CHECK_EQ_INT(rc, 0);
	int64_t fin = count_finite(lg, V);
	printf("    real dims (2 layers: dense + MoE, vocab %lld): create + synthetic weights %.0f ms; "
	       "prefill %lld tokens in one step %.1f ms (%.0f tok/s, incl. first-use costs); last row "
	       "%lld of %lld logits finite\n", (long long)V, t_create / 1e3, (long long)P, t_pre / 1e3,
	       P / (t_pre / 1e6), (long long)fin, (long long)V);
	CHECK(fin == V);
	double us[2] = {0, 0};
	for (int mode = 0; mode < 2 && !rc; mode++) {
		set_switch(b, "DSV32_CUDA_GRAPHS", mode ? "1" : "0");
		if (!mode)
			set_switch(b, "DSV32_CUDA_PROFILE", "1"); /* per-op GPU times of the eager steps */
		for (int64_t i = 0; i < ND && !rc; i++) {
			struct backend_seq d = {1, tok + P + i, pos + P + i, bt, 8, NULL, lg + (mode * ND + i) * V,
						NULL, NULL, 0};
			struct backend_step sd = {0, 1, &d, NULL};
			t0 = now_us();
			rc = backend_step(b, &sd);
			if (i >= 2) /* the first steps pay first-use costs (and the capture) */
				us[mode] += now_us() - t0;
		}
		set_switch(b, "DSV32_CUDA_GRAPHS", NULL);
		if (!mode) {
			set_switch(b, "DSV32_CUDA_PROFILE", NULL);
			printf("    profile of the %lld eager decode steps (stderr):\n", (long long)ND);
			fflush(stdout);
			cuda_forward_profile_print();
		}
	}
	CHECK_EQ_INT(rc, 0);
	int64_t same = !memcmp(lg, lg + ND * V, (size_t)ND * V * 4);
	fin = count_finite(lg, 2 * ND * V);
	printf("    real dims decode batch 1 at ~%lld tokens: eager %.0f us/step, graphs %.0f us/step "
	       "(%.2fx); %lld of %lld logits finite; graph logits %s eager's\n", (long long)P,
	       us[0] / (ND - 2), us[1] / (ND - 2), us[1] > 0 ? us[0] / us[1] : 0.0, (long long)fin,
	       (long long)(2 * ND * V), same ? "bit-identical to" : "DIFFER from");
	CHECK(fin == 2 * ND * V);
	CHECK(same);
	/* the prefill again (same positions), profiled: per-op GPU times at 300 rows */
	set_switch(b, "DSV32_CUDA_PROFILE", "1");
	t0 = now_us();
	rc = backend_step(b, &st);
	double t_pre2 = now_us() - t0;
	set_switch(b, "DSV32_CUDA_PROFILE", NULL);
	CHECK_EQ_INT(rc, 0);
	printf("    prefill %lld tokens again: %.1f ms (%.0f tok/s); its profile (stderr):\n",
	       (long long)P, t_pre2 / 1e3, P / (t_pre2 / 1e6));
	fflush(stdout);
	cuda_forward_profile_print();
	backend_cuda_set_batch_invariant(b, 1); /* 64-row pieces, CPU-order bf16 products */
	t0 = now_us();
	rc = backend_step(b, &st);
	double t_pre3 = now_us() - t0;
	backend_cuda_set_batch_invariant(b, 0);
	CHECK_EQ_INT(rc, 0);
	printf("    prefill %lld tokens in the batch-invariant mode: %.1f ms (%.0f tok/s; the fast "
	       "mode above)\n", (long long)P, t_pre3 / 1e3, P / (t_pre3 / 1e6));
	backend_destroy(b);
	free(tok), free(pos), free(fl), free(lg);
	test_model_free(&m);
}

/* A step's validation and empty steps behave like the CPU backend's. The mode: the environment
 * override is read when the backend is created (not at every step), the setter changes it. */
TEST_T(gpu_forward, step_validation, 120)
{
	struct pair p;
	setenv("DSV32_CUDA_BATCH_INVARIANT", "1", 1);
	pair_open(&p, "tiny", 8, 2, 0);
	unsetenv("DSV32_CUDA_BATCH_INVARIANT");
	CHECK(!strcmp(backend_cuda_mode(p.gpu), "batch-invariant")); /* the override, at creation */
	CHECK_EQ_INT(backend_cuda_set_batch_invariant(p.gpu, 0), 1);
	CHECK(!strcmp(backend_cuda_mode(p.gpu), "fast"));
	CHECK_EQ_INT(backend_cuda_set_batch_invariant(p.cpu, 1), -ENOTSUP);
	/* the forward's switches: by the environment variable's name, CUDA backends only */
	CHECK_EQ_INT(backend_cuda_set_switch(p.gpu, "DSV32_CUDA_NO_SUCH_SWITCH", "1"), -EINVAL);
	CHECK_EQ_INT(backend_cuda_set_switch(p.gpu, "DSV32_CUDA_FWD_PDL", NULL), 0);
	CHECK_EQ_INT(backend_cuda_set_switch(p.cpu, "DSV32_CUDA_FWD_PDL", "0"), -ENOTSUP);
	int32_t bt[2] = {1, 0}, bad_tok[1] = {(int32_t)p.V};
	int64_t pos[1] = {0}, far[1] = {200};
	float *lg = malloc((size_t)p.V * 4);
	REQUIRE(lg);
	struct backend_seq s = {1, bad_tok, pos, bt, 2, NULL, lg, NULL, NULL, 0};
	struct backend_step st = {0, 1, &s, NULL};
	CHECK_EQ_INT(backend_step(p.gpu, &st), -EINVAL); /* token out of range */
	s.tokens = p.tok, s.pos = far;
	CHECK_EQ_INT(backend_step(p.gpu, &st), -EINVAL); /* position outside the block table */
	s.n = 0;
	CHECK_EQ_INT(backend_step(p.gpu, &st), 0);       /* nothing to do */
	s.n = 1, s.pos = pos;
	gpu_fill_nan(lg, p.V);
	CHECK_EQ_INT(backend_step(p.gpu, &st), 0);
	int64_t finite = 0;
	for (int64_t i = 0; i < p.V; i++)
		finite += isfinite(lg[i]);
	printf("    one-token step: %lld of %lld logits finite\n", (long long)finite, (long long)p.V);
	CHECK(finite == p.V);
	free(lg);
	pair_close(&p);
}

#endif
