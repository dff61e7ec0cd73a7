/*
 * ckpt_helpers.h — what the checkpoint tests share: running mkmodel (found through
 * test_bin_dir()), the "mini" config (the tiny preset with a 1024-token vocab, so a complete
 * checkpoint is ~2 MB), and rewriting a checkpoint with one tensor altered.
 */
#ifndef DSV32_TESTS_CKPT_HELPERS_H
#define DSV32_TESTS_CKPT_HELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "model/config.h"
#include "model/fileio.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/test.h"

/* Runs `$DSV32_BIN/mkmodel ARGS` with stdout+stderr into TMP/mkmodel.log; returns the exit
 * status and, if log is non-NULL, the log text (malloc'd). */
static inline int run_mkmodel(const char *args, char **log)
{
	char logp[512];
	snprintf(logp, sizeof logp, "%s/mkmodel.log", test_tmpdir());
	size_t n = strlen(test_bin_dir()) + strlen(args) + strlen(logp) + 32;
	char *cmd = malloc(n);
	REQUIRE(cmd);
	snprintf(cmd, n, "%s/mkmodel %s >%s 2>&1", test_bin_dir(), args, logp);
	int st = system(cmd);
	free(cmd);
	if (log)
		*log = file_read(logp, NULL, 1 << 20, NULL);
	return st == -1 ? -1 : WEXITSTATUS(st);
}

/* A generated checkpoint, opened and bound. */
struct test_model {
	char dir[512];
	struct dsv32_config c;
	struct checkpoint ck;
	struct weights w;
};

/* Loads m->dir's config, opens the checkpoint and binds every tensor; ends the case with the
 * reason on any failure. */
static inline void test_model_bind(struct test_model *m)
{
	struct err e;
	REQUIRE(config_load(&m->c, m->dir, &e) == 0);
	REQUIRE(ckpt_open(&m->ck, m->dir, &e) == 0);
	if (weights_bind(&m->w, &m->c, &m->ck, &e)) {
		test_fail(__FILE__, __LINE__, "weights_bind: %s", e.msg);
		test_abort_case();
	}
}

/* Runs cmd (a shell command that writes the checkpoint into m->dir), then test_model_bind. */
static inline void test_model_make(struct test_model *m, const char *cmd)
{
	REQUIRE(system(cmd) == 0);
	test_model_bind(m);
}

static inline void test_model_free(struct test_model *m)
{
	weights_free(&m->w);
	ckpt_close(&m->ck);
}

/* Writes TMP/mini.json: tests/data/tiny_config.json with vocab_size 1024. Returns its path. */
static inline const char *write_mini_config(void)
{
	static char path[512];
	char src[4096];
	snprintf(src, sizeof src, "%s/tests/data/tiny_config.json", test_root());
	size_t len;
	char *t = file_read(src, &len, 1 << 20, NULL);
	REQUIRE(t);
	char *v = strstr(t, "\"vocab_size\": 129280");
	REQUIRE(v);
	memcpy(v, "\"vocab_size\":   1024", 20);
	snprintf(path, sizeof path, "%s/mini.json", test_tmpdir());
	REQUIRE(file_write(path, t, len, NULL) == 0);
	free(t);
	return path;
}

/* mkmodel --config mini.json --seed SEED --out TMP/NAME [--manifest TMP/NAME.manifest]. */
static inline const char *make_mini(const char *name, int seed, int manifest)
{
	static char dir[512];
	char args[2048];
	const char *cfg = write_mini_config();
	snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
	snprintf(args, sizeof args, "--config %s --seed %d --tokenizer fallback --out %s%s%s%s",
		 cfg, seed, dir, manifest ? " --manifest " : "", manifest ? dir : "",
		 manifest ? ".manifest" : "");
	char *log = NULL;
	int st = run_mkmodel(args, &log);
	if (st)
		fprintf(stderr, "mkmodel failed (%d): %s\n", st, log ? log : "");
	free(log);
	REQUIRE(st == 0);
	return dir;
}

/* How a rewrite alters the tensor it targets. */
struct alter {
	const char *name;   /* tensor to alter */
	int drop;           /* leave it out */
	int dtype;          /* >= 0: relabel with this dtype (same bytes; must have the same size) */
	int ndim;           /* > 0: relabel with this shape (same byte count) */
	int64_t shape[ST_MAX_DIMS];
	void (*edit)(void *bytes, size_t n); /* change the bytes */
	const void *data;   /* non-NULL: new bytes (nbytes of them) */
	size_t nbytes;
};

/* Copies every tensor of ck into the single file OUT (model.safetensors), altered as a says. */
static inline void rewrite_ckpt(const struct checkpoint *ck, const char *out, const struct alter *a)
{
	struct err e;
	struct st_writer *w = st_writer_open(out, &e);
	REQUIRE(w);
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const struct st_tensor *t = &ck->tensors[i];
		int hit = a && !strcmp(t->name, a->name);
		if (hit && a->drop)
			continue;
		enum st_dtype dt = hit && a->dtype >= 0 ? (enum st_dtype)a->dtype : t->dtype;
		int nd = hit && a->ndim > 0 ? a->ndim : t->ndim;
		const int64_t *sh = hit && a->ndim > 0 ? a->shape : t->shape;
		REQUIRE(st_writer_add(w, t->name, dt, nd, sh) == 0);
	}
	REQUIRE(st_writer_begin_data(w) == 0);
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const struct st_tensor *t = &ck->tensors[i];
		int hit = a && !strcmp(t->name, a->name);
		if (hit && a->drop)
			continue;
		if (hit && a->data) {
			REQUIRE(st_writer_data(w, a->data, a->nbytes) == 0);
		} else if (hit && a->edit) {
			void *copy = malloc(t->nbytes ? t->nbytes : 1);
			REQUIRE(copy);
			memcpy(copy, t->data, t->nbytes);
			a->edit(copy, t->nbytes);
			REQUIRE(st_writer_data(w, copy, t->nbytes) == 0);
			free(copy);
		} else {
			REQUIRE(st_writer_data(w, t->data, t->nbytes) == 0);
		}
	}
	REQUIRE(st_writer_close(w, &e) == 0);
}

#endif
