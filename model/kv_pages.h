/*
 * kv_pages.h — the KV page manager: which page ids each sequence owns, reference counts, the
 * prefix cache and its LRU eviction. Bookkeeping only (nano-vllm's block manager).
 *
 * Owns: the page ids 0..n_pages-1 of the backend's pools (one id indexes the page of every
 * layer's MLA and indexer pools, MTP layer included, KV_PAGE_TOKENS = 64 positions each), the
 * block tables of sequences (struct kv_seq), the prefix cache. Must not: touch page contents
 * (the backend writes them), know about requests or sampling.
 *
 * A page is in exactly one state:
 *   used     ref > 0: in the block tables of `ref` sequences (never twice in one table);
 *   cached   ref = 0, published: in the LRU list, findable by the prefix cache, evictable;
 *   free     ref = 0, not published: on the free stack.
 * Allocation takes a free page, else evicts the least recently released cached page.
 *
 * Prefix cache. A full page (64 computed positions) is published with
 *   hash = kv_pages_hash(hash of the previous page of the sequence (0 for the first), uid,
 *                        the page's 64 token ids)
 * and remembers its uid, its 64 token ids and its parent: the published page that stood for
 * the sequence's previous 64 tokens, with that page's generation (bumped whenever a page id is
 * reallocated). A lookup of page b of a new sequence succeeds only if an entry with the chained
 * hash has the same uid, the same 64 tokens and, as parent, exactly the page (and generation)
 * matched for page b-1. By induction a hit stands for exactly the same tokens at the same
 * positions under the same identity, so a hash collision can never hand out wrong K/V. Entries
 * of one uid are never found by another (the uid is in the hash and checked).
 * When two sequences compute the same page concurrently, the second publish finds the first
 * and does not insert a twin; that sequence then chains its later pages to the published one.
 *
 * Hits are capped so that at least one prompt token is recomputed (its logits are needed), so
 * a sequence of n prompt tokens reuses at most floor((n - 1) / 64) pages.
 *
 * The MTP layer (backend.h: its cache at position p needs token p + 1, so it lags the main
 * layers by one) is outside the prefix cache's promise: a published page guarantees only the
 * main layers' K/V. The MTP slot of a page's last position depends on the first token of the
 * next page, which the page's hash does not cover. Rule: without MTP drafting the scheduler
 * never runs MTP steps, so no MTP slot is ever written or read and the pages simply reserve
 * them; with it (sched_config.mtp_draft) the MTP slots of a hit prefix are taken as its
 * publisher left them: right except the last position's (written with the publisher's next
 * token) and those a publisher that ended before its MTP step never wrote. That is safe
 * because the MTP layer only drafts: a draft is kept only where the main model's own draw
 * equals it, so stale slots cost acceptance, never tokens. Nothing writes a hit page's slots
 * (a hitter's MTP rows start at its first computed position).
 */
#ifndef DSV32_KV_PAGES_H
#define DSV32_KV_PAGES_H

#include <stddef.h>
#include <stdint.h>

#include "model/kv_cache.h"

struct kv_pages {
	int64_t n_pages;
	int32_t *ref;          /* [n_pages] sequences holding the page */
	uint32_t *gen;         /* [n_pages] bumped at every allocation */
	uint8_t *published;    /* [n_pages] 1 = in the prefix-cache table */
	/* prefix-cache entry of a published page */
	uint64_t *hash;        /* [n_pages] */
	uint32_t *uid;         /* [n_pages] */
	int32_t *parent;       /* [n_pages] parent page, -1 for a first page */
	uint32_t *parent_gen;  /* [n_pages] */
	int32_t *tokens;       /* [n_pages, 64] */
	int32_t *hnext;        /* [n_pages] next entry in the same bucket, -1 */
	int32_t *bucket;       /* [n_buckets] first entry, -1 */
	uint64_t bucket_mask;
	/* LRU of cached pages (head = evicted first) and the free stack */
	int32_t *lru_prev, *lru_next; /* [n_pages] */
	int32_t lru_head, lru_tail;
	int64_t n_cached;
	int32_t *free_stack;   /* [n_pages] */
	int64_t n_free;
	/* counters */
	uint64_t n_lookup_pages, n_hit_pages, n_evicted;
	/* All ones; tests narrow it to force hash collisions (verification must still hold). */
	uint64_t hash_mask;
};

/* One sequence's block table and prefix-cache chain state. Zero-initialise. */
struct kv_seq {
	int32_t *bt;           /* [cap] page of positions [64 b, 64 b + 64) */
	int64_t n_blocks, cap;
	uint32_t uid;          /* client identity: keys its prefix-cache entries */
	int64_t n_published;   /* leading pages already published (or taken from the cache) */
	uint64_t chain_hash;   /* hash of page n_published - 1 (0 if none) */
	int32_t chain_page;    /* the published page that stands for it (-1 if none) */
	uint32_t chain_gen;
};

int kv_pages_init(struct kv_pages *kp, int64_t n_pages);
void kv_pages_free(struct kv_pages *kp);

/* Pages an allocation can get now: free + cached. */
static inline int64_t kv_pages_available(const struct kv_pages *kp)
{
	return kp->n_free + kp->n_cached;
}
static inline int64_t kv_pages_used(const struct kv_pages *kp)
{
	return kp->n_pages - kp->n_free - kp->n_cached;
}
static inline int64_t kv_pages_for(int64_t n_tokens)
{
	return (n_tokens + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS;
}

uint64_t kv_pages_hash(uint64_t prev, uint32_t uid, const int32_t *tokens /* [64] */);

/* For an empty sequence: takes the longest verified cached prefix of tokens[0..n) (at most
 * floor((n - 1) / 64) pages), appends those pages to its block table with a reference each,
 * and returns the number of positions reused (a multiple of 64). -ENOMEM if the block table
 * cannot grow (nothing taken). */
int64_t kv_pages_match(struct kv_pages *kp, struct kv_seq *s, const int32_t *tokens, int64_t n);
/* How many pages kv_pages_match would take and how many of them are cached (ref 0: taking them
 * lowers kv_pages_available). Changes nothing. */
void kv_pages_peek(const struct kv_pages *kp, uint32_t uid, const int32_t *tokens, int64_t n,
		   int64_t *n_hit, int64_t *n_hit_cached);
/* Grows the block table to cover positions [0, n_tokens). All or nothing: 0, or -ENOMEM when
 * not enough pages are available (or the table cannot grow). */
int kv_pages_reserve(struct kv_pages *kp, struct kv_seq *s, int64_t n_tokens);
/* Publishes every full page whose 64 positions are all computed (n_computed of them), in
 * order. tokens: the sequence's ids, at least n_computed of them. */
void kv_pages_publish(struct kv_pages *kp, struct kv_seq *s, const int32_t *tokens,
		      int64_t n_computed);
/* Drops the sequence's references (last page first, so deeper pages are evicted first) and
 * empties its block table (the allocation is kept for reuse). */
void kv_pages_release(struct kv_pages *kp, struct kv_seq *s);
void kv_seq_free(struct kv_seq *s);

/* Checks every invariant: each page in exactly one state, ref counts equal to the number of
 * block-table entries over seqs[0..n_seqs) (which must be every live sequence), no page twice
 * in one table, LRU and free stack consistent, every published page in its hash bucket once.
 * 0, or -EFAULT with a message in e. For tests and debugging: O(n_pages + table sizes). */
int kv_pages_check(const struct kv_pages *kp, const struct kv_seq *const *seqs, int64_t n_seqs,
		   struct err *e);

#endif
