/* test_nccl.c — driver/nccl.c with no GPU: what it refuses before any GPU is touched. A clique
 * is one rank a GPU (a GPU named twice, or no GPU, or more than NCCL_MAX_RANKS, is refused
 * naming it, before NCCL is loaded); a library that is absent or is not NCCL is named in the
 * error and not kept, so a later load may still find the real one. (The collectives
 * themselves: tests/gpu/test_gpu_nccl.c.) */
#include <errno.h>
#include <string.h>

#include "driver/nccl.h"
#include "tests/test.h"

TEST(nccl, clique_refused_before_loading)
{
	struct gpu g[3];
	memset(g, 0, sizeof g);
	g[0].ordinal = 0, g[1].ordinal = 1, g[2].ordinal = 0;
	struct gpu *gs[3] = {&g[0], &g[1], &g[2]};
	struct nccl *c = (struct nccl *)&g; /* must come back NULL */
	struct err e = {""};
#ifdef DSV32_NO_CUDA
	CHECK_EQ_INT(nccl_open(gs, 2, &c, &e), -ENOTSUP);
	CHECK_CONTAINS(e.msg, "no NCCL in this build");
	CHECK(c == NULL);
#else
	CHECK_EQ_INT(nccl_open(gs, 3, &c, &e), -EINVAL);
	CHECK_CONTAINS(e.msg, "GPU 0 is ranks 0 and 2");
	CHECK(c == NULL);
	CHECK_EQ_INT(nccl_open(gs, 0, &c, &e), -EINVAL);
	CHECK_CONTAINS(e.msg, "clique of 0 GPUs");
	CHECK_EQ_INT(nccl_open(gs, NCCL_MAX_RANKS + 1, &c, &e), -EINVAL);
#endif
	nccl_close(NULL);
}

TEST(nccl, load_names_what_is_not_nccl)
{
	struct err e = {""};
#ifdef DSV32_NO_CUDA
	CHECK_EQ_INT(nccl_load(NULL, &e), -ENOTSUP);
	CHECK_CONTAINS(nccl_version(), "no NCCL");
#else
	/* (each case runs in its own child: no NCCL is loaded yet) */
	CHECK_EQ_INT(nccl_load("/nonexistent/libnccl.so.2", &e), -ENODEV);
	CHECK_CONTAINS(e.msg, "dlopen(/nonexistent/libnccl.so.2)");
	CHECK_EQ_INT(nccl_load("libm.so.6", &e), -ENODEV);
	CHECK_CONTAINS(e.msg, "libm.so.6 is not NCCL: it lacks ncclGetVersion");
	CHECK_CONTAINS(nccl_version(), "NCCL not loaded");
	/* then the usual places: the real library where this machine has one (no GPU needed) */
	int r = nccl_load(NULL, &e);
	if (r == 0)
		CHECK(strncmp(nccl_version(), "NCCL 2.", 7) == 0);
	else
		CHECK_CONTAINS(e.msg, "NCCL");
	printf("    %s\n", r == 0 ? nccl_version() : e.msg);
#endif
}
