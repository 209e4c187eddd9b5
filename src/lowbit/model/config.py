"""ModelArgs: the decoder's hyper-parameters, under Hugging Face config.json names.

    args = ModelArgs.from_config(json.load(open("config.json")))
    args.head_dim      # hidden_size // num_attention_heads unless the config says otherwise

Unknown keys are ignored; `extra` keeps the whole dict for architecture files that need more. A key the config
leaves out means what transformers' config class for that model_type defaults it to (with_defaults).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# HF model_type -> architecture module under lowbit.model (SmolLM2, Falcon3 and Llama 3 are "llama").
ARCH_ALIASES = {
    "llama": "llama",
    "mobilellm": "llama",
    "bitnet": "bitnet",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
}


@dataclass
class ModelArgs:
    model_type: str = "llama"
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope_freq_factors: list[float] | None = None  # lowbit's key for a GGUF's rope_freqs.weight (divides inv_freq)
    vocab_size: int = 32000
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if not self.head_dim:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}; "
                    "the config must give head_dim")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")

    @classmethod
    def from_config(cls, config: dict) -> "ModelArgs":
        """Builds args from a config.json dict (transformers 4 or 5 spelling of the RoPE settings, read as
        transformers 5 reads them: rope_parameters())."""
        config = with_defaults(config)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "rope_theta", "rope_scaling"}
        kw = {k: v for k, v in config.items() if k in names and v is not None}
        theta, scaling = rope_parameters(config).get("rope_theta"), rope_scaling(config)
        if theta is not None:
            kw["rope_theta"] = theta
        if scaling is not None:
            kw["rope_scaling"] = scaling
        if config.get("share_embedding"):  # MobileLLM's spelling of tied embeddings
            kw["tie_word_embeddings"] = True
        return cls(**kw, extra=dict(config))

    @property
    def arch(self) -> str:
        """The architecture module name for this model_type."""
        try:
            return ARCH_ALIASES[self.model_type]
        except KeyError:
            raise ValueError(f"unsupported model_type {self.model_type!r}; supported: "
                             f"{', '.join(sorted(ARCH_ALIASES))}") from None

    @property
    def eos_ids(self) -> set[int]:
        e = self.eos_token_id
        if e is None:
            return set()
        return {int(e)} if isinstance(e, int) else {int(i) for i in e}


def _model_class(cfg: dict):
    """The architecture module's Model class for cfg's model_type, None for an unknown one."""
    from lowbit.model import get_model_class

    try:
        return get_model_class(str(cfg.get("model_type", "")).lower())
    except ValueError:
        return None


def with_defaults(cfg: dict) -> dict:
    """cfg with its architecture's defaults (Model.config_defaults: transformers' config class defaults) for the
    keys it leaves out. A key the config sets, even to null, is kept; an unknown model_type is left as is."""
    cls = _model_class(cfg)
    if cls is None:
        return cfg
    missing = {k: v for k, v in cls.config_defaults.items() if k not in cfg}
    return {**cfg, **missing} if missing else cfg


def rope_parameters(cfg: dict) -> dict:
    """The RoPE settings as transformers 5 runs them (its config.rope_parameters), one dict: a non-empty
    rope_scaling (transformers 4's key) replaces rope_parameters (transformers 5's) whole, and the top-level
    rope_theta / partial_rotary_factor fill in only what that dict leaves out. So rope_parameters.rope_theta
    wins over a top-level rope_theta that disagrees, and beside a rope_scaling without one, rope_parameters'
    rope_theta is not read (the top-level one, else the architecture's default, is)."""
    rp = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rp = dict(rp) if isinstance(rp, dict) else {}
    for key in ("rope_theta", "partial_rotary_factor"):
        if rp.get(key) is None and cfg.get(key) is not None:
            rp[key] = cfg[key]
    return rp


def rope_scaling(cfg: dict) -> dict | None:
    """rope_parameters() without rope_theta when it asks for a scaled RoPE (rope_type other than default), else
    None: what ModelArgs.rope_scaling and layers.rope_inv_freq take."""
    if rope_type(cfg) == "default":
        return None
    return {k: v for k, v in rope_parameters(cfg).items() if k != "rope_theta"}


# ---- what the runtime implements --------------------------------------------------------------------
# Every config key that changes a decoder's math, with a test for "this value asks for something". An
# architecture module declares the features it implements (Model.features); check_supported() refuses a
# config that asks for any other one, naming the key, so nothing is silently dropped. The one list.

def rope_type(cfg: dict) -> str:
    """The RoPE type the config asks for (rope_parameters()), "default" when none."""
    rp = rope_parameters(cfg)
    return str(rp.get("rope_type", rp.get("type", "default")) or "default")


def _partial_rotary(cfg: dict) -> float:
    v = rope_parameters(cfg).get("partial_rotary_factor", 1.0)
    return 1.0 if v is None else float(v)


# The config keys that can ask for sliding-window attention. Each architecture lists the ones transformers' config
# class for it reads (Model.window_keys): Phi-3 only sliding_window (every layer), Mistral and Gemma 2 sliding_window
# and layer_types (a Mistral config.json with layer_types loads as Ministral's), Qwen 2/3 also use_sliding_window.
WINDOW_KEYS = ("sliding_window", "use_sliding_window", "layer_types")


def window_keys(cfg: dict) -> tuple[str, ...]:
    """The sliding-window keys transformers reads for cfg's model_type (all of them for an unknown one)."""
    cls = _model_class(cfg)
    return WINDOW_KEYS if cls is None else cls.window_keys


def layer_types(cfg: dict, keys: tuple[str, ...]) -> list | None:
    """cfg's layer_types where `keys` (an architecture's window_keys) include it, else None: transformers ignores
    the key for the architectures whose config class has none."""
    return cfg.get("layer_types") if "layer_types" in keys else None


def sliding_window_active(cfg: dict, keys: tuple[str, ...] | None = None) -> bool:
    """The config asks for sliding-window attention in some layer, reading only `keys` (default: the ones
    transformers reads for cfg's model_type, window_keys)."""
    keys = window_keys(cfg) if keys is None else keys
    if cfg.get("sliding_window") in (None, 0):
        return False
    if "use_sliding_window" in keys and not cfg.get("use_sliding_window", True):  # Qwen: sliding_window -> None
        return False
    types = layer_types(cfg, keys)
    return not isinstance(types, list) or "sliding_attention" in types


def _non_neutral(key: str, neutral=(None,)):
    return lambda cfg: key in cfg and cfg[key] not in neutral


FEATURES: dict[str, tuple[str, object]] = {
    # feature: (the config key(s) it reads, cfg -> True when the config asks for it)
    "attention_bias": ("attention_bias", lambda c: bool(c.get("attention_bias"))),
    "mlp_bias": ("mlp_bias", lambda c: bool(c.get("mlp_bias"))),
    "sliding_window": ("sliding_window / use_sliding_window / layer_types", sliding_window_active),
    "qk_norm": ("use_qk_norm / qk_layernorm / qk_norm",
                lambda c: any(bool(c.get(k)) for k in ("use_qk_norm", "qk_layernorm", "qk_norm"))),
    "partial_rotary": ("partial_rotary_factor", lambda c: _partial_rotary(c) != 1.0),
    "attn_logit_softcapping": ("attn_logit_softcapping", _non_neutral("attn_logit_softcapping", (None, 0, 0.0))),
    "final_logit_softcapping": ("final_logit_softcapping", _non_neutral("final_logit_softcapping", (None, 0, 0.0))),
    "query_pre_attn_scalar": ("query_pre_attn_scalar", lambda c: c.get("query_pre_attn_scalar") is not None),
    "per_layer_heads": ("num_attention_heads / num_key_value_heads / head_dim / intermediate_size as lists",
                        lambda c: any(isinstance(c.get(k), (list, tuple)) for k in
                                      ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"))),
    "mixture_of_experts": ("num_local_experts / num_experts / n_routed_experts",
                           lambda c: any((c.get(k) or 0) > 0 for k in ("num_local_experts", "num_experts", "n_routed_experts")
                                         if isinstance(c.get(k) or 0, (int, float)))),
    "bidirectional_attention": ("use_bidirectional_attention", lambda c: bool(c.get("use_bidirectional_attention"))),
    "logit_and_residual_multipliers": ("embedding_multiplier / logits_scaling / residual_multiplier / attention_multiplier",
                                       lambda c: any(c.get(k) not in (None, 1, 1.0) for k in
                                                     ("embedding_multiplier", "logits_scaling", "residual_multiplier",
                                                      "attention_multiplier"))),
}
LAYER_TYPES = ("full_attention", "sliding_attention")


def check_supported(cfg: dict, where="config") -> None:
    """Raises ValueError naming every config key that asks for something this model_type's runtime does not
    implement (unknown rope type, sliding window, q/k norms, partial rotary, soft-capping, per-layer sizes...)."""
    from lowbit.model import get_model_class

    cls = get_model_class(str(cfg.get("model_type", "")).lower())
    cfg = with_defaults(cfg)
    problems = []
    for feature, (keys, asks) in FEATURES.items():
        try:
            active = asks(cfg)
        except (TypeError, ValueError):
            problems.append(f"{keys} has an unreadable value")
            continue
        if active and feature not in cls.features:
            problems.append(f"{keys} ({feature})")
    rope = rope_type(cfg)
    if rope not in cls.rope_types:
        problems.append(f"rope_scaling.rope_type={rope!r} (supported for {cfg.get('model_type')}: "
                        f"{', '.join(cls.rope_types)})")
    types = layer_types(cfg, cls.window_keys)  # what transformers reads
    if types is not None and (not isinstance(types, list) or len(types) != cfg.get("num_hidden_layers")):
        problems.append("layer_types is not a list with one entry per layer")
    elif isinstance(types, list) and any(t not in LAYER_TYPES for t in types):
        problems.append(f"layer_types {sorted({str(t) for t in types} - set(LAYER_TYPES))}")
    if problems:
        raise ValueError(f"{where}: model_type {cfg.get('model_type')!r} asks for what lowbit does not implement: "
                         + "; ".join(problems))
