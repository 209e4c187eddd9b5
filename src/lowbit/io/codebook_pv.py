"""PV-tuning's discrete step with the end-to-end gradient (Malinovskii et al. 2024, "PV-Tuning: Beyond
Straight-Through Estimation"), for the KD fine-tune of io/codebook_tune:

    grads = track_weight_grads(student)          # from now on every backward adds dL/dW of each linear
    ... a few fine-tuning steps (loss.backward()) ...
    changed = recode(student, grads, tau=0.01, alpha=0.1)   # codes moved towards W - a * g

The loss is linearized around the current dequantized weights W of every codebook linear, with a proximal term:
for a vector (v weights of one row) moving from w to w', L(w') - L(w) ~ g.(w' - w) + |w' - w|^2 / (2a), whose
minimizer over the codebook's vectors is the centroid nearest to the target W - a*g in the normalized space (the
weights divided by their group scale, the distance weighted by the scale squared). Each linear's a is
alpha * rms(W) / rms(g) (the target moves by alpha of the weights' RMS). Every vector's best code and its predicted
loss decrease are computed; only the tau fraction of all vectors (over all linears together) with the largest
predicted decrease take their new code, so the step stays inside the region where the linearization holds. The
codebooks, scales and norms then go on training (the continuous step). Deterministic (no random draws).
For m > 1 additive codebooks the codes are chosen one codebook at a time, the others fixed (one greedy pass).
"""
from __future__ import annotations

import torch

from lowbit.io.torch_llama import CodebookLinear, TorchLlama


def track_weight_grads(student: TorchLlama) -> dict[str, torch.Tensor]:
    """Makes every backward through the student add dL/dW [M, K] of each codebook linear into a float32 buffer;
    returns HF name -> that buffer (zero it, or call reset_weight_grads, after each discrete step)."""
    out = {}
    for name, lin in student.codebook_linears().items():
        lin.grad_sum = torch.zeros(lin.shape, dtype=torch.float32)
        out[name] = lin.grad_sum
    return out


def untrack_weight_grads(student: TorchLlama) -> None:
    for lin in student.codebook_linears().values():
        lin.grad_sum = None


def _best_codes(lin: CodebookLinear, g: torch.Tensor, alpha: float, chunk: int = 32768):
    """For every vector of lin: (predicted loss decrease >= 0 [N], its best codes [N, m] uint8), N = M * kp / v."""
    books = lin.books.detach()  # [m, 2^b, v]
    m, _, v = books.shape
    rows, kp = lin.shape[0], lin.kp
    w = lin.weight().detach()  # [M, K]
    a = alpha * float(w.pow(2).mean().sqrt()) / max(float(g.pow(2).mean().sqrt()), 1e-30)
    s = lin.scales.detach().repeat_interleave(lin.group, dim=1)[:, :kp]  # [M, kp] each weight's scale
    gp = torch.nn.functional.pad(g, (0, kp - g.shape[1]))  # [M, kp]
    codes = lin.codes.reshape(-1, m).long()  # [N, m]
    s = s.reshape(-1, v)
    gp = gp.reshape(-1, v)
    gains, best = [], []
    for lo in range(0, codes.shape[0], chunk):
        c = codes[lo:lo + chunk]
        sc, gc = s[lo:lo + chunk], gp[lo:lo + chunk]
        parts = torch.stack([books[i][c[:, i]] for i in range(m)])  # [m, n, v]
        cur = parts.sum(0)  # [n, v] the normalized vector now
        ok = sc != 0
        t = cur - torch.where(ok, a * gc / torch.where(ok, sc, torch.ones_like(sc)), torch.zeros_like(gc))
        wt = sc * sc / (2 * a)  # [n, v] per-weight loss units of the proximal objective
        new = c.clone()
        vec = cur.clone()
        for i in range(m):
            rest = vec - books[i][new[:, i]]
            r = t - rest  # the target for codebook i's vector
            # sum_j wt_j (C_j - r_j)^2 = wt.C^2 - 2 (wt*r).C + const, for every centroid C at once: [n, 2^b]
            score = wt @ (books[i] * books[i]).T - 2 * (wt * r) @ books[i].T
            new[:, i] = score.argmin(1)
            vec = rest + books[i][new[:, i]]
        before = (wt * (cur - t).pow(2)).sum(1)
        after = (wt * (vec - t).pow(2)).sum(1)
        changed = (new != c).any(1)
        gains.append(torch.where(changed, (before - after).clamp_min(0), torch.zeros_like(before)))
        best.append(new.to(torch.uint8))
    return torch.cat(gains), torch.cat(best)


def recode(student: TorchLlama, grads: dict[str, torch.Tensor], tau: float, alpha: float) -> dict:
    """The discrete step: each codebook linear's codes moved towards W - a*g (g = grads[name], e.g. the summed
    dL/dW of the last few steps), for the tau fraction of all vectors with the largest predicted loss decrease.
    Returns {"changed": vectors recoded, "vectors": all vectors, "predicted": summed predicted decrease,
    "undo": HF name -> the old codes [M, nseg, m] (pass to restore_codes to take the step back)}."""
    if not 0.0 < tau <= 1.0 or alpha <= 0:
        raise ValueError(f"the PV step needs 0 < tau <= 1 and alpha > 0 (got tau={tau}, alpha={alpha})")
    lins = student.codebook_linears()
    missing = [n for n in lins if n not in grads]
    if missing:
        raise ValueError(f"no weight gradient for {missing[0]} (track_weight_grads before the backward passes)")
    found = {}
    with torch.no_grad():
        for name, lin in lins.items():
            found[name] = _best_codes(lin, grads[name], alpha)
        total = sum(int(gn.numel()) for gn, _ in found.values())
        k = max(1, int(tau * total))
        allg = torch.cat([gn for gn, _ in found.values()])
        positive = int((allg > 0).sum())
        k = min(k, positive)
        undo, changed, predicted = {}, 0, 0.0
        if k:
            thr = float(torch.topk(allg, k, sorted=True).values[-1])
            thr = max(thr, torch.finfo(torch.float32).tiny)
            for name, (gn, best) in found.items():
                pick = gn >= thr
                n = int(pick.sum())
                if not n:
                    continue
                lin = lins[name]
                undo[name] = lin.codes.clone()
                flat = lin.codes.view(-1, lin.codes.shape[-1])
                flat[pick] = best[pick]
                changed += n
                predicted += float(gn[pick].sum())
    return {"changed": changed, "vectors": total, "predicted": predicted, "undo": undo}


def restore_codes(student: TorchLlama, undo: dict[str, torch.Tensor]) -> None:
    """Takes a recode() step back."""
    lins = student.codebook_linears()
    with torch.no_grad():
        for name, old in undo.items():
            lins[name].codes.copy_(old)


def discrete_step(student: TorchLlama, teacher: TorchLlama, grads: dict[str, torch.Tensor], tau: float,
                  alpha: float, check: list[torch.Tensor], step: int) -> dict:
    """One PV step inside the fine-tune: recode() with the summed weight gradients, then (with check windows, each
    [1, T]) the step is kept only if the mean KD loss on them falls; the gradient sums are zeroed. Returns
    {"step", "changed", "vectors", "kept", "check": [loss before, loss after]}."""
    from lowbit.io.codebook_tune import kd_loss

    def check_loss() -> float:
        with torch.no_grad():
            return sum(float(kd_loss(student, teacher, w)) for w in check) / len(check)

    before = check_loss() if check else 0.0
    st = recode(student, grads, tau, alpha)
    after = check_loss() if check else 0.0
    kept = not check or after < before
    if not kept:
        restore_codes(student, st["undo"])
    for g in grads.values():
        g.zero_()
    out = {"step": step, "changed": st["changed"] if kept else 0, "vectors": st["vectors"], "kept": kept}
    if check:
        out["check"] = [before, after]
    return out
