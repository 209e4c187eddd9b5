"""io.codebook_tune / io.torch_llama: the torch Llama equals lowbit's, the KD fine-tune lowers its loss and is
deterministic under a seed, convert(error_feedback=..., finetune_steps=...) round-trips through the format."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="error feedback and fine-tuning run in torch")

from lowbit.api import load  # noqa: E402
from lowbit.cli import main  # noqa: E402
from lowbit.formats.codebook import CodebookWeight  # noqa: E402
from lowbit.io.checkpoint import is_linear, open_checkpoint  # noqa: E402
from lowbit.io.codebook_tune import finetune, kd_loss  # noqa: E402
from lowbit.io.convert import convert  # noqa: E402
from lowbit.io.torch_llama import TorchLlama  # noqa: E402
from lowbit.model import Model  # noqa: E402

from .tiny import random_weights, safetensors_digest, tiny_config, write_hf  # noqa: E402
from .torch_threads import one_thread  # noqa: E402,F401  (autouse fixture)

TEXT = ("The licenses for most software are designed to take away your freedom to share and change it. "
        "By contrast, the hello world license is intended to guarantee your freedom to share. ") * 6


def tiny_source(tmp_path):
    """A tiny f32 HF checkpoint and a calibration text file: (config, weights, checkpoint dir, text path)."""
    cfg = tiny_config()
    w = random_weights(cfg)
    src = write_hf(tmp_path / "src", cfg, w, dtype="f32")
    text = tmp_path / "calib.txt"
    text.write_text(TEXT)
    return cfg, w, src, text


def test_torch_llama_matches_lowbit_model():
    cfg = tiny_config()
    w = random_weights(cfg)
    ids = [5, 9, 33, 2, 70, 71, 100, 4]
    with torch.no_grad():
        got = TorchLlama(cfg, w)(torch.tensor([ids]))[0].numpy()
    want = Model.from_weights(cfg, w, max_context=64, native_decode=False).logits(ids)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def quantized_pair(seed=0):
    cfg = tiny_config()
    w = random_weights(cfg, seed=seed)
    packed = {n: CodebookWeight.quantize(v, m=1, v=4, b=3, g=32, iters=1) for n, v in w.items() if is_linear(n)}
    return cfg, w, packed


def test_finetune_lowers_kd_loss_and_is_deterministic():
    cfg, w, packed = quantized_pair()
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(3, cfg["vocab_size"], size=200)]
    probe = torch.tensor([ids[:64], ids[100:164]])
    runs = []
    for _ in range(2):
        student, teacher = TorchLlama(cfg, {**w, **packed}), TorchLlama(cfg, w)
        with torch.no_grad():
            before = float(kd_loss(student, teacher, probe))
        losses = finetune(student, teacher, ids, steps=12, seq=48, lr=3e-2, seed=7, progress=False)
        with torch.no_grad():
            after = float(kd_loss(student, teacher, probe))
        assert after < 0.9 * before, (before, after)
        runs.append((losses, {n: lin.packed() for n, lin in student.codebook_linears().items()}, student.norms()))
    (l1, p1, n1), (l2, p2, n2) = runs
    assert l1 == l2
    for n in p1:
        assert np.array_equal(p1[n].codebooks, p2[n].codebooks) and np.array_equal(p1[n].scale, p2[n].scale)
        assert np.array_equal(p1[n].codes, packed[n].codes)  # codes frozen
    assert all(np.array_equal(n1[k], n2[k]) for k in n1)
    student = TorchLlama(cfg, {**w, **packed})
    finetune(student, TorchLlama(cfg, w), ids, steps=12, seq=48, lr=3e-2, seed=8, progress=False)
    other = {n: lin.packed() for n, lin in student.codebook_linears().items()}
    assert any(not np.array_equal(other[n].codebooks, p1[n].codebooks) for n in p1)  # the seed matters


def test_convert_with_error_feedback_and_finetune_round_trips(tmp_path):
    cfg, w, src, text = tiny_source(tmp_path)
    opts = {"m": 2, "v": 4, "b": 3, "g": 32, "iters": 1, "seed": 3}
    kw = dict(format="codebook", format_options=opts, calibration=text, calibration_tokens=300, progress=False,
              error_feedback=True, finetune_steps=3, finetune_options={"seq": 32, "lr": 1e-3})
    a = convert(src, tmp_path / "a", **kw)
    b = convert(src, tmp_path / "b", **kw)
    assert safetensors_digest(a) == safetensors_digest(b)
    ck = open_checkpoint(a)
    assert ck.lowbit["error_feedback"] == {"damp": 0.01} and ck.lowbit["finetune"]["steps"] == 3
    name = "model.layers.1.mlp.down_proj.weight"
    pw = ck.load(name)
    assert isinstance(pw, CodebookWeight) and (pw.m, pw.v, pw.b, pw.group) == (2, 4, 3, 32)
    assert np.mean((pw.dequantize() - w[name]) ** 2) < 0.5 * np.mean(w[name] ** 2)
    norm = ck.load("model.layers.0.input_layernorm.weight")
    assert norm.dtype == np.float32 and not np.array_equal(norm, w["model.layers.0.input_layernorm.weight"])
    assert load(a).logits([1, 2, 3]).shape == (3, cfg["vocab_size"])


def test_cli_flags_and_errors(tmp_path):
    cfg, _, src, text = tiny_source(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--format", "codebook", "--b", "3", "--g", "32", "--iters", "1",
                 "--calibration", str(text), "--calibration-tokens", "200", "--finetune-steps", "2",
                 "--finetune-seq", "32", "--damp", "0.05", "--teacher-tokens", "30", "--pv-steps", "1", "--finetune-schedule", "cosine", "-q"]) == 0
    meta = open_checkpoint(out).lowbit
    assert meta["error_feedback"] == {"damp": 0.05} and meta["finetune"]["steps"] == 2
    ft = meta["finetune"]
    assert (ft["schedule"], ft["warmup"], ft["teacher_tokens"], ft["extra_frac"], ft["pv_steps"]) == ("cosine", 0, 30, 0.5, 1)
    with pytest.raises(ValueError, match="calibration"):
        convert(src, tmp_path / "x", format="codebook", error_feedback=True, progress=False)
    with pytest.raises(ValueError, match="Llama"):
        convert(write_hf(tmp_path / "q", tiny_config(model_type="qwen2"), random_weights(tiny_config(model_type="qwen2")),
                         dtype="f32"), tmp_path / "y", format="codebook", calibration=text, error_feedback=True,
                progress=False)


def test_lr_factor_warmup_then_cosine():
    from lowbit.io.codebook_tune import lr_factor

    f = [lr_factor(i, 20, 4, "cosine") for i in range(20)]
    assert f[:4] == [0.2, 0.4, 0.6, 0.8] and f[4] == 1.0
    assert all(a > b for a, b in zip(f[4:], f[5:])) and f[-1] < 0.01
    assert [lr_factor(i, 20, 2, "constant") for i in (0, 1, 2, 19)] == [1 / 3, 2 / 3, 1.0, 1.0]


def test_finetune_with_teacher_samples_is_deterministic_and_checks_options():
    from lowbit.io.codebook_tune import tune
    from lowbit.io.kd_data import teacher_samples

    cfg, w, packed = quantized_pair()
    rng = np.random.default_rng(1)
    ids = [int(i) for i in rng.integers(3, cfg["vocab_size"], size=120)]
    # teacher_samples needs the tokenizer's EOS ids only (the batch engine also decodes text: none here)
    tok = type("Tok", (), {"eos_ids": {2}, "decode": lambda self, ids, skip_special=True: ""})()
    s1 = teacher_samples(cfg, w, tok, ids, tokens=90, length=30, seed=5, progress=False)
    s2 = teacher_samples(cfg, w, tok, ids, tokens=90, length=30, seed=5, progress=False)
    assert s1 == s2 and 60 <= sum(len(s) for s in s1) <= 90 + 8 * len(s1)
    assert all(2 not in s[8:] for s in s1)  # EOS ends a sample and is dropped
    assert all(any(s[:8] == ids[i:i + 8] for i in range(len(ids) - 7)) for s in s1)  # prompts cut from ids
    assert teacher_samples(cfg, w, tok, ids, tokens=90, length=30, seed=6, progress=False) != s1
    runs = []
    opts = {"seq": 32, "lr": 3e-2, "seed": 2, "schedule": "cosine", "warmup": 2, "teacher_tokens": 60,
            "teacher_len": 20, "extra_frac": 0.5}
    for _ in range(2):
        runs.append(tune(cfg, w, tok, ids, packed, w["lm_head.weight"], 6, opts, progress=False))
    (t1, l1), (t2, l2) = runs
    assert l1 == l2 and len(l1) == 6 and all(np.array_equal(t1[n].codebooks, t2[n].codebooks) for n in packed)
    assert set(t1) == set(packed) | {n for n in w if "norm" in n}
    student = TorchLlama(cfg, {**w, **packed})
    with pytest.raises(ValueError, match="schedule"):
        finetune(student, TorchLlama(cfg, w), ids, 2, schedule="linear", progress=False)
    with pytest.raises(ValueError, match="extra"):
        finetune(student, TorchLlama(cfg, w), ids, 2, extra_frac=0.5, progress=False)


def test_finetune_dir_keeps_codes_and_other_tensors(tmp_path):
    from lowbit.io.codebook_tune import finetune_dir

    cfg, w, src, text = tiny_source(tmp_path)
    first = convert(src, tmp_path / "ef", format="codebook", format_options={"m": 1, "v": 4, "b": 3, "g": 32, "iters": 1},
                    calibration=text, calibration_tokens=300, progress=False, error_feedback=True, finetune_steps=0)
    losses = finetune_dir(first, src, tmp_path / "ft", TEXT, 300, 4,
                          {"seq": 32, "lr": 3e-2, "schedule": "cosine", "warmup": 1, "teacher_tokens": 40,
                           "teacher_len": 16, "extra_frac": 0.5, "holdout": 40}, progress=False, save_every=2)
    assert len(losses) == 4
    # the checkpoint after 2 of the 4 steps: same codes, codebooks between the start's and the end's
    mid = open_checkpoint(tmp_path / "ft-2")
    assert mid.lowbit["finetune_again"]["steps"] == 2 and not (tmp_path / "ft-4").exists()
    assert [s for s, _ in open_checkpoint(tmp_path / "ft").lowbit["finetune_again"]["holdout_kl"]] == [0, 4]
    cb = [open_checkpoint(d).load("model.layers.0.mlp.up_proj.weight").codebooks for d in (first, mid.path, tmp_path / "ft")]
    assert not np.array_equal(cb[0], cb[1]) and not np.array_equal(cb[1], cb[2])
    a, b = open_checkpoint(first), open_checkpoint(tmp_path / "ft")
    assert b.lowbit["finetune_again"]["steps"] == 4 and a.tensor_names() == b.tensor_names()
    name = "model.layers.1.self_attn.o_proj.weight"
    pa, pb = a.load(name), b.load(name)
    assert np.array_equal(pa.codes, pb.codes) and not np.array_equal(pa.codebooks, pb.codebooks)
    assert np.array_equal(np.asarray(a.load("lm_head.weight").dequantize()), np.asarray(b.load("lm_head.weight").dequantize()))
    assert load(tmp_path / "ft").logits([1, 2, 3]).shape == (3, cfg["vocab_size"])
    with pytest.raises(ValueError, match="save_every"):
        finetune_dir(first, src, tmp_path / "z", TEXT, 300, 1, {}, progress=False, save_every=-1)
    with pytest.raises(ValueError, match="no codebook"):
        finetune_dir(convert(src, tmp_path / "i4", format="int4", progress=False), src, tmp_path / "x", TEXT, 300, 1, {},
                     progress=False)


def test_rechoose_codes_replaces_bad_codes_and_keeps_good_ones():
    from lowbit.io.codebook_tune import rechoose_codes

    cfg, w, packed = quantized_pair()
    rng = np.random.default_rng(3)
    ids = [int(i) for i in rng.integers(3, cfg["vocab_size"], size=150)]
    bad = {}
    for n, pw in packed.items():  # the same codebooks and scales, random codes
        codes = rng.integers(0, 2 ** pw.b, size=pw.unpacked_codes().shape).astype(np.uint8)
        bad[n] = CodebookWeight.from_parts(codes, pw.scales(), pw.codebooks, pw.group, k=pw.shape[1], **pw.meta_extra)
    norms = {n: v * 1.1 for n, v in w.items() if "layernorm" in n}  # "fine-tuned" norms: targets rescaled
    new, changed = rechoose_codes(cfg, w, {**bad, **norms}, ids, progress=False)
    assert changed == len(packed) and set(new) == set(packed)
    for n in packed:
        assert np.array_equal(new[n].codebooks, bad[n].codebooks) and np.array_equal(new[n].scale, bad[n].scale)
    probe = torch.tensor([ids[:64]])
    teacher = TorchLlama(cfg, w)
    with torch.no_grad():
        kl_bad = float(kd_loss(TorchLlama(cfg, {**w, **bad, **norms}), teacher, probe))
        kl_new = float(kd_loss(TorchLlama(cfg, {**w, **new, **norms}), teacher, probe))
    assert kl_new < 0.5 * kl_bad, (kl_bad, kl_new)
    again, changed = rechoose_codes(cfg, w, {**new, **norms}, ids, progress=False)
    assert changed == 0 and all(np.array_equal(again[n].codes, new[n].codes) for n in new)  # nothing better found


def test_codebook_linear_weight_equals_dequantize_with_a_partial_group():
    from lowbit.io.torch_llama import CodebookLinear

    w = np.random.default_rng(4).standard_normal((37, 90)).astype(np.float32)  # K 90: groups 64 + 26 (+2 padded)
    for m in (1, 2):
        pw = CodebookWeight.quantize(w, m=m, v=4, b=3, g=64, iters=1)
        lin = CodebookLinear(pw)
        assert lin.codes.dtype == torch.uint8
        assert np.array_equal(lin.weight().detach().numpy(), pw.dequantize())
        assert np.array_equal(lin.packed().codes, pw.codes)


def test_several_calibration_files_and_the_heldout_check(tmp_path):
    cfg, _, src, text = tiny_source(tmp_path)
    more = tmp_path / "more.txt"
    more.write_text("Everyone is permitted to copy and distribute verbatim copies of this license document. " * 4)
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--format", "codebook", "--b", "3", "--g", "32", "--iters", "1",
                 "--calibration", str(text), str(more), "--calibration-tokens", "400", "--finetune-steps", "3",
                 "--finetune-seq", "32", "--finetune-lr", "3e-2", "--teacher-tokens", "0",
                 "--finetune-holdout", "64", "-q"]) == 0
    meta = open_checkpoint(out).lowbit
    assert meta["calibration"] == ["calib.txt,more.txt", 400]
    kl = meta["finetune"]["holdout_kl"]
    assert [s for s, _ in kl] == [0, 3] and all(np.isfinite(k) and k >= 0 for _, k in kl)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        convert(src, tmp_path / "x", format="codebook", calibration=[text, tmp_path / "nope.txt"], progress=False)
    with pytest.raises(ValueError, match="holdout"):
        convert(src, tmp_path / "y", format="codebook", format_options={"b": 3, "g": 32, "iters": 1},
                calibration=text, calibration_tokens=100, error_feedback=True, finetune_steps=1,
                finetune_options={"seq": 32, "holdout": 99}, progress=False)


def test_heldout_kl_is_zero_for_the_teacher_and_positive_for_a_quantized_student():
    from lowbit.io.codebook_tune import heldout_kl

    cfg, w, packed = quantized_pair()
    ids = list(range(3, 70))
    teacher = TorchLlama(cfg, w)
    assert heldout_kl(teacher, teacher, ids, 16) == pytest.approx(0.0, abs=1e-6)
    student = TorchLlama(cfg, {**w, **packed})
    with torch.no_grad():
        manual = [float(kd_loss(student, teacher, torch.tensor([ids[s:s + 16]]))) for s in range(0, 64, 16)]
        # windows of 16 tokens (15 scored each) and a last one of 3 tokens (2 scored)
        last = float(kd_loss(student, teacher, torch.tensor([ids[64:]])))
    want = (sum(m * 15 for m in manual) + last * 2) / 62
    assert heldout_kl(student, teacher, ids, 16) == pytest.approx(want, rel=1e-5) and want > 0
