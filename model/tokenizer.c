/*
 * tokenizer.c — loading tokenizer.json into struct tokenizer, lookups and decoding.
 *
 * Owns: validation of everything tokenizer.json says about how text is tokenized (refusing, with
 * the field named, whatever tokenizer_encode.c does not implement), the id -> bytes table, the
 * merge table, the added-token trie.
 * Must not: keep the JSON tree after loading, or accept a file it would tokenize differently
 * from the reference.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/fileio.h"
#include "model/tokenizer_int.h"
#include "model/unicode_tables.h"

#define TOK_MAX_FILE (256u << 20)
#define TOK_MAX_IDS (1u << 24)

/* The three Split patterns of DeepSeek's pre-tokenizer, as tokenizer.json spells them. */
static const char pat_digits3[] = "\\p{N}{1,3}";
static const char pat_cjk[] = "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+";
static const char pat_main[] =
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
	" ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

/* ---- GPT-2 byte-level alphabet ------------------------------------------------------------ */

static uint16_t byte_to_cp[256]; /* byte -> code point of its byte-level character */
static int16_t cp_to_byte[324];  /* inverse, -1 where none */

static void bytelevel_build(void)
{
	int n = 0;
	for (int i = 0; i < 324; i++)
		cp_to_byte[i] = -1;
	for (int b = 0; b < 256; b++) {
		int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
		byte_to_cp[b] = (uint16_t)(printable ? b : 256 + n++);
		cp_to_byte[byte_to_cp[b]] = (int16_t)b;
	}
}

static void bytelevel_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, bytelevel_build);
}

/* Decodes a byte-level string (UTF-8 of alphabet characters) into raw bytes; out holds at
 * least n bytes. Returns the byte count, or -1 if s has a character outside the alphabet. */
static long bytelevel_decode(const char *s, size_t n, char *out)
{
	size_t i = 0, k = 0;
	while (i < n) {
		uint32_t cp;
		int l = utf8_decode((const unsigned char *)s + i, n - i, &cp);
		if (!l || cp >= 324 || cp_to_byte[cp] < 0)
			return -1;
		out[k++] = (char)cp_to_byte[cp];
		i += (size_t)l;
	}
	return (long)k;
}

/* ---- hashing ------------------------------------------------------------------------------ */

uint64_t tok_hash(const void *p, size_t n)
{
	const uint8_t *s = p;
	uint64_t h = 0x243f6a8885a308d3ull ^ (n * 0x9e3779b97f4a7c15ull);
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, s, 8);
		h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
		h ^= h >> 29;
		s += 8;
		n -= 8;
	}
	uint64_t w = 0;
	memcpy(&w, s, n);
	h = (h ^ w ^ ((uint64_t)n << 56)) * 0x94d049bb133111ebull;
	h ^= h >> 31;
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 32);
}

static uint32_t pow2_at_least(uint64_t n)
{
	uint32_t c = 16;
	while (c < n)
		c <<= 1;
	return c;
}

int32_t tok_vocab_find(const struct tokenizer *t, const void *p, size_t n)
{
	uint64_t h = tok_hash(p, n);
	for (uint32_t i = (uint32_t)h & t->vmask;; i = (i + 1) & t->vmask) {
		const struct tok_vslot *v = &t->vmap[i];
		if (v->id < 0)
			return -1;
		if (v->hash == h && (size_t)t->voc_len[v->id] == n &&
		    !memcmp(t->voc_pool + t->voc_off[v->id], p, n))
			return v->id;
	}
}

/* ---- load-time checks ---------------------------------------------------------------------- */

static int get_str(const struct json *o, const char *key, const char **s, struct err *e,
		   const char *name, const char *where)
{
	size_t len;
	int r = json_get_str(o, key, s, &len);
	if (r == 1)
		return 0;
	return err_set(e, -EINVAL, "%s: %s.%s: %s", name, where, key,
		       r == 0 ? "missing" : "not a string");
}

/* A member that must be absent, null, false or the empty string (an unimplemented option). */
static int must_be_off(const struct json *o, const char *key, struct err *e, const char *name,
		       const char *where)
{
	const struct json *v = json_get(o, key);
	if (!v || v->type == JSON_NULL || v->type == JSON_FALSE ||
	    (v->type == JSON_STRING && v->len == 0))
		return 0;
	return err_set(e, -ENOTSUP, "%s: %s.%s is set; this tokenizer does not implement it", name,
		       where, key);
}

static int check_normalizer(const struct json *n, struct err *e, const char *name)
{
	if (!n || n->type == JSON_NULL)
		return 0;
	const char *type;
	if (get_str(n, "type", &type, e, name, "normalizer"))
		return -EINVAL;
	const struct json *list = json_get(n, "normalizers");
	if (!strcmp(type, "Sequence") && list && list->type == JSON_ARRAY && list->n == 0)
		return 0;
	return err_set(e, -ENOTSUP,
		       "%s: normalizer: type \"%s\" is not implemented (only null or an empty "
		       "Sequence)",
		       name, type);
}

static int check_pretok_step(struct tokenizer *t, const struct json *s, int last, struct err *e,
			     const char *name)
{
	const char *type;
	if (get_str(s, "type", &type, e, name, "pre_tokenizer step"))
		return -EINVAL;
	if (!strcmp(type, "ByteLevel")) {
		if (!last)
			return err_set(e, -ENOTSUP,
				       "%s: pre_tokenizer: ByteLevel must be the last step", name);
		int b;
		if (json_get_bool(s, "add_prefix_space", &b) == 1 && b)
			return err_set(e, -ENOTSUP,
				       "%s: pre_tokenizer ByteLevel.add_prefix_space true is not "
				       "implemented",
				       name);
		if (json_get_bool(s, "use_regex", &b) != 1 || b)
			return err_set(e, -ENOTSUP,
				       "%s: pre_tokenizer ByteLevel.use_regex must be false (the "
				       "GPT-2 split is not implemented)",
				       name);
		return 0;
	}
	if (strcmp(type, "Split"))
		return err_set(e, -ENOTSUP, "%s: pre_tokenizer: step type \"%s\" is not implemented",
			       name, type);
	if (last)
		return err_set(e, -ENOTSUP, "%s: pre_tokenizer: must end with ByteLevel", name);
	const char *behavior, *re;
	if (get_str(s, "behavior", &behavior, e, name, "pre_tokenizer Split"))
		return -EINVAL;
	if (strcmp(behavior, "Isolated"))
		return err_set(e, -ENOTSUP,
			       "%s: pre_tokenizer Split.behavior \"%s\" is not implemented (only "
			       "Isolated)",
			       name, behavior);
	int inv;
	if (json_get_bool(s, "invert", &inv) == 1 && inv)
		return err_set(e, -ENOTSUP, "%s: pre_tokenizer Split.invert true is not implemented",
			       name);
	const struct json *pat = json_get(s, "pattern");
	if (!pat || pat->type != JSON_OBJECT || json_get_str(pat, "Regex", &re, &(size_t){0}) != 1)
		return err_set(e, -ENOTSUP,
			       "%s: pre_tokenizer Split.pattern must be {\"Regex\": ...} with a known "
			       "pattern",
			       name);
	enum tok_split k;
	if (!strcmp(re, pat_digits3))
		k = TOK_SPLIT_DIGITS3;
	else if (!strcmp(re, pat_cjk))
		k = TOK_SPLIT_CJK;
	else if (!strcmp(re, pat_main))
		k = TOK_SPLIT_MAIN;
	else
		return err_set(e, -ENOTSUP,
			       "%s: pre_tokenizer Split.pattern.Regex \"%.200s\" is not one this "
			       "tokenizer implements",
			       name, re);
	if (t->n_steps == TOK_MAX_STEPS)
		return err_set(e, -ENOTSUP, "%s: pre_tokenizer: too many Split steps", name);
	t->steps[t->n_steps++] = k;
	return 0;
}

static int check_pretok(struct tokenizer *t, const struct json *p, struct err *e,
			const char *name)
{
	if (!p || p->type != JSON_OBJECT)
		return err_set(e, -ENOTSUP,
			       "%s: pre_tokenizer: missing (a Sequence of Split steps ending in "
			       "ByteLevel is required)",
			       name);
	const char *type;
	if (get_str(p, "type", &type, e, name, "pre_tokenizer"))
		return -EINVAL;
	if (strcmp(type, "Sequence"))
		return check_pretok_step(t, p, 1, e, name);
	const struct json *list = json_get(p, "pretokenizers");
	if (!list || list->type != JSON_ARRAY || list->n == 0)
		return err_set(e, -EINVAL, "%s: pre_tokenizer.pretokenizers: missing or empty", name);
	for (const struct json *s = list->child; s; s = s->next) {
		if (s->type != JSON_OBJECT)
			return err_set(e, -EINVAL, "%s: pre_tokenizer.pretokenizers: not an object",
				       name);
		if (check_pretok_step(t, s, s->next == NULL, e, name))
			return -ENOTSUP;
	}
	return 0;
}

static int check_decoder(const struct json *d, struct err *e, const char *name)
{
	const char *type;
	if (!d || d->type != JSON_OBJECT)
		return err_set(e, -ENOTSUP, "%s: decoder: missing (ByteLevel is required)", name);
	if (get_str(d, "type", &type, e, name, "decoder"))
		return -EINVAL;
	if (strcmp(type, "ByteLevel"))
		return err_set(e, -ENOTSUP, "%s: decoder: type \"%s\" is not implemented (only "
			       "ByteLevel)", name, type);
	return 0;
}

static int check_model(struct tokenizer *t, const struct json *m, struct err *e,
		       const char *name)
{
	const char *type;
	if (!m || m->type != JSON_OBJECT)
		return err_set(e, -EINVAL, "%s: model: missing", name);
	if (get_str(m, "type", &type, e, name, "model"))
		return -EINVAL;
	if (strcmp(type, "BPE"))
		return err_set(e, -ENOTSUP, "%s: model.type \"%s\" is not implemented (only BPE)",
			       name, type);
	const char *off[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix",
			     "byte_fallback"};
	for (size_t i = 0; i < sizeof off / sizeof *off; i++)
		if (must_be_off(m, off[i], e, name, "model"))
			return -ENOTSUP;
	int b;
	t->ignore_merges = json_get_bool(m, "ignore_merges", &b) == 1 && b;
	return 0;
}

/* ---- vocab, merges, added tokens ---------------------------------------------------------- */

static int load_vocab(struct tokenizer *t, const struct json *vocab, const struct json *added,
		      struct err *e, const char *name)
{
	if (!vocab || vocab->type != JSON_OBJECT)
		return err_set(e, -EINVAL, "%s: model.vocab: missing or not an object", name);
	/* n_ids from both the vocab and the added tokens. */
	int64_t max_id = -1;
	size_t pool = 0;
	for (const struct json *v = vocab->child; v; v = v->next) {
		int64_t id;
		if (json_int64(v, &id) || id < 0 || id >= TOK_MAX_IDS)
			return err_set(e, -EINVAL, "%s: model.vocab[\"%.100s\"]: id not an integer in "
				       "[0, %u)", name, v->key, TOK_MAX_IDS);
		max_id = id > max_id ? id : max_id;
		pool += v->key_len;
	}
	for (const struct json *a = added ? added->child : NULL; a; a = a->next) {
		int64_t id;
		if (json_int64(json_get(a, "id"), &id) || id < 0 || id >= TOK_MAX_IDS)
			return err_set(e, -EINVAL, "%s: added_tokens: id missing or not in [0, %u)",
				       name, TOK_MAX_IDS);
		max_id = id > max_id ? id : max_id;
	}
	t->n_ids = (uint32_t)(max_id + 1);
	t->voc_off = calloc(t->n_ids, sizeof *t->voc_off);
	t->voc_len = malloc(t->n_ids * sizeof *t->voc_len);
	t->voc_pool = malloc(pool + 1);
	t->vmask = pow2_at_least((uint64_t)vocab->n * 2) - 1;
	t->vmap = malloc(((size_t)t->vmask + 1) * sizeof *t->vmap);
	if (!t->voc_off || !t->voc_len || !t->voc_pool || !t->vmap)
		return err_set(e, -ENOMEM, "%s: out of memory", name);
	for (uint32_t i = 0; i < t->n_ids; i++)
		t->voc_len[i] = -1;
	for (uint32_t i = 0; i <= t->vmask; i++)
		t->vmap[i].id = -1;
	size_t used = 0;
	for (const struct json *v = vocab->child; v; v = v->next) {
		int64_t id;
		json_int64(v, &id);
		if (t->voc_len[id] >= 0)
			return err_set(e, -EINVAL, "%s: model.vocab: id %lld appears twice", name,
				       (long long)id);
		long n = bytelevel_decode(v->key, v->key_len, t->voc_pool + used);
		if (n < 0)
			continue; /* not byte-level: must be an added token (checked below) */
		if (tok_vocab_find(t, t->voc_pool + used, (size_t)n) >= 0)
			return err_set(e, -EINVAL, "%s: model.vocab[\"%.100s\"]: appears twice", name,
				       v->key);
		t->voc_off[id] = (uint32_t)used;
		t->voc_len[id] = (int32_t)n;
		uint64_t h = tok_hash(t->voc_pool + used, (size_t)n);
		uint32_t i = (uint32_t)h & t->vmask;
		while (t->vmap[i].id >= 0)
			i = (i + 1) & t->vmask;
		t->vmap[i].hash = h;
		t->vmap[i].id = (int32_t)id;
		used += (size_t)n;
	}
	for (int b = 0; b < 256; b++) {
		char c = (char)b;
		t->byte_id[b] = tok_vocab_find(t, &c, 1);
		if (t->byte_id[b] < 0)
			return err_set(e, -EINVAL,
				       "%s: model.vocab: byte 0x%02x has no token (a byte-level BPE "
				       "needs all 256)",
				       name, b);
	}
	/* Vocab entries that are not byte-level strings are only allowed as added tokens. */
	for (const struct json *v = vocab->child; v; v = v->next) {
		int64_t id;
		json_int64(v, &id);
		if (t->voc_len[id] >= 0)
			continue;
		int found = 0;
		for (const struct json *a = added ? added->child : NULL; a && !found; a = a->next) {
			int64_t aid;
			found = !json_int64(json_get(a, "id"), &aid) && aid == id;
		}
		if (!found)
			return err_set(e, -EINVAL,
				       "%s: model.vocab[\"%.100s\"]: not a byte-level string and not "
				       "an added token",
				       name, v->key);
	}
	return 0;
}

/* Splits one merge ("a b" or ["a", "b"]) into its two byte-level strings. */
static int merge_parts(const struct json *m, const char **a, size_t *na, const char **b,
		       size_t *nb)
{
	if (m->type == JSON_ARRAY && m->n == 2 && m->child->type == JSON_STRING &&
	    m->child->next->type == JSON_STRING) {
		*a = m->child->str, *na = m->child->len;
		*b = m->child->next->str, *nb = m->child->next->len;
		return 0;
	}
	if (m->type != JSON_STRING)
		return -EINVAL;
	const char *sp = memchr(m->str, ' ', m->len);
	if (!sp)
		return -EINVAL;
	*a = m->str, *na = (size_t)(sp - m->str);
	*b = sp + 1;
	const char *sp2 = memchr(*b, ' ', m->len - *na - 1); /* JS split(" ", 2): first two */
	*nb = sp2 ? (size_t)(sp2 - *b) : m->len - *na - 1;
	return 0;
}

static int load_merges(struct tokenizer *t, const struct json *merges, struct err *e,
		       const char *name)
{
	if (!merges || merges->type != JSON_ARRAY)
		return err_set(e, -EINVAL, "%s: model.merges: missing or not an array", name);
	t->mmask = pow2_at_least((uint64_t)merges->n * 2) - 1;
	t->merges = malloc(((size_t)t->mmask + 1) * sizeof *t->merges);
	char *buf = malloc(1024);
	if (!t->merges || !buf) {
		free(buf);
		return err_set(e, -ENOMEM, "%s: out of memory", name);
	}
	for (uint32_t i = 0; i <= t->mmask; i++)
		t->merges[i].key = ~0ull;
	uint32_t rank = 0;
	int rc = 0;
	for (const struct json *m = merges->child; m; m = m->next, rank++) {
		const char *a, *b;
		size_t na, nb;
		if (merge_parts(m, &a, &na, &b, &nb) || na + nb > 1024) {
			rc = err_set(e, -EINVAL, "%s: model.merges[%u]: not \"a b\" or [a, b]", name,
				     rank);
			break;
		}
		long ra = bytelevel_decode(a, na, buf), rb = ra < 0 ? -1 : bytelevel_decode(b, nb, buf + ra);
		int32_t ia = ra < 0 ? -1 : tok_vocab_find(t, buf, (size_t)ra);
		int32_t ib = rb < 0 ? -1 : tok_vocab_find(t, buf + ra, (size_t)rb);
		int32_t iab = rb < 0 ? -1 : tok_vocab_find(t, buf, (size_t)(ra + rb));
		if (ia < 0 || ib < 0 || iab < 0) {
			rc = err_set(e, -EINVAL,
				     "%s: model.merges[%u] \"%.*s\" + \"%.*s\": %s is not in the vocab",
				     name, rank, (int)na, a, (int)nb, b,
				     ia < 0 ? "the left part" : ib < 0 ? "the right part" : "the merged token");
			break;
		}
		uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
		uint32_t i = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & t->mmask;
		while (t->merges[i].key != ~0ull && t->merges[i].key != key)
			i = (i + 1) & t->mmask;
		/* A repeated pair keeps its last rank, as the reference's Map does. */
		t->merges[i].key = key;
		t->merges[i].rank = rank;
		t->merges[i].id = iab;
	}
	t->n_merges = rank;
	free(buf);
	if (!rc) {
		t->bpair = malloc(256 * 256 * sizeof *t->bpair);
		if (!t->bpair)
			return err_set(e, -ENOMEM, "%s: out of memory", name);
		for (int a = 0; a < 256; a++)
			for (int b = 0; b < 256; b++) {
				const struct tok_merge *m = tok_merge_find(t, t->byte_id[a], t->byte_id[b]);
				t->bpair[a << 8 | b] = m ? (struct tok_bpair){m->rank, m->id}
							 : (struct tok_bpair){UINT32_MAX, -1};
			}
	}
	return rc;
}

static int trie_add(struct tokenizer *t, const char *s, size_t n, int32_t idx, uint32_t *cap)
{
	uint32_t node = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)s[i];
		uint32_t ch = t->trie[node].child;
		while (ch && t->trie[ch].byte != c)
			ch = t->trie[ch].sibling;
		if (!ch) {
			if (t->n_trie == *cap) {
				uint32_t nc = *cap * 2;
				struct tok_trie *p = realloc(t->trie, nc * sizeof *p);
				if (!p)
					return -ENOMEM;
				t->trie = p;
				*cap = nc;
			}
			ch = t->n_trie++;
			t->trie[ch] = (struct tok_trie){.child = 0,
							.sibling = t->trie[node].child,
							.added = -1,
							.byte = c};
			t->trie[node].child = ch;
		}
		node = ch;
	}
	t->trie[node].added = idx; /* a repeated content: the last one wins, as in the reference */
	return 0;
}

static int load_added(struct tokenizer *t, const struct json *added, struct err *e,
		      const char *name)
{
	if (added && added->type != JSON_ARRAY)
		return err_set(e, -EINVAL, "%s: added_tokens: not an array", name);
	size_t n = added ? added->n : 0, pool = 0;
	for (const struct json *a = added ? added->child : NULL; a; a = a->next) {
		const char *s;
		size_t len;
		if (json_get_str(a, "content", &s, &len) != 1 || len == 0)
			return err_set(e, -EINVAL, "%s: added_tokens: content missing or empty", name);
		pool += len + 1;
	}
	uint32_t cap = 256;
	t->added = calloc(n ? n : 1, sizeof *t->added);
	t->added_pool = malloc(pool + 1);
	t->trie = malloc(cap * sizeof *t->trie);
	if (!t->added || !t->added_pool || !t->trie)
		return err_set(e, -ENOMEM, "%s: out of memory", name);
	t->trie[0] = (struct tok_trie){0, 0, -1, 0};
	t->n_trie = 1;
	size_t used = 0, i = 0;
	for (const struct json *a = added ? added->child : NULL; a; a = a->next, i++) {
		struct tok_added *ad = &t->added[i];
		const char *s;
		size_t len;
		int64_t id;
		json_get_str(a, "content", &s, &len);
		json_int64(json_get(a, "id"), &id);
		memcpy(t->added_pool + used, s, len + 1);
		ad->content = t->added_pool + used;
		ad->len = (uint32_t)len;
		ad->id = (int32_t)id;
		used += len + 1;
		int b;
		ad->special = json_get_bool(a, "special", &b) == 1 && b;
		ad->lstrip = json_get_bool(a, "lstrip", &b) == 1 && b;
		ad->rstrip = json_get_bool(a, "rstrip", &b) == 1 && b;
		ad->single_word = json_get_bool(a, "single_word", &b) == 1 && b;
		ad->normalized = json_get_bool(a, "normalized", &b) == 1 && b;
		if (trie_add(t, s, len, (int32_t)i, &cap))
			return err_set(e, -ENOMEM, "%s: out of memory", name);
		t->added_first[(uint8_t)s[0]] = 1;
	}
	t->n_added = n;
	t->added_first_only = -1;
	for (int c = 0, k = 0; c < 256; c++)
		if (t->added_first[c])
			t->added_first_only = k++ ? -1 : c;
	return 0;
}

/* The id -> decoded bytes table: added tokens as their content, the rest from the vocab. */
static int build_ids(struct tokenizer *t, struct err *e, const char *name)
{
	size_t pool = 0;
	t->tok_off = calloc(t->n_ids, sizeof *t->tok_off);
	t->tok_len = malloc(t->n_ids * sizeof *t->tok_len);
	t->tok_flags = calloc(t->n_ids, 1);
	if (!t->tok_off || !t->tok_len || !t->tok_flags)
		return err_set(e, -ENOMEM, "%s: out of memory", name);
	for (uint32_t i = 0; i < t->n_ids; i++) {
		t->tok_len[i] = t->voc_len[i];
		t->tok_off[i] = t->voc_off[i];
	}
	for (size_t i = 0; i < t->n_added; i++) {
		struct tok_added *a = &t->added[i];
		/* An added token may reuse a vocab id only for the same bytes, or decoding would
		 * turn BPE output into the added token's text. */
		if (t->voc_len[a->id] >= 0 && ((uint32_t)t->voc_len[a->id] != a->len ||
					       memcmp(t->voc_pool + t->voc_off[a->id], a->content,
						      a->len)))
			return err_set(e, -EINVAL,
				       "%s: added_tokens[%zu] \"%.100s\": id %d is the vocab entry of "
				       "other bytes",
				       name, i, a->content, a->id);
		t->tok_len[a->id] = (int32_t)a->len;
		t->tok_flags[a->id] = (uint8_t)(1 | (a->special ? 2 : 0));
	}
	for (uint32_t i = 0; i < t->n_ids; i++)
		pool += t->tok_len[i] > 0 ? (size_t)t->tok_len[i] : 0;
	if (pool >= UINT32_MAX)
		return err_set(e, -EFBIG, "%s: vocabulary too large", name);
	t->tok_pool = malloc(pool + 1);
	if (!t->tok_pool)
		return err_set(e, -ENOMEM, "%s: out of memory", name);
	size_t used = 0;
	for (uint32_t i = 0; i < t->n_ids; i++) {
		if (t->tok_len[i] < 0)
			continue;
		const char *src = t->voc_pool + t->voc_off[i];
		if (t->tok_flags[i] & 1)
			for (size_t k = t->n_added; k-- > 0;)
				if ((uint32_t)t->added[k].id == i) {
					src = t->added[k].content;
					break;
				}
		memcpy(t->tok_pool + used, src, (size_t)t->tok_len[i]);
		t->tok_off[i] = (uint32_t)used;
		used += (size_t)t->tok_len[i];
	}
	return 0;
}

int tokenizer_parse(struct tokenizer **out, const char *text, size_t len, const char *name,
		    struct err *e)
{
	*out = NULL;
	unicode_tables_init();
	bytelevel_init();
	struct json_doc doc;
	int rc = json_parse(&doc, text, len);
	if (rc)
		return err_set(e, rc, "%s: %s", name, rc == -ENOMEM ? "out of memory" : doc.err);
	struct tokenizer *t = calloc(1, sizeof *t);
	const struct json *root = doc.root, *model = json_get(root, "model");
	if (!t) {
		rc = err_set(e, -ENOMEM, "%s: out of memory", name);
		goto out;
	}
	if (root->type != JSON_OBJECT) {
		rc = err_set(e, -EINVAL, "%s: not a JSON object", name);
		goto out;
	}
	const struct json *added = json_get(root, "added_tokens");
	if ((rc = check_normalizer(json_get(root, "normalizer"), e, name)) ||
	    (rc = check_pretok(t, json_get(root, "pre_tokenizer"), e, name)) ||
	    (rc = check_decoder(json_get(root, "decoder"), e, name)) ||
	    (rc = check_model(t, model, e, name)) ||
	    (added && added->type != JSON_ARRAY &&
	     (rc = err_set(e, -EINVAL, "%s: added_tokens: not an array", name))) ||
	    (rc = load_vocab(t, json_get(model, "vocab"), added, e, name)) ||
	    (rc = load_merges(t, json_get(model, "merges"), e, name)) ||
	    (rc = load_added(t, added, e, name)) || (rc = build_ids(t, e, name)))
		goto out;
	if ((rc = tok_cache_init(t)))
		err_set(e, rc, "%s: out of memory", name);
out:
	json_doc_free(&doc);
	if (rc) {
		tokenizer_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

int tokenizer_load(struct tokenizer **out, const char *path, struct err *e)
{
	char buf[4096];
	size_t n = strlen(path);
	if (n < 5 || strcmp(path + n - 5, ".json"))
		path = path_join(buf, sizeof buf, path, "tokenizer.json");
	size_t len;
	char *text = file_read(path, &len, TOK_MAX_FILE, e);
	if (!text) {
		*out = NULL;
		return -ENOENT;
	}
	int rc = tokenizer_parse(out, text, len, path, e);
	free(text);
	return rc;
}

void tokenizer_free(struct tokenizer *t)
{
	if (!t)
		return;
	tok_cache_free(t);
	free(t->tok_off);
	free(t->tok_len);
	free(t->tok_flags);
	free(t->tok_pool);
	free(t->voc_off);
	free(t->voc_len);
	free(t->voc_pool);
	free(t->vmap);
	free(t->merges);
	free(t->bpair);
	free(t->added);
	free(t->added_pool);
	free(t->trie);
	free(t);
}

/* ---- lookups and decoding ------------------------------------------------------------------ */

int32_t tokenizer_token_id_n(const struct tokenizer *t, const char *s, size_t len)
{
	uint32_t node = 0;
	for (size_t i = 0; i < len; i++) {
		uint32_t ch = t->trie[node].child;
		while (ch && t->trie[ch].byte != (uint8_t)s[i])
			ch = t->trie[ch].sibling;
		if (!ch)
			return -1;
		node = ch;
	}
	return len && t->trie[node].added >= 0 ? t->added[t->trie[node].added].id : -1;
}

int32_t tokenizer_token_id(const struct tokenizer *t, const char *s)
{
	return tokenizer_token_id_n(t, s, strlen(s));
}

int tokenizer_token_bytes(const struct tokenizer *t, int32_t id, const char **p, size_t *len)
{
	if (id < 0 || (uint32_t)id >= t->n_ids || t->tok_len[id] < 0)
		return -EINVAL;
	*p = t->tok_pool + t->tok_off[id];
	*len = (size_t)t->tok_len[id];
	return 0;
}

int tokenizer_is_special(const struct tokenizer *t, int32_t id)
{
	return id >= 0 && (uint32_t)id < t->n_ids && (t->tok_flags[id] & 2);
}

uint32_t tokenizer_n_ids(const struct tokenizer *t) { return t->n_ids; }
size_t tokenizer_n_added(const struct tokenizer *t) { return t->n_added; }

const char *tokenizer_added(const struct tokenizer *t, size_t i, int32_t *id)
{
	if (i >= t->n_added)
		return NULL;
	if (id)
		*id = t->added[i].id;
	return t->added[i].content;
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
		     struct sbuf *out)
{
	size_t total = 0;
	if (out->oom)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_ids || t->tok_len[ids[i]] < 0)
			return -EINVAL;
		total += (size_t)t->tok_len[ids[i]];
	}
	if (out->len + total + 1 > out->cap) {
		size_t cap = out->cap ? out->cap : 64;
		while (cap < out->len + total + 1)
			cap *= 2;
		char *p = realloc(out->p, cap);
		if (!p) {
			out->oom = 1;
			return -ENOMEM;
		}
		out->p = p;
		out->cap = cap;
	}
	char *dst = out->p + out->len;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if ((flags & TOKENIZER_SKIP_SPECIAL) && (t->tok_flags[id] & 2))
			continue;
		size_t l = (size_t)t->tok_len[id];
		memcpy(dst, t->tok_pool + t->tok_off[id], l);
		dst += l;
	}
	out->len = (size_t)(dst - out->p);
	return 0;
}
