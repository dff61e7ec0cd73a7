/*
 * stopstr.h — stop strings over streamed text: finds a stop string wherever the stream was cut
 * and holds back text that may be the start of one, so nothing is streamed and then retracted.
 *
 * Owns: one request's stop strings (copied) and the text held back. Must not: decode tokens
 * (model/detok.h does; it feeds complete UTF-8 here) or know about requests.
 *
 * Rule: the occurrence of a stop string that ends first in the stream (ties: the longest) ends
 * it: the text before that occurrence is released, it and everything after are dropped — the
 * same result however the text is cut into feeds. Until then, after each feed the
 * held text is released except its longest suffix that is a proper prefix of some stop string
 * (any later occurrence must start inside that suffix). With final = 1 nothing is held back.
 * Stop strings are valid UTF-8 and the text fed is too, so every cut is at a character
 * boundary.
 */
#ifndef DSV32_STOPSTR_H
#define DSV32_STOPSTR_H

#include <stddef.h>

#include "model/json.h"

struct stopstr {
	int n;
	const char **s;  /* [n] into buf */
	size_t *len;     /* [n] */
	char *buf;
	struct sbuf held;
};

/* Copies n strings s[i] of len[i] bytes (each >= 1). 0 or -ENOMEM. n = 0 is a no-op matcher
 * that passes everything through. */
int stopstr_init(struct stopstr *m, const char *const *s, const size_t *len, int n);
void stopstr_free(struct stopstr *m);

/* Feeds text p[0..n). Appends the releasable bytes to out and returns 1 if a stop string
 * matched (the stream is over), else 0. final = 1: the stream ends here, release everything
 * that did not match. */
int stopstr_feed(struct stopstr *m, const char *p, size_t n, int final, struct sbuf *out);

#endif
