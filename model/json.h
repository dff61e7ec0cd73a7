/*
 * json.h — a small strict JSON reader (RFC 8259) and the string builder its writers use.
 *
 * Owns: parsing untrusted text into a read-only tree held in one arena, lookups, and writing
 * JSON strings the way Python's json.dumps(ensure_ascii=False) does (the chat encoding and the
 * checkpoint writer depend on that exact form). Object members keep their source order.
 * Must not: trust its input. Every string is validated UTF-8 (surrogate escapes must pair),
 * nesting is bounded, and errors say line and column.
 */
#ifndef DSV32_JSON_H
#define DSV32_JSON_H

#include <stddef.h>
#include <stdint.h>

enum json_type {
	JSON_NULL,
	JSON_FALSE,
	JSON_TRUE,
	JSON_NUMBER,
	JSON_STRING,
	JSON_ARRAY,
	JSON_OBJECT,
};

struct json {
	enum json_type type;
	uint32_t n;           /* number of children (array elements / object members) */
	const char *key;      /* member key when the parent is an object, NUL-terminated */
	size_t key_len;       /* key bytes (a key may hold an escaped NUL) */
	const char *str;      /* JSON_STRING: decoded UTF-8, NUL-terminated; JSON_NUMBER: source text */
	size_t len;           /* bytes of str */
	double num;           /* JSON_NUMBER: value as strtod reads it */
	struct json *child;   /* first element / member */
	struct json *next;    /* next sibling */
};

struct json_arena;

struct json_doc {
	struct json *root;
	struct json_arena *arena;
	char err[160]; /* "line L, column C: reason" when json_parse fails */
};

#define JSON_MAX_DEPTH 256

/* Parses text[0..len). Returns 0, or -EINVAL with doc->err set (and no tree), or -ENOMEM. */
int json_parse(struct json_doc *doc, const char *text, size_t len);
void json_doc_free(struct json_doc *doc);

/* Member of an object by key (first match), or NULL; NULL-safe on obj. */
const struct json *json_get(const struct json *obj, const char *key);
/* Element i of an array, or NULL. */
const struct json *json_at(const struct json *arr, size_t i);
/* Exact integer value of a number (no fraction, no exponent, fits int64). 0 or -EINVAL. */
int json_int64(const struct json *v, int64_t *out);
/* Typed lookups: 1 if present with that type (value stored), 0 if absent, -EINVAL if wrong type. */
int json_get_str(const struct json *obj, const char *key, const char **s, size_t *len);
int json_get_bool(const struct json *obj, const char *key, int *b);
int json_get_num(const struct json *obj, const char *key, double *d);
const char *json_type_name(enum json_type t);

/* Growable byte buffer. On allocation failure it sets `oom` and drops further writes. */
struct sbuf {
	char *p;
	size_t len, cap;
	int oom;
};

void sbuf_free(struct sbuf *b);
void sbuf_put(struct sbuf *b, const void *p, size_t n);
void sbuf_puts(struct sbuf *b, const char *s);
void sbuf_putc(struct sbuf *b, char c);
__attribute__((format(printf, 2, 3))) void sbuf_printf(struct sbuf *b, const char *fmt, ...);
/* NUL-terminates (not counted in len) and returns b->p, or NULL after an allocation failure. */
char *sbuf_cstr(struct sbuf *b);

/* Writes s[0..n) as a JSON string literal, escaping like Python's json.dumps: \" \\ \n \r \t
 * \b \f, other bytes < 0x20 as \u00XX; with ascii != 0 every non-ASCII code point as \uXXXX
 * (surrogate pairs above U+FFFF), else UTF-8 passes through unchanged. */
void json_write_str(struct sbuf *b, const char *s, size_t n, int ascii);
/* Writes d like Python's repr(float): shortest round-trip digits, "1.0", "1e-06", "1e+16". */
void json_write_double(struct sbuf *b, double d);
/* Writes v like Python's json.dumps(v, ensure_ascii=ascii): ", " and ": " separators, member
 * order kept, numbers as in the source text. */
void json_write(struct sbuf *b, const struct json *v, int ascii);

/* UTF-8: length of the valid sequence starting at s (1..4), or 0 if invalid (overlong,
 * surrogate, > U+10FFFF, truncated). Stores the code point in *cp when valid. */
int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encodes cp (<= U+10FFFF, not a surrogate) into out; returns bytes written (1..4). */
int utf8_encode(uint32_t cp, char out[4]);

#endif
