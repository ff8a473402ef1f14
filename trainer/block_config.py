"""The collaborative block's fitting settings: what the trainer fits and chooses on its
holdouts (`trainer.collaborative_fit`). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CollaborativeConfig:
    """The served embedding's collaborative block (`[train.collaborative]`): low-rank EASE^R over
    users' items, fitted and chosen on the last share of the training window (the holdout)."""
    rank: int | None = None          # block width (0: no block; unset: chosen on the holdout
                                     # from `rank_grid` by the block alone, a wider one only
                                     # on a clear lead)
    rank_grid: tuple[int, ...] = (128, 256, 512)   # the widths the holdout chooses among
    weight: float | None = None      # the block's score spread over the encoder's (unset:
                                     # chosen on the holdout from `weight_grid`, beside the
                                     # block alone and the encoder alone)
    weight_grid: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)   # the weights it chooses among
    l2_grid: tuple[float, ...] = (30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0)   # EASE^R's ridge
                                     # lambdas the holdout chooses among
    holdout: float = 0.1             # last share of the training window's engagements that
                                     # chooses lambda, the width and the weight
    weight_windows: int = 1          # successive holdout windows (each a `holdout` share, the
                                     # last ending the training window) whose users' Recall@20
                                     # together choose the weight
    min_holdout_users: int = 200     # users with a history the holdout windows judge together:
                                     # earlier windows (each a `holdout` share) are added until
                                     # they hold this many, up to `max_holdout_share`
    max_holdout_share: float = 0.5   # the most of the training window the holdouts may cover
    max_items: int = 5_000           # the most-engaged items, solved densely (an I x I EASE^R
                                     # solve per lambda tried: cubic in this); every other item
                                     # with at least 3 users is folded in against them
    unit_users: bool = True          # a user's block set to a fixed length (false: the plain
                                     # sum, whose share grows with the user's history)
    recency_days: float | None = None    # tau of a user's item weights in its block, in days
                                         # (0: all alike; unset: the holdout's choice among
                                         # `recency_windows` and `recency_gaps`)
    recency_windows: tuple[float, ...] = (0.0, 2.0, 4.0, 8.0, 16.0)   # taus in holdout windows,
                                     # their weights averaged: a data set's clock is its own
                                     # (a day of sessions, a shop's season, a decade of
                                     # ratings), so the scales are multiples of the holdout
                                     # window's length
    recency_gaps: tuple[float, ...] = (1.0, 4.0, 16.0)   # single taus in multiples of the
                                     # median time between a user's successive engagements,
                                     # each chosen over the windows' mixture only on a clear
                                     # lead: where intent lives for minutes, the last
                                     # engagements say most
    fit_days: float | None = None    # tau of the pairs' weights in EASE^R's fit, in days (0:
                                     # binary; unset: the holdout's choice of the binary fit
                                     # and the fits at every tau of `fit_windows` summed)
    fit_windows: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)   # those taus, in holdout
                                     # windows
    next_periods: int = 2            # periods of the next-period regression added to EASE^R
                                     # (which items users engage new after what they had; 0:
                                     # none), each as long as the holdout window
    next_l2: float = 3000.0          # its ridge lambda
    next_weight: float | None = None     # its score spread over EASE^R's (unset: chosen on the
                                         # holdout from `next_grid` by the block alone, above
                                         # the lightest only on a clear lead)
    next_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)   # the weights it chooses among
    propagation_layers: int = 2      # layers of the graph propagation added to the block
                                     # (0: none)
    propagation_weight: float | None = None   # its score spread over the rest of the block's
                                              # (unset: chosen on the holdout from
                                              # `propagation_grid` by the block alone, above
                                              # the lightest only on a clear lead)
    propagation_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)   # the weights it chooses among
    prior_windows: tuple[float, ...] = (1.0,)   # taus of the popularity prior's decay
                                     # (`trainer.popularity_prior`) in holdout windows, their
                                     # weights averaged: what many engaged over about the
                                     # last window's span, on the data's own clock
    prior_weight: float | None = None    # its score spread over the block's (unset: chosen on
                                         # the holdout from `prior_grid` by the block alone,
                                         # each heavier weight only on a clear lead)
    prior_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0)   # the weights it chooses among

    def __post_init__(self) -> None:
        def unset_or_nonneg(v): return v is None or v >= 0
        checks = (("rank", unset_or_nonneg(self.rank), ">= 0 or unset"),
                  ("rank_grid", bool(self.rank_grid) and min(self.rank_grid) >= 1, "non-empty, each >= 1"),
                  ("weight", unset_or_nonneg(self.weight), ">= 0 or unset"),
                  ("weight_grid", bool(self.weight_grid) and min(self.weight_grid) >= 0, "non-empty, each >= 0"),
                  ("l2_grid", bool(self.l2_grid) and min(self.l2_grid) > 0, "non-empty, each > 0"),
                  ("holdout", 0 < self.holdout < 1, "in (0, 1)"),
                  ("weight_windows", 1 <= self.weight_windows and self.holdout * self.weight_windows < 1,
                   ">= 1, with holdout x weight_windows < 1"),
                  ("min_holdout_users", self.min_holdout_users >= 0, ">= 0"),
                  ("max_holdout_share", 0 < self.max_holdout_share < 1, "in (0, 1)"),
                  ("max_items", self.max_items >= 2, ">= 2"),
                  ("recency_days", unset_or_nonneg(self.recency_days), ">= 0 or unset"),
                  ("recency_windows", bool(self.recency_windows) and min(self.recency_windows) >= 0,
                   "non-empty, each >= 0"),
                  ("recency_gaps", min(self.recency_gaps, default=1.0) > 0, "each > 0"),
                  ("fit_days", unset_or_nonneg(self.fit_days), ">= 0 or unset"),
                  ("fit_windows", bool(self.fit_windows) and min(self.fit_windows) >= 0, "non-empty, each >= 0"),
                  ("next_periods", self.next_periods >= 0, ">= 0"),
                  ("next_l2", self.next_l2 > 0, "> 0"),
                  ("next_weight", unset_or_nonneg(self.next_weight), ">= 0 or unset"),
                  ("next_grid", bool(self.next_grid) and min(self.next_grid) >= 0, "non-empty, each >= 0"),
                  ("propagation_layers", self.propagation_layers >= 0, ">= 0"),
                  ("propagation_weight", unset_or_nonneg(self.propagation_weight), ">= 0 or unset"),
                  ("propagation_grid", bool(self.propagation_grid) and min(self.propagation_grid) >= 0,
                   "non-empty, each >= 0"),
                  ("prior_windows", bool(self.prior_windows) and min(self.prior_windows) >= 0,
                   "non-empty, each >= 0"),
                  ("prior_weight", unset_or_nonneg(self.prior_weight), ">= 0 or unset"),
                  ("prior_grid", bool(self.prior_grid) and min(self.prior_grid) >= 0, "non-empty, each >= 0"))
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

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

    def prior_weights(self) -> tuple[float, ...]:
        """The popularity prior's weights the holdout chooses among (one when configured)."""
        return (self.prior_weight,) if self.prior_weight is not None else tuple(self.prior_grid)

    def prior_taus(self, window_days: float) -> tuple[float, ...]:
        """The prior's decay taus in days: `prior_windows` x the holdout window's length."""
        return tuple(round(m * window_days, 3) for m in self.prior_windows)

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
