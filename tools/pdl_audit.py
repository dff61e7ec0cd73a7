#!/usr/bin/env python3
"""pdl_audit.py BUILD_DIR — non-coherent loads that ptxas moved above griddepcontrol.wait.

Under programmatic dependent launch a kernel is resident while the kernel before it still
writes its outputs; griddepcontrol.wait (SASS: ACQBULK) is where those outputs become
readable. ptxas orders ordinary loads after it, but not ld.global.nc (__ldg, and what the
compiler makes of `const __restrict__` pointers; SASS: LDG.*.CONSTANT): those promise data that
no one writes while the kernel lives, and ptxas may hoist them above the wait. Session 24 found
it doing so in k_moe_gate_logits1s (one of x's loads above ACQBULK: the router read the norm's
output before the norm had finished whenever the two overlapped).

For every kernel of BUILD_DIR/ptx/*.ptx that waits, this compares the ld.global.nc loads before
the first griddepcontrol.wait in the PTX with the LDG.*.CONSTANT loads before the first ACQBULK
in the SASS of BUILD_DIR/ptx/*.cubin (cuobjdump: the GPU machine has it, this one does not).
More in the SASS: ptxas hoisted loads across the wait; each such kernel is listed with the
hoisted loads' SASS lines. A hoisted load that reads the previous kernel's output is a race;
one that reads constants (weights) is harmless, so the list is for reading, not a verdict.
Exit status 1 when any kernel is listed, 2 when cuobjdump is missing.

pdl_audit.py --ptx BUILD_DIR (no cuobjdump needed: this machine) lists instead every waiting
kernel with ld.global.nc loads after the wait in its PTX: the candidates, safe only while
ptxas leaves them there.

The driver compiles the PTX again when it loads the module (the binary embeds PTX), with the
ptxas of its own CUDA version; the offline cubin approximates that compilation.
"""
import glob
import os
import re
import shutil
import subprocess
import sys


def ptx_entries(text):
    """{kernel: body} of every .entry in a PTX file"""
    out = {}
    for m in re.finditer(r"\.entry (\w+)\((.*?)\n\}\n", text, re.S):
        out[m.group(1)] = m.group(2)
    return out


def sass_functions(text):
    """{kernel: [instruction lines]} from cuobjdump -sass output"""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\w+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        if cur and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            out[cur].append(line.strip())
    return out


def nc_loads(ptx_text):
    """ld.global.nc loads in a piece of PTX"""
    return len(re.findall(r"ld\.global\.nc", ptx_text))


def ptx_candidates(build):
    """--ptx: the waiting kernels with non-coherent loads after the wait"""
    n = 0
    for ptx in sorted(glob.glob(os.path.join(build, "ptx", "*.ptx"))):
        for name, body in sorted(ptx_entries(open(ptx).read()).items()):
            if "griddepcontrol.wait" not in body:
                continue
            i = body.index("griddepcontrol.wait")
            after = nc_loads(body[i:])
            if after:
                n += 1
                before = nc_loads(body[:i])
                print(f"{os.path.basename(ptx)} {name}: ld.global.nc {before} before the wait, "
                      f"{after} after")
    print(f"pdl_audit --ptx: {n} waiting kernels with non-coherent loads after the wait")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--ptx":
        return ptx_candidates(sys.argv[2])
    if len(sys.argv) != 2:
        sys.stderr.write(__doc__)
        return 64
    build = sys.argv[1]
    tool = shutil.which("cuobjdump")
    if not tool:
        sys.stderr.write("pdl_audit: cuobjdump not found (run it on the GPU machine)\n")
        return 2
    listed = checked = 0
    for ptx in sorted(glob.glob(os.path.join(build, "ptx", "*.ptx"))):
        cubin = ptx[:-4] + ".cubin"
        if not os.path.exists(cubin):
            continue
        entries = ptx_entries(open(ptx).read())
        waiting = {k: b for k, b in entries.items() if "griddepcontrol.wait" in b}
        if not waiting:
            continue
        sass = sass_functions(subprocess.run([tool, "-sass", cubin], capture_output=True,
                                             text=True).stdout)
        for name, body in sorted(waiting.items()):
            code = sass.get(name)
            if code is None:
                continue
            checked += 1
            ptx_before = nc_loads(body[: body.index("griddepcontrol.wait")])
            wait = next((i for i, l in enumerate(code) if "ACQBULK" in l), None)
            if wait is None:
                continue
            before = [l for l in code[:wait] if re.search(r"LDG\.[A-Z0-9.]*CONSTANT", l)]
            if len(before) > ptx_before:
                listed += 1
                print(f"{os.path.basename(ptx)} {name}: {len(before)} LDG.CONSTANT before ACQBULK, "
                      f"{ptx_before} ld.global.nc before griddepcontrol.wait in the PTX")
                for l in before:
                    print("    " + re.sub(r"\s*/\* 0x[0-9a-f]+ \*/", "", l))
    print(f"pdl_audit: {checked} waiting kernels checked, {listed} with loads hoisted above the wait")
    return 1 if listed else 0


if __name__ == "__main__":
    sys.exit(main())
