"""Model shapes measured by the benchmarks (Hugging Face config names)."""
from __future__ import annotations

# name -> config; weights are random in the chosen format (as paper 000 does for Llama3-8B).
MODEL_SHAPES: dict[str, dict] = {
    "bitnet-0.7b": dict(model_type="llama", hidden_size=1536, intermediate_size=4096, num_hidden_layers=24,
                        num_attention_heads=16, num_key_value_heads=16, vocab_size=32000, label="1bitLLM bitnet_b1_58-large"),
    "falcon3-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=18,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=131072, label="Falcon3-1B"),
    "mobilellm-1.5b": dict(model_type="llama", hidden_size=1600, intermediate_size=4352, num_hidden_layers=54,
                           num_attention_heads=25, num_key_value_heads=5, vocab_size=32000, tie_word_embeddings=True,
                           label="MobileLLM-1.5B"),
    "bitnet-2b": dict(model_type="bitnet", hidden_size=2560, intermediate_size=6912, num_hidden_layers=30,
                      num_attention_heads=20, num_key_value_heads=5, vocab_size=128256, tie_word_embeddings=True,
                      label="BitNet-b1.58-2B-4T"),
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, label="Llama3-8B"),
}


def linear_shapes(cfg: dict) -> list[tuple[int, int]]:
    """Distinct (M, K) of one decoder block's projections, in model order: q, kv, o, gate/up, down."""
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q = cfg["num_attention_heads"] * hd
    kv = cfg["num_key_value_heads"] * hd
    out: list[tuple[int, int]] = []
    for s in [(q, h), (kv, h), (h, q), (f, h), (h, f)]:
        if s not in out:
            out.append(s)
    return out


GEMV_MODELS = ["falcon3-1b", "mobilellm-1.5b", "bitnet-2b", "llama3-8b"]
