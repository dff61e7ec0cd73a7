/* test_ipc_e2e.c — server and clients in separate processes through the real socket, memfd,
 * rings and futexes, with the test engine of test_ipc_engine.c standing in for the model:
 * requests, typed errors, stats, limits, draining, many clients at once, small rings that wrap,
 * the server killed with SIGKILL, a server with a bad hello. (Killed and hostile clients:
 * test_ipc_stress.c.) */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/client_int.h"
#include "ipc/proto.h"
#include "ipc/server.h"
#include "model/clock.h"
#include "tests/test.h"
#include "tests/test_ipc_engine.h"

/* ---- tests ------------------------------------------------------------------------------------ */

TEST(ipc_e2e, connect_generate_stats_errors)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	struct tipc_engine e;
	tipc_engine_open(&e, path, 4);
	fflush(NULL);
	pid_t p = fork();
	if (p == 0) {
		int bad = 0;
		dsv32_t *h = tipc_connect(path);
		if (!h)
			_exit(2);
		const uint32_t prompt[] = {10, 20};
		bad += tipc_submit(h, 1, prompt, 2, 3) != 0;
		const uint32_t bad_tok[] = {100001};
		bad += tipc_submit(h, 2, bad_tok, 1, 3) != 0; /* engine-side typed error */
		struct dsv32_generate_params g;
		dsv32_generate_params_init(&g, 3);
		g.input = DSV32_INPUT_TEXT;
		g.text = "\xff\xfe";
		g.text_len = 2; /* invalid UTF-8: typed error, connection stays */
		bad += dsv32_submit_generate(h, &g) != 0;
		dsv32_generate_params_init(&g, 4);
		g.input = DSV32_INPUT_TOKENS;
		g.tokens = prompt;
		g.n_tokens = 1;
		g.top_p = 2.0f; /* out of range */
		bad += dsv32_submit_generate(h, &g) != 0;
		bad += dsv32_submit_generate(h, &g) != -EEXIST;
		bad += dsv32_stats(h, 5) != 0;
		int tok = 0, done = 0, e_tok = 0, e_utf = 0, e_par = 0, st = 0;
		struct dsv32_event ev;
		while (dsv32_inflight(h) && dsv32_wait(h, 5000, &ev) == 1) {
			if (ev.type == DSV32_EVENT_TOKEN && ev.request_id == 1)
				tok += ev.token.tokens[0] == prompt[ev.token.seq % 2] + ev.token.seq;
			done += ev.type == DSV32_EVENT_DONE && ev.request_id == 1 && ev.done.completion_tokens == 3 &&
				ev.done.reason == DSV32_FINISH_LENGTH && ev.done.ttft_us == 2.0;
			e_tok += ev.type == DSV32_EVENT_ERROR && ev.request_id == 2 && ev.error.code == DSV32_E_BAD_TOKEN;
			e_utf += ev.type == DSV32_EVENT_ERROR && ev.request_id == 3 && ev.error.code == DSV32_E_BAD_UTF8;
			e_par += ev.type == DSV32_EVENT_ERROR && ev.request_id == 4 && ev.error.code == DSV32_E_BAD_PARAM;
			st += ev.type == DSV32_EVENT_STATS && ev.request_id == 5 && strstr(ev.stats.text, "ipc_clients 1\n");
		}
		if (tok != 3 || done != 1 || e_tok != 1 || e_utf != 1 || e_par != 1 || st != 1) {
			fprintf(stderr, "tok %d done %d e_tok %d e_utf %d e_par %d st %d\n", tok, done, e_tok, e_utf, e_par, st);
			bad++;
		}
		bad += dsv32_cancel(h, 1) != -ENOENT;
		dsv32_close(h);
		_exit(bad ? 1 : 0);
	}
	int status = -1;
	uint64_t t0 = clock_mono_ms();
	while (waitpid(p, &status, WNOHANG) == 0 && clock_mono_ms() - t0 < 20000)
		tipc_engine_step(&e, 10);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	for (int i = 0; i < 20; i++)
		tipc_engine_step(&e, 10);
	struct ipc_server_counters c;
	ipc_server_counters(e.srv, &c);
	CHECK_EQ_INT(c.clients, 0);
	CHECK_EQ_INT(c.inflight, 0);
	CHECK_EQ_INT(e.gone, 1);
	tipc_engine_close(&e);
}

TEST(ipc_e2e, sixteen_clients_fifty_requests)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	struct tipc_engine e;
	tipc_engine_open(&e, path, 32);
	pid_t pids[16];
	for (int i = 0; i < 16; i++) {
		struct tipc_client_arg a = {path, (uint64_t)i + 1, 50, 8};
		pids[i] = tipc_spawn_client(&a);
	}
	int left = 16, ok = 0;
	uint64_t t0 = clock_mono_ms();
	while (left && clock_mono_ms() - t0 < 50000) {
		tipc_engine_step(&e, 5);
		for (int i = 0; i < 16; i++) {
			int st;
			if (pids[i] > 0 && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
				ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
				pids[i] = 0;
				left--;
			}
		}
	}
	CHECK_EQ_INT(left, 0);
	CHECK_EQ_INT(ok, 16);
	CHECK_EQ_INT(e.requests, 16 * 50);
	for (int i = 0; i < 20; i++)
		tipc_engine_step(&e, 5);
	struct ipc_server_counters c;
	ipc_server_counters(e.srv, &c);
	CHECK_EQ_INT(c.clients, 0);
	CHECK_EQ_INT(c.inflight, 0);
	CHECK_EQ_INT(c.violations, 0);
	CHECK_EQ_INT(e.n_jobs, 0);
	tipc_engine_close(&e);
}

TEST(ipc_e2e, small_areas_wrap_many_times)
{
	/* rings and data areas far smaller than the traffic: every index and byte position
	 * wraps many times, records of varied size skip the area's end, submits see -EAGAIN */
	char path[256];
	tipc_sock_path(path, sizeof path);
	struct tipc_engine e;
	memset(&e, 0, sizeof e);
	struct ipc_server_config c;
	ipc_server_config_init(&c);
	c.path = path;
	c.max_clients = 4;
	c.max_inflight_client = 8;
	c.sq_entries = 8;
	c.cq_entries = 64;
	c.sq_data_bytes = 4096;
	c.cq_data_bytes = 16384;
	c.max_msg_bytes = 2048;
	c.max_prompt_bytes = 1024;
	REQUIRE(ipc_server_open(&e.srv, &c) == 0);
	tipc_stop_strings = 1;
	/* A client descheduled for a few ms (a loaded CI machine) lets the engine fill its small
	 * completion ring: those requests end with `busy`, which is their one terminal event. */
	tipc_allow_busy = 1;
	e.pace_us = 200;
	pid_t pids[2];
	for (int i = 0; i < 2; i++) {
		struct tipc_client_arg a = {path, 900 + (uint64_t)i, tipc_sanitizer() ? 300 : 1000, 8};
		pids[i] = tipc_spawn_client(&a);
	}
	int ok = 0, left = 2;
	uint64_t t0 = clock_mono_ms();
	while (left && clock_mono_ms() - t0 < 25000) {
		tipc_engine_step(&e, 5);
		for (int i = 0; i < 2; i++) {
			int st;
			if (pids[i] > 0 && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
				ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
				pids[i] = 0;
				left--;
			}
		}
	}
	CHECK_EQ_INT(ok, 2);
	struct ipc_server_counters k;
	ipc_server_counters(e.srv, &k);
	CHECK_EQ_INT(k.violations, 0);
	CHECK(k.requests >= (tipc_sanitizer() ? 600 : 2000));
	CHECK(k.busy < k.requests);
	fprintf(stderr, "    %llu requests, %llu ended busy, %llu events\n", (unsigned long long)k.requests,
		(unsigned long long)k.busy, (unsigned long long)k.events);
	tipc_engine_close(&e);
}

TEST(ipc_e2e, server_killed_clients_get_server_lost)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	int ready[2];
	REQUIRE(pipe(ready) == 0);
	fflush(NULL);
	pid_t srv = fork();
	if (srv == 0) {
		struct tipc_engine e;
		tipc_engine_open(&e, path, 8);
		e.hold = 1; /* requests stay in flight until the server dies */
		for (;;)
			tipc_engine_step(&e, 50);
	}
	enum { N = 4 };
	pid_t cl[N];
	for (int i = 0; i < N; i++) {
		fflush(NULL);
		cl[i] = fork();
		if (cl[i] == 0) {
			close(ready[0]);
			dsv32_t *h = tipc_connect(path);
			if (!h)
				_exit(2);
			const uint32_t p[] = {1};
			for (int k = 1; k <= 3; k++)
				if (tipc_submit(h, (uint64_t)k, p, 1, 1000))
					_exit(3);
			dsv32_set_spin(h, i == 0 ? 1000 : 0);
			if (write(ready[1], "x", 1) != 1)
				_exit(4);
			int lost = 0;
			struct dsv32_event ev;
			int r;
			while ((r = dsv32_wait(h, 10000, &ev)) == 1)
				lost += ev.type == DSV32_EVENT_ERROR && ev.error.code == DSV32_E_SERVER_LOST;
			int bad = r != -ENOTCONN || lost != 3 || dsv32_inflight(h) != 0;
			bad |= dsv32_submit_generate(h, &(struct dsv32_generate_params){.request_id = 9}) != -ENOTCONN;
			if (bad)
				fprintf(stderr, "client: r %d lost %d\n", r, lost);
			dsv32_close(h);
			_exit(bad ? 1 : 0);
		}
	}
	close(ready[1]);
	char buf[N];
	size_t got = 0;
	while (got < N) {
		ssize_t n = read(ready[0], buf, N - got);
		REQUIRE(n > 0);
		got += (size_t)n;
	}
	usleep(50000); /* let the clients go to sleep on their futexes */
	kill(srv, SIGKILL);
	uint64_t t0 = clock_mono_ms();
	waitpid(srv, NULL, 0);
	int ok = 0;
	for (int i = 0; i < N; i++) {
		int st;
		waitpid(cl[i], &st, 0);
		ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
	}
	uint64_t dt = clock_mono_ms() - t0;
	fprintf(stderr, "    every client saw server_lost %llu ms after the kill\n", (unsigned long long)dt);
	CHECK_EQ_INT(ok, N);
	CHECK(dt < 5000);
}

TEST(ipc_e2e, limits_draining_and_refusals)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	struct tipc_engine e;
	struct ipc_server_config c;
	ipc_server_config_init(&c);
	c.path = path;
	c.max_clients = 1;
	c.max_inflight_client = 16;
	c.cq_entries = 64;
	c.sq_data_bytes = 1 << 16;
	c.max_msg_bytes = 1 << 12;
	c.max_prompt_bytes = 1 << 10;
	memset(&e, 0, sizeof e);
	REQUIRE(ipc_server_open(&e.srv, &c) == 0);
	fflush(NULL);
	pid_t p = fork();
	if (p == 0) {
		dsv32_t *h = tipc_connect(path), *h2 = NULL;
		int bad = !h;
		bad += dsv32_connect(path, &h2) != -EUSERS; /* one client max */
		char big[2000];
		memset(big, 'a', sizeof big);
		struct dsv32_generate_params g;
		dsv32_generate_params_init(&g, 1);
		g.text = big;
		g.text_len = sizeof big; /* > max_prompt_bytes, < max_msg_bytes: typed error */
		bad += dsv32_submit_generate(h, &g) != 0;
		char huge[5000] = {0};
		g.request_id = 2;
		g.text = huge;
		g.text_len = sizeof huge;
		bad += dsv32_submit_generate(h, &g) != -EMSGSIZE; /* refused locally */
		struct dsv32_event ev;
		bad += dsv32_wait(h, 5000, &ev) != 1 || ev.type != DSV32_EVENT_ERROR ||
		       ev.error.code != DSV32_E_PROMPT_TOO_LONG;
		/* the server starts draining after it sees request 3 */
		const uint32_t t[] = {1};
		bad += tipc_submit(h, 3, t, 1, 1) != 0;
		bad += dsv32_wait(h, 5000, &ev) != 1;
		bad += tipc_submit(h, 4, t, 1, 1) != 0;
		while (dsv32_inflight(h) && dsv32_wait(h, 5000, &ev) == 1)
			if (ev.request_id == 4)
				bad += ev.type != DSV32_EVENT_ERROR || ev.error.code != DSV32_E_DRAINING;
		dsv32_close(h);
		_exit(bad ? 1 : 0);
	}
	int status = -1;
	uint64_t t0 = clock_mono_ms();
	while (waitpid(p, &status, WNOHANG) == 0 && clock_mono_ms() - t0 < 20000) {
		tipc_engine_step(&e, 10);
		if (e.requests >= 1)
			ipc_server_set_draining(e.srv, 1);
	}
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	ipc_server_close(e.srv);
	free(e.jobs);
	/* a second server on a live path is refused; a stale socket file is replaced */
	struct ipc_server *s1, *s2;
	REQUIRE(ipc_server_open(&s1, &c) == 0);
	CHECK_EQ_INT(ipc_server_open(&s2, &c), -EADDRINUSE);
	ipc_server_close(s1);
	FILE *f = fopen(path, "w"); /* not a socket: left alone */
	REQUIRE(f);
	fclose(f);
	CHECK_EQ_INT(ipc_server_open(&s2, &c), -EADDRINUSE);
	CHECK(access(path, F_OK) == 0);
	unlink(path);
	/* SO_PEERCRED: a uid/gid not on the lists is refused; on the list, let in */
	uint32_t other = getuid() + 1, mine = getuid();
	c.allow_uids = &other;
	c.n_allow_uids = 1;
	REQUIRE(ipc_server_open(&s1, &c) == 0);
	for (int k = 0; k < 2; k++) {
		fflush(NULL);
		p = fork();
		if (p == 0) {
			dsv32_t *h = NULL;
			int r = dsv32_connect(path, &h);
			dsv32_close(h);
			_exit(r == (k == 0 ? -EACCES : 0) ? 0 : 1);
		}
		t0 = clock_mono_ms();
		while (waitpid(p, &status, WNOHANG) == 0 && clock_mono_ms() - t0 < 10000) {
			struct ipc_item it[4];
			ipc_server_poll(s1, 10, it, 4);
		}
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		ipc_server_close(s1);
		c.allow_uids = &mine;
		REQUIRE(ipc_server_open(&s1, &c) == 0);
	}
	ipc_server_close(s1);
}

/* A server that speaks another protocol version, or sends garbage, is refused by the client. */
TEST(ipc_e2e, client_refuses_bad_hello)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	REQUIRE(strlen(path) < sizeof a.sun_path);
	memcpy(a.sun_path, path, strlen(path) + 1);
	int lfd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	REQUIRE(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0);
	struct ipc_hello hellos[3] = {
		{.magic = IPC_MAGIC, .version = IPC_VERSION + 1},
		{.magic = 0x12345678, .version = IPC_VERSION},
		{.magic = IPC_MAGIC, .version = IPC_VERSION, .status = 0}, /* status ok but no fds */
	};
	int want[3] = {-EPROTONOSUPPORT, -EPROTO, -EPROTO};
	for (int k = 0; k < 3; k++) {
		fflush(NULL);
		pid_t p = fork();
		if (p == 0) {
			dsv32_t *h = NULL;
			int r = dsv32_connect(path, &h);
			if (r != want[k])
				fprintf(stderr, "hello %d: %d, want %d\n", k, r, want[k]);
			_exit(r == want[k] && !h ? 0 : 1);
		}
		int fd = accept(lfd, NULL, NULL);
		REQUIRE(fd >= 0);
		CHECK(send(fd, &hellos[k], sizeof hellos[k], 0) == (ssize_t)sizeof hellos[k]);
		int st;
		waitpid(p, &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		close(fd);
	}
	close(lfd);
}

/* allow-gids lets a client in by a supplementary group too (SO_PEERGROUPS), not only by its
 * primary gid; a client in none of the listed groups is refused. The client processes take the
 * groups with setgroups(), which needs CAP_SETGID: without it the case says so and checks only
 * the refusal. */
TEST(ipc_e2e, allow_gids_supplementary_groups)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	struct ipc_server_config c;
	ipc_server_config_init(&c);
	c.path = path;
	uint32_t listed = 4242;
	c.allow_gids = &listed;
	c.n_allow_gids = 1;
	struct ipc_server *s;
	REQUIRE(ipc_server_open(&s, &c) == 0);
	int can_setgroups = 1;
	/* k = 0: supplementary groups {4243} (not listed): refused; k = 1: {4241, 4242}: let in */
	for (int k = 0; k < 2; k++) {
		fflush(NULL);
		pid_t p = fork();
		if (p == 0) {
			gid_t g[2] = {k ? 4241 : 4243, 4242};
			if (setgroups(k ? 2 : 1, g))
				_exit(3); /* no CAP_SETGID */
			dsv32_t *h = NULL;
			int r = dsv32_connect(path, &h);
			dsv32_close(h);
			_exit(r == (k == 0 ? -EACCES : 0) ? 0 : 1);
		}
		int status = -1;
		uint64_t t0 = clock_mono_ms();
		while (waitpid(p, &status, WNOHANG) == 0 && clock_mono_ms() - t0 < 10000) {
			struct ipc_item it[4];
			ipc_server_poll(s, 10, it, 4);
		}
		REQUIRE(WIFEXITED(status));
		if (WEXITSTATUS(status) == 3) {
			can_setgroups = 0;
			break;
		}
		CHECK_EQ_INT(WEXITSTATUS(status), 0);
	}
	if (!can_setgroups) {
		/* no CAP_SETGID: our own groups do not include 4242, so we must be refused */
		dsv32_t *h = NULL;
		fflush(NULL);
		pid_t p = fork();
		if (p == 0) {
			int r = dsv32_connect(path, &h);
			_exit(r == -EACCES ? 0 : 1);
		}
		int status = -1;
		uint64_t t0 = clock_mono_ms();
		while (waitpid(p, &status, WNOHANG) == 0 && clock_mono_ms() - t0 < 10000) {
			struct ipc_item it[4];
			ipc_server_poll(s, 10, it, 4);
		}
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		printf("    setgroups not permitted here: only the refusal was checked\n");
	}
	ipc_server_close(s);
}
