"""Runs an OpenVINO export behind lowbit's model interface (prefill / decode / logits / cache), so the
generation loop, sampling, streaming and chat code are the native backend's own.

    model = OpenVINOModel("smollm2-ov", device="CPU", precision="f32")
    logits = model.prefill(ids)     # float32 [vocab]; chunks of `prefill_chunk` tokens through static models
    logits = model.decode(tok)      # one token through the T = 1 models

Two pipelines of compiled chunks: T = 1 (decode) and T = prefill_chunk (prefill; the same IR reshaped).
Each keeps its K/V as OpenVINO state; when the other pipeline runs next, the states are copied over
(once per prompt, not per token). The position bookkeeping is a CacheIndex: truncating the cache (a
new prompt sharing a prefix with the last) only moves `length`: slots past it are masked and rewritten.
Compiled models are cached on disk (OpenVINO CACHE_DIR, OUT/cache by default).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np

from lowbit.model.config import ModelArgs
from lowbit.model.kv_cache import CacheIndex
from lowbit.model.layers import Rope, token_ids
from lowbit.openvino import require_openvino
from lowbit.openvino.export import read_manifest

DEFAULT_PREFILL_CHUNK = 32  # tokens per prefill call: the CPU's compressed FullyConnected costs ~linear in T
PRECISIONS = ("f32", "bf16", "f16")
SAME_WEIGHTS = {"bf16": "f16", "tq1": "ternary"}  # lowbit formats without an OpenVINO twin -> the nearest one


class _Pipeline:
    """The compiled chunks for T tokens per call, their requests, and the numpy buffers bound to them."""

    def __init__(self, core, models, kinds, device: str, config: dict, tokens: int, hidden: int, hd: int,
                 slots: int, vocab: int):
        import openvino as ov

        t = self.T = tokens
        self.token = np.zeros((1, t), np.int64)
        self.mask = np.zeros((1, 1, t, slots), np.float32)
        self.cos = np.zeros((1, t, 1, hd), np.float32)
        self.sin = np.zeros((1, t, 1, hd), np.float32)
        self.pos = np.zeros((t,), np.int64)
        self.logits = np.zeros((1, t, vocab), np.float32)
        shared = {"token": self.token, "mask": self.mask, "cos": self.cos, "sin": self.sin, "pos": self.pos}
        self.requests = []
        self._keep = []  # every buffer a request reads or writes (OpenVINO tensors share their memory)
        x = np.zeros((1, t, hidden), np.float32)  # the hidden state between chunks
        for model, kind in zip(models, kinds):
            compiled = core.compile_model(model, device, config)
            req = compiled.create_infer_request()
            for i, port in enumerate(compiled.inputs):
                name = port.get_any_name()
                buf = x if name == "x" else shared[name]
                req.set_input_tensor(i, ov.Tensor(buf, shared_memory=True))
            if kind == "head":
                out = self.logits
                self.head_in = x  # [1, T, hidden]: what the head reads
            else:
                out = x = np.zeros((1, t, hidden), np.float32)
                self._keep.append(x)
            req.set_output_tensor(0, ov.Tensor(out, shared_memory=True))
            self.requests.append(req)

    def run(self, head: bool = True) -> None:
        """Runs every chunk (without the head when head=False: the caller needs only some rows' logits)."""
        for req in self.requests if head else self.requests[:-1]:
            req.infer()


class OpenVINOModel:
    """An exported model on an OpenVINO device, with the interface generate/ perplexity use."""

    backend = "openvino"

    def __init__(self, path, device: str | None = None, precision: str | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, threads: int | None = None, cache_dir=None):
        ov = require_openvino()
        self.path = pathlib.Path(path)
        self.manifest = m = read_manifest(self.path)
        cfg = json.loads((self.path / "config.json").read_text())
        from lowbit.openvino.graph import check_graph_supports

        check_graph_supports(cfg, int(m["max_seq_len"]), self.path)  # an export made before lowbit refused it
        self.args = ModelArgs.from_config(cfg)
        from lowbit.io.tokenizer import Tokenizer

        self.tokenizer = Tokenizer.from_hf_dir(self.path, cfg)
        self.device = device or m.get("device", "CPU")
        core = ov.Core()
        have = list(core.available_devices)
        if not any(d == self.device or d.startswith(self.device + ".") or self.device.startswith(d + ".")
                   for d in have):
            raise RuntimeError(f"OpenVINO device {self.device!r} is not available here (available: {', '.join(have)})")
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.cache_dir = pathlib.Path(cache_dir) if cache_dir else self.path / "cache"
        if cache_dir is None and not os.access(self.path, os.W_OK):
            from lowbit.api import cache_root

            self.cache_dir = cache_root() / "openvino-compiled"
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        core.set_property({"CACHE_DIR": str(self.cache_dir)})
        config = {"PERFORMANCE_HINT": "LATENCY"}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        if threads and self.device == "CPU":
            config["INFERENCE_NUM_THREADS"] = int(threads)
        self.precision = precision
        self.max_context = int(m["max_seq_len"])
        self.slots = int(m["cache_slots"])
        self.cache = CacheIndex(self.max_context)
        a = self.args
        self.rope = Rope(a.head_dim, self.max_context, a.rope_theta, a.rope_scaling, a.rope_freq_factors)
        kinds = [c["kind"] for c in m["chunks"]]
        dims = dict(hidden=a.hidden_size, hd=a.head_dim, slots=self.slots, vocab=a.vocab_size)

        def read(tokens):
            models = [core.read_model(str(self.path / c["file"])) for c in m["chunks"]]
            if tokens != 1:
                for model in models:
                    model.reshape({p.get_any_name(): _shape_for(p.get_any_name(), tokens, dims) for p in model.inputs})
            return models

        self._decode = _Pipeline(core, read(1), kinds, self.device, config, 1, **dims)
        self.prefill_chunk = min(int(prefill_chunk), self.max_context)
        self._prefill = (self._decode if self.prefill_chunk == 1 else
                         _Pipeline(core, read(self.prefill_chunk), kinds, self.device, config, self.prefill_chunk, **dims))
        self._holder = self._decode  # the pipeline whose state holds the cache

    # ---- the model interface the generation loop uses ------------------------------------------
    def reset(self) -> None:
        """Empties the cache (the state keeps stale rows; they are masked and rewritten)."""
        self.cache.reset()

    def prefill(self, ids, all_logits: bool = False) -> np.ndarray:
        """ids: int [n] after the cached positions -> float32 logits [vocab] (last token) or [n, vocab]."""
        ids = token_ids(ids, self.args.vocab_size).tolist()  # OpenVINO's Gather reads -1 as the last row, zeros past the end
        n = len(ids)
        if n == 0:
            raise ValueError("prefill needs at least one token")
        self.cache.check_room(n)
        pipe = self._prefill if n > 1 else self._decode
        outs = []
        for s in range(0, n, pipe.T):
            rows = self._step(pipe, ids[s:s + pipe.T], all_rows=all_logits)
            if all_logits:
                outs.append(rows.copy())
        return np.concatenate(outs, axis=0) if all_logits else rows[-1].copy()

    def decode(self, token: int) -> np.ndarray:
        """One token at the next position -> float32 logits [vocab]."""
        token = int(token_ids([token], self.args.vocab_size)[0])
        self.cache.check_room(1)
        return self._step(self._decode, [token])[0].copy()

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits from an empty cache: int [n] -> float32 [n, vocab]."""
        self.reset()
        try:
            return self.prefill(ids, all_logits=True)
        finally:
            self.reset()

    # ---- internals -----------------------------------------------------------------------------
    def _step(self, pipe: _Pipeline, ids: list[int], all_rows: bool = True) -> np.ndarray:
        """Runs up to pipe.T tokens at the next positions -> logits rows [len(ids), vocab] (a view), or
        only the last row [1, vocab] when all_rows is False."""
        self._hold(pipe)
        n, c, scratch = len(ids), self.cache, self.slots - 1
        p = np.arange(c.length, c.length + n)
        pipe.token[0, :n] = ids
        pipe.token[0, n:] = 0
        pipe.pos[:n] = p
        pipe.pos[n:] = scratch  # padding rows write the scratch slot
        pipe.cos[0, :n, 0] = self.rope.C[p]
        pipe.sin[0, :n, 0] = self.rope.S[p]
        slot = np.arange(self.slots)
        pipe.mask[0, 0, :n] = np.where(slot[None, :] <= p[:, None], np.float32(0), np.float32(-np.inf))
        pipe.mask[0, 0, n:] = np.where(slot == scratch, np.float32(0), np.float32(-np.inf))
        if all_rows or pipe is self._decode:
            pipe.run()
            rows = pipe.logits[0, :n]
        else:  # only the last token's logits: the T = 1 head on that row (the heads are stateless)
            pipe.run(head=False)
            dec = self._decode
            dec.head_in[0, 0] = pipe.head_in[0, n - 1]
            dec.requests[-1].infer()
            rows = dec.logits[0, :1]
        c.length += n
        c.tokens.extend(ids)
        return rows

    def _hold(self, pipe: _Pipeline) -> None:
        """Makes `pipe`'s states hold the cache (copies them from the other pipeline when it ran last)."""
        if pipe is self._holder:
            return
        for src, dst in zip(self._holder.requests, pipe.requests):
            states = {s.name: s for s in src.query_state()}
            for s in dst.query_state():
                s.state = states[s.name].state
        self._holder = pipe

    @property
    def n_params(self) -> int:
        from lowbit.model.dummy import weight_shapes

        return int(sum(np.prod(s) for s in weight_shapes(self.args).values()))

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<OpenVINOModel {self.path} on {self.device}: {m['weights']} weights, {len(m['chunks'])} chunks, "
                f"max_seq_len {self.max_context}, prefill chunk {self.prefill_chunk}>")


def _shape_for(name: str, t: int, d: dict) -> list[int]:
    """The static input shapes for T tokens per call."""
    return {"token": [1, t], "x": [1, t, d["hidden"]], "mask": [1, 1, t, d["slots"]], "cos": [1, t, 1, d["hd"]],
            "sin": [1, t, 1, d["hd"]], "pos": [t]}[name]


def open_openvino(src, weights: str = "int4", group_size: int | None = None, max_context: int | None = None,
                  device: str | None = None, precision: str | None = None, threads: int | None = None,
                  chunk_layers: int | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                  progress: bool = True) -> OpenVINOModel:
    """An OpenVINOModel for an export directory, or for any lowbit source (GGUF, HF folder, lowbit dir),
    exported once into the lowbit cache (keyed like lowbit.load's conversions) and loaded from there.

    max_context: the static cache length of a new export (default: the model's context, at most 1024);
    for an existing export it must not exceed the export's max_seq_len.
    """
    from lowbit.api import cache_dir_for
    from lowbit.io.checkpoint import open_checkpoint
    from lowbit.openvino.export import DEFAULT_CHUNK_LAYERS, DEFAULT_MAX_SEQ_LEN, export, is_openvino_dir

    p = pathlib.Path(src).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    weights = SAME_WEIGHTS.get(weights, weights)
    kw = dict(device=device, precision=precision, threads=threads, prefill_chunk=prefill_chunk)
    if is_openvino_dir(p):
        have = read_manifest(p)["max_seq_len"]
        if max_context and max_context > have:
            raise ValueError(f"{p} was exported for at most {have} tokens (asked for {max_context}); "
                             "export it again with a larger --max-seq-len")
        return OpenVINOModel(p, **kw)
    cfg = open_checkpoint(p).config
    max_seq = int(max_context or min(cfg["max_position_embeddings"], DEFAULT_MAX_SEQ_LEN))
    layers = int(chunk_layers or DEFAULT_CHUNK_LAYERS)
    out = cache_dir_for(p, format=f"openvino-{weights}", group_size=group_size, max_seq_len=max_seq,
                        chunk_layers=layers)
    if not is_openvino_dir(out):
        if out.exists():  # ours (inside the cache) but not a whole export: rebuilt below
            shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        export(p, out, weights=weights, group_size=group_size, max_seq_len=max_seq, chunk_layers=layers,
               device=device or "CPU", overwrite=True, progress=progress)
    return OpenVINOModel(out, **kw)
