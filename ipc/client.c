/*
 * client.c — the client library (ipc/dsv32.h): handshake, submission producer, completion
 * consumer, futex sleep, and the synthesis of server_lost errors.
 *
 * Owns: a dsv32_t handle: its socket (liveness), eventfd (wakes the server), the mapping of its
 * region, the private copies of the indices it owns, and the ids of its in-flight requests
 * (so that when the server goes away every one of them still ends with exactly one terminal
 * event, synthesised here; nothing is re-submitted).
 * Must not: link anything from model/, block in submit or poll, or hand the caller pointers
 * into shared memory (events are copied into the handle first).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ipc/client_int.h"
#include "ipc/dsv32.h"
#include "ipc/frame.h"
#include "ipc/futex.h"
#include "ipc/proto.h"
#include "ipc/ring.h"

#define CONNECT_TIMEOUT_MS 10000
#define LIVENESS_CHECK_NS 1000000ull /* poll looks at the socket at most once per ms */
#define SLEEP_SLICE_MS 100            /* wait re-checks liveness this often while asleep */

struct dsv32 {
	int sock, efd;
	uint8_t *base;
	size_t bytes;
	struct ipc_header *hdr;
	struct ipc_sqe *sqes;
	struct ipc_cqe *cqes;
	uint8_t *sq_data, *cq_data;
	uint32_t sq_entries, cq_entries, sq_data_bytes, cq_data_bytes;
	uint32_t max_msg, max_inflight;
	uint64_t epoch;
	/* submission side (we produce) */
	uint32_t sq_tail, sq_head_seen;
	struct ring_data sq_dat;
	uint32_t *sq_data_end; /* [sq_entries]: sq_dat.tail after each record */
	/* completion side (we consume) */
	uint32_t cq_head;
	uint32_t cq_data_next; /* where the server's next payload probably starts (prefetch hint) */
	char *evbuf; /* copy of the current event's payload */
	size_t evcap;
	/* requests waiting for their terminal event */
	uint64_t *inflight;
	uint32_t n_inflight, cap_inflight;
	/* connection loss */
	int lost;
	int lost_code;
	char lost_msg[IPC_ERROR_MSG_MAX];
	uint64_t last_check_ns;
	unsigned spin_us;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *const finish_names[DSV32_FINISH_COUNT] = {
	[DSV32_FINISH_STOP] = "stop",
	[DSV32_FINISH_LENGTH] = "length",
	[DSV32_FINISH_EOS] = "eos",
	[DSV32_FINISH_CANCELLED] = "cancelled",
	[DSV32_FINISH_CONTEXT_LIMIT] = "context_limit",
};

const char *dsv32_finish_name(int reason)
{
	return reason > 0 && reason < DSV32_FINISH_COUNT ? finish_names[reason] : "unknown";
}

void dsv32_generate_params_init(struct dsv32_generate_params *p, uint64_t request_id)
{
	*p = (struct dsv32_generate_params){.request_id = request_id,
					    .input = DSV32_INPUT_TEXT,
					    .top_p = 1.0f,
					    .repetition_penalty = 1.0f,
					    .max_tokens = 256};
}

/* ---- connect / close ------------------------------------------------------------------------ */

/* Receives the hello and its fds. */
static int recv_hello(int fd, struct ipc_hello *h, int fds[2])
{
	struct pollfd pfd = {fd, POLLIN, 0};
	int r = poll(&pfd, 1, CONNECT_TIMEOUT_MS);
	if (r == 0)
		return -ETIMEDOUT;
	if (r < 0)
		return -errno;
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {h, sizeof *h};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			   .msg_controllen = sizeof u.buf};
	ssize_t n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0)
		return -errno;
	fds[0] = fds[1] = -1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int got[2] = {-1, -1};
			memcpy(got, CMSG_DATA(cm), (k < 2 ? k : 2) * sizeof(int));
			for (size_t i = 2; i < k; i++) { /* more than we asked for: close them */
				int extra;
				memcpy(&extra, CMSG_DATA(cm) + i * sizeof(int), sizeof extra);
				close(extra);
			}
			fds[0] = got[0];
			fds[1] = got[1];
		}
	if (n == 0)
		return -ECONNRESET;
	if (n != (ssize_t)sizeof *h || h->magic != IPC_MAGIC || (m.msg_flags & MSG_CTRUNC))
		return -EPROTO;
	if (h->version != IPC_VERSION)
		return -EPROTONOSUPPORT;
	if (h->status == DSV32_E_TOO_MANY_CLIENTS)
		return -EUSERS;
	if (h->status < 0)
		return h->status;
	if (h->status)
		return -ECONNREFUSED;
	return fds[0] >= 0 && fds[1] >= 0 ? 0 : -EPROTO;
}

/* Checks the header against the hello and the mapping's size (the server is trusted, but a
 * broken one must not make us read outside the mapping). */
static int check_region(struct dsv32 *h, const struct ipc_hello *hello)
{
	struct ipc_header *x = h->hdr;
	uint64_t b = h->bytes;
	if (x->magic != IPC_MAGIC || x->version != IPC_VERSION || x->epoch != hello->epoch ||
	    x->region_bytes != b || !ipc_is_pow2(x->sq_entries) || !ipc_is_pow2(x->cq_entries) ||
	    !ipc_is_pow2(x->sq_data_bytes) || !ipc_is_pow2(x->cq_data_bytes) ||
	    (uint64_t)x->sq_off + (uint64_t)x->sq_entries * sizeof(struct ipc_sqe) > b ||
	    (uint64_t)x->cq_off + (uint64_t)x->cq_entries * sizeof(struct ipc_cqe) > b ||
	    (uint64_t)x->sq_data_off + x->sq_data_bytes > b ||
	    (uint64_t)x->cq_data_off + x->cq_data_bytes > b || x->max_msg_bytes > x->sq_data_bytes ||
	    x->sq_off < sizeof *x || x->sq_off % 8 || x->cq_off % 8 || x->cq_data_off % 8)
		return -EPROTO;
	h->sqes = (struct ipc_sqe *)(h->base + x->sq_off);
	h->cqes = (struct ipc_cqe *)(h->base + x->cq_off);
	h->sq_data = h->base + x->sq_data_off;
	h->cq_data = h->base + x->cq_data_off;
	h->sq_entries = x->sq_entries;
	h->cq_entries = x->cq_entries;
	h->sq_data_bytes = x->sq_data_bytes;
	h->cq_data_bytes = x->cq_data_bytes;
	h->max_msg = x->max_msg_bytes;
	h->max_inflight = x->max_inflight;
	h->epoch = x->epoch;
	h->sq_dat.size = x->sq_data_bytes;
	return 0;
}

int dsv32_connect(const char *path, dsv32_t **out)
{
	*out = NULL;
	if (!path)
		path = DSV32_DEFAULT_SOCKET;
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof a.sun_path)
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	struct dsv32 *h = calloc(1, sizeof *h);
	if (!h)
		return -ENOMEM;
	h->efd = -1;
	h->base = MAP_FAILED;
	h->spin_us = 20;
	int fds[2] = {-1, -1}, r;
	h->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (h->sock < 0 || connect(h->sock, (struct sockaddr *)&a, sizeof a)) {
		r = -errno;
		goto err;
	}
	struct ipc_hello hello;
	if ((r = recv_hello(h->sock, &hello, fds)))
		goto err;
	h->efd = fds[1];
	fds[1] = -1;
	/* The memfd must be sealed against shrinking (else a truncate would SIGBUS us) and have
	 * the announced size. */
	struct stat st;
	int seals = fcntl(fds[0], F_GET_SEALS);
	r = -EPROTO;
	if (fstat(fds[0], &st) || (uint64_t)st.st_size != hello.region_bytes || seals < 0 ||
	    (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW) ||
	    hello.region_bytes < IPC_HEADER_BYTES || hello.region_bytes > (1ull << 32))
		goto err;
	h->bytes = hello.region_bytes;
	h->base = mmap(NULL, h->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (h->base == MAP_FAILED) {
		r = -errno;
		goto err;
	}
	close(fds[0]);
	fds[0] = -1;
	h->hdr = (struct ipc_header *)h->base;
	if ((r = check_region(h, &hello)))
		goto err;
	h->sq_data_end = calloc(h->sq_entries, sizeof *h->sq_data_end);
	h->evcap = h->cq_data_bytes / 4 + 16;
	h->evbuf = malloc(h->evcap);
	if (!h->sq_data_end || !h->evbuf) {
		r = -ENOMEM;
		goto err;
	}
	h->last_check_ns = now_ns();
	*out = h;
	return 0;
err:
	if (fds[0] >= 0)
		close(fds[0]);
	if (fds[1] >= 0)
		close(fds[1]);
	dsv32_close(h);
	return r;
}

void dsv32_close(dsv32_t *h)
{
	if (!h)
		return;
	if (h->base != MAP_FAILED)
		munmap(h->base, h->bytes);
	if (h->sock >= 0)
		close(h->sock);
	if (h->efd >= 0)
		close(h->efd);
	free(h->sq_data_end);
	free(h->evbuf);
	free(h->inflight);
	free(h);
}

void dsv32_set_spin(dsv32_t *h, unsigned us) { h->spin_us = us; }
uint64_t dsv32_epoch(const dsv32_t *h) { return h->epoch; }
unsigned dsv32_inflight(const dsv32_t *h) { return h->n_inflight; }

/* ---- in-flight ids -------------------------------------------------------------------------- */

static int inflight_find(const struct dsv32 *h, uint64_t id)
{
	for (uint32_t i = 0; i < h->n_inflight; i++)
		if (h->inflight[i] == id)
			return (int)i;
	return -1;
}

static int inflight_add(struct dsv32 *h, uint64_t id)
{
	if (h->n_inflight == h->cap_inflight) {
		uint32_t cap = h->cap_inflight ? 2 * h->cap_inflight : 64;
		uint64_t *v = realloc(h->inflight, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		h->inflight = v;
		h->cap_inflight = cap;
	}
	h->inflight[h->n_inflight++] = id;
	return 0;
}

static void inflight_remove(struct dsv32 *h, uint64_t id)
{
	int i = inflight_find(h, id);
	if (i >= 0) /* order does not matter: swap with the last */
		h->inflight[i] = h->inflight[--h->n_inflight];
}

/* ---- submission ----------------------------------------------------------------------------- */

static void mark_lost(struct dsv32 *h, int code, const char *msg)
{
	if (h->lost)
		return;
	h->lost = 1;
	if (!h->lost_code) {
		h->lost_code = code;
		snprintf(h->lost_msg, sizeof h->lost_msg, "%s", msg);
	}
}

/* Reads the server's sq head and releases the records behind it. */
static int sq_reclaim(struct dsv32 *h)
{
	/* Acquire: the server copied the entries and records below its head before storing it
	 * (release); only then may we overwrite them. */
	uint32_t head = atomic_load_explicit(&h->hdr->sq_head.v, memory_order_acquire);
	if (ring_check_head(head, h->sq_head_seen, h->sq_tail)) {
		mark_lost(h, DSV32_E_SERVER_LOST, "the server broke the submission ring");
		return -ENOTCONN;
	}
	if (head != h->sq_head_seen) {
		h->sq_dat.head = h->sq_data_end[ring_slot(head - 1, h->sq_entries)];
		h->sq_head_seen = head;
	}
	return 0;
}

/* Publishes one sqe (its record is in place) and wakes the server if it sleeps. */
static void sq_publish(struct dsv32 *h, uint8_t op, uint64_t id, int64_t off, uint32_t len)
{
	uint32_t slot = ring_slot(h->sq_tail, h->sq_entries);
	struct ipc_sqe e = {.opcode = op, .data_len = len, .data_off = (uint32_t)off, .req_id = id};
	memcpy(&h->sqes[slot], &e, sizeof e);
	h->sq_data_end[slot] = h->sq_dat.tail;
	h->sq_tail++;
	/* Release: the sqe and its record must be visible before the server sees the tail. */
	atomic_store_explicit(&h->hdr->sq_tail.v, h->sq_tail, memory_order_release);
	/* Full fence (Dekker with the server's "store flag; fence; load tails" before it sleeps):
	 * either the server sees our tail, or we see its NEED_WAKEUP flag. */
	atomic_thread_fence(memory_order_seq_cst);
	/* Relaxed: ordered by the fence above. */
	if (atomic_load_explicit(&h->hdr->sq_flags.v, memory_order_relaxed) & IPC_NEED_WAKEUP) {
		uint64_t one = 1;
		if (write(h->efd, &one, sizeof one) < 0) {
			/* EAGAIN: the counter is saturated, so the server is being woken anyway */
		}
	}
}

/* Room for one sqe and len record bytes; returns the record's offset or a negative errno. */
static int64_t sq_reserve(struct dsv32 *h, uint32_t len)
{
	if (h->lost)
		return -ENOTCONN;
	/* Read the server's head only when our last view of it says there is no room (as
	 * io_uring does): it is a cache line the server writes, so reading it costs a miss. */
	int64_t off = -1;
	for (int pass = 0; pass < 2; pass++) {
		if (pass) {
			int r = sq_reclaim(h);
			if (r)
				return r;
		}
		if (!ring_space(h->sq_tail, h->sq_head_seen, h->sq_entries))
			continue;
		off = ring_data_alloc(&h->sq_dat, len, IPC_DATA_ALIGN, 0);
		if (off >= 0)
			break;
	}
	return off < 0 ? -EAGAIN : off;
}

int dsv32_submit_generate(dsv32_t *h, const struct dsv32_generate_params *p)
{
	if (!h || !p || !p->request_id)
		return -EINVAL;
	if (inflight_find(h, p->request_id) >= 0)
		return -EEXIST;
	size_t len = ipc_frame_generate_size(p);
	if (!len)
		return -EINVAL;
	if (len > h->max_msg)
		return -EMSGSIZE;
	if (h->n_inflight == h->cap_inflight && inflight_add(h, 0) == 0)
		h->n_inflight--; /* grow now so that nothing can fail after publishing */
	if (h->n_inflight == h->cap_inflight)
		return -ENOMEM;
	int64_t off = sq_reserve(h, (uint32_t)len);
	if (off < 0)
		return (int)off;
	ipc_frame_encode_generate(h->sq_data + off, p);
	sq_publish(h, IPC_OP_GENERATE, p->request_id, off, (uint32_t)len);
	inflight_add(h, p->request_id);
	return 0;
}

int dsv32_cancel(dsv32_t *h, uint64_t request_id)
{
	if (!h || !request_id)
		return -EINVAL;
	if (inflight_find(h, request_id) < 0)
		return -ENOENT;
	int64_t off = sq_reserve(h, 0);
	if (off < 0)
		return (int)off;
	sq_publish(h, IPC_OP_CANCEL, request_id, 0, 0);
	return 0;
}

int dsv32_stats(dsv32_t *h, uint64_t request_id)
{
	if (!h || !request_id)
		return -EINVAL;
	if (inflight_find(h, request_id) >= 0)
		return -EEXIST;
	if (h->n_inflight == h->cap_inflight && inflight_add(h, 0) == 0)
		h->n_inflight--;
	if (h->n_inflight == h->cap_inflight)
		return -ENOMEM;
	int64_t off = sq_reserve(h, 0);
	if (off < 0)
		return (int)off;
	sq_publish(h, IPC_OP_STATS, request_id, 0, 0);
	inflight_add(h, request_id);
	return 0;
}

/* ---- completion ----------------------------------------------------------------------------- */

/* Is the server still there? Socket EOF, or the CLOSED state in the header. */
static void check_liveness(struct dsv32 *h)
{
	h->last_check_ns = now_ns();
	/* Acquire: a server that set CLOSED did so after posting its last cqes. */
	if (atomic_load_explicit(&h->hdr->state.v, memory_order_acquire) == IPC_STATE_CLOSED) {
		mark_lost(h, DSV32_E_SERVER_LOST, "the server shut down");
		return;
	}
	char c;
	ssize_t n = recv(h->sock, &c, 1, MSG_DONTWAIT | MSG_PEEK);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		mark_lost(h, DSV32_E_SERVER_LOST, "the server went away (socket closed)");
}

/* The next synthesised terminal event of a lost connection, or -ENOTCONN. */
static int synth_next(struct dsv32 *h, struct dsv32_event *ev)
{
	if (!h->n_inflight)
		return -ENOTCONN;
	uint64_t id = h->inflight[--h->n_inflight];
	memset(ev, 0, sizeof *ev);
	ev->type = DSV32_EVENT_ERROR;
	ev->request_id = id;
	ev->error.code = h->lost_code;
	snprintf(h->evbuf, h->evcap, "%s", h->lost_msg);
	ev->error.message = h->evbuf;
	return 1;
}

/* Takes one cqe off the ring into ev. */
static int take_cqe(struct dsv32 *h, struct dsv32_event *ev)
{
	struct ipc_cqe e;
	/* The server allocates payloads one after another: fetch where the next one probably is
	 * together with the entry (one cache miss less on the round trip). Only a hint. */
	uint32_t guess = h->cq_data_next & (h->cq_data_bytes - 1);
	__builtin_prefetch(h->cq_data + guess);
	if (guess + 64 < h->cq_data_bytes)
		__builtin_prefetch(h->cq_data + guess + 64);
	memcpy(&e, &h->cqes[ring_slot(h->cq_head, h->cq_entries)], sizeof e);
	int bad = ring_data_check(e.data_off, e.data_len, h->cq_data_bytes) ||
		  e.data_len + 1 > h->evcap;
	if (!bad) {
		memcpy(h->evbuf, h->cq_data + e.data_off, e.data_len);
		h->cq_data_next = e.data_off + ipc_align(e.data_len, IPC_DATA_ALIGN);
	}
	h->cq_head++;
	/* Release: our copies of the cqe and its payload are done before the server may reuse
	 * the slot and bytes. */
	atomic_store_explicit(&h->hdr->cq_head.v, h->cq_head, memory_order_release);
	if (bad || ipc_frame_decode_event(&e, h->evbuf, e.data_len, ev)) {
		mark_lost(h, DSV32_E_SERVER_LOST, "the server sent a malformed event");
		return 0;
	}
	if (e.type == IPC_EV_ERROR && e.req_id == 0) {
		/* about the connection (e.g. bad_frame before a disconnect): the requests still in
		 * flight will end with this code when the socket closes */
		h->lost_code = ev->error.code;
		snprintf(h->lost_msg, sizeof h->lost_msg, "%s", ev->error.message);
	} else if (e.type != IPC_EV_TOKEN) {
		inflight_remove(h, e.req_id);
	}
	/* The server may have left submissions waiting for completion room that we just made;
	 * if it sleeps, wake it (same Dekker pairing as in sq_publish). */
	atomic_thread_fence(memory_order_seq_cst);
	/* Relaxed (ordered by the fence). The flag first: it rarely changes, so its line stays
	 * in our cache, while sq_head's moves with every submission the server takes. */
	if ((atomic_load_explicit(&h->hdr->sq_flags.v, memory_order_relaxed) & IPC_NEED_WAKEUP) &&
	    h->sq_tail != atomic_load_explicit(&h->hdr->sq_head.v, memory_order_relaxed)) {
		uint64_t one = 1;
		if (write(h->efd, &one, sizeof one) < 0) {
			/* EAGAIN: already being woken */
		}
	}
	return 1;
}

int dsv32_poll(dsv32_t *h, struct dsv32_event *ev)
{
	for (;;) {
		/* Acquire: pairs with the server's release store of cq_tail, so the cqe and its
		 * payload are visible before we read them. */
		uint32_t tail = atomic_load_explicit(&h->hdr->cq_tail.v, memory_order_acquire);
		if (tail - h->cq_head > h->cq_entries) {
			mark_lost(h, DSV32_E_SERVER_LOST, "the server broke the completion ring");
			return synth_next(h, ev);
		}
		if (tail != h->cq_head) {
			if (take_cqe(h, ev))
				return 1;
			continue;
		}
		if (h->lost)
			return synth_next(h, ev);
		if (now_ns() - h->last_check_ns < LIVENESS_CHECK_NS)
			return 0;
		check_liveness(h);
		if (!h->lost)
			return 0;
		/* lost: drain what the server posted before it went, then synthesise */
	}
}

int dsv32_wait(dsv32_t *h, int timeout_ms, struct dsv32_event *ev)
{
	if (timeout_ms == 0)
		return dsv32_poll(h, ev);
	uint64_t t0 = now_ns();
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : t0 + (uint64_t)timeout_ms * 1000000ull;
	for (;;) {
		int r = dsv32_poll(h, ev);
		if (r)
			return r;
		/* spin: the answer is often microseconds away */
		uint64_t spin_until = now_ns() + (uint64_t)h->spin_us * 1000;
		if (spin_until > deadline)
			spin_until = deadline;
		int seen = 0;
		while (!seen && now_ns() < spin_until)
			/* Relaxed: only a hint; dsv32_poll re-reads it with acquire. */
			seen = atomic_load_explicit(&h->hdr->cq_tail.v, memory_order_relaxed) != h->cq_head;
		if (seen)
			continue;
		uint64_t now = now_ns();
		if (now >= deadline)
			return 0;
		uint64_t left_ms = (deadline - now + 999999) / 1000000;
		int slice = left_ms < SLEEP_SLICE_MS ? (int)left_ms : SLEEP_SLICE_MS;
		/* Relaxed store then a full fence (Dekker with the server's "store tail; fence;
		 * load flag"): either we see its new tail, or it sees our flag and wakes us. */
		atomic_store_explicit(&h->hdr->cq_flags.v, IPC_NEED_WAKEUP, memory_order_relaxed);
		atomic_thread_fence(memory_order_seq_cst);
		/* Relaxed loads (ordered by the fence): they only decide whether to sleep;
		 * dsv32_poll re-reads the tail with acquire. A CLOSED state set (and woken) between
		 * here and the futex call costs at most one sleep slice. */
		uint32_t tail = atomic_load_explicit(&h->hdr->cq_tail.v, memory_order_relaxed);
		if (tail == h->cq_head &&
		    atomic_load_explicit(&h->hdr->state.v, memory_order_relaxed) == IPC_STATE_RUNNING)
			ipc_futex_wait(&h->hdr->cq_tail.v, tail, slice);
		/* Relaxed: a stale flag costs the server one needless futex wake. */
		atomic_store_explicit(&h->hdr->cq_flags.v, 0, memory_order_relaxed);
		h->last_check_ns = 0; /* after a sleep, look at the socket too */
	}
}

/* ---- for tests (ipc/client_int.h) ----------------------------------------------------------- */

void *ipc_client_region(dsv32_t *h, size_t *bytes)
{
	*bytes = h->bytes;
	return h->base;
}

int ipc_client_socket(dsv32_t *h) { return h->sock; }
