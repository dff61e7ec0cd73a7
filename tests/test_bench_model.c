/*
 * test_bench_model.c — what of `dsv32 bench model` and the synthetic-weights option runs
 * without a GPU: every argument error exits 2 before anything is created, with a message
 * naming the bad flag and value; the engine refuses synthetic weights on a backend other than
 * cuda before it opens anything. (The benchmark itself runs on the GPU machine.)
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "model/engine.h"
#include "model/fileio.h"
#include "tests/ckpt_helpers.h"
#include "tests/test.h"

/* Runs `$DSV32_BIN/dsv32 bench model ARGS`; returns the exit status, *err = its stderr. */
static int run_bench_model(const char *args, char **err)
{
	char cmd[4096], path[512];
	snprintf(path, sizeof path, "%s/bench_model.err", test_tmpdir());
	snprintf(cmd, sizeof cmd, "%s/dsv32 bench model %s >/dev/null 2>%s", test_bin_dir(), args, path);
	int st = system(cmd);
	*err = file_read(path, NULL, 1 << 20, NULL);
	REQUIRE(*err);
	return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

TEST(bench_model, argument_errors_exit_2_naming_the_value)
{
	static const char *const cases[][2] = {
		{"", "give exactly one of --synthetic and --model DIR"},
		{"--synthetic --model /srv/m", "give exactly one of --synthetic and --model DIR"},
		{"--synthetic --layers 0", "--layers 0: out of range [1, 61]"},
		{"--synthetic --layers four", "--layers \"four\": not an integer"},
		{"--synthetic --layers 3 --dense 4", "--dense 4 exceeds --layers 3"},
		{"--synthetic --dense -1", "--dense -1: out of range [0, 61]"},
		{"--synthetic --seed 1x", "--seed \"1x\": not an integer"},
		{"--synthetic --batches 1,16,x", "--batches \"x\": not an integer"},
		{"--synthetic --batches 1,,16", "--batches \"1,,16\": expected a comma-separated list"},
		{"--synthetic --batches 0", "--batches 0: out of range [1, 4096]"},
		{"--synthetic --contexts 1024,", "--contexts \"1024,\": expected a comma-separated list"},
		{"--synthetic --prompts 4096,-5", "--prompts -5: out of range"},
		{"--synthetic --steps 0", "--steps 0: out of range [1, 100000]"},
		{"--synthetic --prefill-reps 0", "--prefill-reps 0: out of range [1, 100]"},
		{"--synthetic --kv-pages none", "--kv-pages \"none\": not an integer"},
		{"--synthetic --steps", "--steps needs a value"},
		{"--synthetic --graphs sometimes", "--graphs \"sometimes\": expected off, on or both"},
		{"--synthetic --frobnicate", "unknown argument \"--frobnicate\""},
		{"--model /srv/m --layers 2", "--layers and --dense describe a synthetic model"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char *err;
		int st = run_bench_model(cases[i][0], &err);
		if (st != 2 || !strstr(err, cases[i][1]))
			printf("    `dsv32 bench model %s`: exit %d, stderr: %s", cases[i][0], st, err);
		CHECK_EQ_INT(st, 2);
		CHECK_CONTAINS(err, cases[i][1]);
		free(err);
	}
	/* the benchmark is listed */
	char cmd[1024], path[512];
	snprintf(path, sizeof path, "%s/bench_list.err", test_tmpdir());
	snprintf(cmd, sizeof cmd, "%s/dsv32 bench 2>%s", test_bin_dir(), path);
	int st = system(cmd);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	char *list = file_read(path, NULL, 1 << 20, NULL);
	REQUIRE(list);
	CHECK_CONTAINS(list, "model");
	free(list);
}

TEST(bench_model, engine_refuses_synthetic_weights_off_cuda)
{
	const char *backends[] = {"cpu", "auto", NULL};
	for (int i = 0; i < 3; i++) {
		struct engine en;
		struct err e = {""};
		struct engine_opts o = {.model_dir = "/nonexistent/model", .backend = backends[i],
					.synthetic_weights = 1, .synthetic_seed = 42};
		CHECK(engine_open(&en, &o, &e) == -EINVAL);
		/* refused before anything is opened: the model directory is never looked at */
		CHECK_CONTAINS(e.msg, "synthetic weights (seed 42) need the cuda backend");
		CHECK(!strstr(e.msg, "/nonexistent/model"));
	}
}
