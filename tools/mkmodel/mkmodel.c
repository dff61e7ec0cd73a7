/*
 * mkmodel.c — writes a complete DeepSeek-V3.2 checkpoint directory in the published format
 * (config.json, generation_config.json, tokenizer.json, tokenizer_config.json, sharded
 * safetensors + model.safetensors.index.json) with deterministic random weights.
 *
 *   mkmodel tiny --out DIR [--seed N]
 *   mkmodel real --layers N --dense K --out DIR [--header-only]
 *   mkmodel --config FILE --out DIR
 *   common: --tokenizer FILE|fallback, --patch-v31-tokens, --manifest FILE, --structured
 *   (small test checkpoints whose routing and index choices have margins: structured.c)
 *   mkmodel manifest --model DIR [--out FILE]     (name, dtype, shape, sha256 per tensor)
 *
 * Owns: the tensor list of spec §7.2 as the writer sees it, the sharding, and the manifest.
 * Values come from gen.h (tests regenerate them from the same seed). Must not: use floating
 * point in the random stream, or write anything outside --out.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "model/config.h"
#include "model/fileio.h"
#include "model/json.h"
#include "model/safetensors.h"
#include "model/sha256.h"
#include "tools/mkmodel/gen.h"
#include "tools/mkmodel/mkmodel.h"

/* ---- the tensor list ---------------------------------------------------------------------- */

struct tspec {
	char name[128];
	const char *stream; /* generator stream name (MTP copies use the main tensor's) */
	enum st_dtype dtype;
	int ndim;
	int64_t shape[2];
	enum gen_kind kind;
	int64_t fan_in;
	int shard;
};

struct tlist {
	struct tspec *t;
	size_t n, cap;
	int shard; /* shard of the tensors being added */
};

static void add(struct tlist *l, const char *name, enum st_dtype dt, int64_t d0, int64_t d1,
		enum gen_kind kind, int64_t fan_in, const char *stream)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 256;
		l->t = realloc(l->t, l->cap * sizeof *l->t);
		ASSERT(l->t);
	}
	struct tspec *t = &l->t[l->n++];
	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "%s", name);
	t->stream = stream;
	t->dtype = dt;
	t->ndim = d1 ? 2 : 1;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->kind = kind;
	t->fan_in = fan_in;
	t->shard = l->shard;
}

static void add_fp8(struct tlist *l, const char *prefix, int64_t out, int64_t in)
{
	char n[160];
	snprintf(n, sizeof n, "%s.weight", prefix);
	add(l, n, ST_F8_E4M3, out, in, GEN_FP8, in, NULL);
	snprintf(n, sizeof n, "%s.weight_scale_inv", prefix);
	add(l, n, ST_F32, (out + 127) / 128, (in + 127) / 128, GEN_SCALE, in, NULL);
}

/* Every tensor of checkpoint layer L (spec §7.2), in the order weights.c binds them. */
static void add_layer(struct tlist *l, const struct dsv32_config *c, int64_t L)
{
	const int64_t H = c->hidden_size, heads = c->num_attention_heads, ID = c->index_head_dim;
	char p[160];
#define P(s) (snprintf(p, sizeof p, "model.layers.%lld.%s", (long long)L, s), p)
	add(l, P("input_layernorm.weight"), ST_BF16, H, 0, GEN_NORM, 0, NULL);
	add(l, P("post_attention_layernorm.weight"), ST_BF16, H, 0, GEN_NORM, 0, NULL);
	add_fp8(l, P("self_attn.q_a_proj"), c->q_lora_rank, H);
	add(l, P("self_attn.q_a_layernorm.weight"), ST_BF16, c->q_lora_rank, 0, GEN_NORM, 0, NULL);
	add_fp8(l, P("self_attn.q_b_proj"), heads * c->qk_head_dim, c->q_lora_rank);
	add_fp8(l, P("self_attn.kv_a_proj_with_mqa"), c->kv_lora_rank + c->qk_rope_head_dim, H);
	add(l, P("self_attn.kv_a_layernorm.weight"), ST_BF16, c->kv_lora_rank, 0, GEN_NORM, 0, NULL);
	add_fp8(l, P("self_attn.kv_b_proj"), heads * (c->qk_nope_head_dim + c->v_head_dim),
		c->kv_lora_rank);
	add_fp8(l, P("self_attn.o_proj"), H, heads * c->v_head_dim);
	add_fp8(l, P("self_attn.indexer.wq_b"), c->index_n_heads * ID, c->q_lora_rank);
	add_fp8(l, P("self_attn.indexer.wk"), ID, H);
	add(l, P("self_attn.indexer.k_norm.weight"), ST_BF16, ID, 0, GEN_NORM, 0, NULL);
	add(l, P("self_attn.indexer.k_norm.bias"), ST_BF16, ID, 0, GEN_BIAS_BF16, 0, NULL);
	add(l, P("self_attn.indexer.weights_proj.weight"), ST_BF16, c->index_n_heads, H, GEN_BF16,
	    H, NULL);
	if (!config_layer_is_moe(c, L)) {
		add_fp8(l, P("mlp.gate_proj"), c->intermediate_size, H);
		add_fp8(l, P("mlp.up_proj"), c->intermediate_size, H);
		add_fp8(l, P("mlp.down_proj"), H, c->intermediate_size);
		return;
	}
	const int64_t E = c->n_routed_experts, MI = c->moe_intermediate_size;
	add(l, P("mlp.gate.weight"), ST_BF16, E, H, GEN_BF16, H, NULL);
	add(l, P("mlp.gate.e_score_correction_bias"), ST_F32, E, 0, GEN_BIAS_F32, 0, NULL);
	for (int64_t j = 0; j < E; j++) {
		char q[160];
		snprintf(q, sizeof q, "model.layers.%lld.mlp.experts.%lld.gate_proj", (long long)L,
			 (long long)j);
		add_fp8(l, q, MI, H);
		snprintf(q, sizeof q, "model.layers.%lld.mlp.experts.%lld.up_proj", (long long)L,
			 (long long)j);
		add_fp8(l, q, MI, H);
		snprintf(q, sizeof q, "model.layers.%lld.mlp.experts.%lld.down_proj", (long long)L,
			 (long long)j);
		add_fp8(l, q, H, MI);
	}
	if (c->n_shared_experts > 0) {
		const int64_t SI = MI * c->n_shared_experts;
		add_fp8(l, P("mlp.shared_experts.gate_proj"), SI, H);
		add_fp8(l, P("mlp.shared_experts.up_proj"), SI, H);
		add_fp8(l, P("mlp.shared_experts.down_proj"), H, SI);
	}
#undef P
}

/* Shards: embeddings; layers_per_shard main layers each; the MTP layer; norm + lm_head. */
static int build_list(struct tlist *l, const struct dsv32_config *c, int64_t layers_per_shard)
{
	const int64_t H = c->hidden_size, V = c->vocab_size;
	l->shard = 0;
	add(l, "model.embed_tokens.weight", ST_BF16, V, H, GEN_BF16, 1, NULL);
	for (int64_t L = 0; L < c->num_hidden_layers; L++) {
		l->shard = 1 + (int)(L / layers_per_shard);
		add_layer(l, c, L);
	}
	l->shard++;
	if (c->num_nextn_predict_layers > 0) {
		const int64_t L = c->num_hidden_layers;
		char p[160];
#define P(s) (snprintf(p, sizeof p, "model.layers.%lld.%s", (long long)L, s), p)
		/* embed_tokens and shared_head.head are copies of the main ones, as published */
		add(l, P("embed_tokens.weight"), ST_BF16, V, H, GEN_BF16, 1, "model.embed_tokens.weight");
		add(l, P("enorm.weight"), ST_BF16, H, 0, GEN_NORM, 0, NULL);
		add(l, P("hnorm.weight"), ST_BF16, H, 0, GEN_NORM, 0, NULL);
		add(l, P("eh_proj.weight"), ST_BF16, H, 2 * H, GEN_BF16, 2 * H, NULL);
		add(l, P("shared_head.norm.weight"), ST_BF16, H, 0, GEN_NORM, 0, NULL);
		add(l, P("shared_head.head.weight"), ST_BF16, V, H, GEN_BF16, H, "lm_head.weight");
#undef P
		add_layer(l, c, L);
		l->shard++;
	}
	add(l, "model.norm.weight", ST_BF16, H, 0, GEN_NORM, 0, NULL);
	add(l, "lm_head.weight", ST_BF16, V, H, GEN_BF16, H, NULL);
	return l->shard + 1;
}

/* ---- writing ------------------------------------------------------------------------------ */

static size_t tbytes(const struct tspec *t)
{
	size_t n = st_dtype_size(t->dtype) * (size_t)t->shape[0];
	return t->ndim == 2 ? n * (size_t)t->shape[1] : n;
}

static void shard_name(char *buf, size_t size, int s, int n)
{
	snprintf(buf, size, "model-%05d-of-%05d.safetensors", s + 1, n);
}

/* --structured: the whole tensor generated in memory, edited by structured_apply, written. */
static int write_structured(struct st_writer *w, const struct dsv32_config *c,
			    const struct tspec *t, uint64_t seed)
{
	size_t n = tbytes(t);
	void *buf = malloc(n ? n : 1);
	ASSERT(buf);
	struct gen g;
	gen_init(&g, seed, t->stream ? t->stream : t->name, t->kind, t->fan_in);
	gen_fill(&g, buf, n / gen_elem_size(t->kind));
	structured_apply(c, seed, t->name, t->shape, buf);
	int r = st_writer_data(w, buf, n);
	free(buf);
	return r;
}

static int write_shard(const char *dir, const struct tlist *l, int s, int n_shards,
		       uint64_t seed, int header_only, void *chunk, size_t chunk_bytes,
		       const struct dsv32_config *structured, struct err *e)
{
	char name[64], path[4096];
	shard_name(name, sizeof name, s, n_shards);
	struct st_writer *w = st_writer_open(path_join(path, sizeof path, dir, name), e);
	if (!w)
		return -EIO;
	for (size_t i = 0; i < l->n; i++)
		if (l->t[i].shard == s)
			st_writer_add(w, l->t[i].name, l->t[i].dtype, l->t[i].ndim, l->t[i].shape);
	st_writer_begin_data(w);
	for (size_t i = 0; i < l->n; i++) {
		const struct tspec *t = &l->t[i];
		if (t->shard != s)
			continue;
		size_t left = tbytes(t);
		if (structured) {
			if (write_structured(w, structured, t, seed))
				break;
			continue;
		}
		if (header_only && (t->kind == GEN_FP8 || t->kind == GEN_BF16)) {
			st_writer_skip(w, left); /* a file hole: big weights stay unwritten */
			continue;
		}
		struct gen g;
		gen_init(&g, seed, t->stream ? t->stream : t->name, t->kind, t->fan_in);
		size_t es = gen_elem_size(t->kind);
		while (left) {
			size_t n = left < chunk_bytes ? left : chunk_bytes;
			gen_fill(&g, chunk, n / es);
			if (st_writer_data(w, chunk, n))
				break;
			left -= n;
		}
	}
	return st_writer_close(w, e);
}

static int cmp_spec(const void *a, const void *b)
{
	return strcmp((*(struct tspec *const *)a)->name, (*(struct tspec *const *)b)->name);
}

static int write_index(const char *dir, const struct tlist *l, int n_shards, struct err *e)
{
	struct tspec **by = malloc(l->n * sizeof *by);
	if (!by)
		return err_set(e, -ENOMEM, "out of memory");
	uint64_t total = 0;
	for (size_t i = 0; i < l->n; i++)
		by[i] = &l->t[i], total += tbytes(&l->t[i]);
	qsort(by, l->n, sizeof *by, cmp_spec); /* HF writes the weight_map sorted by name */
	struct sbuf b = {0};
	sbuf_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {\n",
		    total);
	for (size_t i = 0; i < l->n; i++) {
		char name[64];
		shard_name(name, sizeof name, by[i]->shard, n_shards);
		sbuf_puts(&b, "    ");
		json_write_str(&b, by[i]->name, strlen(by[i]->name), 0);
		sbuf_printf(&b, ": \"%s\"%s\n", name, i + 1 < l->n ? "," : "");
	}
	sbuf_puts(&b, "  }\n}\n");
	free(by);
	char path[4096];
	const char *text = sbuf_cstr(&b);
	int r = text ? file_write(path_join(path, sizeof path, dir, "model.safetensors.index.json"),
				  text, b.len, e)
		     : err_set(e, -ENOMEM, "out of memory");
	sbuf_free(&b);
	return r;
}

static const char generation_config[] =
	"{\n"
	"  \"_from_model_config\": true,\n"
	"  \"bos_token_id\": 0,\n"
	"  \"eos_token_id\": 1,\n"
	"  \"do_sample\": true,\n"
	"  \"temperature\": 1.0,\n"
	"  \"top_p\": 0.95,\n"
	"  \"transformers_version\": \"4.46.3\"\n"
	"}\n";

/* The manifest: one line per tensor in name order, "name dtype d0,d1 sha256", read back
 * through our reader (tests/gpu/check_safetensors.py compares it with the `safetensors`
 * package's view of the same files). */
static int write_manifest(const char *model, const char *out, struct err *e)
{
	struct checkpoint ck;
	int r = ckpt_open(&ck, model, e);
	if (r)
		return r;
	FILE *f = out ? fopen(out, "w") : stdout;
	if (!f) {
		r = err_set(e, -errno, "%s: cannot create: %s", out, strerror(errno));
		ckpt_close(&ck);
		return r;
	}
	for (size_t i = 0; i < ck.n_tensors; i++) {
		const struct st_tensor *t = &ck.tensors[i];
		char hex[65];
		sha256_hex(t->data, t->nbytes, hex);
		fprintf(f, "%s %s ", t->name, st_dtype_name(t->dtype));
		for (int k = 0; k < t->ndim; k++)
			fprintf(f, "%s%lld", k ? "," : "", (long long)t->shape[k]);
		fprintf(f, "%s %s\n", t->ndim ? "" : "-", hex);
	}
	if (ferror(f) || (out && fclose(f)))
		r = err_set(e, -EIO, "%s: write failed", out ? out : "stdout");
	ckpt_close(&ck);
	return r;
}

/* ---- command line ------------------------------------------------------------------------- */

static int usage(void)
{
	fprintf(stderr,
		"usage: mkmodel tiny --out DIR [options]\n"
		"       mkmodel real --layers N --dense K --out DIR [--header-only] [options]\n"
		"       mkmodel --config FILE --out DIR [options]\n"
		"       mkmodel manifest --model DIR [--out FILE]\n"
		"options: --seed N (default 1)  --tokenizer FILE|fallback (default\n"
		"         build/tokenizer/tokenizer.json)  --patch-v31-tokens  --manifest FILE\n"
		"         --header-only (big tensors left as file holes)\n"
		"         --structured (routing and indexer signals with wide margins, structured.c)\n");
	return 2;
}

static int parse_i64(const char *s, int64_t *v)
{
	char *end;
	errno = 0;
	long long x = strtoll(s, &end, 10);
	if (errno || end == s || *end || x < 0)
		return -EINVAL;
	*v = x;
	return 0;
}

int main(int argc, char **argv)
{
	const char *preset = NULL, *config = NULL, *out = NULL, *manifest = NULL, *model = NULL;
	const char *tok = "build/tokenizer/tokenizer.json";
	int64_t seed = 1, layers = -1, dense = -1;
	int header_only = 0, patch = 0, structured = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int takes = 1;
		if (!strcmp(a, "tiny") || !strcmp(a, "real") || !strcmp(a, "manifest"))
			preset = a, takes = 0;
		else if (!strcmp(a, "--header-only"))
			header_only = 1, takes = 0;
		else if (!strcmp(a, "--patch-v31-tokens"))
			patch = 1, takes = 0;
		else if (!strcmp(a, "--structured"))
			structured = 1, takes = 0;
		else if (!v)
			return usage();
		else if (!strcmp(a, "--config"))
			config = v;
		else if (!strcmp(a, "--out"))
			out = v;
		else if (!strcmp(a, "--model"))
			model = v;
		else if (!strcmp(a, "--manifest"))
			manifest = v;
		else if (!strcmp(a, "--tokenizer"))
			tok = v;
		else if (!strcmp(a, "--seed") || !strcmp(a, "--layers") || !strcmp(a, "--dense")) {
			int64_t *dst = a[2] == 's' ? &seed : a[2] == 'l' ? &layers : &dense;
			if (parse_i64(v, dst)) {
				fprintf(stderr, "mkmodel: %s %s: expected a non-negative integer\n", a, v);
				return 2;
			}
		} else {
			fprintf(stderr, "mkmodel: unknown argument '%s'\n", a);
			return usage();
		}
		i += takes;
	}
	struct err e;
	if (preset && !strcmp(preset, "manifest")) {
		if (!model)
			return usage();
		if (write_manifest(model, out, &e)) {
			fprintf(stderr, "mkmodel: %s\n", e.msg);
			return 1;
		}
		return 0;
	}
	if (!out || (!preset == !config))
		return usage();
	struct dsv32_config c;
	int r;
	if (config)
		r = config_load(&c, config, &e);
	else if (!strcmp(preset, "tiny"))
		r = config_parse(&c, mkmodel_tiny_config, strlen(mkmodel_tiny_config),
				 "<tiny preset>", &e);
	else {
		if (layers < 1 || dense < 0 || dense > layers) {
			fprintf(stderr, "mkmodel: real needs --layers N (>= 1) and --dense K (<= N)\n");
			return 2;
		}
		r = config_parse(&c, mkmodel_real_config, strlen(mkmodel_real_config),
				 "<real preset>", &e);
		c.num_hidden_layers = layers;
		c.first_k_dense_replace = dense;
	}
	if (!r && structured && header_only)
		r = err_set(&e, -EINVAL, "--structured and --header-only exclude each other");
	if (!r && structured)
		r = structured_check(&c, &e);
	if (r) {
		fprintf(stderr, "mkmodel: %s\n", e.msg);
		return 1;
	}
	if (dir_make(out)) {
		fprintf(stderr, "mkmodel: %s: cannot create directory: %s\n", out, strerror(errno));
		return 1;
	}
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char path[4096];
	char *cj = config_to_json(&c);
	struct tlist l = {0};
	int n_shards = build_list(&l, &c, preset && !strcmp(preset, "real") ? 1 : 2);
	size_t chunk_bytes = 4u << 20;
	void *chunk = malloc(chunk_bytes);
	r = !cj || !chunk ? err_set(&e, -ENOMEM, "out of memory")
			  : file_write(path_join(path, sizeof path, out, "config.json"), cj,
				       strlen(cj), &e);
	if (!r)
		r = file_write(path_join(path, sizeof path, out, "generation_config.json"),
			       generation_config, sizeof generation_config - 1, &e);
	if (!r)
		r = tokfiles_write(out, strcmp(tok, "fallback") ? tok : NULL, patch, c.vocab_size, &e);
	for (int s = 0; s < n_shards && !r; s++)
		r = write_shard(out, &l, s, n_shards, (uint64_t)seed, header_only, chunk, chunk_bytes,
				structured ? &c : NULL, &e);
	if (!r)
		r = write_index(out, &l, n_shards, &e);
	if (!r && manifest)
		r = write_manifest(out, manifest, &e);
	free(chunk);
	free(cj);
	if (r) {
		free(l.t);
		fprintf(stderr, "mkmodel: %s\n", e.msg);
		return 1;
	}
	uint64_t total = 0;
	for (size_t i = 0; i < l.n; i++)
		total += tbytes(&l.t[i]);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("mkmodel: %s: %zu tensors in %d shards, %.1f MB%s, seed %lld, %.2f s\n", out, l.n,
	       n_shards, (double)total / 1e6, header_only ? " (header only: data left as holes)" : "",
	       (long long)seed, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	free(l.t);
	return 0;
}
