/*
 * cuda_backend.c — the CUDA backend behind model/backend.h: GPU memory pools, the weight
 * upload, the KV page pools on the device, and the step.
 *
 * Memory (DESIGN.md §3): three virtual ranges reserved once with the driver's VMM API — the
 * weights region (every checkpoint tensor the model binds, plus the fp32 norm vectors the
 * binder made), the KV page pool (one page id indexes the MLA and indexer page of every layer,
 * sized from what is left after weights and the scratch arena), and the per-step LIFO scratch
 * arena. Nothing is allocated after creation.
 *
 * Upload: tensors are read from the mmapped checkpoint in file order into two pinned staging
 * buffers and copied to the device asynchronously, so the copy of one chunk overlaps the read
 * of the next; the rate is reported. With synthetic weights (backend_cuda_create_opts) the tensors
 * a header-only checkpoint leaves as holes are generated in place instead (model/cuda_synth.h).
 *
 * Placement (for the fused GEMMs of model/cuda_forward.c and model/cuda_moe.h): the three
 * projections of the attention-normed input, q_a_proj, indexer.wk and kv_a_proj_with_mqa,
 * adjacent as one [q_lora_rank + index_head_dim + kv_lora_rank + rope, hidden] matrix when
 * q_lora_rank % 128 == 0 (their scale matrices adjacent too, so the scale block of every row is
 * where the fused matrix expects it); every gate_proj / up_proj pair (dense MLP, each expert,
 * the shared expert) adjacent as one [2 * inter, hidden] matrix. The norm vectors (fp32 copies
 * made by the binder) and the RoPE cos/sin table go into the same region.
 *
 * The step: model/cuda_forward.c, after backend_validate_step; never a CPU fallback. Its mode
 * (fast, or batch-invariant: backend_cuda_opts.batch_invariant, DSV32_CUDA_BATCH_INVARIANT
 * overriding it when the backend is created; backend_cuda_set_batch_invariant later) is said
 * in the start-up line and by backend_cuda_mode.
 * Draws (backend_step_draw): the tokens of the sequences the scheduler asks for, drawn by the GPU
 * sampler beside the logits (model/cuda_step_sample.h: the function of model/sampler.h), for up
 * to STEP_DRAWS sequences and STEP_DRAW_HIST ids of the penalised ones' histories a step;
 * DSV32_CUDA_DRAW=0 at creation turns them off (the scheduler then samples the downloaded
 * logits itself).
 * Must not: decide scheduling or which rows are drawn.
 */
#include "model/backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver/gpu.h"
#include "model/clock.h"
#include "model/cuda_forward.h"
#include "model/cuda_gemm.h"
#include "model/cuda_gemm_tune.h"
#include "model/cuda_stage.h"
#include "model/cuda_step_sample.h"
#include "model/cuda_synth.h"
#include "model/env_knob.h"
#include "model/kv_cache.h"
#include "model/rope.h"

#ifdef DSV32_NO_CUDA

int backend_cuda_create(const struct dsv32_config *c, const struct weights *w,
			const struct checkpoint *ck, int64_t n_pages, struct backend **out,
			struct err *e)
{
	(void)c, (void)w, (void)ck, (void)n_pages, (void)out;
	struct err why;
	cu_load(&why);
	return err_set(e, -ENOTSUP, "no CUDA backend in this build: %s", why.msg);
}

int backend_cuda_layer_step(struct backend *b, int64_t layer, const struct backend_step *st,
			    float *x, float *r)
{
	(void)b, (void)layer, (void)st, (void)x, (void)r;
	return -ENOTSUP;
}

int backend_cuda_create_opts(const struct dsv32_config *c, const struct weights *w,
			     const struct checkpoint *ck, const struct backend_cuda_opts *o,
			     struct backend **out, struct err *e)
{
	if (!o->synthetic)
		return backend_cuda_create(c, w, ck, o->n_pages, out, e); /* says why: no CUDA */
	return err_set(e, -ENOTSUP, "synthetic weights need the CUDA backend, which this build "
				    "does not have");
}

const char *backend_cuda_mode(const struct backend *b)
{
	(void)b;
	return "not cuda";
}

int backend_cuda_set_batch_invariant(struct backend *b, int on)
{
	(void)b, (void)on;
	return -ENOTSUP;
}

int backend_cuda_set_switch(struct backend *b, const char *name, const char *value)
{
	(void)b, (void)name, (void)value;
	return -ENOTSUP;
}

int64_t backend_cuda_draws(const struct backend *b)
{
	(void)b;
	return -ENOTSUP;
}

int backend_cuda_graph_stats(const struct backend *b, int64_t *captures, int64_t *replays)
{
	(void)b;
	*captures = *replays = 0;
	return -ENOTSUP;
}

int backend_cuda_kv_fill_synthetic(struct backend *b, const int32_t *bt, int64_t n_tokens,
				   uint64_t seed, struct err *e)
{
	(void)b, (void)bt, (void)n_tokens, (void)seed;
	return err_set(e, -ENOTSUP, "synthetic KV needs the CUDA backend, which this build does "
				    "not have");
}

#else

#define STAGE_BYTES ((size_t)64 << 20) /* one pinned staging buffer */
/* The per-step scratch arena; a step larger than it holds runs in passes. 4 GiB holds the
 * scheduler's 2048-token prefill chunk at real dimensions in one pass (2 GiB held 1665 rows: two
 * passes, each streaming every expert's weights). */
#define SCRATCH_BYTES ((size_t)4 << 30)
/* Sequences a step may have drawn on the device (backend.sample_rows; the sampler's workspace
 * is per block, at most one block an SM, so the capacity costs 288 bytes a row beyond that) and
 * the ids of their histories (those with a penalty; backend.hist_ids: 16 MiB on the device and
 * pinned). */
#define STEP_DRAWS 1024
#define STEP_DRAW_HIST ((int64_t)1 << 22)

struct cuda_backend {
	struct backend base;
	struct gpu g;
	const struct weights *w;
	const struct checkpoint *ck;
	struct gpu_region weights_region; /* every bound tensor, checkpoint order */
	gpu_ptr *tensor_dev;              /* [ck->n_tensors] device address of each tensor, 0 if unused */
	size_t *by_data;                  /* [ck->n_tensors] tensor indices sorted by data pointer */
	struct gpu_region kv_region;      /* [n_layers][n_pages] MLA pages, then the indexer pages */
	struct gpu_arena scratch;
	struct fwd_model m;               /* device addresses the forward reads */
	void *pinned;                     /* per-step metadata staging (grown on demand) */
	struct fwd_graphs *graphs;        /* captured decode steps (made on first use) */
	struct fwd_kept kept;             /* the latest main step's kept rows (in the scratch arena) */
	CUstream side;                    /* the forward's side stream (fwd_env.side) */
	CUevent ev_fork, ev_join;         /* its fork and join events */
	void *plog;                       /* pinned logits staging (fwd_env.plog) */
	struct cuda_step_sampler smp;     /* the draws' buffers (rows 0: no draws) */
	size_t plog_bytes;
	struct fwd_host_block *hb;        /* [n_hb] backend_host_alloc's pinned blocks */
	int n_hb, cap_hb;
	struct fwd_switches sw;           /* the forward's switches (read at creation) */
	int synthetic;                    /* generate cuda_synth_generated() tensors from seed */
	int batch_invariant;              /* the mode: backend_cuda_opts.batch_invariant, or
					   * DSV32_CUDA_BATCH_INVARIANT when set (read at creation) */
	uint64_t seed;
	size_t pinned_bytes;
	size_t upload_bytes;
	double upload_s;
	int64_t l0, l1;                   /* the main layers it runs: all (0, num_hidden_layers), or
					   * a pipeline stage's range (model/cuda_stage.h) */
	struct gpu_region rows_in[2];     /* a later stage: the previous stage's rows (x, r) */
};

/* Streams n bytes from host src (the mmap) to device dst through the two pinned buffers. */
struct stager {
	struct gpu *g;
	void *buf[2];
	CUevent done[2];
	int cur;
};

static int stage_copy(struct stager *s, gpu_ptr dst, const uint8_t *src, size_t n)
{
	while (n) {
		size_t k = n < STAGE_BYTES ? n : STAGE_BYTES;
		/* this buffer's previous copy must be finished before it is overwritten */
		CU_TRY(cu.cuEventSynchronize(s->done[s->cur]));
		memcpy(s->buf[s->cur], src, k); /* the read from the page cache / disk */
		CU_TRY(cu.cuMemcpyHtoDAsync(dst, s->buf[s->cur], k, s->g->stream));
		CU_TRY(cu.cuEventRecord(s->done[s->cur], s->g->stream));
		s->cur ^= 1;
		dst += k, src += k, n -= k;
	}
	return 0;
}

/* qsort order of tensor indices: by shard, then by offset in the shard. */
static const struct checkpoint *sort_ck;
static int by_file_offset(const void *a, const void *b)
{
	const struct st_tensor *x = &sort_ck->tensors[*(const size_t *)a];
	const struct st_tensor *y = &sort_ck->tensors[*(const size_t *)b];
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->data < y->data ? -1 : x->data > y->data;
}

static size_t round256(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- where each tensor goes ------------------------------------------------------------------ */

static int by_data_ptr(const void *a, const void *b)
{
	const uint8_t *x = sort_ck->tensors[*(const size_t *)a].data;
	const uint8_t *y = sort_ck->tensors[*(const size_t *)b].data;
	return x < y ? -1 : x > y;
}

/* Index of the checkpoint tensor whose data starts at p, or -1. */
static int64_t tensor_of(const struct cuda_backend *b, const void *p)
{
	size_t lo = 0, hi = b->ck->n_tensors;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const uint8_t *d = b->ck->tensors[b->by_data[mid]].data;
		if (d == (const uint8_t *)p)
			return (int64_t)b->by_data[mid];
		if (d < (const uint8_t *)p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

/* Places n FP8 weights p[0..n-1] (same `in`, every one but the last with out % 128 == 0) as one
 * matrix [sum of out, in] with adjacent scale matrices, so each row's scale block is where the
 * fused matrix expects it; their tensors are then copied there by the upload. 0, or -1 when
 * they cannot be fused (left to the ordinary placement). */
static int place_group(struct cuda_backend *b, const struct fp8_linear *const *p, int n,
		       struct fwd_fp8 *out)
{
	int64_t t[8];
	size_t wb = 0, sb = 0;
	for (int i = 0; i < n; i++) {
		t[2 * i] = tensor_of(b, p[i]->w), t[2 * i + 1] = tensor_of(b, p[i]->scale);
		if (p[i]->in != p[0]->in || (i < n - 1 && p[i]->out % 128) || t[2 * i] < 0 ||
		    t[2 * i + 1] < 0 || b->tensor_dev[t[2 * i]] || b->tensor_dev[t[2 * i + 1]])
			return -1;
		wb += b->ck->tensors[t[2 * i]].nbytes, sb += b->ck->tensors[t[2 * i + 1]].nbytes;
	}
	gpu_ptr W = gpu_region_alloc(&b->weights_region, wb);
	gpu_ptr S = gpu_region_alloc(&b->weights_region, sb);
	if (!W || !S)
		return -1;
	*out = (struct fwd_fp8){W, S, 0, (int)p[0]->in};
	for (int i = 0; i < n; i++) {
		b->tensor_dev[t[2 * i]] = W, b->tensor_dev[t[2 * i + 1]] = S;
		W += b->ck->tensors[t[2 * i]].nbytes, S += b->ck->tensors[t[2 * i + 1]].nbytes;
		out->out += (int)p[i]->out;
	}
	return 0;
}

static int place_pair(struct cuda_backend *b, const struct fp8_linear *x, const struct fp8_linear *y,
		      struct fwd_fp8 *out)
{
	const struct fp8_linear *p[2] = {x, y};
	return place_group(b, p, 2, out);
}

/* Whether this backend runs layer l (main layers 0 .. num_hidden_layers - 1, then the MTP
 * layer): a stage runs its range, and the last one the MTP layer too. */
static int owns_layer(const struct cuda_backend *b, int64_t l)
{
	return l < b->base.c->num_hidden_layers ? l >= b->l0 && l < b->l1
						: b->l1 == b->base.c->num_hidden_layers;
}

/* Whether checkpoint tensor `name` is uploaded: its layer's when owns_layer, the embedding on the
 * first stage, the final norm and lm_head on the last, anything else everywhere. */
static int wanted_in(const struct dsv32_config *c, int64_t l0, int64_t l1, const char *name)
{
	const int64_t Lm = c->num_hidden_layers;
	long long l;
	int n = 0;
	if (sscanf(name, "model.layers.%lld.%n", &l, &n) == 1 && n > 0)
		return l >= 0 && (l < Lm ? l >= l0 && l < l1 : l1 == Lm);
	if (!strncmp(name, "model.embed_tokens.", 19))
		return l0 == 0;
	if (!strncmp(name, "model.norm.", 11) || !strncmp(name, "lm_head.", 8))
		return l1 == Lm;
	return 1;
}

static int tensor_wanted(const struct cuda_backend *b, const char *name)
{
	return wanted_in(b->base.c, b->l0, b->l1, name);
}

/* Bytes of the tensors a backend of main layers [l0, l1) uploads (each 256-aligned). */
static size_t wanted_bytes(const struct dsv32_config *c, const struct checkpoint *ck, int64_t l0,
			   int64_t l1)
{
	size_t n = 0;
	for (size_t i = 0; i < ck->n_tensors; i++)
		n += wanted_in(c, l0, l1, ck->tensors[i].name) ? round256(ck->tensors[i].nbytes) : 0;
	return n;
}

static const struct layer_weights *layer_w(const struct cuda_backend *b, int64_t l)
{
	return l < b->base.c->num_hidden_layers ? &b->w->layers[l] : &b->w->mtp.layer;
}

static int64_t n_fwd_layers(const struct cuda_backend *b)
{
	return b->base.c->num_hidden_layers + (b->w->has_mtp ? 1 : 0);
}

/* The fused placements, before any tensor is uploaded. */
static int place_fused(struct cuda_backend *b, struct err *e)
{
	const struct dsv32_config *c = b->base.c;
	for (int64_t l = 0; l < n_fwd_layers(b); l++) {
		if (!owns_layer(b, l))
			continue;
		const struct layer_weights *lw = layer_w(b, l);
		struct fwd_layer *L = &b->m.layers[l];
		const struct fp8_linear *qkv[3] = {&lw->wq_a, &lw->idx_wk, &lw->wkv_a};
		L->fused_qkv = place_group(b, qkv, 3, &L->qkv) == 0;
		L->fused_qib = place_pair(b, &lw->wq_b, &lw->idx_wq_b, &L->qib) == 0;
		L->is_moe = lw->is_moe;
		if (!lw->is_moe) {
			if (place_pair(b, &lw->w1, &lw->w3, &L->w13))
				return err_set(e, -EINVAL, "layer %lld: dense gate_proj/up_proj cannot be "
					       "placed as one matrix (intermediate_size %% 128)", (long long)l);
			continue;
		}
		int64_t E = c->n_routed_experts;
		L->ex13 = calloc((size_t)E, sizeof *L->ex13);
		L->ex2 = calloc((size_t)E, sizeof *L->ex2);
		if (!L->ex13 || !L->ex2)
			return err_set(e, -ENOMEM, "out of memory");
		if (place_pair(b, &lw->sh_w1, &lw->sh_w3, &L->sh13))
			return err_set(e, -EINVAL, "layer %lld: shared expert gate/up not fusable", (long long)l);
		for (int64_t x = 0; x < E; x++)
			if (place_pair(b, &lw->exp_w1[x], &lw->exp_w3[x], &L->ex13[x]))
				return err_set(e, -EINVAL, "layer %lld expert %lld: gate/up not fusable "
					       "(moe_intermediate_size %% 128)", (long long)l, (long long)x);
	}
	return 0;
}

static int upload_weights(struct cuda_backend *b, struct err *e)
{
	const struct checkpoint *ck = b->ck;
	const struct dsv32_config *c = b->base.c;
	size_t total = wanted_bytes(c, ck, b->l0, b->l1);
	/* + the fp32 vectors, the RoPE table and the MoE address tables */
	size_t per_layer = 16 * 256 + (size_t)4 * (2 * c->hidden_size + c->q_lora_rank +
						  c->kv_lora_rank + 2 * c->index_head_dim +
						  9 * c->n_routed_experts);
	total += (size_t)(c->num_hidden_layers + 1) * per_layer + (size_t)4 * c->hidden_size * 4 + 4096;
	total += round256((size_t)c->max_position_embeddings * 64 * sizeof(float)) + ((size_t)1 << 20);
	int r = gpu_region_reserve(&b->g, &b->weights_region, "weights", total, e);
	if (!r)
		r = gpu_region_grow(&b->g, &b->weights_region, total, e);
	if (r)
		return r;
	b->tensor_dev = calloc(ck->n_tensors, sizeof *b->tensor_dev);
	b->by_data = malloc((ck->n_tensors ? ck->n_tensors : 1) * sizeof *b->by_data);
	b->m.layers = calloc((size_t)(c->num_hidden_layers + 1), sizeof *b->m.layers);
	if (!b->tensor_dev || !b->by_data || !b->m.layers)
		return err_set(e, -ENOMEM, "out of memory");
	for (size_t i = 0; i < ck->n_tensors; i++)
		b->by_data[i] = i;
	sort_ck = ck;
	qsort(b->by_data, ck->n_tensors, sizeof *b->by_data, by_data_ptr);
	if ((r = place_fused(b, e)))
		return r;
	struct stager s = {.g = &b->g};
	s.buf[0] = gpu_host_alloc(STAGE_BYTES);
	s.buf[1] = gpu_host_alloc(STAGE_BYTES);
	if (!b->tensor_dev || !s.buf[0] || !s.buf[1]) {
		r = err_set(e, -ENOMEM, "cannot allocate 2 x %zu MiB of pinned staging memory",
			    STAGE_BYTES >> 20);
		goto out;
	}
	cu.cuEventCreate(&s.done[0], CU_EVENT_DISABLE_TIMING);
	cu.cuEventCreate(&s.done[1], CU_EVENT_DISABLE_TIMING);
	cu.cuEventRecord(s.done[0], b->g.stream);
	cu.cuEventRecord(s.done[1], b->g.stream);
	/* file order: upload shard by shard in offset order so the mmap is read sequentially */
	size_t *order = malloc(ck->n_tensors * sizeof *order);
	if (!order) {
		r = err_set(e, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < ck->n_tensors; i++)
		order[i] = i;
	sort_ck = ck;
	qsort(order, ck->n_tensors, sizeof *order, by_file_offset);
	double t0 = clock_mono_s();
	for (size_t k = 0; k < ck->n_tensors && !r; k++) {
		const struct st_tensor *t = &ck->tensors[order[k]];
		if (!tensor_wanted(b, t->name)) /* (another pipeline stage's) */
			continue;
		gpu_ptr d = b->tensor_dev[order[k]]; /* placed already (fused), or next in the region */
		if (!d)
			d = gpu_region_alloc(&b->weights_region, t->nbytes);
		if (!d) {
			r = err_set(e, -ENOMEM, "weights region overflow at %s", t->name);
			break;
		}
		b->tensor_dev[order[k]] = d;
		if (b->synthetic && cuda_synth_generated(t))
			r = cuda_synth_tensor(&b->g, d, t, b->seed); /* a hole in a header-only file */
		else
			r = stage_copy(&s, d, t->data, t->nbytes);
		if (r)
			err_set(e, r, "uploading %s failed", t->name);
		b->upload_bytes += t->nbytes;
	}
	free(order);
	if (!r && cu_check(cu.cuStreamSynchronize(b->g.stream), "cuStreamSynchronize", __FILE__, __LINE__))
		r = err_set(e, -EIO, "weight upload failed");
	b->upload_s = clock_mono_s() - t0;
	cu.cuEventDestroy(s.done[0]);
	cu.cuEventDestroy(s.done[1]);
out:
	gpu_host_free(s.buf[0]);
	gpu_host_free(s.buf[1]);
	return r;
}

/* ---- the forward's view of the weights ------------------------------------------------------- */

static gpu_ptr dev_of(const struct cuda_backend *b, const void *p)
{
	int64_t t = tensor_of(b, p);
	return t < 0 ? 0 : b->tensor_dev[t];
}

static struct fwd_fp8 dev8(const struct cuda_backend *b, const struct fp8_linear *l)
{
	return (struct fwd_fp8){dev_of(b, l->w), dev_of(b, l->scale), (int)l->out, (int)l->in};
}

/* A copy of a host fp32 vector [n] in the weights region. */
static gpu_ptr dev_vec(struct cuda_backend *b, const float *v, int64_t n)
{
	gpu_ptr d = v ? gpu_region_alloc(&b->weights_region, (size_t)n * sizeof *v) : 0;
	if (d && gpu_upload(&b->g, d, v, (size_t)n * sizeof *v))
		return 0;
	return d;
}

/* The RoPE table: rope_cos_sin's values for every position (k_rope reads them). */
static int build_rope(struct cuda_backend *b, struct err *e)
{
	const struct dsv32_config *c = b->base.c;
	int64_t half = c->qk_rope_head_dim / 2, n = c->max_position_embeddings;
	if (half != 32 || c->index_head_dim != 128 || c->index_n_heads > 64)
		return err_set(e, -EINVAL, "cuda backend: qk_rope_head_dim 64, index_head_dim 128 and "
					   "index_n_heads <= 64 are what the kernels take");
	float *inv = malloc((size_t)half * sizeof *inv), *cs = malloc((size_t)n * 64 * sizeof *cs);
	float co[32], si[32];
	if (!inv || !cs) {
		free(inv), free(cs);
		return err_set(e, -ENOMEM, "out of memory");
	}
	rope_inv_freq(c, inv, NULL, NULL);
	for (int64_t p = 0; p < n; p++) {
		rope_cos_sin(inv, half, p, co, si);
		for (int i = 0; i < 32; i++)
			cs[(p * 32 + i) * 2] = co[i], cs[(p * 32 + i) * 2 + 1] = si[i];
	}
	b->m.rope_cs = gpu_region_alloc(&b->weights_region, (size_t)n * 64 * sizeof *cs);
	b->m.rope_max_pos = n;
	int r = b->m.rope_cs ? gpu_upload(&b->g, b->m.rope_cs, cs, (size_t)n * 64 * sizeof *cs) : -ENOMEM;
	free(inv);
	free(cs);
	return r ? err_set(e, r, "cuda backend: RoPE table upload failed") : 0;
}

static int build_layer(struct cuda_backend *b, int64_t l, struct err *e)
{
	const struct dsv32_config *c = b->base.c;
	const struct layer_weights *lw = layer_w(b, l);
	struct fwd_layer *L = &b->m.layers[l];
	L->attn_norm = dev_vec(b, lw->attn_norm, c->hidden_size);
	L->ffn_norm = dev_vec(b, lw->ffn_norm, c->hidden_size);
	L->q_norm = dev_vec(b, lw->q_norm, c->q_lora_rank);
	L->kv_norm = dev_vec(b, lw->kv_norm, c->kv_lora_rank);
	L->q_a = dev8(b, &lw->wq_a);
	L->kv_a = dev8(b, &lw->wkv_a);
	L->q_b = dev8(b, &lw->wq_b);
	L->kv_b = dev8(b, &lw->wkv_b);
	L->o = dev8(b, &lw->wo);
	L->idx_q_b = dev8(b, &lw->idx_wq_b);
	L->idx_k = dev8(b, &lw->idx_wk);
	L->idx_k_norm_w = dev_vec(b, lw->idx_k_norm_w, c->index_head_dim);
	L->idx_k_norm_b = dev_vec(b, lw->idx_k_norm_b, c->index_head_dim);
	L->idx_wproj = dev_of(b, lw->idx_weights_proj.w);
	if (!L->attn_norm || !L->ffn_norm || !L->q_norm || !L->kv_norm || !L->kv_b.w || !L->o.w ||
	    !L->idx_k_norm_w || !L->idx_k_norm_b || !L->idx_wproj)
		return err_set(e, -EINVAL, "cuda backend: layer %lld: a tensor has no device copy",
			       (long long)l);
	if (!lw->is_moe) {
		L->w2 = dev8(b, &lw->w2);
		return 0;
	}
	int64_t E = c->n_routed_experts;
	L->gate = dev_of(b, lw->gate.w);
	L->gate_bias = dev_vec(b, lw->gate_bias, E);
	L->sh2 = dev8(b, &lw->sh_w2);
	for (int64_t x = 0; x < E; x++)
		L->ex2[x] = dev8(b, &lw->exp_w2[x]);
	if (env_int("DSV32_CUDA_MOE_DENSE", 0) == 1) /* diagnosis: see cuda_forward.c */
		return 0;
	gpu_ptr *tab = malloc((size_t)E * 4 * sizeof *tab);
	if (!tab)
		return err_set(e, -ENOMEM, "out of memory");
	for (int64_t x = 0; x < E; x++) {
		tab[x] = L->ex13[x].w, tab[E + x] = L->ex13[x].s;
		tab[2 * E + x] = L->ex2[x].w, tab[3 * E + x] = L->ex2[x].s;
	}
	struct cuda_fp8_mat sh13 = {L->sh13.w, L->sh13.s, L->sh13.out, L->sh13.in};
	struct cuda_fp8_mat sh2 = {L->sh2.w, L->sh2.s, L->sh2.out, L->sh2.in};
	int r = cuda_moe_layer_init(&b->g, &b->weights_region, c, L->gate, L->gate_bias, tab, tab + E,
				    tab + 2 * E, tab + 3 * E, sh13, sh2, &L->moe, e);
	free(tab);
	L->moe_ready = r == 0;
	return r;
}

static int build_model(struct cuda_backend *b, struct err *e)
{
	const struct dsv32_config *c = b->base.c;
	const struct weights *w = b->w;
	struct fwd_model *m = &b->m;
	int r = build_rope(b, e);
	for (int64_t l = 0; l < n_fwd_layers(b) && !r; l++)
		r = owns_layer(b, l) ? build_layer(b, l, e) : 0;
	if (r)
		return r;
	const int first = b->l0 == 0, last = b->l1 == c->num_hidden_layers;
	m->l0 = b->l0, m->l1 = b->l1;
	m->embed = first ? dev_of(b, w->embed.w) : 0;
	m->norm = last ? dev_vec(b, w->norm, c->hidden_size) : 0;
	m->lm_head = last ? dev_of(b, w->lm_head.w) : 0;
	m->has_mtp = w->has_mtp && last;
	if (m->has_mtp) {
		m->mtp_embed = dev_of(b, w->mtp.embed.w);
		m->enorm = dev_vec(b, w->mtp.enorm, c->hidden_size);
		m->hnorm = dev_vec(b, w->mtp.hnorm, c->hidden_size);
		m->eh_proj = dev_of(b, w->mtp.eh_proj.w);
		m->head_norm = dev_vec(b, w->mtp.head_norm, c->hidden_size);
		m->mtp_head = dev_of(b, w->mtp.head.w);
	}
	if ((first && !m->embed) || (last && (!m->norm || !m->lm_head)) ||
	    (m->has_mtp && (!m->mtp_embed || !m->enorm || !m->hnorm || !m->eh_proj ||
			    !m->head_norm || !m->mtp_head)))
		return err_set(e, -EINVAL, "cuda backend: a model-level tensor has no device copy");
	return 0;
}

/* ---- backend_ops --------------------------------------------------------------------------- */

/* The mode of a new backend: the option, unless DSV32_CUDA_BATCH_INVARIANT is 1 or 0. */
static int invariant_mode(const struct backend_cuda_opts *o)
{
	const int v = env_int("DSV32_CUDA_BATCH_INVARIANT", -1);
	return v == 0 || v == 1 ? v : !!o->batch_invariant;
}

/* Decode steps replay CUDA graphs unless the switch DSV32_CUDA_GRAPHS is 0 (a test compares both
 * ways on one backend through backend_cuda_set_switch; run 2: graphs bit-identical to eager). */
static struct fwd_env env_of(struct cuda_backend *b)
{
	int on = b->sw.graphs;
	if (on && !b->graphs)
		b->graphs = cuda_forward_graphs_new();
	return (struct fwd_env){.g = &b->g, .arena = &b->scratch, .c = b->base.c, .m = &b->m,
				.base = &b->base, .kv_base = b->kv_region.base, .kv_layer0 = b->l0,
				.pinned = &b->pinned,
				.pinned_bytes = &b->pinned_bytes, .plog = &b->plog,
				.plog_bytes = &b->plog_bytes, .host_blocks = b->hb, .kept = &b->kept,
				.n_host_blocks = b->n_hb, .sw = &b->sw, .graphs = on ? b->graphs : NULL,
				.side = b->side, .ev_fork = b->ev_fork, .ev_join = b->ev_join,
				.batch_invariant = b->batch_invariant, .smp = &b->smp};
}

static int cuda_step(struct backend *base, const struct backend_step *st)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	int r = backend_validate_step(base, b->w, st);
	if (r)
		return r;
	struct fwd_env env = env_of(b);
	return cuda_forward_step(&env, st);
}

static int cuda_step_draw(struct backend *base, const struct backend_step *st,
			  struct backend_sample *const *draw)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	int r = backend_validate_step_draw(base, b->w, st, draw);
	if (r)
		return r;
	struct fwd_env env = env_of(b);
	env.draw = draw;
	return cuda_forward_step(&env, st);
}

static int cuda_page_io(struct backend *base, int64_t layer, enum backend_pool pool, int64_t page,
			void *buf, int write)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	if (layer < 0 || layer >= base->n_layers || page < 0 || page >= base->n_pages)
		return -EINVAL;
	size_t mla = base->mla_page_bytes, idx = base->idx_page_bytes;
	size_t off = pool == BACKEND_POOL_MLA
			     ? ((size_t)layer * base->n_pages + page) * mla
			     : (size_t)base->n_layers * base->n_pages * mla +
				       ((size_t)layer * base->n_pages + page) * idx;
	size_t n = pool == BACKEND_POOL_MLA ? mla : idx;
	return write ? gpu_upload(&b->g, b->kv_region.base + off, buf, n)
		     : gpu_download(&b->g, buf, b->kv_region.base + off, n);
}

/* backend_host_alloc: pinned memory, recorded so the forward downloads logits straight into it. */
static void *cuda_host_alloc(struct backend *base, size_t bytes)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	if (b->n_hb == b->cap_hb) {
		int cap = b->cap_hb ? 2 * b->cap_hb : 8;
		struct fwd_host_block *hb = realloc(b->hb, (size_t)cap * sizeof *hb);
		if (!hb)
			return NULL;
		b->hb = hb, b->cap_hb = cap;
	}
	cu.cuCtxSetCurrent(b->g.ctx); /* (the caller's thread may not have made it current) */
	void *p = gpu_host_alloc(bytes ? bytes : 1);
	if (p)
		b->hb[b->n_hb++] = (struct fwd_host_block){p, bytes};
	return p;
}

static void cuda_host_free(struct backend *base, void *p)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	for (int k = 0; k < b->n_hb; k++)
		if (b->hb[k].p == p) {
			b->hb[k] = b->hb[--b->n_hb];
			cu.cuCtxSetCurrent(b->g.ctx);
			gpu_host_free(p);
			return;
		}
}

static void cuda_destroy(struct backend *base)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	if (b->g.ctx) /* (a pipeline's stages: each its own GPU) */
		cu.cuCtxSetCurrent(b->g.ctx);
	cuda_forward_profile_print();
	while (b->n_hb) /* (blocks the callers did not free: theirs is a bug, leaked no further) */
		cuda_host_free(base, (void *)b->hb[b->n_hb - 1].p);
	free(b->hb);
	cuda_forward_graphs_free(b->graphs);
	if (b->ev_fork)
		cu.cuEventDestroy(b->ev_fork);
	if (b->ev_join)
		cu.cuEventDestroy(b->ev_join);
	if (b->side)
		cu.cuStreamDestroy(b->side);
	cuda_step_sampler_free(&b->g, &b->smp);
	gpu_arena_free(&b->g, &b->scratch);
	gpu_region_free(&b->g, &b->rows_in[0]);
	gpu_region_free(&b->g, &b->rows_in[1]);
	gpu_region_free(&b->g, &b->kv_region);
	gpu_region_free(&b->g, &b->weights_region);
	gpu_host_free(b->pinned);
	gpu_host_free(b->plog);
	if (b->m.layers)
		for (int64_t l = 0; l <= b->base.c->num_hidden_layers; l++)
			free(b->m.layers[l].ex13), free(b->m.layers[l].ex2);
	free(b->m.layers);
	free(b->tensor_dev);
	free(b->by_data);
	cuda_gemm_close(&b->g);
	gpu_close(&b->g);
	free(b);
}

static const struct backend_ops cuda_ops = {"cuda", cuda_step, cuda_page_io, cuda_destroy};

int backend_cuda_create(const struct dsv32_config *c, const struct weights *w,
			const struct checkpoint *ck, int64_t n_pages, struct backend **out,
			struct err *e)
{
	struct backend_cuda_opts o = {.n_pages = n_pages};
	return backend_cuda_create_opts(c, w, ck, &o, out, e);
}

int backend_cuda_create_opts(const struct dsv32_config *c, const struct weights *w,
			     const struct checkpoint *ck, const struct backend_cuda_opts *o,
			     struct backend **out, struct err *e)
{
	/* DSV32_CUDA_STAGES=N and DSV32_CUDA_STAGE_GPUS=a,b,.. override the options (tests: a
	 * daemon's pipeline on one GPU) */
	struct backend_cuda_opts v = *o;
	v.stages = env_int("DSV32_CUDA_STAGES", v.stages);
	const char *gpus = getenv("DSV32_CUDA_STAGE_GPUS");
	for (int i = 0; gpus && *gpus && i < CUDA_MAX_STAGES; i++) {
		char *end;
		long g = strtol(gpus, &end, 10);
		if (end == gpus || g < 0 || g > 1023 || (*end && *end != ','))
			return err_set(e, -EINVAL, "DSV32_CUDA_STAGE_GPUS: \"%s\" is not a list of GPU "
						   "ordinals", getenv("DSV32_CUDA_STAGE_GPUS"));
		v.stage_gpu[i] = (int)g;
		gpus = *end ? end + 1 : end;
	}
	if (v.stages > 1)
		return cuda_pipeline_create(c, w, ck, &v, out, e);
	const struct cuda_stage_place whole = {v.stage_gpu[0], 0, c->num_hidden_layers, -1, 1, 0};
	return cuda_stage_create(c, w, ck, &v, &whole, out, e);
}

int cuda_stage_create(const struct dsv32_config *c, const struct weights *w,
		      const struct checkpoint *ck, const struct backend_cuda_opts *o,
		      const struct cuda_stage_place *p, struct backend **out, struct err *e)
{
	const int ordinal = p->ordinal;
	const int64_t l0 = p->l0, l1 = p->l1, n_pages = o->n_pages;
	if (l0 < 0 || l1 <= l0 || l1 > c->num_hidden_layers)
		return err_set(e, -EINVAL, "cuda backend: layers [%lld, %lld) are not a range of the "
					   "model's %lld", (long long)l0, (long long)l1,
			       (long long)c->num_hidden_layers);
	struct cuda_backend *b = calloc(1, sizeof *b);
	if (!b)
		return err_set(e, -ENOMEM, "out of memory");
	int r = gpu_open(&b->g, ordinal, e);
	if (r) {
		free(b);
		return r;
	}
	cuda_gemm_retain(&b->g);
	b->l0 = l0, b->l1 = l1;
	b->synthetic = o->synthetic;
	b->seed = o->seed;
	b->batch_invariant = invariant_mode(o);
	cuda_forward_switches_init(&b->sw);
	b->base.ops = &cuda_ops;
	b->base.host_alloc = cuda_host_alloc;
	b->base.host_free = cuda_host_free;
	b->base.c = c;
	b->base.n_layers = (l1 - l0) + (l1 == c->num_hidden_layers ? c->num_nextn_predict_layers : 0);
	b->base.mla_page_bytes = kv_mla_page_bytes(c);
	b->base.idx_page_bytes = kv_index_page_bytes(c);
	b->w = w;
	b->ck = ck;
	if ((r = upload_weights(b, e)) || (r = build_model(b, e)))
		goto err;
	if ((r = gpu_arena_init(&b->g, &b->scratch, SCRATCH_BYTES, e)))
		goto err;
	if (cuda_forward_prepare(&b->g)) {
		r = err_set(e, -EIO, "cuda backend: cannot set the forward kernels' attributes");
		goto err;
	}
	if (cu_check(cu.cuStreamCreate(&b->side, CU_STREAM_NON_BLOCKING), "cuStreamCreate", __FILE__,
		     __LINE__) ||
	    cu_check(cu.cuEventCreate(&b->ev_fork, CU_EVENT_DISABLE_TIMING), "cuEventCreate", __FILE__,
		     __LINE__) ||
	    cu_check(cu.cuEventCreate(&b->ev_join, CU_EVENT_DISABLE_TIMING), "cuEventCreate", __FILE__,
		     __LINE__)) {
		r = err_set(e, -EIO, "cuda backend: cannot create the side stream or its events");
		goto err;
	}
	/* the draws' buffers (before the KV pool takes what is left) */
	if (env_int("DSV32_CUDA_DRAW", 1) != 0 && l1 == c->num_hidden_layers) { /* (last stage) */
		if ((r = cuda_step_sampler_init(&b->g, &b->smp, STEP_DRAWS, (int)c->vocab_size,
						STEP_DRAW_HIST, e)))
			goto err;
		b->base.step_draw = cuda_step_draw;
		b->base.sample_rows = STEP_DRAWS;
		b->base.hist_ids = STEP_DRAW_HIST;
	}
	/* a later pipeline stage: the planes the previous stage's rows arrive in, mapped before the
	 * KV pool takes what is left */
	if (l0 > 0) {
		gpu_ptr x, rr;
		if ((r = cuda_stage_rows_in(&b->base, cuda_stage_step_rows(o), p->prev_gpu, &x, &rr, e)))
			goto err;
	}
	/* the KV pool: what is left, keeping 1 GiB for the driver and library workspaces */
	size_t free_b = 0, total_b = 0;
	cu.cuMemGetInfo(&free_b, &total_b);
	size_t page_bytes = (size_t)b->base.n_layers * (b->base.mla_page_bytes + b->base.idx_page_bytes);
	size_t keep = (size_t)1 << 30;
	/* (pipeline stages still to come on this GPU: their weights and scratch first, then a share
	 * of the rest each) */
	keep += p->later_bytes;
	int64_t fit = free_b > keep ? (int64_t)((free_b - keep) / page_bytes) : 0;
	fit /= p->share > 1 ? p->share : 1;
	b->base.n_pages = n_pages > 0 && n_pages < fit ? n_pages : fit;
	if (b->base.n_pages < 1) {
		r = err_set(e, -ENOMEM, "no GPU memory left for the KV cache (%zu MiB free after weights)",
			    free_b >> 20);
		goto err;
	}
	size_t kv_bytes = (size_t)b->base.n_pages * page_bytes;
	if ((r = gpu_region_reserve(&b->g, &b->kv_region, "kv pages", kv_bytes, e)) ||
	    (r = gpu_region_grow(&b->g, &b->kv_region, kv_bytes, e)))
		goto err;
	/* the GEMM dispatch measured on these weights (model/cuda_gemm_tune.h; logs, never fatal:
	 * what it could not measure keeps the defaults) */
	(void)cuda_gemm_tune_model(&b->g, &b->m, (int)n_fwd_layers(b), &b->scratch);
	char range[64] = "";
	if (l0 > 0 || l1 < c->num_hidden_layers)
		snprintf(range, sizeof range, " layers %lld-%lld", (long long)l0, (long long)l1 - 1);
	fprintf(stderr,
		"<6>dsv32: cuda backend%s on GPU %d, %s (sm_%d%d, %d SMs, %.1f GiB): weights %.2f GiB "
		"uploaded in %.2f s (%.1f GB/s), KV pool %lld pages of 64 tokens (%.2f GiB), scratch "
		"%zu MiB, sampler %zu MiB (%lld draws a step); mode %s%s\n",
		range, ordinal, b->g.name, b->g.cc_major, b->g.cc_minor, b->g.sm_count,
		b->g.total_mem / 1073741824.0,
		b->upload_bytes / 1073741824.0, b->upload_s,
		b->upload_s > 0 ? b->upload_bytes / b->upload_s / 1e9 : 0.0,
		(long long)b->base.n_pages, kv_bytes / 1073741824.0, SCRATCH_BYTES >> 20,
		b->smp.region.mapped >> 20, (long long)b->base.sample_rows, backend_cuda_mode(&b->base),
		b->batch_invariant ? " (GEMMs and MoE in <= 64-row pieces, bf16 products in the CPU's "
				    "order: a row's numbers do not depend on its batch)"
				  : " (large-M GEMM and MoE paths; not batch-invariant: --batch-invariant "
				    "or DSV32_CUDA_BATCH_INVARIANT=1 for that)");
	*out = &b->base;
	return 0;
err:
	cuda_destroy(&b->base);
	return r;
}

/* The CUDA backends behind base: itself, or a pipeline's stages in order (model/cuda_stage.h);
 * how many (0: base is not a CUDA backend). */
static int cuda_parts(const struct backend *base, struct cuda_backend **parts)
{
	if (base && base->ops == &cuda_ops) {
		parts[0] = (struct cuda_backend *)base;
		return 1;
	}
	struct backend *st[CUDA_MAX_STAGES];
	int n = base ? cuda_pipeline_stages(base, st) : 0;
	for (int i = 0; i < n; i++)
		parts[i] = (struct cuda_backend *)st[i];
	return n;
}

int backend_cuda_kv_fill_synthetic(struct backend *base, const int32_t *bt, int64_t n_tokens,
				   uint64_t seed, struct err *e)
{
	struct cuda_backend *parts[CUDA_MAX_STAGES] = {0};
	int n = cuda_parts(base, parts), r = n ? 0 : -ENOTSUP;
	if (!n)
		return err_set(e, -ENOTSUP, "synthetic KV fill: not a CUDA backend");
	for (int i = 0; i < n && !r; i++) { /* each stage its own layers' pools (a pipeline's stages
					      * fill theirs alike from the same seed: timing data) */
		struct cuda_backend *b = parts[i];
		const struct backend *sb = &b->base;
		size_t mla_layer = (size_t)sb->n_pages * sb->mla_page_bytes;
		size_t idx_layer = (size_t)sb->n_pages * sb->idx_page_bytes;
		gpu_ptr mla = b->kv_region.base, idx = mla + (size_t)sb->n_layers * mla_layer;
		cu.cuCtxSetCurrent(b->g.ctx);
		r = cuda_synth_kv_fill(&b->g, sb->c, mla, mla_layer, idx, idx_layer, (int)sb->n_layers,
				       bt, n_tokens, seed, &b->scratch);
		if (!r)
			r = gpu_sync(&b->g);
	}
	return r ? err_set(e, r, "synthetic KV fill of %lld tokens failed (%d)", (long long)n_tokens, r)
		 : 0;
}

int64_t backend_cuda_draws(const struct backend *base)
{
	struct cuda_backend *parts[CUDA_MAX_STAGES] = {0};
	int n = cuda_parts(base, parts); /* (the last stage draws) */
	return n ? (int64_t)parts[n - 1]->smp.draws : -ENOTSUP;
}

int backend_cuda_graph_stats(const struct backend *base, int64_t *captures, int64_t *replays)
{
	struct cuda_backend *parts[CUDA_MAX_STAGES] = {0};
	int n = cuda_parts(base, parts);
	*captures = *replays = 0;
	for (int i = 0; i < n; i++) { /* (a pipeline: every stage's) */
		int64_t c, r;
		cuda_forward_graphs_stats(parts[i]->graphs, &c, &r);
		*captures += c, *replays += r;
	}
	return n ? 0 : -ENOTSUP;
}

const char *backend_cuda_mode(const struct backend *base)
{
	struct cuda_backend *parts[CUDA_MAX_STAGES] = {0};
	int n = cuda_parts(base, parts);
	return !n ? "not cuda" : parts[0]->batch_invariant ? "batch-invariant" : "fast";
}

int backend_cuda_set_batch_invariant(struct backend *base, int on)
{
	struct cuda_backend *parts[CUDA_MAX_STAGES] = {0};
	int n = cuda_parts(base, parts);
	if (!n)
		return -ENOTSUP;
	int was = parts[0]->batch_invariant;
	for (int i = 0; i < n; i++)
		parts[i]->batch_invariant = !!on;
	return was;
}

int backend_cuda_set_switch(struct backend *base, const char *name, const char *value)
{
	struct cuda_backend *parts[CUDA_MAX_STAGES] = {0};
	int n = cuda_parts(base, parts), r = n ? 0 : -ENOTSUP;
	for (int i = 0; i < n && !r; i++)
		r = cuda_forward_switch_set(&parts[i]->sw, name, value);
	return r;
}

/* ---- a pipeline stage's side (model/cuda_stage.h) ---------------------------------------------- */

int64_t cuda_stage_step_rows(const struct backend_cuda_opts *o)
{
	int64_t n = o->step_rows > 0 ? o->step_rows : 8192;
	return n < CUDA_STAGE_MAX_ROWS ? n : CUDA_STAGE_MAX_ROWS;
}

size_t cuda_stage_fixed_bytes(const struct dsv32_config *c, const struct checkpoint *ck,
			      int64_t l0, int64_t l1, int64_t step_rows)
{
	size_t n = SCRATCH_BYTES + ((size_t)1 << 30); /* (the sampler, tables, slack) */
	if (l0 > 0) /* the rows-in planes */
		n += 2 * (size_t)step_rows * (size_t)c->hidden_size * 2;
	return n + wanted_bytes(c, ck, l0, l1);
}

void cuda_stage_current(struct backend *base)
{
	cu.cuCtxSetCurrent(((struct cuda_backend *)base)->g.ctx);
}

int cuda_stage_rows_in(struct backend *base, int64_t rows, int writer, gpu_ptr *x, gpu_ptr *r,
		       struct err *e)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	const size_t plane = (size_t)rows * (size_t)base->c->hidden_size * 2;
	int rc = 0;
	cu.cuCtxSetCurrent(b->g.ctx);
	for (int k = 0; k < 2 && !rc; k++) {
		struct gpu_region *g = &b->rows_in[k];
		if (!g->base)
			rc = gpu_region_reserve(&b->g, g, k ? "stage rows in (residual)" : "stage rows in",
						(size_t)CUDA_STAGE_MAX_ROWS * base->c->hidden_size * 2, e);
		if (!rc)
			rc = gpu_region_grow_shared(&b->g, g, plane, writer, e);
	}
	if (rc)
		return rc;
	*x = b->rows_in[0].base, *r = b->rows_in[1].base;
	b->m.in_x = *x, b->m.in_r = *r;
	return 0;
}

void cuda_stage_rows_out(struct backend *base, gpu_ptr x, gpu_ptr r)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	b->m.out_x = x, b->m.out_r = r;
}

int cuda_stage_ordinal(const struct backend *base)
{
	return ((const struct cuda_backend *)base)->g.ordinal;
}

int backend_cuda_layer_step(struct backend *base, int64_t layer, const struct backend_step *st,
			    float *x, float *r)
{
	if (base->ops != &cuda_ops) /* (a pipeline: its layers are its stages') */
		return -ENOTSUP;
	struct cuda_backend *b = (struct cuda_backend *)base;
	if (st->mtp || !x || !r)
		return -EINVAL;
	int rc = backend_validate_step(base, b->w, st);
	if (rc)
		return rc;
	struct fwd_env env = env_of(b);
	return cuda_forward_layer(&env, layer, st, x, r);
}

#endif
