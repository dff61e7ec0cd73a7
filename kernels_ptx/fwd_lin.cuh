// fwd_lin.cuh — pieces of the forward's bf16 products shared by fwd_glue.cu and fwd_fused.cu:
// the row count of the few-row kernels, their output store and the fixed-order chunk product of
// k_fwd_gemv / k_fwd_gemv_ks (also inside k_fwd_idx_qw); the programmatic-dependent-launch
// steps of the forward's kernels. Device code only.
#pragma once
#include "common.cuh"

// Programmatic dependent launch (model/cuda_fwd.h, LAUNCH_PDL). pdl_trigger: the next kernel in
// the stream may be scheduled now (it runs what does not depend on this grid, e.g. its weight
// loads, then waits in its own pdl_wait for this grid to complete). pdl_wait: returns when the
// previous kernel has completed and its writes are visible; before it a kernel may read only
// constant data (weights), never an activation (even one written kernels earlier: the previous
// kernel may itself have triggered before its own wait), and may write nothing. Every kernel
// launched that way waits in every block (so a grid completes after its predecessor: the order
// stays transitive). Both are no-ops in a kernel launched without the attribute.
// ld.global.nc (__ldg, or what the compiler makes of a const __restrict__ pointer) of what an
// earlier kernel wrote is not ordered by the wait: ptxas treats non-coherent loads as reads of
// data no one writes while the kernel lives and may move them above it (SASS: LDG.E.*.CONSTANT
// before ACQBULK; session 24 found one of x's loads so moved in k_moe_gate_logits1s, whose x is
// now read by ordinary loads). Many kernels still read activations that way after the wait
// (ordinary loads cost the decode GEMMs 13-52 us a step, session 24), so after any kernel change
// tools/pdl_audit.py (tools/gpu_session.sh runs it on the GPU machine) must list no kernel;
// where it lists one, make the moved load ordinary (.ca) or .cg.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// e4m3 code b (low 8 bits) -> fp32 on the integer and FMA pipes: its sign, exponent and mantissa
// fields placed in an fp32 (exponent field at bit 23, mantissa at bit 20) are the value times
// 2^-120 (bias 7 vs 127; subnormal codes land on fp32 subnormals with the same scaling), so one
// exact multiply by 2^120 gives it. The same value as e4m3_to_f32 for every code but the NaNs
// (0x7f, 0xff give +-480; quantised weights never hold them); checked on the CPU for all 256
// codes. For the one-row products, where e4m3_to_f32's conversion instructions (cvt e4m3x2 ->
// f16x2, then f16 -> f32: one element per weight byte, no reuse at one row) are the bound.
__device__ __forceinline__ float e4m3_to_f32_alu(uint32_t b)
{
	return __fmul_rn(__uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)), 0x1p120f);
}

#define LIN_ROWS 4

// y[m, v] = val: fp32 to y32, or bf16 (rounded once) to y16 when y32 is null; row stride ldy.
__device__ __forceinline__ void lin_out(float *__restrict__ y32, uint16_t *__restrict__ y16, int ldy,
					int m, int v, float val)
{
	if (y32)
		y32[(size_t)m * ldy + v] = val;
	else
		y16[(size_t)m * ldy + v] = f32_to_bf16(val);
}

// acc[m] += the 8 products of weight chunk q (16 bytes: columns 8c .. 8c+7) with row m of x, in
// column order, fused multiply-adds (k_fwd_gemv's fixed order), for m < M <= LIN_ROWS.
__device__ __forceinline__ void gemv_chunk(float acc[LIN_ROWS], const uint4 q,
					   const uint16_t *__restrict__ x, int ldx, int c, int M)
{
	const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
	for (int m = 0; m < LIN_ROWS; m++) {
		if (m >= M)
			break;
		const uint4 xq = reinterpret_cast<const uint4 *>(x + (size_t)m * ldx)[c];
		const uint32_t xw[4] = {xq.x, xq.y, xq.z, xq.w};
#pragma unroll
		for (int k = 0; k < 4; k++) {
			acc[m] = fmaf(__uint_as_float(wq[k] << 16), __uint_as_float(xw[k] << 16), acc[m]);
			acc[m] = fmaf(__uint_as_float(wq[k] & 0xffff0000u),
				      __uint_as_float(xw[k] & 0xffff0000u), acc[m]);
		}
	}
}

