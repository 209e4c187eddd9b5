"""The benchmark verbs run and report what they promise (speed itself is measured by `lowbit bench`,
never asserted in tests)."""
import json

import numpy as np
import pytest

from lowbit.bench.gemv import random_weight, time_matmul
from lowbit.cli import main


def test_bandwidth_json(capsys):
    assert main(["bench", "bandwidth", "--size-mb", "16", "-t", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["threads"] for r in res] == [1, 2]
    assert all(r["gbps"] > 0 and r["bytes"] == 16 << 20 for r in res)


def test_roof_json_and_table(capsys):
    assert main(["bench", "roof", "-t", "2", "--min-time", "0.01", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["threads"] for r in res] == [1, 2]
    assert all(r["gmacs"] > 0 and r["gmacs_per_thread"] == r["gmacs"] / r["threads"] for r in res)
    assert main(["bench", "roof", "-t", "1", "--min-time", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "int8 compute roof" in out and "G MAC/s" in out
    assert main(["bench", "roof", "--min-time", "0"]) == 1


def test_gemv_table_and_plot(tmp_path, capsys):
    plot = tmp_path / "gemv.png"
    args = ["bench", "gemv", "--models", "mobilellm-1.5b", "--formats", "bf16,ternary", "-t", "1",
            "--rotate-mb", "8", "--min-time", "0.01", "--bandwidth-mb", "16", "--plot", str(plot)]
    assert main(args + ["--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    shapes = {(r["M"], r["K"]) for r in res["rows"]}
    assert shapes == {(1600, 1600), (320, 1600), (4352, 1600), (1600, 4352)}
    for r in res["rows"]:
        assert r["us"] > 0 and r["gbps"] > 0 and 0 < r["bw_fraction"]
        assert (r["speedup_vs_bf16"] == 1.0) == (r["format"] == "bf16")
        assert r["copies"] >= 1
    assert {c["format"] for c in res["in_cache"]} == {"bf16", "ternary"}
    assert plot.stat().st_size > 1000 and res["plot"] == str(plot)
    assert main(args[:-2]) == 0
    out = capsys.readouterr().out
    assert "x bf16" in out and "in-cache throughput" in out and "fork/join" in out


def test_gemm_mode_reports_ops(capsys):
    assert main(["bench", "gemv", "--models", "mobilellm-1.5b", "--formats", "int4", "-n", "8", "-t", "1",
                 "--rotate-mb", "4", "--min-time", "0.01", "--bandwidth-mb", "16", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_tokens"] == 8 and all(r["gops"] > 0 for r in res["rows"])


def test_gemv_token_counts_report_macs_and_per_token_cost(capsys):
    args = ["bench", "gemv", "--models", "bitnet-0.7b", "--formats", "ternary", "--tokens", "1,4", "-t", "1",
            "--rotate-mb", "4", "--min-time", "0.01", "--bandwidth-mb", "16"]
    assert main(args + ["--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tokens"] == [1, 4] and res["int8_roof_gmacs"] > 0
    for r in res["rows"]:
        assert r["gmacs"] == pytest.approx(r["M"] * r["K"] * r["tokens"] / r["us"] / 1e3)
        assert r["roof_fraction"] == r["gmacs"] / res["int8_roof_gmacs"]
        gemv = next(g for g in res["rows"] if g["tokens"] == 1 and (g["M"], g["K"]) == (r["M"], r["K"]))
        assert r["per_token_vs_gemv"] == pytest.approx(gemv["us"] / (r["us"] / r["tokens"]))
    assert {(r["M"], r["K"], r["tokens"]) for r in res["rows"]} == {
        (m, k, n) for m, k in [(1536, 1536), (4096, 1536), (1536, 4096)] for n in (1, 4)}
    assert [(c["format"], c["tokens"]) for c in res["in_cache"]] == [("ternary", 1), ("ternary", 4)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "G MAC/s" in out and "%roof" in out and "x GEMV/tok" in out
    assert main(args[:6] + ["--tokens", "1,x"]) == 1 and "--tokens" in capsys.readouterr().err
    assert main(args[:6] + ["--tokens", "0"]) == 1


def test_rotation_uses_distinct_copies():
    pw = random_weight("ternary", 256, 1024, np.random.default_rng(0))
    r = time_matmul(pw, 1, rotate_bytes=4 * pw.nbytes, min_time=0.001, repeats=1)
    assert r["copies"] == 4


@pytest.mark.parametrize("head, head_bytes", [
    (None, 32000 * 1536 * 6 // 8 + 32000 * 48 * 4),  # the default int6: 6 bits a weight + 2 float16 per 32
    ("int8", 32000 * 1536 + 32000 * 48 * 2),  # int8: a byte per weight + a float16 scale per 32
    ("int4", 32000 * 1536 // 2 + 32000 * 48 * 4),  # int4: half a byte + float16 scale and offset per 32
])
def test_e2e_shape_json(capsys, head, head_bytes):
    args = ["bench", "e2e", "--shape", "bitnet-0.7b", "--layers", "1", "-p", "8", "-n", "4", "-r", "1", "-t", "1"]
    assert main(args + ["--json"] + (["--lm-head-format", head] if head else [])) == 0
    res = json.loads(capsys.readouterr().out)
    b = res["bytes_per_token"]
    assert b["total"] == b["blocks"] + b["lm_head"] + b["kv_cache"] and b["lm_head"] == head_bytes
    assert main(args + ["--json", "--kv-cache", "int8"]) == 0  # K/V rows of 96 int8 values + a float32 scale
    b8 = json.loads(capsys.readouterr().out)["bytes_per_token"]
    assert b8["kv_cache"] * 96 * 2 == b["kv_cache"] * 100
    assert res["model"].startswith(f"bitnet-0.7b (ternary, lm_head {head or 'int6'}")
    assert res["tg_tps"] > 0 and res["pp_tps"] > 0 and 0 < res["roofline_fraction"]
    # one block: q, k, v, o (1536 x 1536) + gate, up, down (1536 x 4096) per token; lm_head once per 8 tokens
    assert res["prefill_macs_per_token"] == 4 * 1536 * 1536 + 3 * 1536 * 4096 + 32000 * 1536 // 8
    c = res["int8_roof_samples"]
    assert len(c) == 2 and res["int8_roof_gmacs"] == max(c) > 0
    assert res["prefill_roof_fraction"] == pytest.approx(
        res["pp_rounds"][0] * res["prefill_macs_per_token"] / (max(c) * 1e9))
    v = res["avx512_roof"]  # the AMX level also reports prefill against the vector (vpdpbusd) roof
    if res["isa"] == "amx":
        assert v["gmacs"] > 0 and v["prefill_fraction"] == pytest.approx(res["pp_tps"] * res["prefill_macs_per_token"] / (v["gmacs"] * 1e9))
    else:
        assert v is None


def test_e2e_profile(capsys):
    args = ["bench", "e2e", "--shape", "bitnet-0.7b", "--layers", "1", "-p", "8", "-n", "4", "-r", "1", "-t", "2"]
    assert main(args + ["--profile", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    p = res["profile"]
    for kind, n in (("decode", 4), ("prefill", 8)):
        row = p[kind]
        assert row["tokens"] == n
        parts = [row[c] for c in ("gemv", "join", "attention", "lm_head", "rest", "python")]
        assert min(parts) >= 0 and row["gemv"] > 0 and row["lm_head"] > 0
        assert sum(parts) == pytest.approx(row["total"], rel=1e-3)
        joins = [row[c] for c in ("join_gemv", "join_attention", "join_lm_head", "join_rest")]
        assert min(joins) >= 0 and sum(joins) == pytest.approx(row["join"], rel=1e-6, abs=1e-9)
    r, d, b = p["decode_rates"], p["decode"], res["bytes_per_token"]  # each part's bytes over its ms (+ its joins)
    assert r["token_gbps"] == pytest.approx(b["total"] / (d["total"] * 1e6), rel=1e-6)
    assert r["gemv_gbps"] == pytest.approx(b["blocks"] / ((d["gemv"] + d["join_gemv"]) * 1e6), rel=1e-6)
    assert r["attention_gbps"] > 0 and r["lm_head_gbps"] > 0
    # against the bandwidth read around the profiled rounds themselves (not the timed rounds' reads)
    reads = p["bandwidth_samples"]
    assert len(reads) == 2 and min(reads) > 0 and r["bandwidth_gbps"] == max(reads)
    assert r["roofline_fraction"] == pytest.approx(r["token_gbps"] / r["bandwidth_gbps"], rel=1e-9)
    assert main(args + ["--profile"]) == 0
    out = capsys.readouterr().out
    assert "decode streams" in out and "attention (KV)" in out and "around the profiled rounds" in out
    assert "join waits" in out and "of which at GEMV ends" in out and "decode tg4" in out and "prefill pp8" in out


def test_bad_arguments_fail_clearly(capsys):
    assert main(["bench", "gemv", "--models", "gpt5"]) == 1
    assert "unknown model shape 'gpt5'" in capsys.readouterr().err


def test_rsr_figures_json_table_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE", str(tmp_path))  # the k autotune cache
    plot = tmp_path / "rsr.png"
    args = ["bench", "rsr", "--min-n", "8", "--max-n", "9", "--shape", "bitnet-0.7b", "--tokens", "32",
            "-t", "1", "--min-time", "0.005"]
    assert main(args + ["--json", "--plot", str(plot)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [(r["n"], r["kind"]) for r in res["fig11"]] == [(256, "binary"), (256, "ternary"), (512, "binary"),
                                                           (512, "ternary")]
    assert all(r["numpy_dot_s"] > 0 and r["numpy_rsr_s"] > 0 and r["numpy_dot_int64_s"] > 0 for r in res["fig11"])
    assert [r["n"] for r in res["fig4"]] == [256, 512]
    assert all(r[key] > 0 for r in res["fig4"] for key in ("rsr_s", "rsrpp_s", "rsrpp_i8_s", "lut_s", "rsrpp_bound_s"))
    assert {(r["M"], r["K"]) for r in res["dense"]} == {(1536, 1536), (4096, 1536), (1536, 4096)}
    assert all(r["N"] == 32 and r["dense_us"] > 0 and r["rsr_us"] > 0 and r["index_bytes"] > 0 for r in res["dense"])
    assert all(r["lut_us"] > 0 and r["lut_bytes"] == 2 * r["M"] * r["K"] // 8 for r in res["dense"])
    assert [r["n"] for r in res["size"]] == [256, 512]
    assert plot.stat().st_size > 1000
    assert main(["bench", "rsr", "--parts", "size", "--min-n", "11", "--max-n", "16"]) == 0
    out = capsys.readouterr().out
    assert "Index size" in out and "2^16" in out


def test_rsr_kscan_reports_cpu_time_per_k(capsys):
    import lowbit
    threads = lowbit.get_threads()
    assert main(["bench", "rsr", "--parts", "kscan", "--min-n", "8", "--max-n", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["kscan"]
    assert [r["k"] for r in rows] == list(range(3, 8))  # eq. 7 at n = 256: k = 6, scanned from 3 to 7
    assert all(r["f32_ns_per_input"] > 0 and r["i8_ns_per_weight"] > 0 for r in rows)
    assert all(r["f32_ns_per_weight"] == pytest.approx(r["f32_ns_per_input"] / r["k"]) for r in rows)  # k rows a block
    assert lowbit.get_threads() == threads  # restored


def test_rsr_gemv_bound_counts_index_bytes_and_memory_operations():
    from lowbit.bench.rsr import MEMOPS_PER_CYCLE, MEMOPS_PER_INPUT, MEMOPS_PER_SEGMENT, rsrpp_gemv_bound
    from lowbit.formats.rsr_index import RSRIndex
    idx = RSRIndex.build(np.zeros((40, 1000), np.uint8), 4, 2, (0.0, 1.0))  # 10 blocks, 16 segments each
    assert idx.nbytes == 10 * (1000 * 2 + 17 * 2)
    b = rsrpp_gemv_bound(idx, dot_s=4 * 40 * 1000 / 1e9, threads=2, mhz=1000.0)  # np.dot at 1 GB/s
    assert b["dot_gb_s"] == pytest.approx(1.0)
    assert b["index_stream_s"] == pytest.approx(idx.nbytes / 1e9)
    ops = 10 * (1000 * MEMOPS_PER_INPUT + 16 * MEMOPS_PER_SEGMENT)
    assert b["port_s"] == pytest.approx(ops / MEMOPS_PER_CYCLE / 2e9)
    assert b["bound_s"] == max(b["port_s"], b["index_stream_s"])
    assert rsrpp_gemv_bound(idx, 1.0, 2, None).keys() == {"index_stream_s", "dot_gb_s", "bound_s"}  # no clock known


def test_rsr_bad_arguments(capsys):
    assert main(["bench", "rsr", "--parts", "fig5"]) == 1
    assert "--parts" in capsys.readouterr().err
    assert main(["bench", "rsr", "--max-n", "17"]) == 1
    assert "max-n" in capsys.readouterr().err


@pytest.mark.parametrize("given, used", [([], "int4"), (["--format", "int2"], "int2")])
def test_e2e_real_model_takes_the_run_default_format(monkeypatch, tmp_path, given, used):
    # a GGUF / HF source is converted as `lowbit run` converts it (int4), not to --shape's ternary default, which
    # would time a model the conversion destroys (SmolLM2-135M: perplexity 1e8) as if it were the default model
    import lowbit.api

    seen = {}

    def fake_load(path, format, **kw):
        seen["format"], seen["path"] = format, path
        raise RuntimeError("stop here")

    monkeypatch.setattr(lowbit.api, "load", fake_load)
    assert main(["bench", "e2e", "-m", str(tmp_path / "m.gguf"), "-r", "1"] + given) != 0  # "lowbit: error: stop here"
    assert seen["format"] == used
    seen.clear()  # no -m and no --shape: the default model (this called a function api.py does not have)
    assert main(["bench", "e2e", "-r", "1"] + given) != 0
    assert seen["format"] == used and seen["path"].name == "SmolLM2-135M-Instruct.Q4_1.gguf"
