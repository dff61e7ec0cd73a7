/*
 * cuda_gemm_tune.h — the start-up measurement of the FP8 GEMM dispatch (issue 9: the dispatch
 * is never slower than cuBLASLt at a shape it runs): the model's dense FP8 weight shapes timed on
 * every candidate path at the M buckets the fast mode runs, the fastest recorded in
 * model/cuda_gemm.c's table.
 */
#ifndef DSV32_CUDA_GEMM_TUNE_H
#define DSV32_CUDA_GEMM_TUNE_H

#include "model/cuda_forward.h"

#ifndef DSV32_NO_CUDA
/* For each distinct (N, K) of the dense FP8 GEMMs of m's n_layers layers (the attention
 * projections, the dense MLPs) of at least 8 MB, and M buckets 1, 8, 16, 32, 64, 128 and 2048 (a
 * prefill chunk): cuda_gemm_tune_rotate on that matrix of each layer in turn (the L2 serves no
 * repeat) in the fast mode, on operand rows taken from the scratch arena and released after
 * (g's mode is restored). Smaller matrices keep the defaults (the test models: their numbers do
 * not depend on a measurement). Stops after ~5 s (the remaining shapes keep the defaults);
 * logs the time and each shape's picks. DSV32_GEMM_TUNE=0: nothing. 0 or a negative errno (the
 * table keeps what was measured before the failure). */
int cuda_gemm_tune_model(struct gpu *g, const struct fwd_model *m, int n_layers,
			 struct gpu_arena *scratch);
#endif

#endif
