/*
 * tokenizer_int.h — the insides of struct tokenizer, shared by tokenizer.c (loading, lookups,
 * decoding) and tokenizer_encode.c (pre-tokenizer scanner, BPE, word cache). Not a public API.
 */
#ifndef DSV32_TOKENIZER_INT_H
#define DSV32_TOKENIZER_INT_H

#include <pthread.h>
#include <stdint.h>

#include "model/tokenizer.h"

/* One step of the pre-tokenizer Sequence: a Split (behavior Isolated) with a known pattern. */
enum tok_split {
	TOK_SPLIT_DIGITS3, /* \p{N}{1,3} */
	TOK_SPLIT_CJK,     /* [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+ */
	TOK_SPLIT_MAIN,    /* DeepSeek's main pattern (see tokenizer_encode.c) */
};
#define TOK_MAX_STEPS 8

struct tok_added {
	const char *content; /* NUL-terminated, in the tokenizer's pool */
	uint32_t len;
	int32_t id;
	uint8_t special, lstrip, rstrip, single_word, normalized;
};

/* Added-token trie over bytes: children in a sibling list. */
struct tok_trie {
	uint32_t child, sibling; /* node indices, 0 = none (node 0 is the root) */
	int32_t added;           /* index into added[] of the token ending here, or -1 */
	uint8_t byte;
};

/* Merge table: (left id, right id) -> rank and merged id; open addressing, key ~0 = empty. */
struct tok_merge {
	uint64_t key; /* (uint64_t)left << 32 | right */
	uint32_t rank;
	int32_t id;
};

/* Raw-bytes -> id map of the BPE vocab (for ignore_merges and building merges). */
struct tok_vslot {
	uint64_t hash;
	int32_t id; /* -1 = empty */
};

struct tok_cache; /* the word cache, tokenizer_encode.c */

struct tokenizer {
	uint32_t n_ids;     /* max id + 1 */
	uint32_t *tok_off;  /* (n_ids) offset of each id's decoded bytes in tok_pool */
	int32_t *tok_len;   /* (n_ids) their length, -1 for an unknown id */
	uint8_t *tok_flags; /* (n_ids) bit 0: added token, bit 1: special */
	char *tok_pool;

	uint32_t *voc_off; /* (n_ids) raw bytes of the BPE vocab entry, in voc_pool */
	int32_t *voc_len;  /* (n_ids) -1 if the id has no byte-level vocab entry */
	char *voc_pool;
	struct tok_vslot *vmap; /* (vmask + 1) */
	uint32_t vmask;

	int32_t byte_id[256]; /* id of each single byte */
	struct tok_bpair { uint32_t rank; int32_t id; } *bpair; /* (256 * 256) merges of two bytes:
								   a word's first lookups */
	struct tok_merge *merges; /* (mmask + 1) */
	uint32_t mmask;
	uint32_t n_merges;
	int ignore_merges;

	struct tok_added *added; /* (n_added) in file order */
	size_t n_added;
	char *added_pool;
	struct tok_trie *trie; /* (n_trie) */
	uint32_t n_trie;
	uint8_t added_first[256]; /* 1 if some added token starts with this byte */
	int added_first_only;     /* that byte if it is the only one (memchr finds them), else -1 */

	enum tok_split steps[TOK_MAX_STEPS];
	int n_steps;

	struct tok_cache *cache;
};

uint64_t tok_hash(const void *p, size_t n);
int32_t tok_vocab_find(const struct tokenizer *t, const void *p, size_t n);

static inline const struct tok_merge *tok_merge_find(const struct tokenizer *t, int32_t a,
						     int32_t b)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	uint32_t i = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & t->mmask;
	for (;;) {
		const struct tok_merge *m = &t->merges[i];
		if (m->key == key)
			return m;
		if (m->key == ~0ull)
			return NULL;
		i = (i + 1) & t->mmask;
	}
}

int tok_cache_init(struct tokenizer *t);
void tok_cache_free(struct tokenizer *t);

#endif
