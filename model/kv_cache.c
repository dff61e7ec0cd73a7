/*
 * kv_cache.c — KV record layouts, the latent FP8 quantisation and host pools (see kv_cache.h).
 * Multi-byte fields are little-endian (memcpy on a little-endian host, as the GPU reads them).
 */
#include "model/kv_cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/cpu_ops.h"
#include "model/err.h"
#include "model/numerics.h"

size_t kv_mla_scale_offset(const struct dsv32_config *c) { return (size_t)c->kv_lora_rank; }

size_t kv_mla_kpe_offset(const struct dsv32_config *c)
{
	return (size_t)c->kv_lora_rank + (size_t)(c->kv_lora_rank / 128) * 4;
}

size_t kv_mla_page_bytes(const struct dsv32_config *c)
{
	return (size_t)KV_PAGE_TOKENS * c->mla_record_bytes;
}

size_t kv_index_page_bytes(const struct dsv32_config *c)
{
	return (size_t)KV_PAGE_TOKENS * ((size_t)c->index_head_dim + 4);
}

void kv_mla_write(const struct dsv32_config *c, uint8_t *page, int64_t slot, const float *c_kv,
		  const float *k_pe)
{
	ASSERT(slot >= 0 && slot < KV_PAGE_TOKENS && c->kv_lora_rank % 128 == 0);
	uint8_t *rec = page + (size_t)slot * c->mla_record_bytes;
	uint8_t *scales = rec + kv_mla_scale_offset(c);
	for (int64_t g = 0; g < c->kv_lora_rank / 128; g++) {
		float s = act_quant_group(c_kv + g * 128, 128, rec + g * 128);
		memcpy(scales + g * 4, &s, 4);
	}
	uint8_t *pe = rec + kv_mla_kpe_offset(c);
	for (int64_t i = 0; i < c->qk_rope_head_dim; i++) {
		uint16_t h = f32_to_bf16(k_pe[i]);
		memcpy(pe + 2 * i, &h, 2);
	}
}

void kv_mla_read(const struct dsv32_config *c, const uint8_t *page, int64_t slot, float *kv)
{
	ASSERT(slot >= 0 && slot < KV_PAGE_TOKENS);
	const uint8_t *rec = page + (size_t)slot * c->mla_record_bytes;
	const uint8_t *scales = rec + kv_mla_scale_offset(c);
	const float *lut = cpu_e4m3_table();
	for (int64_t g = 0; g < c->kv_lora_rank / 128; g++) {
		float s;
		memcpy(&s, scales + g * 4, 4);
		for (int64_t j = 0; j < 128; j++)
			kv[g * 128 + j] = lut[rec[g * 128 + j]] * s;
	}
	const uint8_t *pe = rec + kv_mla_kpe_offset(c);
	for (int64_t i = 0; i < c->qk_rope_head_dim; i++) {
		uint16_t h;
		memcpy(&h, pe + 2 * i, 2);
		kv[c->kv_lora_rank + i] = bf16_to_f32(h);
	}
}

void kv_index_write(const struct dsv32_config *c, uint8_t *page, int64_t slot, const uint8_t *k8,
		    float scale)
{
	ASSERT(slot >= 0 && slot < KV_PAGE_TOKENS);
	memcpy(page + (size_t)slot * (size_t)c->index_head_dim, k8, (size_t)c->index_head_dim);
	memcpy(page + (size_t)KV_PAGE_TOKENS * (size_t)c->index_head_dim + (size_t)slot * 4, &scale,
	       4);
}

const uint8_t *kv_index_codes(const struct dsv32_config *c, const uint8_t *page, int64_t slot)
{
	return page + (size_t)slot * (size_t)c->index_head_dim;
}

float kv_index_scale(const struct dsv32_config *c, const uint8_t *page, int64_t slot)
{
	float s;
	memcpy(&s, page + (size_t)KV_PAGE_TOKENS * (size_t)c->index_head_dim + (size_t)slot * 4, 4);
	return s;
}

int kv_pools_init(struct kv_pools *kp, const struct dsv32_config *c, int64_t n_layers,
		  int64_t n_pages)
{
	memset(kp, 0, sizeof *kp);
	if (n_layers < 1 || n_pages < 1)
		return -EINVAL;
	kp->n_layers = n_layers;
	kp->n_pages = n_pages;
	kp->mla_page = kv_mla_page_bytes(c);
	kp->idx_page = kv_index_page_bytes(c);
	kp->mla = calloc((size_t)n_layers, sizeof *kp->mla);
	kp->idx = calloc((size_t)n_layers, sizeof *kp->idx);
	if (!kp->mla || !kp->idx)
		goto err;
	for (int64_t l = 0; l < n_layers; l++) {
		kp->mla[l] = calloc((size_t)n_pages, kp->mla_page);
		kp->idx[l] = calloc((size_t)n_pages, kp->idx_page);
		if (!kp->mla[l] || !kp->idx[l])
			goto err;
	}
	return 0;
err:
	kv_pools_free(kp);
	return -ENOMEM;
}

void kv_pools_free(struct kv_pools *kp)
{
	for (int64_t l = 0; l < kp->n_layers; l++) {
		if (kp->mla)
			free(kp->mla[l]);
		if (kp->idx)
			free(kp->idx[l]);
	}
	free(kp->mla);
	free(kp->idx);
	memset(kp, 0, sizeof *kp);
}

uint8_t *kv_pools_mla(const struct kv_pools *kp, int64_t layer, int64_t page)
{
	ASSERT(layer >= 0 && layer < kp->n_layers && page >= 0 && page < kp->n_pages);
	return kp->mla[layer] + (size_t)page * kp->mla_page;
}

uint8_t *kv_pools_idx(const struct kv_pools *kp, int64_t layer, int64_t page)
{
	ASSERT(layer >= 0 && layer < kp->n_layers && page >= 0 && page < kp->n_pages);
	return kp->idx[layer] + (size_t)page * kp->idx_page;
}
