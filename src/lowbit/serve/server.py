"""The server around the app: the engine thread plus uvicorn, in the foreground (`lowbit serve`) or in a
background thread (tests, `lowbit bench serve`)."""
from __future__ import annotations

import pathlib
import socket
import threading
import time

from lowbit.generate.batch import PREFILL_CHUNK, BatchEngine
from lowbit.serve.app import EngineWorker, build_app
from lowbit.serve.protocol import Limits

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def model_name(llm) -> str:
    """What /v1/models reports: the name the user loaded (GGUF file stem, folder name), else "lowbit"."""
    for src in (getattr(llm, "source", None), getattr(llm, "path", None)):
        if src:
            p = pathlib.Path(src)
            return p.stem if p.suffix == ".gguf" else p.name
    return "lowbit"


class Server:
    """llm: a lowbit.LLM. max_batch: sequences decoded together (KV cache slots); max_context: tokens per
    sequence (default: the model's cache); max_tokens: the most a request may ask for (default: max_context);
    max_queue: requests waiting for a slot before new ones get 429."""

    def __init__(self, llm, host: str = "127.0.0.1", port: int = 8080, max_batch: int = 8,
                 max_context: int | None = None, max_tokens: int | None = None, default_max_tokens: int = 256,
                 max_queue: int = 64, prefill_chunk: int = PREFILL_CHUNK, model_id: str | None = None,
                 log_level: str = "warning"):
        import uvicorn

        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.llm = llm
        self.engine = BatchEngine(llm.model, llm.tokenizer, max_batch=max_batch, max_context=max_context,
                                  prefill_chunk=prefill_chunk)
        ctx = self.engine.max_context
        if max_tokens is not None and max_tokens < 1:  # 0 meant "the context" before: say so instead
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        max_tokens = int(max_tokens or ctx)
        if default_max_tokens < 1:  # else a request that does not say got an empty (0) or failed (< 0) completion
            raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
        self.limits = Limits(max_context=ctx, max_tokens=max_tokens, default_max_tokens=default_max_tokens,
                             vocab_size=llm.model.embed.shape[0])
        self.model_id = model_id or model_name(llm)
        self.worker = EngineWorker(self.engine, max_queue=max_queue)
        self.app = build_app(llm, self.worker, self.limits, self.model_id)
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(self.app, host=host, port=self.port, log_level=log_level, access_log=False,
                                timeout_graceful_shutdown=2)
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def http_thread_id(self) -> int | None:
        """The native id of the thread uvicorn runs in (start()), for per-thread CPU accounting."""
        return self._thread.native_id if self._thread is not None else None

    def serve_forever(self) -> None:
        """Runs in the foreground until interrupted (Ctrl-C)."""
        self.worker.start()
        try:
            self._uvicorn.run()
        finally:
            self.worker.stop()

    def start(self, timeout: float = 30.0) -> "Server":
        """Starts in a background thread; returns once it accepts connections."""
        self.worker.start()
        self._thread = threading.Thread(target=self._uvicorn.run, name="lowbit-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.worker.stop(timeout)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
