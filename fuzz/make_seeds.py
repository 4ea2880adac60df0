#!/usr/bin/env python3
"""Writes the seed inputs of the file-format fuzz targets from the project's real files:
model_config <- tests/fixtures/*/config.json, deployment <- configs/*.toml, safetensors_header <- the
head of a fixture checkpoint and miniatures of real headers (same names and dtypes, tiny shapes, so
they validate and the fuzzer starts from accepted files). Frame and RPC seeds: make_seeds.cpp.
usage: fuzz/make_seeds.py            (from anywhere; writes into fuzz/corpus/)"""
import json
import pathlib
import struct

root = pathlib.Path(__file__).resolve().parent.parent
corpus = root / "fuzz" / "corpus"
fixtures = root / "tests" / "fixtures"
sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
         "F8_E4M3": 1}


def write(target, name, data):
    out = corpus / target / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    print(f"{out.relative_to(root)} ({len(data)} bytes)")


def safetensors(header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # writers pad the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + data


def miniature(path, keep=None):
    """A real header with every dimension cut to at most 2, offsets re-laid, and zero data."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    real = json.loads(raw[8:8 + n])
    header, offset = {}, 0
    for name, t in list(real.items())[:keep]:
        if name == "__metadata__":
            header[name] = t
            continue
        shape = [min(d, 2) for d in t["shape"]]
        size = sizes[t["dtype"]]
        for d in shape:
            size *= d
        header[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return safetensors(header, bytes(offset))


for d in sorted(fixtures.glob("*/config.json")):
    write("model_config", f"{d.parent.name}.json", d.read_bytes())

for f in sorted((root / "configs").glob("*.toml")):
    write("deployment", f.name, f.read_bytes())

st = fixtures / "tiny-llama" / "model.safetensors"
raw = st.read_bytes()
(n,) = struct.unpack("<Q", raw[:8])
write("safetensors_header", "tiny_llama_head", raw[:8 + n + 64])  # real header, data cut short
write("safetensors_header", "tiny_llama_mini", miniature(st, keep=12))
write("safetensors_header", "qwen2_yarn_mini", miniature(fixtures / "qwen2-yarn" / "model.safetensors", keep=12))
write("safetensors_header", "mistral_shard_mini", miniature(fixtures / "mistral-sliding" / "model-00003-of-00003.safetensors"))
every = {"__metadata__": {"format": "pt"}}
offset = 0
for i, (dtype, size) in enumerate(sizes.items()):
    every[f"t{i}.{dtype.lower()}"] = {"dtype": dtype, "shape": [2, 1], "data_offsets": [offset, offset + 2 * size]}
    offset += 2 * size
write("safetensors_header", "every_dtype", safetensors(every, bytes(offset)))
write("safetensors_header", "empty_tensor", safetensors({"e": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}}, b""))
