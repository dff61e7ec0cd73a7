/*
 * gpu.c — device, modules, launches and memory regions on the CUDA driver API (see gpu.h).
 * Compiled only when the CUDA headers are present and the build is not static.
 */
#include "driver/gpu.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/kernels.h"

/* ---- device and modules ------------------------------------------------------------------- */

static int load_module(struct gpu *g, const struct kernel_image *ki, CUmodule *mod,
		       struct err *e)
{
	char log[8192] = "", info[2048] = "";
	CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
			       CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
	void *vals[] = {log, (void *)(uintptr_t)sizeof log, info, (void *)(uintptr_t)sizeof info};
	CUresult r = CUDA_ERROR_INVALID_IMAGE;
	/* The cubin is exact sm_90a code; use it on sm_90 devices, else JIT the PTX. */
	if (ki->cubin && g->cc_major == 9 && g->cc_minor == 0)
		r = cu.cuModuleLoadDataEx(mod, ki->cubin, 4, opts, vals);
	if (r != CUDA_SUCCESS)
		r = cu.cuModuleLoadDataEx(mod, ki->ptx, 4, opts, vals);
	if (r != CUDA_SUCCESS) {
		const char *name = "?";
		cu.cuGetErrorName(r, &name);
		return err_set(e, -EIO, "loading kernel module %s failed: %s; JIT log: %s",
			       ki->name, name, log[0] ? log : "(empty)");
	}
	return 0;
}

int gpu_open(struct gpu *g, int ordinal, struct err *e)
{
	memset(g, 0, sizeof *g);
	int r = cu_load(e);
	if (r)
		return r;
	int count = 0;
	if (cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count <= ordinal)
		return err_set(e, -ENODEV, "GPU %d not present (%d visible)", ordinal, count);
	CUdevice dev;
	CU_TRY(cu.cuDeviceGet(&dev, ordinal));
	g->ordinal = ordinal;
	CU_TRY(cu.cuDeviceGetName(g->name, sizeof g->name, dev));
	CU_TRY(cu.cuDeviceGetAttribute(&g->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
	CU_TRY(cu.cuDeviceGetAttribute(&g->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
	CU_TRY(cu.cuDeviceGetAttribute(&g->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
	CU_TRY(cu.cuDeviceGetAttribute(&g->smem_block_optin,
				       CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev));
	CU_TRY(cu.cuDeviceTotalMem(&g->total_mem, dev));
	CUcontext ctx;
	CU_TRY(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
	g->ctx = ctx;
	CU_TRY(cu.cuCtxSetCurrent(ctx));
	CUstream s;
	CU_TRY(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	g->stream = s;
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ordinal}};
	CU_TRY(cu.cuMemGetAllocationGranularity(&g->granularity, &prop,
						CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	g->modules = calloc((size_t)n_kernel_images + 1, sizeof *g->modules);
	if (!g->modules)
		return err_set(e, -ENOMEM, "out of memory");
	for (int i = 0; i < n_kernel_images; i++) {
		CUmodule m;
		if ((r = load_module(g, &kernel_images[i], &m, e)))
			return r;
		g->modules[i] = m;
		g->n_modules++;
	}
	return 0;
}

void gpu_close(struct gpu *g)
{
	if (!g->ctx)
		return;
	cu.cuCtxSetCurrent(g->ctx);
	for (int i = 0; i < g->n_modules; i++)
		cu.cuModuleUnload(g->modules[i]);
	free(g->modules);
	free(g->fns);
	for (int i = 0; i < g->n_globals; i++)
		free(g->globals[i].name);
	free(g->globals);
	if (g->stream)
		cu.cuStreamDestroy(g->stream);
	CUdevice dev;
	if (cu.cuDeviceGet(&dev, g->ordinal) == CUDA_SUCCESS)
		cu.cuDevicePrimaryCtxRelease(dev);
	memset(g, 0, sizeof *g);
}

/* The embedded image (< n, an index) whose entry list has `fn`, its place there in *k; -1 if
 * none: the build-time lists, so no driver call fails on a miss. */
static int entry_image(const char *fn, int n, int *k)
{
	for (int i = 0; i < n; i++) {
		const struct kernel_image *im = &kernel_images[i];
		for (*k = 0; *k < im->n_entries; ++*k)
			if (!strcmp(im->entries[*k], fn))
				return i;
	}
	return -1;
}

int gpu_kernel_embedded(const char *fn)
{
	int k;
	return entry_image(fn, n_kernel_images, &k) >= 0;
}

/* The cache entry of kernel `fn`, looked up and added on first use; NULL if absent (valid until
 * the next lookup adds one). */
static struct gpu_kernel_fn *kernel_entry(struct gpu *g, const char *fn)
{
	for (int i = 0; i < g->n_fns; i++)
		if (!strcmp(g->fns[i].name, fn))
			return &g->fns[i];
	int k, i = entry_image(fn, g->n_modules, &k);
	if (i < 0) {
		fprintf(stderr, "<3>dsv32: kernel %s not found in the %d embedded module(s)\n", fn,
			g->n_modules);
		return NULL;
	}
	const struct kernel_image *im = &kernel_images[i];
	const char *name = im->entries[k]; /* the entry list's copy: static, unlike fn */
	CUfunction f;
	if (cu_check(cu.cuModuleGetFunction(&f, g->modules[i], fn), "cuModuleGetFunction", __FILE__,
		     __LINE__))
		return NULL;
	struct gpu_kernel_fn *nf = realloc(g->fns, (size_t)(g->n_fns + 1) * sizeof *nf);
	if (!nf)
		return NULL;
	g->fns = nf;
	g->fns[g->n_fns] =
		(struct gpu_kernel_fn){name, f, im->entry_params ? im->entry_params[k] : -1, 0};
	return &g->fns[g->n_fns++];
}

void *gpu_kernel(struct gpu *g, const char *fn)
{
	const struct gpu_kernel_fn *k = kernel_entry(g, fn);
	return k ? k->fn : NULL;
}

int gpu_kernel_smem(struct gpu *g, const char *name, void **fn)
{
	struct gpu_kernel_fn *k = kernel_entry(g, name);
	*fn = k ? k->fn : NULL;
	if (!k)
		return -ENOENT;
	if (k->smem_optin)
		return 0;
	void *f = k->fn;
	int st = 0; /* static shared memory counts against the same limit */
	if (cu_check(cu.cuFuncGetAttribute(&st, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f),
		     "cuFuncGetAttribute", __FILE__, __LINE__) ||
	    cu_check(cu.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
					   g->smem_block_optin - st),
		     "cuFuncSetAttribute", __FILE__, __LINE__))
		return -EIO;
	k->smem_optin = 1;
	return 0;
}

int gpu_args_check(const struct gpu *g, const void *fn, int n_args)
{
	if (!fn)
		return -ENOENT;
	if (n_args < 0)
		return 0;
	for (int i = 0; i < g->n_fns; i++) {
		const struct gpu_kernel_fn *k = &g->fns[i];
		if (k->fn != fn)
			continue;
		if (k->n_params < 0 || n_args >= k->n_params)
			return 0;
		fprintf(stderr, "<3>dsv32: kernel %s takes %d arguments, the launch passed %d\n",
			k->name, k->n_params, n_args);
		return -EINVAL;
	}
	return 0;
}

int gpu_launch_n(struct gpu *g, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
		 unsigned by, unsigned bz, unsigned smem, void **args, int n_args)
{
	int r = gpu_args_check(g, fn, n_args);
	if (r)
		return r;
	CU_TRY(cu.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, g->stream, args, NULL));
	return 0;
}

int gpu_launch_pdl_n(struct gpu *g, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
		     unsigned by, unsigned bz, unsigned smem, void **args, int n_args)
{
	int r = gpu_args_check(g, fn, n_args);
	if (r)
		return r;
	CUlaunchAttribute at;
	memset(&at, 0, sizeof at);
	at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
	at.value.programmaticStreamSerializationAllowed = 1;
	CUlaunchConfig cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.gridDimX = gx, cfg.gridDimY = gy, cfg.gridDimZ = gz;
	cfg.blockDimX = bx, cfg.blockDimY = by, cfg.blockDimZ = bz;
	cfg.sharedMemBytes = smem;
	cfg.hStream = (CUstream)g->stream;
	cfg.attrs = &at, cfg.numAttrs = 1;
	CU_TRY(cu.cuLaunchKernelEx(&cfg, (CUfunction)fn, args, NULL));
	return 0;
}

int gpu_module_global(struct gpu *g, const char *name, gpu_ptr *ptr, size_t *bytes)
{
	for (int i = 0; i < g->n_globals; i++)
		if (!strcmp(g->globals[i].name, name)) {
			*ptr = g->globals[i].ptr, *bytes = g->globals[i].bytes;
			return 0;
		}
	for (int i = 0; i < g->n_modules; i++) {
		CUdeviceptr p;
		size_t n;
		/* a miss is CUDA_ERROR_NOT_FOUND, not a failure: no cu_check's message */
		if (cu.cuModuleGetGlobal(&p, &n, g->modules[i], name) != CUDA_SUCCESS)
			continue;
		*ptr = p, *bytes = n;
		struct gpu_global *ng = realloc(g->globals, (size_t)(g->n_globals + 1) * sizeof *ng);
		char *copy = strdup(name);
		if (ng)
			g->globals = ng;
		if (ng && copy)
			g->globals[g->n_globals++] = (struct gpu_global){copy, p, n};
		else
			free(copy); /* (found all the same; only not kept) */
		return 0;
	}
	return -ENOENT;
}

int gpu_max_active_clusters(struct gpu *g, void *fn, unsigned cluster, unsigned block,
			    unsigned smem)
{
	(void)g;
	CUlaunchConfig cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.gridDimX = cluster, cfg.gridDimY = cfg.gridDimZ = 1; /* one cluster, the kernel's shape */
	cfg.blockDimX = block, cfg.blockDimY = cfg.blockDimZ = 1;
	cfg.sharedMemBytes = smem;
	int n = 0;
	if (!fn || cu_check(cu.cuOccupancyMaxActiveClusters(&n, (CUfunction)fn, &cfg),
			    "cuOccupancyMaxActiveClusters", __FILE__, __LINE__))
		return -EIO;
	return n;
}

int gpu_max_active_clusters_once(struct gpu *g, int *cache, const char *name, unsigned cluster,
				 unsigned block, unsigned smem)
{
	if (*cache < 0) {
		void *fn;
		int r = gpu_kernel_smem(g, name, &fn);
		r = r ? r : gpu_max_active_clusters(g, fn, cluster, block, smem);
		*cache = r > 0 ? r : 0;
	}
	return *cache;
}

int gpu_launch_as_n(struct gpu *g, int pdl, void *fn, unsigned gx, unsigned gy, unsigned gz,
		    unsigned bx, unsigned by, unsigned bz, unsigned smem, void **args, int n_args)
{
	return (pdl ? gpu_launch_pdl_n : gpu_launch_n)(g, fn, gx, gy, gz, bx, by, bz, smem, args,
						       n_args);
}

int gpu_timing_events(CUevent ev[2])
{
	ev[0] = ev[1] = NULL;
	for (int i = 0; i < 2; i++)
		if (cu_check(cu.cuEventCreate(&ev[i], CU_EVENT_DEFAULT), "cuEventCreate", __FILE__,
			     __LINE__)) {
			ev[i] = NULL;
			gpu_timing_events_free(ev);
			return -1;
		}
	return 0;
}

void gpu_timing_events_free(CUevent ev[2])
{
	for (int i = 0; i < 2; i++)
		if (ev[i])
			cu.cuEventDestroy(ev[i]);
	ev[0] = ev[1] = NULL;
}

int gpu_sync(struct gpu *g)
{
	CU_TRY(cu.cuStreamSynchronize(g->stream));
	return 0;
}

/* ---- memory regions (VMM) ----------------------------------------------------------------- */

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

int gpu_region_reserve(struct gpu *g, struct gpu_region *r, const char *name, size_t reserve,
		       struct err *e)
{
	memset(r, 0, sizeof *r);
	r->name = name;
	r->reserved = round_up(reserve ? reserve : 1, g->granularity);
	CUdeviceptr base;
	if (cu_check(cu.cuMemAddressReserve(&base, r->reserved, 0, 0, 0), "cuMemAddressReserve",
		     __FILE__, __LINE__))
		return err_set(e, -ENOMEM, "%s: cannot reserve %zu bytes of GPU address space",
			       name, r->reserved);
	r->base = base;
	return 0;
}

int gpu_region_grow(struct gpu *g, struct gpu_region *r, size_t bytes, struct err *e)
{
	return gpu_region_grow_shared(g, r, bytes, -1, e);
}

int gpu_region_grow_shared(struct gpu *g, struct gpu_region *r, size_t bytes, int peer,
			   struct err *e)
{
	if (bytes <= r->mapped)
		return 0;
	size_t want = round_up(bytes, g->granularity);
	if (want > r->reserved)
		return err_set(e, -ENOMEM, "%s: %zu bytes exceed the %zu reserved", r->name, want,
			       r->reserved);
	size_t size = want - r->mapped;
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = g->ordinal}};
	CUmemGenericAllocationHandle h;
	if (cu_check(cu.cuMemCreate(&h, size, &prop, 0), "cuMemCreate", __FILE__, __LINE__))
		return err_set(e, -ENOMEM, "%s: cannot allocate %zu bytes of GPU memory", r->name,
			       size);
	if (cu_check(cu.cuMemMap(r->base + r->mapped, size, 0, h, 0), "cuMemMap", __FILE__, __LINE__)) {
		cu.cuMemRelease(h);
		return err_set(e, -EIO, "%s: cuMemMap failed", r->name);
	}
	CUmemAccessDesc acc[2] = {
		{.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = g->ordinal},
		 .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
		{.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = peer},
		 .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
	const size_t n_acc = peer >= 0 && peer != g->ordinal ? 2 : 1;
	if (cu_check(cu.cuMemSetAccess(r->base + r->mapped, size, acc, n_acc), "cuMemSetAccess",
		     __FILE__, __LINE__))
		return err_set(e, -EIO, "%s: cuMemSetAccess failed (GPU %d%s)", r->name, g->ordinal,
			       n_acc > 1 ? " and its peer" : "");
	CUmemGenericAllocationHandle *hs = realloc(r->chunks, (size_t)(r->n_chunks + 1) * sizeof *hs);
	if (!hs)
		return err_set(e, -ENOMEM, "out of memory");
	hs[r->n_chunks++] = h;
	r->chunks = hs;
	r->mapped = want;
	return 0;
}

gpu_ptr gpu_region_alloc(struct gpu_region *r, size_t bytes)
{
	size_t off = round_up(r->used, 256);
	if (off + bytes > r->mapped)
		return 0;
	r->used = off + bytes;
	return r->base + off;
}

void gpu_region_free(struct gpu *g, struct gpu_region *r)
{
	(void)g;
	if (!r->base)
		return;
	if (r->mapped)
		cu.cuMemUnmap(r->base, r->mapped);
	CUmemGenericAllocationHandle *hs = r->chunks;
	for (int i = 0; i < r->n_chunks; i++)
		cu.cuMemRelease(hs[i]);
	free(r->chunks);
	cu.cuMemAddressFree(r->base, r->reserved);
	memset(r, 0, sizeof *r);
}

int gpu_arena_init(struct gpu *g, struct gpu_arena *a, size_t bytes, struct err *e)
{
	memset(a, 0, sizeof *a);
	int r = gpu_region_reserve(g, &a->region, "scratch arena", bytes, e);
	if (!r)
		r = gpu_region_grow(g, &a->region, bytes, e);
	return r;
}

gpu_ptr gpu_arena_push(struct gpu_arena *a, size_t bytes)
{
	size_t off = round_up(a->top, 256);
	if (off + bytes > a->region.mapped)
		return 0;
	a->top = off + bytes;
	if (a->top > a->high_water)
		a->high_water = a->top;
	return a->region.base + off;
}

void gpu_arena_free(struct gpu *g, struct gpu_arena *a) { gpu_region_free(g, &a->region); }

/* ---- host staging and copies -------------------------------------------------------------- */

void *gpu_host_alloc(size_t bytes)
{
	void *p = NULL;
	if (cu_check(cu.cuMemHostAlloc(&p, bytes, 0), "cuMemHostAlloc", __FILE__, __LINE__))
		return NULL;
	return p;
}

void gpu_host_free(void *p)
{
	if (p)
		cu.cuMemFreeHost(p);
}

int gpu_upload(struct gpu *g, gpu_ptr dst, const void *src, size_t bytes)
{
	CU_TRY(cu.cuMemcpyHtoDAsync(dst, src, bytes, g->stream));
	return gpu_sync(g);
}

int gpu_download(struct gpu *g, void *dst, gpu_ptr src, size_t bytes)
{
	CU_TRY(cu.cuMemcpyDtoHAsync(dst, src, bytes, g->stream));
	return gpu_sync(g);
}

int gpu_memset(struct gpu *g, gpu_ptr dst, uint8_t byte, size_t bytes)
{
	CU_TRY(cu.cuMemsetD8Async(dst, byte, bytes, g->stream));
	return gpu_sync(g);
}

#endif /* DSV32_NO_CUDA */
