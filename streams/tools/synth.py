"""A synthetic ads world with planted hierarchical interests, for quality and scale work.

Interests form a tree (coarse x mid x fine, 4 x 4 x 4 by default). Advertisers own
campaigns, campaigns run ads, ads promote products, pixels fire on products; every ad and
product belongs to one fine interest, and its entity text uses that interest's words. Users
hold 1-3 fine interests, some drift to a new one during the stream, and engage mostly inside
their interests through a sparse funnel impression -> click -> add_to_cart -> conversion.
User activity and ad popularity are Zipf-skewed. Some ads launch late (cold start).

Deterministic by seed; events are generated chunk by chunk in time order, so tens of
millions never sit in memory. Ground-truth labels go beside the events for evaluation.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from hirflow.state.events import Engagement, Entity, as_dict

LEXICON = {
    "sports": {"running": ["trail", "marathon", "sprint", "treadmill"],
               "cycling": ["road bike", "mountain bike", "helmet", "jersey"],
               "swimming": ["goggles", "swimsuit", "pool", "snorkel"],
               "tennis": ["racket", "tennis ball", "court shoes", "tennis bag"]},
    "home": {"kitchen": ["cookware", "knife set", "blender", "coffee maker"],
             "garden": ["lawn mower", "seeds", "planter", "hose"],
             "furniture": ["sofa", "desk", "bookshelf", "mattress"],
             "lighting": ["lamp", "led bulb", "chandelier", "night light"]},
    "tech": {"phones": ["smartphone", "phone case", "charger", "screen protector"],
             "computers": ["laptop", "keyboard", "monitor", "mouse"],
             "audio": ["headphones", "speaker", "earbuds", "microphone"],
             "gaming": ["console", "controller", "gaming chair", "vr headset"]},
    "fashion": {"shoes": ["sneakers", "boots", "sandals", "heels"],
                "bags": ["backpack", "handbag", "wallet", "suitcase"],
                "outerwear": ["jacket", "raincoat", "parka", "blazer"],
                "jewelry": ["necklace", "ring", "earrings", "watch"]},
}
ADJECTIVES = ["premium", "classic", "new", "lightweight", "durable", "compact", "pro", "eco"]
DAY_MS = 86_400_000


@dataclass(frozen=True)
class SynthConfig:
    seed: int = 7
    coarse: int = 4
    mid: int = 4                    # per coarse
    fine: int = 4                   # per mid
    advertisers: int = 32
    campaigns_per_advertiser: int = 3
    ads_per_campaign: int = 4
    pixels_per_advertiser: int = 1
    users: int = 2_000
    events: int = 100_000           # engagement events (structural edges not counted)
    start_ms: int = 1_767_225_600_000   # 2026-01-01T00:00Z; `hirflow synth --start now` for live
    span_days: float = 28.0
    late_launch: float = 0.2        # share of ads launched during the stream (cold start)
    drift: float = 0.3              # share of users who swap one interest mid-stream
    locality: float = 0.0           # chance that a user's 2nd/3rd interest shares the 1st's coarse one
    in_interest: float = 0.85       # impressions on the user's own interests
    ctr_in: float = 0.12
    ctr_out: float = 0.02
    cart_rate: float = 0.3          # of clicks
    conversion_rate: float = 0.35   # of carts
    zipf_users: float = 1.1
    zipf_ads: float = 1.05

    def __post_init__(self) -> None:
        if min(self.coarse, self.mid, self.fine, self.advertisers, self.users) < 1:
            raise ValueError("sizes must be >= 1")
        if self.events < 0:
            raise ValueError(f"events must be >= 0, got {self.events}")
        if not 0.0 <= self.locality <= 1.0:
            raise ValueError(f"locality must be in [0, 1], got {self.locality}")

    @property
    def n_fine(self) -> int:
        return self.coarse * self.mid * self.fine


def interest_words(cfg: SynthConfig, f: int) -> tuple[str, str, str]:
    """(coarse, mid, fine) words of fine interest f; synthetic tokens beyond the lexicon."""
    c, m, x = f // (cfg.mid * cfg.fine), (f // cfg.fine) % cfg.mid, f % cfg.fine
    if c < len(LEXICON):
        cw = list(LEXICON)[c]
        mids = LEXICON[cw]
        if m < len(mids):
            mw = list(mids)[m]
            if x < len(mids[mw]):
                return cw, mw, mids[mw][x]
            return cw, mw, f"{mw} type{x}"
        return cw, f"{cw} line{m}", f"{cw} line{m} type{x}"
    return f"topic{c}", f"topic{c} line{m}", f"topic{c} line{m} type{x}"


def _zipf_weights(n: int, a: float, rng: np.random.Generator) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** a
    rng.shuffle(w)
    return w / w.sum()


def entity_text(cfg: SynthConfig, f: int, kind: str, rng: np.random.Generator) -> str:
    """The text of an entity of `kind` planted in fine interest `f`: words of its fine, mid and
    coarse interests, so world knowledge carries the planted hierarchy."""
    cw, mw, fw = interest_words(cfg, f)
    adj = ADJECTIVES[int(rng.integers(len(ADJECTIVES)))]
    if kind == "ad":
        return f"{adj} {fw} deals for {mw} fans"
    if kind == "product":
        return f"{adj} {fw} - {mw}, {cw}"
    if kind == "campaign":
        return f"{mw} {fw} season campaign"
    return f"{mw} and {cw} brand"


class SynthWorld:
    """The entities of the world; `stream()` yields its events in time order."""

    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        self.rng = rng
        F = cfg.n_fine
        n_camp = cfg.advertisers * cfg.campaigns_per_advertiser
        n_ads = n_camp * cfg.ads_per_campaign
        # advertisers specialise in a mid interest; campaigns and ads in a fine one below it
        n_mid = cfg.coarse * cfg.mid
        self.adv_mid = rng.integers(0, n_mid, cfg.advertisers)
        self.camp_adv = np.repeat(np.arange(cfg.advertisers), cfg.campaigns_per_advertiser)
        self.camp_fine = self.adv_mid[self.camp_adv] * cfg.fine + rng.integers(0, cfg.fine, n_camp)
        self.ad_camp = np.repeat(np.arange(n_camp), cfg.ads_per_campaign)
        self.ad_fine = self.camp_fine[self.ad_camp]
        span = int(cfg.span_days * DAY_MS)
        late = rng.random(n_ads) < cfg.late_launch
        self.ad_launch = np.where(late, cfg.start_ms + rng.integers(span // 4, span, n_ads),
                                  cfg.start_ms)
        self.ad_pop = _zipf_weights(n_ads, cfg.zipf_ads, rng)
        self.ads_by_fine = [np.flatnonzero(self.ad_fine == f) for f in range(F)]
        # users: 1-3 fine interests, preferring interests that have ads
        has_ads = np.array([len(a) > 0 for a in self.ads_by_fine])
        pool = np.flatnonzero(has_ads)
        k = rng.integers(1, 4, cfg.users)
        self.user_interests = [list(rng.choice(pool, size=min(kk, len(pool)), replace=False))
                               for kk in k]
        if cfg.locality > 0:
            self._localise(pool)
        self.user_act = _zipf_weights(cfg.users, cfg.zipf_users, rng)
        drifting = rng.random(cfg.users) < cfg.drift
        self.user_drift = {int(u): (int(cfg.start_ms + rng.integers(span // 3, span)),
                                    int(rng.choice(pool)))
                           for u in np.flatnonzero(drifting)}

    def _localise(self, pool: np.ndarray) -> None:
        """Redraw each user's further interests, with chance `locality`, under the coarse
        interest of its first, so the coarse level is planted in behaviour as well as in text
        (people who buy running shoes also buy cycling gear). A generator of its own keeps the
        rest of the world identical to the one with locality 0."""
        cfg = self.cfg
        rng = np.random.default_rng(cfg.seed + 3)
        per_coarse = cfg.mid * cfg.fine
        for ints in self.user_interests:
            for j in range(1, len(ints)):
                if rng.random() < cfg.locality:
                    near = [int(f) for f in pool if f // per_coarse == ints[0] // per_coarse
                            and f not in ints]
                    if near:
                        ints[j] = near[int(rng.integers(len(near)))]

    # -- ids ------------------------------------------------------------------------------
    @staticmethod
    def user(u: int) -> str:
        return f"user:u{u}"

    @staticmethod
    def ad(a: int) -> str:
        return f"ad:a{a}"

    @staticmethod
    def product(a: int) -> str:
        return f"product:p{a}"

    # -- entities and structure -----------------------------------------------------------
    def structure(self) -> Iterator[tuple[int, Entity | Engagement]]:
        """(ts, entity or structural edge) for every entity, at its launch time."""
        cfg = self.cfg
        rng = np.random.default_rng(cfg.seed + 1)
        t0 = cfg.start_ms
        for a in range(cfg.advertisers):
            adv = f"advertiser:v{a}"
            yield t0, Entity(adv, t0, entity_text(cfg, int(self.adv_mid[a]) * cfg.fine, "advertiser", rng))
            for j in range(cfg.pixels_per_advertiser):
                yield t0, Entity(f"pixel:x{a}_{j}", t0, None, {"advertiser": adv})
        for c in range(len(self.camp_adv)):
            camp = f"campaign:c{c}"
            yield t0, Entity(camp, t0, entity_text(self.cfg, int(self.camp_fine[c]), "campaign", rng))
            yield t0, Engagement(f"advertiser:v{self.camp_adv[c]}", camp, "owns", t0)
        for a in range(len(self.ad_camp)):
            t = int(self.ad_launch[a])
            f = int(self.ad_fine[a])
            adv = int(self.camp_adv[self.ad_camp[a]])
            yield t, Entity(self.ad(a), t, entity_text(self.cfg, f, "ad", rng))
            yield t, Entity(self.product(a), t, entity_text(self.cfg, f, "product", rng))
            yield t, Engagement(f"campaign:c{self.ad_camp[a]}", self.ad(a), "runs", t)
            yield t, Engagement(self.ad(a), self.product(a), "promotes", t)
            yield t, Engagement(f"pixel:x{adv}_0", self.product(a), "fires_on", t)

    # -- engagement stream ----------------------------------------------------------------
    def stream(self, chunk: int = 50_000) -> Iterator[Entity | Engagement]:
        """Every entity, structural edge and engagement, in time order."""
        cfg = self.cfg
        span = int(cfg.span_days * DAY_MS)
        structure = sorted(self.structure(), key=lambda x: x[0])
        si = 0
        rng = np.random.default_rng(cfg.seed + 2)
        n_sessions = max(1, int(cfg.events / (1 + cfg.in_interest * cfg.ctr_in * 1.5)))
        produced = 0
        done_sessions = 0
        while produced < cfg.events:
            b = min(chunk, max(1, n_sessions - done_sessions)) if done_sessions < n_sessions else chunk
            lo = cfg.start_ms + span * done_sessions // n_sessions
            hi = cfg.start_ms + span * min(n_sessions, done_sessions + b) // n_sessions
            ts = np.sort(rng.integers(lo, max(lo + 1, hi), b))
            users = rng.choice(cfg.users, size=b, p=self.user_act)
            ads = self._choose_ads(users, ts, lo, rng)
            r_click, r_cart, r_conv = rng.random(b), rng.random(b), rng.random(b)
            delays = rng.integers(1_000, 60_000, (b, 3)) * np.array([1, 10, 60])
            out = []
            for i in range(b):
                a = int(ads[i, 0])
                if a >= 0:
                    out.extend(self._funnel(int(users[i]), a, int(ts[i]), bool(ads[i, 1]),
                                            r_click[i], r_cart[i], r_conv[i], delays[i]))
            done_sessions += b
            out.sort(key=lambda e: e.ts)
            for ev in out:
                while si < len(structure) and structure[si][0] <= ev.ts:
                    yield structure[si][1]
                    si += 1
                yield ev
                produced += 1
                if produced >= cfg.events:
                    break
        for _, item in structure[si:]:
            yield item

    def interests_at(self, u: int, t: int) -> list[int]:
        ints = self.user_interests[u]
        d = self.user_drift.get(u)
        if d is not None and t >= d[0]:
            return ints[:-1] + [d[1]]
        return ints

    def _choose_ads(self, users: np.ndarray, ts: np.ndarray, lo: int, rng) -> np.ndarray:
        """(ad, in_interest) per session, vectorised: Zipf popularity among launched ads, of
        one of the user's current interests with probability `in_interest`, else any ad.
        Ads launching inside a chunk become visible from the next chunk on."""
        cfg = self.cfg
        b = len(users)
        launched = self.ad_launch <= lo
        in_int = rng.random(b) < cfg.in_interest
        pick, u = rng.random(b), rng.random(b)
        fine = np.full(b, -1)
        for i in np.flatnonzero(in_int):
            ints = self.interests_at(int(users[i]), int(ts[i]))
            fine[i] = ints[int(pick[i] * len(ints))]
        out = np.full((b, 2), -1)
        out[:, 1] = in_int
        groups = [(f, np.flatnonzero(fine == f)) for f in np.unique(fine[fine >= 0])]
        groups.append((None, np.flatnonzero(~in_int)))
        for f, idx in groups:
            cands = np.flatnonzero(launched) if f is None else self.ads_by_fine[f]
            cands = cands[launched[cands]]
            if len(cands) and len(idx):
                cum = np.cumsum(self.ad_pop[cands])
                pos = np.searchsorted(cum, u[idx] * cum[-1], side="right")
                out[idx, 0] = cands[np.minimum(pos, len(cands) - 1)]
        return out

    def _funnel(self, u: int, a: int, t: int, in_interest: bool, r_click: float, r_cart: float,
                r_conv: float, delays) -> list[Engagement]:
        cfg = self.cfg
        user, ad = self.user(u), self.ad(a)
        evs = [Engagement(user, ad, "impression", t)]
        if r_click < (cfg.ctr_in if in_interest else cfg.ctr_out):
            t += int(delays[0])
            evs.append(Engagement(user, ad, "click", t))
            if r_cart < cfg.cart_rate:
                t += int(delays[1])
                evs.append(Engagement(user, self.product(a), "add_to_cart", t))
                if r_conv < cfg.conversion_rate:
                    t += int(delays[2])
                    evs.append(Engagement(user, self.product(a), "conversion", t))
        return evs

    # -- ground truth ---------------------------------------------------------------------
    def labels(self) -> Iterator[dict]:
        """Planted interests per node: fine id and its mid and coarse parents."""
        cfg = self.cfg

        def tree(f: int) -> dict:
            return {"fine": int(f), "mid": int(f // cfg.fine), "coarse": int(f // (cfg.mid * cfg.fine))}

        for a in range(len(self.ad_camp)):
            f = int(self.ad_fine[a])
            yield {"node": self.ad(a), **tree(f), "launch_ts": int(self.ad_launch[a])}
            yield {"node": self.product(a), **tree(f), "launch_ts": int(self.ad_launch[a])}
        for c in range(len(self.camp_adv)):
            yield {"node": f"campaign:c{c}", **tree(int(self.camp_fine[c]))}
        for u in range(cfg.users):
            d = self.user_drift.get(u)
            yield {"node": self.user(u), "interests": [tree(f) for f in self.user_interests[u]],
                   "drift": None if d is None else {"ts": d[0], "to": tree(d[1])}}


def write(world: SynthWorld, out: Path) -> dict[str, Path]:
    """Write engagements.jsonl, entities.jsonl, labels.jsonl and config.json under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / f"{k}.jsonl" for k in ("engagements", "entities", "labels")}
    with paths["engagements"].open("w") as fe, paths["entities"].open("w") as fn:
        for item in world.stream():
            f = fe if isinstance(item, Engagement) else fn
            f.write(json.dumps(as_dict(item)) + "\n")
    with paths["labels"].open("w") as fl:
        for row in world.labels():
            fl.write(json.dumps(row) + "\n")
    (out / "config.json").write_text(json.dumps(asdict(world.cfg), indent=2))
    return paths
