"""The subscriber client: each change once per node and seq, and at least once across a
crash of the caller (a batch counts as handled only when the caller asks for the next)."""
from hirflow.streams import changes, clients
from hirflow.streams.subscribe import Subscriber
from hirflow.streams.topics import Topics


def _publish(cfg, items):
    p = clients.producer(cfg.kafka)
    for node, seq in items:
        c = changes.TokenChange(node, "m", seq, [1, 2], [1], [], [0], 0, 0)
        p.produce(Topics(cfg.kafka.topic_prefix).token_changes, changes.encode(c), node.encode())
    assert p.flush(30) == 0


def _take(sub, n, rounds=50):
    got = []
    for _ in range(rounds):
        got += sub.poll(0.2)
        if len(got) >= n:
            break
    return got


def test_a_caller_that_dies_mid_batch_gets_the_batch_again_and_duplicates_are_dropped(cfg):
    _publish(cfg, [("ad:1", 1), ("ad:1", 1), ("ad:2", 1), ("ad:1", 2)])   # one resend
    with Subscriber(cfg, group_id="g") as sub:                  # handles nothing, "crashes"
        got = _take(sub, 3)
        assert sorted((c.node, c.seq) for c in got) == [("ad:1", 1), ("ad:1", 2), ("ad:2", 1)]
        assert sub.duplicates == 1
    with Subscriber(cfg, group_id="g") as sub:                  # the same changes again
        assert len(_take(sub, 3)) == 3
        sub.poll(0.2)                                           # asks for more: handled
    with Subscriber(cfg, group_id="g") as sub:                  # nothing left for the group
        assert _take(sub, 1, rounds=5) == []


def test_dedup_memory_is_bounded(cfg):
    _publish(cfg, [(f"ad:{i}", 1) for i in range(50)])
    with Subscriber(cfg, group_id="b", dedup_nodes=10) as sub:
        assert len(_take(sub, 50)) == 50 and len(sub.last_seq) == 10


def test_a_replayed_years_old_event_is_counted_apart_from_freshness():
    """Freshness is event -> change for live events; a replay of 2011's invoices would fill
    the histogram with 10^8-second observations, so those are counted apart."""
    import time
    from types import SimpleNamespace
    from hirflow.streams.metrics import REGISTRY
    from hirflow.streams.refresh.token_outbox import TokenOutbox

    def value(name):
        return REGISTRY.get_sample_value(name) or 0.0

    outbox = SimpleNamespace(_errors=[])
    msg = SimpleNamespace(latency=lambda: 0.001)
    now = int(time.time() * 1000)
    seen, old = value("hirflow_freshness_seconds_count"), value("hirflow_token_changes_historical_total")
    TokenOutbox._on_delivery(outbox, now - 1500, now, None, msg)                 # live: 1.5 s
    TokenOutbox._on_delivery(outbox, 1_291_000_000_000, now, None, msg)          # December 2010
    assert value("hirflow_freshness_seconds_count") == seen + 1
    assert value("hirflow_token_changes_historical_total") == old + 1


def test_repeated_client_lines_are_held_back_and_counted():
    """A broker outage's client chatter: one line per client library per interval, the next
    one counting those held back; hirflow's own lines pass."""
    import logging
    from hirflow.streams.logs import Repeats
    f = Repeats(every_s=60)

    def rec(msg, name="hirflow.kafka"):
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, (), None)

    first = rec("FAIL|rdkafka#producer-1| Connect to 127.0.0.1:9092 failed (after 0ms)")
    assert f.filter(first)
    assert not any(f.filter(rec(f"FAIL|rdkafka#producer-1| Connect to 127.0.0.1:9092 failed (after {i}ms)"))
                   for i in range(4))
    assert not f.filter(rec("coordinator not available"))
    child = rec("Failed fetch messages from 111: NodeNotReadyError", "aiokafka.consumer.fetcher")
    assert f.filter(child) and not f.filter(child)                   # a client's child logger too
    mine = rec("x", "hirflow.streams.ingest.loop")
    assert f.filter(mine) and f.filter(mine)                         # hirflow's own lines pass
    f._last = {k: (v[0] - 61, v[1]) for k, v in f._last.items()}       # a minute later
    again = rec("FAIL|rdkafka#producer-1| Connect to 127.0.0.1:9092 failed (after 3ms)")
    assert f.filter(again) and "(+5 more hirflow.kafka lines" in again.getMessage()
