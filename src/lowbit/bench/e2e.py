"""End-to-end speed: prompt (prefill, GEMM) and generation (decode, GEMV) tokens/s on a real model or a
model shape with random weights, against the roofline (bytes read per token / measured bandwidth).

    lowbit bench e2e --shape llama3-8b --format ternary -t 2
    lowbit bench e2e -m model-dir-or-gguf
"""
from __future__ import annotations

import resource
import time

import numpy as np

import lowbit
from lowbit.bench import bandwidth, memory, print_json, roof
from lowbit.bench.gemv import random_weight
from lowbit.bench.shapes import MODEL_SHAPES
from lowbit.cli._common import DEFAULT_FORMAT, default_model
from lowbit.formats import PackedWeight
from lowbit.model.kv_cache import KV_TYPES

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def shape_model(name: str, fmt: str, lm_head_format: str | None = None, layers: int | None = None,
                max_context: int = 1024, seed: int = 0):
    """A model of a named shape with random weights in `fmt` (lm_head in `lm_head_format`, default convert's)."""
    from lowbit.io.convert import LM_HEAD_FORMAT
    from lowbit.model import Model
    from lowbit.model.dummy import weight_shapes

    lm_head_format = lm_head_format or LM_HEAD_FORMAT
    if name not in MODEL_SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(MODEL_SHAPES)}")
    cfg = {k: v for k, v in MODEL_SHAPES[name].items() if k != "label"}
    cfg.setdefault("max_position_embeddings", 4096)
    cfg.setdefault("rms_norm_eps", 1e-5)
    cfg.setdefault("rope_theta", 500000.0)
    if cfg["model_type"] == "bitnet":
        cfg.setdefault("hidden_act", "relu2")
    if layers:
        cfg["num_hidden_layers"] = int(layers)
    cfg["tie_word_embeddings"] = False  # a converted model always carries its own lm_head
    rng = np.random.default_rng(seed)
    weights: dict[str, object] = {}
    for wname, shape in weight_shapes(cfg).items():
        if len(shape) == 1:
            weights[wname] = np.ones(shape, np.float32)
        elif wname == "model.embed_tokens.weight":
            weights[wname] = random_weight("bf16", *shape, rng)
        elif wname == "lm_head.weight":
            weights[wname] = random_weight(lm_head_format, *shape, rng)
        else:
            weights[wname] = random_weight(fmt, *shape, rng)
    return Model.from_weights(cfg, weights, max_context=max_context), cfg


def bytes_per_token(model, position: float) -> dict:
    """Bytes a decode step reads: decoder blocks' weights, lm_head, and the KV cache at `position`."""
    a = model.args
    blocks = lm_head = 0
    for name, lin in model.linears().items():
        w = lin.weight
        n = getattr(w, "decode_nbytes", w.nbytes)  # rsr: one token reads only its dense codes
        if name == "lm_head":
            lm_head += n
        else:
            blocks += n
    row_bytes = model.cache.k.shape[-1] * model.cache.k.dtype.itemsize  # int8 rows carry their 4-byte scale
    kv = int(2 * a.num_hidden_layers * a.num_key_value_heads * row_bytes * position)
    return {"blocks": int(blocks), "lm_head": int(lm_head), "kv_cache": kv, "total": int(blocks + lm_head + kv)}


def run(model, prompt_tokens: int = 128, gen_tokens: int = 64, repeats: int = 3, seed: int = 0,
        between=lambda: None) -> dict:
    """Times prefill of `prompt_tokens` and `gen_tokens` greedy decode steps (EOS ignored);
    `between()` runs before every round and after the last (the bandwidth probe)."""
    vocab = model.args.vocab_size
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(0, vocab, size=prompt_tokens)]
    if prompt_tokens + gen_tokens > model.max_context:
        raise ValueError(f"prompt + generation ({prompt_tokens + gen_tokens}) exceed the context ({model.max_context})")
    pp, tg = [], []
    for r in range(repeats + 1):  # the first round is the warm-up
        if r:
            between()
        model.reset()
        t0 = time.perf_counter()
        logits = model.prefill(prompt)
        t1 = time.perf_counter()
        tok = int(np.argmax(logits))
        for _ in range(gen_tokens):
            tok = int(np.argmax(model.decode(tok)))
        t2 = time.perf_counter()
        if r:
            pp.append(prompt_tokens / (t1 - t0))
            tg.append(gen_tokens / (t2 - t1))
    between()
    model.reset()
    return {"prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "repeats": repeats,
            "pp_tps": float(np.mean(pp)), "pp_sd": float(np.std(pp)),
            "tg_tps": float(np.mean(tg)), "tg_sd": float(np.std(tg)), "tg_rounds": [float(v) for v in tg],
            "pp_rounds": [float(v) for v in pp]}


def prefill_macs_per_token(model, prompt_tokens: int) -> int:
    """Weight MACs per prompt token: every decoder linear once per token, lm_head once per prompt (prefill
    computes the last token's logits only). Attention's q.k and p.v are not counted."""
    macs = 0
    for name, lin in model.linears().items():
        m, k = lin.weight.shape
        macs += m * k / prompt_tokens if name == "lm_head" else m * k
    return int(macs)


def describe(model) -> dict:
    n_bytes = n_weights = 0
    formats = {}
    for name, lin in model.linears().items():
        w: PackedWeight = lin.weight
        n_bytes += w.nbytes
        n_weights += w.shape[0] * w.shape[1]
        formats[w.format] = formats.get(w.format, 0) + w.shape[0] * w.shape[1]
    emb = model.embed.table if hasattr(model.embed, "table") else None
    emb_bytes = getattr(emb, "nbytes", 0) if emb is not None else 0
    return {"linear_bytes": n_bytes, "embedding_bytes": int(emb_bytes), "size_bytes": int(n_bytes + emb_bytes),
            "bits_per_weight": 8.0 * n_bytes / max(n_weights, 1), "formats": formats, "params": model.n_params}


def read_gbps(threads: int, buf) -> float:
    """One quick read of the bandwidth roof (`lowbit bench bandwidth`'s kernel over buf), as read beside the rounds."""
    return bandwidth.measure(threads, passes=2, repeats=1, buf=buf)["gbps"]


def bench(model, threads: int, prompt_tokens: int, gen_tokens: int, repeats: int, label: str) -> dict:
    lowbit.set_threads(threads)
    # The host's DRAM share drifts within minutes: read the roof before every timed round and after the
    # last, and take the highest (the conservative choice for the fraction).
    buf = memory.buffer(256 << 20)
    roofs: list[float] = []
    computes: list[float] = []  # the int8 compute roof (`lowbit bench roof`), read beside the bandwidth

    def probes():
        roofs.append(read_gbps(threads, buf))
        computes.append(roof.measure(threads, min_time=0.05, repeats=2)["gmacs"])
    speed = run(model, prompt_tokens, gen_tokens, repeats, between=probes)
    bw = {"gbps": max(roofs), "samples": roofs}
    # Each round against the higher of the two roofs read around it: the host's share can change
    # between rounds, and a round is only comparable with the bandwidth of its own minutes.
    per_tok_bytes = bytes_per_token(model, prompt_tokens + gen_tokens / 2)["total"]
    fractions = [tps * per_tok_bytes / (max(roofs[i], roofs[i + 1]) * 1e9) for i, tps in enumerate(speed["tg_rounds"])]
    per_tok = bytes_per_token(model, prompt_tokens + gen_tokens / 2)
    roof_tps = bw["gbps"] * 1e9 / per_tok["total"]
    # Prefill against the int8 compute roof of the same threads, each round against the higher of the two
    # roofs read around it (as decode against the bandwidth).
    pp_macs = prefill_macs_per_token(model, prompt_tokens)
    compute_fractions = [tps * pp_macs / (max(computes[i], computes[i + 1]) * 1e9)
                         for i, tps in enumerate(speed["pp_rounds"])]
    # On the AMX level the roof is the tile unit's (~7x vpdpbusd's); the vector roof beside it says how prefill
    # compares with what the AVX-512 kernels could reach at most.
    vnni = None
    isa = lowbit.cpu_info()["isa"]
    if isa == "amx":
        vnni_gmacs = roof.measure_isa("avx512", threads, min_time=0.05, repeats=3)["gmacs"]
        vnni = {"gmacs": vnni_gmacs, "prefill_fraction": speed["pp_tps"] * pp_macs / (vnni_gmacs * 1e9)}
    return {"model": label, "threads": threads, **speed, **describe(model), "bytes_per_token": per_tok,
            "bandwidth_gbps": bw["gbps"], "bandwidth_samples": bw["samples"], "roofline_tps": roof_tps, "roofline_fraction": float(np.mean(fractions)),
            "roofline_fraction_sd": float(np.std(fractions)),
            "prefill_macs_per_token": pp_macs, "int8_roof_gmacs": max(computes), "int8_roof_samples": computes,
            "prefill_gmacs": speed["pp_tps"] * pp_macs / 1e9, "prefill_roof_fraction": float(np.mean(compute_fractions)),
            "prefill_roof_fraction_sd": float(np.std(compute_fractions)), "avx512_roof": vnni,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "isa": isa}


def decode_rates(row: dict, per_tok: dict, bandwidth_gbps: float) -> dict:
    """GB/s each part of a profiled decode token streams (bytes_per_token's parts over their ms per token, each
    with the join waits at its own barriers): where the roofline's gap is. row: step_profile's "decode" row."""
    def rate(nbytes: int, *cats: str) -> float:
        ms = sum(row.get(c, 0.0) for c in cats)
        return nbytes / (ms * 1e6) if ms > 0 else 0.0
    token = rate(per_tok["total"], "total")
    return {"gemv_gbps": rate(per_tok["blocks"], "gemv", "join_gemv"),
            "attention_gbps": rate(per_tok["kv_cache"], "attention", "join_attention"),
            "lm_head_gbps": rate(per_tok["lm_head"], "lm_head", "join_lm_head"),
            "token_gbps": token, "bandwidth_gbps": float(bandwidth_gbps),
            "roofline_fraction": token / bandwidth_gbps if bandwidth_gbps > 0 else 0.0}


def format_rates(r: dict) -> str:
    return (f"  decode streams (bytes per token / its ms, joins at its barriers included): GEMV {r['gemv_gbps']:.1f}, "
            f"attention (KV) {r['attention_gbps']:.1f}, lm_head {r['lm_head_gbps']:.1f}, whole token "
            f"{r['token_gbps']:.1f} GB/s ({100 * r['roofline_fraction']:.0f}% of the roofline); bandwidth read "
            f"{r['bandwidth_gbps']:.1f} GB/s around the profiled rounds")


def print_result(r: dict) -> None:
    b = r["bytes_per_token"]
    print(f"{r['model']}: {r['params'] / 1e9:.2f} B params, {r['size_bytes'] / 1e9:.2f} GB, "
          f"{r['bits_per_weight']:.2f} bits/weight in the linears ({', '.join(r['formats'])}), ISA {r['isa']}, "
          f"{r['threads']} thread(s)")
    print(f"  prompt  pp{r['prompt_tokens']:<4d} {r['pp_tps']:9.1f} ± {r['pp_sd']:.1f} tok/s   "
          f"({r['prefill_macs_per_token'] / 1e9:.2f} G weight MACs/token -> {r['prefill_gmacs']:.1f} G MAC/s)")
    print(f"  decode  tg{r['gen_tokens']:<4d} {r['tg_tps']:9.1f} ± {r['tg_sd']:.1f} tok/s   (mean ± sd of {r['repeats']} after a warm-up)")
    print(f"  bytes/token {b['total'] / 1e6:.1f} MB = blocks {b['blocks'] / 1e6:.1f} + lm_head {b['lm_head'] / 1e6:.1f} "
          f"+ KV cache {b['kv_cache'] / 1e6:.1f}; bandwidth {r['bandwidth_gbps']:.1f} GB/s (highest of "
          f"{', '.join(f'{x:.0f}' for x in r['bandwidth_samples'])} read around the rounds) -> roofline "
          f"{r['roofline_tps']:.1f} tok/s")
    print(f"  decode at {100 * r['roofline_fraction']:.0f} ± {100 * r['roofline_fraction_sd']:.0f}% of the roofline "
          f"(each round against the bandwidth read around it)")
    print(f"  prefill at {100 * r['prefill_roof_fraction']:.0f} ± {100 * r['prefill_roof_fraction_sd']:.0f}% of the int8 "
          f"compute roof (highest {r['int8_roof_gmacs']:.0f} G MAC/s of "
          f"{', '.join(f'{x:.0f}' for x in r['int8_roof_samples'])} with {r['threads']} thread(s) read around the "
          f"rounds, `lowbit bench roof`)")
    if r.get("avx512_roof"):
        v = r["avx512_roof"]
        print(f"  prefill at {100 * v['prefill_fraction']:.0f}% of the AVX-512 vpdpbusd roof ({v['gmacs']:.0f} G MAC/s, "
              f"`LOWBIT_ISA=avx512 lowbit bench roof`, read after the rounds)")
    print(f"  peak memory (RSS) {r['peak_rss_bytes'] / 1e9:.2f} GB")


def add_parser(bsub) -> None:
    e = bsub.add_parser("e2e", help="prompt and generation tokens/s and the fraction of the roofline",
                        description="End-to-end speed on a model (-m, anything `lowbit.load` takes) or a model "
                                    "shape with random weights (--shape), EOS ignored while timing.")
    src = e.add_mutually_exclusive_group()
    src.add_argument("-m", "--model", help="model dir, HF folder or GGUF")
    src.add_argument("--shape", choices=sorted(MODEL_SHAPES), help="a model shape with random weights")
    e.add_argument("--format", default=None,
                   help="weight format of the decoder linears (default: ternary for --shape; for a GGUF / HF source, "
                        f"what `lowbit run` converts it to, {DEFAULT_FORMAT})")
    e.add_argument("--lm-head-format", default=None,
                   help="format of lm_head (default: lowbit convert's, see `lowbit convert --help`); with -m, the "
                        "conversion setting of a GGUF / HF source")
    e.add_argument("--layers", type=int, default=None, help="override the number of layers of --shape (memory)")
    e.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    e.add_argument("--kv-cache", choices=tuple(KV_TYPES), default=None,
                   help="what the KV cache holds (default: the model's, f16 for a quantized one)")
    e.add_argument("-p", "--prompt-tokens", type=int, default=128, help="prompt length (default 128)")
    e.add_argument("-n", "--gen-tokens", type=int, default=64, help="generated tokens (default 64)")
    e.add_argument("-r", "--repeats", type=int, default=3, help="timed repeats after one warm-up (default 3)")
    e.add_argument("--profile", action="store_true",
                   help="then, in a separate run with the native timers on: per decode and per prefill token, "
                        "time in the GEMVs, join waits, attention, the lm_head, the rest and the Python around it")
    e.add_argument("--json", action="store_true", help="print JSON")
    e.set_defaults(func=main)


def main(args) -> int:
    threads = args.threads or lowbit.cpu_info()["physical_cores"]
    if args.shape:
        from lowbit.io.convert import LM_HEAD_FORMAT

        head = args.lm_head_format or LM_HEAD_FORMAT
        fmt = args.format or "ternary"
        model, _ = shape_model(args.shape, fmt, head, args.layers, max_context=args.prompt_tokens + args.gen_tokens + 8)
        if args.kv_cache:
            model.set_kv_cache(args.kv_cache)
        label = f"{args.shape} ({fmt}, lm_head {head}, random weights"
        label += f", {args.layers} layers)" if args.layers else ")"
    else:
        from lowbit.api import load
        # a real checkpoint in the format `lowbit run` gives it: ternary would time a model it destroys
        llm = load(args.model or default_model(), format=args.format or DEFAULT_FORMAT, lm_head_format=args.lm_head_format,
                   kv_cache=args.kv_cache)  # (set after load, the warm-up's native step would be built twice)
        model = llm.model
        label = str(args.model or "default model")
    if args.kv_cache:
        label += f", {args.kv_cache} KV cache"
    res = bench(model, threads, args.prompt_tokens, args.gen_tokens, args.repeats, label)
    if args.profile:
        from lowbit.model.profile import step_profile

        # The profiled rounds run minutes after the timed ones, and the host's share of the DRAM drifts by the
        # minute: their streams are set against the bandwidth read right before and after them (as a timed round
        # against the reads around it), not against the timed rounds' reads.
        buf = memory.buffer(256 << 20)
        reads = [read_gbps(threads, buf)]
        res["profile"] = step_profile(model, args.prompt_tokens, args.gen_tokens, repeats=max(1, args.repeats - 1))
        reads.append(read_gbps(threads, buf))
        del buf
        res["profile"]["decode_rates"] = decode_rates(res["profile"]["decode"], res["bytes_per_token"], max(reads))
        res["profile"]["bandwidth_samples"] = reads
    if args.json:
        print_json(res)
    else:
        print_result(res)
        if args.profile:
            from lowbit.model.profile import format_profile

            print(format_profile(res["profile"]))
            print(format_rates(res["profile"]["decode_rates"]))
    return 0

