/*
 * cu.c — dlopen of libcuda.so.1 and resolution of the driver function table.
 *
 * Owns: the process-wide table `cu` and the error reporting of driver calls.
 * Must not: know about models or kernels.
 */
#include "driver/cu.h"

#include <errno.h>
#include <stdio.h>

#ifdef DSV32_NO_CUDA

int cu_load(struct err *e)
{
#ifdef DSV32_STATIC
	return err_set(e, -ENOTSUP, "this is a static build: it carries the CPU backend only "
				    "(a static binary cannot load the NVIDIA driver)");
#else
	return err_set(e, -ENOTSUP, "built without the CUDA headers: CPU backend only");
#endif
}

#else

#include <dlfcn.h>
#include <pthread.h>

struct cu_api cu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_result;
static char load_msg[512];

int cu_check(CUresult r, const char *call, const char *file, int line)
{
	if (r == CUDA_SUCCESS)
		return 0;
	const char *name = NULL, *text = NULL;
	if (cu.cuGetErrorName)
		cu.cuGetErrorName(r, &name);
	if (cu.cuGetErrorString)
		cu.cuGetErrorString(r, &text);
	fprintf(stderr, "<3>dsv32: %s (%s) in %s at %s:%d\n", name ? name : "CUDA error",
		text ? text : "?", call, file, line);
	return -EIO;
}

static void load(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		load_result = -ENODEV;
		snprintf(load_msg, sizeof load_msg, "no NVIDIA driver: dlopen(libcuda.so.1): %s",
			 dlerror());
		return;
	}
	/* cuGetProcAddress_v2 (CUDA >= 12) returns the entry point matching our header's ABI. */
	__typeof__(cuGetProcAddress) *get = (__typeof__(cuGetProcAddress) *)dlsym(lib, "cuGetProcAddress_v2");
	if (!get) {
		load_result = -ENODEV;
		snprintf(load_msg, sizeof load_msg,
			 "libcuda.so.1 has no cuGetProcAddress_v2: driver older than CUDA 12");
		return;
	}
	CUdriverProcAddressQueryResult status;
#define CU_RESOLVE(name)                                                                         \
	if (get(#name, (void **)&cu.name, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) ||  \
	    !cu.name) {                                                                          \
		load_result = -ENODEV;                                                           \
		snprintf(load_msg, sizeof load_msg,                                              \
			 "the driver lacks %s for CUDA %d (status %d): driver too old?", #name,  \
			 CUDA_VERSION, (int)status);                                             \
		return;                                                                          \
	}
	CU_FUNCS(CU_RESOLVE)
#undef CU_RESOLVE
	CUresult r = cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		const char *name = "?";
		cu.cuGetErrorName(r, &name);
		load_result = -ENODEV;
		snprintf(load_msg, sizeof load_msg, "cuInit failed: %s (no usable GPU?)", name);
		return;
	}
	int ver = 0;
	cu.cuDriverGetVersion(&ver);
	if (ver < CUDA_VERSION) {
		load_result = -ENODEV;
		snprintf(load_msg, sizeof load_msg,
			 "the driver supports CUDA %d.%d; this build needs %d.%d", ver / 1000,
			 ver % 1000 / 10, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
		return;
	}
	load_result = 0;
}

int cu_load(struct err *e)
{
	pthread_once(&load_once, load);
	if (load_result)
		return err_set(e, load_result, "%s", load_msg);
	return 0;
}

#endif
