/*
 * kernels.h — the GPU kernels embedded in the binary at build time (tools/embed.c writes the
 * table from the kernels_ptx/ sources compiled to PTX for sm_90a, plus the ptxas-built cubin).
 * An empty table means the build had no nvcc: the daemon then runs the CPU backend only.
 */
#ifndef DSV32_KERNELS_H
#define DSV32_KERNELS_H

#include <stddef.h>

struct kernel_image {
	const char *name;           /* file stem in kernels_ptx/, e.g. "rmsnorm" */
	const unsigned char *ptx;   /* NUL-terminated PTX text */
	long ptx_len;               /* bytes, without the NUL */
	const unsigned char *cubin; /* sm_90a ELF, or NULL */
	long cubin_len;
	const char *const *entries; /* the module's kernel entry points (from the PTX .entry lines) */
	int n_entries;
	const int *entry_params; /* each entry's parameter count (from its PTX .param lines) */
};

extern const struct kernel_image kernel_images[]; /* terminated by a zeroed entry */
extern const int n_kernel_images;

#endif
