/*
 * cpu_pool.h — a small fixed pool of worker threads for the CPU backend's parallel loops.
 *
 * Owns: the threads and the one primitive the backend needs: run fn over [0, n) split into
 * contiguous ranges, one per thread, and wait. Must not: split a reduction. Callers hand it
 * loops over independent outputs only (columns of a matmul, heads, key positions), so a value
 * is computed by exactly one thread in a fixed order and the result does not depend on the
 * number of threads or on what else is in the batch (batch invariance, issue 3).
 */
#ifndef DSV32_CPU_POOL_H
#define DSV32_CPU_POOL_H

#include <stdint.h>

struct cpu_pool;

/* fn computes items [begin, end) of a loop; ctx is the caller's argument block. */
typedef void (*cpu_pool_fn)(void *ctx, int64_t begin, int64_t end);

/* n_threads >= 1 (1 = no worker threads: cpu_pool_run calls fn inline). NULL on failure. */
struct cpu_pool *cpu_pool_start(int n_threads);
void cpu_pool_stop(struct cpu_pool *p);
int cpu_pool_threads(const struct cpu_pool *p);

/* Runs fn over [0, n) and returns when every range is done. p may be NULL (inline). One caller
 * at a time per pool, and fn must not call cpu_pool_run on the same pool (no nesting).
 * Ranges smaller than min_chunk items are not split further (threads cost a wake-up). */
void cpu_pool_run(struct cpu_pool *p, cpu_pool_fn fn, void *ctx, int64_t n, int64_t min_chunk);

#endif
