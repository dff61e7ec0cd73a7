#!/bin/sh
# Collects what tools/gpu_session.sh needs into one small folder that travels to the GPU
# machine (the device tool's `carry`): the binaries built here and the tokenizer.
# Usage: tools/gpu_bundle.sh BUILD_DIR BUNDLE_DIR
set -e
build=$1
bundle=$2
rm -rf "$bundle"
mkdir -p "$bundle"
for f in gpu_test_runner test_runner dsv32 dsv32d mkmodel; do
  [ -x "$build/$f" ] && cp "$build/$f" "$bundle/"
done
[ -f "$build/tokenizer/tokenizer.json" ] && cp "$build/tokenizer/tokenizer.json" "$bundle/"
# the GPU image's pieces, for tools/image_gpu_check.sh (make BUILD=... static mkimage)
[ -x "$build/mkimage" ] && cp "$build/mkimage" "$bundle/"
[ -x "$build/static/dsv32-init" ] && mkdir -p "$bundle/static" && cp "$build/static/dsv32-init" "$bundle/static/"
# the kernels' PTX and offline cubins, for tools/pdl_audit.py (the GPU machine has cuobjdump)
if ls "$build"/ptx/*.cubin >/dev/null 2>&1; then
  mkdir -p "$bundle/ptx"
  cp "$build"/ptx/*.ptx "$build"/ptx/*.cubin "$bundle/ptx/"
fi
du -sh "$bundle"
# extra commands for tools/gpu_session.sh (one shell line each), when the caller names a file
[ -n "${EXTRA_FILE:-}" ] && [ -f "$EXTRA_FILE" ] && cp "$EXTRA_FILE" "$bundle/EXTRA"
true
