/*
 * cu.h — the CUDA driver API, loaded at run time. The only header that includes cuda.h.
 *
 * libcuda.so.1 is opened with dlopen and every entry point is resolved once through
 * cuGetProcAddress for the API version we were built against, into the table `cu`.
 * Call as cu.cuMemAlloc(...). Every call's result goes through CU_TRY / cu_check, which name
 * the call, the site and the driver's error name.
 *
 * Builds without the CUDA headers (no toolkit) or static (musl cannot dlopen a glibc driver)
 * define DSV32_NO_CUDA: cu_load() then fails with a clear message and the CPU backend runs.
 */
#ifndef DSV32_CU_H
#define DSV32_CU_H

#include "model/err.h"

#if !defined(DSV32_STATIC) && __has_include(<cuda.h>)
#include <cuda.h>
#else
#define DSV32_NO_CUDA 1
#endif

#ifndef DSV32_NO_CUDA

/* Every driver function we use. The macro argument is the documented base name; cuda.h may
 * map it to a versioned symbol (cuMemAlloc -> cuMemAlloc_v2), which the table follows.
 * Name the base of the ABI we call: cuda.h maps cuGraphInstantiate to
 * cuGraphInstantiateWithFlags, but cuGetProcAddress("cuGraphInstantiate") returns the old
 * five-argument function, so the table lists cuGraphInstantiateWithFlags itself. */
#define CU_FUNCS(X)                                                                           \
	X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                 \
	X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute)         \
	X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)          \
	X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize)                             \
	X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute)  \
	X(cuModuleGetGlobal)                                                                   \
	X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)                           \
	X(cuOccupancyMaxActiveClusters)                                                       \
	X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                           \
	X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime)         \
	X(cuEventDestroy) X(cuStreamWaitEvent)                                                \
	X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuMemsetD8) X(cuMemsetD8Async)           \
	X(cuMemsetD32Async)                                                                   \
	X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyHtoDAsync)                  \
	X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemHostAlloc) X(cuMemFreeHost)          \
	X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease)             \
	X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAllocationGranularity)          \
	X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags)        \
	X(cuGraphLaunch) \
	X(cuGraphExecDestroy) X(cuGraphDestroy)                                               \
	X(cuTensorMapEncodeTiled)

struct cu_api {
#define CU_MEMBER(name) __typeof__(name) *name;
	CU_FUNCS(CU_MEMBER)
#undef CU_MEMBER
};

extern struct cu_api cu;

/* Logs "<3>dsv32: CUDA_ERROR_X (text) in CALL at FILE:LINE" and returns -EIO; 0 on success. */
int cu_check(CUresult r, const char *call, const char *file, int line);

#define CU_TRY(call)                                                       \
	do {                                                               \
		int cu_r_ = cu_check((call), #call, __FILE__, __LINE__);   \
		if (cu_r_)                                                 \
			return cu_r_;                                      \
	} while (0)

#endif /* DSV32_NO_CUDA */

/* Opens libcuda.so.1, resolves the table and calls cuInit. Idempotent. 0, or -ENODEV /
 * -ENOTSUP with e saying why (no driver, no GPU, static or header-less build). */
int cu_load(struct err *e);

#endif
