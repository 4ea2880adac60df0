#!/bin/bash
# One device call (attnb: decode attention ring): tests, decode attention chain table, b=64/256 steps
# with ring_decode 0/1/2, then ncu of the decode attention kernels of one b=64 step if time is left.
# env: STEPS="test time bench ncu", BENCH_VARIANTS, LIMIT_S
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(dirname "$here"); cd "$root"
out=${OUT:-/tmp/out}; mkdir -p "$out"
t0=$(date +%s); note() { echo "[+$(($(date +%s)-t0))s] $*"; }
left() { echo $(( ${LIMIT_S:-170} - ($(date +%s) - t0) )); }
steps=${STEPS:-"test time bench ncu"}
mkdir -p /tmp/pack && tar -xJf "$here/pack.tar.xz" -C /tmp/pack
export LD_LIBRARY_PATH=/tmp/pack/lib; bin=/tmp/pack/bin
mkdir -p /work/wt && ln -sfn "$root" /work/wt/attnb
if [[ $steps == *bench* ]]; then
  PYTHONUNBUFFERED=1 python3 bench/hf_peer_bench.py --work /tmp/bench-model --build-only >"$out/hf.log" 2>&1 &
fi
note "unpacked"
if [[ $steps == *test* ]]; then
  timeout 60 "$bin/test_cuda_ops" --gtest_filter="${TEST_FILTER:-*attention_fast*:*ring*:*rope_once*:*rope_kv_write*:*capture*}" >"$out/tests.log" 2>&1; rc=$?
  note "tests rc=$rc"; grep -E '^\[  (PASSED|FAILED)|^\[       OK|Failure|Expected|Which is|first difference' "$out/tests.log" | head -40
  grep '^\[parity\]' "$out/tests.log" | grep -E 'ring|decode 64|rope_once out' | sort -k6 -g | tail -4
  if [ $rc -ne 0 ]; then timeout 40 compute-sanitizer --tool memcheck --print-limit 5 "$bin/test_cuda_ops" --gtest_filter='*ring*/bf16' 2>&1 | grep -v '^\[' | head -30; fi
fi
if [[ $steps == *time* ]]; then
  timeout 60 "$bin/time_cuda_ops" attention >"$out/time.log" 2>&1; note "time_cuda_ops rc=$?"; cat "$out/time.log"
fi
if [[ $steps == *bench* ]]; then
  for i in $(seq 1 120); do [ -f /tmp/bench-model/READY ] && break; sleep 1; done
  note "model ready: $([ -f /tmp/bench-model/READY ] && echo yes || echo NO)"; tail -2 "$out/hf.log"
  for v in ${BENCH_VARIANTS:-ring0 early ring1c ring0c ring1 early ring0 ring1c}; do
    [ "$(left)" -gt 25 ] || { note "skip $v (time)"; continue; }
    timeout 40 "$bin/conveyor_bench" --model /tmp/bench-model --variants "$v" --ceilings 0 --ablate ${BENCH_ABLATE:-64,256} \
      >>"$out/bench.log" 2>&1; note "$v rc=$?"
  done
  grep '"decode"' "$out/bench.log" | sed 's/.*"variant": "\([a-z0-9]*\)", "batch": \([0-9]*\), "step_ms": \([0-9.]*\).*"decode_tok_s": \([0-9.]*\).*/\1 b=\2 step \3 ms \4 tok\/s/'
fi
if [[ $steps == *ncu* ]] && [ -f /tmp/bench-model/READY ]; then
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for v in ${NCU_VARIANTS:-ring0 ring1 ring1c early}; do
    [ -n "$ncu_bin" ] && [ "$(left)" -gt 25 ] || { note "skip ncu $v"; continue; }
    timeout 30 "$ncu_bin" --clock-control none --profile-from-start off -k regex:decode_gqa --csv --print-units base \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__shared_mem_config_size,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__waves_per_multiprocessor,sm__warps_active.avg.pct_of_peak_sustained_active --log-file "$out/ncu_$v.csv" \
      "$bin/conveyor_bench" --model /tmp/bench-model --profile decode64 --profile-variant "$v" >/dev/null 2>&1
    note "ncu $v rc=$?"
    python3 - "$out/ncu_$v.csv" "$v" <<'PY'
import csv, sys, statistics
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h = rows[0]; ki = h.index("Kernel Name"); mi = h.index("Metric Name"); vi = h.index("Metric Value")
t = {}
for r in rows[1:]:
    t.setdefault((r[ki][:60], r[mi]), []).append(float(r[vi].replace(",", "")))
for (k, m), v in sorted(t.items()):
    print(f"ncu {sys.argv[2]}: {k} {m} n={len(v)} median={statistics.median(v):.4g}")
PY
  done
fi
note done
