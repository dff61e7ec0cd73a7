/*
 * npy.c — .npy/.npz writer and reader (see npy.h). Zip records are written field by field in
 * little-endian; sizes above 4 GiB are refused (no zip64 on the writing side).
 */
#include "model/npy.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/fileio.h"

/* ---- CRC-32 (zip polynomial 0xEDB88320) --------------------------------------------------- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
		crc_table[i] = c;
	}
}

uint32_t npy_crc32(uint32_t crc, const void *p, size_t n)
{
	pthread_once(&crc_once, crc_init);
	const uint32_t *table = crc_table;
	const uint8_t *b = p;
	crc = ~crc;
	for (size_t i = 0; i < n; i++)
		crc = table[(crc ^ b[i]) & 0xff] ^ (crc >> 8);
	return ~crc;
}

/* ---- .npy header ---------------------------------------------------------------------- */

static size_t elem_count(int ndim, const int64_t *shape)
{
	size_t n = 1;
	for (int i = 0; i < ndim; i++)
		n *= (size_t)shape[i];
	return n;
}

/* Builds the magic + v1 header (padded to 64 bytes). Returns its length. hdr: [>= 256] */
static size_t npy_header(char *hdr, size_t cap, enum npy_dtype t, int ndim, const int64_t *shape)
{
	char dict[200];
	int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
			 t == NPY_F32 ? "<f4" : "<i4");
	for (int i = 0; i < ndim; i++)
		n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld%s", (long long)shape[i],
			      ndim == 1 ? "," : i + 1 < ndim ? ", " : "");
	n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
	size_t total = 10 + (size_t)n + 1;
	total = (total + 63) / 64 * 64;
	ASSERT(total <= cap);
	size_t hlen = total - 10;
	memcpy(hdr, "\x93NUMPY\x01\x00", 8);
	hdr[8] = (char)(hlen & 0xff);
	hdr[9] = (char)(hlen >> 8);
	memset(hdr + 10, ' ', hlen);
	memcpy(hdr + 10, dict, (size_t)n);
	hdr[total - 1] = '\n';
	return total;
}

int npy_write(const char *path, enum npy_dtype t, int ndim, const int64_t *shape,
	      const void *data, struct err *e)
{
	char hdr[256];
	size_t h = npy_header(hdr, sizeof hdr, t, ndim, shape);
	size_t nbytes = elem_count(ndim, shape) * 4;
	FILE *f = fopen(path, "wb");
	if (!f)
		return err_set(e, -errno, "%s: cannot create: %s", path, strerror(errno));
	int ok = fwrite(hdr, 1, h, f) == h && fwrite(data, 1, nbytes, f) == nbytes;
	ok = (fclose(f) == 0) && ok;
	return ok ? 0 : err_set(e, -EIO, "%s: write failed", path);
}

/* ---- .npz writer ---------------------------------------------------------------------- */

struct npz_entry {
	char name[128];
	uint32_t crc, size, offset;
};

struct npz_writer {
	FILE *f;
	char path[512];
	struct npz_entry *ent;
	size_t n, cap;
	uint64_t off;
	int failed;
};

static void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v)
{
	put16(p, v & 0xffff);
	put16(p + 2, v >> 16);
}
static uint32_t get16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t get32(const uint8_t *p) { return get16(p) | get16(p + 2) << 16; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

struct npz_writer *npz_open(const char *path, struct err *e)
{
	struct npz_writer *z = calloc(1, sizeof *z);
	if (!z) {
		err_set(e, -ENOMEM, "out of memory");
		return NULL;
	}
	z->f = fopen(path, "wb");
	if (!z->f) {
		err_set(e, -errno, "%s: cannot create: %s", path, strerror(errno));
		free(z);
		return NULL;
	}
	snprintf(z->path, sizeof z->path, "%s", path);
	return z;
}

int npz_add(struct npz_writer *z, const char *key, enum npy_dtype t, int ndim,
	    const int64_t *shape, const void *data)
{
	char hdr[256];
	size_t h = npy_header(hdr, sizeof hdr, t, ndim, shape);
	size_t nbytes = elem_count(ndim, shape) * 4;
	if (strlen(key) + 5 > sizeof z->ent[0].name || z->off + h + nbytes + 200 > 0xffffffffu) {
		z->failed = 1;
		return -EFBIG;
	}
	if (z->n == z->cap) {
		size_t cap = z->cap ? 2 * z->cap : 16;
		struct npz_entry *ne = realloc(z->ent, cap * sizeof *ne);
		if (!ne)
			return -ENOMEM;
		z->ent = ne;
		z->cap = cap;
	}
	struct npz_entry *en = &z->ent[z->n];
	snprintf(en->name, sizeof en->name, "%s.npy", key);
	en->crc = npy_crc32(npy_crc32(0, hdr, h), data, nbytes);
	en->size = (uint32_t)(h + nbytes);
	en->offset = (uint32_t)z->off;
	uint8_t lh[30] = {0};
	size_t nl = strlen(en->name);
	put32(lh, 0x04034b50);
	put16(lh + 4, 20);
	put16(lh + 12, 0x21); /* 1980-01-01 */
	put32(lh + 14, en->crc);
	put32(lh + 18, en->size);
	put32(lh + 22, en->size);
	put16(lh + 26, (uint32_t)nl);
	int ok = fwrite(lh, 1, 30, z->f) == 30 && fwrite(en->name, 1, nl, z->f) == nl &&
		 fwrite(hdr, 1, h, z->f) == h && fwrite(data, 1, nbytes, z->f) == nbytes;
	if (!ok) {
		z->failed = 1;
		return -EIO;
	}
	z->off += 30 + nl + h + nbytes;
	z->n++;
	return 0;
}

int npz_close(struct npz_writer *z, struct err *e)
{
	uint64_t cd_off = z->off, cd_size = 0;
	int ok = !z->failed;
	for (size_t i = 0; i < z->n && ok; i++) {
		struct npz_entry *en = &z->ent[i];
		uint8_t ch[46] = {0};
		size_t nl = strlen(en->name);
		put32(ch, 0x02014b50);
		put16(ch + 4, 20);
		put16(ch + 6, 20);
		put16(ch + 14, 0x21);
		put32(ch + 16, en->crc);
		put32(ch + 20, en->size);
		put32(ch + 24, en->size);
		put16(ch + 28, (uint32_t)nl);
		put32(ch + 42, en->offset);
		ok = fwrite(ch, 1, 46, z->f) == 46 && fwrite(en->name, 1, nl, z->f) == nl;
		cd_size += 46 + nl;
	}
	uint8_t end[22] = {0};
	put32(end, 0x06054b50);
	put16(end + 8, (uint32_t)z->n);
	put16(end + 10, (uint32_t)z->n);
	put32(end + 12, (uint32_t)cd_size);
	put32(end + 16, (uint32_t)cd_off);
	ok = ok && z->n < 0xffff && fwrite(end, 1, 22, z->f) == 22;
	ok = (fclose(z->f) == 0) && ok;
	int r = ok ? 0 : err_set(e, -EIO, "%s: write failed", z->path);
	free(z->ent);
	free(z);
	return r;
}

/* ---- readers -------------------------------------------------------------------------- */

int npy_parse(const uint8_t *buf, size_t len, struct npy_array *a, struct err *e)
{
	memset(a, 0, sizeof *a);
	if (len < 10 || memcmp(buf, "\x93NUMPY", 6))
		return err_set(e, -EINVAL, "not an .npy (bad magic)");
	size_t hlen, off;
	if (buf[6] == 1) {
		hlen = get16(buf + 8);
		off = 10;
	} else {
		if (len < 12)
			return err_set(e, -EINVAL, "truncated .npy header");
		hlen = get32(buf + 8);
		off = 12;
	}
	if (off + hlen > len || hlen > 65536)
		return err_set(e, -EINVAL, "truncated .npy header");
	char h[65537];
	memcpy(h, buf + off, hlen);
	h[hlen] = 0;
	if (strstr(h, "'descr': '<f4'"))
		a->dtype = NPY_F32;
	else if (strstr(h, "'descr': '<i4'"))
		a->dtype = NPY_I32;
	else
		return err_set(e, -EINVAL, "unsupported dtype in .npy header: %s", h);
	if (!strstr(h, "'fortran_order': False"))
		return err_set(e, -EINVAL, "fortran_order arrays are not supported");
	const char *s = strstr(h, "'shape': (");
	if (!s)
		return err_set(e, -EINVAL, "no shape in .npy header");
	s += 10;
	while (*s && *s != ')') {
		char *end;
		long long v = strtoll(s, &end, 10);
		if (end == s || v < 0 || a->ndim == NPY_MAX_DIMS)
			return err_set(e, -EINVAL, "bad shape in .npy header: %s", h);
		a->shape[a->ndim++] = v;
		s = end;
		while (*s == ',' || *s == ' ')
			s++;
	}
	size_t n = 4, avail = len - off - hlen;
	for (int i = 0; i < a->ndim; i++) { /* checked: a shape must fit in the bytes present */
		if (a->shape[i] && n > avail / (size_t)a->shape[i]) {
			n = SIZE_MAX;
			break;
		}
		n *= (size_t)a->shape[i];
	}
	if (n > avail)
		return err_set(e, -EINVAL, ".npy data truncated: %zu bytes for shape of %d dims", avail,
			       a->ndim);
	a->data = malloc(n ? n : 1);
	if (!a->data)
		return err_set(e, -ENOMEM, "out of memory");
	memcpy(a->data, buf + off + hlen, n);
	a->nbytes = n;
	return 0;
}

int npy_read(const char *path, struct npy_array *a, struct err *e)
{
	size_t len;
	char *buf = file_read(path, &len, (size_t)1 << 36, e);
	if (!buf)
		return -EIO;
	int r = npy_parse((const uint8_t *)buf, len, a, e);
	free(buf);
	return r;
}

int npz_find(const uint8_t *z, size_t len, const char *key, struct npy_array *a, struct err *e)
{
	char want[256];
	memset(a, 0, sizeof *a);
	snprintf(want, sizeof want, "%s.npy", key);
	size_t eocd = len >= 22 ? len - 22 : 0;
	while (eocd > 0 && get32(z + eocd) != 0x06054b50)
		eocd--;
	if (len < 22 || get32(z + eocd) != 0x06054b50)
		return err_set(e, -EINVAL, "not a zip archive");
	uint64_t p = get32(z + eocd + 16);
	size_t n = get16(z + eocd + 10);
	for (size_t i = 0; i < n; i++) {
		if (p + 46 > len || get32(z + p) != 0x02014b50)
			return err_set(e, -EINVAL, "bad central directory");
		uint32_t method = get16(z + p + 10);
		uint64_t csize = get32(z + p + 20), lofs = get32(z + p + 42);
		size_t nl = get16(z + p + 28), xl = get16(z + p + 30), cl = get16(z + p + 32);
		if (p + 46 + nl + xl > len)
			return err_set(e, -EINVAL, "bad central directory");
		const uint8_t *x = z + p + 46 + nl;
		for (size_t k = 0; k + 4 <= xl;) { /* zip64 extra: the fields that were 0xffffffff */
			uint32_t id = get16(x + k), sz = get16(x + k + 2);
			if (id == 1) {
				const uint8_t *v = x + k + 4, *end = x + k + 4 + sz;
				if (end > x + xl)
					end = x + xl;
				if (get32(z + p + 24) == 0xffffffffu && v + 8 <= end)
					v += 8;
				if (csize == 0xffffffffu && v + 8 <= end)
					csize = get64(v), v += 8;
				if (lofs == 0xffffffffu && v + 8 <= end)
					lofs = get64(v);
			}
			k += 4 + sz;
		}
		if (nl == strlen(want) && !memcmp(z + p + 46, want, nl)) {
			if (method != 0)
				return err_set(e, -EINVAL, "entry %s is compressed (not supported)", want);
			if (lofs > len || len - lofs < 30)
				return err_set(e, -EINVAL, "entry %s: bad local header", want);
			uint64_t data = lofs + 30 + get16(z + lofs + 26) + get16(z + lofs + 28);
			if (data > len || csize > len - data)
				return err_set(e, -EINVAL, "entry %s truncated", want);
			return npy_parse(z + data, (size_t)csize, a, e);
		}
		p += 46 + nl + xl + cl;
	}
	return err_set(e, -ENOENT, "no entry %s", want);
}

int npz_read(const char *path, const char *key, struct npy_array *a, struct err *e)
{
	size_t len;
	uint8_t *z = (uint8_t *)file_read(path, &len, (size_t)1 << 36, e);
	if (!z)
		return -EIO;
	struct err e2;
	int r = npz_find(z, len, key, a, &e2);
	if (r)
		err_set(e, r, "%s: %s", path, e2.msg);
	free(z);
	return r;
}

void npy_free(struct npy_array *a)
{
	free(a->data);
	memset(a, 0, sizeof *a);
}
