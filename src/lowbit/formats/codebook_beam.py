"""Code search for additive codebooks (m > 1): exact joint search when the m codebooks have few joint codes,
else AQLM's beam search. 

    idx = search_codes(x, books, idx, wt, beam=8)    # x [N, v], books [m, nc, v], idx uint8 [N, m] (start)

Beam search (AQLM, Egiazarian et al. 2024, section 3.1): a beam of `beam` distinct code tuples per vector
starts at the current codes; for each codebook i in turn, every beam member's code i is replaced by each of
the nc centroids and the `beam` best distinct tuples are kept; after the sweep the best tuple wins. The
current codes are always among the candidates, so the error never increases. Native (kernels/codebook.cpp
codebook_beam, on the thread pool), deterministic (no sampling; ties keep the earlier candidate).
"""
from __future__ import annotations

import numpy as np

from lowbit import _native

JOINT_MAX = 256          # exact joint search when nc**m is at most this (one native nearest-centroid pass)


def assign(x: np.ndarray, books: np.ndarray, wt: np.ndarray | None) -> np.ndarray:
    """Nearest centroid of each vector (native, on the thread pool). x [N, v], books [nc <= 256, v],
    wt [N, v] coordinate weights or None -> uint8 [N]."""
    out = np.empty(x.shape[0], np.uint8)
    _native.codebook_assign(np.ascontiguousarray(x, np.float32),
                            None if wt is None else np.ascontiguousarray(wt, np.float32),
                            np.ascontiguousarray(books.T, np.float32), out)
    return out


def joint_books(books: np.ndarray) -> np.ndarray:
    """[m, nc, v] -> [nc**m, v]: every sum C_0[c_0] + ... + C_{m-1}[c_{m-1}], c_0 the slowest index."""
    m, nc, v = books.shape
    out = books[0]
    for i in range(1, m):
        out = (out[:, None, :] + books[i][None, :, :]).reshape(-1, v)
    return out


def joint_codes(x: np.ndarray, books: np.ndarray, wt: np.ndarray | None) -> np.ndarray:
    """The exact best code tuple per vector (nc**m <= 256) -> uint8 [N, m]."""
    m, nc, _ = books.shape
    flat = assign(x, joint_books(books), wt).astype(np.int64)
    idx = np.empty((x.shape[0], m), np.uint8)
    for i in range(m - 1, -1, -1):
        idx[:, i] = flat % nc
        flat //= nc
    return idx


def search_codes(x: np.ndarray, books: np.ndarray, idx: np.ndarray, wt: np.ndarray | None, beam: int = 8) -> np.ndarray:
    """Code tuples for x [N, v] under additive codebooks books [m, nc, v], starting from idx uint8 [N, m]:
    exact when nc**m <= 256, else beam search of width `beam`. wt [N, v] coordinate weights or None."""
    m, nc, v = books.shape
    if nc ** m <= JOINT_MAX:
        return joint_codes(x, books, wt)
    return beam_codes(x, books, idx, wt, beam)


def beam_codes(x: np.ndarray, books: np.ndarray, idx: np.ndarray, wt: np.ndarray | None, beam: int) -> np.ndarray:
    """AQLM beam search (native, on the thread pool) from the start tuples idx [N, m] -> uint8 [N, m]."""
    out = np.array(idx, np.uint8, order="C", copy=True)
    _native.codebook_beam(np.ascontiguousarray(x, np.float32),
                          None if wt is None else np.ascontiguousarray(wt, np.float32),
                          np.ascontiguousarray(books, np.float32), out, int(beam))
    return out
