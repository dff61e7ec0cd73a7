/*
 * weights.h — every tensor of DeepSeek-V3.2 bound by name with its expected dtype and shape
 * (spec §7.2), pointing into the mmapped checkpoint.
 *
 * Owns: the binding and its error messages ("tensor X: expected F8_E4M3 [1536, 7168], got
 * BF16 [1536, 7168] in FILE"), and small fp32 copies of vectors whose checkpoint dtype may
 * vary (norm weights and the indexer LayerNorm may be BF16 or F32: both are accepted).
 * Must not: compute. Backends read these pointers (the CPU directly, the GPU to upload).
 *
 * Layer numbering follows the checkpoint: layers[0 .. num_hidden_layers-1] are the main
 * model; the MTP module (num_nextn_predict_layers = 1) is checkpoint layer num_hidden_layers
 * and is bound into `mtp`.
 */
#ifndef DSV32_WEIGHTS_H
#define DSV32_WEIGHTS_H

#include <stdint.h>

#include "model/config.h"
#include "model/err.h"
#include "model/safetensors.h"

/* An FP8 e4m3 weight [out, in] with its 128x128 block scales (weight_scale_inv, multiplied). */
struct fp8_linear {
	const uint8_t *w;     /* [out, in] e4m3 codes, row-major */
	const float *scale;   /* [ceil(out/128), ceil(in/128)] fp32, powers of two in V3.2 */
	int64_t out, in;
};

/* A bf16 matrix [rows, cols] row-major (embeddings, lm_head, router, weights_proj, eh_proj). */
struct bf16_mat {
	const uint16_t *w;
	int64_t rows, cols;
};

struct layer_weights {
	float *attn_norm;          /* [hidden] input_layernorm */
	float *ffn_norm;           /* [hidden] post_attention_layernorm */
	/* MLA */
	struct fp8_linear wq_a;    /* q_a_proj [q_lora_rank, hidden] */
	float *q_norm;             /* [q_lora_rank] q_a_layernorm */
	struct fp8_linear wq_b;    /* q_b_proj [heads*(nope+rope), q_lora_rank], per head [nope|rope] */
	struct fp8_linear wkv_a;   /* kv_a_proj_with_mqa [kv_lora_rank + rope, hidden] */
	float *kv_norm;            /* [kv_lora_rank] kv_a_layernorm */
	struct fp8_linear wkv_b;   /* kv_b_proj [heads*(nope+v), kv_lora_rank], per head [k_nope|v] */
	struct fp8_linear wo;      /* o_proj [hidden, heads*v_head_dim] */
	/* lightning indexer */
	struct fp8_linear idx_wq_b;  /* indexer.wq_b [index_n_heads*128, q_lora_rank], per head [rope|nope] */
	struct fp8_linear idx_wk;    /* indexer.wk [128, hidden], [rope|nope] */
	float *idx_k_norm_w;         /* [128] indexer.k_norm.weight */
	float *idx_k_norm_b;         /* [128] indexer.k_norm.bias */
	struct bf16_mat idx_weights_proj; /* indexer.weights_proj [index_n_heads, hidden] */
	/* FFN: dense (is_moe == 0) or MoE */
	int is_moe;
	struct fp8_linear w1, w3, w2;   /* dense gate_proj, up_proj [inter, hidden]; down_proj [hidden, inter] */
	struct bf16_mat gate;           /* mlp.gate.weight [n_routed_experts, hidden] */
	float *gate_bias;               /* mlp.gate.e_score_correction_bias [n_routed_experts] */
	struct fp8_linear *exp_w1, *exp_w3, *exp_w2; /* [n_routed_experts] each: [moe_inter, hidden] / [hidden, moe_inter] */
	struct fp8_linear sh_w1, sh_w3, sh_w2;       /* shared expert [moe_inter*n_shared, hidden] / [hidden, ...] */
};

struct mtp_weights {
	struct bf16_mat embed;     /* model.layers.N.embed_tokens [vocab, hidden] */
	float *enorm, *hnorm;      /* [hidden] */
	struct bf16_mat eh_proj;   /* [hidden, 2*hidden]: first hidden input columns multiply enorm(emb) */
	float *head_norm;          /* [hidden] shared_head.norm */
	struct bf16_mat head;      /* shared_head.head [vocab, hidden] */
	struct layer_weights layer; /* the full decoder block (MLA + indexer + MoE) */
};

struct weights {
	struct bf16_mat embed;     /* model.embed_tokens [vocab, hidden] */
	float *norm;               /* [hidden] model.norm */
	struct bf16_mat lm_head;   /* [vocab, hidden] */
	int64_t n_layers;
	struct layer_weights *layers; /* [n_layers] */
	int has_mtp;
	struct mtp_weights mtp;
	void *owned;               /* allocations made by the binder (fp32 vectors, arrays) */
};

/* Binds every tensor of config c from the open checkpoint. On a missing tensor, wrong dtype or
 * shape, returns -EINVAL with e naming the tensor, the expected and the actual dtype/shape and
 * the shard file. */
int weights_bind(struct weights *w, const struct dsv32_config *c, const struct checkpoint *ck,
		 struct err *e);
void weights_free(struct weights *w);

/* What binding saw (spec §11: V3.2 expects power-of-two weight_scale_inv; others are counted,
 * not rejected; every scale must be finite and positive). */
struct weights_stats {
	int64_t n_tensors;         /* checkpoint tensors bound */
	int64_t n_scales;          /* weight_scale_inv values checked */
	int64_t n_scales_not_pow2; /* of those, not an exact power of two */
};
void weights_get_stats(const struct weights *w, struct weights_stats *s);

#endif
