/*
 * weights.c — binds every tensor of spec §7.2 by its HF name, with the dtype and shape the
 * config implies, to the pointers of struct weights (model/weights.h).
 *
 * Owns: the expected tensor list (names, dtypes, shapes computed from the config), the error
 * messages that print expected vs actual and the shard file, the fp32 copies of norm vectors
 * (BF16 or F32 in the checkpoint), and the check that every weight_scale_inv is finite and
 * positive (powers of two are expected and counted, not required).
 * Must not: compute, or copy large tensors: FP8 weights and bf16 matrices stay in the mapping.
 */
#include "model/weights.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/numerics.h"

/* What weights.owned points to. */
struct owned {
	void **p;
	size_t n, cap;
	struct weights_stats stats;
};

struct binder {
	const struct checkpoint *ck;
	struct owned *own;
	struct err *e;
	char name[256];
};

static void *own_alloc(struct binder *b, size_t size)
{
	struct owned *o = b->own;
	if (o->n == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 64;
		void **p = realloc(o->p, cap * sizeof *p);
		if (!p)
			return NULL;
		o->p = p, o->cap = cap;
	}
	void *q = calloc(1, size ? size : 1);
	if (q)
		o->p[o->n++] = q;
	return q;
}

static void fmt_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
	size_t n = (size_t)snprintf(buf, size, "[");
	for (int i = 0; i < ndim && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
	if (n < size)
		snprintf(buf + n, size - n, "]");
}

/* Looks up b->name and checks it is dt (or alt, if alt >= 0) with the given shape. */
static const struct st_tensor *want(struct binder *b, enum st_dtype dt, int alt, int ndim,
				    int64_t d0, int64_t d1, int *r)
{
	int64_t shape[2] = {d0, d1};
	char exp[64], got[200];
	fmt_shape(exp, sizeof exp, ndim, shape);
	const struct st_tensor *t = ckpt_find(b->ck, b->name);
	if (!t) {
		*r = err_set(b->e, -EINVAL, "tensor %s: missing from the checkpoint %s (expected %s%s%s %s)",
			     b->name, b->ck->dir, st_dtype_name(dt), alt >= 0 ? " or " : "",
			     alt >= 0 ? st_dtype_name((enum st_dtype)alt) : "", exp);
		return NULL;
	}
	int ok = (t->dtype == dt || (alt >= 0 && t->dtype == (enum st_dtype)alt)) && t->ndim == ndim;
	for (int i = 0; ok && i < ndim; i++)
		ok = t->shape[i] == shape[i];
	if (!ok) {
		fmt_shape(got, sizeof got, t->ndim, t->shape);
		*r = err_set(b->e, -EINVAL, "tensor %s: expected %s%s%s %s, got %s %s in %s", b->name,
			     st_dtype_name(dt), alt >= 0 ? " or " : "",
			     alt >= 0 ? st_dtype_name((enum st_dtype)alt) : "", exp,
			     st_dtype_name(t->dtype), got, b->ck->files[t->file].path);
		return NULL;
	}
	if ((uintptr_t)t->data % st_dtype_size(t->dtype)) {
		*r = err_set(b->e, -EINVAL, "tensor %s: data is not %zu-byte aligned in %s", b->name,
			     st_dtype_size(t->dtype), b->ck->files[t->file].path);
		return NULL;
	}
	b->own->stats.n_tensors++;
	*r = 0;
	return t;
}

__attribute__((format(printf, 2, 3))) static void set_name(struct binder *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->name, sizeof b->name, fmt, ap);
	va_end(ap);
}

/* PREFIX.weight (F8_E4M3 [out, in]) and PREFIX.weight_scale_inv (F32 [ceil(out/128),
 * ceil(in/128)]), every scale finite and positive. */
static int bind_fp8(struct binder *b, const char *prefix, int64_t out, int64_t in,
		    struct fp8_linear *l)
{
	int r;
	set_name(b, "%s.weight", prefix);
	const struct st_tensor *w = want(b, ST_F8_E4M3, -1, 2, out, in, &r);
	if (!w)
		return r;
	set_name(b, "%s.weight_scale_inv", prefix);
	int64_t so = (out + 127) / 128, si = (in + 127) / 128;
	const struct st_tensor *s = want(b, ST_F32, -1, 2, so, si, &r);
	if (!s)
		return r;
	const float *sc = s->data; /* [so, si] */
	for (int64_t i = 0; i < so * si; i++) {
		float v = sc[i];
		if (!(isfinite(v) && v > 0))
			return err_set(b->e, -EINVAL, "tensor %s: value %g at [%lld, %lld] is not a finite "
				       "positive scale in %s", b->name, (double)v, (long long)(i / si),
				       (long long)(i % si), b->ck->files[s->file].path);
		if (f32_bits(v) & 0x7fffffu)
			b->own->stats.n_scales_not_pow2++;
	}
	b->own->stats.n_scales += so * si;
	l->w = w->data;
	l->scale = sc;
	l->out = out;
	l->in = in;
	return 0;
}

static int bind_bf16(struct binder *b, const char *name, int64_t rows, int64_t cols,
		     struct bf16_mat *m)
{
	int r;
	set_name(b, "%s", name);
	const struct st_tensor *t = want(b, ST_BF16, -1, 2, rows, cols, &r);
	if (!t)
		return r;
	m->w = t->data;
	m->rows = rows;
	m->cols = cols;
	return 0;
}

/* A vector [n] held as BF16 or F32 (or F32 only if f32_only), copied to owned fp32. */
static int bind_vec(struct binder *b, const char *name, int64_t n, int f32_only, float **out)
{
	int r;
	set_name(b, "%s", name);
	const struct st_tensor *t = want(b, ST_F32, f32_only ? -1 : ST_BF16, 1, n, 0, &r);
	if (!t)
		return r;
	float *v = own_alloc(b, (size_t)n * sizeof *v);
	if (!v)
		return err_set(b->e, -ENOMEM, "tensor %s: out of memory", name);
	if (t->dtype == ST_F32)
		memcpy(v, t->data, (size_t)n * sizeof *v);
	else
		for (int64_t i = 0; i < n; i++)
			v[i] = bf16_to_f32(((const uint16_t *)t->data)[i]);
	*out = v;
	return 0;
}

/* One decoder block: checkpoint layer L (the MTP block is L = num_hidden_layers). */
static int bind_layer(struct binder *b, const struct dsv32_config *c, int64_t L,
		      struct layer_weights *lw)
{
	const int64_t H = c->hidden_size, heads = c->num_attention_heads;
	char p[160], n[224];
	int r;
	memset(lw, 0, sizeof *lw);
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%lld.%s", (long long)L, suffix), n)
#define PFX(suffix) (snprintf(p, sizeof p, "model.layers.%lld.%s", (long long)L, suffix), p)
	if ((r = bind_vec(b, NAME("input_layernorm.weight"), H, 0, &lw->attn_norm)) ||
	    (r = bind_vec(b, NAME("post_attention_layernorm.weight"), H, 0, &lw->ffn_norm)) ||
	    (r = bind_fp8(b, PFX("self_attn.q_a_proj"), c->q_lora_rank, H, &lw->wq_a)) ||
	    (r = bind_vec(b, NAME("self_attn.q_a_layernorm.weight"), c->q_lora_rank, 0, &lw->q_norm)) ||
	    (r = bind_fp8(b, PFX("self_attn.q_b_proj"), heads * c->qk_head_dim, c->q_lora_rank,
			  &lw->wq_b)) ||
	    (r = bind_fp8(b, PFX("self_attn.kv_a_proj_with_mqa"), c->kv_lora_rank + c->qk_rope_head_dim,
			  H, &lw->wkv_a)) ||
	    (r = bind_vec(b, NAME("self_attn.kv_a_layernorm.weight"), c->kv_lora_rank, 0,
			  &lw->kv_norm)) ||
	    (r = bind_fp8(b, PFX("self_attn.kv_b_proj"), heads * (c->qk_nope_head_dim + c->v_head_dim),
			  c->kv_lora_rank, &lw->wkv_b)) ||
	    (r = bind_fp8(b, PFX("self_attn.o_proj"), H, heads * c->v_head_dim, &lw->wo)))
		return r;
	/* lightning indexer */
	const int64_t ID = c->index_head_dim;
	if ((r = bind_fp8(b, PFX("self_attn.indexer.wq_b"), c->index_n_heads * ID, c->q_lora_rank,
			  &lw->idx_wq_b)) ||
	    (r = bind_fp8(b, PFX("self_attn.indexer.wk"), ID, H, &lw->idx_wk)) ||
	    (r = bind_vec(b, NAME("self_attn.indexer.k_norm.weight"), ID, 0, &lw->idx_k_norm_w)) ||
	    (r = bind_vec(b, NAME("self_attn.indexer.k_norm.bias"), ID, 0, &lw->idx_k_norm_b)) ||
	    (r = bind_bf16(b, NAME("self_attn.indexer.weights_proj.weight"), c->index_n_heads, H,
			   &lw->idx_weights_proj)))
		return r;
	lw->is_moe = config_layer_is_moe(c, L);
	if (!lw->is_moe) {
		const int64_t I = c->intermediate_size;
		if ((r = bind_fp8(b, PFX("mlp.gate_proj"), I, H, &lw->w1)) ||
		    (r = bind_fp8(b, PFX("mlp.up_proj"), I, H, &lw->w3)) ||
		    (r = bind_fp8(b, PFX("mlp.down_proj"), H, I, &lw->w2)))
			return r;
		return 0;
	}
	const int64_t E = c->n_routed_experts, MI = c->moe_intermediate_size;
	if ((r = bind_bf16(b, NAME("mlp.gate.weight"), E, H, &lw->gate)) ||
	    (r = bind_vec(b, NAME("mlp.gate.e_score_correction_bias"), E, 1, &lw->gate_bias)))
		return r;
	lw->exp_w1 = own_alloc(b, (size_t)E * sizeof *lw->exp_w1);
	lw->exp_w3 = own_alloc(b, (size_t)E * sizeof *lw->exp_w3);
	lw->exp_w2 = own_alloc(b, (size_t)E * sizeof *lw->exp_w2);
	if (!lw->exp_w1 || !lw->exp_w3 || !lw->exp_w2)
		return err_set(b->e, -ENOMEM, "layer %lld: out of memory", (long long)L);
	for (int64_t j = 0; j < E; j++) {
		char q[200];
		snprintf(q, sizeof q, "model.layers.%lld.mlp.experts.%lld.", (long long)L, (long long)j);
		size_t qn = strlen(q);
		if ((r = bind_fp8(b, (snprintf(q + qn, sizeof q - qn, "gate_proj"), q), MI, H,
				  &lw->exp_w1[j])) ||
		    (r = bind_fp8(b, (snprintf(q + qn, sizeof q - qn, "up_proj"), q), MI, H,
				  &lw->exp_w3[j])) ||
		    (r = bind_fp8(b, (snprintf(q + qn, sizeof q - qn, "down_proj"), q), H, MI,
				  &lw->exp_w2[j])))
			return r;
	}
	if (c->n_shared_experts > 0) {
		const int64_t SI = MI * c->n_shared_experts;
		if ((r = bind_fp8(b, PFX("mlp.shared_experts.gate_proj"), SI, H, &lw->sh_w1)) ||
		    (r = bind_fp8(b, PFX("mlp.shared_experts.up_proj"), SI, H, &lw->sh_w3)) ||
		    (r = bind_fp8(b, PFX("mlp.shared_experts.down_proj"), H, SI, &lw->sh_w2)))
			return r;
	}
	return 0;
#undef NAME
#undef PFX
}

static int bind_mtp(struct binder *b, const struct dsv32_config *c, struct mtp_weights *m)
{
	const int64_t L = c->num_hidden_layers, H = c->hidden_size, V = c->vocab_size;
	char n[160];
	int r;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%lld.%s", (long long)L, suffix), n)
	if ((r = bind_bf16(b, NAME("embed_tokens.weight"), V, H, &m->embed)) ||
	    (r = bind_vec(b, NAME("enorm.weight"), H, 0, &m->enorm)) ||
	    (r = bind_vec(b, NAME("hnorm.weight"), H, 0, &m->hnorm)) ||
	    (r = bind_bf16(b, NAME("eh_proj.weight"), H, 2 * H, &m->eh_proj)) ||
	    (r = bind_vec(b, NAME("shared_head.norm.weight"), H, 0, &m->head_norm)) ||
	    (r = bind_bf16(b, NAME("shared_head.head.weight"), V, H, &m->head)))
		return r;
#undef NAME
	return bind_layer(b, c, L, &m->layer);
}

int weights_bind(struct weights *w, const struct dsv32_config *c, const struct checkpoint *ck,
		 struct err *e)
{
	memset(w, 0, sizeof *w);
	struct owned *o = calloc(1, sizeof *o);
	if (!o)
		return err_set(e, -ENOMEM, "out of memory");
	w->owned = o;
	struct binder b = {.ck = ck, .own = o, .e = e};
	int r;
	if ((r = bind_bf16(&b, "model.embed_tokens.weight", c->vocab_size, c->hidden_size,
			   &w->embed)) ||
	    (r = bind_vec(&b, "model.norm.weight", c->hidden_size, 0, &w->norm)) ||
	    (r = bind_bf16(&b, "lm_head.weight", c->vocab_size, c->hidden_size, &w->lm_head)))
		goto err;
	w->n_layers = c->num_hidden_layers;
	w->layers = own_alloc(&b, (size_t)w->n_layers * sizeof *w->layers);
	if (!w->layers) {
		r = err_set(e, -ENOMEM, "out of memory");
		goto err;
	}
	for (int64_t L = 0; L < w->n_layers; L++)
		if ((r = bind_layer(&b, c, L, &w->layers[L])))
			goto err;
	w->has_mtp = c->num_nextn_predict_layers > 0;
	if (w->has_mtp && (r = bind_mtp(&b, c, &w->mtp)))
		goto err;
	return 0;
err:
	weights_free(w);
	return r;
}

void weights_get_stats(const struct weights *w, struct weights_stats *s)
{
	const struct owned *o = w->owned;
	if (o)
		*s = o->stats;
	else
		memset(s, 0, sizeof *s);
}

void weights_free(struct weights *w)
{
	struct owned *o = w->owned;
	if (o) {
		for (size_t i = 0; i < o->n; i++)
			free(o->p[i]);
		free(o->p);
		free(o);
	}
	memset(w, 0, sizeof *w);
}
