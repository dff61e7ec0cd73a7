#!/bin/sh
# Fails if a ptxas -v report shows register spills in any kernel, or wgmma instructions that
# ptxas serialised (C7514: non-wgmma instructions touching an in-flight accumulator, e.g. a
# run-time branch around a wgmma.wait_group; the kernel still runs, each wgmma then waits for
# the previous one).
# Usage: tools/check_spills.sh build/ptx/NAME.ptxas.txt
# Kernels named *_traced (diagnosis twins that record timelines) are exempt from the spill check.
report=$1
spills=$(awk '/Function properties for/ { fn = $NF }
	/[1-9][0-9]* bytes spill (stores|loads)/ && fn !~ /_traced$/ { print fn ": " $0 }' "$report")
if [ -n "$spills" ]; then
  echo "error: register spills in $report:"; echo "$spills"; exit 1
fi
if grep -F "C7514" "$report" >/dev/null; then
  echo "error: wgmma serialised by ptxas in $report:"; grep -F "C7514" "$report"; exit 1
fi
exit 0
