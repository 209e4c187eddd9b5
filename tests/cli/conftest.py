"""A tiny lowbit model directory (random int4 weights, a small byte-level BPE tokenizer with a chat
template), written once per session, so CLI and API tests run without converting a real model."""
import pytest

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXT = ("The quick brown fox jumps over the lazy dog. A tiny model writes tiny words. "
        "Numbers 0123456789 and punctuation, too! ") * 20


def make_tokenizer():
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from lowbit.io.tokenizer import Tokenizer

    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator([TEXT], trainer)
    return Tokenizer(backend, bos_id=1, eos_ids={0, 2}, add_bos=False, chat_template=CHAT_TEMPLATE)


def write_tiny_dir(out, fmt="int4"):
    from lowbit.formats import quantize
    from lowbit.io.modeldir import ModelDirWriter
    from lowbit.model.dummy import dummy_weights

    tok = make_tokenizer()
    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               vocab_size=tok.vocab_size, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
               tie_word_embeddings=False, hidden_act="silu", bos_token_id=1, eos_token_id=2, rope_scaling=None)
    weights = dummy_weights(cfg, seed=0, std=0.3)
    with ModelDirWriter(out) as w:
        for name, a in weights.items():
            if a.ndim == 1:
                w.add(name, a)
            elif name == "model.embed_tokens.weight":
                w.add(name, quantize(a, "bf16"))
            elif name == "lm_head.weight":
                w.add(name, quantize(a, "int8"))
            else:
                w.add(name, quantize(a, fmt))
        w.finish(cfg, tok, {"format": fmt, "lm_head_format": "int8", "embed_format": "bf16", "source": "random"})
    return out


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return write_tiny_dir(tmp_path_factory.mktemp("models") / "tiny-int4")


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Converted models go to a per-session temporary cache, never to ~/.cache/lowbit."""
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path_factory.getbasetemp() / "lowbit-cache"))
