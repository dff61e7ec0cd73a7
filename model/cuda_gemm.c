/*
 * cuda_gemm.c — launchers of the FP8 GEMM kernels (see cuda_gemm.h).
 */
#include "model/cuda_gemm.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdio.h>

int cuda_gemm_decode_ksplit(int K)
{
	int kb = K / 128;
	return kb >= 8 ? 8 : kb >= 4 ? 4 : kb >= 2 ? 2 : 1;
}

int cuda_gemm_fp8_decode(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
			 int M, int N, int K, int ldy)
{
	if (M < 1 || M > 64 || N % 16 || K % 128 || ldy < N) {
		fprintf(stderr, "<3>dsv32: gemm_fp8_decode: unsupported shape M=%d N=%d K=%d ldy=%d\n",
			M, N, K, ldy);
		return -EINVAL;
	}
	static const char *names[] = {"k_gemm_fp8_decode_m1", "k_gemm_fp8_decode_m2",
				      "k_gemm_fp8_decode_m4", "k_gemm_fp8_decode_m8"};
	int v = M <= 8 ? 0 : M <= 16 ? 1 : M <= 32 ? 2 : 3;
	void *fn = gpu_kernel(g, names[v]);
	int ksplit = cuda_gemm_decode_ksplit(K);
	int tiles_per_block = 8 / ksplit;
	unsigned blocks = (unsigned)((N / 16 + tiles_per_block - 1) / tiles_per_block);
	void *args[] = {&W, &S, &x8, &sx, &y, &M, &N, &K, &ldy, &ksplit};
	return gpu_launch(g, fn, blocks, 1, 1, 256, 1, 1, 0, args);
}

#endif
