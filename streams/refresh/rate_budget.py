"""A token bucket: work that may run at most `rate` items per second, with up to one
second's worth saved up as a burst. The refresh loop paces neighbour refreshes and hot-swap
re-encoding with one each, so neither can crowd out the refresh of freshly dirtied nodes."""
from __future__ import annotations

import time
from typing import Callable


class RateBudget:
    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._saved = 0.0
        self._t = clock()

    def available(self) -> int:
        """Whole items that may run now (the bucket refills at `rate`, holds at most `rate`)."""
        t = self._clock()
        self._saved = min(self.rate, self._saved + (t - self._t) * self.rate)
        self._t = t
        return int(self._saved)

    def spend(self, n: int) -> None:
        self._saved -= n

    def reset(self) -> None:
        """Start empty: a new run of work gets no burst saved up before it."""
        self._saved, self._t = 0.0, self._clock()
