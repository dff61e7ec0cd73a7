/*
 * cli.h — subcommands of the dsv32 CLI. Each returns the process exit status
 * (0 ok, 1 failure, 2 usage error); argv[0] is the subcommand's name.
 */
#ifndef DSV32_CLI_H
#define DSV32_CLI_H

#include <stddef.h>
#include <stdint.h>

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

/* The server's stats text (dsv32_stats, then up to 10 s for its event) into buf, cut to n - 1
 * bytes and NUL-terminated: 1; 0 on a timeout; -EIO for the server's ERROR event, buf then
 * holding "NAME: message"; another negative errno from the client library. */
struct dsv32;
int cli_fetch_stats(struct dsv32 *h, uint64_t request_id, char *buf, size_t n);

/* The count 1..9 that may follow the flag at argv[*i] (*i then moves past it), else dflt: an
 * optional value such as --mtp-draft's. */
int cli_flag_count(int argc, char **argv, int *i, int dflt);

/* benchmarks (dsv32 bench NAME) */
int bench_gemm(int argc, char **argv);
int bench_attention(int argc, char **argv);
int bench_nccl(int argc, char **argv);
int bench_tokenizer(int argc, char **argv);
int bench_ipc(int argc, char **argv);
int bench_sched(int argc, char **argv);
int bench_model(int argc, char **argv);

#endif
