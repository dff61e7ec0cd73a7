/*
 * cuda_forward.c — the forward pass on the GPU (see cuda_forward.h): the CPU backend's
 * layer_forward (model/cpu_backend.c) op for op, one kernel launch per step, all on the
 * engine stream.
 *
 * Reads like the CPU version, in four files (model/cuda_fwd.h says which owns what): this one
 * the step's rows and metadata, the MTP input (§4), the step (embedding, layers, final norm,
 * head §3.10), the decode graphs and the profile; cuda_fwd_ops.c the ops (norm, act_quant, FP8
 * GEMM, bf16 linear, RoPE, Hadamard); cuda_fwd_attn.c one decoder layer (§3.2-§3.7);
 * cuda_fwd_ffn.c the MLP and the MoE block (§3.8-§3.9). Activations are bf16 on the
 * device, rounded where the CPU rounds; the per-row state of the CPU (the causal key count
 * pos + 1, the row's block table, its physical slot) is uploaded once per step.
 *
 * Buffers have Tp = round_up(T, 8) rows, so a GEMM may run on the padded row count (cuBLASLt
 * refuses M that is not a multiple of 8); rows T .. Tp-1 hold garbage that no real row reads.
 * Synchronisation: none inside the layer loop; the final downloads (logits, hidden rows) wait.
 * Dumps (st->dump) download after each named op and wait: they are for tests and tools.
 *
 * Two modes (fwd_env.batch_invariant, backend_cuda_opts):
 *   fast (the default): GEMMs of M > 64 rows through cuda_gemm_fp8's prefill paths (wgmma /
 *     cuBLASLt), the GEMM dispatch's fast mode below (cuda_gemm_set_batch_invariant: cuBLASLt
 *     where it measured faster), the MoE block on all the step's rows at once (its
 *     wgmma grouped GEMMs above 64 rows, by the GEMM dispatch's mode); bf16 products
 *     on the tensor cores above 8 rows (fwd_mma.cu), the memory-bound GEMV for 1-4 rows, the
 *     CUDA cores in the CPU's order for 5-8. Where it departs from the CPU: the large-M GEMMs'
 *     fp32 accumulation (~2^-12 relative) flips FP8 re-quantisations downstream (run 7:
 *     teacher-forced layer outputs median 3.6e-2 from the CPU, experts differ on 4 of 600
 *     (layer, row); end-to-end logits within issue 12's limits), and a row's numbers depend
 *     on the row count of its step.
 *   batch-invariant: GEMMs and the MoE block in pieces of <= 64 rows through the decode
 *     kernels (one kernel per shape for every M: a row's result does not depend on M), every
 *     bf16 product on the CUDA cores in the CPU's order (bit-identical to the CPU backend's),
 *     the selection width always index_topk, the sparse attention with a decode row's key
 *     splits for every row count; the like-with-like tests run in this mode.
 * A step larger than the scratch arena holds runs in passes (cuda_forward_step); decode-sized
 * steps (<= 64 rows, no dumps; MTP steps and steps with hidden rows too) replay captured CUDA
 * graphs. Switches
 * for diagnosis (struct fwd_switches: read when the backend is created, backend_cuda_set_switch
 * later): DSV32_CUDA_GRAPHS=0, DSV32_CUDA_UNFUSED=1, DSV32_CUDA_FWD_PDL=0/1/names,
 * DSV32_CUDA_FWD_FORK=0, DSV32_CUDA_LOGITS_STAGED=0/1, DSV32_CUDA_MLA_FP32=1, DSV32_CUDA_PROFILE=1,
 * DSV32_CUDA_MMA_ROWS=N, DSV32_CUDA_MAX_ROWS=N, DSV32_CUDA_FWD_SKIP=names, DSV32_TOPK_MODE=m (the
 * indexer's top-k kernel, model/cuda_attn.h: a process-wide setting, here so that bench model
 * --ab can set it); and
 * DSV32_CUDA_MOE_DENSE=1 (the backend's, at creation).
 */
#include "model/cuda_fwd.h"

#ifndef DSV32_NO_CUDA

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda_attn.h"
#include "model/cuda_gemm.h"
#include "model/cuda_step_sample.h"
#include "model/kv_cache.h"
#include "model/numerics.h"

/* ---- profile (DSV32_CUDA_PROFILE=1, eager steps only): GPU time between consecutive ops ---- */

#define PROF_EVENTS 4096
/* The profiled step is enqueued behind a spin of this long (k_fwd_spin) so its ops run back to
 * back on the GPU: without it, ops shorter than the host's launch (+ event) time measured the
 * host (run 12: every one-row kernel at ~8 us). */
#define PROF_SPIN_NS 8000000LL
#define PROF_NAMES 128

static struct {
	int on, n_ev;
	CUevent ev[PROF_EVENTS];
	char ev_name[PROF_EVENTS][40];
	struct {
		char name[40];
		double ms;
		long n;
	} t[PROF_NAMES];
	int n_t;
	long steps;
} prof;

void fwd_prof_mark(void *stream, const char *name)
{
	if (!prof.on || prof.n_ev >= PROF_EVENTS)
		return;
	if (!prof.ev[prof.n_ev])
		cu.cuEventCreate(&prof.ev[prof.n_ev], 0);
	snprintf(prof.ev_name[prof.n_ev], sizeof prof.ev_name[0], "%s", name);
	cu.cuEventRecord(prof.ev[prof.n_ev++], stream);
}

int fwd_prof_on(void)
{
	return prof.on;
}

/* Waits for the step, adds each op's time to its name's total. */
static void prof_step_end(void)
{
	if (!prof.on || prof.n_ev < 2)
		return;
	cu.cuEventSynchronize(prof.ev[prof.n_ev - 1]);
	for (int i = 1; i < prof.n_ev; i++) {
		float ms = 0;
		cu.cuEventElapsedTime(&ms, prof.ev[i - 1], prof.ev[i]);
		int k = 0;
		while (k < prof.n_t && strcmp(prof.t[k].name, prof.ev_name[i]))
			k++;
		if (k == prof.n_t && prof.n_t < PROF_NAMES)
			snprintf(prof.t[prof.n_t++].name, sizeof prof.t[0].name, "%s", prof.ev_name[i]);
		if (k < prof.n_t)
			prof.t[k].ms += ms, prof.t[k].n++;
	}
	prof.steps++;
	prof.n_ev = 0;
}

void cuda_forward_profile_print(void)
{
	if (!prof.steps)
		return;
	double total = 0;
	for (int k = 0; k < prof.n_t; k++)
		total += prof.t[k].ms;
	fprintf(stderr, "cuda forward profile: %ld steps, %.3f ms GPU per step (time between "
			"consecutive ops, the GPU's launch gaps included: each step enqueued ahead "
			"behind a %.0f ms spin)\n", prof.steps, total / prof.steps, PROF_SPIN_NS / 1e6);
	for (int done = 0; done < prof.n_t; done++) { /* by total time, largest first */
		int best = -1;
		for (int k = 0; k < prof.n_t; k++)
			if (prof.t[k].n >= 0 && (best < 0 || prof.t[k].ms > prof.t[best].ms))
				best = k;
		fprintf(stderr, "  %-36s %9.1f us/step %6ld calls/step %9.2f us/call %5.1f%%\n",
			prof.t[best].name, prof.t[best].ms * 1e3 / prof.steps,
			prof.t[best].n / prof.steps, prof.t[best].ms * 1e3 / prof.t[best].n,
			100.0 * prof.t[best].ms / total);
		prof.t[best].n = -1;
	}
	memset(prof.t, 0, sizeof prof.t);
	prof.n_t = 0, prof.steps = 0;
}

/* ---- switches ------------------------------------------------------------------------------------ */

static const char *const switch_names[] = {
	"DSV32_CUDA_GRAPHS", "DSV32_CUDA_UNFUSED", "DSV32_CUDA_FWD_PDL", "DSV32_CUDA_FWD_FORK",
	"DSV32_CUDA_LOGITS_STAGED", "DSV32_CUDA_MMA_ROWS", "DSV32_CUDA_MLA_FP32", "DSV32_CUDA_PROFILE",
	"DSV32_CUDA_MAX_ROWS", "DSV32_CUDA_FWD_SKIP", "DSV32_TOPK_MODE", "DSV32_GEMM_SWAP",
	"DSV32_CUDA_QB_EARLY", "DSV32_CUDA_QB_FUSE", "DSV32_CUDA_MOE_ROUTER", "DSV32_GEMM_GEMV",
	"DSV32_MLA_PDL", "DSV32_GEMM_SW_PAIR", "DSV32_GEMM_SW_M1", "DSV32_CUDA_MOE_ROUTER_T",
	"DSV32_CUDA_MOE_GATE_KS", "DSV32_CUDA_MOE_GEMV_BLOCK", "DSV32_CUDA_MOE_BLOCK_ROUTE",
	"DSV32_CUDA_MOE_BLOCK_EARLY", "DSV32_GEMM_SW_OCT",
};
#define N_SWITCHES (int)(sizeof switch_names / sizeof switch_names[0])

int cuda_forward_switch_set(struct fwd_switches *s, const char *name, const char *v)
{
	int k = 0;
	while (k < N_SWITCHES && strcmp(switch_names[k], name))
		k++;
	if (k == N_SWITCHES)
		return -EINVAL;
	const int zero = v && *v == '0', one = v && *v == '1';
	const long long n = v ? atoll(v) : 0;
	switch (k) {
	case 0: s->graphs = !zero; break;
	case 1: s->unfused = one; break;
	case 2: /* 0, 1, a list of kernel names, or unset (-1: by rows, fwd_pdl) */
		s->pdl = !v ? -1 : zero ? 0 : one ? 1 : 2;
		snprintf(s->pdl_list, sizeof s->pdl_list, "%s", s->pdl == 2 ? v : "");
		break;
	case 3: s->fork = !v ? -1 : zero ? 0 : n == 3 ? 3 : 1; break; /* -1: by rows */
	case 4: s->staged = zero ? 0 : one ? 1 : -1; break;
	case 5: s->mma_rows = n > 0 && n < (1 << 30) ? (int)n : 0; break;
	case 6: s->mla_fp32 = one; break;
	case 7: s->profile = one; break;
	case 8: s->max_rows = n > 0 ? n : 0; break;
	case 9: snprintf(s->skip, sizeof s->skip, "%s", v ? v : ""); break;
	case 11: cuda_gemm_set_swap(v ? atoi(v) : -1); break; /* (cuda_gemm's own; -1 its default) */
	case 12: s->qb_early = !v ? -1 : !zero; break; /* -1: by keys (fwd_qb_early) */
	case 13: s->qb_fuse = !v ? -1 : !zero; break; /* -1: by keys (fwd_qib) */
	case 14: cuda_moe_set_router(v ? atoi(v) : 1); break; /* (cuda_moe's own: 1 its default) */
	case 15: cuda_gemm_set_gemv(v ? atoi(v) : -1); break; /* (cuda_gemm's own: bits; -1 default) */
	case 16: cuda_attn_set_mla_pdl(v ? one : -1); break; /* (cuda_attn's own; -1 its default) */
	case 17: cuda_gemm_set_sw_pair(v ? atoi(v) : -1); break; /* (cuda_gemm's own; -1 default) */
	case 18: cuda_gemm_set_sw_m1(v ? atoi(v) : -1); break; /* (cuda_gemm's own; -1 default) */
	case 19: cuda_moe_set_router_t(v ? atoi(v) : 1); break; /* (cuda_moe's own: 1 its default) */
	case 20: cuda_moe_set_gate_ks(v ? atoi(v) : 1); break; /* (cuda_moe's own: 1 its default) */
	case 21: cuda_gemm_set_moe_block(v ? atoi(v) : -1); break; /* (cuda_gemm's own; -1 default) */
	case 22: cuda_gemm_set_moe_block_route(v ? atoi(v) : -1); break; /* (cuda_gemm's own) */
	case 23: cuda_gemm_set_moe_block_early(v ? atoi(v) : -1); break; /* (cuda_gemm's own) */
	case 24: cuda_gemm_set_sw_oct(v ? atoi(v) : -1); break; /* (cuda_gemm's own; -1 default) */
	default: /* (cuda_attn's own; 0 = its dispatch) */
		s->topk_mode = n > 0 && n <= 9 ? (int)n : 0;
		cuda_attn_set_topk_mode(s->topk_mode);
		break;
	}
	if (k != 0 && k != 7) /* (not GRAPHS, PROFILE: nothing a graph captures) */
		s->gen++;
	return 0;
}

void cuda_forward_switches_init(struct fwd_switches *s)
{
	memset(s, 0, sizeof *s);
	for (int k = 0; k < N_SWITCHES; k++)
		cuda_forward_switch_set(s, switch_names[k], getenv(switch_names[k]));
}

/* ---- the step's metadata ------------------------------------------------------------------------ */

static int row_flags(const struct backend_seq *s, int64_t j)
{
	return s->flags ? s->flags[j] : (j == s->n - 1 ? BACKEND_ROW_LOGITS : 0);
}

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* 1: the logits buffer of every sequence with logits rows lies in the backend's pinned host
 * memory (fwd_env.host_blocks: the scheduler's, bench model's by default). */
static int logits_pinned(const struct fwd *F)
{
	const struct backend_step *st = F->st;
	size_t V = (size_t)F->c->vocab_size;
	for (int64_t i = 0; i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		int64_t nl = 0;
		for (int64_t j = 0; j < s->n; j++)
			nl += !!(row_flags(s, j) & BACKEND_ROW_LOGITS);
		if (!nl || (F->E->draw && F->E->draw[i]))
			continue; /* (drawn on the device: not downloaded) */
		const char *a = (const char *)s->logits, *b = a + (size_t)nl * V * 4;
		int in = 0;
		for (int k = 0; k < F->E->n_host_blocks && !in; k++) {
			const char *p = F->E->host_blocks[k].p;
			in = a >= p && b <= p + F->E->host_blocks[k].bytes;
		}
		if (!in)
			return 0;
	}
	return 1;
}

/* Counts the rows, fills the host copies and uploads the metadata (and up to two [T, D] float
 * inputs, as bf16) in one copy. Returns 0 with F->T = 0 for an empty step. */
static int fwd_begin(struct fwd *F, const struct fwd_env *E, const struct backend_step *st,
		     const float *in0, const float *in1)
{
	const struct dsv32_config *c = E->c;
	memset(F, 0, sizeof *F);
	F->E = E, F->g = E->g, F->A = E->arena, F->c = c, F->m = E->m, F->st = st;
	/* the GEMM dispatch follows the step's mode (sticky per GPU: set at every step) */
	cuda_gemm_set_batch_invariant(E->g, E->batch_invariant);
	int64_t T = 0;
	for (int64_t i = 0; i < st->n_seqs; i++)
		T += st->seqs[i].n;
	if (T == 0)
		return 0;
	if (T > 65535)
		return -EINVAL; /* grid y of the per-row kernels */
	F->T = (int)T, F->Tp = fwd_round8((int)T);
	F->pos_h = malloc((size_t)T * sizeof *F->pos_h);
	F->seq_h = malloc((size_t)T * sizeof *F->seq_h);
	if (!F->pos_h || !F->seq_h)
		return -ENOMEM;
	int64_t maxp = 0;
	for (int64_t i = 0, t = 0; i < st->n_seqs; i++)
		for (int64_t j = 0; j < st->seqs[i].n; j++, t++) {
			F->pos_h[t] = st->seqs[i].pos[j];
			F->seq_h[t] = i;
			maxp = F->pos_h[t] > maxp ? F->pos_h[t] : maxp;
			if (F->pos_h[t] >= F->m->rope_max_pos)
				return -EINVAL;
			int fl = row_flags(&st->seqs[i], j);
			F->n_logits += !!(fl & BACKEND_ROW_LOGITS);
			F->n_hidden += !!(fl & BACKEND_ROW_HIDDEN);
			F->n_keep += !!(fl & BACKEND_ROW_KEEP);
			/* (validated: all or none of an MTP step's sequences give h_i) */
			F->mtp_kept |= st->mtp && !st->seqs[i].mtp_hidden;
		}
	/* block-table columns and the selection width rounded up to powers of two, so a captured
	 * decode graph serves many steps (scores past a row's keys are -inf, lists -1 padded); the
	 * batch-invariant mode always selects index_topk wide (the attention's work per row then
	 * never depends on the step's longest row) */
	int64_t mb = 1, ks = 1;
	while (mb < maxp / KV_PAGE_TOKENS + 1)
		mb *= 2;
	while (ks < maxp + 1)
		ks *= 2;
	F->mb = (int)mb;
	F->max_n = (int)(maxp + 1);
	F->ksel = (int)(ks < c->index_topk && !E->batch_invariant ? ks : c->index_topk);
	int64_t D = c->hidden_size;
	/* pinned layout: tok, pos, slot, nkeys [T]; bt [T, mb]; lrows, hrows, krows; then bf16
	 * inputs */
	size_t o_tok = 0, o_pos = al256(T * 4), o_slot = o_pos + al256(T * 4);
	size_t o_nk = o_slot + al256(T * 4), o_bt = o_nk + al256(T * 4);
	size_t o_lr = o_bt + al256((size_t)T * F->mb * 4), o_hr = o_lr + al256((size_t)F->n_logits * 4 + 4);
	size_t o_kr = o_hr + al256((size_t)F->n_hidden * 4 + 4), o_up = o_kr + al256((size_t)T * 4);
	size_t up_bytes = al256((size_t)T * D * 2);
	int n_up = st->mtp ? !F->mtp_kept : (in0 ? 1 : 0) + (in1 ? 1 : 0);
	size_t total = o_up + (size_t)n_up * up_bytes;
	if (*E->pinned_bytes < total) {
		gpu_host_free(*E->pinned);
		*E->pinned_bytes = 0;
		if (!(*E->pinned = gpu_host_alloc(total)))
			return -ENOMEM;
		*E->pinned_bytes = total;
	}
	uint8_t *h = *E->pinned;
	int32_t *tok = (int32_t *)(h + o_tok), *pos = (int32_t *)(h + o_pos);
	int32_t *slot = (int32_t *)(h + o_slot), *nk = (int32_t *)(h + o_nk);
	int32_t *bt = (int32_t *)(h + o_bt), *lr = (int32_t *)(h + o_lr), *hr = (int32_t *)(h + o_hr);
	int32_t *kr = (int32_t *)(h + o_kr);
	uint16_t *up = (uint16_t *)(h + o_up);
	int nl = 0, nh = 0, nkeep = 0;
	for (int64_t i = 0, t = 0; i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		for (int64_t j = 0; j < s->n; j++, t++) {
			int64_t p = s->pos[j];
			tok[t] = s->tokens[j];
			pos[t] = (int32_t)p;
			slot[t] = s->block_table[p / KV_PAGE_TOKENS] * KV_PAGE_TOKENS + (int32_t)(p % KV_PAGE_TOKENS);
			nk[t] = (int32_t)(p + 1);
			for (int b = 0; b < F->mb; b++)
				bt[t * F->mb + b] = b < s->n_blocks ? s->block_table[b] : 0;
			int fl = row_flags(s, j);
			if (fl & BACKEND_ROW_LOGITS)
				lr[nl++] = (int32_t)t;
			if (fl & BACKEND_ROW_HIDDEN)
				hr[nh++] = (int32_t)t;
			if (fl & BACKEND_ROW_KEEP)
				kr[nkeep++] = (int32_t)t;
			if (F->mtp_kept)
				kr[t] = (int32_t)(s->mtp_kept + j);
			else if (st->mtp)
				for (int64_t d = 0; d < D; d++)
					up[t * D + d] = f32_to_bf16(s->mtp_hidden[j * D + d]);
		}
	}
	for (int k = 0, u = 0; k < 2 && !st->mtp; k++) {
		const float *in = k ? in1 : in0;
		if (!in)
			continue;
		uint16_t *dst = (uint16_t *)((uint8_t *)up + (size_t)u++ * up_bytes);
		for (int64_t i = 0; i < T * D; i++)
			dst[i] = f32_to_bf16(in[i]);
	}
	F->meta_bytes = total, F->o_pos = o_pos, F->o_slot = o_slot, F->o_nk = o_nk, F->o_bt = o_bt;
	F->o_lr = o_lr, F->o_hr = o_hr, F->o_kr = o_kr, F->o_up = o_up, F->up_bytes = up_bytes;
	return 0;
}

int cuda_forward_prepare(struct gpu *g)
{
	/* the shared-memory limit of the few-row product kernels (head_mma in the fast mode,
	 * lin_stream in the invariant one; a function attribute, set outside any capture: once
	 * here, no longer at every step) */
	static const char *const more[] = {"k_fwd_lin_stream", "k_fwd_uv1_qh", "k_fwd_q_absorb1h"};
	for (int v = 0; v < 6; v++) {
		void *fn;
		if (gpu_kernel_smem(g, v < 3 ? fwd_head_mma_names[v] : more[v - 3], &fn))
			return -EIO;
	}
	return 0;
}

/* The step's one metadata upload (pinned -> device, on the stream: a node of a captured graph). */
static int fwd_upload(struct fwd *F)
{
	TAKE(dev, F->meta_bytes);
	if (!fwd_skipped(F, "metadata_upload") &&
	    cu_check(cu.cuMemcpyHtoDAsync(dev, *F->E->pinned, F->meta_bytes, F->g->stream),
		     "cuMemcpyHtoDAsync", __FILE__, __LINE__))
		return -EIO;
	F->tok = dev, F->pos = dev + F->o_pos, F->slot = dev + F->o_slot, F->nkeys = dev + F->o_nk;
	F->bt = dev + F->o_bt, F->lrows = dev + F->o_lr, F->hrows = dev + F->o_hr;
	F->krows = dev + F->o_kr;
	F->up[0] = dev + F->o_up, F->up[1] = dev + F->o_up + F->up_bytes;
	return 0;
}

static void fwd_end(struct fwd *F)
{
	free(F->pos_h);
	free(F->seq_h);
}

/* ---- the step ---------------------------------------------------------------------------------- */

/* Downloads rows idx (device int32 [n]) of src bf16 [T, D] as floats into dst [n, D]. */
static int gather_download(struct fwd *F, gpu_ptr src, gpu_ptr idx, int n, int D, float *dst)
{
	size_t mark = gpu_arena_mark(F->A);
	TAKE(g, (size_t)n * D * 2);
	LAUNCH("k_moe_gather", n, 1, 256, 0, &src, &idx, &g, &D);
	uint16_t *h = malloc((size_t)n * D * 2);
	if (!h)
		return -ENOMEM;
	int r = gpu_download(F->g, h, g, (size_t)n * D * 2);
	for (size_t i = 0; !r && i < (size_t)n * D; i++)
		dst[i] = bf16_to_f32(h[i]);
	free(h);
	gpu_arena_release(F->A, mark);
	return r;
}

/* n bytes from src to dst on the engine stream (either may be on another GPU: a pipeline
 * stage's rows); capturable. 0 or -EIO. */
static int fwd_copy(struct fwd *F, gpu_ptr dst, gpu_ptr src, size_t n)
{
	return cu_check(cu.cuMemcpyDtoDAsync(dst, src, n, F->g->stream), "cuMemcpyDtoDAsync",
			__FILE__, __LINE__)
		       ? -EIO
		       : 0;
}

/* Everything of a step on the device, up to the final normed rows (*out, and r = the MTP
 * block's output) and the logits of the flagged rows (*l32: fp32 [n_logits, V], 0 if none).
 * No synchronisation unless dumping: this is what a decode graph captures. */
static int step_device(struct fwd *F, gpu_ptr *out_p, gpu_ptr *r_p, gpu_ptr *l32_p)
{
	const struct dsv32_config *c = F->c;
	const struct fwd_model *m = F->m;
	const struct backend_step *st = F->st;
	int T = F->T, D = (int)c->hidden_size, V = (int)c->vocab_size;
	int64_t Lm = c->num_hidden_layers;
	TRY(fwd_upload(F));
	fwd_prof_mark(F->g->stream, "metadata upload");
	TAKE(x, (size_t)F->Tp * D * 2); /* bf16 [Tp, D] layer input / output */
	TAKE(r, (size_t)F->Tp * D * 2); /* bf16 [Tp, D] residual stream */
	gpu_ptr norm, head;
	if (!st->mtp) {
		/* the embedding inside the first norm's launch (fwd_layer), unless dumped or unfused;
		 * a later pipeline stage starts from the rows the stage before it left */
		const int embed = m->l0 == 0 && (st->dump || !fwd_fused(F));
		const size_t off = (size_t)F->row_off * D * 2, rows = (size_t)T * D * 2;
		if (m->l0 > 0) {
			TRY(fwd_copy(F, x, m->in_x + off, rows));
			TRY(fwd_copy(F, r, m->in_r + off, rows));
		}
		if (embed) {
			gpu_ptr emb = m->embed;
			LAUNCH("k_embed", T, 1, 256, 0, &emb, &F->tok, &x, &D);
			TRY(fwd_dump_all(F, "embed", -1, x, DUMP_BF16, D, D));
		}
		for (int64_t l = m->l0; l < m->l1; l++)
			TRY(fwd_layer(F, l, &m->layers[l], x, r,
				      l ? 0 : embed ? FWD_FIRST : FWD_FIRST_EMBED));
		if (m->l1 < Lm) { /* an earlier stage: its rows to the next, no outputs */
			TRY(fwd_copy(F, m->out_x + off, x, rows));
			TRY(fwd_copy(F, m->out_r + off, r, rows));
			*out_p = *r_p = *l32_p = 0;
			return fwd_side_close(F);
		}
		norm = m->norm, head = m->lm_head;
	} else {
		/* MTP input (§4): x = eh_proj([enorm(embed(x_{i+1})) ; hnorm(h_i)]) */
		TAKE(e, (size_t)F->Tp * D * 2);
		TAKE(cat, (size_t)F->Tp * 2 * D * 2); /* bf16 [Tp, 2D] */
		gpu_ptr emb = m->mtp_embed, h = F->up[0]; /* h_i uploaded, or gathered from the kept rows */
		if (F->mtp_kept) {
			gpu_ptr kept = F->E->kept->p;
			h = fwd_take(F, (size_t)F->Tp * D * 2);
			if (!h)
				return -ENOMEM;
			LAUNCH("k_moe_gather", T, 1, 256, 0, &kept, &F->krows, &h, &D);
		}
		LAUNCH("k_embed", T, 1, 256, 0, &emb, &F->tok, &e, &D);
		TRY(fwd_rms(F, e, D, 0, m->enorm, cat, 2 * D, D));
		TRY(fwd_rms(F, h, D, 0, m->hnorm, cat + (size_t)D * 2, 2 * D, D));
		TRY(fwd_dump_all(F, "mtp_cat", Lm, cat, DUMP_BF16, 2 * D, 2 * D));
		TRY_TAG("eh_proj", fwd_lin(F, m->eh_proj, cat, 2 * D, 0, x, D, T, 2 * D, D));
		TRY(fwd_dump_all(F, "mtp_eh_proj", Lm, x, DUMP_BF16, D, D));
		TRY(fwd_layer(F, Lm, &m->layers[Lm], x, r, FWD_FIRST));
		norm = m->head_norm, head = m->mtp_head;
	}
	/* final norm of the fp32 sum x + r: out = RMSNorm, r = bf16(x + r) (the MTP block's output) */
	TAKE(out, (size_t)F->Tp * D * 2);
	TRY(fwd_rms(F, x, D, r, norm, out, D, D));
	TRY(fwd_dump_all(F, "result_norm", st->mtp ? Lm : -1, out, DUMP_BF16, D, D));
	if (F->n_keep) { /* the KEEP rows into the kept rows, after the earlier passes' */
		gpu_ptr kd = F->E->kept->p + (size_t)F->keep_off * D * 2;
		LAUNCH("k_moe_gather", F->n_keep, 1, 256, 0, &out, &F->krows, &kd, &D);
	}
	*out_p = out, *r_p = r, *l32_p = 0;
	if (F->n_logits) {
		int nl = F->n_logits;
		gpu_ptr hr = out; /* every row asks for logits (decode): they are in order already */
		if (nl < T) {
			hr = fwd_take(F, (size_t)nl * D * 2);
			if (!hr)
				return -ENOMEM;
			LAUNCH("k_moe_gather", nl, 1, 256, 0, &out, &F->lrows, &hr, &D);
		}
		TAKE(l32, (size_t)nl * V * 4);
		TRY_TAG("lm head", fwd_lin(F, head, hr, D, l32, 0, V, nl, D, V));
		*l32_p = l32;
	}
	return fwd_side_close(F);
}

/* The step's outputs to the callers' buffers, in row order: the logits (downloaded from l32)
 * and the hidden rows (gathered from out, or r for MTP). Waits for the step. */
static int step_finish(struct fwd *F, gpu_ptr out, gpu_ptr r, gpu_ptr l32)
{
	const struct backend_step *st = F->st;
	int D = (int)F->c->hidden_size, V = (int)F->c->vocab_size;
	float *hid = NULL;
	int rc = 0;
	if (F->n_hidden) {
		hid = malloc((size_t)F->n_hidden * D * sizeof *hid);
		rc = hid ? gather_download(F, st->mtp ? r : out, F->hrows, F->n_hidden, D, hid) : -ENOMEM;
	}
	/* the drawn sequences' tokens (backend_step_draw): the sampler on their rows of l32, only
	 * the draws downloaded (model/cuda_step_sample.h); one LOGITS row each */
	int n_draw = F->E->draw && !rc ? cuda_step_sample_launch(F->g, F->E->smp, st, F->E->draw,
								 l32, V)
				       : 0;
	if (n_draw < 0)
		rc = n_draw, n_draw = 0;
	/* Pinned callers' buffers (the backend's host memory): straight in (run 14 / 15, bench
	 * model --pinned-logits with DSV32_CUDA_LOGITS_STAGED=0, batch 1 / 16 at 1K: 1.498 / 5.064
	 * ms). Pageable ones: every row into the pinned staging buffer in one copy, then host copies
	 * into the sequences' buffers, instead of the driver staging each pageable copy itself (run
	 * 14: 1.539 / 5.830 against 1.584 / 6.082). DSV32_CUDA_LOGITS_STAGED=1 / 0 forces either. */
	const int staged = F->E->sw->staged < 0 ? !logits_pinned(F) : F->E->sw->staged;
	const int down = F->n_logits > n_draw && !fwd_skipped(F, "logits_download"); /* (timing only) */
	float *stage = NULL;
	if (staged && down && !rc) {
		size_t need = (size_t)F->n_logits * V * 4;
		if (*F->E->plog_bytes < need) {
			gpu_host_free(*F->E->plog);
			*F->E->plog_bytes = (*F->E->plog = gpu_host_alloc(need)) ? need : 0;
		}
		if (*F->E->plog_bytes >= need) {
			stage = *F->E->plog;
			if (cu_check(cu.cuMemcpyDtoHAsync(stage, l32, need, F->g->stream),
				     "cuMemcpyDtoHAsync", __FILE__, __LINE__))
				rc = -EIO;
		}
	}
	/* the logits straight into each sequence's buffer: its flagged rows are consecutive rows
	 * of l32 (row order), and its buffer holds them in that order (was: a fresh host buffer
	 * for all and a copy per row; run 9: ~55 ms of a 69 ms batch-128 step, page faults and
	 * copies of 66 MB) */
	for (int64_t i = 0, kl = 0; !rc && !stage && down && i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		int64_t nl = 0;
		for (int64_t j = 0; j < s->n; j++)
			nl += !!(row_flags(s, j) & BACKEND_ROW_LOGITS);
		const int drawn = F->E->draw && F->E->draw[i];
		if (nl && !drawn && cu_check(cu.cuMemcpyDtoHAsync(s->logits, l32 + (size_t)kl * V * 4,
							(size_t)nl * V * 4, F->g->stream),
				   "cuMemcpyDtoHAsync", __FILE__, __LINE__))
			rc = -EIO;
		kl += nl;
	}
	fwd_prof_mark(F->g->stream, "logits download");
	if (!rc && (F->n_logits || !F->n_hidden))
		rc = gpu_sync(F->g); /* the step (and its downloads) complete when it returns */
	for (int64_t i = 0, kl = 0; !rc && stage && i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		int64_t nl = 0;
		for (int64_t j = 0; j < s->n; j++)
			nl += !!(row_flags(s, j) & BACKEND_ROW_LOGITS);
		if (nl && !(F->E->draw && F->E->draw[i]))
			memcpy(s->logits, stage + (size_t)kl * V, (size_t)nl * V * 4);
		kl += nl;
	}
	if (n_draw && !rc)
		cuda_step_sample_finish(F->E->smp, st, F->E->draw);
	for (int64_t i = 0, kh = 0; !rc && F->n_hidden && i < st->n_seqs; i++) {
		const struct backend_seq *s = &st->seqs[i];
		int64_t nh = 0;
		for (int64_t j = 0; j < s->n; j++)
			if (row_flags(s, j) & BACKEND_ROW_HIDDEN)
				memcpy(s->hidden + nh++ * D, hid + kh++ * D, (size_t)D * sizeof *hid);
	}
	free(hid);
	return rc;
}

/* ---- decode graphs ------------------------------------------------------------------------------ */

/* A captured step: valid for every step with the same shape (rows, block-table columns,
 * selection width, whether scores run, logits rows, hidden rows, main or MTP, kept rows written
 * or read and where) and mode, the same pinned staging buffer and the same arena top (its
 * scratch addresses are baked in). A replay keeps the capture's scratch taken until the step
 * ends (end): step_finish's gathers take scratch above it, not over the metadata and rows the
 * graph wrote. */
struct fwd_graph {
	int T, mb, ksel, need, nl, nh, mtp, nk, mk, inv;
	gpu_ptr kept; /* the kept rows' address where the step writes or reads them */
	unsigned sw; /* the switches' generation (fwd_switches.gen) */
	void *pinned;
	size_t top, end;
	CUgraphExec exec;
	gpu_ptr out, r, l32, hrows; /* hrows: the uploaded hidden-row list (step_finish's gather) */
	unsigned long long used;
};

struct fwd_graphs {
	struct fwd_graph g[FWD_MAX_GRAPHS];
	int n;
	unsigned long long clock;
	int off;                  /* capture failed once: eager from then on */
	int64_t captures, replays;
};

struct fwd_graphs *cuda_forward_graphs_new(void)
{
	return calloc(1, sizeof(struct fwd_graphs));
}

void cuda_forward_graphs_free(struct fwd_graphs *G)
{
	if (!G)
		return;
	for (int i = 0; i < G->n; i++)
		cu.cuGraphExecDestroy(G->g[i].exec);
	free(G);
}

void cuda_forward_graphs_stats(const struct fwd_graphs *G, int64_t *captures, int64_t *replays)
{
	*captures = G ? G->captures : 0;
	*replays = G ? G->replays : 0;
}

/* Replays the step's graph, capturing it first if none fits: *ran = 1 and the outputs at *out,
 * *r, *l32; *ran = 0 when the step is not eligible or its capture failed (the caller runs it
 * eagerly). 0 or a negative errno. */
static int step_graph(struct fwd *F, int *ran, gpu_ptr *out, gpu_ptr *r, gpu_ptr *l32)
{
	struct fwd_graphs *G = F->E->graphs;
	const struct backend_step *st = F->st;
	*ran = 0;
	if (!G || G->off || st->dump || F->T > FWD_GRAPH_MAX_ROWS || F->keep_off || F->row_off)
		return 0;
	int need = F->max_n > F->c->index_topk;
	gpu_ptr kept = F->n_keep || F->mtp_kept ? F->E->kept->p : 0;
	size_t top = F->A->top;
	struct fwd_graph *hit = NULL;
	for (int i = 0; i < G->n && !hit; i++) {
		struct fwd_graph *x = &G->g[i];
		if (x->T == F->T && x->mb == F->mb && x->ksel == F->ksel && x->need == need &&
		    x->nl == F->n_logits && x->nh == F->n_hidden && x->mtp == !!st->mtp &&
		    x->nk == F->n_keep && x->mk == F->mtp_kept && x->kept == kept &&
		    x->inv == F->E->batch_invariant &&
		    x->sw == F->E->sw->gen &&
		    x->pinned == *F->E->pinned && x->top == top)
			hit = x;
	}
	if (!hit) {
		if (G->n == FWD_MAX_GRAPHS) { /* evict the least recently used */
			int lru = 0;
			for (int i = 1; i < G->n; i++)
				if (G->g[i].used < G->g[lru].used)
					lru = i;
			cu.cuGraphExecDestroy(G->g[lru].exec);
			G->g[lru] = G->g[--G->n];
		}
		CUgraph graph = NULL;
		CUgraphExec exec = NULL;
		struct fwd_graph x = {F->T, F->mb, F->ksel, need, F->n_logits, F->n_hidden,
				      !!st->mtp, F->n_keep, F->mtp_kept, F->E->batch_invariant, kept,
				      F->E->sw->gen, *F->E->pinned, top, 0, NULL, 0, 0, 0, 0, 0};
		if (cu_check(cu.cuStreamBeginCapture(F->g->stream, CU_STREAM_CAPTURE_MODE_RELAXED),
			     "cuStreamBeginCapture", __FILE__, __LINE__)) {
			G->off = 1;
			return 0;
		}
		int rc = step_device(F, &x.out, &x.r, &x.l32);
		x.end = F->A->top, x.hrows = F->hrows;
		CUresult er = cu.cuStreamEndCapture(F->g->stream, &graph);
		if (!rc && er == CUDA_SUCCESS)
			er = cu.cuGraphInstantiateWithFlags(&exec, graph, 0);
		if (graph)
			cu.cuGraphDestroy(graph);
		if (rc || er != CUDA_SUCCESS) {
			gpu_arena_release(F->A, top);
			fprintf(stderr, "<4>dsv32: cuda forward: decode graph capture failed (%d, CUresult "
					"%d): steps run eagerly from now on\n", rc, (int)er);
			if (exec)
				cu.cuGraphExecDestroy(exec);
			G->off = 1;
			return 0;
		}
		x.exec = exec;
		G->g[G->n] = x;
		hit = &G->g[G->n++];
		G->captures++;
	} else {
		G->replays++;
	}
	hit->used = ++G->clock;
	if (cu_check(cu.cuGraphLaunch(hit->exec, F->g->stream), "cuGraphLaunch", __FILE__, __LINE__))
		return -EIO;
	*out = hit->out, *r = hit->r, *l32 = hit->l32;
	F->hrows = hit->hrows;
	F->A->top = hit->end; /* the replay's scratch stays taken until the step ends */
	*ran = 1;
	return 0;
}

/* Rows one pass can hold in the arena: the scratch of one layer per row (the largest buffers
 * live at once in fwd_layer and its FFN), the step's own per-row buffers and a fixed part (GEMM
 * and attention workspaces, the indexer scores), with a quarter of margin. */
static int64_t fwd_max_rows(const struct fwd_env *E)
{
	const struct dsv32_config *c = E->c;
	int64_t D = c->hidden_size, H = c->num_attention_heads, Hpad = (H + 15) / 16 * 16;
	int64_t Rk = c->kv_lora_rank, rope = c->qk_rope_head_dim, qlr = c->q_lora_rank;
	int64_t Hi = c->index_n_heads, dv = c->v_head_dim, Nq = qlr + 128 + Rk + rope;
	size_t row = (size_t)(5 * D + 3 * Nq + 4 * qlr + 2 * Rk + 2 * H * c->qk_head_dim +
			      3 * Hi * 128 + 8 * Hi + 512 + 8 * c->index_topk +
			      2 * Hpad * (Rk + rope) + 2 * Hpad * Rk + 3 * H * dv + 4 * D);
	size_t ffn = (size_t)(3 * D + 8 * c->intermediate_size);
	if (c->n_routed_experts) {
		size_t moe = cuda_moe_scratch_bytes(E->g, c, 1024) / 1024 + 1;
		ffn = moe > ffn ? moe : ffn;
	}
	row += ffn + (size_t)6 * D + 64 + 4 * 2048; /* x, r, out; metadata incl. a 128K block table */
	if (E->sw->max_rows > 0) /* tests: force passes on small models */
		return E->sw->max_rows;
	size_t fixed = SCORES_BUDGET + ((size_t)128 << 20);
	size_t have = E->arena->region.reserved - E->arena->top;
	if (have <= fixed)
		return 1;
	int64_t n = (int64_t)((have - fixed) / (row + row / 4));
	return n < 1 ? 1 : n > 65535 ? 65535 : n;
}

/* After a failed step: both streams idle (a branch may have been issued on the side stream). */
static void fwd_sync_all(const struct fwd_env *E)
{
	gpu_sync(E->g);
	if (E->side)
		cu.cuStreamSynchronize(E->side);
}

static int step_pass(const struct fwd_env *E, const struct backend_step *st, int64_t keep_off,
		     int64_t row_off)
{
	struct fwd F;
	size_t mark = gpu_arena_mark(E->arena);
	int r = fwd_begin(&F, E, st, NULL, NULL);
	F.keep_off = keep_off, F.row_off = row_off;
	if (!r && F.T) {
		gpu_ptr out = 0, res = 0, l32 = 0;
		int graphed = 0;
		r = step_graph(&F, &graphed, &out, &res, &l32);
		if (!r && !graphed) { /* eagerly */
			prof.on = E->sw->profile && !st->dump;
			if (prof.on) { /* the GPU waits while the host enqueues the step (k_fwd_spin) */
				long long ns = PROF_SPIN_NS;
				void *a[] = {&ns};
				r = gpu_launch(E->g, gpu_kernel(E->g, "k_fwd_spin"), 1, 1, 1, 32, 1, 1, 0, a);
			}
			fwd_prof_mark(E->g->stream, "step start");
			if (!r)
				r = step_device(&F, &out, &res, &l32);
		}
		if (!r)
			r = step_finish(&F, out, res, l32);
		prof_step_end(); /* (the eager profiled steps: the download is its last op) */
		prof.on = 0;
	}
	if (r) /* nothing of this step may still run when the arena is reused */
		fwd_sync_all(E);
	gpu_arena_release(E->arena, mark);
	fwd_end(&F);
	return r;
}

/* A step larger than the arena holds runs as consecutive passes over its rows in order (up to
 * max rows of the step's row order each; fewer where a verification's drawn rows would be
 * split), each a complete step of its own:
 * a sequence's rows are in position order, so every row still finds the keys of the rows
 * before it in the cache, as in chunked prefill. Sequence indices are kept (sequences with no
 * rows in a pass have n = 0), so dumps name the same sequences. */
static int step_passes(const struct fwd_env *E, const struct backend_step *st)
{
	int64_t T = 0, max = fwd_max_rows(E);
	for (int64_t i = 0; i < st->n_seqs; i++)
		T += st->seqs[i].n;
	if (T <= max)
		return step_pass(E, st, 0, 0);
	const struct dsv32_config *c = E->c;
	int64_t n = st->n_seqs, V = c->vocab_size, D = c->hidden_size, kept = 0;
	struct backend_seq *sub = calloc((size_t)n, sizeof *sub);
	uint8_t **fl = calloc((size_t)n, sizeof *fl);
	int64_t *done_l = calloc((size_t)n, sizeof *done_l), *done_h = calloc((size_t)n, sizeof *done_h);
	int r = sub && fl && done_l && done_h ? 0 : -ENOMEM;
	for (int64_t i = 0; i < n && !r; i++) { /* explicit flags (NULL means "the last row") */
		const struct backend_seq *s = &st->seqs[i];
		fl[i] = malloc((size_t)(s->n ? s->n : 1));
		if (!fl[i]) {
			r = -ENOMEM;
			break;
		}
		for (int64_t j = 0; j < s->n; j++)
			fl[i][j] = s->flags ? s->flags[j] : (j == s->n - 1 ? BACKEND_ROW_LOGITS : 0);
	}
	for (int64_t t0 = 0, t1; t0 < T && !r; t0 = t1) {
		t1 = t0 + max < T ? t0 + max : T;
		/* a verification's drawn rows stay in one pass (their draws are made together): a
		 * boundary after its first LOGITS row and before its last moves before the first */
		for (int64_t i = 0, base = 0; i < n && t1 < T && E->draw; base += st->seqs[i++].n) {
			if (t1 <= base || t1 >= base + st->seqs[i].n || !E->draw[i] || !E->draw[i]->row2)
				continue;
			const int64_t chain = backend_sample_chain(E->draw[i], st->seqs[i].n);
			int64_t first = -1, before = 0;
			for (int64_t j = 0; j < t1 - base; j++)
				if (fl[i][j] & BACKEND_ROW_LOGITS)
					before++, first = first < 0 ? base + j : first;
			if (before > 0 && before < chain && first > t0)
				t1 = first;
			else if (before > 0 && before < chain)
				r = -E2BIG; /* (passes shorter than the chain: DSV32_CUDA_MAX_ROWS) */
		}
		int64_t base = 0, keep_off = kept; /* sequence i's first row; rows kept before */
		for (int64_t i = 0; i < n && !r; i++) {
			const struct backend_seq *s = &st->seqs[i];
			int64_t a = t0 - base, b = t1 - base;
			a = a < 0 ? 0 : a > s->n ? s->n : a;
			b = b < 0 ? 0 : b > s->n ? s->n : b;
			sub[i] = *s;
			sub[i].n = b - a;
			sub[i].tokens = s->tokens + a;
			sub[i].pos = s->pos + a;
			sub[i].flags = fl[i] + a;
			sub[i].logits = s->logits ? s->logits + done_l[i] * V : NULL;
			sub[i].hidden = s->hidden ? s->hidden + done_h[i] * D : NULL;
			sub[i].mtp_hidden = s->mtp_hidden ? s->mtp_hidden + a * D : NULL;
			sub[i].mtp_kept = s->mtp_kept + a; /* (kept h_i: row j's is mtp_kept + j) */
			for (int64_t j = a; j < b; j++) {
				done_l[i] += !!(fl[i][j] & BACKEND_ROW_LOGITS);
				done_h[i] += !!(fl[i][j] & BACKEND_ROW_HIDDEN);
				kept += !!(fl[i][j] & BACKEND_ROW_KEEP);
			}
			base += s->n;
		}
		struct backend_step part = *st;
		part.seqs = sub;
		if (!r)
			r = step_pass(E, &part, keep_off, t0);
	}
	for (int64_t i = 0; fl && i < n; i++)
		free(fl[i]);
	free(fl), free(sub), free(done_l), free(done_h);
	return r;
}

/* The kept rows (backend.h): a main step drops the previous ones and takes room for its own
 * KEEP rows at the arena's top, below its scratch, where they stay until the next main step
 * (so an MTP step's scratch lies above them); a failed main step keeps none. An MTP step reads
 * them (its range checked here). */
int cuda_forward_step(const struct fwd_env *E, const struct backend_step *st)
{
	struct fwd_kept *K = E->kept;
	if (E->m->l1 < E->c->num_hidden_layers) { /* an earlier pipeline stage: rows, no outputs */
		for (int64_t i = 0; i < st->n_seqs; i++)
			for (int64_t j = 0; j < st->seqs[i].n; j++)
				if (row_flags(&st->seqs[i], j))
					return -EINVAL;
		if (st->mtp || E->draw)
			return -EINVAL;
	}
	if (st->mtp)
		return !E->m->has_mtp || !backend_kept_ok(st, K->n) ? -EINVAL : step_passes(E, st);
	if (K->n)
		gpu_arena_release(E->arena, K->mark);
	K->n = 0, K->p = 0;
	int64_t nk = 0;
	for (int64_t i = 0; i < st->n_seqs; i++)
		for (int64_t j = 0; j < st->seqs[i].n; j++)
			nk += !!(row_flags(&st->seqs[i], j) & BACKEND_ROW_KEEP);
	if (nk) {
		K->mark = gpu_arena_mark(E->arena);
		K->p = gpu_arena_push(E->arena, (size_t)nk * (size_t)E->c->hidden_size * 2);
		if (!K->p)
			return -ENOMEM;
		K->n = nk;
	}
	int r = step_passes(E, st);
	if (r && K->n) {
		gpu_arena_release(E->arena, K->mark);
		K->n = 0, K->p = 0;
	}
	return r;
}

int cuda_forward_layer(const struct fwd_env *E, int64_t layer, const struct backend_step *st,
		       float *x, float *r)
{
	const struct dsv32_config *c = E->c;
	if (layer < 0 || layer > c->num_hidden_layers || st->mtp ||
	    (layer == c->num_hidden_layers && !E->m->has_mtp))
		return -EINVAL;
	struct fwd F;
	size_t mark = gpu_arena_mark(E->arena);
	int rc = fwd_begin(&F, E, st, x, r);
	if (!rc && F.T)
		rc = fwd_upload(&F);
	if (!rc && F.T) {
		int D = (int)c->hidden_size, T = F.T;
		int first = layer == 0 || layer == c->num_hidden_layers;
		gpu_ptr dx = fwd_take(&F, (size_t)F.Tp * D * 2), dr = fwd_take(&F, (size_t)F.Tp * D * 2);
		rc = !dx || !dr ? -ENOMEM : 0;
		if (!rc && !cu_check(cu.cuMemcpyDtoDAsync(dx, F.up[0], (size_t)T * D * 2, E->g->stream),
				     "cuMemcpyDtoDAsync", __FILE__, __LINE__) &&
		    !cu_check(cu.cuMemcpyDtoDAsync(dr, F.up[1], (size_t)T * D * 2, E->g->stream),
			      "cuMemcpyDtoDAsync", __FILE__, __LINE__))
			rc = fwd_layer(&F, layer, &E->m->layers[layer], dx, dr, first);
		else if (!rc)
			rc = -EIO;
		if (!rc)
			rc = fwd_side_close(&F);
		uint16_t *h = rc ? NULL : malloc((size_t)T * D * 2 * 2);
		if (!rc && !h)
			rc = -ENOMEM;
		if (!rc)
			rc = gpu_download(E->g, h, dx, (size_t)T * D * 2);
		if (!rc)
			rc = gpu_download(E->g, h + (size_t)T * D, dr, (size_t)T * D * 2);
		for (size_t i = 0; !rc && i < (size_t)T * D; i++) {
			x[i] = bf16_to_f32(h[i]);
			r[i] = bf16_to_f32(h[(size_t)T * D + i]);
		}
		free(h);
	}
	if (rc)
		fwd_sync_all(E);
	gpu_arena_release(E->arena, mark);
	fwd_end(&F);
	return rc;
}

#endif