"""Streaming text out of token ids: incremental detokenization and stop strings.

A token may end in the middle of a multi-byte UTF-8 character (byte-level BPE splits emoji and CJK
across tokens), and SentencePiece drops a leading space when a sequence is decoded on its own. So
`StreamDecoder` decodes a short window of ids with some context before them and emits only the new,
complete characters. `StopMatcher` holds back text that might begin a stop string and cuts the
output before the first stop string (which itself is not emitted).
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


class StreamDecoder:
    """ids in, text pieces out; the concatenated pieces equal decode(all ids).

    context: ids decoded before the first new one (e.g. the prompt's last few), never emitted.
    """

    def __init__(self, tokenizer, context=(), skip_special: bool = True):
        self.tok = tokenizer
        self.skip = skip_special
        self.ids: list[int] = [int(i) for i in list(context)[-4:]]
        self.prefix = 0  # ids[prefix:read] were decoded already and are context for the next piece
        self.read = len(self.ids)

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special=self.skip)

    def push(self, token: int) -> str:
        """Adds one id; returns the newly completed text ('' while a character is still incomplete)."""
        self.ids.append(int(token))
        before = self._decode(self.ids[self.prefix:self.read])
        now = self._decode(self.ids[self.prefix:])
        if len(now) > len(before) and not now.endswith(REPLACEMENT):
            self.prefix, self.read = self.read, len(self.ids)
            return now[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        before = self._decode(self.ids[self.prefix:self.read])
        now = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return now[len(before):] if len(now) > len(before) else ""


class StopMatcher:
    """Cuts a stream of text pieces at the first stop string; the stop string is not emitted."""

    def __init__(self, stops=()):
        if isinstance(stops, str):
            stops = [stops]
        if not isinstance(stops, (list, tuple, set, type(None))) or not all(isinstance(s, str) for s in stops or ()):
            raise TypeError(f"stop must be a string or a list of strings, got {stops!r}")
        self.stops = [s for s in (stops or ()) if s]
        self.pending = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        """Returns the text that is safe to emit now; sets self.stopped when a stop string appeared."""
        if self.stopped:
            return ""
        text = self.pending + piece
        if not self.stops:
            self.pending = ""
            return text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self.pending = ""
            return text[:cut]
        hold = 0  # the longest tail of text that is a proper prefix of some stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        self.pending = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]

    def flush(self) -> str:
        """The held-back tail at the end of generation (it never completed a stop string)."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out
