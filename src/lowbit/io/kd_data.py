"""Data for the codebook fine-tune (io.codebook_tune.finetune): text sampled from the float teacher itself, the
data-free distillation of LLM-QAT, to add to a short calibration text.

    extra = teacher_samples(config, weights, tokenizer, ids, tokens=4096, length=128, seed=0)  # [[id, ...], ...]

Each sample starts from a short prompt cut from the calibration tokens at a seeded position and continues at
temperature 1 (plain sampling, no top-k/top-p), so the student sees the teacher's own distribution around the
calibration text's domain. The teacher runs in lowbit's native decoder with int8 linears (its samples differ
from the float model's only by int8 rounding; the fine-tune's targets stay the float model's).
"""
from __future__ import annotations

import numpy as np


def teacher_samples(config: dict, weights: dict, tokenizer, ids: list[int], tokens: int, length: int = 128,
                    seed: int = 0, prompt: int = 8, temperature: float = 1.0, progress: bool = True) -> list[list[int]]:
    """About `tokens` sampled tokens in sequences of prompt + up to `length` ids (a sequence ends early at an
    EOS id, which is dropped). weights: HF name -> float array or PackedWeight of the float source model;
    ids: the calibration tokens the prompts are cut from. Deterministic for a seed."""
    from tqdm.auto import tqdm

    from lowbit.generate.loop import generate_step
    from lowbit.generate.sampling import Sampler, SamplingParams
    from lowbit.model import Model

    if tokens <= 0:
        return []
    if length < 1 or prompt < 1:
        raise ValueError(f"teacher samples need length >= 1 and prompt >= 1 (got {length}, {prompt})")
    if len(ids) < prompt:
        raise ValueError(f"the calibration text is too short to cut {prompt}-token prompts from")
    model = Model.from_weights(dict(config), weights, tokenizer=tokenizer, max_context=prompt + length,
                               format="int8")
    eos = set(getattr(tokenizer, "eos_ids", ()) or ()) | set(model.args.eos_ids)
    rng = np.random.default_rng(seed)
    out, made = [], 0
    bar = tqdm(total=tokens, desc="teacher samples", unit="token", disable=not progress)
    while made < tokens:
        start = int(rng.integers(0, len(ids) - prompt + 1))
        head = [int(i) for i in ids[start:start + prompt]]
        sampler = Sampler(SamplingParams(temperature=temperature), rng=rng)
        model.reset()
        body = []
        for tok in generate_step(model, head, sampler, max_tokens=min(length, tokens - made)):
            if tok in eos:
                break
            body.append(tok)
        made += max(len(body), 1)  # a sample that ends at once still counts, so the loop always ends
        bar.update(len(body))
        if body:
            out.append(head + body)
    bar.close()
    return out
