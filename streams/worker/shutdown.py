"""A bounded stop: SIGTERM (or SIGINT) ends the worker within `GRACE_S` seconds whatever the
broker does.

The graceful path (faust stops its services; ingest and refresh commit what they applied;
RocksDB is closed) needs the broker for its last acknowledgements and offset commits. With
the broker away it can wait for minutes. Past `GRACE_S` the process exits as a kill -9
would, which loses nothing and applies nothing twice: what is durable in RocksDB stays (its
write-ahead log), and the next start reads again from the stored offsets whatever had not
been committed or produced. The chart's grace period (60 s) leaves room for it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading

import faust

log = logging.getLogger(__name__)

GRACE_S = 18.0
FORCED_EXIT = 75        # EX_TEMPFAIL: stopped, not cleanly; a restart redoes what was left


def arm(grace_s: float = GRACE_S) -> threading.Timer:
    """Start the deadline of a stop: a daemon timer that ends the process at `grace_s`."""
    def expire() -> None:
        log.error("the graceful stop did not finish within %.0f s (is the broker away?): "
                  "exiting; the next start redoes what was not committed", grace_s)
        logging.shutdown()
        os._exit(FORCED_EXIT)
    timer = threading.Timer(grace_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def quiet_thread_stops() -> None:
    """While the worker stops, a client thread ended by cancellation (faust's consumer thread
    whose fetches the broker's absence left pending) is one line in the log, not a traceback
    on stderr: it is how a stop looks without a broker, not a fault. Any other exception in a
    thread still reaches the previous hook in full."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not None and issubclass(args.exc_type, asyncio.CancelledError):
            name = args.thread.name if args.thread is not None else "?"
            log.info("thread %s: its pending work was cancelled by the stop", name)
            return
        previous(args)
    threading.excepthook = hook


class BoundedWorker(faust.Worker):
    """faust's worker whose stop on a signal has a deadline (`arm`)."""

    _deadline: threading.Timer | None = None

    def _schedule_shutdown(self, signal) -> None:
        if self._deadline is None:
            self._deadline = arm()
            quiet_thread_stops()
        super()._schedule_shutdown(signal)
