// gemm_scale_layout.cu — layout conversions around cuBLASLt's FP8 GEMM: the activation scales
// in the layout its VEC128_32F mode reads, and the transpose of its output when it computes y^T.
//
// act_quant writes sx[M, K/128] (a token's K blocks contiguous); cuBLASLt reads VEC128_32F
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

// k_bf16_transpose: dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols (bf16),
// through a 32x32 shared tile so both sides are coalesced. Grid (ceil(cols/32), ceil(rows/32)),
// block (32, 8). Used when cuBLASLt computes y^T (activations as its A operand).
extern "C" __global__ void __launch_bounds__(256)
k_bf16_transpose(const uint16_t *__restrict__ src, long long ld_src, uint16_t *__restrict__ dst,
		 long long ld_dst, int rows, int cols)
{
	__shared__ uint16_t tile[32][33]; // +1: no bank conflicts on the transposed read
	const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32, tx = threadIdx.x;
	for (int i = threadIdx.y; i < 32; i += 8) {
		const int r = r0 + i, c = c0 + tx;
		if (r < rows && c < cols)
			tile[i][tx] = src[(long long)r * ld_src + c];
	}
	__syncthreads();
	for (int i = threadIdx.y; i < 32; i += 8) {
		const int c = c0 + i, r = r0 + tx;
		if (r < rows && c < cols)
			dst[(long long)c * ld_dst + r] = tile[tx][i];
	}
}
