/*
 * config.h — the model's hyperparameters, read from a DeepSeek-V3.2 HF config.json (spec §1).
 *
 * Field names are DeepSeek's own (grep works across the spec, the checkpoint and the code).
 * Owns: parsing and validating config.json, and the constants derived from it (softmax scale,
 * YaRN tables' inputs, cache record sizes). Must not: read tensors.
 */
#ifndef DSV32_CONFIG_H
#define DSV32_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "model/err.h"

struct dsv32_config {
	char model_type[32];       /* "deepseek_v32" */
	int64_t vocab_size;        /* 129280 */
	int64_t hidden_size;       /* 7168 */
	int64_t intermediate_size; /* 18432, dense MLP */
	int64_t moe_intermediate_size; /* 2048, per expert */
	int64_t num_hidden_layers; /* 61 */
	int64_t first_k_dense_replace; /* 3 */
	int64_t moe_layer_freq;    /* 1 */
	int64_t num_attention_heads; /* 128 */
	int64_t num_key_value_heads; /* 128, unused by MLA */
	int64_t q_lora_rank;       /* 1536 */
	int64_t kv_lora_rank;      /* 512 */
	int64_t qk_nope_head_dim;  /* 128 */
	int64_t qk_rope_head_dim;  /* 64 */
	int64_t v_head_dim;        /* 128 */
	int64_t n_routed_experts;  /* 256 */
	int64_t n_shared_experts;  /* 1 */
	int64_t num_experts_per_tok; /* 8 */
	int64_t n_group;           /* 8 */
	int64_t topk_group;        /* 4 */
	double routed_scaling_factor; /* 2.5 */
	char scoring_func[16];     /* "sigmoid" */
	char topk_method[16];      /* "noaux_tc" */
	int norm_topk_prob;        /* true */
	char hidden_act[16];       /* "silu" */
	double rope_theta;         /* 10000 */
	struct {
		char type[16];     /* "yarn" */
		double factor;     /* 40 */
		int64_t original_max_position_embeddings; /* 4096 */
		double beta_fast, beta_slow; /* 32, 1 */
		double mscale, mscale_all_dim; /* 1, 1 */
	} rope_scaling;
	int64_t max_position_embeddings; /* 163840 */
	double rms_norm_eps;       /* 1e-6 */
	int64_t index_n_heads;     /* 64 */
	int64_t index_head_dim;    /* 128 */
	int64_t index_topk;        /* 2048 */
	int64_t num_nextn_predict_layers; /* 1 */
	int64_t bos_token_id, eos_token_id; /* 0, 1 */
	int tie_word_embeddings;   /* false */
	int attention_bias;        /* false */
	struct {
		char quant_method[16]; /* "fp8" */
		char fmt[16];          /* "e4m3" */
		char activation_scheme[16]; /* "dynamic" */
		int64_t weight_block_size[2]; /* 128, 128 */
		char scale_fmt[16];    /* "ue8m0" */
	} quantization_config;

	/* Derived (config_derive) */
	int64_t qk_head_dim;       /* qk_nope_head_dim + qk_rope_head_dim = 192 */
	float softmax_scale;       /* qk_head_dim^-0.5 * m^2, m = 0.1*mscale_all_dim*ln(factor)+1 */
	size_t mla_record_bytes;   /* kv_lora_rank + kv_lora_rank/128*4 + 2*qk_rope_head_dim = 656 */
	size_t index_record_bytes; /* index_head_dim + 4 = 132 */
};

/* Parses and validates config.json text. `path` only names the file in messages. */
int config_parse(struct dsv32_config *c, const char *text, size_t len, const char *path,
		 struct err *e);
/* Reads DIR/config.json (or a file path) and parses it. */
int config_load(struct dsv32_config *c, const char *path, struct err *e);
/* Writes c as a config.json in the published HF form (the fields above, without derived). */
char *config_to_json(const struct dsv32_config *c);
/* Fills the derived fields; called by config_parse. */
void config_derive(struct dsv32_config *c);
/* 1 if layer l (0-based, < num_hidden_layers + num_nextn_predict_layers) has a MoE FFN. */
int config_layer_is_moe(const struct dsv32_config *c, int64_t l);

#endif
