// swiglu.cu — the SwiGLU of the dense MLP and the experts (spec §3.8):
// h = bf16( silu(fp32(g)) * fp32(u) ), silu(z) = z / (1 + exp(-z)).
//
// k_swiglu: gu bf16 [T, 2*inter] holding [g | u] per row (the fused gate+up output), out bf16
// [T, inter]. Grid-stride over T*inter elements.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
k_swiglu(const uint16_t *__restrict__ gu, uint16_t *__restrict__ out, int inter, long long n)
{
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		const long long t = i / inter, j = i % inter;
		const float g = bf16_to_f32(gu[t * 2 * inter + j]);
		const float u = bf16_to_f32(gu[t * 2 * inter + inter + j]);
		out[i] = f32_to_bf16(g / (1.0f + expf(-g)) * u);
	}
}
