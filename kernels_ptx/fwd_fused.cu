// fwd_fused.cu — the CUDA forward's RMSNorm (k_fwd_rmsnorm, also with its act_quant) and chains
// of its per-row ops fused into one launch each (fewer kernels per decode step), every
// intermediate rounded where the unfused chain rounds it, so the outputs are the same bits as
// the separate kernels (k_rope, k_hadamard128, k_act_quant, k_layernorm128, k_kv_mla_write,
// k_kv_index_write, k_fwd_rmsnorm, k_fwd_idx_weights; tests/gpu/test_gpu_forward.c), which are
// themselves checked against the CPU: rope_apply_halfsplit / _interleaved (model/rope.c),
// cpu_hadamard, cpu_act_quant, cpu_layernorm, cpu_rmsnorm (model/cpu_ops.c), kv_mla_write /
// kv_index_write (model/kv_cache.c), indexer_project (model/cpu_indexer.c). Device code only.
//
// k_fwd_idx_q   per (token, indexer head): half-split RoPE of dims 0..63 -> bf16, Hadamard ->
//               bf16 (written back: idx_q), act_quant -> e4m3 codes, and the head weight
//               w' = ((w * H^-0.5) * s_q) * 128^-0.5 (spec §3.6 steps 4-7); k_fwd_idx_qw the
//               same with the weights_proj product w itself (decode, k_fwd_gemv_ks's order).
// k_fwd_qkv_norms  everything that reads the fused q_a | indexer wk | kv_a GEMM output, in one
//               launch (block ranges): per token the q_a RMSNorm with its act_quant; per token
//               the RMSNorm of c_kv -> bf16 (written: kv_cmpr), interleaved RoPE of k_pe
//               (written back in place: k_pe), the 656-byte MLA record at the slot (§3.3,
//               §6.1); per token the indexer key: LayerNorm -> bf16, half-split RoPE -> bf16,
//               Hadamard -> bf16 (written: idx_k), act_quant into the indexer cache page at the
//               token's slot (§3.6.3-4, §6.2).
// k_fwd_rmsnorm cpu_rmsnorm / cpu_add_rmsnorm (model/cpu_ops.c): k_rmsnorm_add's arithmetic with
//               row strides, so a norm can read a slice of a fused GEMM output and write into a
//               slice of a wider row (the MTP concat); optionally act_quant of its output;
//               k_fwd_rmsnorm_1k the same with 1024 threads.
// k_fwd_embed_rmsnorm(_1k)  the first layer's attn_norm (with act_quant) reading its rows from
//               the embedding table, and the residual stream's first value (k_embed's copy).
#include "common.cuh"
#include "fwd_lin.cuh"

// Asks L1 for the norm weights w[0 .. dim) a block's threads read after its reduction (one
// prefetch per 128-byte line), so that read does not wait a DRAM round trip of its own.
template <int THREADS>
__device__ __forceinline__ void prefetch_weights(const float *__restrict__ w, int dim)
{
	for (int i = threadIdx.x * 32; i < dim; i += THREADS * 32)
		asm volatile("prefetch.global.L1 [%0];" ::"l"(w + i));
}

// A normed row goes through shared memory: written to global by 16-byte copies (when aligned) and
// read from there by the act_quant warps (was: each thread's scalar stores, then the quantising
// warps' loads of them back from global, an L2 round trip inside every norm).
template <int THREADS>
__device__ __forceinline__ void row_out(const uint16_t *ob, uint16_t *__restrict__ orow, int dim)
{
	if ((dim & 7) == 0 && (reinterpret_cast<uintptr_t>(orow) & 15) == 0)
		for (int i = threadIdx.x; i < dim / 8; i += THREADS)
			reinterpret_cast<uint4 *>(orow)[i] = reinterpret_cast<const uint4 *>(ob)[i];
	else
		for (int i = threadIdx.x; i < dim; i += THREADS)
			orow[i] = ob[i];
}

#define NORM_MAX_DIM 8192 // THREADS * PER of both norm widths

// out[t, :dim] (row stride ldo) = RMSNorm(s) with s = x[t] (+ res[t] when res is not null;
// res[t] = bf16(s) then); x row stride ldx, res row stride dim. One block per row (t = row).
// q non-null (then ldo == dim, dim % 128 == 0): also act_quant of the output row (k_act_quant's
// numbers): codes q [T, dim], scales qs [T, dim / 128]. dim <= NORM_MAX_DIM.
template <int THREADS, int PER>
__device__ __forceinline__ void fwd_rmsnorm(int row, const uint16_t *__restrict__ x, int ldx,
					    uint16_t *__restrict__ res, const float *__restrict__ w,
					    uint16_t *__restrict__ out, int ldo, int dim, float eps,
					    uint8_t *__restrict__ q, float *__restrict__ qs)
{
	__shared__ __align__(16) uint16_t ob[NORM_MAX_DIM]; // the normed row (bf16)
	prefetch_weights<THREADS>(w, dim);
	pdl_trigger();
	pdl_wait(); // x and res are the previous kernels' outputs
	block_rmsnorm_row<THREADS, PER>(x + (size_t)row * ldx, res ? res + (size_t)row * dim : nullptr,
					w, ob, dim, eps);
	__syncthreads(); // the normed row is in ob
	row_out<THREADS>(ob, out + (size_t)row * ldo, dim);
	if (!q)
		return;
	const int lane = threadIdx.x & 31, groups = dim / 128;
	for (int g = threadIdx.x >> 5; g < groups; g += THREADS / 32) {
		const float sc = warp_act_quant128(ob + g * 128, q + (size_t)row * dim + g * 128, lane);
		if (lane == 0)
			qs[(size_t)row * groups + g] = sc;
	}
}

// 256 threads, dim <= 8192 (k_rmsnorm_add's shape)
extern "C" __global__ void __launch_bounds__(256)
k_fwd_rmsnorm(const uint16_t *__restrict__ x, int ldx, uint16_t *__restrict__ res,
	      const float *__restrict__ w, uint16_t *__restrict__ out, int ldo, int dim, float eps,
	      uint8_t *__restrict__ q, float *__restrict__ qs)
{
	fwd_rmsnorm<256, 32>(blockIdx.x, x, ldx, res, w, out, ldo, dim, eps, q, qs);
}

// 1024 threads, dim <= 8192: the hidden-size norms of a decode step (7 values a thread instead
// of 28: run 4 measured 9.3 us a call with 256 threads at batch 1; the sum of squares is added
// in another order than k_fwd_rmsnorm's, fp32 rounding only)
extern "C" __global__ void __launch_bounds__(1024, 1)
k_fwd_rmsnorm_1k(const uint16_t *__restrict__ x, int ldx, uint16_t *__restrict__ res,
		 const float *__restrict__ w, uint16_t *__restrict__ out, int ldo, int dim, float eps,
		 uint8_t *__restrict__ q, float *__restrict__ qs)
{
	fwd_rmsnorm<1024, 8>(blockIdx.x, x, ldx, res, w, out, ldo, dim, eps, q, qs);
}

// The first layer's attention norm straight from the embedding table (spec §3.1, §3.2): row t of
// the step is table[ids[t]] (bf16 [vocab, dim]); res[t] = that row (the residual stream's start:
// k_embed's copy), out[t] = RMSNorm(row) with act_quant into q, qs — k_fwd_rmsnorm(_1k)'s numbers
// on an input without residual. Grid T; THREADS as the norm of that width. dim % 8 == 0.
template <int THREADS, int PER>
__device__ __forceinline__ void embed_rmsnorm(const uint16_t *__restrict__ table, const int *__restrict__ ids,
					      uint16_t *__restrict__ res, const float *__restrict__ w,
					      uint16_t *__restrict__ out, int dim, float eps,
					      uint8_t *__restrict__ q, float *__restrict__ qs)
{
	const int t = blockIdx.x;
	pdl_trigger();
	pdl_wait(); // ids: the step's metadata (uploaded before)
	const uint16_t *xr = table + (size_t)ids[t] * dim;
	for (int i = threadIdx.x; i < dim / 8; i += THREADS)
		reinterpret_cast<uint4 *>(res + (size_t)t * dim)[i] = reinterpret_cast<const uint4 *>(xr)[i];
	fwd_rmsnorm<THREADS, PER>(t, xr, 0, nullptr, w, out, dim, dim, eps, q, qs);
}

extern "C" __global__ void __launch_bounds__(256)
k_fwd_embed_rmsnorm(const uint16_t *__restrict__ table, const int *__restrict__ ids,
		    uint16_t *__restrict__ res, const float *__restrict__ w, uint16_t *__restrict__ out,
		    int dim, float eps, uint8_t *__restrict__ q, float *__restrict__ qs)
{
	embed_rmsnorm<256, 32>(table, ids, res, w, out, dim, eps, q, qs);
}

extern "C" __global__ void __launch_bounds__(1024, 1)
k_fwd_embed_rmsnorm_1k(const uint16_t *__restrict__ table, const int *__restrict__ ids,
		       uint16_t *__restrict__ res, const float *__restrict__ w, uint16_t *__restrict__ out,
		       int dim, float eps, uint8_t *__restrict__ q, float *__restrict__ qs)
{
	embed_rmsnorm<1024, 8>(table, ids, res, w, out, dim, eps, q, qs);
}

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

// The indexer query row r = (token r / H, head r % H) by one warp: iq bf16 [T * H, 128] (the
// wq_b output, per head [rope | nope]; overwritten with idx_q), q8 e4m3 [T * H, 128], w fp32
// [T, H]: wr (the weights_proj output of the row) becomes w' at w[r]; pos int [T], cs fp32
// [max_pos, 32, 2].
__device__ __forceinline__ void idx_q_row(int r, float wr, uint16_t *__restrict__ iq,
					  uint8_t *__restrict__ q8, float *__restrict__ w,
					  const int *__restrict__ pos, const float *__restrict__ cs, int H,
					  float had, float hs, float ds, int lane)
{
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
		w[r] = __fmul_rn(__fmul_rn(__fmul_rn(wr, hs), sc), ds);
}

// idx_q_row for every row, w[r] read from w (k_fwd_idx_q: grid ceil(T * H / 8), 256 threads).
extern "C" __global__ void __launch_bounds__(256)
k_fwd_idx_q(uint16_t *__restrict__ iq, uint8_t *__restrict__ q8, float *__restrict__ w,
	    const int *__restrict__ pos, const float *__restrict__ cs, int H, int rows, float had,
	    float hs, float ds)
{
	const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	pdl_trigger();
	pdl_wait(); // iq is the previous kernel's output
	if (r >= rows)
		return;
	idx_q_row(r, w[r], iq, q8, w, pos, cs, H, had, hs, ds, lane);
}

// The same for a decode step (T <= 4) with weights_proj folded in: block r computes w[r] =
// a[r / H] . Wp[r % H] (a bf16 [T, lda], Wp bf16 [H, D]) as k_fwd_gemv_ks does for its block's
// output (the 8 warps over K, warp partials added in warp order: the same numbers), then warp 0
// runs idx_q_row on it. Grid T * H, 256 threads. D % 8 == 0, lda % 8 == 0.
extern "C" __global__ void __launch_bounds__(256)
k_fwd_idx_qw(uint16_t *__restrict__ iq, uint8_t *__restrict__ q8, float *__restrict__ w,
	     const int *__restrict__ pos, const float *__restrict__ cs, int H, float had, float hs,
	     float ds, const uint16_t *__restrict__ Wp, const uint16_t *__restrict__ a, int lda, int D)
{
	__shared__ float part[8];
	const int r = blockIdx.x, t = r / H, h = r % H, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const uint4 *wr = reinterpret_cast<const uint4 *>(Wp + (size_t)h * D);
	float acc[LIN_ROWS] = {0.f, 0.f, 0.f, 0.f};
	// the first 4 chunks of the weight row (constant) loaded before the wait; the chunks are
	// then added in the same order as k_fwd_gemv_ks (c = tid, tid + 256, ...)
	const int nc = D / 8;
	uint4 pre[4];
#pragma unroll
	for (int u = 0; u < 4; u++)
		if (threadIdx.x + 256 * u < nc)
			pre[u] = wr[threadIdx.x + 256 * u];
	pdl_trigger();
	pdl_wait(); // a and iq are earlier kernels' outputs
#pragma unroll
	for (int u = 0; u < 4; u++)
		if (threadIdx.x + 256 * u < nc)
			gemv_chunk(acc, pre[u], a + (size_t)t * lda, lda, threadIdx.x + 256 * u, 1);
#pragma unroll 4
	for (int c = threadIdx.x + 1024; c < nc; c += 256)
		gemv_chunk(acc, wr[c], a + (size_t)t * lda, lda, c, 1);
	acc[0] = warp_sum(acc[0]);
	if (lane == 0)
		part[warp] = acc[0];
	__syncthreads(); // every warp's partial is in shared memory
	if (warp)
		return;
	float dot = part[0];
	for (int k = 1; k < 8; k++)
		dot += part[k];
	idx_q_row(r, dot, iq, q8, w, pos, cs, H, had, hs, ds, lane);
}

// The indexer key of token t by one warp: kr bf16 [T, ld] (wk output), nw, nb fp32 [128]
// (k_norm), ik bf16 [T, 128] out (idx_k), slots int [T] (page * 64 + offset), pool: the layer's
// indexer pages (page_bytes each).
__device__ __forceinline__ void idx_k_token(int t, const uint16_t *__restrict__ kr, int ld,
					    const float *__restrict__ nw, const float *__restrict__ nb,
					    uint16_t *__restrict__ ik, const int *__restrict__ pos,
					    const float *__restrict__ cs, const int *__restrict__ slots,
					    uint8_t *__restrict__ pool, long long page_bytes, float eps,
					    float had, int lane)
{
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
#define KV_MAX_R 2048

// The MLA cache side of token t by a block of KV_THREADS: y bf16 [T, ld]: c_kv at column kvo
// (R values), k_pe right after (rope values, rotated in place); nw fp32 [R] (kv_norm), ckv bf16
// [T, R] out (kv_cmpr), slots int [T], pool: the layer's MLA records (slot s at pool + s *
// rec_bytes). R % 128 == 0, R <= 2048, rope == 64. RMSNorm as k_fwd_rmsnorm, k_pe pairs
// (2i, 2i+1) as k_rope (threads 0..31), then warp w < R/128 quantises c_kv tile w as
// k_kv_mla_write.
__device__ __forceinline__ void kv_token(int t, uint16_t *__restrict__ y, int ld, int kvo,
					 const float *__restrict__ nw, uint16_t *__restrict__ ckv, int R,
					 const int *__restrict__ pos, const float *__restrict__ cs,
					 const int *__restrict__ slots, uint8_t *__restrict__ pool,
					 int rec_bytes, float eps)
{
	__shared__ __align__(16) uint16_t ob[KV_MAX_R]; // the normed c_kv (bf16), as in fwd_rmsnorm
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	uint16_t *row = y + (size_t)t * ld + kvo;
	uint8_t *rec = pool + (size_t)slots[t] * rec_bytes;
	const int tiles = R / 128;
	prefetch_weights<KV_THREADS>(nw, R);
	block_rmsnorm_row<KV_THREADS, 8>(row, nullptr, nw, ob, R, eps);
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
	__syncthreads(); // the normed c_kv is in ob
	row_out<KV_THREADS>(ob, ckv + (size_t)t * R, R);
	for (int w = warp; w < tiles; w += KV_THREADS / 32) {
		const float sc = warp_act_quant128(ob + w * 128, rec + w * 128, lane);
		if (lane == 0)
			*reinterpret_cast<float *>(rec + R + w * 4) = sc;
	}
}

// y bf16 [T, ld] (ld = qlr + 128 + R + rope): the fused GEMM's output q_a | wk | kv_a | k_pe.
// Blocks [0, T): token b's q_a RMSNorm (qnw) -> cq bf16 [T, qlr] and its act_quant -> cq8, cqs
// (k_fwd_rmsnorm's arithmetic); blocks [T, 2T): kv_token(b - T) (kv_a at column kvo); blocks
// [2T, 2T + ceil(T / 8)): idx_k_token for 8 tokens a block (wk at column qlr; ik, ipool, ipb,
// inw, inb as there). The three read disjoint columns of y and write disjoint buffers. Grid
// 2T + ceil(T / 8), 256 threads.
extern "C" __global__ void __launch_bounds__(KV_THREADS)
k_fwd_qkv_norms(uint16_t *__restrict__ y, int ld, int T, float eps, const float *__restrict__ qnw,
		uint16_t *__restrict__ cq, int qlr, uint8_t *__restrict__ cq8, float *__restrict__ cqs,
		int kvo, const float *__restrict__ kvnw, uint16_t *__restrict__ ckv, int R,
		const int *__restrict__ pos, const float *__restrict__ cs, const int *__restrict__ slots,
		uint8_t *__restrict__ mpool, int rec_bytes, const float *__restrict__ inw,
		const float *__restrict__ inb, uint16_t *__restrict__ ik, uint8_t *__restrict__ ipool,
		long long ipb, float had)
{
	const int b = blockIdx.x;
	pdl_trigger();
	pdl_wait(); // y is the previous kernel's output (fwd_rmsnorm's second wait returns at once)
	if (b < T) {
		fwd_rmsnorm<KV_THREADS, 32>(b, y, ld, nullptr, qnw, cq, qlr, qlr, eps, cq8, cqs);
	} else if (b < 2 * T) {
		kv_token(b - T, y, ld, kvo, kvnw, ckv, R, pos, cs, slots, mpool, rec_bytes, eps);
	} else {
		const int t = (b - 2 * T) * 8 + (threadIdx.x >> 5);
		if (t < T)
			idx_k_token(t, y + qlr, ld, inw, inb, ik, pos, cs, slots, ipool, ipb, eps, had,
				    threadIdx.x & 31);
	}
}
