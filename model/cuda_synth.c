/*
 * cuda_synth.c — synthetic weights and KV caches on the GPU (model/cuda_synth.h): the launches
 * of kernels_ptx/synth.cu and synth_kv.cu, the KV values' host reference, and (CUDA-less
 * builds only) backend.h's two synthetic entry points, which cuda_backend.c defines otherwise.
 */
#include "model/cuda_synth.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "model/backend.h"
#include "model/kv_cache.h"
#include "model/numerics.h"

int cuda_synth_generated(const struct st_tensor *t)
{
	return t->dtype == ST_F8_E4M3 || (t->dtype == ST_BF16 && t->ndim == 2);
}

/* splitmix64's finaliser, as synth_kv_mix in kernels_ptx/synth_kv.cu */
static uint64_t kv_mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t cuda_synth_kv_stream(uint64_t seed, int64_t layer, int kind)
{
	return kv_mix(seed ^ ((uint64_t)(layer * 3 + kind + 1) * 0xd1b54a32d192ed69ull));
}

float cuda_synth_kv_scale(int kind)
{
	(void)kind; /* every kind has the same RMS (cuda_synth.h) */
	return (float)(CUDA_SYNTH_KV_RMS * sqrt(3.0) / 65536.0);
}

uint16_t cuda_synth_kv_value(uint64_t stream, uint64_t i, float scale)
{
	uint64_t r = kv_mix(stream + (i + 1) * 0x9e3779b97f4a7c15ull);
	int k = (int)(r & 0xffff) + (int)((r >> 16) & 0xffff) + (int)((r >> 32) & 0xffff) +
		(int)(r >> 48) - 131072;
	return f32_to_bf16((float)k * scale);
}

#ifndef DSV32_NO_CUDA

static uint64_t name_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
	for (const unsigned char *c = (const unsigned char *)s; *c; c++)
		h = (h ^ *c) * 0x100000001b3ull;
	return h;
}

static int ilog2_u64(uint64_t x)
{
	int n = -1;
	while (x)
		x >>= 1, n++;
	return n;
}

int cuda_synth_tensor(struct gpu *g, gpu_ptr dst, const struct st_tensor *t, uint64_t seed)
{
	if (!cuda_synth_generated(t))
		return -EINVAL;
	unsigned long long s = seed ^ (name_hash(t->name) * 0x9e3779b97f4a7c15ull);
	unsigned blocks = (unsigned)(g->sm_count > 0 ? g->sm_count * 8 : 1024);
	if (t->dtype == ST_F8_E4M3) {
		long long n = (long long)t->nbytes;
		void *args[] = {&dst, &n, &s};
		return gpu_launch(g, gpu_kernel(g, "k_synth_e4m3"), blocks, 1, 1, 256, 1, 1, 0, args);
	}
	/* mkmodel's GEN_BF16: rms ~ 1/sqrt(fan-in), fan-in = columns (1 for embeddings) */
	uint64_t fan_in = strstr(t->name, "embed_tokens") ? 1 : (uint64_t)t->shape[1];
	int shift = (ilog2_u64(5461 * fan_in) + 1) / 2;
	long long n = (long long)(t->nbytes / 2);
	void *args[] = {&dst, &n, &s, &shift};
	return gpu_launch(g, gpu_kernel(g, "k_synth_bf16"), blocks, 1, 1, 256, 1, 1, 0, args);
}

#endif

#ifndef DSV32_NO_CUDA

int cuda_synth_kv_fill(struct gpu *g, const struct dsv32_config *c, gpu_ptr mla_pool,
		       size_t mla_layer_bytes, gpu_ptr idx_pool, size_t idx_layer_bytes, int n_layers,
		       const int32_t *bt, int64_t n_tokens, uint64_t seed, struct gpu_arena *scratch)
{
	const int R = (int)c->kv_lora_rank, rope = (int)c->qk_rope_head_dim, dk = (int)c->index_head_dim;
	const int rec = (int)c->mla_record_bytes;
	const long long idx_page = (long long)kv_index_page_bytes(c);
	if (n_tokens < 1 || n_layers < 1 || R % 128 || dk != 128 || rope % 2)
		return -EINVAL;
	int64_t n_pages = (int64_t)(mla_layer_bytes / kv_mla_page_bytes(c));
	if ((int64_t)(idx_layer_bytes / (size_t)idx_page) < n_pages)
		n_pages = (int64_t)(idx_layer_bytes / (size_t)idx_page);
	if (n_pages > INT32_MAX / KV_PAGE_TOKENS)
		return -EINVAL; /* slots are int */
	const int64_t n_blocks = (n_tokens + KV_PAGE_TOKENS - 1) / KV_PAGE_TOKENS;
	for (int64_t b = 0; b < n_blocks; b++)
		if (bt[b] < 0 || bt[b] >= n_pages)
			return -EINVAL;
	const size_t mark = gpu_arena_mark(scratch);
	gpu_ptr d_bt = gpu_arena_push(scratch, (size_t)n_blocks * 4);
	if (!d_bt)
		return -ENOMEM;
	int r = gpu_upload(g, d_bt, bt, (size_t)n_blocks * 4);
	/* staging for one chunk: the largest that fits, at most CUDA_SYNTH_KV_CHUNK tokens */
	const size_t per_token = (size_t)(R + rope + dk) * 2 + 4;
	int64_t chunk = n_tokens < CUDA_SYNTH_KV_CHUNK ? n_tokens : CUDA_SYNTH_KV_CHUNK;
	gpu_ptr d_ckv = 0, d_kpe = 0, d_k = 0, d_slots = 0;
	const size_t inner = gpu_arena_mark(scratch);
	while (!r) {
		d_ckv = gpu_arena_push(scratch, (size_t)chunk * R * 2);
		d_kpe = gpu_arena_push(scratch, (size_t)chunk * rope * 2);
		d_k = gpu_arena_push(scratch, (size_t)chunk * dk * 2);
		d_slots = gpu_arena_push(scratch, (size_t)chunk * 4);
		if (d_ckv && d_kpe && d_k && d_slots)
			break;
		gpu_arena_release(scratch, inner);
		if (chunk <= KV_PAGE_TOKENS || chunk * (int64_t)per_token < 4096)
			r = -ENOMEM;
		chunk /= 2;
	}
	void *gen = gpu_kernel(g, "k_synth_kv_rows"), *mla_w = gpu_kernel(g, "k_kv_mla_write"),
	     *idx_w = gpu_kernel(g, "k_kv_index_write");
	if (!r && (!gen || !mla_w || !idx_w))
		r = -ENOENT;
	float sc_c = cuda_synth_kv_scale(0), sc_p = cuda_synth_kv_scale(1), sc_k = cuda_synth_kv_scale(2);
	for (int64_t p0 = 0; p0 < n_tokens && !r; p0 += chunk) {
		int n = (int)(n_tokens - p0 < chunk ? n_tokens - p0 : chunk);
		long long pos0 = (long long)p0;
		for (int l = 0; l < n_layers && !r; l++) {
			unsigned long long s_c = cuda_synth_kv_stream(seed, l, 0),
					   s_p = cuda_synth_kv_stream(seed, l, 1),
					   s_k = cuda_synth_kv_stream(seed, l, 2);
			gpu_ptr mla = mla_pool + (size_t)l * mla_layer_bytes;
			gpu_ptr idx = idx_pool + (size_t)l * idx_layer_bytes;
			int ld_c = R, ld_p = rope, ld_k = dk, rr = R, rp = rope, rb = rec, nt = n;
			long long pb = idx_page;
			void *ga[] = {&d_ckv, &d_kpe, &d_k, &d_slots, &d_bt, &pos0, &rr, &rp, &ld_k,
				      &s_c, &s_p, &s_k, &sc_c, &sc_p, &sc_k};
			void *ma[] = {&d_ckv, &ld_c, &d_kpe, &ld_p, &d_slots, &mla, &rr, &rp, &rb};
			void *ia[] = {&d_k, &ld_k, &d_slots, &idx, &pb, &nt};
			r = gpu_launch(g, gen, (unsigned)n, 1, 1, 128, 1, 1, 0, ga);
			if (!r)
				r = gpu_launch(g, mla_w, (unsigned)n, 1, 1, 32 * (R / 128 + 1), 1, 1, 0, ma);
			if (!r)
				r = gpu_launch(g, idx_w, (unsigned)((n + 7) / 8), 1, 1, 256, 1, 1, 0, ia);
		}
	}
	gpu_arena_release(scratch, mark);
	return r;
}

#endif
