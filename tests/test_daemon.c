/*
 * test_daemon.c — dsv32d end to end on the tiny model with the CPU backend: the systemd notify
 * sequence, greedy streams through the rings equal to `dsv32 eval --generate` (the CPU backend
 * is batch-invariant), many clients at once, clients killed under load without leaks, the
 * server killed (every client gets server_lost), typed errors, drain on SIGTERM.
 *
 * Programs come from test_bin_dir() ($DSV32_BIN, else the runner's directory): mkmodel,
 * dsv32d, dsv32. The tiny model uses
 * the real tokenizer (build/tokenizer/tokenizer.json, fetched by `make tokenizer`).
 *
 * DSV32_TEST_BACKEND=cuda (on a GPU machine) runs the same cases on the CUDA backend, the daemon
 * and `dsv32 eval` alike, both in the CUDA backend's batch-invariant mode (--batch-invariant: a
 * busy daemon batches rows that eval runs alone, and only that mode makes a row's numbers
 * independent of its batch). Every check holds there too, greedy streams equal to eval's
 * included; the CPU backend is batch-invariant by construction.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/dsv32.h"
#include "model/clock.h"
#include "model/fileio.h"
#include "tests/ckpt_helpers.h"
#include "tests/test.h"

static int sanitizer(void) { return getenv("DSV32_SANITIZER") && atoi(getenv("DSV32_SANITIZER")); }

/* The backend under test: "cpu" unless DSV32_TEST_BACKEND names another. */
static const char *backend(void)
{
	const char *b = getenv("DSV32_TEST_BACKEND");
	return b && *b ? b : "cpu";
}

/* The flag that puts the backend under test in its batch-invariant mode: dsv32d's key, eval's
 * switch (the CPU backend needs none). */
static const char *invariant_flag(void)
{
	return strcmp(backend(), "cpu") ? "--batch-invariant" : "";
}

/* TMP/tiny, generated once per case. */
static void make_model(char *dir, size_t n)
{
	snprintf(dir, n, "%s/tiny", test_tmpdir());
	char cmd[2048];
	snprintf(cmd, sizeof cmd,
		 "%s/mkmodel tiny --seed 1 --tokenizer %s/build/tokenizer/tokenizer.json --out %s > %s.log 2>&1",
		 test_bin_dir(), test_root(), dir, dir);
	if (system(cmd)) {
		test_fail(__FILE__, __LINE__, "mkmodel failed (is build/tokenizer/tokenizer.json there? `make tokenizer`): %s", cmd);
		test_abort_case();
	}
}

struct daemon {
	pid_t pid;
	char sock[108];
	char log[512];
};

/* Starts dsv32d on TMP/d.sock with extra flags; waits until it accepts a client (30 s). */
static void daemon_start(struct daemon *d, const char *model, const char *extra)
{
	snprintf(d->sock, sizeof d->sock, "%s/d.sock", test_tmpdir());
	snprintf(d->log, sizeof d->log, "%s/dsv32d.log", test_tmpdir());
	char cmd[4096];
	snprintf(cmd, sizeof cmd, "exec %s/dsv32d --model %s --socket %s --backend %s %s --threads 2 %s > %s 2>&1",
		 test_bin_dir(), model, d->sock, backend(), invariant_flag(), extra ? extra : "", d->log);
	d->pid = fork();
	if (d->pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	uint64_t t0 = clock_mono_ms();
	for (;;) {
		dsv32_t *h;
		if (dsv32_connect(d->sock, &h) == 0) {
			dsv32_close(h);
			return;
		}
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid || clock_mono_ms() - t0 > 60000) {
			char show[700];
			snprintf(show, sizeof show, "tail -n 20 %s >&2", d->log);
			if (system(show)) {}
			test_fail(__FILE__, __LINE__, "dsv32d did not start");
			test_abort_case();
		}
		usleep(20000);
	}
}

/* SIGTERM and wait; returns the exit status (or -1). */
static int daemon_stop(struct daemon *d)
{
	kill(d->pid, SIGTERM);
	int st = 0;
	uint64_t t0 = clock_mono_ms();
	while (waitpid(d->pid, &st, WNOHANG) != d->pid) {
		if (clock_mono_ms() - t0 > 30000) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &st, 0);
			return -1;
		}
		usleep(10000);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The prompts used by the stream tests, and their greedy continuations from `dsv32 eval`. */
#define N_PROMPTS 6
#define GEN 3
static const uint32_t prompts[N_PROMPTS][5] = {
	{0, 100, 200, 300, 400}, {0, 7, 7, 7, 7},	   {0, 5000, 60000, 128000, 3},
	{0, 42, 4242, 42424, 1}, {0, 128798, 2, 77, 9}, {0, 1, 2, 3, 4},
};

static void eval_reference(const char *model, uint32_t ref[N_PROMPTS][GEN])
{
	char toks[512], out[512], cmd[2048];
	snprintf(toks, sizeof toks, "%s/prompts.txt", test_tmpdir());
	snprintf(out, sizeof out, "%s/eval.txt", test_tmpdir());
	FILE *f = fopen(toks, "w");
	REQUIRE(f);
	for (int p = 0; p < N_PROMPTS; p++)
		fprintf(f, "%u,%u,%u,%u,%u\n", prompts[p][0], prompts[p][1], prompts[p][2],
			prompts[p][3], prompts[p][4]);
	fclose(f);
	snprintf(cmd, sizeof cmd, "%s/dsv32 eval --model %s --backend %s %s --tokens %s --generate %d > %s 2>&1",
		 test_bin_dir(), model, backend(), invariant_flag(), toks, GEN, out);
	REQUIRE(system(cmd) == 0);
	struct err e;
	size_t n;
	char *text = file_read(out, &n, 1 << 20, &e);
	REQUIRE(text);
	for (int p = 0; p < N_PROMPTS; p++) {
		char key[32];
		snprintf(key, sizeof key, "seq%d: generated", p);
		char *s = strstr(text, key);
		REQUIRE(s);
		s += strlen(key);
		for (int k = 0; k < GEN; k++)
			ref[p][k] = (uint32_t)strtoul(s, &s, 10);
	}
	free(text);
}

/* One client: n_req greedy requests over the prompts, up to `window` in flight; checks one
 * terminal event each, gap-free seq, tokens equal to ref. Returns 0 if all good. */
static int client_streams(const char *sock, int n_req, int window, uint32_t ref[N_PROMPTS][GEN],
			  uint64_t seed)
{
	dsv32_t *h;
	if (dsv32_connect(sock, &h))
		return 10;
	uint32_t(*got)[GEN] = calloc((size_t)n_req, sizeof *got);
	int *n_got = calloc((size_t)n_req, sizeof *n_got), *done = calloc((size_t)n_req, sizeof *done),
	    *next_seq = calloc((size_t)n_req, sizeof *next_seq);
	if (!got || !n_got || !done || !next_seq)
		return 17;
	int submitted = 0, finished = 0, bad = 0, n_differ = 0;
	uint64_t t0 = clock_mono_ms();
	while (finished < n_req && !bad) {
		while (submitted < n_req && submitted - finished < window) {
			struct dsv32_generate_params p;
			dsv32_generate_params_init(&p, (uint64_t)submitted + 1);
			int pi = (int)((seed + (uint64_t)submitted) % N_PROMPTS);
			p.input = DSV32_INPUT_TOKENS;
			p.tokens = prompts[pi];
			p.n_tokens = 5;
			p.max_tokens = GEN;
			int r = dsv32_submit_generate(h, &p);
			if (r == -EAGAIN)
				break;
			if (r)
				return 11;
			submitted++;
		}
		struct dsv32_event ev;
		int r = dsv32_wait(h, 1000, &ev);
		if (r < 0 || clock_mono_ms() - t0 > 240000)
			return 12;
		if (r == 0)
			continue;
		int i = (int)(ev.request_id - 1);
		if (i < 0 || i >= n_req || done[i])
			return 13; /* an event for nothing in flight, or after the terminal one */
		int pi = (int)((seed + (uint64_t)i) % N_PROMPTS);
		if (ev.type == DSV32_EVENT_TOKEN) {
			if ((int)ev.token.seq != next_seq[i]++)
				return 14; /* a gap or a repeat in the sequence numbers */
			for (uint32_t k = 0; k < ev.token.n_tokens && n_got[i] < GEN; k++)
				got[i][n_got[i]++] = ev.token.tokens[k];
		} else if (ev.type == DSV32_EVENT_DONE) {
			done[i] = 1;
			finished++;
			if (n_got[i] != GEN)
				bad = 18; /* a request ended early */
			else if (!(ev.done.queued_us > 0 && ev.done.queued_us <= ev.done.ttft_us))
				bad = 19; /* queued: submission to the first step, before the first token */
			else if (memcmp(got[i], ref[pi], sizeof ref[pi]))
				n_differ++; /* not the tokens `dsv32 eval --generate` produced */
		} else {
			return 16;
		}
	}
	dsv32_close(h);
	free(got), free(n_got), free(done), free(next_seq);
	if (n_differ)
		printf("    client %llu (%s backend): %d of %d greedy streams differ from eval's\n",
		       (unsigned long long)seed, backend(), n_differ, n_req);
	if (!bad && n_differ)
		bad = 15;
	return bad;
}

/* Reads notify datagrams for up to ms milliseconds into msgs (a real systemd reads them as they
 * come: the socket queue holds only about 10). */
static void collect(int fd, char msgs[][256], int *n, int max, int ms)
{
	uint64_t t0 = clock_mono_ms();
	while (clock_mono_ms() - t0 < (uint64_t)ms && *n < max) {
		ssize_t k = recv(fd, msgs[*n], 255, MSG_DONTWAIT);
		if (k > 0) {
			msgs[*n][k] = 0;
			(*n)++;
		} else {
			usleep(2000);
		}
	}
}

TEST_T(daemon, notify_sequence_and_drain, 120)
{
	char model[512];
	make_model(model, sizeof model);
	char nsock[300];
	snprintf(nsock, sizeof nsock, "%s/notify.sock", test_tmpdir());
	int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	REQUIRE(strlen(nsock) < sizeof sa.sun_path);
	memcpy(sa.sun_path, nsock, strlen(nsock) + 1);
	REQUIRE(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
	setenv("NOTIFY_SOCKET", nsock, 1);
	setenv("WATCHDOG_USEC", "400000", 1);
	struct daemon d = {0};
	snprintf(d.sock, sizeof d.sock, "%s/d.sock", test_tmpdir());
	snprintf(d.log, sizeof d.log, "%s/dsv32d.log", test_tmpdir());
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "exec %s/dsv32d --model %s --socket %s --backend %s %s > %s 2>&1",
		 test_bin_dir(), model, d.sock, backend(), invariant_flag(), d.log);
	if ((d.pid = fork()) == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	char msgs[128][256];
	int n = 0;
	uint64_t t0 = clock_mono_ms();
	int ready = 0;
	while (clock_mono_ms() - t0 < 60000 && !ready) {
		int before = n;
		collect(fd, msgs, &n, 100, 5);
		for (int i = before; i < n; i++)
			ready |= !strcmp(msgs[i], "READY=1");
	}
	collect(fd, msgs, &n, 120, 700); /* watchdog pings every 200 ms */
	kill(d.pid, SIGTERM);
	collect(fd, msgs, &n, 128, 300);
	int st;
	waitpid(d.pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	int i_load = -1, i_extend = -1, i_warm = -1, i_ready = -1, i_wd = -1, i_stop = -1;
	for (int i = 0; i < n; i++) {
		if (!strncmp(msgs[i], "STATUS=loading", 14) && i_load < 0)
			i_load = i;
		if (!strncmp(msgs[i], "EXTEND_TIMEOUT_USEC=", 20) && i_extend < 0)
			i_extend = i;
		if (!strcmp(msgs[i], "STATUS=warming up"))
			i_warm = i;
		if (!strcmp(msgs[i], "READY=1"))
			i_ready = i;
		if (!strcmp(msgs[i], "WATCHDOG=1") && i_wd < 0)
			i_wd = i;
		if (!strcmp(msgs[i], "STOPPING=1"))
			i_stop = i;
	}
	/* STATUS/EXTEND while loading, READY=1 only after the warm-up, WATCHDOG=1 pings from
	 * the loop, STOPPING=1 on SIGTERM */
	CHECK(i_load >= 0 && i_extend > i_load);
	CHECK(i_warm > i_extend && i_ready > i_warm);
	CHECK(i_wd > i_ready);
	CHECK(i_stop > i_wd);
	if (i_stop < 0)
		for (int i = 0; i < n; i++)
			printf("    notify: %s\n", msgs[i]);
	close(fd);
}

/* `clients` processes of client_streams (per requests, window in flight, seeds from seed0),
 * each checked to exit 0. */
static void clients_stream(const char *sock, int clients, int per, int window,
			   uint32_t ref[N_PROMPTS][GEN], uint64_t seed0)
{
	pid_t pids[16];
	REQUIRE(clients <= 16);
	for (int c = 0; c < clients; c++) {
		pids[c] = fork();
		if (pids[c] == 0)
			_exit(client_streams(sock, per, window, ref, seed0 + (uint64_t)c));
	}
	for (int c = 0; c < clients; c++) {
		int st;
		waitpid(pids[c], &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			fprintf(stderr, "    client %d: status %d\n", c, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
}

/* The tiny model, eval's greedy tokens for the prompts, and dsv32d on it with `flags`. */
static void daemon_with_ref(struct daemon *d, uint32_t ref[N_PROMPTS][GEN], const char *flags)
{
	char model[512];
	make_model(model, sizeof model);
	eval_reference(model, ref);
	daemon_start(d, model, flags);
}

TEST_T(daemon, streams_equal_eval_many_clients, 600)
{
	uint32_t ref[N_PROMPTS][GEN];
	struct daemon d;
	daemon_with_ref(&d, ref, "--max-seqs 32");
	clients_stream(d.sock, sanitizer() ? 4 : 16, sanitizer() ? 10 : 50, 4, ref, 0);
	CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* Stats as a key -> value lookup. */
static long long stat_of(const char *text, const char *key)
{
	char k[64];
	snprintf(k, sizeof k, "\n%s ", key);
	const char *p = strstr(text, k);
	if (!p && !strncmp(text, key, strlen(key)))
		p = text - 1;
	return p ? atoll(p + strlen(k)) : -1;
}

static int fetch_stats(const char *sock, char *buf, size_t n)
{
	dsv32_t *h;
	if (dsv32_connect(sock, &h))
		return -1;
	int r = dsv32_stats(h, 99);
	struct dsv32_event ev;
	while (!r && (r = dsv32_wait(h, 10000, &ev)) == 1)
		if (ev.type == DSV32_EVENT_STATS) {
			snprintf(buf, n, "\n%s", ev.stats.text);
			break;
		}
	dsv32_close(h);
	return r == 1 ? 0 : -1;
}

/* --mtp-draft (one draft a step) and --mtp-draft 3: the streams are still eval's greedy tokens
 * (a draft is kept only where the model's own draw equals it), and the stats count the drafts
 * verified. */
TEST_T(daemon, mtp_draft_streams_equal_eval, 300)
{
	static const char *const flags[2] = {"--max-seqs 8 --mtp-draft", "--max-seqs 8 --mtp-draft 3"};
	for (int k = 0; k < 2; k++) {
		uint32_t ref[N_PROMPTS][GEN];
		struct daemon d;
		daemon_with_ref(&d, ref, flags[k]);
		clients_stream(d.sock, 4, 6, 3, ref, 100);
		char stats[4096];
		REQUIRE(fetch_stats(d.sock, stats, sizeof stats) == 0);
		CHECK(stat_of(stats, "mtp_drafts") > 0);
		CHECK(stat_of(stats, "mtp_drafts_accepted") >= 0);
		CHECK_EQ_INT(daemon_stop(&d), 0);
	}
}

static int count_fds(pid_t pid)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "ls /proc/%d/fd | wc -l", (int)pid);
	FILE *f = popen(cmd, "r");
	int n = -1;
	if (f) {
		if (fscanf(f, "%d", &n) != 1)
			n = -1;
		pclose(f);
	}
	return n;
}

/* The daemon's fd count once it has stopped changing (the server closes a departed client's
 * fds from its loop, so a count taken right after a disconnect may still include them): polls
 * every 50 ms until the count is the same for 500 ms, or `want` when want >= 0, for up to 5 s. */
static int settled_fds(pid_t pid, int want)
{
	int last = count_fds(pid), same_ms = 0;
	for (int waited = 0; waited < 5000; waited += 50) {
		if (want >= 0 ? last == want : same_ms >= 500)
			break;
		usleep(50000);
		int n = count_fds(pid);
		same_ms = n == last ? same_ms + 50 : 0;
		last = n;
	}
	return last;
}

TEST_T(daemon, clients_killed_under_load_leak_nothing, 300)
{
	char model[512];
	make_model(model, sizeof model);
	uint32_t ref[N_PROMPTS][GEN];
	eval_reference(model, ref);
	struct daemon d;
	daemon_start(&d, model, NULL);
	char st[8192];
	REQUIRE(fetch_stats(d.sock, st, sizeof st) == 0);
	CHECK_CONTAINS(st, "\nbackend_mode batch-invariant\n"); /* the mode the streams rely on */
	int fds0 = settled_fds(d.pid, -1);
	/* survivors: two clients whose outputs must stay exact */
	pid_t surv[2];
	for (int c = 0; c < 2; c++)
		if ((surv[c] = fork()) == 0)
			_exit(client_streams(d.sock, sanitizer() ? 6 : 20, 2, ref, (uint64_t)c));
	/* victims: started and SIGKILLed every 100 ms while they have requests in flight */
	uint64_t t0 = clock_mono_ms(), budget = sanitizer() ? 4000 : 10000;
	uint64_t seed = 3;
	while (clock_mono_ms() - t0 < budget) {
		pid_t v = fork();
		if (v == 0)
			_exit(client_streams(d.sock, 1000, 8, ref, 17));
		usleep(100000 + (unsigned)(test_rand(&seed) % 100000));
		kill(v, SIGKILL);
		waitpid(v, NULL, 0);
	}
	for (int c = 0; c < 2; c++) {
		int s;
		waitpid(surv[c], &s, 0);
		CHECK(WIFEXITED(s) && WEXITSTATUS(s) == 0);
	}
	/* within one step + 100 ms (generous here) the dead clients' state is gone */
	usleep(1500000);
	REQUIRE(fetch_stats(d.sock, st, sizeof st) == 0);
	CHECK_EQ_INT(stat_of(st, "live_requests"), 0);
	CHECK_EQ_INT(stat_of(st, "running"), 0);
	CHECK_EQ_INT(stat_of(st, "waiting"), 0);
	CHECK_EQ_INT(stat_of(st, "kv_pages_used"), 0);
	CHECK(stat_of(st, "ipc_clients") <= 1); /* the stats connection itself */
	CHECK_EQ_INT(settled_fds(d.pid, fds0), fds0);
	CHECK_EQ_INT(daemon_stop(&d), 0);
}

TEST_T(daemon, server_killed_clients_get_server_lost, 120)
{
	char model[512];
	make_model(model, sizeof model);
	struct daemon d;
	daemon_start(&d, model, NULL);
	dsv32_t *h[4];
	for (int c = 0; c < 4; c++) {
		REQUIRE(dsv32_connect(d.sock, &h[c]) == 0);
		struct dsv32_generate_params p;
		dsv32_generate_params_init(&p, 1);
		p.input = DSV32_INPUT_TOKENS;
		p.tokens = prompts[c];
		p.n_tokens = 5;
		p.max_tokens = 8000; /* still running when the server dies */
		REQUIRE(dsv32_submit_generate(h[c], &p) == 0);
	}
	usleep(300000);
	kill(d.pid, SIGKILL);
	waitpid(d.pid, NULL, 0);
	uint64_t t0 = clock_mono_ms();
	for (int c = 0; c < 4; c++) {
		int lost = 0;
		struct dsv32_event ev;
		while (!lost && clock_mono_ms() - t0 < 5000) {
			int r = dsv32_wait(h[c], 100, &ev);
			if (r == 1 && ev.type == DSV32_EVENT_ERROR && ev.error.code == DSV32_E_SERVER_LOST)
				lost = 1;
			if (r < 0)
				break;
		}
		CHECK(lost);
		dsv32_close(h[c]);
	}
	printf("    server_lost seen by 4 clients within %llu ms\n", (unsigned long long)(clock_mono_ms() - t0));
	CHECK(clock_mono_ms() - t0 < 5000);
}

/* A request that gets a typed error; the client stays connected and is served afterwards. */
static void expect_error(dsv32_t *h, struct dsv32_generate_params *p, int code, const char *needle)
{
	REQUIRE(dsv32_submit_generate(h, p) == 0);
	struct dsv32_event ev;
	REQUIRE(dsv32_wait(h, 20000, &ev) == 1);
	CHECK_EQ_INT(ev.type, DSV32_EVENT_ERROR);
	CHECK_EQ_INT(ev.request_id, p->request_id);
	CHECK_EQ_INT(ev.error.code, code);
	if (ev.type == DSV32_EVENT_ERROR)
		CHECK_CONTAINS(ev.error.message, needle);
}

TEST_T(daemon, typed_errors_keep_the_client, 120)
{
	char model[512];
	make_model(model, sizeof model);
	struct daemon d;
	daemon_start(&d, model, "--max-prompt-tokens 16 --max-new-tokens 100");
	dsv32_t *h;
	REQUIRE(dsv32_connect(d.sock, &h) == 0);
	struct dsv32_generate_params p;
	uint32_t bad_ids[3] = {0, 5, 129280};
	dsv32_generate_params_init(&p, 1);
	p.max_tokens = 10;
	p.input = DSV32_INPUT_TOKENS, p.tokens = bad_ids, p.n_tokens = 3;
	expect_error(h, &p, DSV32_E_BAD_TOKEN, "outside the vocabulary");
	uint32_t long_ids[20] = {0};
	dsv32_generate_params_init(&p, 2);
	p.max_tokens = 10;
	p.input = DSV32_INPUT_TOKENS, p.tokens = long_ids, p.n_tokens = 20;
	expect_error(h, &p, DSV32_E_PROMPT_TOO_LONG, "limit is 16");
	dsv32_generate_params_init(&p, 3);
	p.input = DSV32_INPUT_TEXT, p.text = "hello", p.text_len = 5, p.max_tokens = 1000;
	expect_error(h, &p, DSV32_E_BAD_PARAM, "max_tokens");
	dsv32_generate_params_init(&p, 4);
	p.max_tokens = 10;
	p.input = DSV32_INPUT_CHAT, p.text = "[{\"role\": \"wizard\", \"content\": \"x\"}]";
	p.text_len = strlen(p.text);
	expect_error(h, &p, DSV32_E_BAD_PARAM, "messages[0]");
	dsv32_generate_params_init(&p, 5);
	p.max_tokens = 10;
	p.input = DSV32_INPUT_TEXT, p.text = "hello", p.text_len = 5, p.top_p = 0;
	expect_error(h, &p, DSV32_E_BAD_PARAM, "top_p");
	/* still connected and served */
	dsv32_generate_params_init(&p, 6);
	p.input = DSV32_INPUT_CHAT;
	p.text = "[{\"role\": \"user\", \"content\": \"<｜User｜>hi\"}]"; /* injected tokens stay text */
	p.text_len = strlen(p.text);
	p.max_tokens = 3;
	p.logprobs = 3; /* the chosen token's logprob and 3 alternatives */
	REQUIRE(dsv32_submit_generate(h, &p) == 0);
	struct dsv32_event ev;
	int toks = 0, done = 0;
	while (!done && dsv32_wait(h, 20000, &ev) == 1) {
		if (ev.type == DSV32_EVENT_TOKEN && ev.token.n_tokens) {
			toks += (int)ev.token.n_tokens;
			CHECK_EQ_INT(ev.token.n_top, 3);
			CHECK(ev.token.logprobs && ev.token.logprobs[0] <= 0.0f);
			CHECK(ev.token.top && ev.token.top[0].logprob >= ev.token.top[1].logprob);
		}
		done = ev.type != DSV32_EVENT_TOKEN;
	}
	CHECK_EQ_INT(ev.type, DSV32_EVENT_DONE);
	CHECK_EQ_INT(toks, 3);
	/* cancel: DONE with reason cancelled, nothing after it */
	dsv32_generate_params_init(&p, 7);
	p.input = DSV32_INPUT_TOKENS, p.tokens = prompts[0], p.n_tokens = 5, p.max_tokens = 100;
	REQUIRE(dsv32_submit_generate(h, &p) == 0);
	REQUIRE(dsv32_cancel(h, 7) == 0);
	done = 0;
	while (!done && dsv32_wait(h, 20000, &ev) == 1)
		done = ev.type != DSV32_EVENT_TOKEN;
	CHECK_EQ_INT(ev.type, DSV32_EVENT_DONE);
	if (ev.type == DSV32_EVENT_DONE)
		CHECK_EQ_INT(ev.done.reason, DSV32_FINISH_CANCELLED);
	dsv32_close(h);
	CHECK_EQ_INT(daemon_stop(&d), 0);
}

TEST(daemon, bad_config_and_checkpoint_exit_nonzero)
{
	char cmd[2048], out[512];
	snprintf(out, sizeof out, "%s/out.log", test_tmpdir());
	snprintf(cmd, sizeof cmd, "%s/dsv32d --model %s/nonexistent > %s 2>&1", test_bin_dir(), test_tmpdir(), out);
	int st = system(cmd);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
	struct err e;
	size_t n;
	char *log = file_read(out, &n, 1 << 20, &e);
	REQUIRE(log);
	CHECK_CONTAINS(log, "nonexistent/config.json");
	free(log);
	snprintf(cmd, sizeof cmd, "%s/dsv32d --model x --max-seqs 0 > %s 2>&1", test_bin_dir(), out);
	st = system(cmd);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	log = file_read(out, &n, 1 << 20, &e);
	REQUIRE(log);
	CHECK_CONTAINS(log, "max-seqs = 0 out of range");
	free(log);
}

TEST_T(daemon, engine_fault_ends_every_request_and_exits_1, 120)
{
	char model[512];
	make_model(model, sizeof model);
	struct daemon d;
	setenv("DSV32D_TEST_FAULT_AT_STEP", "6", 1); /* a few steps after the clients start */
	daemon_start(&d, model, NULL);
	unsetenv("DSV32D_TEST_FAULT_AT_STEP");
	dsv32_t *h[3];
	for (int c = 0; c < 3; c++) {
		REQUIRE(dsv32_connect(d.sock, &h[c]) == 0);
		for (int r = 0; r < 2; r++) {
			struct dsv32_generate_params p;
			dsv32_generate_params_init(&p, (uint64_t)r + 1);
			p.input = DSV32_INPUT_TOKENS, p.tokens = prompts[(c + r) % N_PROMPTS], p.n_tokens = 5;
			p.max_tokens = 500;
			REQUIRE(dsv32_submit_generate(h[c], &p) == 0);
		}
	}
	/* every request ends with exactly one engine_fault (or, at worst, server_lost if the
	 * daemon exited before a client read its ring: never a silent hang) */
	for (int c = 0; c < 3; c++) {
		int terminal[2] = {0, 0}, faults = 0;
		struct dsv32_event ev;
		uint64_t t0 = clock_mono_ms();
		while ((terminal[0] + terminal[1] < 2) && clock_mono_ms() - t0 < 20000) {
			int r = dsv32_wait(h[c], 200, &ev);
			if (r < 0)
				break;
			if (r == 0 || ev.type == DSV32_EVENT_TOKEN)
				continue;
			REQUIRE(ev.request_id >= 1 && ev.request_id <= 2);
			terminal[ev.request_id - 1]++;
			if (ev.type == DSV32_EVENT_ERROR && ev.error.code == DSV32_E_ENGINE_FAULT)
				faults++;
		}
		CHECK_EQ_INT(terminal[0], 1);
		CHECK_EQ_INT(terminal[1], 1);
		CHECK_EQ_INT(faults, 2);
		dsv32_close(h[c]);
	}
	int st = 0;
	uint64_t t0 = clock_mono_ms();
	while (waitpid(d.pid, &st, WNOHANG) != d.pid && clock_mono_ms() - t0 < 10000)
		usleep(10000);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
}
