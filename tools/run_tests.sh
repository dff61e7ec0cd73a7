#!/bin/bash
# The README's test command (`make test`) ends here. It runs, in order:
#   1. the unit and end-to-end suite (build/test_runner), programs from build/;
#   2. the same suite built with ASan + UBSan (build/asan/test_runner), programs from build/asan/;
#   3. every libFuzzer target for FUZZ_SECONDS (default 60) each, from its seed corpus;
#   4. the appliance images booted under QEMU (tests/image/boot_test.sh: the CPU image, on a disk too, and the GPU image without a driver);
# and closes with exactly one line "N passed, N failed" summing all of them.
# Usage: tools/run_tests.sh BUILD_DIR
set -u
build=${1:-build}
fuzz_seconds=${FUZZ_SECONDS:-60}
passed=0
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

count() { # adds the runner's closing "N passed, N failed" to the totals
  local line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    echo "  (no summary line: counted as one failure)"; failed=$((failed + 1)); return
  fi
  passed=$((passed + $(echo "$line" | cut -d' ' -f1)))
  failed=$((failed + $(echo "$line" | cut -d' ' -f3)))
}

echo "== unit and end-to-end tests"
DSV32_BIN=$build "$build/test_runner" 2>&1 | tee "$log" | sed '$d'
count

echo "== the same suite under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  DSV32_BIN=$build/asan DSV32_SANITIZER=1 "$build/asan/test_runner" 2>&1 | tee "$log" | sed '$d'
count

echo "== fuzz smoke runs (${fuzz_seconds} s each)"
for f in "$build"/fuzz/fuzz_*; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  corpus=$build/fuzz/corpus/$name
  mkdir -p "$corpus"
  seeds=tests/fuzz/seeds/${name#fuzz_}
  [ -d "$seeds" ] || seeds=
  mkdir -p "$build/fuzz/artifacts"
  if "$f" -max_total_time="$fuzz_seconds" -rss_limit_mb=4096 -timeout=10 -print_final_stats=0 \
       -artifact_prefix="$build/fuzz/artifacts/$name-" "$corpus" $seeds >"$log" 2>&1; then
    echo "ok    fuzz.${name#fuzz_} ($(grep -E '^#[0-9]+.*DONE' "$log" | awk '{print $1}' | tr -d '#') runs)"
    passed=$((passed + 1))
  else
    echo "FAIL  fuzz.${name#fuzz_}"; tail -n 40 "$log"
    failed=$((failed + 1))
  fi
done

echo "== the appliance image booted under QEMU"
tests/image/boot_test.sh "$build" | tee "$log"
passed=$((passed + $(grep -c '^ok ' "$log")))
failed=$((failed + $(grep -c '^FAIL ' "$log")))
[ "$(grep -cE '^(ok|FAIL) ' "$log")" -eq 3 ] || { echo "  (the boot test did not report all three cases)"; failed=$((failed + 1)); }

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
