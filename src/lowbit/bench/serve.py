"""Serving throughput: `lowbit serve` on loopback under 1, 4, 16 concurrent clients (continuous batching).

    lowbit bench serve --shape bitnet-0.7b --format ternary --requests 200 --clients 1,4,16
    lowbit bench serve -m model-dir

The server runs in this process (engine thread + uvicorn on 127.0.0.1, a free port); the clients are
asyncio tasks in a load generator process of their own (lowbit.bench.serve_client), streaming
/v1/completions with token-id prompts (random ids, `--prompt-tokens` long, a new one per request unless
`--prompt-pool`, so no level gains from cached prefixes) and `max_tokens` = `--gen-tokens`. Each level
sends exactly `--requests` requests, `clients` at a time, each with a timeout, so the run is bounded. The
levels run as a sandwich (level_order): every level but the last in two halves, before and after the last
one, so the host's drift over the run weighs about the same on each level (`--sequential`: each level
whole, in turn). A request fails unless it answers 200, streams to `data: [DONE]` and reports its usage; a
request is lost if it never ends. Reported per level: aggregate generated tokens/s (completion
tokens only / wall time) and prompt tokens/s, per-request decode tokens/s (median), time to first token
and latency (p50 / p95); `--profile` adds where each engine step's time went.

--shape models have random weights and no tokenizer: they are served with IdTokenizer (token ids in,
" <id>" pieces out), so no vocabulary is needed; EOS never fires (the shapes define none).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np

import lowbit
from lowbit.bench import print_json
from lowbit.bench.shapes import MODEL_SHAPES
from lowbit.model.kv_cache import KV_TYPES


class IdTokenizer:
    """Text-free tokenizer for random-weight shapes: ids decode to " <id>"; prompts must be token ids."""

    eos_ids: set = set()
    bos_id = None
    chat_template = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text, add_bos=None):
        raise ValueError("this model has no tokenizer: send the prompt as a list of token ids")

    def decode(self, ids, skip_special: bool = True) -> str:
        return "".join(f" <{int(i)}>" for i in ids)


def _pct(xs, q) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def run_clients(base: str, clients: int, prompts: list[list[int]], gen_tokens: int, timeout: float,
                in_process: bool = False) -> tuple[list[dict], float, float | None]:
    """One request per prompt, `clients` at a time, from the load generator's own process (serve_client)
    -> (the requests' results, wall seconds, the generator's CPU seconds). in_process: an asyncio loop in
    this process instead (the old way; it shares the GIL with the server's threads)."""
    if in_process:
        from lowbit.bench.serve_client import run_clients as run_here

        cpu0 = time.thread_time()
        res, wall = asyncio.run(run_here(base, clients, prompts, gen_tokens, timeout))
        return res, wall, time.thread_time() - cpu0
    job = json.dumps({"url": base, "clients": clients, "prompts": prompts, "gen_tokens": gen_tokens,
                      "timeout": timeout})
    rounds = -(-len(prompts) // max(clients, 1))  # every request has its own timeout: the generator ends
    p = subprocess.run([sys.executable, "-m", "lowbit.bench.serve_client"], input=job, capture_output=True,
                       text=True, timeout=rounds * timeout + 120)
    if p.returncode != 0:
        raise RuntimeError(f"the load generator failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    out = json.loads(p.stdout)
    return out["results"], out["wall"], out["cpu"]


def _summary(clients: int, requests: int, results: list[dict], wall: float) -> dict:
    """A level's figures from its requests' results and its wall time (the sum over its slices)."""
    ok = [r for r in results if r["ok"]]
    errors = sorted({r["error"] for r in results if not r["ok"]})
    toks = sum(r["tokens"] for r in ok)
    ptoks = sum(r["prompt_tokens"] for r in ok)
    tps = [r["tps"] for r in ok if r["tps"] == r["tps"]]
    return {"clients": clients, "requests": requests, "completed": len(ok), "failed": len(results) - len(ok),
            "lost": requests - len(results), "errors": errors[:5], "wall_s": wall, "completion_tokens": toks,
            "prompt_tokens": ptoks, "aggregate_tps": toks / wall if wall > 0 else 0.0,
            "aggregate_prompt_tps": ptoks / wall if wall > 0 else 0.0, "per_request_tps_p50": _pct(tps, 50),
            "ttft_p50_s": _pct([r["ttft"] for r in ok], 50), "ttft_p95_s": _pct([r["ttft"] for r in ok], 95),
            "latency_p50_s": _pct([r["latency"] for r in ok], 50),
            "latency_p95_s": _pct([r["latency"] for r in ok], 95)}


def level_order(n_levels: int, requests: int, sandwich: bool = True) -> list[tuple[int, int, int]]:
    """The slices the levels run in: (level, first request, end). Sequential: each level whole, in turn.
    Sandwich: every level but the last in two halves, the first halves in order, the last level whole, the
    second halves in reverse order; so a host whose speed drifts over the run (this one's swings by a third
    within minutes) weighs about the same on every level, and the ratios compare like with like. Only the
    split levels pay an extra drain of their batch, and the last (the most clients) is not split."""
    if not sandwich or n_levels == 1 or requests < 2:
        return [(i, 0, requests) for i in range(n_levels)]
    h = requests // 2
    return ([(i, 0, h) for i in range(n_levels - 1)] + [(n_levels - 1, 0, requests)]
            + [(i, h, requests) for i in reversed(range(n_levels - 1))])


def random_prompts(rng, n: int, length: int, ids: np.ndarray) -> list[list[int]]:
    """n prompts of `length` token ids drawn from `ids`."""
    return [[int(t) for t in ids[rng.integers(0, len(ids), size=length)]] for _ in range(n)]


def bench(llm, clients: list[int], requests: int, prompt_tokens: int, gen_tokens: int, max_batch: int | None = None,
          timeout: float = 600.0, seed: int = 0, label: str = "", prompt_pool: int = 0,
          profile: bool = False, sandwich: bool = True, in_process: bool = False) -> dict:
    """Starts a server on 127.0.0.1 for llm, runs each concurrency level, stops the server.

    Every request has its own random prompt (prompt_pool 0), so no level gains from the server's prefix
    re-use and each pays the same prefill per request; prompt_pool N > 0: the requests cycle through N
    prompts, each run once before the first level (cached prefixes are then re-used by every level).
    profile: the engine's step profile per level, then the native step alone (step_ceiling).
    sandwich: the levels' slices in level_order's sandwich (default), else each level whole in turn.
    in_process: the clients in this process (run_clients), not in a load generator process of their own."""
    from lowbit.serve import Server

    if requests < 1 or prompt_tokens < 1 or gen_tokens < 1 or not clients or min(clients) < 1:
        raise ValueError("requests, prompt tokens, generated tokens and every client count must be >= 1")
    if prompt_pool < 0:
        raise ValueError(f"the prompt pool must be >= 0, got {prompt_pool}")
    ctx = prompt_tokens + gen_tokens + 1
    if ctx > llm.model.max_context:
        raise ValueError(f"prompt + generated tokens ({ctx - 1}) exceed the model's context ({llm.model.max_context})")
    rng = np.random.default_rng(seed)
    vocab = llm.model.args.vocab_size
    eos = set(getattr(llm.tokenizer, "eos_ids", ()) or ()) | llm.model.args.eos_ids
    ids = np.array([i for i in range(vocab) if i not in eos], np.int64)
    pool = random_prompts(rng, prompt_pool, prompt_tokens, ids) if prompt_pool else None
    batch = max_batch or max(clients)
    # each level's requests: a new random prompt each, or the pool's prompts in turn
    prompts = [[pool[i % len(pool)] for i in range(requests)] if pool
               else random_prompts(rng, requests, prompt_tokens, ids) for _ in clients]
    order = level_order(len(clients), requests, sandwich)
    got = [([], 0.0) for _ in clients]
    with Server(llm, port=0, max_batch=batch, max_context=ctx, max_queue=max(clients) + 1, model_id=label) as srv:
        run_clients(srv.url, 1, random_prompts(rng, 1, prompt_tokens, ids), min(gen_tokens, 4), timeout, in_process)
        if pool:  # every pool prompt cached before the first level, so no level pays its cold prefills
            run_clients(srv.url, min(len(pool), batch), pool, 1, timeout, in_process)
        profs = [StepProfile(srv.engine, profile, {"http": srv.http_thread_id}) for _ in clients]
        for li, a, b in order:
            with profs[li] as prof:
                res, wall, cpu = run_clients(srv.url, clients[li], prompts[li][a:b], gen_tokens, timeout, in_process)
                prof.add_cpu("clients", cpu)
            got[li] = (got[li][0] + res, got[li][1] + wall)
    levels = []
    for li, c in enumerate(clients):
        lv = _summary(c, requests, *got[li])
        if profile:
            lv["profile"] = profs[li].result
        levels.append(lv)
    base = levels[0]["aggregate_tps"] if levels and levels[0]["clients"] == 1 else None
    if profile:  # the same model, the server stopped: what the kernels allow at this batch, what the roof allows
        ceiling = step_ceiling(llm.model, batch, prompt_tokens)
        bound = compute_bound(llm.model, prompt_tokens, gen_tokens, base)
    for lv in levels:
        lv["speedup_vs_1_client"] = lv["aggregate_tps"] / base if base else None
    return {"model": label, "threads": lowbit.get_threads(),
            "isa": lowbit.cpu_info()["isa"], "max_batch": batch, "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens, "prompt_pool": prompt_pool, "levels": levels,
            "order": [[clients[li], b - a] for li, a, b in order],
            **({"step_ceiling": ceiling, "compute_bound": bound} if profile else {})}


def thread_cpu_seconds(tid: int | None) -> float | None:
    """CPU time (user + system) of thread `tid` of this process so far, from /proc (Linux); else None."""
    if tid is None:
        return None
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


class StepProfile:
    """Where a level's wall time went, per engine step: the native step's categories (kernels/decoder.h),
    the engine's Python around it (admission, sampling, detokenizing, bookkeeping), the time the engine
    was not stepping (idle between requests), and the CPU time the HTTP server's thread and the clients
    (add_cpu: what the load generator reports) used meanwhile (on the same cores as the step: they slow it
    down when they run during it)."""

    CATEGORIES = ("gemv", "join", "attention", "lm_head", "rest")

    def __init__(self, engine, on: bool, threads: dict | None = None):
        self.engine, self.on, self.result = engine, on, None
        self.nat = engine.runner._native if on else None
        self.threads = threads or {}
        self.extra_cpu: dict = {}
        self.tot: dict = {}  # summed over the level's slices (entered once per slice)

    def add_cpu(self, name: str, seconds: float | None) -> None:
        """CPU seconds that `name` (the load generator) spent during this slice, as it reports them."""
        self.extra_cpu[name] = seconds

    def __enter__(self):
        if self.on:
            if self.nat is not None:
                self.nat.set_profile(True)
            e = self.engine
            self.start = (e.steps, e.rows, e.step_seconds, time.perf_counter())
            self.cpu0 = {k: thread_cpu_seconds(t) for k, t in self.threads.items()}
            self.extra_cpu = {}
        return self

    def __exit__(self, *exc):
        if not self.on:
            return
        e = self.engine
        add = {"steps": e.steps - self.start[0], "rows": e.rows - self.start[1],
               "step_s": e.step_seconds - self.start[2], "wall": time.perf_counter() - self.start[3]}
        if self.nat is not None:
            p = self.nat.profile()["batch"]
            self.nat.set_profile(False)
            add["native"] = p["seconds"]
            for c in self.CATEGORIES:
                add[c] = p[c]
        for k, t in self.threads.items():
            c0, c1 = self.cpu0.get(k), thread_cpu_seconds(t)
            add[k + "_cpu"] = c1 - c0 if c0 is not None and c1 is not None else None
        for k, v in self.extra_cpu.items():
            add[k + "_cpu"] = v
        for k, v in add.items():  # a thread CPU time /proc could not give stays None
            prev = self.tot.get(k, 0)
            self.tot[k] = None if v is None or prev is None else prev + v
        self.result = self._result()

    def _result(self) -> dict:
        t = self.tot
        n = max(t["steps"], 1)
        r = {"steps": t["steps"], "rows_per_step": t["rows"] / n, "wall_ms_per_step": 1e3 * t["wall"] / n,
             "step_ms": 1e3 * t["step_s"] / n}
        native = t.get("native", 0.0)
        if "native" in t:
            for c in self.CATEGORIES:
                r[c + "_ms"] = 1e3 * t[c] / n
            r["native_ms"] = 1e3 * native / n
        r["python_ms"] = 1e3 * max(t["step_s"] - native, 0.0) / n
        r["not_stepping_ms"] = 1e3 * max(t["wall"] - t["step_s"], 0.0) / n
        for k, v in t.items():  # the threads' and the reported (add_cpu) CPU seconds
            if k.endswith("_cpu"):
                r[k + "_ms"] = 1e3 * v / n if v is not None else None
        return r


def step_ceiling(model, batch: int, prompt_tokens: int, rounds: int = 8, seed: int = 0) -> dict | None:
    """The kernels' bound on the aggregate speedup: the native step alone (no server), `batch` steps of one
    row against one step of `batch` rows, alternating, from slots holding prompt_tokens tokens.
    -> {"b1": {category: ms per step}, "bn": {...}, "gain": {category: batch x b1 / bn}} (medians over
    rounds), or None without the native step."""
    from lowbit.model.batch import BatchDecoder

    ctx = model.max_context
    n_prompt = max(1, min(prompt_tokens, ctx - 2 * rounds))
    rounds = min(rounds, (ctx - n_prompt) // 2)  # each round adds two rows to every slot
    if rounds < 1:
        return None
    bd = BatchDecoder(model, batch, max_context=ctx)
    nat = bd._native
    if nat is None:
        return None
    rng = np.random.default_rng(seed)
    vocab = model.args.vocab_size
    for s in range(batch):
        bd.step([(s, [int(t) for t in rng.integers(0, vocab, n_prompt)], True)])
    cats = StepProfile.CATEGORIES + ("seconds",)
    runs: dict[str, list] = {"b1": [], "bn": []}
    try:
        for r in range(rounds):
            for kind in (("b1", "bn") if r % 2 == 0 else ("bn", "b1")):
                nat.set_profile(True)
                if kind == "b1":
                    for s in range(batch):  # every slot one row further, one at a time
                        bd.step([(s, [int(rng.integers(0, vocab))], True)])
                else:
                    bd.step([(s, [int(rng.integers(0, vocab))], True) for s in range(batch)])
                p = nat.profile()["batch"]
                runs[kind].append({c: 1e3 * p[c] / p["steps"] for c in cats})
    finally:
        nat.set_profile(False)
    med = {k: {c: float(np.median([x[c] for x in v])) for c in cats} for k, v in runs.items()}
    gain = {c: batch * med["b1"][c] / med["bn"][c] if med["bn"][c] > 0 else float("nan") for c in cats}
    return {"batch": batch, "rounds": rounds, "b1": med["b1"], "bn": med["bn"], "gain": gain}


def compute_bound(model, prompt_tokens: int, gen_tokens: int, one_client_tps: float | None = None) -> dict:
    """The int8 compute roof's bound on the aggregate generated tokens/s at any concurrency. Batching shares the
    weight stream, not the arithmetic: every prompt token and every generated token but the last is a row of
    some step through every decoder linear, and every generated token takes one lm_head row, so a request
    costs at least that many MACs however many run together (attention's q.k and p.v not counted: the bound
    is high). At `lowbit bench roof`'s rate on this process's threads:
    -> {"macs_per_request", "macs_per_generated_token", "int8_roof_gmacs", "max_aggregate_tps",
        "max_speedup_vs_1_client" (against one_client_tps, the 1-client level's aggregate; None without it)}."""
    from lowbit.bench import roof

    block = head = 0
    for name, lin in model.linears().items():
        m, k = lin.weight.shape
        if name == "lm_head":
            head += m * k
        else:
            block += m * k
    macs = (prompt_tokens + gen_tokens - 1) * block + gen_tokens * head
    gmacs = roof.measure(lowbit.get_threads())["gmacs"]
    tps = gen_tokens * gmacs * 1e9 / macs
    return {"macs_per_request": int(macs), "macs_per_generated_token": macs / gen_tokens, "int8_roof_gmacs": gmacs,
            "max_aggregate_tps": tps, "max_speedup_vs_1_client": tps / one_client_tps if one_client_tps else None}


def _ms(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_result(r: dict) -> None:
    print(f"{r['model']}: ISA {r['isa']}, max batch {r['max_batch']}, prompts of {r['prompt_tokens']} tokens, "
          f"{r['gen_tokens']} generated per request (greedy), loopback HTTP streaming; slices run "
          + ", ".join(f"{c}x{n}" for c, n in r["order"]) + " (clients x requests)")
    print(f"{'clients':>7} {'requests':>8} {'failed':>6} {'lost':>4} {'aggregate tok/s':>15} {'x 1 client':>10} "
          f"{'per-request tok/s':>17} {'TTFT p50/p95 s':>15} {'latency p50/p95 s':>18}")
    for lv in r["levels"]:
        sp = f"{lv['speedup_vs_1_client']:.2f}" if lv["speedup_vs_1_client"] else "-"
        print(f"{lv['clients']:>7} {lv['requests']:>8} {lv['failed']:>6} {lv['lost']:>4} {lv['aggregate_tps']:>15.1f} "
              f"{sp:>10} {lv['per_request_tps_p50']:>17.1f} "
              f"{lv['ttft_p50_s']:>7.2f}/{lv['ttft_p95_s']:<7.2f} {lv['latency_p50_s']:>8.2f}/{lv['latency_p95_s']:<8.2f}")
        for e in lv["errors"]:
            print(f"        error: {e}")
    print(f"{'clients':>7} {'prompt tok/s':>12} {'generated tok/s':>15}   (aggregate, over each level's wall time)")
    for lv in r["levels"]:
        print(f"{lv['clients']:>7} {lv['aggregate_prompt_tps']:>12.1f} {lv['aggregate_tps']:>15.1f}")
    if any("profile" in lv for lv in r["levels"]):
        print("per engine step (ms): native step = gemv/gemm + join + attention + lm_head + rest; python = the "
              "engine around it; idle = engine not stepping; http / client cpu = CPU time of the server's and the "
              "clients' threads per step")
        print(f"{'clients':>7} {'steps':>6} {'rows':>6} {'wall':>7} {'gemv':>7} {'join':>6} {'attn':>6} {'head':>6} "
              f"{'rest':>6} {'python':>7} {'idle':>6} {'http cpu':>8} {'client cpu':>10}")
        for lv in r["levels"]:
            p = lv.get("profile")
            if p:
                print(f"{lv['clients']:>7} {p['steps']:>6} {p['rows_per_step']:>6.1f} {p['wall_ms_per_step']:>7.2f} "
                      + " ".join(f"{p.get(c + '_ms', float('nan')):>{w}.2f}" for c, w in
                                 (("gemv", 7), ("join", 6), ("attention", 6), ("lm_head", 6), ("rest", 6)))
                      + f" {p['python_ms']:>7.2f} {p['not_stepping_ms']:>6.2f} {_ms(p.get('http_cpu_ms')):>8}"
                      f" {_ms(p.get('clients_cpu_ms')):>10}")
    c = r.get("step_ceiling")
    if c:
        names = (*StepProfile.CATEGORIES, "seconds")
        print(f"the native step alone, {c['batch']} steps of 1 row vs 1 step of {c['batch']} rows, alternating "
              f"(median of {c['rounds']}), ms per step; gain = {c['batch']} x B1 / B{c['batch']} (the kernels' bound "
              f"on the aggregate speedup of decode):")
        print(f"{'':>7} " + " ".join(f"{('total' if n == 'seconds' else n):>9}" for n in names))
        for label, row in (("B=1", c["b1"]), (f"B={c['batch']}", c["bn"]), ("gain", c["gain"])):
            print(f"{label:>7} " + " ".join(f"{row[n]:>9.2f}" for n in names))
    b = r.get("compute_bound")
    if b:
        sp = f" = {b['max_speedup_vs_1_client']:.2f} x the 1-client level" if b["max_speedup_vs_1_client"] else ""
        print(f"compute bound at any concurrency: {b['macs_per_generated_token'] / 1e6:.0f} M MAC per generated token "
              f"(its share of the prompt's rows included) at the int8 roof of {b['int8_roof_gmacs']:.0f} G MAC/s "
              f"-> at most {b['max_aggregate_tps']:.1f} generated tok/s aggregate{sp}")


def add_parser(bsub) -> None:
    s = bsub.add_parser("serve", help="lowbit serve under 1, 4, 16 concurrent clients (loopback)",
                        description=__doc__.split("\n\n")[0] + " Bounded: a fixed number of requests per level.")
    src = s.add_mutually_exclusive_group()
    src.add_argument("-m", "--model", help="model dir, HF folder or GGUF (default: --shape bitnet-0.7b)")
    src.add_argument("--shape", choices=sorted(MODEL_SHAPES), help="a model shape with random weights (default bitnet-0.7b)")
    s.add_argument("--format", default="ternary", help="weight format of the decoder linears (default ternary)")
    s.add_argument("--layers", type=int, default=None, help="override the number of layers of --shape")
    s.add_argument("-t", "--threads", type=int, default=None, help="kernel threads (default: physical cores)")
    s.add_argument("--clients", default="1,4,16", help="concurrency levels, comma-separated (default 1,4,16)")
    s.add_argument("--requests", type=int, default=48, help="requests per level (default 48; the issue's figure: 200)")
    s.add_argument("-p", "--prompt-tokens", type=int, default=32, help="prompt length in tokens (default 32)")
    s.add_argument("-n", "--gen-tokens", type=int, default=32, help="tokens generated per request (default 32)")
    s.add_argument("--max-batch", type=int, default=None, help="server batch size (default: the most clients)")
    s.add_argument("--kv-cache", choices=tuple(KV_TYPES), default=None,
                   help="what the KV cache holds (default: the model's, f16 for a quantized one)")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds per request before it counts as failed")
    s.add_argument("--prompt-pool", type=int, default=0,
                   help="cycle the requests through N random prompts, so cached prefixes are re-used (default 0: "
                        "every request its own prompt, every level the same prefill per request)")
    s.add_argument("--sequential", action="store_true",
                   help="run each level whole, one after another (default: every level but the last in two halves, "
                        "before and after the last, so the host's drift over the run weighs the same on every level)")
    s.add_argument("--clients-in-process", action="store_true",
                   help="run the clients in the server's process (the old way: they share its GIL, and the engine "
                        "waits for it between steps) instead of a load generator process")
    s.add_argument("--profile", action="store_true",
                   help="per engine step: the native step's parts, the engine's Python, idle time, HTTP CPU (per "
                        "level); then the native step alone at 1 row vs max-batch rows (the kernels' bound)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=main)


def main(args) -> int:
    from lowbit.api import LLM

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError("--threads must be >= 1")
        lowbit.set_threads(args.threads)
    try:
        clients = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--clients must be comma-separated integers, got {args.clients!r}") from None
    ctx = args.prompt_tokens + args.gen_tokens + 1
    if args.model:
        llm = lowbit.load(args.model, format=args.format, max_context=max(ctx, 16), kv_cache=args.kv_cache)
        label = str(args.model)
    else:
        from lowbit.bench.e2e import shape_model

        shape = args.shape or "bitnet-0.7b"
        model, _ = shape_model(shape, args.format, layers=args.layers, max_context=ctx)
        if args.kv_cache:
            model.set_kv_cache(args.kv_cache)
        llm = LLM(model, IdTokenizer(model.args.vocab_size))
        label = f"{shape} ({args.format}, random weights{f', {args.layers} layers' if args.layers else ''})"
    label += f", {llm.model.kv_cache} KV cache"
    res = bench(llm, clients, args.requests, args.prompt_tokens, args.gen_tokens, args.max_batch, args.timeout,
                label=label, prompt_pool=args.prompt_pool, profile=args.profile, sandwich=not args.sequential,
                in_process=args.clients_in_process)
    if args.json:
        print_json(res)
    else:
        print_result(res)
    return 0 if all(lv["failed"] == 0 and lv["lost"] == 0 for lv in res["levels"]) else 1
