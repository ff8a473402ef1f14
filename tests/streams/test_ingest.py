"""Ingest through the real broker: same state as a direct apply; bad input to the DLQ."""
import json

import msgpack

from hirflow.state.events import Engagement, encode_engagement
from hirflow.state.graph import GraphStore
from hirflow.state.writer import GraphWriter
from hirflow.streams import clients
from hirflow.streams.ingest.deadletter import parse_headers
from hirflow.streams.ingest.loop import IngestLoop
from hirflow.streams.tools.replay import produce
from hirflow.streams.tools.synth import SynthConfig, SynthWorld
from hirflow.streams.topics import Topics
from tests.conftest import replace_section
from tests.state.helpers import apply_direct, assert_same_state, digest
from tests.streams.kafka_helpers import assert_ingest_equals_direct, committed_total, drain, run_until


def engagements(n=3000):
    world = SynthWorld(SynthConfig(events=n, users=150, advertisers=6, seed=3))
    return [e for e in world.stream() if isinstance(e, Engagement)]


def test_broker_replay_equals_direct_apply(cfg, tmp_path):
    evs = engagements()
    produce(cfg, evs, progress=False)
    assert_ingest_equals_direct(cfg, Topics(cfg.kafka.topic_prefix), evs, tmp_path)


def test_two_workers_split_partitions_and_forward_reverse_sides(cfg, tmp_path):
    """worker.count=2: each applies the sides it owns; the rest travel on the reverse topic."""
    evs = engagements(2000)
    produce(cfg, evs, progress=False)
    topics = Topics(cfg.kafka.topic_prefix)
    stores, loops = [], []
    for i in range(2):
        c = replace_section(replace_section(cfg, "worker", index=i, count=2), "graph",
                            path=str(tmp_path / f"w{i}"))
        c = replace_section(c, "ingest", group_id=f"ingest-w{i}")
        store = GraphStore(c.graph.path, c.schema, c.kafka.partitions)
        stores.append(store)
        loops.append(IngestLoop(c, GraphWriter(store, c.graph), topics))
    want_sides = 2 * len(evs)
    seen = lambda: sum(s.events for st in stores for s in map(st.reader.state, st.reader.node_ids()))
    import time
    deadline = time.monotonic() + 60
    while seen() < want_sides and time.monotonic() < deadline:
        for lp in loops:
            lp.poll_once(timeout=0.05)
    merged = {}
    for st in stores:
        merged.update(digest(st))
    for lp in loops:
        lp.close()
    for st in stores:
        st.close()
    with GraphStore(tmp_path / "direct", cfg.schema, cfg.kafka.partitions) as store:
        apply_direct(store, evs, cfg.graph)
        assert_same_state(merged, digest(store))


def test_bad_input_goes_to_dead_letter_and_the_stream_keeps_flowing(cfg, tmp_path):
    topics = Topics(cfg.kafka.topic_prefix)
    now = 1_767_225_600_000
    good = lambda i: Engagement(f"user:{i}", f"ad:{i % 3}", "click", now + i)
    bad = [
        (b"\xc1\xc1 definitely not msgpack", "undecodable"),
        (msgpack.packb({"src": 1, "dst": "ad:1", "action": "click", "ts": now}), "wrong_type"),
        (msgpack.packb({"src": "shop:1", "dst": "ad:1", "action": "click", "ts": now}), "unknown_node_type"),
        (msgpack.packb({"src": "user:1", "dst": "ad:1", "action": "click", "ts": now, "w": float("nan")}), "bad_weight"),
        (b"x" * (10 * 1024 * 1024), "too_large"),
        (b'{"src": "user:1", "dst": ', "bad_json"),
        # a 400-digit integer once stopped ingest before its first commit, and again after
        # every restart
        (json.dumps({"src": "user:1", "dst": "ad:1", "action": "click", "ts": now,
                     "id": 10 ** 400}).encode(), "bad_id"),
    ]
    p = clients.producer(cfg.kafka)
    expected_good = []
    for i in range(10 * len(bad)):
        if i % 10 == 5:
            raw, _ = bad[i // 10]
            p.produce(topics.engagements, value=raw, key=b"user:1",
                      headers=[("trace-id", f"t{i}".encode()), ("hirflow.reason", b"forged")])
        elif i % 2:
            ev = good(i)
            d = {"src": ev.src, "dst": ev.dst, "action": ev.action, "ts": ev.ts}
            p.produce(topics.engagements, value=json.dumps(d).encode(), key=ev.src.encode())
            expected_good.append(ev)
        else:
            ev = good(i)
            p.produce(topics.engagements, value=encode_engagement(ev), key=ev.src.encode())
            expected_good.append(ev)
    assert p.flush(30) == 0
    assert_ingest_equals_direct(cfg, topics, expected_good, tmp_path)
    dead = drain(cfg, topics.dead_letter, len(bad))
    assert len(dead) == len(bad)
    by_reason = {parse_headers(m.headers())["hirflow.reason"]: m for m in dead}
    assert set(by_reason) == {r for _, r in bad}
    for raw, reason in bad:
        m = by_reason[reason]
        h = parse_headers(m.headers())
        assert m.value() == raw                                   # original bytes kept
        assert h["hirflow.origin.topic"] == topics.engagements
        assert h["trace-id"].startswith("t") and h["hirflow.reason"] == reason   # the producer's
        assert [k for k, _ in m.headers()].count("hirflow.reason") == 1      # headers, none forged
        assert int(h["hirflow.origin.offset"]) >= 0 and h["hirflow.detail"] is not None


def test_a_paced_stream_is_steady_not_bursts(cfg):
    """`produce(rate=...)` spreads events evenly: at 2,000 events/s no 50 ms window of the
    0.6 s stream holds more than a few slices' worth (pacing per 1,000 events sent them all
    in one burst)."""
    import time

    evs = engagements(1200)
    stamps = []

    def stamped(items):
        for e in items:
            stamps.append(time.monotonic())
            yield e

    stats = produce(cfg, stamped(evs), rate=2000, progress=False)
    t = sorted(stamps)
    assert stats["engagements"] == len(evs) and 0.5 < t[-1] - t[0] < 1.5
    per_window = [sum(1 for x in t if w <= x < w + 0.05) for w in t[::50]]
    assert max(per_window) <= 250                      # 100 expected in 50 ms at 2,000/s


def test_state_becomes_durable_on_the_commit_interval_not_at_each_empty_consume(cfg):
    """With short consume waits an empty call is a gap between fetches: applied records stay
    in memory until `commit_interval_ms` is up, then one commit makes them durable."""
    import time

    c = replace_section(cfg, "ingest", batch_wait_ms=5, commit_interval_ms=4000)
    evs = engagements(60)
    produce(c, evs, progress=False)
    with GraphStore(c.graph.path, c.schema, c.kafka.partitions) as store:
        loop = IngestLoop(c, GraphWriter(store, c.graph), Topics(c.kafka.topic_prefix))
        created = time.monotonic()
        run_until(loop, lambda: loop.applied >= len(evs), timeout=30)
        for _ in range(20):                                  # empty consume calls
            assert loop.poll_once() == 0
        assert time.monotonic() - created < 3.5, "too slow to tell the interval from idling"
        assert store.reader.state(evs[0].src) is None        # applied, not yet durable
        time.sleep(max(0.0, created + 4.0 - time.monotonic()))
        loop.poll_once()
        assert store.reader.state(evs[0].src) is not None
        loop.close()


class _LosesAsyncCommits:
    """A consumer whose asynchronous offset commits never reach Kafka (as one the coordinator
    rejects does); everything else goes to the real consumer."""

    def __init__(self, real) -> None:
        self._real = real

    def commit(self, *args, asynchronous=True, **kw):
        if asynchronous:
            return None
        return self._real.commit(*args, asynchronous=False, **kw)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_kafka_offsets_catch_up_with_state_once_the_stream_is_idle(cfg):
    """A lost asynchronous commit is made good when the stream goes quiet, so Kafka's
    committed offsets do not lag durable state at the end of a stream."""
    evs = engagements(400)
    produce(cfg, evs, progress=False)
    topics = Topics(cfg.kafka.topic_prefix)
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions) as store:
        real = clients.consumer(cfg.kafka, cfg.ingest.group_id)
        loop = IngestLoop(cfg, GraphWriter(store, cfg.graph), topics, consumer=_LosesAsyncCommits(real))
        run_until(loop, lambda: loop.applied >= len(evs))
        run_until(loop, lambda: committed_total(cfg, topics.engagements) >= len(evs), timeout=20)
        loop.close()


def test_both_forwarded_sides_of_one_engagement_on_one_reverse_partition_are_applied(cfg, tmp_path):
    """A producer other than hirflow's (or one worker forwarding both sides of an engagement
    whose nodes share a partition it does not own) puts two sides with the same origin
    offset on one reverse partition: both apply, once each, also when replayed."""
    from hirflow.streams.ingest.reverse_record import ReverseRecord
    topics = Topics(cfg.kafka.topic_prefix)
    with GraphStore(tmp_path / "probe", cfg.schema, cfg.kafka.partitions) as s:
        part = s.keys.partition
    users = [f"user:{i}" for i in range(200)]
    ads = [f"ad:{i}" for i in range(200)]
    src = next(u for u in users if part(u) == 0)
    dst = next(a for a in ads if part(a) == 0)
    ev = Engagement(src, dst, "click", 1_767_225_600_000)
    p = clients.producer(cfg.kafka)
    for _ in range(2):                                  # the second copy: a replay
        for side in (1, 2):
            p.produce(topics.reverse, value=ReverseRecord(ev, side, 3, 41).encode(),
                      key=(src if side == 1 else dst).encode(), partition=0)
    assert p.flush(30) == 0
    store = GraphStore(tmp_path / "w", cfg.schema, cfg.kafka.partitions)
    loop = IngestLoop(cfg, GraphWriter(store, cfg.graph), topics)
    run_until(loop, lambda: loop.applied >= 2, timeout=30)
    for _ in range(10):
        loop.poll_once(timeout=0.05)
    loop.close()
    assert loop.applied == 2
    assert store.reader.state(src).events == 1 and store.reader.state(dst).events == 1
    store.close()


def test_a_dead_letter_fits_the_message_limit_with_its_headers(cfg):
    """A record refused for its size is near the broker's limit already: its dead letter is
    cut to fit with the headers added, and says how long the original was and its hash."""
    import hashlib

    from hirflow.streams.ingest.deadletter import DeadLetters
    topics = Topics(cfg.kafka.topic_prefix)
    p = clients.producer(cfg.kafka)
    limit = 100_000
    dead = DeadLetters(p, topics.dead_letter, max_bytes=limit)
    original = bytes(range(256)) * 500                           # 128,000 bytes
    dead.send_raw(topics.engagements, 2, 17, b"user:1", original, 0, "too_large", "x" * 900)
    dead.send_raw(topics.engagements, 2, 18, b"user:2", b"small", 0, "bad_json", "")
    assert p.flush(30) == 0
    got = {parse_headers(m.headers())["hirflow.origin.offset"]: m
           for m in drain(cfg, topics.dead_letter, 2)}
    big, small = got["17"], got["18"]
    size = len(big.value()) + len(big.key()) + sum(len(k) + len(v) for k, v in big.headers())
    assert size <= limit and original.startswith(big.value())
    h = parse_headers(big.headers())
    assert int(h["hirflow.truncated.length"]) == len(original)
    assert h["hirflow.truncated.sha256"] == hashlib.sha256(original).hexdigest()
    assert small.value() == b"small" and "hirflow.truncated.length" not in parse_headers(small.headers())


def test_a_node_key_collision_is_dead_lettered_not_a_crash(cfg, tmp_path):
    """Two node ids whose 8-byte keys collide (crafted here by weakening the hash; 64 bits
    can be brute-forced by a hostile producer) never mix: the later id's engagements go to
    the dead-letter topic and the stream goes on."""
    topics = Topics(cfg.kafka.topic_prefix)
    now = 1_767_225_600_000
    first = [Engagement("user:a", f"ad:{i}", "click", now + i) for i in range(3)]
    clash = Engagement("user:b", "ad:9", "click", now + 10)
    after = [Engagement("user:c", "ad:1", "click", now + 20)]
    produce(cfg, first, progress=False)
    store = GraphStore(tmp_path / "w", cfg.schema, cfg.kafka.partitions)
    real = store.keys.key
    store.keys.key = lambda n: real("user:a") if n == "user:b" else real(n)
    loop = IngestLoop(cfg, GraphWriter(store, cfg.graph), topics)
    run_until(loop, lambda: loop.applied >= 3)
    loop.commit()
    produce(cfg, [clash] + after, progress=False)
    run_until(loop, lambda: loop.applied >= 4)
    loop.close()
    assert store.reader.state("user:a").events == 3 and store.reader.state("user:c").events == 1
    (dead,) = drain(cfg, topics.dead_letter, 1)
    assert parse_headers(dead.headers())["hirflow.reason"] == "node_key_collision"
    store.close()


def test_the_ingest_loop_runs_the_retention_sweep(cfg, tmp_path):
    """With graph.expire_after_days set, the ingest thread sweeps the store once a second:
    old, spent nodes leave it (the refresh then takes them out of the index)."""
    import time

    from hirflow.streams.metrics import NODES_EXPIRED
    cfg = replace_section(cfg, "graph", expire_after_days=30.0)
    evs = engagements(1000)                        # January 2026: long idle
    produce(cfg, evs, progress=False)
    store = GraphStore(tmp_path / "w", cfg.schema, cfg.kafka.partitions)
    loop = IngestLoop(cfg, GraphWriter(store, cfg.graph), Topics(cfg.kafka.topic_prefix))
    before = NODES_EXPIRED._value.get()
    run_until(loop, lambda: loop.applied >= len(evs))
    loop.commit()
    dirty = loop.writer.dirty                       # as a refresh would: dirty nodes wait
    dirty.clear_settled(dirty.claim(10 ** 6), set(), lambda nodes: store.commit(dirty_del=nodes))
    deadline = time.monotonic() + 30
    while NODES_EXPIRED._value.get() == before:
        assert time.monotonic() < deadline, "nothing expired"
        loop.poll_once(timeout=0.1)
    loop.close()
    users = {e.src for e in evs}
    assert users - set(store.reader.node_ids())           # spent users left the store
    store.close()


def test_the_tail_of_a_dead_letter_burst_is_reported(caplog):
    """A burst logs one line a second; what the last line did not cover is reported once
    the second has passed, not only when the next bad record comes."""
    from types import SimpleNamespace
    from hirflow.streams.ingest.deadletter import DeadLetters

    sent = []
    producer = SimpleNamespace(produce=lambda *a, **kw: sent.append(kw), poll=lambda t=0: 0)
    dlq = DeadLetters(producer, "dlq")
    with caplog.at_level("WARNING", logger="hirflow.streams.ingest.deadletter"):
        for i in range(5):
            dlq.send_raw("t", 0, i, b"k", b"v", 0, "undecodable")
        assert len(caplog.records) == 1                    # one line for the burst so far
        dlq.flush_log()
        assert len(caplog.records) == 1                    # not yet: within the second
        dlq._last_log -= 1.1
        dlq.flush_log()
    assert len(caplog.records) == 2 and "4 more" in caplog.records[-1].getMessage()
    assert len(sent) == 5


def test_a_broker_that_lost_its_topics_stops_a_running_loop_before_any_new_record(tmp_path):
    """The embedded broker killed and started again on its port (in-memory: its topics are
    gone), the topics created again and a few records produced: the running loop checks the
    topics' identity once the broker answers, before applying anything, and refuses with a
    clear error and a metric. Nothing is applied from the new topic, nothing skipped."""
    import os
    import signal

    import pytest

    from hirflow.state.graph import IncompatibleStoreError
    from hirflow.streams.broker import EmbeddedBroker
    from hirflow.streams.metrics import TOPICS_REFUSED
    from hirflow.streams.topics import ensure_topics
    from tests.conftest import make_config
    b = EmbeddedBroker().start()
    cfg = make_config(tmp_path, bootstrap=b.bootstrap)
    topics = Topics(cfg.kafka.topic_prefix)
    ensure_topics(cfg.kafka, topics)
    produce(cfg, engagements(400), progress=False)
    store = GraphStore(tmp_path / "w", cfg.schema, cfg.kafka.partitions)
    loop = IngestLoop(cfg, GraphWriter(store, cfg.graph), topics)
    try:
        run_until(loop, lambda: committed_total(cfg, topics.engagements) >= 400, timeout=60)
        before = (loop.applied, dict(loop.writer.offsets))
        refused = TOPICS_REFUSED._value.get()
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait()
        for _ in range(20):
            loop.poll_once(timeout=0.05)
        b.start()
        ensure_topics(cfg.kafka, topics)
        produce(cfg, engagements(40), progress=False)
        with pytest.raises(IncompatibleStoreError, match="deleted and created again"):
            run_until(loop, lambda: False, timeout=90)
        assert (loop.applied, dict(loop.writer.offsets)) == before
        assert TOPICS_REFUSED._value.get() == refused + 1
    finally:
        loop.consumer.close()
        store.close()
        b.stop()
