"""Fitting the served embedding's collaborative block around a training run
(`encoder.collaborative`).

Everything is chosen on holdouts of the training window itself, never on validation or test.
The holdout windows are its last `holdout` shares of positive engagements; earlier windows
are added until they judge `min_holdout_users` users with a history (a quiet data set's last
tenth may hold a few dozen). Only users with a history are judged (an empty block is the
same at every setting); with `SchemaConfig.session_users`, a session first seen in a window
is judged on its later half there given its earlier half. On the last window, by the block
alone: EASE^R's lambda with its fit (recency scales summed, or binary), the users' item
weights (the mean of season-long recency scales, or one scale of the data's own tempo, the
median time between a user's engagements, on a clear lead), the next-period and
graph-propagation weights (above 0 only on a clear lead), the rank (wider only on a clear
lead) and the popularity prior's weight (heavier only on a clear lead). The trainer visits
chunks in time order, so when it reaches a window's first chunk the student has seen nothing
from it: `choose` embeds the window's users and the items as of that chunk's start and
scores each part alone and their mixes; the served weight (`holdout.choose_parts`) never
serves an encoder below popularity, else the weight with the best mean, ties to the part
that ranks better alone. After training, `block` refits on the whole window with the chosen
settings, scales the block against the final encoder, and serves it alone when the encoder
collapsed.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Sequence

import numpy as np

from hirflow.encoder import collaborative as C
from hirflow.encoder.collaborative import BLOCK_ALONE
from hirflow.encoder.model import HierarchicalEncoder
from hirflow.state.events import Engagement
from hirflow.state.schema import SchemaConfig, node_type
from hirflow.state.views import ViewSampler
from hirflow.trainer.block_config import CollaborativeConfig
from hirflow.trainer.block_fit import fit, scaled
from hirflow.trainer.embedding import block_rows, embed, state_of
from hirflow.trainer.evaluate import positive_actions
from hirflow.trainer.holdout import Holdout, choose_parts, weights_tried
from hirflow.trainer.interactions import Interactions
from hirflow.trainer.item_item import taus_json, taus_label
from hirflow.trainer.next_period import NextPeriod
from hirflow.trainer.popularity_prior import Prior, choose_prior
from hirflow.trainer.propagation import Propagation

log = logging.getLogger(__name__)

DEFAULT_WEIGHT = 0.5     # when the run never reached a usable holdout (a window of one chunk)


def holdout_starts(data: Interactions, cfg: CollaborativeConfig, session_users: bool) -> list[int]:
    """The holdout windows' starts, oldest first: `weight_windows` windows of a `holdout`
    share each, the last ending the training window; earlier ones added while the windows
    together judge fewer than `min_holdout_users` users with a history (a quiet data set's
    last tenth may hold a few dozen), as long as they cover at most `max_holdout_share` of
    the window. A configured weight needs the last window only."""
    if cfg.weight is not None:
        return [data.quantile_time(1 - cfg.holdout)]
    starts: list[int] = []
    judged = 0
    j = 1
    while True:
        start = data.quantile_time(1 - cfg.holdout * j)
        judged += len(Holdout.at_time(data, start, starts[0] if starts else None, session_users).judged)
        starts.insert(0, start)
        if j >= cfg.weight_windows and (judged >= cfg.min_holdout_users
                                        or cfg.holdout * (j + 1) > cfg.max_holdout_share):
            break
        j += 1
    if len(starts) > cfg.weight_windows:
        log.info("collaborative block: %d holdout windows (%d users with a history)", len(starts), judged)
    return sorted(set(starts))


class CollaborativeFit:
    def __init__(self, events: Sequence[Engagement], schema: SchemaConfig,
                 cfg: CollaborativeConfig) -> None:
        self.events, self.schema, self.cfg = events, schema, cfg
        self.positive = sorted(positive_actions(schema))
        keep = set(self.positive)
        # a user-item engagement in either direction (an ad shown to a user counts as well)
        pairs = ((a, b, e.ts) for e in events if e.action in keep for a, b in ((e.src, e.dst), (e.dst, e.src)))
        self.data = Interactions.of(pairs, (schema.user_type,), schema.item_node_types, cfg.max_items)
        self.enabled = cfg.enabled and len(self.data.items) >= 2
        # the holdout windows' nominal starts, oldest first; a fixed weight needs the last only
        self.starts = holdout_starts(self.data, cfg, schema.session_users) if self.enabled else []
        # the next-period regression's periods are as long as the last holdout window
        span = self.data.last_time + 1 - self.starts[-1] if self.starts else 0
        self.next_base = NextPeriod(cfg.next_periods, int(span), cfg.next_l2, 0.0)
        # recency scales are multiples of this window's length, or of the median time
        # between a user's engagements: each data set's own clock
        self.window_days = max(span / C.DAY_MS, 1e-3)
        self.gap_days = self.data.median_gap() / C.DAY_MS
        self.windows: list[dict] = []        # each window reached: its weight curve (JSON)
        self.choice: dict | None = None      # what the holdout chose (JSON: kept in snapshots)

    def _holdout(self, at: int, until: int | None = None) -> Holdout:
        return Holdout.at_time(self.data, at, until, self.schema.session_users)

    @property
    def start(self) -> int | None:
        """The last holdout window's nominal start (None: no block to fit)."""
        return self.starts[-1] if self.starts else None

    def snapshot(self) -> dict:
        """What a resumed run needs: the windows reached and the choice, if made."""
        return {"windows": self.windows, "choice": self.choice}

    def restore(self, doc: dict | None) -> None:
        self.windows, self.choice = list((doc or {}).get("windows") or []), (doc or {}).get("choice")

    def due(self, cutoff: int) -> bool:
        """Whether the step whose views are as of `cutoff` (its chunk's start - 1) opens the
        next holdout window and nothing has been chosen yet."""
        return self.enabled and self.choice is None and self._reached() < len(self.starts) \
            and cutoff + 1 >= self.starts[self._reached()]

    def _reached(self) -> int:
        """How many nominal window starts the windows seen so far cover."""
        return self.windows[-1]["covers"] if self.windows else 0

    def choose(self, student: HierarchicalEncoder, cutoff: int, texts, dev) -> None:
        """Score the holdout window from `cutoff` + 1 (lambda, the fit's tau and the users'
        tau chosen on it unless configured, then the weight curve); on the last window,
        choose."""
        t = time.perf_counter()
        at = cutoff + 1
        # a chunk may pass several nominal starts: it opens the window of the last one passed
        covers = max(j for j, s in enumerate(self.starts) if s <= at) + 1
        until = self.starts[covers] if covers < len(self.starts) else None
        h = self._holdout(at, until)
        window = {"at": at, "covers": covers, "usable": h.usable}
        if h.usable:
            window.update(self._score(h, student, cutoff, texts, dev))
        self.windows.append(window)
        log.info("collaborative block: holdout window from %d (%d of %d), %s (%.1f s)", at, covers,
                 len(self.starts), f"{window.get('users', 0)} users" if h.usable else "not usable",
                 time.perf_counter() - t)
        if covers == len(self.starts):
            self.choice = self._decide(window)

    def _score(self, h: Holdout, student: HierarchicalEncoder, cutoff: int, texts, dev) -> dict:
        """On one window: lambda with the fit, the users' item weights, and each judged user's
        Recall@20 per weight of the grid (none when the weight is configured)."""
        lam, fit_days, l2_tried = h.choose_fit(self.cfg.l2_grid, self.cfg.fits(self.window_days))
        days, recency_tried = h.choose_recency(lam, fit_days,
                                               self.cfg.recency_taus(self.window_days, self.gap_days))
        next_weight, next_tried = h.choose_next(lam, fit_days, days, self.next_base,
                                                self.cfg.next_weights())
        prop_weight, prop_tried = h.choose_propagation(lam, fit_days, days, self.cfg.propagation_layers,
                                                       self.cfg.propagation_weights())
        rank, rank_tried = h.choose_rank(days, self.cfg.ranks())
        prior_weight, prior_tried = choose_prior(h, lam, fit_days, days, rank,
                                                 self.cfg.prior_taus(self.window_days),
                                                 self.cfg.prior_weights())
        per_user = {}
        if self.cfg.weight is None:
            users = [self.data.users[i] for i in h.judged]
            # sessions' first halves are history: their edges are in the state they are embedded from
            early = [e for e in self.events if e.ts > cutoff and ((e.src, e.dst, e.ts) in h.prefix
                                                                  or (e.dst, e.src, e.ts) in h.prefix)]
            at_ts = max([cutoff] + [e.ts for e in early])
            with state_of([e for e in self.events if e.ts <= cutoff] + early, self.schema) as sampler:
                eu = embed(student, sampler, users, at_ts, student.cfg, texts, dev)
                ei = embed(student, sampler, list(self.data.items), at_ts, student.cfg, texts, dev)
            curve = h.weight_curve(eu @ ei.T, lam, rank, weights_tried(self.cfg.weight_grid),
                                   self.cfg.unit_users, days, fit_days)
            # unrounded (JSON keeps a float exactly): a resumed run chooses as an unbroken one
            per_user = {str(w): [float(x) for x in r] for w, r in curve.items()}
            per_user["popularity"] = [float(x) for x in h.popularity()]
        return {"users": int(len(h.judged)), "l2": lam, "fit_days": taus_json(fit_days),
                "recency_days": taus_json(days), "next_weight": next_weight, "rank": rank,
                "propagation_weight": prop_weight, "prior_weight": prior_weight,
                "prior_days": list(self.cfg.prior_taus(self.window_days)),
                "prior_recall@20": {f"{k:g}": round(v, 5) for k, v in prior_tried.items()},
                "propagation_recall@20": {f"{k:g}": round(v, 5) for k, v in prop_tried.items()},
                "rank_recall@20": {str(k): round(v, 5) for k, v in rank_tried.items()},
                # keyed "lambda/fit tau" ("lambda/15+30+..." for a sum of fits)
                "l2_recall@20": {f"{k[0]:g}/{taus_label(k[1])}": round(v, 5) for k, v in l2_tried.items()},
                "next_recall@20": {f"{k:g}": round(v, 5) for k, v in next_tried.items()},
                "recency_recall@20": {taus_label(k): round(v, 5) for k, v in recency_tried.items()},
                "per_user_recall@20": per_user}

    def _decide(self, last: dict) -> dict:
        """The choice once the last window is scored: its lambda, fit and users' weights, and
        the weight with the best Recall@20 over every usable window's users together."""
        if not last["usable"]:
            return {"at": last["at"], "usable": False}
        weight, tried, why = self.cfg.weight, {}, "configured"
        usable = [w for w in self.windows if w["usable"]]
        if weight is None:
            pooled = {k: np.concatenate([np.asarray(w["per_user_recall@20"][k]) for w in usable])
                      for k in last["per_user_recall@20"]}
            popularity = pooled.pop("popularity", None)
            weight, tried, why = choose_parts({float(k): v for k, v in pooled.items()}, popularity)
            if popularity is not None:
                tried["popularity"] = float(np.mean(popularity))
        choice = {k: last.get(k) for k in ("at", "usable", "l2", "fit_days", "recency_days",
                                           "l2_recall@20", "next_weight", "next_recall@20", "recency_recall@20",
                                           "propagation_weight", "propagation_recall@20",
                                           "prior_weight", "prior_days", "prior_recall@20",
                                           "rank", "rank_recall@20")}
        choice.update({"weight": weight, "why": why, "holdout_users": last["users"],
                       "judged_users": sum(w["users"] for w in usable),
                       "weight_recall@20": {str(k): round(v, 5) for k, v in tried.items()},
                       # each window's own curve: its mean Recall@20 per weight
                       "windows": [{"at": w["at"], "users": w["users"], "l2": w["l2"],
                                    "weight_recall@20": {k: round(float(np.mean(r)), 5)
                                                         for k, r in w["per_user_recall@20"].items()
                                                         if len(r)}}
                                   for w in usable]})
        log.info("collaborative block: %d holdout window(s), %d users, chose lambda %g, fit tau %s "
                 "days, recency tau %s days, next-period weight %g, weight %g (%s)", len(usable),
                 sum(w["users"] for w in usable), choice["l2"], taus_label(choice["fit_days"]),
                 taus_label(choice["recency_days"]), choice["next_weight"] or 0.0, weight, why)
        return choice

    def block(self, embs: np.ndarray, nodes: list[str], sampler: ViewSampler,
              encoder_ok: bool = True) -> C.CollaborativeBlock | None:
        """The block fitted on the whole window, scaled against the final encoder embeddings
        `embs` of `nodes` (users' blocks from the records `sampler` reads); served alone
        (`BLOCK_ALONE`) when the encoder is not `encoder_ok` (collapsed)."""
        if not self.enabled:
            return None
        choice = self.choice if self.choice and self.choice.get("usable") else None
        if choice is not None and not encoder_ok:
            choice = dict(choice, weight=BLOCK_ALONE, why="the encoder collapsed: the block alone")
        if choice is None:
            h = self._holdout(self.start)
            fit_days = self.cfg.fits(self.window_days)[0]
            lam = h.choose_fit(self.cfg.l2_grid, (fit_days,))[0] if h.usable \
                else sorted(self.cfg.l2_grid)[len(self.cfg.l2_grid) // 2]
            weight = self.cfg.weight if self.cfg.weight is not None else DEFAULT_WEIGHT
            if not encoder_ok:
                weight = BLOCK_ALONE
            log.warning("collaborative block: no holdout chunk to choose its weight on; weight %g", weight)
            choice = {"l2": lam, "weight": weight, "usable": False, "why": "no usable holdout",
                      "fit_days": taus_json(fit_days),
                      "recency_days": taus_json(self.cfg.recency_taus(self.window_days)[0]),
                      "rank": min(self.cfg.ranks()),
                      "next_weight": self.cfg.next_weights()[0],
                      "propagation_weight": self.cfg.propagation_weights()[0],
                      "prior_weight": min(self.cfg.prior_weights()),
                      "prior_days": list(self.cfg.prior_taus(self.window_days))}
        codes = self.schema.action_codes()
        block = fit(self.data, choice["l2"], choice.get("rank") or min(self.cfg.ranks()),
                      [codes[a] for a in self.positive],
                      (self.schema.user_type,), {"holdout": choice}, self.cfg.unit_users,
                      choice.get("recency_days") or 0.0, choice.get("fit_days") or 0.0,
                      replace(self.next_base, weight=choice.get("next_weight") or 0.0),
                      Propagation(self.cfg.propagation_layers, choice.get("propagation_weight") or 0.0),
                      Prior(choice.get("prior_weight") or 0.0, tuple(choice.get("prior_days") or ())))
        if block is None:
            return None
        row = {n: i for i, n in enumerate(nodes)}
        users = [n for n in nodes if node_type(n) == self.schema.user_type][:2000]
        items = [n for n in block.items if n in row]
        raw = block_rows(block, sampler, users, codes)
        key = block.item_rows([block.row[n] for n in items])
        enc = embs[[row[n] for n in users]] @ embs[[row[n] for n in items]].T
        return scaled(block, enc, raw @ key.T, choice["weight"])
