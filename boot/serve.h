/*
 * serve.h — the serving loop's state: the bridge between the IPC server (ipc/server.h) and the
 * engine's scheduler (model/sched.h).
 *
 * Owns: the table of live requests (client handle + client request id <-> scheduler id, the
 * timings of each), turning validated IPC requests into scheduler requests (typed errors for
 * what the engine rejects), forwarding scheduler events as IPC events, cancelling everything of
 * a client that went away, and the stats text. Must not: block, or read shared memory (the IPC
 * layer hands over private copies).
 */
#ifndef DSV32_SERVE_H
#define DSV32_SERVE_H

#include <stdint.h>

#include "boot/conf.h"
#include "ipc/server.h"
#include "model/engine.h"

struct serve_req {
	uint64_t sid;        /* scheduler id (unique for the daemon's lifetime) */
	uint64_t client;     /* IPC connection handle */
	uint64_t req_id;     /* the client's id */
	uint64_t t_submit_ns, t_first_ns, t_last_ns;
	int64_t n_prompt, n_out;
	int logprobs;        /* the client asked for logprobs */
};

struct serve {
	struct engine *en;
	struct ipc_server *ipc;
	const struct dsv32d_conf *conf;
	struct serve_req *live; /* [n_live] */
	int64_t n_live, cap_live;
	uint64_t next_sid;
	uint64_t n_requests, n_rejected, n_finished, n_engine_errors;
	uint64_t n_steps, fault_at_step; /* test hook: fail step fault_at_step (0 = never) */
};

void serve_init(struct serve *sv, struct engine *en, struct ipc_server *ipc,
		const struct dsv32d_conf *conf);
void serve_free(struct serve *sv);
/* Handles one item from ipc_server_poll. */
void serve_item(struct serve *sv, const struct ipc_item *it);
/* One engine step if there is work; forwards its events. 0, or the engine fault (negative). */
int serve_step(struct serve *sv);
/* Ends every live request with an error event (engine fault or shutdown) and delivers it. */
void serve_fail_all(struct serve *sv, int dsv32_code, const char *msg);
static inline int64_t serve_live(const struct serve *sv) { return sv->n_live; }

#endif
