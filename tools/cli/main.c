/*
 * main.c — the dsv32 command-line tool: the table of subcommands.
 *
 * Offline subcommands link the engine (model/); client subcommands use only the client
 * library (ipc/dsv32.h). Each subcommand lives in its own file tools/cli/cmd_<name>.c and is
 * listed in the table below.
 */
#include <stdio.h>
#include <string.h>

#include "ipc/dsv32.h"
#include "tools/cli/cli.h"

static const struct cli_cmd commands[] = {
	{"run", cmd_run, "the main job offline: load a model, generate from a prompt, stream the text"},
	{"generate", cmd_generate, "client: send one request to dsv32d and stream the answer"},
	{"chat", cmd_chat, "client: interactive chat with dsv32d (streaming, history, /think on|off)"},
	{"stats", cmd_stats, "client: the server's statistics"},
	{"info", cmd_info, "load a checkpoint, bind every tensor and print a summary"},
	{"chat-render", cmd_chat_render, "messages JSON on stdin -> the V3.2 chat prompt (no tokenizing)"},
	{"chat-parse", cmd_chat_render, "model output on stdin -> reasoning, content, tool calls as JSON"},
	{"tokenize", cmd_tokenize, "text on stdin -> token ids (--model DIR [--special])"},
	{"detokenize", cmd_detokenize, "token ids on stdin -> text (--model DIR)"},
	{"eval", cmd_eval, "run the forward pass on token files: logits, MTP, dumps, perplexity, greedy"},
	{"bench", cmd_bench, "benchmarks: dsv32 bench WHAT (gemm, ...)"},
};

int cli_flag_count(int argc, char **argv, int *i, int dflt)
{
	const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
	if (!v || v[0] < '1' || v[0] > '9' || v[1])
		return dflt;
	++*i;
	return v[0] - '0';
}

static void usage(FILE *f)
{
	fprintf(f, "dsv32 %s — DeepSeek-V3.2 inference engine tools\n\nusage: dsv32 COMMAND [ARGS]\n\n",
		dsv32_version());
	for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
		fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "dsv32: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
