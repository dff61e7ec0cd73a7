/*
 * test_forward.c — the CPU forward pass end to end (issue 3): batch invariance bit for bit
 * (full prefill = every chunk size = token by token = mixed batches = a prefix copied into
 * other pages), thread-count invariance, the cache bytes the forward writes, step validation,
 * no NaN/Inf through 100 greedy decode steps of the tiny model, and `dsv32 eval`.
 *
 * Models come from mkmodel in test_bin_dir() ($DSV32_BIN, else the runner's directory): "mini"
 * is the tiny preset's shape with a 1024-token vocabulary and index_topk 8, so a 20-token context is already sparse.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "model/backend.h"
#include "model/cpu_mutation.h"
#include "model/fileio.h"
#include "model/kv_cache.h"
#include "model/npy.h"
#include "model/numerics.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/ckpt_helpers.h"
#include "tests/test.h"

/* ---- models ---------------------------------------------------------------------------- */

static const char *mini_json =
	"{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"model_type\": \"deepseek_v32\",\n"
	" \"vocab_size\": %d, \"hidden_size\": 256, \"intermediate_size\": 512,\n"
	" \"moe_intermediate_size\": 128, \"num_hidden_layers\": %d, \"first_k_dense_replace\": %d,\n"
	" \"moe_layer_freq\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 4,\n"
	" \"q_lora_rank\": 256, \"kv_lora_rank\": 256, \"qk_nope_head_dim\": 64,\n"
	" \"qk_rope_head_dim\": 64, \"v_head_dim\": 64, \"n_routed_experts\": 16,\n"
	" \"n_shared_experts\": 1, \"num_experts_per_tok\": 4, \"n_group\": 4, \"topk_group\": 2,\n"
	" \"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\",\n"
	" \"norm_topk_prob\": true, \"hidden_act\": \"silu\", \"rope_theta\": 10000,\n"
	" \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"original_max_position_embeddings\": 4096,\n"
	"   \"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 1.0, \"mscale_all_dim\": 1.0},\n"
	" \"max_position_embeddings\": 163840, \"rms_norm_eps\": 1e-06, \"index_n_heads\": 4,\n"
	" \"index_head_dim\": 128, \"index_topk\": %d, \"num_nextn_predict_layers\": 1,\n"
	" \"bos_token_id\": 0, \"eos_token_id\": 1, \"tie_word_embeddings\": false,\n"
	" \"attention_bias\": false, \"torch_dtype\": \"bfloat16\",\n"
	" \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\",\n"
	"   \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128], \"scale_fmt\": \"ue8m0\"}}\n";

/* Generates TMP/NAME with mkmodel ("tiny" preset, "mini", or "shallow" = mini with one MoE
 * layer) and binds it. */
static void model_load(struct test_model *m, const char *name)
{
	char cmd[4096], cfg[512];
	snprintf(m->dir, sizeof m->dir, "%s/%s", test_tmpdir(), name);
	if (!strcmp(name, "tiny")) {
		snprintf(cmd, sizeof cmd, "%s/mkmodel tiny --seed 1 --tokenizer fallback --out %s >%s.log 2>&1",
			 test_bin_dir(), m->dir, m->dir);
	} else {
		char text[4096];
		int shallow = !strcmp(name, "shallow"); /* one MoE layer */
		int n = snprintf(text, sizeof text, mini_json, 1024, shallow ? 1 : 4, shallow ? 0 : 2, 8);
		snprintf(cfg, sizeof cfg, "%s/%s.json", test_tmpdir(), name);
		REQUIRE(file_write(cfg, text, (size_t)n, NULL) == 0);
		snprintf(cmd, sizeof cmd, "%s/mkmodel --config %s --seed 1 --tokenizer fallback --out %s >%s.log 2>&1",
			 test_bin_dir(), cfg, m->dir, m->dir);
	}
	test_model_make(m, cmd);
}

static struct backend *make_backend(struct test_model *m, int64_t n_pages, int threads)
{
	struct backend *b;
	struct err e;
	REQUIRE(backend_cpu_create(&m->c, &m->w, n_pages, threads, &b, &e) == 0);
	return b;
}

static void rand_tokens(int32_t *tok, int64_t T, int64_t vocab, uint64_t seed)
{
	for (int64_t t = 0; t < T; t++)
		tok[t] = (int32_t)(test_rand(&seed) % (uint64_t)vocab);
}

/* Runs positions [p0, p0 + n) of one sequence as one step; logits of every row -> out [n, V]. */
static void run_rows(struct backend *b, const int32_t *tok, int64_t p0, int64_t n, const int32_t *bt,
		     int64_t n_blocks, float *out)
{
	int64_t pos[512];
	uint8_t fl[512];
	REQUIRE(n <= 512);
	for (int64_t i = 0; i < n; i++)
		pos[i] = p0 + i, fl[i] = BACKEND_ROW_LOGITS;
	struct backend_seq s = {n, tok + p0, pos, bt, n_blocks, fl, out, NULL, NULL, 0};
	struct backend_step st = {0, 1, &s, NULL};
	REQUIRE(backend_step(b, &st) == 0);
}

/* The whole sequence in chunks of `chunk`: out [T, V]. */
static void run_chunked(struct backend *b, const int32_t *tok, int64_t T, int64_t chunk,
			const int32_t *bt, int64_t n_blocks, float *out, int64_t V)
{
	for (int64_t p = 0; p < T; p += chunk)
		run_rows(b, tok, p, T - p < chunk ? T - p : chunk, bt, n_blocks, out + p * V);
}

static int64_t first_diff(const float *a, const float *b, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		if (f32_bits(a[i]) != f32_bits(b[i]))
			return i;
	return -1;
}

/* ---- batch invariance -------------------------------------------------------------------- */

TEST_T(forward, every_chunk_size_is_bit_identical, 300)
{
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size, T = 20;
	int32_t tok[80], bt[2] = {0, 1};
	rand_tokens(tok, 80, V, 3);
	struct backend *b = make_backend(&m, 2, 2);
	float *ref = malloc((size_t)(80 * V) * sizeof *ref), *got = malloc((size_t)(80 * V) * sizeof *got);
	run_chunked(b, tok, T, T, bt, 2, ref, V);
	for (int64_t i = 0; i < T * V; i++)
		REQUIRE(isfinite(ref[i]));
	for (int64_t chunk = 1; chunk < T; chunk++) { /* 1 = token by token */
		run_chunked(b, tok, T, chunk, bt, 2, got, V);
		int64_t d = first_diff(ref, got, T * V);
		if (d >= 0)
			test_fail(__FILE__, __LINE__, "chunk %lld: logits differ at row %lld",
				  (long long)chunk, (long long)(d / V));
	}
	/* a longer sequence across a page boundary (and sparse: index_topk 8), sampled sizes */
	T = 80;
	run_chunked(b, tok, T, T, bt, 2, ref, V);
	int64_t sizes[] = {1, 3, 7, 8, 9, 31, 63, 64, 65, 79};
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		run_chunked(b, tok, T, sizes[k], bt, 2, got, V);
		int64_t d = first_diff(ref, got, T * V);
		if (d >= 0)
			test_fail(__FILE__, __LINE__, "T=80 chunk %lld: logits differ at row %lld",
				  (long long)sizes[k], (long long)(d / V));
	}
	backend_destroy(b);
	free(ref);
	free(got);
	test_model_free(&m);
}

TEST_T(forward, mixed_batches_and_threads_are_bit_identical, 300)
{
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size;
	enum { NS = 3 };
	int64_t len[NS] = {70, 23, 41};
	int32_t tok[NS][70];
	/* pages interleaved across sequences, as a scheduler would hand them out */
	int32_t bt[NS][2] = {{4, 0}, {2, 5}, {1, 3}};
	float *ref[NS], *got[NS];
	struct backend *solo = make_backend(&m, 6, 1);
	for (int s = 0; s < NS; s++) {
		rand_tokens(tok[s], len[s], V, 100 + (uint64_t)s);
		ref[s] = malloc((size_t)(len[s] * V) * sizeof *ref[s]);
		got[s] = malloc((size_t)(len[s] * V) * sizeof *got[s]);
		int32_t own[2] = {0, 1};
		run_chunked(solo, tok[s], len[s], len[s], own, 2, ref[s], V);
	}
	backend_destroy(solo);
	/* three rounds with random chunk sizes per sequence per step, 2 threads */
	struct backend *b = make_backend(&m, 6, 2);
	uint64_t rng = 42;
	for (int round = 0; round < 3; round++) {
		int64_t done[NS] = {0};
		for (;;) {
			struct backend_seq seqs[NS];
			int64_t pos[NS][70];
			uint8_t fl[NS][70];
			int64_t ns = 0;
			for (int s = 0; s < NS; s++) {
				if (done[s] == len[s] || test_rand(&rng) % 4 == 0)
					continue;
				int64_t n = 1 + (int64_t)(test_rand(&rng) % (round == 0 ? 1 : 17));
				if (n > len[s] - done[s])
					n = len[s] - done[s];
				for (int64_t i = 0; i < n; i++)
					pos[s][i] = done[s] + i, fl[s][i] = BACKEND_ROW_LOGITS;
				seqs[ns++] = (struct backend_seq){n, tok[s] + done[s], pos[s], bt[s], 2,
								  fl[s], got[s] + done[s] * V, NULL, NULL, 0};
				done[s] += n;
			}
			if (ns == 0) {
				int all = 1;
				for (int s = 0; s < NS; s++)
					all &= done[s] == len[s];
				if (all)
					break;
				continue;
			}
			struct backend_step st = {0, ns, seqs, NULL};
			REQUIRE(backend_step(b, &st) == 0);
		}
		for (int s = 0; s < NS; s++) {
			int64_t d = first_diff(ref[s], got[s], len[s] * V);
			if (d >= 0)
				test_fail(__FILE__, __LINE__, "round %d seq %d: row %lld differs from solo",
					  round, s, (long long)(d / V));
		}
	}
	backend_destroy(b);
	for (int s = 0; s < NS; s++) {
		free(ref[s]);
		free(got[s]);
	}
	test_model_free(&m);
}

TEST_T(forward, prefix_pages_copied_elsewhere_give_same_logits, 120)
{
	/* a prefix-cache hit: the first full page of a sequence is copied (every layer, both
	 * pools) to another page id, and a second sequence continues from it */
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size, T = 75;
	int32_t tok[75], bt_a[2] = {0, 1}, bt_b[2] = {3, 2};
	rand_tokens(tok, T, V, 9);
	struct backend *b = make_backend(&m, 4, 2);
	float *ref = malloc((size_t)(T * V) * sizeof *ref), *got = malloc((size_t)(T * V) * sizeof *got);
	run_chunked(b, tok, T, T, bt_a, 2, ref, V);
	uint8_t *buf = malloc(b->mla_page_bytes > b->idx_page_bytes ? b->mla_page_bytes : b->idx_page_bytes);
	for (int64_t l = 0; l < b->n_layers; l++)
		for (int pool = 0; pool < 2; pool++) {
			REQUIRE(backend_page_io(b, l, (enum backend_pool)pool, 0, buf, 0) == 0);
			REQUIRE(backend_page_io(b, l, (enum backend_pool)pool, 3, buf, 1) == 0);
		}
	run_chunked(b, tok + 0, T, 64, bt_b, 2, got, V); /* recompute writes the same bytes */
	run_rows(b, tok, 64, T - 64, bt_b, 2, got + 64 * V);
	CHECK(first_diff(ref + 64 * V, got + 64 * V, (T - 64) * V) < 0);
	CHECK(backend_page_io(b, b->n_layers, BACKEND_POOL_MLA, 0, buf, 0) == -EINVAL);
	CHECK(backend_page_io(b, 0, BACKEND_POOL_INDEX, 4, buf, 0) == -EINVAL);
	free(buf);
	free(ref);
	free(got);
	backend_destroy(b);
	test_model_free(&m);
}

TEST_T(forward, naive_attention_agrees_on_a_shallow_model, 120)
{
	/* one layer: the end-to-end noise floor is near zero, so the two attention forms (which
	 * round to bf16 in different places) must agree closely on the logits */
	struct test_model m;
	model_load(&m, "shallow");
	int64_t V = m.c.vocab_size, T = 40;
	int32_t tok[40], bt[1] = {0};
	rand_tokens(tok, T, V, 21);
	float *a = malloc((size_t)(T * V) * sizeof *a), *n = malloc((size_t)(T * V) * sizeof *n);
	struct backend *b = make_backend(&m, 1, 2);
	run_chunked(b, tok, T, T, bt, 1, a, V);
	backend_cpu_set_naive_attention(b, 1);
	run_chunked(b, tok, T, 7, bt, 1, n, V);
	double rel[40], worst = 0;
	int below = 0; /* rows within 3e-2 */
	for (int64_t t = 0; t < T; t++) {
		double err = 0, ref = 0;
		for (int64_t v = 0; v < V; v++) {
			double d = (double)a[t * V + v] - n[t * V + v];
			err += d * d, ref += (double)a[t * V + v] * a[t * V + v];
		}
		rel[t] = sqrt(err / ref);
		worst = fmax(worst, rel[t]);
		below += rel[t] < 3e-2;
	}
	/* measured: every row within 3.3e-2 (the two forms' bf16 roundings, amplified by the
	 * FP8 re-quantisation of o_proj's input); a structural bug moves logits by O(1) */
	fprintf(stderr, "    shallow: naive vs absorbed: %d of %lld rows within 3e-2 relative L2, worst %.2e\n",
		below, (long long)T, worst);
	CHECK(below >= T * 9 / 10);
	CHECK(worst < 0.1); /* an FP8 rounding or a near-tied routing flip, not a different model */
	CHECK(worst > 0);   /* the switch does change the path */
	free(a);
	free(n);
	backend_destroy(b);
	test_model_free(&m);
}

/* ---- cache bytes, MTP, validation -------------------------------------------------------- */

struct capture {
	int64_t layer, pos;
	float kv_cmpr[512], k_pe[64], idx_k[128];
	int32_t topk[64];
	int64_t n_topk;
};

static void capture_cb(void *ctx, const char *name, int64_t layer, int64_t seq, int64_t pos,
		       int is_int, const void *data, int64_t n)
{
	struct capture *c = ctx;
	if (layer != c->layer || pos != c->pos)
		return;
	if (!strcmp(name, "kv_cmpr"))
		memcpy(c->kv_cmpr, data, (size_t)n * 4);
	else if (!strcmp(name, "k_pe"))
		memcpy(c->k_pe, data, (size_t)n * 4);
	else if (!strcmp(name, "idx_k"))
		memcpy(c->idx_k, data, (size_t)n * 4);
	else if (!strcmp(name, "idx_topk"))
		memcpy(c->topk, data, (size_t)n * 4), c->n_topk = n;
}

TEST_T(forward, cache_bytes_match_the_layouts, 120)
{
	struct test_model m;
	model_load(&m, "mini");
	const struct dsv32_config *c = &m.c;
	int32_t tok[30], bt[1] = {1};
	rand_tokens(tok, 30, c->vocab_size, 5);
	struct backend *b = make_backend(&m, 2, 1);
	float *logits = malloc((size_t)(30 * c->vocab_size) * sizeof *logits);
	struct capture cap = {.layer = 2, .pos = 21};
	struct backend_dump d = {capture_cb, &cap};
	int64_t pos[30];
	uint8_t fl[30];
	for (int i = 0; i < 30; i++)
		pos[i] = i, fl[i] = BACKEND_ROW_LOGITS;
	struct backend_seq s = {30, tok, pos, bt, 1, fl, logits, NULL, NULL, 0};
	struct backend_step st = {0, 1, &s, &d};
	REQUIRE(backend_step(b, &st) == 0);
	/* top-k of position 21 with index_topk 8: 8 ascending positions <= 21 */
	CHECK_EQ_INT(cap.n_topk, 8);
	for (int i = 0; i < 8; i++)
		CHECK(cap.topk[i] >= 0 && cap.topk[i] <= 21 && (i == 0 || cap.topk[i] > cap.topk[i - 1]));
	/* the MLA record of position 21 in layer 2 = the layout applied to kv_cmpr and k_pe */
	uint8_t *page = malloc(b->mla_page_bytes), *want = calloc(1, b->mla_page_bytes);
	REQUIRE(backend_page_io(b, 2, BACKEND_POOL_MLA, 1, page, 0) == 0);
	kv_mla_write(c, want, 21, cap.kv_cmpr, cap.k_pe);
	CHECK(!memcmp(page + 21 * c->mla_record_bytes, want + 21 * c->mla_record_bytes,
		      c->mla_record_bytes));
	/* the indexer key: act_quant of idx_k, codes then scales */
	uint8_t *ip = malloc(b->idx_page_bytes), k8[128];
	REQUIRE(backend_page_io(b, 2, BACKEND_POOL_INDEX, 1, ip, 0) == 0);
	float ks = act_quant_group(cap.idx_k, 128, k8);
	CHECK(!memcmp(ip + 21 * 128, k8, 128));
	CHECK(kv_index_scale(c, ip, 21) == ks);
	free(page);
	free(want);
	free(ip);
	free(logits);
	backend_destroy(b);
	test_model_free(&m);
}

TEST_T(forward, mtp_is_batch_invariant_and_finite, 120)
{
	struct test_model m;
	model_load(&m, "mini");
	REQUIRE(m.w.has_mtp);
	int64_t V = m.c.vocab_size, D = m.c.hidden_size, T = 30;
	int32_t tok[30], bt[1] = {0};
	rand_tokens(tok, T, V, 77);
	struct backend *b = make_backend(&m, 1, 2);
	float *hid = malloc((size_t)(T * D) * sizeof *hid), *lg = malloc((size_t)(T * V) * sizeof *lg);
	float *ref = malloc((size_t)(T * V) * sizeof *ref), *got = malloc((size_t)(T * V) * sizeof *got);
	int64_t pos[30];
	uint8_t fl[30];
	for (int i = 0; i < T; i++)
		pos[i] = i, fl[i] = BACKEND_ROW_LOGITS | BACKEND_ROW_HIDDEN | BACKEND_ROW_KEEP;
	struct backend_seq s = {T, tok, pos, bt, 1, fl, lg, hid, NULL, 0};
	struct backend_step st = {0, 1, &s, NULL};
	REQUIRE(backend_step(b, &st) == 0);
	for (int64_t chunk = T - 1; chunk >= 1; chunk -= (chunk > 5 ? 13 : 4)) {
		float *out = chunk == T - 1 ? ref : got;
		for (int64_t p = 0; p < T - 1; p += chunk) {
			int64_t n = T - 1 - p < chunk ? T - 1 - p : chunk;
			struct backend_seq ms = {n, tok + p + 1, pos + p, bt, 1, fl + p, out + p * V,
						 NULL, hid + p * D, 0};
			for (int64_t i = 0; i < n; i++)
				fl[p + i] = BACKEND_ROW_LOGITS;
			struct backend_step mst = {1, 1, &ms, NULL};
			REQUIRE(backend_step(b, &mst) == 0);
		}
		if (out == got)
			CHECK(first_diff(ref, got, (T - 1) * V) < 0);
	}
	for (int64_t i = 0; i < (T - 1) * V; i++)
		REQUIRE(isfinite(ref[i]));
	/* h_i from the main step's kept rows instead of given (backend.h): the same bits, in
	 * two sequences of one step (pages written twice with the same records) */
	memset(got, 0, (size_t)(T * V) * sizeof *got);
	for (int i = 0; i < T; i++)
		fl[i] = BACKEND_ROW_LOGITS;
	struct backend_seq ks[2] = {{11, tok + 1, pos, bt, 1, fl, got, NULL, NULL, 0},
				    {T - 12, tok + 12, pos + 11, bt, 1, fl, got + 11 * V, NULL, NULL, 11}};
	struct backend_step kst = {1, 2, ks, NULL};
	CHECK(backend_step(b, &kst) == 0);
	CHECK(first_diff(ref, got, (T - 1) * V) < 0);
	/* MTP rows without h_i are rejected: kept rows out of range (or negative), h_i given for
	 * one sequence and not the other; KEEP flagged in an MTP step; and after a main step that
	 * kept nothing, any kept row */
	ks[1].mtp_kept = 13; /* (rows 13 .. T: one past the T kept) */
	CHECK(backend_step(b, &kst) == -EINVAL);
	ks[1].mtp_kept = -1;
	CHECK(backend_step(b, &kst) == -EINVAL);
	ks[1].mtp_kept = 11, ks[1].mtp_hidden = hid + 11 * D;
	CHECK(backend_step(b, &kst) == -EINVAL);
	ks[1].mtp_hidden = NULL;
	fl[0] |= BACKEND_ROW_KEEP;
	CHECK(backend_step(b, &kst) == -EINVAL);
	fl[0] = BACKEND_ROW_LOGITS;
	CHECK(backend_step(b, &kst) == 0); /* (still taken) */
	struct backend_seq one = {1, tok, pos, bt, 1, NULL, lg, NULL, NULL, 0};
	struct backend_step ost = {0, 1, &one, NULL}; /* keeps nothing */
	REQUIRE(backend_step(b, &ost) == 0);
	struct backend_seq bad = {1, tok, pos, bt, 1, NULL, lg, NULL, NULL, 0};
	struct backend_step bst = {1, 1, &bad, NULL};
	CHECK(backend_step(b, &bst) == -EINVAL);
	free(hid);
	free(lg);
	free(ref);
	free(got);
	backend_destroy(b);
	test_model_free(&m);
}

TEST_T(forward, step_validation, 60)
{
	struct test_model m;
	model_load(&m, "mini");
	struct backend *b = make_backend(&m, 2, 1);
	float *lg = malloc((size_t)m.c.vocab_size * sizeof *lg);
	int32_t tok[1] = {5}, bt[2] = {0, 1};
	int64_t pos[1] = {0};
	struct backend_seq s = {1, tok, pos, bt, 1, NULL, lg, NULL, NULL, 0};
	struct backend_step st = {0, 1, &s, NULL};
	CHECK(backend_step(b, &st) == 0);
	tok[0] = (int32_t)m.c.vocab_size;
	CHECK(backend_step(b, &st) == -EINVAL); /* token out of range */
	tok[0] = 5;
	pos[0] = 64;
	CHECK(backend_step(b, &st) == -EINVAL); /* position beyond the block table */
	s.n_blocks = 2;
	bt[1] = 2;
	CHECK(backend_step(b, &st) == -EINVAL); /* page id out of range */
	bt[1] = 1;
	s.logits = NULL;
	CHECK(backend_step(b, &st) == -EINVAL); /* logits wanted, nowhere to put them */
	s.logits = lg;
	CHECK(backend_step(b, &st) == 0);
	struct backend_step empty = {0, 0, NULL, NULL};
	CHECK(backend_step(b, &empty) == 0);
	free(lg);
	backend_destroy(b);
	test_model_free(&m);
}

TEST_T(forward, tiny_model_100_greedy_steps_stay_finite, 600)
{
	struct test_model m;
	model_load(&m, "tiny");
	int64_t V = m.c.vocab_size, D = m.c.hidden_size, T = 16, steps = 100;
	int32_t tok[16 + 100], bt[2] = {0, 1};
	rand_tokens(tok, T, 20000, 1);
	struct backend *b = make_backend(&m, 2, 2);
	float *lg = malloc((size_t)V * sizeof *lg), *hid = malloc((size_t)D * sizeof *hid);
	double max_logit = 0, max_hidden = 0;
	for (int64_t p = 0; p < T + steps - 1; p++) {
		int64_t pos = p;
		uint8_t fl = BACKEND_ROW_LOGITS | BACKEND_ROW_HIDDEN;
		struct backend_seq s = {1, tok + p, &pos, bt, 2, &fl, lg, hid, NULL, 0};
		struct backend_step st = {0, 1, &s, NULL};
		REQUIRE(backend_step(b, &st) == 0);
		int64_t best = 0;
		for (int64_t v = 0; v < V; v++) {
			if (!isfinite(lg[v])) {
				test_fail(__FILE__, __LINE__, "position %lld: logit %lld = %g",
					  (long long)p, (long long)v, lg[v]);
				test_abort_case();
			}
			max_logit = fmax(max_logit, fabs(lg[v]));
			if (lg[v] > lg[best])
				best = v;
		}
		for (int64_t i = 0; i < D; i++) {
			REQUIRE(isfinite(hid[i]));
			max_hidden = fmax(max_hidden, fabs(hid[i]));
		}
		if (p + 1 >= T)
			tok[p + 1] = (int32_t)best;
	}
	fprintf(stderr, "    tiny: 100 greedy steps, max |logit| %.3g, max |final hidden| %.3g\n",
		max_logit, max_hidden);
	CHECK(max_logit < 1e4);
	free(lg);
	free(hid);
	backend_destroy(b);
	test_model_free(&m);
}

/* Main logits [T, V] and MTP logits [T-1, V] of one sequence on a fresh backend. */
static void run_with_mtp(struct test_model *m, const int32_t *tok, int64_t T, float *lg, float *mtp)
{
	int64_t D = m->c.hidden_size;
	int32_t bt[1] = {0};
	int64_t pos[64];
	uint8_t fl[64];
	float *hid = malloc((size_t)(T * D) * sizeof *hid);
	struct backend *b = make_backend(m, 1, 2);
	for (int64_t i = 0; i < T; i++)
		pos[i] = i, fl[i] = BACKEND_ROW_LOGITS | BACKEND_ROW_HIDDEN;
	struct backend_seq s = {T, tok, pos, bt, 1, fl, lg, hid, NULL, 0};
	struct backend_step st = {0, 1, &s, NULL};
	REQUIRE(backend_step(b, &st) == 0);
	for (int64_t i = 0; i < T; i++)
		fl[i] = BACKEND_ROW_LOGITS;
	struct backend_seq ms = {T - 1, tok + 1, pos, bt, 1, fl, mtp, NULL, hid, 0};
	struct backend_step mst = {1, 1, &ms, NULL};
	REQUIRE(backend_step(b, &mst) == 0);
	backend_destroy(b);
	free(hid);
}

TEST_T(forward, every_mutation_changes_the_output, 300)
{
	/* the test-only switches of issue 4 each change something on a random checkpoint
	 * (whether a test turns red for each is issue 4's structured-checkpoint job) */
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size, T = 24;
	int32_t tok[24];
	rand_tokens(tok, T, V, 8);
	float *lg0 = malloc((size_t)(T * V) * sizeof *lg0), *mt0 = malloc((size_t)(T * V) * sizeof *mt0);
	float *lg = malloc((size_t)(T * V) * sizeof *lg), *mt = malloc((size_t)(T * V) * sizeof *mt);
	run_with_mtp(&m, tok, T, lg0, mt0);
	for (int k = 1; k < CPU_MUTATION_COUNT; k++) {
		cpu_mutation = (enum cpu_mutation)k;
		run_with_mtp(&m, tok, T, lg, mt);
		int main_same = first_diff(lg0, lg, T * V) < 0;
		int mtp_same = first_diff(mt0, mt, (T - 1) * V) < 0;
		if (main_same && mtp_same)
			test_fail(__FILE__, __LINE__, "mutation %s changes nothing",
				  cpu_mutation_name((enum cpu_mutation)k));
		if (k == CPU_MUTATION_MTP_CONCAT_SWAPPED)
			CHECK(main_same && !mtp_same); /* only the MTP layer is touched */
	}
	cpu_mutation = CPU_MUTATION_NONE;
	run_with_mtp(&m, tok, T, lg, mt);
	CHECK(first_diff(lg0, lg, T * V) < 0);
	CHECK_EQ_INT(cpu_mutation_set("topk_ignored"), 0);
	CHECK(cpu_mutation == CPU_MUTATION_TOPK_IGNORED);
	CHECK_EQ_INT(cpu_mutation_set("no_such_bug"), -EINVAL);
	free(lg0);
	free(mt0);
	free(lg);
	free(mt);
	test_model_free(&m);
}

/* ---- dsv32 eval ----------------------------------------------------------------------------- */

/* Runs `$DSV32_BIN/dsv32 ARGS`, output into TMP/eval.log; returns the exit status and the log. */
static int run_dsv32(const char *args, char **log)
{
	char cmd[8192], logp[512];
	snprintf(logp, sizeof logp, "%s/eval.log", test_tmpdir());
	snprintf(cmd, sizeof cmd, "%s/dsv32 %s >%s 2>&1", test_bin_dir(), args, logp);
	int st = system(cmd);
	*log = file_read(logp, NULL, 1 << 20, NULL);
	return st == -1 ? -1 : WEXITSTATUS(st);
}

static const char *write_tokens(const char *name, const char *text)
{
	static char path[8][512];
	static int k;
	char *p = path[k++ % 8];
	snprintf(p, 512, "%s/%s", test_tmpdir(), name);
	REQUIRE(file_write(p, text, strlen(text), NULL) == 0);
	return p;
}

TEST_T(eval, outputs_dumps_generation, 300)
{
	struct test_model m;
	model_load(&m, "mini");
	int64_t V = m.c.vocab_size, K = m.c.num_experts_per_tok;
	const char *tf = write_tokens("two.txt", "5,17,300,2,9,44,1000,7,8,9,10,11\n"
						 "3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4\n");
	char args[4096], *log;
	const char *t = test_tmpdir();
	snprintf(args, sizeof args,
		 "eval --model %s --backend cpu --tokens %s --chunk 7 --generate 3 --threads 2 "
		 "--logits-out %s/l.npz --mtp-out %s/m.npz --dump-topk %s/k.npz --dump-experts %s/e.npz "
		 "--dump embed attn_norm q_cmpr q kv_cmpr k_pe idx_q idx_k idx_w idx_scores idx_topk "
		 "q_lat attn_o attn_out ffn_norm ffn_out ffn_moe_logits ffn_moe_topk ffn_moe_weights "
		 "ffn_moe_out result_norm mtp_cat mtp_eh_proj --dump-out %s/d.npz",
		 m.dir, tf, t, t, t, t, t);
	int rc = run_dsv32(args, &log);
	CHECK_EQ_INT(rc, 0);
	CHECK_CONTAINS(log, "seq0: perplexity");
	CHECK_CONTAINS(log, "seq1: generated ");
	free(log);
	char p[600];
	struct npy_array a;
	struct err e;
	snprintf(p, sizeof p, "%s/l.npz", t);
	REQUIRE(npz_read(p, "seq1", &a, &e) == 0);
	CHECK(a.shape[0] == 20 && a.shape[1] == V);
	float *l1 = a.data; /* keep for the single-sequence comparison below */
	snprintf(p, sizeof p, "%s/m.npz", t);
	struct npy_array mt;
	REQUIRE(npz_read(p, "seq0", &mt, &e) == 0);
	CHECK(mt.shape[0] == 11 && mt.shape[1] == V);
	npy_free(&mt);
	snprintf(p, sizeof p, "%s/k.npz", t);
	struct npy_array k;
	REQUIRE(npz_read(p, "s1_l3", &k, &e) == 0); /* [T, min(index_topk, T)] */
	CHECK(k.dtype == NPY_I32 && k.shape[0] == 20 && k.shape[1] == 8);
	int32_t *kk = k.data;
	CHECK(kk[0] == 0 && kk[1] == -1);                      /* row 0: itself, padded */
	for (int r = 8; r < 20; r++)
		for (int i = 1; i < 8; i++)
			CHECK(kk[r * 8 + i] > kk[r * 8 + i - 1] && kk[r * 8 + i] <= r);
	npy_free(&k);
	REQUIRE(npz_read(p, "s0_l4", &k, &e) == 0); /* the MTP layer, rows 0..T-2 */
	CHECK(k.shape[0] == 11);
	npy_free(&k);
	snprintf(p, sizeof p, "%s/e.npz", t);
	REQUIRE(npz_read(p, "s0_l2", &k, &e) == 0);
	CHECK(k.shape[0] == 12 && k.shape[1] == K);
	kk = k.data;
	for (int r = 0; r < 12; r++)
		for (int i = 1; i < K; i++)
			CHECK(kk[r * K + i] > kk[r * K + i - 1]);
	npy_free(&k);
	CHECK(npz_read(p, "s0_l0", &k, &e) == -ENOENT); /* dense layer: no experts */
	snprintf(p, sizeof p, "%s/d.npz", t);
	REQUIRE(npz_read(p, "idx_scores_s1_l0", &k, &e) == 0);
	CHECK(k.shape[0] == 20 && k.shape[1] == 20 && isinf(((float *)k.data)[1]));
	npy_free(&k);
	REQUIRE(npz_read(p, "attn_norm_s0_l1", &k, &e) == 0);
	CHECK(k.shape[0] == 12 && k.shape[1] == m.c.hidden_size);
	npy_free(&k);
	/* every dump name of backend.h is produced (layer 2 is MoE, 4 the MTP layer) */
	const char *keys[] = {"embed_s0", "q_cmpr_s0_l0", "q_s0_l0", "kv_cmpr_s0_l0", "k_pe_s1_l3",
			      "idx_q_s0_l0", "idx_k_s0_l0", "idx_w_s0_l0", "idx_topk_s0_l0",
			      "q_lat_s0_l0", "attn_o_s0_l0", "attn_out_s0_l0", "ffn_norm_s0_l0",
			      "ffn_out_s0_l0", "ffn_moe_logits_s0_l2", "ffn_moe_topk_s0_l2",
			      "ffn_moe_weights_s0_l2", "ffn_moe_out_s0_l4", "result_norm_s0",
			      "result_norm_s0_l4", "mtp_cat_s0_l4", "mtp_eh_proj_s1_l4"};
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
		if (npz_read(p, keys[i], &k, &e))
			test_fail(__FILE__, __LINE__, "dump %s missing: %s", keys[i], e.msg);
		npy_free(&k);
	}

	/* one sequence, .npy, no chunking: the same bits as seq1 above */
	const char *one = write_tokens("one.txt", "3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4");
	snprintf(args, sizeof args, "eval --model %s --tokens %s --logits-out %s/one.npy", m.dir, one, t);
	CHECK_EQ_INT(run_dsv32(args, &log), 0);
	free(log);
	snprintf(p, sizeof p, "%s/one.npy", t);
	REQUIRE(npy_read(p, &k, &e) == 0);
	CHECK(k.ndim == 2 && k.shape[0] == 20 && k.shape[1] == V);
	CHECK(!memcmp(k.data, l1, (size_t)(20 * V) * 4));
	npy_free(&k);
	npy_free(&a);
	test_model_free(&m);
}

TEST_T(eval, malformed_tokens_files, 120)
{
	struct test_model m;
	model_load(&m, "mini");
	struct {
		const char *text, *want;
	} cases[] = {
		{"1,2,x\n", ":1:5: expected a token id"},
		{"1,,2\n", ":1:3: missing token id"},
		{"1,2,\n", ":1:5: missing token id"},
		{"1,2\n\n3\n", ":2:1: empty line"},
		{"1,2\n   \n", ":2:4: empty line"},
		{"5,1024\n", ":1:3: token id out of range"},
		{"7,99999999999999999999\n", ":1:3: token id out of range"},
		{"-1\n", ":1:1: expected a token id, got '-'"},
		{"1 2\n", ":1:3: expected ',' or end of line"},
		{"1,2\n3;4\n", ":2:2: expected ','"},
		{"", "no sequences"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		const char *f = write_tokens("bad.txt", cases[i].text);
		char args[2048], *log;
		snprintf(args, sizeof args, "eval --model %s --tokens %s", m.dir, f);
		CHECK_EQ_INT(run_dsv32(args, &log), 1);
		CHECK_CONTAINS(log, cases[i].want);
		CHECK_CONTAINS(log, "bad.txt");
		free(log);
	}
	char args[2048], *log;
	snprintf(args, sizeof args, "eval --model %s --tokens %s/nonexistent.txt", m.dir, test_tmpdir());
	CHECK_EQ_INT(run_dsv32(args, &log), 1);
	CHECK_CONTAINS(log, "nonexistent.txt");
	free(log);
	/* spaces around ids and CRLF are fine */
	const char *ok = write_tokens("ok.txt", " 1, 2 ,3\r\n4\r\n");
	snprintf(args, sizeof args, "eval --model %s --tokens %s", m.dir, ok);
	CHECK_EQ_INT(run_dsv32(args, &log), 0);
	free(log);
	snprintf(args, sizeof args, "eval --model %s", m.dir);
	CHECK_EQ_INT(run_dsv32(args, &log), 2); /* usage */
	free(log);
	snprintf(args, sizeof args, "eval --model %s --tokens %s --bench --logits-out x.npy", m.dir, ok);
	CHECK_EQ_INT(run_dsv32(args, &log), 2); /* --bench computes no per-row logits */
	free(log);
	snprintf(args, sizeof args, "eval --model %s --tokens %s --bench --generate 3", m.dir, ok);
	CHECK_EQ_INT(run_dsv32(args, &log), 0);
	CHECK_CONTAINS(log, "seq1: generated ");
	CHECK_CONTAINS(log, "bench: one-thread read bandwidth");
	free(log);
	snprintf(args, sizeof args, "eval --model %s --tokens %s --dump attn_norm kv_cmprr", m.dir, ok);
	CHECK_EQ_INT(run_dsv32(args, &log), 2);
	CHECK_CONTAINS(log, "unknown name 'kv_cmprr'");
	free(log);
	/* the test-only mutation switch is loud, and an unknown name is an error */
	snprintf(args, sizeof args, "eval --model %s --tokens %s", m.dir, ok);
	setenv("DSV32_CPU_MUTATION", "no_relu_typo", 1);
	CHECK_EQ_INT(run_dsv32(args, &log), 1);
	CHECK_CONTAINS(log, "unknown mutation");
	free(log);
	setenv("DSV32_CPU_MUTATION", "indexer_no_relu", 1);
	CHECK_EQ_INT(run_dsv32(args, &log), 0);
	CHECK_CONTAINS(log, "TEST MUTATION 'indexer_no_relu' is on");
	free(log);
	unsetenv("DSV32_CPU_MUTATION");
	test_model_free(&m);
}
