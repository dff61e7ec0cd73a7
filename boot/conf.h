/*
 * conf.h — dsv32d's configuration: defaults, a config file, and command-line flags, in that
 * order of precedence (a flag overrides the file, the file overrides the default).
 *
 * File format (docs/CONFIG.md): one `key = value` per line; `#` starts a comment; blank lines
 * are ignored; keys are the flag names without the leading `--` (`-` and `_` are the same).
 * Unknown keys, malformed values and out-of-range numbers are errors that name the file, the
 * line and the key. Owns: parsing, validation and printing the effective configuration.
 */
#ifndef DSV32_CONF_H
#define DSV32_CONF_H

#include <stdint.h>
#include <stdio.h>

#include "model/err.h"

struct dsv32d_conf {
	char model[4096];         /* checkpoint directory */
	char backend[16];         /* "cpu" or "cuda" */
	char socket[108];         /* unix socket path */
	uint32_t socket_mode;     /* file mode of the socket */
	char allow_uids[256];     /* comma-separated uids allowed to connect; empty = any */
	char allow_gids[256];     /* comma-separated gids allowed to connect; empty = any */
	int64_t max_clients;
	int64_t max_inflight_per_client;
	int64_t max_inflight;      /* in flight over all clients */
	int64_t max_prompt_tokens;
	int64_t max_new_tokens;    /* cap on a request's max_tokens */
	int64_t max_message_bytes; /* one request record */
	int64_t max_batch_tokens;  /* token budget of one engine step */
	int64_t max_seqs;          /* sequences in one engine step */
	int64_t kv_pages;          /* KV-cache pages of 64 tokens; 0 = size from free memory */
	int64_t context_limit;     /* 0 = max_position_embeddings */
	int64_t threads;           /* CPU backend threads; 0 = all cores */
	int64_t drain_timeout_s;   /* SIGTERM: in-flight requests get this long to finish */
	int64_t host_memory_mb;    /* bound on the daemon's own host allocations (KV on CPU) */
	int64_t synthetic_weights; /* >= 0: seed of the weights the CUDA backend generates for a
				    * header-only checkpoint (mkmodel real --header-only); -1: off */
	int64_t batch_invariant;   /* 1: the CUDA backend's batch-invariant mode (backend_cuda_opts);
				    * 0: its fast paths. A flag without a value means 1. */
	int64_t gpus;              /* the CUDA backend's GPUs (backend_cuda_opts.stages) */
	int64_t mtp_draft;         /* 1: speculative decoding with the MTP layer (sched_config);
				    * 0: off. A flag without a value means 1. */
};

void conf_defaults(struct dsv32d_conf *c);
/* Applies a config file. 0, or -errno with e naming file, line and key. */
int conf_load_file(struct dsv32d_conf *c, const char *path, struct err *e);
/* The file format's reader, for any such file: fn(ctx, key, value, "path:line", e) for each
 * `key = value` line (both trimmed) until fn returns non-zero. 0, that return, or -EINVAL with
 * e set (the file unreadable, a line without '='). */
typedef int conf_line_fn(void *ctx, const char *key, const char *value, const char *where,
			 struct err *e);
int conf_file_each(const char *path, conf_line_fn *fn, void *ctx, struct err *e);
/* Applies one key/value (from a flag or a file line). `where` names the origin in messages. */
int conf_set(struct dsv32d_conf *c, const char *key, const char *value, const char *where,
	     struct err *e);
/* Parses argv: --config FILE is applied first, then every --key value / --key=value flag (a
 * switch key, batch-invariant, also as a bare --key: 1), then the keys are checked against each
 * other (synthetic-weights needs backend = cuda).
 * Returns 0, 1 if --help was asked (usage printed to stdout), or -errno with e set. */
int conf_from_args(struct dsv32d_conf *c, int argc, char **argv, struct err *e);
/* Prints every key with its effective value, one per line, each prefixed by `prefix`. */
void conf_print(const struct dsv32d_conf *c, FILE *f, const char *prefix);

#endif
