"""The Python API: load a model, generate, stream, chat, score.

    import lowbit
    llm = lowbit.load("SmolLM2-135M-Instruct.Q4_1.gguf", format="int4")   # or an HF folder / lowbit dir
    print(llm.generate("The capital of France is", max_tokens=16))
    for piece in llm.stream("Once upon a time", max_tokens=64, temperature=0.7, seed=0):
        print(piece, end="", flush=True)
    print(llm.last_stats)                       # prompt / generation tokens/s, peak memory
    llm.chat([{"role": "user", "content": "Hi!"}], max_tokens=64)
    llm.logits(llm.tokenizer.encode("text"))    # float32 [n, vocab], teacher-forced

Sources that are not lowbit model directories (GGUF files, HF folders) are converted once into
~/.cache/lowbit/<name>-<format>-<key> ($LOWBIT_CACHE overrides the root) and loaded from there; the key
covers the source's absolute path, size and mtime and the conversion settings.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib

import numpy as np

from lowbit._runtime import set_threads
from lowbit.generate import Generation, GenerationStats, SamplingParams
from lowbit.model import Model

CACHE_VERSION = 2  # bump when converted directories change meaning (2: int4 groups of 32 by default)


def cache_root() -> pathlib.Path:
    """Where converted models are kept: $LOWBIT_CACHE or ~/.cache/lowbit."""
    return pathlib.Path(os.environ.get("LOWBIT_CACHE") or pathlib.Path.home() / ".cache" / "lowbit").expanduser()


def _fingerprint(p: pathlib.Path) -> list:
    """(size, mtime_ns) of a file, or of every file in a folder (names sorted)."""
    if p.is_file():
        st = p.stat()
        return [st.st_size, st.st_mtime_ns]
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(p.iterdir()) if f.is_file()]


def conversion_settings(format: str, group_size: int | None = None, lm_head_format: str | None = None,
                        embed_format: str | None = None) -> dict:
    """The convert() options for a format: float formats keep lm_head and embeddings in that format."""
    if format in ("f32", "bf16"):
        lm_head_format = lm_head_format or format
        embed_format = embed_format or format
    return dict(format=format, group_size=group_size, lm_head_format=lm_head_format or "int8",
                embed_format=embed_format or "bf16")


def cache_dir_for(src, **settings) -> pathlib.Path:
    """The cache directory a source converts into under the given conversion settings."""
    p = pathlib.Path(src).expanduser().resolve()
    key = json.dumps([CACHE_VERSION, str(p), _fingerprint(p), sorted(settings.items())], default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    name = p.stem if p.is_file() else p.name
    g = settings.get("group_size")
    return cache_root() / f"{name}-{settings['format']}{f'-g{g}' if g else ''}-{digest}"


def resolve_model_dir(src, format: str = "int4", group_size: int | None = None, lm_head_format: str | None = None,
                      embed_format: str | None = None, progress: bool = True) -> pathlib.Path:
    """A loadable lowbit model directory for `src`: itself if it is one, else its cached conversion."""
    from lowbit.io.modeldir import is_lowbit_dir

    p = pathlib.Path(src).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    if p.is_dir() and is_lowbit_dir(p):
        return p
    settings = conversion_settings(format, group_size, lm_head_format, embed_format)
    out = cache_dir_for(p, **settings)
    if not (out.is_dir() and is_lowbit_dir(out)):
        from lowbit.io.convert import convert

        out.parent.mkdir(parents=True, exist_ok=True)
        convert(p, out, overwrite=True, progress=progress, **settings)
    return out


def model_from_checkpoint(ck, max_context: int | None = None, format: str | None = None) -> Model:
    """Builds the Model of an open checkpoint (weights as the reader gives them; `format` quantizes floats)."""
    weights = {name: ck.load(name) for name in ck.tensor_names()}
    config = dict(ck.config)
    if (getattr(ck, "lowbit", None) or {}).get("tied_embeddings"):
        config["tie_word_embeddings"] = True  # the converted dir stores lm_head separately; count it once
    return Model.from_weights(config, weights, tokenizer=ck.tokenizer(), max_context=max_context, format=format)


class LLM:
    """A loaded model with its tokenizer; generation methods mirror the CLI."""

    def __init__(self, model: Model, tokenizer, path: pathlib.Path | None = None, source=None):
        self.model = model
        self.tokenizer = tokenizer
        self.path = path  # the lowbit model directory (None for in-memory models)
        self.source = source  # what the user passed to load()
        self.last_stats: GenerationStats | None = None

    @property
    def config(self) -> dict:
        return self.model.args.extra

    def stream(self, prompt, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               min_p: float = 0.0, repetition_penalty: float = 1.0, seed: int | None = None, stop=None,
               add_bos: bool | None = None) -> Generation:
        """Text pieces continuing `prompt` (str or token ids); .stats after iteration (also in last_stats)."""
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repetition_penalty=repetition_penalty, seed=seed)
        gen = Generation(self.model, self.tokenizer, prompt, max_tokens=max_tokens, stop=stop, params=params,
                         add_bos=add_bos)
        self.last_stats = gen.stats
        return gen

    def generate(self, prompt, max_tokens: int = 256, **kw) -> str:
        """The continuation of `prompt` as one string (keywords as stream)."""
        return "".join(self.stream(prompt, max_tokens=max_tokens, **kw))

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """Token ids of the conversation under the model's chat template, ready for the assistant's turn."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_bos=False))

    def stream_chat(self, messages: list[dict], max_tokens: int = 256, **kw) -> Generation:
        """Streams the assistant's reply to `messages` ([{"role": ..., "content": ...}, ...])."""
        return self.stream(self.chat_prompt(messages), max_tokens=max_tokens, **kw)

    def chat(self, messages: list[dict], max_tokens: int = 256, **kw) -> str:
        """The assistant's reply to `messages` as one string."""
        return "".join(self.stream_chat(messages, max_tokens=max_tokens, **kw))

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits: int [n] -> float32 [n, vocab] (the cache is emptied)."""
        return self.model.logits(ids)

    def __repr__(self) -> str:
        a = self.model.args
        return (f"<LLM {a.model_type} {a.num_hidden_layers}L d={a.hidden_size} "
                f"{self.model.n_params / 1e6:.0f}M params from {self.path or 'memory'}>")


def load(path, format: str = "int4", threads: int | None = None, group_size: int | None = None,
         max_context: int | None = None, lm_head_format: str | None = None, embed_format: str | None = None,
         progress: bool = True, backend: str = "native", device: str | None = None,
         precision: str | None = None) -> LLM:
    """Loads a lowbit model directory, or converts an HF folder / GGUF file once (cached) and loads that.

    format, group_size, lm_head_format, embed_format: the conversion settings (ignored for a lowbit dir).
    threads: kernel threads (default: physical cores or $LOWBIT_THREADS).
    max_context: KV cache length (default: max_position_embeddings, capped at 8192).
    backend: "native" (lowbit's kernels) or "openvino" (path: an `lowbit export-openvino` folder, or any
      source, exported once into the cache with `format` as the weight type: f32, f16, int8, int4, int2,
      ternary, binary); device: OpenVINO device (CPU, GPU, NPU; default: the export's);
      precision: OpenVINO inference precision hint (f32, bf16, f16; default: the device's own).
    """
    from lowbit.io.checkpoint import open_checkpoint

    if backend == "openvino":
        from lowbit.openvino.backend import open_openvino

        model = open_openvino(path, weights=format, group_size=group_size, max_context=max_context, device=device,
                              precision=precision, threads=threads, progress=progress)
        return LLM(model, model.tokenizer, path=model.path, source=path)
    if backend != "native":
        raise ValueError(f"unknown backend {backend!r}; choose native or openvino")
    if device not in (None, "CPU") or precision is not None:
        raise ValueError("device and precision apply to backend='openvino' only")
    if threads is not None:
        set_threads(threads)
    model_dir = resolve_model_dir(path, format=format, group_size=group_size, lm_head_format=lm_head_format,
                                  embed_format=embed_format, progress=progress)
    ck = open_checkpoint(model_dir)
    model = model_from_checkpoint(ck, max_context=max_context)
    return LLM(model, model.tokenizer, path=model_dir, source=path)


HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]


def from_pretrained(repo_id: str, format: str = "int4", revision: str | None = None, filename: str | None = None,
                    **load_kw) -> LLM:
    """Downloads a Hugging Face Hub repo (safetensors + config + tokenizer, or one GGUF `filename`) and loads it."""
    import huggingface_hub

    if filename:
        path = huggingface_hub.hf_hub_download(repo_id, filename, revision=revision)
    else:
        path = huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS)
    return load(path, format=format, **load_kw)
