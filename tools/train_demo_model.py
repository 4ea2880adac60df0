#!/usr/bin/env python3
"""Train models/demo: a small Llama that writes King James Bible English, for `scripts/demo`.

Two steps, on two machines:

  prepare (here, Debian 12, no Python packages needed; apt-get must reach the Debian archive):
      python3 tools/train_demo_model.py prepare --out .device-pack-demo
    downloads the Debian packages bible-kjv-text (the text, public domain) and bible-kjv (the
    `bible` program that reads its compressed format), extracts them without installing, dumps
    Genesis 1:1 to Revelation 22:21 and writes `kjv.txt` (chapters as "Book N" + one verse per line,
    verse numbers dropped, a blank line between chapters) and `SOURCES.json` (package names,
    versions, sha256 of the .deb files, the packages' copyright files).

  train (the GPU machine: torch, transformers 5, tokenizers; no network needed):
      python3 tools/train_demo_model.py train --corpus .device-pack-demo/kjv.txt --out $OUT/demo \
          [--train-seconds 60] [--keep last|best] [--golden $OUT/golden]
    models/demo was made with `--train-seconds 60 --eval-every 10` (README.md there).
    1. a byte-level BPE tokenizer (HF tokenizers, GPT-2 pre-tokenisation, 8192 ids, <s> prepended by
       the post-processor) trained on the corpus;
    2. a LlamaForCausalLM (4 layers, hidden 384, 6 heads / 2 KV heads, ffn 1024, tied embeddings,
       512 positions) trained from scratch with AdamW under bf16 autocast. Every sample starts with
       <s> at the start of a verse or chapter heading; 1 chapter in 50 is held out. The corpus is
       only ~1 M tokens: held-out loss is lowest (~3.5) after ~5 s on an H200 and rises after, as
       the model memorises. `--keep last` (default) keeps the final weights, which recite KJV
       verses nearly word for word and so read as clean English (a wrong pipeline shows at once);
       `--keep best` keeps those of the best held-out loss (new sentences, poorer English);
    3. saved as a normal HF directory in bf16 (config.json, generation_config.json,
       model.safetensors, tokenizer.json, tokenizer_config.json) + training_log.json;
    4. with --golden: the saved directory loaded back by HF (float32, eager attention, CPU, as the
       fixtures in tests/fixtures) for a few text prompts: the prompt ids HF's tokenizer gives, the
       logits at the last prompt position, and up to 32 greedy tokens (cut before the first step
       whose top-2 logits are closer than 2e-3, where float rounding could pick either). Written as
       golden.safetensors (p{i}.input_ids i32 [T], p{i}.last_logits f32 [V], p{i}.greedy i32 [N])
       + golden.json (prompts, their texts, margins, versions, losses).
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time

PACKAGES = ["bible-kjv-text", "bible-kjv"]
VOCAB = 8192
SEQ = 512
GOLDEN_PROMPTS = [
    "In the beginning",
    "And God said",
    "The LORD is my shepherd",
    "Blessed are the",
    "And it came to pass",
]
GOLDEN_TOKENS = 32
MIN_MARGIN = 2e-3


# ------------------------------------------------------------------------------------------------
# prepare (Debian, no third-party Python)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def prepare(args):
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # apt-get download drops to the _apt user where it can
        run(["apt-get", "download", *PACKAGES], cwd=tmp, stdout=subprocess.DEVNULL)
        sources = {"packages": [], "archive": "Debian 12 (bookworm) main"}
        root = os.path.join(tmp, "root")
        for deb in sorted(f for f in os.listdir(tmp) if f.endswith(".deb")):
            path = os.path.join(tmp, deb)
            fields = {}
            for key in ("Package", "Version", "Architecture"):
                fields[key.lower()] = run(["dpkg-deb", "-f", path, key], capture_output=True,
                                          text=True).stdout.strip()
            with open(path, "rb") as f:
                fields["sha256"] = hashlib.sha256(f.read()).hexdigest()
            run(["dpkg-deb", "-x", path, root])
            copyright_file = os.path.join(root, "usr/share/doc", fields["package"], "copyright")
            if os.path.exists(copyright_file):
                with open(copyright_file, encoding="utf-8", errors="replace") as f:
                    fields["copyright"] = f.read()
            sources["packages"].append(fields)
        # -l: one verse per line (no wrapping); -p: the data files from the extracted package.
        dump = run([os.path.join(root, "usr/bin/bible"), "-p", os.path.join(root, "usr/lib"), "-l100000",
                    "Gen1:1-Rev22:21"], capture_output=True, text=True).stdout
    chapters, verses = clean(dump)
    text = "\n\n".join(chapters) + "\n"
    with open(os.path.join(out, "kjv.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    sources["text"] = {"file": "kjv.txt", "chapters": len(chapters), "verses": verses, "bytes": len(text.encode()),
                       "sha256": hashlib.sha256(text.encode()).hexdigest(),
                       "format": "'Book N' heading, one verse per line (numbers dropped), blank line between chapters"}
    with open(os.path.join(out, "SOURCES.json"), "w", encoding="utf-8") as f:
        json.dump(sources, f, indent=1)
    print(f"prepare: {len(chapters)} chapters, {verses} verses, {len(text)} bytes -> {out}/kjv.txt")


def clean(dump):
    """`bible` prints "Genesis 1", a blank line, then "  1 In the beginning ..." per verse."""
    chapters, cur, verses = [], None, 0
    verse = re.compile(r"^\s+\d+ (.*\S)\s*$")
    for line in dump.splitlines():
        if not line.strip():
            continue
        m = verse.match(line)
        if m:
            if cur is None:
                raise SystemExit(f"prepare: a verse before any chapter heading: {line!r}")
            cur.append(m.group(1))
            verses += 1
        else:
            if cur:
                chapters.append("\n".join(cur))
            cur = [line.strip()]
    if cur:
        chapters.append("\n".join(cur))
    if len(chapters) != 1189 or verses != 31102:  # the KJV's counts: a changed dump format shows here
        raise SystemExit(f"prepare: expected 1189 chapters and 31102 verses, got {len(chapters)} and {verses}")
    return chapters, verses


# ------------------------------------------------------------------------------------------------
# train (GPU machine)


def train_tokenizer(chapters, out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(chapters, trainer=trainer)
    assert tok.token_to_id("<s>") == 0 and tok.token_to_id("</s>") == 1
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.model_max_length = SEQ
    fast.save_pretrained(out)
    return tok


def tokenize(tok, chapters):
    """Token stream of all chapters (joined by the "\n\n" between them) and where verses start."""
    import numpy as np

    sep = tok.encode("\n\n", add_special_tokens=False).ids
    ids, starts, chapter_of = [], [], []
    encs = tok.encode_batch([c for c in chapters], add_special_tokens=False)
    for ci, (text, enc) in enumerate(zip(chapters, encs)):
        base = len(ids)
        # A verse starts at the character after each "\n" (and the heading at 0): find their tokens.
        line_starts = {0} | {m.end() for m in re.finditer("\n", text)}
        for ti, (b, _) in enumerate(enc.offsets):
            if b in line_starts:
                starts.append(base + ti)
                chapter_of.append(ci)
        ids.extend(enc.ids)
        if ci + 1 < len(chapters):
            ids.extend(sep)
    return np.array(ids, dtype=np.int64), np.array(starts, dtype=np.int64), np.array(chapter_of)


def split_starts(ids, starts, chapter_of, n_chapters):
    """Training and held-out window starts: every 50th chapter is held out; a held-out chapter's
    verses are never training starts, and no training window of SEQ tokens reaches into one."""
    import numpy as np

    held_out = chapter_of % 50 == 49
    chapter_first = np.array([starts[chapter_of == c].min() for c in range(n_chapters)])
    chapter_end = np.append(chapter_first[1:], len(ids))
    train_starts = starts[~held_out]
    ok = np.ones(len(train_starts), dtype=bool)
    for c in np.nonzero(np.arange(n_chapters) % 50 == 49)[0]:
        ok &= ~((train_starts < chapter_end[c]) & (train_starts + SEQ - 1 > chapter_first[c]))
    return train_starts[ok], starts[held_out]


def train(args):
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    t_start = time.time()
    torch.manual_seed(args.seed)
    out = args.out
    os.makedirs(out, exist_ok=True)
    with open(args.corpus, encoding="utf-8") as f:
        chapters = f.read().rstrip("\n").split("\n\n")
    tok = train_tokenizer(chapters, out)
    ids, starts, chapter_of = tokenize(tok, chapters)
    train_starts, val_starts = split_starts(ids, starts, chapter_of, len(chapters))
    print(f"train: {len(ids)} tokens ({len(open(args.corpus, 'rb').read()) / len(ids):.2f} bytes/token), "
          f"{len(train_starts)} training starts, {len(val_starts)} held-out starts, "
          f"tokenizer {time.time() - t_start:.1f}s", flush=True)

    dev = torch.device("cuda")
    data = torch.tensor(np.append(ids, np.zeros(SEQ, dtype=np.int64)), device=dev)  # padded: no window runs off
    train_idx = torch.tensor(train_starts, device=dev)
    val_idx = torch.tensor(val_starts, device=dev)
    offs = torch.arange(SEQ - 1, device=dev)
    bos = torch.zeros(1, 1, dtype=torch.long, device=dev)

    def batch(idx, n, gen=None):
        pick = idx[torch.randint(len(idx), (n,), device=dev, generator=gen)]
        x = data[pick[:, None] + offs[None, :]]
        return torch.cat([bos.expand(n, 1), x], dim=1)

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=SEQ,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
                         initializer_range=0.02)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)

    def loss_of(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), x[:, 1:].reshape(-1))

    val_gen = torch.Generator(device=dev)

    @torch.no_grad()
    def evaluate(idx, batches=8):
        model.eval()
        val_gen.manual_seed(1234)  # the same windows every time: losses comparable across evaluations
        total = sum(loss_of(batch(idx, args.batch, val_gen)).item() for _ in range(batches)) / batches
        model.train()
        return total

    log, best, best_state, best_at = [], float("inf"), None, 0.0
    step, t0, last_eval, tokens = 0, time.time(), -1e9, 0
    warmup = 100
    while True:
        elapsed = time.time() - t0
        if elapsed >= args.train_seconds:
            break
        if elapsed - last_eval >= args.eval_every:
            last_eval = elapsed
            v = evaluate(val_idx)
            tr = evaluate(train_idx, 4)
            log.append({"step": step, "seconds": round(elapsed, 1), "tokens": tokens, "train_loss": round(tr, 4),
                        "val_loss": round(v, 4)})
            print(f"  step {step:6d}  {elapsed:6.1f}s  train {tr:.3f}  held-out {v:.3f}", flush=True)
            if v < best:
                best, best_at = v, elapsed
                if args.keep == "best":
                    best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
            elif args.keep == "best" and elapsed - best_at > args.patience:
                print(f"  held-out loss has not improved for {args.patience:.0f}s: stopping", flush=True)
                break
        frac = min(1.0, elapsed / args.train_seconds)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(train_idx, args.batch)
        loss = loss_of(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
    torch.cuda.synchronize()
    train_s = time.time() - t0
    final_val = evaluate(val_idx)
    if final_val < best:
        best, best_state = final_val, None
    if args.keep == "best" and best_state is not None:
        model.load_state_dict(best_state)
    kept = {"which": args.keep, "val_loss": round(evaluate(val_idx), 4), "train_loss": round(evaluate(train_idx, 8), 4)}
    print(f"train: {step} steps, {tokens / 1e6:.0f} M tokens in {train_s:.0f}s; kept weights: {kept}", flush=True)

    model.generation_config.bos_token_id = 0
    model.generation_config.eos_token_id = 1
    model.to(torch.bfloat16).save_pretrained(out)
    summary = {
        "params": n_params, "steps": step, "tokens_seen": tokens, "train_seconds": round(train_s, 1),
        "corpus_tokens": int(len(ids)), "batch": args.batch, "seq": SEQ, "lr": args.lr, "kept": kept,
        "final_val_loss": round(final_val, 4), "log": log, "torch": torch.__version__,
        "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name(),
    }
    with open(os.path.join(out, "training_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if args.golden:
        golden(out, args.golden, summary)
    print(f"train: done in {time.time() - t_start:.0f}s", flush=True)


def golden(model_dir, out, summary):
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.makedirs(out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    tok = AutoTokenizer.from_pretrained(model_dir)
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    # Never stop early: every greedy token is the argmax of the logits HF returns.
    m.generation_config.eos_token_id = None
    tensors, prompts = {}, []
    for i, text in enumerate(GOLDEN_PROMPTS):
        ids = tok(text).input_ids
        x = torch.tensor([ids])
        with torch.no_grad():
            last = m(input_ids=x).logits[0, -1].float()
            g = m.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=GOLDEN_TOKENS, min_new_tokens=GOLDEN_TOKENS, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=1)
        toks = g.sequences[0, len(ids):]
        glog = torch.stack([lg[0] for lg in g.logits]).float()
        top2 = glog.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        n = next((k for k, mg in enumerate(margins) if mg < MIN_MARGIN), len(margins))
        assert bool((glog.argmax(-1) == toks).all())
        tensors[f"p{i}.input_ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"p{i}.last_logits"] = last.contiguous()
        tensors[f"p{i}.greedy"] = toks[:n].to(torch.int32).contiguous()
        prompts.append({"text": text, "input_ids": ids, "greedy": toks[:n].tolist(),
                        "greedy_text": tok.decode(toks[:n].tolist()), "min_margin": round(min(margins[:n] or [0]), 5),
                        "cut_at": n if n < len(margins) else None})
        print(f"golden: {text!r} -> {tok.decode(toks.tolist())!r}", flush=True)
    save_file(tensors, os.path.join(out, "golden.safetensors"))
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump({"model": "models/demo", "reference": "HF transformers, float32, eager attention, CPU",
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "prompts": prompts, "training": {k: summary[k] for k in ("kept", "steps", "train_seconds")}},
                  f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="download the Debian packages and write the corpus (here)")
    p.add_argument("--out", required=True)
    t = sub.add_parser("train", help="tokenizer + model + goldens (GPU machine)")
    t.add_argument("--corpus", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--golden")
    t.add_argument("--train-seconds", type=float, default=60)
    t.add_argument("--eval-every", type=float, default=10)
    t.add_argument("--keep", choices=["last", "best"], default="last",
                   help="last: the weights at the end (they recite the corpus nearly word for word); "
                        "best: those of the lowest held-out loss (they generalise, but write worse English)")
    t.add_argument("--patience", type=float, default=40, help="stop when held-out loss has not improved this long")
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    prepare(a) if a.cmd == "prepare" else train(a)


if __name__ == "__main__":
    main()
