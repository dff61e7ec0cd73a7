/*
 * env_knob.h — how the CUDA backend reads its diagnosis switches and knobs from the environment
 * (docs/CONFIG.md lists them): once per process, into a cache the call site keeps (< 0: not read
 * yet; a setter may fill it first), as a number. A value that does not begin with one (an
 * optional sign, then a digit) counts as unset. Host code only.
 */
#ifndef DSV32_ENV_KNOB_H
#define DSV32_ENV_KNOB_H

#include <limits.h>
#include <stdlib.h>

/* The decimal value of environment variable `name`, or dflt when it is unset or not a number. */
static inline int env_int(const char *name, int dflt)
{
	const char *v = getenv(name);
	if (!v)
		return dflt;
	const char *d = *v == '-' || *v == '+' ? v + 1 : v;
	return *d >= '0' && *d <= '9' ? atoi(v) : dflt;
}

/* A switch on by default: *on, or (when < 0) whether `name` is anything but 0. */
static inline int env_on(int *on, const char *name)
{
	if (*on < 0)
		*on = env_int(name, 1) != 0;
	return *on;
}

/* A switch off by default: *on, or (when < 0) whether `name` is 1. */
static inline int env_is_1(int *on, const char *name)
{
	if (*on < 0)
		*on = env_int(name, 0) == 1;
	return *on;
}

/* A knob with a few meanings, 0..max: *v, or (when < 0) `name`'s value, 0 when unset or outside
 * 0..max (a value it does not know keeps the default). */
static inline int env_choice(int *v, const char *name, int max)
{
	if (*v < 0) {
		const int x = env_int(name, 0);
		*v = x >= 0 && x <= max ? x : 0;
	}
	return *v;
}

/* A knob that takes a value: *v, or (when < 0) `name` as a non-negative number (0 when unset or
 * negative). */
static inline int env_uint(int *v, const char *name) { return env_choice(v, name, INT_MAX); }

#endif
