/*
 * cuda_gemm.c — launchers of the FP8 GEMM kernels (see cuda_gemm.h).
 */
#include "model/cuda_gemm.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdio.h>

struct gemm_split cuda_gemm_decode_split(const struct gpu *g, int N, int K)
{
	int kb = K / 128;
	struct gemm_split sp = {.ksplit = kb >= 8 ? 8 : kb >= 4 ? 4 : kb >= 2 ? 2 : 1};
	int blocks = (N / 16) / (8 / sp.ksplit);
	/* Aim for >= 8 blocks of 8 warps per SM (about 3 resident, so the last wave is short),
	 * but keep >= 2 K blocks per warp so the partials stay a small part of the traffic, and
	 * only for matrices >= 32 MB: below that the reduce launch costs more than it gains
	 * (measured, docs/PERF.md). */
	int want = g->sm_count * 8;
	sp.chunks = 1;
	while ((size_t)N * K >= (32u << 20) && blocks * sp.chunks * 2 <= want &&
	       kb / (sp.chunks * 2) >= 2 * sp.ksplit)
		sp.chunks *= 2;
	sp.chunk_blocks = (kb + sp.chunks - 1) / sp.chunks;
	return sp;
}

size_t cuda_gemm_decode_workspace(const struct gpu *g, int M, int N, int K)
{
	struct gemm_split sp = cuda_gemm_decode_split(g, N, K);
	return sp.chunks > 1 ? (size_t)sp.chunks * M * N * 4 : 0;
}

int cuda_gemm_fp8_decode(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
			 int M, int N, int K, int ldy, gpu_ptr ws)
{
	if (M < 1 || M > 64 || N % 16 || K % 128 || ldy < N) {
		fprintf(stderr, "<3>dsv32: gemm_fp8_decode: unsupported shape M=%d N=%d K=%d ldy=%d\n",
			M, N, K, ldy);
		return -EINVAL;
	}
	static const char *names[] = {"k_gemm_fp8_decode_m1", "k_gemm_fp8_decode_m2",
				      "k_gemm_fp8_decode_m4", "k_gemm_fp8_decode_m8"};
	int v = M <= 8 ? 0 : M <= 16 ? 1 : M <= 32 ? 2 : 3;
	struct gemm_split sp = cuda_gemm_decode_split(g, N, K);
	if (sp.chunks > 1 && !ws)
		return -EINVAL;
	int tiles_per_block = 8 / sp.ksplit;
	unsigned blocks = (unsigned)((N / 16 + tiles_per_block - 1) / tiles_per_block);
	void *args[] = {&W, &S, &x8, &sx, &y, &M, &N, &K, &ldy, &sp.ksplit, &ws, &sp.chunk_blocks};
	int r = gpu_launch(g, gpu_kernel(g, names[v]), blocks, (unsigned)sp.chunks, 1, 256, 1, 1, 0,
			   args);
	if (r || sp.chunks == 1)
		return r;
	void *rargs[] = {&ws, &y, &sp.chunks, &M, &N, &ldy};
	unsigned rb = (unsigned)(((long long)M * N + 255) / 256);
	return gpu_launch(g, gpu_kernel(g, "k_gemm_chunk_reduce"), rb < 1024 ? rb : 1024, 1, 1, 256,
			  1, 1, 0, rargs);
}

#endif
