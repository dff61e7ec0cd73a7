/*
 * presets.c — the configs mkmodel knows by name, as JSON text (what tests and docs reference).
 *
 * Owns: the tiny preset (also committed as tests/data/tiny_config.json; a test keeps them equal)
 * and the real 671B config (tests/data/config_671b.json; `real` truncates its layers), and the
 * DeepSeek pre-tokenizer the fallback tokenizer copies. Must not: write files.
 */
#include "tools/mkmodel/mkmodel.h"

/* The keys both presets share, the same text in each: the start of the object, and the
 * keys every DeepSeek-V3.2 config sets alike (FP8 quantisation, RMSNorm eps, RoPE scaling,
 * the routing scale and function, untied embeddings). */
#define CONFIG_HEAD \
	"{\n" \
	"  \"architectures\": [\n" \
	"    \"DeepseekV32ForCausalLM\"\n" \
	"  ],\n" \
	"  \"attention_bias\": false,\n" \
	"  \"attention_dropout\": 0.0,\n" \
	"  \"bos_token_id\": 0,\n" \
	"  \"eos_token_id\": 1,\n" \
	"  \"ep_size\": 1,\n"

#define CONFIG_FIXED \
	"  \"quantization_config\": {\n" \
	"    \"activation_scheme\": \"dynamic\",\n" \
	"    \"fmt\": \"e4m3\",\n" \
	"    \"quant_method\": \"fp8\",\n" \
	"    \"scale_fmt\": \"ue8m0\",\n" \
	"    \"weight_block_size\": [\n" \
	"      128,\n" \
	"      128\n" \
	"    ]\n" \
	"  },\n" \
	"  \"rms_norm_eps\": 1e-06,\n" \
	"  \"rope_scaling\": {\n" \
	"    \"beta_fast\": 32,\n" \
	"    \"beta_slow\": 1,\n" \
	"    \"factor\": 40,\n" \
	"    \"mscale\": 1.0,\n" \
	"    \"mscale_all_dim\": 1.0,\n" \
	"    \"original_max_position_embeddings\": 4096,\n" \
	"    \"type\": \"yarn\"\n" \
	"  },\n" \
	"  \"rope_theta\": 10000,\n" \
	"  \"routed_scaling_factor\": 2.5,\n" \
	"  \"scoring_func\": \"sigmoid\",\n" \
	"  \"tie_word_embeddings\": false,\n"

/* tiny: every feature on (2 dense + 2 MoE layers + MTP, 4 groups of 4 experts, index_topk 64
 * so a 512-token context is really sparse), vocab 129280 so the real tokenizer's ids fit. */
const char mkmodel_tiny_config[] =
	CONFIG_HEAD
	"  \"first_k_dense_replace\": 2,\n"
	"  \"hidden_act\": \"silu\",\n"
	"  \"hidden_size\": 256,\n"
	"  \"index_head_dim\": 128,\n"
	"  \"index_n_heads\": 4,\n"
	"  \"index_topk\": 64,\n"
	"  \"initializer_range\": 0.02,\n"
	"  \"intermediate_size\": 512,\n"
	"  \"kv_lora_rank\": 256,\n"
	"  \"max_position_embeddings\": 163840,\n"
	"  \"model_type\": \"deepseek_v32\",\n"
	"  \"moe_intermediate_size\": 128,\n"
	"  \"moe_layer_freq\": 1,\n"
	"  \"n_group\": 4,\n"
	"  \"n_routed_experts\": 16,\n"
	"  \"n_shared_experts\": 1,\n"
	"  \"norm_topk_prob\": true,\n"
	"  \"num_attention_heads\": 4,\n"
	"  \"num_experts_per_tok\": 4,\n"
	"  \"num_hidden_layers\": 4,\n"
	"  \"num_key_value_heads\": 4,\n"
	"  \"num_nextn_predict_layers\": 1,\n"
	"  \"q_lora_rank\": 256,\n"
	"  \"qk_nope_head_dim\": 64,\n"
	"  \"qk_rope_head_dim\": 64,\n"
	CONFIG_FIXED
	"  \"topk_group\": 2,\n"
	"  \"topk_method\": \"noaux_tc\",\n"
	"  \"torch_dtype\": \"bfloat16\",\n"
	"  \"transformers_version\": \"4.44.2\",\n"
	"  \"use_cache\": true,\n"
	"  \"v_head_dim\": 64,\n"
	"  \"vocab_size\": 129280\n"
	"}\n"
	;

/* The published DeepSeek-V3.2 config.json (spec §1). */
const char mkmodel_real_config[] =
	CONFIG_HEAD
	"  \"first_k_dense_replace\": 3,\n"
	"  \"hidden_act\": \"silu\",\n"
	"  \"hidden_size\": 7168,\n"
	"  \"index_head_dim\": 128,\n"
	"  \"index_n_heads\": 64,\n"
	"  \"index_topk\": 2048,\n"
	"  \"initializer_range\": 0.02,\n"
	"  \"intermediate_size\": 18432,\n"
	"  \"kv_lora_rank\": 512,\n"
	"  \"max_position_embeddings\": 163840,\n"
	"  \"model_type\": \"deepseek_v32\",\n"
	"  \"moe_intermediate_size\": 2048,\n"
	"  \"moe_layer_freq\": 1,\n"
	"  \"n_group\": 8,\n"
	"  \"n_routed_experts\": 256,\n"
	"  \"n_shared_experts\": 1,\n"
	"  \"norm_topk_prob\": true,\n"
	"  \"num_attention_heads\": 128,\n"
	"  \"num_experts_per_tok\": 8,\n"
	"  \"num_hidden_layers\": 61,\n"
	"  \"num_key_value_heads\": 128,\n"
	"  \"num_nextn_predict_layers\": 1,\n"
	"  \"q_lora_rank\": 1536,\n"
	"  \"qk_nope_head_dim\": 128,\n"
	"  \"qk_rope_head_dim\": 64,\n"
	CONFIG_FIXED
	"  \"topk_group\": 4,\n"
	"  \"topk_method\": \"noaux_tc\",\n"
	"  \"torch_dtype\": \"bfloat16\",\n"
	"  \"transformers_version\": \"4.44.2\",\n"
	"  \"use_cache\": true,\n"
	"  \"v_head_dim\": 128,\n"
	"  \"vocab_size\": 129280\n"
	"}\n"
	;

/* DeepSeek-V3's pre_tokenizer, copied from its tokenizer.json (ASCII-escaped). */
const char mkmodel_deepseek_pretokenizer[] =
	"{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[\\u4e00-\\u9fa5\\u3040-\\u309f\\u30a0-\\u30ff]+\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[!\\\"#$%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?[\\\\p{L}\\\\p{M}]+| ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*|\\\\s*[\\r\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}]}";
