/*
 * engine.h — one loaded model ready to serve: config, checkpoint, weights, tokenizer, backend
 * and scheduler, opened in that order and closed in reverse. The daemon (boot/) and the
 * offline `dsv32 run` both drive an engine, so they run the same code.
 *
 * Owns: loading (with progress callbacks for systemd's STATUS), sizing the KV pool, turning a
 * request's input (plain text, OpenAI-style chat messages, or token ids) into prompt ids with
 * the right special-token policy, and the warm-up step. Must not: know about clients or IPC.
 */
#ifndef DSV32_ENGINE_H
#define DSV32_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/config.h"
#include "model/err.h"
#include "model/safetensors.h"
#include "model/sched.h"
#include "model/tokenizer.h"
#include "model/weights.h"

struct engine_opts {
	const char *model_dir;    /* config.json, safetensors, tokenizer.json */
	const char *backend;      /* "cpu", "cuda" or "auto" */
	int threads;              /* CPU backend threads; 0 = online cores */
	int64_t kv_pages;         /* 0 = from host_memory_mb, at most ENGINE_DEFAULT_PAGES */
	int64_t host_memory_mb;   /* bound on the CPU KV pool */
	int64_t max_batch_tokens, max_seqs, max_context;
	/* 1: model_dir may be a header-only checkpoint (mkmodel real --header-only); the CUDA
	 * backend generates the tensors it leaves out from synthetic_seed (backend_cuda_opts).
	 * Needs backend "cuda". For benchmarks: the weights are random. */
	int synthetic_weights;
	uint64_t synthetic_seed;
	int batch_invariant;      /* the CUDA backend's batch-invariant mode (backend_cuda_opts) */
	int gpus;                 /* the CUDA backend over GPUs 0 .. gpus - 1 by layer ranges
				   * (backend_cuda_opts.stages; 0 or 1: GPU 0 alone) */
	int mtp_draft;            /* speculative decoding with the MTP layer (sched_config) */
	/* called with a short description before each loading stage (may be NULL) */
	void (*progress)(void *ctx, const char *stage);
	void *progress_ctx;
};

#define ENGINE_DEFAULT_PAGES 4096

struct engine {
	struct dsv32_config c;
	struct checkpoint ck;
	struct weights w;
	struct tokenizer *tok;
	struct backend *be;
	struct sched *s;
	const char *backend_name;
	int64_t kv_pages;
	size_t kv_bytes;          /* host or device bytes of the KV pool */
	double load_s;            /* wall time of engine_open */
};

enum engine_input {
	ENGINE_INPUT_TEXT,   /* plain UTF-8 text: added-token strings in it are plain text */
	ENGINE_INPUT_CHAT,   /* JSON messages (or {"messages", "tools"}) rendered with the V3.2
			      * encoding: template tokens special, message content plain text */
	ENGINE_INPUT_TOKENS, /* ids, each < vocab_size */
};

/* Loads everything. 0, or -errno with e naming the file / tensor / field that was wrong. */
int engine_open(struct engine *en, const struct engine_opts *o, struct err *e);
void engine_close(struct engine *en);

/* The prompt ids of a request. text/len for TEXT and CHAT, ids/n_ids for TOKENS; thinking
 * selects the chat mode. allow_special (TEXT only) recognises added tokens in the text, for
 * callers that pass pre-rendered prompts. Appends to out. 0, or -EINVAL (e says what: invalid
 * JSON, a bad message field, a token id out of range, an empty prompt), -ENOMEM. */
int engine_prompt(const struct engine *en, enum engine_input kind, const char *text, size_t len,
		  const uint32_t *ids, size_t n_ids, int thinking, int allow_special,
		  struct tokenizer_ids *out, struct err *e);

/* Runs one short request through the scheduler and the backend (every layer, the cache
 * writes, the sampler) and checks it produced a finite token: the daemon reports READY only
 * after this. 0, or the failure. */
int engine_warmup(struct engine *en, struct err *e);

#endif
