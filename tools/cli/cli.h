/*
 * cli.h — subcommands of the dsv32 CLI. Each returns the process exit status
 * (0 ok, 1 failure, 2 usage error); argv[0] is the subcommand's name.
 */
#ifndef DSV32_CLI_H
#define DSV32_CLI_H

struct cli_cmd {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
};

int cmd_run(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_chat_render(int argc, char **argv); /* also serves chat-parse */
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);

/* benchmarks (dsv32 bench NAME) */
int bench_gemm(int argc, char **argv);
int bench_attention(int argc, char **argv);
int bench_tokenizer(int argc, char **argv);
int bench_ipc(int argc, char **argv);
int bench_sched(int argc, char **argv);
int bench_model(int argc, char **argv);

#endif
