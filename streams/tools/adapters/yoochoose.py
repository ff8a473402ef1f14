"""YOOCHOOSE click sessions (RecSys Challenge 2015), as session-rec prepares them:
tab-separated ``SessionId ItemId Time`` with a header, Time in unix seconds (fractional).

There are no users: each session is a node of type ``session`` (`configs/yoochoose.toml`
makes it the type whose next engagements are predicted), each item a ``product``, every row
a ``click``. Sessions are anonymous and short-lived: the click's half-life in that config is
an hour, so an idle session's edges fade and retention expires it.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from hirflow.state.events import Engagement

HEADER = ("SessionId", "ItemId", "Time")


class YoochooseFormatError(ValueError):
    pass


def looks_like(first_line: str) -> bool:
    return tuple(first_line.strip().split("\t")) == HEADER


def read(lines: Iterable[str]) -> Iterator[Engagement]:
    for lineno, line in enumerate(lines, 1):
        row = line.rstrip("\n").split("\t")
        if lineno == 1 and tuple(row) == HEADER:
            continue
        if row == [""]:
            continue
        if len(row) != 3:
            raise YoochooseFormatError(f"line {lineno}: expected 3 tab-separated columns "
                                       f"{' '.join(HEADER)}, got {len(row)}")
        session, item, ts = row
        try:
            t = int(round(float(ts) * 1000))
        except ValueError:
            raise YoochooseFormatError(f"line {lineno}: Time {ts!r} is not unix seconds") from None
        yield Engagement(f"session:{session}", f"product:{item}", "click", t)
