/*
 * cpu_mutation.h — test-only switches that put one deliberate spec violation into the CPU
 * backend, one per bug listed in spec §10b, so the numerics tests (issue 4) can prove they
 * turn red for each.
 *
 * Owns: the list, the names and the one process-wide setting. At most one mutation is on;
 * CPU_MUTATION_NONE (the default) is the spec. backend_cpu_create reads the environment
 * variable DSV32_CPU_MUTATION=<name> (for tools run by tests) and says loudly on stderr when
 * one is on. Each op checks cpu_mutated() at the single place where its spec decision is made.
 * Must not: be set in production.
 */
#ifndef DSV32_CPU_MUTATION_H
#define DSV32_CPU_MUTATION_H

enum cpu_mutation {
	CPU_MUTATION_NONE,
	CPU_MUTATION_INDEXER_ROPE_INTERLEAVED, /* indexer RoPE interleaved instead of half-split */
	CPU_MUTATION_HADAMARD_Q_ONLY,          /* Hadamard on the indexer q but not on k */
	CPU_MUTATION_INDEXER_NO_RELU,          /* no ReLU on the per-head index dot */
	CPU_MUTATION_INDEXER_NO_K_SCALE,       /* index score not multiplied by s_k */
	CPU_MUTATION_TOPK_IGNORED,             /* every causal key attended, top-k unused */
	CPU_MUTATION_SELF_EXCLUDED,            /* a query never sees its own key (pos > 0) */
	CPU_MUTATION_MLA_ROPE_HALFSPLIT,       /* MLA RoPE half-split instead of interleaved */
	CPU_MUTATION_Q_HEAD_ROPE_FIRST,        /* q head read as [rope | nope] */
	CPU_MUTATION_KV_B_SWAPPED,             /* kv_b_proj halves swapped (needs nope == v dim) */
	CPU_MUTATION_NO_YARN,                  /* plain RoPE frequencies */
	CPU_MUTATION_NO_MSCALE,                /* softmax scale qk_head_dim^-0.5 without m^2 */
	CPU_MUTATION_SCALE_576,                /* softmax scale (kv_lora_rank + rope)^-0.5 */
	CPU_MUTATION_DIVIDE_SCALE_INV,         /* FP8 weights divided by weight_scale_inv */
	CPU_MUTATION_GATE_BIAS_IGNORED,        /* experts selected without the correction bias */
	CPU_MUTATION_GATE_BIAS_IN_WEIGHTS,     /* the bias also added to the routing weights */
	CPU_MUTATION_NO_GROUP_LIMIT,           /* topk_group not applied */
	CPU_MUTATION_NO_RENORM,                /* routing weights not renormalised */
	CPU_MUTATION_NO_ROUTE_SCALE,           /* routed_scaling_factor not applied */
	CPU_MUTATION_NO_SHARED_EXPERT,         /* shared expert left out */
	CPU_MUTATION_SILU_ON_UP,               /* SiLU on up_proj instead of gate_proj */
	CPU_MUTATION_MTP_CONCAT_SWAPPED,       /* MTP eh_proj input [hnorm(h) ; enorm(e)] */
	CPU_MUTATION_COUNT
};

extern enum cpu_mutation cpu_mutation; /* set before creating a backend */

static inline int cpu_mutated(enum cpu_mutation m) { return cpu_mutation == m; }

/* "indexer_rope_interleaved", ...; "none" for CPU_MUTATION_NONE. */
const char *cpu_mutation_name(enum cpu_mutation m);
/* Sets cpu_mutation by name; 0 or -EINVAL for an unknown name. */
int cpu_mutation_set(const char *name);

#endif
