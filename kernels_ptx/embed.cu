// embed.cu — embedding gather (spec §3.1): out[t] = table[ids[t]], bf16 rows, no scaling.
//
// k_embed: table bf16 [vocab, dim], ids int32 [T], out bf16 [T, dim]; dim % 8 == 0.
// One block per token; 16-byte copies. ids are validated by the host before the launch.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
k_embed(const uint16_t *__restrict__ table, const int *__restrict__ ids,
	uint16_t *__restrict__ out, int dim)
{
	const int t = blockIdx.x;
	const uint4 *src = reinterpret_cast<const uint4 *>(table + (size_t)ids[t] * dim);
	uint4 *dst = reinterpret_cast<uint4 *>(out + (size_t)t * dim);
	for (int i = threadIdx.x; i < dim / 8; i += blockDim.x)
		dst[i] = src[i];
}
