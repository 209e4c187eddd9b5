"""Tokenizers from tokenizer.json and from GGUF metadata, against transformers where it reads the same files."""
import json

import pytest

from lowbit.io.checkpoint import open_checkpoint
from lowbit.io.tokenizer import Tokenizer

from .test_gguf import smollm2_gguf
from .tiny import CHATML, random_weights, tiny_config, write_gguf, write_spm_gguf, write_tokenizer

TEXTS = ["Hello world", " leading space", "hello  world\n\nthe end", "12345 and 2024, 3.14", "café naïve 日本語 🤖",
         "line1\nline2\r\n\ttab  double  space   ", "I'm don't they'll", "<|im_start|>user\nhi<|im_end|>\n", "", "   "]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "ünïcödé\nnext line"}]


def test_hf_dir_tokenizer(tmp_path):
    write_tokenizer(tmp_path)
    tok = Tokenizer.from_hf_dir(tmp_path, {"eos_token_id": 2})
    im_start, im_end, eot = (tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    assert tok.bos_id == im_start and not tok.add_bos  # no post-processor adds it and the config does not ask
    assert tok.eos_ids == {eot, im_end}  # eos_token, config eos id 2 (= <|im_end|>), and the template's turn end
    ids = tok.encode("hello world")
    assert tok.decode(ids) == "hello world" and len(ids) == 2
    assert tok.encode("hi", add_bos=True)[0] == im_start
    text = tok.apply_chat_template(MESSAGES)
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|im_end|>") == 4
    ids = tok.encode(text)
    assert ids.count(im_end) == 4 and tok.decode(ids, skip_special=False) == text
    assert "<|im_end|>" not in tok.decode(ids)


def test_hf_dir_add_bos_and_eos_sources(tmp_path):
    write_tokenizer(tmp_path, add_bos=True)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 5]}))
    tok = Tokenizer.from_hf_dir(tmp_path, {})
    assert tok.add_bos and tok.encode("x")[0] == tok.bos_id and tok.encode("x", add_bos=False)[0] != tok.bos_id
    assert {0, 5} <= tok.eos_ids


def test_bos_from_post_processor(tmp_path):
    """Llama 3 style: no add_bos_token in the config, the post-processor prepends BOS."""
    from tokenizers import Tokenizer as Backend, processors
    write_tokenizer(tmp_path)
    backend = Backend.from_file(str(tmp_path / "tokenizer.json"))
    bos = backend.token_to_id("<|im_start|>")
    backend.post_processor = processors.TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_hf_dir(tmp_path, {})
    assert tok.add_bos and tok.encode("hello") == [bos] + Tokenizer(backend).encode("hello")


def test_chat_template_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    write_tokenizer(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tok = Tokenizer.from_hf_dir(tmp_path, {})
    for gen in (True, False):
        assert tok.apply_chat_template(MESSAGES, add_generation_prompt=gen) == theirs.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=gen)
    for text in TEXTS:
        assert tok.encode(text) == theirs.encode(text, add_special_tokens=False), text


def test_template_globals():
    from tokenizers import Tokenizer as Backend, models
    backend = Backend(models.BPE(vocab={"<s>": 0, "</s>": 1}, merges=[]))
    src = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
           "{% generation %}{{ m['content'] | tojson }}{% endgeneration %}{% endfor %}{{ eos_token }}")
    tok = Tokenizer(backend, bos_id=0, eos_ids=[1], chat_template=src)
    assert tok.apply_chat_template([{"role": "user", "content": "é"}]) == '<s>"é"</s>'
    with pytest.raises(Exception, match="no tools"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(backend).apply_chat_template([])


def test_save_round_trip(tmp_path):
    write_tokenizer(tmp_path / "src")
    tok = Tokenizer.from_hf_dir(tmp_path / "src", {"eos_token_id": 2})
    tok.save(tmp_path / "out")
    again = Tokenizer.from_hf_dir(tmp_path / "out", {})
    assert (again.bos_id, again.eos_ids, again.add_bos, again.chat_template) == (tok.bos_id, tok.eos_ids, tok.add_bos, tok.chat_template)
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)


def test_tiny_gguf_tokenizer(tmp_path):
    cfg = tiny_config()
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg), pre="gpt2")
    tok = open_checkpoint(path).tokenizer()
    assert tok.bos_id == 1 and 2 in tok.eos_ids and not tok.add_bos and tok.chat_template == CHATML
    write_tokenizer(tmp_path)  # the same vocabulary as tokenizer.json
    ref = Tokenizer.from_hf_dir(tmp_path, {})
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text), text
        assert tok.decode(tok.encode(text)) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")


def test_gguf_without_add_bos_key_follows_llama_cpp(tmp_path):
    """No tokenizer.ggml.add_bos_token (Llama 3 / Falcon 3 GGUFs from older converters): llama.cpp prepends BOS
    for their pre-tokenizers, not for others; before, lowbit never did for byte-level BPE (prompts ran without
    <|begin_of_text|>). The key, when present, decides."""
    cfg = tiny_config()
    weights = random_weights(cfg)
    for pre, add_bos, want in (("llama-bpe", None, True), ("falcon3", None, True), ("llama-bpe", False, False),
                               ("qwen2", None, False), ("smollm", None, False), ("qwen2", True, True)):
        path = write_gguf(tmp_path / f"{pre}-{add_bos}.gguf", cfg, weights, pre=pre, add_bos=add_bos)
        tok = open_checkpoint(path).tokenizer()
        assert tok.add_bos is want and (tok.encode("hello")[0] == tok.bos_id) is want, (pre, add_bos)


def test_sentencepiece_gguf_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = write_spm_gguf(tmp_path / "spm.gguf")
    tok = open_checkpoint(path).tokenizer()
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert tok.add_bos and tok.bos_id == 1 and tok.eos_ids == {2}
    for text in ["hello world", " hello  world", "the caf\u00e9 12 \u00fcn\u00ef\nx", "hello</s>", "", "a"]:
        ids = tok.encode(text)
        assert ids == theirs.encode(text) and ids[0] == 1, text
        assert tok.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text


# ---- EOS appended with the special tokens (add_eos_token) ----

def with_post_processor(d, bos: bool, eos: bool, config_key: bool | None) -> None:
    """write_tokenizer's folder with a post-processor adding BOS (<|im_start|>) / EOS (<|endoftext|>) and
    tokenizer_config's add_eos_token (None: left out)."""
    from tokenizers import Tokenizer as Backend, processors
    write_tokenizer(d)
    backend = Backend.from_file(str(d / "tokenizer.json"))
    ids = {t: backend.token_to_id(t) for t in ("<|im_start|>", "<|endoftext|>")}
    single = " ".join(["<|im_start|>"] * bos + ["$A"] + ["<|endoftext|>"] * eos)
    specials = [(t, i) for t, i, on in zip(ids, ids.values(), (bos, eos)) if on]
    backend.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials) if specials else None
    backend.save(str(d / "tokenizer.json"))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    if config_key is not None:
        tc["add_eos_token"] = config_key
    (d / "tokenizer_config.json").write_text(json.dumps(tc))


@pytest.mark.parametrize("bos,eos,config_key", [(True, True, True), (True, True, None), (False, True, None),
                                                (True, False, False), (True, False, None), (False, False, None)])
def test_add_eos_matches_transformers(tmp_path, bos, eos, config_key):
    """EOS appended where transformers appends it: a tokenizer.json whose post-processor adds EOS (what
    transformers writes for add_eos_token: true) encoded without it before. add_bos=False: the text's own tokens."""
    transformers = pytest.importorskip("transformers")
    with_post_processor(tmp_path, bos, eos, config_key)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tok = Tokenizer.from_hf_dir(tmp_path, {})
    for text in TEXTS:
        assert tok.encode(text) == theirs(text)["input_ids"], text
        assert tok.encode(text, add_bos=False) == theirs(text, add_special_tokens=False)["input_ids"], text
    assert (tok.add_bos, tok.add_eos) == (bos, eos) and tok.eos_token_id == tok.token_to_id("<|endoftext|>")
    assert tok.encode("hi", add_eos=False)[-1:] != [tok.eos_token_id]
    assert tok.encode("hi", add_bos=False, add_eos=True)[-1] == tok.eos_token_id


def test_add_eos_token_in_config_only(tmp_path):
    """tokenizer_config.json's add_eos_token decides when set, as add_bos_token does (transformers 4's Llama and
    Gemma tokenizers and llama.cpp's convert_hf_to_gguf read it; transformers 5 reads only the post-processor,
    which agrees in the files it saves); a lowbit save writes a post-processor that says the same."""
    transformers = pytest.importorskip("transformers")
    with_post_processor(tmp_path / "src", True, False, True)
    tok = Tokenizer.from_hf_dir(tmp_path / "src", {})
    eos = tok.token_to_id("<|endoftext|>")
    assert tok.encode("hello") == [tok.bos_id, tok.token_to_id("hello"), eos] and tok.add_eos
    with_post_processor(tmp_path / "off", True, True, False)
    assert Tokenizer.from_hf_dir(tmp_path / "off", {}).encode("hello")[-1] != eos
    tok.save(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["add_eos_token"] is True
    again = Tokenizer.from_hf_dir(tmp_path / "out", {})
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text) == theirs(text)["input_ids"], text


@pytest.mark.parametrize("add_eos", [True, False, None])
@pytest.mark.parametrize("kind", ["spm", "bpe"])
def test_gguf_add_eos_token(tmp_path, kind, add_eos):
    """tokenizer.ggml.add_eos_token: llama.cpp's llama_tokenize with add_special appends tokenizer.ggml.eos_token_id
    (before: never); absent means false. Against transformers' GGUF tokenizer, and kept by a lowbit save."""
    transformers = pytest.importorskip("transformers")
    if kind == "spm":
        path = write_spm_gguf(tmp_path / "m.gguf", add_eos=add_eos)
    else:
        cfg = tiny_config()
        path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg), pre="gpt2", add_bos=True, add_eos=add_eos)
    tok = open_checkpoint(path).tokenizer()
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert tok.encode("hello") == theirs("hello")["input_ids"]
    assert tok.add_eos is bool(add_eos) and tok.eos_token_id == 2
    tok.save(tmp_path / "dir")
    again = Tokenizer.from_hf_dir(tmp_path / "dir", {})
    theirs_dir = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "dir"))
    for text in ["hello world", " hello  world", "the caf\u00e9 12", ""]:
        ids = tok.encode(text)
        assert ids == theirs(text)["input_ids"] == again.encode(text) == theirs_dir(text)["input_ids"], text
        assert (ids[-1] == 2) is bool(add_eos) and ids[0] == 1, text
        assert tok.encode(text, add_bos=False) == theirs(text, add_special_tokens=False)["input_ids"], text


@pytest.fixture(scope="module")
def smollm2_tokenizers():
    transformers = pytest.importorskip("transformers")
    p = smollm2_gguf()
    if p is None:
        pytest.skip("SmolLM2 GGUF not installed")
    return open_checkpoint(p).tokenizer(), transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def test_smollm2_gguf_tokenizer_matches_transformers(smollm2_tokenizers):
    tok, theirs = smollm2_tokenizers
    assert tok.bos_id == theirs.bos_token_id == 1 and tok.eos_ids == {theirs.eos_token_id} == {2}
    assert tok.vocab_size == len(theirs) == 49152
    chat = tok.apply_chat_template(MESSAGES)
    assert chat == theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    for text in TEXTS + [chat, chat * 2]:
        ids = tok.encode(text)
        assert ids == theirs.encode(text), text
        assert tok.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids, skip_special=False) == text


def test_template_eos_token_is_the_tokenizers_own(tmp_path):
    # Llama 3 style: tokenizer_config's eos_token (<|im_end|> here, <|eot_id|> there) is not the smallest of the
    # generation config's eos ids (<|endoftext|> here, <|end_of_text|> there); a template's {{ eos_token }} is the former
    transformers = pytest.importorskip("transformers")
    write_tokenizer(tmp_path)
    tc = json.loads((tmp_path / "tokenizer_config.json").read_text())
    tc["eos_token"] = "<|im_end|>"
    tc["chat_template"] = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tc))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ids = [theirs.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    tok = Tokenizer.from_hf_dir(tmp_path, {})
    assert tok.eos_ids >= set(ids) and min(tok.eos_ids) == ids[0]
    want = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert "<|im_end|>" in want
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=False) == want
