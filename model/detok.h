/*
 * detok.h — streaming detokenizer and UTF-8 repair.
 *
 * Owns: turning a stream of token ids (or raw bytes) into text that is always complete, valid
 * UTF-8, for streamed output and stop-string matching; and the repair of invalid UTF-8 that the
 * tokenizer's encoder applies to its input.
 * Must not: hold back anything but the bytes of one incomplete character (at most 3).
 *
 * The rule for invalid bytes is the WHATWG UTF-8 decoder's (Unicode's "maximal subpart"
 * practice, also node's TextDecoder and Python's errors="replace"): each maximal prefix of a
 * valid sequence that cannot be completed, and each byte that cannot start one, becomes one
 * U+FFFD. A held prefix is replaced as soon as the next byte shows it cannot be completed (and
 * that byte is then read afresh), or at detok_flush. So the concatenation of everything a detok
 * emits equals the one-shot repair of all bytes pushed, wherever the stream was cut.
 */
#ifndef DSV32_DETOK_H
#define DSV32_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "model/json.h"
#include "model/tokenizer.h"

struct detok {
	const struct tokenizer *tok;
	unsigned flags;      /* TOKENIZER_SKIP_SPECIAL or 0 */
	uint8_t pend[4];     /* bytes of the incomplete character held back */
	uint8_t npend, need; /* held bytes; total bytes the character needs (0: none held) */
	uint8_t lo, hi;      /* allowed range of the next continuation byte */
};

void detok_init(struct detok *d, const struct tokenizer *tok, unsigned flags);
/* Appends the complete characters that id makes available. 0, or -EINVAL (unknown id; the
 * state is unchanged), or -ENOMEM (out's oom flag). */
int detok_push(struct detok *d, int32_t id, struct sbuf *out);
/* Same for raw bytes (no tokenizer needed). */
void detok_push_bytes(struct detok *d, const void *p, size_t n, struct sbuf *out);
/* Ends the stream: a held incomplete character becomes U+FFFD. The detok is then reset. */
void detok_flush(struct detok *d, struct sbuf *out);
/* Bytes held back (0..3). */
static inline size_t detok_pending(const struct detok *d) { return d->npend; }

/* Length of the valid UTF-8 prefix of s[0..n) (n when all of it is valid). */
size_t detok_valid_prefix(const void *s, size_t n);
/* Appends s[0..n) to out with invalid sequences replaced as described above. */
void detok_repair(const void *s, size_t n, struct sbuf *out);

#endif
