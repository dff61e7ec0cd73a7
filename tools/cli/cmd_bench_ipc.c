/*
 * cmd_bench_ipc.c — `dsv32 bench ipc`: round-trip latency of a small request through the
 * shared-memory rings (a 1-token generate answered by its done event), on the busy-poll path
 * (both sides spin) and on the futex path (both sides sleep: the server in epoll on the
 * client's eventfd, the client on its futex), side by side with a unix-socket echo of a 64-byte
 * message measured in the same run (blocking, and busy-polled with MSG_DONTWAIT).
 *
 * The server is a separate process, as in production. With two or more CPUs the two processes
 * are pinned to different CPUs (--same-cpu: both to CPU 0, where a wake-up is a context switch
 * rather than an interrupt to an idle CPU; busy-polling is then meaningless). Prints p50 and p99
 * and the ratios; asserts nothing.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/dsv32.h"
#include "ipc/futex.h"
#include "ipc/server.h"
#include "model/clock.h"
#include "tools/cli/bench_sort.h"
#include "tools/cli/cli.h"

static long n_cpus;  /* counted before anything is pinned (musl counts the affinity mask) */
static int same_cpu; /* --same-cpu: both processes on CPU 0 */

static void pin(int cpu)
{
	if (n_cpus < 2)
		return;
	if (same_cpu)
		cpu = 0;
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	sched_setaffinity(0, sizeof s, &s);
}

struct result {
	double p50_us, p99_us;
};

static struct result summarize(uint64_t *t, int n)
{
	qsort(t, (size_t)n, sizeof *t, bench_cmp_u64);
	return (struct result){t[n / 2] / 1e3, t[(int)(n * 0.99)] / 1e3};
}

enum mode { MODE_BUSY, MODE_FUTEX, MODE_DEFAULT };

/* The echo server: answers every generate with done; exits when its client leaves.
 * BUSY: polls without sleeping; FUTEX: sleeps at once; DEFAULT: spins 50 us, then sleeps. */
static void echo_server(const char *path, int mode, int ready_fd)
{
	int busy = mode == MODE_BUSY;
	pin(1);
	struct ipc_server_config c;
	ipc_server_config_init(&c);
	c.path = path;
	c.max_clients = 2;
	c.spin_us = mode == MODE_DEFAULT ? 50 : 0;
	struct ipc_server *s;
	if (ipc_server_open(&s, &c)) {
		fprintf(stderr, "dsv32 bench ipc: cannot open a server on %s\n", path);
		_exit(1);
	}
	if (write(ready_fd, "r", 1) != 1)
		_exit(1);
	struct ipc_item it[16];
	for (;;) {
		int n = ipc_server_poll(s, busy ? 0 : -1, it, 16);
		for (int i = 0; i < n; i++) {
			if (it[i].type == IPC_ITEM_GONE) {
				ipc_server_close(s);
				_exit(0);
			}
			if (it[i].type == IPC_ITEM_GENERATE) {
				ipc_server_emit_done(s, it[i].client, it[i].req_id, DSV32_FINISH_LENGTH, 1, 0, 0, 0, 0);
				ipc_request_free(it[i].req);
			}
		}
	}
}

static int ring_rtt(const char *path, int mode, uint64_t *t, int iters, int warmup,
		    struct result *res)
{
	int busy = mode == MODE_BUSY;
	int pfd[2];
	if (pipe(pfd))
		return -errno;
	unlink(path);
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		echo_server(path, mode, pfd[1]);
	}
	close(pfd[1]);
	char c;
	int r = read(pfd[0], &c, 1) == 1 ? 0 : -EIO;
	close(pfd[0]);
	dsv32_t *h = NULL;
	if (!r)
		r = dsv32_connect(path, &h);
	if (r) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return r;
	}
	if (mode != MODE_DEFAULT)
		dsv32_set_spin(h, 0);
	const uint32_t tok = 1;
	struct dsv32_generate_params p;
	dsv32_generate_params_init(&p, 1);
	p.input = DSV32_INPUT_TOKENS;
	p.tokens = &tok;
	p.n_tokens = 1;
	p.max_tokens = 1;
	for (int i = 0; i < warmup + iters && !r; i++) {
		struct dsv32_event ev;
		p.request_id = (uint64_t)i + 1;
		uint64_t t0 = clock_mono_ns();
		r = dsv32_submit_generate(h, &p);
		int got = 0;
		while (!r && !got) {
			got = busy ? dsv32_poll(h, &ev) : dsv32_wait(h, 5000, &ev);
			if (got < 0 || (!busy && got == 0))
				r = got < 0 ? got : -ETIMEDOUT;
		}
		if (i >= warmup)
			t[i - warmup] = clock_mono_ns() - t0;
	}
	dsv32_close(h);
	waitpid(pid, NULL, 0);
	if (!r)
		*res = summarize(t, iters);
	return r;
}

static int socket_rtt(int busy, uint64_t *t, int iters, int warmup, struct result *res)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
		return -errno;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		pin(1);
		close(sv[0]);
		char m[64];
		for (;;) {
			ssize_t n = recv(sv[1], m, sizeof m, busy ? MSG_DONTWAIT : 0);
			if (n == 0)
				_exit(0);
			if (n > 0 && send(sv[1], m, (size_t)n, 0) != n)
				_exit(1);
		}
	}
	close(sv[1]);
	char m[64] = {0};
	int r = 0;
	for (int i = 0; i < warmup + iters && !r; i++) {
		uint64_t t0 = clock_mono_ns();
		if (send(sv[0], m, sizeof m, 0) != (ssize_t)sizeof m)
			r = -errno;
		ssize_t n;
		while (!r && (n = recv(sv[0], m, sizeof m, busy ? MSG_DONTWAIT : 0)) != (ssize_t)sizeof m)
			if (n >= 0 || errno != EAGAIN)
				r = -EIO;
		if (i >= warmup)
			t[i - warmup] = clock_mono_ns() - t0;
	}
	close(sv[0]);
	waitpid(pid, NULL, 0);
	if (!r)
		*res = summarize(t, iters);
	return r;
}

/* The floor of any sleeping round trip on this machine: two processes ping-ponging one shared
 * futex word (two wake-ups per round trip, nothing else). */
static int futex_floor(uint64_t *t, int iters, int warmup, struct result *res)
{
	_Atomic uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (w == MAP_FAILED)
		return -errno;
	atomic_store(w, 0);
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		pin(1);
		for (uint32_t v = 1;; v += 2) { /* wait for odd v, answer v + 1 */
			while (atomic_load(w) != v) {
				if (atomic_load(w) == UINT32_MAX)
					_exit(0);
				ipc_futex_wait(w, v - 1, 100);
			}
			atomic_store(w, v + 1);
			ipc_futex_wake(w);
		}
	}
	for (int i = 0; i < warmup + iters; i++) {
		uint32_t v = 2 * (uint32_t)i + 1;
		uint64_t t0 = clock_mono_ns();
		atomic_store(w, v);
		ipc_futex_wake(w);
		while (atomic_load(w) != v + 1)
			ipc_futex_wait(w, v, 100);
		if (i >= warmup)
			t[i - warmup] = clock_mono_ns() - t0;
	}
	atomic_store(w, UINT32_MAX);
	ipc_futex_wake(w);
	waitpid(pid, NULL, 0);
	munmap((void *)w, 4096);
	*res = summarize(t, iters);
	return 0;
}

int bench_ipc(int argc, char **argv)
{
	int iters = 100000;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--same-cpu"))
			same_cpu = 1;
		else {
			fprintf(stderr, "usage: dsv32 bench ipc [--iters N] [--same-cpu]\n");
			return 2;
		}
	}
	if (iters < 100)
		iters = 100;
	n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int warmup = iters / 10;
	uint64_t *t = malloc((size_t)iters * sizeof *t);
	char path[108];
	snprintf(path, sizeof path, "/tmp/dsv32-bench-ipc-%d.sock", (int)getpid());
	pin(0);
	struct result busy, fut, dflt, sock, sock_busy, floor;
	int r = ring_rtt(path, MODE_BUSY, t, iters, warmup, &busy);
	if (!r)
		r = ring_rtt(path, MODE_FUTEX, t, iters, warmup, &fut);
	if (!r)
		r = ring_rtt(path, MODE_DEFAULT, t, iters, warmup, &dflt);
	if (!r)
		r = socket_rtt(0, t, iters, warmup, &sock);
	if (!r)
		r = socket_rtt(1, t, iters, warmup, &sock_busy);
	if (!r)
		r = futex_floor(t, iters, warmup, &floor);
	unlink(path);
	free(t);
	if (r) {
		fprintf(stderr, "dsv32 bench ipc: %s\n", strerror(-r));
		return 1;
	}
	printf("dsv32 bench ipc: round trip, client and server in separate processes%s, %d iterations each\n",
	       n_cpus < 2 ? " (one CPU)" : same_cpu ? " both pinned to CPU 0" : " pinned to CPUs 0 and 1", iters);
	printf("  %-46s %9s %9s\n", "path", "p50 us", "p99 us");
	printf("  %-46s %9.2f %9.2f\n", "rings, busy-poll (generate -> done event)", busy.p50_us, busy.p99_us);
	printf("  %-46s %9.2f %9.2f\n", "rings, futex + eventfd (both sides asleep)", fut.p50_us, fut.p99_us);
	printf("  %-46s %9.2f %9.2f\n", "rings, defaults (spin 20/50 us, then futex)", dflt.p50_us, dflt.p99_us);
	printf("  %-46s %9.2f %9.2f\n", "unix socket echo, 64 B, blocking", sock.p50_us, sock.p99_us);
	printf("  %-46s %9.2f %9.2f\n", "unix socket echo, 64 B, busy-poll", sock_busy.p50_us, sock_busy.p99_us);
	printf("  %-46s %9.2f %9.2f\n", "floor: bare futex ping-pong (2 wake-ups)", floor.p50_us, floor.p99_us);
	printf("  busy-poll rings vs blocking socket: %.1fx lower p50 (target >= 5x, p50 <= 1 us)\n",
	       sock.p50_us / busy.p50_us);
	printf("  busy-poll rings vs busy-poll socket: %.1fx lower p50\n", sock_busy.p50_us / busy.p50_us);
	printf("  futex rings vs blocking socket: %.2fx; vs the bare futex floor: %.2fx (aim: futex p50 <= 5 us)\n",
	       sock.p50_us / fut.p50_us, fut.p50_us / floor.p50_us);
	printf("command: dsv32 bench ipc --iters %d%s\n", iters, same_cpu ? " --same-cpu" : "");
	return 0;
}
