/*
 * cpio.c — the newc reader: a 110-byte header of "070701" and 13 fields of 8 hex digits, the
 * name, the data; the name and the next header 4-byte aligned; "TRAILER!!!" ends it.
 */
#include "tools/mkimage/cpio.h"

#include <string.h>

/* One field of 8 hex digits; -1 if it is not one */
static int hex8(const unsigned char *p, uint32_t *v)
{
	*v = 0;
	for (int i = 0; i < 8; i++) {
		int c = p[i], d = c >= '0' && c <= '9'   ? c - '0'
				  : c >= 'A' && c <= 'F' ? c - 'A' + 10
				  : c >= 'a' && c <= 'f' ? c - 'a' + 10
							 : -1;
		if (d < 0)
			return -1;
		*v = *v << 4 | (uint32_t)d;
	}
	return 0;
}

int cpio_walk(const unsigned char *p, size_t n, int (*fn)(void *ctx, const struct cpio_entry *e),
	      void *ctx, const char **why)
{
	for (uint64_t off = 0;;) {
		uint32_t v[13];
		if (n < 110 || off > n - 110 || memcmp(p + off, "070701", 6)) {
			*why = "not a newc cpio archive, or cut short before its trailer";
			return -1;
		}
		int ok = 1;
		for (int i = 0; i < 13; i++)
			ok &= !hex8(p + off + 6 + 8 * i, &v[i]);
		const uint32_t nlen = v[11];
		/* the name after the header, the data and the next entry each 4-byte aligned */
		const uint64_t name = off + 110, data = (name + nlen + 3) & ~(uint64_t)3;
		if (!ok || !nlen || name + nlen > n || p[name + nlen - 1] ||
		    memchr(p + name, 0, nlen) != p + name + nlen - 1) {
			*why = "a malformed entry header (its fields or its name)";
			return -1;
		}
		struct cpio_entry e = {(const char *)p + name, v[1], v[6], v[9], v[10], p + data};
		if (!strcmp(e.name, "TRAILER!!!"))
			return 0;
		if (data + e.size > n) {
			*why = "cut short inside an entry's data";
			return -1;
		}
		int r = fn(ctx, &e);
		if (r)
			return r;
		off = (data + e.size + 3) & ~(uint64_t)3;
	}
}
