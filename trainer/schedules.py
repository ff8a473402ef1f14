"""Schedules computed before training (DINO style): arrays indexed by step, checked for length."""
from __future__ import annotations

import numpy as np


def cosine(start: float, end: float, steps: int, warmup_steps: int = 0, warmup_start: float = 0.0) -> np.ndarray:
    """Linear warm-up to `start`, then cosine from `start` to `end`; exactly `steps` values."""
    if steps < 1 or not 0 <= warmup_steps <= steps:
        raise ValueError(f"need steps >= 1 and 0 <= warmup_steps <= steps, got {steps}, {warmup_steps}")
    warm = np.linspace(warmup_start, start, warmup_steps, endpoint=False)
    n = steps - warmup_steps
    t = np.arange(n) / max(1, n - 1)
    out = np.concatenate([warm, end + 0.5 * (start - end) * (1 + np.cos(np.pi * t))])
    assert len(out) == steps
    return out


def teacher_momentum(steps: int, base: float = 0.996, final: float = 1.0) -> np.ndarray:
    """EMA momentum of the teacher per step, rising from `base` to `final`."""
    return cosine(base, final, steps)
