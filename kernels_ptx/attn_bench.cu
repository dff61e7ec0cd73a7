// attn_bench.cu — probes `dsv32 bench attention` uses to explain the fixed costs of the batch-1
// attention kernels (no model arithmetic here):
//   k_attn_spin: block 0's thread 0 spins for `cycles` SM clock cycles (clock64), so the event
//     time of one launch gives the SM clock the kernels run at;
//   k_attn_empty: does nothing; back-to-back launches give the launch-to-launch cost, and with
//     ~200 KB of dynamic shared memory (as k_mla_decode) against none, the cost of switching the
//     shared-memory carveout between consecutive kernels.
#include "common.cuh"

extern "C" __global__ void k_attn_spin(long long cycles, int *out)
{
	if (blockIdx.x || threadIdx.x)
		return;
	const long long t0 = clock64();
	long long t = t0;
	int spins = 0;
	while (t - t0 < cycles)
		t = clock64(), spins++;
	if (out)
		*out = spins;
}

extern "C" __global__ void k_attn_empty(int *out)
{
	if (out && !blockIdx.x && !threadIdx.x)
		*out = 1;
}
