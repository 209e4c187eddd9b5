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
import shutil
import time
from dataclasses import dataclass

import numpy as np

from lowbit._runtime import set_threads
from lowbit.generate import Generation, GenerationStats, SamplingParams
from lowbit.memory import peak_rss_gb, reset_peak_rss, rss_gb
from lowbit.model import Model
from lowbit.model.kv_cache import kv_dtype

# bump when converted directories change meaning (2: int4 groups of 32, 3: int8 blocks of 32, 4: GGUF Q4_0 / Q4_1
# keep their codes and scales in int4)
CACHE_VERSION = 4


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
    """The convert() options for a format: float formats keep lm_head and embeddings in that format.
    A parameterized name ("codebook-m2v8b8g128") becomes the format plus its format_options."""
    from lowbit.formats import parse_format

    from lowbit.io.convert import LM_HEAD_FORMAT

    format, options = parse_format(format)
    if format in ("f32", "bf16"):
        lm_head_format = lm_head_format or format
        embed_format = embed_format or format
    settings = dict(format=format, group_size=group_size, lm_head_format=lm_head_format or LM_HEAD_FORMAT,
                    embed_format=embed_format or "bf16")
    if options:
        settings["format_options"] = options
    return settings


def cache_dir_for(src, **settings) -> pathlib.Path:
    """The cache directory a source converts into under the given conversion settings."""
    p = pathlib.Path(src).expanduser().resolve()
    key = json.dumps([CACHE_VERSION, str(p), _fingerprint(p), sorted(settings.items())], default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    name = p.stem if p.is_file() else p.name
    g = settings.get("group_size")
    opts = "".join(f"{k}{v}" for k, v in (settings.get("format_options") or {}).items())
    return cache_root() / f"{name}-{settings['format']}{opts}{f'-g{g}' if g else ''}-{digest}"


@dataclass
class LoadStats:
    """What lowbit.load spent, apart from generation (llama.cpp's load time)."""

    load_time: float = 0.0  # s: open, fault the weights in, build the model, one warm-up token
    convert_time: float = 0.0  # s: a first-run conversion into the cache (0 when it was cached)
    convert_peak_gb: float = 0.0  # the process's peak RSS while converting
    rss_after_load_gb: float = 0.0  # resident memory once loaded (weights mapped in)

    def __str__(self) -> str:
        conv = (f" | first-run conversion: {self.convert_time:.2f} s, peak RSS {self.convert_peak_gb:.2f} GB"
                if self.convert_time else "")
        return f"load:       {self.load_time * 1e3:8.1f} ms (weights faulted in, one warm-up token){conv}"


def resolve_model_dir(src, format: str = "int4", group_size: int | None = None, lm_head_format: str | None = None,
                      embed_format: str | None = None, progress: bool = True,
                      stats: LoadStats | None = None) -> pathlib.Path:
    """A loadable lowbit model directory for `src`: itself if it is one, else its cached conversion
    (timed into stats.convert_time / convert_peak_gb when it had to be made)."""
    from lowbit.io.modeldir import is_lowbit_dir

    p = pathlib.Path(src).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    if p.is_dir() and is_lowbit_dir(p):
        return p
    settings = conversion_settings(format, group_size, lm_head_format, embed_format)
    out = cache_dir_for(p, **settings)
    if out.exists() and not cache_entry_loads(out):
        shutil.rmtree(out, ignore_errors=True)  # ours (inside the cache): rebuilt below, never trusted
    if not (out.is_dir() and is_lowbit_dir(out)):
        from lowbit.io.convert import convert

        out.parent.mkdir(parents=True, exist_ok=True)
        tic = time.perf_counter()
        convert(p, out, overwrite=True, progress=progress, **settings)
        if stats is not None:
            stats.convert_time = time.perf_counter() - tic
            stats.convert_peak_gb = peak_rss_gb()
            reset_peak_rss()  # generation's peak is reported apart from the conversion's
    return out


def cache_entry_loads(out: pathlib.Path) -> bool:
    """True when the cached conversion at out opens (metadata, shard headers and sizes, every tensor rebuilt);
    else warns that it is rebuilt."""
    import warnings

    from lowbit.io.modeldir import LowbitCheckpoint

    try:
        ck = LowbitCheckpoint(out)
        for name in ck.tensor_names():
            ck.load(name)
        return True
    except (ValueError, OSError, KeyError) as e:
        warnings.warn(f"cache entry {out} fails to load ({e}); rebuilding it", UserWarning, stacklevel=3)
        return False


def model_from_checkpoint(ck, max_context: int | None = None, format: str | None = None,
                          kv_cache: str | None = None) -> Model:
    """Builds the Model of an open checkpoint (weights as the reader gives them; `format` quantizes floats)."""
    weights = {name: ck.load(name) for name in ck.tensor_names()}
    config = dict(ck.config)
    if (getattr(ck, "lowbit", None) or {}).get("tied_embeddings"):
        config["tie_word_embeddings"] = True  # the converted dir stores lm_head separately; count it once
    return Model.from_weights(config, weights, tokenizer=ck.tokenizer(), max_context=max_context, format=format,
                              kv_cache=kv_cache)


class LLM:
    """A loaded model with its tokenizer; generation methods mirror the CLI."""

    def __init__(self, model: Model, tokenizer, path: pathlib.Path | None = None, source=None):
        self.model = model
        self.tokenizer = tokenizer
        self.path = path  # the lowbit model directory (None for in-memory models)
        self.source = source  # what the user passed to load()
        self.last_stats: GenerationStats | None = None
        self.load_stats = LoadStats()

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

    def generate(self, prompt, max_tokens: int = 256, max_batch: int | None = None, **kw):
        """The continuation of `prompt` as one string (keywords as stream).

        A list of prompts (each a str or a list of token ids) gives a list of strings, decoded together
        (continuous batching over a multi-slot KV cache, at most max_batch at once, default up to 16);
        greedy outputs equal the one-at-a-time ones. last_stats is then a list, one per prompt.
        """
        if _is_batch(prompt):
            return self.generate_batch(prompt, max_tokens=max_tokens, max_batch=max_batch, **kw)
        return "".join(self.stream(prompt, max_tokens=max_tokens, **kw))

    def generate_batch(self, prompts, max_tokens: int = 256, max_batch: int | None = None, temperature: float = 0.0,
                       top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                       seed: int | None = None, stop=None, add_bos: bool | None = None) -> list[str]:
        """generate() of several prompts at once -> their continuations, in order."""
        from lowbit.generate.batch import generate_batch

        prompts = list(prompts)
        if max_batch is not None and max_batch < 1:  # 0 silently meant the default
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not prompts:
            return []
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repetition_penalty=repetition_penalty, seed=seed)
        seqs = generate_batch(self.model, self.tokenizer, prompts, max_tokens=max_tokens, stop=stop, params=params,
                              add_bos=add_bos, engine=self.batch_engine(max_batch or min(len(prompts), 16)))
        for s in seqs:
            if s.finish_reason == "error":
                raise RuntimeError(f"batched generation failed: {s.error}")
        self.last_stats = [s.stats for s in seqs]
        return [s.text for s in seqs]

    def batch_engine(self, max_batch: int):
        """The continuous-batching engine with max_batch slots (kept, so slots re-use cached prefixes)."""
        from lowbit.generate.batch import BatchEngine

        eng = getattr(self, "_engine", None)
        if eng is None or eng.max_batch != max_batch:
            eng = self._engine = BatchEngine(self.model, self.tokenizer, max_batch=max_batch)
        return eng

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


def _is_batch(prompt) -> bool:
    """A list of prompts (str or id lists), as opposed to one prompt given as a list of token ids."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(
        isinstance(p, (str, list, tuple, np.ndarray)) for p in prompt)


def load(path, format: str = "int4", threads: int | None = None, group_size: int | None = None,
         max_context: int | None = None, lm_head_format: str | None = None, embed_format: str | None = None,
         progress: bool = True, warmup: bool = True, backend: str = "native", device: str | None = None,
         precision: str | None = None, kv_cache: str | None = None) -> LLM:
    """Loads a lowbit model directory, or converts an HF folder / GGUF file once (cached) and loads that.

    format, group_size, lm_head_format, embed_format: the conversion settings (ignored for a lowbit dir).
    threads: kernel threads (default: physical cores or $LOWBIT_THREADS).
    max_context: KV cache length (default: max_position_embeddings, capped at 8192).
    kv_cache: what the KV cache holds: "f16" (the default for quantized models), "int8" (each row's values and
        one float32 scale: half the bytes attention reads, for long contexts and batched serving) or "f32".
    warmup: fault every weight page in and run one token through the model now, so the first prompt's
        speed is the model's, not the page faults' (the time is in .load_stats.load_time).
    backend: "native" (lowbit's kernels) or "openvino" (path: an `lowbit export-openvino` folder, or any
      source, exported once into the cache with `format` as the weight type: f32, f16, int8, int4, int2,
      ternary, binary); device: OpenVINO device (CPU, GPU, NPU; default: the export's);
      precision: OpenVINO inference precision hint (f32, bf16, f16; default: the device's own).
    """
    from lowbit.io.checkpoint import open_checkpoint

    if backend == "openvino":
        from lowbit.openvino.backend import open_openvino

        if kv_cache is not None:
            raise ValueError("kv_cache applies to backend='native' only (an OpenVINO export keeps its own state)")

        model = open_openvino(path, weights=format, group_size=group_size, max_context=max_context, device=device,
                              precision=precision, threads=threads, progress=progress)
        return LLM(model, model.tokenizer, path=model.path, source=path)
    if backend != "native":
        raise ValueError(f"unknown backend {backend!r}; choose native or openvino")
    if device not in (None, "CPU") or precision is not None:
        raise ValueError("device and precision apply to backend='openvino' only")
    if kv_cache is not None:
        kv_dtype(kv_cache)  # an unknown name fails before any conversion
    if threads is not None:
        set_threads(threads)
    stats = LoadStats()
    model_dir = resolve_model_dir(path, format=format, group_size=group_size, lm_head_format=lm_head_format,
                                  embed_format=embed_format, progress=progress, stats=stats)
    tic = time.perf_counter()
    ck = open_checkpoint(model_dir)
    model = model_from_checkpoint(ck, max_context=max_context, kv_cache=kv_cache)
    if warmup:
        if hasattr(ck, "prefault"):
            ck.prefault()
        warm_up(model)
    stats.load_time = time.perf_counter() - tic
    stats.rss_after_load_gb = rss_gb()
    llm = LLM(model, model.tokenizer, path=model_dir, source=path)
    llm.load_stats = stats
    return llm


def warm_up(model: Model) -> None:
    """One prefill token and one decode step (builds the native decoder, touches the KV cache and the
    thread pool), then an empty cache."""
    tok = model.args.bos_token_id
    tok = tok if isinstance(tok, int) and 0 <= tok < model.args.vocab_size else 0
    model.reset()
    logits = model.prefill([tok])
    if model.cache.max_ctx >= 2:
        model.decode(int(np.argmax(logits)))
    model.reset()


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
