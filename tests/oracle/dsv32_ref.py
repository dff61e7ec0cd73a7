"""dsv32_ref.py -- an independent PyTorch implementation of DeepSeek-V3.2's forward pass,
written from /work/shared/spec/dsv32-model.md (sections 3-6; [REF] semantics), used as the
oracle the C CPU backend is checked against (issue 4).

One function per op, named like the spec. Activations are fp32 tensors holding bf16 values
(rounded with `bf16()` at each op's output, as the spec's bf16 tensors are); norms, RoPE,
softmax, gate math and every accumulation run in fp32. FP8 uses torch.float8_e4m3fn for the
e4m3 rounding and fp32 bit operations for the UE8M0 scales (spec 5.3). The attention form is a
switch: "absorbed" (spec 3.7b, what the C backend uses for every token) or "naive" (3.7a).

The rounding points follow the spec; where the spec leaves a choice to the implementation
(fp32 scores/softmax, the absorbed form's bf16 q_lat and o_lat, routed experts summed in
ascending expert id then the shared expert), this file says so at the op.

Must not: depend on the C code, or on anything but torch, numpy and safetensors.
"""
import json
import math
import os

import numpy as np
import torch
from safetensors import safe_open

E4M3_MAX = 448.0
PAGE = 64  # KV page tokens (spec 6.3)


def setup_torch():
    """Exact fp32: no TF32 and no reduced-precision reductions anywhere."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---- number formats (spec 5.1, 5.3) -----------------------------------------------------------

def bf16(x):
    """fp32 -> nearest-even bf16 -> fp32."""
    return x.to(torch.bfloat16).to(torch.float32)


def e4m3(x):
    """fp32 (already clamped to +-448) -> e4m3 value as fp32 (round to nearest even)."""
    return x.to(torch.float8_e4m3fn).to(torch.float32)


def ue8m0_scale(amax):
    """2^ceil(log2(amax * (1/448))) on the fp32 bits: exponent field, +1 if any mantissa bit."""
    v = amax * torch.tensor(1.0 / 448.0, dtype=torch.float32, device=amax.device)
    bits = v.contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((e + 127) << 23).to(torch.int32).view(torch.float32)


def act_quant(x, group=128):
    """Per contiguous group of 128 along the last dim (spec 5.3): returns (x8 values as fp32,
    scales [..., n/128]). x8 * scale is the dequantised value."""
    n = x.shape[-1]
    assert n % group == 0, n
    g = x.reshape(*x.shape[:-1], n // group, group)
    amax = g.abs().amax(dim=-1).clamp(min=1e-4)
    s = ue8m0_scale(amax)
    q = e4m3((g / s.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX))
    return q.reshape(x.shape), s


def e4m3_codes(x8):
    """e4m3 values (fp32) -> uint8 codes."""
    return x8.to(torch.float8_e4m3fn).view(torch.uint8)


# ---- linears (spec 5.2, 5.4) ------------------------------------------------------------------

class FP8Weight:
    """An FP8 weight [out, in] with its 128x128 block scales (weight_scale_inv, multiplied)."""

    def __init__(self, w8, scale_inv):
        self.w = w8.to(torch.float32)        # e4m3 values, exact in fp32
        self.s = scale_inv.to(torch.float32)  # [ceil(out/128), ceil(in/128)]
        self.out, self.inp = self.w.shape

    def dequant(self):
        s = self.s.repeat_interleave(128, 0)[: self.out].repeat_interleave(128, 1)[:, : self.inp]
        return self.w * s


def fp8_linear(x, W):
    """y = bf16( sum_kb (x8_kb . W8_kb) * s_x[kb] * S[o/128, kb] ): each 128-block dot in fp32
    on the e4m3 values, promoted and summed over blocks in ascending kb (spec 5.4)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    xq, sx = act_quant(x2)
    nkb = W.inp // 128
    assert W.inp % 128 == 0
    S = W.s.repeat_interleave(128, 0)[: W.out]  # [out, nkb]
    y = torch.zeros(x2.shape[0], W.out, dtype=torch.float32, device=x.device)
    for kb in range(nkb):
        blk = slice(kb * 128, (kb + 1) * 128)
        d = xq[:, blk] @ W.w[:, blk].T
        y = y + d * (sx[:, kb : kb + 1] * S[:, kb].unsqueeze(0))
    return bf16(y).reshape(*lead, W.out)


def linear_fp32(x, w):
    """bf16 weight, fp32 inputs and accumulation, fp32 out (router, weights_proj, lm_head)."""
    return x @ w.T


# ---- norms (spec 3.2, 3.6.3) ------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """bf16( w * x / sqrt(mean(x^2) + eps) ), fp32 math on the fp32 input."""
    inv = 1.0 / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return bf16(w * (x * inv))


def layernorm(x, w, b, eps):
    """Mean-subtracted, biased variance, weight and bias, fp32 math, bf16 out."""
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return bf16((x - mean) * (1.0 / torch.sqrt(var + eps)) * w + b)


# ---- RoPE with YaRN (spec 3.4, Appendix A) ----------------------------------------------------

def yarn_inv_freq(cfg, mutation_no_yarn=False):
    dim = cfg["qk_rope_head_dim"]
    base = float(cfg["rope_theta"])
    rs = cfg["rope_scaling"]
    factor = float(rs["factor"])
    orig = float(rs["original_max_position_embeddings"])

    def cdim(n_rot):  # the dimension index whose wavelength makes n_rot turns over orig
        return dim * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(cdim(float(rs["beta_fast"]))), 0)
    high = min(math.ceil(cdim(float(rs["beta_slow"]))), dim - 1)
    base_inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if mutation_no_yarn:
        return base_inv
    hi = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (hi - low)).clamp(0, 1)
    smooth = 1 - ramp
    return base_inv / factor * (1 - smooth) + base_inv * smooth


def rope_cos_sin(inv, pos):
    """cos/sin [T, half] of the fp32 angle pos * inv (evaluated in fp64, rounded to fp32)."""
    ang = pos.to(torch.float32).unsqueeze(-1) * inv.unsqueeze(0)
    return torch.cos(ang.double()).float(), torch.sin(ang.double()).float()


def rope_interleaved(x, cos, sin):
    """MLA layout: pairs (x[2i], x[2i+1]). x [T, ..., 64], cos/sin [T, 32]."""
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    a, b = x[..., 0::2], x[..., 1::2]
    y = torch.empty_like(x)
    y[..., 0::2] = a * cos - b * sin
    y[..., 1::2] = a * sin + b * cos
    return bf16(y)


def rope_halfsplit(x, cos, sin):
    """Indexer layout: pairs (x[i], x[i+32])."""
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return bf16(torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1))


# ---- Hadamard (spec 3.6.4) --------------------------------------------------------------------

_HAD = {}


def hadamard_matrix(n, device):
    """Sylvester H[i][j] = (-1)^popcount(i & j), explicit."""
    key = (n, str(device))
    if key not in _HAD:
        i = torch.arange(n)
        pc = torch.zeros(n, n, dtype=torch.int64)
        m = i.unsqueeze(1) & i.unsqueeze(0)
        while bool((m > 0).any()):
            pc += m & 1
            m = m >> 1
        _HAD[key] = (1 - 2 * (pc % 2)).to(torch.float32).to(device)
    return _HAD[key]


def hadamard(x):
    """bf16( (x . H) * n^-0.5 )."""
    n = x.shape[-1]
    return bf16((x @ hadamard_matrix(n, x.device)) * (n ** -0.5))


# ---- KV cache records (spec 6.1, 6.2) ---------------------------------------------------------

def latent_fp8(c_kv):
    """[REF] step 6: c_kv rounded through the FP8 cache (1x128 act_quant, UE8M0). Returns
    (dequantised c_kv, e4m3 values, scales)."""
    q, s = act_quant(c_kv)
    T, R = c_kv.shape
    deq = (q.reshape(T, R // 128, 128) * s.unsqueeze(-1)).reshape(T, R)
    return deq, q, s


def mla_record_bytes(q, s, k_pe):
    """Our MLA record per token: R e4m3 codes | R/128 fp32 scales | rope bf16. -> uint8 [T, B]"""
    T = q.shape[0]
    codes = e4m3_codes(q).cpu().numpy()
    scales = s.cpu().numpy().astype("<f4").view(np.uint8).reshape(T, -1)
    pe = k_pe.to(torch.bfloat16).cpu().view(torch.int16).numpy().astype("<i2").view(np.uint8)
    return np.concatenate([codes, scales, pe.reshape(T, -1)], axis=1)


def index_record_bytes(k8, ks):
    """Indexer key per token: Di e4m3 codes | fp32 scale (the page layout splits them)."""
    T = k8.shape[0]
    codes = e4m3_codes(k8).cpu().numpy()
    scales = ks.reshape(T, 1).cpu().numpy().astype("<f4").view(np.uint8).reshape(T, 4)
    return np.concatenate([codes, scales], axis=1)


# ---- checkpoint -------------------------------------------------------------------------------

class Checkpoint:
    def __init__(self, model_dir, device):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        idx = os.path.join(model_dir, "model.safetensors.index.json")
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        self.t = {}
        for shard in sorted(set(wm.values())):
            with safe_open(os.path.join(model_dir, shard), framework="pt") as f:
                for k in f.keys():
                    self.t[k] = f.get_tensor(k).to(device)
        self.device = device

    def f32(self, name):
        return self.t[name].to(torch.float32)

    def fp8(self, prefix):
        return FP8Weight(self.t[prefix + ".weight"], self.t[prefix + ".weight_scale_inv"])

    def has(self, name):
        return name in self.t


# ---- the model (spec 3.2-3.10, 4) -------------------------------------------------------------

class Model:
    def __init__(self, ck, attn_form="absorbed"):
        self.ck = ck
        c = self.cfg = ck.cfg
        self.dev = ck.device
        self.attn_form = attn_form
        self.eps = float(c["rms_norm_eps"])
        self.L = c["num_hidden_layers"]
        self.has_mtp = c.get("num_nextn_predict_layers", 0) > 0
        self.inv = yarn_inv_freq(c).to(self.dev)
        m = 0.1 * float(c["rope_scaling"]["mscale_all_dim"]) * math.log(float(c["rope_scaling"]["factor"])) + 1.0
        qk_head_dim = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        self.s_att = float(torch.tensor(qk_head_dim ** -0.5 * m * m, dtype=torch.float32))

    def lw(self, l, name):
        return "model.layers.%d.%s" % (l, name)

    def is_moe(self, l):
        c = self.cfg
        if l >= self.L:
            return True
        return l >= c["first_k_dense_replace"] and l % c.get("moe_layer_freq", 1) == 0

    # -- MLA projections (3.3) and the lightning indexer (3.6)

    def mla_project(self, l, a, pos):
        c, ck = self.cfg, self.ck
        H, nope, rope = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        R = c["kv_lora_rank"]
        c_q = rmsnorm(fp8_linear(a, ck.fp8(self.lw(l, "self_attn.q_a_proj"))),
                      ck.f32(self.lw(l, "self_attn.q_a_layernorm.weight")), self.eps)
        q = fp8_linear(c_q, ck.fp8(self.lw(l, "self_attn.q_b_proj"))).reshape(-1, H, nope + rope)
        kv = fp8_linear(a, ck.fp8(self.lw(l, "self_attn.kv_a_proj_with_mqa")))
        c_kv = rmsnorm(kv[:, :R], ck.f32(self.lw(l, "self_attn.kv_a_layernorm.weight")), self.eps)
        cos, sin = rope_cos_sin(self.inv, pos)
        k_pe = rope_interleaved(kv[:, R:], cos, sin)
        q = torch.cat([q[..., :nope], rope_interleaved(q[..., nope:], cos, sin)], dim=-1)
        return c_q, q, c_kv, k_pe

    def indexer_project(self, l, a, c_q, pos):
        c, ck = self.cfg, self.ck
        Hi, Di, rope = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"]
        cos, sin = rope_cos_sin(self.inv, pos)
        qI = fp8_linear(c_q, ck.fp8(self.lw(l, "self_attn.indexer.wq_b"))).reshape(-1, Hi, Di)
        qI = torch.cat([rope_halfsplit(qI[..., :rope], cos, sin), qI[..., rope:]], dim=-1)
        kI = layernorm(fp8_linear(a, ck.fp8(self.lw(l, "self_attn.indexer.wk"))),
                       ck.f32(self.lw(l, "self_attn.indexer.k_norm.weight")),
                       ck.f32(self.lw(l, "self_attn.indexer.k_norm.bias")), self.eps)
        kI = torch.cat([rope_halfsplit(kI[..., :rope], cos, sin), kI[..., rope:]], dim=-1)
        qI, kI = hadamard(qI), hadamard(kI)
        q8, sq = act_quant(qI)  # sq [T, Hi, 1]
        k8, sk = act_quant(kI)  # sk [T, 1]
        w = linear_fp32(a, ck.f32(self.lw(l, "self_attn.indexer.weights_proj.weight")))
        w = w * (Hi ** -0.5) * sq[..., 0] * (Di ** -0.5)
        return q8, w, k8, sk[:, 0]

    @staticmethod
    def index_scores(q8, w, k8, sk):
        """I[t, s] = sk[s] * sum_h ReLU(q8[t,h] . k8[s]) * w[t,h]  (fp32 on e4m3 values)."""
        dots = torch.einsum("thd,sd->tsh", q8, k8)
        return (torch.relu(dots) * w.unsqueeze(1)).sum(-1) * sk.unsqueeze(0)

    def index_topk(self, scores, pos):
        """Per query: k = min(index_topk, p+1) best keys among positions 0..p, ties to the lower
        position; sorted ascending. Returns a list of int arrays."""
        k_max = self.cfg["index_topk"]
        sc = scores.cpu().numpy()
        out = []
        for t in range(sc.shape[0]):
            n = int(pos[t]) + 1
            k = min(k_max, n)
            row = sc[t, :n]
            order = np.lexsort((np.arange(n), -row.astype(np.float64)))
            out.append(np.sort(order[:k]).astype(np.int32))
        return out

    # -- sparse attention (3.7)

    def attention(self, l, q, ckv, k_pe, sel):
        """q [T, H, nope+rope]; ckv [Tk, R] dequantised latent; k_pe [Tk, rope]; sel: list of
        selected key indices per query. Returns o [T, H, dv] (bf16 values)."""
        c = self.cfg
        H, nope, dv, R = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        T, Tk = q.shape[0], ckv.shape[0]
        mask = torch.full((T, Tk), float("-inf"), device=self.dev)
        for t, s in enumerate(sel):
            mask[t, torch.as_tensor(s, dtype=torch.long, device=self.dev)] = 0.0
        Wb = self.ck.fp8(self.lw(l, "self_attn.kv_b_proj"))
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        if self.attn_form == "naive":
            kvb = fp8_linear(ckv, Wb).reshape(Tk, H, nope + dv)
            k_nope, v = kvb[..., :nope], kvb[..., nope:]
            score = (torch.einsum("thd,shd->ths", q_nope, k_nope) +
                     torch.einsum("thd,sd->ths", q_pe, k_pe)) * self.s_att
            P = torch.softmax(score + mask.unsqueeze(1), dim=-1)
            return bf16(torch.einsum("ths,shd->thd", P, v))
        # absorbed: q_lat = W_UK^T q_nope (bf16), o_lat = P . c_kv (bf16), o = W_UV o_lat (bf16)
        Wd = Wb.dequant().reshape(H, nope + dv, R)
        W_UK, W_UV = Wd[:, :nope, :], Wd[:, nope:, :]
        q_lat = bf16(torch.einsum("thd,hdc->thc", q_nope, W_UK))
        score = (torch.einsum("thc,sc->ths", q_lat, ckv) +
                 torch.einsum("thd,sd->ths", q_pe, k_pe)) * self.s_att
        P = torch.softmax(score + mask.unsqueeze(1), dim=-1)
        o_lat = bf16(torch.einsum("ths,sc->thc", P, ckv))
        return bf16(torch.einsum("thc,hdc->thd", o_lat, W_UV))

    # -- FFN (3.8, 3.9)

    def swiglu_mlp(self, x, prefix):
        ck = self.ck
        g = fp8_linear(x, ck.fp8(prefix + ".gate_proj"))
        u = fp8_linear(x, ck.fp8(prefix + ".up_proj"))
        return fp8_linear(bf16(torch.nn.functional.silu(g) * u), ck.fp8(prefix + ".down_proj"))

    def gate(self, l, f):
        """Returns (logits [T, E] fp32, idx [T, K] ascending, weights [T, K] in idx order)."""
        c, ck = self.cfg, self.ck
        E, K, G, kg = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
        logits = linear_fp32(f, ck.f32(self.lw(l, "mlp.gate.weight")))
        sc = torch.sigmoid(logits)
        sel = sc + ck.f32(self.lw(l, "mlp.gate.e_score_correction_bias")).unsqueeze(0)
        sc_np, sel_np = sc.cpu().numpy(), sel.cpu().numpy().astype(np.float64)
        per = E // G
        T = f.shape[0]
        idx = np.zeros((T, K), np.int32)
        wts = np.zeros((T, K), np.float32)
        for t in range(T):
            s = sel_np[t].copy()
            if G > 1:
                gs = np.sort(s.reshape(G, per), axis=1)[:, ::-1]
                gscore = (gs[:, 0].astype(np.float32) + gs[:, 1].astype(np.float32)).astype(np.float64)
                keep = np.lexsort((np.arange(G), -gscore))[:kg]  # ties: lower group id
                drop = np.ones(G, bool)
                drop[keep] = False
                s.reshape(G, per)[drop] = -np.inf
            pick = np.lexsort((np.arange(E), -s))[:K]  # ties: lower expert id
            w = sc_np[t, pick].astype(np.float32)
            total = np.float32(0)
            for v in w:  # the renormalisation sum in pick order
                total = np.float32(total + v)
            if c.get("norm_topk_prob", True):
                w = (w / total).astype(np.float32)
            w = (w * np.float32(c["routed_scaling_factor"])).astype(np.float32)
            order = np.argsort(pick)
            idx[t], wts[t] = pick[order], w[order]
        return logits, idx, wts

    def moe(self, l, f):
        c = self.cfg
        logits, idx, wts = self.gate(l, f)
        T, K = idx.shape
        D = f.shape[1]
        outs = torch.zeros(T, K, D, device=self.dev)
        idx_t = torch.as_tensor(idx, device=self.dev, dtype=torch.long)
        for e in np.unique(idx):
            rows, ks = (idx_t == int(e)).nonzero(as_tuple=True)
            outs[rows, ks] = self.swiglu_mlp(f[rows], self.lw(l, "mlp.experts.%d" % int(e)))
        w_t = torch.as_tensor(wts, device=self.dev)
        acc = torch.zeros(T, D, device=self.dev)
        for k in range(K):  # ascending expert id per token (idx sorted), fp32
            acc = acc + outs[:, k] * w_t[:, k : k + 1]
        if c.get("n_shared_experts", 0) > 0:
            acc = acc + self.swiglu_mlp(f, self.lw(l, "mlp.shared_experts"))
        return bf16(acc), idx

    # -- one decoder layer (3.2)

    def layer(self, l, x, r, pos, first, rec=None):
        """x: layer input, r: residual (ignored when first). Returns (x_out, r_out). rec: a dict
        that receives this layer's top-k, experts and cache records."""
        ck = self.ck
        if first:
            r = x
            a = rmsnorm(x, ck.f32(self.lw(l, "input_layernorm.weight")), self.eps)
        else:
            s = x + r
            a = rmsnorm(s, ck.f32(self.lw(l, "input_layernorm.weight")), self.eps)
            r = bf16(s)
        c_q, q, c_kv, k_pe = self.mla_project(l, a, pos)
        q8, w, k8, sk = self.indexer_project(l, a, c_q, pos)
        ckv_deq, ckv8, ckv_s = latent_fp8(c_kv)
        sel = self.index_topk(self.index_scores(q8, w, k8, sk), pos)
        o = self.attention(l, q, ckv_deq, k_pe, sel)
        attn_out = fp8_linear(o.reshape(o.shape[0], -1), ck.fp8(self.lw(l, "self_attn.o_proj")))
        s = attn_out + r
        f = rmsnorm(s, ck.f32(self.lw(l, "post_attention_layernorm.weight")), self.eps)
        r = bf16(s)
        experts = None
        if self.is_moe(l):
            x, experts = self.moe(l, f)
        else:
            x = self.swiglu_mlp(f, self.lw(l, "mlp"))
        if rec is not None:
            rec["topk"] = sel
            rec["experts"] = experts
            rec["mla"] = mla_record_bytes(ckv8, ckv_s, k_pe)
            rec["idx"] = index_record_bytes(k8, sk)
        return x, r

    # -- whole sequences (3.1, 3.10, 4)

    def forward(self, tokens, rec_layers=None):
        """tokens: int list. Returns (logits [T, V] fp32, h [T, D] final normed hidden, per-layer
        records). rec_layers: list that receives (x_in, r_in) per layer and the final (x, r)."""
        ck = self.ck
        tok = torch.as_tensor(tokens, dtype=torch.long, device=self.dev)
        pos = torch.arange(len(tokens), device=self.dev)
        x = ck.f32("model.embed_tokens.weight")[tok]
        r = torch.zeros_like(x)
        recs = []
        for l in range(self.L):
            if rec_layers is not None:
                rec_layers.append((x, r))
            rec = {}
            x, r = self.layer(l, x, r, pos, l == 0, rec)
            recs.append(rec)
        if rec_layers is not None:
            rec_layers.append((x, r))
        h = rmsnorm(x + r, ck.f32("model.norm.weight"), self.eps)
        return linear_fp32(h, ck.f32("lm_head.weight")), h, recs

    def mtp(self, tokens, h):
        """Row i = MTP(token i+1, h_i) at position i, i = 0..T-2 (spec 4). Returns (logits,
        record, (z, x_out, r_out))."""
        ck, L = self.ck, self.L
        T = len(tokens)
        tok = torch.as_tensor(tokens[1:], dtype=torch.long, device=self.dev)
        pos = torch.arange(T - 1, device=self.dev)
        e = ck.f32(self.lw(L, "embed_tokens.weight"))[tok]
        cat = torch.cat([rmsnorm(e, ck.f32(self.lw(L, "enorm.weight")), self.eps),
                         rmsnorm(h[: T - 1], ck.f32(self.lw(L, "hnorm.weight")), self.eps)], dim=-1)
        z = bf16(linear_fp32(cat, ck.f32(self.lw(L, "eh_proj.weight"))))
        rec = {}
        x, r = self.layer(L, z, None, pos, True, rec)
        hn = rmsnorm(x + r, ck.f32(self.lw(L, "shared_head.norm.weight")), self.eps)
        return linear_fp32(hn, ck.f32(self.lw(L, "shared_head.head.weight"))), rec, (z, x, r)
