"""Crash safety of conversion and of the conversion cache: a conversion killed with SIGKILL at a random point
leaves its destination absent or complete (never half-written), and a cache entry that fails to load is
rebuilt, not trusted."""
import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from lowbit.io.checkpoint import open_checkpoint
from lowbit.io.modeldir import LowbitCheckpoint

from .tiny import random_weights, tiny_config, write_gguf, write_hf

CHILD = textwrap.dedent("""
    import sys, pathlib
    from lowbit.io.convert import convert
    src, out = sys.argv[1], pathlib.Path(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(1000):  # convert again and again (overwrite too) until killed
        convert(src, out / f"m{i % 3}", format="int4", progress=False, shard_bytes=30_000, overwrite=True)
""")


def complete(d: pathlib.Path, ref: dict) -> bool:
    ck = LowbitCheckpoint(d)
    assert ck.tensor_names() == list(ref)
    for name, want in ref.items():
        got = ck.load(name)
        np.testing.assert_array_equal(got.dequantize() if hasattr(got, "dequantize") else got, want, err_msg=name)
    return True


def test_sigkill_at_random_points_leaves_nothing_half_written(tmp_path):
    cfg = tiny_config(hidden_size=128, intermediate_size=256, num_hidden_layers=3, vocab_size=1000)
    src = write_hf(tmp_path / "src", cfg, random_weights(cfg), dtype="f32")
    from lowbit.io.convert import convert
    ref_ck = LowbitCheckpoint(convert(src, tmp_path / "ref", format="int4", progress=False))
    ref = {n: (lambda w: w.dequantize() if hasattr(w, "dequantize") else np.array(w))(ref_ck.load(n))
           for n in ref_ck.tensor_names()}
    rnd = random.Random(0)
    checked = 0
    for trial in range(4):
        out = tmp_path / f"out{trial}"
        out.mkdir()
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(src), str(out)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        p.stdin.write("go\n")
        p.stdin.flush()
        time.sleep(rnd.uniform(0.2, 1.5))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert p.returncode == -signal.SIGKILL
        for i in range(3):
            d = out / f"m{i}"
            if d.exists():  # else absent: fine
                assert complete(d, ref), d
                checked += 1
        # a fresh conversion next to the debris of the killed one works and removes the dead process's temp folders
        convert(src, out / "m0", format="int4", progress=False, overwrite=True)
        assert complete(out / "m0", ref)
        assert [p.name for p in out.iterdir() if p.name.startswith(".m0.")] == []
    assert checked > 0  # some kills came after a whole conversion


def test_damaged_cache_entry_is_rebuilt(tmp_path, monkeypatch):
    import lowbit
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config()
    src = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    first = lowbit.load(src, format="int8", progress=False, warmup=False)
    entry = first.path
    want = first.generate("hello", max_tokens=4)
    for damage in ("truncate", "config", "delete"):
        weights = next(entry.glob("*.safetensors"))
        if damage == "truncate":
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        elif damage == "config":
            (entry / "config.json").write_text("{ not json")
        else:
            weights.unlink()
        with pytest.warns(UserWarning, match="rebuilding"):
            again = lowbit.load(src, format="int8", progress=False, warmup=False)
        assert again.path == entry and again.generate("hello", max_tokens=4) == want
        LowbitCheckpoint(entry)  # whole again
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a sound entry is used as is
        lowbit.load(src, format="int8", progress=False, warmup=False)
