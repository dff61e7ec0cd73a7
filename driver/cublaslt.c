/*
 * cublaslt.c — dlopen of libcublasLt.so.13, its function table, and the FP8 block-scaled GEMM
 * with DeepSeek's scaling (see cublaslt.h for the operand mapping).
 *
 * Owns: the process-wide table `lt_fn`, each handle's plan cache. Must not: allocate device
 * memory or know about the model. The only file that includes <cublasLt.h>.
 */
#include "driver/cublaslt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* y^T (LT_ACTS_A) with 16-byte aligned columns, then cuBLASLt's own workspace. */
size_t cublaslt_gemm_fp8_workspace(int M, int N)
{
	return ((size_t)N * ((M + 7) / 8 * 8) * 2 + 255) / 256 * 256 + CUBLASLT_WORKSPACE;
}

#ifdef DSV32_NO_CUDA

int cublaslt_open(struct gpu *g, struct cublaslt **out, struct err *e)
{
	*out = NULL;
	return err_set(e, -ENOTSUP, "no cuBLASLt in this build (static or built without the "
				    "CUDA headers)");
}

void cublaslt_close(struct cublaslt *lt) {}

const char *cublaslt_version(void) { return "no cuBLASLt in this build"; }

#else

#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>

#define LT_FUNCS(X)                                                                           \
	X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetVersion) X(cublasLtGetStatusName)   \
	X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                              \
	X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate)                       \
	X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmulPreferenceCreate)                      \
	X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)            \
	X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)

static struct {
#define LT_MEMBER(name) __typeof__(name) *name;
	LT_FUNCS(LT_MEMBER)
#undef LT_MEMBER
} lt_fn;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_result;
static char load_msg[512];
static char version_msg[128] = "cuBLASLt not loaded";

/* The library's soname first (found through the loader's path), then the toolkit's usual
 * place: the GPU machines have it in /usr/local/cuda/lib64 without an ld.so.conf entry. */
static void load(void)
{
	static const char *const names[] = {"libcublasLt.so.13",
					    "/usr/local/cuda/lib64/libcublasLt.so.13"};
	void *lib = NULL;
	for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++)
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		load_result = -ENODEV;
		snprintf(load_msg, sizeof load_msg, "no cuBLASLt: dlopen(libcublasLt.so.13): %s",
			 dlerror());
		return;
	}
#define LT_RESOLVE(name)                                                                     \
	if (!(lt_fn.name = (__typeof__(name) *)dlsym(lib, #name))) {                         \
		load_result = -ENODEV;                                                       \
		snprintf(load_msg, sizeof load_msg, "libcublasLt.so.13 lacks %s", #name);    \
		return;                                                                      \
	}
	LT_FUNCS(LT_RESOLVE)
#undef LT_RESOLVE
	size_t ver = lt_fn.cublasLtGetVersion();
	snprintf(version_msg, sizeof version_msg, "cuBLASLt %zu (libcublasLt.so.13)", ver);
	/* The block-scaled modes (VEC128_32F, BLK128x128_32F) arrived in cuBLAS 12.9. */
	if (ver < 120900) {
		load_result = -ENOTSUP;
		snprintf(load_msg, sizeof load_msg,
			 "cuBLASLt %zu lacks FP8 block scaling (needs >= 12.9)", ver);
		return;
	}
	load_result = 0;
}

const char *cublaslt_version(void)
{
	pthread_once(&load_once, load);
	return load_result ? load_msg : version_msg;
}

/* Logs "<3>dsv32: CUBLAS_STATUS_X in CALL at FILE:LINE"; 0, -ENOTSUP or -EIO. */
static int lt_check(cublasStatus_t s, const char *call, const char *file, int line)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	const char *name = lt_fn.cublasLtGetStatusName ? lt_fn.cublasLtGetStatusName(s) : NULL;
	fprintf(stderr, "<3>dsv32: %s (%d) in %s at %s:%d\n", name ? name : "cuBLAS error",
		(int)s, call, file, line);
	return s == CUBLAS_STATUS_NOT_SUPPORTED ? -ENOTSUP : -EIO;
}

#define LT_TRY(call)                                                       \
	do {                                                               \
		int lt_r_ = lt_check((call), #call, __FILE__, __LINE__);   \
		if (lt_r_)                                                 \
			return lt_r_;                                      \
	} while (0)

/* Two ways to put the GEMM to cuBLASLt, tried in this order until the heuristic accepts one
 * (remembered process-wide): cuBLASLt documents both operand orders of the DeepSeek scaling.
 *   LT_WEIGHTS_A: A = W8 (op T, BLK128x128), B = x8 (op N, VEC128), D = y directly;
 *   LT_ACTS_A:    A = x8 (op T, VEC128), B = W8 (op N, BLK128x128), D = y^T [N, round_up(M,8)]
 *                 in the workspace, then k_bf16_transpose into y. */
enum lt_variant { LT_WEIGHTS_A, LT_ACTS_A, LT_VARIANTS };
static const char *const variant_name[] = {"weights as A", "activations as A"};
static int preferred_variant; /* the last variant the heuristic accepted */

/* One shape's prepared call. ok < 0: cuBLASLt refused the shape (cached, not re-queried). */
struct lt_plan {
	int M, N, K, ldy, s_ld;
	size_t ws_bytes;
	int ok, variant, ldt; /* ldt: y^T's leading dimension (LT_ACTS_A) */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t a, b, d;
	cublasLtMatmulAlgo_t algo;
};

#define LT_PLANS 256

struct cublaslt {
	cublasLtHandle_t handle;
	int n_plans, next_evict; /* a full cache replaces entries round-robin */
	struct lt_plan plans[LT_PLANS];
};

static void plan_free(struct lt_plan *p)
{
	if (p->d)
		lt_fn.cublasLtMatrixLayoutDestroy(p->d);
	if (p->b)
		lt_fn.cublasLtMatrixLayoutDestroy(p->b);
	if (p->a)
		lt_fn.cublasLtMatrixLayoutDestroy(p->a);
	if (p->desc)
		lt_fn.cublasLtMatmulDescDestroy(p->desc);
	p->d = p->b = p->a = NULL;
	p->desc = NULL;
}

int cublaslt_open(struct gpu *g, struct cublaslt **out, struct err *e)
{
	*out = NULL;
	pthread_once(&load_once, load);
	if (load_result)
		return err_set(e, load_result, "%s", load_msg);
	if (g->cc_major != 9)
		return err_set(e, -ENOTSUP, "cuBLASLt's 128x128 FP8 block scaling needs sm_90 "
					    "(this GPU is sm_%d%d)", g->cc_major, g->cc_minor);
	struct cublaslt *lt = calloc(1, sizeof *lt);
	if (!lt)
		return err_set(e, -ENOMEM, "out of memory");
	/* cuBLASLt uses the context current on this thread: gpu_open made g's primary current. */
	cublasStatus_t s = lt_fn.cublasLtCreate(&lt->handle);
	if (s != CUBLAS_STATUS_SUCCESS) {
		free(lt);
		return err_set(e, -EIO, "cublasLtCreate: %s", lt_fn.cublasLtGetStatusName(s));
	}
	*out = lt;
	return 0;
}

void cublaslt_close(struct cublaslt *lt)
{
	if (!lt)
		return;
	for (int i = 0; i < lt->n_plans; i++)
		plan_free(&lt->plans[i]);
	lt_fn.cublasLtDestroy(lt->handle);
	free(lt);
}

/* Sets the scale pointers of p's descriptor (A's and B's, by variant). */
static int plan_set_scales(struct lt_plan *p, gpu_ptr S, gpu_ptr sxT)
{
	const void *sw = (const void *)(uintptr_t)S, *sa = (const void *)(uintptr_t)sxT;
	const void *pa = p->variant == LT_WEIGHTS_A ? sw : sa;
	const void *pb = p->variant == LT_WEIGHTS_A ? sa : sw;
	LT_TRY(lt_fn.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
						    &pa, sizeof pa));
	LT_TRY(lt_fn.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
						    &pb, sizeof pb));
	return 0;
}

/* Descriptors, layouts and the heuristic's first algorithm for one shape and variant (see
 * cublaslt.h). The scale pointers must be set before the heuristic: it rejects a block-scaled
 * mode without one (CUBLAS_STATUS_INVALID_VALUE). */
static int plan_try(struct cublaslt *lt, struct lt_plan *p, gpu_ptr S, gpu_ptr sxT)
{
	cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	int wa = p->variant == LT_WEIGHTS_A;
	int32_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
	int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
	int32_t mode_a = wa ? blk : vec, mode_b = wa ? vec : blk;
	uint64_t rows_a = (uint64_t)p->K, cols_a = (uint64_t)(wa ? p->N : p->M);
	uint64_t cols_b = (uint64_t)(wa ? p->M : p->N);
	p->ldt = (p->M + 7) / 8 * 8;
	LT_TRY(lt_fn.cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	LT_TRY(lt_fn.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
	LT_TRY(lt_fn.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
	LT_TRY(lt_fn.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
						    &mode_a, sizeof mode_a));
	LT_TRY(lt_fn.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
						    &mode_b, sizeof mode_b));
	int r = plan_set_scales(p, S, sxT);
	if (r)
		return r;
	/* FAST_ACCUM stays at its default 0: cuBLASLt promotes to fp32 periodically (2xAcc). */
	LT_TRY(lt_fn.cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, rows_a, cols_a, p->K));
	LT_TRY(lt_fn.cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, (uint64_t)p->K, cols_b, p->K));
	if (wa)
		LT_TRY(lt_fn.cublasLtMatrixLayoutCreate(&p->d, CUDA_R_16BF, (uint64_t)p->N,
							(uint64_t)p->M, p->ldy));
	else
		LT_TRY(lt_fn.cublasLtMatrixLayoutCreate(&p->d, CUDA_R_16BF, (uint64_t)p->M,
							(uint64_t)p->N, p->ldt));
	cublasLtMatmulPreference_t pref = NULL;
	LT_TRY(lt_fn.cublasLtMatmulPreferenceCreate(&pref));
	size_t ws = CUBLASLT_WORKSPACE;
	r = lt_check(lt_fn.cublasLtMatmulPreferenceSetAttribute(
			     pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
		     "cublasLtMatmulPreferenceSetAttribute", __FILE__, __LINE__);
	cublasLtMatmulHeuristicResult_t res;
	int n = 0;
	memset(&res, 0, sizeof res);
	cublasStatus_t s = r ? CUBLAS_STATUS_SUCCESS
			     : lt_fn.cublasLtMatmulAlgoGetHeuristic(lt->handle, p->desc, p->a, p->b,
								    p->d, p->d, pref, 1, &res, &n);
	lt_fn.cublasLtMatmulPreferenceDestroy(pref);
	if (r)
		return r;
	/* No algorithm is not an error to log: it is how cuBLASLt says "not this shape". */
	if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && n < 1))
		return -ENOTSUP;
	if (s != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, "<4>dsv32: cuBLASLt (%s) M=%d N=%d K=%d: ", variant_name[p->variant],
			p->M, p->N, p->K);
		return lt_check(s, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
	}
	p->algo = res.algo;
	return 0;
}

/* Tries the preferred variant, then the other; the first the heuristic accepts is kept. */
static int plan_build(struct cublaslt *lt, struct lt_plan *p, gpu_ptr S, gpu_ptr sxT)
{
	int first = preferred_variant, r = -ENOTSUP;
	for (int i = 0; i < LT_VARIANTS; i++) {
		p->variant = (first + i) % LT_VARIANTS;
		r = plan_try(lt, p, S, sxT);
		if (!r) {
			preferred_variant = p->variant;
			return 0;
		}
		plan_free(p);
	}
	return r;
}

static struct lt_plan *plan_get(struct cublaslt *lt, int M, int N, int K, int ldy, int s_ld,
				size_t ws_bytes, gpu_ptr S, gpu_ptr sxT)
{
	for (int i = 0; i < lt->n_plans; i++) {
		struct lt_plan *p = &lt->plans[i];
		if (p->M == M && p->N == N && p->K == K && p->ldy == ldy && p->s_ld == s_ld &&
		    p->ws_bytes == ws_bytes)
			return p;
	}
	struct lt_plan *p;
	if (lt->n_plans < LT_PLANS) {
		p = &lt->plans[lt->n_plans++];
	} else {
		p = &lt->plans[lt->next_evict];
		lt->next_evict = (lt->next_evict + 1) % LT_PLANS;
		plan_free(p);
	}
	*p = (struct lt_plan){.M = M, .N = N, .K = K, .ldy = ldy, .s_ld = s_ld,
			      .ws_bytes = ws_bytes};
	p->ok = plan_build(lt, p, S, sxT);
	return p;
}

int cublaslt_gemm_fp8(struct cublaslt *lt, struct gpu *g, gpu_ptr W, gpu_ptr S, int s_ld,
		      gpu_ptr x8, gpu_ptr sxT, gpu_ptr y, int M, int N, int K, int ldy, gpu_ptr ws,
		      size_t ws_bytes)
{
	/* cuBLASLt reads the weight scales with rows of round_up(K/128, 4): it has no ld for them */
	if (M < 1 || N < 1 || K % 128 || s_ld != (K / 128 + 3) / 4 * 4 || ldy < N || ldy % 8 ||
	    ws_bytes < cublaslt_gemm_fp8_workspace(M, N)) {
		fprintf(stderr, "<3>dsv32: cublaslt_gemm_fp8: unsupported shape M=%d N=%d K=%d "
				"s_ld=%d ldy=%d (or workspace %zu < %zu)\n", M, N, K, s_ld, ldy,
			ws_bytes, cublaslt_gemm_fp8_workspace(M, N));
		return -EINVAL;
	}
	/* workspace: [y^T for LT_ACTS_A | cuBLASLt's own CUBLASLT_WORKSPACE] */
	size_t yt_bytes = cublaslt_gemm_fp8_workspace(M, N) - CUBLASLT_WORKSPACE;
	gpu_ptr lt_ws = ws + yt_bytes;
	struct lt_plan *p = plan_get(lt, M, N, K, ldy, s_ld, CUBLASLT_WORKSPACE, S, sxT);
	if (p->ok)
		return p->ok;
	int r = plan_set_scales(p, S, sxT);
	if (r)
		return r;
	int wa = p->variant == LT_WEIGHTS_A;
	const void *pa = (const void *)(uintptr_t)(wa ? W : x8);
	const void *pb = (const void *)(uintptr_t)(wa ? x8 : W);
	void *d = (void *)(uintptr_t)(wa ? y : ws);
	const float alpha = 1.0f, beta = 0.0f;
	LT_TRY(lt_fn.cublasLtMatmul(lt->handle, p->desc, &alpha, pa, p->a, pb, p->b, &beta, d, p->d,
				    d, p->d, &p->algo, (void *)(uintptr_t)lt_ws, CUBLASLT_WORKSPACE,
				    (cudaStream_t)g->stream));
	if (wa)
		return 0;
	/* y[m, n] = yT[n, m]: rows = N, cols = M of the source */
	long long ld_src = p->ldt, ld_dst = ldy;
	int rows = N, cols = M;
	void *args[] = {&ws, &ld_src, &y, &ld_dst, &rows, &cols};
	return gpu_launch(g, gpu_kernel(g, "k_bf16_transpose"), (unsigned)(cols + 31) / 32,
			  (unsigned)(rows + 31) / 32, 1, 32, 8, 1, 0, args);
}

#endif
