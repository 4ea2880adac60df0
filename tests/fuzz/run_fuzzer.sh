#!/usr/bin/env bash
# One fuzz.run test: fuzz TARGET for SECONDS with its libFuzzer binary in BUILD_DIR; fail on a crash
# (scripts/fuzz prints the log and where the crashing input is) or when the fuzz build failed.
# usage: run_fuzzer.sh SCRIPTS_FUZZ BUILD_DIR SECONDS TARGET
set -uo pipefail
fuzz=$1; dir=$2; seconds=$3; target=$4
if [ -f "$dir/BUILD_FAILED" ]; then
  echo "FAIL the clang build of the fuzz targets failed; $dir/build.log ends:"
  tail -n 40 "$dir/build.log"
  exit 1
fi
exec "$fuzz" --dir "$dir" --no-build "$seconds" "$target"
