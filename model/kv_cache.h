/*
 * kv_cache.h — the byte layouts of the paged KV caches (spec §6) and the CPU backend's pools.
 *
 * A page holds KV_PAGE_TOKENS = 64 consecutive positions of one sequence; one page id indexes
 * the page of every layer's pools (main layers 0..L-1 and the MTP layer L).
 *
 * MLA record (one token, mla_record_bytes = 656 for the real dims), spec §6.1:
 *   [0, R)              R = kv_lora_rank e4m3 codes of c_kv, in R/128 tiles of 128
 *   [R, R + R/128*4)    R/128 fp32 scales, tile order (value = e4m3 * scale)
 *   [.., + 2*rope)      qk_rope_head_dim bf16 k_pe, post-RoPE, interleaved layout
 * Records are token-major inside an MLA page: page + slot * mla_record_bytes.
 *
 * Indexer page (spec §6.2): 64 x index_head_dim e4m3 codes (token-major), then 64 fp32 scales.
 * Not 132 B interleaved records.
 *
 * Owns: these layouts, the latent FP8 quantisation the MLA cache holds (act_quant 1x128 UE8M0,
 * the [REF] simulation of the deployed cache, §3.3.6), and plain host pools. Must not: decide
 * which pages a sequence gets (the scheduler passes block tables).
 */
#ifndef DSV32_KV_CACHE_H
#define DSV32_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

#define KV_PAGE_TOKENS 64

/* Byte offsets inside one MLA record. */
size_t kv_mla_scale_offset(const struct dsv32_config *c); /* kv_lora_rank */
size_t kv_mla_kpe_offset(const struct dsv32_config *c);   /* kv_lora_rank + kv_lora_rank/128*4 */
size_t kv_mla_page_bytes(const struct dsv32_config *c);   /* 64 * mla_record_bytes */
size_t kv_index_page_bytes(const struct dsv32_config *c); /* 64 * (index_head_dim + 4) */

/* Quantises c_kv (bf16 values) per 128-tile and writes the record of `slot` (0..63).
 * c_kv: [kv_lora_rank], k_pe: [qk_rope_head_dim] (bf16 values, post-RoPE) */
void kv_mla_write(const struct dsv32_config *c, uint8_t *page, int64_t slot, const float *c_kv,
		  const float *k_pe);
/* Reads a record back: kv = [c_kv dequantised (kv_lora_rank) | k_pe (qk_rope_head_dim)],
 * every value exact in bf16. kv: [kv_lora_rank + qk_rope_head_dim] */
void kv_mla_read(const struct dsv32_config *c, const uint8_t *page, int64_t slot, float *kv);

/* Indexer key: k8 [index_head_dim] e4m3 codes and its fp32 scale. */
void kv_index_write(const struct dsv32_config *c, uint8_t *page, int64_t slot, const uint8_t *k8,
		    float scale);
const uint8_t *kv_index_codes(const struct dsv32_config *c, const uint8_t *page, int64_t slot);
float kv_index_scale(const struct dsv32_config *c, const uint8_t *page, int64_t slot);

/* Host pools: for each of n_layers layers, n_pages MLA pages and n_pages indexer pages. */
struct kv_pools {
	int64_t n_layers, n_pages;
	size_t mla_page, idx_page; /* bytes per page */
	uint8_t **mla;             /* [n_layers] -> [n_pages * mla_page] */
	uint8_t **idx;             /* [n_layers] -> [n_pages * idx_page] */
};

int kv_pools_init(struct kv_pools *kp, const struct dsv32_config *c, int64_t n_layers,
		  int64_t n_pages);
void kv_pools_free(struct kv_pools *kp);
uint8_t *kv_pools_mla(const struct kv_pools *kp, int64_t layer, int64_t page);
uint8_t *kv_pools_idx(const struct kv_pools *kp, int64_t layer, int64_t page);

#endif
