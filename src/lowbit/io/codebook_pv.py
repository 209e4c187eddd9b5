"""PV-tuning's discrete step with the end-to-end gradient (Malinovskii et al. 2024, "PV-Tuning: Beyond
Straight-Through Estimation"), for the KD fine-tune of io/codebook_tune:

    track_weight_grads(student)      # from now on every backward adds dL/dW and (dL/dW)^2 of each linear
    ... a few fine-tuning steps (loss.backward()) ...
    st = recode(student, tau=1e-4, alpha=0.1)   # codes moved towards an Adam-like step W - a*g

The KD loss is modelled around the current dequantized weights W of every codebook linear, per weight j, as
g_j d_j + d_j^2 / (2 a_j) for a move d_j: g = the mean of the last few steps' gradients, a_j = alpha * rms(W) /
(rms over those steps of g_j), i.e. the target W - a*g is an Adam-like step (weights whose gradient is large or
noisy, such as the inputs with outlier activations, get a stiff proximal term; without it the step picks exactly
those and breaks the model). Each vector's best code is the centroid nearest the target in the normalized space
(the weights divided by their group scale, the distance weighted by scale^2 / (2a)); only the tau fraction of all
vectors (over all linears together) with the largest predicted loss decrease take their new code. The exact search
runs on the `prefilter` x tau fraction of vectors with the largest bound on that decrease (sum of a_j g_j^2 / 2).
Deterministic (no random draws). For m > 1 additive codebooks the codes are chosen one codebook at a time, the
others fixed (one greedy pass).
"""
from __future__ import annotations

import torch

from lowbit.io.torch_llama import CodebookLinear, TorchLlama


def track_weight_grads(student: TorchLlama) -> None:
    """Makes every backward through the student add dL/dW [M, K] and its square into float32 buffers of each
    codebook linear (grad_sum, grad_sq; grad_n counts the backwards)."""
    for lin in student.codebook_linears().values():
        lin.grad_sum = torch.zeros(lin.shape, dtype=torch.float32)
        lin.grad_sq = torch.zeros(lin.shape, dtype=torch.float32)
        lin.grad_n = 0


def reset_weight_grads(student: TorchLlama) -> None:
    for lin in student.codebook_linears().values():
        lin.grad_sum.zero_()
        lin.grad_sq.zero_()
        lin.grad_n = 0


def untrack_weight_grads(student: TorchLlama) -> None:
    for lin in student.codebook_linears().values():
        lin.grad_sum = lin.grad_sq = None
        lin.grad_n = 0


def _step(lin: CodebookLinear, alpha: float):
    """(mean gradient g, step size a, scale s), each [N, v] over the vectors of lin (zero past K)."""
    n = max(getattr(lin, "grad_n", 0), 1)
    if lin.grad_sum is None:
        raise ValueError("no weight gradient (track_weight_grads before the backward passes)")
    v, kp = lin.books.shape[2], lin.kp
    pad = (0, kp - lin.shape[1])
    g = torch.nn.functional.pad(lin.grad_sum / n, pad).reshape(-1, v)
    rms_g = torch.nn.functional.pad((lin.grad_sq / n).sqrt(), pad).reshape(-1, v)
    w_rms = float(lin.weight().detach().pow(2).mean().sqrt())
    a = alpha * w_rms / (rms_g + 1e-3 * float(rms_g.mean()) + 1e-30)
    s = lin.scales.detach().repeat_interleave(lin.group, dim=1)[:, :kp].reshape(-1, v)
    return g, a, s


def _best_codes(lin: CodebookLinear, g, a, s, idx: torch.Tensor, chunk: int = 32768):
    """For the vectors idx of lin: (predicted loss decrease >= 0 [n], their best codes [n, m] int64)."""
    if len(idx) > chunk:  # bounded temporaries ([chunk, 2^b] scores)
        parts = [_best_codes(lin, g, a, s, idx[lo:lo + chunk], chunk) for lo in range(0, len(idx), chunk)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    books = lin.books.detach()  # [m, 2^b, v]
    m = books.shape[0]
    c = lin.codes.reshape(-1, m)[idx].long()  # [n, m]
    sc, gc, ac = s[idx], g[idx], a[idx]
    cur = sum(books[i][c[:, i]] for i in range(m))  # [n, v] the normalized vector now
    ok = sc != 0
    t = cur - torch.where(ok, ac * gc / torch.where(ok, sc, torch.ones_like(sc)), torch.zeros_like(gc))
    wt = sc * sc / (2 * ac)  # [n, v]: the proximal objective's weight, in loss units per normalized unit^2
    new, vec = c.clone(), cur.clone()
    for i in range(m):
        rest = vec - books[i][new[:, i]]
        r = t - rest  # the target of codebook i's vector
        # sum_j wt_j (C_j - r_j)^2 = wt.C^2 - 2 (wt*r).C + const, for every centroid C at once: [n, 2^b]
        score = wt @ (books[i] * books[i]).T - 2 * (wt * r) @ books[i].T
        new[:, i] = score.argmin(1)
        vec = rest + books[i][new[:, i]]
    gain = (wt * (cur - t).pow(2)).sum(1) - (wt * (vec - t).pow(2)).sum(1)
    changed = (new != c).any(1)
    return torch.where(changed, gain.clamp_min(0), torch.zeros_like(gain)), new


def plan(student: TorchLlama, tau: float, alpha: float, prefilter: float = 16.0) -> dict:
    """The candidate moves of a discrete step, best first: {"moves": [(name, vector index [n], codes [n, m],
    gain [n])...] per linear, "order": global order, "vectors": N}. apply_plan() takes the first k."""
    if not 0.0 < tau <= 1.0 or alpha <= 0 or prefilter < 1:
        raise ValueError(f"the PV step needs 0 < tau <= 1, alpha > 0, prefilter >= 1 (got {tau}, {alpha}, {prefilter})")
    lins = student.codebook_linears()
    with torch.no_grad():
        steps = {name: _step(lin, alpha) for name, lin in lins.items()}
        bounds = [(a * g * g / 2).sum(1) for g, a, _ in steps.values()]  # [N_l] each: >= the true decrease
        total = sum(int(b.numel()) for b in bounds)
        n_cand = min(total, max(1, int(prefilter * tau * total)))
        thr = float(torch.topk(torch.cat(bounds), n_cand, sorted=True).values[-1])
        names, idxs, codes, gains = [], [], [], []
        for (name, lin), b in zip(lins.items(), bounds):
            idx = torch.nonzero(b >= thr).flatten()
            if not idx.numel():
                continue
            gn, best = _best_codes(lin, *steps[name], idx)
            keep = gn > 0
            names.append(name)
            idxs.append(idx[keep])
            codes.append(best[keep])
            gains.append(gn[keep])
        allg = torch.cat(gains) if gains else torch.zeros(0)
        owner = torch.cat([torch.full((len(x),), i) for i, x in enumerate(idxs)]) if idxs else torch.zeros(0, dtype=torch.long)
        pos = torch.cat([torch.arange(len(x)) for x in idxs]) if idxs else torch.zeros(0, dtype=torch.long)
        order = torch.sort(allg, descending=True, stable=True).indices
    return {"names": names, "idx": idxs, "codes": codes, "gains": allg, "owner": owner[order], "pos": pos[order],
            "sorted_gains": allg[order], "vectors": total}


def apply_plan(student: TorchLlama, p: dict, k: int) -> dict:
    """Takes the first k moves of plan p: {"changed", "predicted", "undo": HF name -> old codes}."""
    lins = student.codebook_linears()
    k = min(k, len(p["owner"]))
    undo = {}
    with torch.no_grad():
        for li in torch.unique(p["owner"][:k]).tolist():
            name = p["names"][li]
            sel = p["pos"][:k][p["owner"][:k] == li]
            lin = lins[name]
            undo[name] = lin.codes.clone()
            flat = lin.codes.view(-1, lin.codes.shape[-1])
            flat[p["idx"][li][sel]] = p["codes"][li][sel].to(torch.uint8)
    return {"changed": k, "predicted": float(p["sorted_gains"][:k].sum()), "undo": undo}


def recode(student: TorchLlama, tau: float, alpha: float, prefilter: float = 16.0) -> dict:
    """The discrete step: the tau fraction of all vectors with the largest predicted loss decrease take their best
    code. Returns {"changed", "vectors", "predicted", "undo": HF name -> the old codes [M, nseg, m]}."""
    p = plan(student, tau, alpha, prefilter)
    st = apply_plan(student, p, max(1, int(tau * p["vectors"])))
    return {**st, "vectors": p["vectors"]}


def restore_codes(student: TorchLlama, undo: dict[str, torch.Tensor]) -> None:
    """Takes a recode() / apply_plan() step back."""
    lins = student.codebook_linears()
    with torch.no_grad():
        for name, old in undo.items():
            lins[name].codes.copy_(old)


def discrete_step(student: TorchLlama, teacher: TorchLlama, tau: float, alpha: float, check: list[torch.Tensor],
                  step: int, tries: int = 3) -> dict:
    """One PV step inside the fine-tune, from the gradients gathered since the last one (then reset). Without check
    windows: recode(tau). With check windows (each [1, T]): a line search on the fraction: tau, tau/4, tau/16, ...
    (`tries` of them), the first that lowers the mean KD loss on the check windows is kept, else none.
    Returns {"step", "changed", "vectors", "kept", "tau" (the fraction kept, 0: none), "check": [before, after]}."""
    from lowbit.io.codebook_tune import kd_loss

    def check_loss() -> float:
        with torch.no_grad():
            return sum(float(kd_loss(student, teacher, w)) for w in check) / len(check)

    p = plan(student, tau, alpha)
    out = {"step": step, "changed": 0, "vectors": p["vectors"], "kept": False, "tau": 0.0}
    if not check:
        st = apply_plan(student, p, max(1, int(tau * p["vectors"])))
        out.update(changed=st["changed"], kept=True, tau=tau)
    else:
        before = check_loss()
        out["check"] = [before, before]
        for i in range(tries):
            t = tau / 4 ** i
            st = apply_plan(student, p, max(1, int(t * p["vectors"])))
            after = check_loss()
            if after < before:
                out.update(changed=st["changed"], kept=True, tau=t, check=[before, after])
                break
            restore_codes(student, st["undo"])
    reset_weight_grads(student)
    return out
