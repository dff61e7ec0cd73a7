/*
 * test_mutations.c — every spec §10b bug, switched on in the CPU backend (model/cpu_mutation.h),
 * must turn the numerics suite red (issue 4). Each case sets one mutation in its own forked
 * process, runs the op-level checks and the end-to-end checks of the shallow structured config
 * (one MoE layer + MTP, 96 tokens: dense and sparse index rows, routing with margins, MTP) and
 * of the structured tiny config where a mutation needs depth or a longer context, and requires
 * at least one failed check. The list is pinned: a new mutation fails here until it has a case.
 */
#include "model/cpu_mutation.h"
#include "tests/oracle/numerics_ops.h"

static void expect_red(const char *mutation, int deep)
{
	REQUIRE(cpu_mutation_set(mutation) == 0);
	struct nc_verdict v = {0};
	v.quiet = 1;
	nc_ops(&v);
	nc_e2e(&v, "moe1", &NC_SHALLOW);
	if (deep && !v.fails)
		nc_e2e(&v, "tiny", &NC_DEEP);
	fprintf(stderr, "mutation %-26s -> %d failed check(s)%s%s\n", mutation, v.fails,
		v.fails ? "; first: " : "", v.first);
	if (!v.fails)
		test_fail(__FILE__, __LINE__, "mutation %s: the numerics suite stays green", mutation);
}

#define MUTATION(name, deep)                                  \
	TEST_T(mutations, name, 240) { expect_red(#name, deep); }

MUTATION(indexer_rope_interleaved, 0)
MUTATION(hadamard_q_only, 0)
MUTATION(indexer_no_relu, 0)
MUTATION(indexer_no_k_scale, 0)
MUTATION(topk_ignored, 0)
MUTATION(self_excluded, 0)
MUTATION(mla_rope_halfsplit, 0)
MUTATION(q_head_rope_first, 0)
MUTATION(kv_b_swapped, 0)
MUTATION(no_yarn, 0)
MUTATION(no_mscale, 0)
MUTATION(scale_576, 0)
MUTATION(divide_scale_inv, 0)
MUTATION(gate_bias_ignored, 0)
MUTATION(gate_bias_in_weights, 0)
MUTATION(no_group_limit, 0)
MUTATION(no_renorm, 0)
MUTATION(no_route_scale, 0)
MUTATION(no_shared_expert, 0)
MUTATION(silu_on_up, 0)
MUTATION(mtp_concat_swapped, 0)

TEST(mutations, every_mutation_has_a_case)
{
	/* the cases above, in the enum's order; a new mutation needs a case */
	CHECK_EQ_INT(CPU_MUTATION_COUNT, 22);
	CHECK_EQ_STR(cpu_mutation_name(CPU_MUTATION_COUNT - 1), "mtp_concat_swapped");
}
