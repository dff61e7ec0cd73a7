/*
 * cublaslt.h — cuBLASLt's FP8 block-scaled GEMM (DeepSeek scaling), loaded at run time.
 *
 * Owns: dlopen of libcublasLt.so.13 and the table of its functions (resolved once, like cu.c
 * does for libcuda), one cuBLASLt handle per `struct cublaslt`, and a cache of matmul plans
 * (descriptors, layouts and the heuristic's algorithm) per (M, N, K, ldy), so a decode step
 * does no heuristic query. Only cublaslt.c includes <cublasLt.h>; callers see plain types.
 * Must not: allocate device memory (the caller passes the workspace), know about the model.
 *
 * The GEMM (spec §5.4): y[M, ldy] (bf16) = x8[M, K] (e4m3) x W8[N, K]^T (e4m3), fp32 accumulate,
 * with activation scales per 1x128 (VEC128_32F) and weight scales per 128x128 (BLK128x128_32F).
 * cuBLASLt is column-major, so the call is D[N, M] = op(A) op(B) with
 *   A = W8 as a K x N column-major matrix (ld K), op T, scales BLK128x128:
 *       S[ceil(N/128), s_ld] row-major with s_ld = round_up(K/128, 4) exactly (cuBLASLt takes
 *       no leading dimension for scales): weight_scale_inv itself when K/128 % 4 == 0, which
 *       holds for every DeepSeek-V3.2 matrix (K = 512, 1536, 2048, 7168, 16384, 18432);
 *   B = x8 as a K x M column-major matrix (ld K), op N, scales VEC128:
 *       sxT[K/128, M] (token index contiguous): the TRANSPOSE of act_quant's sx[M, K/128];
 *   D = y as an N x M column-major matrix with ld = ldy, i.e. our row-major y[M, ldy].
 * If this cuBLASLt refuses that operand order, the swapped one is used (A = x8 with VEC128,
 * B = W8 with BLK128x128, D = y^T in the workspace, then transposed into y); see cublaslt.c.
 *
 * Builds without the CUDA headers, and static builds, define DSV32_NO_CUDA (driver/cu.h):
 * cublaslt_open() then fails with "no cuBLASLt in this build".
 */
#ifndef DSV32_CUBLASLT_H
#define DSV32_CUBLASLT_H

#include <stddef.h>

#include "driver/gpu.h"
#include "model/err.h"

struct cublaslt; /* opaque: handle + plan cache */

/* Loads libcublasLt.so.13 (once per process), creates a handle in g's context. 0, or
 * -ENOTSUP / -ENODEV / -EIO with e saying why. */
int cublaslt_open(struct gpu *g, struct cublaslt **out, struct err *e);
void cublaslt_close(struct cublaslt *lt);
/* "cuBLASLt 130100 (libcublasLt.so.13)" or why it is absent. */
const char *cublaslt_version(void);

/* cuBLASLt's own workspace (NVIDIA's advice for Hopper: 32 MiB). */
#define CUBLASLT_WORKSPACE ((size_t)32 << 20)
/* Workspace bytes cublaslt_gemm_fp8 needs: CUBLASLT_WORKSPACE and room for y^T. */
size_t cublaslt_gemm_fp8_workspace(int M, int N);

#ifndef DSV32_NO_CUDA
/* The GEMM above, enqueued on g's stream. ws: ws_bytes >= cublaslt_gemm_fp8_workspace(M, N)
 * of device workspace (alignment 256).
 * 0; -ENOTSUP when cuBLASLt has no algorithm for the shape (e.g. small M; remembered per
 * shape, so a refused shape costs one query); -EINVAL on a shape outside the contract
 * (K % 128, s_ld, ldy < N or ldy % 8); -EIO on a cuBLASLt error (logged with call and status). */
int cublaslt_gemm_fp8(struct cublaslt *lt, struct gpu *g, gpu_ptr W, gpu_ptr S, int s_ld,
		      gpu_ptr x8, gpu_ptr sxT, gpu_ptr y, int M, int N, int K, int ldy, gpu_ptr ws,
		      size_t ws_bytes);
#endif

#endif
