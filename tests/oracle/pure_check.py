#!/usr/bin/env python3
"""pure_check.py -- the oracle's number formulas in pure Python (no torch, no numpy), exact
rational arithmetic, to validate them on a machine without torch against the C values.

  python3 tests/oracle/pure_check.py gen FILE        # writes inputs, one per line
  (C side prints "x code" / "row: scale codes..." for them; see tests/oracle/README.md)
  python3 tests/oracle/pure_check.py check FILE OUT  # compares the C output OUT with ours

Formulas checked: e4m3 (float8_e4m3fn) round to nearest even with subnormals and saturation
after the clamp to +-448 (spec 5.1); UE8M0 act_quant scales 2^ceil(log2(amax * fp32(1/448)))
on the fp32 bits with the 1e-4 floor; x / s in fp32 then e4m3 (spec 5.3).
"""
import random
import struct
import sys
from fractions import Fraction


def f32(x):
    """Round a Python float (double) to the nearest fp32 value."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def e4m3_values():
    """All finite float8_e4m3fn values by code (0x7f/0xff = NaN excluded)."""
    vals = {}
    for code in range(256):
        s, e, m = code >> 7, (code >> 3) & 15, code & 7
        if e == 15 and m == 7:
            continue
        v = Fraction(m, 8) * Fraction(1, 64) if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
        vals[code] = -v if s else v
    return vals


VALS = e4m3_values()
POS = sorted((v, c) for c, v in VALS.items() if v >= 0 and c < 128)


def e4m3_code(x):
    """Nearest e4m3 code, ties to the even mantissa (code parity), saturating at 448."""
    sign = 0x80 if (x < 0 or (x == 0 and str(x).startswith("-"))) else 0
    a = Fraction(abs(x))
    if a >= 448:
        return sign | 0x7E
    best = None
    for v, c in POS:
        d = abs(v - a)
        if best is None or d < best[0] or (d == best[0] and c % 2 == 0):
            best = (d, c)
    return sign | best[1]


def ue8m0_scale(amax):
    v = f32(amax * f32(1.0 / 448.0))
    b = f32_bits(v)
    e = ((b >> 23) & 0xFF) - 127 + (1 if b & 0x7FFFFF else 0)
    return struct.unpack("<f", struct.pack("<I", (e + 127) << 23))[0]


def act_quant(row):
    amax = max(max(abs(v) for v in row), f32(1e-4))
    s = ue8m0_scale(amax)
    return s, [e4m3_code(max(-448.0, min(448.0, f32(v / s)))) for v in row]


def gen(path):
    rng = random.Random(7)
    with open(path, "w") as f:
        vals = [v for v, _ in POS]
        for _ in range(3000):  # on, between and beside the grid
            a, b = float(rng.choice(vals)), float(rng.choice(vals))
            for x in (a, (a + b) / 2, a * (1 + rng.random() * 0.1)):
                f.write("e %r\n" % f32(rng.choice((1, -1)) * min(x, 448.0)))
        for x in (0.0, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -9 * 1.5, 448.0, 1e-30, 0.0078125 * 1.0625):
            f.write("e %r\n" % f32(x))
        for mag in (1.0, 1e-3, 3e-5, 448.0, 7.0, 56.0):
            row = [f32(rng.gauss(0, 1) * mag) for _ in range(128)]
            f.write("q " + " ".join(repr(v) for v in row) + "\n")


def check(inp, outp):
    bad = n = 0
    with open(inp) as fi, open(outp) as fo:
        for li, lo in zip(fi, fo):
            kind, rest = li.split(" ", 1)
            got = lo.split()
            if kind == "e":
                x = float(rest)
                want = [e4m3_code(x)]
                have = [int(got[0])]
            else:
                s, codes = act_quant([float(v) for v in rest.split()])
                want = [f32_bits(s)] + codes
                have = [f32_bits(float(got[0]))] + [int(v) for v in got[1:]]
            n += 1
            if want != have:
                bad += 1
                if bad <= 10:
                    print("MISMATCH", li.strip()[:80], "want", want[:8], "have", have[:8])
    print("pure_check: %d cases, %d mismatches" % (n, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2], sys.argv[3]))
