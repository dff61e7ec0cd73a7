/*
 * gpu.h — one GPU: its context, stream, the embedded kernel modules, and memory.
 *
 * Owns: opening a device (primary context), loading every embedded kernel image (the sm_90a
 * cubin when present, else the PTX through the JIT, whose error log is printed on failure),
 * looking kernels up by name, launching them, and the device memory of the process:
 *   - one reserved virtual range per pool (driver VMM API: reserve once, map physical chunks),
 *     a weights region, a KV page pool and a LIFO per-step scratch arena; nothing is allocated
 *     after start-up;
 *   - pinned host staging buffers for uploads.
 * Must not: know about the model; model/ asks for memory and launches kernels by name.
 */
#ifndef DSV32_GPU_H
#define DSV32_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "driver/cu.h"
#include "model/err.h"

typedef unsigned long long gpu_ptr; /* a device address (the same type as CUdeviceptr) */

/* A virtual range reserved once, backed by physical chunks mapped on demand up to `size`. */
struct gpu_region {
	const char *name;
	gpu_ptr base;
	size_t reserved;   /* bytes of address space */
	size_t mapped;     /* bytes backed by physical memory, from base */
	size_t used;       /* bump pointer for gpu_region_alloc */
	int n_chunks;
	void *chunks;      /* CUmemGenericAllocationHandle[] */
};

/* LIFO scratch: mark, allocate, release back to the mark; backed by a gpu_region. */
struct gpu_arena {
	struct gpu_region region;
	size_t top;
	size_t high_water;
};

struct gpu_kernel_fn {
	const char *name;
	void *fn;       /* CUfunction */
	int n_params;   /* its parameters (the PTX's), or -1 when not known */
	int smem_optin; /* its dynamic shared memory limit raised (gpu_kernel_smem) */
};

struct gpu_global {
	char *name; /* (owned) */
	gpu_ptr ptr;
	size_t bytes;
};

struct gpu {
	int ordinal;
	char name[128];
	int cc_major, cc_minor, sm_count;
	int smem_block_optin; /* the most shared memory a block may opt in to (bytes) */
	size_t total_mem;
	size_t granularity; /* VMM allocation granularity */
	void *ctx;          /* CUcontext (primary) */
	void *stream;       /* CUstream: the engine's one stream */
	int n_modules;
	void **modules;     /* CUmodule[] in kernel_images order */
	int n_fns;
	struct gpu_kernel_fn *fns; /* cache of looked-up functions */
	int n_globals;
	struct gpu_global *globals; /* cache of found __device__ variables (gpu_module_global) */
};

/* Opens device `ordinal`, makes its primary context current, creates the stream and loads
 * every embedded kernel image. */
int gpu_open(struct gpu *g, int ordinal, struct err *e);
void gpu_close(struct gpu *g);
/* Finds kernel `fn` (an extern "C" entry point) in any loaded module; NULL if absent. */
void *gpu_kernel(struct gpu *g, const char *fn);
/* Whether the binary embeds kernel `fn` (a quiet test, no driver call: for optional variants). */
int gpu_kernel_embedded(const char *fn);
/* gpu_kernel for a kernel that may be launched with more than 48 KB of dynamic shared memory:
 * the first time, its limit is raised to all a block may opt in to (smem_block_optin less its
 * static shared memory), so any launch of it fits without a driver call each time. *fn: the function; 0, -ENOENT (not in
 * the modules) or -EIO (the driver refused). */
int gpu_kernel_smem(struct gpu *g, const char *name, void **fn);
/* The device address and size of the __device__ variable `name` in any loaded module (for
 * diagnosis buffers the host reads back, flags a kernel sets for another); 0, -ENOENT when no
 * module has it. Found once and kept, so a call on every launch costs no driver call. */
int gpu_module_global(struct gpu *g, const char *name, gpu_ptr *ptr, size_t *bytes);
/* How many clusters of fn (a kernel whose compile-time cluster is `cluster` x 1 x 1) launched with
 * `block` threads and `smem` bytes of dynamic shared memory a block the device holds at once
 * (cuOccupancyMaxActiveClusters: a cluster's blocks share a GPC, so on the H200 only 30 of 4
 * blocks of > ~114 KB, not 33), or -EIO when the driver cannot say. */
int gpu_max_active_clusters(struct gpu *g, void *fn, unsigned cluster, unsigned block,
			    unsigned smem);
/* gpu_max_active_clusters of kernel `name` (gpu_kernel_smem), asked once and kept in *cache
 * (a caller's static, < 0 until asked; the GPUs of a process taken as alike, every first caller
 * storing the same value): 0 when the kernel is not there or the driver cannot say. */
int gpu_max_active_clusters_once(struct gpu *g, int *cache, const char *name, unsigned cluster,
				 unsigned block, unsigned smem);
/* Launches fn on the engine stream with grid/block/shared bytes and the kernel's arguments
 * (an array of pointers to each argument, as cuLaunchKernel takes them). n_args: the array's
 * length, or -1 when not known; fewer than the kernel's parameters is refused (-EINVAL, with
 * the kernel's name: the driver would read past the array); more is allowed (arrays shared by
 * variants of a kernel, the last argument used by some only: the driver reads what it needs). */
int gpu_launch_n(struct gpu *g, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
		 unsigned by, unsigned bz, unsigned smem, void **args, int n_args);
/* The same launch as a programmatic dependent of the previous kernel on the stream
 * (cuLaunchKernelEx, programmatic stream serialisation): the grid may start while that kernel
 * drains; the kernel orders itself with griddepcontrol.wait. Capturable in CUDA graphs. */
int gpu_launch_pdl_n(struct gpu *g, void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
		     unsigned by, unsigned bz, unsigned smem, void **args, int n_args);
/* The length of a launch's argument array `a` when it is an array (a compile-time count), -1
 * when it is a void ** (not known). */
#define GPU_NARGS(a)                                                                             \
	__builtin_choose_expr(__builtin_types_compatible_p(__typeof__(a), void **), -1,          \
			      (int)(sizeof(a) / sizeof(char *)))
/* gpu_launch(...) / gpu_launch_pdl(...): the two above with the array's count (a choice between
 * them made at run time: gpu_launch_as, below). */
#define gpu_launch(g, fn, gx, gy, gz, bx, by, bz, smem, args)                                   \
	gpu_launch_n(g, fn, gx, gy, gz, bx, by, bz, smem, args, GPU_NARGS(args))
#define gpu_launch_pdl(g, fn, gx, gy, gz, bx, by, bz, smem, args)                               \
	gpu_launch_pdl_n(g, fn, gx, gy, gz, bx, by, bz, smem, args, GPU_NARGS(args))
/* One of the two, by pdl (1: gpu_launch_pdl_n): for callers whose switch picks the form at run
 * time; gpu_launch_as(g, pdl, fn, ..., args) counts the array as gpu_launch does. */
int gpu_launch_as_n(struct gpu *g, int pdl, void *fn, unsigned gx, unsigned gy, unsigned gz,
		    unsigned bx, unsigned by, unsigned bz, unsigned smem, void **args, int n_args);
#define gpu_launch_as(g, pdl, fn, gx, gy, gz, bx, by, bz, smem, args)                           \
	gpu_launch_as_n(g, pdl, fn, gx, gy, gz, bx, by, bz, smem, args, GPU_NARGS(args))
#ifndef DSV32_NO_CUDA
/* The two events of a timing (ev[0] the start, ev[1] the end): 0, or -1 with both NULL when the
 * driver could not make them (after a GPU fault the context is unusable, and a handle never made
 * must not be recorded or destroyed). gpu_timing_events_free destroys what was made. */
int gpu_timing_events(CUevent ev[2]);
void gpu_timing_events_free(CUevent ev[2]);
#endif
/* 0 when a launch of fn with n_args arguments is sound (n_args < 0, or fn unknown: not
 * checked), -ENOENT for no kernel (fn NULL: not found), else -EINVAL (printed); what
 * gpu_launch_n and gpu_launch_pdl_n check first. */
int gpu_args_check(const struct gpu *g, const void *fn, int n_args);
int gpu_sync(struct gpu *g);

/* Regions (driver VMM API). reserve: address space only; grow maps physical memory so that
 * at least `bytes` from base are backed; alloc bumps within the mapped part (aligned to 256). */
int gpu_region_reserve(struct gpu *g, struct gpu_region *r, const char *name, size_t reserve,
		       struct err *e);
int gpu_region_grow(struct gpu *g, struct gpu_region *r, size_t bytes, struct err *e);
/* gpu_region_grow whose new memory GPU `peer` may also read and write (a pipeline stage's rows,
 * written by the previous stage's GPU); peer < 0 or g's own: as gpu_region_grow. Every grow of
 * a region shares it with the same peer. */
int gpu_region_grow_shared(struct gpu *g, struct gpu_region *r, size_t bytes, int peer,
			   struct err *e);
gpu_ptr gpu_region_alloc(struct gpu_region *r, size_t bytes);
void gpu_region_free(struct gpu *g, struct gpu_region *r);

int gpu_arena_init(struct gpu *g, struct gpu_arena *a, size_t bytes, struct err *e);
static inline size_t gpu_arena_mark(const struct gpu_arena *a) { return a->top; }
gpu_ptr gpu_arena_push(struct gpu_arena *a, size_t bytes); /* 0 when full (a bug: sized at start) */
static inline void gpu_arena_release(struct gpu_arena *a, size_t mark) { a->top = mark; }
void gpu_arena_free(struct gpu *g, struct gpu_arena *a);

/* Pinned host memory for staging. */
void *gpu_host_alloc(size_t bytes);
void gpu_host_free(void *p);

/* Plain copies on the engine stream, synchronous. */
int gpu_upload(struct gpu *g, gpu_ptr dst, const void *src, size_t bytes);
int gpu_download(struct gpu *g, void *dst, gpu_ptr src, size_t bytes);
int gpu_memset(struct gpu *g, gpu_ptr dst, uint8_t byte, size_t bytes);

#endif
