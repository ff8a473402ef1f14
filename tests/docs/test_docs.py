"""The documents that are generated or checked against the code stay true to it."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from hirflow.streams.config import HirflowConfig
from hirflow.streams.tools.config_reference import field_comments, render

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_current():
    """docs/configuration.md is what `hirflow config --reference` prints today."""
    assert (ROOT / "docs/configuration.md").read_text() == render(), \
        "regenerate: hirflow config --reference > docs/configuration.md"


def test_every_config_key_is_described():
    cfg = HirflowConfig()
    for section in dataclasses.fields(cfg):
        cls = type(getattr(cfg, section.name))
        notes = field_comments(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not notes.get(f.name)]
        assert not missing, f"{section.name}: keys without a comment beside them: {missing}"


def test_comment_parser_joins_continuation_lines():
    @dataclasses.dataclass
    class Example:
        a: int = 1          # first line
                            # and its continuation
        b: str = "x"        # b's own
        c: float = 2.0

    assert field_comments(Example) == {"a": "first line and its continuation", "b": "b's own", "c": ""}


def test_markdown_links_resolve_inside_the_repository():
    """Every relative link in the README and docs/ points at a file of the repository (a
    user's clone has nothing beside it)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "helm/hirflow/README.md"]
    for f in files:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", f.read_text()):
            if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path = (f.parent / target).resolve()
            assert path.exists(), f"{f.relative_to(ROOT)} links to missing {target}"
            assert ROOT in path.parents or path == ROOT, \
                f"{f.relative_to(ROOT)} links outside the repository: {target}"
