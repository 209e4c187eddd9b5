"""The OpenAI-compatible HTTP app (Starlette): /v1/chat/completions, /v1/completions, /v1/models, /health.

One engine thread (EngineWorker) owns the model and runs the continuous-batching engine
(generate/batch.py); request handlers only validate, tokenize, submit, and relay text pieces from the
engine thread to the client through an asyncio queue. A client that disconnects cancels its sequence
at the next token boundary. Errors are OpenAI-shaped JSON: 400 bad request, 404/405 unknown route or
method, 413 body too large, 429 queue full, 500 generation failure; the server keeps running.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from lowbit.generate.batch import BatchEngine, Sequence
from lowbit.serve import protocol
from lowbit.serve.protocol import Job, Limits, RequestError

log = logging.getLogger("lowbit.serve")
MAX_BODY_BYTES = 4 << 20
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


class EngineWorker:
    """The thread that owns the model: steps the engine while there is work, sleeps when idle."""

    def __init__(self, engine: BatchEngine, max_queue: int = 64):
        self.engine = engine
        self.max_queue = max_queue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lowbit-engine", daemon=True)
        self.failures = 0
        self._out: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue, tuple]] = []  # this step's pieces and ends

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.engine.wake()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            if not eng.has_work():
                eng.wait_for_work(0.5)
                continue
            try:
                eng.step()
            except Exception:  # a bug, not bad input: end what is running and keep serving
                self.failures += 1
                log.exception("engine step failed")
                eng.fail_all(RuntimeError("the engine failed while running this request"))
            self._flush()
        eng.fail_all(None)  # shutting down: release every waiting client
        self._flush()

    def _flush(self) -> None:
        """Hands the step's pieces to the event loop(s): one wake-up per loop per step, not one per token."""
        if not self._out:
            return
        by_loop: dict = {}
        for loop, queue, item in self._out:
            by_loop.setdefault(loop, []).append((queue, item))
        self._out = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the event loop is gone (shutdown)
                pass

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> Sequence:
        """Queues the job; its text pieces (streaming jobs only) and its end arrive on `queue` as
        ("piece", str) and ("done", None)."""
        if self.engine.queued() >= self.max_queue:
            raise RequestError(f"the server is busy: {self.max_queue} requests are already waiting; retry later",
                               status=429, code="queue_full", type="server_busy")

        def put(item):  # on the engine's thread; delivered after the step (_flush)
            self._out.append((loop, queue, item))

        on_piece = (lambda s, p: put(("piece", p))) if job.stream else None
        return self.engine.submit(job.prompt_ids, max_tokens=job.max_tokens, params=job.params, stop=job.stop,
                                  on_piece=on_piece, on_done=lambda s: put(("done", None)))


def _deliver(items) -> None:
    for queue, item in items:
        queue.put_nowait(item)


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _read_json(request: Request):
    n = request.headers.get("content-length")
    if n is not None and n.isdigit() and int(n) > MAX_BODY_BYTES:
        raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes", status=413)
    raw = b""
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes", status=413)
    try:
        return json.loads(raw)
    except RecursionError:
        raise RequestError("the request body is nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from None


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def build_app(llm, worker: EngineWorker, limits: Limits, model_id: str) -> Starlette:
    tokenizer = llm.tokenizer
    started = int(time.time())

    async def health(request: Request):
        ok = worker.alive
        eng = worker.engine
        return JSONResponse({"status": "ok" if ok else "engine stopped", "running": len(eng.active),
                             "waiting": eng.queued(), "max_batch": eng.max_batch},
                            status_code=200 if ok else 503)

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": model_id, "object": "model", "created": started, "owned_by": "lowbit",
             "max_context": limits.max_context}]})

    async def generate(request: Request, kind: str):
        try:
            body = await _read_json(request)
            job = protocol.parse_job(kind, body, tokenizer, limits, model_id)
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            seq = worker.submit(job, loop, queue)
        except RequestError as e:
            return _error(e)
        if job.stream:
            return StreamingResponse(_stream(job, seq, queue), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:  # non-streaming: only the end is queued; poll the connection meanwhile
            while True:
                try:
                    await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                    break
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        seq.cancel()
                        worker.engine.wake()
                        return JSONResponse(protocol.error_body("client disconnected"), status_code=499)
        except asyncio.CancelledError:
            seq.cancel()
            raise
        if seq.finish_reason == "error":
            return JSONResponse(protocol.error_body(f"generation failed: {seq.error}", "server_error"),
                                status_code=500)
        return JSONResponse(protocol.response(job, seq))

    async def _stream(job: Job, seq: Sequence, queue: asyncio.Queue):
        try:
            if job.kind == "chat":
                yield _sse(protocol.chunk(job, role=True))
            done = False
            while not done:  # the pieces that arrived together go out in one write
                events = []
                item = await queue.get()
                while True:
                    if item[0] == "done":
                        done = True
                        break
                    events.append(_sse(protocol.chunk(job, item[1])))
                    if queue.empty():
                        break
                    item = queue.get_nowait()
                if events:
                    yield b"".join(events)
            if seq.finish_reason == "error":
                yield _sse(protocol.error_body(f"generation failed: {seq.error}", "server_error"))
            else:
                yield _sse(protocol.chunk(job, finish_reason=seq.finish_reason))
                if job.include_usage:
                    yield _sse(protocol.chunk(job, usage_of=seq))
            yield b"data: [DONE]\n\n"
        finally:  # the client went away (or we are done): stop generating for it
            if not seq.done:
                seq.cancel()
                worker.engine.wake()

    async def chat(request: Request):
        return await generate(request, "chat")

    async def completions(request: Request):
        return await generate(request, "completion")

    async def http_error(request: Request, exc: HTTPException):
        return JSONResponse(protocol.error_body(exc.detail or "error", "invalid_request_error"),
                            status_code=exc.status_code)

    async def server_error(request: Request, exc: Exception):
        log.exception("request failed", exc_info=exc)
        return JSONResponse(protocol.error_body(f"internal error: {type(exc).__name__}", "server_error"),
                            status_code=500)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
