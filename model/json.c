/*
 * json.c — strict JSON reader into an arena-held tree, and Python-compatible writers.
 * See json.h for the contract. The parser is recursive descent with an explicit depth bound.
 */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ------------------------------------------------------------------------------ */

struct json_arena {
	struct json_arena *prev;
	size_t used, cap;
	char mem[];
};

static void *arena_alloc(struct json_doc *doc, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	struct json_arena *a = doc->arena;
	if (!a || a->cap - a->used < n) {
		size_t cap = n > (1u << 20) ? n : (1u << 20);
		struct json_arena *na = malloc(sizeof *na + cap);
		if (!na)
			return NULL;
		na->prev = a;
		na->used = 0;
		na->cap = cap;
		doc->arena = a = na;
	}
	void *p = a->mem + a->used;
	a->used += n;
	return p;
}

void json_doc_free(struct json_doc *doc)
{
	struct json_arena *a = doc->arena;
	while (a) {
		struct json_arena *prev = a->prev;
		free(a);
		a = prev;
	}
	doc->arena = NULL;
	doc->root = NULL;
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
	if (n == 0)
		return 0;
	unsigned c = s[0];
	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	int len;
	uint32_t v, min;
	if ((c & 0xe0) == 0xc0) {
		len = 2, v = c & 0x1f, min = 0x80;
	} else if ((c & 0xf0) == 0xe0) {
		len = 3, v = c & 0x0f, min = 0x800;
	} else if ((c & 0xf8) == 0xf0) {
		len = 4, v = c & 0x07, min = 0x10000;
	} else {
		return 0;
	}
	if ((size_t)len > n)
		return 0;
	for (int i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		v = (v << 6) | (s[i] & 0x3f);
	}
	if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
		return 0;
	*cp = v;
	return len;
}

int utf8_encode(uint32_t cp, char out[4])
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* ---- parser ------------------------------------------------------------------------------- */

struct parser {
	struct json_doc *doc;
	const char *s, *end, *p;
	int depth;
	int failed;
};

static int fail(struct parser *ps, const char *why)
{
	if (ps->failed)
		return -EINVAL;
	ps->failed = 1;
	int line = 1, col = 1;
	for (const char *q = ps->s; q < ps->p && q < ps->end; q++) {
		if (*q == '\n')
			line++, col = 1;
		else
			col++;
	}
	snprintf(ps->doc->err, sizeof ps->doc->err, "line %d, column %d: %s", line, col, why);
	return -EINVAL;
}

static void skip_ws(struct parser *ps)
{
	while (ps->p < ps->end &&
	       (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static int hex4(const char *p, uint32_t *v)
{
	*v = 0;
	for (int i = 0; i < 4; i++) {
		char c = p[i];
		int d;
		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			d = c - 'A' + 10;
		else
			return -1;
		*v = (*v << 4) | (uint32_t)d;
	}
	return 0;
}

/* Parses a string literal at ps->p (which points at '"'); decoded copy into the arena. */
static int parse_string(struct parser *ps, const char **out, size_t *out_len)
{
	const char *p = ps->p + 1;
	/* First pass: find the end and an upper bound of the decoded size (never larger). */
	const char *q = p;
	while (q < ps->end && *q != '"') {
		if (*q == '\\')
			q++;
		q++;
	}
	if (q >= ps->end)
		return fail(ps, "unterminated string");
	char *dst = arena_alloc(ps->doc, (size_t)(q - p) + 1);
	if (!dst)
		return -ENOMEM;
	size_t n = 0;
	while (p < q) {
		unsigned char c = (unsigned char)*p;
		if (c < 0x20) {
			ps->p = p;
			return fail(ps, "control character in string");
		}
		if (c == '\\') {
			char e = p[1];
			p += 2;
			switch (e) {
			case '"': dst[n++] = '"'; break;
			case '\\': dst[n++] = '\\'; break;
			case '/': dst[n++] = '/'; break;
			case 'b': dst[n++] = '\b'; break;
			case 'f': dst[n++] = '\f'; break;
			case 'n': dst[n++] = '\n'; break;
			case 'r': dst[n++] = '\r'; break;
			case 't': dst[n++] = '\t'; break;
			case 'u': {
				uint32_t cp, lo;
				if (q - p < 4 || hex4(p, &cp)) {
					ps->p = p;
					return fail(ps, "bad \\u escape");
				}
				p += 4;
				if (cp >= 0xdc00 && cp <= 0xdfff) {
					ps->p = p;
					return fail(ps, "unpaired low surrogate escape");
				}
				if (cp >= 0xd800 && cp <= 0xdbff) {
					if (q - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) ||
					    lo < 0xdc00 || lo > 0xdfff) {
						ps->p = p;
						return fail(ps, "unpaired high surrogate escape");
					}
					p += 6;
					cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
				}
				n += (size_t)utf8_encode(cp, dst + n);
				break;
			}
			default:
				ps->p = p - 1;
				return fail(ps, "bad escape");
			}
			continue;
		}
		if (c < 0x80) {
			dst[n++] = (char)c;
			p++;
			continue;
		}
		uint32_t cp;
		int k = utf8_decode((const unsigned char *)p, (size_t)(q - p), &cp);
		if (!k) {
			ps->p = p;
			return fail(ps, "invalid UTF-8 in string");
		}
		memcpy(dst + n, p, (size_t)k);
		n += (size_t)k;
		p += k;
	}
	dst[n] = 0;
	*out = dst;
	*out_len = n;
	ps->p = q + 1;
	return 0;
}

static int parse_number(struct parser *ps, struct json *v)
{
	const char *p = ps->p, *start = p;
	if (p < ps->end && *p == '-')
		p++;
	if (p >= ps->end)
		return fail(ps, "bad number");
	if (*p == '0') {
		p++;
	} else if (*p >= '1' && *p <= '9') {
		while (p < ps->end && *p >= '0' && *p <= '9')
			p++;
	} else {
		return fail(ps, "bad number");
	}
	if (p < ps->end && *p == '.') {
		p++;
		if (p >= ps->end || *p < '0' || *p > '9') {
			ps->p = p;
			return fail(ps, "bad number fraction");
		}
		while (p < ps->end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < ps->end && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < ps->end && (*p == '+' || *p == '-'))
			p++;
		if (p >= ps->end || *p < '0' || *p > '9') {
			ps->p = p;
			return fail(ps, "bad number exponent");
		}
		while (p < ps->end && *p >= '0' && *p <= '9')
			p++;
	}
	size_t n = (size_t)(p - start);
	char *txt = arena_alloc(ps->doc, n + 1);
	if (!txt)
		return -ENOMEM;
	memcpy(txt, start, n);
	txt[n] = 0;
	v->type = JSON_NUMBER;
	v->str = txt;
	v->len = n;
	v->num = strtod(txt, NULL);
	ps->p = p;
	return 0;
}

static int parse_value(struct parser *ps, struct json *v);

static int parse_container(struct parser *ps, struct json *v, int is_obj)
{
	if (++ps->depth > JSON_MAX_DEPTH)
		return fail(ps, "nesting too deep");
	v->type = is_obj ? JSON_OBJECT : JSON_ARRAY;
	ps->p++;
	skip_ws(ps);
	char close = is_obj ? '}' : ']';
	struct json **link = &v->child;
	if (ps->p < ps->end && *ps->p == close) {
		ps->p++;
		ps->depth--;
		return 0;
	}
	for (;;) {
		struct json *c = arena_alloc(ps->doc, sizeof *c);
		if (!c)
			return -ENOMEM;
		memset(c, 0, sizeof *c);
		skip_ws(ps);
		if (is_obj) {
			if (ps->p >= ps->end || *ps->p != '"')
				return fail(ps, "expected member name");
			int r = parse_string(ps, &c->key, &c->key_len);
			if (r)
				return r;
			skip_ws(ps);
			if (ps->p >= ps->end || *ps->p != ':')
				return fail(ps, "expected ':'");
			ps->p++;
		}
		int r = parse_value(ps, c);
		if (r)
			return r;
		if (v->n == UINT32_MAX)
			return fail(ps, "too many elements");
		*link = c;
		link = &c->next;
		v->n++;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			continue;
		}
		if (ps->p < ps->end && *ps->p == close) {
			ps->p++;
			ps->depth--;
			return 0;
		}
		return fail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
	}
}

static int parse_literal(struct parser *ps, const char *word, enum json_type t, struct json *v)
{
	size_t n = strlen(word);
	if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n))
		return fail(ps, "unexpected token");
	ps->p += n;
	v->type = t;
	return 0;
}

static int parse_value(struct parser *ps, struct json *v)
{
	skip_ws(ps);
	if (ps->p >= ps->end)
		return fail(ps, "unexpected end of input");
	switch (*ps->p) {
	case '{': return parse_container(ps, v, 1);
	case '[': return parse_container(ps, v, 0);
	case '"':
		v->type = JSON_STRING;
		return parse_string(ps, &v->str, &v->len);
	case 't': return parse_literal(ps, "true", JSON_TRUE, v);
	case 'f': return parse_literal(ps, "false", JSON_FALSE, v);
	case 'n': return parse_literal(ps, "null", JSON_NULL, v);
	default: return parse_number(ps, v);
	}
}

int json_parse(struct json_doc *doc, const char *text, size_t len)
{
	memset(doc, 0, sizeof *doc);
	struct parser ps = {.doc = doc, .s = text, .end = text + len, .p = text};
	struct json *root = arena_alloc(doc, sizeof *root);
	if (!root)
		return -ENOMEM;
	memset(root, 0, sizeof *root);
	int r = parse_value(&ps, root);
	if (!r) {
		skip_ws(&ps);
		if (ps.p != ps.end)
			r = fail(&ps, "trailing characters after the value");
	}
	if (r) {
		if (r == -ENOMEM)
			snprintf(doc->err, sizeof doc->err, "out of memory");
		char keep[sizeof doc->err];
		memcpy(keep, doc->err, sizeof keep);
		json_doc_free(doc);
		memcpy(doc->err, keep, sizeof keep);
		return r;
	}
	doc->root = root;
	return 0;
}

/* ---- lookups ------------------------------------------------------------------------------ */

const struct json *json_get(const struct json *obj, const char *key)
{
	if (!obj || obj->type != JSON_OBJECT)
		return NULL;
	size_t n = strlen(key);
	for (const struct json *c = obj->child; c; c = c->next)
		if (c->key_len == n && !memcmp(c->key, key, n))
			return c;
	return NULL;
}

const struct json *json_at(const struct json *arr, size_t i)
{
	if (!arr || arr->type != JSON_ARRAY || i >= arr->n)
		return NULL;
	const struct json *c = arr->child;
	while (i--)
		c = c->next;
	return c;
}

int json_int64(const struct json *v, int64_t *out)
{
	if (!v || v->type != JSON_NUMBER)
		return -EINVAL;
	for (size_t i = 0; i < v->len; i++)
		if (v->str[i] == '.' || v->str[i] == 'e' || v->str[i] == 'E')
			return -EINVAL;
	errno = 0;
	char *end;
	long long x = strtoll(v->str, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*out = x;
	return 0;
}

int json_get_str(const struct json *obj, const char *key, const char **s, size_t *len)
{
	const struct json *v = json_get(obj, key);
	if (!v)
		return 0;
	if (v->type != JSON_STRING)
		return -EINVAL;
	*s = v->str;
	if (len)
		*len = v->len;
	return 1;
}

int json_get_bool(const struct json *obj, const char *key, int *b)
{
	const struct json *v = json_get(obj, key);
	if (!v)
		return 0;
	if (v->type != JSON_TRUE && v->type != JSON_FALSE)
		return -EINVAL;
	*b = v->type == JSON_TRUE;
	return 1;
}

int json_get_num(const struct json *obj, const char *key, double *d)
{
	const struct json *v = json_get(obj, key);
	if (!v)
		return 0;
	if (v->type != JSON_NUMBER)
		return -EINVAL;
	*d = v->num;
	return 1;
}

const char *json_type_name(enum json_type t)
{
	static const char *names[] = {"null", "false", "true", "number", "string", "array", "object"};
	return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

/* ---- sbuf --------------------------------------------------------------------------------- */

void sbuf_free(struct sbuf *b)
{
	free(b->p);
	memset(b, 0, sizeof *b);
}

static int sbuf_reserve(struct sbuf *b, size_t extra)
{
	if (b->oom)
		return -1;
	if (b->cap - b->len > extra)
		return 0;
	size_t cap = b->cap ? b->cap : 256;
	while (cap - b->len <= extra)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p) {
		b->oom = 1;
		return -1;
	}
	b->p = p;
	b->cap = cap;
	return 0;
}

void sbuf_put(struct sbuf *b, const void *p, size_t n)
{
	if (sbuf_reserve(b, n))
		return;
	memcpy(b->p + b->len, p, n);
	b->len += n;
}

void sbuf_puts(struct sbuf *b, const char *s) { sbuf_put(b, s, strlen(s)); }

void sbuf_putc(struct sbuf *b, char c)
{
	if (sbuf_reserve(b, 1))
		return;
	b->p[b->len++] = c;
}

void sbuf_printf(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || sbuf_reserve(b, (size_t)n + 1))
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

char *sbuf_cstr(struct sbuf *b)
{
	if (sbuf_reserve(b, 1))
		return NULL;
	b->p[b->len] = 0;
	return b->p;
}

/* ---- writers ------------------------------------------------------------------------------ */

void json_write_str(struct sbuf *b, const char *s, size_t n, int ascii)
{
	sbuf_putc(b, '"');
	size_t i = 0;
	while (i < n) {
		unsigned char c = (unsigned char)s[i];
		const char *esc = NULL;
		switch (c) {
		case '"': esc = "\\\""; break;
		case '\\': esc = "\\\\"; break;
		case '\n': esc = "\\n"; break;
		case '\r': esc = "\\r"; break;
		case '\t': esc = "\\t"; break;
		case '\b': esc = "\\b"; break;
		case '\f': esc = "\\f"; break;
		}
		if (esc) {
			sbuf_puts(b, esc);
			i++;
		} else if (c < 0x20) {
			sbuf_printf(b, "\\u%04x", c);
			i++;
		} else if (c < 0x80 || !ascii) {
			sbuf_putc(b, (char)c);
			i++;
		} else {
			uint32_t cp;
			int k = utf8_decode((const unsigned char *)s + i, n - i, &cp);
			if (!k) { /* not reachable for parsed strings; keep the byte as U+FFFD */
				cp = 0xfffd;
				k = 1;
			}
			if (cp >= 0x10000) {
				cp -= 0x10000;
				sbuf_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
			} else {
				sbuf_printf(b, "\\u%04x", cp);
			}
			i += (size_t)k;
		}
	}
	sbuf_putc(b, '"');
}

/* Python's repr(float): shortest digits that round-trip; exponent form when the decimal
 * exponent is < -4 or >= 16; otherwise positional with at least one fractional digit. */
void json_write_double(struct sbuf *b, double d)
{
	if (isinf(d)) {
		sbuf_puts(b, d > 0 ? "Infinity" : "-Infinity");
		return;
	}
	char buf[40];
	int prec;
	for (prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
		if (strtod(buf, NULL) == d)
			break;
	}
	/* buf = [-]D.DDDDe[+-]XX */
	char digits[20];
	int nd = 0, neg = buf[0] == '-';
	const char *p = buf + neg;
	for (; *p && *p != 'e'; p++)
		if (*p != '.')
			digits[nd++] = *p;
	int exp10 = atoi(p + 1);
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	if (neg)
		sbuf_putc(b, '-');
	if (exp10 < -4 || exp10 >= 16) {
		sbuf_putc(b, digits[0]);
		if (nd > 1) {
			sbuf_putc(b, '.');
			sbuf_put(b, digits + 1, (size_t)nd - 1);
		}
		sbuf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
	} else if (exp10 < 0) {
		sbuf_puts(b, "0.");
		for (int i = 0; i < -exp10 - 1; i++)
			sbuf_putc(b, '0');
		sbuf_put(b, digits, (size_t)nd);
	} else {
		for (int i = 0; i <= exp10; i++)
			sbuf_putc(b, i < nd ? digits[i] : '0');
		sbuf_putc(b, '.');
		if (nd > exp10 + 1)
			sbuf_put(b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
		else
			sbuf_putc(b, '0');
	}
}

static void write_number(struct sbuf *b, const struct json *v)
{
	int64_t i;
	if (!json_int64(v, &i)) {
		sbuf_printf(b, "%lld", (long long)i);
		return;
	}
	int is_int = 1;
	for (size_t k = 0; k < v->len; k++)
		if (v->str[k] == '.' || v->str[k] == 'e' || v->str[k] == 'E')
			is_int = 0;
	/* An integer too large for int64: Python keeps its digits. A number beyond double's range
	 * (1e400) keeps its source text too: Python would write Infinity, which is not JSON. */
	if (is_int || !isfinite(v->num))
		sbuf_put(b, v->str, v->len);
	else
		json_write_double(b, v->num);
}

void json_write(struct sbuf *b, const struct json *v, int ascii)
{
	switch (v->type) {
	case JSON_NULL: sbuf_puts(b, "null"); return;
	case JSON_FALSE: sbuf_puts(b, "false"); return;
	case JSON_TRUE: sbuf_puts(b, "true"); return;
	case JSON_NUMBER: write_number(b, v); return;
	case JSON_STRING: json_write_str(b, v->str, v->len, ascii); return;
	case JSON_ARRAY:
	case JSON_OBJECT: {
		int obj = v->type == JSON_OBJECT;
		sbuf_putc(b, obj ? '{' : '[');
		for (const struct json *c = v->child; c; c = c->next) {
			if (c != v->child)
				sbuf_puts(b, ", ");
			if (obj) {
				json_write_str(b, c->key, c->key_len, ascii);
				sbuf_puts(b, ": ");
			}
			json_write(b, c, ascii);
		}
		sbuf_putc(b, obj ? '}' : ']');
		return;
	}
	}
}
