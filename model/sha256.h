/*
 * sha256.h — SHA-256 (FIPS 180-4), for checkpoint manifests that an independent reader (the
 * Python `safetensors` package) is compared against.
 *
 * Owns: the hash. Must not: allocate or do I/O.
 */
#ifndef DSV32_SHA256_H
#define DSV32_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sha256 {
	uint32_t h[8];
	uint64_t len;     /* bytes hashed so far */
	uint8_t buf[64];  /* partial block */
	size_t nbuf;
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *p, size_t n);
void sha256_final(struct sha256 *s, uint8_t out[32]);
/* One call: hex digest (64 chars + NUL) of p[0..n). */
void sha256_hex(const void *p, size_t n, char hex[65]);

#endif
