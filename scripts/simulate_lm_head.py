"""Perplexity of SmolLM2-135M with a simulated intN lm_head (asymmetric, groups of 32, lowbit's fit_affine),
dequantized and stored as bf16, the rest as `--format DEC` converts it: would an int5/int6 lm_head format stay
within 1 % of bf16? (docs/lm_head.md). Not run by CI.

    python scripts/simulate_lm_head.py bf16 6 5 4     # decoder format, then the bit widths to try
"""
import sys, pathlib, time
import numpy as np
from lowbit.api import resolve_model_dir
from lowbit.cli._common import default_model
from lowbit.io.checkpoint import open_checkpoint
from lowbit.formats.floats import BF16Weight, f32_to_bf16_bits
from lowbit.formats.int4 import fit_affine
from lowbit.formats.intcodes import group_view
from lowbit.model import Model
from lowbit.perplexity import perplexity

dec = sys.argv[1]
d = resolve_model_dir(default_model(), format=dec, lm_head_format="bf16", embed_format="bf16", progress=False)
ck = open_checkpoint(d)
text = pathlib.Path("tests/data/GPL-3.0.txt").read_text()
for bits in [int(b) for b in sys.argv[2:]]:
    t = time.time()
    weights = {n: ck.load(n) for n in ck.tensor_names()}
    w = weights["lm_head.weight"].dequantize()
    out = np.empty_like(w)
    for s in range(0, w.shape[0], 2048):
        wg = group_view(w[s:s + 2048], 32)
        a, b, c = fit_affine(wg, 1 << bits, False)
        out[s:s + 2048] = (c * a[:, :, None] + b[:, :, None]).reshape(wg.shape[0], -1)[:, :w.shape[1]]
    weights["lm_head.weight"] = BF16Weight(f32_to_bf16_bits(out))
    cfg = dict(ck.config); cfg["tie_word_embeddings"] = True
    model = Model.from_weights(cfg, weights, tokenizer=ck.tokenizer(), max_context=512)
    tok = ck.tokenizer()
    ids = tok.encode(text, add_bos=False)
    bos = tok.bos_id if getattr(tok, "add_bos", False) else None
    r = perplexity(model, ids, ctx=512, bos_id=bos)
    print(f"dec={dec} lm_head=simulated int{bits} g32 (bf16 storage): ppl {r.ppl:.4f} ({time.time()-t:.0f}s)", flush=True)
