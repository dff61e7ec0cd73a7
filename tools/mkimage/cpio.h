/*
 * cpio.h — reading the appliance image's archive format (cpio "newc", as the kernel unpacks an
 * initramfs): every entry of an archive in memory, checked against the bytes it has.
 * Owns: the reader. Must not: trust a header's numbers before checking them against the size.
 */
#ifndef DSV32_CPIO_H
#define DSV32_CPIO_H

#include <stddef.h>
#include <stdint.h>

struct cpio_entry {
	const char *name;            /* NUL-terminated, inside the archive */
	uint32_t mode, size;         /* st_mode; the data's bytes */
	uint32_t rmajor, rminor;     /* a device node's numbers */
	const unsigned char *data;   /* [size] */
};

/* fn(ctx, entry) for each entry before the trailer, in order, until fn returns non-zero.
 * 0 at the trailer, fn's return, or -1 with *why saying what is wrong (not the format, a
 * malformed header, cut short). */
int cpio_walk(const unsigned char *p, size_t n, int (*fn)(void *ctx, const struct cpio_entry *e),
	      void *ctx, const char **why);

#endif
