/*
 * cmd_chat_render.c — `dsv32 chat-render` (messages JSON on stdin -> the DeepSeek-V3.2 prompt on
 * stdout) and `dsv32 chat-parse` (model output on stdin -> reasoning, content and tool calls as
 * one JSON object). Offline helpers around model/chat.h for checking prompts by eye or against
 * the reference encoder; they do not tokenize.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat.h"
#include "tools/cli/cli.h"

#define STDIN_MAX ((size_t)256 << 20)

static char *read_stdin(size_t *len)
{
	struct sbuf b = {0};
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, stdin)) > 0 && b.len <= STDIN_MAX)
		sbuf_put(&b, buf, n);
	if (ferror(stdin) || b.len > STDIN_MAX || !sbuf_cstr(&b)) {
		sbuf_free(&b);
		return NULL;
	}
	*len = b.len;
	return b.p;
}

static int usage(const char *cmd)
{
	if (!strcmp(cmd, "chat-parse"))
		fprintf(stderr, "usage: dsv32 chat-parse [--thinking] < output.txt\n");
	else
		fprintf(stderr, "usage: dsv32 chat-render [--model DIR] [--thinking] [--keep-thinking] "
				"[--no-bos] [--context N] [--segments] < messages.json\n"
				"  messages.json: a messages array, or {\"messages\": [...], \"tools\": [...]}\n"
				"  --segments: print each span on its own line as T (template) or C (content)\n"
				"              and its JSON-quoted text, instead of the prompt\n");
	return 2;
}

static int parse_main(enum chat_mode mode)
{
	size_t len;
	char *text = read_stdin(&len);
	if (!text) {
		fprintf(stderr, "dsv32: cannot read stdin\n");
		return 1;
	}
	struct chat_reply r;
	struct err e = {{0}};
	int rc = chat_parse(&r, text, len, mode, &e);
	free(text);
	if (rc) {
		fprintf(stderr, "dsv32: %s\n", rc == -EINVAL ? e.msg : strerror(-rc));
		return 1;
	}
	struct sbuf o = {0};
	sbuf_puts(&o, "{\"reasoning_content\": ");
	json_write_str(&o, r.reasoning, r.reasoning_len, 0);
	sbuf_puts(&o, ", \"content\": ");
	json_write_str(&o, r.content, r.content_len, 0);
	sbuf_puts(&o, ", \"tool_calls\": [");
	for (size_t k = 0; k < r.n_calls; k++) {
		sbuf_puts(&o, k ? ", {\"name\": " : "{\"name\": ");
		json_write_str(&o, r.calls[k].name, r.calls[k].name_len, 0);
		sbuf_puts(&o, ", \"arguments\": ");
		json_write_str(&o, r.calls[k].arguments, r.calls[k].arguments_len, 0);
		sbuf_putc(&o, '}');
	}
	sbuf_printf(&o, "], \"has_eos\": %s}\n", r.has_eos ? "true" : "false");
	fwrite(o.p, 1, o.len, stdout);
	sbuf_free(&o);
	chat_reply_free(&r);
	return 0;
}

int cmd_chat_render(int argc, char **argv)
{
	struct chat_opts o = chat_opts_default(CHAT_MODE_CHAT);
	int segments = 0, parse = !strcmp(argv[0], "chat-parse");
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--thinking"))
			o.mode = CHAT_MODE_THINKING;
		else if (!parse && !strcmp(argv[i], "--model") && i + 1 < argc)
			i++; /* accepted for symmetry with the other subcommands; not needed yet */
		else if (!parse && !strcmp(argv[i], "--keep-thinking"))
			o.drop_thinking = 0;
		else if (!parse && !strcmp(argv[i], "--no-bos"))
			o.add_bos = 0;
		else if (!parse && !strcmp(argv[i], "--context") && i + 1 < argc)
			o.context = strtoul(argv[++i], NULL, 10);
		else if (!parse && !strcmp(argv[i], "--segments"))
			segments = 1;
		else
			return usage(argv[0]);
	}
	if (parse)
		return parse_main(o.mode);
	size_t len;
	char *json = read_stdin(&len);
	if (!json) {
		fprintf(stderr, "dsv32: cannot read stdin\n");
		return 1;
	}
	struct chat_prompt p;
	struct err e = {{0}};
	int rc = chat_encode_json(&p, json, len, &o, &e);
	free(json);
	if (rc) {
		fprintf(stderr, "dsv32: %s\n", rc == -EINVAL ? e.msg : strerror(-rc));
		return 1;
	}
	if (!segments) {
		fwrite(p.text, 1, p.len, stdout);
	} else {
		struct sbuf b = {0};
		for (size_t k = 0; k < p.n_seg; k++) {
			sbuf_puts(&b, p.seg[k].allow_special ? "T " : "C ");
			json_write_str(&b, p.text + p.seg[k].off, p.seg[k].len, 0);
			sbuf_putc(&b, '\n');
		}
		fwrite(b.p, 1, b.len, stdout);
		sbuf_free(&b);
	}
	chat_prompt_free(&p);
	return 0;
}
