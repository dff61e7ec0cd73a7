/*
 * cuda_stage.h — the pipeline of CUDA backends (model/cuda_pipeline.c, backend_cuda_opts.stages)
 * and what it asks of each stage (model/cuda_backend.c). Internal to the CUDA backend.
 *
 * A stage is an ordinary CUDA backend limited to main layers [l0, l1): it uploads only their
 * tensors (and the embedding when l0 == 0; the final norm, lm_head and the MTP layer when l1 is
 * the last layer), keeps their KV pools (pool 0 = layer l0), starts from the rows the previous
 * stage left in its rows-in planes and, unless last, leaves its own rows where the next stage
 * reads them (model/cuda_forward.h, fwd_model.l0 ..).
 */
#ifndef DSV32_CUDA_STAGE_H
#define DSV32_CUDA_STAGE_H

#include "model/backend.h"

#ifndef DSV32_NO_CUDA
#include "driver/gpu.h"

/* The rows a step may hand from one stage to the next (the address space each stage reserves
 * for its rows-in planes; memory is mapped as steps need it). */
#define CUDA_STAGE_MAX_ROWS ((int64_t)1 << 20) /* (dsv32d's max-batch-tokens cap) */

/* Where a stage goes: main layers [l0, l1) on GPU `ordinal`, its rows written by GPU prev_gpu
 * (l0 > 0). Its KV pool: o->n_pages, or the GPU's free memory less later_bytes (what the
 * stages still to be created on that GPU take besides their pools), divided by share (those
 * stages, this one included); one GPU alone: share 1, later_bytes 0. */
struct cuda_stage_place {
	int ordinal;
	int64_t l0, l1;
	int prev_gpu;
	int share;
	size_t later_bytes;
};

/* A CUDA backend at place p (o as for backend_cuda_create_opts). */
int cuda_stage_create(const struct dsv32_config *c, const struct weights *w,
		      const struct checkpoint *ck, const struct backend_cuda_opts *o,
		      const struct cuda_stage_place *p, struct backend **out, struct err *e);
/* What a stage of main layers [l0, l1) takes on its GPU besides its KV pool: its tensors, the
 * scratch arena and a margin (a pipeline sizing the pools of stages that share a GPU). */
size_t cuda_stage_fixed_bytes(const struct dsv32_config *c, const struct checkpoint *ck,
			      int64_t l0, int64_t l1, int64_t step_rows);
/* The rows-in planes' rows mapped at creation (backend_cuda_opts.step_rows, or its default). */
int64_t cuda_stage_step_rows(const struct backend_cuda_opts *o);
/* Makes the stage's GPU context current on the calling thread. */
void cuda_stage_current(struct backend *b);
int cuda_stage_ordinal(const struct backend *b);
/* A later stage's rows-in planes (x, r: bf16 [rows, hidden] each) grown to `rows` rows, shared
 * with GPU `writer` (the previous stage's): their addresses, which never move. 0 or an errno. */
int cuda_stage_rows_in(struct backend *b, int64_t rows, int writer, gpu_ptr *x, gpu_ptr *r,
		       struct err *e);
/* Where an earlier stage leaves its rows: the next stage's rows-in planes. */
void cuda_stage_rows_out(struct backend *b, gpu_ptr x, gpu_ptr r);

/* The pipeline (backend_cuda_create_opts with o->stages > 1). */
int cuda_pipeline_create(const struct dsv32_config *c, const struct weights *w,
			 const struct checkpoint *ck, const struct backend_cuda_opts *o,
			 struct backend **out, struct err *e);
/* A pipeline's stages in order into st[CUDA_MAX_STAGES]: how many; 0 when b is not a pipeline. */
int cuda_pipeline_stages(const struct backend *b, struct backend **st);
#endif

#endif
