"""The JSON schema of hirflow's config keys, derived from the config dataclasses.

The chart's `values.schema.json` spells out `config` (what goes into config.toml) so that a
typo fails at `helm install` rather than at pod start; the tests compare it with this
derivation so the two cannot drift apart.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Mapping

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean"}


def schema_of(tp: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        kinds = [schema_of(a) if a is not type(None) else {"type": "null"} for a in args]
        return {"anyOf": kinds}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return {"type": "object", "additionalProperties": False,
                "properties": {f.name: schema_of(hints[f.name]) for f in dataclasses.fields(tp)}}
    if origin in (tuple, list):
        return {"type": "array", "items": schema_of(args[0])} if args else {"type": "array"}
    if origin in (dict, Mapping) or tp is dict:
        return {"type": "object", "additionalProperties": schema_of(args[1]) if args else True}
    if tp is float:
        return {"type": "number"}
    return {"type": _SCALARS[tp]}
