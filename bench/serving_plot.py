#!/usr/bin/env python3
"""Plots serving_bench's --csv: latency (TTFT and end-to-end, p50 and p99) and throughput against the
offered load, one line per batching mode.

usage: python3 bench/serving_plot.py serving.csv serving_latency_vs_load.png [--title TEXT]
"""
import argparse
import csv
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("--title", default="serving_bench")
    a = ap.parse_args()
    rows = defaultdict(list)
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            rows[r["mode"]].append({k: (v if k == "mode" else float(v)) for k, v in r.items()})
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.5))
    for mode, rs in rows.items():
        rs.sort(key=lambda r: r["rate"])
        x = [r["rate"] for r in rs]
        line = ax[0].plot(x, [r["ttft_p50_ms"] for r in rs], "o-", label=f"{mode} p50")[0]
        ax[0].plot(x, [r["ttft_p99_ms"] for r in rs], "x--", color=line.get_color(), label=f"{mode} p99")
        ax[1].plot(x, [r["e2e_p50_ms"] for r in rs], "o-", color=line.get_color(), label=f"{mode} p50")
        ax[1].plot(x, [r["e2e_p99_ms"] for r in rs], "x--", color=line.get_color(), label=f"{mode} p99")
        ax[2].plot(x, [r["tok_per_s"] for r in rs], "o-", color=line.get_color(), label=mode)
    for i, (t, y) in enumerate([("time to first token", "ms"), ("end-to-end latency", "ms"), ("throughput", "tokens/s")]):
        ax[i].set_title(t)
        ax[i].set_xlabel("offered load (requests/s, Poisson)")
        ax[i].set_ylabel(y)
        ax[i].set_xscale("log")
        if i < 2:
            ax[i].set_yscale("log")
        ax[i].grid(True, which="both", alpha=0.3)
        ax[i].legend(fontsize=7)
    fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
