"""io.codebook_pv: PV-tuning's discrete step with the end-to-end gradient. The codes chosen equal a brute-force
search of the linearized proximal objective, the step lowers the KD loss on its own batch, changes at most the tau
fraction of vectors and can be taken back; the fine-tune with it is deterministic and records every step."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PV step runs in torch")

from lowbit.formats.codebook import CodebookWeight  # noqa: E402
from lowbit.io.checkpoint import is_linear, open_checkpoint  # noqa: E402
from lowbit.io.codebook_pv import _best_codes, _step, recode, restore_codes, track_weight_grads  # noqa: E402
from lowbit.io.codebook_tune import finetune, kd_loss  # noqa: E402
from lowbit.io.torch_llama import CodebookLinear, TorchLlama  # noqa: E402

from .tiny import random_weights, tiny_config  # noqa: E402
from .torch_threads import one_thread  # noqa: E402,F401  (autouse fixture)


def setup(m=1, seed=0):
    cfg = tiny_config()
    w = random_weights(cfg, seed=seed)
    packed = {n: CodebookWeight.quantize(v, m=m, v=4, b=3, g=32, iters=1) for n, v in w.items() if is_linear(n)}
    rng = np.random.default_rng(seed)
    ids = [int(i) for i in rng.integers(3, cfg["vocab_size"], size=200)]
    return cfg, w, packed, ids


@pytest.mark.parametrize("m", [1, 2])
def test_best_codes_match_a_brute_force_search(m):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((9, 70)).astype(np.float32)  # K 70: 2 groups of 64 (the second partial), 2 padded
    lin = CodebookLinear(CodebookWeight.quantize(w, m=m, v=4, b=3, g=64, iters=1))
    g = torch.from_numpy(rng.standard_normal((9, 70)).astype(np.float32))
    sq = g * g * torch.from_numpy(rng.uniform(1, 4, (9, 70)).astype(np.float32))  # E[g^2] >= mean^2
    lin.grad_sum, lin.grad_sq, lin.grad_n = 2 * g, 2 * sq, 2
    alpha = 0.3
    step = _step(lin, alpha)
    gains, best = _best_codes(lin, *step, torch.arange(9 * 72 // 4), chunk=7)  # odd chunk: partial chunks
    books = lin.books.detach().numpy().astype(np.float64)
    w_rms = np.sqrt((lin.weight().detach().numpy().astype(np.float64) ** 2).mean())
    rms_g = np.pad(np.sqrt(sq.numpy().astype(np.float64)), ((0, 0), (0, 2))).reshape(-1, 4)
    a = alpha * w_rms / (rms_g + 1e-3 * rms_g.mean())
    s = np.repeat(lin.scales.detach().numpy(), 64, axis=1)[:, :lin.kp].reshape(-1, 4).astype(np.float64)
    gp = np.pad(g.numpy(), ((0, 0), (0, lin.kp - 70))).reshape(-1, 4).astype(np.float64)
    codes = lin.codes.numpy().reshape(-1, m)
    # every combination of centroids: [8^m, 4]
    combos = np.stack(np.meshgrid(*[np.arange(8)] * m, indexing="ij"), -1).reshape(-1, m)
    vecs = sum(books[i][combos[:, i]] for i in range(m))
    for j in range(codes.shape[0]):
        cur = sum(books[i][codes[j, i]] for i in range(m))
        t = cur - a[j] * gp[j] / s[j]
        obj = (s[j] ** 2 / (2 * a[j]) * (vecs - t) ** 2).sum(1)
        old = (s[j] ** 2 / (2 * a[j]) * (cur - t) ** 2).sum()
        got = (s[j] ** 2 / (2 * a[j]) * (sum(books[i][best[j, i]] for i in range(m)) - t) ** 2).sum()
        assert float(gains[j]) <= (a[j] * gp[j] ** 2 / 2).sum() * (1 + 1e-4) + 1e-12  # the prefilter's bound holds
        changed = (best[j].numpy() != codes[j]).any()
        assert float(gains[j]) == pytest.approx(old - got if changed else 0.0, rel=1e-3, abs=1e-9)
        if m == 1:  # exact nearest centroid of the target
            assert got == pytest.approx(obj.min(), rel=1e-4, abs=1e-9)
        else:  # one greedy pass over the codebooks: no worse than now, no better than the best pair
            assert obj.min() - 1e-9 <= got <= old + 1e-9


def test_recode_lowers_the_loss_of_its_batch_within_tau_and_undoes():
    cfg, w, packed, ids = setup()
    student, teacher = TorchLlama(cfg, {**w, **packed}), TorchLlama(cfg, w)
    finetune(student, teacher, ids, steps=4, seq=48, lr=3e-2, seed=7, progress=False)
    batch = torch.tensor([ids[:64], ids[100:164]])
    track_weight_grads(student)
    for p in student.parameters():
        p.requires_grad_(True)
    for b in (batch[:1], batch[1:]):
        kd_loss(student, teacher, b).backward()
    lins = student.codebook_linears()
    assert all(lin.grad_n == 2 and float(lin.grad_sq.min()) >= 0 and float(lin.grad_sum.abs().sum()) > 0
               for lin in lins.values())
    with torch.no_grad():
        loss = kd_loss(student, teacher, batch)
    before = {n: lin.codes.clone() for n, lin in lins.items()}
    st = recode(student, tau=0.01, alpha=1.0)
    assert 0 < st["changed"] <= int(0.01 * st["vectors"]) and st["predicted"] > 0
    diff = sum(int((lin.codes != before[n]).any(-1).sum()) for n, lin in student.codebook_linears().items())
    assert diff == st["changed"]
    with torch.no_grad():
        after = float(kd_loss(student, teacher, batch))
    assert after < float(loss), (float(loss), after)
    restore_codes(student, st["undo"])
    assert all(torch.equal(lin.codes, before[n]) for n, lin in student.codebook_linears().items())
    with pytest.raises(ValueError, match="tau"):
        recode(student, tau=0.0, alpha=0.2)
    from lowbit.io.codebook_pv import untrack_weight_grads

    untrack_weight_grads(student)
    with pytest.raises(ValueError, match="gradient"):
        recode(student, tau=0.1, alpha=0.2)


def test_finetune_with_pv_steps_is_deterministic_and_records_them():
    cfg, w, packed, ids = setup(seed=1)
    runs = []
    for _ in range(2):
        student, teacher = TorchLlama(cfg, {**w, **packed}), TorchLlama(cfg, w)
        log = []
        losses = finetune(student, teacher, ids, steps=6, seq=48, lr=3e-2, seed=3, progress=False, pv_every=2,
                          pv_tau=0.02, pv_alpha=1.0, pv_check=1, pv_log=log)
        runs.append((losses, log, {n: lin.packed() for n, lin in student.codebook_linears().items()}))
        assert all(lin.grad_sum is None for lin in student.codebook_linears().values())  # tracking ends
    (l1, g1, p1), (l2, g2, p2) = runs
    assert l1 == l2 and g1 == g2
    assert [r["step"] for r in g1] == [2, 4, 6] and all(len(r["check"]) == 2 for r in g1)
    assert all(r["kept"] == (r["check"][1] < r["check"][0]) for r in g1)
    assert all(np.array_equal(p1[n].codes, p2[n].codes) for n in p1)
    moved = sum(int((p1[n].unpacked_codes() != packed[n].unpacked_codes()).any(-1).sum()) for n in p1)
    assert 0 < moved <= sum(r["changed"] for r in g1) and any(r["kept"] for r in g1)  # a vector may move twice
    assert all(r["tau"] in (0.0, 0.02, 0.005, 0.00125) and (r["tau"] > 0) == r["kept"] for r in g1)  # line search
    assert all(r["changed"] <= int(0.02 * r["vectors"]) for r in g1)
    student = TorchLlama(cfg, {**w, **packed})
    with pytest.raises(ValueError, match="PV step"):
        finetune(student, TorchLlama(cfg, w), ids, 2, pv_every=1, pv_tau=2.0, progress=False)


def test_cli_pv_flags_reach_the_model_config(tmp_path):
    from lowbit.cli import main

    from .test_codebook_tune import tiny_source

    _, _, src, text = tiny_source(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--format", "codebook", "--b", "3", "--g", "32", "--iters", "1",
                 "--calibration", str(text), "--calibration-tokens", "200", "--finetune-steps", "4",
                 "--finetune-seq", "32", "--teacher-tokens", "0", "--finetune-pv-every", "2",
                 "--finetune-pv-tau", "0.05", "--finetune-pv-alpha", "1.0", "--finetune-pv-check", "0", "-q"]) == 0
    ft = open_checkpoint(out).lowbit["finetune"]
    assert (ft["pv_every"], ft["pv_tau"], ft["pv_alpha"], ft["pv_check"]) == (2, 0.05, 1.0, 0)
    assert [r["step"] for r in ft["pv"]] == [2, 4] and all(r["kept"] for r in ft["pv"])
