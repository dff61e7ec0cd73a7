/*
 * sched_trace.h — the events of a scheduler run, kept for tests that check or compare runs
 * (tests/test_sched_cpu.c, tests/gpu/test_gpu_draw.c): the scheduler stepped until it has no
 * work, every event kept in order (no error event allowed; text pointers cleared: they die with
 * the step), then, to compare runs whose batches interleave requests differently, sorted by
 * request and position.
 */
#ifndef DSV32_TESTS_SCHED_TRACE_H
#define DSV32_TESTS_SCHED_TRACE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sched.h"
#include "tests/test.h"

#define SCHED_TRACE_MAX 4096

struct sched_trace {
	struct sched_event ev[SCHED_TRACE_MAX];
	int64_t n;
};

static inline void sched_trace_run(struct sched *s, struct sched_trace *t)
{
	t->n = 0;
	for (int guard = 0; sched_has_work(s); guard++) {
		REQUIRE(guard < 100000);
		const struct sched_event *ev;
		int64_t n;
		REQUIRE(sched_step(s, &ev, &n) == 0);
		for (int64_t i = 0; i < n; i++) {
			CHECK(ev[i].type != SCHED_EVENT_ERROR);
			REQUIRE(t->n < SCHED_TRACE_MAX);
			t->ev[t->n] = ev[i];
			t->ev[t->n++].text = NULL;
		}
	}
}

static inline int sched_trace_order(const void *x, const void *y)
{
	const struct sched_event *a = x, *b = y;
	if (a->id != b->id)
		return (a->id > b->id) - (a->id < b->id);
	if (a->type != b->type) /* a request's tokens before its finish */
		return a->type == SCHED_EVENT_TOKEN ? -1 : 1;
	return (a->seq > b->seq) - (a->seq < b->seq);
}

static inline void sched_trace_sort(struct sched_trace *t)
{
	qsort(t->ev, (size_t)t->n, sizeof t->ev[0], sched_trace_order);
}

/* Compares the token events of two sorted traces, those of request `skip` in b left out: the
 * count of events that differ in request, position, token or alternatives (ids), plus one if
 * the counts differ; *worst = the largest difference of a logprob (chosen or alternative). */
static inline int64_t sched_trace_diff(const struct sched_trace *a, const struct sched_trace *b,
				       uint64_t skip, double *worst)
{
	int64_t bad = 0, j = 0;
	*worst = 0;
	for (int64_t i = 0; i < a->n; i++) {
		const struct sched_event *x = &a->ev[i];
		if (x->type != SCHED_EVENT_TOKEN)
			continue;
		while (j < b->n && (b->ev[j].type != SCHED_EVENT_TOKEN || b->ev[j].id == skip))
			j++;
		if (j == b->n)
			return bad + 1;
		const struct sched_event *y = &b->ev[j++];
		bad += x->id != y->id || x->seq != y->seq || x->token != y->token ||
		       x->n_top != y->n_top ||
		       memcmp(x->top_ids, y->top_ids, (size_t)x->n_top * sizeof x->top_ids[0]);
		double d = fabs((double)x->logprob - y->logprob);
		for (int k = 0; k < x->n_top && k < y->n_top; k++)
			d = fmax(d, fabs((double)x->top_logprobs[k] - y->top_logprobs[k]));
		*worst = fmax(*worst, d);
	}
	while (j < b->n && (b->ev[j].type != SCHED_EVENT_TOKEN || b->ev[j].id == skip))
		j++;
	return bad + (j != b->n);
}

#endif
