/*
 * nccl.c — dlopen of libnccl.so.2, its function table, and a clique of communicators over the
 * process's GPUs (see nccl.h).
 *
 * Owns: the process-wide table `nc_fn`, each clique. Must not: allocate device memory or know
 * about the model. The only file that includes <nccl.h>.
 */
#include "driver/nccl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(DSV32_NO_CUDA) || !__has_include(<nccl.h>)

static const char no_nccl[] = "no NCCL in this build (static, or built without the CUDA or "
			      "NCCL headers)";

int nccl_load(const char *path, struct err *e) { return err_set(e, -ENOTSUP, "%s", no_nccl); }
const char *nccl_version(void) { return no_nccl; }

int nccl_open(struct gpu *const *gpus, int n, struct nccl **out, struct err *e)
{
	*out = NULL;
	return err_set(e, -ENOTSUP, "%s", no_nccl);
}

void nccl_close(struct nccl *c) {}

int nccl_all_reduce_sum(struct nccl *c, const gpu_ptr *send, const gpu_ptr *recv, size_t count,
			enum nccl_type type, struct err *e)
{
	return err_set(e, -ENOTSUP, "%s", no_nccl);
}

int nccl_check(struct nccl *c, struct err *e) { return err_set(e, -ENOTSUP, "%s", no_nccl); }

#else

#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>

#define NC_FUNCS(X)                                                                           \
	X(ncclGetVersion) X(ncclGetErrorString) X(ncclGetLastError) X(ncclCommInitAll)        \
	X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommGetAsyncError) X(ncclAllReduce)         \
	X(ncclGroupStart) X(ncclGroupEnd)

static struct {
#define NC_MEMBER(name) __typeof__(name) *name;
	NC_FUNCS(NC_MEMBER)
#undef NC_MEMBER
} nc_fn;

/* ncclGetLastError and bfloat16 arrived in 2.13 and 2.10 (codes major * 10000 + minor * 100
 * + patch since 2.9). */
#define NCCL_OLDEST 21300

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static void *nc_lib; /* the library loaded, once a process */
static char version_msg[128] = "NCCL not loaded";

/* One candidate: the table from `name`, or the reason it is not NCCL enough; the library is
 * closed again when refused. */
static int load_from(const char *name, struct err *e)
{
	void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return err_set(e, -ENODEV, "no NCCL: dlopen(%s): %s", name, dlerror());
	__typeof__(nc_fn) fn;
#define NC_RESOLVE(name_)                                                                      \
	if (!(fn.name_ = (__typeof__(name_) *)dlsym(lib, #name_))) {                           \
		dlclose(lib);                                                                  \
		return err_set(e, -ENODEV, "%s is not NCCL: it lacks %s", name, #name_);      \
	}
	NC_FUNCS(NC_RESOLVE)
#undef NC_RESOLVE
	int v = 0;
	if (fn.ncclGetVersion(&v) != ncclSuccess || v < NCCL_OLDEST) {
		dlclose(lib);
		return err_set(e, -ENOTSUP, "%s: NCCL version code %d, older than %d (2.13)",
			       name, v, NCCL_OLDEST);
	}
	nc_fn = fn;
	snprintf(version_msg, sizeof version_msg, "NCCL %d.%d.%d (%s)", v / 10000,
		 v / 100 % 100, v % 100, name);
	nc_lib = lib; /* last: a clique reads nc_fn only after a load that saw it set */
	return 0;
}

int nccl_load(const char *path, struct err *e)
{
	static const char *const names[] = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2"};
	pthread_mutex_lock(&load_lock);
	int r = 0;
	if (!nc_lib) {
		r = load_from(path ? path : names[0], e);
		for (size_t i = 1; r && !path && i < sizeof names / sizeof *names; i++)
			if (load_from(names[i], NULL) == 0)
				r = 0;
	}
	pthread_mutex_unlock(&load_lock);
	return r;
}

const char *nccl_version(void) { return version_msg; }

struct nccl {
	int n;
	int broken; /* an error was seen: calls refused, communicators aborted at close */
	ncclComm_t comm[NCCL_MAX_RANKS];
	struct gpu *gpu[NCCL_MAX_RANKS];
};

/* NCCL's words for r, with its last error's detail where it has one. */
static int nc_fail(struct err *e, ncclResult_t r, ncclComm_t comm, const char *call)
{
	const char *last = nc_fn.ncclGetLastError(comm);
	return err_set(e, -EIO, "NCCL %s: %s (%d)%s%s", call, nc_fn.ncclGetErrorString(r), (int)r,
		       last && *last ? ": " : "", last && *last ? last : "");
}

int nccl_open(struct gpu *const *gpus, int n, struct nccl **out, struct err *e)
{
	*out = NULL;
	if (n < 1 || n > NCCL_MAX_RANKS)
		return err_set(e, -EINVAL, "NCCL clique of %d GPUs (1 to %d)", n, NCCL_MAX_RANKS);
	int dev[NCCL_MAX_RANKS];
	for (int r = 0; r < n; r++) {
		dev[r] = gpus[r]->ordinal;
		for (int q = 0; q < r; q++)
			if (dev[q] == dev[r])
				return err_set(e, -EINVAL, "NCCL clique: GPU %d is ranks %d and %d "
							   "(one rank a GPU)", dev[r], q, r);
	}
	int rc = nccl_load(NULL, e);
	if (rc)
		return rc;
	struct nccl *c = calloc(1, sizeof *c);
	if (!c)
		return err_set(e, -ENOMEM, "NCCL clique: out of memory");
	c->n = n;
	memcpy(c->gpu, gpus, (size_t)n * sizeof *gpus);
	/* NVLink SHARP (multicast objects in the NVSwitches) stays off unless the environment asks
	 * for it: the all-reduces here are small (rows of 7168 values), and on shared hosts a
	 * program using multicast can take the GPUs out of service (the GPU machines' rule). */
	setenv("NCCL_NVLS_ENABLE", "0", 0);
	CUcontext cur = NULL;
	cu.cuCtxGetCurrent(&cur);
	ncclResult_t r = nc_fn.ncclCommInitAll(c->comm, n, dev);
	cu.cuCtxSetCurrent(cur);
	if (r != ncclSuccess) {
		rc = nc_fail(e, r, NULL, "ncclCommInitAll");
		free(c);
		return rc;
	}
	*out = c;
	return 0;
}

void nccl_close(struct nccl *c)
{
	if (!c)
		return;
	CUcontext cur = NULL;
	cu.cuCtxGetCurrent(&cur);
	for (int r = 0; r < c->n; r++)
		(c->broken ? nc_fn.ncclCommAbort : nc_fn.ncclCommDestroy)(c->comm[r]);
	cu.cuCtxSetCurrent(cur);
	free(c);
}

int nccl_all_reduce_sum(struct nccl *c, const gpu_ptr *send, const gpu_ptr *recv, size_t count,
			enum nccl_type type, struct err *e)
{
	size_t elem = type == NCCL_TYPE_F32 ? 4 : 2;
	if (c->broken)
		return err_set(e, -EIO, "NCCL clique broken by an earlier error");
	if (count > SIZE_MAX / elem)
		return err_set(e, -EINVAL, "NCCL all-reduce of %zu elements", count);
	if (!count)
		return 0;
	for (int q = 0; q < c->n; q++)
		if (!send[q] || !recv[q])
			return err_set(e, -EINVAL, "NCCL all-reduce: rank %d has no %s buffer", q,
				       send[q] ? "receive" : "send");
	ncclDataType_t t = type == NCCL_TYPE_F32 ? ncclFloat32 : ncclBfloat16;
	CUcontext cur = NULL;
	cu.cuCtxGetCurrent(&cur);
	/* one thread issues every rank's part: NCCL needs them as one group */
	ncclResult_t r = nc_fn.ncclGroupStart();
	int failed = -1; /* the rank whose call failed */
	for (int q = 0; q < c->n && r == ncclSuccess; q++) {
		r = nc_fn.ncclAllReduce((const void *)(uintptr_t)send[q], (void *)(uintptr_t)recv[q],
					count, t, ncclSum, c->comm[q],
					(cudaStream_t)c->gpu[q]->stream);
		if (r != ncclSuccess)
			failed = q;
	}
	ncclResult_t end = nc_fn.ncclGroupEnd();
	cu.cuCtxSetCurrent(cur);
	if (r != ncclSuccess) { /* the ranks before it were queued: the group is not to be trusted */
		c->broken = 1;
		return nc_fail(e, r, c->comm[failed], "ncclAllReduce");
	}
	if (end != ncclSuccess) {
		c->broken = 1;
		return nc_fail(e, end, NULL, "ncclGroupEnd (ncclAllReduce)");
	}
	return 0;
}

int nccl_check(struct nccl *c, struct err *e)
{
	for (int q = 0; q < c->n; q++) {
		ncclResult_t async = ncclSuccess;
		ncclResult_t r = nc_fn.ncclCommGetAsyncError(c->comm[q], &async);
		if (r == ncclSuccess)
			r = async;
		if (r != ncclSuccess && r != ncclInProgress) {
			c->broken = 1;
			char what[64];
			snprintf(what, sizeof what, "rank %d (GPU %d)", q, c->gpu[q]->ordinal);
			return nc_fail(e, r, c->comm[q], what);
		}
	}
	return 0;
}

#endif
