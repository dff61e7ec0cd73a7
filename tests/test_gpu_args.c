/* test_gpu_args.c — the launch argument check of driver/gpu.c, with no GPU: GPU_NARGS counts an
 * argument array and not a pointer; gpu_args_check refuses fewer arguments than the kernel's
 * parameters (the driver would read past the array: how a five-argument launch of a six-parameter
 * kernel crashed the forward in session 14) and lets the rest through; the embedded kernel table
 * carries each entry's parameter count from its PTX (tools/embed.c), checked on kernels whose
 * signatures this test knows; gpu_kernel_embedded finds entries by name in that table. */
#include <errno.h>
#include <string.h>

#include "driver/gpu.h"
#include "tests/test.h"

#ifndef DSV32_NO_CUDA
#include "driver/kernels.h"

static int nargs_of(void **args) { return GPU_NARGS(args); }

TEST(gpu_args, nargs_counts_arrays_only)
{
	int a = 1, b = 2;
	void *three[] = {&a, &b, &a};
	void **p = three;
	CHECK_EQ_INT(GPU_NARGS(three), 3);
	CHECK_EQ_INT(GPU_NARGS(((void *[]){&a, &b})), 2);
	CHECK_EQ_INT(GPU_NARGS(p), -1);
	CHECK_EQ_INT(nargs_of(three), -1);
}

TEST(gpu_args, check_refuses_too_few)
{
	int k0 = 0, k1 = 0, k2 = 0; /* (their addresses stand for CUfunctions) */
	struct gpu_kernel_fn fns[] = {{"k_three", &k0, 3, 0}, {"k_none", &k1, 0, 0},
				      {"k_unknown", &k2, -1, 0}};
	struct gpu g;
	memset(&g, 0, sizeof g);
	g.fns = fns, g.n_fns = 3;
	CHECK_EQ_INT(gpu_args_check(&g, &k0, 3), 0);
	CHECK_EQ_INT(gpu_args_check(&g, &k0, 2), -EINVAL);
	CHECK_EQ_INT(gpu_args_check(&g, &k0, 0), -EINVAL);
	CHECK_EQ_INT(gpu_args_check(&g, &k0, 4), 0);  /* more: the rest unused */
	CHECK_EQ_INT(gpu_args_check(&g, &k0, -1), 0); /* count not known */
	CHECK_EQ_INT(gpu_args_check(&g, &k1, 0), 0);
	CHECK_EQ_INT(gpu_args_check(&g, &k2, 1), 0);  /* parameters not known */
	CHECK_EQ_INT(gpu_args_check(&g, &g, 1), 0);   /* not a looked-up kernel */
	CHECK_EQ_INT(gpu_args_check(&g, NULL, 3), -ENOENT); /* no kernel: not found */
	CHECK_EQ_INT(gpu_args_check(&g, NULL, -1), -ENOENT);
}

/* The parameter count of entry `name` in the embedded table, -2 when absent. */
static int embedded_params(const char *name)
{
	for (int i = 0; i < n_kernel_images; i++)
		for (int k = 0; k < kernel_images[i].n_entries; k++)
			if (!strcmp(kernel_images[i].entries[k], name))
				return kernel_images[i].entry_params[k];
	return -2;
}

TEST(gpu_args, embedded_table_counts_parameters)
{
	if (n_kernel_images == 0) {
		printf("    no kernels embedded (a build without nvcc)\n");
		return;
	}
	int entries = 0;
	for (int i = 0; i < n_kernel_images; i++)
		for (int k = 0; k < kernel_images[i].n_entries; k++, entries++)
			CHECK(kernel_images[i].entry_params[k] >= 0);
	/* k_act_quant(x, q, s, n_groups); k_moe_swiglu_quant(gu, h8, hs, I, n_groups, table);
	 * k_moe_combine_v8(ex, w, perm, sh, y, T, K, D): kernels_ptx/act_quant.cu, moe_block.cu */
	CHECK_EQ_INT(embedded_params("k_act_quant"), 4);
	CHECK_EQ_INT(embedded_params("k_moe_swiglu_quant"), 6);
	CHECK_EQ_INT(embedded_params("k_moe_combine_v8"), 8);
	printf("    %d kernels embedded, each with its parameter count\n", entries);
}
#endif

#ifndef DSV32_NO_CUDA
/* gpu_kernel_embedded: the quiet test cuda_gemm_fp8_stream_sw asks before taking a kernel's
 * traced twin (k_..._traced, kernels_ptx/gemm_fp8_stream.cu) */
TEST(gpu_args, embedded_kernels_known_by_name)
{
	const int any = n_kernel_images > 0;
	CHECK_EQ_INT(gpu_kernel_embedded("k_act_quant"), any);
	CHECK_EQ_INT(gpu_kernel_embedded("k_gemm_fp8_swap_n120q4"), any);
	CHECK_EQ_INT(gpu_kernel_embedded("k_gemm_fp8_swap_n120q4_traced"), any);
	CHECK_EQ_INT(gpu_kernel_embedded("k_gemm_fp8_swap_n64k2_traced"), 0); /* no twin */
	CHECK_EQ_INT(gpu_kernel_embedded("k_act_quant_x"), 0);
	CHECK_EQ_INT(gpu_kernel_embedded(""), 0);
}
#endif
