"""Hugging Face checkpoints: config.json + model.safetensors (or shards listed in model.safetensors.index.json).

Dense tensors (f32/f16/bf16) load as float32. Packed ternary releases (transformers' BitNet scheme:
microsoft/bitnet-b1.58-2B-4T, tiiuae/Falcon3-*-1.58bit, HF1BitLLM/Llama3-8B-1.58) load losslessly as
TernaryWeight:

    X.weight        uint8 [R = ceil(out/4), in]; bits 2i..2i+1 of packed row r hold original row r + i*R,
                    as code c = w + 1 in {0, 1, 2}
    X.weight_scale  [1] (or [out]); applied as in transformers' integrations/bitnet.py:
                    BitLinear ("linear_class": "bitlinear", the default) divides y by it -> scale = 1/ws;
                    AutoBitLinear ("linear_class": "autobitlinear", offline) multiplies -> scale = ws.
The ternary values are exact; the scale is stored as float16 by the format (relative error < 2**-11).
"""
from __future__ import annotations

import json
import re
import warnings

import numpy as np

from lowbit.formats.ternary import TernaryWeight
from lowbit.io.checkpoint import (
    LM_HEAD, Checkpoint, canonical_names, check_all_used, check_shape, expected_shape, fused_parts, fused_suffix, is_linear,
    normalize_config, read_json,
)
from lowbit.io.safetensors_file import SafetensorsFile

# source name -> HF llama name (1bitLLM's BitnetForCausalLM, checkpoints saved without the "model." prefix)
RENAMES = (
    (re.compile(r"^(layers\.|embed_tokens\.|norm\.)"), r"model.\1"),
    (re.compile(r"\.self_attn\.inner_attn_ln\."), ".self_attn.attn_sub_norm."),
    (re.compile(r"\.mlp\.ffn_layernorm\."), ".mlp.ffn_sub_norm."),
)


def sanitize_name(name: str) -> str:
    for pattern, repl in RENAMES:
        name = pattern.sub(repl, name)
    return name


def unpack_bitnet(packed: np.ndarray, out_features: int) -> np.ndarray:
    """uint8 [R, in] (transformers pack_weights) -> int8 [out_features, in] in {-1, 0, 1}."""
    rows = [((packed >> np.uint8(2 * i)) & np.uint8(3)) for i in range(4)]
    t = np.concatenate(rows, axis=0)[:out_features].astype(np.int8)
    t -= 1
    if t.size and t.max() > 1:
        raise ValueError("packed ternary weight holds code 3, which is not a ternary value")
    return t


class HFCheckpoint(Checkpoint):
    kind = "hf"

    def __init__(self, path):
        super().__init__(path)
        raw = read_json(self.path / "config.json")
        self.quant = raw.get("quantization_config") or {}
        self.files = self._open_files()
        self.where: dict[str, tuple[SafetensorsFile, str]] = {}  # HF name -> (file, stored name)
        for f in self.files:
            for stored in f.keys():
                self.where[sanitize_name(stored)] = (f, stored)
        archs = raw.get("architectures")
        archs = [a.lower() for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
        self.sub_norms = any(n.endswith("attn_sub_norm.weight") for n in self.where)
        if self.sub_norms and raw.get("model_type") == "llama" and any("bitnet" in a for a in archs):
            raw = {**raw, "model_type": "bitnet"}  # 1bitLLM: llama config, BitNet sub-norms, SiLU
        if LM_HEAD not in self.where:
            if raw.get("tie_word_embeddings") is False:  # transformers would leave lm_head random, with a warning
                warnings.warn(f"{self.path}: config.json says tie_word_embeddings: false but no {LM_HEAD} is stored; "
                              "the output projection uses the embedding (tied)", UserWarning, stacklevel=2)
            raw = {**raw, "tie_word_embeddings": True}
        self.config = normalize_config(raw, self.path / "config.json")
        self.linear_scale_mode = "multiply" if self.quant.get("linear_class") == "autobitlinear" else "divide"
        if self.quant.get("use_rms_norm"):
            raise ValueError(f"{self.path}: BitNet quantization_config with use_rms_norm is not supported")
        self._names = canonical_names(self.config, self.sub_norms)
        # fused tensors (Phi-3's qkv_proj, gate_up_proj) -> canonical name: (fused name, first row, end row)
        self.parts: dict[str, tuple[str, int, int]] = {}
        for fused in [n for n in self.where if fused_suffix(n)]:
            check_shape(self.where[fused][0].path, fused, self.where[fused][0].shape(self.where[fused][1]),
                        expected_shape(self.config, fused))
            for name, start, stop in fused_parts(self.config, fused):
                if name in self.where:
                    raise ValueError(f"{self.path}: {name!r} is stored both alone and inside {fused!r}")
                self.parts[name] = (fused, start, stop)
        check_all_used(self.path, self.config, self.where, self._names + [self.parts[n][0] for n in self.parts],
                       ignorable=("rotary_emb.inv_freq", ".weight_scale"))
        missing = [n for n in self._names if n not in self.where and n not in self.parts]
        if missing:
            raise ValueError(f"{self.path}: checkpoint lacks {len(missing)} tensors the config implies, e.g. {missing[:3]}")
        for name in self._names:
            self._check(name)

    def _open_files(self) -> list[SafetensorsFile]:
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{index}: malformed index ({e!r})") from None
            names = sorted(set(weight_map.values()))
            for n in names:
                if not (self.path / n).is_file():
                    raise FileNotFoundError(f"{self.path / n}: shard listed in {index.name} is missing")
        elif (self.path / "model.safetensors").is_file():
            names = ["model.safetensors"]
        else:
            names = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not names:
            raise FileNotFoundError(f"{self.path}: no *.safetensors weights (pytorch .bin checkpoints are not supported)")
        return [SafetensorsFile(self.path / n) for n in names]

    def _is_packed(self, name: str) -> bool:
        if name in self.parts:
            return False
        f, stored = self.where[name]
        return f.dtype(stored) == "U8" and stored.endswith(".weight") and stored[:-len("weight")] + "weight_scale" in f

    def _check(self, name: str) -> None:
        if name in self.parts:
            return  # the fused tensor's shape was checked
        f, stored = self.where[name]
        shape, want = f.shape(stored), expected_shape(self.config, name)
        if self._is_packed(name):
            want = (-(-want[0] // 4), want[1])
        check_shape(f.path, name, shape, want)

    def tensor_names(self) -> list[str]:
        return list(self._names)

    @property
    def is_ternary(self) -> bool:
        """True when the linear weights are stored packed ternary (they load as TernaryWeight)."""
        return any(self._is_packed(n) for n in self._names if is_linear(n))

    def load(self, name: str):
        if name not in self._names:
            raise self._unknown(name)
        if name in self.parts:
            fused, start, stop = self.parts[name]
            f, stored = self.where[fused]
            return np.ascontiguousarray(f.float32(stored)[start:stop])
        f, stored = self.where[name]
        if not self._is_packed(name):
            w = np.ascontiguousarray(f.float32(stored))
            if not np.isfinite(w).all():
                raise ValueError(f"{f.path}: tensor {stored!r} has NaN or Inf values")
            return w
        out_features = expected_shape(self.config, name)[0]
        t = unpack_bitnet(f.raw(stored), out_features)
        ws = f.float32(stored[:-len("weight")] + "weight_scale").reshape(-1).astype(np.float64)
        if ws.size not in (1, out_features):
            raise ValueError(f"{f.path}: {stored}_scale has {ws.size} values; expected 1 or {out_features}")
        if np.any(ws == 0) or not np.all(np.isfinite(ws)):
            raise ValueError(f"{f.path}: {stored}_scale has zero or non-finite values")
        scale = ws if self.linear_scale_mode == "multiply" else 1.0 / ws
        scale = np.broadcast_to(scale.astype(np.float32).reshape(-1, 1), (out_features, 1))
        return TernaryWeight.from_ternary(t, np.ascontiguousarray(scale), source="bitnet-packed")

    def load_source(self, name: str):
        """F32/F16/BF16 matrices as SourceRows over the mmapped file (no float32 copy)."""
        from lowbit.formats.base import SourceRows

        if name not in self._names or name in self.parts or self._is_packed(name):
            return self.load(name)
        f, stored = self.where[name]
        kind = {"F32": "f32", "F16": "f16", "BF16": "bf16"}.get(f.dtype(stored))
        if kind is None or len(f.shape(stored)) != 2:
            return self.load(name)
        return SourceRows(f.raw(stored), kind)

    def tokenizer(self):
        from lowbit.io.tokenizer import Tokenizer
        return Tokenizer.from_hf_dir(self.path, self.config)
