"""The README's first examples, as a new user meets them: its JSON records produced as they
are shown (keyed by `src` / `node`, murmur2 partitioning), a worker with no checkpoint yet,
and its `curl` examples answering with the fields the README shows; before the first
checkpoint `retrieve` answers from the graph, as the README says."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from hirflow.streams import clients
from hirflow.streams.topics import Topics
from hirflow.streams.worker.worker_process import WorkerProcess

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def json_examples() -> list[dict]:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", README, re.S)
            if b.lstrip().startswith("{") and "\n" not in b.strip()]


def curl_examples() -> list[tuple[str, str]]:
    """(path and query, the output shown) of each `$ curl 'localhost:6066/...'` line."""
    out = []
    for block in re.findall(r"```\n(\$ curl.*?)```", README, re.S):
        for cmd, shown in re.findall(r"\$ curl '[^/]+(/[^']+)'\n(.*?)(?=\n\$ curl|\Z)", block, re.S):
            out.append((cmd, shown))
    return out


def top_level_keys(text: str) -> set[str]:
    """The keys at the outermost level of a JSON object shown with `...` elisions."""
    keys, depth = set(), 0
    for m in re.finditer(r'[{}\[\]]|"([^"]+)":', text):
        tok = m.group(0)
        if tok in "{[":
            depth += 1
        elif tok in "}]":
            depth -= 1
        elif depth == 1:
            keys.add(m.group(1))
    return keys


def test_the_readme_records_and_queries_work_before_the_first_checkpoint(cfg, tmp_path):
    records = json_examples()
    engagement = next(r for r in records if "src" in r)
    entity = next(r for r in records if "node" in r and "text" in r)
    now = int(time.time() * 1000)
    user = engagement["src"]
    # the README's record, and a few users who share its item and engaged others
    evs = [dict(engagement, ts=now - 60_000)]
    for i in range(3):
        evs += [dict(engagement, src=f"user:co{i}", ts=now - 50_000),
                dict(engagement, src=f"user:co{i}", dst=f"ad:other{i}", ts=now - 40_000)]
    topics = Topics(cfg.kafka.topic_prefix)
    p = clients.producer(cfg.kafka)
    for e in evs:
        p.produce(topics.engagements, json.dumps(e).encode(), key=e["src"].encode())
    p.produce(topics.entities, json.dumps(dict(entity, ts=now)).encode(), key=entity["node"].encode())
    assert p.flush(30) == 0
    w = WorkerProcess(cfg, tmp_path / "worker.log", {"HIRFLOW_WORKER__KNOWLEDGE": "false",
                                                      "HIRFLOW_WORKER__METRICS_INTERVAL_S": "0.5"}).start()
    try:
        w.wait_metric("hirflow_events_applied_total", len(evs), timeout=90)
        shown = dict(curl_examples())
        retrieve = next(c for c in shown if c.startswith("/v1/retrieve"))
        similar = next(c for c in shown if c.startswith("/v1/similar"))
        for path in (retrieve, similar):
            mine = path.replace("user:u512", user)
            deadline = time.monotonic() + 60
            while True:                      # 503 until the worker has caught up and serves
                status, body = w.get(mine)
                got = json.loads(body) if status == 200 else {}
                if got.get("results") or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert status == 200, f"{mine}: {status} {body[:200]!r}"
            want = top_level_keys(shown[path])
            assert want <= set(got), f"{mine}: the README shows {sorted(want - set(got))} too"
            assert got["results"], f"{mine} answered nothing"
            if path == retrieve:
                assert got["method"] == "neighbourhood"
                assert {r["node"] for r in got["results"]} <= {f"ad:other{i}" for i in range(3)}
    finally:
        w.close()
