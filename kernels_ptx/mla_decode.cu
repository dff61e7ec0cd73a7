// mla_decode.cu — sparse MLA attention of decode rows over the paged FP8 latent cache, in the
// absorbed form (spec §3.7b): for each row b and head h, over the selected keys s in order,
//   score[s] = scale * (q_lat[b,h] . c_kv[s] + q_pe[b,h] . k_pe[s])     (fp32)
//   P = softmax(score),  o_lat[b,h] = bf16( Σ_s P[s] c_kv[s] )
// c_kv is dequantised from the 656-byte record of spec §6.1 (e4m3 x its 128-wide tile's fp32
// power-of-two scale), k_pe read as bf16. The CPU reference is attn_latent (model/cpu_attn.c);
// the q_lat absorption before and the W_UV projection after are GEMMs.
//
// diag (benchmarks only; 0 otherwise): bit 0 skips the gathers after the first tile (the tiles
// reuse its records), bit 1 skips the MMAs of S and P V, bit 2 skips the dequantisation after
// the first tile, bit 5 the load and conversion of Q, bit 6 the output stores — so `dsv32 bench
// attention` can time the phases apart.
// k_mla_decode: q bf16 [B, H, R + 64] per head [q_lat (R) | q_pe (64)], sel int [B, ld_sel]
// physical slots in key order (-1 ends the list), pool: the layer's MLA records (slot r at
// pool + r * rec_bytes), o_lat bf16 [B, H, R]. R % 128 == 0, R <= 512, H % 16 == 0.
//
// Structure (FlashMLA's, on mma.sync): grid (ceil(H / 64), B, splits), 512 threads = 16 warps,
// one block = 64 heads of one row over keys_per_split (a multiple of 64) of its keys. Dynamic
// shared memory (mla_smem_bytes in model/cuda_attn.c): Q [64 heads][R+64] (loaded once), the
// key tile K [64 keys][R+64] (dequantised), P_hi and P_lo [64 heads][64 keys], all fp16, the raw records of
// the next tile [64][rec_bytes] (gathered by slot id with cp.async while the current tile is
// computed), and the softmax exchange. Rows are padded by 16 bytes so ldmatrix hits 8 banks.
// Warp w: head group hg = w % 4 (heads 16 hg .. +16), quarter kq = w / 4. Per tile of 64 keys:
//   1. the raw records (landed) are dequantised into K (rows of invalid keys zeroed), the next
//      tile's gather is issued;
//   2. S = Q K^T (64 x 64, k = R + 64) with mma.m16n8k16 fp16 -> fp32: warp w owns its 16 heads
//      x keys 16 kq .. +16;
//   3. online softmax in fp32: the 4 warps of a head group exchange their row maxima through
//      shared memory (named barrier of 128 threads), p = exp(s - m) split into P_hi = fp16(p) and
//      P_lo = fp16(p - P_hi), the rescale factor e^(m_old - m) of each head into shared memory;
//   4. O += P V with V = the latent part of the same K tile: warp w owns all 64 heads x latent
//      dims w R/16 .. +R/16 (4 m-tiles x R/128 n-tiles, up to 64 fp32 accumulators a thread),
//      so each V fragment is loaded from shared memory once per tile; O += P_hi V + P_lo V.
// (First version: 8 warps, 32 keys and R/2 dims a warp, 128 accumulators: 80-91 TFLOP/s at
// batch 128 on the H200, latency-bound with 2 warps per scheduler.)
// Numerics, where this departs from attn_latent: the operands are fp16, which holds q (bf16),
// k_pe (bf16) and the dequantised c_kv (e4m3 x 2^e) exactly while their magnitudes are in
// [2^-14, 65504] — for c_kv, tile scales 2^-14 .. 2^7, i.e. a tile amax of 0.03 .. 57344 (a
// smaller value goes subnormal and loses low bits; a larger one overflows); the dots are fp32
// tensor-core sums in another order; P enters P V as P_hi + P_lo (two fp16 MMAs on the same V
// fragment), within 2^-22 of p (or 2^-25 absolute where P_lo is an fp16 subnormal), and the
// normaliser l sums the fp32 p; so the weights match the CPU's to fp32 rounding (run 4: P
// rounded to fp16 once, 2^-11, still moved the GPU forward's layer comparisons past their
// 1e-2; bf16, the first version, 2^-9). The split costs a third more MMAs. With more than one split,
// partial (o, m, l) go to `part` and k_mla_combine merges them (FlashDecoding; small batches
// would leave most SMs idle).
#include "common.cuh"
#include "mla.cuh"
#include "mla_combine.cuh"
#include "mma.cuh"

#define MLA_HG 64   // heads per block
#define MLA_KT 64   // keys per tile
#define MLA_ROPE 64 // rope part of a key
#define MLA_PAD 8   // fp16 elements of row padding
#define MLA_PLD (MLA_KT + MLA_PAD)
#define MLA_THREADS 512 // 16 warps: 4 head groups x 4 quarters (of the keys in S, of R in P V)

// the 4 warps of one head group (128 threads)
__device__ __forceinline__ void group_barrier(int id)
{
	asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

#define MLA_KW (MLA_KT / (MLA_THREADS / 32)) // keys of a tile a warp gathers

// The slots of the keys warp w gathers in the tile at k0: keys k0 + w + 16 j (j < MLA_KW), -1 at
// and beyond k_end; loaded a tile ahead, so the gather does not wait on them.
__device__ __forceinline__ void mla_slots(const int *__restrict__ srow, int k0, int k_end, int warp,
					  int slot[MLA_KW])
{
#pragma unroll
	for (int j = 0; j < MLA_KW; j++) {
		const int k = k0 + warp + (MLA_THREADS / 32) * j;
		slot[j] = k < k_end ? srow[k] : -1;
	}
}

// Issue the cp.async gather of the records of a tile's keys (slots from mla_slots; none when
// copy is 0: benchmarks) into raw, and note each key's slot (-1 beyond the list) in sslot[64] for
// the dequantisation. Warp w takes keys w, w + 16, w + 32, w + 48, its lanes the 16-byte chunks
// of each record.
__device__ __forceinline__ void mla_gather(const int slot[MLA_KW], int copy, const uint8_t *__restrict__ pool,
					   int rec_bytes, int RB, uint8_t *raw, int *sslot, int tid)
{
	const int cb = (rec_bytes & 15) == 0 ? 16 : (rec_bytes & 7) == 0 ? 8 : 4;
	const int nch = rec_bytes / cb;
	const int warp = tid >> 5, lane = tid & 31;
#pragma unroll
	for (int j = 0; j < MLA_KW; j++) {
		const int kk = warp + (MLA_THREADS / 32) * j;
		if (lane == 0)
			sslot[kk] = slot[j];
		if (slot[j] < 0 || !copy)
			continue;
		const uint8_t *src = pool + (size_t)slot[j] * rec_bytes;
		uint8_t *dst = raw + kk * RB;
		for (int c = lane; c < nch; c += 32) {
			if (cb == 16)
				cp_async16(smem_u32(dst + c * 16), src + c * 16);
			else if (cb == 8)
				cp_async8(smem_u32(dst + c * 8), src + c * 8);
			else
				cp_async4(smem_u32(dst + c * 4), src + c * 4);
		}
	}
	cp_async_commit();
}

extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1)
k_mla_decode(const uint16_t *__restrict__ q, const int *__restrict__ sel, int ld_sel,
	     const uint8_t *__restrict__ pool, int rec_bytes, int R, int H, float scale,
	     uint16_t *__restrict__ o_lat, int keys_per_split, float *__restrict__ part, int diag)
{
	extern __shared__ __align__(16) uint8_t smem[];
	const int DK = R + MLA_ROPE, LD = DK + MLA_PAD; // fp16 row stride of Q and K
	const int RB = (rec_bytes + 15) & ~15;          // byte stride of the raw records
	uint16_t *qs = reinterpret_cast<uint16_t *>(smem);       // [64 heads][LD]
	uint16_t *ks = qs + MLA_HG * LD;                         // [64 keys][LD]
	uint16_t *ps = ks + MLA_KT * LD;                         // [2][64 heads][MLA_PLD]: P_hi, P_lo
	uint8_t *raw = reinterpret_cast<uint8_t *>(ps + 2 * MLA_HG * MLA_PLD); // [64 keys][RB]
	float *red = reinterpret_cast<float *>(raw + MLA_KT * RB);          // [4][64]
	float *cs = red + 4 * MLA_HG;                                      // [64] this tile's rescale
	int *nval = reinterpret_cast<int *>(cs + MLA_HG);                  // [2]
	int *sslot = nval + 2;                                             // [2][64] the tiles' slots

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int hg = warp & 3, kq = warp >> 2;
	const int b = blockIdx.y, h0 = blockIdx.x * MLA_HG;
	const int *srow = sel + (size_t)b * ld_sel;
	const int k_begin = blockIdx.z * keys_per_split;
	const int k_end = min(ld_sel, k_begin + keys_per_split);

	// Q of the block's 64 heads (zero rows beyond H), every load in flight at once (cp.async),
	// committed with the first tile's gather; warp w: heads w, w + 16, .., its lanes the 16-byte
	// chunks of a row
	for (int r = warp; r < ((diag & 32) ? 0 : MLA_HG); r += MLA_THREADS / 32)
		for (int c = lane; c < DK / 8; c += 32) {
			if (h0 + r < H)
				cp_async16(smem_u32(qs + r * LD + c * 8), q + ((size_t)b * H + h0 + r) * DK + c * 8);
			else
				*reinterpret_cast<uint4 *>(qs + r * LD + c * 8) = make_uint4(0, 0, 0, 0);
		}
	int slot[MLA_KW]; // the next tile's slots of this warp's keys
	mla_slots(srow, k_begin, k_end, warp, slot);
	if (k_begin < k_end)
		mla_gather(slot, 1, pool, rec_bytes, RB, raw, sslot, tid);
	else
		cp_async_commit();

	const int NTW = R / 128;        // n-tiles of 8 latent dims a warp owns in P V (all 64 heads)
	const int dbase = warp * (R / 16); // its first latent dim
	float o[4][4][4];                // [head m-tile][n-tile][fragment]
#pragma unroll
	for (int mt = 0; mt < 4; mt++)
#pragma unroll
		for (int n = 0; n < 4; n++)
			o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
	float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; // rows lane/4 and lane/4 + 8
	const int row0 = 16 * hg + (lane >> 2);                 // this thread's first head in the block

	// ldmatrix addresses (bytes): Q as A (rows = heads), K as B of S (rows = keys, non-trans),
	// P as A, K as B of P V (rows = keys, .trans)
	const uint32_t qa = smem_u32(qs + (16 * hg + (lane & 15)) * LD + (lane >> 4) * 8);
	const uint32_t kb = smem_u32(ks + (16 * kq + (lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8);
	const uint32_t pa = smem_u32(ps + (lane & 15) * MLA_PLD + (lane >> 4) * 8); // + m-tile rows
	const uint32_t vb = smem_u32(ks + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + dbase + (lane >> 4) * 8);
	const int J = R / 8 + MLA_ROPE / 8; // 16-byte fp16 chunks of a key row

	int t = 0;
	for (int k0 = k_begin; k0 < k_end; k0 += MLA_KT, t++) {
		if (tid == 0)
			nval[t & 1] = min(MLA_KT, k_end - k0);
		mla_slots(srow, k0 + MLA_KT, k_end, warp, slot); // in flight through the dequantisation
		cp_async_wait_all();
		__syncthreads(); // raw records of this tile landed; K and P free (last tile consumed)
		if (t == 0 && !(diag & 32)) // Q (landed with the first tile) to fp16 in place, before S
			for (int r = warp; r < MLA_HG; r += MLA_THREADS / 32)
				for (int c = lane; c < DK / 8; c += 32) {
					uint4 *v = reinterpret_cast<uint4 *>(qs + r * LD + c * 8);
					const uint4 x = *v;
					*v = make_uint4(bf16x2_to_f16x2(x.x), bf16x2_to_f16x2(x.y), bf16x2_to_f16x2(x.z),
							bf16x2_to_f16x2(x.w));
				}
		// 1. dequantise: c_kv codes x tile scale, k_pe as is; an invalid key ends the list.
		//    Warp w: keys w, w + 16, w + 32, w + 48; its lanes: the 16-byte chunks of a K row
		for (int kk = warp; kk < ((diag & 4) && t ? 0 : MLA_KT); kk += MLA_THREADS / 32) {
			for (int c = lane; c < J; c += 32) {
				const int slot = sslot[(t & 1) * MLA_KT + kk]; // (-1 beyond k_end)
				uint4 out = make_uint4(0, 0, 0, 0);
				const uint8_t *rp = raw + kk * RB;
				if (slot < 0) {
					if (c == 0)
						atomicMin(&nval[t & 1], kk);
				} else {
					out = mla_record_chunk(rp, c, R);
				}
				*reinterpret_cast<uint4 *>(ks + kk * LD + 8 * c) = out;
			}
		}
		__syncthreads(); // K tile and the valid count visible; raw free
		const int nv = nval[t & 1];
		if (nv == MLA_KT && k0 + MLA_KT < k_end)
			mla_gather(slot, !(diag & 1), pool, rec_bytes, RB, raw, sslot + ((t + 1) & 1) * MLA_KT, tid);
		if (nv == 0)
			break;

		// 2. S = Q K^T for 16 heads x 16 keys
		float s[2][4];
#pragma unroll
		for (int j = 0; j < 2; j++)
			s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
		for (int d0 = 0; d0 < ((diag & 2) ? 0 : DK); d0 += 16) {
			uint32_t a0, a1, a2, a3, b0, b1, b2, b3;
			ldsm_x4(qa + d0 * 2, a0, a1, a2, a3);
			ldsm_x4(kb + d0 * 2, b0, b1, b2, b3);
			mma_f16_16816(s[0], a0, a1, a2, a3, b0, b1);
			mma_f16_16816(s[1], a0, a1, a2, a3, b2, b3);
		}
		// 3. online softmax: scale, mask, row maxima over the 4 warps of the head group
		float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
		for (int j = 0; j < 2; j++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const bool ok = 16 * kq + 8 * j + 2 * (lane & 3) + e < nv;
				s[j][e] = ok ? s[j][e] * scale : -INFINITY;
				s[j][2 + e] = ok ? s[j][2 + e] * scale : -INFINITY;
				mx[0] = fmaxf(mx[0], s[j][e]);
				mx[1] = fmaxf(mx[1], s[j][2 + e]);
			}
#pragma unroll
		for (int i = 0; i < 2; i++) {
			mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
			mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
		}
		if ((lane & 3) == 0)
			red[kq * MLA_HG + row0] = mx[0], red[kq * MLA_HG + row0 + 8] = mx[1];
		group_barrier(1 + hg);
		float corr[2], msub[2];
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = row0 + 8 * i;
			const float tmax = fmaxf(fmaxf(red[r], red[MLA_HG + r]), fmaxf(red[2 * MLA_HG + r], red[3 * MLA_HG + r]));
			const float mnew = fmaxf(m[i], tmax);
			corr[i] = m[i] == -INFINITY ? 0.f : expf(m[i] - mnew);
			msub[i] = mnew == -INFINITY ? 0.f : mnew;
			m[i] = mnew;
			l[i] *= corr[i];
		}
		if (kq == 0 && (lane & 3) == 0)
			cs[row0] = corr[0], cs[row0 + 8] = corr[1];
#pragma unroll
		for (int j = 0; j < 2; j++)
#pragma unroll
			for (int i = 0; i < 2; i++) {
				// the two weights as P_hi + P_lo: fp16(p) and fp16(p - P_hi)
				const float p0 = expf(s[j][2 * i] - msub[i]), p1 = expf(s[j][2 * i + 1] - msub[i]);
				const uint32_t hi = f32x2_to_f16x2(p0, p1);
				const uint32_t lo = f32x2_to_f16x2(p0 - f16_lo(hi), p1 - f16_hi(hi));
				l[i] += p0 + p1;
				const int at = (row0 + 8 * i) * MLA_PLD + 16 * kq + 8 * j + 2 * (lane & 3);
				*reinterpret_cast<uint32_t *>(ps + at) = hi;
				*reinterpret_cast<uint32_t *>(ps + MLA_HG * MLA_PLD + at) = lo;
			}
		__syncthreads(); // all of P and the rescale factors written
		// 4. O += P V over the tile's 64 keys: warp w owns all 64 heads x latent dims
		//    w R/16 .. +R/16 (each V fragment loaded once per tile)
#pragma unroll
		for (int mt = 0; mt < 4; mt++) {
			const float c0 = cs[16 * mt + (lane >> 2)], c1 = cs[16 * mt + (lane >> 2) + 8];
#pragma unroll
			for (int n = 0; n < 4; n++) {
				o[mt][n][0] *= c0, o[mt][n][1] *= c0;
				o[mt][n][2] *= c1, o[mt][n][3] *= c1;
			}
		}
#pragma unroll
		for (int kk = 0; kk < ((diag & 2) ? 0 : MLA_KT / 16); kk++) {
			uint32_t b[2][4]; // V: dims +0..15 and +16..31 of the warp's slice
#pragma unroll
			for (int n2 = 0; n2 < 2; n2++)
				if (2 * n2 < NTW)
					ldsm_x4_t(vb + (16 * kk * LD + 16 * n2) * 2, b[n2][0], b[n2][1], b[n2][2], b[n2][3]);
#pragma unroll
			for (int mt = 0; mt < 4; mt++)
#pragma unroll
				for (int part = 0; part < 2; part++) { // P_hi, then P_lo, on the same V
					uint32_t a0, a1, a2, a3;
					ldsm_x4(pa + (part * MLA_HG * MLA_PLD + 16 * mt * MLA_PLD + kk * 16) * 2, a0, a1, a2, a3);
#pragma unroll
					for (int n2 = 0; n2 < 2; n2++) {
						if (2 * n2 < NTW)
							mma_f16_16816(o[mt][2 * n2], a0, a1, a2, a3, b[n2][0], b[n2][1]);
						if (2 * n2 + 1 < NTW)
							mma_f16_16816(o[mt][2 * n2 + 1], a0, a1, a2, a3, b[n2][2], b[n2][3]);
					}
				}
		}
		if (nv < MLA_KT)
			break;
	}
	cp_async_wait_all();
	// the combine (launched with programmatic stream serialisation) may start its blocks now;
	// they wait in griddepcontrol.wait until this grid has completed and its writes are visible
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

	// the normaliser: the quad's partial sums, then the 4 warps of the group in a fixed order
#pragma unroll
	for (int i = 0; i < 2; i++) {
		l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
		l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
	}
	__syncthreads();
	if ((lane & 3) == 0)
		red[kq * MLA_HG + row0] = l[0], red[kq * MLA_HG + row0 + 8] = l[1];
	__syncthreads();
	// m and l of each head (the S warps of quarter 0 hold m), then the outputs of this warp's
	// dims for all 64 heads
	if (kq == 0 && (lane & 3) == 0)
		cs[row0] = m[0], cs[row0 + 8] = m[1];
	__syncthreads(); // m visible
#pragma unroll
	for (int mt = 0; mt < 4; mt++)
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = 16 * mt + (lane >> 2) + 8 * i, h = h0 + r;
			if (h >= H || (diag & 64))
				continue;
			const float lr = ((red[r] + red[MLA_HG + r]) + red[2 * MLA_HG + r]) + red[3 * MLA_HG + r];
			if (gridDim.z > 1) {
				// part: the unnormalised o [B, H, splits][R], then (m, l) [B, H, splits][2]:
				// o's rows stay 32-byte aligned, so each quad's store is one whole sector (rows
				// of R + 2 floats left every store straddling two sectors: run 9, 9 of the 23
				// us of batch 1's decode kernel)
				const size_t idx = ((size_t)b * H + h) * gridDim.z + blockIdx.z;
				float *pp = part + idx * R;
#pragma unroll
				for (int n = 0; n < 4; n++)
					if (n < NTW)
						*reinterpret_cast<float2 *>(pp + dbase + 8 * n + 2 * (lane & 3)) =
							make_float2(o[mt][n][2 * i], o[mt][n][2 * i + 1]);
				if (warp == 0 && (lane & 3) == 0) {
					float *ml = part + (size_t)gridDim.y * H * gridDim.z * R + 2 * idx;
					ml[0] = cs[r], ml[1] = lr;
				}
			} else {
				const float inv = lr > 0.f ? 1.f / lr : 0.f;
				uint16_t *out = o_lat + ((size_t)b * H + h) * R + dbase + 2 * (lane & 3);
#pragma unroll
				for (int n = 0; n < 4; n++)
					if (n < NTW)
						*reinterpret_cast<uint32_t *>(out + 8 * n) =
							(uint32_t)f32_to_bf16(o[mt][n][2 * i] * inv) |
							((uint32_t)f32_to_bf16(o[mt][n][2 * i + 1] * inv) << 16);
			}
		}
}

// Merges the splits of k_mla_decode (FlashDecoding; launched as its programmatic dependent, so its
// blocks are resident when the decode grid ends): mla_combine.cuh's merge, one block per (head,
// row), R threads (splits <= 64): warp 0 computes the weights once into shared memory, then every
// thread sums its output element over the splits in order.
extern "C" __global__ void __launch_bounds__(512)
k_mla_combine(const float *__restrict__ part, int splits, int R, uint16_t *__restrict__ o_lat)
{
	__shared__ float wsh[MLA_MAX_SPLITS];
	__shared__ float s_L;
	// its own dependents (the forward's next kernel, PDL-launched) may start now: they wait in
	// their griddepcontrol.wait for this grid's completion
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	// launched early (programmatic dependent launch, cuda_attn.c): the partials of the decode
	// kernel are complete and visible past this point (a no-op in an ordinary launch)
	asm volatile("griddepcontrol.wait;" ::: "memory");
	const size_t bh = blockIdx.x; // b * H + h
	const int tid = threadIdx.x;
	if (tid < 32)
		mla_combine_weights(part, splits, R, bh, gridDim.x, wsh, &s_L);
	__syncthreads(); // weights and L visible
	if (tid < R)
		o_lat[bh * R + tid] = mla_combine_elem(part, splits, R, bh, tid, wsh, s_L);
}
