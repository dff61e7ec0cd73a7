#!/bin/bash
# One GPU session in one call (run on the GPU machine from the repository root):
#   tools/gpu_session.sh BUNDLE_DIR OUT_DIR
# BUNDLE_DIR holds binaries built on the development machine (tools/gpu_bundle.sh makes it):
# gpu_test_runner, dsv32, dsv32d, mkmodel, and tokenizer.json. Steps, each logged to OUT_DIR:
#   1. the GPU and driver, and tools/pdl_audit.py over the bundle's ptx/ (loads ptxas hoisted
#      above griddepcontrol.wait);  2. every GPU test (kernels against the CPU backend);
#   3. the same under compute-sanitizer memcheck;  4. benchmarks;
#   5. the tiny checkpoint read back by the independent `safetensors` Python reader;
#   6. the GPU appliance image's tree on this driver (tools/image_gpu_check.sh), where the
#      bundle has static/dsv32-init and mkimage.
# Environment: SKIP_TESTS (also step 5), SKIP_SANITIZER, SKIP_DAEMON, SKIP_ORACLE, SKIP_IMAGE=1
# leave steps out; BENCHES (default "gemm attention moe"); TEST_TIMEOUT, BENCH_TIMEOUT,
# EXTRA_TIMEOUT in seconds. Two sessions may run at once on a two-GPU machine
# (CUDA_VISIBLE_DEVICES, separate OUT_DIRs).
set -u
bundle=${1:?bundle dir}
top=${2:?out dir}
out=$top/logs # every log; packed into logs.tgz at the end (the device tool returns <= 8 files)
mkdir -p "$out"
summary=$top/summary.txt
: > "$summary"
step() { echo "== $*" | tee -a "$summary"; }

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$summary"
date -u | tee -a "$summary"

if [ -d "$bundle/ptx" ] && command -v cuobjdump >/dev/null; then
  step "non-coherent loads hoisted above griddepcontrol.wait (tools/pdl_audit.py)"
  python3 tools/pdl_audit.py "$bundle" > "$out/pdl_audit.log" 2>&1
  echo "exit status $?" >> "$out/pdl_audit.log"
  tail -n 20 "$out/pdl_audit.log" | tee -a "$summary"
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "GPU tests"
  DSV32_BIN=$bundle timeout "${TEST_TIMEOUT:-300}" "$bundle/gpu_test_runner" > "$out/gpu_tests.log" 2>&1
  tail -n 1 "$out/gpu_tests.log" | tee -a "$summary"
  grep -E "^FAIL|worst|sm_" "$out/gpu_tests.log" | head -40 | tee -a "$summary"
fi

if [ "${SKIP_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer memcheck over the GPU tests"
  DSV32_BIN=$bundle timeout 400 compute-sanitizer --tool memcheck --target-processes all \
    --print-limit 20 "$bundle/gpu_test_runner" > "$out/sanitizer.log" 2>&1
  # a timed-out compute-sanitizer may leave its target running (s34: the benches right after
  # one read HBM at 1.39 TB/s on an H100, as if shared); nothing timed may share the GPU with it
  pkill -KILL -f "$bundle/gpu_test_runner" 2>/dev/null && sleep 1
  grep -E "ERROR SUMMARY|passed, " "$out/sanitizer.log" | sort | uniq -c | tee -a "$summary"
fi

if [ "${SKIP_DAEMON:-0}" != 1 ]; then
  # the real-dimension checkpoint is written in the background while the GPU tests run
  ( "$bundle/mkmodel" real --layers 2 --dense 1 --seed 1 --out /tmp/dsv32-real21 \
      --tokenizer "$bundle/tokenizer.json" > "$out/mkmodel_real21.log" 2>&1 ) &
  real_pid=$!
fi

for b in ${BENCHES-gemm attention moe}; do
  step "bench $b"
  timeout "${BENCH_TIMEOUT:-150}" "$bundle/dsv32" bench $b > "$out/bench_$b.txt" 2>&1
  echo "exit status $?" >> "$out/bench_$b.txt"
  cat "$out/bench_$b.txt" >> "$summary"
done

# EXTRA: one shell line per command (B = the bundle dir), each logged to extra_N.log
if [ -f "$bundle/EXTRA" ]; then
  n=0
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    n=$((n + 1))
    step "extra $n: $line"
    t0=$SECONDS
    B=$bundle timeout "${EXTRA_TIMEOUT:-90}" bash -c "$line" > "$out/extra_$n.log" 2>&1
    echo "exit status $? after $((SECONDS - t0)) s" >> "$out/extra_$n.log"
    tail -n 30 "$out/extra_$n.log" | tee -a "$summary"
  done < "$bundle/EXTRA"
fi

if [ "${SKIP_TESTS:-0}" != 1 ] && [ -x "$bundle/mkmodel" ] && [ -f tests/gpu/check_safetensors.py ]; then
  step "tiny checkpoint through the independent safetensors reader"
  m=/tmp/dsv32-tiny
  rm -rf "$m"
  "$bundle/mkmodel" tiny --seed 1 --out "$m" --tokenizer "$bundle/tokenizer.json" \
    --manifest "$m.manifest" > "$out/mkmodel.log" 2>&1
  tail -n 3 "$out/mkmodel.log" | tee -a "$summary"
  python3 tests/gpu/check_safetensors.py "$m" --manifest "$m.manifest" > "$out/check_safetensors.log" 2>&1
  tail -n 5 "$out/check_safetensors.log" | tee -a "$summary"
fi
if [ "${SKIP_DAEMON:-0}" != 1 ]; then
  step "dsv32d --backend cuda: pools and weight upload (its step is not on the GPU yet)"
  for m in /tmp/dsv32-tiny /tmp/dsv32-real21; do
    [ "$m" = /tmp/dsv32-real21 ] && { wait "$real_pid"; tail -n 1 "$out/mkmodel_real21.log" | tee -a "$summary"; }
    [ -f "$m/config.json" ] || { echo "no checkpoint $m" | tee -a "$summary"; continue; }
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null # cold page cache where allowed
    timeout 300 "$bundle/dsv32d" --model "$m" --backend cuda --socket /tmp/dsv32-gpu.sock \
      > "$out/daemon_$(basename $m).log" 2>&1
    echo "exit status $?" >> "$out/daemon_$(basename $m).log"
    grep -E "cuda backend|not yet on GPU|warm-up|exit status|<3>" "$out/daemon_$(basename $m).log" | tee -a "$summary"
  done
fi

if [ "${SKIP_IMAGE:-0}" != 1 ] && [ -x "$bundle/static/dsv32-init" ] && [ -x "$bundle/mkimage" ]; then
  step "the GPU image's tree on this driver (tools/image_gpu_check.sh)"
  timeout 400 tools/image_gpu_check.sh "$bundle" "$out/image_gpu" > "$out/image_gpu_check.log" 2>&1
  echo "exit status $?" >> "$out/image_gpu_check.log"
  tee -a "$summary" < "$out/image_gpu_check.log"
fi

if [ -f tests/oracle/READY_TO_RUN ]; then
  [ "${SKIP_ORACLE:-0}" = 1 ] || {
  step "PyTorch oracle fixtures"
  cmd=$(cat tests/oracle/READY_TO_RUN)
  mkdir -p "$out/oracle"
  BUNDLE=$bundle ORACLE_OUT=$out/oracle timeout 420 bash -c "$cmd" > "$out/oracle.log" 2>&1
  echo "oracle exit status $?" | tee -a "$summary"
  tail -n 40 "$out/oracle.log" | tee -a "$summary"
  (cd "$out" && tar czf "$top/oracle.tgz" oracle 2>/dev/null && rm -rf oracle)
  }
fi
(cd "$top" && tar czf logs.tgz logs && rm -rf logs)
cat "$summary"
