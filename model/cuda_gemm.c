/*
 * cuda_gemm.c — launchers of the FP8 GEMM kernels, the cuBLASLt path and the per-shape
 * dispatch between them (see cuda_gemm.h).
 */
#include "model/cuda_gemm.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "driver/cublaslt.h"

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

/* ---- grouped (MoE experts) ------------------------------------------------------------------ */

size_t cuda_gemm_fp8_grouped_workspace(const struct gpu *g, int max_rows, int G, int N, int K)
{
	(void)g, (void)max_rows, (void)G, (void)N, (void)K;
	return 0;
}

int cuda_gemm_fp8_grouped(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G,
			  gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int max_rows, int N, int K, int ldy,
			  gpu_ptr ws, size_t ws_bytes)
{
	(void)ws, (void)ws_bytes;
	if (G < 1 || max_rows < 0 || N % 16 || K % 128 || ldy < N) {
		fprintf(stderr, "<3>dsv32: gemm_fp8_grouped: unsupported shape G=%d rows=%d N=%d "
				"K=%d ldy=%d\n", G, max_rows, N, K, ldy);
		return -EINVAL;
	}
	if (max_rows == 0)
		return 0;
	/* one z-slot per group that can have rows: at most min(G, max_rows) of them */
	int slots = G < max_rows ? G : max_rows;
	struct gemm_split sp = cuda_gemm_decode_split(g, N, K);
	int tiles_per_block = 8 / sp.ksplit;
	unsigned blocks = (unsigned)((N / 16 + tiles_per_block - 1) / tiles_per_block);
	void *args[] = {&w_tab, &s_tab, &off, &G, &x8, &sx, &y, &N, &K, &ldy, &sp.ksplit};
	return gpu_launch(g, gpu_kernel(g, "k_gemm_fp8_grouped_m8"), blocks, 1, (unsigned)slots, 256,
			  1, 1, 0, args);
}

/* ---- cuBLASLt -------------------------------------------------------------------------- */

#define MAX_GPUS 16

static pthread_mutex_t gemm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cublaslt *lt_of[MAX_GPUS]; /* per GPU ordinal, opened on first use */
static int lt_state[MAX_GPUS];           /* 0 untried, 1 open, < 0 failed (errno) */

static size_t sxT_bytes(int M, int K) { return ((size_t)M * (K / 128) * 4 + 255) / 256 * 256; }

size_t cuda_gemm_fp8_workspace(const struct gpu *g, int M, int N, int K)
{
	size_t lt = sxT_bytes(M, K) + cublaslt_gemm_fp8_workspace(M, N);
	size_t dec = M <= 64 ? cuda_gemm_decode_workspace(g, M, N, K) : 0;
	return lt > dec ? lt : dec;
}

static struct cublaslt *lt_get(struct gpu *g)
{
	if (g->ordinal < 0 || g->ordinal >= MAX_GPUS)
		return NULL;
	pthread_mutex_lock(&gemm_lock);
	if (lt_state[g->ordinal] == 0) {
		struct err e = {""};
		lt_state[g->ordinal] = cublaslt_open(g, &lt_of[g->ordinal], &e);
		if (lt_state[g->ordinal])
			fprintf(stderr, "<4>dsv32: GPU %d: no cuBLASLt GEMM path: %s\n", g->ordinal,
				e.msg);
		else
			lt_state[g->ordinal] = 1;
	}
	struct cublaslt *lt = lt_state[g->ordinal] == 1 ? lt_of[g->ordinal] : NULL;
	pthread_mutex_unlock(&gemm_lock);
	return lt;
}

int cuda_gemm_fp8_lt(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
		     int M, int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes)
{
	struct cublaslt *lt = lt_get(g);
	if (!lt)
		return -ENOTSUP;
	size_t st = sxT_bytes(M, K);
	if (M < 1 || K % 128 || ws_bytes < st + cublaslt_gemm_fp8_workspace(M, N) || !ws)
		return -EINVAL;
	/* cuBLASLt reads the activation scales token-contiguous: sxT[K/128, M] = sx^T. */
	int rows = M, cols = K / 128;
	void *args[] = {&sx, &ws, &rows, &cols};
	unsigned blocks = (unsigned)(((long long)rows * cols + 255) / 256);
	int r = gpu_launch(g, gpu_kernel(g, "k_f32_transpose"), blocks < 1024 ? blocks : 1024, 1, 1,
			   256, 1, 1, 0, args);
	if (r)
		return r;
	return cublaslt_gemm_fp8(lt, g, W, S, (K / 128 + 3) / 4 * 4, x8, ws, y, M, N, K, ldy,
				 ws + st, ws_bytes - st);
}

/* ---- the dispatch table ------------------------------------------------------------------ */

struct gemm_entry {
	int ordinal, bucket, N, K;
	enum cuda_gemm_path path;
};

#define MAX_ENTRIES 1024
static struct gemm_entry table[MAX_ENTRIES];
static int n_table;

int cuda_gemm_m_bucket(int M)
{
	int b = 8;
	while (b < M && b < (1 << 24))
		b *= 2;
	return b;
}

static struct gemm_entry *entry_find(int ordinal, int bucket, int N, int K)
{
	for (int i = 0; i < n_table; i++)
		if (table[i].ordinal == ordinal && table[i].bucket == bucket && table[i].N == N &&
		    table[i].K == K)
			return &table[i];
	return NULL;
}

enum cuda_gemm_path cuda_gemm_path_for(const struct gpu *g, int M, int N, int K)
{
	if (M > 64)
		return CUDA_GEMM_PATH_CUBLASLT; /* no prefill kernel of ours yet */
	pthread_mutex_lock(&gemm_lock);
	struct gemm_entry *e = entry_find(g->ordinal, cuda_gemm_m_bucket(M), N, K);
	enum cuda_gemm_path p = e ? e->path : CUDA_GEMM_PATH_NONE;
	pthread_mutex_unlock(&gemm_lock);
	/* Unmeasured decode shapes: ours (cuBLASLt streams ~0.35 TB/s at M = 16..128, issue 9). */
	return p == CUDA_GEMM_PATH_NONE ? CUDA_GEMM_PATH_DECODE : p;
}

void cuda_gemm_path_set(const struct gpu *g, int M, int N, int K, enum cuda_gemm_path path)
{
	pthread_mutex_lock(&gemm_lock);
	int b = cuda_gemm_m_bucket(M);
	struct gemm_entry *e = entry_find(g->ordinal, b, N, K);
	if (!e && n_table < MAX_ENTRIES)
		e = &table[n_table++];
	if (e)
		*e = (struct gemm_entry){g->ordinal, b, N, K, path};
	pthread_mutex_unlock(&gemm_lock);
}

int cuda_gemm_fp8(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y, int M,
		  int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes)
{
	if (cuda_gemm_path_for(g, M, N, K) == CUDA_GEMM_PATH_CUBLASLT) {
		int r = cuda_gemm_fp8_lt(g, W, S, x8, sx, y, M, N, K, ldy, ws, ws_bytes);
		if (r != -ENOTSUP || M > 64) {
			if (r == -ENOTSUP)
				fprintf(stderr, "<3>dsv32: FP8 GEMM M=%d N=%d K=%d: cuBLASLt cannot "
						"run it and our kernels stop at M = 64\n", M, N, K);
			return r;
		}
	}
	return cuda_gemm_fp8_decode(g, W, S, x8, sx, y, M, N, K, ldy, ws);
}

/* ---- start-up measurement ---------------------------------------------------------------- */

/* 1: cuda_gemm_tune may pick cuBLASLt over our decode kernel when it is faster (M = 32, 64 on
 * most shapes, docs/PERF.md). 0 until cuBLASLt's results pass the CPU check. */
#define CUDA_GEMM_LT_FOR_DECODE 0

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

struct tune_args {
	gpu_ptr W, S, x8, sx, y, ws, flush;
	size_t ws_bytes, flush_bytes;
	int M, N, K, ldy;
};

static int run_path(struct gpu *g, const struct tune_args *a, enum cuda_gemm_path p)
{
	if (p == CUDA_GEMM_PATH_DECODE)
		return cuda_gemm_fp8_decode(g, a->W, a->S, a->x8, a->sx, a->y, a->M, a->N, a->K,
					    a->ldy, a->ws);
	return cuda_gemm_fp8_lt(g, a->W, a->S, a->x8, a->sx, a->y, a->M, a->N, a->K, a->ldy, a->ws,
				a->ws_bytes);
}

/* Median microseconds of 5 event-timed launches after a warm-up; < 0 when the path fails. */
static float time_path(struct gpu *g, const struct tune_args *a, enum cuda_gemm_path p)
{
	if (run_path(g, a, p) || gpu_sync(g))
		return -1;
	CUevent e0, e1;
	if (cu_check(cu.cuEventCreate(&e0, CU_EVENT_DEFAULT), "cuEventCreate", __FILE__, __LINE__))
		return -1;
	if (cu_check(cu.cuEventCreate(&e1, CU_EVENT_DEFAULT), "cuEventCreate", __FILE__, __LINE__)) {
		cu.cuEventDestroy(e0);
		return -1;
	}
	float t[5], ms = -1;
	int k;
	for (k = 0; k < 5; k++) {
		if (a->flush)
			cu.cuMemsetD8Async(a->flush, (unsigned char)k, a->flush_bytes, g->stream);
		cu.cuEventRecord(e0, g->stream);
		if (run_path(g, a, p))
			break;
		cu.cuEventRecord(e1, g->stream);
		if (cu_check(cu.cuEventSynchronize(e1), "cuEventSynchronize", __FILE__, __LINE__))
			break;
		cu.cuEventElapsedTime(&t[k], e0, e1);
	}
	if (k == 5) {
		qsort(t, 5, sizeof *t, cmp_float);
		ms = t[2];
	}
	cu.cuEventDestroy(e0);
	cu.cuEventDestroy(e1);
	return ms < 0 ? -1 : ms * 1e3f;
}

int cuda_gemm_tune(struct gpu *g, gpu_ptr W, gpu_ptr S, gpu_ptr x8, gpu_ptr sx, gpu_ptr y,
		   int M, int N, int K, int ldy, gpu_ptr ws, size_t ws_bytes, gpu_ptr flush,
		   size_t flush_bytes, float *us_decode, float *us_lt)
{
	struct tune_args a = {W, S, x8, sx, y, ws, flush, ws_bytes, flush_bytes,
			      cuda_gemm_m_bucket(M), N, K, ldy};
	float td = a.M <= 64 ? time_path(g, &a, CUDA_GEMM_PATH_DECODE) : -1;
	float tl = time_path(g, &a, CUDA_GEMM_PATH_CUBLASLT);
	if (us_decode)
		*us_decode = td;
	if (us_lt)
		*us_lt = tl;
	if (td < 0 && tl < 0)
		return -EIO;
	/* cuBLASLt 13.1's block-scaled GEMM misses the CPU check (docs/PERF.md: ~1% of outputs
	 * 2+ bf16 ulps off), so where ours can run it is chosen only if ours cannot. */
	int lt_wins = tl >= 0 && (td < 0 || (CUDA_GEMM_LT_FOR_DECODE && tl < td));
	cuda_gemm_path_set(g, a.M, N, K, lt_wins ? CUDA_GEMM_PATH_CUBLASLT : CUDA_GEMM_PATH_DECODE);
	return 0;
}

void cuda_gemm_close(struct gpu *g)
{
	if (g->ordinal < 0 || g->ordinal >= MAX_GPUS)
		return;
	pthread_mutex_lock(&gemm_lock);
	if (lt_state[g->ordinal] == 1)
		cublaslt_close(lt_of[g->ordinal]);
	lt_of[g->ordinal] = NULL;
	lt_state[g->ordinal] = 0;
	int j = 0;
	for (int i = 0; i < n_table; i++)
		if (table[i].ordinal != g->ordinal)
			table[j++] = table[i];
	n_table = j;
	pthread_mutex_unlock(&gemm_lock);
}

#endif
