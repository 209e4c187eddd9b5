"""Checkpoints: one reader per source kind, all speaking Hugging Face tensor names and config keys.

    ckpt = open_checkpoint("SmolLM2-135M-Instruct.Q4_1.gguf")   # or an HF folder, or a lowbit dir
    ckpt.config["hidden_size"]; ckpt.tensor_names()
    w = ckpt.load("model.layers.0.self_attn.q_proj.weight")    # float32 [M, K] or a PackedWeight
    tok = ckpt.tokenizer()

Tensor names (``W`` = weight matrices [out, in], ``N`` = norm vectors):
    model.embed_tokens.weight                          W [vocab, hidden]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight   W q [heads*hd, hidden], k/v [kv*hd, hidden], o [hidden, heads*hd]
    model.layers.{i}.mlp.{gate,up,down}_proj.weight    W gate/up [inter, hidden], down [hidden, inter]
    model.layers.{i}.input_layernorm.weight            N [hidden]
    model.layers.{i}.post_attention_layernorm.weight   N [hidden]
    model.layers.{i}.self_attn.attn_sub_norm.weight    N [heads*hd]   (BitNet only)
    model.layers.{i}.mlp.ffn_sub_norm.weight           N [inter]      (BitNet only)
    model.norm.weight                                  N [hidden]
    lm_head.weight                                     W [vocab, hidden]  (absent when tied)
Families add: *.bias [out] (Qwen2 q/k/v; attention_bias, mlp_bias), self_attn.{q,k}_norm.weight [hd] (Qwen3),
{pre,post}_feedforward_layernorm.weight [hidden] (Gemma 2). Each architecture module lists its tensors
(lowbit.model.<arch>.Model.layer_shapes); the readers split fused checkpoint tensors (FUSED: Phi-3's
qkv_proj and gate_up_proj) into these names and refuse any tensor that the model would not use.
"""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from lowbit.formats import PackedWeight

LLAMA_ALIASES = {"mobilellm": "llama", "smollm": "llama", "smollm2": "llama", "falcon3": "llama"}
# fused checkpoint tensor (inside a layer) -> the canonical tensors it stacks along rows, in order (Phi-3)
FUSED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
LINEAR_SUFFIXES = tuple(f"self_attn.{p}.weight" for p in ATTN) + tuple(f"mlp.{p}.weight" for p in MLP)
EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
FINAL_NORM = "model.norm.weight"


def model_class(config: dict, sub_norms: bool = False):
    """The architecture's Model class (lowbit.model.<arch>); sub_norms: BitNet's sub-norms on a llama config."""
    from lowbit.model import get_model_class

    cls = get_model_class(config["model_type"])
    if sub_norms and not cls.sub_norms:
        from lowbit.model.bitnet import Model as BitNet
        cls = BitNet
    return cls


def tensor_shapes(config: dict, sub_norms: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of this config has -> shape, in order (lm_head only when untied)."""
    from lowbit.model.config import ModelArgs

    return model_class(config, sub_norms).tensor_shapes(ModelArgs.from_config(config))


def canonical_names(config: dict, sub_norms: bool = False) -> list[str]:
    """Every tensor a model of this config has, in order (lm_head only when untied)."""
    return list(tensor_shapes(config, sub_norms))


def fused_parts(config: dict, fused: str) -> list[tuple[str, int, int]]:
    """model.layers.{i}.<FUSED key> -> [(canonical name, first row, end row)] of the stacked tensors."""
    prefix, _, i, suffix = fused.split(".", 3)
    parts, start = [], 0
    for part in FUSED[suffix]:
        name = f"model.layers.{i}.{part}"
        rows = expected_shape(config, name)[0]
        parts.append((name, start, start + rows))
        start += rows
    return parts


def fused_suffix(name: str) -> str | None:
    """The FUSED key of a layer tensor name, or None."""
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[3] in FUSED:
        return parts[3]
    return None


def check_all_used(where, config: dict, present, used: list[str], ignorable=()) -> None:
    """Refuses a checkpoint holding tensors the model would silently drop (a bias, a norm, an extra layer)."""
    used_set = set(used)
    extra = [n for n in present if n not in used_set and not n.endswith(tuple(ignorable))
             and not (n == LM_HEAD and config.get("tie_word_embeddings"))]  # tied: transformers ignores it too
    if extra:
        raise ValueError(f"{where}: the checkpoint has {len(extra)} tensors that model_type {config['model_type']!r} "
                         f"with this config does not use, e.g. {sorted(extra)[:3]}; lowbit refuses to drop them "
                         "(a bias needs attention_bias/mlp_bias in the config)")


def is_linear(name: str) -> bool:
    """True for the decoder layers' projection weights (the ones `format` applies to)."""
    return name.startswith("model.layers.") and name.endswith(LINEAR_SUFFIXES)


def expected_shape(config: dict, name: str) -> tuple[int, ...]:
    """The shape the config implies for a canonical tensor name."""
    from lowbit.model.config import ModelArgs

    a = ModelArgs.from_config(config)
    if name in (EMBED, LM_HEAD):
        return (a.vocab_size, a.hidden_size)
    if name == FINAL_NORM:
        return (a.hidden_size,)
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        suffix = parts[3]
        if suffix in FUSED:
            shapes = [expected_shape(config, f"model.layers.{parts[2]}.{p}") for p in FUSED[suffix]]
            return (sum(s[0] for s in shapes), shapes[0][1])
        layer = model_class(config, True).layer_shapes(a)  # BitNet's sub-norms included: shapes only
        if suffix in layer:
            return layer[suffix]
        bitnet_free = model_class(config).layer_shapes(a)
        if suffix in bitnet_free:
            return bitnet_free[suffix]
    raise KeyError(f"not a known tensor name: {name!r}")


def read_json(path: pathlib.Path) -> dict:
    """A JSON object file's content; a clear ValueError naming the file when it is malformed."""
    try:
        value = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: malformed JSON ({type(e).__name__}: {e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def normalize_config(raw: dict, where) -> dict:
    """Checks and completes a Hugging Face-style config (keys as in config.json).

    Fills the architecture's transformers defaults (config.with_defaults), then num_key_value_heads, head_dim,
    rope_theta and rope_scaling (as transformers 5 reads them from rope_parameters / rope_scaling / rope_theta:
    config.rope_parameters), rms_norm_eps, hidden_act,
    max_position_embeddings, tie_word_embeddings defaults.
    Raises ValueError naming `where` for an unsupported model_type or missing sizes.
    """
    from lowbit.model.config import ARCH_ALIASES, check_supported, rope_parameters, rope_scaling, with_defaults

    cfg = dict(raw)
    mt = str(cfg.get("model_type", "")).lower()
    mt = LLAMA_ALIASES.get(mt, mt)
    if mt not in ARCH_ALIASES:
        raise ValueError(f"{where}: unsupported model_type {cfg.get('model_type')!r}; lowbit supports "
                         f"{', '.join(sorted(ARCH_ALIASES))} (SmolLM2, Falcon3, MobileLLM are llama)")
    cfg["model_type"] = mt
    cfg = with_defaults(cfg)  # what transformers reads for the keys this config leaves out
    check_supported(cfg, where)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
            raise ValueError(f"{where}: config needs a positive integer {key!r}, got {cfg.get(key)!r}")
    check_config_values(cfg, where)
    cfg["num_key_value_heads"] = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ValueError(f"{where}: num_attention_heads={cfg['num_attention_heads']} is not a multiple of "
                         f"num_key_value_heads={cfg['num_key_value_heads']}")
    if not cfg.get("head_dim") and cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ValueError(f"{where}: hidden_size {cfg['hidden_size']} is not a multiple of num_attention_heads "
                         f"{cfg['num_attention_heads']}; the config must give head_dim")
    cfg["head_dim"] = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    if cfg["head_dim"] <= 0 or (not raw.get("head_dim") and cfg["hidden_size"] % cfg["num_attention_heads"]):
        raise ValueError(f"{where}: hidden_size {cfg['hidden_size']} is not a multiple of num_attention_heads "
                         f"{cfg['num_attention_heads']} and the config gives no positive head_dim")
    cfg["rope_theta"] = float(rope_parameters(cfg).get("rope_theta") or 10000.0)  # as transformers 5 reads them
    cfg["rope_scaling"] = rope_scaling(cfg)
    cfg["rms_norm_eps"] = float(cfg.get("rms_norm_eps") or 1e-6)
    if mt == "gemma2":  # transformers' Gemma 2 reads hidden_activation
        cfg["hidden_act"] = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    cfg["hidden_act"] = cfg.get("hidden_act") or ("relu2" if mt == "bitnet" else "silu")
    cfg["max_position_embeddings"] = int(cfg.get("max_position_embeddings") or 2048)
    cfg["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    cfg.setdefault("bos_token_id", None)
    cfg.setdefault("eos_token_id", None)
    factors = cfg.get("rope_freq_factors")
    if factors is not None and len(factors) != cfg["head_dim"] // 2:
        raise ValueError(f"{where}: config rope_freq_factors has {len(factors)} values; head_dim/2 = {cfg['head_dim'] // 2}")
    return cfg


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


SIZE_LIMITS = {"hidden_size": 1 << 17, "intermediate_size": 1 << 20, "num_hidden_layers": 1 << 12,
               "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12, "head_dim": 1 << 12, "vocab_size": 1 << 24}


def check_config_values(cfg: dict, where) -> None:
    """Type and range checks of every config value the runtime reads (None = the default), so a wrong one is a
    ValueError naming `where` and the key: never an AttributeError deep in the model, nor a silent truthiness
    ("false" is not False)."""
    def bad(key, want):
        raise ValueError(f"{where}: config {key!r} must be {want}, got {cfg.get(key)!r}")

    for key in ("num_key_value_heads", "head_dim", "max_position_embeddings"):
        if cfg.get(key) is not None and (not _is_int(cfg[key]) or cfg[key] <= 0):
            bad(key, "a positive integer")
    for key, top in SIZE_LIMITS.items():  # beyond any real model: a damaged file, not a request for terabytes
        if _is_int(cfg.get(key)) and cfg[key] > top:
            bad(key, f"at most {top}")
    if (cfg.get("max_position_embeddings") or 0) > 1 << 24:
        bad("max_position_embeddings", "at most 2**24")
    for key in ("rope_theta", "rms_norm_eps"):
        if cfg.get(key) is not None and (not _is_number(cfg[key]) or cfg[key] <= 0):
            bad(key, "a positive finite number")
    if cfg.get("hidden_act") is not None:
        from lowbit.model.layers import ACTIVATIONS
        if not isinstance(cfg["hidden_act"], str) or cfg["hidden_act"] not in ACTIVATIONS:
            bad("hidden_act", f"one of {', '.join(ACTIVATIONS)}")
    for key in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
        if cfg.get(key) is not None and not isinstance(cfg[key], bool) and cfg[key] not in (0, 1):
            bad(key, "true or false")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = cfg.get(key)
        ids = v if isinstance(v, list) and key == "eos_token_id" else [v]
        top = cfg["vocab_size"] if key == "bos_token_id" else 1 << 31  # BOS is fed to the model: it must embed
        if v is not None and not all(_is_int(i) and 0 <= i < top for i in ids):
            bad(key, "a token id below vocab_size" if key == "bos_token_id" else "a token id (eos: or a list of them)")
    architectures = cfg.get("architectures")
    if architectures is not None and not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        bad("architectures", "a list of strings")
    for key in ("rope_scaling", "rope_parameters"):
        scaling = cfg.get(key)
        if scaling is None:
            continue
        if not isinstance(scaling, dict):
            bad(key, "an object or null")
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if not isinstance(kind, str):
            raise ValueError(f"{where}: config {key}.rope_type must be a string, got {kind!r}")
        if "rope_theta" in scaling and (not _is_number(scaling["rope_theta"]) or scaling["rope_theta"] <= 0):
            raise ValueError(f"{where}: config {key}.rope_theta must be a positive number, got {scaling['rope_theta']!r}")
        needs = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings")}.get(kind, ())
        for k in needs + tuple(k for k in ("low_freq_factor", "high_freq_factor") if k in scaling and kind == "llama3"):
            if not _is_number(scaling.get(k)) or scaling[k] <= 0:
                raise ValueError(f"{where}: config {key}.{k} must be a positive number, got {scaling.get(k)!r}")
        if kind == "llama3" and scaling.get("low_freq_factor", 1.0) >= scaling.get("high_freq_factor", 4.0):
            raise ValueError(f"{where}: config {key} needs low_freq_factor < high_freq_factor")
    factors = cfg.get("rope_freq_factors")
    if factors is not None and not (isinstance(factors, list) and all(_is_number(f) and f > 0 for f in factors)):
        bad("rope_freq_factors", "a list of positive numbers (one per rotary frequency)")


def check_shape(where, name: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"{where}: tensor {name!r} has shape {list(got)} but the config implies {list(want)}")


class Checkpoint:
    """A source of weights with HF names. Subclasses: HFCheckpoint, GGUFCheckpoint, LowbitCheckpoint."""

    kind: str = ""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.config: dict = {}

    def tensor_names(self) -> list[str]:
        raise NotImplementedError

    def load(self, name: str) -> np.ndarray | PackedWeight:
        """float32 [M, K] / [N] for dense tensors, or a PackedWeight (lowbit dirs, lossless ternary)."""
        raise NotImplementedError

    def load_source(self, name: str):
        """A 2-D float tensor as stored (formats.base.SourceRows: float32 / float16 / bf16 views, no copy),
        for the native quantizers; load(name) for anything else (packed, quantized, fused, scaled)."""
        return self.load(name)

    def release(self) -> None:
        """Drops the source's mapped pages from the process once the tensors read so far are done
        (conversion calls it after each tensor, so RSS does not grow with the file); a no-op by default."""
        for f in getattr(self, "files", ()):
            if hasattr(f, "release"):
                f.release()

    def tokenizer(self):
        raise NotImplementedError

    def _unknown(self, name: str) -> KeyError:
        return KeyError(f"{self.path}: no tensor {name!r} (see tensor_names())")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.path}>"


def open_checkpoint(path) -> Checkpoint:
    """Opens an HF folder (config.json + *.safetensors), a .gguf file, or a lowbit model directory."""
    p = pathlib.Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    if p.is_file():
        with open(p, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF" or p.suffix == ".gguf":
            from lowbit.io.gguf_checkpoint import GGUFCheckpoint
            return GGUFCheckpoint(p)
        raise ValueError(f"{p}: not a GGUF file; pass a .gguf file, an HF model folder or a lowbit model directory")
    cfg = p / "config.json"
    if not cfg.is_file():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            from lowbit.io.gguf_checkpoint import GGUFCheckpoint
            return GGUFCheckpoint(ggufs[0])
        raise FileNotFoundError(f"{p}: no config.json (not an HF model folder or lowbit model directory)")
    from lowbit.io.modeldir import LowbitCheckpoint, is_lowbit_dir
    if is_lowbit_dir(p):
        return LowbitCheckpoint(p)
    from lowbit.io.hf import HFCheckpoint
    return HFCheckpoint(p)
