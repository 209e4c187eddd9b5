"""lowbit bench llamacpp: the ternary-valued F16 GGUF it writes, its llama-quantize / llama-bench plumbing (with
stand-in executables: CI has no llama.cpp) and, when $LLAMACPP_BIN holds the real tools, one tiny real run."""
import json
import os
import pathlib
import re
import stat
import sys

import numpy as np
import pytest

from lowbit.bench import llamacpp
from lowbit.cli import main
from lowbit.io.checkpoint import open_checkpoint

FAKE_QUANTIZE = """\
import shutil, sys
args = sys.argv[1:]
assert args[0] == "--output-tensor-type" and args[1] in ("q8_0", "q4_1"), args
shutil.copyfile(args[2], args[3])  # stands in for the quantization: lowbit then converts the F16 copy
"""
FAKE_BENCH = """\
import json, sys
a = sys.argv[1:]
p, n, t = int(a[a.index("-p") + 1]), int(a[a.index("-n") + 1]), int(a[a.index("-t") + 1])
assert a[a.index("-o") + 1] == "json" and a[a.index("-m") + 1].endswith(".gguf")
print(json.dumps([{"n_prompt": p, "n_gen": 0, "n_threads": t, "avg_ts": 100.0 * t, "stddev_ts": 1.0},
                  {"n_prompt": 0, "n_gen": n, "n_threads": t, "avg_ts": 10.0 * t, "stddev_ts": 0.5}]))
"""


def _exe(path: pathlib.Path, body: str) -> pathlib.Path:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def tools(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))
    _exe(tmp_path / "llama-quantize", FAKE_QUANTIZE)
    return _exe(tmp_path / "llama-bench", FAKE_BENCH)


def test_ternary_gguf_is_llama_with_ternary_weights(tmp_path):
    path = llamacpp.write_ternary_gguf(tmp_path / "t.gguf", "tiny", layers=1)
    ck = open_checkpoint(path)
    assert ck.config["model_type"] == "llama" and ck.config["num_hidden_layers"] == 1
    names = ck.tensor_names()
    assert "lm_head.weight" in names  # untied: llama.cpp and lowbit both read output.weight
    for name in names:
        w = np.asarray(ck.load(name), np.float32)
        if w.ndim == 2:
            s = np.abs(w).max()
            assert s > 0 and set(np.unique(np.round(w / s)).tolist()) == {-1.0, 0.0, 1.0}
            assert np.allclose(np.abs(w)[w != 0], s)
    import gguf

    fields = gguf.GGUFReader(str(path)).fields  # llama.cpp refuses a gpt2 vocabulary without merges
    assert fields["general.architecture"].contents() == "llama" and fields["tokenizer.ggml.merges"].contents()
    mtime = path.stat().st_mtime_ns
    assert llamacpp.write_ternary_gguf(path, "tiny", layers=1).stat().st_mtime_ns == mtime  # written once


def test_llama_bench_json_parsed(tools, tmp_path):
    r = llamacpp.llama_bench(tools, tmp_path / "x.gguf", 2, 16, 8, 1)
    assert r == {"pp_tps": 200.0, "pp_sd": 1.0, "tg_tps": 20.0, "tg_sd": 0.5}


def test_run_alternates_both_sides(tools, tmp_path, capsys):
    rc = main(["bench", "llamacpp", "--llama-bench", str(tools), "--shape", "tiny", "--layers", "1", "--types", "Q4_0",
               "-t", "1,2", "-p", "8", "-n", "4", "-r", "1", "--rounds", "2", "--workdir", str(tmp_path / "w"),
               "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["output_type"] == "q8_0"
    rows = {(r["threads"], r["side"]): r for r in res["rows"]}
    assert set(rows) == {(1, "lowbit"), (1, "llama.cpp"), (2, "lowbit"), (2, "llama.cpp")}
    assert rows[(2, "llama.cpp")]["tg_rounds"] == [20.0, 20.0] and rows[(1, "llama.cpp")]["pp_tps"] == 100.0
    assert rows[(1, "lowbit")]["lowbit_format"] == "int4" and len(rows[(1, "lowbit")]["pp_rounds"]) == 2
    assert all(r["pp_tps"] > 0 and r["tg_tps"] > 0 for r in res["rows"])
    assert pathlib.Path(res["ggufs"]["Q4_0"]).name.endswith("-Q4_0-q8_0.gguf")


def test_run_on_a_given_gguf(tools, tmp_path, capsys):
    # -m: llama.cpp reads the file as it is; lowbit converts it as the blocks' type maps (F16 -> the default int4)
    # and keeps the lm_head that reads the output matrix's bytes where one does (F16: none, convert's default)
    gguf = llamacpp.write_ternary_gguf(tmp_path / "given.gguf", "tiny", layers=1)
    assert llamacpp.gguf_types(gguf) == ("F16", "F16")
    rc = main(["bench", "llamacpp", "--llama-bench", str(tools), "-m", str(gguf), "-t", "1", "-p", "8", "-n", "4",
               "-r", "1", "--rounds", "1", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["model"] == str(gguf) and res["output_type"] == "F16" and res["lm_head_format"] is None
    rows = {r["side"]: r for r in res["rows"]}
    assert rows["lowbit"]["type"] == "F16 (file)" and rows["lowbit"]["lowbit_format"] == "int4"
    assert rows["llama.cpp"]["pp_tps"] == 100.0 and rows["lowbit"]["tg_tps"] > 0
    assert main(["bench", "llamacpp", "--llama-bench", str(tools), "-m", str(gguf), "--format", "int8", "-t", "1",
                 "-p", "8", "-n", "4", "-r", "1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "given.gguf" in out and re.search(r"F16 \(file\)\s+1\s+lowbit\s+int8\s", out)


def test_default_model_types():
    from lowbit.cli._common import default_model

    # SmolLM2-135M-Instruct's GGUF: Q4_1 blocks, a tied Q8_0 embedding as the output (lowbit's int8 lm_head bytes)
    block, head = llamacpp.gguf_types(default_model())
    assert (block, head) == ("Q4_1", "Q8_0") and llamacpp.HEAD_FORMAT[head] == "int8"


def test_bad_input_named(tools, tmp_path):
    with pytest.raises(FileNotFoundError, match="llama-bench"):
        llamacpp.run(tmp_path / "nope" / "llama-bench")
    with pytest.raises(ValueError, match="Q3_K"):
        llamacpp.run(tools, types=("Q3_K",))
    with pytest.raises(FileNotFoundError, match="no such GGUF"):
        llamacpp.run(tools, model=tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="shape"):
        llamacpp.shape_config("no-such-shape")
    broken = _exe(tmp_path / "broken-bench", "import sys; sys.exit('no model')")
    with pytest.raises(RuntimeError, match="llama-bench failed"):
        llamacpp.llama_bench(broken, tmp_path / "x.gguf", 1, 8, 4, 1)


@pytest.mark.skipif(not os.environ.get("LLAMACPP_BIN"), reason="set LLAMACPP_BIN to llama.cpp's bin folder "
                    "(bash scripts/llamacpp.sh) to run llama-quantize and llama-bench for real")
def test_real_llamacpp_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path / "cache"))
    exe = pathlib.Path(os.environ["LLAMACPP_BIN"]) / "llama-bench"
    res = llamacpp.run(exe, shape="tiny", layers=1, types=("Q4_0",), threads=(1,), prompt_tokens=8, gen_tokens=4,
                       repeats=1, rounds=1, workdir=tmp_path / "w", log=lambda s: None)
    assert {r["side"] for r in res["rows"]} == {"lowbit", "llama.cpp"}
    assert all(r["pp_tps"] > 0 and r["tg_tps"] > 0 for r in res["rows"])
