"""Hot swap under load: queries answer throughout, the generation flips once, a tampered
checkpoint is refused and the old model keeps serving."""
from __future__ import annotations

import shutil
import threading
import time

from hirflow.state.events import Engagement
from hirflow.streams.hotswap.watch import CheckpointWatcher
from hirflow.streams.metrics import CHECKPOINTS_REFUSED, INDEX_SWITCHES
from hirflow.streams.api.query import QueryService
from hirflow.streams.subscribe import Subscriber
from hirflow.streams.topics import Topics
from hirflow.trainer.announcement import Announcement
from hirflow.trainer.publish import announce
from tests.conftest import replace_section
from tests.streams.refresh_helpers import assert_index_matches_state, loop_over, settle


def _announce(cfg, path):
    return announce({"bootstrap.servers": cfg.kafka.bootstrap}, Topics(cfg.kafka.topic_prefix).checkpoints, path)


def test_hot_swap_under_load_flips_once_and_refuses_a_tampered_checkpoint(cfg, tiny_world, tiny_checkpoints, tmp_path):
    a, b = tiny_checkpoints
    cfg = replace_section(cfg, "refresh", checkpoint=str(a), swap_rate=400.0)
    events = sorted(tiny_world, key=lambda e: e.ts)
    store, writer, loop = loop_over(cfg, events[:1000])
    watcher = CheckpointWatcher(cfg, loop.request_swap, poll_s=0.2)
    try:
        settle(loop, 200)
        gen0, switches0, refused0 = loop.gen, INDEX_SWITCHES._value.get(), CHECKPOINTS_REFUSED._value.get()
        q = QueryService.of(loop)
        user = next(n for n in loop.memory.ids if n.startswith("user:"))
        assert q.retrieve({"user": user, "k": "10"})["results"]
        prim = int(loop.memory.assign[loop.memory.row(user), 0])
        assert q.primitive("0", str(prim), {})["members"]
        assert 0.0 <= q.proximity({"node": user, "level": "0", "prim": str(prim)})["behaviour_share"] <= 1.0

        # a tampered copy of b is announced first: refused, a serves on
        bad = tmp_path / "tampered" / b.name
        shutil.copytree(b, bad)
        _announce(cfg, bad)
        with open(bad / "weights.safetensors", "r+b") as f:
            f.seek(200)
            f.write(b"\x00\x01\x02\x03")
        watcher.start()
        deadline = time.monotonic() + 30
        while CHECKPOINTS_REFUSED._value.get() == refused0:
            assert time.monotonic() < deadline, "tampered checkpoint was not refused"
            loop.run_once()
        assert loop.active.id == a.name and loop.gen == gen0 and loop.building is None

        # the real b under load: events keep arriving, queries keep answering
        answers, errors, stop = [], [], threading.Event()

        def query():
            while not stop.is_set():
                try:
                    answers.append((loop.gen, len(q.retrieve({"user": user, "k": "10"})["results"])))
                except Exception as exc:     # noqa: BLE001 - the test reports any failure
                    errors.append(exc)
                time.sleep(0.005)

        qt = threading.Thread(target=query)
        qt.start()
        _announce(cfg, b)
        rest = events[1000:]
        deadline = time.monotonic() + 120
        i = 0
        gens = []
        while loop.active.id != b.name or loop.swap.busy:
            assert time.monotonic() < deadline, "hot swap did not finish"
            if i < len(rest):
                writer.apply_batch([(e, 3) for e in rest[i:i + 20]])
                writer.commit()
                i += 20
            loop.run_once()
            gens.append(loop.gen)
        stop.set()
        qt.join()
        assert not errors and answers and all(n > 0 for _, n in answers)
        assert sorted(set(gens)) == [gen0, gen0 + 1] and gens == sorted(gens)   # flipped once
        assert INDEX_SWITCHES._value.get() == switches0 + 1
        assert {g for g, _ in answers} <= {gen0, gen0 + 1}
        settle(loop, 200)
        assert_index_matches_state(loop)
        assert loop.index.count(gen0) == 0                   # the old generation is gone
        assert all(r.model == b.name for r in loop.index.iter_records(loop.gen))
        with Subscriber(cfg, group_id="t-swap") as sub:
            got = []
            for _ in range(40):
                got += sub.poll(0.5)
                if {c.node for c in got if c.model == b.name} >= set(loop.memory.ids):
                    break
        assert {c.node for c in got if c.model == b.name} >= set(loop.memory.ids)
    finally:
        watcher.close()
        loop.close()
        store.close()


def test_events_after_the_swap_use_the_new_model(cfg, tiny_world, tiny_checkpoints):
    a, b = tiny_checkpoints
    cfg = replace_section(cfg, "refresh", checkpoint=str(a), swap_rate=10_000.0)
    store, writer, loop = loop_over(cfg, tiny_world[:500])
    try:
        settle(loop, 200)
        loop.request_swap(Announcement(b.name, str(b)))
        settle(loop, 200)
        t = max(e.ts for e in tiny_world)
        writer.apply_batch([(Engagement("user:fresh", "ad:new", "click", t, 1.0), 3)])
        writer.commit()
        settle(loop)
        rec = loop.index.records(loop.gen, ["user:fresh"])[0]
        assert rec.model == b.name and rec.seq == 1
    finally:
        loop.close()
        store.close()


def _rewritten(src, dest_root, **manifest_changes):
    """A copy of checkpoint `src` whose manifest has `manifest_changes`, with a matching id
    (so only the changed content can be the reason a worker refuses it)."""
    import json

    from hirflow.encoder.checkpoint import MANIFEST, content_id
    tmp = dest_root / "tmp"
    shutil.copytree(src, tmp)
    m = json.loads((tmp / MANIFEST).read_text())
    m.update(manifest_changes)
    body = {k: v for k, v in m.items() if k not in ("id", "files", "format")}
    m["id"] = content_id(m["files"], body)
    (tmp / MANIFEST).write_text(json.dumps(m))
    return tmp.rename(dest_root / m["id"])


def test_announcements_a_worker_must_not_act_on_are_refused_and_it_serves_on(
        cfg, tiny_world, tiny_checkpoints, tmp_path):
    """Outside the checkpoints root, a manifest other than the one announced, a model config
    from a newer trainer (unknown key), a file listed outside the folder, a checkpoint
    trained on older data, an announcement older than the serving model's: each is refused
    with a metric, and the loop runs on."""
    from hirflow.encoder.checkpoint import MANIFEST, sha256_file
    a, b = tiny_checkpoints
    root = tmp_path / "root"
    root.mkdir()
    a2, b2 = shutil.copytree(a, root / a.name), shutil.copytree(b, root / b.name)
    outside = shutil.copytree(b, tmp_path / "elsewhere" / b.name)
    manifest = __import__("json").loads((b2 / MANIFEST).read_text())
    newer = _rewritten(b2, root, config={**manifest["config"], "a_knob_from_the_future": 1})
    escaping = _rewritten(b2, root, files={**manifest["files"], "../../secret": "0" * 64})
    older = _rewritten(b2, root, data_window=[1, 2])          # trained on older data
    cfg = replace_section(cfg, "refresh", checkpoint=str(a2), swap_rate=10_000.0,
                          checkpoints_root=str(root))
    store, writer, loop = loop_over(cfg, tiny_world[:300])
    try:
        settle(loop, 100, 5)
        cases = [Announcement(b.name, str(outside), ts=10),
                 Announcement(b.name, str(b2), sha256="0" * 64, ts=11),
                 Announcement(newer.name, str(newer), ts=12),
                 Announcement(escaping.name, str(escaping), ts=13),
                 Announcement(older.name, str(older), ts=14)]
        for ann in cases:
            refused = CHECKPOINTS_REFUSED._value.get()
            loop.request_swap(ann)
            loop.run_once()
            assert CHECKPOINTS_REFUSED._value.get() == refused + 1, ann
            assert loop.active.id == a.name and loop.building is None and loop.error is None
        loop.request_swap(Announcement(b.name, str(b2), sha256_file(b2 / MANIFEST), ts=20))
        settle(loop, 100, 5)
        assert loop.active.id == b.name
        refused = CHECKPOINTS_REFUSED._value.get()
        loop.request_swap(Announcement(a.name, str(a2), ts=15))       # replayed, older: no rollback
        loop.run_once()
        assert CHECKPOINTS_REFUSED._value.get() == refused + 1 and loop.active.id == b.name
    finally:
        loop.close()
        store.close()


def test_the_swap_lists_every_node_once_a_slice_at_a_time(tmp_path, tiny_world):
    """Node records in key order, resumed after the last key (a node added meanwhile behind
    the cursor is the refresh's: it is dirty), then indexed nodes without a record."""
    from hirflow.state.graph import GraphConfig, GraphStore
    from hirflow.state.schema import SchemaConfig
    from hirflow.state.writer import GraphWriter
    from hirflow.streams.hotswap.build import NodeList
    with GraphStore(tmp_path / "s", SchemaConfig(), 4) as store:
        w = GraphWriter(store, GraphConfig())
        w.apply_batch([(e, 3) for e in tiny_world[:200]])
        w.commit()
        stored = set(store.reader.node_ids())
        nodes = NodeList(store, sorted(stored)[:5] + ["ad:text-only"])
        got = []
        while not nodes.exhausted:
            got += nodes.take(7)
        assert len(got) == len(set(got)) and set(got) == stored | {"ad:text-only"}


def test_a_watcher_that_stops_says_so(cfg, tiny_checkpoints):
    """The worker's /health reads `watcher.error`: a stopped watcher is never silent."""
    a, _ = tiny_checkpoints

    def fail(ann):
        raise RuntimeError("cannot hand over")
    watcher = CheckpointWatcher(cfg, fail, poll_s=0.2)
    watcher.start()
    try:
        _announce(cfg, a)
        deadline = time.monotonic() + 30
        while watcher.error is None:
            assert time.monotonic() < deadline, "the watcher's failure was not reported"
            time.sleep(0.1)
        assert "cannot hand over" in str(watcher.error)
    finally:
        watcher.close()
