#!/usr/bin/env bash
# Test fixture setup: installs the npm reference tokenizers into the build tree (pinned versions, once)
# and extracts their vocabularies and reference ids (extract_reference.mjs). When node or the npm
# registry is not there, writes OUT/SKIP with the reason and exits 0: the parity tests then skip.
# usage: npm_reference.sh SOURCE_DIR OUT_DIR
set -uo pipefail
src=${1:?usage: npm_reference.sh SOURCE_DIR OUT_DIR}
out=${2:?usage: npm_reference.sh SOURCE_DIR OUT_DIR}
mkdir -p "$out"
rm -f "$out/SKIP"
skip() { echo "$*" >"$out/SKIP"; echo "npm_reference: skipping: $*"; exit 0; }
command -v node >/dev/null || skip "node is not installed"
command -v npm >/dev/null || skip "npm is not installed"
pkgs="llama3-tokenizer-js@1.2.0 llama-tokenizer-js@1.2.2"
stamp="$out/npm/.installed-$(echo "$pkgs" | tr ' @/.' '____')"
if [ ! -f "$stamp" ]; then
  mkdir -p "$out/npm"
  # --prefer-offline: the npm cache answers without the network once it has the tarballs.
  if ! timeout 120 npm install --prefix "$out/npm" --no-save --no-audit --no-fund --prefer-offline $pkgs \
      >"$out/npm-install.log" 2>&1; then
    skip "npm install $pkgs failed (registry unreachable?): $(tail -n 3 "$out/npm-install.log" | tr '\n' ' ')"
  fi
  touch "$stamp"
fi
node "$src/extract_reference.mjs" "$out/npm/node_modules" "$src/corpus.json" "$out" || {
  echo "npm_reference: extract_reference.mjs failed" >&2
  exit 1
}
