/*
 * chat_parse.c — splits DeepSeek-V3.2 output text into reasoning, content and DSML tool calls,
 * on the final text (chat_parse) or while it streams (chat_stream_*). See chat.h.
 *
 * Owns: the rules of the reference's parse_message_from_completion_text: reasoning up to
 * "</think>" (thinking mode), content up to EOS or "\n\n<｜DSML｜function_calls", then invoke and
 * parameter blocks whose arguments become a JSON object text (string="true" values quoted,
 * others pasted as written). Anything else is -EINVAL with the byte offset where it went wrong.
 * Must not: trust the text (it is what a sampled model wrote), read outside it, or abort.
 */
#include "model/chat.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DSML "｜DSML｜"

enum mark {
	MARK_THINK_END,
	MARK_TOOL_START,
	MARK_EOS,
	MARK_INVOKE,
	MARK_CALLS_END,
	MARK_PARAM,
	MARK_INVOKE_END,
	MARK_PARAM_END,
	MARK_COUNT,
	MARK_NONE = -1,
};

static const char *const marks[MARK_COUNT] = {
	[MARK_THINK_END] = CHAT_THINK_END,
	[MARK_TOOL_START] = "\n\n<" DSML "function_calls",
	[MARK_EOS] = CHAT_EOS,
	[MARK_INVOKE] = "<" DSML "invoke",
	[MARK_CALLS_END] = "</" DSML "function_calls>",
	[MARK_PARAM] = "<" DSML "parameter",
	[MARK_INVOKE_END] = "</" DSML "invoke",
	[MARK_PARAM_END] = "/" DSML "parameter",
};

struct pr {
	const char *t;
	size_t len;
	/* Next occurrence of each mark at or after the last position asked (SIZE_MAX: none).
	 * Positions asked only grow, so a cached answer stays right and the scan stays linear. */
	size_t at[MARK_COUNT];
	unsigned char known[MARK_COUNT];
	struct err *e;
};

static size_t find(struct pr *p, enum mark m, size_t i)
{
	if (p->known[m] && (p->at[m] == SIZE_MAX || p->at[m] >= i))
		return p->at[m];
	const char *q = i < p->len ? memmem(p->t + i, p->len - i, marks[m], strlen(marks[m])) : NULL;
	p->at[m] = q ? (size_t)(q - p->t) : SIZE_MAX;
	p->known[m] = 1;
	return p->at[m];
}

/* The reference's _read_until_stop: the earliest of a and b (b may be MARK_NONE) at or after i.
 * The text before it ends at *end; *next is just past the mark (or the end of the text). */
static enum mark read_until(struct pr *p, size_t i, enum mark a, enum mark b, size_t *end,
			    size_t *next)
{
	size_t pa = find(p, a, i), pb = b == MARK_NONE ? SIZE_MAX : find(p, b, i);
	enum mark m = pa <= pb ? a : b;
	size_t pos = pa <= pb ? pa : pb;
	if (pos == SIZE_MAX) {
		*end = *next = p->len;
		return MARK_NONE;
	}
	*end = pos;
	*next = pos + strlen(marks[m]);
	return m;
}

static int is_gt_nl(const struct pr *p, size_t i, size_t end)
{
	return end - i == 2 && p->t[i] == '>' && p->t[i + 1] == '\n';
}

/* Python's str.isspace(), which is what \s matches in the reference's patterns. */
static int py_space(uint32_t c)
{
	return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}

static int ends_with(const char *s, size_t n, const char *suf)
{
	size_t k = strlen(suf);
	return n >= k && !memcmp(s + n - k, suf, k);
}

/* '^\s*name="(.*?)">\n$' (DOTALL; $ also matches before a final newline). */
static int match_name(const char *s, size_t n, size_t *off, size_t *len)
{
	size_t i = 0;
	uint32_t c;
	int k;
	while (i < n && (k = utf8_decode((const unsigned char *)s + i, n - i, &c)) && py_space(c))
		i += (size_t)k;
	if (n - i < 6 || memcmp(s + i, "name=\"", 6))
		return -1;
	i += 6;
	const char *body = s + i;
	size_t bl = n - i;
	if (ends_with(body, bl, "\">\n"))
		bl -= 3;
	else if (ends_with(body, bl, "\">\n\n"))
		bl -= 4;
	else
		return -1;
	*off = i;
	*len = bl;
	return 0;
}

/* '^ name="(.*?)" string="(true|false)">(.*?)<$' (DOTALL; same $ rule). */
static int match_param(const char *s, size_t n, size_t *koff, size_t *klen, int *is_str,
		       size_t *voff, size_t *vlen)
{
	static const char lead[] = " name=\"", sep[] = "\" string=\"";
	if (n < 7 || memcmp(s, lead, 7))
		return -1;
	size_t end;
	if (n && s[n - 1] == '<')
		end = n - 1;
	else if (n >= 2 && s[n - 2] == '<' && s[n - 1] == '\n')
		end = n - 2;
	else
		return -1;
	for (size_t k = 7; k + 10 <= n;) {
		const char *q = memmem(s + k, n - k, sep, 10);
		if (!q)
			return -1;
		k = (size_t)(q - s);
		size_t j = 0;
		if (n - k >= 16 && !memcmp(s + k + 10, "true\">", 6))
			j = k + 16, *is_str = 1;
		else if (n - k >= 17 && !memcmp(s + k + 10, "false\">", 7))
			j = k + 17, *is_str = 0;
		if (j) {
			if (j > end)
				return -1;
			*koff = 7;
			*klen = k - 7;
			*voff = j;
			*vlen = end - j;
			return 0;
		}
		k++;
	}
	return -1;
}

static char *dup_n(const char *s, size_t n)
{
	char *d = malloc(n + 1);
	if (d) {
		memcpy(d, s, n);
		d[n] = 0;
	}
	return d;
}

struct param {
	size_t off, len;
};

static int add_call(struct chat_reply *r, size_t *cap, const char *name, size_t nlen,
		    struct sbuf *args)
{
	if (r->n_calls == *cap) {
		size_t c = *cap ? 2 * *cap : 4;
		struct chat_tool_call *n = realloc(r->calls, c * sizeof *n);
		if (!n)
			return -ENOMEM;
		r->calls = n;
		*cap = c;
	}
	struct chat_tool_call *tc = &r->calls[r->n_calls];
	tc->name = dup_n(name, nlen);
	tc->name_len = nlen;
	tc->arguments = sbuf_cstr(args);
	tc->arguments_len = args->len;
	if (!tc->name || !tc->arguments) {
		free(tc->name);
		return -ENOMEM;
	}
	r->n_calls++;
	*args = (struct sbuf){0};
	return 0;
}

/* One invoke block, from just past "<｜DSML｜invoke" to just past its "</｜DSML｜invoke". */
static int parse_invoke(struct pr *p, size_t *pi, struct chat_reply *r, size_t *cap)
{
	size_t i = *pi, end, next, noff, nlen;
	enum mark m = read_until(p, i, MARK_PARAM, MARK_INVOKE_END, &end, &next);
	if (match_name(p->t + i, end - i, &noff, &nlen))
		return err_set(p->e, -EINVAL, "tool call at byte %zu: expected ' name=\"NAME\">' "
			       "then a newline after the invoke token", i);
	const char *name = p->t + i + noff;
	i = next;
	struct sbuf args = {0};
	struct param *seen = NULL;
	size_t n_seen = 0;
	int rc = 0;
	sbuf_putc(&args, '{');
	while (m == MARK_PARAM) {
		size_t ko, kl, vo, vl, start = i;
		int is_str;
		read_until(p, i, MARK_PARAM_END, MARK_NONE, &end, &next);
		if (match_param(p->t + i, end - i, &ko, &kl, &is_str, &vo, &vl)) {
			rc = err_set(p->e, -EINVAL, "tool parameter at byte %zu: expected ' name=\"KEY\" "
				     "string=\"true|false\">VALUE</｜DSML｜parameter>'", start);
			break;
		}
		const char *key = p->t + i + ko;
		for (size_t k = 0; k < n_seen && !rc; k++)
			if (seen[k].len == kl && !memcmp(p->t + seen[k].off, key, kl))
				rc = err_set(p->e, -EINVAL,
					     "tool parameter at byte %zu: duplicate name \"%.*s\"",
					     start, (int)(kl > 60 ? 60 : kl), key);
		if (rc)
			break;
		struct param *ns = realloc(seen, (n_seen + 1) * sizeof *ns);
		if (!ns) {
			rc = -ENOMEM;
			break;
		}
		seen = ns;
		seen[n_seen++] = (struct param){(size_t)(key - p->t), kl};
		if (n_seen > 1)
			sbuf_puts(&args, ", ");
		json_write_str(&args, key, kl, 0);
		sbuf_puts(&args, ": ");
		if (is_str)
			json_write_str(&args, p->t + i + vo, vl, 0);
		else
			sbuf_put(&args, p->t + i + vo, vl);
		i = next;
		m = read_until(p, i, MARK_PARAM, MARK_INVOKE_END, &end, &next);
		if (!is_gt_nl(p, i, end)) {
			rc = err_set(p->e, -EINVAL, "tool parameter at byte %zu: expected \">\" and a "
				     "newline after the parameter's closing token", i);
			break;
		}
		i = next;
	}
	free(seen);
	sbuf_putc(&args, '}');
	if (!rc && args.oom)
		rc = -ENOMEM;
	if (!rc)
		rc = add_call(r, cap, name, nlen, &args);
	sbuf_free(&args);
	*pi = i;
	return rc;
}

/* The DSML block, from just past "\n\n<｜DSML｜function_calls". */
static int parse_calls(struct pr *p, size_t *pi, struct chat_reply *r)
{
	size_t i = *pi, end, next, cap = 0;
	while (i < p->len) {
		enum mark m = read_until(p, i, MARK_INVOKE, MARK_CALLS_END, &end, &next);
		if (!is_gt_nl(p, i, end))
			return err_set(p->e, -EINVAL, "tool calls at byte %zu: expected \">\" and a "
				       "newline before the next DSML token", i);
		i = next;
		if (m == MARK_CALLS_END)
			break;
		if (m == MARK_NONE)
			return err_set(p->e, -EINVAL, "tool calls at byte %zu: the block ends without "
				       "an invoke or closing token", i);
		int rc = parse_invoke(p, &i, r, &cap);
		if (rc)
			return rc;
	}
	*pi = i;
	return 0;
}

static int check_specials(const char *s, size_t n, size_t base, const char *what, struct err *e)
{
	static const char *const sp[] = {CHAT_BOS, CHAT_EOS, CHAT_THINK_START, CHAT_THINK_END, DSML};
	for (size_t k = 0; k < sizeof sp / sizeof *sp; k++) {
		const char *q = memmem(s, n, sp[k], strlen(sp[k]));
		if (q)
			return err_set(e, -EINVAL, "%s holds the special token %s at byte %zu", what,
				       sp[k], base + (size_t)(q - s));
	}
	return 0;
}

static int parse(struct chat_reply *r, const char *text, size_t len, enum chat_mode mode,
		 struct err *e)
{
	struct pr p = {.t = text, .len = len, .e = e};
	size_t i = 0, end, next, rs = 0, re = 0;
	enum mark m;
	if (mode == CHAT_MODE_THINKING) {
		m = read_until(&p, 0, MARK_THINK_END, MARK_TOOL_START, &end, &next);
		if (m != MARK_THINK_END)
			return err_set(e, -EINVAL, "reasoning is not closed by </think>%s",
				       m == MARK_TOOL_START ? " before the tool calls" : "");
		re = end;
		i = next;
	}
	size_t cs = i, ce;
	m = read_until(&p, i, MARK_EOS, MARK_TOOL_START, &ce, &next);
	i = next;
	r->has_eos = m == MARK_EOS;
	int rc;
	if (m == MARK_TOOL_START) {
		if ((rc = parse_calls(&p, &i, r)))
			return rc;
		m = read_until(&p, i, MARK_EOS, MARK_NONE, &end, &next);
		if (end != i)
			return err_set(e, -EINVAL, "unexpected text after the tool calls at byte %zu", i);
		r->has_eos = m == MARK_EOS;
		i = next;
	}
	if (i != len)
		return err_set(e, -EINVAL, "unexpected text after the end of sentence at byte %zu", i);
	if ((rc = check_specials(text + rs, re - rs, rs, "reasoning", e)) ||
	    (rc = check_specials(text + cs, ce - cs, cs, "content", e)))
		return rc;
	r->reasoning = dup_n(text + rs, re - rs);
	r->reasoning_len = re - rs;
	r->content = dup_n(text + cs, ce - cs);
	r->content_len = ce - cs;
	return r->reasoning && r->content ? 0 : -ENOMEM;
}

int chat_parse(struct chat_reply *r, const char *text, size_t len, enum chat_mode mode,
	       struct err *e)
{
	memset(r, 0, sizeof *r);
	int rc = parse(r, text, len, mode, e);
	if (rc)
		chat_reply_free(r);
	return rc;
}

void chat_reply_free(struct chat_reply *r)
{
	free(r->reasoning);
	free(r->content);
	for (size_t k = 0; k < r->n_calls; k++) {
		free(r->calls[k].name);
		free(r->calls[k].arguments);
	}
	free(r->calls);
	memset(r, 0, sizeof *r);
}

/* ---- streaming ------------------------------------------------------------------------------ */

void chat_stream_init(struct chat_stream *s, enum chat_mode mode)
{
	memset(s, 0, sizeof *s);
	s->mode = mode;
	s->phase = mode == CHAT_MODE_THINKING ? CHAT_STREAM_REASONING : CHAT_STREAM_CONTENT;
}

/* Bytes at the end of t[from..len) that could be the start of mark a or b. */
static size_t holdback(const char *t, size_t from, size_t len, enum mark a, enum mark b)
{
	size_t hold = 0;
	enum mark ms[2] = {a, b};
	for (int j = 0; j < 2; j++) {
		size_t ml = strlen(marks[ms[j]]);
		for (size_t k = ml - 1; k > hold; k--)
			if (k <= len - from && !memcmp(t + len - k, marks[ms[j]], k)) {
				hold = k;
				break;
			}
	}
	return hold;
}

static void emit(struct chat_stream *s, struct sbuf *to, size_t upto, size_t *count)
{
	sbuf_put(to, s->text.p + s->emitted, upto - s->emitted);
	*count += upto - s->emitted;
	s->emitted = upto;
}

int chat_stream_feed(struct chat_stream *s, const char *p, size_t n, struct sbuf *reasoning,
		     struct sbuf *content)
{
	sbuf_put(&s->text, p, n);
	if (s->text.oom)
		return -ENOMEM;
	const char *t = s->text.p;
	size_t len = s->text.len;
	for (;;) {
		int reasoning_phase = s->phase == CHAT_STREAM_REASONING;
		if (!reasoning_phase && s->phase != CHAT_STREAM_CONTENT)
			break;
		enum mark a = reasoning_phase ? MARK_THINK_END : MARK_EOS;
		struct sbuf *to = reasoning_phase ? reasoning : content;
		size_t *count = reasoning_phase ? &s->n_reasoning : &s->n_content;
		struct pr pr = {.t = t, .len = len};
		size_t end, next;
		enum mark m = read_until(&pr, s->emitted, a, MARK_TOOL_START, &end, &next);
		if (m == MARK_NONE) {
			emit(s, to, len - holdback(t, s->emitted, len, a, MARK_TOOL_START), count);
			break;
		}
		emit(s, to, end, count);
		if (m == MARK_TOOL_START) {
			s->phase = CHAT_STREAM_TOOLS; /* in reasoning this is an error finish reports */
			break;
		}
		s->emitted = next;
		s->phase = reasoning_phase ? CHAT_STREAM_CONTENT : CHAT_STREAM_DONE;
	}
	return reasoning->oom || content->oom ? -ENOMEM : 0;
}

int chat_stream_finish(struct chat_stream *s, struct sbuf *reasoning, struct sbuf *content,
		       struct chat_reply *r, struct err *e)
{
	int rc;
	if (s->phase == CHAT_STREAM_REASONING) {
		/* Cut off while thinking: the reasoning so far, checked like a closed one. */
		struct sbuf t = {0};
		if (s->text.len)
			sbuf_put(&t, s->text.p, s->text.len);
		sbuf_puts(&t, CHAT_THINK_END);
		rc = t.oom ? -ENOMEM : chat_parse(r, t.p, t.len, s->mode, e);
		sbuf_free(&t);
	} else {
		rc = chat_parse(r, s->text.p ? s->text.p : "", s->text.len, s->mode, e);
	}
	if (rc)
		return rc;
	ASSERT(s->n_reasoning <= r->reasoning_len && s->n_content <= r->content_len);
	sbuf_put(reasoning, r->reasoning + s->n_reasoning, r->reasoning_len - s->n_reasoning);
	sbuf_put(content, r->content + s->n_content, r->content_len - s->n_content);
	s->n_reasoning = r->reasoning_len;
	s->n_content = r->content_len;
	if (reasoning->oom || content->oom) {
		chat_reply_free(r);
		return -ENOMEM;
	}
	return 0;
}

void chat_stream_free(struct chat_stream *s)
{
	sbuf_free(&s->text);
	memset(s, 0, sizeof *s);
}
