import json

import numpy as np
import pytest
import torch

from hirflow.encoder.checkpoint import CheckpointError, load, save
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.encoder.serving import encoder_from


def model(seed=0):
    torch.manual_seed(seed)
    return HierarchicalEncoder(EncoderConfig(levels=(4, 16), compile=False))


def weights(m):
    """A checkpoint's weights as the trainer writes them: the encoder's under `encoder.`."""
    return {f"encoder.{k}": v for k, v in m.state_dict().items()}


def manifest(m):
    return {"parent": None, "config": m.cfg.to_dict(), "seed": 0, "data_window": [0, 1],
            "metrics": {"loss": 1.5}}


def test_round_trip_is_exact_and_deterministic(tmp_path):
    m = model()
    cb = np.random.default_rng(0).standard_normal((4, 16, 64)).astype(np.float32)
    p1 = save(tmp_path / "a", weights(m), manifest(m), cb)
    p2 = save(tmp_path / "b", weights(m), manifest(m), cb)
    assert p1.name == p2.name                                   # content-derived id
    for f in ("weights.safetensors", "quantizer.safetensors", "manifest.json"):
        assert (p1 / f).read_bytes() == (p2 / f).read_bytes()
    ck = load(p1)
    m2 = encoder_from(ck)                                       # what a worker serves
    for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k
    assert np.array_equal(ck.codebooks, cb)
    assert not list(tmp_path.glob("*/.tmp-*"))                  # nothing half-written left


def test_flipped_byte_truncation_and_edits_are_refused(tmp_path):
    m = model()
    p = save(tmp_path, weights(m), manifest(m))
    w = p / "weights.safetensors"
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0x01
    w.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="weights.safetensors sha256"):
        load(p)
    data[len(data) // 2] ^= 0x01
    w.write_bytes(bytes(data[:-10]))
    with pytest.raises(CheckpointError, match="tampered or truncated"):
        load(p)
    w.write_bytes(bytes(data))
    load(p)
    man = json.loads((p / "manifest.json").read_text())
    man["metrics"]["loss"] = 0.1
    (p / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(CheckpointError, match="id does not match"):
        load(p)


def test_weights_that_do_not_fit_the_manifest_config_are_refused(tmp_path):
    other = HierarchicalEncoder(EncoderConfig(levels=(4, 32), compile=False))
    p = save(tmp_path, weights(model()), manifest(other))
    with pytest.raises(CheckpointError, match="do not fit"):
        encoder_from(load(p))
