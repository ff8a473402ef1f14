"""CiaoDVD movie ratings (Guo et al. 2014; research use): userID,movieID,genreID,reviewID,rating,date.

user -> ``user``, movie -> ``movie``, genre -> a ``genre`` node the movie belongs to (a
structural ``in_genre`` edge, emitted once per movie at its first rating); a rating of 4 or
5 -> ``liked`` (the positive a ranking is judged on), 1 to 3 -> ``disliked`` (negative
feedback). Dates have day resolution: a rating's time is midnight UTC of its date. The
actions and types come from `configs/ciaodvd.toml`, which the worker must load too.
"""
from __future__ import annotations

import datetime as dt
from typing import Iterable, Iterator

from hirflow.state.events import Engagement
from hirflow.streams.tools.adapters.rows import csv_rows

COLUMNS = ("userID", "movieID", "genreID", "reviewID", "rating", "date")

LIKED_FROM = 4          # ratings at or above this are positives (the usual binarisation)


class CiaoFormatError(ValueError):
    pass


def looks_like(first_line: str) -> bool:
    """Whether a first line reads as a CiaoDVD rating row."""
    row = first_line.strip().split(",")
    return len(row) == 6 and row[4].strip() in "12345" and len(row[5].strip()) == 10 \
        and row[5].strip()[4] == "-"


def _ms(date: str, lineno: int) -> int:
    try:
        d = dt.datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise CiaoFormatError(f"line {lineno}: date {date!r} is not YYYY-MM-DD") from None
    return int(d.timestamp() * 1000)


def read(lines: Iterable[str]) -> Iterator[Engagement]:
    seen_movies: set[str] = set()
    for lineno, (user, movie, genre, _review, rating, date) in csv_rows(lines, COLUMNS, CiaoFormatError):
        if rating not in ("1", "2", "3", "4", "5"):
            raise CiaoFormatError(f"line {lineno}: rating {rating!r} is not 1-5")
        t = _ms(date, lineno)
        node = f"movie:{movie}"
        if node not in seen_movies:
            seen_movies.add(node)
            yield Engagement(node, f"genre:{genre}", "in_genre", t)
        yield Engagement(f"user:{user}", node, "liked" if int(rating) >= LIKED_FROM else "disliked", t)
