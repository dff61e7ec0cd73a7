/* test_weights.c — mkmodel checkpoints bound by weights_bind: every tensor, values regenerated
 * from the same seed (tools/mkmodel/gen.h), the manifest, determinism, the header-only real
 * dims, and each corruption giving a message with the tensor, expected vs actual and the file. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "model/fileio.h"
#include "model/numerics.h"
#include "model/safetensors.h"
#include "model/sha256.h"
#include "model/weights.h"
#include "tests/ckpt_helpers.h"
#include "tests/test.h"
#include "tools/mkmodel/gen.h"

struct bound {
	struct dsv32_config c;
	struct checkpoint ck;
	struct weights w;
};

static void bind_dir(struct bound *b, const char *dir)
{
	struct err e;
	REQUIRE(config_load(&b->c, dir, &e) == 0);
	if (ckpt_open(&b->ck, dir, &e))
		fprintf(stderr, "    %s\n", e.msg);
	REQUIRE(b->ck.n_tensors > 0);
	int r = weights_bind(&b->w, &b->c, &b->ck, &e);
	if (r)
		fprintf(stderr, "    %s\n", e.msg);
	REQUIRE(r == 0);
}

static void unbind(struct bound *b)
{
	weights_free(&b->w);
	ckpt_close(&b->ck);
}

/* 1 if p[0..n) are the bytes mkmodel generates for `stream` with this seed. */
static int same_as_gen(const void *p, size_t n, uint64_t seed, const char *stream,
		       enum gen_kind kind, int64_t fan_in)
{
	uint8_t *buf = malloc(n);
	REQUIRE(buf);
	struct gen g;
	gen_init(&g, seed, stream, kind, fan_in);
	gen_fill(&g, buf, n / gen_elem_size(kind));
	int same = !memcmp(buf, p, n);
	free(buf);
	return same;
}

static int fp8_is(const struct fp8_linear *l, uint64_t seed, const char *prefix, int64_t out,
		  int64_t in)
{
	char n[256];
	if (l->out != out || l->in != in)
		return 0;
	snprintf(n, sizeof n, "%s.weight", prefix);
	if (!same_as_gen(l->w, (size_t)(out * in), seed, n, GEN_FP8, in))
		return 0;
	snprintf(n, sizeof n, "%s.weight_scale_inv", prefix);
	return same_as_gen(l->scale, (size_t)((out + 127) / 128 * ((in + 127) / 128)) * 4, seed, n,
			   GEN_SCALE, in);
}

static int vec_is_bf16_gen(const float *v, int64_t n, uint64_t seed, const char *stream,
			   enum gen_kind kind)
{
	uint16_t *h = malloc((size_t)n * 2);
	REQUIRE(h);
	struct gen g;
	gen_init(&g, seed, stream, kind, 0);
	gen_fill(&g, h, (size_t)n);
	int ok = 1;
	for (int64_t i = 0; i < n && ok; i++)
		ok = v[i] == bf16_to_f32(h[i]);
	free(h);
	return ok;
}

TEST(weights, mini_binds_every_tensor_with_generated_values)
{
	const uint64_t seed = 7;
	const char *dir = make_mini("m", (int)seed, 1);
	struct bound b;
	bind_dir(&b, dir);
	const struct dsv32_config *c = &b.c;
	const struct weights *w = &b.w;
	struct weights_stats st;
	weights_get_stats(w, &st);
	CHECK_EQ_INT(st.n_tensors, (int64_t)b.ck.n_tensors); /* every tensor bound, none extra */
	CHECK_EQ_INT(b.ck.n_files, 5);
	CHECK(st.n_scales > 500);
	CHECK_EQ_INT(st.n_scales_not_pow2, 0);
	const int64_t H = c->hidden_size, V = c->vocab_size, MI = c->moe_intermediate_size;

	/* the pointers are the named tensors, and the values are what gen.h makes for them */
	CHECK(w->embed.w == ckpt_find(&b.ck, "model.embed_tokens.weight")->data);
	CHECK(same_as_gen(w->embed.w, (size_t)(V * H) * 2, seed, "model.embed_tokens.weight", GEN_BF16, 1));
	CHECK(same_as_gen(w->lm_head.w, (size_t)(V * H) * 2, seed, "lm_head.weight", GEN_BF16, H));
	CHECK(vec_is_bf16_gen(w->norm, H, seed, "model.norm.weight", GEN_NORM));
	CHECK(w->n_layers == 4 && !w->layers[1].is_moe && w->layers[2].is_moe);
	CHECK(fp8_is(&w->layers[0].wq_a, seed, "model.layers.0.self_attn.q_a_proj", c->q_lora_rank, H));
	CHECK(fp8_is(&w->layers[1].wkv_b, seed, "model.layers.1.self_attn.kv_b_proj",
		     c->num_attention_heads * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank));
	CHECK(fp8_is(&w->layers[1].wkv_a, seed, "model.layers.1.self_attn.kv_a_proj_with_mqa",
		     c->kv_lora_rank + c->qk_rope_head_dim, H));
	CHECK(fp8_is(&w->layers[2].idx_wq_b, seed, "model.layers.2.self_attn.indexer.wq_b",
		     c->index_n_heads * c->index_head_dim, c->q_lora_rank));
	CHECK(fp8_is(&w->layers[1].w2, seed, "model.layers.1.mlp.down_proj", H, c->intermediate_size));
	CHECK(fp8_is(&w->layers[3].exp_w2[7], seed, "model.layers.3.mlp.experts.7.down_proj", H, MI));
	CHECK(fp8_is(&w->layers[3].exp_w3[15], seed, "model.layers.3.mlp.experts.15.up_proj", MI, H));
	CHECK(fp8_is(&w->layers[2].sh_w1, seed, "model.layers.2.mlp.shared_experts.gate_proj", MI, H));
	CHECK(!fp8_is(&w->layers[3].exp_w2[6], seed, "model.layers.3.mlp.experts.7.down_proj", H, MI));
	CHECK(vec_is_bf16_gen(w->layers[1].attn_norm, H, seed, "model.layers.1.input_layernorm.weight",
			      GEN_NORM));
	CHECK(vec_is_bf16_gen(w->layers[3].idx_k_norm_b, 128, seed,
			      "model.layers.3.self_attn.indexer.k_norm.bias", GEN_BIAS_BF16));
	CHECK(same_as_gen(w->layers[3].gate_bias, (size_t)c->n_routed_experts * 4, seed,
			  "model.layers.3.mlp.gate.e_score_correction_bias", GEN_BIAS_F32, 0));
	CHECK(same_as_gen(w->layers[2].gate.w, (size_t)(c->n_routed_experts * H) * 2, seed,
			  "model.layers.2.mlp.gate.weight", GEN_BF16, H));
	CHECK(same_as_gen(w->layers[0].idx_weights_proj.w, (size_t)(c->index_n_heads * H) * 2, seed,
			  "model.layers.0.self_attn.indexer.weights_proj.weight", GEN_BF16, H));
	/* MTP: layer 4, its embed/head are copies of the main ones (as published) */
	REQUIRE(w->has_mtp);
	CHECK(!memcmp(w->mtp.embed.w, w->embed.w, (size_t)(V * H) * 2));
	CHECK(!memcmp(w->mtp.head.w, w->lm_head.w, (size_t)(V * H) * 2));
	CHECK(w->mtp.embed.w != w->embed.w);
	CHECK(same_as_gen(w->mtp.eh_proj.w, (size_t)(H * 2 * H) * 2, seed,
			  "model.layers.4.eh_proj.weight", GEN_BF16, 2 * H));
	CHECK(vec_is_bf16_gen(w->mtp.enorm, H, seed, "model.layers.4.enorm.weight", GEN_NORM));
	CHECK(vec_is_bf16_gen(w->mtp.head_norm, H, seed, "model.layers.4.shared_head.norm.weight", GEN_NORM));
	CHECK(w->mtp.layer.is_moe);
	CHECK(fp8_is(&w->mtp.layer.exp_w1[0], seed, "model.layers.4.mlp.experts.0.gate_proj", MI, H));
	CHECK(fp8_is(&w->mtp.layer.wo, seed, "model.layers.4.self_attn.o_proj", H,
		     c->num_attention_heads * c->v_head_dim));

	/* magnitudes: norms near 1, scales powers of two, no FP8 NaN codes */
	for (int64_t i = 0; i < H; i++)
		CHECK(fabsf(w->layers[0].ffn_norm[i] - 1.0f) <= 15.0f / 128);
	for (size_t i = 0; i < b.ck.n_tensors; i++) {
		const struct st_tensor *t = &b.ck.tensors[i];
		if (t->dtype != ST_F8_E4M3)
			continue;
		for (size_t k = 0; k < t->nbytes; k++)
			if ((((const uint8_t *)t->data)[k] & 0x7f) == 0x7f) {
				test_fail(__FILE__, __LINE__, "%s: NaN code", t->name);
				break;
			}
	}

	/* the manifest mkmodel wrote: every tensor, dtype, shape and sha256 */
	char mp[600];
	snprintf(mp, sizeof mp, "%s.manifest", dir);
	char *m = file_read(mp, NULL, 1 << 24, NULL);
	REQUIRE(m);
	size_t lines = 0;
	for (char *save, *line = strtok_r(m, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[256], dt[16], shape[64], sha[65], hex[65], want[64];
		REQUIRE(sscanf(line, "%255s %15s %63s %64s", name, dt, shape, sha) == 4);
		const struct st_tensor *t = ckpt_find(&b.ck, name);
		REQUIRE(t);
		CHECK_EQ_STR(dt, st_dtype_name(t->dtype));
		if (t->ndim == 2)
			snprintf(want, sizeof want, "%lld,%lld", (long long)t->shape[0], (long long)t->shape[1]);
		else
			snprintf(want, sizeof want, "%lld", (long long)t->shape[0]);
		CHECK_EQ_STR(shape, want);
		sha256_hex(t->data, t->nbytes, hex);
		CHECK_EQ_STR(sha, hex);
		lines++;
	}
	CHECK_EQ_INT(lines, b.ck.n_tensors);
	/* `mkmodel manifest` on the finished directory prints the same */
	char args[2048], mp2[700];
	snprintf(mp2, sizeof mp2, "%s.again", mp);
	snprintf(args, sizeof args, "manifest --model %s --out %s", dir, mp2);
	REQUIRE(run_mkmodel(args, NULL) == 0);
	char *m1 = file_read(mp, NULL, 1 << 24, NULL), *m2 = file_read(mp2, NULL, 1 << 24, NULL);
	REQUIRE(m1 && m2);
	CHECK_EQ_STR(m1, m2);
	free(m1);
	free(m2);
	free(m);
	unbind(&b);
}

TEST(weights, same_seed_same_bytes)
{
	make_mini("a", 3, 1);
	make_mini("b", 3, 1);
	make_mini("c", 4, 1);
	char p[600];
	char *ma = file_read((snprintf(p, sizeof p, "%s/a.manifest", test_tmpdir()), p), NULL, 1 << 24, NULL);
	char *mb = file_read((snprintf(p, sizeof p, "%s/b.manifest", test_tmpdir()), p), NULL, 1 << 24, NULL);
	char *mc = file_read((snprintf(p, sizeof p, "%s/c.manifest", test_tmpdir()), p), NULL, 1 << 24, NULL);
	REQUIRE(ma && mb && mc);
	CHECK_EQ_STR(ma, mb);
	CHECK(strcmp(ma, mc) != 0);
	/* whole files too: shard 2 and the index */
	const char *files[] = {"model-00002-of-00005.safetensors", "model.safetensors.index.json",
			       "config.json", "tokenizer.json"};
	for (size_t i = 0; i < 4; i++) {
		size_t la, lb;
		char *fa = file_read((snprintf(p, sizeof p, "%s/a/%s", test_tmpdir(), files[i]), p), &la,
				     1 << 26, NULL);
		char *fb = file_read((snprintf(p, sizeof p, "%s/b/%s", test_tmpdir(), files[i]), p), &lb,
				     1 << 26, NULL);
		REQUIRE(fa && fb);
		CHECK(la == lb && !memcmp(fa, fb, la));
		free(fa);
		free(fb);
	}
	/* the index carries total_size = the sum of the tensor bytes */
	char *ix = file_read((snprintf(p, sizeof p, "%s/a/model.safetensors.index.json", test_tmpdir()), p),
			     NULL, 1 << 24, NULL);
	REQUIRE(ix);
	CHECK_CONTAINS(ix, "\"total_size\": ");
	free(ix);
	free(ma);
	free(mb);
	free(mc);
}

/* Apparent and on-disk bytes of the files in dir. */
static void du(const char *dir, int64_t *apparent, int64_t *disk)
{
	*apparent = *disk = 0;
	DIR *d = opendir(dir);
	REQUIRE(d);
	for (struct dirent *de; (de = readdir(d));) {
		char p[1024];
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
		if (de->d_name[0] == '.' || stat(p, &st))
			continue;
		*apparent += st.st_size;
		*disk += (int64_t)st.st_blocks * 512;
	}
	closedir(d);
}

TEST(weights, real_dims_header_only)
{
	char dir[512], args[1024];
	snprintf(dir, sizeof dir, "%s/real", test_tmpdir());
	snprintf(args, sizeof args, "real --layers 2 --dense 1 --header-only --tokenizer fallback --out %s",
		 dir);
	char *log = NULL;
	int st = run_mkmodel(args, &log);
	if (st)
		fprintf(stderr, "%s\n", log ? log : "");
	free(log);
	REQUIRE(st == 0);
	int64_t apparent, disk;
	du(dir, &apparent, &disk);
	CHECK(apparent > (int64_t)25 << 30);  /* 2 layers + MTP + embeddings of the 671B dims */
	CHECK(disk < (int64_t)64 << 20);      /* but only headers, scales and norms on disk */
	fprintf(stderr, "    real --layers 2 --dense 1 --header-only: %.1f GB apparent, %.1f MB on disk\n",
		(double)apparent / 1e9, (double)disk / 1e6);
	struct bound b;
	bind_dir(&b, dir);
	const struct weights *w = &b.w;
	struct weights_stats s;
	weights_get_stats(w, &s);
	CHECK_EQ_INT(s.n_tensors, (int64_t)b.ck.n_tensors);
	CHECK_EQ_INT(s.n_scales_not_pow2, 0);
	CHECK(w->n_layers == 2 && !w->layers[0].is_moe && w->layers[1].is_moe && w->has_mtp);
	CHECK(w->layers[0].w1.out == 18432 && w->layers[0].w1.in == 7168);
	CHECK(w->layers[1].wq_b.out == 24576 && w->layers[1].wq_b.in == 1536);
	CHECK(w->layers[1].wkv_a.out == 576);
	CHECK(w->layers[1].wkv_b.out == 32768 && w->layers[1].wkv_b.in == 512);
	CHECK(w->layers[1].wo.in == 16384);
	CHECK(w->layers[1].idx_wq_b.out == 8192 && w->layers[1].idx_wk.out == 128);
	CHECK(w->layers[1].exp_w2[255].out == 7168 && w->layers[1].exp_w2[255].in == 2048);
	CHECK(w->mtp.layer.sh_w2.in == 2048 && w->mtp.eh_proj.cols == 14336);
	CHECK(w->embed.rows == 129280 && w->lm_head.cols == 7168);
	/* scales were written (kv_a's 5 x 56, the partial last row block included) */
	const float *sc = w->layers[1].wkv_a.scale;
	CHECK(sc[0] > 0 && sc[4 * 56 + 55] > 0);
	unbind(&b);
}

/* ---- corruptions -------------------------------------------------------------------------- */

/* Rewrites the mini checkpoint into TMP/bad/model.safetensors with `a` applied; binds it and
 * returns weights_bind's result with the message in e. */
static int bind_altered(const struct alter *a, struct err *e, struct weights_stats *stats)
{
	const char *src = make_mini("m", 5, 0);
	struct bound b;
	struct err e2;
	REQUIRE(config_load(&b.c, src, &e2) == 0);
	REQUIRE(ckpt_open(&b.ck, src, &e2) == 0);
	char dir[512], out[600];
	snprintf(dir, sizeof dir, "%s/bad", test_tmpdir());
	mkdir(dir, 0755);
	snprintf(out, sizeof out, "%s/model.safetensors", dir);
	rewrite_ckpt(&b.ck, out, a);
	ckpt_close(&b.ck);
	REQUIRE(ckpt_open(&b.ck, dir, &e2) == 0);
	int r = weights_bind(&b.w, &b.c, &b.ck, e);
	if (!r && stats)
		weights_get_stats(&b.w, stats);
	if (!r)
		weights_free(&b.w);
	ckpt_close(&b.ck);
	return r;
}

TEST(weights, wrong_shape)
{
	struct alter a = {.name = "model.layers.0.self_attn.q_a_proj.weight", .dtype = -1, .ndim = 2,
			  .shape = {128, 512}};
	struct err e;
	CHECK(bind_altered(&a, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "tensor model.layers.0.self_attn.q_a_proj.weight: expected F8_E4M3 "
			      "[256, 256], got F8_E4M3 [128, 512] in ");
	CHECK_CONTAINS(e.msg, "bad/model.safetensors");
	struct alter s = {.name = "model.layers.3.mlp.experts.2.down_proj.weight_scale_inv", .dtype = -1,
			  .ndim = 1, .shape = {2}};
	CHECK(bind_altered(&s, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "weight_scale_inv: expected F32 [2, 1], got F32 [2] in ");
}

TEST(weights, wrong_dtype)
{
	struct alter a = {.name = "model.layers.1.self_attn.indexer.weights_proj.weight",
			  .dtype = ST_F16};
	struct err e;
	CHECK(bind_altered(&a, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "tensor model.layers.1.self_attn.indexer.weights_proj.weight: expected "
			      "BF16 [4, 256], got F16 [4, 256] in ");
	/* the gate bias must be F32 (same bytes relabelled BF16 [32]) */
	struct alter g = {.name = "model.layers.2.mlp.gate.e_score_correction_bias", .dtype = ST_BF16,
			  .ndim = 1, .shape = {32}};
	CHECK(bind_altered(&g, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "e_score_correction_bias: expected F32 [16], got BF16 [32]");
	/* an FP8 weight relabelled U8 */
	struct alter u = {.name = "model.layers.4.self_attn.o_proj.weight", .dtype = ST_U8};
	CHECK(bind_altered(&u, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "expected F8_E4M3 [256, 256], got U8 [256, 256]");
}

TEST(weights, missing_tensor)
{
	struct alter a = {.name = "model.layers.3.mlp.experts.5.up_proj.weight_scale_inv", .drop = 1,
			  .dtype = -1};
	struct err e;
	CHECK(bind_altered(&a, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "tensor model.layers.3.mlp.experts.5.up_proj.weight_scale_inv: missing");
	CHECK_CONTAINS(e.msg, "expected F32 [1, 2]");
	struct alter m = {.name = "model.layers.4.hnorm.weight", .drop = 1, .dtype = -1};
	CHECK(bind_altered(&m, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "tensor model.layers.4.hnorm.weight: missing");
}

static void zero_first_f32(void *p, size_t n) { memset(p, 0, 4); }
static void nan_last_f32(void *p, size_t n)
{
	float v = NAN;
	memcpy((char *)p + n - 4, &v, 4);
}
static void three_f32(void *p, size_t n)
{
	float v = 3.0f;
	memcpy(p, &v, 4);
}

TEST(weights, scale_values)
{
	struct err e;
	struct alter z = {.name = "model.layers.0.mlp.gate_proj.weight_scale_inv", .dtype = -1,
			  .edit = zero_first_f32};
	CHECK(bind_altered(&z, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "model.layers.0.mlp.gate_proj.weight_scale_inv: value 0 at [0, 0] is not "
			      "a finite positive scale");
	struct alter n = {.name = "model.layers.2.self_attn.kv_b_proj.weight_scale_inv", .dtype = -1,
			  .edit = nan_last_f32};
	CHECK(bind_altered(&n, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "kv_b_proj.weight_scale_inv: value nan at [3, 1]");
	/* a non-power of two is accepted and counted */
	struct alter t = {.name = "model.layers.1.self_attn.o_proj.weight_scale_inv", .dtype = -1,
			  .edit = three_f32};
	struct weights_stats s;
	CHECK(bind_altered(&t, &e, &s) == 0);
	CHECK_EQ_INT(s.n_scales_not_pow2, 1);
}

TEST(weights, f32_norms_accepted)
{
	float v[256];
	for (int i = 0; i < 256; i++)
		v[i] = 0.5f + (float)i / 1024.0f; /* not bf16-representable: must arrive exactly */
	struct alter a = {.name = "model.layers.2.post_attention_layernorm.weight", .dtype = ST_F32,
			  .data = v, .nbytes = sizeof v};
	struct err e;
	/* bind it directly to read the value back */
	const char *src = make_mini("m", 5, 0);
	struct bound b;
	REQUIRE(config_load(&b.c, src, &e) == 0);
	REQUIRE(ckpt_open(&b.ck, src, &e) == 0);
	char dir[512], out[600];
	snprintf(dir, sizeof dir, "%s/f32", test_tmpdir());
	mkdir(dir, 0755);
	snprintf(out, sizeof out, "%s/model.safetensors", dir);
	rewrite_ckpt(&b.ck, out, &a);
	ckpt_close(&b.ck);
	size_t len;
	char *cfg = file_read(path_join(out, sizeof out, src, "config.json"), &len, 1 << 20, NULL);
	REQUIRE(cfg);
	REQUIRE(file_write(path_join(out, sizeof out, dir, "config.json"), cfg, len, NULL) == 0);
	free(cfg);
	bind_dir(&b, dir);
	CHECK(!memcmp(b.w.layers[2].ffn_norm, v, sizeof v));
	unbind(&b);
	/* the indexer k_norm bias as F32 too */
	struct alter k = {.name = "model.layers.0.self_attn.indexer.k_norm.bias", .dtype = ST_F32,
			  .data = v, .nbytes = 128 * 4};
	CHECK(bind_altered(&k, &e, NULL) == 0);
	/* but an F16 norm is not */
	struct alter h = {.name = "model.norm.weight", .dtype = ST_F16};
	CHECK(bind_altered(&h, &e, NULL) == -EINVAL);
	CHECK_CONTAINS(e.msg, "tensor model.norm.weight: expected F32 or BF16 [256], got F16 [256]");
}

TEST(weights, truncated_and_missing_shard)
{
	const char *dir = make_mini("m", 5, 0);
	char p[600];
	struct checkpoint ck;
	struct err e;
	snprintf(p, sizeof p, "%s/model-00003-of-00005.safetensors", dir);
	struct stat st;
	REQUIRE(stat(p, &st) == 0);
	REQUIRE(truncate(p, st.st_size - 1000) == 0);
	CHECK(ckpt_open(&ck, dir, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "model-00003-of-00005.safetensors: tensor ");
	CHECK_CONTAINS(e.msg, "truncated");
	REQUIRE(unlink(p) == 0);
	CHECK(ckpt_open(&ck, dir, &e) == -ENOENT);
	CHECK_CONTAINS(e.msg, "model-00003-of-00005.safetensors: cannot open (a shard named in "
			      "model.safetensors.index.json)");
}

TEST_T(weights, tiny_preset_full, 120)
{
	char dir[512], args[1024];
	snprintf(dir, sizeof dir, "%s/tiny", test_tmpdir());
	snprintf(args, sizeof args, "tiny --seed 1 --tokenizer fallback --out %s", dir);
	REQUIRE(run_mkmodel(args, NULL) == 0);
	struct bound b;
	bind_dir(&b, dir);
	struct weights_stats s;
	weights_get_stats(&b.w, &s);
	CHECK_EQ_INT(s.n_tensors, (int64_t)b.ck.n_tensors);
	CHECK_EQ_INT(b.ck.n_tensors, 438);
	const int64_t H = 256, V = 129280;
	/* the last rows of the 129280-row embedding and head (what the real tokenizer reaches) */
	CHECK(same_as_gen(b.w.embed.w, (size_t)(V * H) * 2, 1, "model.embed_tokens.weight", GEN_BF16, 1));
	CHECK(same_as_gen(b.w.lm_head.w, (size_t)(V * H) * 2, 1, "lm_head.weight", GEN_BF16, H));
	CHECK(fp8_is(&b.w.layers[3].exp_w1[9], 1, "model.layers.3.mlp.experts.9.gate_proj", 128, H));
	CHECK(fp8_is(&b.w.mtp.layer.idx_wk, 1, "model.layers.4.self_attn.indexer.wk", 128, H));
	unbind(&b);
}

/* The generator's bytes are part of the checkpoint format's promise ("the same seed gives
 * byte-identical files on every machine"): these digests were recorded from mkmodel's seed 1
 * (glibc -O2, musl static and clang ASan builds agree). A change here changes every test
 * checkpoint; update them only on purpose. */
TEST(weights, generator_golden_digests)
{
	static const struct {
		const char *name;
		enum gen_kind kind;
		int64_t fan_in, n;
		const char *sha;
	} g[] = {
		{"model.embed_tokens.weight", GEN_BF16, 1, 1024 * 256,
		 "71c5899008faff81ec05ac497f686a95f9e871d9137fcb38878906c740f5c882"},
		{"model.layers.0.input_layernorm.weight", GEN_NORM, 0, 256,
		 "6ff357ca49bf4817a68569c6e88b2a05f986df4f83725795a731ff1dd71434c8"},
		{"model.layers.2.mlp.gate.e_score_correction_bias", GEN_BIAS_F32, 0, 16,
		 "2f75d49b1c511f195fb7eeb317a004545c108af6491d6b1cbec7a10efdbe0497"},
		{"model.layers.3.mlp.experts.7.down_proj.weight", GEN_FP8, 128, 256 * 128,
		 "51b60f694735e39dde516f7ba875593dfbb3ff5cb972bf2adb4671db494969c5"},
		{"model.layers.3.mlp.experts.7.down_proj.weight_scale_inv", GEN_SCALE, 128, 2,
		 "6d459e617934150d4c61d52741281baaed0e0f00cd7585ffbbd755ad2cb174fd"},
	};
	for (size_t i = 0; i < sizeof g / sizeof *g; i++) {
		size_t bytes = (size_t)g[i].n * gen_elem_size(g[i].kind);
		uint8_t *buf = malloc(bytes);
		REQUIRE(buf);
		struct gen s;
		gen_init(&s, 1, g[i].name, g[i].kind, g[i].fan_in);
		gen_fill(&s, buf, (size_t)g[i].n);
		char hex[65];
		sha256_hex(buf, bytes, hex);
		CHECK_EQ_STR(hex, g[i].sha);
		free(buf);
	}
	/* and the scales are the powers of two the header comment promises: fan-in 128 gives
	 * e = floor(log2(78 * 128) / 2) = 6, so 2^-6 or 2^-7 */
	struct gen s;
	float v[64];
	gen_init(&s, 1, "x", GEN_SCALE, 128);
	gen_fill(&s, v, 64);
	for (int i = 0; i < 64; i++)
		CHECK(v[i] == 1.0f / 64 || v[i] == 1.0f / 128);
}
