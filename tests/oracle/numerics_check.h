/*
 * numerics_check.h — the comparisons of the CPU forward with the PyTorch oracle's committed
 * fixtures (tests/data/oracle/, formats in tests/oracle/README.md), shared by
 * tests/test_numerics.c (every check must pass) and tests/test_mutations.c (each spec §10b
 * mutation must make at least one of them fail).
 *
 * Owns: loading fixtures (a missing fixture is a loud failure, never a skip), regenerating the
 * checkpoint each fixture was made from (mkmodel; its manifest must equal the fixture's), the
 * op-level checks on ops.npz, the end-to-end checks (logits, MTP logits, indexer top-k sets,
 * routed expert sets) and the teacher-forced per-layer checks, each returning the number of
 * failed checks and printing the measured agreement (the op-level checks: numerics_ops.h).
 * Must not: skip anything silently.
 */
#ifndef DSV32_TESTS_NUMERICS_CHECK_H
#define DSV32_TESTS_NUMERICS_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "model/config.h"
#include "model/cpu_attn.h"
#include "model/cpu_indexer.h"
#include "model/cpu_moe.h"
#include "model/cpu_ops.h"
#include "model/fileio.h"
#include "model/kv_cache.h"
#include "model/npy.h"
#include "model/numerics.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/test.h"

#define NC_FN static __attribute__((unused))

/* 1: our side runs the naive attention form, compared with the oracle's naive-form outputs
 * (NAME/naive/ fixtures) end to end. */
static int nc_naive_attention __attribute__((unused));

/* An end-to-end fixture file of NAME: FILE, or naive/FILE in the naive form. */
static const char *nc_fx(char *buf, size_t n, const char *file)
{
	snprintf(buf, n, "%s%s", nc_naive_attention ? "naive/" : "", file);
	return buf;
}

/* ---- verdicts: failed checks are counted and printed, the caller decides ------------------ */

struct nc_verdict {
	int fails;
	int quiet; /* mutation runs: count, print only the summary */
	char first[512];
};

NC_FN void nc_fail(struct nc_verdict *v, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (!v->fails)
		snprintf(v->first, sizeof v->first, "%s", buf);
	v->fails++;
	if (!v->quiet)
		fprintf(stderr, "  FAIL %s\n", buf);
}

/* ---- fixtures ------------------------------------------------------------------------------ */

NC_FN const char *nc_bin(void)
{
	const char *b = getenv("DSV32_BIN");
	return b && *b ? b : "build";
}

NC_FN void nc_path(char *buf, size_t n, const char *name, const char *file)
{
	snprintf(buf, n, "%s/tests/data/oracle/%s%s%s", test_root(), name, *name ? "/" : "", file);
}

/* Reads KEY of fixture NAME/FILE; a missing file or key fails the case loudly. */
NC_FN void nc_load(const char *name, const char *file, const char *key, struct npy_array *a)
{
	char p[1024];
	struct err e;
	nc_path(p, sizeof p, name, file);
	if (npz_read(p, key, a, &e)) {
		test_fail(__FILE__, __LINE__, "oracle fixture missing: %s key %s (%s). Regenerate with "
			  "tests/oracle/make_fixtures.sh (tests/oracle/README.md)", p, key, e.msg);
		test_abort_case();
	}
}

/* 1 if KEY exists in NAME/FILE (for keys that exist only for some layers). */
NC_FN int nc_has(const char *name, const char *file, const char *key)
{
	char p[1024];
	struct err e;
	struct npy_array a;
	nc_path(p, sizeof p, name, file);
	if (npz_read(p, key, &a, &e))
		return 0;
	npy_free(&a);
	return 1;
}

/* bf16 values packed two per int32 (little-endian) -> floats. out: [2 * n] */
NC_FN void nc_unpack_bf16(const struct npy_array *a, float *out)
{
	const uint16_t *h = a->data;
	size_t n = a->nbytes / 2;
	for (size_t i = 0; i < n; i++)
		out[i] = bf16_to_f32(h[i]);
}

struct nc_seqs {
	int n;
	int32_t *tok[8];
	int64_t len[8];
};

NC_FN void nc_tokens(const char *name, struct nc_seqs *s)
{
	char p[1024];
	size_t len;
	struct err e;
	nc_path(p, sizeof p, name, "tokens.txt");
	char *text = file_read(p, &len, 1 << 20, &e);
	if (!text) {
		test_fail(__FILE__, __LINE__, "oracle input missing: %s (%s)", p, e.msg);
		test_abort_case();
	}
	memset(s, 0, sizeof *s);
	for (char *line = text; *line && s->n < 8;) {
		char *end = strchr(line, '\n');
		if (end)
			*end = 0;
		if (*line) {
			int64_t cap = 1 + (int64_t)strlen(line) / 2;
			int32_t *t = malloc((size_t)cap * sizeof *t);
			REQUIRE(t);
			int64_t n = 0;
			for (char *q = line; *q;) {
				t[n++] = (int32_t)strtol(q, &q, 10);
				if (*q == ',')
					q++;
			}
			s->tok[s->n] = t;
			s->len[s->n++] = n;
		}
		if (!end)
			break;
		line = end + 1;
	}
	free(text);
}

NC_FN void nc_tokens_free(struct nc_seqs *s)
{
	for (int i = 0; i < s->n; i++)
		free(s->tok[i]);
}

/* ---- the checkpoint of a fixture -------------------------------------------------------------- */

struct nc_model {
	char name[32], dir[512];
	struct dsv32_config c;
	struct checkpoint ck;
	struct weights w;
	int64_t L; /* num_hidden_layers */
	int has_mtp;
};

/* Regenerates the checkpoint NAME was made from (structured unless NAME is "dense1") and
 * checks its manifest against the fixture's. */
NC_FN void nc_model_load(struct nc_model *m, const char *name)
{
	char cmd[4096], man[600], fman[1024];
	snprintf(m->name, sizeof m->name, "%s", name);
	snprintf(m->dir, sizeof m->dir, "%s/%s", test_tmpdir(), name);
	snprintf(man, sizeof man, "%s/%s.manifest", test_tmpdir(), name);
	snprintf(cmd, sizeof cmd, "%s/mkmodel --config %s/tests/data/numerics_%s.json --seed 1 "
		 "--tokenizer fallback %s --out %s --manifest %s >%s.log 2>&1", nc_bin(), test_root(),
		 name, strcmp(name, "dense1") ? "--structured" : "", m->dir, man, m->dir);
	REQUIRE(system(cmd) == 0);
	nc_path(fman, sizeof fman, name, "manifest.txt");
	size_t la, lb;
	struct err e;
	char *a = file_read(man, &la, 1 << 24, &e), *b = file_read(fman, &lb, 1 << 24, &e);
	if (!b) {
		test_fail(__FILE__, __LINE__, "oracle fixture missing: %s (run tests/oracle/make_fixtures.sh)",
			  fman);
		test_abort_case();
	}
	if (!a || la != lb || memcmp(a, b, la)) {
		test_fail(__FILE__, __LINE__, "checkpoint %s differs from the one its oracle fixture was "
			  "made from (%s): regenerate the fixtures (tests/oracle/make_fixtures.sh)", name, fman);
		test_abort_case();
	}
	free(a);
	free(b);
	REQUIRE(config_load(&m->c, m->dir, &e) == 0);
	REQUIRE(ckpt_open(&m->ck, m->dir, &e) == 0);
	if (weights_bind(&m->w, &m->c, &m->ck, &e)) {
		test_fail(__FILE__, __LINE__, "weights_bind: %s", e.msg);
		test_abort_case();
	}
	m->L = m->c.num_hidden_layers;
	m->has_mtp = m->w.has_mtp;
}

NC_FN void nc_model_free(struct nc_model *m)
{
	weights_free(&m->w);
	ckpt_close(&m->ck);
}

/* ---- statistics ------------------------------------------------------------------------------- */

NC_FN double nc_rel_l2(const float *a, const float *ref, int64_t n)
{
	double d = 0, r = 0;
	for (int64_t i = 0; i < n; i++) {
		double x = (double)a[i] - ref[i];
		d += x * x;
		r += (double)ref[i] * ref[i];
	}
	return sqrt(d) / (sqrt(r) > 1e-30 ? sqrt(r) : 1e-30);
}

static int nc_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The p-th percentile (nearest rank) of v [n]; sorts v. */
NC_FN double nc_pct(double *v, int64_t n, double p)
{
	if (n <= 0)
		return NAN;
	qsort(v, (size_t)n, sizeof *v, nc_cmp_double);
	int64_t i = (int64_t)ceil(p / 100.0 * (double)n) - 1;
	return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

NC_FN int64_t nc_argmax(const float *x, int64_t n)
{
	int64_t b = 0;
	for (int64_t i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* max(|A \ B|, |B \ A|) of two ascending int32 sets (the oracle's row is -1 padded). */
NC_FN int64_t nc_set_diff(const int32_t *a, int64_t na, const int32_t *b, int64_t nb)
{
	while (na > 0 && a[na - 1] < 0)
		na--;
	int64_t i = 0, j = 0, only_a = 0, only_b = 0;
	while (i < na || j < nb) {
		if (j >= nb || (i < na && a[i] < b[j]))
			only_a++, i++;
		else if (i >= na || b[j] < a[i])
			only_b++, j++;
		else
			i++, j++;
	}
	return only_a > only_b ? only_a : only_b;
}

/* ---- what a run of ours produced ---------------------------------------------------------- */

/* idx_topk and ffn_moe_topk rows per (layer, position) of one sequence. */
struct nc_dumps {
	int64_t n_layers, T, K;
	int32_t *topk;   /* [n_layers, T, T] */
	int64_t *topk_n; /* [n_layers, T], -1 = not seen */
	int32_t *ex;     /* [n_layers, T, K] */
	uint8_t *ex_seen; /* [n_layers, T] */
};

NC_FN void nc_dumps_init(struct nc_dumps *d, int64_t n_layers, int64_t T, int64_t K)
{
	d->n_layers = n_layers, d->T = T, d->K = K;
	d->topk = calloc((size_t)(n_layers * T * T), sizeof *d->topk);
	d->topk_n = malloc((size_t)(n_layers * T) * sizeof *d->topk_n);
	d->ex = calloc((size_t)(n_layers * T * (K ? K : 1)), sizeof *d->ex);
	d->ex_seen = calloc((size_t)(n_layers * T), 1);
	REQUIRE(d->topk && d->topk_n && d->ex && d->ex_seen);
	for (int64_t i = 0; i < n_layers * T; i++)
		d->topk_n[i] = -1;
}

NC_FN void nc_dumps_free(struct nc_dumps *d)
{
	free(d->topk);
	free(d->topk_n);
	free(d->ex);
	free(d->ex_seen);
}

static void nc_dump_cb(void *ctx, const char *name, int64_t layer, int64_t seq, int64_t pos,
		       int is_int, const void *data, int64_t n)
{
	struct nc_dumps *d = ctx;
	(void)seq;
	if (!is_int || layer < 0 || layer >= d->n_layers || pos < 0 || pos >= d->T)
		return;
	if (!strcmp(name, "idx_topk") && n <= d->T) {
		memcpy(d->topk + (layer * d->T + pos) * d->T, data, (size_t)n * 4);
		d->topk_n[layer * d->T + pos] = n;
	} else if (!strcmp(name, "ffn_moe_topk") && n == d->K) {
		memcpy(d->ex + (layer * d->T + pos) * d->K, data, (size_t)n * 4);
		d->ex_seen[layer * d->T + pos] = 1;
	}
}

/* Agreement of our top-k and expert rows of one (sequence, layer) with the fixture's. */
struct nc_sets {
	int64_t tk_rows, tk_same, tk_worst, ex_rows, ex_same;
};

NC_FN void nc_sets_add(struct nc_verdict *v, struct nc_sets *st, const struct nc_model *m,
		       const struct nc_dumps *d, int64_t s, int64_t l, int64_t rows)
{
	char key[64];
	struct npy_array a;
	char fb[64];
	snprintf(key, sizeof key, "s%lld_l%lld", (long long)s, (long long)l);
	nc_load(m->name, nc_fx(fb, sizeof fb, "topk.npz"), key, &a);
	if (a.shape[0] != rows)
		nc_fail(v, "%s topk %s: %lld rows in the fixture, %lld ours", m->name, key,
			(long long)a.shape[0], (long long)rows);
	for (int64_t t = 0; t < rows && t < a.shape[0]; t++) {
		int64_t n = d->topk_n[l * d->T + t];
		int64_t diff = n < 0 ? a.shape[1]
				     : nc_set_diff((const int32_t *)a.data + t * a.shape[1], a.shape[1],
						   d->topk + (l * d->T + t) * d->T, n);
		st->tk_rows++;
		st->tk_same += diff == 0;
		st->tk_worst = diff > st->tk_worst ? diff : st->tk_worst;
	}
	npy_free(&a);
	if (!config_layer_is_moe(&m->c, l))
		return;
	nc_load(m->name, nc_fx(fb, sizeof fb, "experts.npz"), key, &a);
	for (int64_t t = 0; t < rows && t < a.shape[0]; t++) {
		st->ex_rows++;
		st->ex_same += d->ex_seen[l * d->T + t] &&
			       !memcmp((const int32_t *)a.data + t * a.shape[1],
				       d->ex + (l * d->T + t) * d->K, (size_t)d->K * 4);
	}
	npy_free(&a);
}

/* ---- end to end -------------------------------------------------------------------------------- */

struct nc_e2e_limits {
	double median, p90, argmax;  /* logits: median and p90 relative L2 at most; argmax at least */
	double mtp_median;           /* MTP logits median relative L2 at most */
	double tk_same;              /* fraction of top-k rows identical at least */
	int64_t tk_worst;            /* keys differing in any row at most */
	int experts_exact;           /* routed expert sets identical in every row */
};

/* Deep structured configs (issue 4 acceptance) and shallow ones. */
static const struct nc_e2e_limits NC_DEEP = {0.2, 0.3, 0.7, 0.2, 0.9, 2, 1};
static const struct nc_e2e_limits NC_SHALLOW = {1e-3, 1, 0, 1e-3, 0.9, 2, 1};

/* Runs every sequence of fixture NAME (full prefill per sequence, then the MTP rows) and
 * compares with the fixture. */
NC_FN void nc_e2e(struct nc_verdict *v, const char *name, const struct nc_e2e_limits *lim)
{
	struct nc_model m;
	nc_model_load(&m, name);
	struct nc_seqs S;
	nc_tokens(name, &S);
	const struct dsv32_config *c = &m.c;
	int64_t V = c->vocab_size, D = c->hidden_size, n_layers = m.L + m.has_mtp;
	int64_t n_pages = 0, max_T = 0;
	for (int i = 0; i < S.n; i++) {
		n_pages += (S.len[i] + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS;
		max_T = S.len[i] > max_T ? S.len[i] : max_T;
	}
	struct backend *b;
	struct err e;
	REQUIRE(backend_cpu_create(c, &m.w, n_pages, 4, &b, &e) == 0);
	backend_cpu_set_naive_attention(b, nc_naive_attention);
	double *rl = malloc((size_t)(S.n * max_T) * sizeof *rl);
	double *mrl = malloc((size_t)(S.n * max_T) * sizeof *mrl);
	int64_t n_rl = 0, n_mrl = 0, agree = 0;
	struct nc_sets st = {0};
	int64_t page0 = 0;
	for (int s = 0; s < S.n; s++) {
		int64_t T = S.len[s], nb = (T + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS;
		int32_t bt[64];
		REQUIRE(nb <= 64);
		for (int64_t i = 0; i < nb; i++)
			bt[i] = (int32_t)(page0 + i);
		page0 += nb;
		int64_t *pos = malloc((size_t)T * sizeof *pos);
		uint8_t *fl = malloc((size_t)T);
		float *logits = malloc((size_t)(T * V) * sizeof *logits);
		float *hidden = malloc((size_t)(T * D) * sizeof *hidden);
		REQUIRE(pos && fl && logits && hidden && rl && mrl);
		for (int64_t t = 0; t < T; t++)
			pos[t] = t, fl[t] = BACKEND_ROW_LOGITS | BACKEND_ROW_HIDDEN;
		struct nc_dumps d;
		nc_dumps_init(&d, n_layers, T, c->num_experts_per_tok);
		struct backend_dump dump = {nc_dump_cb, &d};
		struct backend_seq sq = {T, S.tok[s], pos, bt, nb, fl, logits, hidden, NULL, 0};
		struct backend_step step = {0, 1, &sq, &dump};
		REQUIRE(backend_step(b, &step) == 0);
		char key[32], fb[64];
		struct npy_array fx, rows;
		snprintf(key, sizeof key, "seq%d", s);
		nc_load(name, nc_fx(fb, sizeof fb, "logits.npz"), key, &fx);
		snprintf(key, sizeof key, "rows%d", s);
		nc_load(name, nc_fx(fb, sizeof fb, "logits.npz"), key, &rows);
		REQUIRE(fx.shape[1] == V && fx.shape[0] == rows.shape[0]);
		for (int64_t i = 0; i < rows.shape[0]; i++) {
			int64_t t = ((const int32_t *)rows.data)[i];
			REQUIRE(t >= 0 && t < T);
			const float *ref = (const float *)fx.data + i * V, *ours = logits + t * V;
			rl[n_rl++] = nc_rel_l2(ours, ref, V);
			agree += nc_argmax(ours, V) == nc_argmax(ref, V);
		}
		npy_free(&fx);
		npy_free(&rows);
		if (m.has_mtp && T > 1) {
			struct backend_seq mq = {T - 1, S.tok[s] + 1, pos, bt, nb, fl, logits, NULL, hidden, 0};
			struct backend_step ms = {1, 1, &mq, &dump};
			for (int64_t t = 0; t < T - 1; t++)
				fl[t] = BACKEND_ROW_LOGITS;
			REQUIRE(backend_step(b, &ms) == 0);
			snprintf(key, sizeof key, "mtp%d", s);
			nc_load(name, nc_fx(fb, sizeof fb, "logits.npz"), key, &fx);
			snprintf(key, sizeof key, "mrows%d", s);
			nc_load(name, nc_fx(fb, sizeof fb, "logits.npz"), key, &rows);
			for (int64_t i = 0; i < rows.shape[0]; i++) {
				int64_t t = ((const int32_t *)rows.data)[i];
				REQUIRE(t >= 0 && t < T - 1);
				mrl[n_mrl++] = nc_rel_l2(logits + t * V, (const float *)fx.data + i * V, V);
			}
			npy_free(&fx);
			npy_free(&rows);
		}
		for (int64_t l = 0; l < n_layers; l++)
			nc_sets_add(v, &st, &m, &d, s, l, l < m.L ? T : T - 1);
		nc_dumps_free(&d);
		free(pos);
		free(fl);
		free(logits);
		free(hidden);
	}
	double frac_agree = (double)agree / (double)(n_rl ? n_rl : 1);
	double med = nc_pct(rl, n_rl, 50), p90 = nc_pct(rl, n_rl, 90), mx = nc_pct(rl, n_rl, 100);
	double mmed = nc_pct(mrl, n_mrl, 50);
	double tk_same = (double)st.tk_same / (double)(st.tk_rows ? st.tk_rows : 1);
	fprintf(stderr, "numerics %-7s e2e: logits relL2 median %.2e p90 %.2e max %.2e argmax %.3f "
		"(%lld rows) | mtp median %.2e | topk rows same %.4f worst %lld (%lld rows) | "
		"experts same %lld/%lld\n", name, med, p90, mx, frac_agree, (long long)n_rl, mmed,
		tk_same, (long long)st.tk_worst, (long long)st.tk_rows, (long long)st.ex_same,
		(long long)st.ex_rows);
	if (!(med <= lim->median))
		nc_fail(v, "%s logits median relL2 %.3g > %.3g", name, med, lim->median);
	if (!(p90 <= lim->p90))
		nc_fail(v, "%s logits p90 relL2 %.3g > %.3g", name, p90, lim->p90);
	if (!(frac_agree >= lim->argmax))
		nc_fail(v, "%s argmax agreement %.3f < %.3f", name, frac_agree, lim->argmax);
	if (m.has_mtp && !(mmed <= lim->mtp_median))
		nc_fail(v, "%s MTP logits median relL2 %.3g > %.3g", name, mmed, lim->mtp_median);
	if (!(tk_same >= lim->tk_same) || st.tk_worst > lim->tk_worst)
		nc_fail(v, "%s indexer top-k: %.4f of rows identical (need %.2f), worst row %lld keys "
			"(max %lld)", name, tk_same, lim->tk_same, (long long)st.tk_worst,
			(long long)lim->tk_worst);
	if (lim->experts_exact && st.ex_same != st.ex_rows)
		nc_fail(v, "%s routed experts: %lld of %lld rows differ", name,
			(long long)(st.ex_rows - st.ex_same), (long long)st.ex_rows);
	free(rl);
	free(mrl);
	backend_destroy(b);
	nc_tokens_free(&S);
	nc_model_free(&m);
}

/* ---- teacher forcing, one layer at a time --------------------------------------------------- */

/* Every layer of fixture NAME (MTP layer included) run alone on the oracle's inputs, with the
 * oracle's KV cache records for the other positions; acceptance: >= 95% of rows within
 * relative L2 1e-3 of the oracle's layer output, none above 0.1; top-k and expert rows as e2e;
 * the cache record we write equal to the oracle's on >= 90% of tokens. */
NC_FN void nc_layers(struct nc_verdict *v, const char *name)
{
	struct nc_model m;
	nc_model_load(&m, name);
	struct nc_seqs S;
	nc_tokens(name, &S);
	const struct dsv32_config *c = &m.c;
	struct npy_array seqa;
	nc_load(name, "layers.npz", "seq", &seqa);
	int s = ((const int32_t *)seqa.data)[0];
	npy_free(&seqa);
	REQUIRE(s >= 0 && s < S.n);
	int64_t D = c->hidden_size, n_layers = m.L + m.has_mtp;
	int64_t rec = (int64_t)c->mla_record_bytes, irec = c->index_head_dim + 4;
	struct backend *b;
	struct err e;
	int64_t nb = (S.len[s] + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS;
	REQUIRE(backend_cpu_create(c, &m.w, nb, 4, &b, &e) == 0);
	uint8_t *mla = calloc((size_t)nb, b->mla_page_bytes), *idx = calloc((size_t)nb, b->idx_page_bytes);
	uint8_t *page = malloc(b->mla_page_bytes > b->idx_page_bytes ? b->mla_page_bytes : b->idx_page_bytes);
	REQUIRE(mla && idx && page);
	int32_t bt[64];
	for (int64_t i = 0; i < nb; i++)
		bt[i] = (int32_t)i;
	for (int64_t l = 0; l < n_layers; l++) {
		int is_mtp = l == m.L;
		int64_t T = is_mtp ? S.len[s] - 1 : S.len[s];
		const int32_t *tok = S.tok[s] + (is_mtp ? 1 : 0);
		char kx[32], kr[32], kxo[32], kro[32], km[32], ki[32];
		snprintf(kx, sizeof kx, is_mtp ? "mtp_z" : "x_l%lld", (long long)l);
		snprintf(kr, sizeof kr, "r_l%lld", (long long)l);
		snprintf(kxo, sizeof kxo, is_mtp ? "mtp_x" : "x_l%lld", (long long)l + 1);
		snprintf(kro, sizeof kro, is_mtp ? "mtp_r" : "r_l%lld", (long long)l + 1);
		snprintf(km, sizeof km, "mla_l%lld", (long long)l);
		snprintf(ki, sizeof ki, "idx_l%lld", (long long)l);
		struct npy_array ax, ar, axo, aro, am, ai;
		nc_load(name, "layers.npz", kx, &ax);
		nc_load(name, "layers.npz", kxo, &axo);
		nc_load(name, "layers.npz", kro, &aro);
		nc_load(name, "layers.npz", km, &am);
		nc_load(name, "layers.npz", ki, &ai);
		REQUIRE(ax.shape[0] == T && ax.shape[1] * 2 == D && am.shape[0] == T &&
			am.shape[1] * 4 == rec && ai.shape[1] * 4 == irec);
		float *xin = malloc((size_t)(T * D) * sizeof *xin), *rin = calloc((size_t)(T * D), sizeof *rin);
		float *xo = malloc((size_t)(T * D) * sizeof *xo), *ro = malloc((size_t)(T * D) * sizeof *ro);
		float *x = malloc((size_t)D * sizeof *x), *r = malloc((size_t)D * sizeof *r);
		REQUIRE(xin && rin && xo && ro && x && r);
		nc_unpack_bf16(&ax, xin);
		nc_unpack_bf16(&axo, xo);
		nc_unpack_bf16(&aro, ro);
		if (!is_mtp) {
			nc_load(name, "layers.npz", kr, &ar);
			nc_unpack_bf16(&ar, rin);
			npy_free(&ar);
		}
		/* the oracle's cache records of every position, in our page layouts */
		const uint8_t *om = am.data, *oi = ai.data;
		for (int64_t t = 0; t < T; t++) {
			int64_t pg = t / KV_PAGE_TOKENS, sl = t % KV_PAGE_TOKENS;
			memcpy(mla + (size_t)pg * b->mla_page_bytes + (size_t)(sl * rec), om + t * rec,
			       (size_t)rec);
			uint8_t *ip = idx + (size_t)pg * b->idx_page_bytes;
			memcpy(ip + sl * c->index_head_dim, oi + t * irec, (size_t)c->index_head_dim);
			memcpy(ip + KV_PAGE_TOKENS * c->index_head_dim + sl * 4,
			       oi + t * irec + c->index_head_dim, 4);
		}
		struct nc_dumps d;
		nc_dumps_init(&d, n_layers, T, c->num_experts_per_tok);
		struct backend_dump dump = {nc_dump_cb, &d};
		double *rx = malloc((size_t)T * sizeof *rx), *rr = malloc((size_t)T * sizeof *rr);
		REQUIRE(rx && rr);
		int64_t ok_x = 0, ok_r = 0, same_mla = 0, same_idx = 0;
		for (int64_t t = 0; t < T; t++) {
			for (int64_t i = 0; i < nb; i++) {
				REQUIRE(backend_page_io(b, l, BACKEND_POOL_MLA, i, mla + i * b->mla_page_bytes, 1) == 0);
				REQUIRE(backend_page_io(b, l, BACKEND_POOL_INDEX, i, idx + i * b->idx_page_bytes, 1) == 0);
			}
			memcpy(x, xin + t * D, (size_t)D * sizeof *x);
			memcpy(r, rin + t * D, (size_t)D * sizeof *r);
			int64_t p = t;
			uint8_t fl = 0;
			struct backend_seq sq = {1, tok + t, &p, bt, nb, &fl, NULL, NULL, NULL, 0};
			struct backend_step st = {0, 1, &sq, &dump};
			REQUIRE(backend_cpu_layer_step(b, l, &st, x, r) == 0);
			rx[t] = nc_rel_l2(x, xo + t * D, D);
			rr[t] = nc_rel_l2(r, ro + t * D, D);
			ok_x += rx[t] <= 1e-3;
			ok_r += rr[t] <= 1e-3;
			int64_t pg = t / KV_PAGE_TOKENS, sl = t % KV_PAGE_TOKENS;
			REQUIRE(backend_page_io(b, l, BACKEND_POOL_MLA, pg, page, 0) == 0);
			same_mla += !memcmp(page + sl * rec, om + t * rec, (size_t)rec);
			REQUIRE(backend_page_io(b, l, BACKEND_POOL_INDEX, pg, page, 0) == 0);
			same_idx += !memcmp(page + sl * c->index_head_dim, oi + t * irec,
					    (size_t)c->index_head_dim) &&
				    !memcmp(page + KV_PAGE_TOKENS * c->index_head_dim + sl * 4,
					    oi + t * irec + c->index_head_dim, 4);
		}
		struct nc_sets sets = {0};
		nc_sets_add(v, &sets, &m, &d, s, l, T);
		double mx = nc_pct(rx, T, 100), mr = nc_pct(rr, T, 100);
		double fx = (double)ok_x / (double)T, fr = (double)ok_r / (double)T;
		fprintf(stderr, "numerics %-7s layer %lld (teacher forced, %lld rows): x rows <= 1e-3 "
			"%.3f max %.2e | r rows <= 1e-3 %.3f max %.2e | topk same %lld/%lld worst %lld | "
			"experts same %lld/%lld | cache records same mla %lld idx %lld\n", name,
			(long long)l, (long long)T, fx, mx, fr, mr, (long long)sets.tk_same,
			(long long)sets.tk_rows, (long long)sets.tk_worst, (long long)sets.ex_same,
			(long long)sets.ex_rows, (long long)same_mla, (long long)same_idx);
		if (fx < 0.95 || mx > 0.1 || fr < 0.95 || mr > 0.1)
			nc_fail(v, "%s layer %lld: rows within 1e-3: x %.3f r %.3f (need 0.95), max x %.3g "
				"r %.3g (need <= 0.1)", name, (long long)l, fx, fr, mx, mr);
		if ((double)sets.tk_same < 0.9 * (double)sets.tk_rows || sets.tk_worst > 2)
			nc_fail(v, "%s layer %lld: top-k rows identical %lld/%lld, worst %lld", name,
				(long long)l, (long long)sets.tk_same, (long long)sets.tk_rows,
				(long long)sets.tk_worst);
		if (sets.ex_same != sets.ex_rows)
			nc_fail(v, "%s layer %lld: expert rows identical %lld/%lld", name, (long long)l,
				(long long)sets.ex_same, (long long)sets.ex_rows);
		if ((double)same_mla < 0.9 * (double)T || (double)same_idx < 0.9 * (double)T)
			nc_fail(v, "%s layer %lld: cache records equal to the oracle's: mla %lld idx %lld "
				"of %lld", name, (long long)l, (long long)same_mla, (long long)same_idx,
				(long long)T);
		nc_dumps_free(&d);
		free(rx);
		free(rr);
		free(xin);
		free(rin);
		free(xo);
		free(ro);
		free(x);
		free(r);
		npy_free(&ax);
		npy_free(&axo);
		npy_free(&aro);
		npy_free(&am);
		npy_free(&ai);
	}
	free(mla);
	free(idx);
	free(page);
	backend_destroy(b);
	nc_tokens_free(&S);
	nc_model_free(&m);
}

#endif
