"""The values table of helm/hirflow/README.md, made from the `## @section` / `## @param`
lines of values.yaml (the convention of Bitnami's readme-generator-for-helm)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "hirflow"


def _lookup(values: dict, dotted: str):
    node = values
    for part in dotted.split("."):
        node = node[part]
    return node


def values_table(chart: Path = CHART) -> str:
    text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(text)
    out: list[str] = []
    for line in text.splitlines():
        s = re.match(r"^\s*## @section (.+)$", line)
        if s:
            out += ["", f"### {s.group(1).strip()}", "", "| value | description | default |",
                    "|---|---|---|"]
            continue
        p = re.match(r"^\s*## @param (\S+) (.+)$", line)
        if p:
            default = json.dumps(_lookup(values, p.group(1)))
            out.append(f"| `{p.group(1)}` | {p.group(2).strip().replace('|', '/')} | `{default}` |")
    return "\n".join(out).strip() + "\n"


if __name__ == "__main__":
    print(values_table(), end="")
