"""HF safetensors checkpoints: dense (bf16/f16/f32, sharded), BitNet-packed ternary, errors."""
import json

import numpy as np
import pytest

from lowbit.formats.floats import bf16_bits_to_f32, f32_to_bf16_bits
from lowbit.formats.ternary import TernaryWeight
from lowbit.io.checkpoint import open_checkpoint
from lowbit.io.hf import unpack_bitnet
from lowbit.io.safetensors_file import SafetensorsFile

from .tiny import pack_bitnet, random_weights, tiny_config, write_bitnet_packed, write_hf


def bf16_round(w):
    return bf16_bits_to_f32(f32_to_bf16_bits(w))


@pytest.mark.parametrize("dtype,shards", [("bf16", 1), ("bf16", 3), ("f16", 2), ("f32", 1)])
def test_dense_llama(tmp_path, dtype, shards):
    cfg = tiny_config()
    weights = random_weights(cfg)
    write_hf(tmp_path, cfg, weights, dtype=dtype, shards=shards)
    ck = open_checkpoint(tmp_path)
    assert ck.kind == "hf" and ck.config["model_type"] == "llama" and ck.config["head_dim"] == 16
    assert ck.tensor_names() == list(weights)
    for name, w in weights.items():
        got = ck.load(name)
        want = {"bf16": bf16_round, "f16": lambda a: a.astype(np.float16).astype(np.float32), "f32": lambda a: a}[dtype](w)
        assert got.dtype == np.float32 and got.shape == w.shape
        np.testing.assert_array_equal(got, want)
    if dtype == "bf16" and shards == 1:  # the file is real bf16 safetensors: torch reads the same values
        from safetensors.torch import load_file
        theirs = load_file(tmp_path / "model.safetensors")
        assert str(theirs["model.norm.weight"].dtype) == "torch.bfloat16"
        np.testing.assert_array_equal(theirs["model.norm.weight"].float().numpy(), ck.load("model.norm.weight"))


def test_tied_embeddings_have_no_lm_head(tmp_path):
    cfg = tiny_config(tie_word_embeddings=True)
    weights = random_weights(cfg)
    assert "lm_head.weight" not in weights
    write_hf(tmp_path, {**cfg, "tie_word_embeddings": False}, weights)  # config says untied; files decide, aloud
    with pytest.warns(UserWarning, match="tie_word_embeddings: false but no lm_head.weight is stored"):
        ck = open_checkpoint(tmp_path)
    assert ck.config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in ck.tensor_names()


def test_tied_config_without_lm_head_loads_quietly(tmp_path, recwarn):
    cfg = tiny_config(tie_word_embeddings=True)
    write_hf(tmp_path, cfg, random_weights(cfg))
    assert open_checkpoint(tmp_path).config["tie_word_embeddings"] is True
    assert not [w for w in recwarn if "tie_word_embeddings" in str(w.message)]


def test_unpack_matches_transformers_layout():
    rng = np.random.default_rng(0)
    for out in (8, 10, 13):
        t = rng.integers(-1, 2, size=(out, 5)).astype(np.int8)
        packed = pack_bitnet(t)
        assert packed.shape == (-(-out // 4), 5)
        np.testing.assert_array_equal(unpack_bitnet(packed, out), t)
    try:
        import torch
        from transformers.integrations.bitnet import pack_weights
    except ImportError:
        return
    t = rng.integers(-1, 2, size=(12, 7)).astype(np.int8)
    theirs = pack_weights(torch.from_numpy(t.astype(np.float32)).clone()).numpy()
    np.testing.assert_array_equal(theirs, pack_bitnet(t))
    np.testing.assert_array_equal(unpack_bitnet(theirs, 12), t)


@pytest.mark.parametrize("linear_class", ["autobitlinear", None])
def test_bitnet_packed_is_lossless_ternary(tmp_path, linear_class):
    cfg = tiny_config(model_type="bitnet", hidden_act="relu2", tie_word_embeddings=True, intermediate_size=96)
    path, truth = write_bitnet_packed(tmp_path, cfg, linear_class=linear_class)
    ck = open_checkpoint(path)
    assert ck.config["model_type"] == "bitnet" and ck.is_ternary
    names = ck.tensor_names()
    assert "model.layers.0.self_attn.attn_sub_norm.weight" in names and "model.layers.1.mlp.ffn_sub_norm.weight" in names
    for name, (t, ws) in truth.items():
        w = ck.load(name)
        assert isinstance(w, TernaryWeight) and w.shape == t.shape
        np.testing.assert_array_equal(w.unpacked_codes().astype(np.int8) - 1, t)
        # AutoBitLinear multiplies the output by weight_scale; BitLinear (Falcon3, Llama3-1.58) divides by it
        scale = ws if linear_class == "autobitlinear" else 1.0 / ws
        np.testing.assert_allclose(w.dequantize(), t * scale, rtol=2 ** -11)
    assert ck.load("model.layers.0.mlp.ffn_sub_norm.weight").shape == (96,)


def test_1bitllm_names_are_renamed(tmp_path):
    cfg = tiny_config(architectures=["BitnetForCausalLM"])
    weights = random_weights(cfg, sub_norms=True)
    renamed = {n.replace("self_attn.attn_sub_norm", "self_attn.inner_attn_ln").replace("mlp.ffn_sub_norm", "mlp.ffn_layernorm"): w
               for n, w in weights.items()}
    write_hf(tmp_path, cfg, renamed, dtype="f16")
    ck = open_checkpoint(tmp_path)
    assert ck.config["model_type"] == "bitnet" and ck.config["hidden_act"] == "silu"
    assert ck.tensor_names() == list(weights)


def test_safetensors_reader_zero_copy(tmp_path):
    cfg = tiny_config()
    write_hf(tmp_path, cfg, random_weights(cfg), dtype="f32")
    f = SafetensorsFile(tmp_path / "model.safetensors")
    a = f.raw("model.norm.weight")
    assert isinstance(a.base, np.memmap) and not a.flags.owndata
    before = a.copy()
    a[:] = 7.0  # copy-on-write: the file never changes
    np.testing.assert_array_equal(SafetensorsFile(tmp_path / "model.safetensors").raw("model.norm.weight"), before)


# ---- errors ----

def test_unknown_model_type(tmp_path):
    cfg = tiny_config(model_type="gpt_neox")
    write_hf(tmp_path, cfg, random_weights(tiny_config()))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt_neox'"):
        open_checkpoint(tmp_path)


def test_shape_mismatch(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg)
    weights["model.layers.1.mlp.up_proj.weight"] = np.zeros((97, 64), np.float32)
    write_hf(tmp_path, cfg, weights)
    with pytest.raises(ValueError, match=r"up_proj.weight.*\[97, 64\].*\[96, 64\]"):
        open_checkpoint(tmp_path)


def test_missing_tensor(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg)
    del weights["model.layers.1.self_attn.v_proj.weight"]
    write_hf(tmp_path, cfg, weights)
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        open_checkpoint(tmp_path)


def test_truncated_safetensors(tmp_path):
    cfg = tiny_config()
    write_hf(tmp_path, cfg, random_weights(cfg), shards=2)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match="truncated"):
        open_checkpoint(tmp_path)
    shard.write_bytes(data[:5])
    with pytest.raises(ValueError, match="model-00002-of-00002.safetensors"):
        open_checkpoint(tmp_path)
    shard.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + data[:10])
    with pytest.raises(ValueError, match="malformed safetensors header"):
        open_checkpoint(tmp_path)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_checkpoint(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps(tiny_config()))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        open_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="malformed JSON"):
        open_checkpoint(tmp_path)


def test_missing_shard(tmp_path):
    cfg = tiny_config()
    write_hf(tmp_path, cfg, random_weights(cfg), shards=2)
    (tmp_path / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="shard listed"):
        open_checkpoint(tmp_path)
