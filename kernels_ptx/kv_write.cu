// kv_write.cu — writing new tokens into the paged KV caches (spec §6), byte-identical to the CPU
// backend's kv_mla_write / kv_index_write after its act_quant (model/kv_cache.c).
//
// Slots are physical: slot = page * 64 + offset (the FlashMLA convention, spec §6.3).
//
// k_kv_mla_write: the 656-byte MLA record (real dims; R = kv_lora_rank):
//   [0, R) e4m3 codes of c_kv in R/128 tiles, [R, R + R/128*4) the tiles' fp32 UE8M0 scales,
//   then qk_rope_head_dim bf16 k_pe (post-RoPE, interleaved layout).
//   c_kv bf16 [T, ld_ckv] (first R used), k_pe bf16 [T, ld_kpe] (first rope used), slots int [T],
//   pool: the layer's MLA pages (record r of page p at pool + (p*64 + r) * record_bytes).
//   One block per token, R/128 + 1 warps: warp w < R/128 quantises tile w, the last copies k_pe.
//
// k_kv_index_write: the indexer key (index_head_dim = 128): codes at page + off*128, the fp32
//   scale at page + 64*128 + off*4 (values first, then scales; spec §6.2).
//   k bf16 [T, ld_k] (post LayerNorm, RoPE, Hadamard), slots int [T], pool: the layer's indexer
//   pages (page p at pool + p * page_bytes). One warp per token.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
k_kv_mla_write(const uint16_t *__restrict__ c_kv, int ld_ckv, const uint16_t *__restrict__ k_pe,
	       int ld_kpe, const int *__restrict__ slots, uint8_t *__restrict__ pool, int R,
	       int rope, int record_bytes)
{
	const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	uint8_t *rec = pool + (size_t)slots[t] * record_bytes;
	const int tiles = R / 128;
	if (warp < tiles) {
		const float sc = warp_act_quant128(c_kv + (size_t)t * ld_ckv + warp * 128,
						   rec + warp * 128, lane);
		if (lane == 0)
			*reinterpret_cast<float *>(rec + R + warp * 4) = sc;
	} else if (warp == tiles) {
		// k_pe is bf16 already: a byte copy of rope * 2 bytes (the record offset R + tiles*4 is
		// a multiple of 4, so 4-byte stores are aligned)
		const uint32_t *src = reinterpret_cast<const uint32_t *>(k_pe + (size_t)t * ld_kpe);
		uint32_t *dst = reinterpret_cast<uint32_t *>(rec + R + tiles * 4);
		for (int i = lane; i < rope / 2; i += 32)
			dst[i] = src[i];
	}
}

extern "C" __global__ void __launch_bounds__(256)
k_kv_index_write(const uint16_t *__restrict__ k, int ld_k, const int *__restrict__ slots,
		 uint8_t *__restrict__ pool, long long page_bytes, int n_tokens)
{
	const int t = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (t >= n_tokens)
		return;
	const int slot = slots[t], off = slot & 63;
	uint8_t *page = pool + (size_t)(slot >> 6) * page_bytes;
	const float sc = warp_act_quant128(k + (size_t)t * ld_k, page + off * 128, lane);
	if (lane == 0)
		*reinterpret_cast<float *>(page + 64 * 128 + off * 4) = sc;
}
