/*
 * test_ipc_engine.h — what the IPC process tests share: a small test engine behind a real
 * ipc_server (it answers a request for prompt tokens P with max_tokens tokens, token k =
 * P[k % n] + k, one token per step, then done(length)), and clients that check every event.
 */
#ifndef DSV32_TEST_IPC_ENGINE_H
#define DSV32_TEST_IPC_ENGINE_H

#include <stdint.h>
#include <sys/types.h>

#include "ipc/dsv32.h"
#include "ipc/server.h"

struct tipc_job {
	uint64_t client, id;
	uint32_t prompt[8], n_prompt, max_tokens, emitted;
};

struct tipc_engine {
	struct ipc_server *srv;
	struct tipc_job *jobs;
	int n_jobs, cap;
	int hold;               /* never emit tokens (requests stay in flight) */
	uint64_t gone, gone_bad; /* clients reported gone (with a violation) */
	pid_t bad_pids[16];     /* pids reported gone with bad_frame */
	int n_bad_pids;
	pid_t killed[64];       /* clients the test killed, and when (ms) */
	uint64_t killed_at[64];
	int n_killed;
	uint64_t max_reap_ms;   /* longest kill -> IPC_ITEM_GONE */
	uint64_t requests, steps;
	uint64_t pace_us, last_emit_us; /* emit a round of tokens at most every pace_us */
};

struct tipc_client_arg {
	const char *path;
	uint64_t seed;
	int n_req, window;
};

int tipc_sanitizer(void); /* DSV32_SANITIZER=1: shorter loops, looser deadlines */
void tipc_sock_path(char *buf, size_t n);
int tipc_count_fds(void);

void tipc_engine_open(struct tipc_engine *e, const char *path, uint32_t max_clients);
void tipc_engine_close(struct tipc_engine *e);
/* One step: take requests (sleep up to timeout_ms when idle), emit one token per request. */
void tipc_engine_step(struct tipc_engine *e, int timeout_ms);

extern int tipc_stop_strings; /* > 0: requests carry random stop strings (records of varied size) */
extern int tipc_allow_busy;   /* > 0: a `busy` error is a valid end (tiny completion rings) */
/* Connects, retrying while the server starts. */
dsv32_t *tipc_connect(const char *path);
/* Submits once (-EAGAIN: ring full), or retrying while full (nothing to drain meanwhile). */
int tipc_submit_once(dsv32_t *h, uint64_t id, const uint32_t *p, int n, uint32_t max_tokens);
int tipc_submit(dsv32_t *h, uint64_t id, const uint32_t *p, int n, uint32_t max_tokens);
/* Runs n_req requests (at most `window` in flight) and checks every event; returns problems. */
int tipc_client_run(const char *path, uint64_t seed, int n_req, int window, int quiet);
/* Forks a process running tipc_client_run; it exits 0 if all was well. */
pid_t tipc_spawn_client(const struct tipc_client_arg *a);

#endif
