"""Export + runtime on tiny models (CPU device, f32 precision hint): the OpenVINO backend's logits and
greedy tokens equal lowbit's own f32 path, for every prefill chunk size, across cache reuse (a prompt
extending the cached one) and state hand-over between the prefill and decode pipelines."""
import json

import numpy as np
import pytest

import lowbit
from lowbit.api import model_from_checkpoint
from lowbit.generate import generate_step
from lowbit.io.checkpoint import open_checkpoint
from lowbit.openvino.backend import OpenVINOModel
from lowbit.openvino.export import MANIFEST, export
from tests.cli.conftest import write_tiny_dir
from tests.cli.test_api import write_hf_folder

LOGIT_ATOL = 1e-4  # f32 on both sides; measured ~1e-6 on these models


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_folder(tmp_path_factory.mktemp("ov") / "hf")


@pytest.fixture(scope="module")
def f32_export(hf_dir, tmp_path_factory):
    return export(hf_dir, tmp_path_factory.mktemp("ov") / "tiny-f32", weights="f32", max_seq_len=64,
                  chunk_layers=1, progress=False)


def test_export_layout(f32_export):
    m = json.loads((f32_export / MANIFEST).read_text())
    assert [c["kind"] for c in m["chunks"]] == ["embed", "layers", "layers", "head"]
    assert m["cache_slots"] == 65 and m["weights"] == "f32"
    import openvino as ov

    layer = ov.Core().read_model(str(f32_export / m["chunks"][1]["file"]))
    assert [p.get_any_name() for p in layer.inputs] == ["x", "mask", "cos", "sin", "pos"]
    # the output is the Result named "x" (OpenVINO renames its tensor to x_1: tensor names are unique)
    assert [o.get_node().get_friendly_name() for o in layer.outputs] == ["x"]
    assert sorted(v.get_info().variable_id for v in layer.get_variables()) == ["cache_k_0", "cache_v_0"]
    assert all(p.get_partial_shape().is_static for p in layer.inputs)
    head = ov.Core().read_model(str(f32_export / m["chunks"][-1]["file"]))
    assert head.outputs[0].get_any_name() == "logits"
    assert not list(f32_export.parent.glob(".tiny-f32.tmp-*")), "the temporary folder was left behind"


@pytest.mark.parametrize("prefill_chunk", [1, 4, 16])
def test_matches_native_f32(f32_export, hf_dir, prefill_chunk):
    ref = model_from_checkpoint(open_checkpoint(hf_dir), max_context=64)
    ov_model = OpenVINOModel(f32_export, precision="f32", prefill_chunk=prefill_chunk)
    ids = list(range(3, 21))  # 18 tokens: a partial last prefill chunk for 4 and 16
    np.testing.assert_allclose(ov_model.logits(ids), ref.logits(ids), atol=LOGIT_ATOL, rtol=0)
    for model in (ref, ov_model):
        model.reset()
    want = list(generate_step(ref, ids, max_tokens=12))
    got = list(generate_step(ov_model, ids, max_tokens=12))
    assert got == want
    # the next turn extends the cached sequence: only the new tokens are prefilled, after a decode run
    longer = ids + want + [5, 6, 7]
    want2 = list(generate_step(ref, longer, max_tokens=8))
    assert ov_model.cache.common_prefix(longer) == len(ids) + len(want) - 1
    got2 = list(generate_step(ov_model, longer, max_tokens=8))
    assert got2 == want2
    # a different prompt sharing a prefix: the cache is truncated, stale slots are rewritten
    other = ids[:5] + [30, 31, 32]
    assert list(generate_step(ov_model, other, max_tokens=6)) == list(generate_step(ref, other, max_tokens=6))


def as_exported(pw) -> np.ndarray:
    """The weights the export holds for a lowbit integer weight: a * (c - float16(zp)), zp = -b/a."""
    a, b = pw.affine()
    zp = (np.full_like(a, pw.zc) if pw.offset is None else -b / a).astype(np.float16).astype(np.float32)
    cols = np.arange(pw.shape[1]) // pw.group
    return (pw.unpacked_codes() - zp[:, cols]) * a[:, cols]


@pytest.mark.parametrize("fmt", ["int8", "int4", "int2", "ternary", "binary"])
def test_lowbit_dir_keeps_codes(tmp_path, fmt):
    """A lowbit directory exports its codes as they are (u8, u4, u2; 1-bit as u2): OpenVINO (f32) matches
    lowbit's f32 path on the same weights (codes, float16 scales, zero points rounded to float16 as the
    export stores them)."""
    src = write_tiny_dir(tmp_path / f"tiny-{fmt}", fmt=fmt)
    out = export(src, tmp_path / "ov", weights=fmt, max_seq_len=32, progress=False)
    ck = open_checkpoint(src)
    dense = {}
    for n in ck.tensor_names():
        w = ck.load(n)
        dense[n] = as_exported(w) if hasattr(w, "unpacked_codes") else (w.dequantize() if hasattr(w, "dequantize") else w)
    ref = lowbit.api.Model.from_weights(dict(ck.config), dense, max_context=32)
    ov_model = OpenVINOModel(out, precision="f32")
    ids = list(range(3, 15))
    np.testing.assert_allclose(ov_model.logits(ids), ref.logits(ids), atol=1e-4, rtol=0)


def test_api_and_cli(hf_dir, tmp_path, capsys):
    from lowbit.cli import main

    llm = lowbit.load(hf_dir, backend="openvino", format="f32", precision="f32", max_context=48, progress=False)
    assert llm.model.backend == "openvino" and llm.model.max_context == 48
    text = llm.generate("The quick", max_tokens=6)
    again = lowbit.load(hf_dir, backend="openvino", format="f32", precision="f32", max_context=48, progress=False)
    assert again.path == llm.path  # exported once into the cache, then reused
    assert again.generate("The quick", max_tokens=6) == text
    native = lowbit.load(hf_dir, format="f32", max_context=48, progress=False)
    assert native.generate("The quick", max_tokens=6) == text

    out = tmp_path / "cli-ov"
    assert main(["export-openvino", str(hf_dir), str(out), "--weights", "int8", "--max-seq-len", "32", "-q"]) == 0
    assert (out / MANIFEST).is_file() and any((out / "cache").iterdir())  # compiled once after export
    assert main(["export-openvino", str(hf_dir), str(out), "-q", "--no-compile"]) == 1  # exists, no --overwrite
    assert "already exists" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["run", "-m", str(out), "--backend", "openvino", "--no-chat", "-p", "The", "-n", "4", "-q"]) == 0
    assert capsys.readouterr().out.strip() != ""


def test_errors(f32_export, tmp_path):
    with pytest.raises(RuntimeError, match="not available"):
        OpenVINOModel(f32_export, device="NOSUCHDEVICE")
    with pytest.raises(ValueError, match="exported for at most 64"):
        lowbit.load(f32_export, backend="openvino", max_context=128)
    with pytest.raises(ValueError, match="unknown backend"):
        lowbit.load(f32_export, backend="tpu")
    with pytest.raises(FileNotFoundError, match="not an OpenVINO export"):
        OpenVINOModel(tmp_path)
    with pytest.raises(ValueError, match="unknown OpenVINO weight type"):
        export(f32_export, tmp_path / "x", weights="int3")
    model = OpenVINOModel(f32_export, precision="f32")
    with pytest.raises(lowbit.model.ContextOverflowError):
        model.prefill(list(range(65)))


def test_token_ids_checked(f32_export):
    """Float and bool ids were truncated, and out-of-range ids went to OpenVINO's Gather (-1: the last row,
    past the end: zeros) without a word: prefill, decode and logits refuse them, the cache untouched."""
    model = OpenVINOModel(f32_export, precision="f32")
    vocab = model.args.vocab_size
    for bad in (np.array([1.5, 2.0]), [3, 2.0], np.array([True, False])):
        with pytest.raises(TypeError, match="token ids must be integers"):
            model.prefill(bad)
        with pytest.raises(TypeError, match="token ids must be integers"):
            model.logits(bad)
    for bad in (-1, vocab):
        with pytest.raises(ValueError, match=f"token id {bad} is out of range: the vocabulary has {vocab} tokens"):
            model.prefill([3, bad])
    model.prefill(np.array([3, 4], np.int32))
    with pytest.raises(TypeError, match="token ids must be integers"):
        model.decode(5.0)
    with pytest.raises(ValueError, match="out of range"):
        model.decode(vocab)
    assert model.cache.length == 2 and model.cache.tokens == [3, 4]


def test_overwrite_replaces_only_an_export(hf_dir, tmp_path):
    """--overwrite used to rename away and delete whatever OUT was (a user's folder, a file, the source itself)."""
    from lowbit.io.modeldir import OutputExistsError

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    plain = tmp_path / "notes.txt"
    plain.write_text("keep me too")
    for out in (folder, plain):
        with pytest.raises(OutputExistsError, match="not an OpenVINO export"):
            export(hf_dir, out, weights="f32", max_seq_len=16, overwrite=True, progress=False)
    assert (folder / "notes.txt").read_text() == "keep me" and plain.read_text() == "keep me too"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left behind
    out = export(hf_dir, tmp_path / "ov", weights="f32", max_seq_len=16, progress=False)
    assert export(hf_dir, out, weights="f32", max_seq_len=16, overwrite=True, progress=False) == out  # an export: ok
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (export(hf_dir, empty, weights="f32", max_seq_len=16, progress=False) / MANIFEST).is_file()


def test_cache_entry_that_is_not_an_export_is_rebuilt(hf_dir):
    """A cache folder left without a manifest is lowbit's own: load() rebuilds it (export refuses other folders)."""
    from lowbit.api import cache_dir_for
    from lowbit.openvino.export import DEFAULT_CHUNK_LAYERS

    out = cache_dir_for(hf_dir, format="openvino-f32", group_size=None, max_seq_len=24,
                        chunk_layers=DEFAULT_CHUNK_LAYERS)
    out.mkdir(parents=True)
    (out / "leftover.bin").write_bytes(b"x")
    llm = lowbit.load(hf_dir, backend="openvino", format="f32", max_context=24, progress=False)
    assert llm.path == out and (out / MANIFEST).is_file() and not (out / "leftover.bin").exists()


REFUSED = [  # (family, config overrides, export max_seq_len, text the error names): what the graph does not build
    ("gemma2", {}, 64, "soft-capping"),  # before: KeyError 'gelu_pytorch_tanh'; with a silu config, logits 4 apart
    ("qwen3", {}, 64, "q_norm"),  # before: exported without q/k norms, logits 1.4 apart
    ("mistral", {}, 64, "sliding_window 8"),  # before: attended past the window, logits 3.8 apart
    ("phi3", {"sliding_window": None}, 64, "'longrope'"),  # before: KeyError 'factors'
]


@pytest.mark.parametrize("family,over,max_seq_len,text", REFUSED, ids=[r[0] for r in REFUSED])
def test_what_the_graph_does_not_build_is_refused(tmp_path, family, over, max_seq_len, text):
    """Gemma 2's soft-capping (and the rest of its decoder), Qwen 3's q/k norms, a sliding window shorter than
    the export, longrope: the graph builds none of them, so export and load refuse the model by name."""
    import warnings

    from tests.model.families import write_hf_family
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf, _ = write_hf_family(tmp_path / "hf", family, **over)
    with pytest.raises(ValueError, match="OpenVINO backend does not build") as e:
        export(hf, tmp_path / "ov", weights="f32", max_seq_len=max_seq_len, progress=False)
    assert text in str(e.value) and not (tmp_path / "ov").exists()
    with pytest.raises(ValueError, match=text):
        lowbit.load(hf, backend="openvino", format="f32", max_context=max_seq_len, progress=False)


def test_export_from_before_the_check_is_refused(f32_export, tmp_path):
    """An export lowbit made before it refused such models (e.g. a Qwen 3 without its q/k norms) does not load."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(f32_export, old)
    cfg = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3"}))
    with pytest.raises(ValueError, match="q_norm"):
        OpenVINOModel(old)


def test_window_at_least_the_export_runs(tmp_path):
    """A sliding window at least as long as the export's cache changes nothing: exported, equal to lowbit's."""
    import warnings

    from tests.model.families import write_hf_family
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf, _ = write_hf_family(tmp_path / "hf", "mistral", sliding_window=16)
    out = export(hf, tmp_path / "ov", weights="f32", max_seq_len=16, progress=False)
    ids = list(range(3, 17))
    ref = model_from_checkpoint(open_checkpoint(hf), max_context=16)
    np.testing.assert_allclose(OpenVINOModel(out, precision="f32").logits(ids), ref.logits(ids), atol=LOGIT_ATOL, rtol=0)


def test_rope_freqs_of_a_llama3_gguf(tmp_path):
    """A Llama 3.1/3.2 GGUF carries its llama3 RoPE scaling as rope_freqs.weight (config rope_freq_factors): the
    backend's RoPE tables divide by them as lowbit's own do (before: dropped, plain RoPE without a word)."""
    from lowbit.model.dummy import dummy_weights
    from tests.io.tiny import llama3_rope_factors, tiny_config, write_gguf

    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)
    cfg = tiny_config(max_position_embeddings=64)
    factors = llama3_rope_factors(16, cfg["rope_theta"], scaling)
    path = write_gguf(tmp_path / "m.gguf", cfg, dummy_weights(cfg, seed=1, std=0.3),
                      gguf_tensors={"rope_freqs.weight": factors})
    out = export(path, tmp_path / "ov", weights="f32", max_seq_len=48, progress=False)
    ids = list(range(3, 43))
    ref = model_from_checkpoint(open_checkpoint(path), max_context=48)
    assert ref.args.rope_freq_factors is not None
    np.testing.assert_allclose(OpenVINOModel(out, precision="f32").logits(ids), ref.logits(ids), atol=LOGIT_ATOL, rtol=0)
