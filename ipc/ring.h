/*
 * ring.h — the arithmetic of one single-producer single-consumer ring and of a producer-owned
 * byte area, shared by the server and the client. Pure functions on private copies of indices;
 * the atomic loads and stores of the shared indices happen at the call sites (conn.c, client.c),
 * each with its own comment.
 *
 * Must not: touch shared memory, make system calls, or trust a peer-written index it has not
 * checked with ring_check_tail / ring_check_head.
 */
#ifndef DSV32_IPC_RING_H
#define DSV32_IPC_RING_H

#include <errno.h>
#include <stdint.h>

/* Entries a producer can still push (tail and head are free-running; entries is a power of 2). */
static inline uint32_t ring_space(uint32_t tail, uint32_t head, uint32_t entries)
{
	return entries - (tail - head);
}

/* Entries a consumer can pop. */
static inline uint32_t ring_count(uint32_t tail, uint32_t head) { return tail - head; }

/* Slot of a free-running index. */
static inline uint32_t ring_slot(uint32_t idx, uint32_t entries) { return idx & (entries - 1); }

/* Consumer's check of a tail written by the peer. `head` is the consumer's private head,
 * `seen` the last tail it accepted. The tail may only move forward (from seen) and may run at
 * most `entries` ahead of head. Returns 0 or -EPROTO. */
static inline int ring_check_tail(uint32_t tail, uint32_t seen, uint32_t head, uint32_t entries)
{
	if (tail - head > entries)
		return -EPROTO;
	if ((uint32_t)(tail - head) < (uint32_t)(seen - head))
		return -EPROTO; /* moved backwards */
	return 0;
}

/* Producer's check of a head written by the peer: it may only move forward from `seen`, and
 * never past the producer's tail. */
static inline int ring_check_head(uint32_t head, uint32_t seen, uint32_t tail)
{
	return (uint32_t)(head - seen) <= (uint32_t)(tail - seen) ? 0 : -EPROTO;
}

/* A producer-owned byte area of `size` bytes (a power of two), used as a ring of contiguous
 * records: tail and head are free-running byte positions; a record that would straddle the end
 * starts at offset 0 instead and the skipped bytes count as used until released. */
struct ring_data {
	uint32_t head, tail, size;
};

/* Allocates n bytes (rounded up to align, a power of 2) leaving at least `keep` bytes free
 * afterwards. Returns the record's offset in the area, or -1 if there is no room. */
static inline int64_t ring_data_alloc(struct ring_data *d, uint32_t n, uint32_t align, uint32_t keep)
{
	uint64_t need = ((uint64_t)n + align - 1) & ~(uint64_t)(align - 1);
	uint32_t off = d->tail & (d->size - 1);
	uint64_t skip = (uint64_t)d->size - off < need ? (uint64_t)d->size - off : 0;
	uint64_t used = (uint32_t)(d->tail - d->head);
	if (need == 0)
		return off;
	if (used + skip + need + keep > d->size)
		return -1;
	d->tail += (uint32_t)(skip + need);
	return skip ? 0 : off;
}

/* Free bytes of the area. */
static inline uint32_t ring_data_free(const struct ring_data *d)
{
	return d->size - (uint32_t)(d->tail - d->head);
}

/* Consumer's check of a record (offset, length) against the area bounds, in 64-bit math. */
static inline int ring_data_check(uint32_t off, uint32_t len, uint32_t size)
{
	return (uint64_t)off + len <= size ? 0 : -EPROTO;
}

#endif
