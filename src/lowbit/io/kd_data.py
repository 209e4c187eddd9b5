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

BATCH = 16  # sequences decoded together (the batched decoder reads each weight once per step for all of them)


def teacher_samples(config: dict, weights: dict, tokenizer, ids: list[int], tokens: int, length: int = 128,
                    seed: int = 0, prompt: int = 8, temperature: float = 1.0, progress: bool = True) -> list[list[int]]:
    """About `tokens` sampled tokens in sequences of prompt + up to `length` ids (a sequence ends early at an
    EOS id, which is dropped; tokens / length sequences). weights: HF name -> float array or PackedWeight of the float source model;
    ids: the calibration tokens the prompts are cut from. Deterministic for a seed."""
    from lowbit.generate.batch import BatchEngine
    from lowbit.generate.sampling import SamplingParams
    from lowbit.model import Model

    if tokens <= 0:
        return []
    if length < 1 or prompt < 1:
        raise ValueError(f"teacher samples need length >= 1 and prompt >= 1 (got {length}, {prompt})")
    if len(ids) < prompt:
        raise ValueError(f"the calibration text is too short to cut {prompt}-token prompts from")
    model = Model.from_weights(dict(config), weights, tokenizer=tokenizer, max_context=prompt + length,
                               format="int8")
    rng = np.random.default_rng(seed)
    n = -(-tokens // length)
    starts = rng.integers(0, len(ids) - prompt + 1, size=n)
    heads = [[int(i) for i in ids[s:s + prompt]] for s in starts]
    # one sampler per sequence, seeded by (seed, i): a sample does not depend on how the engine batches
    seeds = np.random.SeedSequence(seed).spawn(n)
    engine = BatchEngine(model, tokenizer, max_batch=min(n, BATCH), max_context=prompt + length)
    seqs = [engine.submit(h, max_tokens=length, params=SamplingParams(temperature=temperature,
                                                                       seed=int(s.generate_state(1)[0])))
            for h, s in zip(heads, seeds)]
    if progress:
        from tqdm.auto import tqdm

        with tqdm(total=n, desc="teacher samples", unit="sequence") as bar:
            while engine.has_work():
                engine.step()
                bar.n = sum(q.done for q in seqs)
                bar.refresh()
    else:
        engine.run()
    eos = engine.eos_ids
    out = []
    for h, q in zip(heads, seqs):
        body = [t for t in q.tokens if t not in eos]
        if body:
            out.append(h + body)
    return out
