"""Layered configuration for frozen dataclasses: defaults < file < env vars < CLI flags.

Every component has one frozen config dataclass; a top-level config nests them as fields.
`load_config` builds one from a TOML or JSON file, environment variables named
`HIRFLOW_<SECTION>__<KEY>` and explicit overrides (from CLI flags, as dotted keys).
An unknown key anywhere is an error that names the key, so a typo never passes silently.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Mapping

ENV_PREFIX = "HIRFLOW_"


class ConfigError(ValueError):
    """A config value or key that cannot be accepted; the message names it."""


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_table_type(tp: Any) -> bool:
    return typing.get_origin(tp) in (dict, Mapping) or tp is dict


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Turn a file/env value into the annotated type; strings from env are parsed."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if _is_dataclass_type(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return build(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected a boolean, got {value!r}")
    if tp in (int, float, str):
        try:
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return tp(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    if origin in (tuple, list):
        if isinstance(value, str):
            value = json.loads(value) if value.strip().startswith("[") else [
                v.strip() for v in value.split(",") if v.strip()]
        elem = args[0] if args else Any
        items = [_coerce(v, elem, f"{where}[{i}]") if elem is not Any and elem is not Ellipsis
                 else v for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): (_coerce(v, vt, f"{where}.{k}") if vt is not Any else v)
                for k, v in value.items()}
    return value


def build(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """Build `cls` from a mapping, filling missing fields with defaults; unknown keys raise."""
    fields = _field_types(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"unknown config key {prefix}{unknown[0]!s}"
                          f" (known: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, tp in fields.items():
        if name in data:
            kwargs[name] = _coerce(data[name], tp, f"{where}.{name}" if where else name)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from None


def as_dict(obj: Any) -> dict[str, Any]:
    """A plain nested dict of a config, for merging and for printing."""
    return dataclasses.asdict(obj)


def _deep_merge(base: dict, top: Mapping) -> dict:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def read_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML (.toml) or JSON (.json) config file into a dict."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    text = p.read_bytes()
    if p.suffix == ".json":
        return json.loads(text)
    try:
        return tomllib.loads(text.decode())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p}: {exc}") from None


def from_env(cls: type, env: Mapping[str, str]) -> dict[str, Any]:
    """Collect `HIRFLOW_SECTION__KEY=value` variables into a nested dict (values as strings).

    Variables with the prefix that name no field are an error, like unknown file keys.
    Inside a table-typed field (such as `kafka.client`) the remaining parts are one key joined
    by dots, so a single entry can come from its own variable (a Kubernetes Secret):
    `HIRFLOW_KAFKA__CLIENT__SASL__PASSWORD` sets `kafka.client["sasl.password"]`.
    """
    out: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in ("HIRFLOW_CONFIG",):
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        tp: Any = cls
        for i, part in enumerate(path):
            if _is_table_type(tp) and i > 0:
                path = path[:i] + [".".join(path[i:])]
                break
            if not _is_dataclass_type(tp) or part not in _field_types(tp):
                raise ConfigError(f"unknown config key {'.'.join(path)} (from env {name})")
            tp = _field_types(tp)[part]
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _dotted(cls: type, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys -> a nested dict. Inside a table-typed field the rest of the key is one
    entry, as with env variables: `kafka.client.sasl.password` sets
    `kafka.client["sasl.password"]`."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = key.split(".")
        tp: Any = cls
        for i, part in enumerate(parts):
            if _is_table_type(tp) and i > 0:
                parts = parts[:i] + [".".join(parts[i:])]
                break
            tp = _field_types(tp).get(part) if _is_dataclass_type(tp) else None
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def load_config(cls: type, file: str | os.PathLike | None = None,
                env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> Any:
    """Defaults < file < env < overrides (dotted keys such as ``kafka.bootstrap``)."""
    env = os.environ if env is None else env
    file = file or env.get("HIRFLOW_CONFIG") or None
    data: dict[str, Any] = {}
    if file:
        data = _deep_merge(data, read_file(file))
    data = _deep_merge(data, from_env(cls, env))
    if overrides:
        data = _deep_merge(data, _dotted(cls, {k: v for k, v in overrides.items() if v is not None}))
    return build(cls, data)
