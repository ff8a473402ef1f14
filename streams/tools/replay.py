"""`hirflow replay`: files of events -> Kafka, keyed by src (or node), idempotent producer.

Formats: ``jsonl`` (one event per line in the wire schema; lines with ``node`` are entity
events), ``csv`` (src,dst,action,ts[,w,id], with a header line naming the columns or
without one, in that order), ``taobao`` (UserBehavior CSV) and
``online-retail`` (the UCI Online Retail invoice lines; rows that are no customer's purchase
of a product are skipped and counted by reason, see `streams.tools.adapters.online_retail`),
``ciaodvd`` (CiaoDVD ratings) and ``yoochoose`` (click sessions as session-rec prepares them).
Lines are validated before producing, so a bad file fails fast with its line number instead
of filling the dead-letter topic; ``--rate`` paces the stream in events per second.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import time
from pathlib import Path
from typing import Iterable, Iterator

from tqdm import tqdm

from hirflow.state.events import (Engagement, Entity, EventError, Validator, as_dict, encode_engagement,
                                  encode_entity)
from hirflow.streams import clients
from hirflow.streams.tools.adapters import ciaodvd, online_retail, taobao, yoochoose
from hirflow.streams.config import HirflowConfig
from hirflow.streams.topics import Topics

log = logging.getLogger(__name__)
FORMATS = ("jsonl", "csv", "taobao", "online-retail", "ciaodvd", "yoochoose")
# the adapters whose rows map one to one onto engagements: format -> (read, its format error)
ADAPTERS = {"taobao": (taobao.read, taobao.TaobaoFormatError),
            "ciaodvd": (ciaodvd.read, ciaodvd.CiaoFormatError),
            "yoochoose": (yoochoose.read, yoochoose.YoochooseFormatError)}
PACE_SLICE_S = 0.005                # with a rate: paced in slices of this much stream time


class ReplayError(ValueError):
    pass


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8")
    return path.open(encoding="utf-8")


CSV_COLUMNS = ("src", "dst", "action", "ts", "w", "id")    # the generic CSV's, in order


def _headerless_csv(line: str) -> bool:
    """Whether a first line reads as a generic CSV row without a header:
    `type:key,type:key,action,ts[,w[,id]]`."""
    cells = [c.strip() for c in line.strip().split(",")]
    return 4 <= len(cells) <= 6 and ":" in cells[0] and ":" in cells[1] and cells[3].isdigit()


def _csv_rows(f) -> Iterator[tuple[int, dict]]:
    """(line number, row) of a generic CSV, with or without its header line: a header names
    the columns (any order); without one they are `CSV_COLUMNS` in order."""
    reader = csv.reader(f)
    header = None
    for lineno, cells in enumerate(reader, 1):
        if not cells or not any(c.strip() for c in cells):
            continue
        if lineno == 1 and cells[0].strip().lower() == "src":
            header = [c.strip().lower() for c in cells]
            unknown = sorted(set(header) - set(CSV_COLUMNS))
            if unknown or not {"src", "dst", "action", "ts"} <= set(header):
                raise ValueError(f"line 1: a header names the columns {', '.join(CSV_COLUMNS)} "
                                 f"(src, dst, action and ts required), got {', '.join(header)}")
            continue
        names = header or CSV_COLUMNS
        if header is None and not 4 <= len(cells) <= 6 or header is not None and len(cells) != len(header):
            want = f"the header's columns {','.join(header)}" if header \
                else f"columns {','.join(CSV_COLUMNS[:4])}[,w,id]"
            raise ValueError(f"line {lineno}: expected {want}, got {len(cells)}")
        yield lineno, dict(zip(names, (c.strip() for c in cells)))


def detect_format(path: Path) -> str:
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl") or name.endswith(".json"):
        return "jsonl"
    with _open_text(path) as f:
        first = f.readline()
    if first.lower().startswith("src,") or _headerless_csv(first):
        return "csv"
    if online_retail.looks_like(first):
        return "online-retail"
    if len(first.split(",")) == 5 and first.split(",")[3].strip() in taobao.BEHAVIORS:
        return "taobao"
    if ciaodvd.looks_like(first):
        return "ciaodvd"
    if yoochoose.looks_like(first):
        return "yoochoose"
    raise ReplayError(f"cannot tell the format of {path}; pass --format ({', '.join(FORMATS)})")


def read_events(path: Path, fmt: str, validator: Validator,
                rejects: online_retail.Rejects | None = None) -> Iterator[Engagement | Entity]:
    """Validated events from a file; a bad line raises ReplayError naming it, except in the
    online-retail format, whose messy rows are expected and counted in `rejects`."""
    with _open_text(path) as f:
        if fmt == "online-retail":
            try:
                for ev in online_retail.read(f, rejects):
                    yield validator.entity(as_dict(ev)) if isinstance(ev, Entity) \
                        else validator.engagement(as_dict(ev))
            except (online_retail.OnlineRetailFormatError, EventError) as exc:
                raise ReplayError(f"{path}: {exc}") from None
            return
        if fmt in ADAPTERS:
            read, error = ADAPTERS[fmt]
            try:
                yield from read(f)
            except error as exc:
                raise ReplayError(f"{path}: {exc}") from None
            return
        rows: Iterable[tuple[int, dict]]
        if fmt == "jsonl":
            rows = ((n, json.loads(line)) for n, line in enumerate(f, 1) if line.strip())
        else:
            rows = _csv_rows(f)
        try:
            yield from _validated(rows, fmt, validator, path)
        except ValueError as exc:              # a CSV whose columns are not the format's
            raise ReplayError(f"{path}: {exc}") from None


def _validated(rows: Iterable[tuple[int, dict]], fmt: str, validator: Validator,
               path: Path) -> Iterator[Engagement | Entity]:
    """Each row as a validated event; a bad one is a ReplayError naming its line."""
    for lineno, d in rows:
        try:
            if fmt == "csv":
                d = {k: v for k, v in d.items() if v not in (None, "")}
                d["ts"] = int(d["ts"]) if "ts" in d else d.get("ts")
                if "w" in d:
                    d["w"] = float(d["w"])
            yield validator.entity(d) if "node" in d else validator.engagement(d)
        except (EventError, ValueError, KeyError) as exc:
            raise ReplayError(f"{path}: line {lineno}: {exc}") from None


def produce(cfg: HirflowConfig, events: Iterable[Engagement | Entity], total: int | None = None,
            rate: float | None = None, progress: bool = True) -> dict:
    """Produce events keyed by src/node; returns counts and the achieved rate.

    With `rate`, events are paced in slices of about 5 ms, so the stream is steady rather
    than a burst of events followed by a pause."""
    topics = Topics(cfg.kafka.topic_prefix)
    errors: list[str] = []

    def delivered(err, msg):
        if err is not None:
            errors.append(str(err))

    p = clients.producer(cfg.kafka, on_delivery=delivered)
    slice_events = max(1, int(rate * PACE_SLICE_S)) if rate else 0
    n_eng = n_ent = 0
    t0 = time.monotonic()
    bar = tqdm(total=total, unit="ev", disable=not progress, smoothing=0.1)
    for i, ev in enumerate(events):
        if isinstance(ev, Entity):
            clients.produce_blocking(p, topics.entities, encode_entity(ev), ev.node.encode(),
                                     timestamp=ev.ts)
            n_ent += 1
        else:
            clients.produce_blocking(p, topics.engagements, encode_engagement(ev), ev.src.encode(),
                                     timestamp=ev.ts)     # Kafka time = event time
            n_eng += 1
        if slice_events and i % slice_events == slice_events - 1:
            ahead = (i + 1) / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        if i % 1000 == 999:
            p.poll(0)
            bar.update(1000)
            if errors:
                break
    left = p.flush(60)
    elapsed = time.monotonic() - t0
    bar.update((n_eng + n_ent) % 1000)
    bar.close()
    if errors or left:
        raise RuntimeError(f"produce failed: {left} undelivered, errors {errors[:3]}")
    n = n_eng + n_ent
    stats = {"engagements": n_eng, "entities": n_ent, "seconds": round(elapsed, 3),
             "events_per_s": round(n / elapsed, 1) if elapsed > 0 else None}
    log.info("produced %d engagements and %d entities in %.1f s (%.0f events/s)",
             n_eng, n_ent, elapsed, n / max(elapsed, 1e-9))
    return stats
