#!/usr/bin/env python3
"""Build extra golden fixtures for Conveyor with real HF transformers.

Each fixture is a tiny random-weight LLaMA-family checkpoint saved as a normal HF directory plus
reference outputs computed by HF transformers itself (float32, eager attention, CPU), with the model
loaded back FROM THE SAVED DIRECTORY, so the goldens are what a loader of that directory must give.

Output format (identical to tests/fixtures/tiny-llama, see tests/fixtures/README.md):
  golden.safetensors: p{i}.input_ids i32 [T], p{i}.logits f32 [T,V],
                      p{i}.hidden_states f32 [L+1,T,H] (last = after the final norm),
                      p{i}.greedy i32 [24], p{i}.greedy_logits f32 [24,V] (row 0 = last prompt pos)
  golden.json:        model, transformers, torch, prompts[{input_ids, greedy}]
                      (+ informative extras: features, hf_rope, checks)

Fixtures:
  llama3-scaled        llama3 rope scaling, GQA 8/1, explicit head_dim != hidden/heads, tied, bf16 weights
  mistral-sliding      Mistral sliding window 16 (40-token prompt), MHA, untied, fp16, sharded checkpoint
  qwen2-yarn           Qwen2 yarn rope (factor 4, orig 128), qkv bias, untied, 5 layers, odd sizes
  llama-legacy-config  attention_bias + mlp_bias, linear rope (factor 2), GQA 4/2, config.json rewritten
                       into the pre-transformers-5 form (top-level rope_theta + rope_scaling{type})

Usage (needs torch + transformers 5.x; CPU only):
  PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py --out /some/dir [--only name,name]
"""

import argparse
import json
import math
import os
import sys
import traceback

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU only, deterministic

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

N_GREEDY = 24
MIN_MARGIN = 1e-3  # re-draw a prompt whose greedy continuation has a near-tie top-1 (max 8 tries)


# --------------------------------------------------------------------------------------------------
# helpers


def load(d, config=None):
    kw = {} if config is None else {"config": config}
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", **kw)
    m.eval()
    # Never stop early: always 24 greedy tokens, and every token is the argmax of its logits.
    m.generation_config.eos_token_id = None
    return m


def perturb(model, seed):
    """HF initialises biases to 0 and norm weights to 1; make them random so loaders must use them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


@torch.no_grad()
def forward(m, ids):
    x = torch.tensor([ids], dtype=torch.long)
    out = m(input_ids=x, attention_mask=torch.ones_like(x), output_hidden_states=True, use_cache=False)
    return out.logits[0].float(), torch.stack([h[0] for h in out.hidden_states]).float()


@torch.no_grad()
def greedy(m, ids):
    x = torch.tensor([ids], dtype=torch.long)
    g = m.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        do_sample=False,
        max_new_tokens=N_GREEDY,
        min_new_tokens=N_GREEDY,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    toks = g.sequences[0, len(ids):]
    glog = torch.stack([lg[0] for lg in g.logits]).float()
    return toks, glog


def compute_prompt(m, ids):
    logits, hs = forward(m, ids)
    toks, glog = greedy(m, ids)
    assert toks.numel() == N_GREEDY, toks.shape
    assert glog.shape[0] == N_GREEDY, glog.shape
    argmax_ok = bool((glog.argmax(-1) == toks).all())
    top2 = glog.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    # consistency: one full forward over prompt + greedy[:-1] must give the cached decode logits
    full, _ = forward(m, list(ids) + toks[:-1].tolist())
    kv_diff = float((full[len(ids) - 1:] - glog).abs().max())
    row0 = float((logits[-1] - glog[0]).abs().max())
    return dict(logits=logits, hs=hs, toks=toks, glog=glog, argmax_ok=argmax_ok, margin=margin,
                kv_diff=kv_diff, row0=row0)


def draw_prompts(m, vocab, lengths, seed):
    prompts = []
    for pi, L in enumerate(lengths):
        best = None
        for attempt in range(8):
            g = torch.Generator().manual_seed(seed * 1000 + pi * 17 + attempt)
            ids = torch.randint(0, vocab, (L,), generator=g).tolist()
            r = compute_prompt(m, ids)
            r["ids"] = ids
            if best is None or (r["argmax_ok"], r["margin"]) > (best["argmax_ok"], best["margin"]):
                best = r
            if r["argmax_ok"] and r["margin"] >= MIN_MARGIN:
                break
        prompts.append(best)
    return prompts


def rope_info(m):
    try:
        re_ = m.model.rotary_emb
        return {"inv_freq": [float(v) for v in re_.inv_freq.tolist()],
                "attention_scaling": float(re_.attention_scaling),
                "rope_parameters": getattr(m.config, "rope_parameters", None)}
    except Exception as e:  # informative only
        return {"error": repr(e)}


def write_golden(d, name, m, prompts, extras):
    tensors = {}
    L = m.config.num_hidden_layers
    H = m.config.hidden_size
    V = m.config.vocab_size
    for i, p in enumerate(prompts):
        T = len(p["ids"])
        assert p["logits"].shape == (T, V)
        assert p["hs"].shape == (L + 1, T, H), p["hs"].shape
        tensors[f"p{i}.input_ids"] = torch.tensor(p["ids"], dtype=torch.int32)
        tensors[f"p{i}.logits"] = p["logits"].contiguous()
        tensors[f"p{i}.hidden_states"] = p["hs"].contiguous()
        tensors[f"p{i}.greedy"] = p["toks"].to(torch.int32).contiguous()
        tensors[f"p{i}.greedy_logits"] = p["glog"].contiguous()
    save_file(tensors, os.path.join(d, "golden.safetensors"))
    j = {
        "model": name,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompts": [{"input_ids": p["ids"], "greedy": p["toks"].tolist()} for p in prompts],
    }
    j.update(extras)
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(j, f, indent=1)
    # read back
    back = load_file(os.path.join(d, "golden.safetensors"))
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k


def report_prompts(prompts, m):
    for i, p in enumerate(prompts):
        # last hidden state is after the final norm: logits == hs[-1] @ lm_head^T
        W = m.get_output_embeddings().weight.detach().float()
        post_norm = float((p["hs"][-1] @ W.T - p["logits"]).abs().max())
        print(f"  p{i}: T={len(p['ids'])} greedy={p['toks'].tolist()[:8]}... argmax_ok={p['argmax_ok']} "
              f"min_top1_margin={p['margin']:.3g} |full-fwd - cached decode|={p['kv_diff']:.2e} "
              f"|logits[-1]-greedy_logits[0]|={p['row0']:.2e} |hs[-1]@lm_head-logits|={post_norm:.2e}")


def summarize(d):
    files = sorted(os.listdir(d))
    total = 0
    for fn in files:
        sz = os.path.getsize(os.path.join(d, fn))
        total += sz
        print(f"    {fn:40s} {sz:10d}")
    print(f"    {'TOTAL':40s} {total:10d}")
    return {fn: os.path.getsize(os.path.join(d, fn)) for fn in files}


def max_diff_on(m_a, m_b, prompts):
    out = 0.0
    for p in prompts:
        a, _ = forward(m_a, p["ids"])
        b, _ = forward(m_b, p["ids"])
        out = max(out, float((a - b).abs().max()))
    return out


def rope_sensitivity(d, prompts, theta):
    """Logits with the same weights but plain (unscaled) rope must differ: the scaling is really used."""
    cfg = AutoConfig.from_pretrained(d)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    return max_diff_on(load(d), load(d, cfg), prompts)


def base_cfg(**kw):
    common = dict(hidden_act="silu", initializer_range=0.08, bos_token_id=1, eos_token_id=2,
                  max_position_embeddings=512, attention_dropout=0.0)
    common.update(kw)
    return common


# --------------------------------------------------------------------------------------------------
# fixtures


def make_llama3_scaled(out, seed=101):
    name = "llama3-scaled"
    d = os.path.join(out, name)
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = LlamaConfig(**base_cfg(vocab_size=512, hidden_size=96, intermediate_size=256, num_hidden_layers=3,
                                 num_attention_heads=8, num_key_value_heads=1, head_dim=16,
                                 rms_norm_eps=1e-5, tie_word_embeddings=True, rope_parameters=rope,
                                 attention_bias=False, mlp_bias=False))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    perturb(model, seed)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "not tied"
    model.to(torch.bfloat16).save_pretrained(d)
    m = load(d)
    assert m.model.layers[0].self_attn.q_proj.weight.shape == (8 * 16, 96)
    prompts = draw_prompts(m, 512, [1, 9, 70], seed)
    checks = {"rope_vs_unscaled_max_logit_diff": rope_sensitivity(d, prompts, 500000.0)}
    print(f"[{name}] llama3 rope vs plain rope (same weights) max|dlogit| = "
          f"{checks['rope_vs_unscaled_max_logit_diff']:.4g}  (must be > 0)")
    ri = rope_info(m)
    print(f"[{name}] inv_freq = {ri.get('inv_freq')}")
    st = load_file(os.path.join(d, "model.safetensors"))
    print(f"[{name}] saved dtypes: {sorted({str(v.dtype) for v in st.values()})}, "
          f"lm_head in file: {'lm_head.weight' in st}")
    return d, name, m, prompts, {
        "features": ["llama3 rope scaling (factor 8, low 1, high 4, orig_max_pos 64, theta 5e5)",
                     "GQA 8 heads / 1 kv head", "head_dim 16 != hidden/heads (96/8=12)",
                     "tied embeddings (no lm_head.weight in file)", "bfloat16 weights on disk"],
        "hf_rope": ri, "checks": checks}


def make_mistral_sliding(out, seed=202):
    name = "mistral-sliding"
    d = os.path.join(out, name)
    W = 16
    cfg = MistralConfig(**base_cfg(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=W,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    torch.manual_seed(seed)
    model = MistralForCausalLM(cfg)
    perturb(model, seed)
    model.to(torch.float16)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    shard = int(total * 0.4)
    model.save_pretrained(d, max_shard_size=shard)
    files = sorted(os.listdir(d))
    shards = [f for f in files if f.startswith("model-") and f.endswith(".safetensors")]
    print(f"[{name}] param bytes {total}, max_shard_size {shard} -> shards {shards}, "
          f"index: {'model.safetensors.index.json' in files}")
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    print(f"[{name}] config sliding_window={cj.get('sliding_window')} layer_types={cj.get('layer_types')}")
    m = load(d)
    print(f"[{name}] loaded config.sliding_window={m.config.sliding_window} "
          f"attn_impl={m.config._attn_implementation}")
    prompts = draw_prompts(m, 512, [1, 9, 40], seed)
    # check 1: a copy with sliding_window=None must differ at late positions of the 40-token prompt
    cfg_full = AutoConfig.from_pretrained(d)
    cfg_full.sliding_window = None
    m_full = load(d, cfg_full)
    ids = prompts[2]["ids"]
    a, _ = forward(m, ids)
    b, _ = forward(m_full, ids)
    early = float((a[:W] - b[:W]).abs().max())
    late = float((a[W:] - b[W:]).abs().max())
    print(f"[{name}] SLIDING CHECK (T=40, W={W}): max|dlogit| vs sliding_window=None: positions <{W}: "
          f"{early:.3g} (must be 0), positions >={W}: {late:.4g} (must be > 0)")
    # check 2: exact window semantics with a 1-layer model: position q sees keys k with q-W < k <= q
    cfg1 = AutoConfig.from_pretrained(d)
    cfg1.num_hidden_layers = 1
    torch.manual_seed(seed + 1)
    cfg1._attn_implementation = "eager"
    m1 = MistralForCausalLM(cfg1).float().eval()
    q = 39
    base, _ = forward(m1, ids)
    res = {}
    for k in (q - W, q - W + 1):
        ids2 = list(ids)
        ids2[k] = (ids2[k] + 1) % 512
        o, _ = forward(m1, ids2)
        res[k] = float((o[q] - base[q]).abs().max())
    print(f"[{name}] WINDOW SEMANTICS (1 layer): change token {q - W} -> |dlogit[{q}]| = {res[q - W]:.3g} "
          f"(must be 0); change token {q - W + 1} -> {res[q - W + 1]:.3g} (must be > 0) => keys q-{W - 1}..q")
    checks = {"sliding_vs_full_max_logit_diff_pos_lt_W": early, "sliding_vs_full_max_logit_diff_pos_ge_W": late,
              "one_layer_dlogit39_change_tok23": res[q - W], "one_layer_dlogit39_change_tok24": res[q - W + 1],
              "shards": shards}
    return d, name, m, prompts, {
        "features": [f"sliding_window {W}: query q attends keys q-{W - 1}..q (HF semantics)",
                     "MHA 4/4", "untied lm_head", "float16 weights on disk",
                     f"sharded checkpoint: {len(shards)} shards + model.safetensors.index.json"],
        "hf_rope": rope_info(m), "checks": checks}


def make_qwen2_yarn(out, seed=303):
    name = "qwen2-yarn"
    d = os.path.join(out, name)
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128}
    cfg = Qwen2Config(**base_cfg(vocab_size=520, hidden_size=64, intermediate_size=200, num_hidden_layers=5,
                                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                                 tie_word_embeddings=False, use_sliding_window=False, rope_parameters=rope))
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    perturb(model, seed)
    model.save_pretrained(d)
    m = load(d)
    prompts = draw_prompts(m, 520, [3, 40, 140], seed)
    checks = {"rope_vs_unscaled_max_logit_diff": rope_sensitivity(d, prompts, 10000.0)}
    ri = rope_info(m)
    print(f"[{name}] yarn vs plain rope (same weights) max|dlogit| = "
          f"{checks['rope_vs_unscaled_max_logit_diff']:.4g} (must be > 0)")
    print(f"[{name}] inv_freq = {ri.get('inv_freq')} attention_scaling = {ri.get('attention_scaling')} "
          f"(0.1*ln(4)+1 = {0.1 * math.log(4) + 1:.6f})")
    return d, name, m, prompts, {
        "features": ["yarn rope (factor 4, orig_max_pos 128, max_pos 512, theta 1e4, beta_fast 32, beta_slow 1)",
                     "q/k/v bias (random, non-zero)", "untied lm_head", "5 layers, intermediate 200, vocab 520",
                     "GQA 4/2", "prompt of 140 > original_max_position_embeddings"],
        "hf_rope": ri, "checks": checks}


def make_llama_legacy(out, seed=404):
    name = "llama-legacy-config"
    d = os.path.join(out, name)
    cfg = LlamaConfig(**base_cfg(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                 tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                                 rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    perturb(model, seed)
    model.save_pretrained(d)
    m_new = load(d)
    prompts_new = draw_prompts(m_new, 512, [1, 9, 40], seed)
    sens = rope_sensitivity(d, prompts_new, 10000.0)
    print(f"[{name}] linear rope vs plain rope (same weights) max|dlogit| = {sens:.4g} (must be > 0)")
    # rewrite config.json into the pre-transformers-5 form
    cp = os.path.join(d, "config.json")
    with open(cp) as f:
        cj = json.load(f)
    rp = cj.pop("rope_parameters")
    print(f"[{name}] transformers-5 rope_parameters written: {rp}")
    cj["rope_theta"] = float(rp["rope_theta"])
    cj["rope_scaling"] = {"type": "linear", "factor": float(rp["factor"])}
    with open(cp, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    m = load(d)
    print(f"[{name}] legacy config reloaded by HF: rope_parameters={getattr(m.config, 'rope_parameters', None)}")
    prompts = [compute_prompt(m, p["ids"]) for p in prompts_new]
    for p, pn in zip(prompts, prompts_new):
        p["ids"] = pn["ids"]
    diff = max(float((p["logits"] - pn["logits"]).abs().max()) for p, pn in zip(prompts, prompts_new))
    gdiff = max(float((p["glog"] - pn["glog"]).abs().max()) for p, pn in zip(prompts, prompts_new))
    same_greedy = all(torch.equal(p["toks"], pn["toks"]) for p, pn in zip(prompts, prompts_new))
    print(f"[{name}] LEGACY CHECK: max|dlogit| legacy-config vs transformers-5-config = {diff:.3g}, "
          f"greedy_logits {gdiff:.3g}, same greedy: {same_greedy} (must be 0 / True)")
    checks = {"legacy_vs_v5_config_max_logit_diff": diff, "legacy_vs_v5_config_max_greedy_logit_diff": gdiff,
              "legacy_vs_v5_same_greedy": same_greedy, "rope_vs_unscaled_max_logit_diff": sens}
    return d, name, m, prompts, {
        "features": ["config.json in pre-transformers-5 form: top-level rope_theta, "
                     "rope_scaling {type: linear, factor: 2.0}, no rope_parameters",
                     "linear rope scaling factor 2", "attention_bias (q/k/v/o bias)",
                     "mlp_bias (gate/up/down bias)", "GQA 4/2", "untied lm_head", "float32 weights"],
        "hf_rope": rope_info(m), "checks": checks}


FIXTURES = {
    "llama3-scaled": make_llama3_scaled,
    "mistral-sliding": make_mistral_sliding,
    "qwen2-yarn": make_qwen2_yarn,
    "llama-legacy-config": make_llama_legacy,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"transformers {transformers.__version__} torch {torch.__version__} threads {torch.get_num_threads()}")
    names = [n for n in FIXTURES if not args.only or n in args.only.split(",")]
    failed = []
    for n in names:
        print(f"==== {n}")
        try:
            d, name, m, prompts, extras = FIXTURES[n](args.out)
            report_prompts(prompts, m)
            write_golden(d, name, m, prompts, extras)
            print(f"[{name}] files:")
            summarize(d)
        except Exception:
            traceback.print_exc()
            failed.append(n)
    print("FAILED:", failed if failed else "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
