/* test_ipc_conn.c — the server's view of one region, driven in-process: requests in, events
 * out, completion-room reservations, and structured corruption by a hostile client. */
#include <errno.h>
#include <stdlib.h>

#include "ipc/conn.h"
#include "tests/test.h"

struct fake {
	struct ipc_layout lay;
	struct ipc_conn_limits lim;
	struct ipc_totals tot;
	uint8_t *mem;
	struct ipc_header *h;
	struct ipc_conn c;
	uint32_t tail, data; /* the simulated client's private sq tail and data position */
	uint32_t cq_head;
};

static void fake_open(struct fake *f, uint32_t cq_entries, uint32_t max_inflight)
{
	memset(f, 0, sizeof *f);
	REQUIRE(ipc_layout_compute(&f->lay, 8, cq_entries, 4096, 16384) == 0);
	f->lim = (struct ipc_conn_limits){.max_msg_bytes = 2048, .max_prompt_bytes = 1024,
					  .max_inflight = max_inflight};
	f->tot.max_inflight = 100;
	f->mem = aligned_alloc(4096, f->lay.bytes);
	memset(f->mem, 0, f->lay.bytes);
	f->h = (struct ipc_header *)f->mem;
	ipc_conn_format(f->mem, &f->lay, &f->lim, 77, 0);
	REQUIRE(ipc_conn_init(&f->c, f->mem, &f->lay, &f->lim, &f->tot) == 0);
}

static void fake_close(struct fake *f)
{
	ipc_conn_free(&f->c);
	CHECK_EQ_INT(f->tot.inflight, 0);
	free(f->mem);
}

/* Writes one sqe (and record) as a well-behaved client would, publishing the tail. */
static void push(struct fake *f, uint8_t op, uint64_t id, const void *rec, uint32_t len)
{
	struct ipc_sqe *e = (struct ipc_sqe *)(f->mem + f->lay.sq_off) + (f->tail & 7);
	memset(e, 0, sizeof *e);
	e->opcode = op;
	e->req_id = id;
	if (len) {
		uint32_t off = f->data % f->lay.sq_data_bytes;
		if (off + len > f->lay.sq_data_bytes)
			off = 0;
		memcpy(f->mem + f->lay.sq_data_off + off, rec, len);
		e->data_off = off;
		e->data_len = len;
		f->data = off + ipc_align(len, 8);
	}
	atomic_store(&f->h->sq_tail.v, ++f->tail);
}

static void push_gen(struct fake *f, uint64_t id, uint32_t max_tokens)
{
	static const uint32_t toks[] = {5, 6, 7};
	struct dsv32_generate_params p;
	dsv32_generate_params_init(&p, id);
	p.input = DSV32_INPUT_TOKENS;
	p.tokens = toks;
	p.n_tokens = 3;
	p.max_tokens = max_tokens;
	uint64_t buf[64];
	size_t n = ipc_frame_generate_size(&p);
	REQUIRE(n <= sizeof buf);
	ipc_frame_encode_generate(buf, &p);
	push(f, IPC_OP_GENERATE, id, buf, (uint32_t)n);
}

/* Pops one event as the client would; returns its type or 0. */
static int pop(struct fake *f, struct dsv32_event *ev, char *payload)
{
	uint32_t tail = atomic_load(&f->h->cq_tail.v);
	if (tail == f->cq_head)
		return 0;
	struct ipc_cqe e = ((struct ipc_cqe *)(f->mem + f->lay.cq_off))[f->cq_head % f->lay.cq_entries];
	REQUIRE((uint64_t)e.data_off + e.data_len <= f->lay.cq_data_bytes);
	memcpy(payload, f->mem + f->lay.cq_data_off + e.data_off, e.data_len);
	atomic_store(&f->h->cq_head.v, ++f->cq_head);
	REQUIRE(ipc_frame_decode_event(&e, payload, e.data_len, ev) == 0);
	return ev->type;
}

static int consume(struct fake *f, struct ipc_conn_item *items, int max)
{
	int n = ipc_conn_consume(&f->c, 0, 1, items, max);
	for (int i = 0; i < n; i++)
		if (items[i].req)
			ipc_request_free(items[i].req);
	return n;
}

TEST(ipc_conn, requests_in_events_out)
{
	struct fake f;
	fake_open(&f, 16, 4);
	struct ipc_conn_item it[8];
	push_gen(&f, 1, 3);
	push(&f, IPC_OP_STATS, 2, NULL, 0);
	push(&f, IPC_OP_CANCEL, 1, NULL, 0);
	push(&f, IPC_OP_CANCEL, 99, NULL, 0); /* unknown: ignored */
	int n = ipc_conn_consume(&f.c, 0, 1, it, 8);
	REQUIRE(n == 3);
	CHECK(it[0].type == IPC_CONN_GENERATE && it[0].req_id == 1 && it[0].req->n_tokens == 3);
	CHECK(it[1].type == IPC_CONN_STATS && it[2].type == IPC_CONN_CANCEL);
	ipc_request_free(it[0].req);
	CHECK_EQ_INT(atomic_load(&f.h->sq_head.v), 4);
	CHECK_EQ_INT(f.tot.inflight, 2);
	const uint32_t t = 42;
	CHECK_EQ_INT(ipc_conn_emit_token(&f.c, 1, &t, 1, NULL, NULL, 0, "x", 1), 0);
	CHECK_EQ_INT(ipc_conn_emit_token(&f.c, 1, &t, 1, NULL, NULL, 0, "y", 1), 0);
	/* a text-only piece (held-back bytes flushed at the end): no token ids, NULL pointer */
	CHECK_EQ_INT(ipc_conn_emit_token(&f.c, 1, NULL, 0, NULL, NULL, 0, "z", 1), 0);
	struct ipc_done_wire d = {.reason = DSV32_FINISH_CANCELLED, .completion_tokens = 2};
	CHECK_EQ_INT(ipc_conn_emit_done(&f.c, 1, &d), 0);
	CHECK_EQ_INT(ipc_conn_emit_done(&f.c, 1, &d), -ENOENT); /* exactly one terminal */
	CHECK_EQ_INT(ipc_conn_emit_stats(&f.c, 2, "a 1\n", 4), 0);
	CHECK_EQ_INT(f.tot.inflight, 0);
	struct dsv32_event ev;
	char pl[4096];
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_TOKEN && ev.token.seq == 0 && ev.token.tokens[0] == 42);
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_TOKEN && ev.token.seq == 1);
	CHECK_EQ_STR(ev.token.text, "y");
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_TOKEN && ev.token.seq == 2 && ev.token.n_tokens == 0);
	CHECK_EQ_STR(ev.token.text, "z");
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_DONE && ev.done.reason == DSV32_FINISH_CANCELLED);
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_STATS);
	CHECK_EQ_STR(ev.stats.text, "a 1\n");
	CHECK(pop(&f, &ev, pl) == 0);
	fake_close(&f);
}

TEST(ipc_conn, limits_give_typed_errors_and_keep_the_client)
{
	struct fake f;
	fake_open(&f, 16, 2);
	struct ipc_conn_item it[8];
	push_gen(&f, 1, 3);
	push_gen(&f, 2, 3);
	push_gen(&f, 3, 3); /* over max_inflight */
	push_gen(&f, 4, 0); /* bad parameter */
	CHECK_EQ_INT(consume(&f, it, 8), 2);
	CHECK(!f.c.violated);
	struct dsv32_event ev;
	char pl[4096];
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_ERROR && ev.request_id == 3 &&
	      ev.error.code == DSV32_E_QUEUE_FULL);
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_ERROR && ev.request_id == 4 &&
	      ev.error.code == DSV32_E_BAD_PARAM);
	CHECK_CONTAINS(ev.error.message, "max_tokens");
	/* draining */
	ipc_conn_emit_error(&f.c, 1, DSV32_E_BAD_TOKEN, "token 5 >= vocab");
	pop(&f, &ev, pl);
	CHECK(ev.error.code == DSV32_E_BAD_TOKEN && ev.request_id == 1);
	push_gen(&f, 5, 3);
	CHECK_EQ_INT(ipc_conn_consume(&f.c, 1, 1, it, 8), 0);
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_ERROR && ev.error.code == DSV32_E_DRAINING);
	/* record larger than max_msg_bytes but inside the data area: typed, stays connected */
	uint8_t big[3000] = {0};
	push(&f, IPC_OP_GENERATE, 6, big, sizeof big);
	CHECK_EQ_INT(consume(&f, it, 8), 0);
	CHECK(pop(&f, &ev, pl) == DSV32_EVENT_ERROR && ev.error.code == DSV32_E_TOO_LARGE);
	CHECK(!f.c.violated);
	ipc_conn_emit_error(&f.c, 2, DSV32_E_ENGINE_FAULT, "x");
	fake_close(&f);
}

TEST(ipc_conn, full_completion_ring_means_busy_never_waiting)
{
	struct fake f;
	fake_open(&f, 8, 2); /* 8 cqes: 2 in flight + 1 connection error reserved */
	struct ipc_conn_item it[8];
	push_gen(&f, 1, 1000);
	push_gen(&f, 2, 1000);
	REQUIRE(consume(&f, it, 8) == 2);
	const uint32_t t = 1;
	int sent = 0, r;
	while ((r = ipc_conn_emit_token(&f.c, 1, &t, 1, NULL, NULL, 0, "a", 1)) == 0)
		sent++;
	CHECK_EQ_INT(r, -ENOBUFS); /* the client does not drain: request 1 ends with busy */
	CHECK_EQ_INT(sent, 8 - 3);
	CHECK_EQ_INT(ipc_conn_emit_token(&f.c, 1, &t, 1, NULL, NULL, 0, "a", 1), -ENOENT);
	/* request 2 still has its terminal reserved */
	struct ipc_done_wire d = {.reason = DSV32_FINISH_LENGTH};
	CHECK_EQ_INT(ipc_conn_emit_done(&f.c, 2, &d), 0);
	struct dsv32_event ev;
	char pl[4096];
	int n_tok = 0, busy = 0, done = 0;
	while (pop(&f, &ev, pl)) {
		n_tok += ev.type == DSV32_EVENT_TOKEN;
		busy += ev.type == DSV32_EVENT_ERROR && ev.error.code == DSV32_E_BUSY && ev.request_id == 1;
		done += ev.type == DSV32_EVENT_DONE && ev.request_id == 2;
	}
	CHECK(n_tok == sent && busy == 1 && done == 1);
	/* submissions wait (not consumed) while the client has no room for their answers */
	fake_close(&f);
}

static void expect_violation(struct fake *f, const char *needle)
{
	struct ipc_conn_item it[8];
	int n = ipc_conn_consume(&f->c, 0, 1, it, 8);
	for (int i = 0; i < n; i++)
		if (it[i].req)
			ipc_request_free(it[i].req);
	if (n != -EPROTO)
		n = ipc_conn_consume(&f->c, 0, 1, it, 8);
	CHECK_EQ_INT(n, -EPROTO);
	CHECK(f->c.violated);
	CHECK_CONTAINS(f->c.why, needle);
	/* the client was told, with a bad_frame error about the connection */
	struct dsv32_event ev;
	char pl[4096];
	int got = 0;
	while (pop(f, &ev, pl))
		got |= ev.type == DSV32_EVENT_ERROR && ev.request_id == 0 &&
		       ev.error.code == DSV32_E_BAD_FRAME;
	CHECK(got);
}

TEST(ipc_conn, structured_corruption_is_a_violation)
{
	struct fake f;
	/* tail past the ring */
	fake_open(&f, 16, 4);
	atomic_store(&f.h->sq_tail.v, 9);
	expect_violation(&f, "entries past head");
	fake_close(&f);
	/* record outside the data area */
	fake_open(&f, 16, 4);
	push_gen(&f, 1, 3);
	struct ipc_sqe *e = (struct ipc_sqe *)(f.mem + f.lay.sq_off);
	e->data_off = 4000;
	e->data_len = 200;
	expect_violation(&f, "outside");
	fake_close(&f);
	/* a tail that moves backwards (seen 4, server consumed 1, then 2) */
	fake_open(&f, 16, 4);
	for (int i = 1; i <= 4; i++)
		push_gen(&f, (uint64_t)i, 3);
	struct ipc_conn_item it[1];
	REQUIRE(consume(&f, it, 1) == 1);
	atomic_store(&f.h->sq_tail.v, 2);
	expect_violation(&f, "backwards");
	fake_close(&f);
	/* magic overwritten */
	fake_open(&f, 16, 4);
	f.h->magic = 0;
	expect_violation(&f, "magic");
	fake_close(&f);
	/* unknown opcode, reserved bits, request id 0, duplicate id, malformed record */
	fake_open(&f, 16, 4);
	push(&f, 9, 1, NULL, 0);
	expect_violation(&f, "opcode");
	fake_close(&f);
	fake_open(&f, 16, 4);
	push(&f, IPC_OP_STATS, 1, NULL, 0);
	((struct ipc_sqe *)(f.mem + f.lay.sq_off))->rsv3 = 1;
	expect_violation(&f, "reserved");
	fake_close(&f);
	fake_open(&f, 16, 4);
	push(&f, IPC_OP_STATS, 0, NULL, 0);
	expect_violation(&f, "id 0");
	fake_close(&f);
	fake_open(&f, 16, 4);
	push_gen(&f, 3, 3);
	push_gen(&f, 3, 3);
	expect_violation(&f, "already in flight");
	fake_close(&f);
	fake_open(&f, 16, 4);
	uint8_t junk[100];
	memset(junk, 0xee, sizeof junk);
	push(&f, IPC_OP_GENERATE, 1, junk, sizeof junk);
	expect_violation(&f, "record");
	fake_close(&f);
	/* the client moves its cq head past our tail */
	fake_open(&f, 16, 4);
	atomic_store(&f.h->cq_head.v, 5);
	expect_violation(&f, "cq head");
	fake_close(&f);
}

TEST(ipc_conn, record_rewritten_after_copy_is_not_seen)
{
	/* The server decodes a private copy: rewriting the record after consumption changes
	 * nothing, and the request it produced stays intact. */
	struct fake f;
	fake_open(&f, 16, 4);
	push_gen(&f, 1, 3);
	struct ipc_conn_item it[2];
	REQUIRE(ipc_conn_consume(&f.c, 0, 1, it, 2) == 1);
	memset(f.mem + f.lay.sq_data_off, 0xff, 256);
	CHECK(it[0].req->n_tokens == 3 && it[0].req->tokens[2] == 7 && it[0].req->max_tokens == 3);
	ipc_request_free(it[0].req);
	ipc_conn_emit_error(&f.c, 1, DSV32_E_CANCELLED, "x");
	fake_close(&f);
}

TEST(ipc_conn, violation_mid_batch_frees_what_was_decoded)
{
	/* regression (fuzz_ipc_frame): requests decoded earlier in the same consume call leaked
	 * when a later entry broke the protocol */
	struct fake f;
	fake_open(&f, 16, 4);
	push_gen(&f, 1, 3);
	push_gen(&f, 2, 3);
	push(&f, 9, 3, NULL, 0);
	struct ipc_conn_item it[8];
	CHECK_EQ_INT(ipc_conn_consume(&f.c, 0, 1, it, 8), -EPROTO);
	fake_close(&f); /* the flights of 1 and 2 go with the conn; ASan checks the requests */
}
