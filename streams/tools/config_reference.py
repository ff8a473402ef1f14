"""The configuration reference (docs/configuration.md), generated from the config dataclasses.

Each key's description is the comment beside its field in the source, so the reference and
the code cannot drift apart: `hirflow config --reference` prints it, and a test compares it
with the file in docs/.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import re
import typing

from hirflow.state.config import ENV_PREFIX
from hirflow.state.schema import ActionSpec
from hirflow.streams.config import HirflowConfig

_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=#]+(?:=[^#]*)?(?:#\s*(.*))?$")
_COMMENT = re.compile(r"^\s+#\s?(.*)$")


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment written beside it (continuation comment lines joined), from
    the class that declares the field (a section may inherit fields: `train` the trainer's)."""
    out: dict[str, str] = {}
    for owner in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        out.update(_own_comments(owner))
    return out


def _own_comments(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    names = set(cls.__dict__.get("__annotations__", {}))
    current = None
    for line in inspect.getsource(cls).splitlines()[1:]:
        m = _FIELD.match(line)
        if m and m.group(1) in names:
            current = m.group(1)
            out[current] = (m.group(2) or "").strip()
            continue
        c = _COMMENT.match(line)
        if c and current is not None and re.match(r"^\s{12,}#", line):
            out[current] = (out[current] + " " + c.group(1).strip()).strip()
        else:
            current = None if not c else current
    return out


def _type_name(tp) -> str:
    s = str(tp) if typing.get_origin(tp) else getattr(tp, "__name__", str(tp))
    s = s.replace("typing.", "").replace("hirflow.state.schema.", "")
    return s.replace(" | None", " or null")      # a table cell cannot hold a bare "|"


def _default(value) -> str:
    if dataclasses.is_dataclass(value):
        return "see below"
    if isinstance(value, dict):
        return "{}" if not value else "see below"
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) if value else "(empty)"
    if value == "":
        return '""'
    return json.dumps(value) if isinstance(value, (bool, type(None))) else str(value)


def _section(name: str, obj) -> list[str]:
    """The table of one section (`name` dotted for a nested one), then a section of its own
    for each field that is itself a config class (`train.collaborative`)."""
    cls = type(obj)
    hints = typing.get_type_hints(cls)
    notes = field_comments(cls)
    doc = inspect.getdoc(cls)
    env_prefix = ENV_PREFIX + "__".join(name.upper().split(".")) + "__"
    lines = [f"## `{name}`", ""]
    if doc and not doc.startswith(cls.__name__ + "("):
        lines += [doc.splitlines()[0] if "\n\n" in doc else " ".join(doc.split()), ""]
    lines += ["| key | type | default | environment variable | what it is |", "|---|---|---|---|---|"]
    nested = []
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        text = notes.get(f.name, "").replace("|", "\\|")
        env = f"`{env_prefix}{f.name.upper()}`"
        type_name = _type_name(hints[f.name])
        if dataclasses.is_dataclass(value):
            nested.append((f"{name}.{f.name}", value))
            text = f"{text}: see `{name}.{f.name}` below" if text else f"see `{name}.{f.name}` below"
            env, type_name = f"`{env_prefix}{f.name.upper()}__<KEY>`", "table"
        lines.append(f"| `{name}.{f.name}` | {type_name} | {_default(value)} | {env} | {text} |")
    lines.append("")
    for sub_name, sub in nested:
        lines += _section(sub_name, sub)
    return lines


def _actions(defaults: dict[str, ActionSpec]) -> list[str]:
    notes = field_comments(ActionSpec)
    lines = ["### Actions (`schema.actions`, `schema.extra_actions`)", "",
             "A table per action name; `extra_actions` adds to the defaults, `actions` replaces "
             "them. Fields of each action:", "",
             "| field | default | what it is |", "|---|---|---|"]
    spec = ActionSpec()
    for f in dataclasses.fields(ActionSpec):
        lines.append(f"| `{f.name}` | {_default(getattr(spec, f.name))} | {notes.get(f.name, '')} |")
    lines += ["", "Default actions:", "", "| action | half-life | sign | structural | funnel weight |",
              "|---|---|---|---|---|"]
    for a, s in defaults.items():
        hl = "never decays" if s.structural else _duration(s.half_life_s)
        lines.append(f"| `{a}` | {hl} | {s.sign:+d} | {json.dumps(s.structural)} | {s.funnel_weight:g} |")
    return lines + [""]


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def render() -> str:
    cfg = HirflowConfig()
    out = ["# Configuration reference", "",
           "Generated from the config dataclasses by `hirflow config --reference` (a test keeps "
           "this file equal to its output). Precedence: **defaults < file** (`--config x.toml` "
           "or `HIRFLOW_CONFIG`) **< environment** (`HIRFLOW_<SECTION>__<KEY>`) **< CLI flags** "
           "(`--set section.key=value`, `--bootstrap`, ...). An unknown key anywhere is an error "
           "that names it. A table-valued key takes one entry per variable: "
           "`HIRFLOW_KAFKA__CLIENT__SASL__PASSWORD` sets `kafka.client[\"sasl.password\"]`. "
           "`hirflow config` prints the effective config.", "",
           "Example (`configs/online_retail.toml` is a complete one for a data set):", "",
           "```toml", "[kafka]", 'bootstrap = "b-1.kafka:9092,b-2.kafka:9092"', "partitions = 24",
           "replication = 3", "", "[refresh]", 'checkpoint = "/checkpoints/ckpt-0123abcd"',
           "neighbor_rate = 1000", "", "[schema.extra_actions.share]", "half_life_s = 604800",
           "funnel_weight = 2.0", "```", ""]
    for f in dataclasses.fields(cfg):
        out += _section(f.name, getattr(cfg, f.name))
        if f.name == "schema":
            out += _actions(cfg.schema.actions)
    return "\n".join(out).rstrip() + "\n"
