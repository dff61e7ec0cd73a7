/*
 * cmd_bench_nccl.c — `dsv32 bench nccl`: NCCL's all-reduce sum over the GPUs of this process
 * (driver/nccl.h, one communicator a GPU, as expert parallelism would sum each MoE layer's
 * shares: docs/MULTIGPU.md step 3) at the sizes a step sums: R rows of the hidden size (7168)
 * in fp32 and bf16, R = 1 .. 4096 by default. Per size: the time of one all-reduce (median of
 * --trials timings of 20 back to back, CUDA events on GPU 0's stream after every stream has
 * drained), the bytes a rank holds over that time (algorithm bandwidth) and NCCL's bus
 * bandwidth (x 2 (n - 1) / n, what the links carry in a ring), against the bus bandwidth of a
 * 1 GiB all-reduce measured in the same run (the links' ceiling as NCCL reaches it) and the
 * time of a one-element all-reduce (its fixed cost). With one GPU there is nothing to measure
 * (an all-reduce of one rank in place is no work: 0.3 us at every size on an H100), and it
 * says so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/gpu.h"
#include "driver/nccl.h"
#include "tools/cli/bench_sort.h"
#include "tools/cli/cli.h"

#ifdef DSV32_NO_CUDA
int bench_nccl(int argc, char **argv)
{
	fprintf(stderr, "dsv32 bench nccl: this build has no CUDA support (static or no toolkit)\n");
	return 1;
}
#else

#define BENCH_NCCL_MAX_GPUS 8
#define HIDDEN 7168

struct nccl_bench {
	struct nccl *c;
	struct gpu *g[BENCH_NCCL_MAX_GPUS];
	gpu_ptr buf[BENCH_NCCL_MAX_GPUS]; /* each rank's buffer, summed in place */
	int n, trials;
};

/* Microseconds of one all-reduce of `count` elements of t, median of the trials; < 0 on failure. */
static double time_us(struct nccl_bench *b, size_t count, enum nccl_type t)
{
	enum { REPS = 20 };
	CUevent ev[2];
	cu.cuCtxSetCurrent(b->g[0]->ctx);
	if (gpu_timing_events(ev))
		return -1;
	double *us = malloc((size_t)b->trials * sizeof *us);
	double r = -1;
	struct err e;
	if (!us)
		goto out;
	for (int k = -1; k < b->trials; k++) { /* trial -1: the warm-up */
		for (int q = 0; q < b->n; q++)
			if (gpu_sync(b->g[q]))
				goto out;
		cu.cuEventRecord(ev[0], b->g[0]->stream);
		for (int i = 0; i < REPS; i++)
			if (nccl_all_reduce_sum(b->c, b->buf, b->buf, count, t, &e)) {
				fprintf(stderr, "dsv32 bench nccl: %s\n", e.msg);
				goto out;
			}
		cu.cuEventRecord(ev[1], b->g[0]->stream);
		float ms = 0;
		if (cu.cuEventSynchronize(ev[1]) || cu.cuEventElapsedTime(&ms, ev[0], ev[1]))
			goto out;
		if (k >= 0)
			us[k] = ms * 1e3 / REPS;
	}
	for (int q = 0; q < b->n; q++) /* every rank's part done before the next size */
		if (gpu_sync(b->g[q]))
			goto out;
	qsort(us, (size_t)b->trials, sizeof *us, bench_cmp_double);
	r = us[b->trials / 2];
out:
	free(us);
	gpu_timing_events_free(ev);
	return r;
}

/* GB/s of what NCCL's links carry for an all-reduce of `bytes` in `us` over n ranks. */
static double bus_gbs(size_t bytes, double us, int n)
{
	return bytes * 2.0 * (n - 1) / n / (us * 1e3);
}

int bench_nccl(int argc, char **argv)
{
	struct nccl_bench b = {.trials = 9};
	const char *rows = "1,16,64,256,1024,4096";
	int want = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--gpus") && i + 1 < argc)
			want = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--trials") && i + 1 < argc)
			b.trials = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
			rows = argv[++i];
		else {
			fprintf(stderr, "usage: dsv32 bench nccl [--gpus N] [--trials N] [--rows R,R,...]\n");
			return 2;
		}
	}
	if (b.trials < 1 || want < 0 || want > BENCH_NCCL_MAX_GPUS) {
		fprintf(stderr, "dsv32 bench nccl: --trials >= 1, --gpus 1 .. %d\n",
			BENCH_NCCL_MAX_GPUS);
		return 2;
	}
	struct err e = {""};
	int visible = 0;
	if (cu_load(&e) || cu.cuDeviceGetCount(&visible) != CUDA_SUCCESS || visible < 1) {
		fprintf(stderr, "dsv32 bench nccl: %s\n", e.msg[0] ? e.msg : "no GPU");
		return 1;
	}
	b.n = want ? want : visible < BENCH_NCCL_MAX_GPUS ? visible : BENCH_NCCL_MAX_GPUS;
	if (b.n > visible) {
		fprintf(stderr, "dsv32 bench nccl: --gpus %d, but %d visible\n", b.n, visible);
		return 1;
	}
	if (b.n == 1) { /* in place on one rank NCCL has nothing to do (0.3 us at any size, s38-5) */
		printf("one GPU: an all-reduce of one rank in place is no work; nothing to measure "
		       "(run with two or more GPUs)\n");
		return 0;
	}
	struct gpu gpus[BENCH_NCCL_MAX_GPUS];
	const size_t big = (size_t)1 << 30; /* bytes a rank holds: the 1 GiB ceiling run */
	int rc = 1, opened = 0;
	for (int q = 0; q < b.n; q++) {
		b.g[q] = &gpus[q];
		if (gpu_open(&gpus[q], q, &e))
			goto out;
		opened = q + 1;
		if (cu.cuMemAlloc(&b.buf[q], big) != CUDA_SUCCESS ||
		    gpu_memset(&gpus[q], b.buf[q], 0, big)) {
			snprintf(e.msg, sizeof e.msg, "GPU %d: 1 GiB for the buffers", q);
			goto out;
		}
	}
	if (nccl_open(b.g, b.n, &b.c, &e))
		goto out;
	printf("%s, %d GPUs (%s)\n", nccl_version(), b.n, gpus[0].name);
	double fixed = time_us(&b, 1, NCCL_TYPE_F32);
	double top_us = time_us(&b, big / 4, NCCL_TYPE_F32);
	double top = bus_gbs(big, top_us, b.n);
	if (fixed < 0 || top_us < 0)
		goto timing_failed;
	printf("one element: %.1f us; 1 GiB: %.0f us, bus %.1f GB/s\n", fixed, top_us, top);
	printf("%6s %5s | %9s %8s %8s %7s | %s\n", "rows", "type", "us", "alg GB/s", "bus GB/s",
	       "of 1GiB", "x fixed");
	for (const char *p = rows; *p;) {
		char *end;
		long R = strtol(p, &end, 10);
		if (end == p || (*end && *end != ',')) {
			snprintf(e.msg, sizeof e.msg, "--rows %s: not a list of numbers", rows);
			goto out;
		}
		p = *end ? end + 1 : end;
		if (R < 1 || R > 65536)
			continue;
		for (int t = 0; t < 2; t++) {
			size_t count = (size_t)R * HIDDEN, bytes = count * (t ? 2 : 4);
			double us = time_us(&b, count, t ? NCCL_TYPE_BF16 : NCCL_TYPE_F32);
			if (us < 0)
				goto timing_failed;
			double bus = bus_gbs(bytes, us, b.n);
			printf("%6ld %5s | %9.1f %8.1f %8.1f %6.0f%% | %.1f\n", R, t ? "bf16" : "fp32",
			       us, bytes / (us * 1e3), bus, 100 * bus / top, us / fixed);
		}
	}
	if (nccl_check(b.c, &e))
		goto out;
	printf("command: dsv32 bench nccl --gpus %d --trials %d --rows %s (the median of %d "
	       "timings of 20 all-reduces a size, in place; bus = alg x 2 (n - 1) / n; \"of 1GiB\": "
	       "against a 1 GiB all-reduce's bus bandwidth in this run; \"x fixed\": against a "
	       "one-element all-reduce)\n", b.n, b.trials, rows, b.trials);
	rc = 0;
	goto out;
timing_failed:
	snprintf(e.msg, sizeof e.msg, "a timed all-reduce failed (the GPU call's error is above)");
out:
	if (rc)
		fprintf(stderr, "dsv32 bench nccl: %s\n", e.msg);
	nccl_close(b.c);
	for (int q = 0; q < opened; q++) {
		cu.cuCtxSetCurrent(gpus[q].ctx);
		if (b.buf[q])
			cu.cuMemFree(b.buf[q]);
		gpu_close(&gpus[q]);
	}
	return rc;
}

#endif
