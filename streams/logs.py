"""Structured logging: one JSON object per line (or plain text for a terminal)."""
from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        d = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in getattr(record, "fields", {}).items():
            d[k] = v
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, default=str)


class Repeats(logging.Filter):
    """At most one line per `every_s` seconds for each kind of message (its text with the
    digits left out: a reconnect's timings and offsets vary, its meaning does not); the next
    line of a kind says how many were held back."""

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL:
            return True
        kind = "".join(c for c in f"{record.name}:{record.getMessage()}"[:120] if not c.isdigit())
        now = time.monotonic()
        last, held = self._last.get(kind, (-1e18, 0))
        if now - last < self.every_s:
            self._last[kind] = (last, held + 1)
            return False
        self._last[kind] = (now, 0)
        if len(self._last) > 10_000:             # many distinct kinds: start over
            self._last = {kind: (now, 0)}
        if held:
            record.msg = f"{record.getMessage()} (+{held} like it in the last {self.every_s:g} s)"
            record.args = ()
        return True


def setup(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # libraries that narrate at INFO (faiss's loader tries each CPU build in turn; the model
    # loader names its files): their warnings and errors still show
    for noisy in ("aiokafka", "faust", "mode", "faiss.loader", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # the clients' reconnect chatter during a broker outage: one line per kind per 10 s
    for chatty in ("hirflow.kafka", "aiokafka"):
        logger = logging.getLogger(chatty)
        logger.filters[:] = [f for f in logger.filters if not isinstance(f, Repeats)]
        logger.addFilter(Repeats())
