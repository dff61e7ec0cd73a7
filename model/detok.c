/*
 * detok.c — streaming detokenizer and WHATWG-style UTF-8 repair (see detok.h for the rule).
 *
 * Owns: the incremental UTF-8 decoder state (one held, incomplete character at most).
 * Must not: allocate, or emit anything but valid UTF-8.
 */
#include "model/detok.h"

#include <errno.h>
#include <string.h>

static const char replacement[3] = {(char)0xef, (char)0xbf, (char)0xbd}; /* U+FFFD */

static void reset(struct detok *d)
{
	d->npend = 0;
	d->need = 0;
	d->lo = 0x80;
	d->hi = 0xbf;
}

void detok_init(struct detok *d, const struct tokenizer *tok, unsigned flags)
{
	d->tok = tok;
	d->flags = flags;
	reset(d);
}

/* Bytes the character led by c needs (0: c cannot lead one), and the range of its first
 * continuation byte (excluding overlongs, surrogates and code points above U+10FFFF). */
static int lead(uint8_t c, uint8_t *lo, uint8_t *hi)
{
	*lo = 0x80;
	*hi = 0xbf;
	if (c >= 0xc2 && c <= 0xdf)
		return 2;
	if (c >= 0xe0 && c <= 0xef) {
		if (c == 0xe0)
			*lo = 0xa0;
		if (c == 0xed)
			*hi = 0x9f;
		return 3;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		if (c == 0xf0)
			*lo = 0x90;
		if (c == 0xf4)
			*hi = 0x8f;
		return 4;
	}
	return 0;
}

void detok_push_bytes(struct detok *d, const void *p, size_t n, struct sbuf *out)
{
	const uint8_t *s = p;
	size_t i = 0;
	while (i < n) {
		if (d->need == 0) {
			/* Fast path: copy the valid run that starts here in one piece. */
			size_t k = detok_valid_prefix(s + i, n - i);
			if (k) {
				sbuf_put(out, s + i, k);
				i += k;
				continue;
			}
			uint8_t c = s[i++];
			int need = lead(c, &d->lo, &d->hi);
			if (!need) {
				sbuf_put(out, replacement, 3);
				continue;
			}
			d->need = (uint8_t)need;
			d->pend[0] = c;
			d->npend = 1;
			continue;
		}
		uint8_t c = s[i];
		if (c < d->lo || c > d->hi) {
			/* The held prefix can never complete: replace it, read c afresh. */
			sbuf_put(out, replacement, 3);
			reset(d);
			continue;
		}
		i++;
		d->pend[d->npend++] = c;
		d->lo = 0x80;
		d->hi = 0xbf;
		if (d->npend == d->need) {
			sbuf_put(out, d->pend, d->npend);
			reset(d);
		}
	}
}

int detok_push(struct detok *d, int32_t id, struct sbuf *out)
{
	const char *p;
	size_t n;
	if (tokenizer_token_bytes(d->tok, id, &p, &n))
		return -EINVAL;
	if ((d->flags & TOKENIZER_SKIP_SPECIAL) && tokenizer_is_special(d->tok, id))
		return 0;
	detok_push_bytes(d, p, n, out);
	return out->oom ? -ENOMEM : 0;
}

void detok_flush(struct detok *d, struct sbuf *out)
{
	if (d->need)
		sbuf_put(out, replacement, 3);
	reset(d);
}

size_t detok_valid_prefix(const void *p, size_t n)
{
	const uint8_t *s = p;
	size_t i = 0;
	while (i < n) {
		/* ASCII eight bytes at a time. */
		while (i + 8 <= n) {
			uint64_t w;
			memcpy(&w, s + i, 8);
			if (w & 0x8080808080808080ull)
				break;
			i += 8;
		}
		if (i >= n)
			break;
		uint8_t c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		uint8_t lo, hi;
		int need = lead(c, &lo, &hi);
		if (!need || i + (size_t)need > n)
			return i;
		if (s[i + 1] < lo || s[i + 1] > hi)
			return i;
		for (int k = 2; k < need; k++)
			if ((s[i + k] & 0xc0) != 0x80)
				return i;
		i += (size_t)need;
	}
	return n;
}

void detok_repair(const void *s, size_t n, struct sbuf *out)
{
	struct detok d;
	detok_init(&d, NULL, 0);
	detok_push_bytes(&d, s, n, out);
	detok_flush(&d, out);
}
