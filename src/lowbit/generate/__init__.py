"""Generation: sampling, the decode loop, streaming text with stop strings and stats.

    from lowbit.generate import generate, stream
    text = generate(model, tokenizer, "Once upon a time", max_tokens=64, temperature=0.7, seed=0)
"""
from __future__ import annotations

from lowbit.generate.detok import StopMatcher, StreamDecoder
from lowbit.generate.loop import Generation, GenerationStats, generate, generate_step, stream
from lowbit.generate.sampling import Sampler, SamplingParams, apply_repetition_penalty

__all__ = ["Generation", "GenerationStats", "Sampler", "SamplingParams", "StopMatcher", "StreamDecoder",
           "apply_repetition_penalty", "generate", "generate_step", "stream"]
