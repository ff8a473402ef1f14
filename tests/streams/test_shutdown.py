"""The stop's thread hook: a cancelled client thread is one log line; other faults stay whole."""
import asyncio
import logging
import threading

import pytest

from hirflow.streams.worker.shutdown import quiet_thread_stops


@pytest.fixture
def restored_hook():
    before = threading.excepthook
    yield
    threading.excepthook = before


def _run(target, name):
    t = threading.Thread(target=target, name=name)
    t.start()
    t.join()


def _raise(exc):
    def target():
        raise exc
    return target


def test_a_cancelled_thread_is_one_line_and_other_faults_reach_the_previous_hook(restored_hook, caplog):
    seen = []
    threading.excepthook = lambda args: seen.append(args.exc_type)
    quiet_thread_stops()
    with caplog.at_level(logging.INFO, logger="hirflow.streams.worker.shutdown"):
        _run(_raise(asyncio.CancelledError()), "consumer-thread")
        _run(_raise(ValueError("a real fault")), "other")
    lines = [r.getMessage() for r in caplog.records if r.name == "hirflow.streams.worker.shutdown"]
    assert lines == ["thread consumer-thread: its pending work was cancelled by the stop"]
    assert seen == [ValueError]
