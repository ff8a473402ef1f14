"""Checkpoints: safetensors weights + a JSON manifest; verified on load, never unpickled.

Layout of a checkpoint directory::

    manifest.json        id, parent, config, data window, seed, metrics, quantizer config,
                         files: {name: sha256}
    weights.safetensors  model parameters and buffers
    quantizer.safetensors  BoM codebooks (M, 2^nbits, d)
    collaborative.json   the collaborative block's item vocabulary (`encoder.collaborative`),
                         when the checkpoint has one; any further JSON file is listed and
                         verified the same way

Written into a temporary sibling directory and renamed, so a crash never leaves half a
checkpoint. Loading recomputes every file's sha256 and refuses a tampered, truncated or
mismatched checkpoint with a message that names the file. The same tensors and manifest
always serialise to the same bytes (sorted keys, no wall-clock fields).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file as load_np, save_file as save_np
from safetensors.torch import load_file as load_torch, save_file as save_torch

FORMAT = "hirflow-checkpoint/1"
WEIGHTS, QUANTIZER, MANIFEST = "weights.safetensors", "quantizer.safetensors", "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that must not be used; the message says which file and why."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    manifest: dict[str, Any]
    weights: dict[str, torch.Tensor]
    codebooks: np.ndarray | None
    documents: dict[str, Any] | None = None   # file name -> content of its further JSON files

    @property
    def id(self) -> str:
        return self.manifest["id"]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_id(files: dict[str, str], manifest: dict[str, Any]) -> str:
    """A checkpoint id derived from its content: same data + seed -> same id."""
    h = hashlib.sha256(json.dumps({"files": files, "manifest": manifest}, sort_keys=True).encode())
    return "ckpt-" + h.hexdigest()[:16]


def save(root: str | os.PathLike, weights: dict[str, torch.Tensor], manifest: dict[str, Any],
         codebooks: np.ndarray | None = None, documents: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint under `root/<id>`; returns its path. `manifest` must not hold
    `id`, `files` or `format` (they are derived here); `documents`: further JSON files
    (name ending in .json -> content)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in sorted(weights.items())}
        save_torch(tensors, str(tmp / WEIGHTS))
        if codebooks is not None:
            save_np({"codebooks": np.ascontiguousarray(codebooks, np.float32)}, str(tmp / QUANTIZER))
        for name, content in sorted((documents or {}).items()):
            if not name.endswith(".json") or "/" in name or name in (MANIFEST,):
                raise ValueError(f"a checkpoint document must be a plain .json file name, got {name!r}")
            (tmp / name).write_text(json.dumps(content, sort_keys=True) + "\n")
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        body = {k: v for k, v in manifest.items() if k not in ("id", "files", "format")}
        ckpt_id = content_id(files, body)
        full = {"format": FORMAT, "id": ckpt_id, **body, "files": files}
        (tmp / MANIFEST).write_text(json.dumps(full, sort_keys=True, indent=2) + "\n")
        for p in tmp.iterdir():
            with p.open("rb") as f:
                os.fsync(f.fileno())
        final = root / ckpt_id
        if final.exists():                      # the same content was saved before
            shutil.rmtree(tmp)
            return final
        os.rename(tmp, final)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load(path: str | os.PathLike) -> Checkpoint:
    """Verify and load; raises CheckpointError for anything that does not check out."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.exists():
        raise CheckpointError(f"{path}: no {MANIFEST}; not a hirflow checkpoint")
    try:
        manifest = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{mpath}: unreadable manifest ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mpath}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    files = manifest.get("files") or {}
    if not isinstance(files, dict) or WEIGHTS not in files:
        raise CheckpointError(f"{mpath}: lists no {WEIGHTS}")
    root = path.resolve()
    for name, digest in files.items():
        f = path / name
        if not isinstance(name, str) or not isinstance(digest, str) or f.resolve().parent != root:
            raise CheckpointError(f"{mpath}: file {str(name)[:80]!r} is not a file of the "
                                  f"checkpoint folder")
        if not f.exists():
            raise CheckpointError(f"{path}: {name} is missing")
        actual = sha256_file(f)
        if actual != digest:
            raise CheckpointError(f"{path}: {name} sha256 {actual[:12]}... does not match the "
                                  f"manifest's {digest[:12]}... (tampered or truncated)")
    body = {k: v for k, v in manifest.items() if k not in ("id", "files", "format")}
    if content_id(files, body) != manifest.get("id"):
        raise CheckpointError(f"{mpath}: id does not match the content (manifest edited?)")
    try:
        weights = load_torch(str(path / WEIGHTS))
        codebooks = load_np(str(path / QUANTIZER))["codebooks"] if QUANTIZER in files else None
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read tensors ({exc})") from None
    documents = {}
    for name in files:
        if name.endswith(".json"):
            try:
                documents[name] = json.loads((path / name).read_text())
            except (ValueError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{path}: {name} is not JSON ({exc})") from None
    return Checkpoint(path, manifest, weights, codebooks, documents)
