"""The codebook quantizer (AQLM-style, vectorized numpy): scale-normalize, k-means, then alternate codes
and codebooks.

    idx, scales, books = fit_codebooks(w, m=1, v=4, b=8, group=128, seed=0)

1. Scales: the RMS of each (row, group of `group` inputs); the normalized weights u = w / s are cut into
   vectors of v consecutive inputs.
2. Init: k-means (k-means++ seeds, Lloyd steps) on a seeded sample of the vectors for codebook 1; for m > 1
   each next codebook is k-means on the residual of the ones before (residual VQ).
3. Refinement rounds over all vectors:
   - codes: for m > 1, codebook_beam.search_codes: the exact joint optimum when nc**m <= 256 (e.g. m2 b4),
     else AQLM's beam search (width `beam`, default 8; never increases the error);
   - codebooks: the weighted least-squares optimum for the fixed codes (all m jointly, normal equations over
     the one-hot code matrix, built with bincount).
4. Codebooks rounded to float16, codes re-chosen for them, and each (row, group) scale refit by least squares.

The error minimized is sum over weights of  s^2 * h_k * (u - u_hat)^2 = h_k (w - w_hat)^2, with h_k an optional
per-input-channel importance (mean x_k^2 over calibration tokens: the diagonal of the layer's Hessian).
Deterministic for a given seed (numpy's generator, no threads-dependent reductions in the choices).
"""
from __future__ import annotations

import numpy as np

from lowbit.formats.codebook_beam import assign, search_codes

SAMPLE = 1 << 15  # vectors the k-means initialization runs on
INIT_STEPS = 12


def group_rms(w: np.ndarray, group: int) -> np.ndarray:
    """w float32 [M, Kp] (zero-padded) -> float16-rounded float32 [M, G], the RMS of each group's real inputs."""
    m, kp = w.shape
    g = -(-kp // group)
    wp = np.zeros((m, g * group), np.float32)
    wp[:, :kp] = w
    s = np.sqrt((wp.reshape(m, g, group) ** 2).mean(axis=2))
    s = np.maximum(s, 1e-8 + 1e-3 * s.max(initial=0.0))
    return s.astype(np.float16).astype(np.float32)


def kmeans(x: np.ndarray, wt: np.ndarray | None, nc: int, rng: np.random.Generator, steps: int = INIT_STEPS) -> np.ndarray:
    """Weighted k-means on x [n, v] with k-means++ seeding -> centroids float32 [nc, v]."""
    n = x.shape[0]
    if n <= nc:
        books = np.zeros((nc, x.shape[1]), np.float32)
        books[:n] = x
        return books
    first = rng.integers(n)
    books = [x[first]]
    d2 = ((x - x[first]) ** 2).sum(axis=1)
    # k-means++ in batches of 16 seeds (each batch drawn by squared distance to the seeds so far)
    while len(books) < nc:
        k = min(16, nc - len(books))
        p = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1.0 / n)
        pick = rng.choice(n, size=k, replace=False, p=p)
        for i in pick:
            books.append(x[i])
            d2 = np.minimum(d2, ((x - x[i]) ** 2).sum(axis=1))
    books = np.array(books, np.float32)
    w1 = np.ones_like(x) if wt is None else wt
    for _ in range(steps):
        idx = assign(x, books, wt).astype(np.int64)
        books = update_single(x, w1, idx, books)
    return books


def update_single(x, wt, idx, old) -> np.ndarray:
    """Weighted mean per centroid (unused centroids keep their value)."""
    nc, v = old.shape
    num = np.stack([np.bincount(idx, weights=wt[:, t] * x[:, t], minlength=nc) for t in range(v)], axis=1)
    den = np.stack([np.bincount(idx, weights=wt[:, t], minlength=nc) for t in range(v)], axis=1)
    return np.where(den > 0, num / np.maximum(den, 1e-30), old).astype(np.float32)


def update_joint(x, wt, idx, books) -> np.ndarray:
    """Least squares for all m codebooks at once given codes idx [N, m]: min sum wt (x - sum_i C_i[idx_i])^2.

    Per coordinate t: (B^T D_t B + lam I) c_t = B^T D_t x_t + lam c_old, B the one-hot [N, m*nc] code matrix
    (the ridge keeps unused centroids in place). Without per-coordinate weights D_t is shared by all t."""
    m, nc, v = books.shape
    n = x.shape[0]
    offs = idx.astype(np.int64) + np.arange(m, dtype=np.int64)[None, :] * nc  # column of each code in B
    shared = bool(np.all(wt == wt[:, :1]))
    cols = range(1) if shared else range(v)
    size = m * nc
    out = np.empty((m * nc, v), np.float64)
    old = books.reshape(m * nc, v).astype(np.float64)
    for t in cols:
        wcol = wt[:, t].astype(np.float64)
        A = np.zeros((size, size), np.float64)
        for i in range(m):
            for j in range(m):
                A[i * nc:(i + 1) * nc, j * nc:(j + 1) * nc] += np.bincount(
                    idx[:, i].astype(np.int64) * nc + idx[:, j], weights=wcol, minlength=nc * nc).reshape(nc, nc)
        lam = 1e-4 * np.trace(A) / size + 1e-12
        A[np.diag_indices(size)] += lam
        ts = range(v) if shared else [t]
        rhs = np.stack([sum(np.bincount(offs[:, i], weights=wcol * x[:, tt], minlength=size) for i in range(m))
                        for tt in ts], axis=1) + lam * old[:, list(ts)]
        out[:, list(ts)] = np.linalg.solve(A, rhs)
    return out.reshape(m, nc, v).astype(np.float32)


def reconstruct(books: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """books [m, nc, v], idx [N, m] -> [N, v]."""
    out = books[0][idx[:, 0]]
    for i in range(1, books.shape[0]):
        out = out + books[i][idx[:, i]]
    return out


def codes_for(x, books, idx, wt, beam):
    """Codes [N, m] for x under books [m, nc, v] (m > 1: codebook_beam.search_codes from idx)."""
    if books.shape[0] == 1:
        return assign(x, books[0], wt)[:, None]
    return search_codes(x, books, idx, wt, beam)


def fit_codebooks(w: np.ndarray, m: int, v: int, b: int, group: int, seed: int = 0, iters: int = 4,
                  importance: np.ndarray | None = None, beam: int = 8, hessian: np.ndarray | None = None,
                  damp: float = 0.01, refine: int = 0, act_order: bool = True):
    """w float32 [M, K] -> (codes uint8 [M, Kp/v, m], scales float32 [M, G], codebooks float32 [m, 2^b, v]),
    scales and codebooks float16-rounded. importance: float [K] (mean x^2 per input channel) or None.
    hessian: float [K, K] = X^T X / n of the layer's inputs: the codebooks are fit with its diagonal as the
    importance, then codes and scales are re-chosen with error feedback (codebook_gptq, act_order: in
    GPTQ's act-order), kept if they lower
    the output error tr((W - Wq) H (W - Wq)^T); refine: then that many conjugate-gradient steps on the
    codebooks for this output error (codebook_gptq.refine_codebooks; 0: none)."""
    if hessian is not None:
        from lowbit.formats.codebook_gptq import gptq_codes, output_error

        hessian = np.asarray(hessian, np.float64)
        if hessian.shape != (w.shape[1], w.shape[1]):
            raise ValueError(f"hessian must be [{w.shape[1]}, {w.shape[1]}], got {hessian.shape}")
        diag = np.maximum(np.diag(hessian), 0.0) if importance is None else importance
        idx, s, books = fit_codebooks(w, m, v, b, group, seed, iters, diag, beam)
        idx_f, s_f = gptq_codes(w, hessian, books, group, beam, damp, act_order)
        k = w.shape[1]

        def wq(i, sc):
            return (reconstruct(books, i.reshape(-1, m)).reshape(w.shape[0], -1)
                    * np.repeat(sc, group, axis=1)[:, :i.shape[1] * v])[:, :k]
        if output_error(w, wq(idx_f, s_f), hessian) >= output_error(w, wq(idx, s), hessian):
            idx_f, s_f = idx, s
        if refine:
            from lowbit.formats.codebook_gptq import refine_codebooks

            books = refine_codebooks(w, hessian, idx_f, s_f, books, group, steps=refine)
        return idx_f, s_f, books
    rows, k = w.shape
    kp = -(-k // v) * v
    nseg, nc = kp // v, 1 << b
    wp = np.zeros((rows, kp), np.float32)
    wp[:, :k] = w
    s = group_rms(wp, group)  # [M, G]
    seg_group = (np.arange(nseg) * v) // group
    s_seg = s[:, seg_group]  # [M, nseg]
    x = (wp.reshape(rows, nseg, v) / s_seg[..., None]).reshape(-1, v)
    h = np.ones(kp, np.float32)
    h[k:] = 0.0
    if importance is not None:
        imp = np.asarray(importance, np.float32).reshape(-1)
        if imp.shape[0] != k:
            raise ValueError(f"importance must have K={k} entries, got {imp.shape[0]}")
        h[:k] = imp / max(float(imp.mean()), 1e-30) + 1e-3
    wt = ((s_seg ** 2)[..., None] * h.reshape(nseg, v)[None]).reshape(-1, v).astype(np.float32)
    uniform = importance is None and k == kp  # weights per vector only: plain distances pick the same codes
    wt_assign = None if uniform else wt
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    sample = np.sort(rng.choice(n, size=min(n, SAMPLE), replace=False))
    books = np.zeros((m, nc, v), np.float32)
    resid = x[sample].copy()
    for i in range(m):
        books[i] = kmeans(resid, None if wt_assign is None else wt[sample], nc, rng)
        resid -= books[i][assign(resid, books[i], None if wt_assign is None else wt[sample]).astype(np.int64)]
    idx = np.zeros((n, m), np.uint8)
    resid = x.copy()
    for i in range(m):  # residual (greedy) codes: the beam search's starting point
        idx[:, i] = assign(resid, books[i], wt_assign)
        resid -= books[i][idx[:, i]]
    del resid
    for it in range(iters + 1):
        idx = codes_for(x, books, idx, wt_assign, beam)
        if it == iters:
            break
        books = update_joint(x, wt, idx, books) if m > 1 else update_single(x, wt, idx[:, 0].astype(np.int64), books[0])[None]
    books = books.astype(np.float16).astype(np.float32)
    idx = codes_for(x, books, idx, wt_assign, beam)  # codes for the stored (float16) codebooks
    # scales: least squares per (row, group) for the final unit reconstruction
    u_hat = reconstruct(books, idx).reshape(rows, nseg * v)
    g = s.shape[1]
    pad = g * group - kp
    hw = np.pad(h[None, :] * u_hat, ((0, 0), (0, pad))).reshape(rows, g, group)
    num = (hw * np.pad(wp, ((0, 0), (0, pad))).reshape(rows, g, group)).sum(axis=2)
    den = (hw * np.pad(u_hat, ((0, 0), (0, pad))).reshape(rows, g, group)).sum(axis=2)
    s_new = np.where(den > 1e-30, num / np.maximum(den, 1e-30), s)
    s_new = s_new.astype(np.float16).astype(np.float32)
    return idx.reshape(rows, nseg, m), s_new, books
