#!/usr/bin/env python3
"""check_safetensors.py — reads a dsv32 checkpoint directory with the independent `safetensors`
package and compares it, tensor for tensor, with the manifest our C reader writes
(name, dtype, shape, sha256 of the raw bytes).

    build/mkmodel tiny --seed 1 --out /tmp/tiny --manifest /tmp/tiny.manifest
    python3 tests/gpu/check_safetensors.py /tmp/tiny --manifest /tmp/tiny.manifest
    # or let it run the C side:  --mkmodel build/mkmodel  (runs `mkmodel manifest --model DIR`)

Also checks: the index's weight_map against the shards, metadata.total_size, FP8 tensors hold no
NaN codes, weight_scale_inv values are finite, positive powers of two. Without the `safetensors`
package, --pure uses a small reader of its own (NOT independent; for a smoke run only).
Exit status 0 only if everything matches; the last line is the PASS/FAIL summary.
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys

DTYPES_TORCH = {
    "float8_e4m3fn": "F8_E4M3", "bfloat16": "BF16", "float16": "F16", "float32": "F32",
    "int32": "I32", "int64": "I64", "uint8": "U8",
}
SIZES = {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "U8": 1}


def shards_of(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            index = json.load(f)
        wm = index["weight_map"]
        return sorted(set(wm.values())), wm, index.get("metadata", {})
    return sorted(x for x in os.listdir(d) if x.endswith(".safetensors")), None, {}


def read_with_safetensors(path):
    """Yields (name, dtype, shape, raw bytes, info) through safetensors.safe_open (torch)."""
    import torch
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name).contiguous()
            dt = DTYPES_TORCH.get(str(t.dtype).replace("torch.", ""), str(t.dtype))
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            info = {}
            if dt == "F8_E4M3":
                info["nan"] = bool(torch.isnan(t.float()).any())
            if name.endswith("weight_scale_inv") and t.numel():
                v = t.float()
                info["bad_scale"] = bool((~torch.isfinite(v) | (v <= 0)).any())
                m, _ = torch.frexp(v)
                info["not_pow2"] = int((m.abs() != 0.5).sum())
            yield name, dt, list(t.shape), raw, info


def read_pure(path):
    """A minimal reader of our own (not independent): header + raw bytes."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        base = 8 + n
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            b, en = e["data_offsets"]
            f.seek(base + b)
            raw = f.read(en - b)
            info = {}
            if e["dtype"] == "F8_E4M3":
                info["nan"] = any((x & 0x7F) == 0x7F for x in raw)
            if name.endswith("weight_scale_inv"):
                vals = struct.unpack("<%df" % (len(raw) // 4), raw)
                info["bad_scale"] = any(not (v > 0 and v != float("inf")) for v in vals)
                bits = struct.unpack("<%dI" % (len(raw) // 4), raw)
                info["not_pow2"] = sum(1 for x in bits if x & 0x7FFFFF)
            yield name, e["dtype"], list(e["shape"]), raw, info


def load_manifest(text):
    m = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, dt, shape, sha = line.split()
        m[name] = (dt, [] if shape == "-" else [int(x) for x in shape.split(",")], sha)
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--manifest", help="file written by `mkmodel ... --manifest FILE`")
    ap.add_argument("--mkmodel", help="path of build/mkmodel: run `mkmodel manifest --model DIR`")
    ap.add_argument("--pure", action="store_true", help="use the built-in reader (not independent)")
    a = ap.parse_args()
    if a.manifest:
        with open(a.manifest) as f:
            manifest = load_manifest(f.read())
    elif a.mkmodel:
        out = subprocess.run([a.mkmodel, "manifest", "--model", a.dir], check=True,
                             capture_output=True, text=True).stdout
        manifest = load_manifest(out)
    else:
        ap.error("give --manifest FILE or --mkmodel PATH")
    reader = read_pure if a.pure else read_with_safetensors
    if not a.pure:
        try:
            import safetensors  # noqa: F401
            import torch  # noqa: F401
        except ImportError as ex:
            print("FAIL: the independent reader is unavailable (%s); use --pure for a smoke run" % ex)
            return 1
    print("reader: %s" % ("built-in pure-Python (NOT independent)" if a.pure else
                          "safetensors.safe_open(framework='pt')"))

    errors = []
    shards, wm, meta = shards_of(a.dir)
    seen = {}
    total = 0
    not_pow2 = 0
    for shard in shards:
        for name, dt, shape, raw, info in reader(os.path.join(a.dir, shard)):
            if name in seen:
                errors.append("%s: in both %s and %s" % (name, seen[name], shard))
            seen[name] = shard
            total += len(raw)
            if wm is not None and wm.get(name) != shard:
                errors.append("%s: weight_map says %s, found in %s" % (name, wm.get(name), shard))
            exp = manifest.get(name)
            if exp is None:
                errors.append("%s: in %s but not in the manifest" % (name, shard))
                continue
            sha = hashlib.sha256(raw).hexdigest()
            if (dt, shape, sha) != exp:
                errors.append("%s: safetensors reads %s %s %s..., manifest says %s %s %s..." %
                              (name, dt, shape, sha[:16], exp[0], exp[1], exp[2][:16]))
            if info.get("nan"):
                errors.append("%s: FP8 NaN codes" % name)
            if info.get("bad_scale"):
                errors.append("%s: a scale is not finite and positive" % name)
            not_pow2 += info.get("not_pow2", 0)
    for name in manifest:
        if name not in seen:
            errors.append("%s: in the manifest but not read from any shard" % name)
    if wm is not None:
        for name in wm:
            if name not in seen:
                errors.append("%s: in weight_map but in no shard" % name)
        if "total_size" in meta and meta["total_size"] != total:
            errors.append("metadata.total_size %s != %d bytes of tensors" % (meta["total_size"], total))
    for e in errors[:50]:
        print("  mismatch: " + e)
    print("%d tensors in %d shards, %d bytes; %d weight_scale_inv values not a power of two" %
          (len(seen), len(shards), total, not_pow2))
    if errors:
        print("FAIL: %d mismatches between the safetensors reader and the dsv32 manifest" % len(errors))
        return 1
    print("PASS: %d tensors identical (name, dtype, shape, sha256)" % len(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
