/*
 * bench_sort.h — the qsort comparators the benchmarks take their medians and percentiles with.
 */
#ifndef DSV32_BENCH_SORT_H
#define DSV32_BENCH_SORT_H

#include <stdint.h>

static inline int bench_cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

static inline int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static inline int bench_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

#endif
