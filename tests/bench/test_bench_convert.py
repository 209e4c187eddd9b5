"""lowbit bench convert on the tiny synthetic shape: writes the sources once, converts in a child process,
reports weights/s and peak RSS; the synthetic checkpoints load and convert like real ones."""
import json

import numpy as np

from lowbit.bench.synthetic import synthetic_config, tensors, write_synthetic
from lowbit.cli import main
from lowbit.io.checkpoint import open_checkpoint


def test_synthetic_sources_read_back(tmp_path):
    cfg = synthetic_config("tiny")
    for kind in ("gguf-f16", "hf-bf16"):
        ck = open_checkpoint(write_synthetic(tmp_path, "tiny", kind))
        assert ck.config["hidden_size"] == cfg["hidden_size"] and ck.config["tie_word_embeddings"]
        for name, shape in tensors(cfg):
            assert np.asarray(ck.load(name)).shape == shape
    assert write_synthetic(tmp_path, "tiny", "gguf-f16").stat().st_size > 0  # reused, not rewritten


def test_bench_convert_json(tmp_path, capsys):
    rc = main(["bench", "convert", "--shape", "tiny", "--sources", "gguf-f16", "--formats", "int4", "-t", "1",
               "--dir", str(tmp_path), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["quantizer"]["int4"] > 0
    (r,) = res["convert"]
    assert r["kind"] == "gguf-f16" and r["format"] == "int4" and r["weights_per_s"] > 0
    assert 0 < r["peak_rss_bytes"] and r["out_bytes"] > 0


def test_bench_convert_rejects_unknown(tmp_path, capsys):
    rc = main(["bench", "convert", "--shape", "tiny", "--sources", "pickle", "--dir", str(tmp_path)])
    assert rc != 0 and "source kind" in capsys.readouterr().err
