/*
 * cuda_step_sample.h — a step's tokens drawn on the device (backend_step_draw): the GPU sampler
 * (model/cuda_sampler.h: the function of model/sampler.h) on the step's logits rows right after
 * the lm head, so only the draws come back to the host, never the logits (0.5 MB a row).
 *
 * Owns: the sampler's device buffers and pinned staging (made once, with the backend), the
 * histories of the draws with a penalty (uploaded each step), the launches (one per run of
 * consecutive drawn logits rows) and the copy of the results into the callers' struct
 * backend_sample.
 * Must not: allocate after creation.
 */
#ifndef DSV32_CUDA_STEP_SAMPLE_H
#define DSV32_CUDA_STEP_SAMPLE_H

#include "driver/gpu.h"
#include "model/backend.h"

#ifndef DSV32_NO_CUDA
#include "model/cuda_sampler.h"

struct cuda_step_sampler {
	int rows;                           /* capacity: sequences a step may sample */
	int vocab;
	int64_t hist_ids;                   /* capacity: history ids of a step's draws */
	struct gpu_region region;           /* params, results, histories, workspace */
	gpu_ptr params, out, hist, ws;
	struct cuda_sampler_row *h_params;  /* pinned [rows] */
	struct cuda_sampler_result *h_out;  /* pinned [rows] */
	int32_t *h_hist;                    /* pinned [hist_ids] */
	int n;                              /* rows of the step in flight */
	uint64_t draws;                     /* results delivered since creation */
};

/* Buffers for `rows` sequences of `vocab` logits and hist_ids ids of history. 0 or a negative
 * errno with e set. */
int cuda_step_sampler_init(struct gpu *g, struct cuda_step_sampler *s, int rows, int vocab,
			   int64_t hist_ids, struct err *e);
void cuda_step_sampler_free(struct gpu *g, struct cuda_step_sampler *s);

/* Enqueues on g->stream, for each sequence i of st with draw[i] and its LOGITS rows in st (a
 * pass of a larger step may hold none), the draw from each of those rows of l32 (fp32
 * [n_logits, ld]: the step's LOGITS rows in row order; the rows after the first: the chain
 * draw[i]->row2, ...), and the results' download. The number of draws, or a negative errno
 * (-E2BIG: more draws or history than the capacity; -EINVAL: a pass with part of a chain's
 * rows). */
int cuda_step_sample_launch(struct gpu *g, struct cuda_step_sampler *s,
			    const struct backend_step *st, struct backend_sample *const *draw,
			    gpu_ptr l32, int64_t ld);

/* After g->stream has synchronised: the out and rc of the launch's draws (st, draw as there). */
void cuda_step_sample_finish(struct cuda_step_sampler *s, const struct backend_step *st,
			     struct backend_sample *const *draw);
#endif

#endif
