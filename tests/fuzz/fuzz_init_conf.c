/*
 * fuzz_init_conf.c — libFuzzer target for dsv32-init's configuration (boot/init/init_conf.h):
 * arbitrary bytes as a kernel command line, as one `key = value` (split at the first '='), and
 * as a command line to split. Checks what must hold of any input: a refused one leaves a
 * message; an accepted one leaves every string NUL-terminated within its field, every count
 * within its limit and every command one that splits, its first word a path; split words lie inside the buffer, as many as it said, NULL after them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "boot/init/init_conf.h"
#include "tests/fuzz/fuzz.h"

static void check_conf(const struct init_conf *c)
{
	FUZZ_CHECK(memchr(c->exec, 0, sizeof c->exec) && memchr(c->runtime_dir, 0, sizeof c->runtime_dir));
	FUZZ_CHECK(c->n_ready >= 0 && c->n_ready <= INIT_READY_MAX);
	FUZZ_CHECK(c->n_mounts >= 0 && c->n_mounts <= INIT_MOUNT_MAX);
	FUZZ_CHECK(c->n_modules >= 0 && c->n_modules <= INIT_MODULE_MAX);
	for (int i = 0; i < c->n_ready; i++) { /* a command whose first word is a path */
		char buf[INIT_CMD_BYTES], *argv[INIT_ARGV_MAX];
		FUZZ_CHECK(memchr(c->ready[i], 0, INIT_CMD_BYTES));
		FUZZ_CHECK(init_split(c->ready[i], buf, sizeof buf, argv, INIT_ARGV_MAX) > 0);
		FUZZ_CHECK(argv[0][0] == '/');
	}
	for (int i = 0; i < c->n_mounts; i++)
		FUZZ_CHECK(c->mounts[i].target[0] == '/' &&
			   memchr(c->mounts[i].data, 0, sizeof c->mounts[i].data));
	FUZZ_CHECK(c->restart_ms >= 0 && c->watchdog_ms >= 0 && c->stop_timeout_ms >= 0);
	FUZZ_CHECK(c->ready_done >= INIT_READY_DONE_SERVE && c->ready_done <= INIT_READY_DONE_REBOOT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = 0; /* (a NUL inside ends the text early, as it would in a file) */
	static struct init_conf c;
	struct err e = {{0}};

	init_conf_defaults(&c);
	if (init_conf_load_cmdline(&c, text, &e))
		FUZZ_CHECK(e.msg[0]);
	check_conf(&c);

	char *eq = strchr(text, '=');
	if (eq) {
		*eq = 0;
		init_conf_defaults(&c);
		e.msg[0] = 0;
		if (init_conf_set(&c, text, eq + 1, "fuzz", &e))
			FUZZ_CHECK(e.msg[0]);
		check_conf(&c);
		*eq = '=';
	}

	size_t n = strlen(text);
	char *buf = malloc(n + 1), *argv[INIT_ARGV_MAX];
	int w = buf ? init_split(text, buf, n + 1, argv, INIT_ARGV_MAX) : -1;
	for (int i = 0; i < w; i++)
		FUZZ_CHECK(argv[i] >= buf && argv[i] + strlen(argv[i]) < buf + n + 1);
	if (w > 0)
		FUZZ_CHECK(argv[w] == NULL);
	free(buf);
	free(text);
	return 0;
}
