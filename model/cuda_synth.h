/*
 * cuda_synth.h — synthetic weights made on the GPU (issue 12: real-dimension runs with no
 * checkpoint on disk). A header-only checkpoint (`mkmodel real --header-only`: every name,
 * dtype and shape, the small tensors written, the big ones left as file holes) gives the
 * tensor list; the CUDA backend uploads the small tensors and asks this file to generate the
 * big ones in place, with mkmodel's recipes (tools/mkmodel/gen.h; kernels_ptx/synth.cu).
 *
 * Owns: which tensors are generated (exactly the ones header-only leaves as holes: every
 * F8_E4M3 tensor and every 2-D BF16 matrix) and their recipe (fan-in = columns, 1 for
 * embeddings). Must not: allocate.
 */
#ifndef DSV32_CUDA_SYNTH_H
#define DSV32_CUDA_SYNTH_H

#include <stdint.h>

#include "driver/gpu.h"
#include "model/safetensors.h"

/* 1 when t is generated rather than read (see above), else 0. */
int cuda_synth_generated(const struct st_tensor *t);

#ifndef DSV32_NO_CUDA
/* Fills dst (t->nbytes on the device) with t's synthetic values on the engine stream, from
 * seed and t's name. 0, -EINVAL when t is not a generated tensor, or the launch error. */
int cuda_synth_tensor(struct gpu *g, gpu_ptr dst, const struct st_tensor *t, uint64_t seed);
#endif

#endif
