/*
 * cpu_mutation.c — names and the process-wide setting of the test-only mutations
 * (see cpu_mutation.h).
 */
#include "model/cpu_mutation.h"

#include <errno.h>
#include <string.h>

enum cpu_mutation cpu_mutation = CPU_MUTATION_NONE;

static const char *const names[CPU_MUTATION_COUNT] = {
	"none",
	"indexer_rope_interleaved",
	"hadamard_q_only",
	"indexer_no_relu",
	"indexer_no_k_scale",
	"topk_ignored",
	"self_excluded",
	"mla_rope_halfsplit",
	"q_head_rope_first",
	"kv_b_swapped",
	"no_yarn",
	"no_mscale",
	"scale_576",
	"divide_scale_inv",
	"gate_bias_ignored",
	"gate_bias_in_weights",
	"no_group_limit",
	"no_renorm",
	"no_route_scale",
	"no_shared_expert",
	"silu_on_up",
	"mtp_concat_swapped",
};

const char *cpu_mutation_name(enum cpu_mutation m)
{
	return m >= 0 && m < CPU_MUTATION_COUNT ? names[m] : "?";
}

int cpu_mutation_set(const char *name)
{
	for (int m = 0; m < CPU_MUTATION_COUNT; m++)
		if (!strcmp(name, names[m])) {
			cpu_mutation = (enum cpu_mutation)m;
			return 0;
		}
	return -EINVAL;
}
