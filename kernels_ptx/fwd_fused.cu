// fwd_fused.cu — chains of the CUDA forward's per-row ops fused into one launch each (fewer
// kernels per decode step), every intermediate rounded where the unfused chain rounds it, so
// the outputs are the same bits as the separate kernels (k_rope, k_hadamard128, k_act_quant,
// k_layernorm128, k_kv_mla_write, k_kv_index_write, k_fwd_rmsnorm, k_fwd_idx_weights), which are
// themselves checked against the CPU: rope_apply_halfsplit / _interleaved (model/rope.c),
// cpu_hadamard, cpu_act_quant, cpu_layernorm, cpu_rmsnorm (model/cpu_ops.c), kv_mla_write /
// kv_index_write (model/kv_cache.c), indexer_project (model/cpu_indexer.c). Device code only.
//
// k_fwd_idx_q   per (token, indexer head): half-split RoPE of dims 0..63 -> bf16, Hadamard ->
//               bf16 (written back: idx_q), act_quant -> e4m3 codes, and the head weight
//               w' = ((w * H^-0.5) * s_q) * 128^-0.5 (spec §3.6 steps 4-7).
// k_fwd_idx_k   per token: LayerNorm -> bf16, half-split RoPE -> bf16, Hadamard -> bf16 (written:
//               idx_k), act_quant into the indexer cache page at the token's slot (§3.6.3-4, §6.2).
// k_fwd_kv      per token: RMSNorm of c_kv -> bf16 (written: kv_cmpr), interleaved RoPE of k_pe
//               (written back in place: k_pe), the 656-byte MLA record at the slot (§3.3, §6.1).
#include "common.cuh"

__device__ __forceinline__ float bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Half-split RoPE of the 64 rope dims (pairs (i, i + 32)) on a warp's 128-vector held as
// v[k] = x[4 lane + k]: lanes 0..7 hold the first halves, lanes 8..15 the second. The same fp32
// operations as k_rope (no contraction), results rounded to bf16.
__device__ __forceinline__ void warp_rope_halfsplit(float v[4], const float *__restrict__ cs, int pos,
						    int lane)
{
	float other[4];
#pragma unroll
	for (int k = 0; k < 4; k++)
		other[k] = __shfl_xor_sync(0xffffffffu, v[k], 8);
	if (lane < 16) {
		const int lo = lane < 8;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const int i = 4 * (lane & 7) + k;
			const float c = cs[((size_t)pos * 32 + i) * 2 + 0];
			const float s = cs[((size_t)pos * 32 + i) * 2 + 1];
			const float a = lo ? v[k] : other[k], b = lo ? other[k] : v[k];
			v[k] = lo ? bf16r(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)))
				  : bf16r(__fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
		}
	}
}

__device__ __forceinline__ void load4(const uint16_t *__restrict__ x, float v[4], int lane)
{
	const uint2 raw = *reinterpret_cast<const uint2 *>(x + lane * 4);
	v[0] = bf16_to_f32(raw.x & 0xffff), v[1] = bf16_to_f32(raw.x >> 16);
	v[2] = bf16_to_f32(raw.y & 0xffff), v[3] = bf16_to_f32(raw.y >> 16);
}

__device__ __forceinline__ void store4(uint16_t *__restrict__ x, const float v[4], int lane)
{
	uint2 raw;
	raw.x = (uint32_t)f32_to_bf16(v[0]) | ((uint32_t)f32_to_bf16(v[1]) << 16);
	raw.y = (uint32_t)f32_to_bf16(v[2]) | ((uint32_t)f32_to_bf16(v[3]) << 16);
	*reinterpret_cast<uint2 *>(x + lane * 4) = raw;
}

// iq bf16 [T * H, 128] (the wq_b output, per head [rope | nope]; overwritten with idx_q),
// q8 e4m3 [T * H, 128], w fp32 [T, H] (weights_proj output, overwritten with w'), pos int [T],
// cs fp32 [max_pos, 32, 2]. One warp per (token, head); grid ceil(T * H / 8), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
k_fwd_idx_q(uint16_t *__restrict__ iq, uint8_t *__restrict__ q8, float *__restrict__ w,
	    const int *__restrict__ pos, const float *__restrict__ cs, int H, int rows, float had,
	    float hs, float ds)
{
	const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (r >= rows)
		return;
	float v[4];
	load4(iq + (size_t)r * 128, v, lane);
	warp_rope_halfsplit(v, cs, pos[r / H], lane);
	warp_hadamard128(v, lane);
#pragma unroll
	for (int k = 0; k < 4; k++)
		v[k] = bf16r(v[k] * had);
	store4(iq + (size_t)r * 128, v, lane);
	const float sc = warp_act_quant128_regs(v, q8 + (size_t)r * 128, lane);
	if (lane == 0)
		w[r] = __fmul_rn(__fmul_rn(__fmul_rn(w[r], hs), sc), ds);
}

// kr bf16 [T, ld] (wk output), nw, nb fp32 [128] (k_norm), ik bf16 [T, 128] out (idx_k),
// slots int [T] (page * 64 + offset), pool: the layer's indexer pages (page_bytes each).
// One warp per token; grid ceil(T / 8), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
k_fwd_idx_k(const uint16_t *__restrict__ kr, int ld, const float *__restrict__ nw,
	    const float *__restrict__ nb, uint16_t *__restrict__ ik, const int *__restrict__ pos,
	    const float *__restrict__ cs, const int *__restrict__ slots, uint8_t *__restrict__ pool,
	    long long page_bytes, int T, float eps, float had)
{
	const int t = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (t >= T)
		return;
	float v[4];
#pragma unroll
	for (int k = 0; k < 4; k++) // k_layernorm128's arithmetic
		v[k] = bf16_to_f32(kr[(size_t)t * ld + lane * 4 + k]);
	warp_layernorm128(v, lane, nw, nb, eps);
#pragma unroll
	for (int k = 0; k < 4; k++)
		v[k] = bf16r(v[k]);
	warp_rope_halfsplit(v, cs, pos[t], lane);
	warp_hadamard128(v, lane);
#pragma unroll
	for (int k = 0; k < 4; k++)
		v[k] = bf16r(v[k] * had);
	store4(ik + (size_t)t * 128, v, lane);
	const int slot = slots[t], off = slot & 63;
	uint8_t *page = pool + (size_t)(slot >> 6) * page_bytes;
	const float sc = warp_act_quant128_regs(v, page + off * 128, lane);
	if (lane == 0)
		*reinterpret_cast<float *>(page + 64 * 128 + off * 4) = sc;
}

#define KV_THREADS 256

// y bf16 [T, ld]: c_kv at column kvo (R values), k_pe right after (rope values, rotated in place);
// nw fp32 [R] (kv_norm), ckv bf16 [T, R] out (kv_cmpr), slots int [T], pool: the layer's MLA
// records (slot s at pool + s * rec_bytes). R % 128 == 0, R <= 2048, rope == 64.
// One block per token, 256 threads: RMSNorm as k_fwd_rmsnorm, k_pe pairs (2i, 2i+1) as k_rope
// (threads 0..31), then warp w < R/128 quantises c_kv tile w as k_kv_mla_write.
extern "C" __global__ void __launch_bounds__(KV_THREADS)
k_fwd_kv(uint16_t *__restrict__ y, int ld, int kvo, const float *__restrict__ nw,
	 uint16_t *__restrict__ ckv, int R, const int *__restrict__ pos, const float *__restrict__ cs,
	 const int *__restrict__ slots, uint8_t *__restrict__ pool, int rec_bytes, float eps)
{
	const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	uint16_t *row = y + (size_t)t * ld + kvo;
	uint8_t *rec = pool + (size_t)slots[t] * rec_bytes;
	const int tiles = R / 128;
	block_rmsnorm_row<KV_THREADS, 8>(row, nullptr, nw, ckv + (size_t)t * R, R, eps);
	if (tid < 32) { // k_pe: pair (2 tid, 2 tid + 1), interleaved layout
		uint16_t *pe = row + R;
		const float c = cs[((size_t)pos[t] * 32 + tid) * 2 + 0];
		const float sn = cs[((size_t)pos[t] * 32 + tid) * 2 + 1];
		const float a = bf16_to_f32(pe[2 * tid]), b = bf16_to_f32(pe[2 * tid + 1]);
		const uint16_t o0 = f32_to_bf16(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
		const uint16_t o1 = f32_to_bf16(__fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c)));
		pe[2 * tid] = o0, pe[2 * tid + 1] = o1;
		*reinterpret_cast<uint32_t *>(rec + R + tiles * 4 + 4 * tid) = (uint32_t)o0 | ((uint32_t)o1 << 16);
	}
	__syncthreads(); // this block's ckv row is written (global, visible within the block)
	for (int w = warp; w < tiles; w += KV_THREADS / 32) {
		const float sc = warp_act_quant128(ckv + (size_t)t * R + w * 128, rec + w * 128, lane);
		if (lane == 0)
			*reinterpret_cast<float *>(rec + R + w * 4) = sc;
	}
}
