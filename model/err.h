/*
 * err.h — invariants and load-time error messages shared by every layer.
 *
 * ASSERT stays on in release builds: a broken invariant aborts with file, line and expression.
 * Errors that come from outside (a bad checkpoint, a bad config, a bad request) are not
 * invariants: functions return a negative errno and, where a person must read why, fill a
 * `struct err` with a message that names the file, the field or tensor, expected and actual.
 */
#ifndef DSV32_ERR_H
#define DSV32_ERR_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define ASSERT(expr)                                                                   \
	do {                                                                           \
		if (!(expr)) {                                                         \
			fprintf(stderr, "<2>dsv32: assertion failed at %s:%d: %s\n", \
				__FILE__, __LINE__, #expr);                            \
			abort();                                                       \
		}                                                                      \
	} while (0)

/* A human-readable reason for the last failure of a load-time call. */
struct err {
	char msg[1024];
};

/* Formats the message into e (if non-NULL) and returns code (a negative errno) for tail calls:
 *   return err_set(e, -EINVAL, "%s: tensor %s: expected ...", path, name); */
__attribute__((format(printf, 3, 4))) static inline int err_set(struct err *e, int code,
								const char *fmt, ...)
{
	if (e) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof e->msg, fmt, ap);
		va_end(ap);
	}
	return code;
}

#endif
