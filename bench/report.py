#!/usr/bin/env python3
"""Joins conveyor_bench's and hf_peer_bench.py's JSON lines into one table (ratios: roofline share,
MBU, MFU, speed-up over each peer), checks the issue's goals, and plots tokens/s against batch size.

usage: python3 bench/report.py --conveyor conveyor.jsonl --hf hf.jsonl [--png decode_vs_batch.png] [--md table.md]
"""
import argparse
import json


def load(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    except FileNotFoundError:
        pass
    return rows


def pick(rows, **kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]


def one(rows, **kw):
    m = pick(rows, **kw)
    return m[-1] if m else None


def fmt(x, spec="{:.0f}"):
    return "—" if x is None else spec.format(x)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conveyor", required=True)
    ap.add_argument("--hf", required=True)
    ap.add_argument("--png", default="")
    ap.add_argument("--md", default="")
    a = ap.parse_args()
    cv, hf = load(a.conveyor), load(a.hf)
    ceil = one(cv, kind="ceilings") or {}
    load_all = one(cv, kind="load", variant="all") or {}
    bw = ceil.get("copy_bytes_per_s")
    gemm = ceil.get("gemm_flops")
    step_bytes = load_all.get("step_weight_bytes")
    ceiling_steps = bw / step_bytes if bw and step_bytes else None

    lines = []
    out = lines.append
    out(f"device: {ceil.get('device', '?')}; copy bandwidth {fmt(bw and bw / 1e12, '{:.2f}')} TB/s (read+write), "
        f"bf16 GEMM {fmt(gemm and gemm / 1e12, '{:.0f}')} TFLOP/s (cuBLAS 8192^3)")
    out(f"decode ceiling: {fmt(step_bytes and step_bytes / 1e9, '{:.3f}')} GB of weights per step -> "
        f"{fmt(ceiling_steps)} steps/s")
    out("")
    out("| measurement | Conveyor | Conveyor base | ceiling share | HF eager | HF static+compile | x eager | x compile |")
    out("|---|---|---|---|---|---|---|---|")
    batches = sorted({r["batch"] for r in pick(cv, kind="decode")})
    plot = {"Conveyor": {}, "Conveyor (no speed paths)": {}, "HF eager": {}, "HF static+compile": {}}
    for b in batches:
        c = one(cv, kind="decode", variant="all", batch=b)
        base = one(cv, kind="decode", variant="base", batch=b)
        he = one(hf, peer="hf_eager", kind="decode", batch=b)
        hc = one(hf, peer="hf_compile", kind="decode", batch=b)
        ct = c and c["decode_tok_s"]
        share = c and f"{c['weight_roofline_frac']:.0%} roofline, MBU {c['mbu']:.0%}"
        out(f"| decode b={b} tok/s (step ms) | {fmt(ct)} ({fmt(c and c['step_ms'], '{:.3f}')}) | "
            f"{fmt(base and base['decode_tok_s'])} | {share or '—'} | {fmt(he and he['decode_tok_s'])} | "
            f"{fmt(hc and hc['decode_tok_s'])} | {fmt(ratio(ct, he and he['decode_tok_s']), '{:.1f}')} | "
            f"{fmt(ratio(ct, hc and hc['decode_tok_s']), '{:.1f}')} |")
        for name, r, key in (("Conveyor", c, "decode_tok_s"), ("Conveyor (no speed paths)", base, "decode_tok_s"),
                             ("HF eager", he, "decode_tok_s"), ("HF static+compile", hc, "decode_tok_s")):
            if r:
                plot[name][b] = r[key]
    for t in sorted({r["tokens"] for r in pick(cv, kind="prefill")}):
        c = one(cv, kind="prefill", variant="all", tokens=t)
        base = one(cv, kind="prefill", variant="base", tokens=t)
        he = one(hf, peer="hf_eager", kind="prefill", tokens=t)
        ct = c and c["tok_s"]
        out(f"| prefill {t} tok/s ({fmt(c and c['ms'], '{:.2f}')} ms) | {fmt(ct)} | {fmt(base and base['tok_s'])} | "
            f"{fmt(c and c['tflops'], '{:.0f}')} TFLOP/s, MFU {fmt(c and c['mfu'], '{:.0%}')} | {fmt(he and he['tok_s'])} | "
            f"(eager prefill) | {fmt(ratio(ct, he and he['tok_s']), '{:.1f}')} | — |")
    tt = one(cv, kind="ttft", variant="all")
    ttb = one(cv, kind="ttft", variant="base")
    he1 = one(hf, peer="hf_eager", kind="decode", batch=1)
    hc1 = one(hf, peer="hf_compile", kind="decode", batch=1)
    if tt:
        out(f"| time to first token, prompt {tt['prompt']}, ms | {tt['ttft_ms']:.2f} | {fmt(ttb and ttb['ttft_ms'], '{:.2f}')} | — | "
            f"{fmt(he1 and he1['ttft_batch_ms'], '{:.1f}')} | {fmt(hc1 and hc1['ttft_batch_ms'], '{:.1f}')} | "
            f"{fmt(ratio(he1 and he1['ttft_batch_ms'], tt['ttft_ms']), '{:.1f}')} | "
            f"{fmt(ratio(hc1 and hc1['ttft_batch_ms'], tt['ttft_ms']), '{:.1f}')} |")
    mem = one(cv, kind="memory", variant="all")
    hmem = max((r.get("max_mem_bytes", 0) for r in pick(hf, kind="decode")), default=None)
    if mem:
        out(f"| device memory used, GB | {mem['device_bytes_used_after_runs'] / 1e9:.2f} (weights {load_all.get('weight_bytes', 0) / 1e9:.2f}, "
            f"KV {load_all.get('kv_bytes', 0) / 1e9:.2f}) | — | — | {fmt(hmem and hmem / 1e9, '{:.2f}')} (peak allocated) | — | — | — |")
    out("")
    abl = pick(cv, kind="decode")
    variants = []
    for r in abl:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    if len(variants) > 2:  # ablations: one speed path on or off
        out("ablation (decode tok/s): " + "; ".join(
            f"{v}: " + ", ".join(f"b={r['batch']} {r['decode_tok_s']:.0f}" for r in pick(abl, variant=v)) for v in variants))
        # Every variant against the same run's peer and ceiling (the goals are read off "all").
        out("")
        out("| variant | batch | tok/s | step ms | roofline | x HF compile |")
        out("|---|---|---|---|---|---|")
        for v in variants:
            # Each variant runs in its own process and only the first measures the ceilings (the
            # others' weight_roofline_frac uses DESIGN.md's H200 bandwidth): share of this run's ceiling.
            vbytes = (one(cv, kind="load", variant=v) or {}).get("step_weight_bytes")
            for r in pick(abl, variant=v):
                hc = one(hf, peer="hf_compile", kind="decode", batch=r["batch"])
                share = (1e3 / r["step_ms"]) / (bw / vbytes) if bw and vbytes else r["weight_roofline_frac"]
                out(f"| {v} | {r['batch']} | {r['decode_tok_s']:.0f} | {r['step_ms']:.3f} | "
                    f"{share:.1%} | {fmt(ratio(r['decode_tok_s'], hc and hc['decode_tok_s']), '{:.2f}')} |")
    ta, tb = one(cv, kind="tokens", variant="all"), one(cv, kind="tokens", variant="base")
    if ta and tb:
        x, y = ta["batch1_greedy"], tb["batch1_greedy"]
        same = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        out(f"greedy tokens, batch 1, all speed paths vs none: first {same}/{len(x)} identical")
    for r in pick(hf, kind="skipped") + pick(hf, kind="error"):
        out(f"HF {r['peer']} batch {r['batch']}: {r['kind']}: {r.get('reason', r.get('error'))}")
    out("")
    # Goals (issue 8).
    c1 = one(cv, kind="decode", variant="all", batch=1)
    c64 = one(cv, kind="decode", variant="all", batch=64)
    hc64 = one(hf, peer="hf_compile", kind="decode", batch=64)
    p2k = one(cv, kind="prefill", variant="all", tokens=2048)
    g1 = c1 and c1["weight_roofline_frac"]
    g2 = ratio(c64 and c64["decode_tok_s"], hc64 and hc64["decode_tok_s"])
    g3 = p2k and p2k["mfu"]
    out(f"goal batch-1 decode >= 80% of the bandwidth roofline: {fmt(g1, '{:.1%}')} "
        f"-> {'MET' if g1 and g1 >= 0.8 else 'missed'}")
    out(f"goal batch-64 decode >= 5x HF static+compile: {fmt(g2, '{:.2f}')}x -> {'MET' if g2 and g2 >= 5 else 'missed'}")
    out(f"goal prefill 2048 >= 60% of the measured GEMM rate: {fmt(g3, '{:.1%}')} "
        f"-> {'MET' if g3 and g3 >= 0.6 else 'missed'}")
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, style in (("Conveyor", "o-"), ("Conveyor (no speed paths)", "o:"), ("HF static+compile", "s-"),
                            ("HF eager", "s:")):
            pts = sorted(plot[name].items())
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name)
        if ceiling_steps and batches:
            ax.plot(batches, [b * ceiling_steps for b in batches], "k--", lw=1,
                    label=f"weight-bandwidth roofline ({ceiling_steps:.0f} steps/s)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size (sequences decoding together)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"Llama-3.2-1B shape, bf16, {ceil.get('device', 'GPU')}: prompt 128, 128 new tokens")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
