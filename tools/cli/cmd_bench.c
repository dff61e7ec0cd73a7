/*
 * cmd_bench.c — `dsv32 bench WHAT ...`: the benchmarks, one per subsystem. Each prints its
 * numbers, the ratio to the peer or the physical limit measured in the same run, and the
 * command; none asserts a speed.
 */
#include <stdio.h>
#include <string.h>

#include "tools/cli/cli.h"

int bench_moe(int argc, char **argv); /* cmd_bench_moe.c */

static const struct cli_cmd benches[] = {
	{"tokenizer", bench_tokenizer, "tokenizer encode/decode MB/s on one core vs the JS reference"},
	{"ipc", bench_ipc, "round-trip latency through the shared-memory rings vs a unix socket"},
	{"sched", bench_sched, "scheduler bookkeeping per step at 256 sequences (fake backend) and the sampler"},
	{"attention", bench_attention, "indexer scan and top-2048 on the GPU at 1K-128K contexts, batch 1-128"},
	{"model", bench_model, "the whole model at real dims (synthetic weights and KV): decode, prefill, TTFT (GPU)"},
	{"gemm", bench_gemm, "FP8 block-scaled GEMMs at the real shapes vs the HBM read limit (GPU)"},
	{"moe", bench_moe, "the MoE block at the real dims, 1-4096 tokens: stages, TB/s, TFLOP/s (GPU)"},
	{"nccl", bench_nccl, "NCCL's all-reduce over this process's GPUs at 1-4096 rows of 7168 (GPU)"},
};

int cmd_bench(int argc, char **argv)
{
	if (argc >= 2)
		for (size_t i = 0; i < sizeof benches / sizeof *benches; i++)
			if (!strcmp(argv[1], benches[i].name))
				return benches[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "usage: dsv32 bench WHAT [ARGS]\n");
	for (size_t i = 0; i < sizeof benches / sizeof *benches; i++)
		fprintf(stderr, "  %-10s %s\n", benches[i].name, benches[i].help);
	return 2;
}
