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
