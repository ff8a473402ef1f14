import numpy as np
from hypothesis import given, settings, strategies as st

from hirflow.encoder.quantize import BoMQuantizer, unpack_codes
from hirflow.encoder.quantizer_config import LEGACY_BEAM, QuantizerConfig


def data(n=3000, d=32, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_tokens_are_stable_unique_per_codebook_and_survive_a_codebook_round_trip():
    x = data()
    q = BoMQuantizer(32, QuantizerConfig(m=4, nbits=5)).train(x)
    tok = q.tokens(x)
    assert tok.shape == (3000, 4) and tok.dtype == np.int64
    for m in range(4):                                          # codebook m owns its id range
        assert ((tok[:, m] >> 5) == m).all()
    q2 = BoMQuantizer.from_codebooks(q.codebooks_array(), q.cfg)
    assert (q2.tokens(x) == tok).all()
    assert ((tok & 31) == q.codes(x)).all()                      # the low bits are the code


def test_reconstruction_improves_with_more_codebooks_and_training_is_reproducible():
    x = data()
    errs = [BoMQuantizer(32, QuantizerConfig(m=m, nbits=5)).train(x).reconstruction_error(x)
            for m in (1, 2, 4)]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 0.8
    a = BoMQuantizer(32, QuantizerConfig(m=2, nbits=5)).train(x).codebooks_array()
    b = BoMQuantizer(32, QuantizerConfig(m=2, nbits=5)).train(x).codebooks_array()
    assert np.array_equal(a, b)


def test_the_encoding_beam_changes_tokens_not_codebooks_and_travels_in_the_manifest():
    x = data()
    greedy = BoMQuantizer(32, QuantizerConfig(m=4, nbits=5, beam=1)).train(x)
    wide = BoMQuantizer(32, QuantizerConfig(m=4, nbits=5, beam=4)).train(x)
    assert np.array_equal(greedy.codebooks_array(), wide.codebooks_array())
    assert (greedy.tokens(x) != wide.tokens(x)).any()
    assert wide.reconstruction_error(x) < greedy.reconstruction_error(x)
    # a checkpoint's manifest: asdict of the config, read back with its beam
    doc = {"m": 4, "nbits": 5, "train_size": 65_536, "seed": 0, "beam": 1}
    again = BoMQuantizer.from_codebooks(wide.codebooks_array(), QuantizerConfig.of_manifest(doc))
    assert (again.tokens(x) == greedy.tokens(x)).all()
    # written before the beam existed: encodes as it did then
    legacy = {k: v for k, v in doc.items() if k != "beam"}
    assert QuantizerConfig.of_manifest(legacy).beam == LEGACY_BEAM == 4
    old = BoMQuantizer.from_codebooks(wide.codebooks_array(), QuantizerConfig.of_manifest(legacy))
    assert (old.tokens(x) == wide.tokens(x)).all()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2 ** 31 - 1), st.integers(1, 6), st.integers(2, 6), st.sampled_from([8, 24, 64]))
def test_greedy_tokens_are_faiss_beam_1_tokens(seed, m, nbits, d):
    """At beam 1 the tokens come from matrix products instead of faiss's beam search: the
    same codes, for any codebooks and inputs (ties to float rounding aside, which random
    data does not meet)."""
    rng = np.random.default_rng(seed)
    codebooks = rng.standard_normal((m, 1 << nbits, d)).astype(np.float32) / np.arange(1, m + 1)[:, None, None]
    q = BoMQuantizer.from_codebooks(codebooks, QuantizerConfig(m=m, nbits=nbits, beam=1))
    x = rng.standard_normal((200, d)).astype(np.float32)
    q.rq.max_beam_size = 1
    want = unpack_codes(q.rq.compute_codes(x), m, nbits)
    assert (q.codes(x) == want).all()
    # a trained quantizer too, after training replaced its codebooks
    t = BoMQuantizer(d, QuantizerConfig(m=m, nbits=min(nbits, 4), beam=1)).train(x)
    assert (t.codes(x) == unpack_codes(t.rq.compute_codes(x), m, min(nbits, 4))).all()


@settings(max_examples=10, deadline=None)
@given(n=st.integers(4, 40), extra=st.integers(0, 30))
def test_fewer_embeddings_than_dimensions_still_train_a_quantizer(n, extra):
    """A small data set with a wide collaborative block: as many or fewer points than
    dimensions (faiss's progressive-dimension training would need a PCA of more)."""
    x = np.random.default_rng(n).standard_normal((n, n + extra)).astype(np.float32)
    q = BoMQuantizer(x.shape[1], QuantizerConfig(m=2, nbits=1)).train(x)
    assert q.trained and q.tokens(x).shape == (n, 2)
