"""Fitting the served embedding's collaborative block around a training run
(`encoder.collaborative`).

Four settings are chosen on a holdout of the training window itself, never on validation or
test: EASE^R's lambda with its fit (the sum of fits at several recency scales by default, or
one tau of the pairs' weights: `CollaborativeConfig.fit_rule`), then the recency weights of
a user's items (their mix over several taus by default, or one tau: `recency_rule`; all by
the block alone), and the block's weight against the
encoder. The holdout starts at the
first time chunk that begins in the window's last `holdout` share of positive engagements.
The trainer visits chunks in time order, so when it reaches that chunk the student has seen
nothing from the holdout; `choose` then embeds the holdout's users and the vocabulary's items
as of the chunk's start, from a store of the events before it, and picks the weight by how
well the sum of scores ranks the holdout's new items (the best by default, or the lightest
within one standard error of the best: `CollaborativeConfig.weight_rule`). The choice is
kept in the resume snapshot. After training, `block` refits EASE^R on the whole window with
the chosen lambda and scales it against the final encoder's scores.
"""
from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np

from hirflow.encoder import collaborative as C
from hirflow.encoder.model import HierarchicalEncoder
from hirflow.state.events import Engagement
from hirflow.state.schema import SchemaConfig, node_type
from hirflow.state.views import ViewSampler
from hirflow.trainer.embedding import block_rows, embed, state_of
from hirflow.trainer.evaluate import positive_actions

log = logging.getLogger(__name__)

DEFAULT_WEIGHT = 0.5     # when the run never reached a usable holdout (a window of one chunk)


class CollaborativeFit:
    def __init__(self, events: Sequence[Engagement], schema: SchemaConfig,
                 cfg: C.CollaborativeConfig) -> None:
        self.events, self.schema, self.cfg = events, schema, cfg
        self.positive = sorted(positive_actions(schema))
        keep = set(self.positive)
        # a user-item engagement in either direction (an ad shown to a user counts as well)
        pairs = ((a, b, e.ts) for e in events if e.action in keep for a, b in ((e.src, e.dst), (e.dst, e.src)))
        self.data = C.Interactions.of(pairs, (schema.user_type,), schema.item_node_types, cfg.max_items)
        self.enabled = cfg.rank > 0 and len(self.data.items) >= 2
        self.start = self.data.quantile_time(1 - cfg.holdout) if self.enabled else None
        self.choice: dict | None = None      # what the holdout chose (JSON: kept in snapshots)

    def due(self, cutoff: int) -> bool:
        """Whether the step whose views are as of `cutoff` (its chunk's start - 1) opens the
        holdout and nothing has been chosen yet."""
        return self.enabled and self.choice is None and cutoff + 1 >= self.start

    def choose(self, student: HierarchicalEncoder, cutoff: int, texts, dev) -> None:
        """Choose lambda, and the fit's tau, the users' tau and the weight unless configured,
        on the holdout from `cutoff` + 1."""
        t = time.perf_counter()
        h = C.Holdout.at_time(self.data, cutoff + 1)
        if not h.usable:
            self.choice = {"at": cutoff + 1, "usable": False}
            return
        lam, fit_days, l2_tried = h.choose_fit(self.cfg.l2_grid, self.cfg.fits())
        days, days_tried = self.cfg.recency_days, {}
        if days is None:
            days, days_tried = h.choose_recency(lam, self.cfg.recencies(), fit_days)
        weight, w_tried = self.cfg.weight, {}
        rank = min(self.cfg.rank, len(self.data.items) - 1)
        if weight is None:
            users = [self.data.users[i] for i in h.judged]
            with state_of([e for e in self.events if e.ts <= cutoff], self.schema) as sampler:
                eu = embed(student, sampler, users, cutoff, student.cfg, texts, dev)
                ei = embed(student, sampler, list(self.data.items), cutoff, student.cfg, texts, dev)
            weight, w_tried = h.choose_weight(eu @ ei.T, lam, rank, self.cfg.weight_grid,
                                               self.cfg.unit_users, self.cfg.weight_rule, days,
                                               fit_days, self.cfg.factorization)
        self.choice = {"at": cutoff + 1, "usable": True, "l2": lam, "fit_days": C.taus_json(fit_days),
                       "recency_days": C.taus_json(days), "weight": weight, "holdout_users": int(len(h.judged)),
                       # keyed "lambda/fit tau" ("lambda/15+30+..." for a sum of fits)
                       "l2_recall@20": {f"{k[0]:g}/{C.taus_label(k[1])}": round(v, 5)
                                        for k, v in l2_tried.items()},
                       # keyed by tau ("0+30+..." for a mix)
                       "recency_recall@20": {C.taus_label(k): round(v, 5) for k, v in days_tried.items()},
                       "weight_recall@20": {str(k): round(v, 5) for k, v in w_tried.items()}}
        log.info("collaborative block: holdout of %d users chose lambda %g, fit tau %s days, "
                 "recency tau %s days, weight %g (%.1f s)", len(h.judged), lam,
                 C.taus_label(fit_days), C.taus_label(days), weight, time.perf_counter() - t)

    def block(self, embs: np.ndarray, nodes: list[str], sampler: ViewSampler) -> C.CollaborativeBlock | None:
        """The block fitted on the whole window, scaled against the final encoder embeddings
        `embs` of `nodes` (users' blocks from the records `sampler` reads)."""
        if not self.enabled:
            return None
        choice = self.choice if self.choice and self.choice.get("usable") else None
        if choice is None:
            h = C.Holdout.at_time(self.data, self.start)
            fit_days = self.cfg.fits()[0]       # the first candidate: no holdout to choose one
            lam = h.choose_fit(self.cfg.l2_grid, (fit_days,))[0] if h.usable \
                else sorted(self.cfg.l2_grid)[len(self.cfg.l2_grid) // 2]
            weight = self.cfg.weight if self.cfg.weight is not None else DEFAULT_WEIGHT
            log.warning("collaborative block: no holdout chunk to choose its weight on; weight %g", weight)
            choice = {"l2": lam, "weight": weight, "usable": False, "fit_days": C.taus_json(fit_days),
                      "recency_days": C.taus_json(self.cfg.recencies()[0])}
        codes = self.schema.action_codes()
        block = C.fit(self.data, choice["l2"], self.cfg.rank, [codes[a] for a in self.positive],
                      (self.schema.user_type,), {"holdout": choice}, self.cfg.unit_users,
                      choice.get("recency_days") or 0.0, choice.get("fit_days") or 0.0,
                      self.cfg.factorization)
        if block is None:
            return None
        row = {n: i for i, n in enumerate(nodes)}
        users = [n for n in nodes if node_type(n) == self.schema.user_type][:2000]
        items = [n for n in block.items if n in row]
        raw = block_rows(block, sampler, users, codes)
        key = block.key[[block.row[n] for n in items]]
        enc = embs[[row[n] for n in users]] @ embs[[row[n] for n in items]].T
        return C.scaled(block, enc, raw @ key.T, choice["weight"])
