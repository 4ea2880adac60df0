#!/usr/bin/env python3
"""HF transformers as Conveyor's speed peer, on the GPU machine, in the same run as conveyor_bench.

1. Builds a Llama-3.2-1B-shaped model with random weights (tools/hf_peer.py's shape), bf16, saves it
   as an HF directory for conveyor_bench, and touches <work>/READY.
2. Waits for --wait-file (conveyor_bench done), so the two never share the GPU while timing.
3. Times HF on the same prompts (random ids, prompt P, N new tokens, greedy, no early stop):
   - eager (default attention, dynamic cache): every batch size, and prefill at each length;
   - static cache + torch.compile (generate's own compile of the decode step): batch sizes in the
     order given (the goal's batch 64 first), each only while the time budget lasts.
   Decode throughput = batch * (N - 1) / (t(N new tokens) - t(1 new token)), the same definition as
   conveyor_bench (decode steps after the first token).
Prints one JSON line per measurement ("[hf] {...}") and appends them to --out.

usage: python3 bench/hf_peer_bench.py --work /tmp/bench-model --wait-file /tmp/conveyor.done --out $OUT/hf.jsonl
"""
import argparse
import json
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from hf_peer import SHAPES  # noqa: E402  (the shape both benchmarks use)


def emit(out, **kw):
    line = json.dumps(kw)
    print("[hf] " + line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def build(work):
    spec = SHAPES["llama-1b"]
    cfg = getattr(transformers, spec["config"])(**spec["args"])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = getattr(transformers, spec["cls"])(cfg)
    model.to(torch.bfloat16)
    os.makedirs(work, exist_ok=True)
    model.save_pretrained(work)
    open(os.path.join(work, "READY"), "w").close()
    return model.eval()


def sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def prompts(batch, plen, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, plen), generator=g).cuda()
    return ids, torch.ones_like(ids)


def gen(model, ids, mask, new, **kw):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              pad_token_id=0, **kw)


def decode_case(model, peer, batch, a, out, warm_new, **kw):
    ids, mask = prompts(batch, a.prompt, model.config.vocab_size, 1000 + batch)
    torch.cuda.reset_peak_memory_stats()
    # Warm-up: loads kernels; with a static cache it must have the timed run's length, or the compiled
    # step (specialised to the cache length) would be compiled again inside the timed run.
    warm = sync_time(lambda: gen(model, ids, mask, warm_new, **kw))
    t1 = min(sync_time(lambda: gen(model, ids, mask, 1, **kw)) for _ in range(2))
    tn = sync_time(lambda: gen(model, ids, mask, a.new, **kw))
    emit(out, peer=peer, kind="decode", batch=batch, warmup_s=warm, ttft_batch_ms=t1 * 1e3, total_s=tn,
         decode_tok_s=batch * (a.new - 1) / max(tn - t1, 1e-9), e2e_tok_s=batch * a.new / tn,
         max_mem_bytes=torch.cuda.max_memory_allocated())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/bench-model")
    ap.add_argument("--wait-file", default="")
    ap.add_argument("--wait-max-s", type=float, default=400)
    ap.add_argument("--out", default="")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--compile-batches", default="64,1,8,256")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds by which to stop starting compiles")
    ap.add_argument("--build-only", action="store_true", help="save the model for conveyor_bench, time nothing")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    t_build = time.time()
    model = build(a.work)
    emit(a.out, peer="hf", kind="build", seconds=time.time() - t_build, torch=torch.__version__,
         transformers=transformers.__version__, attn=model.config._attn_implementation)
    if a.build_only:
        return 0
    if a.wait_file:
        t0 = time.time()
        while not os.path.exists(a.wait_file) and time.time() - t0 < a.wait_max_s:
            time.sleep(0.5)
    deadline = a.deadline or time.time() + 240

    # Eager: the default attention implementation and dynamic cache.
    for b in map(int, a.batches.split(",")):
        decode_case(model, "hf_eager", b, a, a.out, 2)
    for t in map(int, a.prefill.split(",")):
        ids, _ = prompts(1, t, model.config.vocab_size, 9)
        with torch.no_grad():
            model(ids)
            times = [sync_time(lambda: model(ids)) for _ in range(5)]
        times.sort()
        emit(a.out, peer="hf_eager", kind="prefill", tokens=t, ms=times[2] * 1e3, tok_s=t / times[2])

    # Static cache: generate compiles the decode step (torch.compile, CUDA graphs) on first use.
    for b in map(int, a.compile_batches.split(",")):
        left = deadline - time.time()
        if left < 45:
            emit(a.out, peer="hf_compile", kind="skipped", batch=b, reason=f"time budget ({left:.0f} s left)")
            continue
        try:
            decode_case(model, "hf_compile", b, a, a.out, a.new, cache_implementation="static")
        except Exception as e:  # a compile failure is a result to report, not a crash of the run
            emit(a.out, peer="hf_compile", kind="error", batch=b, error=str(e)[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())
