"""Views as the API shows them (`GET /v1/nodes/{node}/view`), computed from a store in the
test, and compared with a worker's answer."""
import pytest

from hirflow.state.views import STUDENT, ViewSampler
from hirflow.streams.api.query import QueryService


def direct_view(cfg, store, node: str, cutoff: int) -> dict:
    """`GET /v1/nodes/{node}/view?cutoff=...&seed=0` as a single store of every event gives it."""
    def sample(n: str, c: int, s: int):
        return ViewSampler(store.reader, cfg.schema, STUDENT, seed=s).sample([n], c)[0]
    service = QueryService(lambda: None, None, cfg.schema.all_node_types, dict, view_of=sample,
                           actions=cfg.schema.all_actions)
    return service.view(node, {"cutoff": str(cutoff), "seed": "0"})


def assert_same_view(got: dict, want: dict) -> None:
    assert [(x["node"], x["type"], x["hop"]) for x in got["nodes"]] == \
        [(x["node"], x["type"], x["hop"]) for x in want["nodes"]]
    for a, b in zip(got["nodes"], want["nodes"]):
        assert a["stats"] == pytest.approx(b["stats"], rel=1e-5, abs=1e-5), a["node"]
    assert [(e["src"], e["dst"], e["action"]) for e in got["edges"]] == \
        [(e["src"], e["dst"], e["action"]) for e in want["edges"]]
    assert [e["weight"] for e in got["edges"]] == pytest.approx([e["weight"] for e in want["edges"]],
                                                                 rel=1e-5, abs=1e-5)
