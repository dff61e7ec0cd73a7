/*
 * test.h — the one C test harness. Every tests/test_*.c registers cases with TEST(suite, name)
 * and the runner (tests/runner.c) executes each case in its own forked process with a timeout,
 * so a crash or a hang fails one case, not the suite. Cases must be deterministic (seeded).
 *
 *   TEST(json, nested_arrays) { CHECK(x == 1); CHECK_EQ_INT(a, b); REQUIRE(p != NULL); }
 *   TEST_T(e2e, slow_thing, 120) { ... }        // own timeout in seconds (default 30)
 *
 * CHECK records a failure and continues; REQUIRE records it and ends the case.
 */
#ifndef DSV32_TEST_H
#define DSV32_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct test_case {
	const char *suite, *name;
	void (*fn)(void);
	int timeout_s;
	struct test_case *next;
};

void test_register(struct test_case *tc);
void test_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void test_abort_case(void) __attribute__((noreturn));
/* Directory for scratch files of the running case (created, unique per case, removed after). */
const char *test_tmpdir(void);
/* Repository root (where the runner was started; tests read fixtures relative to it). */
const char *test_root(void);
/* Where the programs under test are (mkmodel, dsv32, dsv32d): $DSV32_BIN, else the runner's own
 * directory. */
const char *test_bin_dir(void);

#define TEST_T(suite, name, timeout)                                                    \
	static void test_##suite##_##name(void);                                        \
	__attribute__((constructor)) static void test_reg_##suite##_##name(void)        \
	{                                                                               \
		static struct test_case tc = {#suite, #name, test_##suite##_##name,     \
					      timeout, NULL};                           \
		test_register(&tc);                                                     \
	}                                                                               \
	static void test_##suite##_##name(void)

#define TEST(suite, name) TEST_T(suite, name, 30)

#define CHECK(cond)                                                      \
	do {                                                             \
		if (!(cond))                                             \
			test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond); \
	} while (0)

#define REQUIRE(cond)                                                      \
	do {                                                               \
		if (!(cond)) {                                             \
			test_fail(__FILE__, __LINE__, "REQUIRE(%s)", #cond); \
			test_abort_case();                                 \
		}                                                          \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                                   \
	do {                                                                                 \
		long long a_ = (long long)(a), b_ = (long long)(b);                          \
		if (a_ != b_)                                                                \
			test_fail(__FILE__, __LINE__, "CHECK_EQ_INT(%s, %s): %lld != %lld", #a, \
				  #b, a_, b_);                                               \
	} while (0)

#define CHECK_EQ_STR(a, b)                                                                     \
	do {                                                                                   \
		const char *a_ = (a), *b_ = (b);                                               \
		if (!a_ || !b_ || strcmp(a_, b_))                                              \
			test_fail(__FILE__, __LINE__, "CHECK_EQ_STR(%s, %s): \"%s\" != \"%s\"", #a, \
				  #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                 \
	} while (0)

/* A substring check, for error messages that must name what was wrong. */
#define CHECK_CONTAINS(hay, needle)                                                            \
	do {                                                                                   \
		const char *h_ = (hay), *n_ = (needle);                                        \
		if (!h_ || !strstr(h_, n_))                                                    \
			test_fail(__FILE__, __LINE__, "CHECK_CONTAINS(%s): \"%s\" lacks \"%s\"", #hay, \
				  h_ ? h_ : "(null)", n_);                                     \
	} while (0)

/* Deterministic PRNG for tests (splitmix64). */
static inline uint64_t test_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#endif
