/*
 * chat.c — the DeepSeek-V3.2 prompt encoder (spec §8.3): OpenAI-style messages -> prompt text
 * with template/content segments. See chat.h for the contract; the output parser is in
 * chat_parse.c.
 *
 * Owns: checking each message (typed -EINVAL naming "messages[i].field"), and rendering exactly
 * what DeepSeek's encoding_dsv32.py encode_messages() renders. Values the reference turns into
 * JSON are written with Python's dict semantics (a repeated key keeps its first position and its
 * last value) and json.dumps(ensure_ascii=False) formatting.
 * Must not: tokenize, or let caller text into a segment that allows special tokens.
 *
 * Where the reference raises (an assertion, KeyError, TypeError, or an index out of range) we
 * return -EINVAL. Where it would silently print Python's str() of a wrong type (None, a list) we
 * return -EINVAL too, so every accepted input renders as the reference renders it.
 */
#include "model/chat.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define DSML "｜DSML｜"

static const char tools_head[] =
	"## Tools\n"
	"\n"
	"You have access to a set of tools you can use to answer the user's question.\n"
	"You can invoke functions by writing a \"<" DSML "function_calls>\" block like the "
	"following as part of your reply to the user:\n"
	"<" DSML "function_calls>\n"
	"<" DSML "invoke name=\"$FUNCTION_NAME\">\n"
	"<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML
	"parameter>\n"
	"...\n"
	"</" DSML "invoke>\n"
	"<" DSML "invoke name=\"$FUNCTION_NAME2\">\n"
	"...\n"
	"</" DSML "invoke>\n"
	"</" DSML "function_calls>\n"
	"\n"
	"String and scalar parameters should be specified as is without any escaping or quotes, "
	"while lists and objects should use JSON format. The \"string\" attribute should be set to "
	"\"true\" for string type parameters and \"false\" for other types (numbers, booleans, "
	"arrays, objects).\n"
	"\n"
	"If the thinking_mode is enabled, then after function results you should strongly consider "
	"outputting a thinking block. Here is an example:\n"
	"\n"
	"<" DSML "function_calls>\n"
	"...\n"
	"</" DSML "function_calls>\n"
	"\n"
	"<function_results>\n"
	"...\n"
	"</function_results>\n"
	"\n"
	CHAT_THINK_START "...thinking about results" CHAT_THINK_END "\n"
	"\n"
	"Here are the functions available in JSONSchema format:\n"
	"<functions>\n";

static const char response_format_head[] =
	"## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

struct chat_opts chat_opts_default(enum chat_mode mode)
{
	struct chat_opts o = {.mode = mode, .drop_thinking = 1, .add_bos = 1, .context = 0};
	return o;
}

/* ---- Python-like views of JSON values ---------------------------------------------------- */

/* dict.get(key): the last member with that key wins, as json.loads builds dicts. */
static const struct json *get(const struct json *obj, const char *key)
{
	const struct json *r = NULL;
	size_t kl = strlen(key);
	if (!obj || obj->type != JSON_OBJECT)
		return NULL;
	for (const struct json *c = obj->child; c; c = c->next)
		if (c->key_len == kl && !memcmp(c->key, key, kl))
			r = c;
	return r;
}

/* bool(value) in Python. */
static int truthy(const struct json *v)
{
	if (!v)
		return 0;
	switch (v->type) {
	case JSON_NULL:
	case JSON_FALSE: return 0;
	case JSON_TRUE: return 1;
	case JSON_NUMBER: return v->num != 0;
	case JSON_STRING: return v->len > 0;
	case JSON_ARRAY:
	case JSON_OBJECT: return v->n > 0;
	}
	return 0;
}

struct kref {
	const struct json *m;
	size_t i;
};

static int kref_cmp(const void *pa, const void *pb)
{
	const struct kref *a = pa, *b = pb;
	size_t n = a->m->key_len < b->m->key_len ? a->m->key_len : b->m->key_len;
	int c = memcmp(a->m->key, b->m->key, n);
	if (c)
		return c;
	if (a->m->key_len != b->m->key_len)
		return a->m->key_len < b->m->key_len ? -1 : 1;
	return a->i < b->i ? -1 : a->i > b->i;
}

/* The members of obj as a Python dict sees them: out[i] is the value shown at member i's place
 * (the last member with that key), or NULL where member i repeats an earlier key. */
static int dict_members(const struct json *obj, const struct json ***out)
{
	size_t n = obj->n;
	const struct json **val = calloc(n ? n : 1, sizeof *val);
	struct kref *k = malloc((n ? n : 1) * sizeof *k);
	if (!val || !k) {
		free(val);
		free(k);
		return -ENOMEM;
	}
	size_t i = 0;
	for (const struct json *c = obj->child; c && i < n; c = c->next, i++)
		k[i] = (struct kref){c, i};
	qsort(k, n, sizeof *k, kref_cmp);
	for (size_t g = 0; g < n;) {
		size_t h = g + 1;
		while (h < n && k[h].m->key_len == k[g].m->key_len &&
		       !memcmp(k[h].m->key, k[g].m->key, k[g].m->key_len))
			h++;
		val[k[g].i] = k[h - 1].m;
		g = h;
	}
	free(k);
	*out = val;
	return 0;
}

/* json.dumps(v, ensure_ascii=False) of the value json.loads would have built from v. */
static int write_py(struct sbuf *b, const struct json *v)
{
	if (v->type == JSON_ARRAY) {
		sbuf_putc(b, '[');
		for (const struct json *c = v->child; c; c = c->next) {
			if (c != v->child)
				sbuf_puts(b, ", ");
			int r = write_py(b, c);
			if (r)
				return r;
		}
		sbuf_putc(b, ']');
		return 0;
	}
	if (v->type == JSON_NUMBER && isinf(v->num) && strpbrk(v->str, ".eE")) {
		/* json.loads makes a float of 1e400 and json.dumps writes it as Infinity (json_write
		 * keeps the source text instead, to stay valid JSON) */
		json_write_double(b, v->num);
		return 0;
	}
	if (v->type != JSON_OBJECT) {
		json_write(b, v, 0);
		return 0;
	}
	const struct json **val;
	int r = dict_members(v, &val);
	if (r)
		return r;
	sbuf_putc(b, '{');
	size_t i = 0, k = 0;
	for (const struct json *c = v->child; c; c = c->next, i++) {
		if (!val[i])
			continue;
		if (k++)
			sbuf_puts(b, ", ");
		json_write_str(b, c->key, c->key_len, 0);
		sbuf_puts(b, ": ");
		if ((r = write_py(b, val[i])))
			break;
	}
	sbuf_putc(b, '}');
	free(val);
	return r;
}

/* ---- the output: text plus segments ------------------------------------------------------ */

struct out {
	struct sbuf b;
	struct chat_segment *seg;
	size_t n_seg, cap_seg;
	int oom;
};

/* Marks b[start..len) as one span of the given kind, merging with the previous span. */
static void mark(struct out *o, size_t start, int special)
{
	size_t n = o->b.len - start;
	if (!n || o->b.oom)
		return;
	if (o->n_seg && o->seg[o->n_seg - 1].allow_special == special) {
		o->seg[o->n_seg - 1].len += n;
		return;
	}
	if (o->n_seg == o->cap_seg) {
		size_t cap = o->cap_seg ? 2 * o->cap_seg : 64;
		struct chat_segment *s = realloc(o->seg, cap * sizeof *s);
		if (!s) {
			o->oom = 1;
			return;
		}
		o->seg = s;
		o->cap_seg = cap;
	}
	o->seg[o->n_seg++] = (struct chat_segment){start, n, special};
}

static void tpl(struct out *o, const char *s)
{
	size_t start = o->b.len;
	sbuf_puts(&o->b, s);
	mark(o, start, 1);
}

static void usr(struct out *o, const char *p, size_t n)
{
	size_t start = o->b.len;
	sbuf_put(&o->b, p, n);
	mark(o, start, 0);
}

static int usr_json(struct out *o, const struct json *v)
{
	size_t start = o->b.len;
	int r = write_py(&o->b, v);
	mark(o, start, 0);
	return r;
}

/* ---- messages, checked ------------------------------------------------------------------- */

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL, ROLE_DEVELOPER };
static const char *const role_names[] = {"system", "user", "assistant", "tool", "developer"};

struct msg {
	enum role role;
	size_t src;            /* index in the caller's array; SIZE_MAX for the system message we add */
	const char *content;   /* NULL when null or absent */
	size_t content_len;
	const char *reasoning; /* NULL when none */
	size_t reasoning_len;
	const struct json *tools;           /* a non-empty array, or NULL */
	const struct json *response_format; /* truthy, or NULL */
	const struct json *tool_calls;      /* a non-empty array, or NULL */
};

/* "messages[3]" or the name of the message we made for tools passed beside the messages. */
static const char *where(const struct msg *m, char *buf, size_t size)
{
	if (m->src == SIZE_MAX)
		return "tools";
	snprintf(buf, size, "messages[%zu]", m->src);
	return buf;
}

/* An optional string member: 1 if a string, 0 if absent or null, -EINVAL otherwise. */
static int opt_str(const struct json *obj, const char *key, const char **s, size_t *len,
		   const char *at, struct err *e)
{
	const struct json *v = get(obj, key);
	*s = NULL;
	*len = 0;
	if (!v || v->type == JSON_NULL)
		return 0;
	if (v->type != JSON_STRING)
		return err_set(e, -EINVAL, "%s.%s: expected a string, got %s", at, key,
			       json_type_name(v->type));
	*s = v->str;
	*len = v->len;
	return 1;
}

static int check_tools(const struct json *tools, const char *at, struct err *e)
{
	if (tools->type != JSON_ARRAY)
		return err_set(e, -EINVAL, "%s: expected an array, got %s", at,
			       json_type_name(tools->type));
	size_t i = 0;
	for (const struct json *t = tools->child; t; t = t->next, i++) {
		if (t->type != JSON_OBJECT)
			return err_set(e, -EINVAL, "%s[%zu]: expected an object, got %s", at, i,
				       json_type_name(t->type));
		const struct json *f = get(t, "function");
		if (!f)
			return err_set(e, -EINVAL, "%s[%zu].function: missing", at, i);
		if (f->type != JSON_OBJECT)
			return err_set(e, -EINVAL, "%s[%zu].function: expected an object, got %s", at,
				       i, json_type_name(f->type));
	}
	return 0;
}

static int check_tool_calls(const struct json *calls, const char *at, struct err *e)
{
	if (calls->type != JSON_ARRAY)
		return err_set(e, -EINVAL, "%s.tool_calls: expected an array, got %s", at,
			       json_type_name(calls->type));
	size_t i = 0;
	for (const struct json *c = calls->child; c; c = c->next, i++) {
		if (c->type != JSON_OBJECT)
			return err_set(e, -EINVAL, "%s.tool_calls[%zu]: expected an object, got %s", at,
				       i, json_type_name(c->type));
		const struct json *f = get(c, "function");
		if (!f)
			return err_set(e, -EINVAL, "%s.tool_calls[%zu].function: missing", at, i);
		if (f->type != JSON_OBJECT)
			return err_set(e, -EINVAL,
				       "%s.tool_calls[%zu].function: expected an object, got %s", at,
				       i, json_type_name(f->type));
		static const char *const keys[] = {"name", "arguments"};
		for (int k = 0; k < 2; k++) {
			const struct json *v = get(f, keys[k]);
			if (!v)
				return err_set(e, -EINVAL, "%s.tool_calls[%zu].function.%s: missing", at,
					       i, keys[k]);
			if (v->type != JSON_STRING)
				return err_set(e, -EINVAL,
					       "%s.tool_calls[%zu].function.%s: expected a string, got %s",
					       at, i, keys[k], json_type_name(v->type));
		}
	}
	return 0;
}

static int load_msg(struct msg *m, const struct json *v, size_t idx, struct err *e)
{
	char at[48];
	snprintf(at, sizeof at, "messages[%zu]", idx);
	memset(m, 0, sizeof *m);
	m->src = idx;
	if (v->type != JSON_OBJECT)
		return err_set(e, -EINVAL, "%s: expected an object, got %s", at,
			       json_type_name(v->type));
	const struct json *role = get(v, "role");
	if (!role)
		return err_set(e, -EINVAL, "%s.role: missing", at);
	if (role->type != JSON_STRING)
		return err_set(e, -EINVAL, "%s.role: expected a string, got %s", at,
			       json_type_name(role->type));
	size_t r = 0;
	while (r < 5 && strcmp(role->str, role_names[r]))
		r++;
	if (r == 5 || strlen(role->str) != role->len) {
		char shown[41];
		size_t k = 0;
		for (; k < role->len && k < 40; k++) /* printable ASCII only: it may be echoed back */
			shown[k] = role->str[k] >= 0x20 && role->str[k] < 0x7f ? role->str[k] : '?';
		shown[k] = 0;
		return err_set(e, -EINVAL, "%s.role: unknown role \"%s\"", at, shown);
	}
	m->role = (enum role)r;

	int rc = opt_str(v, "content", &m->content, &m->content_len, at, e);
	if (rc < 0)
		return rc;
	if (!rc && (m->role == ROLE_USER || m->role == ROLE_TOOL || m->role == ROLE_DEVELOPER))
		return err_set(e, -EINVAL, "%s.content: missing (required for role %s)", at,
			       role_names[r]);
	if (m->role == ROLE_DEVELOPER && !m->content_len)
		return err_set(e, -EINVAL, "%s.content: empty (required for role developer)", at);

	if (m->role == ROLE_ASSISTANT) {
		const char *a, *b;
		size_t al, bl;
		if ((rc = opt_str(v, "reasoning", &a, &al, at, e)) < 0 ||
		    (rc = opt_str(v, "reasoning_content", &b, &bl, at, e)) < 0)
			return rc;
		/* msg.get("reasoning") or msg.get("reasoning_content") */
		m->reasoning = al ? a : bl ? b : NULL;
		m->reasoning_len = al ? al : bl;
	}

	const struct json *t = get(v, "tools");
	if (truthy(t)) {
		char tat[64];
		snprintf(tat, sizeof tat, "%s.tools", at);
		if ((rc = check_tools(t, tat, e)))
			return rc;
		m->tools = t;
	}
	const struct json *rf = get(v, "response_format");
	m->response_format = truthy(rf) ? rf : NULL;
	const struct json *tc = get(v, "tool_calls");
	if (truthy(tc)) {
		if ((rc = check_tool_calls(tc, at, e)))
			return rc;
		m->tool_calls = tc;
	}
	return 0;
}

/* ---- rendering, one message at a time ----------------------------------------------------- */

struct enc {
	struct out o;
	const struct msg *m;
	size_t n;
	ssize_t last_user; /* index of the last user or developer message, or -1 */
	enum chat_mode mode;
	struct err *e;
};

static int render_tools(struct enc *x, const struct json *tools)
{
	tpl(&x->o, tools_head);
	for (const struct json *t = tools->child; t; t = t->next) {
		if (t != tools->child)
			tpl(&x->o, "\n");
		int r = usr_json(&x->o, get(t, "function"));
		if (r)
			return r;
	}
	tpl(&x->o, "\n</functions>\n");
	return 0;
}

/* The tools and response-format blocks of a system or developer message. */
static int render_extras(struct enc *x, const struct msg *m)
{
	int r;
	if (m->tools) {
		tpl(&x->o, "\n\n");
		if ((r = render_tools(x, m->tools)))
			return r;
	}
	if (m->response_format) {
		tpl(&x->o, "\n\n");
		tpl(&x->o, response_format_head);
		if ((r = usr_json(&x->o, m->response_format)))
			return r;
	}
	return 0;
}

static int render_call(struct enc *x, const struct msg *m, size_t k, const struct json *call)
{
	char at[48];
	const struct json *f = get(call, "function");
	const struct json *name = get(f, "name"), *args = get(f, "arguments");
	struct json_doc d;
	int r = json_parse(&d, args->str, args->len);
	if (r == -EINVAL)
		return err_set(x->e, r, "%s.tool_calls[%zu].function.arguments: not valid JSON (%s)",
			       where(m, at, sizeof at), k, d.err);
	if (r)
		return r;
	if (d.root->type != JSON_OBJECT) {
		r = err_set(x->e, -EINVAL,
			    "%s.tool_calls[%zu].function.arguments: expected a JSON object, got %s",
			    where(m, at, sizeof at), k, json_type_name(d.root->type));
		json_doc_free(&d);
		return r;
	}
	const struct json **val;
	if ((r = dict_members(d.root, &val))) {
		json_doc_free(&d);
		return r;
	}
	tpl(&x->o, "<" DSML "invoke name=\"");
	usr(&x->o, name->str, name->len);
	tpl(&x->o, "\">\n");
	size_t i = 0, np = 0;
	for (const struct json *c = d.root->child; c && !r; c = c->next, i++) {
		const struct json *v = val[i];
		if (!v)
			continue;
		if (np++)
			tpl(&x->o, "\n");
		tpl(&x->o, "<" DSML "parameter name=\"");
		usr(&x->o, c->key, c->key_len);
		tpl(&x->o, v->type == JSON_STRING ? "\" string=\"true\">" : "\" string=\"false\">");
		if (v->type == JSON_STRING)
			usr(&x->o, v->str, v->len);
		else
			r = usr_json(&x->o, v);
		tpl(&x->o, "</" DSML "parameter>");
	}
	tpl(&x->o, "\n</" DSML "invoke>");
	free(val);
	json_doc_free(&d);
	return r;
}

static int render_assistant(struct enc *x, size_t idx)
{
	const struct msg *m = &x->m[idx];
	char at[48];
	if (x->mode == CHAT_MODE_THINKING && (ssize_t)idx > x->last_user) {
		if (!m->reasoning && !m->tool_calls)
			return err_set(x->e, -EINVAL,
				       "%s.reasoning_content: missing (in thinking mode an assistant "
				       "message after the last user message needs reasoning_content "
				       "or tool_calls)",
				       where(m, at, sizeof at));
		if (m->reasoning)
			usr(&x->o, m->reasoning, m->reasoning_len);
		tpl(&x->o, CHAT_THINK_END);
	}
	if (m->content)
		usr(&x->o, m->content, m->content_len);
	if (m->tool_calls) {
		tpl(&x->o, "\n\n<" DSML "function_calls>\n");
		size_t k = 0;
		for (const struct json *c = m->tool_calls->child; c; c = c->next, k++) {
			if (k)
				tpl(&x->o, "\n");
			int r = render_call(x, m, k, c);
			if (r)
				return r;
		}
		tpl(&x->o, "\n</" DSML "function_calls>");
	}
	tpl(&x->o, CHAT_EOS);
	return 0;
}

static int render_tool(struct enc *x, size_t idx)
{
	const struct msg *m = &x->m[idx];
	char at[48], at2[48];
	size_t a = idx;
	while (a > 0 && x->m[a - 1].role == ROLE_TOOL)
		a--;
	if (a == 0 || x->m[a - 1].role != ROLE_ASSISTANT)
		return err_set(x->e, -EINVAL,
			       "%s: a tool message must follow an assistant message with tool_calls "
			       "(or other tool messages after one)",
			       where(m, at, sizeof at));
	const struct msg *as = &x->m[a - 1];
	size_t order = idx - a + 1, n_calls = as->tool_calls ? as->tool_calls->n : 0;
	if (order > n_calls)
		return err_set(x->e, -EINVAL,
			       "%s: tool result %zu but %s.tool_calls has %zu call(s)",
			       where(m, at, sizeof at), order, where(as, at2, sizeof at2), n_calls);
	if (order == 1)
		tpl(&x->o, "\n\n<function_results>");
	tpl(&x->o, "\n<result>");
	usr(&x->o, m->content, m->content_len);
	tpl(&x->o, "</result>");
	if (order == n_calls) {
		tpl(&x->o, "\n</function_results>");
		int think = (ssize_t)idx >= x->last_user && x->mode == CHAT_MODE_THINKING;
		tpl(&x->o, think ? "\n\n" CHAT_THINK_START : "\n\n" CHAT_THINK_END);
	}
	return 0;
}

static int render(struct enc *x, size_t idx)
{
	const struct msg *m = &x->m[idx];
	int r;
	switch (m->role) {
	case ROLE_SYSTEM:
		if (m->content)
			usr(&x->o, m->content, m->content_len);
		return render_extras(x, m);
	case ROLE_DEVELOPER:
		tpl(&x->o, "<｜User｜>");
		if ((r = render_extras(x, m)))
			return r;
		tpl(&x->o, "\n\n# The user's message is: ");
		usr(&x->o, m->content, m->content_len);
		break;
	case ROLE_USER:
		tpl(&x->o, "<｜User｜>");
		usr(&x->o, m->content, m->content_len);
		break;
	case ROLE_TOOL: return render_tool(x, idx);
	case ROLE_ASSISTANT: return render_assistant(x, idx);
	}
	tpl(&x->o, "<｜Assistant｜>");
	int think = (ssize_t)idx == x->last_user && x->mode == CHAT_MODE_THINKING;
	tpl(&x->o, think ? CHAT_THINK_START : CHAT_THINK_END);
	return 0;
}

/* ---- entry points ------------------------------------------------------------------------ */

static int load_all(struct msg **out, size_t *n_out, const struct json *messages,
		    const struct json *tools, struct err *e)
{
	if (!messages || messages->type != JSON_ARRAY)
		return err_set(e, -EINVAL, "messages: expected an array, got %s",
			       messages ? json_type_name(messages->type) : "nothing");
	int r, extra_tools = truthy(tools);
	if (extra_tools && (r = check_tools(tools, "tools", e)))
		return r;
	size_t n = messages->n;
	struct msg *m = calloc(n + 1, sizeof *m);
	if (!m)
		return -ENOMEM;
	size_t i = 0;
	for (const struct json *v = messages->child; v; v = v->next, i++)
		if ((r = load_msg(&m[i], v, i, e))) {
			free(m);
			return r;
		}
	if (extra_tools) {
		if (n && (m[0].role == ROLE_SYSTEM || m[0].role == ROLE_DEVELOPER) && !m[0].tools) {
			m[0].tools = tools;
		} else {
			memmove(m + 1, m, n * sizeof *m);
			memset(m, 0, sizeof *m);
			m[0].role = ROLE_SYSTEM;
			m[0].src = SIZE_MAX;
			m[0].tools = tools;
			n++;
		}
	}
	*out = m;
	*n_out = n;
	return 0;
}

int chat_encode(struct chat_prompt *out, const struct json *messages, const struct json *tools,
		const struct chat_opts *o, struct err *e)
{
	memset(out, 0, sizeof *out);
	struct enc x = {.mode = o->mode, .e = e, .last_user = -1};
	struct msg *m = NULL;
	int r = load_all(&m, &x.n, messages, tools, e);
	if (r)
		return r;
	x.m = m;
	if (o->context > messages->n) {
		free(m);
		return err_set(e, -EINVAL, "context: %zu exceeds the %zu messages", o->context,
			       (size_t)messages->n);
	}
	/* A system message added for the tools counts as context whenever context is. */
	size_t first = o->context ? o->context + (x.n - messages->n) : 0;
	for (size_t i = x.n; i-- > 0;)
		if (m[i].role == ROLE_USER || m[i].role == ROLE_DEVELOPER) {
			x.last_user = (ssize_t)i;
			break;
		}
	/* drop_thinking_messages() keeps only user, system, tool and assistant messages before the
	 * last user message; the reference then indexes past the shortened list and fails. */
	if (o->mode == CHAT_MODE_THINKING && o->drop_thinking && first < x.n)
		for (ssize_t i = 0; i < x.last_user; i++)
			if (m[i].role == ROLE_DEVELOPER) {
				char at[48];
				r = err_set(e, -EINVAL,
					    "%s.role: a developer message before the last user message "
					    "cannot be encoded in thinking mode with drop_thinking (the "
					    "reference drops it and fails)",
					    where(&m[i], at, sizeof at));
				free(m);
				return r;
			}
	if (o->add_bos && first == 0)
		tpl(&x.o, CHAT_BOS);
	for (size_t i = first; i < x.n && !r; i++)
		r = render(&x, i);
	free(m);
	if (!r && (x.o.b.oom || x.o.oom))
		r = -ENOMEM;
	if (!r && !sbuf_cstr(&x.o.b))
		r = -ENOMEM;
	if (r) {
		sbuf_free(&x.o.b);
		free(x.o.seg);
		return r;
	}
	out->text = x.o.b.p;
	out->len = x.o.b.len;
	out->seg = x.o.seg;
	out->n_seg = x.o.n_seg;
	return 0;
}

int chat_encode_json(struct chat_prompt *out, const char *json, size_t len,
		     const struct chat_opts *o, struct err *e)
{
	memset(out, 0, sizeof *out);
	struct json_doc d;
	int r = json_parse(&d, json, len);
	if (r == -EINVAL)
		return err_set(e, r, "messages JSON: %s", d.err);
	if (r)
		return r;
	const struct json *msgs = d.root, *tools = NULL;
	if (d.root->type == JSON_OBJECT) {
		msgs = get(d.root, "messages");
		tools = get(d.root, "tools");
		if (!msgs)
			r = err_set(e, -EINVAL, "messages: missing");
	} else if (d.root->type != JSON_ARRAY) {
		r = err_set(e, -EINVAL,
			    "messages JSON: expected an array of messages or an object with "
			    "\"messages\", got %s",
			    json_type_name(d.root->type));
	}
	if (!r)
		r = chat_encode(out, msgs, tools, o, e);
	json_doc_free(&d);
	return r;
}

void chat_prompt_free(struct chat_prompt *p)
{
	free(p->text);
	free(p->seg);
	memset(p, 0, sizeof *p);
}
