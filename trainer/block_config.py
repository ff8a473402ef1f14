"""The collaborative block's fitting settings: what the trainer fits and chooses on its
holdouts (`trainer.collaborative_fit`). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass



@dataclass(frozen=True)
class CollaborativeConfig:
    rank: int | None = None          # block width (0: no block; None: chosen on the holdout
                                     # from `rank_grid` by the block alone, a wider one only
                                     # on a clear lead: session data needs more of EASE^R's
                                     # rank than a shop's year)
    rank_grid: tuple[int, ...] = (128, 256, 512)
    weight: float | None = None      # block score spread / encoder score spread (None: chosen
                                     # on the holdout from `weight_grid`)
    weight_grid: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    l2_grid: tuple[float, ...] = (30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0)   # EASE^R lambdas
    holdout: float = 0.1             # last share of the training window's engagements that
                                     # chooses lambda and the weight
    weight_windows: int = 1          # successive holdout windows (each a `holdout` share, the
                                     # last ending the training window) whose users' Recall@20
                                     # together choose the weight
    min_holdout_users: int = 200     # users with a history the holdout windows judge together:
                                     # earlier windows (each a `holdout` share) are added until
                                     # they hold this many, up to `max_holdout_share`
    max_holdout_share: float = 0.5   # the most of the training window the holdouts may cover
    max_items: int = 5_000           # the most-engaged items, solved densely (an I x I EASE^R
                                     # solve per lambda tried: cubic in this); every other item
                                     # with enough users is folded in against them (block_fit)
    unit_users: bool = True          # a user's block set to a fixed length (False: the plain
                                     # sum, whose share grows with the user's history)
    recency_days: float | None = None    # tau of a user's item weights in days (0: all alike;
                                         # None: the holdout's choice among `recency_taus`)
    recency_windows: tuple[float, ...] = (0.0, 2.0, 4.0, 8.0, 16.0)   # taus in holdout windows,
                                     # their weights averaged: a data set's clock is its own
                                     # (a day of sessions, a shop's season, a decade of
                                     # ratings), so the scales are multiples of the last
                                     # holdout window's length (Online Retail's: 16 days)
    recency_gaps: tuple[float, ...] = (1.0, 4.0, 16.0)   # single taus in multiples of the
                                     # median time between a user's successive engagements
                                     # (a click session's: a minute), each chosen over the
                                     # windows' mixture only on a clear lead: where intent
                                     # lives for minutes, the last engagements say most
    fit_days: float | None = None    # tau of the pairs' weights in EASE^R's fit in days (0:
                                     # binary; None: the holdout's choice of the binary fit and
                                     # the fits at every tau of `fit_windows` summed, each at
                                     # unit score spread)
    fit_windows: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)     # in holdout windows
    next_periods: int = 2            # periods of the next-period regression added to EASE^R
                                     # (`trainer.next_period`; 0: none), each as long as the
                                     # holdout window; on Online Retail's windows before its
                                     # test window 2 ranked better than 4 (docs/evaluation.md)
    next_l2: float = 3000.0          # its ridge lambda
    next_weight: float | None = None     # its score spread over EASE^R's (None: chosen on the
                                         # holdout from `next_grid` by the block alone, above
                                         # the lightest only on a clear lead)
    next_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
    propagation_layers: int = 2      # layers of the graph propagation added to the block
                                     # (`trainer.propagation`; 0: none)
    propagation_weight: float | None = None   # its score spread over the rest of the block's
                                              # (None: chosen on the holdout from
                                              # `propagation_grid` by the block alone, above
                                              # the lightest only on a clear lead)
    propagation_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)

    def __post_init__(self) -> None:
        if (self.rank is not None and self.rank < 0) or not self.rank_grid \
                or min(self.rank_grid) < 1 \
                or (self.weight is not None and self.weight < 0) or self.max_items < 2 \
                or not 0 < self.holdout < 1 or not self.l2_grid or min(self.l2_grid) <= 0 \
                or self.weight_windows < 1 or self.holdout * self.weight_windows >= 1 \
                or self.min_holdout_users < 0 or not 0 < self.max_holdout_share < 1 \
                or not self.weight_grid or min(self.weight_grid) < 0 \
                or (self.recency_days is not None and self.recency_days < 0) \
                or not self.recency_windows or min(self.recency_windows) < 0 \
                or min(self.recency_gaps, default=1.0) <= 0 \
                or (self.fit_days is not None and self.fit_days < 0) \
                or not self.fit_windows or min(self.fit_windows) < 0 \
                or self.next_periods < 0 or self.next_l2 <= 0 \
                or (self.next_weight is not None and self.next_weight < 0) \
                or not self.next_grid or min(self.next_grid) < 0 \
                or self.propagation_layers < 0 \
                or (self.propagation_weight is not None and self.propagation_weight < 0) \
                or not self.propagation_grid or min(self.propagation_grid) < 0:
            raise ValueError("collaborative: rank >= 0 or None, rank_grid >= 1, weight >= 0 or "
                             "None, max_items >= 2, holdout in (0, 1), weight_windows >= 1 with "
                             "holdout x weight_windows < 1, min_holdout_users >= 0, "
                             "max_holdout_share in (0, 1), non-empty l2_grid (> 0) and "
                             "weight_grid (>= 0), "
                             "recency_days and fit_days >= 0 or None, non-empty recency_windows "
                             "and fit_windows (>= 0), recency_gaps > 0, next_periods >= 0, next_l2 > 0, "
                             "next_weight >= 0 or None, non-empty next_grid (>= 0), "
                             "propagation_layers >= 0, propagation_weight >= 0 or None, "
                             "non-empty propagation_grid (>= 0)")

    @property
    def enabled(self) -> bool:
        return self.rank != 0

    def ranks(self) -> tuple[int, ...]:
        """The block widths the holdout chooses among (one when configured)."""
        return (self.rank,) if self.rank is not None else tuple(sorted(self.rank_grid))

    def next_weights(self) -> tuple[float, ...]:
        """The next-period part's weights the holdout chooses among (one when configured;
        (0,) when it has no periods)."""
        if self.next_periods == 0:
            return (0.0,)
        return (self.next_weight,) if self.next_weight is not None else tuple(self.next_grid)

    def propagation_weights(self) -> tuple[float, ...]:
        """The propagation's weights the holdout chooses among (one when configured; (0,)
        without layers)."""
        if self.propagation_layers == 0:
            return (0.0,)
        return (self.propagation_weight,) if self.propagation_weight is not None \
            else tuple(self.propagation_grid)

    def fits(self, window_days: float) -> tuple[float | tuple[float, ...], ...]:
        """EASE^R's fits the holdout chooses among, with lambda: the taus (`fit_windows` x
        the holdout window's length) whose fits are summed (`ease_scales`), and the binary
        fit (0): a shop's catalogue moves with its seasons, a week of click sessions does
        not, and the two differ by more than one window's noise (28 % and 6 % on Online
        Retail's and YOOCHOOSE's holdouts, in opposite directions); a configured tau alone."""
        if self.fit_days is not None:
            return (self.fit_days,)
        return (tuple(round(m * window_days, 3) for m in self.fit_windows), 0.0)

    def recency_taus(self, window_days: float, gap_days: float = 0.0
                     ) -> tuple[float | tuple[float, ...], ...]:
        """A user's item weights the holdout chooses among, the default first: the taus
        (`recency_windows` x the holdout window's length) whose weights are averaged
        (`recency_weighted`), then one tau per `recency_gaps` x `gap_days` (the median time
        between a user's successive engagements; none when 0); a configured tau alone."""
        if self.recency_days is not None:
            return (self.recency_days,)
        mixture = tuple(round(m * window_days, 3) for m in self.recency_windows)
        gaps = tuple(m * gap_days for m in self.recency_gaps) if gap_days > 0 else ()
        return (mixture, *gaps)
