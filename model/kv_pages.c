/*
 * kv_pages.c — page states, reference counts, block tables, the verified prefix cache and its
 * LRU (see kv_pages.h for the rules).
 *
 * Owns: page-id bookkeeping. Must not: touch page contents, allocate on the hot path except to
 * grow a block table (amortised doubling).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/kv_pages.h"

#define T KV_PAGE_TOKENS

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t kv_pages_hash(uint64_t prev, uint32_t uid, const int32_t *tokens)
{
	uint64_t h = mix64(prev ^ mix64((uint64_t)uid + 0x9e3779b97f4a7c15ull));
	for (int i = 0; i < T; i += 2)
		h = mix64(h ^ ((uint64_t)(uint32_t)tokens[i] |
			       (uint64_t)(uint32_t)tokens[i + 1] << 32)) + 0x9e3779b97f4a7c15ull;
	return h;
}

int kv_pages_init(struct kv_pages *kp, int64_t n_pages)
{
	memset(kp, 0, sizeof *kp);
	if (n_pages <= 0 || n_pages > INT32_MAX / 2)
		return -EINVAL;
	size_t n = (size_t)n_pages;
	uint64_t nb = 1;
	while (nb < 2 * (uint64_t)n)
		nb <<= 1;
	kp->n_pages = n_pages;
	kp->bucket_mask = nb - 1;
	kp->ref = calloc(n, sizeof *kp->ref);
	kp->gen = calloc(n, sizeof *kp->gen);
	kp->published = calloc(n, 1);
	kp->hash = calloc(n, sizeof *kp->hash);
	kp->uid = calloc(n, sizeof *kp->uid);
	kp->parent = calloc(n, sizeof *kp->parent);
	kp->parent_gen = calloc(n, sizeof *kp->parent_gen);
	kp->tokens = calloc(n * T, sizeof *kp->tokens);
	kp->hnext = calloc(n, sizeof *kp->hnext);
	kp->bucket = malloc(nb * sizeof *kp->bucket);
	kp->lru_prev = calloc(n, sizeof *kp->lru_prev);
	kp->lru_next = calloc(n, sizeof *kp->lru_next);
	kp->free_stack = malloc(n * sizeof *kp->free_stack);
	if (!kp->ref || !kp->gen || !kp->published || !kp->hash || !kp->uid || !kp->parent ||
	    !kp->parent_gen || !kp->tokens || !kp->hnext || !kp->bucket || !kp->lru_prev ||
	    !kp->lru_next || !kp->free_stack) {
		kv_pages_free(kp);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < nb; i++)
		kp->bucket[i] = -1;
	/* Stack order: page 0 is taken first. */
	for (int64_t i = 0; i < n_pages; i++)
		kp->free_stack[i] = (int32_t)(n_pages - 1 - i);
	kp->n_free = n_pages;
	kp->lru_head = kp->lru_tail = -1;
	kp->hash_mask = ~0ull;
	return 0;
}

void kv_pages_free(struct kv_pages *kp)
{
	free(kp->ref);
	free(kp->gen);
	free(kp->published);
	free(kp->hash);
	free(kp->uid);
	free(kp->parent);
	free(kp->parent_gen);
	free(kp->tokens);
	free(kp->hnext);
	free(kp->bucket);
	free(kp->lru_prev);
	free(kp->lru_next);
	free(kp->free_stack);
	memset(kp, 0, sizeof *kp);
}

/* ---- LRU and hash table ------------------------------------------------------------------ */

static void lru_unlink(struct kv_pages *kp, int32_t p)
{
	int32_t a = kp->lru_prev[p], b = kp->lru_next[p];
	if (a >= 0)
		kp->lru_next[a] = b;
	else
		kp->lru_head = b;
	if (b >= 0)
		kp->lru_prev[b] = a;
	else
		kp->lru_tail = a;
	kp->n_cached--;
}

static void lru_append(struct kv_pages *kp, int32_t p)
{
	kp->lru_prev[p] = kp->lru_tail;
	kp->lru_next[p] = -1;
	if (kp->lru_tail >= 0)
		kp->lru_next[kp->lru_tail] = p;
	else
		kp->lru_head = p;
	kp->lru_tail = p;
	kp->n_cached++;
}

static void table_remove(struct kv_pages *kp, int32_t p)
{
	int32_t *link = &kp->bucket[kp->hash[p] & kp->bucket_mask];
	while (*link != p) {
		ASSERT(*link >= 0);
		link = &kp->hnext[*link];
	}
	*link = kp->hnext[p];
	kp->published[p] = 0;
}

/* The published entry standing for tokens[0..64) after the chain state (hash h already
 * chained), or -1. */
static int32_t table_find(const struct kv_pages *kp, uint64_t h, uint32_t uid,
			  const int32_t *tokens, int32_t parent, uint32_t parent_gen)
{
	for (int32_t p = kp->bucket[h & kp->bucket_mask]; p >= 0; p = kp->hnext[p]) {
		if (kp->hash[p] != h || kp->uid[p] != uid || kp->parent[p] != parent)
			continue;
		if (parent >= 0 && kp->parent_gen[p] != parent_gen)
			continue;
		if (memcmp(kp->tokens + (size_t)p * T, tokens, T * sizeof *tokens))
			continue;
		return p;
	}
	return -1;
}

/* ---- pages -------------------------------------------------------------------------------- */

static int32_t page_alloc(struct kv_pages *kp)
{
	int32_t p;
	if (kp->n_free > 0) {
		p = kp->free_stack[--kp->n_free];
	} else {
		p = kp->lru_head;
		ASSERT(p >= 0);
		lru_unlink(kp, p);
		table_remove(kp, p);
		kp->n_evicted++;
	}
	ASSERT(kp->ref[p] == 0 && !kp->published[p]);
	kp->ref[p] = 1;
	kp->gen[p]++;
	return p;
}

static void page_unref(struct kv_pages *kp, int32_t p)
{
	ASSERT(kp->ref[p] > 0);
	if (--kp->ref[p] > 0)
		return;
	if (kp->published[p])
		lru_append(kp, p);
	else
		kp->free_stack[kp->n_free++] = p;
}

static int bt_grow(struct kv_seq *s, int64_t n)
{
	if (n <= s->cap)
		return 0;
	int64_t cap = s->cap ? s->cap : 8;
	while (cap < n)
		cap *= 2;
	int32_t *bt = realloc(s->bt, (size_t)cap * sizeof *bt);
	if (!bt)
		return -ENOMEM;
	s->bt = bt;
	s->cap = cap;
	return 0;
}

static void chain_reset(struct kv_seq *s)
{
	s->n_published = 0;
	s->chain_hash = 0;
	s->chain_page = -1;
	s->chain_gen = 0;
}

/* Walks the verified chain for tokens[0..n); calls back nothing, returns the hit pages. */
void kv_pages_peek(const struct kv_pages *kp, uint32_t uid, const int32_t *tokens, int64_t n,
		   int64_t *n_hit, int64_t *n_hit_cached)
{
	int64_t maxp = n > 0 ? (n - 1) / T : 0, k = 0, cached = 0;
	uint64_t h = 0;
	int32_t parent = -1;
	uint32_t pgen = 0;
	for (; k < maxp; k++) {
		h = kv_pages_hash(h, uid, tokens + k * T) & kp->hash_mask;
		int32_t p = table_find(kp, h, uid, tokens + k * T, parent, pgen);
		if (p < 0)
			break;
		cached += kp->ref[p] == 0;
		parent = p;
		pgen = kp->gen[p];
	}
	*n_hit = k;
	*n_hit_cached = cached;
}

int64_t kv_pages_match(struct kv_pages *kp, struct kv_seq *s, const int32_t *tokens, int64_t n)
{
	ASSERT(s->n_blocks == 0);
	chain_reset(s);
	int64_t maxp = n > 0 ? (n - 1) / T : 0;
	if (bt_grow(s, maxp) < 0)
		return -ENOMEM;
	kp->n_lookup_pages += (uint64_t)maxp;
	for (int64_t k = 0; k < maxp; k++) {
		uint64_t h = kv_pages_hash(s->chain_hash, s->uid, tokens + k * T) & kp->hash_mask;
		int32_t p = table_find(kp, h, s->uid, tokens + k * T, s->chain_page, s->chain_gen);
		if (p < 0)
			break;
		if (kp->ref[p]++ == 0)
			lru_unlink(kp, p);
		s->bt[s->n_blocks++] = p;
		s->n_published++;
		s->chain_hash = h;
		s->chain_page = p;
		s->chain_gen = kp->gen[p];
		kp->n_hit_pages++;
	}
	return s->n_blocks * T;
}

int kv_pages_reserve(struct kv_pages *kp, struct kv_seq *s, int64_t n_tokens)
{
	int64_t need = kv_pages_for(n_tokens) - s->n_blocks;
	if (need <= 0)
		return 0;
	if (need > kv_pages_available(kp) || bt_grow(s, s->n_blocks + need) < 0)
		return -ENOMEM;
	for (int64_t i = 0; i < need; i++)
		s->bt[s->n_blocks++] = page_alloc(kp);
	return 0;
}

void kv_pages_publish(struct kv_pages *kp, struct kv_seq *s, const int32_t *tokens,
		      int64_t n_computed)
{
	while ((s->n_published + 1) * T <= n_computed && s->n_published < s->n_blocks) {
		int64_t b = s->n_published;
		const int32_t *tk = tokens + b * T;
		uint64_t h = kv_pages_hash(s->chain_hash, s->uid, tk) & kp->hash_mask;
		int32_t p = table_find(kp, h, s->uid, tk, s->chain_page, s->chain_gen);
		if (p < 0) { /* not cached yet: this sequence's page becomes the entry */
			p = s->bt[b];
			ASSERT(!kp->published[p] && kp->ref[p] > 0);
			kp->hash[p] = h;
			kp->uid[p] = s->uid;
			kp->parent[p] = s->chain_page;
			kp->parent_gen[p] = s->chain_page >= 0 ? s->chain_gen : 0;
			memcpy(kp->tokens + (size_t)p * T, tk, T * sizeof *tk);
			int32_t *head = &kp->bucket[h & kp->bucket_mask];
			kp->hnext[p] = *head;
			*head = p;
			kp->published[p] = 1;
		}
		s->n_published++;
		s->chain_hash = h;
		s->chain_page = p;
		s->chain_gen = kp->gen[p];
	}
}

void kv_pages_release(struct kv_pages *kp, struct kv_seq *s)
{
	for (int64_t b = s->n_blocks - 1; b >= 0; b--)
		page_unref(kp, s->bt[b]);
	s->n_blocks = 0;
	chain_reset(s);
}

void kv_seq_free(struct kv_seq *s)
{
	free(s->bt);
	memset(s, 0, sizeof *s);
}

/* ---- invariants --------------------------------------------------------------------------- */

int kv_pages_check(const struct kv_pages *kp, const struct kv_seq *const *seqs, int64_t n_seqs,
		   struct err *e)
{
	int64_t N = kp->n_pages;
	int32_t *cnt = calloc((size_t)N, sizeof *cnt);
	uint8_t *where = calloc((size_t)N, 1); /* 1 free stack, 2 LRU, 4 bucket */
	int64_t *last = malloc((size_t)N * sizeof *last);
	int rc = 0;
	if (!cnt || !where || !last) {
		rc = err_set(e, -ENOMEM, "kv_pages_check: out of memory");
		goto out;
	}
	for (int64_t i = 0; i < N; i++)
		last[i] = -1;
	for (int64_t i = 0; i < n_seqs; i++) {
		const struct kv_seq *s = seqs[i];
		if (s->n_published > s->n_blocks) {
			rc = err_set(e, -EFAULT, "seq %lld: %lld published > %lld blocks",
				     (long long)i, (long long)s->n_published,
				     (long long)s->n_blocks);
			goto out;
		}
		for (int64_t b = 0; b < s->n_blocks; b++) {
			int32_t p = s->bt[b];
			if (p < 0 || p >= N) {
				rc = err_set(e, -EFAULT, "seq %lld block %lld: page %d out of range",
					     (long long)i, (long long)b, p);
				goto out;
			}
			if (last[p] == i) {
				rc = err_set(e, -EFAULT, "seq %lld: page %d twice in its table",
					     (long long)i, p);
				goto out;
			}
			last[p] = i;
			cnt[p]++;
		}
	}
	for (int64_t i = 0; i < kp->n_free; i++) {
		int32_t p = kp->free_stack[i];
		if (p < 0 || p >= N || where[p]) {
			rc = err_set(e, -EFAULT, "free stack: page %d bad or repeated", p);
			goto out;
		}
		where[p] |= 1;
	}
	int64_t n_lru = 0;
	for (int32_t p = kp->lru_head, prev = -1; p >= 0; prev = p, p = kp->lru_next[p]) {
		if (p >= N || (where[p] & 3) || kp->lru_prev[p] != prev || ++n_lru > N) {
			rc = err_set(e, -EFAULT, "LRU list broken at page %d", p);
			goto out;
		}
		where[p] |= 2;
		if (kp->lru_next[p] < 0 && kp->lru_tail != p) {
			rc = err_set(e, -EFAULT, "LRU tail %d != last %d", kp->lru_tail, p);
			goto out;
		}
	}
	if (n_lru != kp->n_cached) {
		rc = err_set(e, -EFAULT, "LRU holds %lld pages, n_cached %lld", (long long)n_lru,
			     (long long)kp->n_cached);
		goto out;
	}
	for (uint64_t bkt = 0; bkt <= kp->bucket_mask; bkt++)
		for (int32_t p = kp->bucket[bkt]; p >= 0; p = kp->hnext[p]) {
			if (p >= N || (where[p] & 4) || !kp->published[p] ||
			    (kp->hash[p] & kp->bucket_mask) != bkt) {
				rc = err_set(e, -EFAULT, "hash bucket %llu: page %d bad",
					     (unsigned long long)bkt, p);
				goto out;
			}
			where[p] |= 4;
		}
	for (int64_t p = 0; p < N; p++) {
		const char *bad = NULL;
		if (kp->ref[p] != cnt[p])
			bad = "ref count differs from block-table entries";
		else if (kp->published[p] != !!(where[p] & 4))
			bad = "published flag differs from the hash table";
		else if (cnt[p] > 0 && (where[p] & 3))
			bad = "used page on the free stack or LRU";
		else if (cnt[p] == 0 && kp->published[p] && where[p] != (2 | 4))
			bad = "unreferenced published page not in the LRU";
		else if (cnt[p] == 0 && !kp->published[p] && where[p] != 1)
			bad = "unreferenced unpublished page not on the free stack";
		if (bad) {
			rc = err_set(e, -EFAULT, "page %lld: %s (ref %d, entries %d, where %d)",
				     (long long)p, bad, kp->ref[p], cnt[p], where[p]);
			goto out;
		}
	}
out:
	free(cnt);
	free(where);
	free(last);
	return rc;
}
