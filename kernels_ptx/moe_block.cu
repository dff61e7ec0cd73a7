// moe_block.cu — the pieces of the MoE block (spec §3.9) around the expert GEMMs: the router
// logits, the gather of the quantised rows by expert, and SwiGLU fused with the act_quant of the
// down projection's input. Launchers: model/cuda_moe.c.
//
// k_moe_gate_logits: logits fp32 [T, E] = x bf16 [T, D] · W bf16 [E, D]^T in the CPU's
//   summation order (model/cpu_ops.c cpu_dot_bf16): eight partial sums, partial j adding the
//   products of k = j, j+8, j+16, ... in ascending k, then the fixed tree
//   ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)). A bf16 x bf16 product is exact in fp32, so the FMA
//   equals the CPU's multiply-then-add, and the logits are bit-identical to the CPU's: the
//   routing agrees even at near ties. D % 8 == 0, E % 2 == 0.
//   Block: 2 experts (their rows staged in shared memory: 2 * D * 2 bytes dynamic) x 8 partials
//   x 16 token slots; each thread runs one partial sum for TM tokens (t, t+16, ...). Grid
//   (E / 2, ceil(T / (16 * TM))). The partials of one (token, expert) are 8 adjacent lanes,
//   reduced by shuffles xor 1, 2, 4 — which is exactly the tree above.
// k_moe_gather_q: xs8[r] = x8[src[r]] (e4m3 [.., D]) and sxs[r] = sx[src[r]] (fp32 [.., D/128]):
//   the quantised input rows in expert-sorted order (quantising x once then gathering gives the
//   numbers of quantising each gathered row). One block per sorted row; D % 16 == 0.
// k_moe_swiglu_quant: h = bf16( silu(g) * u ) of the fused gate|up output gu bf16 [R, 2I]
//   (gate columns first), then act_quant per 128 (spec §5.3) -> h8 e4m3 [R, I], hs fp32
//   [R, I/128]: the CPU's cpu_swiglu followed by the cpu_act_quant inside cpu_fp8_linear.
//   One warp per 128-group, 4 values per lane; grid covers R * I / 128 groups, 8 warps a block.
#include "common.cuh"

template <int TM>
__device__ __forceinline__ void gate_logits(const uint16_t *__restrict__ W,
					    const uint16_t *__restrict__ x,
					    float *__restrict__ logits, int T, int E, int D)
{
	extern __shared__ uint4 gate_w4[]; // [2, D] bf16: this block's two expert rows
	const uint16_t *wsm = reinterpret_cast<const uint16_t *>(gate_w4);
	const int e0 = blockIdx.x * 2;
	const uint4 *src = reinterpret_cast<const uint4 *>(W + (size_t)e0 * D);
	for (int i = threadIdx.x; i < 2 * D / 8; i += blockDim.x)
		gate_w4[i] = src[i];
	__syncthreads(); // both rows staged
	const int j = threadIdx.x & 7, slot = (threadIdx.x >> 3) & 15, el = threadIdx.x >> 7;
	const int t0 = blockIdx.y * 16 * TM + slot;
	float p[TM];
	const uint16_t *xr[TM];
#pragma unroll
	for (int m = 0; m < TM; m++) {
		p[m] = 0.f;
		const int t = min(t0 + 16 * m, T - 1); // rows past T compute a copy, never stored
		xr[m] = x + (size_t)t * D + j;
	}
	const uint16_t *wr = wsm + (size_t)el * D + j;
#pragma unroll 4
	for (int k = 0; k < D; k += 8) {
		const float w = bf16_to_f32(wr[k]);
#pragma unroll
		for (int m = 0; m < TM; m++) // exact product: fma == the CPU's multiply, then add
			p[m] = fmaf(bf16_to_f32(xr[m][k]), w, p[m]);
	}
#pragma unroll
	for (int m = 0; m < TM; m++) {
		float v = p[m];
		v += __shfl_xor_sync(0xffffffffu, v, 1); // (p0+p1), (p2+p3), ...
		v += __shfl_xor_sync(0xffffffffu, v, 2); // ((p0+p1)+(p2+p3)), ...
		v += __shfl_xor_sync(0xffffffffu, v, 4); // the whole tree
		const int t = t0 + 16 * m;
		if (j == 0 && t < T)
			logits[(size_t)t * E + e0 + el] = v;
	}
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_gate_logits(const uint16_t *__restrict__ W, const uint16_t *__restrict__ x,
		  float *__restrict__ logits, int T, int E, int D)
{
	gate_logits<1>(W, x, logits, T, E, D);
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_gate_logits_m4(const uint16_t *__restrict__ W, const uint16_t *__restrict__ x,
		     float *__restrict__ logits, int T, int E, int D)
{
	gate_logits<4>(W, x, logits, T, E, D);
}

extern "C" __global__ void __launch_bounds__(128)
k_moe_gather_q(const uint8_t *__restrict__ x8, const float *__restrict__ sx,
	       const int *__restrict__ src, uint8_t *__restrict__ xs8, float *__restrict__ sxs,
	       int D)
{
	const int r = blockIdx.x, s = src[r];
	const uint4 *from = reinterpret_cast<const uint4 *>(x8 + (size_t)s * D);
	uint4 *to = reinterpret_cast<uint4 *>(xs8 + (size_t)r * D);
	for (int i = threadIdx.x; i < D / 16; i += blockDim.x)
		to[i] = from[i];
	const int KB = D / 128;
	for (int i = threadIdx.x; i < KB; i += blockDim.x)
		sxs[(size_t)r * KB + i] = sx[(size_t)s * KB + i];
}

extern "C" __global__ void __launch_bounds__(256)
k_moe_swiglu_quant(const uint16_t *__restrict__ gu, uint8_t *__restrict__ h8,
		   float *__restrict__ hs, int I, long long n_groups)
{
	const long long group = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	if (group >= n_groups)
		return;
	const int per_row = I / 128;
	const long long row = group / per_row;
	const int c = (int)(group % per_row);
	const uint16_t *gp = gu + row * 2 * I + c * 128 + lane * 4;
	const uint2 graw = *reinterpret_cast<const uint2 *>(gp);
	const uint2 uraw = *reinterpret_cast<const uint2 *>(gp + I);
	const uint32_t gw[2] = {graw.x, graw.y}, uw[2] = {uraw.x, uraw.y};
	float v[4];
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const float g = bf16_to_f32((uint16_t)(gw[k >> 1] >> (16 * (k & 1))));
		const float u = bf16_to_f32((uint16_t)(uw[k >> 1] >> (16 * (k & 1))));
		const float silu = __fdiv_rn(g, 1.0f + expf(-g));
		v[k] = bf16_to_f32(f32_to_bf16(__fmul_rn(silu, u)));
	}
	// act_quant of the 128 values (as warp_act_quant128, on values already in registers)
	float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
	amax = fmaxf(warp_max(amax), 1e-4f);
	const float sc = ue8m0_scale(amax);
	uint32_t packed = 0;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const float y = fminf(fmaxf(v[k] / sc, -448.f), 448.f); // exact: sc is a power of two
		packed |= (uint32_t)f32_to_e4m3(y) << (8 * k);
	}
	*reinterpret_cast<uint32_t *>(h8 + row * I + c * 128 + lane * 4) = packed;
	if (lane == 0)
		hs[group] = sc;
}
