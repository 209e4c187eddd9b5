"""ModelArgs: the decoder's hyper-parameters, under Hugging Face config.json names.

    args = ModelArgs.from_config(json.load(open("config.json")))
    args.head_dim      # hidden_size // num_attention_heads unless the config says otherwise

Unknown keys are ignored; `extra` keeps the whole dict for architecture files that need more.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# HF model_type -> architecture module under lowbit.model (SmolLM2, Falcon3 and Llama 3 are "llama").
ARCH_ALIASES = {
    "llama": "llama",
    "mistral": "llama",
    "mobilellm": "llama",
    "bitnet": "bitnet",
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
        """Builds args from a config.json dict (transformers 4 or 5 spelling of the RoPE settings)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kw = {k: v for k, v in config.items() if k in names and v is not None}
        # transformers 5 writes rope_parameters = {"rope_type", "rope_theta", "factor", ...}
        rp = config.get("rope_parameters")
        if isinstance(rp, dict):
            if "rope_theta" in rp:
                kw.setdefault("rope_theta", rp["rope_theta"])
            if rp.get("rope_type", rp.get("type", "default")) != "default" and not kw.get("rope_scaling"):
                kw["rope_scaling"] = dict(rp)
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
