/* test_ipc_engine.c — the test engine and checking clients shared by the IPC process tests
 * (test_ipc_e2e.c, test_ipc_stress.c); see test_ipc_engine.h. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "model/clock.h"
#include "tests/test.h"
#include "tests/test_ipc_engine.h"

int tipc_sanitizer(void) { return getenv("DSV32_SANITIZER") && atoi(getenv("DSV32_SANITIZER")); }

void tipc_sock_path(char *buf, size_t n) { snprintf(buf, n, "%s/dsv32.sock", test_tmpdir()); }

int tipc_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d));)
		n += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

/* ---- the test engine -------------------------------------------------------------------------- */



static void tipc_engine_drop(struct tipc_engine *e, int i) { e->jobs[i] = e->jobs[--e->n_jobs]; }

static void tipc_engine_item(struct tipc_engine *e, struct ipc_item *it)
{
	switch (it->type) {
	case IPC_ITEM_GENERATE: {
		struct ipc_request *r = it->req;
		e->requests++;
		if (r->input != DSV32_INPUT_TOKENS || r->n_tokens > 8) {
			ipc_server_emit_error(e->srv, it->client, it->req_id, DSV32_E_BAD_PARAM, "test engine takes 1..8 tokens");
			break;
		}
		for (uint32_t i = 0; i < r->n_tokens; i++)
			if (r->tokens[i] >= 100000) { /* the engine's own check: the vocabulary */
				ipc_server_emit_error(e->srv, it->client, it->req_id, DSV32_E_BAD_TOKEN,
						      "token id %u >= vocab 100000", r->tokens[i]);
				goto out;
			}
		if (e->n_jobs == e->cap) {
			e->cap = e->cap ? 2 * e->cap : 256;
			e->jobs = realloc(e->jobs, (size_t)e->cap * sizeof *e->jobs);
		}
		struct tipc_job *j = &e->jobs[e->n_jobs++];
		*j = (struct tipc_job){.client = it->client, .id = it->req_id, .n_prompt = r->n_tokens,
				  .max_tokens = r->max_tokens};
		memcpy(j->prompt, r->tokens, 4 * r->n_tokens);
	out:
		ipc_request_free(r);
		break;
	}
	case IPC_ITEM_CANCEL:
		for (int i = 0; i < e->n_jobs; i++)
			if (e->jobs[i].client == it->client && e->jobs[i].id == it->req_id) {
				ipc_server_emit_done(e->srv, it->client, it->req_id, DSV32_FINISH_CANCELLED, e->jobs[i].n_prompt, e->jobs[i].emitted, 0, 0, 0);
				tipc_engine_drop(e, i);
				break;
			}
		break;
	case IPC_ITEM_STATS: {
		char buf[1024];
		int n = ipc_server_format_stats(e->srv, buf, sizeof buf);
		n += snprintf(buf + n, sizeof buf - (size_t)n, "engine_jobs %d\n", e->n_jobs);
		ipc_server_emit_stats(e->srv, it->client, it->req_id, buf, (size_t)n);
		break;
	}
	case IPC_ITEM_GONE:
		e->gone++;
		for (int k = 0; k < e->n_killed; k++)
			if (e->killed[k] == it->pid) {
				uint64_t dt = clock_mono_ms() - e->killed_at[k];
				if (dt > e->max_reap_ms)
					e->max_reap_ms = dt;
				e->killed[k] = e->killed[--e->n_killed];
				e->killed_at[k] = e->killed_at[e->n_killed];
				break;
			}
		if (it->code) {
			e->gone_bad++;
			if (e->n_bad_pids < 16)
				e->bad_pids[e->n_bad_pids++] = it->pid;
		}
		for (int i = 0; i < e->n_jobs; i++)
			if (e->jobs[i].client == it->client)
				tipc_engine_drop(e, i--);
		break;
	}
}

/* One step: take requests, then emit one token per running request. */
void tipc_engine_step(struct tipc_engine *e, int timeout_ms)
{
	struct ipc_item items[32];
	int n = ipc_server_poll(e->srv, e->n_jobs && !e->hold ? 0 : timeout_ms, items, 32);
	for (int i = 0; i < n; i++)
		tipc_engine_item(e, &items[i]);
	e->steps++;
	if (e->hold)
		return;
	if (e->pace_us) {
		if ((clock_mono_ns() / 1000) - e->last_emit_us < e->pace_us)
			return;
		e->last_emit_us = (clock_mono_ns() / 1000);
	}
	for (int i = 0; i < e->n_jobs; i++) {
		struct tipc_job *j = &e->jobs[i];
		uint32_t k = j->emitted, tok = j->prompt[k % j->n_prompt] + k;
		char text[16];
		int tl = snprintf(text, sizeof text, "<%u>", tok);
		int r = ipc_server_emit_token(e->srv, j->client, j->id, &tok, 1, NULL, NULL, 0, text, (uint32_t)tl);
		if (r) { /* busy (ended here), or the client is gone */
			tipc_engine_drop(e, i--);
			continue;
		}
		if (++j->emitted == j->max_tokens) {
			ipc_server_emit_done(e->srv, j->client, j->id, DSV32_FINISH_LENGTH, j->n_prompt, j->emitted, 1000, 2000, 300);
			tipc_engine_drop(e, i--);
		}
	}
}

void tipc_engine_open(struct tipc_engine *e, const char *path, uint32_t max_clients)
{
	memset(e, 0, sizeof *e);
	struct ipc_server_config c;
	ipc_server_config_init(&c);
	c.path = path;
	c.max_clients = max_clients;
	c.max_inflight_client = 16;
	c.cq_entries = 256;
	c.sq_data_bytes = 1 << 20;
	c.max_msg_bytes = 1 << 16;
	c.max_prompt_bytes = 1 << 15;
	c.spin_us = 20;
	REQUIRE(ipc_server_open(&e->srv, &c) == 0);
}

void tipc_engine_close(struct tipc_engine *e)
{
	ipc_server_close(e->srv);
	free(e->jobs);
}

/* ---- clients ---------------------------------------------------------------------------------- */

/* Connects, retrying while the server starts. */
dsv32_t *tipc_connect(const char *path)
{
	dsv32_t *h = NULL;
	for (int i = 0; i < 500; i++) {
		int r = dsv32_connect(path, &h);
		if (r == 0)
			return h;
		usleep(10000);
	}
	return NULL;
}

int tipc_stop_strings;
int tipc_allow_busy;


/* Submits, retrying while the submission ring is full (only for callers with nothing to drain). */
int tipc_submit(dsv32_t *h, uint64_t id, const uint32_t *p, int n, uint32_t max_tokens)
{
	int r;
	while ((r = tipc_submit_once(h, id, p, n, max_tokens)) == -EAGAIN)
		usleep(100);
	return r;
}

int tipc_submit_once(dsv32_t *h, uint64_t id, const uint32_t *p, int n, uint32_t max_tokens)
{
	struct dsv32_generate_params g;
	dsv32_generate_params_init(&g, id);
	g.input = DSV32_INPUT_TOKENS;
	g.tokens = p;
	g.n_tokens = (size_t)n;
	g.max_tokens = max_tokens;
	char buf[4][DSV32_MAX_STOP_LEN + 1];
	const char *stops[4];
	if (tipc_stop_strings) {
		uint64_t s = id;
		g.n_stop = test_rand(&s) % 5;
		for (size_t i = 0; i < g.n_stop; i++) {
			size_t l = 1 + test_rand(&s) % DSV32_MAX_STOP_LEN;
			memset(buf[i], 'a' + (int)(i % 26), l);
			buf[i][l] = 0;
			stops[i] = buf[i];
		}
		g.stop = stops;
	}
	return dsv32_submit_generate(h, &g);
}

struct tipc_want {
	uint64_t id;
	uint32_t prompt[4], n, max_tokens, next_seq;
	int done;
};

/* Runs n_req requests with at most `window` in flight and checks every event: tokens match the
 * test engine's formula, seq gap-free, exactly one terminal. Returns the number of problems. */
int tipc_client_run(const char *path, uint64_t seed, int n_req, int window, int quiet)
{
	dsv32_t *h = tipc_connect(path);
	if (!h) {
		fprintf(stderr, "client %d: cannot connect\n", (int)getpid());
		return 1;
	}
	struct tipc_want *w = calloc((size_t)n_req, sizeof *w);
	int bad = 0, submitted = 0, finished = 0;
	uint64_t s = seed;
	for (int i = 0; i < n_req; i++) {
		w[i].id = seed * 1000 + (uint64_t)i + 1;
		w[i].n = 1 + (uint32_t)(test_rand(&s) % 4);
		for (uint32_t k = 0; k < w[i].n; k++)
			w[i].prompt[k] = (uint32_t)(test_rand(&s) % 50000);
		w[i].max_tokens = 1 + (uint32_t)(test_rand(&s) % 12);
	}
	while (finished < n_req) {
		while (submitted < n_req && submitted - finished < window) {
			struct tipc_want *x = &w[submitted];
			int r = tipc_submit_once(h, x->id, x->prompt, (int)x->n, x->max_tokens);
			if (r == -EAGAIN && submitted > finished)
				break; /* the ring is full: drain events first (never wait without draining) */
			if (r == -EAGAIN) {
				usleep(100);
				continue;
			}
			if (r) {
				bad++;
				goto out;
			}
			submitted++;
		}
		struct dsv32_event ev;
		int r = dsv32_wait(h, 10000, &ev);
		if (r != 1) {
			fprintf(stderr, "client %d: wait returned %d with %d/%d finished\n", (int)getpid(), r, finished, n_req);
			bad++;
			goto out;
		}
		uint64_t i = ev.request_id - seed * 1000 - 1;
		if (i >= (uint64_t)submitted || w[i].done) {
			fprintf(stderr, "client: event for unknown or finished request %llu\n", (unsigned long long)ev.request_id);
			bad++;
			continue;
		}
		struct tipc_want *x = &w[i];
		if (ev.type == DSV32_EVENT_TOKEN) {
			uint32_t k = x->next_seq;
			if (ev.token.seq != k || ev.token.n_tokens != 1 ||
			    ev.token.tokens[0] != x->prompt[k % x->n] + k) {
				if (!quiet)
					fprintf(stderr, "client: request %llu token seq %u (want %u) value %u\n",
						(unsigned long long)ev.request_id, ev.token.seq, k, ev.token.tokens[0]);
				bad++;
			}
			x->next_seq++;
		} else if (ev.type == DSV32_EVENT_DONE) {
			if (ev.done.reason != DSV32_FINISH_LENGTH || x->next_seq != x->max_tokens ||
			    ev.done.completion_tokens != x->max_tokens) {
				fprintf(stderr, "client: request %llu done after %u of %u\n", (unsigned long long)ev.request_id, x->next_seq, x->max_tokens);
				bad++;
			}
			x->done = 1;
			finished++;
		} else if (tipc_allow_busy && ev.error.code == DSV32_E_BUSY) {
			x->done = 1; /* its tokens so far were checked; busy is its one terminal event */
			finished++;
		} else {
			fprintf(stderr, "client: request %llu error %s: %s\n", (unsigned long long)ev.request_id,
				dsv32_error_name(ev.error.code), ev.error.message);
			bad++;
			x->done = 1;
			finished++;
		}
	}
	if (dsv32_inflight(h) != 0)
		bad++;
	struct dsv32_event extra;
	while (dsv32_wait(h, 20, &extra) == 1) { /* nothing may follow the last terminal event */
		fprintf(stderr, "client: event after the last terminal (request %llu)\n", (unsigned long long)extra.request_id);
		bad++;
	}
out:
	free(w);
	dsv32_close(h);
	return bad;
}


pid_t tipc_spawn_client(const struct tipc_client_arg *a)
{
	fflush(NULL);
	pid_t p = fork();
	if (p == 0)
		_exit(tipc_client_run(a->path, a->seed, a->n_req, a->window, 0) ? 1 : 0);
	return p;
}

