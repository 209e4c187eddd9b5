"""lowbit: ultra-low-bit LLM inference on CPUs at the speed of memory.

    import lowbit
    from lowbit.formats import quantize
    pw = quantize(w, "ternary")      # w: float32 [M, K]
    y = pw.matmul(x)                 # x: float32 [N, K] -> float32 [N, M], native kernel
    lowbit.set_threads(2); lowbit.cpu_info()

    llm = lowbit.load("model.gguf", format="int4")   # or an HF folder / lowbit model directory
    llm.generate("The capital of France is", max_tokens=16)
"""
from __future__ import annotations

from lowbit._runtime import cpu_info, get_threads, set_isa, set_threads
from lowbit.api import LLM, from_pretrained, load

__version__ = "0.1.0"

__all__ = ["LLM", "from_pretrained", "load", "cpu_info", "get_threads", "set_isa", "set_threads", "__version__"]
