"""Snapshots of a training run in progress, so an interrupted run continues where it stopped.

At the end of a chunk the trainer stores the student, teacher, engagement head, optimizer
state and the position (next chunk, step) under `<out>/_resume/`: tensors in safetensors (never
pickle), the rest in `state.json`, which names the tensor file and its sha256 and is replaced
atomically, so a crash mid-write leaves the previous snapshot intact. A snapshot is used only
for the same data, configs and seed (its fingerprint); since every batch's randomness is
seeded by its step, the resumed run writes the same checkpoint bytes as an uninterrupted one.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hirflow.encoder.checkpoint import sha256_file

STATE = "state.json"


class ResumeError(ValueError):
    """A snapshot that cannot be continued; the message says why."""


def fingerprint(*parts: Any) -> str:
    """sha256 of JSON-able parts (event tuples, config dicts, seeds)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


def save(root: Path, fp: str, next_chunk: int, step: int, modules: dict[str, torch.nn.Module],
         opt: torch.optim.Optimizer, metrics: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tensors = {f"{name}.{k}": v.detach().cpu().contiguous()
               for name, m in modules.items() for k, v in m.state_dict().items()}
    osd = opt.state_dict()
    for pid, st in osd["state"].items():
        for k, v in st.items():
            tensors[f"opt.{pid}.{k}"] = torch.as_tensor(v).detach().cpu().contiguous()
    name = f"state-{step:08d}-{uuid.uuid4().hex[:8]}.safetensors"
    save_file(tensors, str(root / name))
    body = {"fingerprint": fp, "next_chunk": next_chunk, "step": step, "tensors": name,
            "sha256": sha256_file(root / name), "param_groups": osd["param_groups"],
            "metrics": metrics}
    tmp = root / f".{STATE}.{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(body, sort_keys=True))
    os.replace(tmp, root / STATE)
    for old in root.glob("state-*.safetensors"):
        if old.name != name:
            old.unlink()


def load(root: Path, fp: str, modules: dict[str, torch.nn.Module],
         opt: torch.optim.Optimizer) -> tuple[int, int, dict] | None:
    """Restore a snapshot into `modules` and `opt`; -> (next_chunk, step, last metrics), or
    None when there is none. Refuses one of other data or configs, or a damaged one."""
    path = root / STATE
    if not path.exists():
        return None
    body = json.loads(path.read_text())
    if body["fingerprint"] != fp:
        raise ResumeError(f"{root}: the snapshot is of a run with other data, configs or seed; "
                          "remove it or train without --resume")
    tfile = root / body["tensors"]
    if not tfile.exists() or sha256_file(tfile) != body["sha256"]:
        raise ResumeError(f"{tfile}: missing or damaged (sha256 differs from {STATE})")
    tensors = load_file(str(tfile))
    for name, m in modules.items():
        pre = f"{name}."
        m.load_state_dict({k[len(pre):]: v for k, v in tensors.items() if k.startswith(pre)})
    state: dict[int, dict] = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, pid, key = k.split(".", 2)
            state.setdefault(int(pid), {})[key] = v
    opt.load_state_dict({"state": state, "param_groups": body["param_groups"]})
    return body["next_chunk"], body["step"], body["metrics"]
