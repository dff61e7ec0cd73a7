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
 * of the next; the rate is reported.
 *
 * The step: the forward pass is not on the GPU yet (its kernels exist one by one in
 * kernels_ptx/, tested against the CPU backend). A step validates its input and then fails with
 * -ENOTSUP, saying which op is missing; it never falls back to the CPU silently.
 * Must not: decide scheduling or sample.
 */
#include "model/backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver/gpu.h"
#include "model/kv_cache.h"

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

#else

#define STAGE_BYTES ((size_t)64 << 20) /* one pinned staging buffer */
#define SCRATCH_BYTES ((size_t)1 << 30)

struct cuda_backend {
	struct backend base;
	struct gpu g;
	const struct weights *w;
	const struct checkpoint *ck;
	struct gpu_region weights_region; /* every bound tensor, checkpoint order */
	gpu_ptr *tensor_dev;              /* [ck->n_tensors] device address of each tensor, 0 if unused */
	struct gpu_region kv_region;      /* [n_layers][n_pages] MLA pages, then the indexer pages */
	struct gpu_arena scratch;
	size_t upload_bytes;
	double upload_s;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

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

static int upload_weights(struct cuda_backend *b, struct err *e)
{
	const struct checkpoint *ck = b->ck;
	size_t total = 0;
	for (size_t i = 0; i < ck->n_tensors; i++)
		total += round256(ck->tensors[i].nbytes);
	int r = gpu_region_reserve(&b->g, &b->weights_region, "weights", total, e);
	if (!r)
		r = gpu_region_grow(&b->g, &b->weights_region, total, e);
	if (r)
		return r;
	b->tensor_dev = calloc(ck->n_tensors, sizeof *b->tensor_dev);
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
	double t0 = now_s();
	for (size_t k = 0; k < ck->n_tensors && !r; k++) {
		const struct st_tensor *t = &ck->tensors[order[k]];
		gpu_ptr d = gpu_region_alloc(&b->weights_region, t->nbytes);
		if (!d) {
			r = err_set(e, -ENOMEM, "weights region overflow at %s", t->name);
			break;
		}
		b->tensor_dev[order[k]] = d;
		if ((r = stage_copy(&s, d, t->data, t->nbytes)))
			err_set(e, r, "uploading %s failed", t->name);
		b->upload_bytes += t->nbytes;
	}
	free(order);
	if (!r && cu_check(cu.cuStreamSynchronize(b->g.stream), "cuStreamSynchronize", __FILE__, __LINE__))
		r = err_set(e, -EIO, "weight upload failed");
	b->upload_s = now_s() - t0;
	cu.cuEventDestroy(s.done[0]);
	cu.cuEventDestroy(s.done[1]);
out:
	gpu_host_free(s.buf[0]);
	gpu_host_free(s.buf[1]);
	return r;
}

/* ---- backend_ops --------------------------------------------------------------------------- */

static int cuda_step(struct backend *base, const struct backend_step *st)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	int r = backend_validate_step(base, b->w, st);
	if (r)
		return r;
	fprintf(stderr, "<3>dsv32: cuda backend: not yet on GPU: the decoder layer (MLA attention, "
			"indexer, MoE) has no GPU forward yet; its kernels are tested one by one "
			"(make gpu-test). Use --backend cpu.\n");
	return -ENOTSUP;
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

static void cuda_destroy(struct backend *base)
{
	struct cuda_backend *b = (struct cuda_backend *)base;
	gpu_arena_free(&b->g, &b->scratch);
	gpu_region_free(&b->g, &b->kv_region);
	gpu_region_free(&b->g, &b->weights_region);
	free(b->tensor_dev);
	gpu_close(&b->g);
	free(b);
}

static const struct backend_ops cuda_ops = {"cuda", cuda_step, cuda_page_io, cuda_destroy};

int backend_cuda_create(const struct dsv32_config *c, const struct weights *w,
			const struct checkpoint *ck, int64_t n_pages, struct backend **out,
			struct err *e)
{
	struct cuda_backend *b = calloc(1, sizeof *b);
	if (!b)
		return err_set(e, -ENOMEM, "out of memory");
	int r = gpu_open(&b->g, 0, e);
	if (r) {
		free(b);
		return r;
	}
	b->base.ops = &cuda_ops;
	b->base.c = c;
	b->base.n_layers = c->num_hidden_layers + c->num_nextn_predict_layers;
	b->base.mla_page_bytes = kv_mla_page_bytes(c);
	b->base.idx_page_bytes = kv_index_page_bytes(c);
	b->w = w;
	b->ck = ck;
	if ((r = upload_weights(b, e)))
		goto err;
	if ((r = gpu_arena_init(&b->g, &b->scratch, SCRATCH_BYTES, e)))
		goto err;
	/* the KV pool: what is left, keeping 1 GiB for the driver and library workspaces */
	size_t free_b = 0, total_b = 0;
	cu.cuMemGetInfo(&free_b, &total_b);
	size_t page_bytes = (size_t)b->base.n_layers * (b->base.mla_page_bytes + b->base.idx_page_bytes);
	size_t keep = (size_t)1 << 30;
	int64_t fit = free_b > keep ? (int64_t)((free_b - keep) / page_bytes) : 0;
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
	fprintf(stderr,
		"<6>dsv32: cuda backend on %s (sm_%d%d, %d SMs, %.1f GiB): weights %.2f GiB uploaded "
		"in %.2f s (%.1f GB/s), KV pool %lld pages of 64 tokens (%.2f GiB), scratch %zu MiB\n",
		b->g.name, b->g.cc_major, b->g.cc_minor, b->g.sm_count, b->g.total_mem / 1073741824.0,
		b->upload_bytes / 1073741824.0, b->upload_s,
		b->upload_s > 0 ? b->upload_bytes / b->upload_s / 1e9 : 0.0,
		(long long)b->base.n_pages, kv_bytes / 1073741824.0, SCRATCH_BYTES >> 20);
	*out = &b->base;
	return 0;
err:
	cuda_destroy(&b->base);
	return r;
}

#endif
