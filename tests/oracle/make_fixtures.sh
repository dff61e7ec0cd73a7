#!/bin/bash
# make_fixtures.sh — regenerates the oracle fixtures of issue 4 (tests/data/oracle/) on the GPU
# machine, and checks them against our CPU forward in the same run (the self-check table).
#
#   tests/oracle/make_fixtures.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds mkmodel and dsv32 built from this tree (e.g. build/; if they are missing the
# script runs `make build/mkmodel build/dsv32` first). Run from anywhere; paths are resolved
# against the repository root. Needs python3 with torch (float8_e4m3fn), numpy, safetensors.
# Expected runtime on the H200 machine: about 2-3 minutes (measured 140 s: four small checkpoints, each run
# once by the oracle on the GPU and once by `dsv32 eval` on the CPU; op fixtures).
#
# Writes OUT_DIR/NAME/{manifest.txt,logits.npz,topk.npz,experts.npz,layers.npz} for every
# numerics config NAME (and NAME/naive/ = the oracle in the naive attention form, for the
# shallow configs), OUT_DIR/ops.npz, and OUT_DIR/selfcheck.txt (also printed). Copy
# OUT_DIR/* into tests/data/oracle/ to commit them (the tokens files there are the inputs).
set -u -o pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "${1:?usage: make_fixtures.sh BIN_DIR OUT_DIR}" 2>/dev/null && pwd || echo "$1")
out=${2:?usage: make_fixtures.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$out/selfcheck.txt
: > "$log"
say() { echo "$*" | tee -a "$log"; }
t0=$(date +%s)

cd "$root" || exit 1
if [ ! -x "$bin/mkmodel" ] || [ ! -x "$bin/dsv32" ]; then
  say "building mkmodel and dsv32 into build/"
  make -j"$(nproc)" build/mkmodel build/dsv32 >"$work/make.log" 2>&1 || { tail -30 "$work/make.log"; exit 1; }
  bin=$root/build
fi
say "== oracle fixtures: $(date -u)  host $(hostname)"
python3 -c 'import torch, numpy, safetensors; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tee -a "$log"

status=0
# name  structured  logit-stride  teacher-forced sequence (-1: none)  naive-form fixture too
while read -r name structured stride tf naive; do
  [ -z "$name" ] && continue
  cfg=tests/data/numerics_$name.json
  tok=tests/data/oracle/$name/tokens.txt
  m=$work/$name
  mkdir -p "$out/$name"
  flags=""
  [ "$structured" = 1 ] && flags=--structured
  if ! "$bin/mkmodel" --config "$cfg" --seed 1 --tokenizer fallback $flags --out "$m" \
       --manifest "$out/$name/manifest.txt" >"$work/$name.mkmodel.log" 2>&1; then
    say "FAIL mkmodel $name"; cat "$work/$name.mkmodel.log"; status=1; continue
  fi
  cp "$tok" "$out/$name/tokens.txt"
  if ! python3 tests/oracle/oracle.py fixture --model "$m" --tokens "$tok" --out "$out/$name" \
       --logit-stride "$stride" --full-rows 0 --tf-seq "$tf" 2>&1 | tee -a "$log"; then
    say "FAIL oracle fixture $name"; status=1; continue
  fi
  if [ "$naive" = 1 ] && ! python3 tests/oracle/oracle.py fixture --attn naive --model "$m" \
       --tokens "$tok" --out "$out/$name/naive" --logit-stride "$stride" --full-rows 0 \
       --tf-seq -1 2>&1 | tee -a "$log"; then
    say "FAIL oracle naive-form fixture $name"; status=1
  fi
  mtp=""
  grep -q '"num_nextn_predict_layers": 0' "$cfg" || mtp="--mtp-out $work/$name.mtp.npz"
  if ! "$bin/dsv32" eval --model "$m" --tokens "$tok" --threads "$(nproc)" \
       --logits-out "$work/$name.logits.npz" $mtp --dump-topk "$work/$name.topk.npz" \
       --dump-experts "$work/$name.experts.npz" >"$work/$name.eval.log" 2>&1; then
    say "FAIL dsv32 eval $name"; cat "$work/$name.eval.log"; status=1; continue
  fi
  python3 tests/oracle/oracle.py compare --fixture "$out/$name" --logits "$work/$name.logits.npz" \
    --mtp "$work/$name.mtp.npz" --topk "$work/$name.topk.npz" --experts "$work/$name.experts.npz" \
    2>&1 | tee -a "$log" || status=1
  # the same comparison against the oracle in the naive attention form (a second opinion)
  if python3 tests/oracle/oracle.py eval --attn naive --model "$m" --tokens "$tok" \
       --logits-out "$work/$name.naive.npz" --dump-topk "$work/$name.naive_topk.npz" \
       --dump-experts "$work/$name.naive_ex.npz" >/dev/null 2>&1; then
    echo -n "  (oracle naive form vs our absorbed form) " | tee -a "$log"
    python3 tests/oracle/oracle.py compare --fixture "$out/$name" --logits "$work/$name.naive.npz" \
      --topk "$work/$name.naive_topk.npz" --experts "$work/$name.naive_ex.npz" 2>&1 | tee -a "$log"
  fi
  # transformers' bf16 port as a second opinion on structure (informative; never fails the run)
  timeout 120 python3 tests/oracle/oracle.py hf --model "$m" --tokens "$tok" --fixture "$out/$name" \
    > "$work/$name.hf.log" 2>&1 && tee -a "$log" < "$work/$name.hf.log" | tail -1 \
    || { echo "  (transformers second opinion failed: $(tail -1 "$work/$name.hf.log"))" | tee -a "$log"; }
done <<'EOF'
tiny 1 4 1 0
wide 1 4 1 0
dense1 0 2 -1 1
moe1 1 2 -1 1
EOF

python3 tests/oracle/oracle.py ops --config tests/data/numerics_tiny.json --out "$out/ops.npz" \
  2>&1 | tee -a "$log" || status=1
# the optional second opinion on structure: transformers' bf16 deepseek_v32 port is not run here
# (no FP8, no Hadamard); see tests/oracle/README.md.
say "== done in $(( $(date +%s) - t0 )) s, status $status; sizes:"
du -sh "$out"/* 2>&1 | tee -a "$log"
exit $status
