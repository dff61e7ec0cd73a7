#!/bin/sh
# Fails if a ptxas -v report shows register spills or a stack frame in any kernel.
# Usage: tools/check_spills.sh build/ptx/NAME.ptxas.txt
report=$1
if grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$report" >/dev/null; then
  echo "error: register spills in $report:"; grep -B2 -E "[1-9][0-9]* bytes spill" "$report"; exit 1
fi
exit 0
