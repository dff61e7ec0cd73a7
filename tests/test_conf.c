/* test_conf.c — dsv32d configuration: defaults, file, flags, precedence and errors. */
#include <errno.h>

#include "boot/conf.h"
#include "model/fileio.h"
#include "tests/test.h"

/* TMP/name holding text; its path in path[512]. */
static const char *conf_file(char *path, const char *name, const char *text)
{
	struct err e;
	snprintf(path, 512, "%s/%s", test_tmpdir(), name);
	REQUIRE(file_write(path, text, strlen(text), &e) == 0);
	return path;
}

TEST(conf, defaults_file_and_flag_precedence)
{
	char path[512];
	snprintf(path, sizeof path, "%s/d.conf", test_tmpdir());
	const char *text = "# dsv32d\n\nmodel = /srv/ds32   # the checkpoint\nmax_seqs=16\nsocket-mode = 0660\n";
	struct err e;
	REQUIRE(file_write(path, text, strlen(text), &e) == 0);
	char *argv[] = {"dsv32d", "--max-seqs", "8", "--config", path, "--backend=cpu"};
	struct dsv32d_conf c;
	conf_defaults(&c);
	CHECK_EQ_STR(c.socket, "/run/dsv32/dsv32.sock");
	CHECK_EQ_INT(c.max_seqs, 64);
	REQUIRE(conf_from_args(&c, 6, argv, &e) == 0);
	CHECK_EQ_STR(c.model, "/srv/ds32");
	CHECK_EQ_INT(c.max_seqs, 8); /* the flag wins over the file, wherever it stands */
	CHECK_EQ_STR(c.backend, "cpu");
	CHECK_EQ_INT(c.socket_mode, 0660);
}

TEST(conf, errors_name_file_line_and_key)
{
	char path[512];
	snprintf(path, sizeof path, "%s/bad.conf", test_tmpdir());
	struct err e;
	struct dsv32d_conf c;
	const char *cases[][2] = {
		{"model = x\nmax-seqs = 0\n", ":2: max-seqs = 0 out of range"},
		{"max-seqs = lots\n", "max-seqs: \"lots\" is not an integer"},
		{"frobnicate = 1\n", ":1: unknown key \"frobnicate\""},
		{"just words\n", ":1: expected \"key = value\""},
		{"socket-mode = 999\n", "not an octal file mode"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		REQUIRE(file_write(path, cases[i][0], strlen(cases[i][0]), &e) == 0);
		conf_defaults(&c);
		CHECK(conf_load_file(&c, path, &e) < 0);
		CHECK_CONTAINS(e.msg, cases[i][1]);
	}
	char *argv[] = {"dsv32d", "--max-clients"};
	conf_defaults(&c);
	CHECK(conf_from_args(&c, 2, argv, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "--max-clients needs a value");
	char *argv2[] = {"dsv32d", "stray"};
	CHECK(conf_from_args(&c, 2, argv2, &e) == -EINVAL);
	CHECK(conf_load_file(&c, "/nonexistent/x.conf", &e) < 0);
	CHECK_CONTAINS(e.msg, "/nonexistent/x.conf");
}

TEST(conf, batch_invariant_switch)
{
	struct dsv32d_conf c;
	struct err e;
	conf_defaults(&c);
	CHECK_EQ_INT(c.batch_invariant, 0); /* the fast paths unless asked */
	char *bare[] = {"dsv32d", "--batch-invariant", "--backend", "cuda"};
	REQUIRE(conf_from_args(&c, 4, bare, &e) == 0);
	CHECK_EQ_INT(c.batch_invariant, 1);
	CHECK(!strcmp(c.backend, "cuda")); /* the next flag is not taken as its value */
	conf_defaults(&c);
	char *last[] = {"dsv32d", "--backend", "cuda", "--batch-invariant"};
	REQUIRE(conf_from_args(&c, 4, last, &e) == 0);
	CHECK_EQ_INT(c.batch_invariant, 1);
	conf_defaults(&c);
	char *off[] = {"dsv32d", "--batch-invariant", "0"};
	REQUIRE(conf_from_args(&c, 3, off, &e) == 0);
	CHECK_EQ_INT(c.batch_invariant, 0);
	conf_defaults(&c);
	char *eq[] = {"dsv32d", "--batch_invariant=1"};
	REQUIRE(conf_from_args(&c, 2, eq, &e) == 0);
	CHECK_EQ_INT(c.batch_invariant, 1);
	conf_defaults(&c);
	char *bad[] = {"dsv32d", "--batch-invariant", "2"};
	CHECK(conf_from_args(&c, 3, bad, &e) == -ERANGE);
	CHECK_CONTAINS(e.msg, "batch-invariant = 2 out of range [0, 1]");
	conf_defaults(&c);
	char *word[] = {"dsv32d", "--batch-invariant", "yes"};
	CHECK(conf_from_args(&c, 3, word, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "batch-invariant: \"yes\" is not an integer");
	char path[512];
	conf_file(path, "inv.conf", "batch-invariant = 1\n");
	conf_defaults(&c);
	char *file[] = {"dsv32d", "--config", path};
	REQUIRE(conf_from_args(&c, 3, file, &e) == 0);
	CHECK_EQ_INT(c.batch_invariant, 1);
	char buf[8192] = "";
	FILE *f = fmemopen(buf, sizeof buf, "w");
	REQUIRE(f);
	conf_print(&c, f, "");
	fclose(f);
	CHECK_CONTAINS(buf, "batch-invariant = 1\n");
}

TEST(conf, synthetic_weights_seed_and_backend)
{
	struct dsv32d_conf c;
	struct err e;
	conf_defaults(&c);
	CHECK_EQ_INT(c.synthetic_weights, -1); /* off unless asked */
	char *ok[] = {"dsv32d", "--backend", "cuda", "--synthetic-weights", "12345"};
	REQUIRE(conf_from_args(&c, 5, ok, &e) == 0);
	CHECK_EQ_INT(c.synthetic_weights, 12345);
	conf_defaults(&c);
	char *ok0[] = {"dsv32d", "--synthetic_weights=0", "--backend=cuda"};
	REQUIRE(conf_from_args(&c, 3, ok0, &e) == 0);
	CHECK_EQ_INT(c.synthetic_weights, 0); /* 0 is a seed, not "off" */
	/* typed errors naming the bad value */
	conf_defaults(&c);
	char *bad[] = {"dsv32d", "--backend", "cuda", "--synthetic-weights", "seven"};
	CHECK(conf_from_args(&c, 5, bad, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "synthetic-weights: \"seven\" is not an integer");
	conf_defaults(&c);
	char *neg[] = {"dsv32d", "--backend", "cuda", "--synthetic-weights=-2"};
	CHECK(conf_from_args(&c, 4, neg, &e) == -ERANGE);
	CHECK_CONTAINS(e.msg, "synthetic-weights = -2 out of range [-1,");
	conf_defaults(&c);
	char *big[] = {"dsv32d", "--backend", "cuda", "--synthetic-weights", "99999999999999999999"};
	CHECK(conf_from_args(&c, 5, big, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "\"99999999999999999999\"");
	conf_defaults(&c);
	char *noval[] = {"dsv32d", "--synthetic-weights"};
	CHECK(conf_from_args(&c, 2, noval, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "--synthetic-weights needs a value");
	/* synthetic weights exist only on the GPU: any other backend is refused, from a flag or
	 * from the file */
	conf_defaults(&c);
	char *cpu[] = {"dsv32d", "--synthetic-weights", "3"};
	CHECK(conf_from_args(&c, 3, cpu, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "synthetic-weights = 3 needs backend = cuda (backend is \"auto\")");
	char path[512];
	snprintf(path, sizeof path, "%s/synth.conf", test_tmpdir());
	const char *text = "synthetic-weights = 9\nbackend = cpu\n";
	REQUIRE(file_write(path, text, strlen(text), &e) == 0);
	conf_defaults(&c);
	char *file[] = {"dsv32d", "--config", path};
	CHECK(conf_from_args(&c, 3, file, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "backend is \"cpu\"");
	char *file_flag[] = {"dsv32d", "--config", path, "--backend", "cuda"};
	conf_defaults(&c);
	REQUIRE(conf_from_args(&c, 5, file_flag, &e) == 0); /* the flag fixes the file's backend */
	CHECK_EQ_INT(c.synthetic_weights, 9);
	const char *bad_file = "synthetic-weights = 1.5\n";
	REQUIRE(file_write(path, bad_file, strlen(bad_file), &e) == 0);
	conf_defaults(&c);
	CHECK(conf_load_file(&c, path, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, ":1: synthetic-weights: \"1.5\" is not an integer");
}

/* gpus: the CUDA backend's stages (1 .. CUDA_MAX_STAGES), from flags and files, refused outside. */
TEST(conf, gpus)
{
	struct dsv32d_conf c;
	struct err e;
	conf_defaults(&c);
	CHECK_EQ_INT(c.gpus, 1);
	char *two[] = {"dsv32d", "--gpus", "2"};
	REQUIRE(conf_from_args(&c, 3, two, &e) == 0);
	CHECK_EQ_INT(c.gpus, 2);
	conf_defaults(&c);
	char *zero[] = {"dsv32d", "--gpus", "0"};
	CHECK(conf_from_args(&c, 3, zero, &e) == -ERANGE);
	CHECK_CONTAINS(e.msg, "gpus = 0 out of range [1, 8]");
	char *nine[] = {"dsv32d", "--gpus=9"};
	CHECK(conf_from_args(&c, 2, nine, &e) == -ERANGE);
	CHECK_CONTAINS(e.msg, "gpus = 9 out of range [1, 8]");
	char path[512];
	conf_defaults(&c);
	REQUIRE(conf_load_file(&c, conf_file(path, "gpus.conf", "gpus = 8\n"), &e) == 0);
	CHECK_EQ_INT(c.gpus, 8);
}
