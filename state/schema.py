"""Node types, actions and input limits: what an event may say, from config with defaults.

An action's half-life sets how fast its edges fade (impressions in hours, clicks in days,
conversions in months); structural actions (advertiser owns campaign, ...) never fade;
a negative sign marks explicit negative feedback such as ``not_interested``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from hirflow.state.decay import rate_from_half_life

# Code of a node type the schema does not list (a type removed from the config while the
# store still holds nodes of it). The one such code everywhere: index columns store it (one
# byte: 255) and no type filter matches it; the cold-start model gives it its own direction;
# the trained encoder has no row for it and reads it as the first type (`model_type_codes`).
UNKNOWN_TYPE = -1


def node_type(node_id: str) -> str:
    """The type of a node id: "ad:a1" -> "ad"."""
    return node_id.partition(":")[0]


@functools.lru_cache(maxsize=64)
def type_code_map(types: tuple[str, ...]) -> dict[str, int]:
    """Type name -> its code: its position in the schema's `all_node_types` (cached: views
    ask for it per view; do not mutate the dict returned)."""
    return {t: i for i, t in enumerate(types)}

HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True)
class ActionSpec:
    half_life_s: float = DAY        # how long until an edge of this action weighs half
    sign: int = 1                   # -1 for explicit negative feedback
    structural: bool = False        # never decays (half_life_s is ignored)
    funnel_weight: float = 1.0      # how much the trainer values predicting it (deep funnel > 1)

    def __post_init__(self) -> None:
        if self.sign not in (1, -1):
            raise ValueError(f"sign must be 1 or -1, got {self.sign!r}")
        if not self.structural and not (self.half_life_s > 0 and math.isfinite(self.half_life_s)):
            raise ValueError(f"half_life_s must be positive and finite, got {self.half_life_s!r}")

    @property
    def decay_rate(self) -> float:
        """ln 2 / half-life in 1/ms: weight(t) = w * exp(-rate * (t - t_ref))."""
        return 0.0 if self.structural else rate_from_half_life(self.half_life_s)


DEFAULT_NODE_TYPES = ("user", "ad", "advertiser", "campaign", "product", "pixel")


def _default_actions() -> dict[str, ActionSpec]:
    return {
        "impression": ActionSpec(half_life_s=6 * HOUR),
        "click": ActionSpec(half_life_s=3 * DAY),
        "add_to_cart": ActionSpec(half_life_s=7 * DAY, funnel_weight=2.0),
        "conversion": ActionSpec(half_life_s=90 * DAY, funnel_weight=4.0),
        "not_interested": ActionSpec(half_life_s=30 * DAY, sign=-1),
        # structural edges: advertiser owns campaign, campaign runs ad, ad promotes product,
        # pixel fires on product
        "owns": ActionSpec(structural=True),
        "runs": ActionSpec(structural=True),
        "promotes": ActionSpec(structural=True),
        "fires_on": ActionSpec(structural=True),
    }


@dataclass(frozen=True)
class SchemaConfig:
    node_types: tuple[str, ...] = DEFAULT_NODE_TYPES    # the `type` of node ids `type:key`
    extra_node_types: tuple[str, ...] = ()          # added by data set adapters (category, ...)
    item_types: tuple[str, ...] = ("ad", "product")     # what a user engages and retrieval
                                                    # returns for a user; evaluation ranks them
    user_type: str = "user"                         # whose next engagements are predicted
    session_users: bool = False                     # the user type lives minutes (anonymous
                                                    # sessions): one first seen in a window is
                                                    # judged on its later engagements there,
                                                    # given its earlier ones
    actions: dict[str, ActionSpec] = field(default_factory=_default_actions)   # replaces the defaults
    extra_actions: dict[str, ActionSpec] = field(default_factory=dict)   # added to `actions`
    max_payload_bytes: int = 64 * 1024              # a record larger than this is refused
    max_weight: float = 1e6                         # |w| above this is refused as a typo
    max_key_len: int = 256                          # characters after "type:"
    min_ts_ms: int = 946_684_800_000                # 2000-01-01: older is a unit mistake
    max_future_ms: int = 24 * 3_600_000             # event time may lead wall clock by a day
    max_text_len: int = 16_384                      # entity text characters

    def __post_init__(self) -> None:
        if not self.all_node_types:
            raise ValueError("node_types must not be empty")
        bad = [t for t in self.all_node_types if not t or ":" in t]
        if bad:
            raise ValueError(f"node type {bad[0]!r} must be non-empty and contain no ':'")
        if not self.item_node_types or self.user_type not in self.all_node_types:
            raise ValueError(f"item_types {self.item_types} need one node type of the schema and "
                             f"user_type {self.user_type!r} must be one")
        if len(self.all_actions) > 255:
            raise ValueError("at most 255 actions fit the one-byte action code")

    @property
    def item_node_types(self) -> tuple[str, ...]:
        """The `item_types` this schema has (a data set may have products but no ads)."""
        return tuple(t for t in self.item_types if t in self.all_node_types)

    @property
    def all_node_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.node_types + self.extra_node_types))

    def type_codes(self, nodes) -> list[int]:
        """Each node id's type code ("ad:a1" -> the position of "ad" in `all_node_types`),
        `UNKNOWN_TYPE` for a type the schema does not list."""
        get = type_code_map(self.all_node_types).get
        return [get(node_type(n), UNKNOWN_TYPE) for n in nodes]

    def model_type_codes(self, nodes) -> list[int]:
        """Type codes as the trained encoder embeds them: it has one row per listed type and
        none for an unknown one, which reads as the first type."""
        return [max(c, 0) for c in self.type_codes(nodes)]

    @property
    def all_actions(self) -> dict[str, ActionSpec]:
        return {**self.actions, **self.extra_actions}

    def action_codes(self) -> dict[str, int]:
        """Stable small integer per action (sorted by name) for compact storage."""
        return {name: i for i, name in enumerate(sorted(self.all_actions))}
