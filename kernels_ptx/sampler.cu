// sampler.cu — the sampling function of model/sampler.h on the GPU: penalties, greedy argmax,
// temperature, top-k, top-p, min-p, the inverse-CDF draw with sampler_uniform(seed, index), and
// the raw log-probabilities. model/sampler.c is the definition; this file reproduces its every
// comparison and every double sum in the same order (the serial sums run on one thread over
// shared-memory tiles that the whole block fills), so GPU and CPU draw the same token; only
// exp()/log() may differ from glibc's by an ulp.
//
// k_sampler: one block of SB_THREADS per row (blocks loop over rows when rows > grid).
//   logits   fp32 [rows, ld] (the first V of each row are read; never written)
//   rows     struct sampler_row [rows] (parameters, history offsets; model/cuda_sampler.h)
//   hist     int32 history ids; a row's prompt is hist[prompt_off ..+n_prompt), its output
//            hist[output_off ..+n_output)
//   out      struct sampler_result [rows]
//   ws       per block slot_bytes: pl fp32 [Vp] (penalised copy), a, b int32 [Vp] (counts,
//            candidate ids and sort ping-pong), Vp = V rounded up to 64
//   flags    SB_FAST: parallel sums with an error bound, falling back to the serial ones near
//            a boundary; SB_VERIFY: both, diag[0] += disagreements, diag[1] += fallbacks
//            (diag may be NULL)
// V <= SB_TILE * SB_MAX_TILES.
//
// k_sampler_uniform: bits[i] = sampler_bits(seed[i], index[i]) (the test checks the stream
// bit for bit against the CPU).
#include <stdint.h>

#include "scan.cuh"

#define SB_THREADS 512
#define SB_WARPS (SB_THREADS / 32)
#define SB_TILE 2048 // elements per serial tile (4 per thread)
#define SB_MAX_TILES 256
#define SB_BINS 128 // model/sampler.c DRAW_BINS
#define SB_BINS_PER_NAT 4.0
#define SB_MAX_LOGPROBS 20

struct sampler_row {
	double temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
	int64_t top_k;
	uint64_t seed, index;
	int64_t prompt_off, n_prompt, output_off, n_output;
	int32_t logprobs, top_logprobs;
};

struct sampler_result {
	int32_t token, err;
	float logprob;
	int32_t n_top;
	int32_t top_ids[SB_MAX_LOGPROBS];
	float top_logprobs[SB_MAX_LOGPROBS];
};

// flags of k_sampler
#define SB_FAST 1   // parallel sums with an error bound; the serial sums only near a boundary
#define SB_VERIFY 2 // with SB_FAST: also run the serial sums, count disagreements in diag[0]
// Every parallel approximation of a sum of n <= 524288 non-negative terms, and every serial
// one (sampler.c's), is within (n - 1) * 2^-53 < 5.9e-11 of the exact sum, relative: a
// decision whose margin exceeds SB_SLACK / 4 = 1e-10 of the sum is the serial sums' decision.
#define SB_SLACK 4e-10

#define SB_EINVAL (-22)
#define SB_EDOM (-33)

struct sb_smem {
	union {
		struct {
			double q[SB_TILE];   // a tile's values, compacted, in order
			int32_t id[SB_TILE]; // their ids
		} t;
		uint32_t wcnt[SB_WARPS][256]; // radix sort: per-warp digit counts of a tile
	} u;
	double tsum[SB_MAX_TILES + 1]; // running sum before each tile
	double bins[SB_BINS];
	uint32_t hist[256], base[256], tot[256];
	double red_d[SB_WARPS];
	double scan_d[SB_WARPS];
	float red_f[SB_WARPS];
	int32_t red_i[SB_WARPS];
	uint64_t topkeys[SB_MAX_LOGPROBS];
	double b_d;
	uint64_t b_k, b_m;
	int64_t b_n;
	int32_t b_i, b_j, ntop;
};

// ---- the random stream (model/sampler.c, bit for bit) ------------------------------------

__device__ __forceinline__ uint64_t sb_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t sb_bits(uint64_t seed, uint64_t index)
{
	return sb_mix64(sb_mix64(seed) + (index + 1) * 0x9e3779b97f4a7c15ull);
}

__device__ __forceinline__ double sb_uniform(uint64_t seed, uint64_t index)
{
	return __dmul_rn((double)(sb_bits(seed, index) >> 11), 0x1.0p-53);
}

extern "C" __global__ void k_sampler_uniform(const uint64_t *__restrict__ seed,
					     const uint64_t *__restrict__ index,
					     uint64_t *__restrict__ bits, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		bits[i] = sb_bits(seed[i], index[i]);
}

// ---- order and values ---------------------------------------------------------------------

// sampler.c order_key: ascending keys = logit descending, then id ascending; -0 == +0.
__device__ __forceinline__ uint32_t sb_ord(float l)
{
	uint32_t u = __float_as_uint(l);
	if ((u & 0x7fffffffu) == 0)
		u = 0;
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return ~u;
}

__device__ __forceinline__ uint64_t sb_key(float l, int32_t id)
{
	return ((uint64_t)sb_ord(l) << 32) | (uint32_t)id;
}

// ((double)l - lmax) / T, with no contraction
__device__ __forceinline__ double sb_x(float l, double lmax, double T)
{
	return __ddiv_rn(__dsub_rn((double)l, lmax), T);
}

__device__ __forceinline__ int sb_bin(double x)
{
	return -x < SB_BINS / SB_BINS_PER_NAT ? (int)(-x * SB_BINS_PER_NAT) : SB_BINS - 1;
}

// ---- block helpers (every thread calls them) ------------------------------------------------

__device__ double sb_sum_d(sb_smem &sh, double v)
{
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	if (lane == 0)
		sh.red_d[w] = v;
	__syncthreads(); // partials visible
	if (threadIdx.x == 0) {
		double s = 0.0;
		for (int i = 0; i < SB_WARPS; i++)
			s += sh.red_d[i];
		sh.b_d = s;
	}
	__syncthreads(); // result visible; red_d reusable
	return sh.b_d;
}

__device__ int64_t sb_sum_i(sb_smem &sh, int64_t v)
{
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	if (lane == 0)
		sh.red_d[w] = (double)v; // < 2^53
	__syncthreads(); // partials visible
	if (threadIdx.x == 0) {
		int64_t s = 0;
		for (int i = 0; i < SB_WARPS; i++)
			s += (int64_t)sh.red_d[i];
		sh.b_n = s;
	}
	__syncthreads(); // result visible
	return sh.b_n;
}

// argmax, ties to the lowest id; (-inf, INT32_MAX) when no candidate
__device__ void sb_argmax(sb_smem &sh, float &v, int32_t &id)
{
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, v, o);
		int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
		if (ov > v || (ov == v && oi < id)) {
			v = ov;
			id = oi;
		}
	}
	if (lane == 0) {
		sh.red_f[w] = v;
		sh.red_i[w] = id;
	}
	__syncthreads(); // partials visible
	if (threadIdx.x == 0) {
		for (int i = 1; i < SB_WARPS; i++)
			if (sh.red_f[i] > v || (sh.red_f[i] == v && sh.red_i[i] < id)) {
				v = sh.red_f[i];
				id = sh.red_i[i];
			}
		sh.red_f[0] = v;
		sh.red_i[0] = id;
	}
	__syncthreads(); // result visible
	v = sh.red_f[0];
	id = sh.red_i[0];
	__syncthreads(); // everyone read it before red_* is reused
}

// exclusive prefix sum of doubles over the threads in thread order
__device__ double sb_scan_d(sb_smem &sh, double x)
{
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	double inc = x;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		double y = __shfl_up_sync(0xffffffffu, inc, o);
		if (lane >= o)
			inc += y;
	}
	if (lane == 31)
		sh.scan_d[w] = inc;
	__syncthreads(); // warp totals visible
	double before = 0.0;
	for (int i = 0; i < w; i++)
		before += sh.scan_d[i];
	__syncthreads(); // everyone read scan_d[] before it is reused
	return before + (inc - x);
}

__device__ int32_t sb_min_i(sb_smem &sh, int32_t v)
{
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
	if (lane == 0)
		sh.red_i[w] = v;
	__syncthreads(); // partials visible
	if (threadIdx.x == 0) {
		for (int i = 1; i < SB_WARPS; i++)
			v = min(v, sh.red_i[i]);
		sh.b_i = v;
	}
	__syncthreads(); // result visible
	v = sh.b_i;
	__syncthreads(); // read before reuse
	return v;
}

// ---- radix select: the k-th smallest key (1-based) ---------------------------------------

// Over ids i < V with l[i] != -inf (or all ids with all_ids). Keys are distinct (the id is in
// them), so exactly k keys are <= the result. MSB-first, 8 bits a pass; stops early once the
// prefix names one key.
__device__ uint64_t sb_select(sb_smem &sh, const float *l, int V, int64_t k, bool all_ids)
{
	const int tid = threadIdx.x;
	uint64_t prefix = 0, mask = 0;
	for (int shift = 56; shift >= 0; shift -= 8) {
		if (tid < 256)
			sh.hist[tid] = 0;
		__syncthreads(); // hist zeroed
		for (int i = tid; i < V; i += SB_THREADS) {
			float x = l[i];
			if (!all_ids && x == -INFINITY)
				continue;
			uint64_t K = sb_key(x, i);
			if ((K & mask) == prefix)
				atomicAdd(&sh.hist[(K >> shift) & 255], 1u);
		}
		__syncthreads(); // hist complete
		if (tid == 0) {
			int64_t cum = 0;
			int d = 0;
			for (; d < 255; d++) {
				if (cum + sh.hist[d] >= k)
					break;
				cum += sh.hist[d];
			}
			sh.b_n = k - cum;
			sh.b_j = (int32_t)sh.hist[d];
			sh.b_k = prefix | ((uint64_t)d << shift);
		}
		__syncthreads(); // choice visible
		k = sh.b_n;
		prefix = sh.b_k;
		mask |= 0xffull << shift;
		const int count = sh.b_j;
		__syncthreads(); // b_* read before reuse
		if (count == 1 && shift > 0) { // one key has this prefix: find it
			for (int i = tid; i < V; i += SB_THREADS) {
				float x = l[i];
				if (!all_ids && x == -INFINITY)
					continue;
				uint64_t K = sb_key(x, i);
				if ((K & mask) == prefix)
					sh.b_m = K;
			}
			__syncthreads(); // the one writer is done
			prefix = sh.b_m;
			__syncthreads(); // read before reuse
			break;
		}
	}
	return prefix;
}

// ---- serial sums in id order -----------------------------------------------------------------

struct sb_draw {
	const float *l;
	int V;
	double lmax, T;
	uint64_t thr; // kept: l_i != -inf and key(l_i, i) <= thr
};

// Fills sh.u.t with tile t's non-zero q_i of the kept ids, in id order (adding a zero is exact,
// so skipping them leaves every running sum as sampler.c's); returns their count. bins: also
// add q_i to sh.bins by x (top-p's bound; order-free, only a bound).
__device__ uint32_t sb_tile(sb_smem &sh, const sb_draw &d, int t, bool bins)
{
	const int base = t * SB_TILE + threadIdx.x * 4;
	double q[4];
	uint32_t n = 0;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		q[k] = 0.0;
		int i = base + k;
		if (i < d.V) {
			float x = d.l[i];
			if (x != -INFINITY && sb_key(x, i) <= d.thr) {
				double xx = sb_x(x, d.lmax, d.T);
				q[k] = exp(xx);
				if (bins)
					atomicAdd(&sh.bins[sb_bin(xx)], q[k]);
			}
		}
		n += q[k] > 0.0;
	}
	int total;
	int pos = block_exclusive_scan<SB_THREADS>((int)n, &total);
#pragma unroll
	for (int k = 0; k < 4; k++)
		if (q[k] > 0.0) {
			sh.u.t.q[pos] = q[k];
			sh.u.t.id[pos] = base + k;
			pos++;
		}
	__syncthreads(); // the tile is in shared memory
	return total;
}

// S = sum of q over the kept ids in id order (one thread, sampler.c's order); sh.tsum[t] = the
// running sum before tile t, sh.tsum[ntiles] = S; *last = the last kept id with q > 0.
__device__ double sb_serial_sum(sb_smem &sh, const sb_draw &d, bool bins, int32_t *last)
{
	const int ntiles = (d.V + SB_TILE - 1) / SB_TILE;
	double run = 0.0;
	int32_t lst = -1;
	for (int t = 0; t < ntiles; t++) {
		uint32_t n = sb_tile(sh, d, t, bins);
		if (threadIdx.x == 0) {
			sh.tsum[t] = run;
			double s = run;
			for (uint32_t j = 0; j < n; j++)
				s += sh.u.t.q[j];
			run = s;
			if (n)
				lst = sh.u.t.id[n - 1];
		}
		__syncthreads(); // thread 0 is done with the tile before it is refilled
	}
	if (threadIdx.x == 0) {
		sh.tsum[ntiles] = run;
		sh.b_d = run;
		sh.b_i = lst;
	}
	__syncthreads(); // results visible
	double S = sh.b_d;
	*last = sh.b_i;
	__syncthreads(); // read before reuse
	return S;
}

// Step 7: the first kept id whose running sum exceeds u * S (the last kept id with q > 0 when
// rounding leaves none).
__device__ int32_t sb_walk(sb_smem &sh, const sb_draw &d, double u)
{
	int32_t last;
	const double S = sb_serial_sum(sh, d, false, &last);
	const double target = __dmul_rn(u, S);
	const int ntiles = (d.V + SB_TILE - 1) / SB_TILE;
	if (threadIdx.x == 0) {
		int t = 0;
		while (t < ntiles && !(sh.tsum[t + 1] > target))
			t++;
		sh.b_j = t;
	}
	__syncthreads(); // tile choice visible
	const int t = sh.b_j;
	__syncthreads(); // read before reuse
	if (t == ntiles)
		return last;
	uint32_t n = sb_tile(sh, d, t, false);
	if (threadIdx.x == 0) {
		double cum = sh.tsum[t];
		int32_t tok = last;
		for (uint32_t j = 0; j < n; j++) {
			cum += sh.u.t.q[j];
			if (cum > target) {
				tok = sh.u.t.id[j];
				break;
			}
		}
		sh.b_i = tok;
	}
	__syncthreads(); // token visible
	int32_t tok = sh.b_i;
	__syncthreads(); // read before reuse
	return tok;
}

// q_i of d (0 for the ids it does not keep)
__device__ __forceinline__ double sb_q(const sb_draw &d, int i, bool bins, sb_smem &sh)
{
	if (i >= d.V)
		return 0.0;
	float x = d.l[i];
	if (x == -INFINITY || sb_key(x, i) > d.thr)
		return 0.0;
	double xx = sb_x(x, d.lmax, d.T);
	double q = exp(xx);
	if (bins)
		atomicAdd(&sh.bins[sb_bin(xx)], q);
	return q;
}

// Parallel sums of q per tile: sh.tsum[t] = the (approximate) sum before tile t; returns the
// total. bins as sb_tile.
__device__ double sb_tile_sums(sb_smem &sh, const sb_draw &d, bool bins)
{
	const int ntiles = (d.V + SB_TILE - 1) / SB_TILE;
	for (int t = 0; t < ntiles; t++) {
		const int base = t * SB_TILE + threadIdx.x * 4;
		double s = 0.0;
#pragma unroll
		for (int k = 0; k < 4; k++)
			s += sb_q(d, base + k, bins, sh);
		s = sb_sum_d(sh, s);
		if (threadIdx.x == 0)
			sh.tsum[t + 1] = s;
	}
	if (threadIdx.x == 0) {
		sh.tsum[0] = 0.0;
		for (int t = 0; t < ntiles; t++)
			sh.tsum[t + 1] += sh.tsum[t];
		sh.b_d = sh.tsum[ntiles];
	}
	__syncthreads(); // tsum and the total visible
	const double S = sh.b_d;
	__syncthreads(); // read before reuse
	return S;
}

// Step 7 from parallel sums: with lo/hi = u * S -/+ SB_SLACK * S, the first id whose prefix
// sum exceeds lo also exceeds hi, and every id before it stays under lo: then the serial
// walk stops at that id too (every sum involved is within a quarter of the slack of the
// exact one). Returns it, or -1 when the draw is too near a boundary (then sb_walk).
__device__ int32_t sb_walk_fast(sb_smem &sh, const sb_draw &d, double u)
{
	const double S = sb_tile_sums(sh, d, false);
	const double target = __dmul_rn(u, S), lo = target - SB_SLACK * S,
		     hi = target + SB_SLACK * S;
	const int ntiles = (d.V + SB_TILE - 1) / SB_TILE;
	int t = 0;
	while (t < ntiles && !(sh.tsum[t + 1] > lo))
		t++;
	if (t == ntiles)
		return -1;
	const int base = t * SB_TILE + threadIdx.x * 4;
	double p[4], run = 0.0;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		run += sb_q(d, base + k, false, sh);
		p[k] = run;
	}
	const double before = sh.tsum[t] + sb_scan_d(sh, run);
	int32_t j1 = INT32_MAX, j2 = INT32_MAX;
#pragma unroll
	for (int k = 3; k >= 0; k--) {
		const double P = before + p[k];
		if (base + k < d.V) {
			if (P > lo)
				j1 = base + k;
			if (P > hi)
				j2 = base + k;
		}
	}
	j1 = sb_min_i(sh, j1);
	j2 = sb_min_i(sh, j2);
	return j1 != INT32_MAX && j1 == j2 ? j1 : -1;
}

// ---- top-p / min-p: candidates, stable radix sort, the exact cut --------------------------

// Stable LSD radix sort of ids a[0..n) by sb_ord(l[id]) (input in id order, so ties stay in id
// order: the strict order of sampler.h). Returns the buffer holding the result (a or b).
__device__ int32_t *sb_sort(sb_smem &sh, const float *l, int32_t *a, int32_t *b, int n)
{
	const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	for (int shift = 0; shift < 32; shift += 8) {
		__syncthreads(); // every thread is past the previous pass's hist[d0] read
		if (tid < 256)
			sh.hist[tid] = 0;
		__syncthreads(); // hist zeroed
		for (int j = tid; j < n; j += SB_THREADS)
			atomicAdd(&sh.hist[(sb_ord(l[a[j]]) >> shift) & 255], 1u);
		__syncthreads(); // hist complete
		const uint32_t d0 = (sb_ord(l[a[0]]) >> shift) & 255;
		if (sh.hist[d0] == (uint32_t)n) // one digit: nothing moves
			continue;
		if (tid == 0) {
			uint32_t c = 0;
			for (int d = 0; d < 256; d++) {
				sh.base[d] = c;
				c += sh.hist[d];
			}
		}
		for (int i = tid; i < SB_WARPS * 256; i += SB_THREADS)
			(&sh.u.wcnt[0][0])[i] = 0;
		__syncthreads(); // base and zeroed counts visible
		for (int t0 = 0; t0 < n; t0 += SB_THREADS) {
			const int j = t0 + tid;
			const bool valid = j < n;
			const int32_t id = valid ? a[j] : 0;
			const uint32_t dg = valid ? (sb_ord(l[id]) >> shift) & 255 : 256;
			const uint32_t peers = __match_any_sync(0xffffffffu, dg);
			const uint32_t rank = __popc(peers & ((1u << lane) - 1));
			if (valid && rank == 0)
				sh.u.wcnt[w][dg] = __popc(peers);
			__syncthreads(); // per-warp counts of the tile visible
			if (tid < 256) {
				uint32_t run = 0;
				for (int v = 0; v < SB_WARPS; v++) {
					uint32_t c = sh.u.wcnt[v][tid];
					sh.u.wcnt[v][tid] = run;
					run += c;
				}
				sh.tot[tid] = run;
			}
			__syncthreads(); // warp offsets visible
			if (valid)
				b[sh.base[dg] + sh.u.wcnt[w][dg] + rank] = id;
			__syncthreads(); // offsets read before they are advanced and cleared
			if (tid < 256) {
				sh.base[tid] += sh.tot[tid];
				for (int v = 0; v < SB_WARPS; v++)
					sh.u.wcnt[v][tid] = 0;
			}
			__syncthreads(); // next tile sees the new bases
		}
		int32_t *t = a;
		a = b;
		b = t;
	}
	return a;
}

// The cut over the sorted candidates s[0..n): the first j > 0 with q < min_p, or the first
// prefix whose running sum reaches need (>= need_hi; between need_lo and need_hi: -1, too
// near to call without the serial Z). need_lo == need_hi: sampler.c's loop.
__device__ int sb_cut_loop(sb_smem &sh, const sb_draw &d, const int32_t *s, int n, bool topp,
			   double min_p, double need_lo, double need_hi)
{
	const int tid = threadIdx.x;
	double cum = 0.0; // thread 0's, across tiles
	if (tid == 0) {
		sh.b_n = n;
		sh.b_j = 0;
	}
	for (int t0 = 0; t0 < n; t0 += SB_TILE) {
		const int end = n - t0 < SB_TILE ? n : t0 + SB_TILE;
		for (int j = t0 + tid; j < end; j += SB_THREADS)
			sh.u.t.q[j - t0] = exp(sb_x(d.l[s[j]], d.lmax, d.T));
		__syncthreads(); // the tile's q visible (and b_j's last read done)
		if (tid == 0) {
			for (int j = t0; j < end; j++) {
				double e = sh.u.t.q[j - t0];
				if (j > 0 && e < min_p) {
					sh.b_n = j;
					sh.b_j = 1;
					break;
				}
				cum += e;
				if (topp && cum >= need_hi) {
					sh.b_n = j + 1;
					sh.b_j = 1;
					break;
				}
				if (topp && cum >= need_lo) {
					sh.b_n = -1;
					sh.b_j = 1;
					break;
				}
			}
		}
		__syncthreads(); // stop flag visible
		if (sh.b_j)
			break;
	}
	const int keep = (int)sh.b_n;
	__syncthreads(); // read before reuse
	return keep;
}

// The cut of sb_cut_loop from parallel sums (need in [need_lo, need_hi], from a parallel Z):
// jm = the first j > 0 with q < min_p (exact); jA = the first j whose prefix sum may reach
// need, jB = the first that surely does (slack as sb_walk_fast). The loop stops at jm when
// jm <= jA, at jA + 1 when jA == jB; otherwise -1 (too near: the serial loop decides).
__device__ int sb_cut_fast(sb_smem &sh, const sb_draw &d, const int32_t *s, int n, bool topp,
			   double min_p, double need_lo, double need_hi)
{
	const int nt = (n + SB_TILE - 1) / SB_TILE;
	int32_t jm = INT32_MAX;
	for (int t = 0; t < nt; t++) {
		const int base = t * SB_TILE + threadIdx.x * 4;
		double sum = 0.0;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const int j = base + k;
			if (j < n) {
				const double e = exp(sb_x(d.l[s[j]], d.lmax, d.T));
				if (j > 0 && e < min_p && j < jm)
					jm = j;
				sum += e;
			}
		}
		sum = sb_sum_d(sh, sum);
		if (threadIdx.x == 0)
			sh.tsum[t + 1] = sum;
	}
	jm = sb_min_i(sh, jm);
	const int none = jm == INT32_MAX ? n : jm; // the cut when top-p never stops the loop
	if (!topp)
		return none;
	if (threadIdx.x == 0) {
		sh.tsum[0] = 0.0;
		for (int t = 0; t < nt; t++)
			sh.tsum[t + 1] += sh.tsum[t];
		sh.b_d = sh.tsum[nt];
	}
	__syncthreads(); // prefix sums visible
	const double E = SB_SLACK * sh.b_d;
	int t = 0;
	while (t < nt && !(sh.tsum[t + 1] + E >= need_lo))
		t++;
	__syncthreads(); // b_d read before reuse
	if (t == nt)
		return none;
	const int base = t * SB_TILE + threadIdx.x * 4;
	double p[4], run = 0.0;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const int j = base + k;
		run += j < n ? exp(sb_x(d.l[s[j]], d.lmax, d.T)) : 0.0;
		p[k] = run;
	}
	const double before = sh.tsum[t] + sb_scan_d(sh, run);
	int32_t ja = INT32_MAX, jb = INT32_MAX;
#pragma unroll
	for (int k = 3; k >= 0; k--) {
		const double P = before + p[k];
		if (base + k < n) {
			if (P + E >= need_lo)
				ja = base + k;
			if (P - E >= need_hi)
				jb = base + k;
		}
	}
	ja = sb_min_i(sh, ja);
	jb = sb_min_i(sh, jb);
	if (ja == INT32_MAX)
		return -1;
	if (jm <= ja)
		return jm;
	return ja == jb ? ja + 1 : -1;
}

// Steps 5-6 (sampler.c draw): of the ids d keeps (step 4), the shortest prefix of the order
// whose running sum reaches top_p * Z, cut where q < min_p; returns its last key. Only a
// prefix that the bins bound (top-p, with sampler.c's 1e-9 margin) and the min-p superset
// bound is sorted; the exact cut then runs over it in sorted order, as sampler.c's does.
__device__ uint64_t sb_cut(sb_smem &sh, const sb_draw &d, bool topp, bool minp, double top_p,
			   double min_p, int32_t *a, int32_t *b, int flags,
			   unsigned long long *diag)
{
	const bool fast = flags & SB_FAST;
	const int tid = threadIdx.x;
	double Z = 0.0;
	int bmax = SB_BINS; // candidates: bin <= bmax (SB_BINS: no bound)
	if (topp) {
		for (int i = tid; i < SB_BINS; i += SB_THREADS)
			sh.bins[i] = 0.0;
		__syncthreads(); // bins zeroed before the pass adds to them
		int32_t last;
		Z = fast ? sb_tile_sums(sh, d, true)
			 : sb_serial_sum(sh, d, true, &last); // Z in id order, as sampler.c
		const double need = __dmul_rn(__dmul_rn(top_p, Z), 1.0 + 1e-9);
		double cum = 0.0;
		for (int bi = 0; bi < SB_BINS; bi++) {
			cum += sh.bins[bi];
			if (cum >= need) {
				bmax = bi;
				break;
			}
		}
	}
	const double xmin = minp ? log(min_p) - 1e-9 : 0.0;
	// the candidates, in id order
	int n = 0;
	for (int t0 = 0; t0 < d.V; t0 += SB_TILE) {
		const int base = t0 + tid * 4;
		uint32_t flags = 0, c = 0;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			int i = base + k;
			if (i >= d.V)
				continue;
			float x = d.l[i];
			if (x == -INFINITY || sb_key(x, i) > d.thr)
				continue;
			double xx = sb_x(x, d.lmax, d.T);
			if ((!topp || sb_bin(xx) <= bmax) && (!minp || xx >= xmin)) {
				flags |= 1u << k;
				c++;
			}
		}
		int total;
		int pos = block_exclusive_scan<SB_THREADS>((int)c, &total);
#pragma unroll
		for (int k = 0; k < 4; k++)
			if (flags >> k & 1)
				a[n + pos++] = base + k;
		n += (int)total;
	}
	__syncthreads(); // a[] (global) complete for the block
	const int32_t *s = sb_sort(sh, d.l, a, b, n);
	// the cut, in sorted order; with a parallel Z, the serial Z when the cut is too near
	int keep;
	if (fast) {
		keep = sb_cut_fast(sh, d, s, n, topp, min_p,
				   __dmul_rn(top_p, __dmul_rn(Z, 1.0 - SB_SLACK)),
				   __dmul_rn(top_p, __dmul_rn(Z, 1.0 + SB_SLACK)));
		if (keep < 0 || (flags & SB_VERIFY)) {
			double need = 0.0;
			if (topp) {
				int32_t last;
				need = __dmul_rn(top_p, sb_serial_sum(sh, d, false, &last));
			}
			const int k2 = sb_cut_loop(sh, d, s, n, topp, min_p, need, need);
			if (threadIdx.x == 0 && diag)
				atomicAdd(&diag[keep < 0 ? 1 : 0], keep < 0 || keep != k2 ? 1ull : 0ull);
			keep = keep < 0 ? k2 : keep;
		}
	} else {
		const double need = __dmul_rn(top_p, Z);
		keep = sb_cut_loop(sh, d, s, n, topp, min_p, need, need);
	}
	const int32_t id = s[keep - 1];
	__syncthreads(); // read before reuse
	return sb_key(d.l[id], id);
}

// ---- log-probabilities (raw logits) ------------------------------------------------------------

__device__ void sb_logprobs(sb_smem &sh, const float *raw, int V, int32_t tok, int ntop,
			    sampler_result *o)
{
	const int tid = threadIdx.x;
	float mx = -INFINITY;
	int32_t mi = INT32_MAX;
	for (int i = tid; i < V; i += SB_THREADS)
		if (raw[i] > mx) {
			mx = raw[i];
			mi = i;
		}
	sb_argmax(sh, mx, mi);
	double s = 0.0;
	for (int i = tid; i < V; i += SB_THREADS)
		s += exp(__dsub_rn((double)raw[i], (double)mx));
	const double lse = __dadd_rn((double)mx, log(sb_sum_d(sh, s)));
	const int k = ntop < V ? ntop : V;
	if (k > 0) {
		const uint64_t thr = sb_select(sh, raw, V, k, true);
		if (tid == 0)
			sh.ntop = 0;
		__syncthreads(); // counter zeroed
		for (int i = tid; i < V; i += SB_THREADS) {
			uint64_t K = sb_key(raw[i], i);
			if (K <= thr)
				sh.topkeys[atomicAdd(&sh.ntop, 1)] = K;
		}
		__syncthreads(); // the k keys collected
	}
	if (tid == 0) {
		o->logprob = (float)__dsub_rn((double)raw[tok], lse);
		for (int j = 1; j < k; j++) { // insertion sort of k <= 20 keys
			uint64_t v = sh.topkeys[j];
			int i = j;
			for (; i > 0 && sh.topkeys[i - 1] > v; i--)
				sh.topkeys[i] = sh.topkeys[i - 1];
			sh.topkeys[i] = v;
		}
		o->n_top = k;
		for (int j = 0; j < k; j++) {
			int32_t id = (int32_t)(uint32_t)sh.topkeys[j];
			o->top_ids[j] = id;
			o->top_logprobs[j] = (float)__dsub_rn((double)raw[id], lse);
		}
	}
}

// ---- one row ---------------------------------------------------------------------------------

__device__ void sb_finish(sampler_result *o, int32_t tok, int32_t err)
{
	o->token = tok;
	o->err = err;
	o->logprob = 0.0f;
	o->n_top = 0;
	for (int j = 0; j < SB_MAX_LOGPROBS; j++) {
		o->top_ids[j] = 0;
		o->top_logprobs[j] = 0.0f;
	}
}

// Penalties on the copy pl (sampler.c apply_penalties): cnt[id] = output count | prompt bit;
// the thread whose atomicExch takes a non-zero mark penalises that id, once.
__device__ void sb_penalties(const float *raw, int V, const sampler_row &P, const int32_t *prompt,
			     const int32_t *output, float *pl, uint32_t *cnt)
{
	const int tid = threadIdx.x;
	const bool rep = P.repetition_penalty != 1.0;
	const bool freq = P.frequency_penalty != 0.0 || P.presence_penalty != 0.0;
	const float r = (float)P.repetition_penalty;
	for (int i = tid; i < V; i += SB_THREADS) {
		pl[i] = raw[i];
		cnt[i] = 0;
	}
	__syncthreads(); // copy and zeroed counts before the marks
	for (int64_t i = tid; i < P.n_output; i += SB_THREADS)
		atomicAdd(&cnt[output[i]], 1u);
	if (rep)
		for (int64_t i = tid; i < P.n_prompt; i += SB_THREADS)
			atomicOr(&cnt[prompt[i]], 0x80000000u);
	__syncthreads(); // marks complete before they are taken
	const int64_t nh = P.n_prompt + P.n_output;
	for (int64_t j = tid; j < nh; j += SB_THREADS) {
		const int32_t id = j < P.n_prompt ? prompt[j] : output[j - P.n_prompt];
		const uint32_t v = atomicExch(&cnt[id], 0u);
		if (!v)
			continue;
		const uint32_t c = v & 0x7fffffffu;
		float x = pl[id];
		if (rep)
			x = x > 0.0f ? x / r : x * r;
		if (c && freq)
			x = (float)__dsub_rn(__dsub_rn((double)x,
						       __dmul_rn((double)c, P.frequency_penalty)),
					     P.presence_penalty);
		pl[id] = x;
	}
	__syncthreads(); // pl final
}

__device__ void sb_row(sb_smem &sh, const float *raw, int V, const sampler_row &P,
		       const int32_t *hist, sampler_result *o, float *pl, int32_t *a, int32_t *b,
		       int flags, unsigned long long *diag)
{
	const int tid = threadIdx.x;
	const int32_t *prompt = hist + P.prompt_off, *output = hist + P.output_off;
	int bad = 0;
	for (int64_t i = tid; i < P.n_prompt; i += SB_THREADS)
		bad |= (uint32_t)prompt[i] >= (uint32_t)V;
	for (int64_t i = tid; i < P.n_output; i += SB_THREADS)
		bad |= (uint32_t)output[i] >= (uint32_t)V;
	if (__syncthreads_or(bad)) {
		if (tid == 0)
			sb_finish(o, -1, SB_EINVAL);
		return;
	}
	const float *l = raw;
	if (P.repetition_penalty != 1.0 || P.frequency_penalty != 0.0 ||
	    P.presence_penalty != 0.0) {
		sb_penalties(raw, V, P, prompt, output, pl, (uint32_t *)a);
		l = pl;
	}
	// the checks, the argmax (ties: lowest id), the finite count
	float best = -INFINITY;
	int32_t tok = INT32_MAX;
	int64_t nfin = 0;
	bad = 0;
	for (int i = tid; i < V; i += SB_THREADS) {
		float x = l[i];
		bad |= x != x || x == INFINITY;
		if (x > best) {
			best = x;
			tok = i;
		}
		nfin += x != -INFINITY;
	}
	if (__syncthreads_or(bad)) {
		if (tid == 0)
			sb_finish(o, -1, SB_EDOM);
		return;
	}
	sb_argmax(sh, best, tok);
	if (tok == INT32_MAX) { // every logit -inf
		if (tid == 0)
			sb_finish(o, -1, SB_EDOM);
		return;
	}
	nfin = sb_sum_i(sh, nfin);
	if (P.temperature != 0.0) {
		const bool topp = P.top_p < 1.0, minp = P.min_p > 0.0;
		const bool want_k = P.top_k > 0 && P.top_k < V;
		sb_draw d = {l, V, (double)best, P.temperature, ~0ull};
		if (want_k && P.top_k < nfin)
			d.thr = sb_select(sh, l, V, P.top_k, false);
		if (topp || minp)
			d.thr = sb_cut(sh, d, topp, minp, P.top_p, P.min_p, a, b, flags, diag);
		const double u = sb_uniform(P.seed, P.index);
		if (flags & SB_FAST) {
			tok = sb_walk_fast(sh, d, u);
			if (tok < 0 || (flags & SB_VERIFY)) {
				const int32_t t2 = sb_walk(sh, d, u);
				if (threadIdx.x == 0 && diag)
					atomicAdd(&diag[tok < 0 ? 1 : 0],
						  tok < 0 || tok != t2 ? 1ull : 0ull);
				tok = tok < 0 ? t2 : tok;
			}
		} else {
			tok = sb_walk(sh, d, u);
		}
	}
	if (tid == 0)
		sb_finish(o, tok, 0);
	__syncthreads(); // o's defaults written before the logprobs fill it
	if (P.logprobs)
		sb_logprobs(sh, raw, V, tok, P.top_logprobs, o);
}

extern "C" __global__ void __launch_bounds__(SB_THREADS, 1)
k_sampler(const float *__restrict__ logits, long long ld, int V, int n_rows,
	  const sampler_row *__restrict__ rows, const int32_t *__restrict__ hist,
	  sampler_result *__restrict__ out, unsigned char *__restrict__ ws, long long slot_bytes,
	  int flags, unsigned long long *__restrict__ diag)
{
	__shared__ sb_smem sh;
	const long long vp = (V + 63) / 64 * 64;
	float *pl = (float *)(ws + blockIdx.x * slot_bytes);
	int32_t *a = (int32_t *)(pl + vp), *b = a + vp;
	for (int r = blockIdx.x; r < n_rows; r += gridDim.x) {
		const sampler_row P = rows[r];
		sb_row(sh, logits + r * ld, V, P, hist, out + r, pl, a, b, flags, diag);
		__syncthreads(); // the slot's scratch and shared memory are free for the next row
	}
}
