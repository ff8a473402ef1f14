"""What `hirflow demo` shows at the end: the model checked against the synthetic world's
planted interests, example API calls, and a plot of freshness over the run.

The synthetic world knows each user's interests and each ad's interest (`streams.tools.synth`), so
the demo can say in plain words whether what the API returns makes sense: the ads retrieved
for a user should mostly belong to the user's interests, and the users similar to a user
should share one.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from hirflow.streams.tools.freshness_watch import FreshnessWatch
from hirflow.streams.tools.synth import SynthWorld, interest_words


def get_json(api: str, path: str, timeout: float = 5.0) -> dict | None:
    try:
        with urllib.request.urlopen(api + path, timeout=timeout) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _interests(world: SynthWorld, node: str, t_ms: int) -> set[int]:
    kind, _, key = node.partition(":")
    if kind == "user":
        return set(int(f) for f in world.interests_at(int(key[1:]), t_ms))
    if kind == "ad":
        return {int(world.ad_fine[int(key[1:])])}
    return set()


def _words(world: SynthWorld, fines: set[int]) -> str:
    return ", ".join("/".join(interest_words(world.cfg, f)[1:]) for f in sorted(fines))


def learned(api: str, world: SynthWorld, users: int = 50, k: int = 10) -> dict | None:
    """Over the `users` most active users: share of retrieved ads in the user's planted
    interests and of similar users sharing one, each beside what chance gives. None before
    a checkpoint serves (cold start has no interests to show)."""
    status = get_json(api, "/v1/status")
    if not status or status.get("model", "cold-start") == "cold-start":
        return None
    now = int(time.time() * 1000)
    active = [f"user:u{u}" for u in np.argsort(-world.user_act)[:users]]
    n_ads = len(world.ad_fine)
    hit_ads, hit_users, chance_ads, chance_users, example = [], [], [], [], None
    all_users = [f"user:u{u}" for u in range(world.cfg.users)]
    for user in active:
        mine = _interests(world, user, now)
        ads = get_json(api, f"/v1/retrieve?user={urllib.parse.quote(user)}&k={k}&types=ad")
        sim = get_json(api, f"/v1/similar?node={urllib.parse.quote(user)}&k={k}&types=user")
        if not ads or not sim:
            continue
        a = [r["node"] for r in ads["results"]]
        s = [r["node"] for r in sim["results"] if r["node"] != user]
        hit_ads.append(np.mean([bool(_interests(world, x, now) & mine) for x in a]) if a else 0.0)
        hit_users.append(np.mean([bool(_interests(world, x, now) & mine) for x in s]) if s else 0.0)
        chance_ads.append(np.mean([int(world.ad_fine[i]) in mine for i in range(n_ads)]))
        chance_users.append(np.mean([bool(_interests(world, x, now) & mine) for x in all_users]))
        if example is None:
            example = {"user": user, "interests": _words(world, mine),
                       "ads": [(x, _words(world, _interests(world, x, now))) for x in a[:5]],
                       "similar": [(x, _words(world, _interests(world, x, now))) for x in s[:5]]}
    if not hit_ads:
        return None
    return {"users": len(hit_ads), "k": k, "model": status["model"],
            "ads_in_interest": float(np.mean(hit_ads)), "ads_chance": float(np.mean(chance_ads)),
            "similar_share": float(np.mean(hit_users)), "similar_chance": float(np.mean(chance_users)),
            "example": example}


def print_learned(res: dict | None) -> None:
    if res is None:
        print("\nno checkpoint served by the end of the stream: the worker served cold-start "
              "embeddings (world knowledge + type), which carry no learned interests")
        return
    ex = res["example"]
    print(f"\nwhat the model ({res['model']}) learned, checked against the planted interests "
          f"of the synthetic world ({res['users']} most active users, top {res['k']}):")
    print(f"  retrieved ads in the user's interests: {res['ads_in_interest']:.0%} "
          f"(a random ad: {res['ads_chance']:.0%})")
    print(f"  similar users sharing an interest:     {res['similar_share']:.0%} "
          f"(a random user: {res['similar_chance']:.0%})")
    print(f"  e.g. {ex['user']} (interests: {ex['interests']})")
    print("    retrieve -> " + "; ".join(f"{n} ({w})" for n, w in ex["ads"]))
    print("    similar  -> " + "; ".join(f"{n} ({w})" for n, w in ex["similar"]))


def print_examples(api: str, user: str) -> None:
    print("\nquery API (OpenAPI at /openapi.json); try:")
    q = urllib.parse.quote(user)
    for path in ("/v1/status", f"/v1/nodes/{q}", f"/v1/retrieve?user={q}&k=3&types=ad",
                 f"/v1/similar?node={q}&k=3&types=user", "/v1/primitives/0/0?k=3",
                 f"/v1/proximity?node={q}&level=0&prim=0"):
        try:
            with urllib.request.urlopen(api + path, timeout=5) as r:
                body = r.read().decode()
        except urllib.error.HTTPError as e:
            body = f"{e.code} {e.read().decode()}"
        except OSError as e:
            body = str(e)
        print(f"  curl '{api}{path}'\n    -> {body[:400]}{' ...' if len(body) > 400 else ''}")


def plot_freshness(watch: FreshnessWatch, t0_s: float, swaps: list[tuple[float, str]],
                   path: Path) -> Path | None:
    """Endpoint and all-change latency per second of the run, with checkpoint switches."""
    if not watch.history:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = np.array(watch.history, dtype=float)
    t, lat, ep = h[:, 0] - t0_s, np.maximum(h[:, 1], 1.0), h[:, 2].astype(bool)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.scatter(t[~ep], lat[~ep], s=2, alpha=0.25, color="C1", label="neighbour / re-announce")
    ax.scatter(t[ep], lat[ep], s=2, alpha=0.4, color="C0", label="endpoint changes")
    mid = np.arange(0, t.max() + 5, 5) + 2.5
    p99 = []
    for c in mid:
        m = ep & (t >= c - 2.5) & (t < c + 2.5)
        p99.append(np.percentile(lat[m], 99) if m.sum() >= 10 else np.nan)   # gaps stay gaps
    ax.plot(mid, p99, color="C3", label="endpoint p99 per 5 s")
    for ts, label in swaps:
        ax.axvline(ts - t0_s, color="k", ls=":", lw=1)
        ax.text(ts - t0_s, lat.max(), f" {label}", fontsize=7, va="top")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the stream started")
    ax.set_ylabel("event -> token change received (ms)")
    ax.set_title("hirflow demo: freshness as a subscriber sees it")
    ax.legend(loc="upper right", fontsize=8, markerscale=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
