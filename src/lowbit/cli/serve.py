"""`lowbit serve`: an OpenAI-compatible HTTP server with continuous batching.

Endpoints: POST /v1/chat/completions, POST /v1/completions (both with "stream": true for server-sent
events ending in `data: [DONE]`), GET /v1/models, GET /health. Up to --max-batch requests are decoded
together (one GEMM over their rows per step); more wait in a queue of --max-queue, beyond which new
requests get HTTP 429. Listens on 127.0.0.1 (this machine only) unless --host says otherwise.
"""
from __future__ import annotations

import argparse
import sys

from lowbit.cli._common import add_model_args, load_from_args
from lowbit.generate.batch import PREFILL_CHUNK
from lowbit.model.kv_cache import KV_TYPES

EPILOG = """\
examples:
  lowbit serve                                   # default model on http://127.0.0.1:8080
  lowbit serve -m model-dir --max-batch 16 --port 8000
  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 64}'

  from openai import OpenAI
  client = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="none")
  client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi!"}])
"""


def add_parser(subparsers):
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server with batched decoding",
                              description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    p.add_argument("-t", "--threads", type=int, default=None, help="kernel threads (default: physical cores)")
    p.add_argument("--max-batch", type=int, default=8, metavar="B",
                   help="requests decoded together, each with its own KV cache slot (default: 8)")
    p.add_argument("--max-context", type=int, default=None, metavar="N",
                   help="tokens per request, prompt + completion (default: the model's, at most 8192)")
    p.add_argument("--kv-cache", choices=tuple(KV_TYPES), default=None,
                   help="what the KV cache slots hold (default: f16; f32 for an f32 model): int8 keeps each row's "
                        "values and one scale, half the memory per slot and half the bytes attention reads")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="the most tokens a request may ask for (default: the context)")
    p.add_argument("--default-max-tokens", type=int, default=256, metavar="N",
                   help="completion length when a request does not say (default: 256)")
    p.add_argument("--max-queue", type=int, default=64, metavar="Q",
                   help="requests waiting for a slot before new ones are refused with 429 (default: 64)")
    p.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK, metavar="N",
                   help=f"prompt tokens prefilled per engine step, between the running requests' decode steps "
                        f"(default: {PREFILL_CHUNK}; smaller: steadier streams, larger: faster first tokens)")
    p.add_argument("--model-id", default=None, help="the model name /v1/models reports (default: the model dir's name)")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    try:
        import uvicorn  # noqa: F401
        import starlette  # noqa: F401
    except ModuleNotFoundError:
        raise RuntimeError("lowbit serve needs starlette and uvicorn: pip install 'lowbit[serve]'") from None
    from lowbit.serve import Server
    from lowbit.serve.server import LOOPBACK

    if args.max_batch < 1:
        raise ValueError("--max-batch must be >= 1")
    if not 0 <= args.port <= 65535:
        raise ValueError("--port must be in [0, 65535]")
    for flag, v, lo in (("--max-tokens", args.max_tokens, 1), ("--default-max-tokens", args.default_max_tokens, 1),
                        ("--max-queue", args.max_queue, 0), ("--prefill-chunk", args.prefill_chunk, 1)):
        if v is not None and v < lo:  # before the model loads
            raise ValueError(f"{flag} must be >= {lo}, got {v}")
    llm = load_from_args(args)
    srv = Server(llm, host=args.host, port=args.port, max_batch=args.max_batch, max_context=args.max_context,
                 max_tokens=args.max_tokens, default_max_tokens=args.default_max_tokens, max_queue=args.max_queue,
                 prefill_chunk=args.prefill_chunk, model_id=args.model_id, log_level="info")
    if args.host not in LOOPBACK:
        print(f"lowbit: warning: listening on {args.host}: reachable from other machines, no authentication",
              file=sys.stderr)
    print(f"lowbit: serving {srv.model_id} on {srv.url}/v1 (max batch {args.max_batch}, context "
          f"{srv.limits.max_context}, {getattr(llm.model, 'kv_cache', '?')} KV cache)", file=sys.stderr, flush=True)
    srv.serve_forever()
    return 0
