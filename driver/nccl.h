/*
 * nccl.h — NCCL's collectives over the GPUs of this process, loaded at run time.
 *
 * Owns: dlopen of libnccl.so.2 and the table of its functions (resolved once a process, like
 * cu.c for libcuda); a clique: one communicator a GPU, all made by this process
 * (ncclCommInitAll: dsv32d's one engine thread drives every GPU, docs/MULTIGPU.md), rank r
 * on gpus[r]; the collectives enqueued on each GPU's engine stream (capturable in that GPU's
 * CUDA graph). Only nccl.c includes <nccl.h>; callers see plain types.
 * Must not: allocate device memory, know about the model.
 *
 * NCCL drives the GPUs through the CUDA runtime linked into it, which uses each device's
 * primary context: the one gpu_open makes current. Every call here leaves the calling
 * thread's current context as it found it.
 *
 * Builds without the CUDA headers or <nccl.h>, and static builds: nccl_load() and nccl_open()
 * fail with "no NCCL in this build".
 */
#ifndef DSV32_NCCL_H
#define DSV32_NCCL_H

#include <stddef.h>

#include "driver/gpu.h"
#include "model/err.h"

/* The most GPUs of a clique (one host). */
#define NCCL_MAX_RANKS 64

enum nccl_type { NCCL_TYPE_F32, NCCL_TYPE_BF16 };

struct nccl; /* opaque: the clique's communicators and their GPUs */

/* Opens NCCL once a process: `path`, or NULL for libnccl.so.2 through the loader's path and
 * then /usr/local/cuda/lib64. The first library loaded stays; a failed load is not kept (a
 * later call may name another). 0, or -ENODEV (no library, or it lacks a function: named) or
 * -ENOTSUP (older than 2.13, or no NCCL in this build) with e saying why. */
int nccl_load(const char *path, struct err *e);
/* "NCCL 2.28.9 (libnccl.so.2)", or why it is not loaded. */
const char *nccl_version(void);

/* A clique over gpus[0..n) (each opened by gpu_open, each a different device), rank r on
 * gpus[r]; NCCL is loaded if it is not. 0, or -EINVAL (n outside 1..NCCL_MAX_RANKS, a GPU
 * twice: named), -ENODEV / -ENOTSUP (nccl_load), -EIO (NCCL refused: its words).
 * NCCL_NVLS_ENABLE is set to 0 where the environment does not set it (no NVLink multicast). */
int nccl_open(struct gpu *const *gpus, int n, struct nccl **out, struct err *e);
/* Destroys the communicators (aborts them after an error); NULL is allowed. */
void nccl_close(struct nccl *c);

/* Sum over the clique: recv[r][i] = the sum over q of send[q][i] for i < count, on every rank
 * r, enqueued on each rank's GPU stream (send[r] == recv[r] is in place). Its order of
 * summation is NCCL's, so with three or more ranks it need not be a fixed one. 0, -EINVAL
 * (count beyond size_t's reach in bytes, a buffer missing), or -EIO with NCCL's words (the
 * clique is then broken: every later call refused). */
int nccl_all_reduce_sum(struct nccl *c, const gpu_ptr *send, const gpu_ptr *recv, size_t count,
			enum nccl_type type, struct err *e);
/* An error NCCL met after its call returned (on the GPUs or their links): 0, or -EIO naming the
 * rank, its GPU and NCCL's words; the clique is then broken (every later call refused). */
int nccl_check(struct nccl *c, struct err *e);

#endif
