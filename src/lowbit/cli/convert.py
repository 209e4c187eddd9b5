"""`lowbit convert SRC OUT --format ternary`: a checkpoint -> a lowbit model directory."""
from __future__ import annotations

import argparse
import sys

FORMAT_HELP = {
    "ternary": "1.58-bit {-1,0,+1} x scale (lossless for BitNet / TQ1_0 / TQ2_0 sources)",
    "tq1": "ternary at 5 trits per byte (1.6 bits; lossless from per-tensor/row ternary such as BitNet)",
    "binary": "1-bit +-scale",
    "rsr": "ternary plus an RSR index (paper 003: k-row blocks, input permutations, segments) for calls of >= 32 tokens",
    "codebook": "vector codebooks (AQLM) + Psumbook kernel: m*b/v + 16/g bits (--m --v --b --g)",
    "int2": "2-bit codes, per-group scale and offset",
    "int4": "4-bit codes, per-group scale and offset (default)",
    "int8": "8-bit codes, one scale per block of 32 (like Q8_0)",
    "int6": "6-bit codes, per-group scale and offset (7 bits per weight); the lm_head default",
    "bf16": "bfloat16 (no quantization; the speed baseline)",
    "f32": "float32",
}

EPILOG = """\
formats:
{formats}

examples:
  lowbit convert ./SmolLM2-135M-Instruct smollm2-int4            # an HF folder, downloaded
  lowbit convert SmolLM2-135M-Instruct.Q4_1.gguf smollm2-int2 --format int2 --group-size 64
  lowbit convert ./bitnet-b1.58-2B-4T bitnet --format ternary    # packed ternary: lossless
  lowbit convert SmolLM2-135M-Instruct.Q4_1.gguf smollm2-cb2 --format codebook --m 1 --v 4 --b 8 --g 128

SRC is a Hugging Face model folder (config.json + *.safetensors + tokenizer.json), a .gguf file,
or a lowbit model directory. Ternary and binary make sense only for models trained for them
(BitNet b1.58, ParetoQ); on other models quality collapses (you get a warning).
The output is written to a temporary folder and renamed at the end: an interrupted conversion
leaves no OUT behind.
"""


FINETUNE_STEPS = 200
FINETUNE_LR = 2e-3
TEACHER_TOKENS = 8192
TEACHER_FRAC = 0.5
PV_STEPS = 0
SCHEDULE = "cosine"
WARMUP = 0.1  # a fraction of --finetune-steps


def add_parser(subparsers) -> argparse.ArgumentParser:
    from lowbit.io.convert import LM_HEAD_FORMAT

    formats = "\n".join(f"  {k:<8} {v}" for k, v in FORMAT_HELP.items())
    p = subparsers.add_parser(
        "convert", help="convert a checkpoint (HF safetensors or GGUF) to a lowbit model directory",
        description="Convert a checkpoint to a lowbit model directory: packed weights (mmap-able safetensors), "
                    "config.json and tokenizer files.",
        epilog=EPILOG.format(formats=formats), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="HF model folder, .gguf file, or lowbit directory")
    p.add_argument("out", metavar="OUT", help="directory to create")
    p.add_argument("--format", "-f", default="int4", choices=list(FORMAT_HELP),
                   help="format of the decoder layers' projection weights (default: int4)")
    p.add_argument("--group-size", "-g", type=int, default=None, metavar="G",
                   help="input channels per scale, a multiple of 32 (default: the format's own: 32 for int4 and int8, 64 for int2, "
                        "one per tensor for ternary)")
    p.add_argument("--lm-head-format", default=None, choices=list(FORMAT_HELP), metavar="FMT",
                   help=f"format of the output projection (default: {LM_HEAD_FORMAT}; a tied embedding gets its own "
                        "copy in this format)")
    p.add_argument("--embed-format", default="bf16", choices=list(FORMAT_HELP), metavar="FMT",
                   help="format of the embedding table (default: bf16)")
    p.add_argument("--ternary-method", default="absmean", choices=["absmean", "mse"],
                   help="scale of float weights ternarized to ternary/tq1: absmean (BitNet b1.58, default) or mse "
                        "(error-minimizing, for post-training ternarization); already-ternary weights keep theirs")
    cb = p.add_argument_group("codebook options (--format codebook; bits per weight = m*b/v + 16/g)")
    cb.add_argument("--m", type=int, default=1, help="codebooks per vector, additive (default 1)")
    cb.add_argument("--v", type=int, default=4, help="inputs per vector (default 4)")
    cb.add_argument("--b", type=int, default=8,
                    help="bits per code, 1..8: 2^b centroids per codebook (default 8); b 4 packs two codes per byte "
                         "and runs the register-table kernel, the fastest codebook kernel on AVX2 and on AVX-512 VBMI "
                         "(e.g. --m 2 --v 4 --b 4, 2.125 bpw; b 8 is the more accurate at the same bits)")
    cb.add_argument("--g", type=int, default=128, help="inputs per float16 scale, a multiple of v (default 128)")
    cb.add_argument("--iters", type=int, default=4, help="code/codebook refinement rounds after k-means (default 4)")
    cb.add_argument("--seed", type=int, default=0, help="seed of the k-means sampling (default 0)")
    cb.add_argument("--beam", type=int, default=8,
                    help="beam width of the code search for m > 1 (AQLM; exact joint search when 2^(m*b) <= 256; default 8)")
    cb.add_argument("--calibration", metavar="TEXT", default=None, nargs="+",
                    help="text file(s) to calibrate on, read one after the other (use a different text from the one you "
                         "evaluate on): by default "
                         "error feedback with each linear's input Hessian, then a knowledge-distillation fine-tune (see "
                         "below); with --no-error-feedback --finetune-steps 0, each input channel's error weighted by its "
                         "mean x^2 over the text (run through the source model in float32)")
    cb.add_argument("--calibration-tokens", type=int, default=4096, metavar="N",
                    help="calibration tokens (default 4096)")
    cb.add_argument("--no-error-feedback", dest="error_feedback", action="store_false",
                    help="with --calibration: weight each input's error by its mean x^2 only, instead of the default "
                         "GPTQ-style error feedback with each linear's full input Hessian X^T X, collected layer by layer "
                         "from the model quantized so far (Llama-family models; needs torch)")
    cb.add_argument("--no-act-order", dest="act_order", action="store_false",
                    help="error feedback in input order (each group's scales from the updated weights) instead of the "
                         "default GPTQ act-order (most important inputs first, scales fixed beforehand)")
    cb.add_argument("--damp", type=float, default=0.01,
                    help="dampening of the error feedback's Hessian, a fraction of its mean diagonal (default 0.01)")
    cb.add_argument("--finetune-steps", type=int, default=FINETUNE_STEPS, metavar="N",
                    help="with --calibration: steps of knowledge-distillation fine-tuning afterwards (codes frozen; "
                         "codebooks, scales and norms trained towards the source model's next-token distributions on "
                         f"the calibration text and --teacher-tokens; SmolLM2-135M at 256 tokens: 22-30 s a step measured on "
                         f"one loaded shared core, ~3-4 s estimated on a quiet 2-core machine); 0: none (default "
                         f"{FINETUNE_STEPS}; 500 for the best accuracy: SmolLM2-135M m1v4b8g128 33.6 -> 32.1 perplexity, "
                         "~12 min more per 100 steps on a quiet 2-core machine; docs/codebook.md)")
    cb.add_argument("--finetune-lr", type=float, default=FINETUNE_LR,
                    help=f"peak Adam learning rate of the fine-tune, relative to each tensor's RMS (default {FINETUNE_LR:g})")
    cb.add_argument("--finetune-schedule", choices=["cosine", "constant"], default=SCHEDULE,
                    help=f"learning rate after the warm-up: constant, or a cosine down to 0 at the last step (default "
                         f"{SCHEDULE})")
    cb.add_argument("--finetune-warmup", type=int, default=None, metavar="N",
                    help=f"steps of linear learning-rate warm-up (default: {WARMUP:g} x --finetune-steps)")
    cb.add_argument("--finetune-seq", type=int, default=256, metavar="T",
                    help="tokens per fine-tuning window (default 256; one window per step)")
    cb.add_argument("--teacher-tokens", type=int, default=TEACHER_TOKENS, metavar="N",
                    help="tokens of text sampled from the source model itself (temperature 1, prompts cut from the "
                         "calibration text) that the fine-tune also learns from: data-free distillation as in "
                         f"LLM-QAT, against overfitting a short calibration text (default {TEACHER_TOKENS}; 0: none)")
    cb.add_argument("--teacher-frac", type=float, default=TEACHER_FRAC, metavar="P",
                    help=f"share of the fine-tuning windows taken from the sampled text (default {TEACHER_FRAC:g})")
    cb.add_argument("--finetune-holdout", type=int, default=0, metavar="N",
                    help="leave the last N calibration tokens out of the fine-tune and print the KL to the source model "
                         "on them before and after it (also kept in the model's config.json): a rising value means the "
                         "fine-tune overfits the calibration text (default 0: no check)")
    cb.add_argument("--pv-steps", type=int, default=PV_STEPS, metavar="N",
                    help="after the fine-tune, PV-tuning's discrete step: every linear's codes chosen again by error "
                         "feedback with its fine-tuned codebooks and scales (kept where they lower the layer's output "
                         f"error), then N more fine-tuning steps (default {PV_STEPS}; 0: no discrete step)")
    cb.add_argument("--finetune-pv-every", type=int, default=0, metavar="N",
                    help="during the fine-tune, every N steps PV-tuning's discrete step with the end-to-end gradient: "
                         "the KD loss's gradient g w.r.t. each dequantized weight matrix W (averaged over the last N "
                         "steps) gives an Adam-like target W - a*g, and the codes of the --finetune-pv-tau fraction of "
                         "all vectors with the largest predicted loss decrease move to the centroid nearest it "
                         "(default 0: codes frozen; docs/codebook.md)")
    cb.add_argument("--finetune-pv-tau", type=float, default=1e-3, metavar="F",
                    help="fraction of all code vectors a PV step may change (default 0.001)")
    cb.add_argument("--finetune-pv-alpha", type=float, default=0.2, metavar="A",
                    help="the PV step's target moves each weight by up to A times its matrix's RMS: a = A * rms(W) / "
                         "(RMS of that weight's gradient over the last N steps) (default 0.2)")
    cb.add_argument("--finetune-pv-check", type=int, default=2, metavar="N",
                    help="line search of each PV step on N fixed extra windows: the fraction tau, tau/4, tau/16, the "
                         "first that lowers their KD loss is kept, else none (default 2; 0: always take tau)")
    p.add_argument("--force", action="store_true", help="replace OUT if it is an existing lowbit directory")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    # (flag, default) of each codebook option: main() refuses the ones set where they have no effect
    p.set_defaults(func=main, codebook_flags={a.dest: (a.option_strings[0], a.default) for a in cb._group_actions})
    return p


CALIBRATION_ONLY = ("calibration_tokens", "error_feedback", "act_order", "damp", "finetune_steps", "finetune_lr",
                    "finetune_schedule", "finetune_warmup", "finetune_seq", "teacher_tokens", "teacher_frac",
                    "finetune_holdout", "pv_steps", "finetune_pv_every", "finetune_pv_tau", "finetune_pv_alpha",
                    "finetune_pv_check")


def check_option_scope(args) -> None:
    """Options that the chosen --format (or the lack of --calibration) would ignore are an error, not a no-op."""
    flags = getattr(args, "codebook_flags", {})
    changed = [flag for dest, (flag, default) in flags.items() if getattr(args, dest, default) != default]
    if args.format != "codebook" and changed:
        raise ValueError(f"{', '.join(changed)} apply to --format codebook only, not --format {args.format}")
    if args.calibration is None:
        need = [flags[d][0] for d in CALIBRATION_ONLY if d in flags and flags[d][0] in changed]
        if need:
            raise ValueError(f"{', '.join(need)} need --calibration TEXT")
    if args.ternary_method != "absmean" and args.format not in ("ternary", "tq1", "rsr"):
        raise ValueError(f"--ternary-method applies to --format ternary, tq1 and rsr, not --format {args.format}")


def finetune_options(args) -> dict:
    """The CLI's fine-tune flags -> convert()'s finetune_options (io.codebook_tune.tune)."""
    warmup = args.finetune_warmup if args.finetune_warmup is not None else int(WARMUP * args.finetune_steps)
    opts = {"lr": args.finetune_lr, "seq": args.finetune_seq, "seed": args.seed, "schedule": args.finetune_schedule,
            "warmup": warmup}
    if args.teacher_tokens:
        opts.update(teacher_tokens=args.teacher_tokens, extra_frac=args.teacher_frac)
    if args.pv_steps:
        opts["pv_steps"] = args.pv_steps
    if args.finetune_holdout:
        opts["holdout"] = args.finetune_holdout
    if args.finetune_pv_every:
        opts.update(pv_every=args.finetune_pv_every, pv_tau=args.finetune_pv_tau, pv_alpha=args.finetune_pv_alpha,
                    pv_check=args.finetune_pv_check)
    return opts


def main(args) -> int:
    from lowbit.io.convert import LM_HEAD_FORMAT, convert
    from lowbit.io.modeldir import LowbitCheckpoint

    check_option_scope(args)
    options = None
    if args.format == "codebook":
        options = {"m": args.m, "v": args.v, "b": args.b, "g": args.g, "iters": args.iters, "seed": args.seed,
                   "beam": args.beam}
        if not args.act_order:
            options["act_order"] = False
    try:
        out = convert(args.src, args.out, format=args.format, group_size=args.group_size,
                      lm_head_format=args.lm_head_format or LM_HEAD_FORMAT, embed_format=args.embed_format,
                      overwrite=args.force, progress=not args.quiet, ternary_method=args.ternary_method,
                      format_options=options, calibration=args.calibration,
                      calibration_tokens=args.calibration_tokens,
                      error_feedback=args.calibration is not None and args.error_feedback, damp=args.damp,
                      finetune_steps=args.finetune_steps if args.calibration is not None else 0,
                      finetune_options=finetune_options(args))
    except FileExistsError as e:
        print(f"lowbit: error: {e}", file=sys.stderr)
        return 1
    ck = LowbitCheckpoint(out)
    nbytes = sum(f.path.stat().st_size for f in ck.files)
    print(f"wrote {out} ({nbytes / 2**20:.1f} MiB, {len(ck.tensor_names())} tensors, format {args.format})")
    return 0
