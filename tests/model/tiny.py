"""Tiny in-memory models and a byte tokenizer for the model, generate and CLI tests (no files, no downloads)."""
from __future__ import annotations

from lowbit.model import Model
from lowbit.model.dummy import dummy_weights

BOS, EOS = 256, 257


def tiny_config(**over) -> dict:
    cfg = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=260, max_position_embeddings=128,
               rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=BOS,
               eos_token_id=EOS, hidden_act="silu")
    cfg.update(over)
    return cfg


class ByteTokenizer:
    """ids 0..255 are bytes, 256 = BOS, 257 = EOS, 258/259 unused specials. Multi-byte characters span ids."""

    bos_id = BOS
    eos_ids = {EOS}
    vocab_size = 260

    def encode(self, text: str, add_bos=None) -> list[int]:
        ids = list(text.encode("utf-8"))
        return ([BOS] if add_bos or add_bos is None else []) + ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def tiny_model(seed: int = 0, format: str | None = None, max_context: int | None = None, **over) -> Model:
    cfg = tiny_config(**over)
    return Model.from_weights(cfg, dummy_weights(cfg, seed=seed, std=0.2), tokenizer=ByteTokenizer(),
                              max_context=max_context, format=format)
