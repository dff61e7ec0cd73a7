/*
 * bench_gpu.c — synthetic GPU data and the read-limit and copy-limit probes of the benchmarks
 * (bench_gpu.h).
 */
#include "tools/cli/bench_gpu.h"
#include "tools/cli/bench_sort.h"

#ifndef DSV32_NO_CUDA

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int bench_fill_e4m3(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed)
{
	void *args[] = {&p, &n, &seed};
	return gpu_launch(g, gpu_kernel(g, "k_fill_e4m3"), (unsigned)g->sm_count * 8, 1, 1, 256, 1,
			  1, 0, args);
}

int bench_fill_e4m3_normal(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed,
			   float sigma)
{
	void *args[] = {&p, &n, &seed, &sigma};
	return gpu_launch(g, gpu_kernel(g, "k_fill_e4m3_normal"), (unsigned)g->sm_count * 8, 1, 1,
			  256, 1, 1, 0, args);
}

int bench_fill_pow2(struct gpu *g, gpu_ptr p, long long n, unsigned long long seed, int lo, int hi)
{
	void *args[] = {&p, &n, &seed, &lo, &hi};
	return gpu_launch(g, gpu_kernel(g, "k_fill_f32_pow2"), (unsigned)g->sm_count * 4, 1, 1, 256,
			  1, 1, 0, args);
}

/* One pass of a probe: 0 or a CUresult. */
struct probe {
	struct gpu *g;
	void *fn, **args;     /* a kernel launch (fn), or */
	gpu_ptr dst, src;     /* a copy of n bytes */
	size_t n;
};

static int probe_once(const struct probe *p)
{
	if (p->fn)
		return gpu_launch(p->g, p->fn, (unsigned)p->g->sm_count * 4, 1, 1, 512, 1, 1, 0, p->args);
	return cu.cuMemcpyDtoDAsync(p->dst, p->src, p->n, p->g->stream) != CUDA_SUCCESS;
}

/* Median milliseconds of one pass over `trials` timings of 3 passes (after one warm-up), or a
 * negative value when a GPU call failed. */
static double probe_ms(const struct probe *p, int trials)
{
	const int reps = 3;
	float t[32];
	trials = trials < 1 ? 1 : trials > 32 ? 32 : trials;
	CUevent ev[2];
	if (gpu_timing_events(ev))
		return -1;
	int r = probe_once(p);
	for (int k = 0; k < trials && !r; k++) {
		cu.cuEventRecord(ev[0], p->g->stream);
		for (int i = 0; i < reps && !r; i++)
			r = probe_once(p);
		cu.cuEventRecord(ev[1], p->g->stream);
		r = r || cu_check(cu.cuEventSynchronize(ev[1]), "cuEventSynchronize", __FILE__, __LINE__);
		cu.cuEventElapsedTime(&t[k], ev[0], ev[1]);
		t[k] /= (float)reps;
	}
	gpu_timing_events_free(ev);
	if (r)
		return -1;
	qsort(t, (size_t)trials, sizeof *t, bench_cmp_float);
	return t[trials / 2];
}

double bench_tensor_peak(const struct gpu *g, int fp8, double *mhz)
{
	CUdevice dev;
	int khz = 0;
	if (cu.cuDeviceGet(&dev, g->ordinal) != CUDA_SUCCESS ||
	    cu.cuDeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev) != CUDA_SUCCESS)
		khz = 0;
	if (mhz)
		*mhz = khz / 1e3;
	/* dense FLOP a clock an SM: four tensor cores, each 1024 FP8 (512 bf16) multiply-adds */
	const int per_sm = g->cc_major == 9 && g->cc_minor == 0 ? (fp8 ? 8192 : 4096) : 0;
	return (double)g->sm_count * khz * 1e3 * per_sm / 1e12;
}

double bench_read_limit(struct gpu *g, int trials)
{
	long long n16 = (4ll << 30) / 16;
	gpu_ptr buf, sink;
	if (cu_check(cu.cuMemAlloc(&buf, (size_t)n16 * 16), "cuMemAlloc", __FILE__, __LINE__))
		return -1;
	if (cu_check(cu.cuMemAlloc(&sink, 8), "cuMemAlloc", __FILE__, __LINE__)) {
		cu.cuMemFree(buf);
		return -1;
	}
	bench_fill_e4m3(g, buf, n16 * 16, 1);
	void *args[] = {&buf, &n16, &sink};
	struct probe p = {.g = g, .fn = gpu_kernel(g, "k_read_bw"), .args = args};
	double ms = probe_ms(&p, trials);
	cu.cuMemFree(buf);
	cu.cuMemFree(sink);
	return ms > 0 ? (double)n16 * 16 / (ms * 1e-3) / 1e12 : -1;
}

double bench_copy_limit(struct gpu *g, int trials)
{
	const size_t n = 2ull << 30;
	gpu_ptr a, b;
	if (cu_check(cu.cuMemAlloc(&a, n), "cuMemAlloc", __FILE__, __LINE__))
		return -1;
	if (cu_check(cu.cuMemAlloc(&b, n), "cuMemAlloc", __FILE__, __LINE__)) {
		cu.cuMemFree(a);
		return -1;
	}
	bench_fill_e4m3(g, a, (long long)n, 2);
	struct probe p = {.g = g, .dst = b, .src = a, .n = n};
	double ms = probe_ms(&p, trials);
	cu.cuMemFree(a);
	cu.cuMemFree(b);
	return ms > 0 ? 2.0 * (double)n / (ms * 1e-3) / 1e12 : -1;
}

/* NVML, as bench_energy_mj uses it (nvml.h's signatures; 0 = NVML_SUCCESS) */
static struct {
	int state; /* 0: not tried, 1: ready, -1: absent */
	void *dev; /* nvmlDevice_t */
	int (*energy)(void *dev, unsigned long long *mj);
} nvml;

static int nvml_open(struct gpu *g)
{
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return -1;
	int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
	int (*by_bus)(const char *, void **) =
		(int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
	nvml.energy = (int (*)(void *, unsigned long long *))dlsym(
		lib, "nvmlDeviceGetTotalEnergyConsumption");
	CUdevice d;
	int dom = 0, bus = 0, dev = 0;
	if (!init || !by_bus || !nvml.energy || init() != 0 || cu.cuDeviceGet(&d, g->ordinal) ||
	    cu.cuDeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d) ||
	    cu.cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d) ||
	    cu.cuDeviceGetAttribute(&dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d))
		return -1;
	char id[40];
	snprintf(id, sizeof id, "%08x:%02x:%02x.0", (unsigned)dom, (unsigned)bus, (unsigned)dev);
	if (by_bus(id, &nvml.dev) != 0) { /* (the 4-digit domain of older drivers) */
		snprintf(id, sizeof id, "%04x:%02x:%02x.0", (unsigned)dom, (unsigned)bus, (unsigned)dev);
		if (by_bus(id, &nvml.dev) != 0)
			return -1;
	}
	return 1;
}

long long bench_energy_mj(struct gpu *g)
{
	if (!nvml.state)
		nvml.state = nvml_open(g);
	unsigned long long mj;
	return nvml.state == 1 && nvml.energy(nvml.dev, &mj) == 0 ? (long long)mj : -1;
}

#endif
