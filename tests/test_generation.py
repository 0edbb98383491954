"""Generation with causal language models: against a Python loop over full passes, the cache
against the full pass with grouped heads and rotary positions, and sampling against the filtered
softmax it claims to draw from."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import to_np
from layer_test_utils import run_layer_test

import keras_attn as ka
from keras_attn import decoding
from keras_attn.tokens import BOS_ID, EOS_ID

PROMPTS = np.array([[BOS_ID, 5, 6, 7], [BOS_ID, 9, 0, 0], [BOS_ID, 0, 0, 0]], "int32")


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    return ka.models.causal_lm(24, num_layers=2, embed_dim=32, num_heads=4, ffn_dim=48,
                               num_key_value_heads=2)


def python_greedy(model, prompts, max_length):
    """Greedy continuation by full forward passes over the growing sequence."""
    rows = []
    for prompt in prompts:
        seq = [int(t) for t in prompt if t]
        while len(seq) < max_length:
            logits = to_np(model(np.array([seq], "int32")))[0, -1].astype("float64")
            logits[[0, BOS_ID]] = -np.inf  # padding and <bos> are never generated
            seq.append(int(np.argmax(logits)))
            if seq[-1] == EOS_ID:
                break
        rows.append(seq + [0] * (max_length - len(seq)))
    return np.array(rows)


def test_greedy_generation_equals_a_python_loop_over_full_passes(model):
    tokens = to_np(decoding.generate(model, PROMPTS, 10)).astype(int)
    np.testing.assert_array_equal(tokens, python_greedy(model, PROMPTS, 10))
    np.testing.assert_array_equal(tokens[:, :4] * (PROMPTS > 0), PROMPTS)  # prompts kept


def test_beam_of_one_top_k_of_one_and_cold_sampling_are_greedy(model):
    greedy = to_np(decoding.generate(model, PROMPTS, 10))
    for kwargs in ({"strategy": "beam", "beam_size": 1},
                   {"strategy": "sample", "top_k": 1, "seed": 4},
                   {"strategy": "sample", "temperature": 1e-6, "seed": 4},
                   {"strategy": "sample", "temperature": 0.0, "seed": 4},
                   {"strategy": "sample", "top_p": 1e-6, "seed": 4}):
        np.testing.assert_array_equal(to_np(decoding.generate(model, PROMPTS, 10, **kwargs)),
                                      greedy, err_msg=str(kwargs))


def test_sampling_is_reproducible_by_seed_and_respects_max_new_tokens(model):
    kwargs = {"strategy": "sample", "temperature": 1.5, "max_new_tokens": 3}
    first = to_np(decoding.generate(model, PROMPTS, 12, seed=11, **kwargs))
    np.testing.assert_array_equal(to_np(decoding.generate(model, PROMPTS, 12, seed=11,
                                                          **kwargs)), first)
    assert not np.array_equal(to_np(decoding.generate(model, PROMPTS, 12, seed=12, **kwargs)),
                              first)
    lengths = (PROMPTS > 0).sum(1)
    generated = (first > 0).sum(1) - lengths
    assert np.all(generated <= 3) and np.all(first[:, lengths.max() + 3:] == 0)


@pytest.mark.parametrize("position_encoding", ["rope", "alibi", "learned"])
def test_cached_steps_equal_the_full_pass_with_groups(position_encoding):
    model = ka.models.causal_lm(30, num_layers=2, embed_dim=32, num_heads=4, ffn_dim=64,
                                num_key_value_heads=2, position_encoding=position_encoding,
                                max_length=12)
    ids = np.random.default_rng(0).integers(1, 30, (2, 9)).astype("int32")
    full = to_np(model(ids))
    decoder = model.get_layer("decoder")
    state = decoder.init_decode_state(2, 9)
    prefix, state, _ = decoder.decode_step(ids[:, :4], 0, state)  # a prompt at once
    steps = [to_np(prefix)]
    for i in range(4, 9):
        logits, state, attention = decoder.decode_step(ids[:, i], i, state)
        steps.append(to_np(logits)[:, None])
    assert attention.shape == (2, 2, 4, 9)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


class FixedLogits(keras.layers.Layer):
    """A 'decoder' whose next-token logits are always the same: the sampler's distribution
    is then known exactly."""

    def __init__(self, logits, **kwargs):
        super().__init__(**kwargs)
        self.logits = np.asarray(logits, "float32")

    def call(self, ids):
        return keras.ops.zeros(keras.ops.shape(ids) + (len(self.logits),)) + self.logits

    def init_decode_state(self, batch_size, max_length):
        return {"step": keras.ops.zeros((batch_size,), "int32")}

    def decode_step(self, token_ids, index, state):
        shape = keras.ops.shape(token_ids)
        logits = keras.ops.zeros(tuple(shape) + (len(self.logits),)) + self.logits
        return logits, state, keras.ops.zeros((shape[0], 1))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 4, 1.0),
                                                     (1.3, 0, 0.8), (0.9, 5, 0.7)])
def test_sampled_frequencies_match_the_filtered_softmax(temperature, top_k, top_p):
    """4000 draws in one batch against `reference.sampling_distribution`: a chi-square test
    at the 1e-4 level (it fails when the filter or the draw is wrong, e.g. top-p applied
    before temperature)."""
    logits = np.array([-9.0, 1.2, -9.0, 0.3, 2.0, 1.9, 0.5, -0.4, 1.0, -1.5], "float32")
    logits_banned = logits.copy()  # padding (0) and <bos> (2) are never drawn
    decoder = FixedLogits(logits, name="decoder")
    inputs = keras.Input((None,), dtype="int32")
    model = keras.Model(inputs, decoder(inputs))
    draws = 4000
    prompts = np.full((draws, 1), 7, "int32")
    tokens = to_np(decoding.generate(model, prompts, 2, strategy="sample", seed=3,
                                     temperature=temperature, top_k=top_k, top_p=top_p))
    counts = np.bincount(tokens[:, 1].astype(int), minlength=len(logits))
    logits_banned[[0, 2]] = -np.inf
    want = ref.sampling_distribution(logits_banned, temperature, top_k or None,
                                     top_p if top_p < 1 else None)
    assert np.all(counts[want == 0] == 0), (counts, want)
    kept = want > 0
    chi2 = float(np.sum((counts[kept] - draws * want[kept]) ** 2 / (draws * want[kept])))
    from scipy.stats import chi2 as chi2_distribution

    assert chi2 < chi2_distribution.ppf(1 - 1e-4, kept.sum() - 1), (chi2, counts, want)


def test_decoder_only_layer_contract(tmp_path):
    run_layer_test(ka.TransformerDecoderOnly,
                   {"vocab_size": 20, "num_layers": 1, "embed_dim": 16, "num_heads": 2,
                    "ffn_dim": 32, "num_key_value_heads": 1, "position_encoding": "rope"},
                   {"inputs": np.random.default_rng(1).integers(0, 20, (3, 6)).astype("int32")},
                   (3, 6, 20), tmp_path)


def test_a_reloaded_causal_lm_generates_the_same(model, tmp_path):
    path = str(tmp_path / "lm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(to_np(decoding.generate(loaded, PROMPTS, 10)),
                                  to_np(decoding.generate(model, PROMPTS, 10)))


@pytest.mark.parametrize("kwargs,arg", [
    ({"max_length": 4}, "max_length"),
    ({"max_length": 10, "strategy": "nucleus"}, "strategy"),
    ({"max_length": 10, "top_p": 0.0, "strategy": "sample"}, "top_p"),
    ({"max_length": 10, "top_k": -1, "strategy": "sample"}, "top_k"),
    ({"max_length": 10, "temperature": float("nan"), "strategy": "sample"}, "temperature"),
    ({"max_length": 10, "max_new_tokens": 0}, "max_new_tokens"),
    ({"max_length": 10, "strategy": "beam", "max_new_tokens": 3}, "max_new_tokens"),
])
def test_bad_arguments_name_the_argument(model, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        decoding.generate(model, PROMPTS, **kwargs)
