"""The change-log replay rules: whatever owners, crashes, moves and fenced-off writers did,
replaying the log gives exactly the state the partition's current owner holds."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hirflow.state.partition_log import (CLAIM, Replay, Step, claim_record, partition_of_key, replay,
                                         set_records)
from hirflow.state.graph import offset_key, reverse_mark_key


class Log:
    def __init__(self) -> None:
        self.records: list[tuple[int, bytes, bytes]] = []

    def append(self, recs) -> int:
        for kind, value in recs:
            self.records.append((len(self.records), kind, value))
        return len(self.records) - 1


def apply_steps(state: dict, steps) -> tuple[dict, int]:
    state, cseq = dict(state), -1
    for step in steps:
        if step.replace:
            state = {}
        for code, key, value in step.ops:
            if value is None:
                state.pop((code, key), None)
            else:
                state[(code, key)] = value
        cseq = step.cseq
    return state, cseq


class Owner:
    """A worker holding the partition: local state and where it is in the log."""

    def __init__(self, log: Log, state: dict, cseq: int, keep: bool) -> None:
        self.log = log
        self.epoch = log.append([claim_record(cseq if keep else None, "w")])
        self.state, self.cseq = state, cseq

    def commit(self, ops, part_bytes: int, crash_before_local: bool) -> None:
        self.log.append(set_records(self.epoch, self.cseq + 1, ops, part_bytes))
        if crash_before_local:
            return
        self.state, _ = apply_steps(self.state, [Step(self.cseq + 1, ops)])
        self.cseq += 1

    def snapshot(self, part_bytes: int) -> None:
        ops = [(c, k, v) for (c, k), v in sorted(self.state.items())]
        self.log.append(set_records(self.epoch, self.cseq, ops, part_bytes, snapshot=True))


ops_st = st.lists(st.tuples(st.integers(0, 6), st.binary(min_size=1, max_size=3),
                            st.one_of(st.none(), st.binary(max_size=40))), min_size=1, max_size=12)
action_st = st.one_of(
    st.tuples(st.just("commit"), ops_st, st.booleans()),
    st.tuples(st.just("restart")),          # the owner restarts on its own (kept) state
    st.tuples(st.just("move")),             # another worker restores from the log
    st.tuples(st.just("zombie"), ops_st),   # a fenced-off former owner writes anyway
    st.tuples(st.just("snapshot")),
)


def play(actions, part_bytes: int) -> tuple[Log, Owner]:
    """The log that owners, crashes, moves and zombies write, and the current owner."""
    log = Log()
    owner = Owner(log, {}, 0, keep=False)
    former: Owner | None = None
    crashed = False
    for action in actions:
        kind = action[0]
        if kind == "commit":
            if crashed:                      # a crashed owner restarts before anything else
                owner = Owner(log, owner.state, owner.cseq, keep=True)
                crashed = False
            owner.commit(action[1], part_bytes, crash_before_local=action[2])
            crashed = action[2]
        elif kind == "restart":
            owner = Owner(log, owner.state, owner.cseq, keep=True)
            crashed = False
        elif kind == "move":
            epoch_claim = len(log.records)
            base = None
            log.append([claim_record(base, "other")])
            state, cseq = apply_steps({}, replay(log.records[:epoch_claim], base))
            former, owner = owner, Owner.__new__(Owner)
            owner.log, owner.epoch, owner.state, owner.cseq = log, epoch_claim, state, max(cseq, 0)
            crashed = False
        elif kind == "zombie" and former is not None:
            log.append(set_records(former.epoch, former.cseq + 1, action[1], part_bytes))
        elif kind == "snapshot" and not crashed:
            owner.snapshot(part_bytes)
    return log, owner


@settings(max_examples=300, deadline=None)
@given(st.lists(action_st, max_size=30), st.sampled_from([30, 200, 10_000]))
def test_replaying_the_log_gives_the_current_owners_state(actions, part_bytes):
    log, owner = play(actions, part_bytes)
    # a worker that takes over with no state of its own (base None) may also get a set the
    # owner produced but crashed before committing: a valid next state; with the owner's
    # base it gets exactly the owner's state
    state, cseq = apply_steps({}, replay(log.records, owner.cseq))
    assert state == owner.state
    assert max(cseq, 0) == owner.cseq or not state


@settings(max_examples=200, deadline=None)
@given(st.lists(action_st, max_size=30), st.sampled_from([30, 200, 10_000]), st.data())
def test_a_replay_resumed_after_any_step_ends_where_the_whole_replay_does(actions, part_bytes, data):
    """What a standby does: apply the steps up to one, stop, later resume from that step's
    position with only the records after it; the state equals one replay of the whole log."""
    log, owner = play(actions, part_bytes)
    for base in (owner.cseq, None):
        steps = list(replay(log.records, base))
        whole = apply_steps({}, steps)
        if not steps:
            continue
        k = data.draw(st.integers(1, len(steps)), label="steps applied before stopping")
        done = apply_steps({}, steps[:k])[0]
        resumed = Replay.resume(steps[k - 1].position())
        rest = [s for o, kind, value in log.records[steps[k - 1].offset + 1:]
                for s in resumed.feed(o, kind, value)] + list(resumed.end(base))
        assert [s.offset for s in rest] == [s.offset for s in steps[k:]]
        assert apply_steps(done, rest)[0] == whole[0]
        assert (rest or steps[:k])[-1].cseq == whole[1]


def test_an_orphan_set_is_dropped_at_the_owners_restart_claim_and_kept_otherwise():
    log = Log()
    o = Owner(log, {}, 0, keep=False)
    o.commit([(0, b"a", b"1")], 1000, crash_before_local=False)
    o.commit([(0, b"a", b"2")], 1000, crash_before_local=True)       # produced, never local
    assert apply_steps({}, replay(log.records, base=1))[0] == {(0, b"a"): b"1"}
    assert apply_steps({}, replay(log.records, base=None))[0] == {(0, b"a"): b"2"}


def test_a_snapshot_without_its_claim_starts_the_history():
    """Retention may delete the claim that opened an epoch; its snapshot still counts."""
    log = Log()
    o = Owner(log, {}, 0, keep=False)
    o.commit([(0, b"a", b"1")], 1000, crash_before_local=False)
    o.snapshot(1000)
    o.commit([(0, b"b", b"2")], 1000, crash_before_local=False)
    first_snapshot = next(i for i, (_, kind, _) in enumerate(log.records) if kind == b"snapshot")
    trimmed = log.records[first_snapshot:]
    assert apply_steps({}, replay(trimmed, base=o.cseq))[0] == o.state


def test_incomplete_parts_never_apply():
    log = Log()
    o = Owner(log, {}, 0, keep=False)
    recs = list(set_records(o.epoch, 1, [(0, bytes([i]), b"x" * 20) for i in range(5)], 30))
    assert len(recs) > 1
    log.append(recs[:-1])                                  # the owner died mid-set
    assert list(replay(log.records, base=None)) == []


def test_movable_keys_belong_to_their_partition():
    assert partition_of_key("nodes", (7).to_bytes(2, "big") + b"\0" * 8) == 7
    assert partition_of_key("outbox", (3).to_bytes(2, "big") + b"\1" * 16) == 3
    assert partition_of_key("meta", offset_key("hirflow.engagements", 5)) == 5
    assert partition_of_key("meta", reverse_mark_key(2, 9)) == 2
    assert partition_of_key("meta", b"index:active") is None
    assert partition_of_key("embeddings", b"\0\1" + b"\0" * 10) is None
    assert Replay().epoch == -1 and CLAIM == b"claim"
