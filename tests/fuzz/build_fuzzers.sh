#!/usr/bin/env bash
# Makes the clang build of the fuzz targets for the fuzz.run tests (tests/fuzz/CMakeLists.txt).
# A failure is reported, not fatal: the main build carries on and the fuzz.run tests fail with the log.
# usage: build_fuzzers.sh SCRIPTS_FUZZ BUILD_DIR TARGET...
set -uo pipefail
fuzz=$1; dir=$2; shift 2
mkdir -p "$dir"
rm -f "$dir/BUILD_FAILED"
if ! "$fuzz" --dir "$dir" --build-only "$@" >"$dir/build.log" 2>&1; then
  touch "$dir/BUILD_FAILED"
  echo "conveyor: the clang build of the fuzz targets failed (the fuzz.run tests will fail); log: $dir/build.log"
  tail -n 20 "$dir/build.log"
fi
exit 0
