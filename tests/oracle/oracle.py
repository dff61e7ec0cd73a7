#!/usr/bin/env python3
"""oracle.py -- command line of the PyTorch oracle (dsv32_ref.py), run on the GPU machine.

  oracle.py eval --model DIR --tokens FILE [--attn absorbed|naive] [--logits-out F]
                 [--mtp-out F] [--dump-topk F] [--dump-experts F]
      the formats of `dsv32 eval`: one sequence and a .npy name -> float32 [T, vocab], else
      .npz with keys seq0, seq1, ...; --mtp-out rows i = MTP(token i+1, h_i), [T-1, vocab];
      --dump-topk / --dump-experts: .npz keys s{s}_l{l}, int32, sorted ascending, -1 padded.
  oracle.py fixture --model DIR --tokens FILE --out DIR [--logit-stride N] [--tf-seq S]
      the committed fixtures of one config (tests/data/oracle/NAME/, README.md there).
  oracle.py ops --config FILE --out F [--seed N]
      op-level fixtures on fresh random inputs (ops.npz).
  oracle.py compare --fixture DIR --logits F [--mtp F] --topk F --experts F
      the self-check: our `dsv32 eval` outputs against a fixture, as a short table.
  oracle.py hf --model DIR --tokens FILE --fixture DIR
      a second opinion on structure only: transformers' bf16 deepseek_v32 port.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsv32_ref as ref  # noqa: E402


def read_tokens(path):
    seqs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                seqs.append([int(v) for v in line.split(",")])
    return seqs


def pad_rows(rows, width, fill=-1):
    m = np.full((len(rows), width), fill, np.int32)
    for i, r in enumerate(rows):
        m[i, : len(r)] = r
    return m


def write_mats(path, mats):
    if len(mats) == 1 and path.endswith(".npy"):
        np.save(path, mats[0])
    else:
        np.savez(path, **{"seq%d" % i: m for i, m in enumerate(mats)})


def bf16_pairs(x):
    """fp32 tensor of bf16 values [T, D] (D even) -> int32 [T, D/2], element j = bits of
    values 2j (low half) and 2j+1 (high half), little-endian."""
    h = x.to(torch.bfloat16).cpu().contiguous().view(torch.int16).numpy()
    return np.ascontiguousarray(h).view(np.int32)


def bytes_as_i32(b):
    assert b.shape[1] % 4 == 0
    return np.ascontiguousarray(b).view(np.int32)


def run_seq(model, toks, want_mtp, tf=False):
    """One sequence: logits, MTP logits, per-layer top-k and experts, and (tf) teacher-forcing
    records."""
    layers_io = [] if tf else None
    logits, h, recs = model.forward(toks, layers_io)
    out = {"logits": logits.cpu().numpy().astype(np.float32), "recs": recs, "io": layers_io}
    if want_mtp and len(toks) > 1:
        ml, mrec, mio = model.mtp(toks, h)
        out["mtp"] = ml.cpu().numpy().astype(np.float32)
        out["mtp_rec"] = mrec
        out["mtp_io"] = mio
    return out


def topk_matrix(model, rows):
    T = len(rows)
    return pad_rows(rows, min(model.cfg["index_topk"], T))


def cmd_eval(a):
    dev = ref.setup_torch()
    model = ref.Model(ref.Checkpoint(a.model, dev), a.attn)
    seqs = read_tokens(a.tokens)
    logits, mtps, topk, experts = [], [], {}, {}
    want_mtp = bool(a.mtp_out)
    for s, toks in enumerate(seqs):
        o = run_seq(model, toks, want_mtp)
        logits.append(o["logits"])
        layer_recs = list(enumerate(o["recs"]))
        if "mtp" in o:
            mtps.append(o["mtp"])
            layer_recs.append((model.L, o["mtp_rec"]))
        for l, rec in layer_recs:
            topk["s%d_l%d" % (s, l)] = topk_matrix(model, rec["topk"])
            if rec["experts"] is not None:
                experts["s%d_l%d" % (s, l)] = rec["experts"].astype(np.int32)
    if a.logits_out:
        write_mats(a.logits_out, logits)
    if a.mtp_out:
        write_mats(a.mtp_out, mtps)
    if a.dump_topk:
        np.savez(a.dump_topk, **topk)
    if a.dump_experts:
        np.savez(a.dump_experts, **experts)
    return 0


def cmd_fixture(a):
    """Writes DIR/{logits,topk,experts,layers}.npz (formats: tests/oracle/README.md)."""
    t0 = time.time()
    dev = ref.setup_torch()
    model = ref.Model(ref.Checkpoint(a.model, dev), a.attn)
    seqs = read_tokens(a.tokens)
    os.makedirs(a.out, exist_ok=True)
    logits, topk, experts, layers = {}, {}, {}, {}
    for s, toks in enumerate(seqs):
        tf = s == a.tf_seq
        o = run_seq(model, toks, model.has_mtp, tf)
        T = len(toks)
        stride = a.logit_stride if T > a.full_rows else 1
        rows = np.arange(0, T, stride, dtype=np.int32)
        logits["seq%d" % s] = o["logits"][rows]
        logits["rows%d" % s] = rows
        layer_recs = list(enumerate(o["recs"]))
        if "mtp" in o:
            mrows = np.arange(0, T - 1, stride, dtype=np.int32)
            logits["mtp%d" % s] = o["mtp"][mrows]
            logits["mrows%d" % s] = mrows
            layer_recs.append((model.L, o["mtp_rec"]))
        for l, rec in layer_recs:
            topk["s%d_l%d" % (s, l)] = topk_matrix(model, rec["topk"])
            if rec["experts"] is not None:
                experts["s%d_l%d" % (s, l)] = rec["experts"].astype(np.int32)
        if tf:
            for l, (x, r) in enumerate(o["io"]):
                layers["x_l%d" % l] = bf16_pairs(x)
                layers["r_l%d" % l] = bf16_pairs(r)
            for l, rec in layer_recs:
                layers["mla_l%d" % l] = bytes_as_i32(rec["mla"])
                layers["idx_l%d" % l] = bytes_as_i32(rec["idx"])
            if "mtp" in o:
                z, x, r = o["mtp_io"]
                layers["mtp_z"] = bf16_pairs(z)
                layers["mtp_x"] = bf16_pairs(x)
                layers["mtp_r"] = bf16_pairs(r)
            layers["seq"] = np.array([s], np.int32)
    np.savez(os.path.join(a.out, "logits.npz"), **logits)
    np.savez(os.path.join(a.out, "topk.npz"), **topk)
    np.savez(os.path.join(a.out, "experts.npz"), **experts)
    if layers:
        np.savez(os.path.join(a.out, "layers.npz"), **layers)
    print("oracle fixture %s: %d sequences, %.1f s on %s" % (a.out, len(seqs), time.time() - t0, dev))
    return 0


# ---- op fixtures --------------------------------------------------------------------------------

def rand_bf16(g, shape, scale=1.0):
    return ref.bf16(torch.randn(*shape, generator=g) * scale)


def random_codes(g, shape):
    """Uniform e4m3 codes without the NaN codes 0x7f / 0xff."""
    c = torch.randint(0, 254, shape, generator=g)
    c = c + (c >= 0x7F).to(torch.int64)  # skip 0x7f; 0xff is never reached
    return c.to(torch.uint8)


def pack_u8(codes):
    """uint8 [rows, cols] (cols % 4 == 0) -> int32 [rows, cols/4], little-endian bytes."""
    return np.ascontiguousarray(codes.numpy().astype(np.uint8)).view("<i4")


def codes_to_f32(codes):
    return codes.view(torch.float8_e4m3fn).to(torch.float32)


def cmd_ops(a):
    ref.setup_torch()
    with open(a.config) as f:
        cfg = json.load(f)
    g = torch.Generator().manual_seed(a.seed)
    o = {}
    # e4m3: every code decoded; encoding of values on and between the grid (ties included)
    allc = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    o["e4m3_all"] = codes_to_f32(allc).numpy()
    grid = codes_to_f32(random_codes(g, (4000,)))
    mids = (codes_to_f32(random_codes(g, (2000,))) + codes_to_f32(random_codes(g, (2000,)))) / 2
    vals = torch.cat([grid, grid * (1 + torch.rand(4000, generator=g) * 0.2), mids,
                      torch.tensor([0.0, -0.0, 448.0, -448.0, 2.0 ** -9, 2.0 ** -10, 2.0 ** -9 * 1.5,
                                    3 * 2.0 ** -10, 464.0 - 1e-3, 1e-30])])
    vals = vals.clamp(-448, 448).to(torch.float32)
    o["e4m3_in"] = vals.numpy()
    o["e4m3_codes"] = ref.e4m3_codes(vals).to(torch.int32).numpy()
    # bf16: random fp32 bit patterns (no NaN), and exact ties
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (6000,), generator=g, dtype=torch.int64).to(torch.int32)
    f = bits.view(torch.float32)
    f = torch.where(torch.isnan(f), torch.zeros_like(f), f)
    ties = (torch.randint(0, 2 ** 15, (1000,), generator=g).to(torch.int32) << 16 | 0x8000).view(torch.float32)
    f = torch.cat([f, torch.where(torch.isnan(ties), torch.zeros_like(ties), ties)])
    o["bf16_in"] = f.view(torch.int32).numpy()
    o["bf16_out"] = f.to(torch.bfloat16).view(torch.int16).to(torch.int32).numpy() & 0xFFFF
    # act_quant: rows of varied magnitude, one below the 1e-4 floor, amax on power-of-two edges
    mags = torch.tensor([1.0, 1e-3, 3e-5, 448.0, 896.0, 7.0, 1e3, 0.0625])
    rows = [rand_bf16(g, (256,), float(m)) for m in mags]
    edge = rand_bf16(g, (256,), 0.1)
    edge[5] = 448.0 * 2.0 ** -3  # amax/448 an exact power of two
    rows.append(edge)
    aq_x = torch.stack(rows)
    q, s = ref.act_quant(aq_x)
    o["aq_x"], o["aq_codes"], o["aq_scales"] = aq_x.numpy(), ref.e4m3_codes(q).to(torch.int32).numpy(), s.numpy()
    # FP8 GEMM: K = 384 (3 blocks), N = 136 (a partial block of rows)
    gx = rand_bf16(g, (8, 384), 2.0)
    gw = random_codes(g, (136, 384))
    gs = (2.0 ** -torch.randint(5, 9, (2, 3), generator=g)).to(torch.float32)
    W = ref.FP8Weight(gw.view(torch.float8_e4m3fn), gs)
    o["gemm_x"], o["gemm_w"], o["gemm_s"] = gx.numpy(), pack_u8(gw), gs.numpy()
    o["gemm_y"] = ref.fp8_linear(gx, W).numpy()
    # norms
    rx = torch.randn(8, 256, generator=g) * 3
    rw = rand_bf16(g, (256,), 0.2) + 1
    o["rms_x"], o["rms_w"], o["rms_y"] = rx.numpy(), rw.numpy(), ref.rmsnorm(rx, rw, 1e-6).numpy()
    lx = torch.randn(8, 128, generator=g) * 2 + 0.5
    lw, lb = rand_bf16(g, (128,), 0.2) + 1, rand_bf16(g, (128,), 0.1)
    o["ln_x"], o["ln_w"], o["ln_b"] = lx.numpy(), lw.numpy(), lb.numpy()
    o["ln_y"] = ref.layernorm(lx, lw, lb, 1e-6).numpy()
    # RoPE: the YaRN table and both layouts, positions up to the context limit
    inv = ref.yarn_inv_freq(cfg)
    pos = torch.tensor([0, 1, 2, 7, 63, 64, 300, 1000, 4095, 4096, 10000, 65535, 100000, 131071,
                        150000, 163839])
    rx64 = rand_bf16(g, (16, 64), 1.5)
    cos, sin = ref.rope_cos_sin(inv, pos)
    o["rope_inv"], o["rope_pos"], o["rope_x"] = inv.numpy(), pos.to(torch.int32).numpy(), rx64.numpy()
    o["rope_inter_y"] = ref.rope_interleaved(rx64, cos, sin).numpy()
    o["rope_half_y"] = ref.rope_halfsplit(rx64, cos, sin).numpy()
    # Hadamard
    hx = rand_bf16(g, (16, 128), 1.0)
    hx[3, 7] = 40.0  # an outlier
    o["had_x"], o["had_y"] = hx.numpy(), ref.hadamard(hx).numpy()
    # indexer scores on quantised q/k (8 heads, 100 keys)
    q8, sq = ref.act_quant(ref.bf16(torch.randn(8, 128, generator=g)))
    k8, sk = ref.act_quant(ref.bf16(torch.randn(100, 128, generator=g) * 3))
    w = torch.randn(8, generator=g) * 0.01
    o["is_q8"] = ref.e4m3_codes(q8).to(torch.int32).numpy()
    o["is_k8"] = ref.e4m3_codes(k8).to(torch.int32).numpy()
    o["is_w"], o["is_ks"] = w.numpy(), sk[:, 0].numpy()
    o["is_scores"] = ref.Model.index_scores(q8.unsqueeze(0), w.unsqueeze(0), k8, sk[:, 0])[0].numpy()
    # top-k with ties (scores on a coarse grid), k = 20 of 100
    tk = (torch.randint(0, 12, (6, 100), generator=g).to(torch.float32) * 0.5)
    o["tk_scores"] = tk.numpy()
    o["tk_sel"] = np.stack([np.sort(np.lexsort((np.arange(100), -r.astype(np.float64)))[:20])
                            for r in tk.numpy()]).astype(np.int32)
    # routing: 32 experts, 8 groups, topk_group 3, 6 per token, ties in logits and bias
    rcfg = {"n_routed_experts": 32, "num_experts_per_tok": 6, "n_group": 8, "topk_group": 3,
            "routed_scaling_factor": 2.5, "norm_topk_prob": True}

    class GateOnly(ref.Model):
        def __init__(self):
            self.cfg = rcfg

    logits = torch.randint(-8, 8, (16, 32), generator=g).to(torch.float32) * 0.5
    bias = torch.randint(-2, 3, (32,), generator=g).to(torch.float32) * 0.0625
    idx, wts = route(GateOnly(), logits, bias)
    o["rt_logits"], o["rt_bias"], o["rt_idx"], o["rt_wts"] = logits.numpy(), bias.numpy(), idx, wts
    # attention (tiny dims: 4 heads, nope 64, rope 64, v 64, kv_lora_rank 256), 40 keys
    H, nope, rope, dv, R = 2, 64, 64, 64, 256
    aq = rand_bf16(g, (H, nope + rope), 1.0)
    ckv, _, _ = ref.latent_fp8(rand_bf16(g, (40, R), 1.0))
    kpe = rand_bf16(g, (40, rope), 1.0)
    wb = random_codes(g, (H * (nope + dv), R))
    wbs = (2.0 ** -torch.randint(9, 12, ((H * (nope + dv) + 127) // 128, R // 128), generator=g)).to(torch.float32)
    o["at_q"], o["at_kv"] = aq.numpy(), torch.cat([ckv, kpe], dim=1).numpy()
    o["at_w"], o["at_s"] = pack_u8(wb), wbs.numpy()
    acfg = dict(cfg, num_attention_heads=H, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                v_head_dim=dv, kv_lora_rank=R)
    for form in ("absorbed", "naive"):
        o["at_o_" + form] = attention_op(acfg, form, aq, ckv, kpe, wb, wbs).numpy()
    # SwiGLU middle
    sg, su = rand_bf16(g, (8, 128), 2.0), rand_bf16(g, (8, 128), 2.0)
    o["sw_g"], o["sw_u"] = sg.numpy(), su.numpy()
    o["sw_y"] = ref.bf16(torch.nn.functional.silu(sg) * su).numpy()
    np.savez(a.out, **{k: np.ascontiguousarray(v) for k, v in o.items()})
    print("oracle ops: %d arrays -> %s" % (len(o), a.out))
    return 0


def route(model, logits, bias):
    """Model.gate's selection on given logits (the gate GEMM left out)."""
    c = model.cfg
    E = c["n_routed_experts"]

    class FakeCk:
        def f32(self, name):
            return bias if name.endswith("bias") else torch.eye(E)

    model.ck = FakeCk()
    model.lw = lambda l, n: n
    _, idx, wts = ref.Model.gate(model, 0, logits)
    return idx, wts


def attention_op(cfg, form, q, ckv, kpe, wb, wbs):
    class Attn(ref.Model):
        def __init__(self):
            self.cfg, self.attn_form, self.dev = cfg, form, q.device
            self.s_att = attn_scale(cfg)

    class FakeCk:
        def fp8(self, prefix):
            return ref.FP8Weight(wb.view(torch.float8_e4m3fn), wbs)

    m = Attn()
    m.ck = FakeCk()
    sel = [np.arange(ckv.shape[0])]
    return m.attention(0, q.unsqueeze(0), ckv, kpe, sel)[0]


def attn_scale(cfg):
    import math
    rs = cfg["rope_scaling"]
    m = 0.1 * float(rs["mscale_all_dim"]) * math.log(float(rs["factor"])) + 1.0
    d = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    return float(torch.tensor(d ** -0.5 * m * m, dtype=torch.float32))


# ---- self-check -------------------------------------------------------------------------------

def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def load_mats(path):
    if path.endswith(".npy"):
        return {"seq0": np.load(path)}
    return dict(np.load(path))


def cmd_compare(a):
    fx = dict(np.load(os.path.join(a.fixture, "logits.npz")))
    ours = load_mats(a.logits)
    rl, agree = [], []
    mrl = []
    for key in sorted(k for k in fx if k.startswith("seq")):
        s = key[3:]
        rows = fx["rows" + s]
        mine = ours[key][rows]
        for i in range(len(rows)):
            rl.append(rel_l2(mine[i], fx[key][i]))
            agree.append(int(np.argmax(mine[i]) == np.argmax(fx[key][i])))
    if a.mtp and os.path.exists(a.mtp):
        om = load_mats(a.mtp)
        for key in sorted(k for k in fx if k.startswith("mtp")):
            s = key[3:]
            mine = om["seq" + s][fx["mrows" + s]]
            mrl += [rel_l2(mine[i], fx[key][i]) for i in range(len(mine))]
    tk_f, tk_o = dict(np.load(os.path.join(a.fixture, "topk.npz"))), dict(np.load(a.topk))
    same = tot = 0
    worst = 0
    for k in tk_f:
        if k not in tk_o:  # e.g. the MTP layer of a run without MTP
            continue
        for rf, ro in zip(tk_f[k], tk_o[k]):
            d = len(set(rf[rf >= 0].tolist()) - set(ro[ro >= 0].tolist()))
            same += d == 0
            tot += 1
            worst = max(worst, d)
    ex_f, ex_o = dict(np.load(os.path.join(a.fixture, "experts.npz"))), dict(np.load(a.experts))
    ex_same = sum(int((ex_f[k] == ex_o[k]).all(axis=1).sum()) for k in ex_f if k in ex_o)
    ex_tot = sum(ex_f[k].shape[0] for k in ex_f if k in ex_o)
    q = lambda v, p: float(np.percentile(v, p)) if v else float("nan")  # noqa: E731
    print("%-28s logits relL2 median %.2e p90 %.2e max %.2e argmax %.3f | mtp median %.2e | "
          "topk rows same %.3f worst %d | experts same %d/%d"
          % (os.path.basename(a.fixture.rstrip("/")), q(rl, 50), q(rl, 90), max(rl), np.mean(agree),
             q(mrl, 50), same / max(tot, 1), worst, ex_same, ex_tot))
    return 0


def cmd_hf(a):
    """Second opinion on structure only: transformers' bf16 deepseek_v32 port (no FP8, no
    Hadamard, no MTP) on our checkpoint dequantised to bf16, against the fixture's logits.
    Prints one line; loose by nature (FP8 vs bf16 differs at the 1e-2..1e-1 level)."""
    import tempfile
    import transformers
    from safetensors.torch import save_file
    dev = ref.setup_torch()
    ck = ref.Checkpoint(a.model, dev)
    L = ck.cfg["num_hidden_layers"]
    tensors = {}
    for name, t in ck.t.items():
        if name.endswith("weight_scale_inv") or name.startswith("model.layers.%d." % L):
            continue
        if name.endswith(".weight") and name + "_scale_inv" in ck.t:
            t = ck.fp8(name[: -len(".weight")]).dequant()
        tensors[name] = t.to(torch.bfloat16).contiguous().cpu()
    with tempfile.TemporaryDirectory() as tmp:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(ck.cfg)
        cfg.pop("quantization_config", None)
        cfg["num_nextn_predict_layers"] = 0
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch.bfloat16, attn_implementation="eager").to(dev).eval()
        fx = dict(np.load(os.path.join(a.fixture, "logits.npz")))
        rl, agree = [], []
        with torch.no_grad():
            for s, toks in enumerate(read_tokens(a.tokens)):
                lg = model(torch.tensor([toks], device=dev)).logits[0].float().cpu().numpy()
                rows = fx["rows%d" % s]
                for i, t in enumerate(rows):
                    rl.append(rel_l2(lg[t], fx["seq%d" % s][i]))
                    agree.append(int(np.argmax(lg[t]) == np.argmax(fx["seq%d" % s][i])))
    print("  (transformers %s bf16 port vs the oracle, structure only) logits relL2 median %.2e "
          "p90 %.2e argmax %.3f" % (transformers.__version__, float(np.median(rl)),
                                     float(np.percentile(rl, 90)), float(np.mean(agree))))
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--tokens", required=True)
    e.add_argument("--attn", choices=["absorbed", "naive"], default="absorbed")
    e.add_argument("--logits-out")
    e.add_argument("--mtp-out")
    e.add_argument("--dump-topk")
    e.add_argument("--dump-experts")
    fx = sub.add_parser("fixture")
    fx.add_argument("--model", required=True)
    fx.add_argument("--tokens", required=True)
    fx.add_argument("--out", required=True)
    fx.add_argument("--attn", choices=["absorbed", "naive"], default="absorbed")
    fx.add_argument("--logit-stride", type=int, default=4)
    fx.add_argument("--full-rows", type=int, default=128, help="sequences up to this keep every row")
    fx.add_argument("--tf-seq", type=int, default=-1, help="sequence whose layer inputs are dumped")
    op = sub.add_parser("ops")
    op.add_argument("--config", required=True)
    op.add_argument("--out", required=True)
    op.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("--fixture", required=True)
    c.add_argument("--logits", required=True)
    c.add_argument("--mtp")
    c.add_argument("--topk", required=True)
    c.add_argument("--experts", required=True)
    h = sub.add_parser("hf")
    h.add_argument("--model", required=True)
    h.add_argument("--tokens", required=True)
    h.add_argument("--fixture", required=True)
    a = p.parse_args()
    return {"eval": cmd_eval, "fixture": cmd_fixture, "ops": cmd_ops, "compare": cmd_compare,
            "hf": cmd_hf}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
