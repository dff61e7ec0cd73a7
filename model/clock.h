/*
 * clock.h — the monotonic wall clock the engine and the daemon time things with (request
 * submission, admission, first token; load and upload durations). One definition, so times taken
 * in different files compare.
 */
#pragma once

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t clock_mono_ms(void) { return clock_mono_ns() / 1000000; }

static inline double clock_mono_s(void) { return (double)clock_mono_ns() * 1e-9; }
