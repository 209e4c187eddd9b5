"""convert -> lowbit directory -> load: round trips, lossless ternary, zero-copy, atomicity, overwrite, CLI."""
import json
import warnings

import numpy as np
import pytest

from lowbit.formats import PackedWeight, quantize
from lowbit.formats.ternary import TernaryWeight
from lowbit.io.checkpoint import open_checkpoint
from lowbit.io.convert import LM_HEAD_FORMAT, convert
from lowbit.io.modeldir import LowbitCheckpoint, OutputExistsError

from .tiny import random_ternary, random_weights, tiny_config, write_bitnet_packed, write_gguf, write_hf


@pytest.fixture
def hf_src(tmp_path):
    cfg = tiny_config()  # intermediate 96: down_proj has K = 96, padded inside the formats
    weights = random_weights(cfg)
    return write_hf(tmp_path / "src", cfg, weights, dtype="f32", shards=2), weights


def test_f32_round_trip_is_exact(tmp_path, hf_src):
    src, weights = hf_src
    out = convert(src, tmp_path / "out", format="f32", lm_head_format="f32", embed_format="f32", progress=False)
    ck = open_checkpoint(out)
    assert isinstance(ck, LowbitCheckpoint) and ck.kind == "lowbit"
    assert ck.tensor_names() == list(weights)
    assert ck.config["hidden_size"] == 64 and ck.lowbit["format"] == "f32"
    for name, w in weights.items():
        got = ck.load(name)
        got = got.dequantize() if isinstance(got, PackedWeight) else got
        np.testing.assert_array_equal(got, w, err_msg=name)


@pytest.mark.parametrize("fmt,group", [("int4", None), ("int2", 64), ("int8", None), ("bf16", None)])
def test_quantized_round_trip(tmp_path, hf_src, fmt, group):
    src, weights = hf_src
    out = convert(src, tmp_path / "out", format=fmt, group_size=group, progress=False)
    ck = open_checkpoint(out)
    cfg = json.loads((out / "config.json").read_text())
    for name, w in weights.items():
        got = ck.load(name)
        if name.startswith("model.layers.") and w.ndim == 2:
            want = quantize(w, fmt, **({"group_size": group} if group else {}))
            assert got.format == fmt and cfg["lowbit"]["tensors"][name] == want.state()[0]
            np.testing.assert_array_equal(got.dequantize(), want.dequantize(), err_msg=name)
            x = np.random.default_rng(0).standard_normal((3, w.shape[1])).astype(np.float32)
            np.testing.assert_array_equal(got.matmul(x), want.matmul(x))  # the kernels run on mmapped arrays
        elif name == "lm_head.weight":
            np.testing.assert_array_equal(got.dequantize(), quantize(w, LM_HEAD_FORMAT).dequantize())
        elif name == "model.embed_tokens.weight":
            assert got.format == "bf16"
        else:
            assert isinstance(got, np.ndarray) and got.dtype == np.float32
            np.testing.assert_array_equal(got, w)


def test_load_is_zero_copy(tmp_path, hf_src):
    src, _ = hf_src
    ck = open_checkpoint(convert(src, tmp_path / "out", format="int4", progress=False))
    w = ck.load("model.layers.0.mlp.down_proj.weight")
    for a in w.state()[1].values():
        assert isinstance(a.base, np.memmap) and not a.flags.owndata
    assert isinstance(ck.load("model.norm.weight").base, np.memmap)


def test_tied_embeddings_get_their_own_lm_head(tmp_path):
    cfg = tiny_config(tie_word_embeddings=True)
    weights = random_weights(cfg)
    src = write_hf(tmp_path / "src", cfg, weights)
    ck = open_checkpoint(convert(src, tmp_path / "out", progress=False))
    assert "lm_head.weight" in ck.tensor_names() and ck.config["tie_word_embeddings"] is False
    embed = open_checkpoint(src).load("model.embed_tokens.weight")
    np.testing.assert_array_equal(ck.load("lm_head.weight").dequantize(), quantize(embed, LM_HEAD_FORMAT).dequantize())
    assert ck.load("model.embed_tokens.weight").format == "bf16"


def test_tied_embeddings_with_an_int4_lm_head(tmp_path):
    """--lm-head-format int4: the tied table is stored twice, bf16 for the gather and int4 (groups of 32, scale
    and offset) as the output projection; the directory records it and its tie."""
    cfg = tiny_config(tie_word_embeddings=True)
    src = write_hf(tmp_path / "src", cfg, random_weights(cfg))
    out = convert(src, tmp_path / "out", lm_head_format="int4", progress=False)
    ck = open_checkpoint(out)
    head = ck.load("lm_head.weight")
    embed = open_checkpoint(src).load("model.embed_tokens.weight")
    assert head.format == "int4" and head.group == 32
    np.testing.assert_array_equal(head.dequantize(), quantize(embed, "int4").dequantize())
    assert ck.load("model.embed_tokens.weight").format == "bf16"
    meta = json.loads((out / "config.json").read_text())["lowbit"]
    assert meta["lm_head_format"] == "int4" and meta["tied_embeddings"] is True


def test_bitnet_packed_stays_lossless(tmp_path):
    cfg = tiny_config(model_type="bitnet", hidden_act="relu2", tie_word_embeddings=True)
    src, truth = write_bitnet_packed(tmp_path / "src", cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # already ternary: no quality warning
        out = convert(src, tmp_path / "out", format="ternary", progress=False)
    ck = open_checkpoint(out)
    source = open_checkpoint(src)
    assert ck.config["model_type"] == "bitnet" and ck.config["hidden_act"] == "relu2"
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    for name, (t, _) in truth.items():
        got = ck.load(name)
        assert isinstance(got, TernaryWeight)
        np.testing.assert_array_equal(got.unpacked_codes().astype(np.int8) - 1, t)
        np.testing.assert_array_equal(got.dequantize(), source.load(name).dequantize())
    # to another format the ternary weights are dequantized first
    ck2 = open_checkpoint(convert(src, tmp_path / "out8", format="int8", progress=False))
    name = next(iter(truth))
    assert ck2.load(name).format == "int8"
    np.testing.assert_allclose(ck2.load(name).dequantize(), source.load(name).dequantize(), atol=0.02)


def test_gguf_tq2_to_ternary_is_lossless(tmp_path):
    cfg = tiny_config(hidden_size=256, intermediate_size=256, num_hidden_layers=1, tie_word_embeddings=True)
    rng = np.random.default_rng(3)
    weights = random_weights(cfg)
    for name in weights:
        if weights[name].ndim == 2 and name != "model.embed_tokens.weight":
            t = random_ternary(weights[name].shape, rng)
            t[:, 0] = -1
            weights[name] = t * np.float32(0.03125)
    types = {n: "TQ2_0" for n in weights if weights[n].ndim == 2 and n != "model.embed_tokens.weight"}
    src = write_gguf(tmp_path / "t.gguf", cfg, weights, types)
    ck = open_checkpoint(convert(src, tmp_path / "out", format="ternary", progress=False))
    for name in types:
        np.testing.assert_array_equal(ck.load(name).dequantize(), weights[name])
    assert ck.tokenizer().encode("hello world") == open_checkpoint(src).tokenizer().encode("hello world")


def test_ternary_on_float_weights_warns(tmp_path, hf_src):
    src, _ = hf_src
    with pytest.warns(UserWarning, match="quality to collapse"):
        convert(src, tmp_path / "out", format="ternary", progress=False)
    with pytest.warns(UserWarning, match="quality to collapse"):
        convert(src, tmp_path / "out1", format="binary", group_size=64, progress=False)
    assert open_checkpoint(tmp_path / "out1").load("model.layers.0.self_attn.q_proj.weight").format == "binary"


def test_sharded_output(tmp_path, hf_src):
    src, weights = hf_src
    out = convert(src, tmp_path / "out", format="int4", progress=False, shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2 and not (out / "model.safetensors").exists()
    ck = open_checkpoint(out)
    assert ck.tensor_names() == list(weights)
    np.testing.assert_array_equal(ck.load("model.norm.weight"), weights["model.norm.weight"])


def test_tokenizer_and_config_are_written(tmp_path, hf_src):
    src, _ = hf_src
    out = convert(src, tmp_path / "out", progress=False)
    tok, ref = open_checkpoint(out).tokenizer(), open_checkpoint(src).tokenizer()
    assert tok.encode("hello world") == ref.encode("hello world") and tok.eos_ids == ref.eos_ids
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == ref.apply_chat_template([{"role": "user", "content": "x"}])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["lowbit"]["version"] == 1 and cfg["lowbit"]["lm_head_format"] == LM_HEAD_FORMAT == "int6"
    assert cfg["lowbit"]["tensors"]["model.norm.weight"] == {"dtype": "float32", "shape": [64]}


# ---- atomicity and overwrite ----

def _leftovers(tmp_path):
    return [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_failure_mid_conversion_leaves_nothing(tmp_path, hf_src, monkeypatch):
    src, _ = hf_src
    from lowbit.io.hf import HFCheckpoint
    real = HFCheckpoint.load_source  # how convert reads matrices (load() for the rest)

    def flaky(self, name):
        if name == "model.layers.1.mlp.up_proj.weight":
            raise RuntimeError("disk on fire")
        return real(self, name)

    monkeypatch.setattr(HFCheckpoint, "load_source", flaky)
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
    # a failed --force run keeps the old directory intact
    monkeypatch.setattr(HFCheckpoint, "load_source", real)
    convert(src, tmp_path / "out", format="int8", progress=False)
    monkeypatch.setattr(HFCheckpoint, "load_source", flaky)
    with pytest.raises(RuntimeError):
        convert(src, tmp_path / "out", format="int2", overwrite=True, progress=False)
    assert open_checkpoint(tmp_path / "out").lowbit["format"] == "int8" and _leftovers(tmp_path) == []


def test_overwrite_rules(tmp_path, hf_src):
    src, _ = hf_src
    out = convert(src, tmp_path / "out", format="int8", progress=False)
    with pytest.raises(OutputExistsError, match="already exists"):
        convert(src, out, progress=False)
    convert(src, out, format="int2", overwrite=True, progress=False)
    assert open_checkpoint(out).lowbit["format"] == "int2" and _leftovers(tmp_path) == []
    other = tmp_path / "precious"
    other.mkdir()
    (other / "thesis.txt").write_text("do not delete")
    with pytest.raises(OutputExistsError, match="not a lowbit model directory"):
        convert(src, other, overwrite=True, progress=False)
    assert (other / "thesis.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    convert(src, empty, progress=False)  # an empty directory is fine
    with pytest.raises(ValueError, match="unknown format"):
        convert(src, tmp_path / "bad", format="int3", progress=False)
    with pytest.raises(ValueError, match="multiple of 32"):
        convert(src, tmp_path / "bad", group_size=48, progress=False)


def test_broken_lowbit_dir(tmp_path, hf_src):
    src, _ = hf_src
    out = convert(src, tmp_path / "out", progress=False)
    data = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        open_checkpoint(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["lowbit"]["version"] = 99
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="version 99"):
        open_checkpoint(out)


# ---- CLI ----

def test_cli_convert(tmp_path, hf_src, capsys):
    from lowbit.cli import main
    src, _ = hf_src
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--format", "int2", "--group-size", "64", "-q"]) == 0
    assert "wrote" in capsys.readouterr().out
    ck = open_checkpoint(out)
    assert ck.load("model.layers.0.self_attn.q_proj.weight").group == 64
    assert main(["convert", str(src), str(out), "-q"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["convert", str(src), str(out), "-q", "--force", "--lm-head-format", "bf16"]) == 0
    assert open_checkpoint(out).load("lm_head.weight").format == "bf16"
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "o2"), "-q"]) == 1
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    helptext = capsys.readouterr().out
    assert "--format" in helptext and "ternary" in helptext and "--force" in helptext


@pytest.mark.parametrize("argv,want", [
    (["--format", "int2", "--m", "2", "--b", "4"], "--m, --b apply to --format codebook only, not --format int2"),
    (["--format", "int4", "--ternary-method", "mse"], "--ternary-method applies to --format ternary"),
    (["--format", "codebook", "--finetune-steps", "50"], "--finetune-steps need --calibration TEXT"),
])
def test_cli_convert_refuses_options_it_would_ignore(tmp_path, hf_src, capsys, argv, want):
    # each of these converted without a word, the option having no effect
    from lowbit.cli import main
    src, _ = hf_src
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "-q", *argv]) == 1
    assert want in capsys.readouterr().err and not out.exists()


def test_cli_offers_every_format(tmp_path, hf_src, capsys):
    # the CLI's choices are convert()'s formats: rsr (README's `lowbit convert --format rsr`) and int6 (the lm_head
    # default, so `--lm-head-format int6` too) were refused by argparse
    from lowbit.cli import main
    from lowbit.cli.convert import FORMAT_HELP
    from lowbit.io.convert import FORMATS

    assert set(FORMAT_HELP) == set(FORMATS)
    src, _ = hf_src
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--format", "rsr", "--lm-head-format", "int6", "-q"]) == 0
    ck = open_checkpoint(out)
    assert ck.load("model.layers.0.mlp.up_proj.weight").format == "rsr"
    assert ck.load("lm_head.weight").format == "int6"


def test_ternary_repacks_losslessly_to_tq1():
    from lowbit.formats import quantize
    from lowbit.io.convert import pack

    w = np.random.default_rng(3).standard_normal((100, 576)).astype(np.float32)
    for scale in ("tensor", "row"):
        t = quantize(w, "ternary", scale=scale)
        q = pack(t, "tq1")
        assert q.format == "tq1"
        np.testing.assert_array_equal(q.dequantize(), t.dequantize())


@pytest.mark.parametrize("fmt", ["ternary", "tq1"])
def test_ternary_model_as_f16_and_as_tq2_converts_identically(tmp_path, fmt):
    """A BitNet-style model ({-s, 0, +s}, one s per tensor) exported as F16 GGUF (bitnet.cpp's first step) and
    as TQ2_0 gives the same codes and scales; before, F16 came back at ~2/3 of its size (absmean of 1/3 zeros)."""
    cfg = tiny_config(hidden_size=256, intermediate_size=512, num_hidden_layers=1, tie_word_embeddings=True)
    rng = np.random.default_rng(5)
    weights = random_weights(cfg)
    linear = [n for n in weights if weights[n].ndim == 2 and n != "model.embed_tokens.weight"]
    for name in linear:
        t = rng.choice([-1, 0, 1], size=weights[name].shape, p=[1 / 3, 1 / 3, 1 / 3]).astype(np.float32)
        t[0, :256] = 0  # an all-zero TQ2_0 block (its d is 0)
        weights[name] = t * np.float32(np.float16(rng.uniform(0.01, 0.1)))
    f16 = write_gguf(tmp_path / "f16.gguf", cfg, weights, {n: "F16" for n in linear})
    tq2 = write_gguf(tmp_path / "tq2.gguf", cfg, weights, {n: "TQ2_0" for n in linear})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ternary-valued input: no "quality collapses" warning, no re-ternarizing
        a = open_checkpoint(convert(f16, tmp_path / "a", format=fmt, progress=False))
        b = open_checkpoint(convert(tq2, tmp_path / "b", format=fmt, progress=False))
    for name in linear:
        wa, wb = a.load(name), b.load(name)
        (ma, ta), (mb, tb) = wa.state(), wb.state()
        assert wa.format == wb.format == fmt and ma["group"] == mb["group"], name
        for key in ta:
            np.testing.assert_array_equal(ta[key], tb[key], err_msg=f"{name} {key}")
        np.testing.assert_array_equal(wa.dequantize(), weights[name])
