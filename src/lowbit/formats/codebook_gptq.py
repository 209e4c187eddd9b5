"""Error feedback for codebook quantization (GPTQ over vectors, as GPTVQ and AQLM do): codes chosen input
segment by input segment, each segment's error pushed onto the inputs not yet quantized through the Cholesky
factor of the inverse input Hessian, so that the layer's output error ||(W - Wq) X^T||^2 is what is minimized.

    idx, scales = gptq_codes(w, H, books, group=128)   # w [M, K], H = X^T X / n [K, K], books [m, 2^b, v]

With U the upper Cholesky factor of H^-1 (dampened: H + damp * mean(diag H) * I), segment B (v columns) is
quantized with the metric ||(w_B - q_B) U_BB^-1||^2 (the OBQ cost of the block given that every later column
may still move) and the later columns take W[:, rest] -= (w_B - q_B) U_BB^-1 U[B, rest] (lazily, one scale
group at a time, as GPTQ does). Scales are the RMS of each (row, group) of the weights as updated when the
group is reached. The codebooks stay fixed (fit them first: codebook_quant.fit_codebooks).
"""
from __future__ import annotations

import numpy as np

from lowbit.formats.codebook_beam import assign, search_codes

DAMP = 0.01


def inverse_cholesky(h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """H [K, K] (symmetric PSD) -> U upper triangular with U^T U = (H + damp*mean(diag)*I)^-1 (float64).
    Dead inputs (H[k, k] == 0) get H[k, k] = 1 (their weights are then irrelevant to the output)."""
    h = np.array(h, np.float64, copy=True)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise ValueError(f"the Hessian must be square [K, K], got {h.shape}")
    if not np.all(np.isfinite(h)):
        raise ValueError("the Hessian has non-finite entries")
    diag = np.diag(h).copy()
    dead = diag <= 0
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    h[dead, dead] = 1.0
    mean = float(np.mean(np.diag(h)))
    h[np.diag_indices_from(h)] += damp * mean
    # U = P L'^-1 P with L' the Cholesky factor of P H P (P reverses the order): upper, and U^T U = H^-1
    # (one Cholesky and one triangular inverse instead of an inverse and two Cholesky factorizations)
    flip = h[::-1, ::-1]
    for extra in (0.0, 0.1, 1.0, 10.0):  # more dampening only if the factorization fails
        try:
            lower = np.linalg.cholesky(flip + extra * mean * np.eye(h.shape[0]))
            break
        except np.linalg.LinAlgError:
            continue
    else:
        raise ValueError("the Hessian is not positive definite even after dampening")
    return np.ascontiguousarray(_lower_inverse(lower)[::-1, ::-1])


def _lower_inverse(lower: np.ndarray) -> np.ndarray:
    try:
        from scipy.linalg.lapack import dtrtri
    except ImportError:  # numpy alone: a general inverse (slower, same result)
        return np.tril(np.linalg.inv(lower))
    inv, info = dtrtri(lower, lower=1)
    if info:
        raise ValueError(f"the Hessian's Cholesky factor is singular (LAPACK dtrtri info {info})")
    return np.tril(inv)


def _greedy(x: np.ndarray, books: np.ndarray) -> np.ndarray:
    """Residual (one codebook after the other) codes: the beam search's start. x [N, v] -> uint8 [N, m]."""
    idx = np.empty((x.shape[0], books.shape[0]), np.uint8)
    resid = x.copy()
    for i in range(books.shape[0]):
        idx[:, i] = assign(resid, books[i], None)
        resid -= books[i][idx[:, i]]
    return idx


def _code(x: np.ndarray, books: np.ndarray, beam: int) -> np.ndarray:
    if books.shape[0] == 1:
        return assign(x, books[0], None)[:, None]
    return search_codes(x, books, _greedy(x, books), None, beam)


def _rms(w: np.ndarray) -> np.ndarray:
    s = np.sqrt((w.astype(np.float64) ** 2).mean(axis=1))
    s = np.maximum(s, 1e-8 + 1e-3 * s.max(initial=0.0))
    return s.astype(np.float16).astype(np.float32)


def gptq_codes(w: np.ndarray, h: np.ndarray, books: np.ndarray, group: int, beam: int = 8,
               damp: float = DAMP, act_order: bool = False, scales: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """w float32 [M, K], h [K, K] the input Hessian (X^T X / n), books [m, 2^b, v] (float16-exact) ->
    (codes uint8 [M, Kp/v, m], scales float32 [M, G] float16-rounded), Kp = K rounded up to v.

    act_order: quantize the segments in decreasing order of their inputs' H[k, k] (GPTQ's act-order: the
    inputs that matter most go first, while every other input can still absorb their error), with the
    scales fixed beforehand from the unchanged weights; else in input order, each group's scales taken
    from the weights as updated when the group is reached. scales: float [M, G] to use as they are (e.g. the
    fine-tuned ones, for PV-tuning's discrete step) instead of either choice."""
    rows, k = w.shape
    m, nc, v = books.shape
    if h.shape != (k, k):
        raise ValueError(f"the Hessian must be [{k}, {k}] for a weight of {k} inputs, got {h.shape}")
    if group % v:
        raise ValueError(f"group {group} must be a multiple of v={v}")
    kp = -(-k // v) * v
    nseg, ngroups = kp // v, -(-kp // group)
    wp = np.zeros((rows, kp), np.float64)
    wp[:, :k] = w
    hp = np.zeros((kp, kp), np.float64)
    hp[:k, :k] = h
    dead = np.diag(hp) <= 0
    wp[:, dead] = 0.0
    fixed = scales is not None
    if fixed:
        scales = np.asarray(scales, np.float32)
        if scales.shape != (rows, ngroups):
            raise ValueError(f"scales must be [{rows}, {ngroups}], got {scales.shape}")
    else:
        scales = np.empty((rows, ngroups), np.float32)
    if act_order:
        order = np.argsort(-np.diag(hp).reshape(nseg, v).sum(axis=1), kind="stable")  # segments, most important first
        for gi in range(ngroups if not fixed else 0):
            scales[:, gi] = _rms(wp[:, gi * group:(gi + 1) * group])
        block = group
    else:
        order = np.arange(nseg)
        block = group
    cols = (order[:, None] * v + np.arange(v)[None, :]).reshape(-1)  # permuted column -> input
    wp, hp = wp[:, cols], hp[np.ix_(cols, cols)]
    u = inverse_cholesky(hp, damp)
    idx = np.empty((rows, nseg, m), np.uint8)
    books64 = books.astype(np.float64)
    for b0 in range(0, kp, block):
        b1 = min(kp, b0 + block)
        blk = wp[:, b0:b1].copy()       # [M, block] updated within the block
        err = np.empty_like(blk)         # [M, block] the scaled errors (w - q) U_BB^-1
        if not act_order and not fixed:  # the block is the scale group
            scales[:, b0 // group] = _rms(blk)
        for c0 in range(b0, b1, v):
            c1 = c0 + v
            seg = int(order[c0 // v])
            s = scales[:, seg * v // group]
            uinv = np.linalg.inv(u[c0:c1, c0:c1])  # [v, v] upper
            x = blk[:, c0 - b0:c1 - b0] / s[:, None]  # normalized [M, v]
            code = _code((x @ uinv).astype(np.float32), (books64 @ uinv).astype(np.float32), beam)
            idx[:, seg] = code
            q = books64[0][code[:, 0]]
            for i in range(1, m):
                q = q + books64[i][code[:, i]]
            e = (blk[:, c0 - b0:c1 - b0] - s[:, None] * q) @ uinv  # [M, v]
            err[:, c0 - b0:c1 - b0] = e
            blk[:, c1 - b0:] -= e @ u[c0:c1, c1:b1]
        wp[:, b1:] -= err @ u[b0:b1, b1:]
    return idx, scales


def output_error(w: np.ndarray, wq: np.ndarray, h: np.ndarray) -> float:
    """tr((W - Wq) H (W - Wq)^T) = ||(W - Wq) X^T||^2 / n for H = X^T X / n."""
    d = (np.asarray(w, np.float64) - np.asarray(wq, np.float64))
    return float(((d @ np.asarray(h, np.float64)) * d).sum())


def _apply(books, idx, s_cols):
    """L(C): codes idx [M, nseg, m], books [m, nc, v], s_cols [M, Kp] -> Wq [M, Kp] (float64)."""
    rows, nseg, m = idx.shape
    out = books[0][idx[..., 0]]
    for i in range(1, m):
        out = out + books[i][idx[..., i]]
    return out.reshape(rows, -1) * s_cols


def _adjoint(g, idx, s_cols, nc):
    """L^T(G): G [M, Kp] -> [m, nc, v], the gradient of <G, L(C)> with respect to the codebooks."""
    rows, nseg, m = idx.shape
    v = g.shape[1] // nseg
    gs = (g * s_cols).reshape(rows * nseg, v)
    out = np.empty((m, nc, v), np.float64)
    for i in range(m):
        flat = idx[..., i].reshape(-1).astype(np.int64)
        for t in range(v):
            out[i, :, t] = np.bincount(flat, weights=gs[:, t], minlength=nc)
    return out


def refine_codebooks(w: np.ndarray, h: np.ndarray, idx: np.ndarray, scales: np.ndarray, books: np.ndarray,
                     group: int, steps: int = 8) -> np.ndarray:
    """The codebooks [m, nc, v] that minimize the output error tr((W - Wq) H (W - Wq)^T) for fixed codes
    idx [M, nseg, m] and scales [M, G]: conjugate gradients on this quadratic (Wq is linear in the codebooks),
    `steps` iterations from books, then float16-rounded; the start is returned if they do not lower the error."""
    rows, k = w.shape
    m, nc, v = books.shape
    kp = idx.shape[1] * v
    wp = np.zeros((rows, kp), np.float64)
    wp[:, :k] = w
    hp = np.zeros((kp, kp), np.float64)
    hp[:k, :k] = h
    s_cols = np.repeat(scales.astype(np.float64), group, axis=1)[:, :kp]
    c = books.astype(np.float64)
    r = -_adjoint((_apply(c, idx, s_cols) - wp) @ hp, idx, s_cols, nc)  # minus half the gradient
    p = r.copy()
    rr = float((r * r).sum())
    for _ in range(steps):
        if rr <= 1e-30:
            break
        lp = _apply(p, idx, s_cols)
        curv = float(((lp @ hp) * lp).sum())
        if curv <= 1e-30:
            break
        alpha = rr / curv
        c = c + alpha * p
        r = r - alpha * _adjoint(lp @ hp, idx, s_cols, nc)
        rr_new = float((r * r).sum())
        p = r + (rr_new / rr) * p
        rr = rr_new
    new = c.astype(np.float16).astype(np.float32)
    before = output_error(w, _apply(books.astype(np.float64), idx, s_cols)[:, :k], h)
    after = output_error(w, _apply(new.astype(np.float64), idx, s_cols)[:, :k], h)
    return new if after < before else books
