"""`hirflow_broker_up` and the outage lines: from librdkafka's statistics, on a real broker
stopped and started again on its port, and property-tested on report sequences."""
import json
import logging
import os
import signal
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.streams import clients
from hirflow.streams.broker import EmbeddedBroker
from hirflow.streams.worker.broker_watch import INTERVAL_MS, BrokerWatch
from hirflow.streams.metrics import BROKER_UP
from tests.conftest import make_config


def gauge() -> float:
    return BROKER_UP._value.get()


def poll_until(consumer, cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        consumer.poll(0.2)
        if cond():
            return True
    return False


def test_a_broker_killed_and_restarted_reads_down_then_up_in_two_lines(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hirflow.streams.worker.broker_watch")
    b = EmbeddedBroker().start()
    cfg = make_config(tmp_path, bootstrap=b.bootstrap)
    watch = BrokerWatch(every_s=60.0)
    c = clients.consumer(cfg.kafka, "watch-test", stats_cb=watch.stats, **{"statistics.interval.ms": 500})
    try:
        c.subscribe(["watched"])
        assert poll_until(c, lambda: watch._clients, 20) and watch.up and gauge() == 1
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait()
        assert poll_until(c, lambda: not watch.up, 30), "the outage was not noticed"
        assert gauge() == 0
        b.start()
        assert poll_until(c, lambda: watch.up, 60), "the return was not noticed"
        assert gauge() == 1 and watch.outages == 1
    finally:
        c.close()
        b.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "hirflow.streams.worker.broker_watch"]
    assert len(lines) == 2 and "unreachable" in lines[0] and "again" in lines[1], lines


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["consumer", "producer", "admin"]), st.booleans(),
                          st.floats(0.0, 20.0)), max_size=80))
def test_up_is_any_fresh_client_up_and_an_outage_logs_one_line_per_interval(reports):
    clock = Clock()
    watch = BrokerWatch(every_s=30.0, clock=clock)
    latest: dict[str, tuple[float, bool]] = {}
    log = logging.getLogger("hirflow.streams.worker.broker_watch")
    lines = Lines()
    log.addHandler(lines)
    down_time = 0.0
    try:
        for name, up, dt in reports:
            was_down = not watch.up
            clock.t += dt
            if was_down:
                down_time += dt
            watch.stats(json.dumps({"name": name, "brokers": {
                "b/1": {"state": "UP" if up else "CONNECT"}}}))
            latest[name] = (clock.t, up)
            fresh = [u for t, u in latest.values() if t >= clock.t - 3 * INTERVAL_MS / 1000]
            assert watch.up == any(fresh)
            assert gauge() == (1 if any(fresh) else 0)
    finally:
        log.removeHandler(lines)
    assert len(lines.records) <= 2 * watch.outages + down_time / 30.0
