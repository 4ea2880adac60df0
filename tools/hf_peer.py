#!/usr/bin/env python3
"""HF transformers as Conveyor's correctness peer at real model shapes (issue 5), on the GPU machine.

Builds LLaMA-family models of real shapes with random weights (transformers there, no download),
saves each as a normal HF directory in bf16, then for a few random prompts compares the prompt
logits of
  - HF in float32 (the reference: higher precision, TF32 off),
  - HF in bf16 (the peer: what "bf16 tolerance" means for this model),
  - Conveyor `generate --device cuda --dtype bf16 --logits-out` and `--dtype f32`,
by ‖Δ‖/‖ref‖ and top-1 agreement, and the greedy continuations of Conveyor bf16 and HF bf16.
Conveyor bf16 passes when its error against the f32 reference is within 2× HF bf16's own error and
its top-1 agreement is within 0.05 of min(0.9, HF bf16's); Conveyor f32 when its error is under 1e-3.

usage (device machine, repo root, after scripts/gpu-suite's pack is unpacked):
  python3 tools/hf_peer.py --conveyor .device-pack/bin/conveyor [--shapes llama-1b,qwen2-small] [--work /tmp/hf_peer]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import transformers

SHAPES = {
    # Llama-3.2-1B: GQA 32/8, head_dim 64, tied embeddings, llama3 rope scaling.
    "llama-1b": dict(
        cls="LlamaForCausalLM", config="LlamaConfig",
        args=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                  max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001,
                  rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=8192))),
    # Qwen2.5-1.5B's layer shape (q/k/v bias, GQA 12/2, head_dim 128, tied), fewer layers to save time.
    "qwen2-small": dict(
        cls="Qwen2ForCausalLM", config="Qwen2Config",
        args=dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=8, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645,
                  rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
}


def build(name, work):
    spec = SHAPES[name]
    cfg = getattr(transformers, spec["config"])(**spec["args"])
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = getattr(transformers, spec["cls"])(cfg)
    # Rotary inv_freq is a float buffer that .to(bfloat16) would round, moving every angle by
    # pos × its rounding error; Conveyor (and HF in float32) keep it in float32, so keep it there.
    model._fp32_buffers = {n: b.detach().clone() for n, b in model.named_buffers() if "inv_freq" in n}
    to_dtype(model, torch.bfloat16)
    # HF initialises biases to 0 and norm weights to 1: randomise them so a loader that drops them fails.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0.0, 0.02)
            elif "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    path = os.path.join(work, name)
    model.save_pretrained(path)
    return model.eval(), path


def to_dtype(model, dtype):
    """Casts parameters, then puts the float32 rotary buffers back."""
    model.to(dtype)
    for name, saved in model._fp32_buffers.items():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, saved.clone())
    return model


def rel(a, b):
    return ((a - b).float().norm() / b.float().norm()).item()


def top1(a, b):
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item()


def conveyor_logits(exe, path, ids, dtype, vocab, new_tokens):
    out_file = os.path.join(path, f"conveyor_{dtype}.bin")
    cmd = [exe, "generate", "--model", path, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens",
           str(new_tokens), "--ignore-eos", "--device", "cuda", "--dtype", dtype, "--logits-out", out_file]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"conveyor failed ({r.returncode}): {r.stderr.strip()}")
    logits = torch.from_file(out_file, size=len(ids) * vocab, dtype=torch.float32).view(len(ids), vocab)
    return logits, json.loads(r.stdout)["tokens"], secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conveyor", default=".device-pack/bin/conveyor")
    ap.add_argument("--shapes", default="llama-1b,qwen2-small")
    ap.add_argument("--work", default="/tmp/hf_peer")
    ap.add_argument("--prompt-lens", default="7,128")
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.work, exist_ok=True)
    ok = True
    rows = []
    for name in a.shapes.split(","):
        model, path = build(name, a.work)
        vocab = model.config.vocab_size
        gen = torch.Generator().manual_seed(1)
        for plen in map(int, a.prompt_lens.split(",")):
            ids = torch.randint(0, vocab, (plen,), generator=gen).tolist()
            x = torch.tensor([ids], device="cuda")
            with torch.no_grad():
                hf_bf16 = model(x).logits[0].float().cpu()
                hf_tokens = model.generate(x, max_new_tokens=a.new_tokens, do_sample=False, min_new_tokens=a.new_tokens,
                                           attention_mask=torch.ones_like(x))[0, plen:].tolist()
                ref = to_dtype(model, torch.float32)(x).logits[0].cpu()
                to_dtype(model, torch.bfloat16)
            cv_bf16, cv_tokens, secs_bf16 = conveyor_logits(a.conveyor, path, ids, "bf16", vocab, a.new_tokens)
            cv_f32, _, secs_f32 = conveyor_logits(a.conveyor, path, ids, "f32", vocab, 1)
            prefix = next((i for i, (p, q) in enumerate(zip(cv_tokens, hf_tokens)) if p != q), len(hf_tokens))
            r = dict(shape=name, prompt=plen, hf_bf16_rel=rel(hf_bf16, ref), hf_bf16_top1=top1(hf_bf16, ref),
                     cv_bf16_rel=rel(cv_bf16, ref), cv_bf16_top1=top1(cv_bf16, ref),
                     cv_vs_hf_bf16_top1=top1(cv_bf16, hf_bf16), cv_f32_rel=rel(cv_f32, ref),
                     cv_f32_top1=top1(cv_f32, ref), greedy_prefix=prefix, new_tokens=a.new_tokens,
                     conveyor_bf16_wall_s=round(secs_bf16, 2))
            # bf16 is judged against HF's own bf16 error on the same model and prompt: through 16
            # layers of random weights, bf16 rounding alone moves the logits by a few percent.
            good = (r["cv_bf16_rel"] <= max(2 * r["hf_bf16_rel"], 1e-3) and
                    r["cv_bf16_top1"] >= min(0.9, r["hf_bf16_top1"]) - 0.05 and r["cv_f32_rel"] < 1e-3)
            r["pass"] = good
            ok = ok and good
            rows.append(r)
            print("[hf_peer] " + json.dumps(r), flush=True)
        del model
        torch.cuda.empty_cache()
    print("[hf_peer] shape        T    HF-bf16 rel  top1 | Conveyor-bf16 rel  top1 | Conveyor-f32 rel | greedy = HF bf16")
    for r in rows:
        print(f"[hf_peer] {r['shape']:<12} {r['prompt']:>4}  {r['hf_bf16_rel']:.2e}  {r['hf_bf16_top1']:.3f} | "
              f"{r['cv_bf16_rel']:.2e}  {r['cv_bf16_top1']:.3f} | {r['cv_f32_rel']:.2e} | "
              f"{r['greedy_prefix']}/{r['new_tokens']} {'PASS' if r['pass'] else 'FAIL'}")
    print("[hf_peer]", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
