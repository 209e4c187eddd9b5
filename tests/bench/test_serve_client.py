"""The load generator's own HTTP/1.1 client (bench/serve_client.py) against a scripted asyncio server: chunked
SSE streams over one keep-alive connection, error statuses, a server that hangs up mid-stream, timeouts."""
import asyncio
import json

from lowbit.bench.serve_client import run_clients


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _stream(n: int, split: int = 7) -> bytes:
    """n text events, the usage event and [DONE], in chunks of `split` bytes (events cut across chunks)."""
    body = b"".join(_event({"choices": [{"text": f"t{i}"}]}) for i in range(n))
    body += _event({"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": 2}}) + b"data: [DONE]\n\n"
    out = b""
    for i in range(0, len(body), split):
        piece = body[i:i + split]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


async def _serve(handler):
    """A server whose handler(request number, body) returns the raw response bytes (None: hang up)."""
    stats = {"connections": 0, "requests": 0}

    async def conn(reader, writer):
        stats["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                body = json.loads(await reader.readexactly(length))
                stats["requests"] += 1
                out = await handler(stats["requests"], body)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(conn, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", stats


def _run(handler, clients, prompts, gen_tokens=3, timeout=5.0):
    async def go():
        server, url, stats = await _serve(handler)
        async with server:
            res, wall = await run_clients(url, clients, prompts, gen_tokens, timeout)
        return res, wall, stats

    return asyncio.run(go())


def test_streams_over_keepalive_connections():
    async def handler(i, body):
        assert body["stream"] and body["max_tokens"] == 3
        return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + _stream(3)

    res, wall, stats = _run(handler, 2, [[1, 2]] * 6)
    assert len(res) == 6 and all(r["ok"] and r["tokens"] == 3 and r["prompt_tokens"] == 2 for r in res)
    assert all(0 < r["ttft"] <= r["latency"] for r in res) and wall > 0
    assert stats == {"connections": 2, "requests": 6}  # one connection per client, reused


def test_error_status_and_reuse_after_it():
    async def handler(i, body):
        if i % 2:
            err = b'{"error": {"message": "bad"}}'
            return b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n%s" % (len(err), err)
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _stream(2)

    res, _, stats = _run(handler, 1, [[1]] * 4)
    assert [r["ok"] for r in res] == [False, True, False, True]
    assert res[0]["error"] == "HTTP 400" and stats["connections"] == 1


def test_hang_up_and_timeout_are_failures_and_the_next_request_reconnects():
    async def handler(i, body):
        if i == 1:
            return None  # closes without an answer
        if i == 2:  # half a stream, then nothing: the timeout
            await asyncio.sleep(0.05)
            return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _stream(2)[:40]
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _stream(2)

    res, _, stats = _run(handler, 1, [[1]] * 3, timeout=0.5)
    assert not res[0]["ok"] and "closed" in res[0]["error"]
    assert not res[1]["ok"] and "Timeout" in res[1]["error"]
    assert res[2]["ok"] and res[2]["tokens"] == 2 and stats["connections"] == 3


def test_stream_without_done_is_a_failure():
    async def handler(i, body):
        body = _event({"choices": [{"text": "x"}]})
        chunk = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk

    res, _, _ = _run(handler, 1, [[1]])
    assert not res[0]["ok"] and "[DONE]" in res[0]["error"]
