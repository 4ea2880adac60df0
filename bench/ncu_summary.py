#!/usr/bin/env python3
"""Sums one profiled step's kernel durations by kernel, from an ncu CSV report
(ncu --csv --print-units base --metrics gpu__time_duration.sum --print-kernel-base demangled).
Kernels run one at a time under ncu, so the total is the step's kernel time without launch gaps
or overlap: a step's wall time minus it is what the gaps, the host and the tails cost.

usage: python3 bench/ncu_summary.py report.csv [label]
"""
import csv
import re
import sys


def short(name):
    name = re.sub(r"\(.*\)$", "", name.strip())  # the parameter list
    name = re.sub(r"conveyor::kernels::cuda::|\(anonymous namespace\)::|_GLOBAL__N__[0-9a-f_]+::", "", name)
    name = name.replace("__nv_bfloat16", "bf16")
    return name[:70]


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"{label}: no kernel rows (ncu output below)")
        print("\n".join(lines[-8:]))
        return 1
    rows = list(csv.DictReader(lines[start:]))
    totals, counts = {}, {}
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        k = short(r["Kernel Name"])
        v = float(r["Metric Value"].replace(",", ""))
        totals[k] = totals.get(k, 0.0) + v
        counts[k] = counts.get(k, 0) + 1
    all_ns = sum(totals.values())
    print(f"{label}: {sum(counts.values())} kernels, {all_ns / 1e3:.1f} us of kernel time")
    for k, v in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {v / 1e3:9.1f} us  {counts[k]:4d} x {v / counts[k] / 1e3:7.2f} us  {100 * v / all_ns:5.1f}%  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
