/*
 * cmd_info.c — `dsv32 info --model DIR`: parse config.json, open every shard, bind every tensor
 * and print the model's dimensions and what the checkpoint holds. Exit 1 with the loader's
 * message (file, tensor, expected vs actual) on any problem.
 */
#include <stdio.h>
#include <string.h>

#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tools/cli/cli.h"

int cmd_info(int argc, char **argv)
{
	const char *model = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--model") && i + 1 < argc)
			model = argv[++i];
		else {
			fprintf(stderr, "usage: dsv32 info --model DIR\n");
			return 2;
		}
	}
	if (!model) {
		fprintf(stderr, "usage: dsv32 info --model DIR\n");
		return 2;
	}
	struct dsv32_config c;
	struct err e;
	if (config_load(&c, model, &e)) {
		fprintf(stderr, "dsv32: %s\n", e.msg);
		return 1;
	}
	printf("model_type %s: %lld layers (%lld dense) + %lld MTP, hidden %lld, vocab %lld, "
	       "%lld heads, %lld routed experts (%lld active), index_topk %lld\n",
	       c.model_type, (long long)c.num_hidden_layers, (long long)c.first_k_dense_replace,
	       (long long)c.num_nextn_predict_layers, (long long)c.hidden_size,
	       (long long)c.vocab_size, (long long)c.num_attention_heads,
	       (long long)c.n_routed_experts, (long long)c.num_experts_per_tok,
	       (long long)c.index_topk);
	printf("softmax_scale %.10f, KV cache %zu + %zu B per token per layer\n", c.softmax_scale,
	       c.mla_record_bytes, c.index_record_bytes);
	struct checkpoint ck;
	if (ckpt_open(&ck, model, &e)) {
		fprintf(stderr, "dsv32: %s\n", e.msg);
		return 1;
	}
	size_t bytes = 0;
	for (size_t i = 0; i < ck.n_tensors; i++)
		bytes += ck.tensors[i].nbytes;
	struct weights w;
	int r = weights_bind(&w, &c, &ck, &e);
	if (r) {
		fprintf(stderr, "dsv32: %s\n", e.msg);
	} else {
		struct weights_stats st;
		weights_get_stats(&w, &st);
		printf("checkpoint: %d shard(s), %zu tensors, %.2f GB; every tensor bound (%lld), "
		       "%lld block scales checked, %lld not a power of two; MTP layer %s\n",
		       ck.n_files, ck.n_tensors, bytes / 1e9, (long long)st.n_tensors,
		       (long long)st.n_scales, (long long)st.n_scales_not_pow2,
		       w.has_mtp ? "bound" : "absent");
		weights_free(&w);
	}
	ckpt_close(&ck);
	return r ? 1 : 0;
}
