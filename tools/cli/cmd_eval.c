/*
 * cmd_eval.c — `dsv32 eval`: run the forward pass offline on token files and write what a
 * reference comparison needs (logits, MTP logits, indexer top-k, routed experts, named
 * intermediates), greedy continuations and perplexity.
 *
 *   dsv32 eval --model DIR --backend cpu --tokens FILE [--chunk N] [--generate N]
 *              [--logits-out F] [--mtp-out F] [--dump-topk F] [--dump-experts F]
 *              [--dump NAME... [--dump-out F]] [--threads N] [--batch-invariant]
 *
 * --batch-invariant: the CUDA backend's batch-invariant mode (backend_cuda_opts; the CPU
 * backend always is). Without it the CUDA backend runs its fast paths.
 *
 * FILE: one sequence per line, comma-separated token ids. Outputs: one sequence and a .npy
 * name -> float32 [T, vocab] (row t = logits after position t); otherwise .npz with keys
 * seq0, seq1, ... Owns: argument parsing, the token-file parser, driving backend steps and
 * collecting dumps. Must not: compute model math (the backend does).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/backend.h"
#include "model/clock.h"
#include "model/config.h"
#include "model/fileio.h"
#include "model/kv_cache.h"
#include "model/npy.h"
#include "model/safetensors.h"
#include "model/token_file.h"
#include "model/weights.h"
#include "tools/cli/cli.h"

#define MAX_DUMP_NAMES 32

/* ---- dumps: rows collected per (name, seq, layer), written as padded matrices ------------- */

struct dump_buf {
	char key[96];
	int is_int;
	int64_t width;   /* max values per row */
	int64_t n_rows;  /* positions 0 .. n_rows-1 */
	void **row;      /* [n_rows] malloc'd copies (NULL = missing) */
	int64_t *row_n;  /* [n_rows] */
};

struct dumps {
	const char *names[MAX_DUMP_NAMES];
	int n_names;
	int64_t max_pos;  /* rows at positions >= max_pos (generated tokens) are not kept */
	int64_t seq;      /* the sequence being run (steps carry one sequence each) */
	struct dump_buf *b;
	int64_t n, cap;
};

/* The names the CPU backend dumps (model/backend.h). */
static const char *const dump_names[] = {
	"embed", "attn_norm", "q_cmpr", "q", "kv_cmpr", "k_pe", "idx_q", "idx_k", "idx_w",
	"idx_scores", "idx_topk", "q_lat", "attn_o", "attn_out", "ffn_norm", "ffn_out",
	"ffn_moe_logits", "ffn_moe_topk", "ffn_moe_weights", "ffn_moe_out", "result_norm",
	"mtp_cat", "mtp_eh_proj",
};

static int dump_name_known(const char *name)
{
	for (size_t i = 0; i < sizeof dump_names / sizeof *dump_names; i++)
		if (!strcmp(dump_names[i], name))
			return 1;
	return 0;
}

static int dump_wanted(const struct dumps *d, const char *name)
{
	for (int i = 0; i < d->n_names; i++)
		if (!strcmp(d->names[i], name))
			return 1;
	return 0;
}

static void dump_cb(void *ctx, const char *name, int64_t layer, int64_t seq, int64_t pos,
		    int is_int, const void *data, int64_t n)
{
	struct dumps *d = ctx;
	(void)seq; /* always 0: eval runs one sequence per step */
	seq = d->seq;
	if (pos >= d->max_pos || !dump_wanted(d, name))
		return;
	char key[96];
	if (layer >= 0)
		snprintf(key, sizeof key, "%s_s%lld_l%lld", name, (long long)seq, (long long)layer);
	else
		snprintf(key, sizeof key, "%s_s%lld", name, (long long)seq);
	struct dump_buf *b = NULL;
	for (int64_t i = 0; i < d->n; i++)
		if (!strcmp(d->b[i].key, key))
			b = &d->b[i];
	if (!b) {
		if (d->n == d->cap) {
			d->cap = d->cap ? 2 * d->cap : 64;
			d->b = realloc(d->b, (size_t)d->cap * sizeof *d->b);
			ASSERT(d->b);
		}
		b = &d->b[d->n++];
		memset(b, 0, sizeof *b);
		snprintf(b->key, sizeof b->key, "%s", key);
		b->is_int = is_int;
	}
	if (pos >= b->n_rows) {
		int64_t nr = pos + 1;
		b->row = realloc(b->row, (size_t)nr * sizeof *b->row);
		b->row_n = realloc(b->row_n, (size_t)nr * sizeof *b->row_n);
		ASSERT(b->row && b->row_n);
		for (int64_t i = b->n_rows; i < nr; i++)
			b->row[i] = NULL, b->row_n[i] = 0;
		b->n_rows = nr;
	}
	free(b->row[pos]);
	b->row[pos] = malloc((size_t)(n ? n : 1) * 4);
	ASSERT(b->row[pos]);
	memcpy(b->row[pos], data, (size_t)n * 4);
	b->row_n[pos] = n;
	if (n > b->width)
		b->width = n;
}

/* Adds every collected buffer whose name is `name` (or all when NULL) to an npz, keyed by the
 * full key, or with the name prefix stripped when strip = 1 ("idx_topk_s0_l1" -> "s0_l1"). */
static int dumps_write(struct dumps *d, const char *name, const char *path, struct err *e)
{
	struct npz_writer *z = npz_open(path, e);
	if (!z)
		return -EIO;
	int r = 0;
	for (int64_t i = 0; i < d->n && !r; i++) {
		struct dump_buf *b = &d->b[i];
		size_t nl = name ? strlen(name) : 0;
		if (name && (strncmp(b->key, name, nl) || b->key[nl] != '_'))
			continue;
		int64_t shape[2] = {b->n_rows, b->width};
		uint32_t *m = malloc((size_t)(b->n_rows * b->width + 1) * 4);
		ASSERT(m);
		float ninf = -INFINITY;
		uint32_t pad;
		if (b->is_int)
			pad = 0xffffffffu; /* -1 */
		else
			memcpy(&pad, &ninf, 4);
		for (int64_t t = 0; t < b->n_rows; t++)
			for (int64_t k = 0; k < b->width; k++)
				m[t * b->width + k] = pad;
		for (int64_t t = 0; t < b->n_rows; t++)
			if (b->row[t])
				memcpy(m + t * b->width, b->row[t], (size_t)b->row_n[t] * 4);
		r = npz_add(z, name ? b->key + nl + 1 : b->key, b->is_int ? NPY_I32 : NPY_F32, 2,
			    shape, m);
		free(m);
	}
	int rc = npz_close(z, e);
	if (r)
		return err_set(e, r, "%s: cannot add an entry (%s)", path, strerror(-r));
	return rc;
}

static void dumps_free(struct dumps *d)
{
	for (int64_t i = 0; i < d->n; i++) {
		for (int64_t t = 0; t < d->b[i].n_rows; t++)
			free(d->b[i].row[t]);
		free(d->b[i].row);
		free(d->b[i].row_n);
	}
	free(d->b);
}

/* ---- outputs -------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

/* mats[i]: [rows[i], cols] float32. */
static int write_mats(const char *path, float **mats, const int64_t *rows, int64_t n, int64_t cols,
		      struct err *e)
{
	if (n == 1 && ends_with(path, ".npy")) {
		int64_t shape[2] = {rows[0], cols};
		return npy_write(path, NPY_F32, 2, shape, mats[0], e);
	}
	struct npz_writer *z = npz_open(path, e);
	if (!z)
		return -EIO;
	int r = 0;
	for (int64_t i = 0; i < n && !r; i++) {
		char key[32];
		snprintf(key, sizeof key, "seq%lld", (long long)i);
		int64_t shape[2] = {rows[i], cols};
		r = npz_add(z, key, NPY_F32, 2, shape, mats[i]);
	}
	int rc = npz_close(z, e);
	return r ? err_set(e, r, "%s: write failed", path) : rc;
}

static double cpu_s(void) /* CPU time of every thread of the process */
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Single-thread streaming read bandwidth in GB/s (sum over a 256 MiB buffer, best of 3): the
 * limit decode is compared against in --bench. */
static double read_bandwidth(void)
{
	size_t n = (size_t)64 << 20; /* floats */
	float *buf = malloc(n * sizeof *buf);
	if (!buf)
		return 0;
	for (size_t i = 0; i < n; i++)
		buf[i] = (float)(i & 7);
	double best = 0;
	volatile float sink = 0;
	for (int rep = 0; rep < 3; rep++) {
		double t0 = clock_mono_s();
		float l[8] = {0};
		for (size_t i = 0; i < n; i += 8)
			for (int j = 0; j < 8; j++)
				l[j] += buf[i + j];
		double dt = clock_mono_s() - t0;
		sink += l[0] + l[7];
		double gbs = (double)(n * sizeof *buf) / dt / 1e9;
		best = gbs > best ? gbs : best;
	}
	(void)sink;
	free(buf);
	return best;
}

static int64_t argmax(const float *x, int64_t n)
{
	int64_t best = 0;
	for (int64_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* -log softmax(x)[target], in double. */
static double nll(const float *x, int64_t n, int64_t target)
{
	double m = -INFINITY, s = 0;
	for (int64_t i = 0; i < n; i++)
		m = x[i] > m ? x[i] : m;
	for (int64_t i = 0; i < n; i++)
		s += exp((double)x[i] - m);
	return log(s) + m - (double)x[target];
}

/* ---- the command ---------------------------------------------------------------------- */

struct eval_opts {
	const char *model, *backend, *tokens, *logits_out, *mtp_out, *topk_out, *experts_out;
	const char *dump_out;
	int64_t chunk, generate;
	int threads;
	int bench; /* logits of the last prompt row only (no perplexity): serving-like timing */
	int batch_invariant; /* --batch-invariant: the CUDA backend's batch-invariant mode */
	struct dumps dumps;
};

static int usage(void)
{
	fprintf(stderr,
		"usage: dsv32 eval --model DIR --backend cpu --tokens FILE [--chunk N] [--generate N]\n"
		"                  [--logits-out F] [--mtp-out F] [--dump-topk F] [--dump-experts F]\n"
		"                  [--dump NAME... [--dump-out F]] [--threads N] [--bench]\n"
		"                  [--batch-invariant]\n"
		"  --bench: logits for the last prompt row only (no perplexity), for timing\n"
		"  --batch-invariant: the CUDA backend's batch-invariant mode (default: its fast paths)\n");
	return 2;
}

static int parse_int(const char *s, int64_t lo, int64_t *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < lo)
		return -1;
	*out = v;
	return 0;
}

static int parse_args(int argc, char **argv, struct eval_opts *o)
{
	memset(o, 0, sizeof *o);
	o->backend = "cpu";
	o->dump_out = "dump.npz";
	long nproc = sysconf(_SC_NPROCESSORS_ONLN);
	o->threads = nproc > 0 ? (int)nproc : 1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int64_t n;
		if (!strcmp(a, "--bench")) {
			o->bench = 1;
			continue;
		}
		if (!strcmp(a, "--batch-invariant")) {
			o->batch_invariant = 1;
			continue;
		}
		if (!strcmp(a, "--dump")) {
			while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) {
				if (o->dumps.n_names == MAX_DUMP_NAMES)
					return -1;
				if (!dump_name_known(argv[i + 1])) {
					fprintf(stderr, "dsv32 eval: --dump: unknown name '%s'; known:",
						argv[i + 1]);
					for (size_t k = 0; k < sizeof dump_names / sizeof *dump_names; k++)
						fprintf(stderr, " %s", dump_names[k]);
					fprintf(stderr, "\n");
					return -1;
				}
				o->dumps.names[o->dumps.n_names++] = argv[++i];
			}
			continue;
		}
		if (!v)
			return -1;
		i++;
		if (!strcmp(a, "--model"))
			o->model = v;
		else if (!strcmp(a, "--backend"))
			o->backend = v;
		else if (!strcmp(a, "--tokens"))
			o->tokens = v;
		else if (!strcmp(a, "--logits-out"))
			o->logits_out = v;
		else if (!strcmp(a, "--mtp-out"))
			o->mtp_out = v;
		else if (!strcmp(a, "--dump-topk"))
			o->topk_out = v;
		else if (!strcmp(a, "--dump-experts"))
			o->experts_out = v;
		else if (!strcmp(a, "--dump-out"))
			o->dump_out = v;
		else if (!strcmp(a, "--chunk") && !parse_int(v, 1, &n))
			o->chunk = n;
		else if (!strcmp(a, "--generate") && !parse_int(v, 0, &n))
			o->generate = n;
		else if (!strcmp(a, "--threads") && !parse_int(v, 1, &n) && n <= 1024)
			o->threads = (int)n;
		else
			return -1;
	}
	if (!o->model || !o->tokens || (o->bench && (o->logits_out || o->mtp_out)))
		return -1;
	if (o->topk_out && o->dumps.n_names < MAX_DUMP_NAMES)
		o->dumps.names[o->dumps.n_names++] = "idx_topk";
	if (o->experts_out && o->dumps.n_names < MAX_DUMP_NAMES)
		o->dumps.names[o->dumps.n_names++] = "ffn_moe_topk";
	return 0;
}

/* Runs one sequence: main steps in chunks (logits of every row -> perplexity and, if asked,
 * the output matrix), then MTP steps, then greedy generation. */
static int run_seq(struct backend *be, const struct dsv32_config *c, const struct eval_opts *o,
		   struct backend_dump *dump, int64_t si, const int32_t *tok, int64_t T,
		   const int32_t *bt, int64_t n_blocks, float **logits_all, float **mtp_all,
		   double *t_prefill, double *t_decode, double *c_prefill, double *c_decode)
{
	int64_t D = c->hidden_size, V = c->vocab_size, chunk = o->chunk ? o->chunk : T;
	int r = 0;
	int64_t *pos = malloc((size_t)(T + 1) * sizeof *pos);
	uint8_t *flags = malloc((size_t)T);
	float *logits = malloc((size_t)(chunk * V) * sizeof *logits); /* [chunk, V] */
	float *hidden = o->mtp_out ? malloc((size_t)(T * D) * sizeof *hidden) : NULL; /* [T, D] */
	ASSERT(pos && flags && logits && (!o->mtp_out || hidden));
	if (o->logits_out) {
		*logits_all = malloc((size_t)(T * V) * sizeof **logits_all);
		ASSERT(*logits_all);
	}
	for (int64_t t = 0; t <= T; t++) {
		pos[t] = t;
		if (t < T)
			flags[t] = (o->bench && t < T - 1 ? 0 : BACKEND_ROW_LOGITS) |
				   (hidden ? BACKEND_ROW_HIDDEN : 0);
	}
	double nll_sum = 0, t0 = clock_mono_s(), c0 = cpu_s();
	for (int64_t b = 0; b < T && !r; b += chunk) {
		int64_t n = T - b < chunk ? T - b : chunk;
		struct backend_seq s = {n, tok + b, pos + b, bt, n_blocks, flags + b, logits,
					hidden ? hidden + b * D : NULL, NULL, 0};
		struct backend_step st = {0, 1, &s, dump};
		r = backend_step(be, &st);
		for (int64_t i = 0; i < n && !r && !o->bench; i++) {
			if (b + i + 1 < T)
				nll_sum += nll(logits + i * V, V, tok[b + i + 1]);
			if (*logits_all)
				memcpy(*logits_all + (b + i) * V, logits + i * V, (size_t)V * sizeof *logits);
		}
	}
	*t_prefill += clock_mono_s() - t0;
	*c_prefill += cpu_s() - c0;
	if (!r && T > 1 && !o->bench)
		printf("seq%lld: perplexity %.4f over %lld tokens\n", (long long)si,
		       exp(nll_sum / (double)(T - 1)), (long long)(T - 1));

	if (!r && o->mtp_out) { /* row i = MTP(token i+1, h_i), positions 0..T-2 */
		*mtp_all = malloc((size_t)((T > 1 ? T - 1 : 1) * V) * sizeof **mtp_all);
		ASSERT(*mtp_all);
		for (int64_t t = 0; t < T; t++)
			flags[t] = BACKEND_ROW_LOGITS;
		for (int64_t b = 0; b + 1 < T && !r; b += chunk) {
			int64_t n = T - 1 - b < chunk ? T - 1 - b : chunk;
			struct backend_seq s = {n, tok + b + 1, pos + b, bt, n_blocks, flags + b,
						*mtp_all + b * V, NULL, hidden + b * D, 0};
			struct backend_step st = {1, 1, &s, dump};
			r = backend_step(be, &st);
		}
	}

	if (!r && o->generate > 0) {
		int64_t last = o->bench ? 0 : (T - 1) % chunk; /* bench: only the last row has logits */
		int64_t cur = argmax(logits + last * V, V);
		double t1 = clock_mono_s(), c1 = cpu_s();
		printf("seq%lld: generated", (long long)si);
		for (int64_t g = 0; g < o->generate && !r; g++) {
			printf(" %lld", (long long)cur);
			if (g + 1 == o->generate)
				break;
			int32_t id = (int32_t)cur;
			int64_t p = T + g;
			struct backend_seq s = {1, &id, &p, bt, n_blocks, NULL, logits, NULL, NULL, 0};
			struct backend_step st = {0, 1, &s, NULL};
			r = backend_step(be, &st);
			cur = argmax(logits, V);
		}
		printf("\n");
		*t_decode += clock_mono_s() - t1;
		*c_decode += cpu_s() - c1;
	}
	free(pos);
	free(flags);
	free(logits);
	free(hidden);
	return r;
}

int cmd_eval(int argc, char **argv)
{
	struct eval_opts o;
	if (parse_args(argc, argv, &o))
		return usage();
	if (strcmp(o.backend, "cpu") && strcmp(o.backend, "cuda")) {
		fprintf(stderr, "dsv32 eval: unknown backend '%s' (cpu or cuda)\n", o.backend);
		return 1;
	}
	struct err e = {{0}};
	struct dsv32_config c;
	struct checkpoint ck;
	struct weights w;
	struct token_seqs S = {0};
	struct backend *be = NULL;
	int rc = 1, ck_open = 0, w_bound = 0;
	size_t len;
	char *text = NULL;
	if (config_load(&c, o.model, &e))
		goto out;
	text = file_read(o.tokens, &len, (size_t)1 << 30, &e);
	if (!text || token_file_parse(text, len, o.tokens, c.vocab_size, &S, &e))
		goto out;
	if (ckpt_open(&ck, o.model, &e))
		goto out;
	ck_open = 1;
	if (weights_bind(&w, &c, &ck, &e))
		goto out;
	w_bound = 1;
	if (o.mtp_out && !w.has_mtp) {
		err_set(&e, -EINVAL, "%s: --mtp-out needs an MTP layer (num_nextn_predict_layers = 0)",
			o.model);
		goto out;
	}
	int64_t n_pages = 0, max_T = 0;
	for (int64_t i = 0; i < S.n; i++) {
		n_pages += (S.len[i] + o.generate + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS;
		max_T = S.len[i] > max_T ? S.len[i] : max_T;
	}
	/* cuda: pools and the weight upload are real; its step says what is not on the GPU yet
	 * (never a silent CPU fallback) */
	struct backend_cuda_opts co = {.n_pages = n_pages, .batch_invariant = o.batch_invariant};
	if (!strcmp(o.backend, "cuda") ? backend_cuda_create_opts(&c, &w, &ck, &co, &be, &e)
				       : backend_cpu_create(&c, &w, n_pages, o.threads, &be, &e))
		goto out;
	o.dumps.max_pos = max_T;
	struct backend_dump dump = {dump_cb, &o.dumps};
	float **logits = calloc((size_t)S.n, sizeof *logits), **mtp = calloc((size_t)S.n, sizeof *mtp);
	int64_t *rows = calloc((size_t)S.n, sizeof *rows), *mrows = calloc((size_t)S.n, sizeof *rows);
	int32_t *bt = malloc((size_t)n_pages * sizeof *bt);
	ASSERT(logits && mtp && rows && mrows && bt);
	for (int64_t p = 0; p < n_pages; p++)
		bt[p] = (int32_t)p;
	double t_pre = 0, t_dec = 0, c_pre = 0, c_dec = 0;
	int64_t base = 0, n_tok = 0, r = 0;
	for (int64_t i = 0; i < S.n && !r; i++) {
		int64_t nb = (S.len[i] + o.generate + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS;
		o.dumps.seq = i;
		r = run_seq(be, &c, &o, o.dumps.n_names ? &dump : NULL, i, S.tok[i], S.len[i],
			    bt + base, nb, &logits[i], &mtp[i], &t_pre, &t_dec, &c_pre, &c_dec);
		base += nb;
		n_tok += S.len[i];
		rows[i] = S.len[i];
		mrows[i] = S.len[i] > 1 ? S.len[i] - 1 : 0;
	}
	if (r)
		err_set(&e, (int)r, "backend step failed: %s", strerror((int)-r));
	/* wall time, and CPU time of all threads (the honest number on a shared machine) */
	fprintf(stderr, "eval: %d threads; prefill %lld tokens: %.3f s wall (%.1f tok/s), %.3f s CPU",
		o.threads, (long long)n_tok, t_pre, n_tok / (t_pre > 0 ? t_pre : 1e-9), c_pre);
	if (o.generate > 1) {
		int64_t nd = S.n * (o.generate - 1);
		fprintf(stderr, "; decode %lld steps: %.3f s wall (%.2f tok/s), %.3f s CPU",
			(long long)nd, t_dec, (double)nd / (t_dec > 0 ? t_dec : 1e-9), c_dec);
	}
	fprintf(stderr, "\n");
	if (o.bench) {
		double bw = read_bandwidth(), mb = (double)c.vocab_size * c.hidden_size * 2 / 1e6;
		fprintf(stderr, "bench: one-thread read bandwidth %.1f GB/s; lm_head alone streams %.1f MB "
				"per decode token -> floor %.0f tok/s\n", bw, mb, bw * 1e3 / mb);
	}
	if (!r && o.logits_out)
		r = write_mats(o.logits_out, logits, rows, S.n, c.vocab_size, &e);
	if (!r && o.mtp_out)
		r = write_mats(o.mtp_out, mtp, mrows, S.n, c.vocab_size, &e);
	if (!r && o.topk_out)
		r = dumps_write(&o.dumps, "idx_topk", o.topk_out, &e);
	if (!r && o.experts_out)
		r = dumps_write(&o.dumps, "ffn_moe_topk", o.experts_out, &e);
	int other_dumps = o.dumps.n_names - !!o.topk_out - !!o.experts_out;
	if (!r && other_dumps > 0)
		r = dumps_write(&o.dumps, NULL, o.dump_out, &e);
	for (int64_t i = 0; i < S.n; i++) {
		free(logits[i]);
		free(mtp[i]);
	}
	free(logits);
	free(mtp);
	free(rows);
	free(mrows);
	free(bt);
	rc = r ? 1 : 0;
out:
	if (rc)
		fprintf(stderr, "dsv32 eval: %s\n", e.msg);
	backend_destroy(be);
	if (w_bound)
		weights_free(&w);
	if (ck_open)
		ckpt_close(&ck);
	token_seqs_free(&S);
	free(text);
	dumps_free(&o.dumps);
	return rc;
}
