"""Decay algebra: a time-decayed sum held as ``(w, t_ref)``.

Its value at time t is ``w * 2^(-(t - t_ref) / half_life)``, written with a precomputed
``rate = ln2 / half_life`` (1/ms). Adding an event moves ``t_ref`` to the later of the two
times and decays the older side onto it, so addition is commutative and associative
(exactly in real arithmetic, to rounding in floats): events applied in any order, or
replayed in another order, give the same state. ``rate == 0`` is a structural edge that
never fades: a plain sum.

The scalar forms (`add`, `value_at`) serve the per-event write path; the numpy forms
(`values_at`, `group_sums`) apply the same algebra to whole columns at once.
"""
from __future__ import annotations

import math

import numpy as np

_exp = math.exp


def add(w: float, t_ref: int, dw: float, t: int, rate: float) -> tuple[float, int]:
    """(w, t_ref) + an event of weight dw at time t -> new (w, t_ref)."""
    if t >= t_ref:
        if rate and t != t_ref:
            w *= _exp(-rate * (t - t_ref))
        return w + dw, t
    return w + (dw * _exp(-rate * (t_ref - t)) if rate else dw), t_ref


def value_at(w: float, t_ref: int, t: int, rate: float) -> float:
    """The decayed value at time t (t before t_ref extrapolates backwards)."""
    if not rate or t == t_ref:
        return w
    return w * _exp(-rate * (t - t_ref))


def rate_from_half_life(half_life_s: float | None) -> float:
    """ln 2 / half-life in 1/ms; None or inf means never decays."""
    if half_life_s is None or math.isinf(half_life_s):
        return 0.0
    if half_life_s <= 0:
        raise ValueError(f"half-life must be positive, got {half_life_s!r}")
    return math.log(2) / (half_life_s * 1000.0)


def values_at(w: np.ndarray, t_ref: np.ndarray, t, rate: np.ndarray) -> np.ndarray:
    """`value_at` over columns: each w decayed from its t_ref to t (rate 0: unchanged)."""
    return np.where(rate != 0, w * np.exp(-rate * (t - t_ref)), w)


def group_sums(key: np.ndarray, w: np.ndarray, t: np.ndarray, rate: np.ndarray):
    """Per distinct `key`, the sum of its (w, t) terms: t_ref = the latest t, w = the sum of
    each w decayed onto it (`add` over a whole group at once).
    -> (keys, first index of each key's group in `key`, w, t_ref)."""
    if len(key) == 0:
        return key[:0], np.zeros(0, np.int64), np.zeros(0, np.float64), t[:0]
    order = np.argsort(key, kind="stable")
    k = key[order]
    start = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    tref = np.maximum.reduceat(t[order], start)
    grp = np.repeat(np.arange(len(start)), np.diff(np.r_[start, len(k)]))
    wd = w[order] * np.exp(-rate[order] * (tref[grp] - t[order]))
    return k[start], order[start], np.add.reduceat(wd, start), tref
