/*
 * cuda_moe.c — the MoE block on the GPU (see cuda_moe.h).
 *
 * The flow for T rows, R = T * num_experts_per_tok routed rows, all on the engine stream with
 * grids sized from host bounds (the per-expert counts never leave the device):
 *   k_moe_gate_logits_* (fp32 logits, the CPU's summation order) -> k_moe_route* (experts, weights)
 *   -> k_moe_permute (rows by expert, token order within an expert)
 *   -> the quantised rows in sorted order: up to 64 tokens k_moe_quant_gather (each routed row
 *      quantised from x, and x itself for the shared expert, one launch), above that
 *      k_act_quant of x once then k_moe_gather_q
 *   -> grouped FP8 GEMM with the fused gate|up weights (N = 2 * moe_inter)
 *   -> k_moe_swiglu_quant (bf16 of silu(g) * u, then act_quant) -> grouped FP8 GEMM down_proj
 *   -> the shared expert (cuda_gemm_fp8 on the same quantised x, SwiGLU + act_quant, down)
 *   -> k_moe_combine_v8 (bit-identical to the CPU's moe_combine).
 * Every rounding is the CPU's (mlp_forward): each GEMM output is bf16, SwiGLU rounds to bf16,
 * act_quant as in cpu_fp8_linear.
 * The expert GEMMs are model/cuda_gemm.c's cuda_gemm_fp8_grouped (the decode kernel or wgmma by
 * size), the shared expert's cuda_gemm_fp8 (T > 64 goes to cuBLASLt: rows padded to 8).
 */
#include "model/cuda_moe.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/cuda_gemm.h"

int cuda_moe_layer_init(struct gpu *g, struct gpu_region *r, const struct dsv32_config *c,
			gpu_ptr gate, gpu_ptr gate_bias, const gpu_ptr *w13, const gpu_ptr *s13,
			const gpu_ptr *w2, const gpu_ptr *s2, struct cuda_fp8_mat sh13,
			struct cuda_fp8_mat sh2, struct cuda_moe_layer *L, struct err *e)
{
	int E = (int)c->n_routed_experts;
	if (E < 2 || E > 256 || E % 2 || c->hidden_size % 128 || c->moe_intermediate_size % 128 ||
	    c->num_experts_per_tok < 1 || c->num_experts_per_tok > 32 || c->n_group < 1 ||
	    E % c->n_group || sh13.out % 256 || sh13.in != c->hidden_size ||
	    sh2.out != c->hidden_size || sh2.in * 2 != sh13.out) {
		return err_set(e, -EINVAL,
			       "cuda_moe_layer_init: unsupported MoE shape (E %d, hidden %lld, inter %lld)",
			       E, (long long)c->hidden_size, (long long)c->moe_intermediate_size);
	}
	size_t tab = (size_t)E * sizeof(uint64_t);
	*L = (struct cuda_moe_layer){.gate = gate, .gate_bias = gate_bias, .sh13 = sh13, .sh2 = sh2};
	L->w13_tab = gpu_region_alloc(r, tab);
	L->s13_tab = gpu_region_alloc(r, tab);
	L->w2_tab = gpu_region_alloc(r, tab);
	L->s2_tab = gpu_region_alloc(r, tab);
	if (!L->w13_tab || !L->s13_tab || !L->w2_tab || !L->s2_tab)
		return err_set(e, -ENOMEM, "cuda_moe_layer_init: region %s full", r->name);
	uint64_t *h = malloc(tab);
	if (!h)
		return err_set(e, -ENOMEM, "cuda_moe_layer_init: out of memory");
	const gpu_ptr *src[4] = {w13, s13, w2, s2};
	gpu_ptr dst[4] = {L->w13_tab, L->s13_tab, L->w2_tab, L->s2_tab};
	int rc = 0;
	for (int k = 0; k < 4 && !rc; k++) {
		for (int x = 0; x < E; x++)
			h[x] = src[k][x];
		rc = gpu_upload(g, dst[k], h, tab);
	}
	free(h);
	return rc ? err_set(e, rc, "cuda_moe_layer_init: upload of the expert tables failed (%d)", rc)
		  : 0;
}

/* The shapes of one call. */
struct moe_dims {
	int T, Tp, R, D, I, Ish, E, K;
};

static struct moe_dims moe_dims(const struct dsv32_config *c, int T, int Ish)
{
	struct moe_dims d = {.T = T, .D = (int)c->hidden_size, .I = (int)c->moe_intermediate_size,
			     .Ish = Ish, .E = (int)c->n_routed_experts,
			     .K = (int)c->num_experts_per_tok};
	d.R = T * d.K;
	d.Tp = T > 64 ? (T + 7) / 8 * 8 : T; /* cuBLASLt takes M % 8 == 0 (cuda_gemm.h) */
	return d;
}

static size_t grouped_ws(const struct gpu *g, int R, int E, int N, int K)
{
	return cuda_gemm_fp8_grouped_workspace(g, R, E, N, K);
}

/* Workspace of the GEMMs (one buffer, used by one GEMM at a time). */
static size_t gemm_ws(const struct gpu *g, const struct moe_dims *d)
{
	size_t w[4] = {grouped_ws(g, d->R, d->E, 2 * d->I, d->D), grouped_ws(g, d->R, d->E, d->D, d->I),
		       cuda_gemm_fp8_workspace(g, d->Tp, 2 * d->Ish, d->D),
		       cuda_gemm_fp8_workspace(g, d->Tp, d->D, d->Ish)};
	size_t m = 256;
	for (int i = 0; i < 4; i++)
		m = w[i] > m ? w[i] : m;
	return m;
}

/* The scratch buffers, in push order; sizes in bytes. */
enum { B_LOGITS, B_IDX, B_WTS, B_CNT, B_OFF, B_PERM, B_SRC, B_X8, B_SX, B_XS8, B_SXS, B_GU, B_H8,
       B_HS, B_EY, B_SGU, B_SH8, B_SHS, B_SHY, B_WS, B_COUNT };

static void scratch_sizes(const struct gpu *g, const struct moe_dims *d, size_t *sz)
{
	size_t T = (size_t)d->T, Tp = (size_t)d->Tp, R = (size_t)d->R, D = (size_t)d->D,
	       I = (size_t)d->I, Ish = (size_t)d->Ish;
	sz[B_LOGITS] = T * d->E * 4;
	sz[B_IDX] = R * 4;
	sz[B_WTS] = R * 4;
	sz[B_CNT] = (size_t)d->E * 4;
	sz[B_OFF] = ((size_t)d->E + 1) * 4;
	sz[B_PERM] = R * 4;
	sz[B_SRC] = R * 4;
	sz[B_X8] = Tp * D;
	sz[B_SX] = Tp * (D / 128) * 4;
	sz[B_XS8] = R * D;
	sz[B_SXS] = R * (D / 128) * 4;
	sz[B_GU] = R * 2 * I * 2;
	sz[B_H8] = R * I;
	sz[B_HS] = R * (I / 128) * 4;
	sz[B_EY] = R * D * 2;
	sz[B_SGU] = Tp * 2 * Ish * 2;
	sz[B_SH8] = Tp * Ish;
	sz[B_SHS] = Tp * (Ish / 128) * 4;
	sz[B_SHY] = Tp * D * 2;
	sz[B_WS] = gemm_ws(g, d);
}

size_t cuda_moe_scratch_bytes(const struct gpu *g, const struct dsv32_config *c, int T)
{
	/* the shared expert's width is moe_inter * n_shared_experts (cuda_moe_layer_init checks
	 * the layer's matrices against it) */
	int Ish = (int)(c->moe_intermediate_size * (c->n_shared_experts > 0 ? c->n_shared_experts : 1));
	struct moe_dims d = moe_dims(c, T, Ish);
	size_t sz[B_COUNT], total = 256;
	scratch_sizes(g, &d, sz);
	for (int i = 0; i < B_COUNT; i++)
		total += (sz[i] + 255) / 256 * 256;
	return total;
}

/* The router-logit kernel for T rows (kernels_ptx/moe_block.cu; all give the CPU's bits): its
 * tile (token rows x experts a block) and dynamic shared memory. a8 / a2l / a2: cp.async rings
 * of 6 / 3 / 6 stages of (rows + 2) rows of 2 KC + 16 bytes (KC = 512 / 512 / 128); tiled:
 * GT_SMEM. */
struct gate_kernel {
	const char *name;
	int rows, experts;
	unsigned smem;
};

static struct gate_kernel gate_kernel_for(int T, int E, int D)
{
	if (T > 256 && E % 32 == 0) /* enough 32 x 32 tiles to fill the GPU */
		return (struct gate_kernel){"k_moe_gate_logits_tiled", 32, 32,
					    64 * (8 * 12 + 8) * 4 + 4 * 64 * (64 * 2 + 16)}; /* GT_SMEM */
	if (T <= 16 && D % 512 == 0)
		return (struct gate_kernel){"k_moe_gate_logits_a8", 16, 2, 6 * (16 + 2) * (512 * 2 + 16)};
	if (D % 512 == 0)
		return (struct gate_kernel){"k_moe_gate_logits_a2l", 64, 2, 3 * (64 + 2) * (512 * 2 + 16)};
	return (struct gate_kernel){"k_moe_gate_logits_a2", 64, 2, 6 * (64 + 2) * (128 * 2 + 16)};
}

/* One expert GEMM over the R sorted rows (y row stride N). */
static int grouped(struct gpu *g, gpu_ptr w_tab, gpu_ptr s_tab, gpu_ptr off, int G, gpu_ptr x8,
		   gpu_ptr sx, gpu_ptr y, int R, int N, int K, gpu_ptr ws, size_t ws_bytes)
{
	return cuda_gemm_fp8_grouped(g, w_tab, s_tab, off, G, x8, sx, y, R, N, K, N, ws, ws_bytes);
}

/* SwiGLU of gu [rows, 2I] then act_quant -> h8 [rows, I], hs [rows, I/128]. */
static int swiglu_quant(struct gpu *g, gpu_ptr gu, gpu_ptr h8, gpu_ptr hs, int rows, int I)
{
	long long n = (long long)rows * (I / 128);
	void *args[] = {&gu, &h8, &hs, &I, &n};
	return gpu_launch(g, gpu_kernel(g, "k_moe_swiglu_quant"), (unsigned)((n + 7) / 8), 1, 1, 256,
			  1, 1, 0, args);
}

/* A copy of n bytes of an intermediate into a trace buffer (when the trace asks for it). */
static int tap(struct gpu *g, gpu_ptr dst, gpu_ptr src, size_t n)
{
	if (!dst)
		return 0;
	return cu_check(cu.cuMemcpyDtoDAsync(dst, src, n, g->stream), "cuMemcpyDtoDAsync", __FILE__,
			__LINE__)
		       ? -EIO
		       : 0;
}

static int moe_run(struct gpu *g, const struct dsv32_config *c, const struct cuda_moe_layer *L,
		   gpu_ptr x, gpu_ptr y, const struct moe_dims *d, const gpu_ptr *b, size_t ws_bytes,
		   unsigned stages, const struct cuda_moe_taps *tr)
{
	int T = d->T, E = d->E, D = d->D, K = d->K, R = d->R, I = d->I, Ish = d->Ish;
	int rc = 0;
	/* router logits and the routing */
	if (stages & CUDA_MOE_GATE) {
		void *args[] = {(void *)&L->gate, &x, (void *)&b[B_LOGITS], &T, &E, &D};
		struct gate_kernel k = gate_kernel_for(T, E, D);
		void *fn = gpu_kernel(g, k.name);
		if (!fn)
			return -ENOENT;
		if (k.smem > 48 * 1024)
			CU_TRY(cu.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
						     (int)k.smem));
		rc = gpu_launch(g, fn, (unsigned)(E / k.experts), (unsigned)((T + k.rows - 1) / k.rows), 1,
				256, 1, 1, k.smem, args);
		if (rc)
			return rc;
	}
	if (stages & CUDA_MOE_ROUTE) {
		int G = (int)c->n_group, tg = (int)c->topk_group, norm = c->norm_topk_prob;
		float scale = (float)c->routed_scaling_factor;
		gpu_ptr bias = L->gate_bias;
		if (E == 256 && G == 8 && tg <= 8 && K <= 32) { /* the real shape: a warp a token */
			void *wargs[] = {(void *)&b[B_LOGITS], &bias, &T, &tg, &K, &norm, &scale,
					 (void *)&b[B_IDX], (void *)&b[B_WTS]};
			rc = gpu_launch(g, gpu_kernel(g, "k_moe_route_w"), (unsigned)((T + 7) / 8), 1, 1,
					256, 1, 1, 0, wargs);
		} else {
			void *rargs[] = {(void *)&b[B_LOGITS], &bias, &E, &G, &tg, &K, &norm, &scale,
					 (void *)&b[B_IDX], (void *)&b[B_WTS]};
			rc = gpu_launch(g, gpu_kernel(g, "k_moe_route"), (unsigned)T, 1, 1, 256, 1, 1, 0,
					rargs);
		}
		if (rc)
			return rc;
	}
	/* rows by expert; x quantised once (rows T..Tp-1 zero for the padded shared GEMM) and
	 * gathered in that order */
	if (stages & CUDA_MOE_PERMUTE) {
		void *pargs[] = {(void *)&b[B_IDX], &T, &K, &E, (void *)&b[B_CNT], (void *)&b[B_OFF],
				 (void *)&b[B_PERM], (void *)&b[B_SRC]};
		rc = gpu_launch(g, gpu_kernel(g, "k_moe_permute"), 1, 1, 1, 1024, 1, 1, 0, pargs);
		if (rc)
			return rc;
	}
	if ((stages & CUDA_MOE_GATHER) && T <= 64) { /* decode: one launch (Tp == T) */
		long long ng = (long long)(R + T) * (D / 128);
		void *args[] = {&x, (void *)&b[B_SRC], (void *)&b[B_XS8], (void *)&b[B_SXS],
				(void *)&b[B_X8], (void *)&b[B_SX], &D, &R, &T};
		rc = gpu_launch(g, gpu_kernel(g, "k_moe_quant_gather"), (unsigned)((ng + 7) / 8), 1, 1,
				256, 1, 1, 0, args);
		if (rc)
			return rc;
	} else if (stages & CUDA_MOE_GATHER) {
		long long ng = (long long)T * (D / 128);
		void *args[] = {&x, (void *)&b[B_X8], (void *)&b[B_SX], &ng};
		rc = gpu_launch(g, gpu_kernel(g, "k_act_quant"), (unsigned)((ng + 7) / 8), 1, 1, 256, 1,
				1, 0, args);
		if (!rc && d->Tp > T) {
			size_t pad = (size_t)(d->Tp - T);
			rc = cu_check(cu.cuMemsetD8Async(b[B_X8] + (size_t)T * D, 0, pad * D, g->stream),
				      "cuMemsetD8Async", __FILE__, __LINE__) ||
			     cu_check(cu.cuMemsetD8Async(b[B_SX] + (size_t)T * (D / 128) * 4, 0,
							 pad * (D / 128) * 4, g->stream),
				      "cuMemsetD8Async", __FILE__, __LINE__)
				     ? -EIO
				     : 0;
		}
		if (rc)
			return rc;
		void *gargs[] = {(void *)&b[B_X8], (void *)&b[B_SX], (void *)&b[B_SRC],
				 (void *)&b[B_XS8], (void *)&b[B_SXS], &D, &R};
		rc = gpu_launch(g, gpu_kernel(g, "k_moe_gather_q"), (unsigned)((R + 7) / 8), 1, 1, 256,
				1, 1, 0, gargs);
		if (rc)
			return rc;
	}
	/* routed experts: gate|up, SwiGLU + act_quant, down */
	if (stages & CUDA_MOE_W13) {
		rc = grouped(g, L->w13_tab, L->s13_tab, b[B_OFF], E, b[B_XS8], b[B_SXS], b[B_GU], R,
			     2 * I, D, b[B_WS], ws_bytes);
		if (!rc && tr)
			rc = tap(g, tr->gu, b[B_GU], (size_t)R * 2 * I * 2);
	}
	if (!rc && (stages & CUDA_MOE_SWIGLU))
		rc = swiglu_quant(g, b[B_GU], b[B_H8], b[B_HS], R, I);
	if (!rc && (stages & CUDA_MOE_W2)) {
		rc = grouped(g, L->w2_tab, L->s2_tab, b[B_OFF], E, b[B_H8], b[B_HS], b[B_EY], R, D, I,
			     b[B_WS], ws_bytes);
		if (!rc && tr)
			rc = tap(g, tr->ey, b[B_EY], (size_t)R * D * 2);
	}
	if (rc)
		return rc;
	/* shared expert on the same quantised x */
	if (stages & CUDA_MOE_SHARED) {
		rc = cuda_gemm_fp8(g, L->sh13.w, L->sh13.s, b[B_X8], b[B_SX], b[B_SGU], d->Tp, 2 * Ish,
				   D, 2 * Ish, b[B_WS], ws_bytes);
		if (!rc)
			rc = swiglu_quant(g, b[B_SGU], b[B_SH8], b[B_SHS], d->Tp, Ish);
		if (!rc)
			rc = cuda_gemm_fp8(g, L->sh2.w, L->sh2.s, b[B_SH8], b[B_SHS], b[B_SHY], d->Tp, D,
					   Ish, D, b[B_WS], ws_bytes);
		if (!rc && tr)
			rc = tap(g, tr->sh, b[B_SHY], (size_t)T * D * 2);
		if (rc)
			return rc;
	}
	if (!(stages & CUDA_MOE_COMBINE))
		return 0;
	/* y = bf16( sum of weighted expert rows + shared ) */
	void *cargs[] = {(void *)&b[B_EY], (void *)&b[B_WTS], (void *)&b[B_PERM], (void *)&b[B_SHY],
			 &y, &T, &K, &D};
	long long blocks = ((long long)T * D / 8 + 255) / 256, cap = 64LL * g->sm_count;
	return gpu_launch(g, gpu_kernel(g, "k_moe_combine_v8"), (unsigned)(blocks < cap ? blocks : cap),
			  1, 1, 256, 1, 1, 0, cargs);
}

int cuda_moe_forward(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
		     const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y, int T,
		     const struct cuda_moe_trace *trace)
{
	return cuda_moe_forward_stages(g, a, c, L, x, y, T, trace, NULL, CUDA_MOE_ALL);
}

int cuda_moe_forward_stages(struct gpu *g, struct gpu_arena *a, const struct dsv32_config *c,
			    const struct cuda_moe_layer *L, gpu_ptr x, gpu_ptr y, int T,
			    const struct cuda_moe_trace *trace, const struct cuda_moe_taps *taps,
			    unsigned stages)
{
	if (T < 1)
		return T == 0 ? 0 : -EINVAL;
	struct moe_dims d = moe_dims(c, T, L->sh2.in);
	size_t sz[B_COUNT];
	scratch_sizes(g, &d, sz);
	size_t mark = gpu_arena_mark(a);
	gpu_ptr b[B_COUNT];
	for (int i = 0; i < B_COUNT; i++) {
		gpu_ptr t = 0;
		if (trace && i == B_LOGITS)
			t = trace->logits;
		else if (trace && i == B_IDX)
			t = trace->idx;
		else if (trace && i == B_WTS)
			t = trace->wts;
		b[i] = t ? t : gpu_arena_push(a, sz[i]);
		if (!b[i]) {
			gpu_arena_release(a, mark);
			return -ENOMEM;
		}
	}
	int rc = moe_run(g, c, L, x, y, &d, b, sz[B_WS], stages, taps);
	gpu_arena_release(a, mark);
	return rc;
}

#endif
