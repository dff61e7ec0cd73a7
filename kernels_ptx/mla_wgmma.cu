// mla_wgmma.cu — the sparse MLA decode of mla_decode.cu (absorbed form, spec §3.7b; records of
// spec §6.1) on Hopper's warpgroup MMAs, for many rows (the batch-128 decode): the same inputs,
// outputs, split partials and numerics as k_mla_decode, another work split.
//
// k_mla_decode_wg: the arguments of k_mla_decode; R = 512, 656-byte records, H % 64 == 0 (the
// launcher, model/cuda_attn.c, checks). Grid (H / 64, B, splits), 384 threads = 3 warpgroups, one
// block = 64 heads of one row over keys_per_split of its keys, in tiles of 32 keys:
//   warpgroup 2 (the producer): loads the split's slots into shared memory once, then gathers
//     the 656-byte records of the next tile by slot id with cp.async into raw[2] (warp pw owns
//     keys 8 pw .. +8 of every tile, its lanes the 16-byte chunks of a record), dequantises the
//     current one into the fp16 key tile K[t % 2] and hands it over (named barrier FULL[t % 2]);
//     it waits for the consumers to release a buffer (EMPTY) before overwriting it.
//   warpgroups 0 and 1 (the consumers), for each tile:
//     1. S_w = Q K^T over the k16 steps 2i + w (dims 32 (2i + w) .. + 16, i < 18; 18 wgmma
//        m64n32k16, Q and K from shared memory): the two halves of the 576-dim dot products;
//     2. the halves exchanged through shared memory and added, S = S_0 + S_1 (fp32, the same
//        sum in both warpgroups), so both hold the whole 64 heads x 32 keys scores: the same
//        online softmax (fp32) runs in both, and its weights become the A operand of P V in
//        registers, as P_hi = fp16(p) and P_lo = fp16(p - P_hi);
//     3. O_w = O_w e^(m_old - m) + P_hi V_w + P_lo V_w with V_w = latent dims 256 w .. +256 of
//        the same key tile (4 wgmma m64n256k16, V MN-major through the transpose bit): each
//        warpgroup owns half of the output dims, 128 fp32 accumulators a thread.
// Shared memory (mw_smem_bytes in model/cuda_attn.c, 1024-aligned): Q [9 column blocks of 64
// dims][64 heads][128 B] fp16, K[2] [9][32 keys][128 B] fp16, both in the 128-byte swizzle
// (wgmma.cuh), the S exchange [2 tiles][2 warpgroups][16][128] fp32, raw[2] [32][656] bytes,
// the split's slots [MW_MAXK] ints (keys_per_split <= MW_MAXK).
// Numerics: those of k_mla_decode (mla_decode.cu: fp16 operands, exact in the same ranges; P as
// P_hi + P_lo; l the fp32 sum of p; the output bf16 of o / l), with the dot products summed in
// another order (two fp32 halves of 288 dims, each a tensor-core sum; S_0 + S_1 is the same
// float in both warpgroups, fp32 addition being commutative), the keys of a split in tiles of
// 32, and the weights as 2^(s log2(e) - m) by exp2f (the exponent's fp32 rounding, |s| log2(e)
// 2^-24, and ex2's 2 ulp: ~2^-19 of a weight at |s| ~ 30, as expf of fp32 arguments on the CPU).
// Not bit-identical to k_mla_decode, within the same limits of attn_latent
// (tests/gpu/test_gpu_mla.c).
// k_mla_decode_wg2: the same kernel with the two 64-head blocks of a row (and split) a cluster
// of 2 CTAs, whose key lists are the same: each CTA's producer gathers and dequantises only its
// half of every tile's keys (CTA rank r: keys 16 r .. + 16, warp pw 4 of them; its raw records in
// 4 stages of 16, 3 tiles in flight) and stores each fp16 chunk into its own key tile and, by
// st.async, into the peer's, each 16-byte store completing 16 bytes of the peer's full barrier.
// The handover is by mbarriers instead of named barriers: full[buffer] (this CTA's 128 producer
// threads, one of them expecting the peer's 18432 bytes) and empty[buffer] (16: the consumer
// warps of both CTAs), at the end of shared memory. The same key tiles through the same
// consumers: the same bits as k_mla_decode_wg (run 17: 0 of every test's outputs differ). Run 17
// at 128 rows: 32K 393.9 us against k_mla_decode_wg's 392.2 (the consumers bound there), 128K
// 409.8 against 455.5, 1K 268.3 against 303.8; batch 1 16.3 against 16.5. (Run 17's other forms:
// remote stores with a release-arrive at cluster scope, 398.6 / 457.8; and the consumers
// pipelined, S of tile t + 1 before P V of t, three key buffers, one raw stage in flight: 407.4 /
// 465.1 — removed. Run 25's k_mla_decode_wg2c4 / c8, a row's key splits merged 4 / 8 at a time
// in a cluster of (2, 1, 4) / (2, 1, 8) CTAs through distributed shared memory (batch 1: 19.1 /
// 20.9 us against 16.9, the decode kernel alone 16.0 / 18.2 against 13.8: the exchange cost more
// than the fp32 partials' stores it saved; with the groups merged in the kernel by the last CTA
// of each slice 29.3 / 23.5; bench model +1.4 .. +119 us a step) — removed. Run 26's split
// partials in 16-byte stores (lanes swapping halves): 13.66 against 13.69 us, no gain in the
// step — removed.)
// diag (benchmarks only; 0 otherwise): bit 0 gathers only the first two tiles, bit 1 skips the
// MMAs, bit 2 dequantises only the first two tiles, bit 3 issues P V of a tile and S of the next
// together (one wait a tile: see fuse below; a real result, the same bits), bit 4 skips the softmax
// (and its exchange: P V with zero weights), bit 5 skips the load of Q, bit 6 the output stores,
// bit 7 (k_mla_decode_wg2) the light handover (mw_arrive_cl, mw_wait_cl: CTA-scope semantics, no
// consumer-side proxy fence; a real result, the same bits).
#include "cluster.cuh"
#include "common.cuh"
#include "mla.cuh"
#include "mma.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#define MW_HG 64      // heads per block
#define MW_KT 32      // keys per tile
#define MW_R 512      // latent dims
#define MW_DK 576     // latent + rope dims of a key
#define MW_REC 656    // record bytes: 512 e4m3, 4 fp32 scales, 64 bf16
#define MW_THREADS 384
#define MW_CB (MW_HG * 128)                  // bytes of a Q column block (64 dims of 64 heads)
#define MW_KCB (MW_KT * 128)                 // bytes of a K column block (64 dims of 32 keys)
#define MW_Q_BYTES (MW_DK / 64 * MW_CB)      // 73728
#define MW_K_BYTES (MW_DK / 64 * MW_KCB)     // 36864
#define MW_XS (16 * 128)                     // floats of one warpgroup's S half
#define MW_BAR_FULL 1  // + buffer: the producer's tile is in K[buffer]
#define MW_BAR_EMPTY 3 // + buffer: the consumers are done with K[buffer]
#define MW_BAR_CONS 5  // the 256 consumer threads
#define MW_BAR_PROD 6  // the 128 producer threads
#define MW_MAXK 2048   // keys a split at most (its slots are held in shared memory)

// The shared-memory plan (byte offsets from the 1024-aligned base): Q, two key tiles, two S
// exchanges (2 halves of MW_XS floats each), NST raw stages of STB bytes, the split's slots, the
// mbarriers full[2], empty[2] (PAIR). KW: keys a producer warp dequantises in a tile.
template <bool PAIR> struct mw_cfg {
	static constexpr int KW = PAIR ? 4 : 8, NST = PAIR ? 4 : 2, STB = 4 * KW * MW_REC;
	static constexpr int PEER_BYTES = 16 * MW_DK * 2; // PAIR: the peer's half of a key tile
	static constexpr int K_OFF = MW_Q_BYTES, XS_OFF = K_OFF + 2 * MW_K_BYTES;
	static constexpr int RAW_OFF = XS_OFF + 4 * MW_XS * 4, SSL_OFF = RAW_OFF + NST * STB;
	static constexpr int BAR_OFF = SSL_OFF + MW_MAXK * 4, END = BAR_OFF + 4 * 8;
	static_assert(NST * STB == 2 * MW_KT * MW_REC, "raw holds the stages");
	static_assert(1024 + END <= 1024 + 230400 + 32, "mla_wg_smem_bytes (cuda_attn.c) holds the plan");
};

__device__ __forceinline__ void mw_bar_sync(int id, int n)
{
	asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void mw_bar_arrive(int id, int n)
{
	asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// k_mla_decode_wg2's cross-CTA handover (see the header; addresses by cluster.cuh's cl_mapa,
// the peer's half of a tile by cl_st_async)
// One arrival on the barrier at cluster address bar, releasing this thread's prior operations to
// the cluster; light (diag bit 7): at CTA scope, the default of the instruction (CUTLASS's cluster
// pipelines' consumer release: the operations to order are the wgmma reads already waited for)
__device__ __forceinline__ void mw_arrive_cl(uint32_t bar, bool light)
{
	if (light)
		asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
	else
		asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Waits (acquiring at cluster scope; light: at CTA scope, the instruction's default, as CUTLASS's
// and FlashMLA's waits for bytes that st.async or TMA completed) for the phase of parity `parity`
// of this CTA's barrier bar; traps after 2 s (tma.cuh's mbar_wait: a lost arrival is a bug, the
// test fails with a launch error, no hang)
__device__ __forceinline__ void mw_wait_cl(uint32_t bar, uint32_t parity, bool light)
{
	if (light)
		mbar_wait(bar, parity);
	else
		mbar_wait<true, true>(bar, parity);
}

// d (+)= A[64 x 16] . B[32 x 16]^T, fp16 -> fp32, both K-major in shared memory (descriptors);
// accumulate = 0 overwrites d. d: 16 registers a thread (the m64n32 f32 fragment).
__device__ __forceinline__ void wgmma_f16_ss_n32(float *d, uint64_t da, uint64_t db, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
		     : "l"(da), "l"(db), "r"(accumulate));
}

// d (+)= A[64 x 16] . B[16 x 256], fp16 -> fp32: A from registers (a0..a3: the mma.sync
// m16n8k16 A fragment of the warp's 16 rows), B MN-major in shared memory (descriptor; the
// transpose bit set); accumulate = 0 overwrites d. d: 128 registers a thread.
__device__ __forceinline__ void wgmma_f16_rs_n256_tb(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
						    uint64_t db, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(accumulate));
}

// Byte offset of 16-byte chunk c (0 .. 71: 8 fp16 each, dims 8c .. 8c + 7) of row r in a tile of
// 64-dim column blocks cb_bytes apart, 128-byte swizzle
__device__ __forceinline__ uint32_t mw_chunk(int r, int c, int cb_bytes)
{
	return (c >> 3) * cb_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// A warp's cp.async gather of the records of its KW keys k0 .. k0 + KW - 1 of a tile (slots
// ssl_tile[k0 ..], -1: none) into rows k0 - kb .. of the raw stage raw_tile; one commit group
template <int KW>
__device__ __forceinline__ void mw_gather(const int *ssl_tile, const uint8_t *__restrict__ pool, uint8_t *raw_tile,
					  int k0, int kb, int lane)
{
#pragma unroll
	for (int j = 0; j < KW; j++) {
		const int slot = ssl_tile[k0 + j];
		if (slot < 0)
			continue;
		const uint8_t *src = pool + (size_t)slot * MW_REC;
		const uint32_t dst = smem_u32(raw_tile + (k0 - kb + j) * MW_REC);
		cp_async16(dst + lane * 16, src + lane * 16);
		if (lane < MW_REC / 16 - 32)
			cp_async16(dst + (lane + 32) * 16, src + (lane + 32) * 16);
	}
	cp_async_commit();
}

// A warp's KW keys k0 .. k0 + KW - 1 of a tile, dequantised from rows k0 - kb .. of raw_tile into
// the key tile at byte kt of shared memory (and, PEER, the same bytes at cluster address peer + kt,
// the other CTA's tile, by st.async, completing bytes of its barrier at cluster address pbar),
// branch-free: the latent as 2 KW items a lane (key k0 + q / 2, chunk lane + 32 (q % 2): 8 codes
// by mla.cuh's integer placement, times their 128-wide tile's scale x 2^8 — the same fp16
// product, rounded once, as converting the code and multiplying by the scale), the rope as KW / 4
// (key k0 + lane / 8 + 4 r, chunk 64 + lane % 8: bf16 -> fp16). Every key is converted: one past
// the list's end holds zeros or an older valid record (finite), and the consumers mask it. (Run
// 12: the first version, a branch on the slot and on latent / rope in each of 18 items a lane,
// one key's slot by shuffle each, was the kernel's bound: ~4000 cycles a tile.)
template <int KW, bool PEER>
__device__ __forceinline__ void mw_dequant(const uint8_t *raw_tile, uint8_t *smem, uint32_t kt, uint32_t peer,
					   uint32_t pbar, int k0, int kb, int lane)
{
#pragma unroll
	for (int q = 0; q < 2 * KW; q++) {
		const int kk = k0 + (q >> 1), c = lane + 32 * (q & 1);
		const uint8_t *rp = raw_tile + (kk - kb) * MW_REC;
		const uint2 codes = *reinterpret_cast<const uint2 *>(rp + 8 * c);
		const float sc = *reinterpret_cast<const float *>(rp + MW_R + (c >> 4) * 4) * 256.f;
		const uint32_t sc2 = f32x2_to_f16x2(sc, sc);
		uint32_t w0, w1, w2, w3;
		e4m3x4_to_f16x2_m8(codes.x, w0, w1);
		e4m3x4_to_f16x2_m8(codes.y, w2, w3);
		const uint4 v = make_uint4(f16x2_mul(w0, sc2), f16x2_mul(w1, sc2), f16x2_mul(w2, sc2), f16x2_mul(w3, sc2));
		const uint32_t off = kt + mw_chunk(kk, c, MW_KCB);
		*reinterpret_cast<uint4 *>(smem + off) = v;
		if (PEER)
			cl_st_async(peer + off, v, pbar);
	}
#pragma unroll
	for (int r = 0; r < KW / 4; r++) {
		const int kk = k0 + (lane >> 3) + 4 * r, c = MW_R / 8 + (lane & 7);
		const uint4 u = *reinterpret_cast<const uint4 *>(raw_tile + (kk - kb) * MW_REC + MW_R + 16 + 16 * (lane & 7));
		const uint4 v = make_uint4(bf16x2_to_f16x2(u.x), bf16x2_to_f16x2(u.y), bf16x2_to_f16x2(u.z),
					   bf16x2_to_f16x2(u.w));
		const uint32_t off = kt + mw_chunk(kk, c, MW_KCB);
		*reinterpret_cast<uint4 *>(smem + off) = v;
		if (PEER)
			cl_st_async(peer + off, v, pbar);
	}
}

// The producer warpgroup (see the header): the split's slots into ssl (all loads in flight
// together: run 12 lost ~1 us a tile to a slot load exposed every tile) and raw zeroed, then
// gathers tile t + NST - 1 while dequantising tile t, the raw records in NST stages. PAIR
// (k_mla_decode_wg2): this CTA's half of each tile's keys (16 rank ..), in 4 stages of 16
// records (3 tiles in flight: the gather was latency-bound, run 15), written into both CTAs' key
// tiles, handed over by the cluster barriers at bars (full[2], empty[2]) instead of the named
// barriers. Else 2 stages of 32 records (1 tile in flight).
template <bool PAIR>
__device__ __forceinline__ void mw_produce(const int *__restrict__ srow, int k_begin, int k_end, int nt,
					   const uint8_t *__restrict__ pool, uint8_t *smem, uint32_t bars, int diag)
{
	using C = mw_cfg<PAIR>;
	constexpr int KW = C::KW, NST = C::NST, STB = C::STB;
	uint8_t *raw = smem + C::RAW_OFF;
	int *ssl = reinterpret_cast<int *>(smem + C::SSL_OFF);
	const int ptid = threadIdx.x - 256, pw = ptid >> 5, lane = threadIdx.x & 31;
	const uint32_t rank = PAIR ? cluster_rank() : 0;
	const int kb = PAIR ? 16 * (int)rank : 0, k0 = kb + KW * pw; // the CTA's first key, the warp's
	const uint32_t peer = PAIR ? cl_mapa(smem_u32(smem), rank ^ 1) : 0;
	for (int i0 = 0; i0 < nt * MW_KT; i0 += 8 * 128) {
		int v[8];
#pragma unroll
		for (int u = 0; u < 8; u++) {
			const int k = k_begin + i0 + 128 * u + ptid;
			v[u] = k < k_end ? __ldg(srow + k) : -1;
		}
#pragma unroll
		for (int u = 0; u < 8; u++)
			if (i0 + 128 * u + ptid < nt * MW_KT)
				ssl[i0 + 128 * u + ptid] = v[u];
	}
	for (int i = ptid; i < NST * STB / 16; i += 128)
		reinterpret_cast<uint4 *>(raw)[i] = make_uint4(0, 0, 0, 0);
	mw_bar_sync(MW_BAR_PROD, 128);
	// tile j's gather: one commit group, none past the end or under diag bit 0 after tile 1 —
	// PAIR: an empty group then, as its wait counts groups (without, the wait takes all)
#pragma unroll
	for (int j = 0; j < NST - 1; j++)
		if (j < nt && !((diag & 1) && j >= 2))
			mw_gather<KW>(ssl + j * MW_KT, pool, raw + j * STB, k0, kb, lane);
		else if (PAIR)
			cp_async_commit();
	for (int t = 0; t < nt; t++) {
		const int s = t & 1;
		cp_async_wait_group<NST - 2>(); // tile t's group (the NST - 2 after it may still fly)
		__syncwarp(); // the warp's records of tile t landed; its reads of tile t - 1's stage done
		const int j = t + NST - 1;
		if (j < nt && !((diag & 1) && j >= 2))
			mw_gather<KW>(ssl + j * MW_KT, pool, raw + (j & (NST - 1)) * STB, k0, kb, lane);
		else if (PAIR)
			cp_async_commit();
		if (t >= 2) {
			if (PAIR) // both CTAs' consumers done with tile t - 2
				mw_wait_cl(bars + 8 * (2 + s), ((t >> 1) + 1) & 1, diag & 128);
			else
				mw_bar_sync(MW_BAR_EMPTY + s, MW_THREADS);
		}
		const bool deq = !((diag & 4) && t >= 2); // (the same in both CTAs)
		if (deq)
			mw_dequant<KW, PAIR>(raw + (t & (NST - 1)) * STB, smem, C::K_OFF + s * MW_K_BYTES, peer,
					     PAIR ? cl_mapa(bars + 8 * s, rank ^ 1) : 0, k0, kb, lane);
		if (PAIR) {
			// this CTA's half by its own stores, made visible to the async proxy; the peer's
			// half by st.async, counted in bytes (thread 0 expects them)
			fence_proxy_async();
			if (ptid == 0 && deq)
				asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bars + 8 * s),
					     "r"(C::PEER_BYTES)
					     : "memory");
			else
				mbar_arrive(bars + 8 * s);
		} else {
			fence_proxy_async();
			mw_bar_arrive(MW_BAR_FULL + s, MW_THREADS);
		}
	}
}

// Issues warpgroup wg's half of S = Q K^T for a key tile: the k16 steps 2i + wg (i < 18), i.e.
// dims 32 (2i + wg) .. + 16 — step ks sits at column block ks / 4, bytes 32 (ks % 4) of a row.
// dq, dk: the descriptors of Q and of the key tile at that warpgroup's first step (+ 32 wg
// bytes); a step's is the base + its offset / 16 (the address field, start / 16, never carries:
// shared addresses < 256 KB). No fence, no commit.
__device__ __forceinline__ void mw_issue_s(float *sp, uint64_t dq, uint64_t dk)
{
#pragma unroll
	for (int i = 0; i < 18; i++)
		wgmma_f16_ss_n32(sp, dq + ((i >> 1) * MW_CB + (i & 1) * 64) / 16, dk + ((i >> 1) * MW_KCB + (i & 1) * 64) / 16,
				 i > 0);
}

// Issues O_w += P_hi V_w + P_lo V_w for a key tile (V_w: latent dims 256 wg .., column blocks
// 4 wg ..; k16 step kk = keys 16 kk .., 2048 bytes on); dv: the descriptor at the tile's column
// block 4 wg. No fence, no commit.
__device__ __forceinline__ void mw_issue_pv(float *o, const uint32_t (&ph)[2][4], const uint32_t (&pl)[2][4],
					    uint64_t dv)
{
#pragma unroll
	for (int kk = 0; kk < 2; kk++)
		wgmma_f16_rs_n256_tb(o, ph[kk][0], ph[kk][1], ph[kk][2], ph[kk][3], dv + kk * 2048 / 16, 1);
#pragma unroll
	for (int kk = 0; kk < 2; kk++)
		wgmma_f16_rs_n256_tb(o, pl[kk][0], pl[kk][1], pl[kk][2], pl[kk][3], dv + kk * 2048 / 16, 1);
}

// The online softmax state of a consumer thread's two heads (16 wi + g and + 8), in log2 units:
// scores times scale2 = scale log2(e), weights 2^(s - m) (exp2f, one instruction; expf's range
// reduction took ~8 a weight), m converted back (x ln 2) for the split partials
struct mw_soft {
	float m0, m1, l0, l1;
};

// Steps 2 of the header for tile buffer s (cv: the tile's slots, -1 masks a key): this
// warpgroup's half sp of S through the exchange
// (the same fragment position in the other warpgroup), S = S_0 + S_1, scaled and masked, the
// running maxima and sums updated; out: the A fragments of P V (k16 step kk = keys 16 kk ..:
// a0 head g keys 2 t4 + {0, 1}, a1 head g + 8, a2 and a3 the same keys + 8) and the factors
// e^(m_old - m) of the thread's two heads for O
__device__ __forceinline__ void mw_softmax(const float *sp, float *xs, const int *cv, int s, int wg, int wt, int t4,
					   float scale2, mw_soft &st, uint32_t (&ph)[2][4], uint32_t (&pl)[2][4],
					   float &c0, float &c1)
{
	float *xw = xs + (2 * s + wg) * MW_XS;
#pragma unroll
	for (int j = 0; j < 16; j++)
		xw[j * 128 + wt] = sp[j];
	mw_bar_sync(MW_BAR_CONS, 256);
	const float *xo = xs + (2 * s + (wg ^ 1)) * MW_XS; // the other warpgroup's half
	// fragment register 4 jb + e: head 16 wi + g (e < 2) or + 8, key 8 jb + 2 t4 + e % 2;
	// sp + the other half is the same float in both (fp32 addition commutes)
	float sc[16], mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
	for (int jb = 0; jb < 4; jb++)
#pragma unroll
		for (int e = 0; e < 2; e++) {
			const bool ok = cv[8 * jb + 2 * t4 + e] >= 0;
			const int j0 = 4 * jb + e, j1 = j0 + 2;
			sc[j0] = ok ? (sp[j0] + xo[j0 * 128 + wt]) * scale2 : -INFINITY;
			sc[j1] = ok ? (sp[j1] + xo[j1 * 128 + wt]) * scale2 : -INFINITY;
			mx0 = fmaxf(mx0, sc[j0]);
			mx1 = fmaxf(mx1, sc[j1]);
		}
	mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
	mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
	mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
	mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
	const float mn0 = fmaxf(st.m0, mx0), mn1 = fmaxf(st.m1, mx1);
	c0 = st.m0 == -INFINITY ? 0.f : exp2f(st.m0 - mn0);
	c1 = st.m1 == -INFINITY ? 0.f : exp2f(st.m1 - mn1);
	const float ms0 = mn0 == -INFINITY ? 0.f : mn0, ms1 = mn1 == -INFINITY ? 0.f : mn1;
	st.m0 = mn0, st.m1 = mn1, st.l0 *= c0, st.l1 *= c1;
#pragma unroll
	for (int jb = 0; jb < 4; jb++) {
		const float pg0 = exp2f(sc[4 * jb] - ms0), pg1 = exp2f(sc[4 * jb + 1] - ms0);
		const float pk0 = exp2f(sc[4 * jb + 2] - ms1), pk1 = exp2f(sc[4 * jb + 3] - ms1);
		st.l0 += pg0 + pg1;
		st.l1 += pk0 + pk1;
		const uint32_t hg = f32x2_to_f16x2(pg0, pg1), hk = f32x2_to_f16x2(pk0, pk1);
		ph[jb >> 1][2 * (jb & 1)] = hg;
		ph[jb >> 1][2 * (jb & 1) + 1] = hk;
		pl[jb >> 1][2 * (jb & 1)] = f32x2_to_f16x2(pg0 - f16_lo(hg), pg1 - f16_hi(hg));
		pl[jb >> 1][2 * (jb & 1) + 1] = f32x2_to_f16x2(pk0 - f16_lo(hk), pk1 - f16_hi(hk));
	}
}

// O *= e^(m_old - m) of each row; skipped by a warp whose rows' maxima all stayed (factor 1:
// the same values), as they mostly do after the first tiles (128 multiplies a thread a tile)
__device__ __forceinline__ void mw_rescale(float *o, float c0, float c1)
{
	if (!__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f))
		return;
#pragma unroll
	for (int j = 0; j < 32; j++) {
		o[4 * j] *= c0, o[4 * j + 1] *= c0;
		o[4 * j + 2] *= c1, o[4 * j + 3] *= c1;
	}
}

__device__ __forceinline__ void mw_fence_regs(float *v, int n)
{
#pragma unroll
	for (int j = 0; j < n; j++)
		wg_reg_fence(v[j]);
}

// S's half of a tile issued and waited for
__device__ __forceinline__ void mw_s_now(float *sp, uint64_t dq, uint64_t dk)
{
	wg_fence();
	mw_issue_s(sp, dq, dk);
	wg_commit();
	wg_wait0();
	mw_fence_regs(sp, 16);
}

// P V of a tile issued and waited for
__device__ __forceinline__ void mw_pv_now(float *o, const uint32_t (&ph)[2][4], const uint32_t (&pl)[2][4],
					  uint64_t dv)
{
	wg_fence();
	mw_issue_pv(o, ph, pl, dv);
	wg_commit();
	wg_wait0();
	mw_fence_regs(o, 128);
}

// The kernel (see the header): per tile, S, then the softmax, then P V, each waited for. (Run 13:
// a form pipelined across tiles — S of tile t + 1 issued before P V of t, the softmax of t + 1
// while P V of t ran — was slower, 435 against 403 us at 32K x 128, and was removed.)
template <bool PAIR>
__device__ __forceinline__ void mw_decode(const uint16_t *__restrict__ q, const int *__restrict__ sel, int ld_sel,
					  const uint8_t *__restrict__ pool, int H, float scale,
					  uint16_t *__restrict__ o_lat, int keys_per_split, float *__restrict__ part, int diag)
{
	extern __shared__ __align__(16) uint8_t smem_raw[];
	const uint32_t raw_addr = smem_u32(smem_raw), base = (raw_addr + 1023) & ~1023u;
	uint8_t *smem = smem_raw + (base - raw_addr);
	using C = mw_cfg<PAIR>;
	float *xs = reinterpret_cast<float *>(smem + C::XS_OFF);
	const int *ssl = reinterpret_cast<const int *>(smem + C::SSL_OFF);
	const uint32_t bars = base + C::BAR_OFF; // PAIR: mbarriers full[2], empty[2]

	const int tid = threadIdx.x, lane = tid & 31;
	const int b = blockIdx.y, h0 = blockIdx.x * MW_HG;
	const int *srow = sel + (size_t)b * ld_sel;
	const int k_begin = blockIdx.z * keys_per_split;
	const int k_end = min(ld_sel, k_begin + keys_per_split);
	const int nt = k_end > k_begin ? (k_end - k_begin + MW_KT - 1) / MW_KT : 0;

	if (PAIR) {
		if (tid == 0) {
			for (int i = 0; i < 2; i++) {
				mbar_init(bars + 8 * i, 128);         // full[i]: this CTA's producer threads (+ bytes)
				mbar_init(bars + 8 * (2 + i), 2 * 8); // empty[i]: every consumer warp of both CTAs
			}
			asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
		}
		cluster_sync(); // the barriers initialised before any remote arrival
	}
	// launched as the top-k's programmatic dependent (DSV32_MLA_PDL, cuda_attn.c): the set-up
	// above overlaps it; every input (the slots, q, the records) is read past this wait (a no-op
	// in an ordinary launch)
	asm volatile("griddepcontrol.wait;" ::: "memory");

	// registers: the producer needs few, the consumers hold 128 accumulators (ptxas allocates
	// each role's code within its count)
	if (tid >= 256) {
		asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
		mw_produce<PAIR>(srow, k_begin, k_end, nt, pool, smem, bars, diag);
		if (PAIR)
			cluster_sync(); // no CTA leaves while its peer may still write or signal it
		return;
	}
	asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
	const int wg = tid >> 7, wt = tid & 127, wi = wt >> 5, g = lane >> 2, t4 = lane & 3;

	// Q of the block's 64 heads, bf16 -> fp16 into its swizzled column blocks: 64 x 72 chunks,
	// thread tid items tid + 256 i, all 18 loads in flight (one memory round trip)
	if (!(diag & 32)) {
		uint4 v[18];
#pragma unroll
		for (int u = 0; u < 18; u++) {
			const int i = tid + 256 * u, r = i / 72, c = i - 72 * r;
			v[u] = __ldg(reinterpret_cast<const uint4 *>(q + ((size_t)b * H + h0 + r) * MW_DK) + c);
		}
#pragma unroll
		for (int u = 0; u < 18; u++) {
			const int i = tid + 256 * u, r = i / 72, c = i - 72 * r;
			*reinterpret_cast<uint4 *>(smem + mw_chunk(r, c, MW_CB)) =
				make_uint4(bf16x2_to_f16x2(v[u].x), bf16x2_to_f16x2(v[u].y), bf16x2_to_f16x2(v[u].z),
					   bf16x2_to_f16x2(v[u].w));
		}
	}
	fence_proxy_async();
	mw_bar_sync(MW_BAR_CONS, 256);

	// V descriptor strides: 64-dim column blocks MW_KCB apart (N), 8-key groups 1024 apart (K)
	const uint32_t lbo = MW_KCB, sbo = 1024; // (run 12: the strides swapped fail)
	const bool mma = !(diag & 2);
	const float scale2 = scale * 1.44269504088896341f; // log2(e)
	float o[128]; // O_w: register 4j + {0, 1}: head 16 wi + g, dims 256 wg + 8j + 2 t4 + {0, 1}; + {2, 3}: head + 8
#pragma unroll
	for (int i = 0; i < 128; i++)
		o[i] = 0.f;
	mw_soft st = {-INFINITY, -INFINITY, 0.f, 0.f};
	float sp[16] = {}, c0 = 1.f, c1 = 1.f;
	uint32_t ph[2][4] = {}, pl[2][4] = {};
	// descriptors: Q and key buffer 0 at this warpgroup's first k16 step of S, V at its first
	// column block; key buffer 1 is MW_K_BYTES / 16 on
	const uint64_t dq = wgd_kmajor(base + 32 * wg), dk0 = wgd_kmajor(base + MW_Q_BYTES + 32 * wg);
	const uint64_t dv0 = wgd_mnmajor(base + MW_Q_BYTES + wg * 4 * MW_KCB, lbo, sbo);
	// PAIR: after tile t, each consumer warp's arrival on empty[t % 2] of both CTAs
	auto release = [&](int t) {
		__syncwarp();
		if (lane == 0) {
			const uint32_t rank = cluster_rank(), e = bars + 8 * (2 + (t & 1));
			mw_arrive_cl(cl_mapa(e, rank), diag & 128);
			mw_arrive_cl(cl_mapa(e, rank ^ 1), diag & 128);
		}
	};
	// PAIR: tile t's keys in key buffer t % 2 (both CTAs' halves)
	auto acquire = [&](int t) {
		mw_wait_cl(bars + 8 * (t & 1), (t >> 1) & 1, diag & 128);
		if (!(diag & 128)) // (light: the producers' own fences suffice)
			fence_proxy_async(); // (the tile's writes came through the generic proxy, half from the peer)
	};
	// fuse (diag bit 3, with the MMAs): P V of tile t and S of tile t + 1 issued back to back and
	// waited for together (one wait a tile instead of two; tile t + 1's handover taken while P V
	// of t runs); the same operations in the same order
	const bool fuse = (diag & 8) && mma;
	auto take = [&](int t) { // tile t's key buffer
		if (PAIR)
			acquire(t);
		else
			mw_bar_sync(MW_BAR_FULL + (t & 1), MW_THREADS);
	};
	for (int t = 0; t < nt; t++) {
		const int s = t & 1;
		if (!fuse || t == 0)
			take(t);
		if (ssl[t * MW_KT] >= 0) { // else the list ended before this tile: nothing to add
			if (mma && (!fuse || t == 0)) // (without the MMAs sp keeps its zeros: a write here,
				// beside the fused path's S in flight, would make ptxas serialise every wgmma)
				mw_s_now(sp, dq, dk0 + s * (MW_K_BYTES / 16));
			if (!(diag & 16))
				mw_softmax(sp, xs, ssl + t * MW_KT, s, wg, wt, t4, scale2, st, ph, pl, c0, c1);
			mw_rescale(o, c0, c1);
			if (fuse) {
				wg_fence();
				mw_issue_pv(o, ph, pl, dv0 + s * (MW_K_BYTES / 16));
				if (t + 1 < nt) {
					take(t + 1);
					if (ssl[(t + 1) * MW_KT] >= 0)
						mw_issue_s(sp, dq, dk0 + (s ^ 1) * (MW_K_BYTES / 16));
				}
				wg_commit();
				wg_wait0();
				mw_fence_regs(o, 128);
				mw_fence_regs(sp, 16);
			} else if (mma) {
				mw_pv_now(o, ph, pl, dv0 + s * (MW_K_BYTES / 16));
			}
		} else if (fuse && t + 1 < nt) {
			take(t + 1);
		}
		if (t + 2 < nt) { // the producer(s) wait for this buffer before tile t + 2
			if (PAIR) {
				release(t);
			} else {
				mw_bar_arrive(MW_BAR_EMPTY + s, MW_THREADS);
			}
		}
	}
	// the combine (programmatic dependent launch) may start its blocks; they wait for this grid
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

	float l0 = st.l0, l1 = st.l1;
	l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
	l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
	for (int i = 0; i < 2 && !(diag & 64); i++) {
		const int h = h0 + 16 * wi + g + 8 * i;
		const float lr = i ? l1 : l0;
		if (gridDim.z > 1) {
			// part: o [B, H, splits][R], then (m, l) [B, H, splits][2] (k_mla_combine)
			const size_t idx = ((size_t)b * H + h) * gridDim.z + blockIdx.z;
			float *pp = part + idx * MW_R + 256 * wg + 2 * t4;
#pragma unroll
			for (int j = 0; j < 32; j++)
				*reinterpret_cast<float2 *>(pp + 8 * j) = make_float2(o[4 * j + 2 * i], o[4 * j + 2 * i + 1]);
			if (wg == 0 && t4 == 0) {
				float *ml = part + (size_t)gridDim.y * H * gridDim.z * MW_R + 2 * idx;
				ml[0] = (i ? st.m1 : st.m0) * 0.693147180559945309f, ml[1] = lr; // ln 2: natural units
			}
		} else {
			const float inv = lr > 0.f ? 1.f / lr : 0.f;
			uint16_t *out = o_lat + ((size_t)b * H + h) * MW_R + 256 * wg + 2 * t4;
#pragma unroll
			for (int j = 0; j < 32; j++)
				*reinterpret_cast<uint32_t *>(out + 8 * j) =
					(uint32_t)f32_to_bf16(o[4 * j + 2 * i] * inv) |
					((uint32_t)f32_to_bf16(o[4 * j + 2 * i + 1] * inv) << 16);
		}
	}
	if (PAIR)
		cluster_sync();
}

extern "C" __global__ void __launch_bounds__(MW_THREADS, 1)
k_mla_decode_wg(const uint16_t *__restrict__ q, const int *__restrict__ sel, int ld_sel,
		const uint8_t *__restrict__ pool, int rec_bytes, int R, int H, float scale,
		uint16_t *__restrict__ o_lat, int keys_per_split, float *__restrict__ part, int diag)
{
	mw_decode<false>(q, sel, ld_sel, pool, H, scale, o_lat, keys_per_split, part, diag);
}

// The pair: grid x (the 64-head groups) even, CTAs 2 j and 2 j + 1 (the same row and split) a
// cluster sharing the dequantisation of their common keys
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(MW_THREADS, 1)
k_mla_decode_wg2(const uint16_t *__restrict__ q, const int *__restrict__ sel, int ld_sel,
		 const uint8_t *__restrict__ pool, int rec_bytes, int R, int H, float scale,
		 uint16_t *__restrict__ o_lat, int keys_per_split, float *__restrict__ part, int diag)
{
	mw_decode<true>(q, sel, ld_sel, pool, H, scale, o_lat, keys_per_split, part, diag);
}
