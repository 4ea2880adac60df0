#!/bin/bash
# One device call: SASS check, parity test, per-shape linears (cuBLAS / mma.sync / wgmma), b=64 step.
# env: STEPS="sass test lin bench" (subset), BENCH_VARIANTS, LIN_ENV (extra env runs of --linears)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(dirname "$here"); cd "$root"
out=${OUT:-/tmp/out}; mkdir -p "$out"
t0=$(date +%s); note() { echo "[+$(($(date +%s)-t0))s] $*"; }
steps=${STEPS:-"sass test lin bench"}
mkdir -p /tmp/pack && tar -xJf "$here/pack.tar.xz" -C /tmp/pack
export LD_LIBRARY_PATH=/tmp/pack/lib; bin=/tmp/pack/bin
mkdir -p /work/wt && ln -sfn "$root" /work/wt/wgmma
if [[ $steps == *bench* ]]; then
  PYTHONUNBUFFERED=1 python3 bench/hf_peer_bench.py --work /tmp/bench-model --build-only >"$out/hf.log" 2>&1 &
fi
note "unpacked"
if [[ $steps == *sass* ]]; then
  cuobjdump -sass "$bin/time_cuda_ops" 2>/dev/null | awk '/Function : .*skinny_wgmma_kernel/{f=1} /Function : /&&!/skinny_wgmma/{f=0} f' >"$out/sass.txt"
  echo "sass: $(grep -c HGMMA "$out/sass.txt") HGMMA, $(grep -c 'UTMALDG' "$out/sass.txt") UTMALDG, $(grep -c 'LDL\|STL' "$out/sass.txt") LDL/STL, $(wc -l <"$out/sass.txt") lines"
fi
if [[ $steps == *test* ]]; then
  timeout 60 "$bin/test_cuda_ops" --gtest_filter='*skinny_wgmma*bf16' >"$out/tests.log" 2>&1; rc=$?
  note "tests rc=$rc"; grep -E '^\[  (PASSED|FAILED)|Failure|Expected|Which is|worst' "$out/tests.log" | head -20
  grep '^\[parity\]' "$out/tests.log" | grep wgmma | sort -k6 -g | tail -3
  [ $rc -ne 0 ] && steps=${steps/bench/}
  [ $rc -eq 124 ] && { note "test hung: stopping"; exit 1; }
  if [ $rc -ne 0 ]; then timeout 60 compute-sanitizer --tool memcheck --print-limit 5 "$bin/test_cuda_ops" --gtest_filter='*skinny_wgmma*/bf16' 2>&1 | grep -v '^\[' | head -30; fi
fi
if [[ $steps == *lin* ]]; then
  timeout 60 "$bin/time_cuda_ops" --linears >"$out/linears.log" 2>&1; note "linears rc=$?"; cat "$out/linears.log"
  for e in ${LIN_ENV:-}; do
    f="$out/linears-$(echo "$e" | tr '=,' '__').log"
    env ${e//,/ } timeout 40 "$bin/time_cuda_ops" --linears >"$f" 2>&1; note "linears $e rc=$?"
    grep 'n=64\|n=128' "$f" | sed 's/ *cuBLAS *\([0-9.]*\) us.*wgmma *\([0-9.]*\) us.*/ cuBLAS \1 wgmma \2/'
  done
fi
if [[ $steps == *ncu* ]]; then  # NCU_SHAPES="o_proj:64 gate_up:64": sections of the wgmma kernel alone
  for sn in ${NCU_SHAPES:-o_proj:64}; do
    timeout 40 ncu --clock-control none --kernel-name regex:skinny_wgmma --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
      "$bin/time_cuda_ops" --linears ${sn%%:*} ${sn##*:} >"$out/ncu-${sn%%:*}-${sn##*:}.txt" 2>&1
    note "ncu $sn rc=$?"
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Shared Memory Config|Dynamic Shared|Achieved Occupancy|Cluster|Warp Cycles Per Issued|Compute \(SM\)" "$out/ncu-${sn%%:*}-${sn##*:}.txt" | head -24
  done
fi
if [[ $steps == *bench* ]]; then
  for i in $(seq 1 120); do [ -f /tmp/bench-model/READY ] && break; sleep 1; done
  note "model ready: $([ -f /tmp/bench-model/READY ] && echo yes || echo NO)"; tail -2 "$out/hf.log"
  for ve in ${BENCH_VARIANTS:-nowgmma wgmma nowgmma wgmma}; do  # VARIANT[:ENV=V,ENV=V]
    v=${ve%%:*}; e=""; [ "$v" != "$ve" ] && e=${ve#*:}
    echo "run $ve" >>"$out/bench.log"
    env ${e//,/ } timeout 60 "$bin/conveyor_bench" --model /tmp/bench-model --variants "$v" --ceilings 0 --ablate ${BENCH_ABLATE:-64,128} \
      >>"$out/bench.log" 2>&1; note "$ve rc=$?"
  done
  grep '"decode"\|^run' "$out/bench.log" | sed 's/.*"variant": "\([a-z]*\)", "batch": \([0-9]*\), "step_ms": \([0-9.]*\).*"decode_tok_s": \([0-9.]*\).*/\1 b=\2 step \3 ms \4 tok\/s/'
  for pe in ${PROFILE:-}; do  # VARIANT[:ENV=V]: ncu kernel times of one b=64 step
    v=${pe%%:*}; e=""; [ "$v" != "$pe" ] && e=${pe#*:}
    env ${e//,/ } timeout 45 ncu --clock-control none --profile-from-start off --print-kernel-base demangled --csv \
      --print-units base --metrics gpu__time_duration.sum --log-file /tmp/ncu_$v.csv \
      "$bin/conveyor_bench" --model /tmp/bench-model --profile decode64 --profile-variant "$v" >/dev/null 2>>"$out/profile.txt"
    note "ncu $pe rc=$?"; cp /tmp/ncu_$v.csv "$out/" 2>/dev/null
    python3 bench/ncu_summary.py /tmp/ncu_$v.csv "decode64:$pe" >>"$out/profile.txt" 2>&1
  done
  [ -n "${PROFILE:-}" ] && cat "$out/profile.txt"
fi
note done
