/*
 * server.c — dsv32d's IPC endpoint: the listening socket, the handshake (SO_PEERCRED check,
 * memfd + eventfd over SCM_RIGHTS), one struct ipc_conn per client, epoll for liveness and
 * wake-ups, and the non-blocking event emitters.
 *
 * Wake-ups: each client gets its own eventfd (in the server's epoll set with its socket). Before
 * the server sleeps it sets IPC_NEED_WAKEUP in every client's sq_flags, fences, and looks at the
 * rings once more; a client that publishes a submission and then sees the flag writes its
 * eventfd. A busy server (timeout 0) makes no system call except one epoll check per ms.
 * Liveness: the socket. EOF or error on it = the client is gone; it is reaped at once and
 * reported as IPC_ITEM_GONE.
 *
 * Must not: block on a client (every fd is non-blocking; a hello that cannot be sent at once
 * drops that client), know about models, or read a client's region except through conn.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ipc/conn.h"
#include "ipc/futex.h"
#include "ipc/server.h"

struct client {
	int live;
	uint32_t gen;
	int sock, efd;
	uint32_t uid, gid;
	int32_t pid;
	struct ipc_conn conn;
};

struct ipc_server {
	struct ipc_server_config cfg;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lfd, epfd;
	uint64_t epoch;
	struct ipc_layout lay;
	struct ipc_conn_limits lim;
	struct ipc_totals tot;
	struct client *cl; /* [max_clients] */
	uint32_t n_live, rr;
	int draining;
	uint64_t last_io_ns;
	struct ipc_item *gone; /* reaped clients not yet reported */
	uint32_t n_gone, cap_gone;
	struct ipc_conn_item *tmp; /* [64] */
	struct ipc_server_counters cnt;
};

#define TMP_ITEMS 64

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void ipc_server_config_init(struct ipc_server_config *c)
{
	*c = (struct ipc_server_config){
		.path = DSV32_DEFAULT_SOCKET,
		.socket_mode = 0666,
		.max_clients = 64,
		.max_inflight_client = 64,
		.max_inflight_total = 1024,
		.max_msg_bytes = 4u << 20,
		.max_prompt_bytes = 2u << 20,
		.sq_entries = 256,
		.cq_entries = 1024,
		.sq_data_bytes = 8u << 20,
		.cq_data_bytes = 1u << 20,
		.spin_us = 50,
	};
}

/* ---- handles -------------------------------------------------------------------------------- */

static uint64_t handle_of(const struct ipc_server *s, const struct client *c)
{
	return (uint64_t)c->gen << 32 | (uint64_t)(c - s->cl + 1);
}

static struct client *client_of(struct ipc_server *s, uint64_t h)
{
	uint64_t slot = (h & 0xffffffffu);
	if (slot == 0 || slot > s->cfg.max_clients)
		return NULL;
	struct client *c = &s->cl[slot - 1];
	return c->live && c->gen == (uint32_t)(h >> 32) ? c : NULL;
}

/* ---- open / close --------------------------------------------------------------------------- */

/* A socket file left by a dead server is replaced; one that still answers is not, and a path
 * that is not a socket is never removed (bind then fails with EADDRINUSE). */
static int claim_path(const struct sockaddr_un *a)
{
	struct stat st;
	if (lstat(a->sun_path, &st) || !S_ISSOCK(st.st_mode))
		return 0;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int r = connect(fd, (const struct sockaddr *)a, sizeof *a);
	int e = errno;
	close(fd);
	if (r == 0)
		return -EADDRINUSE;
	if (e == ECONNREFUSED)
		unlink(a->sun_path);
	return 0;
}

int ipc_server_open(struct ipc_server **out, const struct ipc_server_config *cfg)
{
	*out = NULL;
	struct ipc_server *s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->lfd = s->epfd = -1;
	int r = -EINVAL, bound = 0;
	const char *path = cfg->path ? cfg->path : DSV32_DEFAULT_SOCKET;
	if (strlen(path) >= sizeof s->path || cfg->max_clients == 0 ||
	    cfg->max_prompt_bytes > cfg->max_msg_bytes || cfg->max_inflight_total == 0)
		goto err;
	strcpy(s->path, path);
	s->cfg.path = s->path;
	if ((r = ipc_layout_compute(&s->lay, cfg->sq_entries, cfg->cq_entries, cfg->sq_data_bytes,
				    cfg->cq_data_bytes)))
		goto err;
	s->lim = (struct ipc_conn_limits){cfg->max_msg_bytes, cfg->max_prompt_bytes,
					  cfg->max_inflight_client};
	s->tot.max_inflight = cfg->max_inflight_total;
	/* check the limits against the layout once, with a throwaway conn */
	{
		struct ipc_conn probe;
		static uint8_t dummy[64];
		if ((r = ipc_conn_init(&probe, dummy, &s->lay, &s->lim, &s->tot)))
			goto err;
		ipc_conn_free(&probe);
	}
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	s->epoch = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
		   ((uint64_t)getpid() << 48);
	if (!s->epoch)
		s->epoch = 1;
	r = -ENOMEM;
	s->cl = calloc(cfg->max_clients, sizeof *s->cl);
	s->tmp = calloc(TMP_ITEMS, sizeof *s->tmp);
	if (!s->cl || !s->tmp)
		goto err;
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	strcpy(a.sun_path, s->path);
	if ((r = claim_path(&a)))
		goto err;
	s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a)) {
		r = -errno;
		goto err;
	}
	bound = 1;
	if (chmod(s->path, cfg->socket_mode) || listen(s->lfd, 128)) {
		r = -errno;
		goto err;
	}
	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
	if (s->epfd < 0 || epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->lfd, &ev)) {
		r = -errno;
		goto err;
	}
	s->last_io_ns = now_ns();
	*out = s;
	return 0;
err:
	if (s->lfd >= 0)
		close(s->lfd);
	if (bound) /* only a socket file we created */
		unlink(s->path);
	if (s->epfd >= 0)
		close(s->epfd);
	free(s->cl);
	free(s->tmp);
	free(s);
	return r;
}

static void client_release(struct ipc_server *s, struct client *c)
{
	close(c->sock);
	close(c->efd); /* closing removes both from the epoll set */
	s->cnt.rejected += c->conn.n_rejected;
	ipc_conn_free(&c->conn);
	munmap(c->conn.base, s->lay.bytes);
	c->live = 0;
	s->n_live--;
}

void ipc_server_close(struct ipc_server *s)
{
	if (!s)
		return;
	for (uint32_t i = 0; i < s->cfg.max_clients; i++) {
		struct client *c = &s->cl[i];
		if (!c->live)
			continue;
		/* Release: nothing to publish with it, but it must not be reordered before the cqes
		 * we posted; then wake a client sleeping on cq_tail so it sees the state at once. */
		atomic_store_explicit(&c->conn.hdr->state.v, IPC_STATE_CLOSED, memory_order_release);
		ipc_futex_wake(&c->conn.hdr->cq_tail.v);
		client_release(s, c);
	}
	close(s->lfd);
	close(s->epfd);
	unlink(s->path);
	free(s->gone);
	free(s->cl);
	free(s->tmp);
	free(s);
}

/* ---- clients come and go -------------------------------------------------------------------- */

static int gone_push(struct ipc_server *s, const struct ipc_item *it)
{
	if (s->n_gone == s->cap_gone) {
		uint32_t cap = s->cap_gone ? 2 * s->cap_gone : 16;
		struct ipc_item *g = realloc(s->gone, cap * sizeof *g);
		if (!g)
			return -ENOMEM;
		s->gone = g;
		s->cap_gone = cap;
	}
	s->gone[s->n_gone++] = *it;
	return 0;
}

/* Reaps a client now; the caller learns it through IPC_ITEM_GONE. */
static void client_drop(struct ipc_server *s, struct client *c, int code, const char *why)
{
	struct ipc_item it = {.type = IPC_ITEM_GONE, .client = handle_of(s, c), .uid = c->uid,
			      .gid = c->gid, .pid = c->pid, .code = code};
	if (why)
		snprintf(it.why, sizeof it.why, "%s", why);
	if (code)
		s->cnt.violations++;
	else
		s->cnt.hung_up++;
	client_release(s, c);
	if (gone_push(s, &it)) /* out of memory: report later rather than never */
		fprintf(stderr, "<3>dsv32d: ipc: cannot queue the exit of client %llu\n",
			(unsigned long long)it.client);
}

static int send_hello(int fd, const struct ipc_hello *h, int memfd, int efd)
{
	struct iovec iov = {(void *)h, sizeof *h};
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	if (memfd >= 0) {
		memset(&u, 0, sizeof u);
		m.msg_control = u.buf;
		m.msg_controllen = sizeof u.buf;
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
		int fds[2] = {memfd, efd};
		memcpy(CMSG_DATA(cm), fds, sizeof fds);
	}
	return sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof *h ? 0 : -errno;
}

static int gid_listed(const struct ipc_server *s, gid_t g)
{
	for (uint32_t i = 0; i < s->cfg.n_allow_gids; i++)
		if (s->cfg.allow_gids[i] == g)
			return 1;
	return 0;
}

/* Whether the peer on fd may connect: its uid, its primary gid, or one of its supplementary
 * groups (SO_PEERGROUPS, Linux 4.13; the groups of the process that called connect) is listed. */
static int allowed(const struct ipc_server *s, int fd, const struct ucred *cr)
{
	if (!s->cfg.n_allow_uids && !s->cfg.n_allow_gids)
		return 1;
	for (uint32_t i = 0; i < s->cfg.n_allow_uids; i++)
		if (s->cfg.allow_uids[i] == cr->uid)
			return 1;
	if (!s->cfg.n_allow_gids)
		return 0;
	if (gid_listed(s, cr->gid))
		return 1;
#ifdef SO_PEERGROUPS
	gid_t small[64], *g = small;
	socklen_t len = sizeof small;
	int r = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len);
	if (r && errno == ERANGE && len > sizeof small && (g = malloc(len)))
		r = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len);
	int ok = 0;
	for (socklen_t i = 0; !r && i < len / sizeof *g && !ok; i++)
		ok = gid_listed(s, g[i]);
	if (g != small)
		free(g);
	return ok;
#else
	(void)fd;
	return 0;
#endif
}

/* Sets up one accepted connection; on failure the socket is closed. */
static void client_accept(struct ipc_server *s, int fd)
{
	struct ucred cr;
	socklen_t cl = sizeof cr;
	struct ipc_hello h = {.magic = IPC_MAGIC, .version = IPC_VERSION, .epoch = s->epoch};
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl)) {
		close(fd);
		return;
	}
	h.uid = cr.uid;
	h.gid = cr.gid;
	struct client *c = NULL;
	for (uint32_t i = 0; i < s->cfg.max_clients && !c; i++)
		if (!s->cl[i].live)
			c = &s->cl[i];
	int let_in = allowed(s, fd, &cr);
	if (!let_in || !c) {
		h.status = !let_in ? -EACCES : DSV32_E_TOO_MANY_CLIENTS;
		send_hello(fd, &h, -1, -1);
		s->cnt.refused++;
		close(fd);
		return;
	}
	int memfd = memfd_create("dsv32-client", MFD_CLOEXEC | MFD_ALLOW_SEALING), efd = -1;
	void *base = MAP_FAILED;
	if (memfd < 0 || ftruncate(memfd, (off_t)s->lay.bytes))
		goto fail;
	base = mmap(NULL, s->lay.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (base == MAP_FAILED)
		goto fail;
	/* Sealed: the client cannot shrink the file under our mapping (SIGBUS) or grow it. */
	if (fcntl(memfd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL))
		goto fail;
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (efd < 0)
		goto fail;
	c->gen = (c->gen + 1) & 0x7fffffff; /* handle << 1 must not lose a bit (epoll data) */
	uint32_t id = (uint32_t)(c - s->cl);
	ipc_conn_format(base, &s->lay, &s->lim, s->epoch, id);
	if (ipc_conn_init(&c->conn, base, &s->lay, &s->lim, &s->tot))
		goto fail;
	h.client_id = id;
	h.region_bytes = s->lay.bytes;
	h.max_inflight = s->lim.max_inflight;
	h.max_msg_bytes = s->lim.max_msg_bytes;
	h.max_prompt_bytes = s->lim.max_prompt_bytes;
	c->sock = fd;
	c->efd = efd;
	c->uid = cr.uid;
	c->gid = cr.gid;
	c->pid = cr.pid;
	uint64_t hd = handle_of(s, c);
	struct epoll_event es = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = hd << 1};
	struct epoll_event ee = {.events = EPOLLIN, .data.u64 = hd << 1 | 1};
	if (send_hello(fd, &h, memfd, efd) || epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &es) ||
	    epoll_ctl(s->epfd, EPOLL_CTL_ADD, efd, &ee)) {
		ipc_conn_free(&c->conn);
		goto fail;
	}
	close(memfd); /* the mapping keeps the memory; the client has its own fd */
	c->live = 1;
	s->n_live++;
	s->cnt.accepted++;
	return;
fail:
	s->cnt.refused++;
	if (base != MAP_FAILED)
		munmap(base, s->lay.bytes);
	if (memfd >= 0)
		close(memfd);
	if (efd >= 0)
		close(efd);
	close(fd);
}

/* Reads what the client sent on its socket: nothing is allowed but the EOF. */
static void client_socket(struct ipc_server *s, struct client *c)
{
	char buf[64];
	ssize_t n = recv(c->sock, buf, sizeof buf, MSG_DONTWAIT);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		client_drop(s, c, 0, NULL);
	else if (n > 0)
		client_drop(s, c, DSV32_E_BAD_FRAME, "client wrote to the socket after the hello");
}

/* Handles what epoll reports, waiting up to timeout_ms. */
static int do_io(struct ipc_server *s, int timeout_ms)
{
	struct epoll_event ev[64];
	int n = epoll_wait(s->epfd, ev, 64, timeout_ms);
	s->last_io_ns = now_ns();
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	for (int i = 0; i < n; i++) {
		uint64_t d = ev[i].data.u64;
		if (d == 0) {
			for (int k = 0; k < 64; k++) {
				int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
				if (fd < 0)
					break;
				client_accept(s, fd);
			}
			continue;
		}
		struct client *c = client_of(s, d >> 1);
		if (!c)
			continue; /* reaped earlier in this batch */
		if (d & 1) {
			uint64_t v;
			if (read(c->efd, &v, sizeof v) < 0 && errno != EAGAIN)
				client_drop(s, c, 0, NULL);
		} else {
			client_socket(s, c);
		}
	}
	return 0;
}

/* ---- requests ------------------------------------------------------------------------------- */

static int drain_gone(struct ipc_server *s, struct ipc_item *items, int max)
{
	int n = 0;
	while (n < max && s->n_gone) {
		items[n++] = s->gone[0];
		memmove(s->gone, s->gone + 1, --s->n_gone * sizeof *s->gone);
	}
	return n;
}

/* Takes submissions from every client, round robin, into items. */
static int consume_all(struct ipc_server *s, struct ipc_item *items, int max)
{
	int n = 0;
	uint64_t now = now_ns();
	uint32_t nc = s->cfg.max_clients;
	for (uint32_t k = 0; k < nc && n < max; k++) {
		struct client *c = &s->cl[(s->rr + k) % nc];
		if (!c->live)
			continue;
		int want = max - n < TMP_ITEMS ? max - n : TMP_ITEMS;
		int r = ipc_conn_consume(&c->conn, s->draining, now, s->tmp, want);
		if (r == -EPROTO) {
			client_drop(s, c, DSV32_E_BAD_FRAME, c->conn.why);
			continue;
		}
		for (int i = 0; i < r; i++) {
			struct ipc_item *it = &items[n++];
			*it = (struct ipc_item){.type = s->tmp[i].type, .client = handle_of(s, c),
						.uid = c->uid, .gid = c->gid, .pid = c->pid,
						.req_id = s->tmp[i].req_id, .req = s->tmp[i].req};
			if (it->type == IPC_ITEM_GENERATE)
				s->cnt.requests++;
		}
	}
	s->rr = (s->rr + 1) % nc;
	return n;
}

static int any_ready(struct ipc_server *s)
{
	for (uint32_t i = 0; i < s->cfg.max_clients; i++)
		if (s->cl[i].live && ipc_conn_ready(&s->cl[i].conn))
			return 1;
	return 0;
}

static void set_need_wakeup(struct ipc_server *s, uint32_t v)
{
	for (uint32_t i = 0; i < s->cfg.max_clients; i++)
		if (s->cl[i].live) /* Relaxed: the seq_cst fence after the loop orders it. */
			atomic_store_explicit(&s->cl[i].conn.hdr->sq_flags.v, v, memory_order_relaxed);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

int ipc_server_poll(struct ipc_server *s, int timeout_ms, struct ipc_item *items, int max)
{
	int n = drain_gone(s, items, max), r;
	if (n == max)
		return n;
	if (timeout_ms != 0 || now_ns() - s->last_io_ns >= 1000000) {
		if ((r = do_io(s, 0)))
			return n ? n : r;
		n += drain_gone(s, items + n, max - n);
	}
	n += consume_all(s, items + n, max - n);
	if (n || timeout_ms == 0)
		return n;
	/* idle: spin a little, then sleep */
	uint64_t until = now_ns() + (uint64_t)s->cfg.spin_us * 1000;
	while (s->cfg.spin_us && now_ns() < until) {
		if (any_ready(s))
			return consume_all(s, items, max);
		for (int i = 0; i < 64; i++)
			cpu_relax();
	}
	set_need_wakeup(s, IPC_NEED_WAKEUP);
	/* Full fence (Dekker with the client's "store tail; fence; load flag"): either we see its
	 * new tail below, or it sees our flag and writes its eventfd. */
	atomic_thread_fence(memory_order_seq_cst);
	if (!any_ready(s))
		r = do_io(s, timeout_ms);
	set_need_wakeup(s, 0); /* a stale flag costs a client one needless eventfd write */
	n = drain_gone(s, items, max);
	return n + consume_all(s, items + n, max - n);
}

/* ---- events --------------------------------------------------------------------------------- */

/* Maps a conn result; a protocol violation found while emitting drops the client. */
static int emitted(struct ipc_server *s, struct client *c, int r)
{
	if (r == -EPROTO) {
		client_drop(s, c, DSV32_E_BAD_FRAME, c->conn.why);
		return -ENOTCONN;
	}
	if (r == 0)
		s->cnt.events++;
	if (r == -ENOBUFS)
		s->cnt.busy++;
	return r;
}

int ipc_server_emit_token(struct ipc_server *s, uint64_t client, uint64_t req_id,
			  const uint32_t *tokens, uint32_t n_tokens, const float *logprobs,
			  const struct dsv32_top_logprob *top, uint32_t n_top, const char *text,
			  uint32_t text_len)
{
	struct client *c = client_of(s, client);
	if (!c)
		return -ENOTCONN;
	return emitted(s, c, ipc_conn_emit_token(&c->conn, req_id, tokens, n_tokens, logprobs,
						 top, n_top, text, text_len));
}

int ipc_server_emit_done(struct ipc_server *s, uint64_t client, uint64_t req_id,
			 uint32_t reason, uint32_t prompt_tokens, uint32_t completion_tokens,
			 uint64_t queued_ns, uint64_t ttft_ns, uint64_t per_token_ns)
{
	struct client *c = client_of(s, client);
	if (!c)
		return -ENOTCONN;
	struct ipc_done_wire d = {.reason = reason, .prompt_tokens = prompt_tokens,
				  .completion_tokens = completion_tokens, .queued_ns = queued_ns,
				  .ttft_ns = ttft_ns, .per_token_ns = per_token_ns};
	return emitted(s, c, ipc_conn_emit_done(&c->conn, req_id, &d));
}

int ipc_server_emit_error(struct ipc_server *s, uint64_t client, uint64_t req_id, int code,
			  const char *fmt, ...)
{
	struct client *c = client_of(s, client);
	if (!c)
		return -ENOTCONN;
	char msg[IPC_ERROR_MSG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return emitted(s, c, ipc_conn_emit_error(&c->conn, req_id, code, msg));
}

int ipc_server_emit_stats(struct ipc_server *s, uint64_t client, uint64_t req_id,
			  const char *text, size_t len)
{
	struct client *c = client_of(s, client);
	if (!c)
		return -ENOTCONN;
	if (len > UINT32_MAX / 2)
		return -EMSGSIZE;
	return emitted(s, c, ipc_conn_emit_stats(&c->conn, req_id, text, (uint32_t)len));
}

int ipc_server_disconnect(struct ipc_server *s, uint64_t client, int code, const char *msg)
{
	struct client *c = client_of(s, client);
	if (!c)
		return -ENOTCONN;
	ipc_conn_emit_error(&c->conn, 0, code, msg);
	client_drop(s, c, code, msg);
	return 0;
}

void ipc_server_set_draining(struct ipc_server *s, int on) { s->draining = !!on; }

void ipc_server_counters(const struct ipc_server *s, struct ipc_server_counters *c)
{
	*c = s->cnt;
	c->clients = s->n_live;
	c->inflight = s->tot.inflight;
	for (uint32_t i = 0; i < s->cfg.max_clients; i++)
		if (s->cl[i].live)
			c->rejected += s->cl[i].conn.n_rejected;
}

int ipc_server_format_stats(const struct ipc_server *s, char *buf, size_t cap)
{
	struct ipc_server_counters c;
	ipc_server_counters(s, &c);
	return snprintf(buf, cap,
			"ipc_clients %u\nipc_inflight %u\nipc_accepted %llu\nipc_refused %llu\n"
			"ipc_hung_up %llu\nipc_violations %llu\nipc_requests %llu\n"
			"ipc_events %llu\nipc_busy %llu\nipc_draining %d\n",
			c.clients, c.inflight, (unsigned long long)c.accepted,
			(unsigned long long)c.refused, (unsigned long long)c.hung_up,
			(unsigned long long)c.violations, (unsigned long long)c.requests,
			(unsigned long long)c.events, (unsigned long long)c.busy, s->draining);
}

uint64_t ipc_server_epoch(const struct ipc_server *s) { return s->epoch; }
