/*
 * cmd_client.c — the client subcommands: `dsv32 generate`, `dsv32 chat`, `dsv32 stats`.
 *
 * They use only the public client library (ipc/dsv32.h): connect to a running dsv32d, submit,
 * stream the events, print. No engine code is linked into what they do.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/dsv32.h"
#include "tools/cli/cli.h"

struct client_opts {
	const char *socket;
	struct dsv32_generate_params p;
	const char *stop[DSV32_MAX_STOP];
	uint32_t *ids;
	int print_ids, thinking, quiet;
	int timeout_ms;
};

/* Appends s to buf; with escape = 1 as the inside of a JSON string literal (quotes,
 * backslashes and control characters escaped), else verbatim. */
static void append(char **buf, size_t *len, size_t *cap, const char *s, int escape)
{
	for (const char *p = s;; p++) {
		if (*len + 8 >= *cap) {
			*cap = *cap ? *cap * 2 : 256;
			*buf = realloc(*buf, *cap);
			if (!*buf)
				exit(1);
		}
		if (!*p)
			break;
		unsigned char c = (unsigned char)*p;
		if (escape && (c == '"' || c == '\\'))
			*len += (size_t)sprintf(*buf + *len, "\\%c", c);
		else if (escape && c < 0x20)
			*len += (size_t)sprintf(*buf + *len, "\\u%04x", c);
		else
			(*buf)[(*len)++] = (char)c;
	}
	(*buf)[*len] = 0;
}

static int parse_common(struct client_opts *o, int argc, char **argv, int *i)
{
	const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
	struct dsv32_generate_params *p = &o->p;
	if (!strcmp(a, "--socket") && v)
		o->socket = v;
	else if (!strcmp(a, "--max-tokens") && v)
		p->max_tokens = (uint32_t)strtoul(v, NULL, 10);
	else if (!strcmp(a, "--temperature") && v)
		p->temperature = strtof(v, NULL);
	else if (!strcmp(a, "--top-p") && v)
		p->top_p = strtof(v, NULL);
	else if (!strcmp(a, "--top-k") && v)
		p->top_k = (int32_t)strtol(v, NULL, 10);
	else if (!strcmp(a, "--min-p") && v)
		p->min_p = strtof(v, NULL);
	else if (!strcmp(a, "--seed") && v)
		p->seed = strtoull(v, NULL, 10);
	else if (!strcmp(a, "--logprobs") && v)
		p->logprobs = (uint32_t)strtoul(v, NULL, 10);
	else if (!strcmp(a, "--stop") && v && p->n_stop < DSV32_MAX_STOP)
		o->stop[p->n_stop++] = v;
	else if (!strcmp(a, "--timeout") && v)
		o->timeout_ms = (int)(strtod(v, NULL) * 1000);
	else
		return 0;
	(*i)++;
	return 1;
}

/* Streams one request's events to stdout; returns 0 on DONE, 1 on ERROR, 2 on lost server. */
static int stream(dsv32_t *h, const struct client_opts *o, char **text, size_t *text_len)
{
	struct dsv32_event ev;
	uint32_t *ids = NULL;
	size_t n_ids = 0, cap = 0;
	int rc = 2;
	for (;;) {
		int r = dsv32_wait(h, o->timeout_ms ? o->timeout_ms : -1, &ev);
		if (r == 0) {
			fprintf(stderr, "\ndsv32: no event within the timeout\n");
			rc = 2;
			break;
		}
		if (r < 0) {
			fprintf(stderr, "\ndsv32: connection lost\n");
			break;
		}
		if (ev.request_id != o->p.request_id)
			continue;
		if (ev.type == DSV32_EVENT_TOKEN) {
			if (!o->quiet)
				fwrite(ev.token.text, 1, ev.token.text_len, stdout);
			fflush(stdout);
			if (text) {
				*text = realloc(*text, *text_len + ev.token.text_len + 1);
				memcpy(*text + *text_len, ev.token.text, ev.token.text_len);
				*text_len += ev.token.text_len;
				(*text)[*text_len] = 0;
			}
			for (uint32_t k = 0; k < ev.token.n_tokens; k++) {
				if (n_ids == cap) {
					cap = cap ? cap * 2 : 64;
					ids = realloc(ids, cap * sizeof *ids);
				}
				ids[n_ids++] = ev.token.tokens[k];
			}
			continue;
		}
		if (ev.type == DSV32_EVENT_DONE) {
			if (!o->quiet || o->print_ids)
				printf("\n");
			if (o->print_ids) {
				for (size_t k = 0; k < n_ids; k++)
					printf("%s%u", k ? "," : "", ids[k]);
				printf("\n");
			}
			fprintf(stderr,
				"[%s: %u prompt + %u completion tokens, queued %.1f ms, ttft %.1f ms, %.2f ms/token]\n",
				dsv32_finish_name((int)ev.done.reason), ev.done.prompt_tokens,
				ev.done.completion_tokens, ev.done.queued_us / 1e3, ev.done.ttft_us / 1e3,
				ev.done.per_token_us / 1e3);
			rc = 0;
		} else if (ev.type == DSV32_EVENT_ERROR) {
			fprintf(stderr, "\ndsv32: error %s: %s\n", dsv32_error_name(ev.error.code),
				ev.error.message);
			rc = 1;
		}
		break;
	}
	free(ids);
	return rc;
}

static int connect_or_say(const struct client_opts *o, dsv32_t **h)
{
	int r = dsv32_connect(o->socket, h);
	if (r)
		fprintf(stderr, "dsv32: cannot connect to %s: %s\n",
			o->socket ? o->socket : DSV32_DEFAULT_SOCKET, strerror(-r));
	return r;
}

int cmd_generate(int argc, char **argv)
{
	struct client_opts o = {0};
	dsv32_generate_params_init(&o.p, 1);
	const char *tokens = NULL, *chat = NULL;
	char *text = NULL;
	size_t tlen = 0, tcap = 0;
	for (int i = 1; i < argc; i++) {
		if (parse_common(&o, argc, argv, &i))
			continue;
		if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = argv[++i];
		else if (!strcmp(argv[i], "--chat") && i + 1 < argc)
			chat = argv[++i];
		else if (!strcmp(argv[i], "--thinking"))
			o.p.flags |= DSV32_GEN_THINKING;
		else if (!strcmp(argv[i], "--ids"))
			o.print_ids = 1;
		else if (!strcmp(argv[i], "--quiet"))
			o.quiet = 1;
		else if (argv[i][0] == '-' && argv[i][1] == '-') {
			fprintf(stderr, "usage: dsv32 generate [--socket PATH] [--tokens 1,2,3 | --chat JSON | TEXT...]\n"
					"       [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]\n"
					"       [--seed N] [--stop S]... [--logprobs N] [--thinking] [--ids] [--quiet] [--timeout S]\n");
			return 2;
		} else { /* prompt words */
			if (tlen)
				text[tlen++] = ' ';
			size_t n = strlen(argv[i]);
			if (tlen + n + 2 > tcap) {
				tcap = (tlen + n + 2) * 2;
				text = realloc(text, tcap);
			}
			memcpy(text + tlen, argv[i], n + 1);
			tlen += n;
		}
	}
	o.p.stop = o.stop;
	if (tokens) {
		size_t n = 1;
		for (const char *p = tokens; *p; p++)
			n += *p == ',';
		o.ids = malloc(n * sizeof *o.ids);
		n = 0;
		for (char *p = (char *)tokens; *p;) {
			char *end;
			o.ids[n++] = (uint32_t)strtoul(p, &end, 10);
			if (end == p) {
				fprintf(stderr, "dsv32 generate: --tokens: expected comma-separated ids\n");
				return 2;
			}
			p = *end == ',' ? end + 1 : end;
		}
		o.p.input = DSV32_INPUT_TOKENS;
		o.p.tokens = o.ids;
		o.p.n_tokens = n;
	} else if (chat) {
		o.p.input = DSV32_INPUT_CHAT;
		o.p.text = chat;
		o.p.text_len = strlen(chat);
	} else if (text) {
		o.p.input = DSV32_INPUT_TEXT;
		o.p.text = text;
		o.p.text_len = tlen;
	} else {
		fprintf(stderr, "dsv32 generate: no prompt (TEXT, --chat JSON or --tokens ids)\n");
		return 2;
	}
	dsv32_t *h;
	if (connect_or_say(&o, &h))
		return 1;
	int r = dsv32_submit_generate(h, &o.p);
	if (r) {
		fprintf(stderr, "dsv32 generate: submit failed: %s\n", strerror(-r));
		dsv32_close(h);
		return 1;
	}
	int rc = stream(h, &o, NULL, NULL);
	dsv32_close(h);
	free(text);
	free(o.ids);
	return rc;
}

int cmd_chat(int argc, char **argv)
{
	struct client_opts o = {0};
	dsv32_generate_params_init(&o.p, 1);
	for (int i = 1; i < argc; i++) {
		if (parse_common(&o, argc, argv, &i))
			continue;
		if (!strcmp(argv[i], "--thinking"))
			o.thinking = 1;
		else {
			fprintf(stderr, "usage: dsv32 chat [--socket PATH] [--thinking] [--max-tokens N] "
					"[--temperature T] ...\n  type /think on|off, /reset, or an empty line to quit\n");
			return 2;
		}
	}
	o.p.stop = o.stop;
	dsv32_t *h;
	if (connect_or_say(&o, &h))
		return 1;
	char *hist = NULL; /* the JSON messages array so far, without its closing bracket */
	size_t hlen = 0, hcap = 0;
	append(&hist, &hlen, &hcap, "[", 0);
	char line[65536];
	uint64_t id = 1;
	int rc = 0;
	for (;;) {
		printf("%s> ", o.thinking ? "think" : "you");
		fflush(stdout);
		if (!fgets(line, sizeof line, stdin))
			break;
		line[strcspn(line, "\n")] = 0;
		if (!line[0])
			break;
		if (!strncmp(line, "/think", 6)) {
			o.thinking = !!strstr(line, "on");
			continue;
		}
		if (!strcmp(line, "/reset")) {
			hlen = 0;
			append(&hist, &hlen, &hcap, "[", 0);
			continue;
		}
		size_t mark = hlen;
		if (hlen > 1)
			hist[hlen++] = ',';
		hist[hlen] = 0;
		append(&hist, &hlen, &hcap, "{\"role\": \"user\", \"content\": \"", 0);
		append(&hist, &hlen, &hcap, line, 1);
		append(&hist, &hlen, &hcap, "\"}", 0);
		char *req = malloc(hlen + 2);
		memcpy(req, hist, hlen);
		memcpy(req + hlen, "]", 2);
		o.p.request_id = id++;
		o.p.input = DSV32_INPUT_CHAT;
		o.p.flags = o.thinking ? DSV32_GEN_THINKING : 0;
		o.p.text = req;
		o.p.text_len = hlen + 1;
		if (getenv("DSV32_DEBUG_CHAT"))
			fprintf(stderr, "request: %s\n", req);
		char *reply = NULL;
		size_t rlen = 0;
		int r = dsv32_submit_generate(h, &o.p);
		if (r) {
			fprintf(stderr, "dsv32 chat: submit failed: %s\n", strerror(-r));
			rc = 1;
		} else {
			rc = stream(h, &o, &reply, &rlen);
		}
		free(req);
		if (rc) {
			hlen = mark; /* the failed turn is not part of the history */
			hist[hlen] = 0;
			free(reply);
			if (rc == 2)
				break;
			continue;
		}
		/* the assistant turn keeps the answer; reasoning (before </think>) is dropped, as the
		 * V3.2 encoding drops it from earlier turns anyway */
		const char *answer = reply ? reply : "";
		const char *end_think = strstr(answer, "</think>");
		if (end_think)
			answer = end_think + strlen("</think>");
		append(&hist, &hlen, &hcap, ", {\"role\": \"assistant\", \"content\": \"", 0);
		append(&hist, &hlen, &hcap, answer, 1);
		append(&hist, &hlen, &hcap, "\"}", 0);
		free(reply);
	}
	free(hist);
	dsv32_close(h);
	return rc;
}

int cmd_stats(int argc, char **argv)
{
	struct client_opts o = {0};
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--socket") && i + 1 < argc)
			o.socket = argv[++i];
		else {
			fprintf(stderr, "usage: dsv32 stats [--socket PATH]\n");
			return 2;
		}
	dsv32_t *h;
	if (connect_or_say(&o, &h))
		return 1;
	static char text[1 << 16];
	int r = cli_fetch_stats(h, 1, text, sizeof text);
	if (r == 1)
		fputs(text, stdout);
	else if (r == -EIO)
		fprintf(stderr, "dsv32 stats: %s\n", text);
	dsv32_close(h);
	return r == 1 ? 0 : 1;
}

int cli_fetch_stats(dsv32_t *h, uint64_t request_id, char *buf, size_t n)
{
	struct dsv32_event ev;
	int r = dsv32_stats(h, request_id);
	buf[0] = 0;
	while (!r && (r = dsv32_wait(h, 10000, &ev)) == 1) {
		if (ev.type == DSV32_EVENT_STATS) {
			size_t k = ev.stats.len < n - 1 ? ev.stats.len : n - 1;
			memcpy(buf, ev.stats.text, k);
			buf[k] = 0;
			return 1;
		}
		if (ev.type == DSV32_EVENT_ERROR) {
			snprintf(buf, n, "%s: %s", dsv32_error_name(ev.error.code), ev.error.message);
			return -EIO;
		}
	}
	return r;
}
