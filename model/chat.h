/*
 * chat.h — DeepSeek-V3.2 chat encoding (spec §8.3) and the parser for what the model writes back.
 *
 * Owns: turning OpenAI-style JSON messages into the prompt text, byte for byte as DeepSeek's
 * encoding_dsv32.py encode_messages() does, with every span marked as template text (special
 * tokens allowed) or caller content (plain text only); checking those messages and naming the
 * message and field that is wrong; splitting model output into reasoning, content and DSML
 * tool calls, in one call on the final text or incrementally while it streams.
 * Must not: tokenize (model/tokenizer.* does, using the segments below), trust its input, or
 * abort on anything a client sends.
 *
 * Tokenizing a prompt without prompt injection: special tokens may be recognised only where the
 * whole token string lies inside an allow_special segment; the text between two recognised
 * special tokens is encoded as one run regardless of segment boundaries. When no content holds
 * special-token text this gives exactly the ids the reference gets from the whole string.
 */
#ifndef DSV32_CHAT_H
#define DSV32_CHAT_H

#include <stddef.h>

#include "model/err.h"
#include "model/json.h"

#define CHAT_BOS "<｜begin▁of▁sentence｜>"
#define CHAT_EOS "<｜end▁of▁sentence｜>"
#define CHAT_THINK_START "<think>"
#define CHAT_THINK_END "</think>"

enum chat_mode {
	CHAT_MODE_CHAT,     /* thinking_mode="chat": every user turn ends "<｜Assistant｜></think>" */
	CHAT_MODE_THINKING, /* thinking_mode="thinking": the last user turn ends "...<think>" */
};

struct chat_opts {
	enum chat_mode mode;
	int drop_thinking; /* reference default 1 */
	int add_bos;       /* reference default 1; ignored when context > 0 */
	/* Leading messages already encoded earlier (the reference's `context`): they shape the
	 * rendering of the rest but produce no text, and no BOS is written. */
	size_t context;
};

/* The reference's defaults in the given mode: drop_thinking and BOS on, no context. */
struct chat_opts chat_opts_default(enum chat_mode mode);

struct chat_segment {
	size_t off, len;   /* bytes of chat_prompt.text */
	int allow_special; /* 1: template text; 0: caller content, to be encoded as plain text */
};

struct chat_prompt {
	char *text; /* the whole prompt, UTF-8, NUL-terminated (content may hold NUL bytes) */
	size_t len;
	struct chat_segment *seg; /* in order, non-empty, contiguous, covering text[0..len) */
	size_t n_seg;
};

/* Encodes `messages` (a JSON array of message objects). `tools` (a JSON array of OpenAI tool
 * objects, or NULL) are tools passed beside the messages: they go on messages[0] when it is a
 * system or developer message without tools of its own (as DeepSeek's test does), otherwise on
 * a new empty system message put first (as vLLM does). Returns 0, -EINVAL with e naming
 * "messages[i].field" (or "tools[i]..."), or -ENOMEM. */
int chat_encode(struct chat_prompt *out, const struct json *messages, const struct json *tools,
		const struct chat_opts *o, struct err *e);
/* The same from JSON text: either a messages array, or an object with "messages" and optional
 * "tools" (the shape of an OpenAI request body and of the reference test inputs). */
int chat_encode_json(struct chat_prompt *out, const char *json, size_t len,
		     const struct chat_opts *o, struct err *e);
void chat_prompt_free(struct chat_prompt *p);

struct chat_tool_call {
	char *name; /* NUL-terminated */
	size_t name_len;
	char *arguments; /* a JSON object as text, built like the reference's decode_dsml_to_arguments */
	size_t arguments_len;
};

struct chat_reply {
	char *reasoning; /* NUL-terminated; "" in chat mode */
	size_t reasoning_len;
	char *content;
	size_t content_len;
	struct chat_tool_call *calls;
	size_t n_calls;
	int has_eos; /* the text ended with "<｜end▁of▁sentence｜>" */
};

/* Parses a complete model output (the text generated after the prompt) the way the reference's
 * parse_message_from_completion_text does. The trailing end-of-sentence marker may be left out
 * (an engine that stops on the EOS id need not detokenize it). Returns 0, -EINVAL with e saying
 * what is malformed and at which byte, or -ENOMEM. */
int chat_parse(struct chat_reply *r, const char *text, size_t len, enum chat_mode mode,
	       struct err *e);
void chat_reply_free(struct chat_reply *r);

/* Incremental parsing: feed output text as it is generated; each feed appends to `reasoning`
 * and `content` the bytes that are now known to belong there (text that might still become
 * "</think>", the DSML block's start or EOS is held back). Tool calls are returned by
 * chat_stream_finish. The deltas of a stream that finishes without error concatenate to the
 * reply's reasoning and content (finish adds what was held back). */
enum chat_stream_phase {
	CHAT_STREAM_REASONING,
	CHAT_STREAM_CONTENT,
	CHAT_STREAM_TOOLS, /* inside the DSML block: nothing is streamed until the end */
	CHAT_STREAM_DONE,  /* EOS seen */
};

struct chat_stream {
	enum chat_mode mode;
	enum chat_stream_phase phase;
	struct sbuf text;   /* everything fed so far */
	size_t emitted;     /* bytes of text already handed out or consumed as markers */
	size_t n_reasoning; /* bytes handed out as reasoning */
	size_t n_content;   /* bytes handed out as content */
};

void chat_stream_init(struct chat_stream *s, enum chat_mode mode);
int chat_stream_feed(struct chat_stream *s, const char *p, size_t n, struct sbuf *reasoning,
		     struct sbuf *content);
/* Parses everything fed and appends the deltas still held back. A stream cut off inside the
 * reasoning (no "</think>" yet, e.g. at the token limit) gives that reasoning and empty content
 * with has_eos 0 rather than an error. */
int chat_stream_finish(struct chat_stream *s, struct sbuf *reasoning, struct sbuf *content,
		       struct chat_reply *r, struct err *e);
void chat_stream_free(struct chat_stream *s);

#endif
