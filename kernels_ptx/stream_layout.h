/*
 * stream_layout.h — the streaming decode kernel's device tables (kernels_ptx/gemm_fp8_stream.cu),
 * whose sizes its launcher (model/cuda_gemm.c) checks each GEMM against. Plain preprocessor
 * definitions: read by nvcc and by the C compiler.
 */
#ifndef DSV32_STREAM_LAYOUT_H
#define DSV32_STREAM_LAYOUT_H

#define ST_MAXG 8192	    /* groups with a tensor map in st_maps */
#define ST_COUNTS (1 << 20) /* arrival counts of the fused chunk sum (st_count) */

#endif
