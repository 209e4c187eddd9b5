"""`lowbit serve` over real HTTP on 127.0.0.1 (a free port, the server in a background thread, stopped at the
end): non-streaming and streaming completions and chat with httpx and the official `openai` client,
concurrent requests equal to one-at-a-time output (greedy), bad requests, queue limit, disconnects.
Every wait is bounded."""
import json
import threading
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import lowbit  # noqa: E402
from lowbit.serve import Server  # noqa: E402
from tests.cli.conftest import write_tiny_dir  # noqa: E402

PROMPTS = ["The quick brown", "A tiny model", "Numbers 0123", "fox", "lazy dog. A", "punctuation, too!"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return lowbit.load(write_tiny_dir(tmp_path_factory.mktemp("serve") / "tiny"))


@pytest.fixture(scope="module")
def server(llm):
    srv = Server(llm, port=0, max_batch=4, max_tokens=200, max_queue=16).start()
    yield srv
    srv.stop()
    assert not srv.worker.alive


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def sse_events(lines) -> list:
    """The JSON objects of an SSE stream; asserts it ends with data: [DONE]."""
    data = [ln[len("data: "):] for ln in lines if ln.startswith("data: ")]
    assert data and data[-1] == "[DONE]", data[-3:]
    return [json.loads(d) for d in data[:-1]]


def test_health_and_models(client, server):
    h = client.get("/health")
    assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["max_batch"] == 4
    m = client.get("/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == server.model_id == "tiny"


def test_completion_equals_local_generate(client, llm):
    r = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    want = llm.generate(PROMPTS[0], max_tokens=12)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == want
    n = len(llm.tokenizer.encode(PROMPTS[0]))
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": 12, "total_tokens": n + 12}
    assert body["choices"][0]["finish_reason"] == "length"


def test_streaming_completion_and_chat(client, llm):
    with client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 10, "temperature": 0,
                                                         "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        ev = sse_events(list(r.iter_lines()))
    text = "".join(e["choices"][0]["text"] for e in ev if e["choices"])
    assert text == llm.generate(PROMPTS[1], max_tokens=10)
    assert ev[-2]["choices"][0]["finish_reason"] == "length" and ev[-1]["usage"]["completion_tokens"] == 10
    msgs = [{"role": "user", "content": "hi"}]
    with client.stream("POST", "/v1/chat/completions",
                       json={"messages": msgs, "max_tokens": 9, "temperature": 0, "stream": True}) as r:
        ev = sse_events(list(r.iter_lines()))
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant" and ev[0]["object"] == "chat.completion.chunk"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev)
    assert text == llm.chat(msgs, max_tokens=9) and ev[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" not in ev[-1]


def test_openai_client(server, llm):
    openai = pytest.importorskip("openai")
    oc = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox?"}]
    want = llm.chat(msgs, max_tokens=8)
    r = oc.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == want and r.usage.completion_tokens == 8
    parts = [c.choices[0].delta.content or "" for c in
             oc.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True)
             if c.choices]
    assert "".join(parts) == want
    c = oc.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0, stop=["\n"])
    assert c.choices[0].text == llm.generate(PROMPTS[2], max_tokens=6, stop=["\n"])
    assert [m.id for m in oc.models.list()] == ["tiny"]
    with pytest.raises(openai.BadRequestError, match="temperature"):
        oc.chat.completions.create(model="tiny", messages=msgs, temperature=5)


def test_concurrent_requests_equal_sequential(server, llm):
    """More requests than slots, from threads at once: each answer equals the model's one-at-a-time answer
    (greedy), with seeded sampling too."""
    want = [llm.generate(p, max_tokens=16) for p in PROMPTS]
    want_sampled = [llm.generate(p, max_tokens=16, temperature=0.8, top_p=0.9, seed=i) for i, p in enumerate(PROMPTS)]
    got, errors = {}, []

    def ask(i, sampled):
        body = {"prompt": PROMPTS[i], "max_tokens": 16, "temperature": 0}
        if sampled:
            body.update(temperature=0.8, top_p=0.9, seed=i)
        try:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                r = c.post("/v1/completions", json=body)
                got[(i, sampled)] = r.json()["choices"][0]["text"]
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i, s)) for i in range(len(PROMPTS)) for s in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(got) == 2 * len(PROMPTS)
    assert [got[(i, False)] for i in range(len(PROMPTS))] == want
    assert [got[(i, True)] for i in range(len(PROMPTS))] == want_sampled
    assert server.engine.steps > 0 and not server.engine.active


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/completions", b'{"max_tokens": 4}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": ""}', 400, "empty"),
    ("/v1/completions", b'{"prompt": [1, -5]}', 400, "token ids"),
    ("/v1/completions", b'{"prompt": [1, 100000]}', 400, "token ids"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 100000}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "ten"}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": -1}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "top_p": -0.1}', 400, "'top_p' must be in [0.0, 1.0]"),
    ("/v1/completions", b'{"prompt": "hi", "top_p": 1.5}', 400, "'top_p' must be in [0.0, 1.0]"),
    ("/v1/completions", b'{"prompt": "hi", "n": 2}', 400, "'n'"),
    ("/v1/completions", b'{"prompt": "hi", "logprobs": 3}', 400, "logprobs"),
    ("/v1/completions", b'{"prompt": "hi", "stop": [1]}', 400, "stop"),
    ("/v1/completions", b'{"prompt": "hi", "stream": "yes"}', 400, "stream"),
    ("/v1/completions", b'{"prompt": "hi", "seed": 1.5}', 400, "seed"),
    # silently ignored before: the answer was not what the client asked for
    ("/v1/completions", b'{"prompt": "hi", "presence_penalty": 1.5}', 400, "presence_penalty"),
    ("/v1/completions", b'{"prompt": "hi", "frequency_penalty": 0.5}', 400, "frequency_penalty"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "response_format": '
                             b'{"type": "json_object"}}', 400, "response_format"),
    ("/v1/completions", b'{"prompt": "hi", "stream": true, "stream_options": {"include_usage": "no"}}', 400,
     "include_usage"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', 400, "content"),
    ("/v1/chat/completions", b'{"messages": "hi"}', 400, "messages"),
    ("/v1/nothing", b"{}", 404, "Not Found"),
])
def test_bad_requests(client, path, body, status, needle):
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_default_openai_values_are_accepted(client):
    body = {"prompt": "hi", "max_tokens": 2, "presence_penalty": 0, "frequency_penalty": 0.0,
            "response_format": {"type": "text"}}
    assert client.post("/v1/completions", json=body).status_code == 200


def test_top_p_zero_is_the_most_likely_token(client, llm):
    # top_p 0 was a 400 ("must be in (0.0, 1.0]"); OpenAI allows [0, 1], and 0 keeps the most likely token alone
    body = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 1.5, "top_p": 0, "seed": 3}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == llm.generate(PROMPTS[0], max_tokens=8, temperature=0)


def test_server_limits_checked(llm):
    with pytest.raises(ValueError, match="default_max_tokens must be >= 1"):
        Server(llm, port=0, default_max_tokens=0)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        Server(llm, port=0, max_tokens=0)


def test_deeply_nested_json_is_a_400(client):
    r = client.post("/v1/completions", content=b"[" * 100000 + b"]" * 100000)
    assert r.status_code == 400, r.text[:300]


def test_limits_and_survival(client, server):
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 40  # > 256 tokens of context
    r = client.post("/v1/completions", json={"prompt": long_prompt})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # an explicit max_tokens past what the context leaves was cut short silently (finish_reason "length")
    prompt = "The quick brown fox jumps over the lazy dog. " * 10
    n = len(server.llm.tokenizer.encode(prompt))
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 256 - n + 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert f"ask for at most {256 - n}" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 256 - n, "temperature": 0})
    assert r.status_code == 200, r.text
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == n
    assert client.get("/v1/completions").status_code == 405
    r = client.post("/v1/completions", content=b"x" * (5 << 20))
    assert r.status_code == 413
    assert client.get("/health").json()["status"] == "ok"  # still serving
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def _gate_engine(srv, delay: float):
    """Slows every engine step by `delay` s (so a generation outlives the client)."""
    step = srv.engine.step

    def slow():
        time.sleep(delay)
        return step()

    srv.engine.step = slow
    return step


def wait_until(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_disconnect_cancels(server):
    seqs = []
    submit = server.worker.submit
    server.worker.submit = lambda *a: seqs.append(submit(*a)) or seqs[-1]
    step = _gate_engine(server, 0.05)  # the greedy answers take 2.7 s and more: the clients leave first
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:  # streaming: close after the first chunk
            body = {"prompt": "fox", "max_tokens": 200, "temperature": 0, "stream": True}  # greedy: ~75 tokens
            with c.stream("POST", "/v1/completions", json=body) as r:
                next(r.iter_lines())
        assert wait_until(lambda: seqs and seqs[-1].done)
        assert seqs[-1].finish_reason == "cancelled" and len(seqs[-1].tokens) < 200
        with httpx.Client(base_url=server.url, timeout=0.5) as c:  # non-streaming: the client times out
            try:
                r = c.post("/v1/completions", json={"prompt": "dog", "max_tokens": 200, "temperature": 0})  # ~54
                pytest.fail(f"answered before the client gave up: {r.status_code} {r.text[:300]}")
            except httpx.TimeoutException:
                pass
        assert wait_until(lambda: len(seqs) == 2 and seqs[-1].done)
        assert seqs[-1].finish_reason == "cancelled" and len(seqs[-1].tokens) < 200
    finally:
        server.engine.step = step
        server.worker.submit = submit
    assert wait_until(lambda: not server.engine.active and not server.engine.queued())


def test_queue_full_gets_429(llm):
    with Server(llm, port=0, max_batch=1, max_queue=1) as srv:
        gate = threading.Event()
        step = srv.engine.step
        srv.engine.step = lambda: gate.wait(10) and step()
        results = []

        def ask():
            with httpx.Client(base_url=srv.url, timeout=30) as c:
                results.append(c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code)

        t = threading.Thread(target=ask)
        t.start()
        assert wait_until(lambda: srv.engine.queued() == 1)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 429 and "busy" in r.json()["error"]["message"]
        gate.set()
        t.join(30)
        assert results == [200]


def test_random_bodies_never_500(client):
    """Random values in every field: each answer is a 200 or a 4xx with an OpenAI-shaped error, never a 500,
    and the server keeps serving."""
    rng = np.random.default_rng(0)
    values = [None, True, 0, 1, -1, 3, 2.5, -0.5, 1e309, "x", "", [], [1], ["a", "b"], [[1, 2]], {}, {"a": 1},
              [{"role": "user", "content": "hi"}], [{"role": "user"}], [{"content": "x"}], "\ud800", 10**30]
    fields = ["prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
              "min_p", "stop", "seed", "stream", "n", "stream_options", "model", "logprobs", "repetition_penalty"]
    seen = set()
    for i in range(60):
        path = "/v1/chat/completions" if i % 2 else "/v1/completions"
        body = {"messages": [{"role": "user", "content": "hi"}]} if i % 2 else {"prompt": "hi"}
        body["max_tokens"] = 2  # keep the valid ones short
        n_bad = rng.integers(0, 3) if i % 4 < 2 else rng.integers(3, 7)
        body.update({f: values[rng.integers(len(values))] for f in rng.choice(fields, size=n_bad, replace=False)})
        r = client.post(path, content=json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass"),
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 200 or 400 <= r.status_code < 500, (body, r.status_code, r.text[:200])
        seen.add(r.status_code)
        if r.status_code != 200:
            assert isinstance(r.json()["error"]["message"], str)
        elif not body.get("stream"):
            assert r.json()["usage"]["completion_tokens"] <= 2 or "max_tokens" not in body
    assert seen == {200, 400}  # both valid and invalid bodies were drawn
    assert client.get("/health").json()["status"] == "ok"


def test_int8_kv_cache_server_equals_local(tmp_path):
    """A server whose slots hold an int8 KV cache answers concurrent requests as the same model one at a time."""
    llm = lowbit.load(write_tiny_dir(tmp_path / "tiny"), kv_cache="int8")
    want = [llm.generate(p, max_tokens=12) for p in PROMPTS[:4]]
    with Server(llm, port=0, max_batch=4) as srv:
        assert srv.engine.runner.cache.k.dtype == np.int8  # the slots
        got = [None] * 4

        def ask(i):
            with httpx.Client(base_url=srv.url, timeout=60) as c:
                got[i] = c.post("/v1/completions", json={"prompt": PROMPTS[i], "max_tokens": 12, "temperature": 0}).json()
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert [g["choices"][0]["text"] for g in got] == want
