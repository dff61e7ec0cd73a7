#!/bin/sh
# Fails if a ptxas -v report shows register spills in any kernel, or wgmma instructions that
# ptxas serialised (C7514: non-wgmma instructions touching an in-flight accumulator, e.g. a
# run-time branch around a wgmma.wait_group; the kernel still runs, each wgmma then waits for
# the previous one).
# Usage: tools/check_spills.sh build/ptx/NAME.ptxas.txt
report=$1
if grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$report" >/dev/null; then
  echo "error: register spills in $report:"; grep -B2 -E "[1-9][0-9]* bytes spill" "$report"; exit 1
fi
if grep -F "C7514" "$report" >/dev/null; then
  echo "error: wgmma serialised by ptxas in $report:"; grep -F "C7514" "$report"; exit 1
fi
exit 0
