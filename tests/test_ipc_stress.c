/* test_ipc_stress.c — clients killed with SIGKILL at random while active, and hostile clients
 * (random bytes, indices past the ring, records past the data area, records rewritten after
 * submission, a tail moving backwards, writes on the socket): the server survives, frees their
 * state, disconnects only them, and the other clients' results stay exact. */
#include <errno.h>
#include <fcntl.h>
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

/* Kills random clients with SIGKILL every 100 ms for duration_ms while others run; survivors
 * must finish correctly, the server must free everything (slots, fds, requests) and report each
 * death within one step + 100 ms. */
static void kill_loop(int duration_ms)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	signal(SIGPIPE, SIG_IGN);
	struct tipc_engine e;
	tipc_engine_open(&e, path, 16);
	int fds0 = tipc_count_fds();
	enum { N = 8 };
	pid_t pids[N];
	int victim[N];
	uint64_t seed = 100;
	for (int i = 0; i < N; i++) {
		struct tipc_client_arg a = {path, seed++, 30, 4};
		pids[i] = tipc_spawn_client(&a);
		victim[i] = 0;
	}
	uint64_t t0 = clock_mono_ms(), next_kill = t0 + 100;
	int kills = 0, survivors_ok = 0, survivors_bad = 0;
	uint64_t gone_before = 0;
	while (clock_mono_ms() - t0 < (uint64_t)duration_ms) {
		tipc_engine_step(&e, 5);
		if (clock_mono_ms() >= next_kill) {
			next_kill += 100;
			int i = (int)(test_rand(&seed) % N);
			if (pids[i] > 0 && !victim[i]) {
				kill(pids[i], SIGKILL);
				if (e.n_killed < 64) {
					e.killed[e.n_killed] = pids[i];
					e.killed_at[e.n_killed++] = clock_mono_ms();
				}
				victim[i] = 1;
				kills++;
			}
		}
		for (int i = 0; i < N; i++) {
			int st;
			if (pids[i] > 0 && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
				if (!victim[i]) {
					if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
						survivors_ok++;
					else
						survivors_bad++;
				}
				struct tipc_client_arg a = {path, seed++, 30, 4};
				pids[i] = tipc_spawn_client(&a);
				victim[i] = 0;
			}
		}
	}
	for (int i = 0; i < N; i++)
		if (pids[i] > 0) {
			kill(pids[i], SIGKILL);
			waitpid(pids[i], NULL, 0);
		}
	/* every death is reaped within a step + 100 ms */
	uint64_t t1 = clock_mono_ms();
	struct ipc_server_counters c;
	do {
		tipc_engine_step(&e, 5);
		ipc_server_counters(e.srv, &c);
	} while ((c.clients || e.n_jobs) && clock_mono_ms() - t1 < 1000);
	uint64_t reap_ms = clock_mono_ms() - t1;
	fprintf(stderr, "    kill loop: %d kills, %d survivors ok, %llu requests, %llu clients gone, "
		"kill -> gone at most %llu ms, final reap %llu ms\n", kills, survivors_ok,
		(unsigned long long)e.requests, (unsigned long long)e.gone,
		(unsigned long long)e.max_reap_ms, (unsigned long long)reap_ms);
	(void)gone_before;
	/* The contract: a dead client's requests are freed within one step + 100 ms. The server
	 * reaps on the socket's EOF at its next poll (a step here is <= 5 ms); what is measured
	 * here also holds the kernel's teardown of the killed process and, on a loaded 2-core CI
	 * machine, scheduling delays, so the deadline is generous (the printed max is typically
	 * a few ms). Kills of clients not yet connected (or already gone) never match a GONE. */
	CHECK(e.max_reap_ms <= (tipc_sanitizer() ? 2000 : 1000));
	CHECK(kills > 0);
	CHECK(survivors_ok > 0);
	CHECK_EQ_INT(survivors_bad, 0);
	CHECK(reap_ms <= (tipc_sanitizer() ? 1000 : 150));
	CHECK_EQ_INT(c.clients, 0);
	CHECK_EQ_INT(c.inflight, 0);
	CHECK_EQ_INT(c.violations, 0);
	CHECK_EQ_INT(e.n_jobs, 0);
	CHECK_EQ_INT(tipc_count_fds(), fds0);
	CHECK_EQ_INT(e.gone, c.accepted);
	tipc_engine_close(&e);
}

TEST_T(ipc_e2e, clients_killed_at_random, 40) { kill_loop(tipc_sanitizer() ? 3000 : 5000); }

/* The 30 s kill loop (shorter under sanitizers). */
TEST_T(ipc_e2e, kill_loop_long, 90) { kill_loop(tipc_sanitizer() ? 8000 : 30000); }

/* ---- hostile clients -------------------------------------------------------------------------- */

enum { H_RANDOM, H_TAIL_PAST_RING, H_LEN_PAST_AREA, H_REWRITE, H_TAIL_BACKWARDS, H_SOCKET_WRITE, H_N };

struct rewrite_arg {
	volatile uint8_t *p;
	size_t n;
	volatile int stop;
};

static void *rewriter(void *v)
{
	struct rewrite_arg *a = v;
	uint64_t s = 7;
	while (!a->stop)
		a->p[test_rand(&s) % a->n] = (uint8_t)test_rand(&s);
	return NULL;
}

/* Waits for the server to close our socket. */
static int wait_eof(int fd, int timeout_ms)
{
	uint64_t t0 = clock_mono_ms();
	while (clock_mono_ms() - t0 < (uint64_t)timeout_ms) {
		char c;
		ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
		if (n == 0)
			return 0;
		usleep(1000);
	}
	return -ETIMEDOUT;
}

/* A client that breaks the protocol in one way; exits 0 if it was disconnected for it. */
static int hostile(const char *path, int kind, uint64_t seed)
{
	dsv32_t *h = tipc_connect(path);
	if (!h)
		return 2;
	size_t bytes;
	uint8_t *m = ipc_client_region(h, &bytes);
	struct ipc_header *x = (struct ipc_header *)m;
	struct ipc_sqe *sq = (struct ipc_sqe *)(m + x->sq_off);
	uint64_t s = seed + (uint64_t)kind;
	const uint32_t p[] = {3};
	switch (kind) {
	case H_RANDOM: {
		/* the completion ring is trashed too, so only the socket can tell what happened */
		for (size_t i = 0; i < bytes; i += 8) {
			uint64_t v = test_rand(&s);
			memcpy(m + i, &v, 8);
		}
		int r = wait_eof(ipc_client_socket(h), 10000);
		dsv32_close(h);
		return r ? 1 : 0;
	}
	case H_TAIL_PAST_RING:
		atomic_store(&x->sq_tail.v, x->sq_entries + 5);
		break;
	case H_LEN_PAST_AREA:
		sq[0] = (struct ipc_sqe){.opcode = IPC_OP_GENERATE, .req_id = 1,
					 .data_off = x->sq_data_bytes - 16, .data_len = 64};
		atomic_store(&x->sq_tail.v, 1);
		break;
	case H_REWRITE: {
		/* valid submissions while another thread scribbles over the data area: the server
		 * either reads a valid copy or a malformed one (then disconnects); it never reads a
		 * field twice. End with a certain violation. */
		struct rewrite_arg a = {m + x->sq_data_off, 4096, 0};
		pthread_t t;
		pthread_create(&t, NULL, rewriter, &a);
		for (int i = 1; i <= 200; i++) {
			if (tipc_submit(h, (uint64_t)i, p, 1, 2) == -ENOTCONN)
				break;
			struct dsv32_event ev;
			while (dsv32_poll(h, &ev) == 1)
				;
		}
		a.stop = 1;
		pthread_join(t, NULL);
		atomic_store(&x->sq_tail.v, atomic_load(&x->sq_tail.v) + x->sq_entries + 1);
		break;
	}
	case H_TAIL_BACKWARDS: {
		tipc_submit(h, 1, p, 1, 1);
		tipc_submit(h, 2, p, 1, 1);
		struct dsv32_event ev;
		while (dsv32_inflight(h) && dsv32_wait(h, 5000, &ev) == 1)
			;
		atomic_store(&x->sq_tail.v, atomic_load(&x->sq_tail.v) - 1);
		break;
	}
	case H_SOCKET_WRITE: { /* after the handshake, a write the protocol forbids */
		if (send(ipc_client_socket(h), "hi", 2, MSG_NOSIGNAL) != 2)
			return 3;
		struct dsv32_event ev;
		int r;
		uint64_t t0 = clock_mono_ms();
		while ((r = dsv32_wait(h, 200, &ev)) >= 0 && clock_mono_ms() - t0 < 10000)
			;
		dsv32_close(h);
		return r == -ENOTCONN ? 0 : 1;
	}
	}
	/* wake the server regardless of its flags: via a stats submission's eventfd path */
	atomic_store(&x->sq_flags.v, IPC_NEED_WAKEUP);
	struct dsv32_event ev;
	int r, saw_bad_frame = 0;
	uint64_t t0 = clock_mono_ms();
	while ((r = dsv32_wait(h, 200, &ev)) >= 0 && clock_mono_ms() - t0 < 10000) {
		if (r == 1 && ev.type == DSV32_EVENT_ERROR && ev.error.code == DSV32_E_BAD_FRAME)
			saw_bad_frame = 1;
		if (r == 0 && kind != H_RANDOM) /* the server may sleep: nudge it */
			dsv32_stats(h, 1000000 + (uint64_t)(clock_mono_ms() - t0));
	}
	dsv32_close(h);
	/* after scribbling over its own completion ring the random client cannot expect to read
	 * the error event; the disconnect is what it must see */
	if (r != -ENOTCONN || (!saw_bad_frame && kind != H_REWRITE))
		fprintf(stderr, "hostile %d: r %d bad_frame %d\n", kind, r, saw_bad_frame);
	return r == -ENOTCONN && (saw_bad_frame || kind == H_REWRITE) ? 0 : 1;
}

TEST_T(ipc_e2e, hostile_clients_alone_are_disconnected, 60)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	struct tipc_engine e;
	tipc_engine_open(&e, path, 16);
	pid_t good[3], bad[H_N];
	for (int i = 0; i < 3; i++) {
		struct tipc_client_arg a = {path, 500 + (uint64_t)i, 40, 4};
		good[i] = tipc_spawn_client(&a);
	}
	for (int k = 0; k < H_N; k++) {
		fflush(NULL);
		bad[k] = fork();
		if (bad[k] == 0) {
			_exit(hostile(path, k, 99));
		}
	}
	int good_ok = 0, bad_ok = 0, left = 3 + H_N;
	uint64_t t0 = clock_mono_ms();
	while (left && clock_mono_ms() - t0 < 45000) {
		tipc_engine_step(&e, 5);
		for (int i = 0; i < 3 + H_N; i++) {
			pid_t *pp = i < 3 ? &good[i] : &bad[i - 3];
			int st;
			if (*pp > 0 && waitpid(*pp, &st, WNOHANG) == *pp) {
				int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
				if (i < 3)
					good_ok += ok;
				else
					bad_ok += ok;
				if (!ok)
					fprintf(stderr, "    %s client %d failed (status 0x%x)\n", i < 3 ? "good" : "hostile", i < 3 ? i : i - 3, st);
				*pp = 0;
				left--;
			}
		}
	}
	for (int i = 0; i < 10; i++)
		tipc_engine_step(&e, 5);
	CHECK_EQ_INT(left, 0);
	CHECK_EQ_INT(good_ok, 3);
	CHECK_EQ_INT(bad_ok, H_N);
	struct ipc_server_counters c;
	ipc_server_counters(e.srv, &c);
	CHECK_EQ_INT(c.violations, H_N);
	CHECK_EQ_INT(c.clients, 0);
	CHECK_EQ_INT(c.inflight, 0);
	tipc_engine_close(&e);
}

/* Hostile clients of every kind, one after another for a few seconds, beside good clients:
 * each hostile one is disconnected for a violation, every good one finishes correctly. */
TEST_T(ipc_e2e, hostile_loop, 60)
{
	char path[256];
	tipc_sock_path(path, sizeof path);
	signal(SIGPIPE, SIG_IGN);
	struct tipc_engine e;
	tipc_engine_open(&e, path, 16);
	int fds0 = tipc_count_fds();
	enum { G = 3, B = 3 };
	pid_t good[G], bad[B];
	uint64_t seed = 7000;
	for (int i = 0; i < G; i++) {
		struct tipc_client_arg a = {path, seed++, 20, 4};
		good[i] = tipc_spawn_client(&a);
	}
	for (int i = 0; i < B; i++)
		bad[i] = 0;
	int n_bad = 0, bad_ok = 0, good_ok = 0, good_fail = 0;
	uint64_t t0 = clock_mono_ms(), dur = tipc_sanitizer() ? 3000 : 5000;
	while (clock_mono_ms() - t0 < dur) {
		tipc_engine_step(&e, 5);
		for (int i = 0; i < G + B; i++) {
			pid_t *pp = i < G ? &good[i] : &bad[i - G];
			int st;
			if (*pp > 0 && waitpid(*pp, &st, WNOHANG) != *pp)
				continue;
			if (*pp > 0) {
				int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
				if (i < G)
					ok ? good_ok++ : good_fail++;
				else
					bad_ok += ok;
			}
			if (i < G) {
				struct tipc_client_arg a = {path, seed++, 20, 4};
				*pp = tipc_spawn_client(&a);
			} else {
				int kind = (int)(seed % H_N);
				uint64_t hs = seed++;
				fflush(NULL);
				if ((*pp = fork()) == 0)
					_exit(hostile(path, kind, hs));
				n_bad++;
			}
		}
	}
	for (int i = 0; i < G + B; i++) {
		pid_t p = i < G ? good[i] : bad[i - G];
		int st;
		if (p > 0) {
			uint64_t t1 = clock_mono_ms();
			while (waitpid(p, &st, WNOHANG) == 0 && clock_mono_ms() - t1 < 20000)
				tipc_engine_step(&e, 5);
			int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
			if (i < G)
				ok ? good_ok++ : good_fail++;
			else
				bad_ok += ok;
		}
	}
	struct ipc_server_counters c;
	uint64_t t1 = clock_mono_ms();
	do {
		tipc_engine_step(&e, 5);
		ipc_server_counters(e.srv, &c);
	} while (c.clients && clock_mono_ms() - t1 < 2000);
	fprintf(stderr, "    %d hostile clients (%d disconnected as they should be), %d good ok\n",
		n_bad, bad_ok, good_ok);
	CHECK(n_bad >= 3);
	CHECK_EQ_INT(bad_ok, n_bad);
	CHECK_EQ_INT(good_fail, 0);
	CHECK(good_ok >= G);
	CHECK_EQ_INT(c.violations, n_bad);
	CHECK_EQ_INT(c.clients, 0);
	CHECK_EQ_INT(c.inflight, 0);
	CHECK_EQ_INT(e.n_jobs, 0);
	CHECK_EQ_INT(tipc_count_fds(), fds0);
	tipc_engine_close(&e);
}

