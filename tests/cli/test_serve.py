"""`lowbit serve` as a user starts it: a subprocess on a free loopback port, polled until healthy (bounded),
one request, then terminated."""
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from lowbit.cli import main  # noqa: E402
from lowbit.serve.server import free_port  # noqa: E402


def test_serve_help(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--max-batch" in out and "127.0.0.1" in out and "/v1/chat/completions" in out


def test_serve_bad_args(tiny_dir, capsys):
    assert main(["serve", "-m", str(tiny_dir), "--max-batch", "0"]) == 1
    assert "--max-batch" in capsys.readouterr().err
    # --default-max-tokens 0 answered every request that did not say with an empty completion (-1: a 500);
    # --max-tokens 0 silently meant "the context"
    for flag in ("--default-max-tokens", "--max-tokens", "--prefill-chunk"):
        assert main(["serve", "-m", str(tiny_dir), flag, "0"]) == 1
        assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err


def test_serve_subprocess(tiny_dir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lowbit", "serve", "-m", str(tiny_dir), "--port", str(port),
                             "--max-batch", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up in 60 s"
            time.sleep(0.2)
        r = httpx.post(url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 5
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
