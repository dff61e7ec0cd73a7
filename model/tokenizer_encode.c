/*
 * tokenizer_encode.c — text -> ids: added-token splitting, the pre-tokenizer scanner, BPE and
 * the word cache.
 *
 * Owns: a hand-written scanner that reproduces, on byte positions of valid UTF-8 text, what the
 * reference's JavaScript regexes (flag "u") split; the BPE merge loop; the bounded word cache.
 * Must not: allocate per word, read outside the text, or depend on anything but the class
 * tables in unicode_tables.c for character properties.
 *
 * The Split steps (behavior Isolated: both the matches and the text between them become pieces,
 * each fed to the next step; the last step's pieces are BPE words):
 *   DIGITS3  \p{N}{1,3}                       runs of numbers cut into threes from the left
 *   CJK      [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+
 *   MAIN     A [!-/:-@[-`{-~][A-Za-z]+        one ASCII punctuation + ASCII letters
 *          | B [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
 *          | C  ?[\p{P}\p{S}]+[\r\n]*
 *          | D \s*[\r\n]+                     (backtracks to the last \r or \n of the \s run)
 *          | E \s+(?!\S)                      (the \s run, less its last char unless at the end)
 *          | F \s+
 *   The alternatives are tried in order at each position, as a backtracking regex does; the
 *   piece boundaries are the pieces of the previous step, so "end of text" in E means the end of
 *   the piece. Characters where nothing matches collect into one piece.
 *
 * BPE: the lowest-ranked adjacent pair merges first, the leftmost on a tie (the reference's
 * rank + position/length score); words of up to BPE_SMALL bytes use a linear scan, longer ones a
 * heap with lazy invalidation.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/detok.h"
#include "model/tokenizer_int.h"
#include "model/unicode_tables.h"

#define CLS_CRLF 0x80 /* \r or \n, alongside the unicode_class_bit bits */
#define CLS_LM (UNI_L | UNI_M)
#define CLS_PS (UNI_P | UNI_S)

#define BPE_SMALL 48
#define CACHE_SLOTS (1u << 15)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 4 * 3)
#define CACHE_MAX_KEY 4096 /* long words cost the most BPE work, so they are worth keeping */
#define CACHE_KEY_BYTES (2u << 20)
#define CACHE_IDS (512u << 10)

/* ---- word cache ----------------------------------------------------------------------------- */

struct tok_cslot { /* 32 bytes: a short word's lookup touches only its slot */
	uint64_t head;     /* the word's first 8 bytes, zero-padded */
	uint32_t tail_off; /* bytes 8.. of the word in keys[], when key_len > 8 */
	uint16_t key_len;  /* 0: empty slot */
	uint16_t n_ids;
	int32_t ids[4];    /* the ids when n_ids <= 4, else ids[0] = their offset in ids[] */
};

struct tok_cache {
	pthread_mutex_t lock; /* held for a whole encode call, taken only with trylock */
	struct tok_cslot *slots; /* (CACHE_SLOTS) */
	uint32_t n;
	uint8_t *keys; /* (CACHE_KEY_BYTES) */
	uint32_t keys_used;
	int32_t *ids; /* (CACHE_IDS) */
	uint32_t ids_used;
};

int tok_cache_init(struct tokenizer *t)
{
	struct tok_cache *c = calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
	c->keys = malloc(CACHE_KEY_BYTES);
	c->ids = malloc(CACHE_IDS * sizeof *c->ids);
	pthread_mutex_init(&c->lock, NULL);
	t->cache = c;
	return c->slots && c->keys && c->ids ? 0 : -ENOMEM;
}

void tok_cache_free(struct tokenizer *t)
{
	struct tok_cache *c = t->cache;
	if (!c)
		return;
	pthread_mutex_destroy(&c->lock);
	free(c->slots);
	free(c->keys);
	free(c->ids);
	free(c);
	t->cache = NULL;
}

static inline uint64_t word_head(const uint8_t *w, uint32_t n)
{
	uint64_t h = 0;
	memcpy(&h, w, n < 8 ? n : 8);
	return h;
}

static inline uint32_t word_hash(uint64_t head, const uint8_t *w, uint32_t n)
{
	if (n <= 8) {
		uint64_t x = (head ^ ((uint64_t)n << 59)) * 0x9e3779b97f4a7c15ull;
		return (uint32_t)(x >> 32);
	}
	return (uint32_t)tok_hash(w, n);
}

static const struct tok_cslot *cache_find(const struct tok_cache *c, uint32_t h, uint64_t head,
					  const uint8_t *w, uint32_t n)
{
	for (uint32_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
		const struct tok_cslot *s = &c->slots[i];
		if (!s->key_len)
			return NULL;
		if (s->head == head && s->key_len == n &&
		    (n <= 8 || !memcmp(c->keys + s->tail_off, w + 8, n - 8)))
			return s;
	}
}

static void cache_put(struct tok_cache *c, uint32_t h, uint64_t head, const uint8_t *w,
		      uint32_t n, const int32_t *ids, uint32_t n_ids)
{
	if (n_ids > UINT16_MAX)
		return;
	uint32_t key_extra = n > 8 ? n - 8 : 0, ids_extra = n_ids > 4 ? n_ids : 0;
	if (c->n >= CACHE_MAX_ENTRIES || c->keys_used + key_extra > CACHE_KEY_BYTES ||
	    c->ids_used + ids_extra > CACHE_IDS) {
		/* Full: start over (cheaper than LRU bookkeeping; a text's words refill it). */
		memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
		c->n = c->keys_used = c->ids_used = 0;
	}
	uint32_t i = h & (CACHE_SLOTS - 1);
	while (c->slots[i].key_len)
		i = (i + 1) & (CACHE_SLOTS - 1);
	struct tok_cslot *s = &c->slots[i];
	s->head = head;
	s->key_len = (uint16_t)n;
	s->n_ids = (uint16_t)n_ids;
	s->tail_off = c->keys_used;
	if (key_extra)
		memcpy(c->keys + c->keys_used, w + 8, key_extra);
	c->keys_used += key_extra;
	if (n_ids <= 4) {
		memcpy(s->ids, ids, n_ids * sizeof *ids);
	} else {
		s->ids[0] = (int32_t)c->ids_used;
		memcpy(c->ids + c->ids_used, ids, n_ids * sizeof *ids);
		c->ids_used += n_ids;
	}
	c->n++;
}

/* ---- the encoder's state -------------------------------------------------------------------- */

struct enc {
	const struct tokenizer *t;
	const uint8_t *s; /* valid UTF-8 */
	struct tokenizer_ids *out;
	struct tok_cache *cache; /* NULL when not held */
	const struct tokenizer_span *allow; /* NULL: added tokens anywhere; else only inside these */
	size_t n_allow;
	int err;
	/* scratch of the heap BPE, (cap) each: symbol, neighbours, and the rank and merged id of
	 * the pair that starts at each node (kept current, so heap entries validate without a
	 * hash lookup) */
	int32_t *sym, *prev, *next, *pid;
	uint32_t *prank;
	uint64_t *heap;
	size_t cap;
};

static uint8_t ascii_cls[128];

static void ascii_cls_build(void)
{
	for (int c = 0; c < 128; c++)
		ascii_cls[c] = (uint8_t)(unicode_class((uint32_t)c) |
					 (c == '\r' || c == '\n' ? CLS_CRLF : 0));
}

/* Class bits of the character at s[i] (valid UTF-8) and its length. */
static inline uint32_t cls_at(const uint8_t *s, uint32_t i, uint32_t *len)
{
	uint32_t c = s[i], cp;
	if (c < 0x80) {
		*len = 1;
		return ascii_cls[c];
	}
	if (c < 0xe0) {
		cp = (c & 0x1f) << 6 | (s[i + 1] & 0x3f);
		*len = 2;
	} else if (c < 0xf0) {
		cp = (c & 0x0f) << 12 | (uint32_t)(s[i + 1] & 0x3f) << 6 | (s[i + 2] & 0x3f);
		*len = 3;
	} else {
		cp = (c & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3f) << 12 |
		     (uint32_t)(s[i + 2] & 0x3f) << 6 | (s[i + 3] & 0x3f);
		*len = 4;
	}
	return unicode_class(cp);
}

/* Start of the character that ends at s[e] (exclusive). */
static inline uint32_t char_before(const uint8_t *s, uint32_t e)
{
	do
		e--;
	while ((s[e] & 0xc0) == 0x80);
	return e;
}

static int out_grow(struct enc *E, size_t need)
{
	struct tokenizer_ids *o = E->out;
	size_t cap = o->cap ? o->cap : 256;
	while (cap < o->n + need)
		cap *= 2;
	int32_t *v = realloc(o->v, cap * sizeof *v);
	if (!v) {
		E->err = -ENOMEM;
		return -ENOMEM;
	}
	o->v = v;
	o->cap = cap;
	return 0;
}

static inline void push(struct enc *E, int32_t id)
{
	struct tokenizer_ids *o = E->out;
	if (o->n == o->cap && out_grow(E, 1))
		return;
	o->v[o->n++] = id;
}

/* ---- BPE ------------------------------------------------------------------------------------ */

static inline uint32_t pair_rank(const struct tokenizer *t, int32_t a, int32_t b, int32_t *id)
{
	const struct tok_merge *m = tok_merge_find(t, a, b);
	if (!m)
		return UINT32_MAX;
	*id = m->id;
	return m->rank;
}

static void bpe_small(struct enc *E, const uint8_t *w, uint32_t n)
{
	const struct tokenizer *t = E->t;
	int32_t sym[BPE_SMALL], mid[BPE_SMALL];
	uint32_t rk[BPE_SMALL];
	for (uint32_t i = 0; i < n; i++)
		sym[i] = t->byte_id[w[i]];
	for (uint32_t i = 0; i + 1 < n; i++) {
		const struct tok_bpair *bp = &t->bpair[w[i] << 8 | w[i + 1]];
		rk[i] = bp->rank;
		mid[i] = bp->id;
	}
	uint32_t m = n;
	while (m > 1) {
		uint32_t best = UINT32_MAX, k = 0;
		for (uint32_t i = 0; i + 1 < m; i++)
			if (rk[i] < best)
				best = rk[i], k = i;
		if (best == UINT32_MAX)
			break;
		sym[k] = mid[k];
		m--;
		memmove(sym + k + 1, sym + k + 2, (m - k - 1) * sizeof *sym);
		memmove(rk + k + 1, rk + k + 2, (m - k - 1) * sizeof *rk);
		memmove(mid + k + 1, mid + k + 2, (m - k - 1) * sizeof *mid);
		if (k > 0)
			rk[k - 1] = pair_rank(t, sym[k - 1], sym[k], &mid[k - 1]);
		if (k + 1 < m)
			rk[k] = pair_rank(t, sym[k], sym[k + 1], &mid[k]);
	}
	for (uint32_t i = 0; i < m; i++)
		push(E, sym[i]);
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
	size_t i = (*n)++;
	while (i && h[(i - 1) / 2] > v) {
		h[i] = h[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
	uint64_t top = h[0], v = h[--*n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && h[c + 1] < h[c])
			c++;
		if (h[c] >= v)
			break;
		h[i] = h[c];
		i = c;
	}
	h[i] = v;
	return top;
}

/* Recomputes the pair that starts at node i and pushes it keyed (rank, i): i is the original
 * position of the pair's left symbol, which orders ties leftmost first. */
static void heap_pair(struct enc *E, size_t *hn, int32_t i)
{
	int32_t j = E->next[i];
	E->prank[i] = j < 0 ? UINT32_MAX : pair_rank(E->t, E->sym[i], E->sym[j], &E->pid[i]);
	if (E->prank[i] != UINT32_MAX)
		heap_push(E->heap, hn, (uint64_t)E->prank[i] << 32 | (uint32_t)i);
}

static int bpe_scratch(struct enc *E, uint32_t n)
{
	if (n <= E->cap)
		return 0;
	size_t cap = E->cap ? E->cap : 256;
	while (cap < n)
		cap *= 2;
	free(E->sym);
	free(E->prev);
	free(E->next);
	free(E->pid);
	free(E->prank);
	free(E->heap);
	E->sym = malloc(cap * sizeof *E->sym);
	E->prev = malloc(cap * sizeof *E->prev);
	E->next = malloc(cap * sizeof *E->next);
	E->pid = malloc(cap * sizeof *E->pid);
	E->prank = malloc(cap * sizeof *E->prank);
	/* Each merge pushes at most two entries: n initial + 2 n. */
	E->heap = malloc(3 * cap * sizeof *E->heap);
	E->cap = cap;
	if (!E->sym || !E->prev || !E->next || !E->pid || !E->prank || !E->heap) {
		E->cap = 0;
		E->err = -ENOMEM;
		return -ENOMEM;
	}
	return 0;
}

static void bpe_large(struct enc *E, const uint8_t *w, uint32_t n)
{
	if (bpe_scratch(E, n))
		return;
	for (uint32_t i = 0; i < n; i++) {
		E->sym[i] = E->t->byte_id[w[i]];
		E->prev[i] = (int32_t)i - 1;
		E->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
	}
	size_t hn = 0;
	for (uint32_t i = 0; i < n; i++)
		heap_pair(E, &hn, (int32_t)i);
	while (hn) {
		uint64_t top = heap_pop(E->heap, &hn);
		int32_t i = (int32_t)(uint32_t)top, j = E->next[i];
		/* Stale if i was absorbed, or its pair changed since (a pair's rank names it). */
		if (E->sym[i] < 0 || E->prank[i] != (uint32_t)(top >> 32))
			continue;
		E->sym[i] = E->pid[i];
		E->sym[j] = -1;
		E->next[i] = E->next[j];
		if (E->next[j] >= 0)
			E->prev[E->next[j]] = i;
		if (E->prev[i] >= 0)
			heap_pair(E, &hn, E->prev[i]);
		heap_pair(E, &hn, i);
	}
	for (int32_t i = 0; i >= 0; i = E->next[i])
		push(E, E->sym[i]);
}

/* One pre-tokenized word: bytes s[b..e). */
static void word(struct enc *E, uint32_t b, uint32_t e)
{
	const struct tokenizer *t = E->t;
	const uint8_t *w = E->s + b;
	uint32_t n = e - b;
	if (n == 1) {
		push(E, t->byte_id[w[0]]);
		return;
	}
	if (t->ignore_merges) {
		int32_t id = tok_vocab_find(t, w, n);
		if (id >= 0) {
			push(E, id);
			return;
		}
	}
	uint64_t head = 0;
	uint32_t h = 0;
	if (E->cache && n <= CACHE_MAX_KEY) {
		head = word_head(w, n);
		h = word_hash(head, w, n);
		const struct tok_cslot *c = cache_find(E->cache, h, head, w, n);
		if (c) {
			struct tokenizer_ids *o = E->out;
			if (o->n + c->n_ids > o->cap && out_grow(E, c->n_ids))
				return;
			const int32_t *src = c->n_ids <= 4 ? c->ids : E->cache->ids + c->ids[0];
			memcpy(o->v + o->n, src, c->n_ids * sizeof *o->v);
			o->n += c->n_ids;
			return;
		}
	}
	size_t start = E->out->n;
	if (n <= BPE_SMALL)
		bpe_small(E, w, n);
	else
		bpe_large(E, w, n);
	if (E->cache && n <= CACHE_MAX_KEY && !E->err)
		cache_put(E->cache, h, head, w, n, E->out->v + start, (uint32_t)(E->out->n - start));
}

/* ---- the pre-tokenizer scanner ---------------------------------------------------------- */

static void split(struct enc *E, int lvl, uint32_t b, uint32_t e);

static inline void piece(struct enc *E, int lvl, uint32_t b, uint32_t e)
{
	if (lvl + 1 == E->t->n_steps)
		word(E, b, e);
	else
		split(E, lvl + 1, b, e);
}

static inline int ascii_alpha(uint8_t c) { return (uint8_t)((c | 0x20) - 'a') < 26; }

static inline uint32_t run_of(const uint8_t *s, uint32_t i, uint32_t e, uint32_t bits)
{
	uint32_t l;
	while (i < e && (cls_at(s, i, &l) & bits))
		i += l;
	return i;
}

/* End of the MAIN match at s[i] (class c, length l) within a piece ending at e, or 0. */
static uint32_t match_main(const uint8_t *s, uint32_t i, uint32_t c, uint32_t l, uint32_t e)
{
	uint8_t b = s[i];
	uint32_t l2, c2;
	/* A: one ASCII punctuation character, then ASCII letters. */
	if (b < 0x80 && (c & CLS_PS) && i + 1 < e && ascii_alpha(s[i + 1])) {
		uint32_t j = i + 2;
		while (j < e && ascii_alpha(s[j]))
			j++;
		return j;
	}
	/* B: [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ */
	if (c & CLS_LM)
		return run_of(s, i + l, e, CLS_LM);
	if (!(c & (CLS_CRLF | UNI_L | CLS_PS)) && i + l < e &&
	    (cls_at(s, i + l, &l2) & CLS_LM))
		return run_of(s, i + l + l2, e, CLS_LM);
	/* C: " ?[\p{P}\p{S}]+[\r\n]*" */
	uint32_t k = i;
	if (b == ' ' && i + 1 < e && ((c2 = cls_at(s, i + 1, &l2)) & CLS_PS))
		k = i + 1;
	if (k > i || (c & CLS_PS)) {
		uint32_t j = run_of(s, k, e, CLS_PS);
		while (j < e && (s[j] == '\r' || s[j] == '\n'))
			j++;
		return j;
	}
	/* D, E, F: runs of \s. */
	if (c & UNI_WS) {
		uint32_t j = i, last = i, nl_end = 0, cj, lj;
		while (j < e && ((cj = cls_at(s, j, &lj)) & UNI_WS)) {
			if (cj & CLS_CRLF)
				nl_end = j + 1;
			last = j;
			j += lj;
		}
		if (nl_end)
			return nl_end; /* D */
		if (j == e || last == i)
			return j; /* E at the end of the piece, or F for a single char */
		return last;      /* E: leave the last \s to go with what follows */
	}
	return 0;
}

static void split(struct enc *E, int lvl, uint32_t b, uint32_t e)
{
	const uint8_t *s = E->s;
	enum tok_split kind = E->t->steps[lvl];
	uint32_t i = b, g = b, l, j;
	while (i < e && !E->err) {
		uint32_t c = cls_at(s, i, &l);
		switch (kind) {
		case TOK_SPLIT_DIGITS3:
			j = i;
			if (c & UNI_N) {
				j = i + l;
				for (int k = 1; k < 3 && j < e && (cls_at(s, j, &l) & UNI_N); k++)
					j += l;
			}
			break;
		case TOK_SPLIT_CJK:
			j = (c & UNI_CJK) ? run_of(s, i, e, UNI_CJK) : i;
			break;
		default:
			j = match_main(s, i, c, l, e);
			if (!j)
				j = i;
			break;
		}
		if (j == i) {
			i += l;
			continue;
		}
		if (g < i)
			piece(E, lvl, g, i);
		piece(E, lvl, i, j);
		i = g = j;
	}
	if (g < e && !E->err)
		piece(E, lvl, g, e);
}

/* DIGITS3 then CJK in one pass (DeepSeek's first two steps): since no CJK/kana character is a
 * number, their composition cuts the text into number groups, CJK runs and the maximal runs of
 * everything else, which is what this does; each piece goes on to step 2. */
static void split_digits_cjk(struct enc *E, uint32_t b, uint32_t e)
{
	const uint8_t *s = E->s;
	uint32_t i = b, g = b, l, j;
	while (i < e && !E->err) {
		uint32_t c = cls_at(s, i, &l);
		if (c & UNI_N) {
			j = i + l;
			for (int k = 1; k < 3 && j < e && (cls_at(s, j, &l) & UNI_N); k++)
				j += l;
		} else if (c & UNI_CJK) {
			j = run_of(s, i + l, e, UNI_CJK);
		} else {
			i += l;
			continue;
		}
		if (g < i)
			piece(E, 1, g, i);
		piece(E, 1, i, j);
		i = g = j;
	}
	if (g < e && !E->err)
		piece(E, 1, g, e);
}

static void section(struct enc *E, uint32_t b, uint32_t e)
{
	const struct tokenizer *t = E->t;
	if (b >= e)
		return;
	if (t->n_steps >= 2 && t->steps[0] == TOK_SPLIT_DIGITS3 && t->steps[1] == TOK_SPLIT_CJK)
		split_digits_cjk(E, b, e);
	else if (t->n_steps)
		split(E, 0, b, e);
	else
		word(E, b, e);
}

/* ---- added tokens --------------------------------------------------------------------------- */

static int is_word_char(const uint8_t *s, uint32_t i)
{
	uint32_t l;
	return s[i] == '_' || (cls_at(s, i, &l) & (UNI_L | UNI_N));
}

/* The added token matched at s[i] (leftmost-longest, honouring single_word), or -1; *end. */
static int32_t match_added(const struct enc *E, uint32_t i, uint32_t len, uint32_t *end)
{
	const struct tokenizer *t = E->t;
	uint32_t node = 0, cand[64], cend[64], nc = 0;
	for (uint32_t j = i; j < len; j++) {
		uint32_t ch = t->trie[node].child;
		while (ch && t->trie[ch].byte != E->s[j])
			ch = t->trie[ch].sibling;
		if (!ch)
			break;
		node = ch;
		if (t->trie[node].added >= 0) {
			if (nc == 64) { /* keep the 64 longest */
				nc--;
				memmove(cand, cand + 1, nc * sizeof *cand);
				memmove(cend, cend + 1, nc * sizeof *cend);
			}
			cand[nc] = (uint32_t)t->trie[node].added;
			cend[nc++] = j + 1;
		}
	}
	while (nc--) {
		const struct tok_added *a = &t->added[cand[nc]];
		if (a->single_word && ((i > 0 && is_word_char(E->s, char_before(E->s, i))) ||
				       (cend[nc] < len && is_word_char(E->s, cend[nc]))))
			continue;
		*end = cend[nc];
		return (int32_t)cand[nc];
	}
	return -1;
}

static uint32_t trim_start(const uint8_t *s, uint32_t b, uint32_t e)
{
	uint32_t l;
	while (b < e && (cls_at(s, b, &l) & UNI_WS))
		b += l;
	return b;
}

static uint32_t trim_end(const uint8_t *s, uint32_t b, uint32_t e)
{
	uint32_t l;
	while (e > b) {
		uint32_t k = char_before(s, e);
		if (!(cls_at(s, k, &l) & UNI_WS))
			break;
		e = k;
	}
	return e;
}

/* 1 if [b, e) lies inside one allowed span (or no spans were given). */
static int allowed(const struct enc *E, uint32_t b, uint32_t e)
{
	if (!E->allow)
		return 1;
	size_t lo = 0, hi = E->n_allow; /* the last span starting at or before b */
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;
		if (E->allow[mid].off <= b)
			lo = mid;
		else
			hi = mid;
	}
	const struct tokenizer_span *sp = &E->allow[lo];
	return E->n_allow && sp->off <= b && e <= sp->off + sp->len;
}

static void encode_special(struct enc *E, uint32_t len)
{
	const struct tokenizer *t = E->t;
	uint32_t g = 0, i = 0, end;
	int strip_next = 0;
	while (i < len && !E->err) {
		if (t->added_first_only >= 0) {
			/* DeepSeek's added tokens all start with '<': jump between those. */
			const uint8_t *p = memchr(E->s + i, t->added_first_only, len - i);
			if (!p)
				break;
			i = (uint32_t)(p - E->s);
		}
		int32_t a = t->added_first[E->s[i]] ? match_added(E, i, len, &end) : -1;
		if (a < 0 || !allowed(E, i, end)) {
			i++;
			continue;
		}
		const struct tok_added *ad = &t->added[a];
		uint32_t tb = strip_next ? trim_start(E->s, g, i) : g;
		section(E, tb, ad->lstrip ? trim_end(E->s, tb, i) : i);
		push(E, ad->id);
		strip_next = ad->rstrip;
		i = g = end;
	}
	section(E, strip_next ? trim_start(E->s, g, len) : g, len);
}

/* ---- entry ------------------------------------------------------------------------------- */

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
		     struct tokenizer_ids *out)
{
	return tokenizer_encode_spans(t, text, len, NULL, 0, flags, out);
}

int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len,
			   const struct tokenizer_span *allow, size_t n_allow, unsigned flags,
			   struct tokenizer_ids *out)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, ascii_cls_build);
	if (len >= INT32_MAX)
		return -EOVERFLOW;
	struct sbuf fixed = {0};
	if (detok_valid_prefix(text, len) < len) {
		if ((flags & TOKENIZER_STRICT_UTF8) || allow) /* repair would move the spans */
			return -EILSEQ;
		detok_repair(text, len, &fixed);
		if (fixed.oom)
			return -ENOMEM;
		if (fixed.len >= INT32_MAX) {
			sbuf_free(&fixed);
			return -EOVERFLOW;
		}
		text = fixed.p;
		len = fixed.len;
	}
	struct enc E = {.t = t, .s = (const uint8_t *)text, .out = out, .allow = allow,
			.n_allow = n_allow};
	if (allow)
		flags |= TOKENIZER_SPECIAL;
	size_t n0 = out->n;
	if (!(flags & TOKENIZER_NO_CACHE) && !pthread_mutex_trylock(&t->cache->lock))
		E.cache = t->cache;
	if (flags & TOKENIZER_SPECIAL)
		encode_special(&E, (uint32_t)len);
	else
		section(&E, 0, (uint32_t)len);
	if (E.cache)
		pthread_mutex_unlock(&E.cache->lock);
	free(E.sym);
	free(E.prev);
	free(E.next);
	free(E.pid);
	free(E.prank);
	free(E.heap);
	sbuf_free(&fixed);
	if (E.err) {
		out->n = n0;
		return E.err;
	}
	return 0;
}

void tokenizer_ids_free(struct tokenizer_ids *ids)
{
	free(ids->v);
	ids->v = NULL;
	ids->n = ids->cap = 0;
}
