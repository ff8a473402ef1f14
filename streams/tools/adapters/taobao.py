"""Taobao UserBehavior CSV (Alibaba/Tianchi, CC BY-NC-SA): user,item,category,behavior,ts(s).

user -> ``user``, item -> ``product``, category -> a ``category`` node the product belongs
to (a structural ``belongs_to`` edge, emitted once per product), behavior -> action
(``pv``, ``fav``, ``cart``, ``buy``; buy is the deep-funnel conversion). The actions and the
category type come from `configs/taobao.toml`, which the worker must load too.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from hirflow.state.events import Engagement
from hirflow.streams.tools.adapters.rows import csv_rows

COLUMNS = ("user", "item", "category", "behavior", "ts")
BEHAVIORS = ("pv", "fav", "cart", "buy")


class TaobaoFormatError(ValueError):
    pass


def read(lines: Iterable[str]) -> Iterator[Engagement]:
    seen_products: set[str] = set()
    for lineno, (user, item, cat, behavior, ts) in csv_rows(lines, COLUMNS, TaobaoFormatError):
        if behavior not in BEHAVIORS:
            raise TaobaoFormatError(f"line {lineno}: unknown behavior {behavior!r}")
        try:
            t = int(ts) * 1000
        except ValueError:
            raise TaobaoFormatError(f"line {lineno}: timestamp {ts!r} is not an integer") from None
        product = f"product:{item}"
        if product not in seen_products:
            seen_products.add(product)
            yield Engagement(product, f"category:{cat}", "belongs_to", t)
        yield Engagement(f"user:{user}", product, behavior, t)
