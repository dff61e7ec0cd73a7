/* test_config.c — config.json parsing: the published 671B config, the tiny preset, and errors
 * that name the field and the file; mkmodel's --config validation. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "model/config.h"
#include "model/fileio.h"
#include "tests/ckpt_helpers.h"
#include "tests/test.h"

static char *fixture(const char *name, size_t *len)
{
	char p[4096];
	snprintf(p, sizeof p, "%s/tests/data/%s", test_root(), name);
	char *t = file_read(p, len, 1 << 20, NULL);
	REQUIRE(t);
	return t;
}

TEST(config, real_671b)
{
	struct dsv32_config c;
	struct err e;
	char p[4096];
	snprintf(p, sizeof p, "%s/tests/data/config_671b.json", test_root());
	REQUIRE(config_load(&c, p, &e) == 0);
	CHECK_EQ_STR(c.model_type, "deepseek_v32");
	CHECK_EQ_INT(c.vocab_size, 129280);
	CHECK_EQ_INT(c.hidden_size, 7168);
	CHECK_EQ_INT(c.intermediate_size, 18432);
	CHECK_EQ_INT(c.moe_intermediate_size, 2048);
	CHECK_EQ_INT(c.num_hidden_layers, 61);
	CHECK_EQ_INT(c.first_k_dense_replace, 3);
	CHECK_EQ_INT(c.num_attention_heads, 128);
	CHECK_EQ_INT(c.q_lora_rank, 1536);
	CHECK_EQ_INT(c.kv_lora_rank, 512);
	CHECK_EQ_INT(c.qk_nope_head_dim, 128);
	CHECK_EQ_INT(c.qk_rope_head_dim, 64);
	CHECK_EQ_INT(c.v_head_dim, 128);
	CHECK_EQ_INT(c.n_routed_experts, 256);
	CHECK_EQ_INT(c.n_shared_experts, 1);
	CHECK_EQ_INT(c.num_experts_per_tok, 8);
	CHECK_EQ_INT(c.n_group, 8);
	CHECK_EQ_INT(c.topk_group, 4);
	CHECK(c.routed_scaling_factor == 2.5);
	CHECK(c.norm_topk_prob == 1);
	CHECK_EQ_STR(c.rope_scaling.type, "yarn");
	CHECK(c.rope_scaling.factor == 40 && c.rope_scaling.beta_fast == 32 &&
	      c.rope_scaling.beta_slow == 1 && c.rope_scaling.mscale == 1 &&
	      c.rope_scaling.mscale_all_dim == 1);
	CHECK_EQ_INT(c.rope_scaling.original_max_position_embeddings, 4096);
	CHECK_EQ_INT(c.max_position_embeddings, 163840);
	CHECK(c.rms_norm_eps == 1e-6);
	CHECK_EQ_INT(c.index_n_heads, 64);
	CHECK_EQ_INT(c.index_head_dim, 128);
	CHECK_EQ_INT(c.index_topk, 2048);
	CHECK_EQ_INT(c.num_nextn_predict_layers, 1);
	CHECK_EQ_INT(c.bos_token_id, 0);
	CHECK_EQ_INT(c.eos_token_id, 1);
	CHECK_EQ_STR(c.quantization_config.scale_fmt, "ue8m0");
	CHECK_EQ_INT(c.quantization_config.weight_block_size[0], 128);
	/* derived (spec §1, §6) */
	CHECK_EQ_INT(c.qk_head_dim, 192);
	CHECK(fabsf(c.softmax_scale - 0.1352337789f) < 1e-7f);
	CHECK_EQ_INT(c.mla_record_bytes, 656);
	CHECK_EQ_INT(c.index_record_bytes, 132);
	CHECK(!config_layer_is_moe(&c, 2) && config_layer_is_moe(&c, 3) && config_layer_is_moe(&c, 61));
	/* the writer's output parses back to the same config */
	char *j = config_to_json(&c);
	REQUIRE(j);
	struct dsv32_config d;
	REQUIRE(config_parse(&d, j, strlen(j), "rewritten", &e) == 0);
	char *j2 = config_to_json(&d);
	CHECK_EQ_STR(j, j2);
	free(j);
	free(j2);
}

TEST(config, tiny_preset)
{
	size_t len;
	char *t = fixture("tiny_config.json", &len);
	struct dsv32_config c;
	struct err e;
	REQUIRE(config_parse(&c, t, len, "tiny_config.json", &e) == 0);
	free(t);
	CHECK_EQ_INT(c.vocab_size, 129280);
	CHECK_EQ_INT(c.hidden_size, 256);
	CHECK_EQ_INT(c.num_hidden_layers, 4);
	CHECK_EQ_INT(c.first_k_dense_replace, 2);
	CHECK_EQ_INT(c.num_nextn_predict_layers, 1);
	CHECK_EQ_INT(c.num_attention_heads * c.v_head_dim, 256);
	CHECK_EQ_INT(c.mla_record_bytes, 256 + 8 + 128);
	CHECK(c.n_group > 1 && c.topk_group < c.n_group);
	CHECK(c.index_topk < 512); /* a 512-token context is really sparse */
	CHECK(c.rope_scaling.factor == 40);
	/* mkmodel's built-in preset is this file: the config.json it writes matches */
	char dir[512], args[1024], p[1024];
	snprintf(dir, sizeof dir, "%s/t", test_tmpdir());
	snprintf(args, sizeof args, "tiny --header-only --tokenizer fallback --out %s", dir);
	REQUIRE(run_mkmodel(args, NULL) == 0);
	struct dsv32_config m;
	REQUIRE(config_load(&m, dir, &e) == 0);
	char *a = config_to_json(&c), *b = config_to_json(&m);
	CHECK_EQ_STR(a, b);
	free(a);
	free(b);
	/* and generation_config.json says T = 1.0, top_p = 0.95, bos 0, eos 1 */
	char *g = file_read(path_join(p, sizeof p, dir, "generation_config.json"), NULL, 1 << 16, NULL);
	REQUIRE(g);
	CHECK_CONTAINS(g, "\"temperature\": 1.0");
	CHECK_CONTAINS(g, "\"top_p\": 0.95");
	CHECK_CONTAINS(g, "\"bos_token_id\": 0");
	CHECK_CONTAINS(g, "\"eos_token_id\": 1");
	free(g);
}

/* The 671B text with `from` replaced by `to`, written to TMP/bad.json and loaded: it must fail
 * with a message naming the file and `needle`. */
static void expect_error(const char *from, const char *to, const char *needle)
{
	size_t len;
	char *t = fixture("config_671b.json", &len);
	char *at = strstr(t, from);
	REQUIRE(at);
	size_t nf = strlen(from), nt = strlen(to);
	char *u = malloc(len + nt + 1);
	REQUIRE(u);
	size_t pre = (size_t)(at - t);
	memcpy(u, t, pre);
	memcpy(u + pre, to, nt);
	memcpy(u + pre + nt, at + nf, len - pre - nf + 1);
	char p[512];
	snprintf(p, sizeof p, "%s/bad.json", test_tmpdir());
	REQUIRE(file_write(p, u, strlen(u), NULL) == 0);
	struct dsv32_config c;
	struct err e = {{0}};
	int r = config_load(&c, p, &e);
	CHECK(r < 0);
	CHECK_CONTAINS(e.msg, p);
	CHECK_CONTAINS(e.msg, needle);
	free(t);
	free(u);
}

TEST(config, errors_name_field_and_file)
{
	/* missing fields (top level and nested) */
	expect_error("\"hidden_size\": 7168,", "", "missing field \"hidden_size\"");
	expect_error("\"factor\": 40,", "", "\"rope_scaling.factor\"");
	expect_error("\"kv_lora_rank\": 512,", "", "kv_lora_rank");
	/* wrong types */
	expect_error("\"hidden_size\": 7168", "\"hidden_size\": \"7168\"", "\"hidden_size\": expected an integer");
	expect_error("\"norm_topk_prob\": true", "\"norm_topk_prob\": 1", "norm_topk_prob");
	expect_error("\"routed_scaling_factor\": 2.5", "\"routed_scaling_factor\": [2.5]", "routed_scaling_factor");
	expect_error("\"intermediate_size\": 18432", "\"intermediate_size\": 184.5", "intermediate_size");
	/* out of range */
	expect_error("\"qk_rope_head_dim\": 64", "\"qk_rope_head_dim\": 32", "\"qk_rope_head_dim\" = 32 out of range");
	expect_error("\"index_head_dim\": 128", "\"index_head_dim\": 64", "index_head_dim");
	expect_error("\"vocab_size\": 129280", "\"vocab_size\": -1", "vocab_size");
	expect_error("\"topk_group\": 4", "\"topk_group\": 9", "topk_group");
	expect_error("\"hidden_size\": 7168", "\"hidden_size\": 7000", "hidden_size = 7000 is not a multiple of 128");
	expect_error("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 0.5", "rms_norm_eps");
	/* unknown model_type and other unsupported strings */
	expect_error("\"model_type\": \"deepseek_v32\"", "\"model_type\": \"deepseek_v3\"",
		     "\"model_type\" = \"deepseek_v3\"");
	expect_error("\"type\": \"yarn\"", "\"type\": \"linear\"", "rope_scaling.type");
	expect_error("\"scale_fmt\": \"ue8m0\"", "\"scale_fmt\": \"fp32\"", "scale_fmt");
	/* not JSON at all */
	expect_error("{", "{{", "not valid JSON");
}

TEST(config, mkmodel_rejects_bad_config)
{
	char p[512], args[1024];
	snprintf(p, sizeof p, "%s/c.json", test_tmpdir());
	const char *bad = "{\"model_type\": \"deepseek_v32\"}";
	REQUIRE(file_write(p, bad, strlen(bad), NULL) == 0);
	snprintf(args, sizeof args, "--config %s --out %s/o", p, test_tmpdir());
	char *log = NULL;
	CHECK(run_mkmodel(args, &log) == 1);
	CHECK_CONTAINS(log, p);
	CHECK_CONTAINS(log, "missing field \"vocab_size\"");
	free(log);
	snprintf(args, sizeof args, "--config %s/none.json --out %s/o", test_tmpdir(), test_tmpdir());
	CHECK(run_mkmodel(args, &log) == 1);
	CHECK_CONTAINS(log, "none.json");
	free(log);
	CHECK(run_mkmodel("real --layers 2 --dense 3 --out /nonexistent", NULL) == 2);
	CHECK(run_mkmodel("tiny", NULL) == 2); /* no --out */
}
