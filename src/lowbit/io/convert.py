"""Checkpoint -> lowbit model directory, one tensor at a time.

    convert("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-int4", format="int4")
    convert("bitnet-b1.58-2B-4T", "bitnet-ternary", format="ternary")   # packed ternary stays lossless

What goes where:
    decoder-layer projections (q/k/v/o, gate/up/down)   -> `format` (group_size if given)
    lm_head (or, when tied, a copy of the embedding)    -> `lm_head_format`
    model.embed_tokens                                  -> `embed_format` (bf16: the runtime gathers rows)
    norms                                               -> float32
Streaming, with a memory bound: float matrices are read as stored (f16/bf16/f32 views of the mmapped source,
SourceRows) and quantized natively row block by row block, each packed tensor goes straight to the shard
file on disk (ModelDirWriter keeps nothing), the bf16 embedding is converted in row chunks. Peak memory
stays within about the largest tensor in float32 (a source that must be dequantized: GGUF Q4_K...) plus
its packed output, whatever the model's size (`lowbit bench convert` measures it).
"""
from __future__ import annotations

import pathlib
import warnings

import numpy as np

from lowbit.formats import FORMATS, PackedWeight, parse_format, quantize
from lowbit.formats.base import SourceRows
from lowbit.formats.floats import BF16Weight, f32_to_bf16_bits
from lowbit.formats.intcodes import GROUP_ALIGN
from lowbit.formats.ternary import METHODS, TernaryWeight, is_ternary_valued
from lowbit.io.checkpoint import EMBED, LM_HEAD, expected_shape, is_linear, open_checkpoint
from lowbit.io.modeldir import SHARD_BYTES, ModelDirWriter

LOW_BIT = ("ternary", "tq1", "binary", "rsr")
NATIVE_FROM_SOURCE = ("int8", "int6", "int4", "int2", "ternary", "tq1", "binary")  # quantize() reads SourceRows
# The lm_head (and a tied embedding's lm_head copy) default: the smallest format within 1 % of bf16's perplexity
# on SmolLM2-135M (docs/lm_head.md: int6 +0.38 %, int4 +6.8 %); a decode step reads all of it per token.
LM_HEAD_FORMAT = "int6"
COLLAPSE_WARNING = ("converting float weights to {fmt}: expect the model's quality to collapse unless it was "
                    "trained for it (BitNet b1.58 / ParetoQ-style quantization-aware training)")


def pack(value: np.ndarray | PackedWeight, fmt: str, group_size: int | None = None,
         ternary_method: str = "absmean", options: dict | None = None, release=None) -> PackedWeight:
    """value (float32 [M, K] or a PackedWeight) -> PackedWeight in fmt.

    A packed value already in fmt is kept as is (lossless: BitNet / TQ ternary stays ternary);
    otherwise it is dequantized and quantized again (ternary-valued floats keep their scale exactly;
    a ternary source that the target cannot hold exactly, e.g. TQ2_0's per-256 scales in tq1, warns).
    """
    if isinstance(value, SourceRows):  # a float matrix as stored (f32/f16/bf16 view of the source file)
        if fmt == "bf16":
            return BF16Weight(bf16_from_source(value, release=release))
        elif fmt not in NATIVE_FROM_SOURCE:
            value = value.float32()
    source_ternary = isinstance(value, TernaryWeight)
    if isinstance(value, PackedWeight):
        if isinstance(value, TernaryWeight) and fmt == "tq1" and group_size is None and value.ngroups == 1:
            from lowbit.formats.tq1 import TQ1Weight  # ternary with one scale per row: repack losslessly

            a, _ = value.affine()
            return TQ1Weight.from_ternary(value.unpacked_codes().astype(np.int8) - 1, a)
        if isinstance(value, TernaryWeight) and fmt == "rsr" and value.ngroups == 1:
            from lowbit.formats.rsr import RSRWeight  # ternary with one scale per row: index losslessly

            return RSRWeight.from_ternary_weight(value)
        if value.format == fmt and not options and (group_size is None or fmt == "ternary" or getattr(value, "group", None) == group_size):
            return value
        value = value.dequantize()
    extra_options = options
    options = {} if group_size is None or fmt in ("f32", "bf16") else {"group_size": group_size}
    if fmt in ("ternary", "tq1", "rsr"):
        options["method"] = ternary_method
    options.update(extra_options or {})
    packed = quantize(value, fmt, **options)
    if source_ternary and fmt in ("ternary", "tq1", "rsr") and not np.array_equal(packed.dequantize(), value):
        warnings.warn(f"a ternary weight {list(value.shape)} could not be stored exactly in {fmt} "
                      f"(group_size={group_size}); it was re-ternarized with {ternary_method}", UserWarning, stacklevel=3)
    return packed


def bf16_from_source(src: SourceRows, chunk_rows: int = 4096, release=None) -> np.ndarray:
    """uint16 bf16 bits [M, K] of src, converted in row chunks (never the whole matrix in float32); release():
    drops the source's mapped pages read so far, after each chunk (RSS holds the output, not the source too)."""
    if src.kind == "bf16" and src.rows is None:
        return src.data  # already bf16: the file's own bits
    out = np.empty(src.shape, np.uint16)
    for start in range(0, src.shape[0], chunk_rows):
        out[start:start + chunk_rows] = f32_to_bf16_bits(src.float32(start, start + chunk_rows))
        if release is not None:
            release()
    return out


def looks_ternary(value) -> bool:
    """is_ternary_valued on a float matrix; for a SourceRows, on its first rows (only the warning uses it)."""
    if isinstance(value, SourceRows):
        return is_ternary_valued(value.float32(0, 256))
    return isinstance(value, np.ndarray) and is_ternary_valued(value)


def n_weights(config: dict, name: str) -> int:
    try:
        return int(np.prod(expected_shape(config, name)))
    except KeyError:
        return 0


def _check_format(name: str, fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown {name} {fmt!r}; choose one of {', '.join(FORMATS)}")


def calibration_text(files) -> str:
    """The calibration files' texts, one after the other (a blank line between); FileNotFoundError naming a
    missing one."""
    if not files:
        raise ValueError("calibration needs at least one text file")
    texts = []
    for f in files:
        path = pathlib.Path(f)
        if not path.is_file():
            raise FileNotFoundError(f"calibration text not found: {path}")
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n\n".join(texts)


def convert(src, out, format: str = "int4", group_size: int | None = None, lm_head_format: str = LM_HEAD_FORMAT,
            embed_format: str = "bf16", overwrite: bool = False, progress: bool = True,
            shard_bytes: int = SHARD_BYTES, ternary_method: str = "absmean",
            format_options: dict | None = None, calibration=None, calibration_tokens: int = 4096,
            error_feedback: bool = False, damp: float = 0.01, finetune_steps: int = 0,
            finetune_options: dict | None = None) -> pathlib.Path:
    """Converts a checkpoint (HF folder, .gguf, or lowbit dir) into a lowbit model directory at out.

    Args:
        src: path of the source checkpoint.
        out: the directory to create (refused if it exists, unless overwrite).
        format: weight format of the decoder layers' projections (f32, bf16, int8, int4, int2, ternary, binary).
        group_size: input channels per scale (a multiple of 32) for those; None = the format's default.
        lm_head_format: format of the output projection (default LM_HEAD_FORMAT; tied embeddings get their own copy
            in it, the embedding itself stays in embed_format).
        embed_format: format of the embedding table.
        overwrite: replace an existing lowbit directory at out.
        progress: show a tqdm bar.
        ternary_method: scale of a float weight ternarized to ternary/tq1: "absmean" (BitNet b1.58's) or
            "mse" (the error-minimizing one, for post-training ternarization). Weights that are already
            ternary-valued keep their own scale either way.
        format_options: extra quantize() options of `format` (codebook: m, v, b, g, seed, iters); a
            parameterized name such as "codebook-m2v8b8g128" sets them too.
        calibration: a text file, or a list of them (read one after the other); codebook weights then minimize the
            error weighted by each input channel's mean x^2 on its first `calibration_tokens` tokens, run through the
            source model in float32.
        error_feedback: codebook with calibration: GPTQ-style error feedback with each linear's full input
            Hessian, collected layer by layer from the model quantized so far (io.codebook_tune; torch;
            Llama family). damp: the Hessian's dampening (fraction of its mean diagonal).
        finetune_steps: codebook with calibration: then this many steps of knowledge-distillation fine-tuning of
            the codebooks, scales and norms (codes frozen) on the calibration tokens; finetune_options: seq,
            batch, lr, seed of io.codebook_tune.finetune.
    Returns:
        the path of the new directory.
    """
    format, spec = parse_format(format) if format.startswith("codebook-") else (format, {})
    format_options = {**spec, **(format_options or {})}
    _check_format("format", format)
    _check_format("lm_head_format", lm_head_format)
    _check_format("embed_format", embed_format)
    if group_size is not None and (group_size <= 0 or group_size % GROUP_ALIGN):
        raise ValueError(f"group size must be a positive multiple of {GROUP_ALIGN}, got {group_size}")
    if ternary_method not in METHODS:
        raise ValueError(f"unknown ternary_method {ternary_method!r}; choose one of {', '.join(METHODS)}")
    if format == "codebook":  # before any work: a bad m, v, b or g failed after the first tensors
        from lowbit.formats.codebook import DEFAULTS, check_params

        o = {k: DEFAULTS[k] if format_options.get(k) is None else format_options[k] for k in "mvb"}
        g = format_options.get("g")
        check_params(int(o["m"]), int(o["v"]), int(o["b"]), int(g if g is not None else group_size or DEFAULTS["g"]))
    ckpt = open_checkpoint(src)
    tokenizer = ckpt.tokenizer()
    names = ckpt.tensor_names()
    config = dict(ckpt.config)
    tied = LM_HEAD not in names
    importance, done, tune_log = {}, {}, {}
    if (error_feedback or finetune_steps) and calibration is None:
        raise ValueError("error feedback and fine-tuning need a calibration text (calibration=...)")
    if calibration is not None:
        if format != "codebook":
            raise ValueError(f"calibration applies to the codebook format, not {format!r}")
        files = [calibration] if isinstance(calibration, (str, pathlib.Path)) else list(calibration)
        text = calibration_text(files)
        if error_feedback or finetune_steps:
            try:
                from lowbit.io.codebook_tune import tune_model
            except ImportError as e:
                raise RuntimeError(f"codebook error feedback and fine-tuning need torch and scipy ({e}): "
                                   "pip install 'lowbit[tune]', or pass --no-error-feedback --finetune-steps 0") from e

            done = tune_model(ckpt, text, calibration_tokens, format_options, error_feedback, damp, finetune_steps,
                              finetune_options or {}, lm_head_format, progress, log=tune_log)
        else:
            from lowbit.io.calibrate import activation_stats

            importance = activation_stats(ckpt, text, tokens=calibration_tokens)
    warned = False
    from tqdm.auto import tqdm

    with ModelDirWriter(out, overwrite=overwrite, shard_bytes=shard_bytes) as writer:
        # progress in weights (unit_scale: "M weight/s" is the conversion rate)
        total = sum(n_weights(config, n) for n in names) + (n_weights(config, EMBED) if tied else 0)
        bar = tqdm(total=total, desc=f"lowbit convert -> {format}", unit="weight", unit_scale=True, disable=not progress)
        for name in names:
            bar.set_postfix_str(name, refresh=False)
            value = ckpt.load_source(name) if name == EMBED or name == LM_HEAD or is_linear(name) else ckpt.load(name)
            if name in done:  # quantized (and fine-tuned) with the whole model: io.codebook_tune
                writer.add(name, done[name])
            elif is_linear(name):
                if (format in LOW_BIT and not warned and not isinstance(value, TernaryWeight)
                        and not looks_ternary(value)):
                    warnings.warn(COLLAPSE_WARNING.format(fmt=format), UserWarning, stacklevel=2)
                    warned = True
                opts = {**format_options, "importance": importance[name]} if name in importance else format_options
                writer.add(name, pack(value, format, group_size, ternary_method, opts))
            elif name == LM_HEAD:
                writer.add(name, pack(value, lm_head_format))
            elif name == EMBED:
                writer.add(name, pack(value, embed_format, release=ckpt.release))
                if tied:
                    writer.add(LM_HEAD, pack(value, lm_head_format))
                    bar.update(n_weights(config, EMBED))
            else:
                dense = value.dequantize() if isinstance(value, PackedWeight) else value
                writer.add(name, np.asarray(dense, np.float32))
            del value
            ckpt.release()  # the source's pages read so far leave the process (the file is read once)
            bar.update(n_weights(config, name))
        bar.close()
        if tied:  # the directory now holds its own lm_head
            config["tie_word_embeddings"] = False
        meta = {"format": format, "group_size": group_size, "format_options": format_options,
                "calibration": None if calibration is None else [",".join(pathlib.Path(f).name for f in files),
                                                                 calibration_tokens],
                "error_feedback": bool(error_feedback) and {"damp": damp},
                "finetune": bool(finetune_steps) and {"steps": finetune_steps, **(finetune_options or {}), **tune_log},
                "lm_head_format": lm_head_format,
                "embed_format": embed_format, "ternary_method": ternary_method, "source": str(ckpt.path), "source_kind": ckpt.kind,
                "tied_embeddings": tied or bool(ckpt.config.get("tie_word_embeddings"))}
        return writer.finish(config, tokenizer, meta)
