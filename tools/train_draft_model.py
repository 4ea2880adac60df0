#!/usr/bin/env python3
"""Train models/demo-draft: a small draft model for speculative decoding of models/demo (issue 12).

A draft must share its target's tokenizer and vocabulary, so this script does not train a tokenizer:
it reads models/demo's tokenizer.json, tokenises the same KJV corpus the same way
(tools/train_demo_model.py's `tokenize` and held-out split: 1 chapter in 50), and distils the target:
every training batch goes through models/demo (bf16, no gradients) and the draft learns its
next-token distributions (KL(target || draft) at temperature 1 over every position). What matters for
speculative decoding is how often the draft's argmax is the target's, so that is what is reported:
top-1 agreement with the target on held-out windows, on training windows and on the target's own
greedy continuations of a few prompts (teacher-forced: the acceptance rate greedy speculation would
see, before the draft's own proposals diverge).

Several draft shapes can train at once on one GPU (each is far too small to fill an H200): one process
per `--shape`, all for `--train-seconds`, each written as a normal HF directory (bf16 config.json,
generation_config.json, model.safetensors, training_log.json).

  corpus (here, Debian 12; the same as models/demo's):
      python3 tools/train_demo_model.py prepare --out DIR        # DIR/kjv.txt
  train (GPU machine: torch, transformers 5):
      python3 tools/train_draft_model.py --corpus DIR/kjv.txt --target models/demo --out $OUT/drafts \
          --shape l1h192 --shape l2h192 [--train-seconds 90] [--init EARLIER_OUT]
  Shapes: l<layers>h<hidden>; head_dim 64, hidden/64 query heads, 1 KV head, ffn = 8/3 hidden rounded
  to 64, tied embeddings, 512 positions, rope theta 1e4, as the target.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

SEQ = 512
VOCAB = 8192
PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the",
           "And it came to pass", "Jesus wept", "Thou shalt not", "For God so loved the world"]
GEN_TOKENS = 128


def shape_config(shape):
    m = re.fullmatch(r"l(\d+)h(\d+)", shape)
    if not m:
        raise SystemExit(f"bad --shape {shape!r}: want l<layers>h<hidden>, e.g. l1h192")
    layers, hidden = int(m.group(1)), int(m.group(2))
    if hidden % 64:
        raise SystemExit(f"--shape {shape}: hidden must be a multiple of 64 (head_dim 64)")
    ffn = int(round(hidden * 8 / 3 / 64)) * 64
    return layers, hidden, ffn


def train_one(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, args.tools)
    # The same token stream, verse starts and held-out chapters as the target's.
    from train_demo_model import split_starts, tokenize

    t_start = time.time()
    torch.manual_seed(args.seed)
    layers, hidden, ffn = shape_config(args.shape)
    out = os.path.join(args.out, f"draft-{args.shape}")
    os.makedirs(out, exist_ok=True)
    with open(args.corpus, encoding="utf-8") as f:
        chapters = f.read().rstrip("\n").split("\n\n")
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB
    ids, starts, chapter_of = tokenize(tok, chapters)
    train_starts, val_starts = split_starts(ids, starts, chapter_of, len(chapters))

    dev = torch.device("cuda")
    data = torch.tensor(np.append(ids, np.zeros(SEQ, dtype=np.int64)), device=dev)
    train_idx = torch.tensor(train_starts, device=dev)
    val_idx = torch.tensor(val_starts, device=dev)
    offs = torch.arange(SEQ - 1, device=dev)
    bos = torch.zeros(1, 1, dtype=torch.long, device=dev)

    def batch(idx, n, gen=None):
        pick = idx[torch.randint(len(idx), (n,), device=dev, generator=gen)]
        x = data[pick[:, None] + offs[None, :]]
        return torch.cat([bos.expand(n, 1), x], dim=1)

    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16).to(dev).eval()
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=1, head_dim=64,
                         max_position_embeddings=SEQ, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0,
                         eos_token_id=1, initializer_range=0.02)
    config._attn_implementation = "sdpa"
    if args.init:  # go on training an earlier run's draft of this shape (its saved bf16 weights)
        model = LlamaForCausalLM.from_pretrained(os.path.join(args.init, f"draft-{args.shape}"),
                                                 dtype=torch.float32).to(dev)
        model.config._attn_implementation = "sdpa"
    else:
        model = LlamaForCausalLM(config).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)

    def losses(x):
        """(KL(target || draft), CE on the text, top-1 agreement with the target) over the batch."""
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            t_logits = target(input_ids=x).logits[:, :-1]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            d_logits = model(input_ids=x).logits[:, :-1]
        d = F.log_softmax(d_logits.float().reshape(-1, VOCAB), -1)
        t = F.log_softmax(t_logits.float().reshape(-1, VOCAB), -1)
        kl = F.kl_div(d, t, log_target=True, reduction="batchmean")
        ce = F.nll_loss(d, x[:, 1:].reshape(-1))
        agree = (d.argmax(-1) == t.argmax(-1)).float().mean()
        return kl, ce, agree

    eval_gen = torch.Generator(device=dev)

    @torch.no_grad()
    def evaluate(idx, batches=4):
        model.eval()
        eval_gen.manual_seed(1234)
        acc = [0.0, 0.0, 0.0]
        for _ in range(batches):
            for i, v in enumerate(losses(batch(idx, args.batch, eval_gen))):
                acc[i] += v.item() / batches
        model.train()
        return {"kl": round(acc[0], 4), "ce": round(acc[1], 4), "top1_agree": round(acc[2], 4)}

    log, step, tokens, last_eval = [], 0, 0, -1e9
    warmup = 100
    t0 = time.time()
    while True:
        elapsed = time.time() - t0
        if elapsed >= args.train_seconds:
            break
        if elapsed - last_eval >= args.eval_every:
            last_eval = elapsed
            entry = {"step": step, "seconds": round(elapsed, 1), "tokens": tokens, "held_out": evaluate(val_idx),
                     "train": evaluate(train_idx, 2)}
            log.append(entry)
            print(f"[{args.shape}] step {step:5d} {elapsed:5.1f}s held-out {entry['held_out']} train {entry['train']}",
                  flush=True)
        frac = min(1.0, elapsed / args.train_seconds)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(train_idx, args.batch)
        kl, _, _ = losses(x)
        opt.zero_grad(set_to_none=True)
        kl.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
    torch.cuda.synchronize()
    train_s = time.time() - t0
    final = {"held_out": evaluate(val_idx, 8), "train": evaluate(train_idx, 8)}
    print(f"[{args.shape}] {step} steps in {train_s:.0f}s: {final}", flush=True)

    model.generation_config.bos_token_id = 0
    model.generation_config.eos_token_id = 1
    model.to(torch.bfloat16).save_pretrained(out)

    # The acceptance greedy speculation would see: the target's own greedy continuations (float32, as
    # Conveyor's CPU f32 run), and how often the saved bf16 draft (loaded back in float32) picks the
    # same next token, teacher-forced on them.
    tgt32 = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(dev).eval()
    drf32 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(dev).eval()
    tgt32.generation_config.eos_token_id = None  # never stop early: GEN_TOKENS from every prompt
    per_prompt, agree_all, n_all = [], 0, 0
    for text in PROMPTS:
        p = torch.tensor([tok.encode(text).ids], device=dev)  # <s> prepended by the post-processor
        with torch.no_grad():
            g = tgt32.generate(input_ids=p, attention_mask=torch.ones_like(p), do_sample=False,
                               max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS, pad_token_id=1)
            seq = g[0]
            t_next = tgt32(input_ids=seq[None]).logits[0].argmax(-1)
            d_next = drf32(input_ids=seq[None]).logits[0].argmax(-1)
        lo = p.shape[1] - 1
        same = (t_next[lo:-1] == d_next[lo:-1])
        agree_all += int(same.sum())
        n_all += same.numel()
        per_prompt.append({"prompt": text, "agree": round(same.float().mean().item(), 4)})
    gen_agree = agree_all / n_all
    print(f"[{args.shape}] top-1 agreement on the target's greedy continuations: {gen_agree:.4f} {per_prompt}",
          flush=True)
    summary = {"shape": args.shape, "layers": layers, "hidden": hidden, "ffn": ffn, "params": n_params,
               "steps": step, "tokens_seen": tokens, "train_seconds": round(train_s, 1), "batch": args.batch,
               "seq": SEQ, "lr": args.lr, "loss": "KL(target || draft), temperature 1, every position",
               "target": "models/demo", "init": args.init, "final": final, "greedy_continuation_agreement": round(gen_agree, 4),
               "per_prompt": per_prompt, "gen_tokens": GEN_TOKENS, "log": log, "torch": torch.__version__,
               "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name(),
               "wall_seconds": round(time.time() - t_start, 1)}
    with open(os.path.join(out, "training_log.json"), "w") as f:
        json.dump(summary, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--target", default="models/demo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--train-seconds", type=float, default=90)
    ap.add_argument("--eval-every", type=float, default=15)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tools", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--init", help="a folder of earlier drafts (draft-<shape>/): go on training them")
    a = ap.parse_args()
    if len(a.shape) == 1:
        a.shape = a.shape[0]
        return train_one(a)
    # One process per shape, side by side on the one GPU.
    procs = []
    for s in a.shape:
        cmd = [sys.executable, os.path.abspath(__file__), "--corpus", a.corpus, "--target", a.target, "--out", a.out,
               "--shape", s, "--train-seconds", str(a.train_seconds), "--eval-every", str(a.eval_every),
               "--batch", str(a.batch), "--lr", str(a.lr), "--seed", str(a.seed), "--tools", a.tools]
        if a.init:
            cmd += ["--init", a.init]
        procs.append(subprocess.Popen(cmd))
    rc = [p.wait() for p in procs]
    if any(rc):
        raise SystemExit(f"train_draft_model: exit codes {rc}")


if __name__ == "__main__":
    main()
