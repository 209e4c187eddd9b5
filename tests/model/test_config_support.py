"""No silent fallback: every config key the runtime does not implement is refused by name (the one list:
lowbit.model.config.FEATURES, checked against each architecture's declared features), and checkpoint
tensors the model would not use (a bias without attention_bias, an unknown GGUF tensor) are refused; biases
a config asks for are loaded and match transformers."""
import json
import warnings

import numpy as np
import pytest

from lowbit.io.checkpoint import normalize_config, open_checkpoint
from lowbit.model import Model
from lowbit.model.dummy import dummy_weights
from tests.io.tiny import random_weights, tiny_config, write_gguf, write_hf

LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
REFUSED = [  # (model_type, config overrides, text the error must contain)
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
    ("llama", {"rope_scaling": LONGROPE}, "rope_type='longrope'"),  # Phi-3's, not Llama's
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("phi3", {"partial_rotary_factor": 0.75}, "partial_rotary_factor"),  # Phi-4-mini
    ("llama", {"sliding_window": 16}, "sliding_window"),
    ("llama", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("qwen2", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("llama", {"use_qk_norm": True}, "qk_norm"),
    ("mistral", {"qk_layernorm": True}, "qk_norm"),
    ("llama", {"num_key_value_heads": [2, 1]}, "num_key_value_heads"),
    ("llama", {"num_local_experts": 8}, "num_local_experts"),
    ("qwen3", {"mlp_bias": True}, "mlp_bias"),
    ("mistral", {"attention_bias": True}, "attention_bias"),
    ("llama", {"query_pre_attn_scalar": 24}, "query_pre_attn_scalar"),
    ("llama", {"logits_scaling": 8.0}, "logits_scaling"),
    ("gemma2", {"layer_types": ["chunked_attention", "full_attention"]}, "chunked_attention"),
]


@pytest.mark.parametrize("model_type,over,text", REFUSED, ids=[f"{m}-{t}" for m, _, t in REFUSED])
def test_unimplemented_config_key_is_refused(model_type, over, text):
    cfg = tiny_config(model_type=model_type, **over)
    with pytest.raises(ValueError, match="does not implement") as e:
        normalize_config(cfg, "config.json")
    assert text in str(e.value)
    base = tiny_config(model_type=model_type)
    with pytest.raises(ValueError, match="does not implement"):  # the in-memory path checks the same list
        Model.from_weights(cfg, dummy_weights(base))


def test_neutral_values_are_accepted():
    for over in ({"sliding_window": None}, {"use_sliding_window": False, "sliding_window": 16, "model_type": "qwen2"},
                 {"partial_rotary_factor": 1.0}, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                  "original_max_position_embeddings": 64}}, {"attention_bias": False}, {"num_local_experts": 0}):
        normalize_config(tiny_config(**over), "config.json")


def test_bias_tensor_without_config_is_refused(tmp_path):
    cfg = tiny_config()
    w = random_weights(cfg)
    w["model.layers.1.self_attn.q_proj.bias"] = np.ones(64, np.float32)
    with pytest.raises(ValueError, match=r"q_proj\.bias"):
        open_checkpoint(write_hf(tmp_path / "hf", cfg, w, dtype="f32"))
    with pytest.raises(ValueError, match=r"q_proj\.bias"):
        Model.from_weights(tiny_config(model_type="mistral"), {**dummy_weights(tiny_config()), **{
            "model.layers.1.self_attn.q_proj.bias": np.ones(64, np.float32)}})


def test_missing_bias_is_refused(tmp_path):
    cfg = tiny_config(attention_bias=True)
    with pytest.raises(ValueError, match="bias"):
        open_checkpoint(write_hf(tmp_path / "hf", cfg, random_weights(tiny_config()), dtype="f32"))


def rewrite_gguf(src, dst, kv: dict | None = None, tensors: dict | None = None):
    """A copy of a GGUF with extra metadata (key -> (value, GGUFValueType)) and extra float32 tensors."""
    import gguf

    from lowbit.io.gguf_checkpoint import field_value
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), field_value(reader.fields["general.architecture"]))
    for k, f in reader.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, field_value(f), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(k, field_value(f), f.types[0])
    for k, (v, vt) in (kv or {}).items():
        w.add_key_value(k, v, vt)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, a in (tensors or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_unknown_gguf_tensor_is_refused(tmp_path):
    cfg = tiny_config()
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    open_checkpoint(path)
    bad = rewrite_gguf(path, tmp_path / "router.gguf", tensors={"blk.0.ffn_gate_inp.weight": np.ones((4, 64), np.float32)})
    with pytest.raises(ValueError, match="ffn_gate_inp"):  # a MoE router: refused, not dropped
        open_checkpoint(bad)
    one_bias = write_gguf(tmp_path / "b.gguf", cfg, {**random_weights(cfg),
                                                     "model.layers.0.self_attn.q_proj.bias": np.ones(64, np.float32)})
    with pytest.raises(ValueError, match=r"k_proj\.bias"):  # a bias present: all of them expected, not dropped
        open_checkpoint(one_bias)


def test_gguf_experts_are_refused(tmp_path):
    import gguf
    cfg = tiny_config()
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    moe = rewrite_gguf(path, tmp_path / "moe.gguf", kv={"llama.expert_count": (8, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ValueError, match="num_local_experts"):
        open_checkpoint(moe)


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_llama_biases_match_transformers(tmp_path, source):
    """attention_bias + mlp_bias: the readers load every bias (before: dropped without a word)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from lowbit.api import model_from_checkpoint
    from tests.model.families import write_gguf_family, write_hf_family
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf, tmodel = write_hf_family(tmp_path / "hf", "llama", attention_bias=True, mlp_bias=True)
    src = hf if source == "hf" else write_gguf_family(tmp_path / "m.gguf", "llama", tmodel)
    ours = model_from_checkpoint(open_checkpoint(src))
    assert all(lin.bias is not None for n, lin in ours.linears().items() if n != "lm_head")
    ids = [5, 17, 42, 99, 7, 250, 33, 12]
    with torch.no_grad():
        ref = tmodel(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(ours.logits(ids) - ref).max()) < 1e-3
    assert json.loads((hf / "config.json").read_text())["attention_bias"] is True


LEFT_OUT = [  # (family, config overrides when written, keys then removed from config.json)
    ("gemma2", {}, ["attn_logit_softcapping", "final_logit_softcapping"]),  # transformers: 50 / 30
    ("gemma2", {}, ["query_pre_attn_scalar"]),  # 256, not head_dim
    ("phi3", {}, ["rms_norm_eps"]),  # 1e-5
    ("qwen2", {"sliding_window": 4, "use_sliding_window": True, "max_window_layers": 1},
     ["max_window_layers", "layer_types"]),  # 28: no layer slides
]


@pytest.mark.parametrize("family,over,drop", LEFT_OUT, ids=[f"{f}-{d[0]}" for f, _, d in LEFT_OUT])
def test_keys_left_out_take_transformers_defaults(tmp_path, family, over, drop):
    """A config.json without a key means transformers' default for its model_type (before: lowbit's generic
    default, e.g. Gemma 2 without soft-capping, logits 10 apart)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lowbit.api import model_from_checkpoint
    from tests.model.families import write_hf_family
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf, _ = write_hf_family(tmp_path / "hf", family, **over)
        cfg = json.loads((hf / "config.json").read_text())
        for k in drop:
            cfg.pop(k)
        (hf / "config.json").write_text(json.dumps(cfg))
        tmodel = transformers.AutoModelForCausalLM.from_pretrained(hf, attn_implementation="eager").float().eval()
    ids = [5, 17, 42, 99, 7, 250, 33, 12]
    with torch.no_grad():
        ref = tmodel(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(model_from_checkpoint(open_checkpoint(hf)).logits(ids) - ref).max()) < 5e-5  # Phi-3 eps: 1.5e-4


def test_in_memory_config_takes_the_same_defaults():
    from lowbit.model.config import ModelArgs, with_defaults
    cfg = tiny_config(model_type="gemma2", head_dim=16)
    for k in ("rms_norm_eps", "tie_word_embeddings"):
        cfg.pop(k)
    full = with_defaults(cfg)
    assert (full["attn_logit_softcapping"], full["final_logit_softcapping"], full["query_pre_attn_scalar"]) == (50.0, 30.0, 256)
    assert full["tie_word_embeddings"] is True and full["head_dim"] == 16  # what the config says is kept
    m = Model.from_weights(cfg, dummy_weights(full))
    assert (m.attn_softcap, m.final_softcap, m.args.rms_norm_eps) == (50.0, 30.0, 1e-6)
    assert ModelArgs.from_config({**tiny_config(model_type="bitnet"), "rope_theta": None}).rope_theta == 10000.0
    bitnet = {k: v for k, v in tiny_config(model_type="bitnet").items() if k not in ("rope_theta", "hidden_act")}
    assert (ModelArgs.from_config(bitnet).rope_theta, ModelArgs.from_config(bitnet).hidden_act) == (500000.0, "relu2")
    t5 = {**bitnet, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}  # transformers 5 spelling
    assert ModelArgs.from_config(t5).rope_theta == 10000.0
    assert normalize_config(tiny_config(model_type="qwen2", sliding_window=16), "c")["use_sliding_window"] is False


WINDOW_KEYS = [  # (family, config.json keys set after writing, layers that slide): each architecture reads the
    # window keys transformers' config class for it has (before: use_sliding_window: false turned Mistral's,
    # Phi-3's and Gemma 2's window off, and Phi-3 read layer_types; transformers keeps the window)
    ("mistral", {"use_sliding_window": False}, [True, True]),
    ("mistral", {"layer_types": ["full_attention", "sliding_attention"], "use_sliding_window": False},
     [False, True]),  # transformers' AutoConfig makes it a Ministral config, which reads layer_types
    ("phi3", {"use_sliding_window": False}, [True, True]),
    ("phi3", {"layer_types": ["full_attention", "full_attention"]}, [True, True]),
    ("gemma2", {"use_sliding_window": False}, [True, False]),
    ("qwen2", {"sliding_window": 4, "use_sliding_window": True, "layer_types": ["full_attention", "sliding_attention"]},
     [False, True]),
]


@pytest.mark.parametrize("family,keys,slides", WINDOW_KEYS, ids=[f"{f}-{'-'.join(k)}" for f, k, _ in WINDOW_KEYS])
def test_sliding_window_keys_as_transformers_reads_them(tmp_path, family, keys, slides):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lowbit.api import model_from_checkpoint
    from tests.model.families import write_hf_family
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf, _ = write_hf_family(tmp_path / "hf", family)
        cfg = json.loads((hf / "config.json").read_text())
        cfg.update(keys)
        (hf / "config.json").write_text(json.dumps(cfg))
        tmodel = transformers.AutoModelForCausalLM.from_pretrained(hf, attn_implementation="eager").float().eval()
    ids = [5, 17, 42, 99, 7, 250, 33, 12, 180, 64, 9, 3, 77, 140, 2, 8, 31, 4, 66, 21]  # longer than the windows
    with torch.no_grad():
        ref = tmodel(torch.tensor([ids])).logits[0].numpy()
    ours = model_from_checkpoint(open_checkpoint(hf))
    assert float(np.abs(ours.logits(ids) - ref).max()) < 5e-5
    assert [b.window is not None for b in ours.layers] == slides


ROPE_KEYS = [  # config.json RoPE keys written over the family's, as transformers 5 reads them (config.rope_parameters)
    {"rope_theta": 1000.0},  # beside rope_parameters' 10000: rope_parameters wins (before: the top-level one)
    {"rope_theta": 1000.0, "rope_parameters": None},  # the top-level one alone
    {"rope_theta": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}},  # rope_parameters alone
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 40000.0},  # rope_scaling replaces
     "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0}},  # rope_parameters whole
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0},  # and its theta is not read: the default is
     "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}},
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 40000.0,
     "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}},
    {"rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0}},
]


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("keys", ROPE_KEYS, ids=range(len(ROPE_KEYS)))
def test_rope_theta_and_scaling_as_transformers_reads_them(tmp_path, family, keys):
    """rope_theta at the top level vs rope_parameters.rope_theta, rope_scaling vs rope_parameters: lowbit reads
    the one transformers 5 reads (before: a top-level rope_theta beat rope_parameters', logits 1.5 apart)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lowbit.api import model_from_checkpoint
    from lowbit.model.config import ModelArgs
    from tests.model.families import write_hf_family
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf, _ = write_hf_family(tmp_path / "hf", family, max_position_embeddings=256)
        cfg = json.loads((hf / "config.json").read_text())
        for k, v in keys.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        (hf / "config.json").write_text(json.dumps(cfg))
        tmodel = transformers.AutoModelForCausalLM.from_pretrained(hf, attn_implementation="eager").float().eval()
    ids = [5, 17, 42, 99, 7, 250, 33, 12, 180, 64, 9, 3, 77, 140, 2, 8, 31, 4, 66, 21] * 3
    with torch.no_grad():
        ref = tmodel(torch.tensor([ids])).logits[0].numpy()
    ours = model_from_checkpoint(open_checkpoint(hf))
    assert float(np.abs(ours.logits(ids) - ref).max()) < 5e-5
    want = tmodel.config.rope_parameters
    for args in (ours.args, ModelArgs.from_config(cfg)):  # the checkpoint reader and the in-memory path
        assert args.rope_theta == want["rope_theta"]
        assert (args.rope_scaling or {}).get("factor") == want.get("factor")


def test_partial_rotary_factor_in_rope_parameters_is_read():
    """transformers reads partial_rotary_factor from rope_parameters first: a top-level 1.0 beside it does not
    hide it from check_supported (before: accepted, and run with full rotary)."""
    rp = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        normalize_config(tiny_config(partial_rotary_factor=1.0, rope_parameters=rp), "config.json")
    normalize_config(tiny_config(partial_rotary_factor=0.5, rope_parameters={**rp, "partial_rotary_factor": 1.0}),
                     "config.json")
