"""The rows of a headerless CSV data set, as every CSV adapter reads them."""
from __future__ import annotations

import csv
from typing import Iterable, Iterator, Sequence


def csv_rows(lines: Iterable[str], columns: Sequence[str], error: type[ValueError]
             ) -> Iterator[tuple[int, list[str]]]:
    """(line number from 1, fields stripped) of each non-blank row; a row with another
    column count raises `error`, naming the line and the expected columns."""
    for lineno, row in enumerate(csv.reader(lines), 1):
        if not row:
            continue
        if len(row) != len(columns):
            raise error(f"line {lineno}: expected {len(columns)} columns "
                        f"{','.join(columns)}, got {len(row)}")
        yield lineno, [c.strip() for c in row]
