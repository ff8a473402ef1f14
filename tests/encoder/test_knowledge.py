"""World knowledge: real MiniLM vectors; an unseen node with text lands near its interest."""
import numpy as np
import torch

from hirflow.encoder.batching import pack
from hirflow.encoder.knowledge import TextEncoder
from hirflow.encoder.model import EncoderConfig, HierarchicalEncoder
from hirflow.state.schema import SchemaConfig
from hirflow.state.views import N_STATS, View
from hirflow.streams.tools.synth import SynthConfig, SynthWorld


def lone_view(node: str, type_index: int) -> View:
    """What the sampler gives for a node with no events yet: the node alone."""
    z = np.zeros(0, np.int32)
    return View(node, 0, (node,), np.array([type_index], np.int16), np.zeros(1, np.int8),
                np.zeros((1, N_STATS), np.float32), z, z, z.astype(np.int16),
                z.astype(np.float32), z.astype(np.float32))


def test_text_encoder_is_offline_batched_and_cached():
    enc = TextEncoder(device="cpu")
    v = enc.encode(["trail running shoes", "coffee maker", "trail running shoes"])
    assert v.shape == (3, 384) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-4)
    assert enc.encoded == 2                                      # the repeat came from the cache
    assert float(v[0] @ v[2]) > 0.999


def test_unseen_node_with_text_is_closer_to_its_planted_interest():
    world = SynthWorld(SynthConfig(seed=3, users=10))
    labels = {r["node"]: r["fine"] for r in world.labels() if r["node"].startswith("product:")}
    texts = {e.node: e.text for _, e in world.structure() if hasattr(e, "text") and e.node in labels}
    nodes = sorted(texts)
    enc = TextEncoder(device="cpu")
    vecs = dict(zip(nodes, enc.encode([texts[n] for n in nodes])))
    schema = SchemaConfig()
    cfg = EncoderConfig.for_schema(schema, compile=False)
    torch.manual_seed(0)
    model = HierarchicalEncoder(cfg).eval()
    ptype = schema.all_node_types.index("product")
    batch = pack([lone_view(n, ptype) for n in nodes], cfg.pack, knowledge=vecs)
    with torch.no_grad():
        emb, _ = model(batch, "dense_per_view")
    emb = emb.numpy()
    fine = np.array([labels[n] for n in nodes])
    wins, trials = 0, 0
    for i in range(len(nodes)):                   # each node plays the unseen one in turn
        same = (fine == fine[i]) & (np.arange(len(nodes)) != i)
        other = fine != fine[i]
        if same.any() and other.any():
            sims = emb @ emb[i]
            wins += sims[same].mean() > sims[other].mean()
            trials += 1
    assert trials > 20 and wins / trials >= 0.9
