"""The load generator of `lowbit bench serve`, run in a process of its own.

    python -m lowbit.bench.serve_client < job.json > result.json

job: {"url": base URL, "clients": concurrent clients, "prompts": [[token ids], ...], "gen_tokens": n,
"timeout": seconds}. Streams one /v1/completions request per prompt, `clients` at a time, and prints
{"results": [per request], "wall": seconds, "cpu": this process's CPU seconds while it ran}.

Why a process: in the server's process the clients' asyncio loop holds the GIL while it parses the
events of 16 streams, and the engine thread, which needs the GIL between two native steps, waits for it
with both cores idle; a real client is another process, usually on another machine.

Why plain asyncio streams instead of an HTTP library: on a 2-core machine the generator's CPU is taken from
the server's. httpx spent ~0.2 ms of CPU an event (~3 ms a 16-row step); this client, one keep-alive
HTTP/1.1 connection per client reading the chunked SSE body itself, a small fraction of that.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from urllib.parse import urlsplit


class HttpError(Exception):
    pass


class Connection:
    """One keep-alive HTTP/1.1 connection to the server (reopened when the server closes it)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None

    async def post_stream(self, path: str, body: bytes):
        """POST body -> (status, an async iterator over the response body's pieces)."""
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise HttpError("the server closed the connection")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise HttpError(f"bad status line {status_line[:80]!r}")
        status = int(parts[1])
        chunked, length, close = False, None, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = value == b"close"
        return status, self._body(chunked, length, close)

    async def _body(self, chunked: bool, length: int | None, close: bool):
        r = self.reader
        if chunked:
            while True:
                size = int((await r.readline()).split(b";", 1)[0], 16)
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    break
                data = await r.readexactly(size + 2)
                yield data[:-2]
        elif length is not None:
            if length:
                yield await r.readexactly(length)
        else:  # until the server closes
            while data := await r.read(65536):
                yield data
            close = True
        if close:
            await self.close()


async def one_request(conn: Connection, path: str, prompt: list[int], gen_tokens: int, timeout: float) -> dict:
    body = json.dumps({"prompt": prompt, "max_tokens": gen_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    t0 = time.perf_counter()
    first = last = None
    usage = None
    done = False

    async def stream():
        nonlocal first, last, usage, done
        status, pieces = await conn.post_stream(path, body)
        if status != 200:
            async for _ in pieces:  # read the error body so the connection can be reused
                pass
            return f"HTTP {status}"
        buf = b""
        async for piece in pieces:
            buf += piece
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                for line in ev.split(b"\n"):
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    msg = json.loads(data)
                    if msg.get("usage"):
                        usage = msg["usage"]
                    if msg.get("choices") and msg["choices"][0].get("text"):
                        last = time.perf_counter()
                        first = first or last
        return None

    try:
        err = await asyncio.wait_for(stream(), timeout)
    except Exception as e:  # timeouts and broken connections count as failures
        await conn.close()
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    if err:
        return {"ok": False, "error": err}
    t1 = time.perf_counter()
    if not done or usage is None or first is None:
        return {"ok": False, "error": "stream ended without [DONE] / usage / text"}
    n = usage["completion_tokens"]
    return {"ok": True, "tokens": n, "prompt_tokens": usage["prompt_tokens"], "ttft": first - t0, "latency": t1 - t0,
            "tps": (n - 1) / (last - first) if n > 1 and last > first else float("nan")}


async def run_clients(base: str, clients: int, prompts: list[list[int]], gen_tokens: int, timeout: float):
    """One request per prompt, `clients` at a time -> (the requests' results, wall seconds)."""
    u = urlsplit(base)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"the load generator speaks plain http://host:port, got {base!r}")
    path = u.path.rstrip("/") + "/v1/completions"
    results: list[dict] = []
    next_i = 0

    async def worker():
        nonlocal next_i
        conn = Connection(u.hostname, u.port or 80)
        try:
            while next_i < len(prompts):
                i = next_i
                next_i += 1
                results.append(await one_request(conn, path, prompts[i], gen_tokens, timeout))
        finally:
            await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return results, time.perf_counter() - t0


def main() -> int:
    job = json.load(sys.stdin)
    cpu0 = time.process_time()
    results, wall = asyncio.run(run_clients(job["url"], job["clients"], job["prompts"], job["gen_tokens"],
                                            job["timeout"]))
    json.dump({"results": results, "wall": wall, "cpu": time.process_time() - cpu0}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
