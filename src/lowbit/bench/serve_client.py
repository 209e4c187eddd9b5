"""The load generator of `lowbit bench serve`, run in a process of its own.

    python -m lowbit.bench.serve_client < job.json > result.json

job: {"url": base URL, "clients": concurrent clients, "prompts": [[token ids], ...], "gen_tokens": n,
"timeout": seconds}. Streams one /v1/completions request per prompt, `clients` at a time, and prints
{"results": [per request], "wall": seconds, "cpu": this process's CPU seconds while it ran}.

Why a process: in the server's process the clients' asyncio loop holds the GIL while it parses the
events of 16 streams (~0.2 ms each), and the engine thread, which needs the GIL between two native steps,
waits for it with both cores idle; a real client is another process, usually on another machine.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time


async def one_request(client, url: str, prompt: list[int], gen_tokens: int, timeout: float) -> dict:
    body = {"prompt": prompt, "max_tokens": gen_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    usage = None
    done = False
    try:
        async with client.stream("POST", url, json=body, timeout=timeout) as r:
            if r.status_code != 200:
                return {"ok": False, "error": f"HTTP {r.status_code}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                ev = json.loads(data)
                if ev.get("usage"):
                    usage = ev["usage"]
                if ev.get("choices") and ev["choices"][0].get("text"):
                    last = time.perf_counter()
                    first = first or last
    except Exception as e:  # timeouts and broken connections count as failures
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    t1 = time.perf_counter()
    if not done or usage is None or first is None:
        return {"ok": False, "error": "stream ended without [DONE] / usage / text"}
    n = usage["completion_tokens"]
    return {"ok": True, "tokens": n, "prompt_tokens": usage["prompt_tokens"], "ttft": first - t0, "latency": t1 - t0,
            "tps": (n - 1) / (last - first) if n > 1 and last > first else float("nan")}


async def run_clients(base: str, clients: int, prompts: list[list[int]], gen_tokens: int, timeout: float):
    """One request per prompt, `clients` at a time -> (the requests' results, wall seconds)."""
    import httpx

    results: list[dict] = []
    next_i = 0

    async def worker(client):
        nonlocal next_i
        while next_i < len(prompts):
            i = next_i
            next_i += 1
            results.append(await one_request(client, base + "/v1/completions", prompts[i], gen_tokens, timeout))

    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return results, wall


def main() -> int:
    job = json.load(sys.stdin)
    cpu0 = time.process_time()
    results, wall = asyncio.run(run_clients(job["url"], job["clients"], job["prompts"], job["gen_tokens"],
                                            job["timeout"]))
    json.dump({"results": results, "wall": wall, "cpu": time.process_time() - cpu0}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
