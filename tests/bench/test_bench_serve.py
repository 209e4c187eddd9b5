"""`lowbit bench serve` runs its bounded levels against a loopback server and reports every figure
(speed itself is not asserted: it is measured by the benchmark, on a quiet machine)."""
import json

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from lowbit.bench.serve import IdTokenizer, level_order  # noqa: E402
from lowbit.cli import main  # noqa: E402


def test_bench_serve_shape_json(capsys):
    args = ["bench", "serve", "--shape", "bitnet-0.7b", "--layers", "1", "--requests", "6", "-p", "5", "-n", "4",
            "--clients", "1,3", "--profile", "--json"]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["max_batch"] == 3 and [lv["clients"] for lv in res["levels"]] == [1, 3]
    assert res["order"] == [[1, 3], [3, 6], [1, 3]]  # the sandwich: one client's halves around the 3 clients
    for lv in res["levels"]:
        assert lv["completed"] == 6 and lv["failed"] == 0 and lv["lost"] == 0
        assert lv["completion_tokens"] == 6 * 4  # no EOS in a random shape: every request runs to max_tokens
        assert lv["aggregate_tps"] > 0 and lv["per_request_tps_p50"] > 0
        assert lv["prompt_tokens"] == 6 * 5 and lv["aggregate_prompt_tps"] > 0
        p = lv["profile"]  # every prompt and generated token went through some step's rows
        assert p["steps"] >= 4 and p["rows_per_step"] * p["steps"] == pytest.approx(6 * 5 + 6 * 3)
        assert 0 < p["gemv_ms"] < p["native_ms"] <= p["step_ms"] <= p["wall_ms_per_step"] and p["python_ms"] >= 0
        assert p["clients_cpu_ms"] > 0  # the load generator process reports what it spent
        assert 0 < lv["ttft_p50_s"] <= lv["ttft_p95_s"] and lv["ttft_p50_s"] < lv["latency_p50_s"] <= lv["latency_p95_s"]
    assert res["levels"][0]["speedup_vs_1_client"] == 1.0
    c = res["step_ceiling"]  # the native step alone: 3 one-row steps against one 3-row step
    assert c["batch"] == 3 and c["rounds"] >= 1 and c["b1"]["gemv"] > 0 and c["bn"]["seconds"] > c["bn"]["gemv"] > 0
    assert c["gain"]["seconds"] == pytest.approx(3 * c["b1"]["seconds"] / c["bn"]["seconds"])
    b = res["compute_bound"]  # 1 layer of bitnet-0.7b: 4 x 1536^2 + 3 x 1536 x 4096 MACs a row, lm_head 32000 x 1536
    assert b["macs_per_request"] == (5 + 4 - 1) * (4 * 1536 ** 2 + 3 * 1536 * 4096) + 4 * 32000 * 1536
    assert b["int8_roof_gmacs"] > 0 and b["max_aggregate_tps"] == pytest.approx(
        4 * b["int8_roof_gmacs"] * 1e9 / b["macs_per_request"])
    assert b["max_speedup_vs_1_client"] == pytest.approx(b["max_aggregate_tps"] / res["levels"][0]["aggregate_tps"])


def test_bench_serve_clients_in_process(capsys):
    """--clients-in-process: the old load generator (an asyncio loop in the server's process), same figures."""
    args = ["bench", "serve", "--shape", "bitnet-0.7b", "--layers", "1", "--requests", "3", "-p", "4", "-n", "3",
            "--clients", "1,2", "--clients-in-process", "--profile", "--json"]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    for lv in res["levels"]:
        assert lv["completed"] == 3 and lv["failed"] == 0 and lv["lost"] == 0 and lv["completion_tokens"] == 9
        assert lv["profile"]["clients_cpu_ms"] > 0


def test_load_generator_failure_is_reported(monkeypatch):
    """A load generator that dies says why, instead of a level of zeros."""
    from lowbit.bench import serve

    monkeypatch.setattr(serve.sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match="load generator failed"):
        serve.run_clients("http://127.0.0.1:9", 1, [[1, 2]], 2, 5.0)


def test_bench_serve_table_and_bad_args(capsys):
    assert main(["bench", "serve", "--shape", "bitnet-0.7b", "--layers", "1", "--requests", "2", "-p", "3", "-n", "2",
                 "--clients", "1", "--prompt-pool", "1", "--kv-cache", "int8"]) == 0
    out = capsys.readouterr().out
    assert "aggregate tok/s" in out and "TTFT" in out and "prompt tok/s" in out and "int8 KV cache" in out
    assert main(["bench", "serve", "--shape", "bitnet-0.7b", "--layers", "1", "--clients", "1,x"]) == 1
    assert "--clients" in capsys.readouterr().err


def test_id_tokenizer():
    tok = IdTokenizer(10)
    assert tok.decode([1, 22]) == " <1> <22>"
    with pytest.raises(ValueError, match="token ids"):
        tok.encode("text")


def test_level_order():
    assert level_order(3, 10) == [(0, 0, 5), (1, 0, 5), (2, 0, 10), (1, 5, 10), (0, 5, 10)]
    assert level_order(3, 10, sandwich=False) == [(0, 0, 10), (1, 0, 10), (2, 0, 10)]
    assert level_order(1, 10) == [(0, 0, 10)] and level_order(2, 1) == [(0, 0, 1), (1, 0, 1)]
    assert level_order(2, 7) == [(0, 0, 3), (1, 0, 7), (0, 3, 7)]  # every request of every level, once
