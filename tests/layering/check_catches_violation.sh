#!/usr/bin/env bash
# The layering check must fail on a tree that breaks the rule (so a green check means something).
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kernels/cpu" "$tmp/stage_worker/engine/src" "$tmp/transport"
echo '#include "caf/all.hpp"' > "$tmp/kernels/cpu/bad.cpp"
echo '#include <toml++/toml.hpp>' > "$tmp/stage_worker/engine/src/bad.cpp"
echo '  #  include <caf/actor.hpp>' > "$tmp/transport/bad.hpp"
out=$("$here/check_layering.sh" "$tmp") && { echo "check passed a broken tree"; exit 1; }
for f in kernels/cpu/bad.cpp stage_worker/engine/src/bad.cpp transport/bad.hpp; do
  grep -q "$f" <<<"$out" || { echo "violation in $f not reported:"; echo "$out"; exit 1; }
done
echo "layering check catches violations"
