"""Tokenizer: a `tokenizers.Tokenizer` plus what a chat model needs around it (BOS, end-of-turn ids, chat template).

    tok = ckpt.tokenizer()
    ids = tok.encode("some text")   # BOS (and EOS) as the model says, as transformers / llama.cpp add them
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}]), add_bos=False)  # the template's own
    text = tok.decode(ids)
    tok.eos_ids   # {2} for SmolLM2 (<|im_end|>); Llama 3: {<|end_of_text|>, <|eot_id|>}

Built from tokenizer.json + tokenizer_config.json (HF folders, lowbit dirs) or from GGUF metadata
(tokenizer_gguf.py). Special tokens written in the text (e.g. <|im_start|>) are matched whole.
"""
from __future__ import annotations

import json
import pathlib
from datetime import datetime
from typing import Iterable

import tokenizers

# tokens that end a turn when the chat template writes them
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>", "<|endofturn|>")


def _token_str(v) -> str | None:
    """A special token as tokenizer_config.json spells it: "<s>" or {"content": "<s>", ...}."""
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def _ids(v) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]


class Tokenizer:
    """Text <-> token ids for one model.

    Attributes: backend (tokenizers.Tokenizer), bos_id (int | None), eos_ids (set[int]), add_bos (bool),
    eos_token_id (int | None: the model's own EOS token, which encode appends when add_eos), add_eos (bool),
    chat_template (str | None), vocab_size (int, added tokens included).
    """

    def __init__(self, backend: tokenizers.Tokenizer, bos_id: int | None = None, eos_ids: Iterable[int] = (),
                 add_bos: bool = False, chat_template: str | None = None, unk_id: int | None = None,
                 pad_id: int | None = None, add_eos: bool = False, eos_token_id: int | None = None):
        self.backend = backend
        self.bos_id = bos_id
        self.add_bos = bool(add_bos) and bos_id is not None
        self.chat_template = chat_template
        self.unk_id, self.pad_id = unk_id, pad_id
        self.eos_ids: set[int] = {int(i) for i in eos_ids}
        if eos_token_id is None and self.eos_ids:
            eos_token_id = min(self.eos_ids)
        self.eos_token_id = eos_token_id
        if eos_token_id is not None:
            self.eos_ids.add(int(eos_token_id))
        self.add_eos = bool(add_eos) and eos_token_id is not None
        for tok in END_OF_TURN:
            tid = backend.token_to_id(tok)
            if tid is not None and chat_template and tok in chat_template:
                self.eos_ids.add(tid)
        self._template = None
        self.source = None  # the file it was read from, for error messages

    def check(self) -> None:
        """Raises ValueError when the special-token ids or the chat template cannot be used."""
        n = self.vocab_size
        for what, ids in (("bos", [self.bos_id]), ("unk", [self.unk_id]), ("pad", [self.pad_id]), ("eos", self.eos_ids),
                          ("eos", [self.eos_token_id])):
            for i in ids:
                if i is not None and (not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n):
                    raise ValueError(f"{what} token id {i!r} is not an id of this {n}-token vocabulary")
        if self.chat_template is not None:
            if not isinstance(self.chat_template, str):
                raise ValueError(f"chat template must be a string, got {type(self.chat_template).__name__}")
            self._compiled_template()

    def _compiled_template(self):
        if self._template is None:
            try:
                self._template = compile_template(self.chat_template)
            except Exception as e:  # jinja2's TemplateSyntaxError and friends
                raise ValueError(f"{self.source or 'tokenizer'}: chat template does not compile ({type(e).__name__}: {e})") from None
        return self._template

    # --- ids ---
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int | None:
        """The primary EOS: the tokenizer's own eos_token (tokenizer_config.json, the GGUF's eos_token_id), else the
        smallest of eos_ids."""
        return self.eos_token_id

    def id_to_token(self, i: int | None) -> str | None:
        return None if i is None else self.backend.id_to_token(int(i))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_bos: bool | None = None, add_eos: bool | None = None) -> list[int]:
        """Token ids of text with the special tokens the model adds (transformers' add_special_tokens=True,
        llama.cpp's add_special): BOS first when add_bos, EOS (eos_token_id) last when add_eos, each by default
        the model's own setting; add_bos=False alone means the text's own tokens only (no EOS either), as
        for a rendered chat template."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        if add_eos is None:
            add_eos = self.add_eos and add_bos is not False
        if add_eos and self.eos_token_id is not None:
            ids = ids + [self.eos_token_id]
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    # --- chat ---
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """Renders messages ([{"role": ..., "content": ...}]) with the model's jinja2 template, as transformers does."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; format the prompt yourself (lowbit run)")
        template = self._compiled_template()
        ctx = {"bos_token": self.id_to_token(self.bos_id) or "", "eos_token": self.id_to_token(self.eos_token_id) or "",
               "unk_token": self.id_to_token(self.unk_id), "pad_token": self.id_to_token(self.pad_id),
               "tools": None, "documents": None, **kwargs}
        try:
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **ctx)
        except Exception as e:  # the template's own raise_exception, or a template broken at run time
            raise ValueError(f"{self.source or 'tokenizer'}: chat template failed ({type(e).__name__}: {e})") from None

    # --- files ---
    def save(self, directory) -> None:
        """Writes tokenizer.json and tokenizer_config.json (chat_template, bos/eos, add_bos/add_eos, eos ids).

        transformers 5 reads add_bos_token / add_eos_token from tokenizer.json's post-processor only (it drops
        the tokenizer_config keys when there is a tokenizer.json), so one that does not add what add_bos and
        add_eos say is replaced by one that does."""
        d = pathlib.Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._backend_with_specials().save(str(d / "tokenizer.json"))
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.id_to_token(self.bos_id), "eos_token": self.id_to_token(self.eos_token_id),
            "unk_token": self.id_to_token(self.unk_id), "pad_token": self.id_to_token(self.pad_id),
            "add_bos_token": self.add_bos, "add_eos_token": self.add_eos, "clean_up_tokenization_spaces": False,
            "chat_template": self.chat_template, "lowbit_eos_token_ids": sorted(self.eos_ids),
        }
        (d / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None},
                                                            indent=2, ensure_ascii=False))

    def _backend_with_specials(self) -> tokenizers.Tokenizer:
        """The backend, or a copy whose post-processor adds BOS / EOS as add_bos / add_eos say."""
        if _added_specials(self.backend, self.bos_id, self.eos_token_id) == (self.add_bos, self.add_eos):
            return self.backend
        from tokenizers import processors

        bos, eos = self.id_to_token(self.bos_id), self.id_to_token(self.eos_token_id)
        single = " ".join([f"{bos}:0"] * self.add_bos + ["$A:0"] + [f"{eos}:0"] * self.add_eos)
        pair = " ".join([single] + [f"{bos}:1"] * self.add_bos + ["$B:1"] + [f"{eos}:1"] * self.add_eos)
        specials = dict([(bos, self.bos_id)] * self.add_bos + [(eos, self.eos_token_id)] * self.add_eos)
        copy = tokenizers.Tokenizer.from_str(self.backend.to_str())
        copy.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                            special_tokens=list(specials.items()))
        return copy

    @classmethod
    def from_hf_dir(cls, path, config: dict | None = None) -> "Tokenizer":
        """From tokenizer.json (+ tokenizer_config.json, chat_template.jinja, generation_config.json)."""
        d = pathlib.Path(path)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise FileNotFoundError(f"{tj}: no tokenizer.json (lowbit needs the fast-tokenizer file)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tj))
        except Exception as e:
            raise ValueError(f"{tj}: cannot read tokenizer ({e})") from None
        try:
            tok = cls._from_parts(d, backend, config)
            tok.check()
        except ValueError as e:
            if str(d) in str(e):
                raise
            raise ValueError(f"{tj}: {e}") from None
        except (TypeError, KeyError, AttributeError, OverflowError) as e:
            raise ValueError(f"{d}: tokenizer files have a value of the wrong type ({type(e).__name__}: {e})") from None
        tok.source = tj
        return tok

    @classmethod
    def _from_parts(cls, d: pathlib.Path, backend, config: dict | None) -> "Tokenizer":
        tc = _read_json(d / "tokenizer_config.json")
        config = config if config is not None else _read_json(d / "config.json")
        gen = _read_json(d / "generation_config.json")

        def tid(key):
            s = _token_str(tc.get(key))
            return backend.token_to_id(s) if s is not None else None

        bos = tid("bos_token")
        if bos is None and config.get("bos_token_id") is not None:
            bos = _ids(config["bos_token_id"])[0]
        eos_token = tid("eos_token")
        if eos_token is None and _ids(config.get("eos_token_id")):
            eos_token = _ids(config["eos_token_id"])[0]
        eos = set(_ids(config.get("eos_token_id"))) | set(_ids(gen.get("eos_token_id")))
        eos |= set(_ids(tc.get("lowbit_eos_token_ids")))
        # tokenizer_config's add_bos_token / add_eos_token when set (transformers 4's Llama/Gemma tokenizers and
        # llama.cpp's converter read them), else what tokenizer.json's post-processor adds (all transformers 5 reads)
        by_post_processor = _added_specials(backend, bos, eos_token)
        add_bos, add_eos = tc.get("add_bos_token"), tc.get("add_eos_token")
        if not isinstance(add_bos, bool):
            add_bos = by_post_processor[0]
        if not isinstance(add_eos, bool):
            add_eos = by_post_processor[1]
        template = tc.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text()
        return cls(backend, bos_id=bos, eos_ids=eos, add_bos=add_bos, chat_template=template,
                   unk_id=tid("unk_token"), pad_id=tid("pad_token"), add_eos=add_eos, eos_token_id=eos_token)


def _added_specials(backend: tokenizers.Tokenizer, bos: int | None, eos: int | None) -> tuple[bool, bool]:
    """(prepends bos, appends eos): what the backend's post-processor adds when encoding with special tokens."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    return (bos is not None and full[:1] == [bos] and plain[:1] != [bos],
            eos is not None and full[-1:] == [eos] and plain[-1:] != [eos])


def _read_json(p: pathlib.Path) -> dict:
    if not p.is_file():
        return {}
    try:
        v = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{p}: malformed JSON ({type(e).__name__}: {e})") from None
    return v if isinstance(v, dict) else {}


def compile_template(source: str):
    """A jinja2 template with the globals Hugging Face chat templates expect (transformers' environment)."""
    import jinja2
    import jinja2.ext
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Generation(jinja2.ext.Extension):  # {% generation %}...{% endgeneration %} marks assistant text
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
