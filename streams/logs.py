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


CHATTY = ("hirflow.kafka", "aiokafka")     # the Kafka clients' own loggers and their children


class Repeats(logging.Filter):
    """At most one line per `every_s` seconds from each of the loggers named `names` (with
    the loggers below them): a broker outage makes the Kafka clients repeat a dozen kinds of
    reconnect and metadata errors many times a second, and `broker_watch` already says what
    is unreachable and for how long. The next line let through counts those held back. A
    handler's filter: a logger's own would miss its children's lines."""

    def __init__(self, every_s: float = 10.0, names: tuple[str, ...] = CHATTY) -> None:
        super().__init__()
        self.every_s = every_s
        self.names = names
        self._last: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        family = next((n for n in self.names
                       if record.name == n or record.name.startswith(n + ".")), None)
        if family is None or record.levelno >= logging.CRITICAL:
            return True
        now = time.monotonic()
        last, held = self._last.get(family, (-1e18, 0))
        if now - last < self.every_s:
            self._last[family] = (last, held + 1)
            return False
        self._last[family] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} (+{held} more {family} lines in the last {self.every_s:g} s)"
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
    handler.addFilter(Repeats())
