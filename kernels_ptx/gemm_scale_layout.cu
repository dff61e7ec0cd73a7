// gemm_scale_layout.cu — the activation scales in the layout cuBLASLt's VEC128_32F mode reads.
//
// act_quant writes sx[M, K/128] (a token's K blocks contiguous); cuBLASLt reads its B-operand
// scales with the token index contiguous, sxT[K/128, M]. k_f32_transpose is that transpose,
// one thread per output element (writes coalesced; the source is a few KB and stays in L1/L2).
#include "common.cuh"

// dst[c * rows + r] = src[r * cols + c] for r < rows, c < cols.
extern "C" __global__ void __launch_bounds__(256)
k_f32_transpose(const float *__restrict__ src, float *__restrict__ dst, int rows, int cols)
{
	const long long n = (long long)rows * cols;
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		const int c = (int)(i / rows), r = (int)(i % rows);
		dst[i] = src[(long long)r * cols + c];
	}
}
