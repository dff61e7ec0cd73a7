// moe_block.cu — the pieces of the MoE block (spec §3.9) around the expert GEMMs: the router
// logits, the gather of the quantised rows by expert, SwiGLU fused with the act_quant of the
// down projection's input, and the vectorised combine. Launchers: model/cuda_moe.c.
//
// k_moe_gate_logits_a8, _a2: logits fp32 [T, E] = x bf16 [T, D] · W bf16 [E, D]^T in the CPU's
//   summation order (model/cpu_ops.c cpu_dot_bf16): eight partial sums, partial j adding the
//   products of k = j, j+8, j+16, ... in ascending k, then the fixed tree
//   ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)). A bf16 x bf16 product is exact in fp32, so the FMA
//   equals the CPU's multiply-then-add, and the logits are bit-identical to the CPU's: the
//   routing agrees even at near ties. D % 128 == 0, E % 2 == 0. Decode sizes; see below.
// k_moe_gate_route1: the logits of one token (cuda_moe.c's router at T = 1, the real routing
//   shape E = 256 in 8 groups), then its last block to finish routes it (moe_route_select256:
//   k_moe_route_w's numbers) and permutes the rows (moe_permute_one: k_moe_permute's in closed
//   form) — three launches in one. It also writes the K + 1 quantised input rows xs8 e4m3
//   [K + 1, D], sxs fp32 [K + 1, D/128] (all act_quant(x[0]): k_moe_quant_scatter's bits), so the
//   block skips the gather. The last block is found by a device counter that every block
//   increments after a fence on its outputs (g_gate1_done; the last block resets it, so each
//   launch, and each replay of a captured graph, starts from 0: one such launch at a time per
//   GPU, as the engine's one stream runs them). See below.
// k_moe_gate_route1s: the same outputs in the fast mode, the logits summed in another fp32 order
//   (each still the CPU's exact products; the order fixed) over E / 2 blocks, so every SM reads
//   its share of the weights at once. See below.
// k_moe_gate_route_t: route1s's logits for 2 .. 16 tokens (the same bits a token), then its last
//   block routes and permutes them all (k_moe_route_w's and k_moe_permute's numbers): the fast
//   mode's few-token router. See below.
// k_moe_gate_logits_tiled, _t64: the same numbers for many tokens (E % 32 == 0, D % 64 == 0),
//   a 32 (_t64: 64) tokens x 32 experts tile per block, grid (E / 32, ceil(T / 32 or 64)),
//   GT_SMEM(32 or 64) bytes of dynamic shared memory; see below.
// (The fast mode's logits for many tokens on the tensor cores: moe_gate_mma.cu.)
// k_moe_gather_q: xs8[r] = x8[src[r]] (e4m3 [.., D]) and sxs[r] = sx[src[r]] (fp32 [.., D/128]):
//   the quantised input rows in expert-sorted order (quantising x once then gathering gives the
//   numbers of quantising each gathered row). One warp per sorted row, 8 a block; D % 16 == 0.
// k_moe_quant_scatter: the same rows quantised straight from x, each x row once: act_quant of
//   x[t] (T rows, D % 128 == 0) into row R + t (the shared expert's) and copied to its K sorted
//   rows perm[t * K + n] (k_moe_permute's), codes and scales: k_act_quant + k_moe_gather_q's
//   bytes with one read of x and no read of the quantised rows. One warp per (token, 128-group),
//   8 a block; K <= 32. Waits (griddepcontrol.wait) before any read: launched with PDL behind
//   k_moe_gate_route_t.
// k_moe_swiglu_quant: h = bf16( silu(g) * u ) of the fused gate|up output gu bf16 [R, 2I]
//   (gate columns first), then act_quant per 128 (spec §5.3) -> h8 e4m3 [R, I], hs fp32
//   [R, I/128]: the CPU's cpu_swiglu followed by the cpu_act_quant inside cpu_fp8_linear.
//   A half-warp per 128-group (8 values a lane), a warp two groups of a row, 8 warps a block,
//   pairs in steps of the grid (any grid). With `table` each block first makes a table of silu
//   for the common bf16 codes of g (sq_group: the same bits as the expression), for grids of a
//   few blocks an SM (model/cuda_moe.c); else one pair a warp ((groups + 15) / 16 blocks).
// k_moe_combine_v8: k_moe_combine (moe_permute.cu: y = bf16( sum of the weighted expert rows
//   in pick order + shared ), bit-identical to the CPU's moe_combine) with 8 outputs per thread
//   and 16-byte loads (D % 8 == 0); the same arithmetic per output. Grid-stride over T * D / 8.
//   Launched with PDL: it triggers its dependents at once and waits before any read.
// k_moe_combine_rank: one rank's share of the combine under expert parallelism (docs/MULTIGPU.md
//   step 3), fp32 [T, D]: the weighted rows of the rank's own picks in pick order, + the shared
//   expert's row where sh is given (the rank that holds it), not rounded: the CPU's
//   moe_forward_rank, the same arithmetic as k_moe_combine_v8 a pick. A pick is the rank's iff
//   its sorted row is at or past *first (k_moe_rank_picks sorts the other ranks' picks before
//   the rank's rows). PDL as k_moe_combine_v8.
#include "common.cuh"
#include "moe_route.cuh" // the fused routers: moe_route_*, moe_permute_*
#include "tma.cuh"       // mbarriers (k_moe_gate_route1)

// k_moe_gate_logits_a8 / _a2 / _a2l: the chunks of K are brought in by cp.async into a ring of S
// stages (S - 1 chunks in flight; run 3 measured a one-chunk register prefetch at 35 us for one
// token: each of the 56 chunks waited for its loads). Staged as bf16, converted
// when read. NQ threads share one (token, expert), each running partials PP = 8 / NQ of them
// (q * PP .. q * PP + PP - 1); a block is TS = 128 / NQ token rows x 2 experts (a8: 16 rows,
// one partial a thread, for few tokens; a2: 64 rows, 4 partials a thread, one 8-byte read of x
// and of W per 4 products). Dynamic shared memory S * (TS + 2) * (2 KC + 16) bytes; grid (E / 2,
// ceil(T / TS)); D % KC == 0. The thread's own partials are added as (p0+p1)+(p2+p3), then
// shuffles across the NQ lanes: exactly the tree of the CPU.
// KC: the K chunk (elements); a staged row is KC * 2 + 16 bytes (consecutive rows 4 banks apart)

template <int NQ, int S, int KC>
__device__ __forceinline__ void gate_logits_async(const uint16_t *__restrict__ W,
						  const uint16_t *__restrict__ x,
						  float *__restrict__ logits, int T, int E, int D)
{
	constexpr int PP = 8 / NQ, TS = 128 / NQ, ROWB = KC * 2 + 16, STAGE = (TS + 2) * ROWB;
	extern __shared__ __align__(16) unsigned char ga_ring[]; // [S][TS + 2][ROWB]
	const int tid = threadIdx.x, q = tid % NQ, slot = (tid / NQ) % TS, el = tid / (NQ * TS);
	const int e0 = blockIdx.x * 2, t0 = blockIdx.y * TS;
	const int rows = min(TS, T - t0);
	const bool active = slot < rows; // whole warps idle past the last token: no reads
	const int nc = D / KC;
	// chunk c into stage c % S: the block's token rows (stage rows 0 .. rows-1) and its 2
	// expert rows (stage rows TS, TS+1), 16 bytes a copy; one commit group per chunk slot
	auto issue = [&](int c) {
		if (c < nc) {
			unsigned char *st = ga_ring + (size_t)(c % S) * STAGE;
			const int n = (rows + 2) * (KC / 8);
			for (int i = tid; i < n; i += 256) {
				const int r = i / (KC / 8), c16 = i % (KC / 8);
				const uint16_t *src = r < rows ? x + (size_t)(t0 + r) * D
							       : W + (size_t)(e0 + r - rows) * D;
				const int srow = r < rows ? r : TS + r - rows;
				cp_async16(smem_u32(st + (size_t)srow * ROWB + 16 * c16),
					   src + (size_t)c * KC + 8 * c16);
			}
		}
		asm volatile("cp.async.commit_group;" ::: "memory");
	};
#pragma unroll
	for (int c = 0; c < S - 1; c++)
		issue(c);
	float p[PP];
#pragma unroll
	for (int m = 0; m < PP; m++)
		p[m] = 0.f;
	for (int c = 0; c < nc; c++) {
		asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory"); // chunk c: mine
		__syncthreads(); // chunk c: everyone's; chunk c-1 read by all (its stage is refilled)
		issue(c + S - 1);
		if (active) {
			const unsigned char *st = ga_ring + (size_t)(c % S) * STAGE;
			const unsigned char *xr = st + (size_t)slot * ROWB + 2 * PP * q;
			const unsigned char *wr = st + (size_t)(TS + el) * ROWB + 2 * PP * q;
#pragma unroll
			for (int k = 0; k < KC / 8; k++) { // exact products: fma == mul, then add
				if (PP == 4) {
					const uint2 a = *reinterpret_cast<const uint2 *>(xr + 16 * k);
					const uint2 b = *reinterpret_cast<const uint2 *>(wr + 16 * k);
					p[0] = fmaf(__uint_as_float(a.x << 16), __uint_as_float(b.x << 16), p[0]);
					p[1 % PP] = fmaf(__uint_as_float(a.x & 0xffff0000u),
							 __uint_as_float(b.x & 0xffff0000u), p[1 % PP]);
					p[2 % PP] = fmaf(__uint_as_float(a.y << 16), __uint_as_float(b.y << 16),
							 p[2 % PP]);
					p[3 % PP] = fmaf(__uint_as_float(a.y & 0xffff0000u),
							 __uint_as_float(b.y & 0xffff0000u), p[3 % PP]);
				} else {
					const uint32_t a = *reinterpret_cast<const uint16_t *>(xr + 16 * k);
					const uint32_t b = *reinterpret_cast<const uint16_t *>(wr + 16 * k);
					p[0] = fmaf(__uint_as_float(a << 16), __uint_as_float(b << 16), p[0]);
				}
			}
		}
	}
	asm volatile("cp.async.wait_all;" ::: "memory");
	float v = PP == 4 ? (p[0] + p[1 % PP]) + (p[2 % PP] + p[3 % PP]) : p[0];
#pragma unroll
	for (int o = 1; o < NQ; o <<= 1) // the rest of the tree across the NQ lanes
		v += __shfl_xor_sync(0xffffffffu, v, o);
	if (q == 0 && active)
		logits[(size_t)(t0 + slot) * E + e0 + el] = v;
}

// The router-logit entry points: each one of the templates above or below over the same
// arguments, W bf16 [E, D], x bf16 [T, D], logits fp32 [T, E]. bounds: __launch_bounds__'s
// arguments, parenthesised; the rest: the template (its own commas allowed).
#define GATE_LOGITS_KERNEL(name, bounds, ...)                                                  \
	extern "C" __global__ void __launch_bounds__ bounds name(                               \
		const uint16_t *__restrict__ W, const uint16_t *__restrict__ x,                   \
		float *__restrict__ logits, int T, int E, int D)                                  \
	{                                                                                       \
		__VA_ARGS__(W, x, logits, T, E, D);                                               \
	}

#define GA8_S 6 // a8: 6 stages of K chunks of 512 (D % 512 == 0): few barriers for one token
#define GA8_KC 512
#define GA2_S 6 // a2: 6 stages of 128 (D % 128 == 0)
#define GA2_KC 128
#define GA2L_S 3 // a2l: 3 stages of 512 (D % 512 == 0): a quarter of a2's barriers
#define GA2L_KC 512
GATE_LOGITS_KERNEL(k_moe_gate_logits_a8, (256), gate_logits_async<8, GA8_S, GA8_KC>)
GATE_LOGITS_KERNEL(k_moe_gate_logits_a2, (256), gate_logits_async<2, GA2_S, GA2_KC>)
GATE_LOGITS_KERNEL(k_moe_gate_logits_a2l, (256), gate_logits_async<2, GA2L_S, GA2L_KC>)

// ---- k_moe_gate_route1: the router of one token (see the file header) --------------------------
// The logits of k_moe_gate_logits_a8 (the CPU's 8 partials, each a chain of D / 8 FMAs in
// ascending k, then the fixed tree) spread over E / 8 blocks: lane (expert e0 + 4 (warp) +
// lane / 8, partial j = lane % 8) of warps 0 and 1 runs one chain, the chains of a warp
// independent. The chains are the floor (D / 8 dependent FMAs); everything else overlaps them or
// is short: lanes 0-7 of warp 0 bring the block's 8 weight rows into shared memory by 1-D bulk
// copies, all issued at once (before griddepcontrol.wait: the weights are constants), in chunks
// of GR1_KC elements with one mbarrier each (armed first by lane 0; a chain starts on chunk 0
// while the rest land); x is staged as fp32 split by partial, xs[j][c] = x[8c + j] (rows
// XR = D/8 + 4 floats: 4 banks apart), so 4 steps of a chain read x in one 16-byte load; the
// weight rows are WR = 2D + 16 bytes apart (4 banks), so the 4 experts of a warp read distinct
// banks; x's pieces are all loaded before any is stored (one memory round trip after the wait).
// Warp 2 quantises 128-groups of x (read from xs) into all K + 1 input rows meanwhile
// (act_quant(x[0]) whatever the routing: k_moe_quant_scatter's bits), so the block needs no
// gather. The lane that
// finishes a logit also computes its scores (the double-precision sigmoid, and sel = sc + bias)
// into scores fp32 [2][E]; the last block to finish (g_gate1_done) only selects, by warp 0
// (moe_route_select256), and permutes (moe_permute_one, from the picks in registers). (Run 12:
// 14.4 us graph-replayed, when
// the last block computed the scores and every warp quantised its group K + 1 times before its
// chain.) E = 256 in 8 groups (moe_route_select256's shape), D % GR1_KC == 0, D <= GR1_KC *
// GR1_MAXC. Grid E / 8, GR1_THREADS = 96 threads, dynamic shared memory 8 * GR1_MAXC +
// 32 * (D / 8 + 4) + 8 * (2 D + 16) bytes (model/cuda_moe.c).
// (Run 17: a form with 4 experts a block, 64 blocks, took 10.7 us against this one's 10.5; the
// x loads in one round trip, the quantiser reading xs and the permutation from registers did
// not move it either, 10.6 -> 10.5.)
#define GR1_KC 512     // elements of a weight row a chunk (one mbarrier)
#define GR1_EPB 8      // experts a block
#define GR1_THREADS 96 // warps 0-1: the chains; warp 2: the quantised rows
#define GR1_MAXC 16    // chunks at most (D <= 8192)
__device__ unsigned g_gate1_done = 0; // blocks of the running k_moe_gate_route1 that are done

// bytes (a multiple of 16) from global src to shared dst, completing on the mbarrier bar
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes,
					  uint32_t bar)
{
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
		     " [%0], [%1], %2, [%3];" ::"r"(dst),
		     "l"(src), "r"(bytes), "r"(bar)
		     : "memory");
}

// The K + 1 quantised input rows of the one-token routers, for x's 128-group gi by one warp
// (v: this lane's 4 values, x[gi * 128 + 4 lane ..]): act_quant into row 0 (xs8 e4m3 [K + 1, D],
// sxs fp32 [K + 1, D / 128]), its codes (this lane's 4, read back) and scale copied to rows
// 1 .. K — k_moe_quant_scatter's bits.
__device__ __forceinline__ void gate1_quant_rows(const float v[4], int gi, uint8_t *__restrict__ xs8,
						 float *__restrict__ sxs, int D, int K, int lane)
{
	const int KB = D / 128;
	const float sc = warp_act_quant128_regs(v, xs8 + gi * 128, lane);
	const uint32_t q = *reinterpret_cast<const uint32_t *>(xs8 + gi * 128 + lane * 4);
	for (int row = 1; row <= K; row++)
		*reinterpret_cast<uint32_t *>(xs8 + (size_t)row * D + gi * 128 + lane * 4) = q;
	for (int row = lane; row <= K; row += 32)
		sxs[(size_t)row * KB + gi] = sc;
}

// The end of the one-token routers, by warp 0 of every block once the block's scores are
// written and fenced (__threadfence, then a barrier or __syncwarp over the writers): counts the
// block done (g_gate1_done); the last block to finish selects (moe_route_select256, from the
// scores fp32 [2][E] read through L2) and permutes (moe_permute_one, from the picks in
// registers), then resets the count for the next launch (stream order).
__device__ __forceinline__ void gate1_route_last(const float *scores, int E, int topk_group, int K,
						 int norm_topk_prob, float route_scale, int *idx,
						 float *__restrict__ wts, int *__restrict__ counts,
						 int *__restrict__ offsets, int *__restrict__ perm,
						 int *__restrict__ src)
{
	const int lane = threadIdx.x & 31;
	unsigned prev = 0;
	if (lane == 0)
		prev = atomicAdd(&g_gate1_done, 1u);
	if (__shfl_sync(0xffffffffu, prev, 0) != gridDim.x - 1)
		return;
	__threadfence(); // every block's scores (read through L2) after their counts
	float sc[8], sel[8];
	moe_route_load256(scores, E, sc, sel, lane);
	const int pick = moe_route_select256(sc, sel, 0, topk_group, K, norm_topk_prob, route_scale,
					     idx, wts);
	moe_permute_one(pick, K, E, counts, offsets, perm, src);
	if (lane == 0)
		g_gate1_done = 0; // for the next launch (stream order)
}

// The one-token routers' parameters (every form's) and the same names as arguments.
#define GATE1_PARAMS                                                                           \
	const uint16_t *__restrict__ W, const uint16_t *__restrict__ x, float *logits, int E,     \
		int D, const float *__restrict__ bias, int topk_group, int K, int norm_topk_prob, \
		float route_scale, int *idx, float *__restrict__ wts, int *__restrict__ counts,   \
		int *__restrict__ offsets, int *__restrict__ perm, int *__restrict__ src,         \
		uint8_t *__restrict__ xs8, float *__restrict__ sxs, float *scores, unsigned *x_ready
#define GATE1_ARGS                                                                             \
	W, x, logits, E, D, bias, topk_group, K, norm_topk_prob, route_scale, idx, wts, counts,   \
		offsets, perm, src, xs8, sxs, scores, x_ready

extern "C" __global__ void __launch_bounds__(GR1_THREADS, 1) k_moe_gate_route1(GATE1_PARAMS)
{
	constexpr int EPB = GR1_EPB, CW = EPB / 4; // CW warps of chains; warp CW quantises
	extern __shared__ __align__(16) unsigned char gr1_smem[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int nc = D / GR1_KC, XR = D / 8 + 4, WR = 2 * D + 16;
	const uint32_t bars = smem_u32(gr1_smem);
	float *xs = reinterpret_cast<float *>(gr1_smem + 8 * GR1_MAXC);
	unsigned char *ws = gr1_smem + 8 * GR1_MAXC + 32 * XR;
	const int e0 = blockIdx.x * EPB;
	if (warp == 0) { // lane 0 arms the barriers, then lane r < EPB copies weight row r
		if (lane == 0) {
			for (int c = 0; c < nc; c++)
				mbar_init(bars + 8 * c, 1);
			asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::
					     : "memory");
			for (int c = 0; c < nc; c++)
				mbar_arrive_expect_tx(bars + 8 * c, EPB * GR1_KC * 2);
		}
		__syncwarp();
		if (lane < EPB)
			for (int c = 0; c < nc; c++)
				bulk_copy(smem_u32(ws + lane * WR + c * GR1_KC * 2),
					  W + (size_t)(e0 + lane) * D + c * GR1_KC, GR1_KC * 2, bars + 8 * c);
	}
	// the next kernel (the grouped GEMM, launched with PDL) may start its prologue; it reads
	// this grid's outputs only after its griddepcontrol.wait (this grid complete). This grid,
	// launched with PDL (model/cuda_moe.c), has read and written nothing but its weight rows
	// and shared memory before the wait: x is the previous kernel's output
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	asm volatile("griddepcontrol.wait;" ::: "memory");
	// x as fp32 split by partial: xs[j * XR + c] = x[8c + j]; a thread's 16-byte pieces all
	// loaded first (one memory round trip on the critical path, not one per piece)
	constexpr int XP = (GR1_MAXC * GR1_KC / 8 + GR1_THREADS - 1) / GR1_THREADS;
	uint4 xv[XP];
#pragma unroll
	for (int i = 0; i < XP; i++) {
		const int c = tid + i * GR1_THREADS;
		if (c < D / 8)
			xv[i] = __ldca(reinterpret_cast<const uint4 *>(x) + c); // (not __ldg: see gate1s_load)
	}
#pragma unroll
	for (int i = 0; i < XP; i++) {
		const int c = tid + i * GR1_THREADS;
		const uint32_t w4[4] = {xv[i].x, xv[i].y, xv[i].z, xv[i].w};
#pragma unroll
		for (int h = 0; h < 4 && c < D / 8; h++) {
			xs[(2 * h) * XR + c] = __uint_as_float(w4[h] << 16);
			xs[(2 * h + 1) * XR + c] = __uint_as_float(w4[h] & 0xffff0000u);
		}
	}
	__syncthreads(); // xs staged; the barriers initialised
	if (warp == CW) {
		// the K + 1 quantised input rows, beside the chains: a 128-group at a time (its values
		// from the staged xs, x[k] = xs[(k % 8) * XR + k / 8]: no global read)
		for (int gi = blockIdx.x; gi < D / 128; gi += gridDim.x) {
			const int k = gi * 128 + 4 * lane, c = k >> 3, j0 = k & 7; // j0: 0 or 4
			const float v[4] = {xs[j0 * XR + c], xs[(j0 + 1) * XR + c], xs[(j0 + 2) * XR + c],
					    xs[(j0 + 3) * XR + c]};
			gate1_quant_rows(v, gi, xs8, sxs, D, K, lane);
		}
	}
	const int el = (warp & (CW - 1)) * 4 + (lane >> 3), j = lane & 7;
	const unsigned char *wr = ws + el * WR + 2 * j;
	const float *xr = xs + j * XR;
	float p = 0.f;
	for (int c = 0; c < nc && warp < CW; c++) {
		mbar_wait(bars + 8 * c, 0); // chunk c of the 8 rows landed
#pragma unroll
		for (int m = 0; m < GR1_KC / 32; m++) { // 4 steps (k = 8s + j) a float4 of x
			const int s0 = c * (GR1_KC / 8) + 4 * m;
			const float4 xv = *reinterpret_cast<const float4 *>(xr + s0);
			const float xq[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
			for (int q = 0; q < 4; q++) // exact products: fma == multiply, then add
				p = fmaf(bf16_to_f32(*reinterpret_cast<const uint16_t *>(wr + 16 * (s0 + q))),
					 xq[q], p);
		}
	}
	// the CPU's tree over the 8 partials: ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7))
	p += __shfl_xor_sync(0xffffffffu, p, 1);
	p += __shfl_xor_sync(0xffffffffu, p, 2);
	p += __shfl_xor_sync(0xffffffffu, p, 4);
	// the logit, and its scores for the routing (the sigmoid in double, sel = sc + bias) into
	// scores [2][E], so the last block only selects
	if (j == 0 && warp < CW) {
		const int e = e0 + el;
		const float sg = route_sigmoid(p);
		logits[e] = p;
		scores[e] = sg;
		scores[E + e] = bias ? sg + bias[e] : sg;
	}
	__threadfence(); // this thread's scores are visible device-wide before the count says so
	__syncthreads();
	if (warp == 0)
		gate1_route_last(scores, E, topk_group, K, norm_topk_prob, route_scale, idx, wts, counts,
				 offsets, perm, src);
}

// ---- k_moe_gate_route1s: the fast mode's router of one token (see the file header) --------------
// k_moe_gate_route1's outputs (the routing, the permutation, the K + 1 quantised rows, logits and
// scores) with each logit summed in another fp32 order (the fast mode's, like
// k_moe_gate_logits_mma's: the CPU's exact bf16 x bf16 products; the order fixed, so the same
// bits every launch, and the same for every EPB) and the weights read by every SM at once:
// route1's 32 blocks each pull 115 KB and run 896-step FMA chains; here E / EPB blocks of
// 128 EPB threads, each 128 threads one expert: thread t of an expert holds the 16-byte pieces
// t, t + 128, ... of its weight row (D / 1024 pieces, all loaded before griddepcontrol.wait: the
// weights are constants, so under PDL they stream while the kernel before finishes) and of x
// (after the wait), sums its 8 x D / 1024 products in two fp32 chains (even and odd elements of
// a piece, pieces in ascending order), then the warp's lanes by a shuffle tree (xor 16 .. 1) and
// the expert's 4 warps as (w0 + w1) + (w2 + w3). Lanes n < EPB of warp 0 write the logits of
// experts EPB blockIdx.x + n and their scores (gate1_route_last: the last block routes and
// permutes); warp 1 quantises x's groups gi = blockIdx.x + m gridDim.x into the K + 1 input rows
// (gate1_quant_rows: x read from global). EPB = GR1S_EPB = 2 (run 25, bench moe T = 1: gate
// 6.4 us; 6.5 with 1 expert a block (256 blocks) or 4 (64 blocks), the same bits). A form with
// the routing in a second launch by PDL (session 7, run 27: -2..-6.5 us a step) gave
// non-finite logits at real dimensions (run 28) and was removed.
// E = 256 in 8 groups (moe_route_select256's shape), E % EPB == 0, D % 1024 == 0,
// D <= 1024 * GR1S_MAXP. Grid E / EPB, 128 EPB threads, no dynamic shared memory.
#define GR1S_MAXP 8 // 16-byte pieces a thread at most (D <= 8192)
#define GR1S_EPB 2  // experts a block

// The fast routers' row pieces: thread t's 16-byte pieces t, t + 128, ... of a row of D bf16
// (np = D / 1024 of them). WEIGHTS: a weight row (constant), by the non-coherent path (__ldg),
// before griddepcontrol.wait; else an activation row x by ordinary loads (ld.global.ca). Under
// PDL this grid is resident while the kernel before it writes x, so x is not read-only for this
// grid's lifetime and __ldg is not allowed for it: ptxas moved one of x's __ldg loads above
// griddepcontrol.wait in k_moe_gate_logits1s (SASS: LDG.E.128.CONSTANT before ACQBULK), and
// launched under PDL it read the norm's output before the norm had finished whenever the two
// overlapped (s24: the forward's graph and eager decode steps gave other logits; eager steps
// with profile events between the kernels, which keep them apart, agreed with a plain launch).
// Ordinary loads stay after the wait. (s24-6, bench moe 1-4 tokens: the same time as __ldg and
// as ld.global.cg, within 0.5 us.)
template <bool WEIGHTS>
__device__ __forceinline__ void gate1s_load(uint4 (&v)[GR1S_MAXP], const uint16_t *row, int t, int np)
{
	const uint4 *p = reinterpret_cast<const uint4 *>(row) + t;
#pragma unroll
	for (int m = 0; m < GR1S_MAXP; m++)
		if (m < np)
			v[m] = WEIGHTS ? __ldg(p + 128 * m) : __ldca(p + 128 * m);
}

// The fast routers' products of one token by one warp: each lane's pieces of its expert's weight
// row (wv) and of x (xv) in two fp32 chains (even, odd elements of a piece; pieces in ascending
// order; exact products: fma == multiply, then add), then the lanes by a shuffle tree (xor 16 ..
// 1). Every lane returns the warp's sum.
__device__ __forceinline__ float gate1s_warp_dot(const uint4 (&wv)[GR1S_MAXP],
						 const uint4 (&xv)[GR1S_MAXP], int np)
{
	float a0 = 0.f, a1 = 0.f;
#pragma unroll
	for (int m = 0; m < GR1S_MAXP; m++)
		if (m < np) {
			const uint32_t ww[4] = {wv[m].x, wv[m].y, wv[m].z, wv[m].w};
			const uint32_t xw[4] = {xv[m].x, xv[m].y, xv[m].z, xv[m].w};
#pragma unroll
			for (int i = 0; i < 4; i++) {
				a0 = fmaf(__uint_as_float(ww[i] << 16), __uint_as_float(xw[i] << 16), a0);
				a1 = fmaf(__uint_as_float(ww[i] & 0xffff0000u),
					  __uint_as_float(xw[i] & 0xffff0000u), a1);
			}
		}
	float v = a0 + a1;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

// The logit of expert en from its 4 warps' sums r[0 .. 3], (w0 + w1) + (w2 + w3), and its
// scores (the double-precision sigmoid; sel = sc + bias) into sc_row fp32 [2][E]
__device__ __forceinline__ void gate1s_logit(const float *r, int en, int E, const float *bias,
					     float *logits, float *sc_row)
{
	const float p = (r[0] + r[1]) + (r[2] + r[3]);
	const float sg = route_sigmoid(p);
	logits[en] = p;
	sc_row[en] = sg;
	sc_row[E + en] = bias ? sg + bias[en] : sg;
}

// TAIL false (k_moe_gate_logits1s): the logits, scores and rows only; the routing is the next
// kernel's (k_moe_gemv_block's blocks each select from the scores, gemm_fp8_gemv.cu; the _r1
// forms also quantise x themselves, after x_ready)
template <int EPB, bool TAIL> __device__ __forceinline__ void gate_route1s(GATE1_PARAMS)
{
	__shared__ float red[4 * EPB];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int h = tid >> 7, t = tid & 127, np = D / 1024;
	const int e = blockIdx.x * EPB + h;
	uint4 wv[GR1S_MAXP];
	gate1s_load<true>(wv, W + (size_t)e * D, t, np);
	// the next kernel (launched with PDL) may start its prologue; this grid, launched with PDL
	// (model/cuda_moe.c), has read nothing but its weights before the wait: x is the previous
	// kernel's output
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	asm volatile("griddepcontrol.wait;" ::: "memory");
	// x_ready (k_moe_gate_logits1s before k_moe_gemv_block_r1): x is complete, which that
	// kernel's blocks wait for (instead of this grid's end) before they read it
	if (!TAIL && x_ready && blockIdx.x == 0 && tid == 0)
		asm volatile("st.release.gpu.global.u32 [%0], 1;" ::"l"(x_ready) : "memory");
	uint4 xv[GR1S_MAXP];
	gate1s_load<false>(xv, x, t, np);
	const float v = gate1s_warp_dot(wv, xv, np);
	if (lane == 0)
		red[warp] = v;
	__syncthreads(); // the warp sums
	for (int gi = blockIdx.x; warp == 1 && gi < D / 128; gi += gridDim.x) { // into K + 1 rows
		const uint2 raw = __ldca(reinterpret_cast<const uint2 *>(x + gi * 128 + 4 * lane));
		const float q[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
				    __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u)};
		gate1_quant_rows(q, gi, xs8, sxs, D, K, lane);
	}
	if (warp != 0)
		return;
	if (lane < EPB) { // lane n: expert EPB blockIdx.x + n
		gate1s_logit(red + 4 * lane, blockIdx.x * EPB + lane, E, bias, logits, scores);
		if (TAIL)
			__threadfence(); // the scores are visible device-wide before the count says so
	}
	if (!TAIL)
		return;
	__syncwarp();
	gate1_route_last(scores, E, topk_group, K, norm_topk_prob, route_scale, idx, wts, counts,
			 offsets, perm, src);
}

extern "C" __global__ void __launch_bounds__(128 * GR1S_EPB) k_moe_gate_route1s(GATE1_PARAMS)
{
	gate_route1s<GR1S_EPB, true>(GATE1_ARGS);
}

// k_moe_gate_logits1s: k_moe_gate_route1s without its last block's routing (the same logits,
// scores, quantised rows; idx, wts, counts, offsets, perm, src not written): the one-token block
// on k_moe_gemv_block routes itself from the scores (cuda_gemm_fp8_moe_block's route argument);
// with x_ready (not null; k_moe_gemv_block_r1 after it) it also sets *x_ready once x is complete
extern "C" __global__ void __launch_bounds__(128 * GR1S_EPB) k_moe_gate_logits1s(GATE1_PARAMS)
{
	gate_route1s<GR1S_EPB, false>(GATE1_ARGS);
}

// ---- k_moe_gate_route_t: the fast mode's router of a few tokens (T = 2 .. GRT_MAXT) -----------
// k_moe_gate_route1s's logits for each of T tokens (the same products summed in the same order, so
// a token's logits and scores are the same bits at T = 1 and here), the tokens two at a time (both
// rows' pieces loaded before either is summed), scores fp32 [T][2][E]; then the last block to
// finish (g_gatet_done, as g_gate1_done) routes token k by warp k % 8 (moe_route_select256 on its
// scores: k_moe_route_w's numbers) and permutes them all (moe_permute_block: k_moe_permute's),
// so one launch does what the separate logits, route and permute kernels do. The quantised rows
// need the permutation: k_moe_quant_scatter follows (by PDL). Grid E / 2, 256 threads, E = 256 in
// 8 groups, D % 1024 == 0, D <= 8192, 2 <= T <= GRT_MAXT, K <= 32 (moe_permute_block's one pass
// of 256 / K tokens holds them).
#define GRT_MAXT 16
__device__ unsigned g_gatet_done = 0; // blocks of the running k_moe_gate_route_t that are done

extern "C" __global__ void __launch_bounds__(256)
k_moe_gate_route_t(const uint16_t *__restrict__ W, const uint16_t *__restrict__ x, float *logits,
		   int E, int D, const float *__restrict__ bias, int topk_group, int K,
		   int norm_topk_prob, float route_scale, int *idx, float *__restrict__ wts,
		   int *__restrict__ counts, int *__restrict__ offsets, int *__restrict__ perm,
		   int *__restrict__ src, float *scores, int T)
{
	__shared__ float red[GRT_MAXT][8]; // [token][warp]
	__shared__ int last;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int t = tid & 127, np = D / 1024;
	uint4 wv[GR1S_MAXP];
	gate1s_load<true>(wv, W + (size_t)(blockIdx.x * 2 + (tid >> 7)) * D, t, np);
	// as route1s: only the weights (constants) read before the wait
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	asm volatile("griddepcontrol.wait;" ::: "memory");
	for (int k = 0; k < T; k += 2) {
		const bool two = k + 1 < T;
		uint4 xa[GR1S_MAXP], xb[GR1S_MAXP];
		gate1s_load<false>(xa, x + (size_t)k * D, t, np); // (x: as route1s, ordinary loads)
		if (two)
			gate1s_load<false>(xb, x + (size_t)(k + 1) * D, t, np);
		const float va = gate1s_warp_dot(wv, xa, np);
		const float vb = two ? gate1s_warp_dot(wv, xb, np) : 0.f;
		if (lane == 0) {
			red[k][warp] = va;
			if (two)
				red[k + 1][warp] = vb;
		}
	}
	__syncthreads(); // the warp sums
	if (warp == 0 && lane < 2 * T) { // lane 2k + n: token k, expert 2 blockIdx.x + n
		const int k = lane >> 1, n = lane & 1;
		gate1s_logit(&red[k][4 * n], blockIdx.x * 2 + n, E, bias, logits + (size_t)k * E,
			     scores + (size_t)k * 2 * E);
		__threadfence(); // the scores are visible device-wide before the count says so
	}
	__syncthreads(); // (the writers' fences are behind thread 0's count)
	if (tid == 0)
		last = atomicAdd(&g_gatet_done, 1u) == gridDim.x - 1;
	__syncthreads(); // every thread knows whether this block is the last
	if (!last)
		return;
	__threadfence(); // every block's scores (read through L2) after their counts
	for (int k = warp; k < T; k += 8) { // token k by warp k % 8
		float sc[8], sel[8];
		moe_route_load256(scores + (size_t)k * 2 * E, E, sc, sel, lane);
		moe_route_select256(sc, sel, k, topk_group, K, norm_topk_prob, route_scale, idx, wts);
	}
	__syncthreads(); // every token's idx written (read back by the permutation)
	moe_permute_block(idx, T, K, E, counts, offsets, perm, src);
	if (tid == 0)
		g_gatet_done = 0; // for the next launch (stream order)
}

// The tiled forms for many tokens: TT tokens x 32 experts per block (TT = 32: _tiled, 64:
// _t64), K in chunks of GT_KC = 64. A chunk arrives raw (bf16 rows) by cp.async into a ring of
// GT_S stages (GT_S - 1 chunks in flight), then is converted into the fp32 compute buffer split
// by partial: xs[t][j][s] = x[t, kc + 8s + j], so partial j's 8 steps are contiguous (two 4-wide
// reads; 12 floats per (row, partial) and 8 more per row: conflict-free reads and stores).
// Thread (owner o = tid / 8, partial j = tid % 8) keeps partial j of TT / 8 tokens x 8 experts,
// adding the steps in ascending k: the same sums as k_moe_gate_logits_a8. TT = 64: the 4 owners
// of a warp are 2 token groups x 2 expert groups, so each 16-byte read of x or W serves 4 lanes
// and takes 2 shared-memory wavefronts. Measured at 4096 tokens, TT = 32: 866 us with a
// one-chunk register prefetch (run 3), 840 us with the ring (run 4), 730 (run 10), which the
// shared-memory wavefronts would explain (a warp's chunk: 48 of reads and ~24 of the conversion
// against 256 FMA instructions, which 4 schedulers issue in 64 cycles, one wavefront a cycle);
// TT = 64 (64 + ~36 wavefronts against 512 FMA instructions, 1 block an SM at 160 registers):
// runs 12-13 684-719 us at 4096 tokens, 350-357 at 2048, 171 at 1024 (TT = 32: 388 / 198) — so
// not only the wavefronts: the barriers around each chunk's conversion, with 8 warps an SM, are
// the next suspect. Dynamic shared memory GT_SMEM(TT) bytes; grid (E / 32, ceil(T / TT)).
#define GT_E 32
#define GT_KC 64
#define GT_PAD 12
#define GT_S 4
#define GT_RAWB (GT_KC * 2 + 16) // bytes of a raw staged row
#define GT_ROWF (8 * GT_PAD + 8) // floats of a converted row: rows 8 banks apart
#define GT_SMEM(TT) (((TT) + GT_E) * GT_ROWF * 4 + GT_S * ((TT) + GT_E) * GT_RAWB)
template <int TT>
__device__ __forceinline__ void gate_logits_tiled(const uint16_t *__restrict__ W,
						  const uint16_t *__restrict__ x,
						  float *__restrict__ logits, int T, int E, int D)
{
	constexpr int TPT = TT / 8;              // tokens a thread
	constexpr int NR = (TT + GT_E) * 8 / 256; // 16-byte pieces a thread moves per chunk
	extern __shared__ __align__(16) unsigned char gt_smem[];
	float *xs = reinterpret_cast<float *>(gt_smem); // [TT][GT_ROWF]: row, partial j at j * GT_PAD
	float *ws = xs + TT * GT_ROWF;                  // [GT_E][GT_ROWF]
	unsigned char *raw = gt_smem + (TT + GT_E) * GT_ROWF * 4; // [GT_S][TT + GT_E][GT_RAWB]
	const int tid = threadIdx.x, j = tid & 7, o = tid >> 3;
	// tokens TPT*ot .. +TPT-1, experts 8*oe .. +7 of the tile (ot < 8, oe < 4); TT = 32: a
	// warp's owners are 4 token groups of one expert group (24 wavefronts per 4 steps either
	// way; this form fits 80 registers, 3 blocks an SM)
	int ot, oe;
	if constexpr (TT == 32)
		ot = o & 7, oe = o >> 3;
	else
		ot = ((o >> 2) & 3) << 1 | (o & 1), oe = (o >> 4) << 1 | ((o >> 1) & 1);
	const int t_base = blockIdx.y * TT, e_base = blockIdx.x * GT_E;
	const int nc = D / GT_KC;
	// TT + 32 rows (TT of x, 32 of W) x 8 pieces of 16 bytes a chunk: thread q = tid + 256 r
	// moves row q / 8, piece q % 8 (rows past T: a copy of row T-1, never stored)
	const uint16_t *src[NR];
	int srow[NR], sst[NR];
#pragma unroll
	for (int r = 0; r < NR; r++) {
		const int q = tid + 256 * r, row = q >> 3, st = q & 7;
		srow[r] = row, sst[r] = st;
		src[r] = row < TT ? x + (size_t)min(t_base + row, T - 1) * D + 8 * st
				  : W + (size_t)(e_base + row - TT) * D + 8 * st;
	}
	auto issue = [&](int c) { // chunk c into ring stage c % GT_S; one commit group a slot
		if (c < nc) {
			unsigned char *stg = raw + (size_t)(c % GT_S) * (TT + GT_E) * GT_RAWB;
#pragma unroll
			for (int r = 0; r < NR; r++)
				cp_async16(smem_u32(stg + (size_t)srow[r] * GT_RAWB + 16 * sst[r]),
					   src[r] + (size_t)c * GT_KC);
		}
		asm volatile("cp.async.commit_group;" ::: "memory");
	};
	auto convert = [&](int c) { // ring stage c % GT_S -> the fp32 buffer, split by partial
		const unsigned char *stg = raw + (size_t)(c % GT_S) * (TT + GT_E) * GT_RAWB;
#pragma unroll
		for (int r = 0; r < NR; r++) {
			const uint4 v = *reinterpret_cast<const uint4 *>(stg + (size_t)srow[r] * GT_RAWB +
									 16 * sst[r]);
			float *dst = xs + (size_t)srow[r] * GT_ROWF + sst[r]; // ws follows xs
			const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
			for (int h = 0; h < 4; h++) {
				dst[(2 * h) * GT_PAD] = __uint_as_float(wd[h] << 16);
				dst[(2 * h + 1) * GT_PAD] = __uint_as_float(wd[h] & 0xffff0000u);
			}
		}
	};
	float acc[TPT][8];
#pragma unroll
	for (int i = 0; i < TPT; i++)
#pragma unroll
		for (int e = 0; e < 8; e++)
			acc[i][e] = 0.f;
#pragma unroll
	for (int c = 0; c < GT_S - 1; c++)
		issue(c);
	for (int c = 0; c < nc; c++) {
		asm volatile("cp.async.wait_group %0;" ::"n"(GT_S - 2) : "memory"); // chunk c: mine
		__syncthreads(); // chunk c: everyone's; chunk c-1 summed by all (fp32 buffer free)
		convert(c);
		issue(c + GT_S - 1); // into the stage of chunk c-1, converted before the barrier
		__syncthreads(); // chunk c converted
#pragma unroll
		for (int s4 = 0; s4 < 2; s4++) {
			float xv[TPT][4], wv[8][4];
#pragma unroll
			for (int i = 0; i < TPT; i++)
				*reinterpret_cast<float4 *>(xv[i]) = *reinterpret_cast<const float4 *>(
					xs + (TPT * ot + i) * GT_ROWF + j * GT_PAD + 4 * s4);
#pragma unroll
			for (int e = 0; e < 8; e++)
				*reinterpret_cast<float4 *>(wv[e]) = *reinterpret_cast<const float4 *>(
					ws + (8 * oe + e) * GT_ROWF + j * GT_PAD + 4 * s4);
			// step by step, the accumulators' FMAs independent of each other (exact
			// products: fma == multiply, then add)
#pragma unroll
			for (int st = 0; st < 4; st++)
#pragma unroll
				for (int i = 0; i < TPT; i++)
#pragma unroll
					for (int e = 0; e < 8; e++)
						acc[i][e] = fmaf(xv[i][st], wv[e][st], acc[i][e]);
		}
	}
	asm volatile("cp.async.wait_all;" ::: "memory");
#pragma unroll
	for (int i = 0; i < TPT; i++)
#pragma unroll
		for (int e = 0; e < 8; e++) {
			float v = acc[i][e];
			v += __shfl_xor_sync(0xffffffffu, v, 1);
			v += __shfl_xor_sync(0xffffffffu, v, 2);
			v += __shfl_xor_sync(0xffffffffu, v, 4);
			const int t = t_base + TPT * ot + i;
			if (e == j && t < T) // lane j stores expert j of the 8
				logits[(size_t)t * E + e_base + 8 * oe + e] = v;
		}
}

GATE_LOGITS_KERNEL(k_moe_gate_logits_tiled, (256), gate_logits_tiled<32>)
GATE_LOGITS_KERNEL(k_moe_gate_logits_t64, (256, 1), gate_logits_tiled<64>)

extern "C" __global__ void __launch_bounds__(256)
k_moe_gather_q(const uint8_t *__restrict__ x8, const float *__restrict__ sx,
	       const int *__restrict__ src, uint8_t *__restrict__ xs8, float *__restrict__ sxs,
	       int D, int R)
{
	const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (r >= R)
		return;
	const int s = src[r];
	const uint4 *from = reinterpret_cast<const uint4 *>(x8 + (size_t)s * D);
	uint4 *to = reinterpret_cast<uint4 *>(xs8 + (size_t)r * D);
#pragma unroll 4
	for (int i = lane; i < D / 16; i += 32)
		to[i] = from[i];
	const int KB = D / 128;
	for (int i = lane; i < KB; i += 32)
		sxs[(size_t)r * KB + i] = sx[(size_t)s * KB + i];
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_quant_scatter(const uint16_t *__restrict__ x, const int *__restrict__ perm,
		    uint8_t *__restrict__ xs8, float *__restrict__ sxs, int D, int T, int K, int R)
{
	const int KB = D / 128;
	const long long group = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
	// launched with PDL after k_moe_gate_route_t (model/cuda_moe.c): x and perm only after the
	// wait (without PDL both return at once)
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	asm volatile("griddepcontrol.wait;" ::: "memory");
	if (group >= (long long)T * KB)
		return;
	const int t = (int)(group / KB), c = (int)(group % KB), lane = threadIdx.x & 31;
	const int my_row = lane < K ? perm[(size_t)t * K + lane] : 0; // pick `lane`'s sorted row
	// x[t] itself: the shared expert's row R + t, quantised once
	uint8_t *q = xs8 + (size_t)(R + t) * D + c * 128;
	const float sc = warp_act_quant128(x + (size_t)t * D + c * 128, q, lane);
	const uint32_t codes = *reinterpret_cast<const uint32_t *>(q + lane * 4); // this lane's 4
	if (lane == 0)
		sxs[(size_t)(R + t) * KB + c] = sc;
	for (int n = 0; n < K; n++) {
		const int row = __shfl_sync(0xffffffffu, my_row, n);
		*reinterpret_cast<uint32_t *>(xs8 + (size_t)row * D + c * 128 + lane * 4) = codes;
	}
	if (lane < K)
		sxs[(size_t)my_row * KB + c] = sc;
}

// The silu table of k_moe_swiglu_quant: silu_f32 of every bf16 code with 2^-16 <= |g| < 2^8
// (exponent fields 111 .. 134, 24 x 128 codes a sign; positive codes first), 24 KB of shared
// memory a block. A lane whose 8 values of g are not all in it (smaller, larger, zero, inf,
// NaN: rare in a gate projection) computes all 8 instead, so a value comes out with the same
// bits either way.
#define SQ_LO (111u << 7)
#define SQ_SPAN (24u << 7)
#define SQ_BLOCKS_SM 4 // blocks an SM (the host's grid: model/cuda_moe.c)
#define SQ_DEPTH 2     // pairs of groups whose loads a warp has in flight

// One pair's half-warp of work: lane l's 8 values of 128-group c of row r (g words gv, u words
// uv: k = 0 .. 7 the low then high halves of .x, .y, .z, .w) -> their e4m3 codes and, from lane
// 0 of the half, the group's scale. Every lane of the warp calls it (the maximum's shuffles);
// `on`: this half's group exists.
__device__ __forceinline__ void sq_group(const float *tab, bool table, uint4 gv, uint4 uv, bool on,
					 uint8_t *__restrict__ q8, float *__restrict__ qs, int l)
{
	const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
	uint32_t code[8], ix[8], out = 0;
#pragma unroll
	for (int k = 0; k < 8; k++) {
		code[k] = k & 1 ? gw[k >> 1] >> 16 : gw[k >> 1] & 0xffffu;
		const uint32_t a = (code[k] & 0x7fffu) - SQ_LO;
		out |= a >= SQ_SPAN;
		ix[k] = a + (code[k] >> 15) * SQ_SPAN;
	}
	float silu[8];
	if (table && !out) {
#pragma unroll
		for (int k = 0; k < 8; k++)
			silu[k] = tab[ix[k]];
	} else {
#pragma unroll
		for (int k = 0; k < 8; k++)
			silu[k] = silu_f32(bf16_to_f32((uint16_t)code[k]));
	}
	// h = bf16(silu * u) two at a time (swiglu_mul's bits: a NaN's payload differs, and the
	// act_quant below maps every NaN alike)
	float h[8], amax = 0.f;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const uint32_t hb = bf16x2(__fmul_rn(silu[2 * i], __uint_as_float(uw[i] << 16)),
					   __fmul_rn(silu[2 * i + 1], __uint_as_float(uw[i] & 0xffff0000u)));
		h[2 * i] = __uint_as_float(hb << 16);
		h[2 * i + 1] = __uint_as_float(hb & 0xffff0000u);
		amax = fmaxf(amax, fmaxf(fabsf(h[2 * i]), fabsf(h[2 * i + 1])));
	}
#pragma unroll
	for (int m = 8; m > 0; m >>= 1) // the half-warp's maximum (every lane takes part)
		amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
	if (!on)
		return;
	// act_quant (warp_act_quant128_regs' numbers): x / sc = x * (1 / sc), both exact
	const float sc = ue8m0_scale(fmaxf(amax, 1e-4f)), inv = __frcp_rn(sc);
	uint32_t packed[2] = {0, 0};
#pragma unroll
	for (int k = 0; k < 8; k += 2)
		packed[k >> 2] |= (uint32_t)f32x2_to_e4m3x2(e4m3_scaled(h[k], inv),
							     e4m3_scaled(h[k + 1], inv))
				   << (16 * ((k >> 1) & 1));
	*reinterpret_cast<uint2 *>(q8 + l * 8) = make_uint2(packed[0], packed[1]);
	if (l == 0)
		*qs = sc;
}

extern "C" __global__ void __launch_bounds__(256, SQ_BLOCKS_SM)
k_moe_swiglu_quant(const uint16_t *__restrict__ gu, uint8_t *__restrict__ h8,
		   float *__restrict__ hs, int I, long long n_groups, int table)
{
	// a half-warp per 128-group, 8 values a lane (16-byte loads of g and u); a warp takes the
	// groups 2c, 2c + 1 of a row (pair c; the second idle when a row has an odd count), pairs in
	// steps of the grid, SQ_DEPTH of them loaded ahead. 32-bit indices: n_groups < 2^31 (the
	// host's rows x I / 128).
	__shared__ float tab[2 * SQ_SPAN];
	if (table) { // (a grid of a few blocks an SM: the table is made once a block)
		for (uint32_t i = threadIdx.x; i < 2 * SQ_SPAN; i += blockDim.x)
			tab[i] = silu_f32(bf16_to_f32(
				(uint16_t)((i >= SQ_SPAN ? 0x8000u : 0u) + SQ_LO + i % SQ_SPAN)));
		__syncthreads();
	}
	const int per_row = I / 128, ppr = (per_row + 1) / 2, rows = (int)(n_groups / per_row);
	const int lane = threadIdx.x & 31, l = lane & 15, half = lane >> 4;
	// slot j: pair (row[j], pc[j]) = p0 + j step, then + SQ_DEPTH step a round (no division)
	const unsigned step = gridDim.x * 8u, p0 = blockIdx.x * 8u + (threadIdx.x >> 5);
	const int adv_r = (int)(SQ_DEPTH * step / ppr), adv_c = (int)(SQ_DEPTH * step % ppr);
	int row[SQ_DEPTH] = {}, pc[SQ_DEPTH] = {};
	uint4 graw[SQ_DEPTH], uraw[SQ_DEPTH];
	auto load = [&](int j) { // (zero where the slot is past the end or its group past the row)
		const int c = 2 * pc[j] + half;
		graw[j] = uraw[j] = make_uint4(0, 0, 0, 0);
		if (row[j] < rows && c < per_row) {
			const uint16_t *gp = gu + (size_t)row[j] * 2 * I + c * 128 + l * 8;
			graw[j] = *reinterpret_cast<const uint4 *>(gp);
			uraw[j] = *reinterpret_cast<const uint4 *>(gp + I);
		}
	};
#pragma unroll
	for (int j = 0; j < SQ_DEPTH; j++) {
		const unsigned p = p0 + j * step;
		row[j] = (int)(p / ppr), pc[j] = (int)(p % ppr);
		load(j);
	}
	while (row[0] < rows) {
#pragma unroll
		for (int j = 0; j < SQ_DEPTH; j++) {
			if (row[j] >= rows) // (the slots in order: every later one is past too)
				break;
			const int r = row[j], c = 2 * pc[j] + half;
			const uint4 gv = graw[j], uv = uraw[j];
			pc[j] += adv_c, row[j] += adv_r;
			if (pc[j] >= ppr)
				pc[j] -= ppr, row[j]++;
			load(j);
			sq_group(tab, table, gv, uv, c < per_row, h8 + (size_t)r * I + c * 128,
				 hs + (size_t)r * per_row + c, l);
		}
	}
}

// acc[q] += bf16 value q of v times wk: one fp32 multiply and one add (no FMA), as moe_combine.
__device__ __forceinline__ void combine_add8(float acc[8], uint4 v, float wk)
{
	const uint32_t vw[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
	for (int q = 0; q < 8; q++) {
		const float xv = __uint_as_float(q & 1 ? vw[q >> 1] & 0xffff0000u : vw[q >> 1] << 16);
		acc[q] = __fadd_rn(acc[q], __fmul_rn(xv, wk));
	}
}

// acc[q] (zeroed here) = the sum of token t's weighted pick rows at columns d .. d + 7 (ALL) or
// of those whose sorted row is at or past own_from, in pick order (ascending expert id, as
// moe_combine); the first 8 rows' loads all in flight.
template <bool ALL>
__device__ __forceinline__ void combine_picks8(float acc[8], const uint16_t *__restrict__ ex,
					       const float *__restrict__ w,
					       const int *__restrict__ perm, int t, int K, int D,
					       int d, int own_from)
{
#pragma unroll
	for (int q = 0; q < 8; q++)
		acc[q] = 0.f;
	uint4 v[8];
	float wk[8];
	bool own[8];
#pragma unroll
	for (int k = 0; k < 8; k++)
		if (k < K) {
			const int r = perm[t * K + k];
			own[k] = ALL || r >= own_from;
			wk[k] = w[(size_t)t * K + k];
			if (own[k])
				v[k] = *reinterpret_cast<const uint4 *>(ex + (size_t)r * D + d);
		}
#pragma unroll
	for (int k = 0; k < 8; k++)
		if (k < K && own[k])
			combine_add8(acc, v[k], wk[k]);
	for (int k = 8; k < K; k++) {
		const int r = perm[t * K + k];
		if (ALL || r >= own_from)
			combine_add8(acc, *reinterpret_cast<const uint4 *>(ex + (size_t)r * D + d),
				     w[(size_t)t * K + k]);
	}
}

// acc[q] += bf16 value q of the 8 at sh (16-byte aligned): the shared expert's row.
__device__ __forceinline__ void combine_shared8(float acc[8], const uint16_t *__restrict__ sh)
{
	const uint4 s = *reinterpret_cast<const uint4 *>(sh);
	const uint32_t sw[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
	for (int h = 0; h < 4; h++) {
		acc[2 * h] = __fadd_rn(acc[2 * h], __uint_as_float(sw[h] << 16));
		acc[2 * h + 1] = __fadd_rn(acc[2 * h + 1], __uint_as_float(sw[h] & 0xffff0000u));
	}
}

// The body of k_moe_combine_v8 (RANK false: every pick, + sh, rounded to bf16 into y) and of
// k_moe_combine_rank (RANK true: the picks whose sorted row is at or past *first, + sh where
// given, fp32 into y). Launched with PDL (model/cuda_moe.c): everything it reads after the wait;
// the next kernel (the next layer's norm) may start and load its weights meanwhile.
template <bool RANK>
__device__ __forceinline__ void moe_combine8(const uint16_t *__restrict__ ex,
					     const float *__restrict__ w,
					     const int *__restrict__ perm, const int *__restrict__ first,
					     const uint16_t *__restrict__ sh, void *__restrict__ y, int T,
					     int K, int D)
{
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	asm volatile("griddepcontrol.wait;" ::: "memory");
	const int own_from = RANK ? *first : 0;
	const long long n8 = (long long)T * D / 8;
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
	     i += (long long)gridDim.x * blockDim.x) {
		const long long e0 = i * 8;
		const int t = (int)(e0 / D), d = (int)(e0 % D);
		float acc[8];
		combine_picks8<!RANK>(acc, ex, w, perm, t, K, D, d, own_from);
		if (!RANK || sh)
			combine_shared8(acc, sh + e0);
		if (RANK) {
			float4 *out = reinterpret_cast<float4 *>(static_cast<float *>(y) + e0);
			out[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
			out[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
		} else {
			uint32_t o[4];
#pragma unroll
			for (int h = 0; h < 4; h++)
				o[h] = (uint32_t)f32_to_bf16(acc[2 * h]) |
				       ((uint32_t)f32_to_bf16(acc[2 * h + 1]) << 16);
			*reinterpret_cast<uint4 *>(static_cast<uint16_t *>(y) + e0) =
				make_uint4(o[0], o[1], o[2], o[3]);
		}
	}
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_combine_v8(const uint16_t *__restrict__ ex, const float *__restrict__ w,
		 const int *__restrict__ perm, const uint16_t *__restrict__ sh,
		 uint16_t *__restrict__ y, int T, int K, int D)
{
	moe_combine8<false>(ex, w, perm, nullptr, sh, y, T, K, D);
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_combine_rank(const uint16_t *__restrict__ ex, const float *__restrict__ w,
		   const int *__restrict__ perm, const int *__restrict__ first,
		   const uint16_t *__restrict__ sh, float *__restrict__ y, int T, int K, int D)
{
	moe_combine8<true>(ex, w, perm, first, sh, y, T, K, D);
}
