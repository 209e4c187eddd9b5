"""The OpenAI request and response shapes: validation of /v1/completions and /v1/chat/completions bodies
into a Job, and the JSON objects sent back (whole responses, stream chunks, errors).

Everything a client sends is checked here; a bad value raises RequestError (-> HTTP 400, or the status
it carries) with a message naming the field, as OpenAI's API does.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from lowbit.generate.sampling import SamplingParams

MAX_STOPS = 4  # as OpenAI
UNSUPPORTED = {  # fields whose non-default value we cannot honour -> 400 rather than a silently different answer
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "tools": (None, []), "functions": (None, []), "logit_bias": (None, {}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "response_format": (None, {"type": "text"}),
}


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = message, param, status, code, type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class Limits:
    max_context: int  # tokens a sequence may hold (prompt + generated)
    max_tokens: int  # the most tokens one request may ask for
    default_max_tokens: int  # when the request does not say
    vocab_size: int | None = None  # token ids a prompt may hold: [0, vocab_size)


@dataclass
class Job:
    kind: str  # "chat" or "completion"
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    stop: list[str]
    stream: bool
    include_usage: bool
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def _number(body: dict, name: str, default, lo: float, hi: float, integer: bool = False, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise RequestError(f"'{name}' must be {'an integer' if integer else 'a number'}, got {v!r}", name)
    if isinstance(v, float) and not math.isfinite(v):
        raise RequestError(f"'{name}' must be finite, got {v!r}", name)
    if v < lo or v > hi or (lo_open and v == lo):
        raise RequestError(f"'{name}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}", name)
    return v


def _stops(body: dict) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) for x in s):
        raise RequestError("'stop' must be a string or a list of strings", "stop")
    if len(s) > MAX_STOPS:
        raise RequestError(f"'stop' takes at most {MAX_STOPS} strings, got {len(s)}", "stop")
    return [x for x in s if x]


def _message_text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "developer", "tool"):
            raise RequestError(f"messages[{i}].role must be system, user, assistant, developer or tool, got {role!r}",
                               f"messages[{i}].role")
        out.append({"role": "system" if role == "developer" else role, "content": _message_text(m.get("content"), i)})
    return out


def _prompt_ids(body: dict, tokenizer, vocab: int | None) -> list[int]:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        try:
            return list(tokenizer.encode(p))
        except ValueError as e:  # e.g. a model served without a tokenizer
            raise RequestError(str(e), "prompt") from None
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if any(t < 0 or (vocab is not None and t >= vocab) for t in p):
            raise RequestError(f"'prompt' token ids must be in [0, {vocab})", "prompt")
        return [int(t) for t in p]
    if isinstance(p, list) and len(p) > 1:
        raise RequestError("'prompt' must be one string or one list of token ids (send one request per prompt)",
                           "prompt")
    raise RequestError("'prompt' must be a non-empty string or a list of token ids", "prompt")


def parse_job(kind: str, body, tokenizer, limits: Limits, model_id: str) -> Job:
    """Validates a request body (already JSON-decoded) into a Job; raises RequestError."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for name, ok in UNSUPPORTED.items():
        if body.get(name) not in ok:
            raise RequestError(f"'{name}' is not supported by this server", name)
    n = _number(body, "n", 1, 1, 1, integer=True)
    del n
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", "model")
    if kind == "chat":
        messages = _messages(body)
        if not getattr(tokenizer, "chat_template", None):
            raise RequestError("this model has no chat template: use /v1/completions", "messages")
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except Exception as e:  # a template that rejects this conversation (e.g. roles out of order)
            raise RequestError(f"the chat template rejected the messages: {e}", "messages") from None
        ids = list(tokenizer.encode(text, add_bos=False))
        mt_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        ids = _prompt_ids(body, tokenizer, limits.vocab_size)
        mt_name = "max_tokens"
    if not ids:
        raise RequestError("the prompt is empty (no tokens)", "prompt" if kind == "completion" else "messages")
    if len(ids) >= limits.max_context:
        raise RequestError(f"the prompt has {len(ids)} tokens but this server's context holds {limits.max_context} "
                           "(prompt + completion); shorten the prompt", "messages" if kind == "chat" else "prompt",
                           code="context_length_exceeded")
    max_tokens = _number(body, mt_name, min(limits.default_max_tokens, limits.max_tokens), 1, limits.max_tokens,
                         integer=True)
    room = limits.max_context - len(ids)
    if body.get(mt_name) is not None and max_tokens > room:  # asked for: refused as OpenAI does, not cut short
        raise RequestError(f"the prompt has {len(ids)} tokens and '{mt_name}' asks for {max_tokens} more, but this "
                           f"server's context holds {limits.max_context}; ask for at most {room} or shorten the "
                           "prompt", mt_name, code="context_length_exceeded")
    max_tokens = min(max_tokens, room)  # the default: cut to what the context leaves
    seed = _number(body, "seed", None, -(1 << 63), (1 << 63) - 1, integer=True)
    if seed is not None and seed < 0:
        seed &= (1 << 64) - 1  # numpy seeds are non-negative
    try:
        params = SamplingParams(temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                                top_p=_number(body, "top_p", 1.0, 0.0, 1.0),  # 0: only the most likely token
                                top_k=_number(body, "top_k", 0, 0, 1 << 20, integer=True),
                                min_p=_number(body, "min_p", 0.0, 0.0, 0.999),
                                repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 10.0, lo_open=True),
                                seed=seed)
    except ValueError as e:
        raise RequestError(str(e)) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise RequestError("'stream_options' must be an object", "stream_options")
    include_usage = (so or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise RequestError("'stream_options.include_usage' must be true or false", "stream_options")
    return Job(kind, ids, int(max_tokens), params, _stops(body), stream, include_usage, model_id)


# ---- responses ---------------------------------------------------------------------------------

def usage(seq) -> dict:
    p, c = len(seq.prompt_ids), len(seq.tokens)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def response(job: Job, seq) -> dict:
    """The whole (non-streamed) response."""
    reason = seq.finish_reason
    if job.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": seq.text}, "logprobs": None,
                  "finish_reason": reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": seq.text, "logprobs": None, "finish_reason": reason}
        obj = "text_completion"
    return {"id": _id(job), "object": obj, "created": job.created, "model": job.model, "choices": [choice],
            "usage": usage(seq)}


def chunk(job: Job, piece: str | None = None, finish_reason: str | None = None, role: bool = False,
          usage_of=None) -> dict:
    """One streamed chunk: a text piece, the opening role (chat), the finish reason, or the usage."""
    if usage_of is not None:
        choices = []
    elif job.kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else ({"content": piece} if piece else {})
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    else:
        choices = [{"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish_reason}]
    out = {"id": _id(job), "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
           "created": job.created, "model": job.model, "choices": choices}
    if job.include_usage:
        out["usage"] = usage(usage_of) if usage_of is not None else None
    return out


def _id(job: Job) -> str:
    return ("chatcmpl-" if job.kind == "chat" else "cmpl-") + job.id
