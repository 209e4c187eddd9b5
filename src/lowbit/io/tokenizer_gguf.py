"""Builds a Tokenizer from GGUF metadata (tokenizer.ggml.*), the way llama.cpp and transformers read it.

    tokenizer.ggml.model = "gpt2"   byte-level BPE: tokens (in the GPT-2 byte alphabet) + merges "a b";
                                    the split regex depends on tokenizer.ggml.pre (smollm, llama-bpe, qwen2, ...)
    tokenizer.ggml.model = "llama"  SentencePiece BPE: tokens + scores (merges implied by the scores),
                                    byte fallback via <0xNN> tokens, "\u2581" for spaces
    token_type: 1 normal, 2 unknown, 3 control (added as special tokens), 4 user-defined (added tokens), 6 byte
"""
from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from lowbit.io.tokenizer import Tokenizer

CONTROL, USER_DEFINED = 3, 4

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {name: _LLAMA3 for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "smaug-bpe", "dbrx",
                                     "pixtral", "lfm2")}
SPLITS.update({name: _QWEN2 for name in ("qwen2", "deepseek-r1-qwen", "megrez")})
# byte-level BPE pre-tokenizers for which llama.cpp prepends BOS when tokenizer.ggml.add_bos_token is absent (Llama 3
# and Falcon 3 GGUFs converted before gguf-py read the post-processor carry no such key)
BOS_BY_DEFAULT = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def byte_level_pre_tokenizer(pre: str | None):
    """The pre-tokenizer llama.cpp uses for tokenizer.ggml.pre (default: GPT-2's regex)."""
    if pre in SPLITS:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "smollm":  # SmolLM's tokenizer.json: digits one by one, then GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def byte_level_bpe(tokens: list[str], merges: list[str], pre: str | None) -> Backend:
    alphabet = set(bytes_to_unicode().values())
    spell = bytes_to_unicode()
    vocab = {}
    for i, tok in enumerate(tokens):
        if not set(tok) <= alphabet:  # a token written in plain text: respell its bytes
            tok = "".join(spell[b] for b in tok.encode("utf-8"))
        vocab.setdefault(tok, i)
    pairs = [tuple(m.split(" ")) for m in merges]
    backend = Backend(models.BPE(vocab=vocab, merges=[p for p in pairs if len(p) == 2], fuse_unk=False))
    backend.pre_tokenizer = byte_level_pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    return backend


def sentencepiece_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece BPE vocabulary: every split of a token into two tokens, best score first."""
    merges = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def sentencepiece_bpe(tokens: list[str], scores: list[float], unk: str | None, add_space_prefix: bool) -> Backend:
    vocab = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    score_of = {tok: float(scores[i]) if i < len(scores) else 0.0 for tok, i in vocab.items()}
    bpe = models.BPE(vocab=vocab, merges=sentencepiece_merges(vocab, score_of), unk_token=unk, fuse_unk=True,
                     byte_fallback=True)
    backend = Backend(bpe)
    scheme = "first" if add_space_prefix else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def tokenizer_from_gguf(ck) -> Tokenizer:
    """ck: a GGUFCheckpoint. Raises ValueError naming the file for tokenizer models other than gpt2 / llama and
    for damaged tokenizer metadata (the tokenizers library raises a bare Exception on some)."""
    try:
        tok = _tokenizer_from_gguf(ck)
        tok.source = ck.path
        tok.check()
        return tok
    except Exception as e:  # noqa: BLE001 - whatever the metadata broke, the user gets the file's name
        if isinstance(e, ValueError) and str(ck.path) in str(e):
            raise
        raise ValueError(f"{ck.path}: damaged GGUF tokenizer metadata ({type(e).__name__}: {e})") from None


def _tokenizer_from_gguf(ck) -> Tokenizer:
    model = ck.get("tokenizer.ggml.model")
    tokens = ck.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{ck.path}: GGUF has no tokenizer.ggml.tokens (no tokenizer)")
    types = ck.get("tokenizer.ggml.token_type") or []
    unk_id = ck.get("tokenizer.ggml.unknown_token_id")
    if model == "gpt2":
        backend = byte_level_bpe(tokens, ck.get("tokenizer.ggml.merges") or [], ck.get("tokenizer.ggml.pre"))
        default_bos = ck.get("tokenizer.ggml.pre") in BOS_BY_DEFAULT
    elif model == "llama":
        unk = tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else None
        backend = sentencepiece_bpe(tokens, ck.get("tokenizer.ggml.scores") or [], unk,
                                    bool(ck.get("tokenizer.ggml.add_space_prefix", True)))
        default_bos = True
    else:
        raise ValueError(f"{ck.path}: GGUF tokenizer model {model!r} is not supported (supported: gpt2, llama)")
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    if model == "gpt2":  # a "control" token outside the byte alphabet is a llama.cpp mislabel
        alphabet = set(bytes_to_unicode().values())
        special = [a for a in special if set(a.content) <= alphabet]
    backend.add_special_tokens(special)
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    bos_id = ck.get("tokenizer.ggml.bos_token_id")
    eos_id = ck.get("tokenizer.ggml.eos_token_id")
    eot_id = ck.get("tokenizer.ggml.eot_token_id")
    eos = [i for i in (eos_id, eot_id) if i is not None] + list(ck.get("tokenizer.ggml.eog_token_ids") or [])
    # llama.cpp's llama_tokenize with add_special appends tokenizer.ggml.eos_token_id when add_eos_token is set
    # (false by default for the gpt2 and llama tokenizer models)
    return Tokenizer(backend, bos_id=bos_id, eos_ids=eos, add_bos=bool(ck.get("tokenizer.ggml.add_bos_token", default_bos)),
                     chat_template=ck.get("tokenizer.chat_template"), unk_id=unk_id,
                     pad_id=ck.get("tokenizer.ggml.padding_token_id"),
                     add_eos=bool(ck.get("tokenizer.ggml.add_eos_token", False)), eos_token_id=eos_id)
