/*
 * stopstr.c — the stop-string matcher with hold-back (rules in stopstr.h).
 *
 * Owns: the held-back text of one stream. Must not: allocate per feed beyond growing the held
 * buffer (amortised).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/err.h"
#include "model/stopstr.h"

int stopstr_init(struct stopstr *m, const char *const *s, const size_t *len, int n)
{
	memset(m, 0, sizeof *m);
	if (n <= 0)
		return 0;
	size_t total = 0;
	for (int i = 0; i < n; i++)
		total += len[i];
	m->s = malloc((size_t)n * sizeof *m->s);
	m->len = malloc((size_t)n * sizeof *m->len);
	m->buf = malloc(total);
	if (!m->s || !m->len || !m->buf) {
		stopstr_free(m);
		return -ENOMEM;
	}
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		ASSERT(len[i] >= 1);
		memcpy(m->buf + off, s[i], len[i]);
		m->s[i] = m->buf + off;
		m->len[i] = len[i];
		off += len[i];
	}
	m->n = n;
	return 0;
}

void stopstr_free(struct stopstr *m)
{
	free(m->s);
	free(m->len);
	free(m->buf);
	sbuf_free(&m->held);
	memset(m, 0, sizeof *m);
}

int stopstr_feed(struct stopstr *m, const char *p, size_t n, int final, struct sbuf *out)
{
	if (!m->n) {
		if (n)
			sbuf_put(out, p, n);
		return 0;
	}
	struct sbuf *h = &m->held;
	if (!h->len) { /* nothing held: text without any stop string's first byte passes */
		int i = 0;
		while (i < m->n && !(n && memchr(p, (unsigned char)m->s[i][0], n)))
			i++;
		if (i == m->n) {
			if (n)
				sbuf_put(out, p, n);
			return 0;
		}
	}
	if (n)
		sbuf_put(h, p, n);
	ASSERT(!h->oom);
	if (!h->len)
		return 0;
	/* The occurrence that ends first, ties to the longest: the same whatever the chunking,
	 * since every occurrence ending in this feed starts inside the held text. */
	size_t best = SIZE_MAX, best_end = SIZE_MAX;
	for (int i = 0; i < m->n; i++) {
		if (m->len[i] > h->len)
			continue;
		const char *f = memmem(h->p, h->len, m->s[i], m->len[i]);
		if (!f)
			continue;
		size_t at = (size_t)(f - h->p), end = at + m->len[i];
		if (end < best_end || (end == best_end && at < best)) {
			best = at;
			best_end = end;
		}
	}
	if (best != SIZE_MAX) {
		if (best)
			sbuf_put(out, h->p, best);
		h->len = 0;
		return 1;
	}
	size_t keep = 0;
	if (!final) { /* the longest suffix that is a proper prefix of a stop string */
		for (int i = 0; i < m->n; i++) {
			size_t L = m->len[i];
			size_t j = h->len > L - 1 ? h->len - (L - 1) : 0;
			for (; j < h->len && h->len - j > keep; j++)
				if (h->p[j] == m->s[i][0] && !memcmp(h->p + j, m->s[i], h->len - j)) {
					keep = h->len - j;
					break;
				}
		}
	}
	if (h->len > keep)
		sbuf_put(out, h->p, h->len - keep);
	if (keep)
		memmove(h->p, h->p + h->len - keep, keep);
	h->len = keep;
	return 0;
}
