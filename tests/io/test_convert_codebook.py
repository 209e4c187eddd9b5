"""convert --format codebook: deterministic bytes, the options stored, loads and runs, the CLI flags."""

import numpy as np

from lowbit.api import load
from lowbit.cli import main
from lowbit.formats.codebook import CodebookWeight
from lowbit.io.checkpoint import open_checkpoint
from lowbit.io.convert import convert

from .tiny import random_weights, safetensors_digest, tiny_config, write_hf


def test_conversion_is_deterministic_and_loads(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg)
    src = write_hf(tmp_path / "src", cfg, weights, dtype="f32")
    opts = {"m": 2, "v": 8, "b": 6, "g": 32, "iters": 2, "seed": 5}
    a = convert(src, tmp_path / "a", format="codebook", format_options=opts, progress=False)
    b = convert(src, tmp_path / "b", format="codebook-m2v8b6g32", format_options={"iters": 2, "seed": 5}, progress=False)
    assert safetensors_digest(a) == safetensors_digest(b) and safetensors_digest(a)
    ck = open_checkpoint(a)
    assert ck.lowbit["format"] == "codebook" and ck.lowbit["format_options"]["m"] == 2
    name = "model.layers.0.mlp.down_proj.weight"  # K = 96
    pw = ck.load(name)
    assert isinstance(pw, CodebookWeight) and (pw.m, pw.v, pw.b, pw.group) == (2, 8, 6, 32)
    w = weights[name]
    assert np.mean((pw.dequantize() - w) ** 2) < 0.5 * np.mean(w ** 2)
    llm = load(a)
    assert llm.logits([1, 2, 3]).shape == (3, cfg["vocab_size"])


def test_cli_flags(tmp_path, capsys):
    cfg = tiny_config()
    src = write_hf(tmp_path / "src", cfg, random_weights(cfg), dtype="f32")
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--format", "codebook", "--m", "1", "--v", "4", "--b", "5",
                 "--g", "32", "--iters", "1", "-q"]) == 0
    pw = open_checkpoint(out).load("model.layers.0.self_attn.q_proj.weight")
    assert (pw.m, pw.v, pw.b, pw.group) == (1, 4, 5, 32)


def test_bad_options_fail_before_any_work(tmp_path, monkeypatch):
    import importlib

    import pytest

    convert_mod = importlib.import_module("lowbit.io.convert")  # the module (lowbit.io.convert is also the function)

    cfg = tiny_config()
    src = write_hf(tmp_path / "src", cfg, random_weights(cfg), dtype="f32")
    # the check runs before the checkpoint is opened: a bad m, v, b or g failed after the first tensors before
    monkeypatch.setattr(convert_mod, "open_checkpoint", lambda p: pytest.fail("opened the checkpoint"))
    for opts, msg in [({"m": 0}, "m \\(codebooks\\) must be in 1..8, got 0"), ({"b": 9}, "bits per code"),
                      ({"v": 8, "g": 12}, "multiple of v=8")]:
        with pytest.raises(ValueError, match=msg):
            convert(src, tmp_path / "out", format="codebook", format_options=opts, progress=False)
    with pytest.raises(ValueError, match="multiple of v=3"):
        convert(src, tmp_path / "out", format="codebook", group_size=64, format_options={"v": 3}, progress=False)
    assert not (tmp_path / "out").exists()


def test_calibration_weights_by_activation_stats(tmp_path):
    from lowbit.io.calibrate import activation_stats

    cfg = tiny_config()
    weights = random_weights(cfg)
    src = write_hf(tmp_path / "src", cfg, weights, dtype="f32")
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    stats = activation_stats(open_checkpoint(src), text.read_text(), tokens=200, ctx=64)
    name = "model.layers.1.mlp.down_proj.weight"
    assert stats[name].shape == (weights[name].shape[1],) and np.all(stats[name] >= 0) and stats[name].max() > 0
    out = convert(src, tmp_path / "out", format="codebook", format_options={"b": 5, "g": 32, "iters": 1},
                  calibration=text, calibration_tokens=200, progress=False)
    ck = open_checkpoint(out)
    assert ck.lowbit["calibration"] == ["calib.txt", 200] and ck.load(name).meta_extra["weighted"]
