/*
 * config.c — DeepSeek-V3.2 config.json: table-driven parse, validation, derived constants,
 * and the writer mkmodel uses. Every error names the file and the field.
 */
#include "model/config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/fileio.h"
#include "model/json.h"

enum ftype { F_INT, F_NUM, F_STR, F_BOOL };

struct field {
	const char *name; /* "a" or "a.b" for a member of a nested object */
	enum ftype type;
	size_t off, size; /* size: capacity of a string field */
	int required;
	double lo, hi;    /* inclusive range for numbers */
	double def;       /* default for optional numbers / bools */
	const char *def_str;
};

#define OFF(f) offsetof(struct dsv32_config, f)
#define INT(n, f, lo, hi) {n, F_INT, OFF(f), 0, 1, lo, hi, 0, NULL}
#define INT_OPT(n, f, lo, hi, d) {n, F_INT, OFF(f), 0, 0, lo, hi, d, NULL}
#define NUM(n, f, lo, hi) {n, F_NUM, OFF(f), 0, 1, lo, hi, 0, NULL}
#define STR(n, f) {n, F_STR, OFF(f), sizeof(((struct dsv32_config *)0)->f), 1, 0, 0, 0, NULL}
#define STR_OPT(n, f, d) {n, F_STR, OFF(f), sizeof(((struct dsv32_config *)0)->f), 0, 0, 0, 0, d}
#define BOOL_OPT(n, f, d) {n, F_BOOL, OFF(f), 0, 0, 0, 0, d, NULL}

#define BIG 1e12
static const struct field fields[] = {
	STR("model_type", model_type),
	INT("vocab_size", vocab_size, 1, 1 << 24),
	INT("hidden_size", hidden_size, 128, 65536),
	INT("intermediate_size", intermediate_size, 128, 1 << 20),
	INT("moe_intermediate_size", moe_intermediate_size, 128, 1 << 20),
	INT("num_hidden_layers", num_hidden_layers, 1, 1024),
	INT("first_k_dense_replace", first_k_dense_replace, 0, 1024),
	INT_OPT("moe_layer_freq", moe_layer_freq, 1, 1, 1),
	INT("num_attention_heads", num_attention_heads, 1, 1024),
	INT_OPT("num_key_value_heads", num_key_value_heads, 1, 1024, 0),
	INT("q_lora_rank", q_lora_rank, 128, 65536),
	INT("kv_lora_rank", kv_lora_rank, 128, 65536),
	INT("qk_nope_head_dim", qk_nope_head_dim, 1, 1024),
	INT("qk_rope_head_dim", qk_rope_head_dim, 64, 64),
	INT("v_head_dim", v_head_dim, 1, 1024),
	INT("n_routed_experts", n_routed_experts, 1, 4096),
	INT("n_shared_experts", n_shared_experts, 0, 16),
	INT("num_experts_per_tok", num_experts_per_tok, 1, 4096),
	INT("n_group", n_group, 1, 4096),
	INT("topk_group", topk_group, 1, 4096),
	NUM("routed_scaling_factor", routed_scaling_factor, 1e-6, 1e6),
	STR_OPT("scoring_func", scoring_func, "sigmoid"),
	STR_OPT("topk_method", topk_method, "noaux_tc"),
	BOOL_OPT("norm_topk_prob", norm_topk_prob, 1),
	STR_OPT("hidden_act", hidden_act, "silu"),
	NUM("rope_theta", rope_theta, 1, BIG),
	STR("rope_scaling.type", rope_scaling.type),
	NUM("rope_scaling.factor", rope_scaling.factor, 1, 1e6),
	INT("rope_scaling.original_max_position_embeddings",
	    rope_scaling.original_max_position_embeddings, 1, 1 << 30),
	NUM("rope_scaling.beta_fast", rope_scaling.beta_fast, 1e-6, 1e6),
	NUM("rope_scaling.beta_slow", rope_scaling.beta_slow, 1e-6, 1e6),
	NUM("rope_scaling.mscale", rope_scaling.mscale, 0, 1e6),
	NUM("rope_scaling.mscale_all_dim", rope_scaling.mscale_all_dim, 0, 1e6),
	INT("max_position_embeddings", max_position_embeddings, 1, 1 << 30),
	NUM("rms_norm_eps", rms_norm_eps, 1e-12, 1e-1),
	INT("index_n_heads", index_n_heads, 1, 1024),
	INT("index_head_dim", index_head_dim, 128, 128),
	INT("index_topk", index_topk, 1, 1 << 24),
	INT_OPT("num_nextn_predict_layers", num_nextn_predict_layers, 0, 1, 0),
	INT_OPT("bos_token_id", bos_token_id, 0, 1 << 24, 0),
	INT_OPT("eos_token_id", eos_token_id, 0, 1 << 24, 1),
	BOOL_OPT("tie_word_embeddings", tie_word_embeddings, 0),
	BOOL_OPT("attention_bias", attention_bias, 0),
	STR("quantization_config.quant_method", quantization_config.quant_method),
	STR("quantization_config.fmt", quantization_config.fmt),
	STR_OPT("quantization_config.activation_scheme", quantization_config.activation_scheme,
		"dynamic"),
	STR_OPT("quantization_config.scale_fmt", quantization_config.scale_fmt, "ue8m0"),
};

static const struct json *lookup(const struct json *root, const char *dotted)
{
	char buf[96];
	snprintf(buf, sizeof buf, "%s", dotted);
	char *dot = strchr(buf, '.');
	if (!dot)
		return json_get(root, buf);
	*dot = 0;
	return json_get(json_get(root, buf), dot + 1);
}

static int parse_field(struct dsv32_config *c, const struct field *f, const struct json *root,
		       const char *path, struct err *e)
{
	char *dst = (char *)c + f->off;
	const struct json *v = lookup(root, f->name);
	if (!v || v->type == JSON_NULL) {
		if (f->required)
			return err_set(e, -EINVAL, "%s: missing field \"%s\"", path, f->name);
		switch (f->type) {
		case F_INT: *(int64_t *)dst = (int64_t)f->def; break;
		case F_NUM: *(double *)dst = f->def; break;
		case F_BOOL: *(int *)dst = (int)f->def; break;
		case F_STR: snprintf(dst, f->size, "%s", f->def_str); break;
		}
		return 0;
	}
	switch (f->type) {
	case F_INT: {
		int64_t x;
		/* HF configs sometimes write integers as 4096.0; accept exact integral values. */
		if (json_int64(v, &x)) {
			if (v->type != JSON_NUMBER || v->num != floor(v->num) || fabs(v->num) > 9e15)
				return err_set(e, -EINVAL, "%s: field \"%s\": expected an integer, got %s",
					       path, f->name,
					       v->type == JSON_NUMBER ? v->str : json_type_name(v->type));
			x = (int64_t)v->num;
		}
		if (f->hi > 0 && (x < f->lo || x > f->hi))
			return err_set(e, -ERANGE, "%s: field \"%s\" = %lld out of range [%.0f, %.0f]",
				       path, f->name, (long long)x, f->lo, f->hi);
		*(int64_t *)dst = x;
		return 0;
	}
	case F_NUM:
		if (v->type != JSON_NUMBER)
			return err_set(e, -EINVAL, "%s: field \"%s\": expected a number, got %s", path,
				       f->name, json_type_name(v->type));
		if (!(v->num >= f->lo && v->num <= f->hi))
			return err_set(e, -ERANGE, "%s: field \"%s\" = %s out of range [%g, %g]", path,
				       f->name, v->str, f->lo, f->hi);
		*(double *)dst = v->num;
		return 0;
	case F_BOOL:
		if (v->type != JSON_TRUE && v->type != JSON_FALSE)
			return err_set(e, -EINVAL, "%s: field \"%s\": expected true or false, got %s",
				       path, f->name, json_type_name(v->type));
		*(int *)dst = v->type == JSON_TRUE;
		return 0;
	case F_STR:
		if (v->type != JSON_STRING)
			return err_set(e, -EINVAL, "%s: field \"%s\": expected a string, got %s", path,
				       f->name, json_type_name(v->type));
		if (v->len >= f->size)
			return err_set(e, -EINVAL, "%s: field \"%s\": string too long", path, f->name);
		memcpy(dst, v->str, v->len + 1);
		return 0;
	}
	return 0;
}

static int expect_str(const char *path, const char *field, const char *got, const char *want,
		      struct err *e)
{
	if (!strcmp(got, want))
		return 0;
	return err_set(e, -EINVAL, "%s: field \"%s\" = \"%s\": only \"%s\" is supported", path,
		       field, got, want);
}

/* Structural rules the kernels and the cache layout rely on. */
static int validate(const struct dsv32_config *c, const char *path, struct err *e)
{
	int r;
	if ((r = expect_str(path, "model_type", c->model_type, "deepseek_v32", e)) ||
	    (r = expect_str(path, "scoring_func", c->scoring_func, "sigmoid", e)) ||
	    (r = expect_str(path, "topk_method", c->topk_method, "noaux_tc", e)) ||
	    (r = expect_str(path, "hidden_act", c->hidden_act, "silu", e)) ||
	    (r = expect_str(path, "rope_scaling.type", c->rope_scaling.type, "yarn", e)) ||
	    (r = expect_str(path, "quantization_config.quant_method",
			    c->quantization_config.quant_method, "fp8", e)) ||
	    (r = expect_str(path, "quantization_config.fmt", c->quantization_config.fmt, "e4m3", e)) ||
	    (r = expect_str(path, "quantization_config.scale_fmt", c->quantization_config.scale_fmt,
			    "ue8m0", e)))
		return r;
	struct {
		const char *name;
		int64_t v;
	} mult128[] = {
		{"hidden_size", c->hidden_size},
		{"q_lora_rank", c->q_lora_rank},
		{"kv_lora_rank", c->kv_lora_rank},
		{"intermediate_size", c->intermediate_size},
		{"moe_intermediate_size", c->moe_intermediate_size},
		{"num_attention_heads x v_head_dim", c->num_attention_heads * c->v_head_dim},
	};
	for (size_t i = 0; i < sizeof mult128 / sizeof *mult128; i++)
		if (mult128[i].v % 128)
			return err_set(e, -EINVAL, "%s: %s = %lld is not a multiple of 128", path,
				       mult128[i].name, (long long)mult128[i].v);
	if (c->quantization_config.weight_block_size[0] != 128 ||
	    c->quantization_config.weight_block_size[1] != 128)
		return err_set(e, -EINVAL,
			       "%s: field \"quantization_config.weight_block_size\" = [%lld, %lld]: "
			       "only [128, 128] is supported",
			       path, (long long)c->quantization_config.weight_block_size[0],
			       (long long)c->quantization_config.weight_block_size[1]);
	if (c->n_routed_experts % c->n_group)
		return err_set(e, -EINVAL, "%s: n_routed_experts = %lld is not a multiple of n_group = %lld",
			       path, (long long)c->n_routed_experts, (long long)c->n_group);
	if (c->topk_group > c->n_group)
		return err_set(e, -ERANGE, "%s: topk_group = %lld exceeds n_group = %lld", path,
			       (long long)c->topk_group, (long long)c->n_group);
	if (c->n_routed_experts / c->n_group < 2)
		return err_set(e, -ERANGE, "%s: fewer than 2 experts per group (group scores are the sum of the top 2)",
			       path);
	if (c->num_experts_per_tok > c->topk_group * (c->n_routed_experts / c->n_group))
		return err_set(e, -ERANGE,
			       "%s: num_experts_per_tok = %lld exceeds the experts in topk_group groups",
			       path, (long long)c->num_experts_per_tok);
	if (c->first_k_dense_replace > c->num_hidden_layers)
		return err_set(e, -ERANGE, "%s: first_k_dense_replace = %lld exceeds num_hidden_layers = %lld",
			       path, (long long)c->first_k_dense_replace, (long long)c->num_hidden_layers);
	if (c->qk_nope_head_dim % 2)
		return err_set(e, -EINVAL, "%s: qk_nope_head_dim = %lld must be even", path,
			       (long long)c->qk_nope_head_dim);
	if (c->tie_word_embeddings)
		return err_set(e, -EINVAL, "%s: field \"tie_word_embeddings\" = true: DeepSeek-V3.2 has a separate lm_head",
			       path);
	if (c->attention_bias)
		return err_set(e, -EINVAL, "%s: field \"attention_bias\" = true is not DeepSeek-V3.2", path);
	if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size)
		return err_set(e, -ERANGE, "%s: bos_token_id / eos_token_id outside vocab_size", path);
	return 0;
}

void config_derive(struct dsv32_config *c)
{
	if (c->num_key_value_heads == 0)
		c->num_key_value_heads = c->num_attention_heads;
	c->qk_head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
	/* spec §3.5: YaRN is always on; m = 0.1 * mscale_all_dim * ln(factor) + 1 (double, as the
	 * reference's Python floats), then the product is used as fp32. */
	double m = 0.1 * c->rope_scaling.mscale_all_dim * log(c->rope_scaling.factor) + 1.0;
	c->softmax_scale = (float)(pow((double)c->qk_head_dim, -0.5) * m * m);
	c->mla_record_bytes = (size_t)(c->kv_lora_rank + c->kv_lora_rank / 128 * 4 +
				       2 * c->qk_rope_head_dim);
	c->index_record_bytes = (size_t)(c->index_head_dim + 4);
}

int config_parse(struct dsv32_config *c, const char *text, size_t len, const char *path,
		 struct err *e)
{
	memset(c, 0, sizeof *c);
	struct json_doc doc;
	int r = json_parse(&doc, text, len);
	if (r)
		return err_set(e, r, "%s: not valid JSON: %s", path, doc.err);
	if (doc.root->type != JSON_OBJECT) {
		json_doc_free(&doc);
		return err_set(e, -EINVAL, "%s: expected a JSON object", path);
	}
	for (size_t i = 0; i < sizeof fields / sizeof *fields && !r; i++)
		r = parse_field(c, &fields[i], doc.root, path, e);
	if (!r) {
		const struct json *wbs = json_get(json_get(doc.root, "quantization_config"),
						  "weight_block_size");
		int64_t a, b;
		if (!wbs)
			c->quantization_config.weight_block_size[0] =
				c->quantization_config.weight_block_size[1] = 128;
		else if (wbs->type != JSON_ARRAY || wbs->n != 2 || json_int64(json_at(wbs, 0), &a) ||
			 json_int64(json_at(wbs, 1), &b))
			r = err_set(e, -EINVAL,
				    "%s: field \"quantization_config.weight_block_size\": expected [int, int]",
				    path);
		else
			c->quantization_config.weight_block_size[0] = a,
			c->quantization_config.weight_block_size[1] = b;
	}
	json_doc_free(&doc);
	if (!r)
		r = validate(c, path, e);
	if (!r)
		config_derive(c);
	return r;
}

int config_load(struct dsv32_config *c, const char *path, struct err *e)
{
	char file[4096];
	size_t n = strlen(path);
	if (n > 5 && !strcmp(path + n - 5, ".json"))
		snprintf(file, sizeof file, "%s", path);
	else
		path_join(file, sizeof file, path, "config.json");
	size_t len;
	char *text = file_read(file, &len, 16u << 20, e);
	if (!text)
		return -EINVAL;
	int r = config_parse(c, text, len, file, e);
	free(text);
	return r;
}

int config_layer_is_moe(const struct dsv32_config *c, int64_t l)
{
	return l >= c->first_k_dense_replace && c->n_routed_experts > 0;
}

char *config_to_json(const struct dsv32_config *c)
{
	struct sbuf b = {0};
	sbuf_puts(&b, "{\n  \"architectures\": [\"DeepseekV32ForCausalLM\"],\n");
	sbuf_printf(&b, "  \"model_type\": \"%s\",\n", c->model_type);
	for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
		const struct field *f = &fields[i];
		if (strchr(f->name, '.') || !strcmp(f->name, "model_type"))
			continue;
		const char *src = (const char *)c + f->off;
		sbuf_printf(&b, "  \"%s\": ", f->name);
		switch (f->type) {
		case F_INT: sbuf_printf(&b, "%lld", (long long)*(const int64_t *)src); break;
		case F_NUM: json_write_double(&b, *(const double *)src); break;
		case F_BOOL: sbuf_puts(&b, *(const int *)src ? "true" : "false"); break;
		case F_STR: sbuf_printf(&b, "\"%s\"", src); break;
		}
		sbuf_puts(&b, ",\n");
	}
	const __typeof__(c->rope_scaling) *rs = &c->rope_scaling;
	sbuf_printf(&b, "  \"rope_scaling\": {\"type\": \"%s\", \"factor\": ", rs->type);
	json_write_double(&b, rs->factor);
	sbuf_printf(&b, ", \"original_max_position_embeddings\": %lld, \"beta_fast\": ",
		    (long long)rs->original_max_position_embeddings);
	json_write_double(&b, rs->beta_fast);
	sbuf_puts(&b, ", \"beta_slow\": ");
	json_write_double(&b, rs->beta_slow);
	sbuf_puts(&b, ", \"mscale\": ");
	json_write_double(&b, rs->mscale);
	sbuf_puts(&b, ", \"mscale_all_dim\": ");
	json_write_double(&b, rs->mscale_all_dim);
	sbuf_puts(&b, "},\n");
	const __typeof__(c->quantization_config) *q = &c->quantization_config;
	sbuf_printf(&b,
		    "  \"quantization_config\": {\"quant_method\": \"%s\", \"fmt\": \"%s\", "
		    "\"activation_scheme\": \"%s\", \"weight_block_size\": [%lld, %lld], "
		    "\"scale_fmt\": \"%s\"},\n",
		    q->quant_method, q->fmt, q->activation_scheme, (long long)q->weight_block_size[0],
		    (long long)q->weight_block_size[1], q->scale_fmt);
	sbuf_puts(&b, "  \"torch_dtype\": \"bfloat16\"\n}\n");
	return sbuf_cstr(&b);
}
