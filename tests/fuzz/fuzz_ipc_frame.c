/*
 * fuzz_ipc_frame.c — libFuzzer target for the server side of one client's shared region.
 *
 * The input is decoded twice: (1) as one GENERATE record and one event payload handed to the
 * frame decoders, and (2) as a script of what a hostile client and the engine do to a region:
 * arbitrary writes to the submission ring, the data area, the client's indices and the header,
 * interleaved with the server consuming submissions and emitting events. The region is a heap
 * block of exactly its size, so ASan catches any read outside it. No crash, no leak, no
 * out-of-bounds access is the property; the reservation invariant (a terminal event always
 * fits) is checked with __builtin_trap.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/conn.h"

struct script {
	const uint8_t *p;
	size_t n;
};

static int next(struct script *s, uint32_t *v, size_t bytes)
{
	if (s->n < bytes)
		return 0;
	*v = 0;
	memcpy(v, s->p, bytes);
	s->p += bytes;
	s->n -= bytes;
	return 1;
}

static void decode_direct(const uint8_t *data, size_t size)
{
	if (size > 1 << 16)
		return;
	uint64_t *buf = malloc(size + 16);
	memcpy(buf, data, size);
	struct ipc_request *r = NULL;
	char msg[IPC_ERROR_MSG_MAX];
	if (ipc_frame_decode_generate(buf, (uint32_t)size, 1, 1 << 12, &r, msg, sizeof msg) == 0) {
		/* touch every decoded field so ASan sees any bad pointer */
		volatile uint32_t sink = 0;
		for (uint32_t i = 0; i < r->n_tokens; i++)
			sink += r->tokens[i];
		for (uint32_t i = 0; i < r->n_stop; i++)
			sink += (uint32_t)strlen(r->stop[i]) + r->stop_len[i];
		for (uint32_t i = 0; i < r->n_stop_tokens; i++)
			sink += r->stop_tokens[i];
		if (r->text)
			sink += (uint32_t)strlen(r->text);
		(void)sink;
		ipc_request_free(r);
	}
	if (size >= sizeof(struct ipc_cqe)) {
		struct ipc_cqe e;
		memcpy(&e, data, sizeof e);
		uint32_t len = (uint32_t)(size - sizeof e);
		struct dsv32_event ev;
		memmove(buf, data + sizeof e, len);
		if (ipc_frame_decode_event(&e, (char *)buf, len, &ev) == 0 && ev.type == DSV32_EVENT_TOKEN) {
			volatile uint32_t sink = 0;
			for (uint32_t i = 0; i < ev.token.n_tokens; i++)
				sink += ev.token.tokens[i];
			sink += (uint32_t)strlen(ev.token.text);
			(void)sink;
		}
	}
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	decode_direct(data, size);

	struct ipc_layout lay;
	if (ipc_layout_compute(&lay, 8, 16, 4096, 4096))
		__builtin_trap();
	struct ipc_conn_limits lim = {.max_msg_bytes = 2048, .max_prompt_bytes = 1024, .max_inflight = 4};
	struct ipc_totals tot = {.max_inflight = 6};
	uint8_t *m = calloc(1, lay.bytes);
	struct ipc_header *h = (struct ipc_header *)m;
	ipc_conn_format(m, &lay, &lim, 1, 0);
	struct ipc_conn c;
	if (ipc_conn_init(&c, m, &lay, &lim, &tot))
		__builtin_trap();
	uint64_t ids[64];
	int n_ids = 0;
	struct script s = {data, size};
	uint32_t op, a, b;
	while (next(&s, &op, 1)) {
		switch (op % 12) {
		case 0: /* bytes into the submission ring */
			if (!next(&s, &a, 1) || !next(&s, &b, 1))
				break;
			a %= lay.sq_entries * sizeof(struct ipc_sqe);
			b = b % 33;
			if (b > s.n)
				b = (uint32_t)s.n;
			if (a + b > lay.sq_entries * sizeof(struct ipc_sqe))
				b = lay.sq_entries * (uint32_t)sizeof(struct ipc_sqe) - a;
			memcpy(m + lay.sq_off + a, s.p, b);
			s.p += b, s.n -= b;
			break;
		case 1: /* bytes into the data area */
			if (!next(&s, &a, 2) || !next(&s, &b, 1))
				break;
			a %= lay.sq_data_bytes;
			if (b > s.n)
				b = (uint32_t)s.n;
			if (a + b > lay.sq_data_bytes)
				b = lay.sq_data_bytes - a;
			memcpy(m + lay.sq_data_off + a, s.p, b);
			s.p += b, s.n -= b;
			break;
		case 2: /* the client bumps its tail */
			if (next(&s, &a, 1))
				atomic_store(&h->sq_tail.v, atomic_load(&h->sq_tail.v) + (a % 11) - 1);
			break;
		case 3: /* any tail or cq head */
			if (next(&s, &a, 4) && next(&s, &b, 1))
				atomic_store(b & 1 ? &h->cq_head.v : &h->sq_tail.v, a);
			break;
		case 4: /* the client consumes events */
			if (next(&s, &a, 1))
				atomic_store(&h->cq_head.v, atomic_load(&h->cq_tail.v) - (a % 4));
			break;
		case 5: /* header scribbles */
			if (next(&s, &a, 1) && next(&s, &b, 1))
				m[a % 128] = (uint8_t)b;
			break;
		case 6: { /* the server takes submissions */
			struct ipc_conn_item it[8];
			int n = ipc_conn_consume(&c, op & 0x80, 5, it, 1 + (int)(op >> 4) % 8);
			for (int i = 0; i < n; i++) {
				if (it[i].req)
					ipc_request_free(it[i].req);
				if (it[i].type != IPC_CONN_CANCEL && n_ids < 64)
					ids[n_ids++] = it[i].req_id;
			}
			break;
		}
		case 7: { /* tokens */
			if (!n_ids || !next(&s, &a, 1))
				break;
			uint32_t toks[4] = {1, 2, 3, 4};
			float lp[4] = {0};
			struct dsv32_top_logprob top[16] = {{0, 0}};
			ipc_conn_emit_token(&c, ids[a % n_ids], toks, 1 + a % 4, a & 8 ? lp : NULL,
					    a & 16 ? top : NULL, (a >> 5) % 5, "abcdefgh", a % 9);
			break;
		}
		case 8: /* done */
			if (n_ids && next(&s, &a, 1)) {
				struct ipc_done_wire d = {.reason = 1};
				int r = ipc_conn_emit_done(&c, ids[a % n_ids], &d);
				if (r == -ENOBUFS) /* the reservation must always hold */
					__builtin_trap();
			}
			break;
		case 9: /* errors */
			if (next(&s, &a, 1)) {
				int r = ipc_conn_emit_error(&c, n_ids && a ? ids[a % n_ids] : 0, 4,
							    "a long message about what went wrong, long enough to matter");
				if (r == -ENOBUFS && a && n_ids)
					__builtin_trap();
			}
			break;
		case 10: /* stats */
			if (n_ids && next(&s, &a, 2)) {
				static char blob[4096];
				ipc_conn_emit_stats(&c, ids[a % n_ids], blob, a % sizeof blob);
			}
			break;
		case 11: /* readiness probe */
			ipc_conn_ready(&c);
			break;
		}
	}
	ipc_conn_free(&c);
	if (tot.inflight != 0)
		__builtin_trap();
	free(m);
	return 0;
}
