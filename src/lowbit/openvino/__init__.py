"""The OpenVINO backend (NITRO, paper 002): lowbit models as chunked, static-shape, stateful OpenVINO IR
for Intel CPUs, GPUs and NPUs.

    lowbit export-openvino MODEL OUT --weights int4 --max-seq-len 1024 --chunk-layers 8
    llm = lowbit.load(OUT, backend="openvino", device="CPU")       # or a GGUF / HF / lowbit source

graph.py builds the IR op by op, export.py writes the chunks, backend.py runs them behind the same
prefill/decode/cache interface as lowbit's own Model, so generation, sampling and chat are shared.
Needs the optional dependency `openvino` (pip install 'lowbit[openvino]').
"""
from __future__ import annotations


def require_openvino():
    """The openvino module, or a clear error saying how to install it."""
    try:
        import openvino
    except ImportError as e:
        raise RuntimeError("the OpenVINO backend needs the `openvino` package: pip install openvino "
                           f"(or pip install 'lowbit[openvino]') ({e})") from None
    return openvino


def available_devices() -> list[str]:
    """OpenVINO's devices on this machine (e.g. ['CPU'], ['CPU', 'GPU', 'NPU'])."""
    return list(require_openvino().Core().available_devices)
