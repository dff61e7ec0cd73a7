/*
 * cuda_forward.h — the forward pass of DeepSeek-V3.2 on the GPU (the CUDA backend's step,
 * model/cuda_backend.c): the device addresses of every weight the forward reads, and the step
 * and one-layer entry points.
 *
 * Owns: the op order of a step (the CPU backend's, model/cpu_backend.c, op for op: same
 * roundings, bf16 between ops, FP8 where the spec says, the absorbed attention form over keys
 * read back from the FP8 cache), its scratch (from the backend's arena, released at the end of
 * the step), the per-step metadata upload and the dumps. Must not: allocate device memory
 * outside the arena, synchronise inside the layer loop (only the final downloads wait), decide
 * scheduling or sample.
 */
#ifndef DSV32_CUDA_FORWARD_H
#define DSV32_CUDA_FORWARD_H

#include "driver/gpu.h"
#include "model/backend.h"
#include "model/cuda_moe.h"

#ifndef DSV32_NO_CUDA

/* A device FP8 weight: e4m3 [out, in] and fp32 block scales [ceil(out/128), in/128]. */
struct fwd_fp8 {
	gpu_ptr w, s;
	int out, in;
};

struct fwd_layer {
	gpu_ptr attn_norm, ffn_norm;  /* fp32 [hidden] */
	gpu_ptr q_norm, kv_norm;      /* fp32 [q_lora_rank], [kv_lora_rank] */
	int fused_qkv;                /* 1: qkv is q_a|idx_k|kv_a as one matrix (q_lora_rank % 128 == 0) */
	struct fwd_fp8 qkv;           /* [q_lora_rank + 128 + kv_lora_rank + rope, hidden] when fused */
	struct fwd_fp8 q_a, kv_a;     /* the parts (their addresses lie inside qkv when fused) */
	struct fwd_fp8 q_b, kv_b, o;
	struct fwd_fp8 idx_q_b, idx_k; /* idx_k: indexer.wk, inside qkv when fused */
	int fused_qib;                /* 1: qib is q_b|idx_q_b as one matrix (both read q_cmpr) */
	struct fwd_fp8 qib;           /* [H * qk_head_dim + index_n_heads * 128, q_lora_rank] */
	gpu_ptr idx_k_norm_w, idx_k_norm_b; /* fp32 [index_head_dim] */
	gpu_ptr idx_wproj;            /* bf16 [index_n_heads, hidden] */
	int is_moe;
	struct fwd_fp8 w13, w2;       /* dense MLP: gate|up fused [2 * inter, hidden], down */
	/* MoE: router, experts (each gate|up fused), shared expert */
	gpu_ptr gate, gate_bias;      /* bf16 [E, hidden], fp32 [E] */
	struct fwd_fp8 *ex13, *ex2;   /* host arrays [E] */
	struct fwd_fp8 sh13, sh2;
	struct cuda_moe_layer moe;    /* for cuda_moe_forward */
	int moe_ready;                /* cuda_moe_layer_init succeeded */
};

struct fwd_model {
	struct fwd_layer *layers;     /* [num_hidden_layers + MTP layers]; only [l0, l1) (and the
				       * MTP layer on the last stage) filled */
	/* A pipeline stage (model/cuda_pipeline.c) runs main layers [l0, l1): after the embedding
	 * when l0 == 0, else from the rows the previous stage left at in_x / in_r (bf16 [rows, D]
	 * each: its layer output and residual, the step's row order); up to the logits when l1 ==
	 * num_hidden_layers, else leaving its own rows at out_x / out_r (the next stage's in_x /
	 * in_r, maybe on another GPU). One GPU: l0 = 0, l1 = num_hidden_layers. */
	int64_t l0, l1;
	gpu_ptr in_x, in_r, out_x, out_r;
	gpu_ptr embed, norm, lm_head; /* bf16 [V, D], fp32 [D], bf16 [V, D] (embed on the first
				       * stage, norm and lm_head on the last; else 0) */
	int has_mtp;                  /* the MTP layer is here (the last stage) */
	gpu_ptr mtp_embed, enorm, hnorm, eh_proj, head_norm, mtp_head;
	gpu_ptr rope_cs;              /* fp32 [rope_max_pos, 32, 2] (cos, sin), rope_cos_sin's values */
	int64_t rope_max_pos;
};

/* Captured decode steps (CUDA graphs), keyed by shape; see cuda_forward.c. */
#define FWD_MAX_GRAPHS 32
#define FWD_GRAPH_MAX_ROWS 64 /* steps of more rows run eagerly (decode GEMM path only) */
struct fwd_graphs;
struct fwd_graphs *cuda_forward_graphs_new(void);
void cuda_forward_graphs_free(struct fwd_graphs *G);
void cuda_forward_graphs_stats(const struct fwd_graphs *G, int64_t *captures, int64_t *replays);

/* The forward's switches for diagnosis and A/B timing (model/cuda_forward.c's header and
 * docs/CONFIG.md say what each does), read from the environment once when the backend is created
 * (cuda_forward_switches_init); a test or tool changes one later through cuda_forward_switch_set
 * (backend_cuda_set_switch). Decode graphs captured under other values are not replayed. */
struct fwd_switches {
	int graphs;       /* DSV32_CUDA_GRAPHS (1; 0: every step eagerly) */
	int unfused;      /* DSV32_CUDA_UNFUSED=1: the separate kernels, not the fused chains */
	int pdl;          /* DSV32_CUDA_FWD_PDL: the forward's kernels by programmatic dependent
			   * launch: 1 all, 0 none, 2 those in pdl_list; -1 (unset) in steps of more
			   * than FWD_PDL_ROWS rows, every row count for LAUNCH_PDL_ANY (fwd_launch) */
	char pdl_list[256]; /* DSV32_CUDA_FWD_PDL=k1,k2 (diagnosis): only these kernel names */
	int fork;         /* DSV32_CUDA_FWD_FORK: the attention's query branch on the side stream
			   * from the top-k on (1) or from the index scores on (3); 0: no side
			   * stream; -1 (unset): 3 in steps of FWD_FORK_EARLY_ROWS rows or more, else 1 */
	int staged;       /* DSV32_CUDA_LOGITS_STAGED: -1 (default) the logits through the pinned
			   * staging buffer unless the callers' buffers are the backend's own host
			   * memory; 1 always through it; 0 never */
	int topk_mode;    /* DSV32_TOPK_MODE (cuda_attn_set_topk_mode: process-wide) */
	int qb_early;     /* DSV32_CUDA_QB_EARLY: in one-row steps that run the indexer, the query
			   * branch forked right after k_fwd_qkv_norms, beside the whole index chain:
			   * 1 at every key count, 0 never (after the scores, as fork says); -1
			   * (unset) below FWD_QB_EARLY_KEYS keys (fwd_qb_early) */
	int qb_fuse;      /* DSV32_CUDA_QB_FUSE: in one-row steps of the fast mode that run the
			   * indexer, q_b and the indexer's q_b as one GEMM (fwd_layer.qib), the q
			   * absorption forked beside the top-k: 1 at every key count, 0 never; -1
			   * (unset) from FWD_QB_EARLY_KEYS keys (fwd_qib) */
	int mma_rows;     /* DSV32_CUDA_MMA_ROWS (0: by mode) */
	int mla_fp32;     /* DSV32_CUDA_MLA_FP32=1 */
	int profile;      /* DSV32_CUDA_PROFILE=1 */
	int64_t max_rows; /* DSV32_CUDA_MAX_ROWS (0: from the arena) */
	char skip[256];   /* DSV32_CUDA_FWD_SKIP: comma-separated names of what the forward does not
			   * run (its own kernels, metadata_upload, logits_download: timing by
			   * subtraction; wrong numbers) */
	unsigned gen;     /* bumped by every change (the decode graphs' key) */
};
void cuda_forward_switches_init(struct fwd_switches *s);
/* the dynamic shared memory of k_fwd_uv1_qh and k_fwd_q_absorb1h (kernels_ptx/fwd_glue.cu's
 * UVH_SMEM, QAH_SMEM; cuda_forward_prepare sets the kernels' limits, the tests too) */
#define FWD_UVH_SMEM (128 * (512 + 16) + (512 + 128) * 4)
#define FWD_QAH_SMEM (192 * (512 + 4 + 16))
/* Sets switch name (the environment variable's name) to value as if read from the environment
 * (NULL: its default). 0, or -EINVAL for a name that is not one of the switches above. */
int cuda_forward_switch_set(struct fwd_switches *s, const char *name, const char *value);

/* A block of the backend's pinned host memory (backend_host_alloc). */
struct fwd_host_block {
	const void *p;
	size_t bytes;
};

/* The rows the latest main step kept (BACKEND_ROW_KEEP, backend.h): bf16 [n, D] at p, taken from
 * the scratch arena (its top was mark below them) and held there between steps, until the next
 * main step drops them. */
struct fwd_kept {
	gpu_ptr p;
	int64_t n;
	size_t mark;
};

/* What a step runs against. */
struct cuda_step_sampler;

struct fwd_env {
	struct gpu *g;
	struct gpu_arena *arena;
	const struct dsv32_config *c;
	const struct fwd_model *m;
	const struct backend *base;   /* pools: n_layers, n_pages, page sizes */
	gpu_ptr kv_base;              /* [n_layers][n_pages] MLA pages, then the indexer pages */
	int64_t kv_layer0;            /* the layer of pool 0 (a pipeline stage's m->l0) */
	void **pinned;                /* the per-step metadata buffer (pinned, grown on demand) */
	size_t *pinned_bytes;
	void **plog;                  /* pinned staging of the logits (grown on demand), for callers'
				       * buffers outside host_blocks */
	size_t *plog_bytes;
	const struct fwd_host_block *host_blocks; /* [n_host_blocks] the backend's pinned host memory:
				       * logits buffers inside one are downloaded straight into */
	int n_host_blocks;
	const struct fwd_switches *sw;
	struct fwd_graphs *graphs;    /* NULL: every step runs eagerly */
	void *side;                   /* CUstream: a second stream for branches of a layer that
				       * run beside the engine stream (cuda_fwd_attn.c); NULL: none */
	void *ev_fork, *ev_join;      /* CUevents of those branches' fork and join */
	int batch_invariant;          /* the mode (backend_cuda_opts.batch_invariant; see
				       * cuda_forward.c for what each mode runs) */
	struct cuda_step_sampler *smp; /* the device sampler's buffers (model/cuda_step_sample.h) */
	struct backend_sample *const *draw; /* NULL, or [n_seqs]: the step's draws
				       * (backend_step_draw): drawn on the device, their logits
				       * never downloaded */
	struct fwd_kept *kept;        /* the kept rows (main steps replace them) */
};

/* With DSV32_CUDA_PROFILE=1, eager steps record the GPU time between consecutive ops; this
 * prints the totals by op (stderr) and clears them. Called by the backend's destroy. */
void cuda_forward_profile_print(void);

/* Once per GPU before the first step (the backend's creation): the kernels' function attributes.
 * 0 or -EIO. */
int cuda_forward_prepare(struct gpu *g);

/* The whole step (st validated by the caller). 0 or a negative errno. */
int cuda_forward_step(const struct fwd_env *E, const struct backend_step *st);

/* Decoder layer `layer` alone on the rows of st (see backend_cuda_layer_step). */
int cuda_forward_layer(const struct fwd_env *E, int64_t layer, const struct backend_step *st,
		       float *x, float *r);

#endif
#endif
