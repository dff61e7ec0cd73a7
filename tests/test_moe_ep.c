/* test_moe_ep.c — expert parallelism's CPU reference (model/cpu_moe.c moe_forward_rank, step 3
 * of docs/MULTIGPU.md; the oracle a GPU rank's MoE block will be checked against): on the mini
 * checkpoint's first MoE layer (16 experts, 4 picks a token), the ranks' shares summed in fp32
 * and rounded to bf16 give moe_forward's output: bit for bit with one rank, and with 2, 3, 4
 * and 16 ranks within the reordering of that fp32 sum (nc_bf16_close: at most one bf16 ulp,
 * 90% of the values the same). The ranks' expert ranges tile the experts exactly once; a share with none of a
 * token's picks and no shared expert is exactly zero; leaving one rank out of the sum moves
 * the output (so a share computed twice or dropped cannot pass). */
#include <string.h>

#include "model/cpu_moe.h"
#include "model/numerics.h"
#include "tests/ckpt_helpers.h"
#include "tests/oracle/numerics_ops.h"

TEST(moe_ep, expert_ranges_tile_the_experts)
{
	const int64_t counts[] = {16, 256, 7};
	for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
		for (int ranks = 1; ranks <= 9; ranks++) {
			int64_t next = 0, e0, e1;
			for (int r = 0; r < ranks; r++) {
				moe_rank_experts(counts[k], r, ranks, &e0, &e1);
				CHECK(e0 == next && e1 >= e0);
				next = e1;
			}
			CHECK(next == counts[k]);
		}
	int64_t e0, e1;
	moe_rank_experts(256, 3, 8, &e0, &e1);
	CHECK(e0 == 96 && e1 == 128);
}

TEST_T(moe_ep, shares_sum_to_the_block, 120)
{
	struct test_model m;
	snprintf(m.dir, sizeof m.dir, "%s", make_mini("ep", 3, 0));
	test_model_bind(&m);
	const struct dsv32_config *c = &m.c;
	const int64_t D = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
	const int64_t T = 40;
	const struct layer_weights *lw = &m.w.layers[c->first_k_dense_replace];
	REQUIRE(E == 16 && K == 4);

	float *f = malloc((size_t)(T * D) * 4), *y = malloc((size_t)(T * D) * 4);
	float *sum = malloc((size_t)(T * D) * 4), *part = malloc((size_t)(T * D) * 4);
	float *rs = malloc((size_t)(T * D) * 4); /* the sum rounded to bf16: the block's output */
	float *logits = malloc((size_t)(T * E) * 4), *wts = malloc((size_t)(T * K) * 4);
	int32_t *idx = malloc((size_t)(T * K) * 4);
	REQUIRE(f && y && sum && part && rs && logits && wts && idx);
	uint64_t seed = 17;
	for (int64_t i = 0; i < T * D; i++) /* bf16 values ~ U(-2, 2), as a normed row */
		f[i] = bf16_round((float)((test_rand(&seed) >> 40) * 0x1p-24) * 4.0f - 2.0f);
	moe_forward(NULL, c, lw, f, T, y, idx, wts, logits);

	const int rank_counts[] = {1, 2, 3, 4, 16};
	for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
		int ranks = rank_counts[k];
		memset(sum, 0, (size_t)(T * D) * 4);
		int64_t zero_shares = 0, zero_ok = 0;
		for (int r = 0; r < ranks; r++) {
			moe_forward_rank(NULL, c, lw, f, T, idx, wts, r, ranks, part);
			int64_t e0, e1;
			moe_rank_experts(E, r, ranks, &e0, &e1);
			for (int64_t t = 0; t < T; t++) {
				int owns = 0;
				for (int64_t n = 0; n < K; n++)
					owns += idx[t * K + n] >= e0 && idx[t * K + n] < e1;
				if (r > 0 && !owns) { /* nothing of this token here: exactly zero */
					zero_shares++;
					int z = 1;
					for (int64_t d = 0; d < D; d++)
						z &= part[t * D + d] == 0.0f;
					zero_ok += z;
				}
			}
			for (int64_t i = 0; i < T * D; i++)
				sum[i] += part[i];
		}
		for (int64_t i = 0; i < T * D; i++)
			rs[i] = bf16_round(sum[i]);
		/* one rank: the block's bits; more: within one bf16 ulp, 90% the same */
		char what[32];
		snprintf(what, sizeof what, "ep, %d ranks", ranks);
		struct nc_verdict v = {0};
		nc_bf16_close(&v, what, rs, y, T * D, ranks == 1 ? 0.0 : 0.1);
		CHECK_EQ_INT(v.fails, 0);
		printf("    %2d ranks: %lld / %lld shares without the token's experts exactly zero\n",
		       ranks, (long long)zero_ok, (long long)zero_shares);
		CHECK_EQ_INT(zero_ok, zero_shares);
		if (ranks == 4) { /* the sum without rank 2 is not the block */
			moe_forward_rank(NULL, c, lw, f, T, idx, wts, 2, 4, part);
			int64_t moved = 0;
			for (int64_t i = 0; i < T * D; i++)
				moved += nc_bf16_far(bf16_round(sum[i] - part[i]), y[i]);
			CHECK(moved > T * D / 10);
		}
	}
	free(f), free(y), free(sum), free(part), free(rs), free(logits), free(wts), free(idx);
	test_model_free(&m);
}
