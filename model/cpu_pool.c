/*
 * cpu_pool.c — worker threads for cpu_pool_run (see cpu_pool.h).
 *
 * One job at a time: the caller publishes (fn, ctx, n, chunk) and bumps a generation counter
 * under the mutex, every worker takes the range of its index, the caller does range 0, and
 * the caller waits until every worker has reported. The mutex orders the job fields before
 * the workers read them and the workers' results before the caller returns.
 */
#include "model/cpu_pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "model/err.h"

struct cpu_pool {
	int n_threads;            /* including the caller */
	pthread_t *threads;       /* [n_threads - 1] */
	pthread_mutex_t mu;
	pthread_cond_t wake, done;
	uint64_t generation;      /* bumped once per job */
	int pending;              /* workers still running the current job */
	int stopping;
	cpu_pool_fn fn;
	void *ctx;
	int64_t n, chunk;         /* items and items per range */
};

struct worker_arg {
	struct cpu_pool *p;
	int index; /* 1 .. n_threads-1 */
};

static void run_range(struct cpu_pool *p, int index)
{
	int64_t b = (int64_t)index * p->chunk, e = b + p->chunk;
	if (e > p->n)
		e = p->n;
	if (b < e)
		p->fn(p->ctx, b, e);
}

static void *worker_main(void *a)
{
	struct worker_arg *wa = a;
	struct cpu_pool *p = wa->p;
	uint64_t seen = 0;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (p->generation == seen && !p->stopping)
			pthread_cond_wait(&p->wake, &p->mu);
		if (p->stopping)
			break;
		seen = p->generation;
		pthread_mutex_unlock(&p->mu);
		run_range(p, wa->index);
		pthread_mutex_lock(&p->mu);
		if (--p->pending == 0)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	free(wa);
	return NULL;
}

struct cpu_pool *cpu_pool_start(int n_threads)
{
	ASSERT(n_threads >= 1);
	struct cpu_pool *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->n_threads = n_threads;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	p->threads = calloc((size_t)n_threads, sizeof *p->threads);
	if (!p->threads) {
		free(p);
		return NULL;
	}
	for (int i = 1; i < n_threads; i++) {
		struct worker_arg *wa = malloc(sizeof *wa);
		if (wa) {
			wa->p = p;
			wa->index = i;
		}
		if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa)) {
			free(wa);
			p->n_threads = i; /* stop the ones already running */
			cpu_pool_stop(p);
			return NULL;
		}
	}
	return p;
}

void cpu_pool_stop(struct cpu_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stopping = 1;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i < p->n_threads; i++)
		pthread_join(p->threads[i - 1], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->wake);
	pthread_cond_destroy(&p->done);
	free(p->threads);
	free(p);
}

int cpu_pool_threads(const struct cpu_pool *p) { return p ? p->n_threads : 1; }

void cpu_pool_run(struct cpu_pool *p, cpu_pool_fn fn, void *ctx, int64_t n, int64_t min_chunk)
{
	if (n <= 0)
		return;
	if (min_chunk < 1)
		min_chunk = 1;
	int64_t parts = p ? p->n_threads : 1;
	if (parts > n / min_chunk)
		parts = n / min_chunk;
	if (parts <= 1) {
		fn(ctx, 0, n);
		return;
	}
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->ctx = ctx;
	p->n = n;
	p->chunk = (n + parts - 1) / parts;
	p->pending = p->n_threads - 1;
	p->generation++;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	run_range(p, 0);
	pthread_mutex_lock(&p->mu);
	while (p->pending > 0)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
}
