"""Export a checkpoint to chunked, static-shape, stateful OpenVINO IR (NITRO's layout).

    export("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-ov", weights="int4", max_seq_len=1024, chunk_layers=8)

OUT/
    openvino.json             manifest: chunks in order, max_seq_len, cache slots, weight types, device
    config.json, tokenizer*   the model's config (normalized) and tokenizer, as in a lowbit directory
    embed.xml/.bin            token [1, T] -> x
    layers_00_07.xml/.bin     x, mask, cos, sin, pos -> x; state cache_k_i / cache_v_i per layer
    ...
    head.xml/.bin             x -> logits
    cache/                    OpenVINO's compiled-model cache (filled on first compile per device)

The models are written for T = 1 (decode); the runtime reshapes a copy to T = P for chunked prefill.
Conversion reads one chunk's tensors at a time (peak memory: about one chunk in float32) and writes
into a temporary folder renamed to OUT at the end.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import uuid

import numpy as np

from lowbit.openvino import require_openvino

MANIFEST = "openvino.json"
VERSION = 1
DEFAULT_MAX_SEQ_LEN = 1024
DEFAULT_CHUNK_LAYERS = 8
DEVICES = ("CPU", "GPU", "NPU")


def is_openvino_dir(path) -> bool:
    return (pathlib.Path(path) / MANIFEST).is_file()


def read_manifest(path) -> dict:
    p = pathlib.Path(path) / MANIFEST
    if not p.is_file():
        raise FileNotFoundError(f"{p}: not an OpenVINO export (run `lowbit export-openvino MODEL OUT` first)")
    try:
        m = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: malformed manifest ({e})") from None
    if m.get("version") != VERSION:
        raise ValueError(f"{p}: export version {m.get('version')!r} is not {VERSION}; export the model again")
    for c in m.get("chunks", []):
        if not (p.parent / c["file"]).is_file():
            raise FileNotFoundError(f"{p.parent / c['file']}: chunk listed in {MANIFEST} is missing")
    return m


def side_weights(weights: str) -> tuple[str, str]:
    """(embedding, lm_head) weight types for a layer weight type: floats keep their own; integer
    exports keep the embedding in float16 and the lm_head in int8 (OpenVINO's compressed weights have no 6-bit
    type, `lowbit convert`'s default; an int6 lm_head is re-quantized from its values)."""
    return (weights, weights) if weights in ("f32", "f16") else ("f16", "int8")


def chunk_plan(n_layers: int, chunk_layers: int) -> list[list[int]]:
    if chunk_layers < 1:
        raise ValueError(f"chunk_layers must be >= 1, got {chunk_layers}")
    return [list(range(s, min(s + chunk_layers, n_layers))) for s in range(0, n_layers, chunk_layers)]


def export(src, out, weights: str = "int4", group_size: int | None = None, max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
           chunk_layers: int = DEFAULT_CHUNK_LAYERS, device: str = "CPU", overwrite: bool = False,
           progress: bool = True) -> pathlib.Path:
    """Writes the OpenVINO export of checkpoint `src` (HF folder, .gguf or lowbit dir) to `out`.

    weights: f32, f16, int8, int4, int2, ternary, binary (decoder projections; see side_weights()).
    group_size: input channels per scale for integer weights (None: the format's default).
    max_seq_len: the static KV cache length (tokens). chunk_layers: decoder layers per IR.
    device: the device the export is meant for (recorded; the runtime's default).
    """
    require_openvino()
    import openvino as ov

    from lowbit.io.checkpoint import EMBED, FINAL_NORM, LM_HEAD, is_linear, open_checkpoint
    from lowbit.openvino.graph import (
        WEIGHT_TYPES, as_weight, check_graph_supports, embed_model, head_model, layers_model,
    )

    if weights not in WEIGHT_TYPES:
        raise ValueError(f"unknown OpenVINO weight type {weights!r}; choose one of {', '.join(WEIGHT_TYPES)}")
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    out = pathlib.Path(out).expanduser()
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):  # an empty dir is fine
        from lowbit.io.modeldir import OutputExistsError

        if not overwrite:
            raise OutputExistsError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it")
        if not is_openvino_dir(out):  # overwrite replaces an earlier export, never a user's file or folder
            raise OutputExistsError(f"{out} exists and is not an OpenVINO export (no {MANIFEST}); refusing to "
                                    "replace it")
    ck = open_checkpoint(src)
    cfg = dict(ck.config)
    check_graph_supports(cfg, max_seq_len, ck.path)
    names = set(ck.tensor_names())
    embed_w, head_w = side_weights(weights)
    plan = chunk_plan(cfg["num_hidden_layers"], chunk_layers)
    slots = max_seq_len + 1  # + the scratch slot padding tokens write to

    def get(name: str, required: bool = True):
        if name not in names:
            if required:
                raise KeyError(f"{ck.path}: tensor {name!r} is missing")
            return None
        v = ck.load(name)
        if is_linear(name):
            return as_weight(v, weights, group_size)
        return np.asarray(v.dequantize() if hasattr(v, "dequantize") else v, np.float32).reshape(-1)

    from tqdm.auto import tqdm

    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        chunks = []
        bar = tqdm(total=cfg["num_hidden_layers"] + 2, desc=f"lowbit export-openvino -> {weights}", unit="layer",
                   disable=not progress)

        def save(model, file, kind, layers=None):
            ov.save_model(model, str(tmp / file), compress_to_fp16=False)
            chunks.append({"file": file, "kind": kind, **({"layers": layers} if layers is not None else {})})

        table = ck.load(EMBED)
        save(embed_model(as_weight(table, embed_w), cfg["hidden_size"]), "embed.xml", "embed")
        del table
        bar.update()
        for layer_ids in plan:
            bar.set_postfix_str(f"layers {layer_ids[0]}-{layer_ids[-1]}", refresh=False)
            model = layers_model(layer_ids, get, cfg, slots)
            save(model, f"layers_{layer_ids[0]:02d}_{layer_ids[-1]:02d}.xml", "layers", layer_ids)
            del model
            bar.update(len(layer_ids))
        lm = ck.load(LM_HEAD if LM_HEAD in names else EMBED)
        save(head_model(get(FINAL_NORM), as_weight(lm, head_w), cfg["hidden_size"], cfg["rms_norm_eps"]),
             "head.xml", "head")
        del lm
        bar.update()
        bar.close()
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        ck.tokenizer().save(tmp)
        manifest = {"version": VERSION, "max_seq_len": max_seq_len, "cache_slots": slots, "weights": weights,
                    "embed_weights": embed_w, "lm_head_weights": head_w, "group_size": group_size,
                    "chunk_layers": chunk_layers, "device": device, "source": str(ck.path),
                    "openvino": ov.get_version(), "chunks": chunks}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _commit(tmp: pathlib.Path, out: pathlib.Path) -> None:
    """Renames tmp to out, replacing an existing out only once the new one is complete."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
