/*
 * fuzz.h — what every libFuzzer target here shares: FUZZ_CHECK, an invariant of the code under
 * test that any input must keep (a trap, which libFuzzer reports with the input that broke it).
 */
#ifndef DSV32_FUZZ_H
#define DSV32_FUZZ_H

#define FUZZ_CHECK(c)                   \
	do {                            \
		if (!(c))               \
			__builtin_trap(); \
	} while (0)

#endif
