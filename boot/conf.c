/*
 * conf.c — dsv32d configuration: one table of keys drives defaults, file, flags and printing.
 */
#include "boot/conf.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "model/fileio.h"
#include "model/sched.h"

enum ctype { C_STR, C_INT, C_MODE, C_SWITCH };

struct key {
	const char *name;
	enum ctype type;
	size_t off, size;
	int64_t lo, hi;
	const char *def;
	const char *help;
};

#define S(n, f, d, h) {n, C_STR, offsetof(struct dsv32d_conf, f), sizeof(((struct dsv32d_conf *)0)->f), 0, 0, d, h}
#define I(n, f, lo, hi, d, h) {n, C_INT, offsetof(struct dsv32d_conf, f), 8, lo, hi, d, h}
/* an int64 0 / 1 that a bare --flag sets to 1 */
#define SW(n, f, d, h) {n, C_SWITCH, offsetof(struct dsv32d_conf, f), 8, 0, 1, d, h}

static const struct key keys[] = {
	S("model", model, "", "checkpoint directory (config.json, safetensors, tokenizer.json)"),
	S("backend", backend, "auto", "cpu, cuda, or auto (the GPU when the driver finds one and the CUDA backend takes the model, else the CPU, saying why)"),
	S("socket", socket, "/run/dsv32/dsv32.sock", "unix socket clients connect to"),
	{"socket-mode", C_MODE, offsetof(struct dsv32d_conf, socket_mode), 4, 0, 0777, "0666", "file mode of the socket (octal)"},
	S("allow-uids", allow_uids, "", "comma-separated uids allowed to connect (empty: any)"),
	S("allow-gids", allow_gids, "", "comma-separated gids allowed to connect (empty: any)"),
	I("max-clients", max_clients, 1, 4096, "64", "connected clients at once"),
	I("max-inflight-per-client", max_inflight_per_client, 1, 4096, "32", "requests in flight per client"),
	I("max-inflight", max_inflight, 1, 65536, "256", "requests in flight over all clients"),
	I("max-prompt-tokens", max_prompt_tokens, 1, 1 << 24, "32768", "prompt length limit in tokens"),
	I("max-new-tokens", max_new_tokens, 1, 1 << 24, "8192", "cap on a request's max_tokens"),
	I("max-message-bytes", max_message_bytes, 4096, 1 << 28, "4194304", "largest request record"),
	I("max-batch-tokens", max_batch_tokens, 1, 1 << 20, "2048", "token budget of one engine step"),
	I("max-seqs", max_seqs, 1, 4096, "64", "sequences in one engine step"),
	I("kv-pages", kv_pages, 0, INT64_C(1) << 32, "0", "KV-cache pages of 64 tokens (0: size from memory)"),
	I("context-limit", context_limit, 0, 1 << 24, "0", "context limit in tokens (0: the model's)"),
	I("threads", threads, 0, 1024, "0", "CPU backend threads (0: all cores)"),
	I("drain-timeout", drain_timeout_s, 0, 86400, "30", "seconds in-flight requests get after SIGTERM"),
	I("host-memory-mb", host_memory_mb, 64, INT64_C(1) << 24, "8192", "bound on host memory for the CPU KV cache"),
	I("synthetic-weights", synthetic_weights, -1, INT64_MAX, "-1", "seed: generate the weights a header-only checkpoint leaves out on the GPU (backend cuda; -1: off)"),
	{"mtp-draft", C_SWITCH, offsetof(struct dsv32d_conf, mtp_draft), 8, 0, SCHED_MAX_DRAFTS, "0", "K > 0: speculative decoding with the checkpoint's MTP layer (up to K drafted tokens a sequence a step, the MTP layer chained on itself after the first; each kept only where the request's own draw equals it: the same tokens, fewer steps when drafts are right), 0: off; --mtp-draft alone means 1"},
	I("gpus", gpus, 1, CUDA_MAX_STAGES, "1", "GPUs the CUDA backend spreads the model over (GPUs 0 .. N-1, each a consecutive range of the layers with their KV cache; the model's numbers are one GPU's): a model larger than one GPU"),
	SW("batch-invariant", batch_invariant, "0", "1: the CUDA backend's batch-invariant mode (a row's numbers do not depend on its batch; slower prefill and large batches), 0: its fast paths; --batch-invariant alone means 1"),
};

static const struct key *find_key(const char *name)
{
	char norm[64];
	size_t n = strlen(name);
	if (n >= sizeof norm)
		return NULL;
	for (size_t i = 0; i <= n; i++)
		norm[i] = name[i] == '_' ? '-' : name[i];
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
		if (!strcmp(keys[i].name, norm))
			return &keys[i];
	return NULL;
}

int conf_set(struct dsv32d_conf *c, const char *key, const char *value, const char *where,
	     struct err *e)
{
	const struct key *k = find_key(key);
	if (!k)
		return err_set(e, -EINVAL, "%s: unknown key \"%s\"", where, key);
	char *dst = (char *)c + k->off;
	char *end;
	switch (k->type) {
	case C_STR:
		if (strlen(value) >= k->size)
			return err_set(e, -EINVAL, "%s: %s: value longer than %zu bytes", where, k->name,
				       k->size - 1);
		memcpy(dst, value, strlen(value) + 1);
		return 0;
	case C_INT:
	case C_SWITCH: {
		errno = 0;
		long long v = strtoll(value, &end, 10);
		if (errno || end == value || *end)
			return err_set(e, -EINVAL, "%s: %s: \"%s\" is not an integer", where, k->name, value);
		if (v < k->lo || v > k->hi)
			return err_set(e, -ERANGE, "%s: %s = %lld out of range [%lld, %lld]", where,
				       k->name, v, (long long)k->lo, (long long)k->hi);
		*(int64_t *)dst = v;
		return 0;
	}
	case C_MODE: {
		errno = 0;
		unsigned long v = strtoul(value, &end, 8);
		if (errno || end == value || *end || v > 0777)
			return err_set(e, -EINVAL, "%s: %s: \"%s\" is not an octal file mode", where,
				       k->name, value);
		*(uint32_t *)dst = (uint32_t)v;
		return 0;
	}
	}
	return 0;
}

void conf_defaults(struct dsv32d_conf *c)
{
	memset(c, 0, sizeof *c);
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
		int r = conf_set(c, keys[i].name, keys[i].def, "default", NULL);
		ASSERT(r == 0);
	}
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
		s[--n] = 0;
	return s;
}

int conf_file_each(const char *path, conf_line_fn *fn, void *ctx, struct err *e)
{
	size_t len;
	char *text = file_read(path, &len, 1 << 20, e);
	if (!text)
		return -EINVAL;
	int r = 0, line = 0;
	for (char *s = text, *nl; s && *s && !r; s = nl) {
		nl = strchr(s, '\n');
		if (nl)
			*nl++ = 0;
		line++;
		char *hash = strchr(s, '#');
		if (hash)
			*hash = 0;
		char *l = trim(s);
		if (!*l)
			continue;
		char *eq = strchr(l, '=');
		char where[4200];
		snprintf(where, sizeof where, "%s:%d", path, line);
		if (!eq) {
			r = err_set(e, -EINVAL, "%s: expected \"key = value\"", where);
			break;
		}
		*eq = 0;
		r = fn(ctx, trim(l), trim(eq + 1), where, e);
	}
	free(text);
	return r;
}

static int conf_line(void *ctx, const char *key, const char *value, const char *where,
		     struct err *e)
{
	return conf_set(ctx, key, value, where, e);
}

int conf_load_file(struct dsv32d_conf *c, const char *path, struct err *e)
{
	return conf_file_each(path, conf_line, c, e);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: dsv32d [--config FILE] [--KEY VALUE ...]\n\nkeys (also valid in the config file as `key = value`):\n");
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
		fprintf(f, "  --%-24s %s (default %s)\n", keys[i].name, keys[i].help,
			keys[i].def[0] ? keys[i].def : "\"\"");
}

int conf_from_args(struct dsv32d_conf *c, int argc, char **argv, struct err *e)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 1;
		}
		if (!strcmp(argv[i], "--config")) {
			if (i + 1 >= argc)
				return err_set(e, -EINVAL, "--config needs a file");
			int r = conf_load_file(c, argv[i + 1], e);
			if (r)
				return r;
		}
	}
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strncmp(a, "--", 2))
			return err_set(e, -EINVAL, "unexpected argument \"%s\" (flags are --key value)", a);
		char key[64];
		const char *val, *eq = strchr(a, '=');
		if (eq) {
			snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
			val = eq + 1;
		} else {
			snprintf(key, sizeof key, "%s", a + 2);
			const struct key *k = find_key(key);
			if (k && k->type == C_SWITCH && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)))
				val = "1"; /* a bare switch */
			else if (i + 1 >= argc)
				return err_set(e, -EINVAL, "--%s needs a value", key);
			else
				val = argv[++i];
		}
		if (!strcmp(key, "config"))
			continue;
		int r = conf_set(c, key, val, "command line", e);
		if (r)
			return r;
	}
	if (c->synthetic_weights >= 0 && strcmp(c->backend, "cuda"))
		return err_set(e, -EINVAL, "synthetic-weights = %lld needs backend = cuda (backend is \"%s\")",
			       (long long)c->synthetic_weights, c->backend);
	return 0;
}

void conf_print(const struct dsv32d_conf *c, FILE *f, const char *prefix)
{
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
		const char *src = (const char *)c + keys[i].off;
		switch (keys[i].type) {
		case C_STR: fprintf(f, "%s%s = %s\n", prefix, keys[i].name, src); break;
		case C_INT:
		case C_SWITCH: fprintf(f, "%s%s = %lld\n", prefix, keys[i].name, (long long)*(const int64_t *)src); break;
		case C_MODE: fprintf(f, "%s%s = %04o\n", prefix, keys[i].name, *(const uint32_t *)src); break;
		}
	}
}
