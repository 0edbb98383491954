"""Greedy and beam search of sequence-to-sequence models (`decoding.generate`): against
Python/NumPy searches, exhaustive search, and in graphs."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf
from backend_utils import as_np, call_traced
from reference import log_softmax

from keras_attn import decoding
from keras_attn.decoding.samplers import Beam, TopP
from keras_attn.models import transformer_seq2seq

BOS, EOS = 2, 3


# ---- a toy model keeping the decoding contract, with NumPy-known probabilities --------------


class MarkovEncoder(keras.layers.Layer):
    def call(self, source_ids):
        return keras.ops.cast(source_ids, "float32")  # (B, S)

    def compute_output_shape(self, source_ids_shape):
        return source_ids_shape


class MarkovDecoder(keras.layers.Layer):
    """Second-order Markov chain: logits = table[t, y_{t-1}, y_t] + bias[source_ids[:, 0]].

    The state carries the token before the previous one, so a beam search that reorders its
    state wrongly gets the wrong probabilities. The attention (B, S) depends on the previous
    token and hides source padding.
    """

    def __init__(self, table, bias, **kwargs):
        super().__init__(**kwargs)
        self.table = np.asarray(table, "float32")  # (L, V, V, V)
        self.bias = np.asarray(bias, "float32")  # (source vocab, V)
        self.vocab = self.table.shape[-1]

    def _logits(self, index, prevprev, prev, first):
        v = self.vocab
        flat = keras.ops.reshape(self.table, (-1, v))  # (L * V * V, V)
        rows = (index * v + prevprev) * v + prev
        return keras.ops.take(flat, rows, axis=0) + keras.ops.take(self.bias, first, axis=0)

    def call(self, target_ids, encoder_outputs):
        target_ids = keras.ops.cast(target_ids, "int32")
        first = keras.ops.cast(encoder_outputs[:, 0], "int32")[:, None]  # (B, 1)
        prevprev = keras.ops.pad(target_ids[:, :-1], ((0, 0), (1, 0)))  # (B, T)
        index = keras.ops.arange(keras.ops.shape(target_ids)[1])[None, :]  # (1, T)
        return self._logits(index, prevprev, target_ids, first)  # (B, T, V)

    def compute_output_spec(self, target_ids, encoder_outputs):
        return keras.KerasTensor(tuple(target_ids.shape) + (self.vocab,), "float32")

    def init_decode_state(self, encoder_outputs, source_ids, max_length):
        source_ids = keras.ops.cast(source_ids, "int32")
        return {"source": source_ids, "prevprev": keras.ops.zeros_like(source_ids[:, 0])}

    def decode_step(self, token_ids, index, state):
        source = state["source"]
        logits = self._logits(index, state["prevprev"], token_ids, source[:, 0])
        positions = keras.ops.arange(keras.ops.shape(source)[1])[None, :]  # (1, S)
        weights = keras.ops.cast(1 + (positions + token_ids[:, None]) % 3, "float32")
        weights = weights * keras.ops.cast(keras.ops.not_equal(source, 0), "float32")
        attention = weights / keras.ops.sum(weights, axis=-1, keepdims=True)  # (B, S)
        return logits, {"source": source, "prevprev": token_ids}, attention


def markov_model(vocab=7, max_length=6, source_vocab=5, scale=2.0, seed=0, table=None):
    rng = np.random.default_rng(seed)
    if table is None:
        table = scale * rng.standard_normal((max_length, vocab, vocab, vocab))
        table[..., 0] -= 10.0  # like a trained model, rarely predict padding
    bias = scale * rng.standard_normal((source_vocab, vocab))
    source = keras.Input((None,), dtype="int32", name="source_ids")
    target = keras.Input((None,), dtype="int32", name="target_in_ids")
    decoder = MarkovDecoder(table, bias, name="decoder")
    logits = decoder(target, MarkovEncoder(name="encoder")(source))
    return keras.Model([source, target], logits), decoder


def allowed(vocab):
    """Every token the searches may emit: not padding (0), not <bos>."""
    return [v for v in range(vocab) if v not in (0, BOS)]


def banned(logits):
    """Logits with padding and <bos> ruled out, as the searches rule them out."""
    logits = np.array(logits, "float64")
    logits[..., [0, BOS]] = -np.inf
    return logits


def np_markov_logits(decoder, t, prevprev, prev, first):
    return decoder.table[t, prevprev, prev].astype("float64") + decoder.bias[first]


def np_beam_search(decoder, source, max_length, beam_size, alpha):
    """Textbook beam search run to `max_length`: finished hypotheses stay with their score."""
    results = []
    for first in source[:, 0]:
        beams = [(0.0, [], False, 0)]  # (log P, tokens, finished, length)
        for t in range(max_length):
            candidates = []
            for logp, tokens, finished, length in beams:
                if finished:
                    candidates.append((logp, tokens + [0], True, length))
                    continue
                prevprev, prev = ([0, BOS] + tokens)[-2:]
                step = log_softmax(np_markov_logits(decoder, t, prevprev, prev, first))
                for v in allowed(decoder.vocab):
                    candidates.append((logp + step[v], tokens + [v], v == EOS, t + 1))
            score = [c[0] / ((5 + c[3]) / 6) ** alpha for c in candidates]
            order = sorted(range(len(candidates)), key=lambda i: -score[i])  # stable
            beams = [candidates[i] for i in order[:beam_size]]
        results.append(beams[0][1])
    return np.array(results, "int32")


def exhaustive_best(decoder, first, max_length, alpha):
    """The complete hypothesis (ends in <eos>, or reaches max_length) of best score."""
    best, best_score = None, -np.inf
    for length in range(1, max_length + 1):
        for tokens in itertools.product(allowed(decoder.vocab), repeat=length):
            if EOS in tokens[:-1] or (tokens[-1] != EOS and length < max_length):
                continue
            logp, prevprev, prev = 0.0, 0, BOS
            for t, v in enumerate(tokens):
                logp += log_softmax(np_markov_logits(decoder, t, prevprev, prev, first))[v]
                prevprev, prev = prev, v
            score = logp / ((5 + length) / 6) ** alpha
            if score > best_score:
                best, best_score = list(tokens) + [0] * (max_length - length), score
    return np.array(best, "int32")


SOURCE = np.array([[1, 2, 0, 0], [3, 1, 4, 0], [4, 4, 4, 4], [2, 0, 0, 0]], "int32")


# ---- greedy ---------------------------------------------------------------------------------


def test_greedy_matches_numpy_on_the_markov_model():
    model, decoder = markov_model()
    tokens, attention = decoding.generate(model, SOURCE, 6, return_attention_scores=True)
    tokens, attention = as_np(tokens), as_np(attention)
    assert tokens.dtype == np.int32 and tokens.shape == (4, 6) and attention.shape == (4, 6, 4)
    for b, first in enumerate(SOURCE[:, 0]):
        prevprev, prev, done = 0, BOS, False
        for t in range(6):
            if done:
                assert tokens[b, t] == 0 and np.all(attention[b, t] == 0)
                continue
            expected = int(np.argmax(banned(np_markov_logits(decoder, t, prevprev, prev,
                                                             first))))
            assert tokens[b, t] == expected
            weights = (1 + (np.arange(4) + prev) % 3) * (SOURCE[b] != 0)
            np.testing.assert_allclose(attention[b, t], weights / weights.sum(), atol=1e-6)
            prevprev, prev, done = prev, expected, expected == EOS
    assert np.any(tokens == EOS) and np.any(tokens[:, -1] != 0)  # both ways of ending occur


@pytest.mark.tf_only
def test_search_stops_once_every_sequence_ended():
    """The loop must not run another step after all sequences emitted <eos>."""
    table = np.zeros((8, 7, 7, 7))
    table[0, :, :, 5] = 50.0  # token 5 first,
    table[1, :, :, EOS] = 50.0  # then <eos>, whatever the history

    class CheckedDecoder(MarkovDecoder):
        def decode_step(self, token_ids, index, state):
            with tf.control_dependencies([tf.debugging.assert_less(index, 2)]):
                return super().decode_step(tf.identity(token_ids), index, state)

    model, decoder = markov_model(max_length=8, table=table, scale=0.1)
    checked = CheckedDecoder(decoder.table, decoder.bias, name="decoder")
    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    model = keras.Model([source, target], checked(target, MarkovEncoder(name="encoder")(source)))
    tokens = as_np(decoding.generate(model, SOURCE, 8))
    np.testing.assert_array_equal(tokens[:, :2], [[5, EOS]] * len(SOURCE))
    np.testing.assert_array_equal(tokens[:, 2:], 0)
    beams = as_np(decoding.generate(model, SOURCE, 8, sampler=Beam(3, 0.0)))
    np.testing.assert_array_equal(beams[:, 2:], 0)


# ---- beam search ----------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("beam_size", [2, 3])
def test_beam_search_matches_numpy_reference(beam_size, alpha):
    model, decoder = markov_model()
    tokens = as_np(decoding.generate(model, SOURCE, 6, sampler=Beam(beam_size, alpha)))
    np.testing.assert_array_equal(tokens, np_beam_search(decoder, SOURCE, 6, beam_size, alpha))


def test_beam_state_follows_its_parent():
    """A garden path: the best hypothesis switches beams after step 0, and its next token
    depends on the state (the token before the previous one) it inherited."""
    table = np.full((5, 7, 7, 7), -20.0)
    table[0, 0, BOS, [4, 5]] = np.log([0.6, 0.4])  # beam 0: 4, beam 1: 5
    table[1, BOS, 4, :] = np.log(1 / 7)  # after 4 anything; after 5 surely 6,
    table[1, BOS, 5, 6] = 0.0  # so 5 6 overtakes and moves to beam 0
    table[2, 5, 6, EOS] = 0.0  # 5 6 <eos>, but with a wrong state (4 before 6): 1
    table[2, 4, :, 1] = 0.0
    table[3:, :, :, EOS] = 0.0
    model, decoder = markov_model(table=table, scale=0.0, max_length=5)
    tokens = as_np(decoding.generate(model, SOURCE, 5, sampler=Beam(2, 0.0)))
    np.testing.assert_array_equal(tokens, [[5, 6, EOS, 0, 0]] * len(SOURCE))
    np.testing.assert_array_equal(tokens, np_beam_search(decoder, SOURCE, 5, 2, 0.0))


def test_live_hypothesis_overtakes_a_finished_one():
    """Early stopping must not return a finished hypothesis that a longer one later beats."""
    table = np.full((6, 7, 7, 7), -20.0)
    table[0, 0, BOS, [EOS, 4]] = np.log([0.55, 0.45])  # <eos> first is likelier ...
    table[1:4, :, :, 5] = 0.0  # ... but 4 continues surely: 4 5 5 5 <eos>
    table[4, :, :, EOS] = 0.0
    model, decoder = markov_model(table=table, scale=0.0)
    for alpha, expected in ((0.0, [EOS, 0, 0, 0, 0, 0]), (2.0, [4, 5, 5, 5, EOS, 0])):
        tokens = as_np(decoding.generate(model, SOURCE, 6, sampler=Beam(2, alpha)))
        np.testing.assert_array_equal(tokens, [expected] * len(SOURCE))
        np.testing.assert_array_equal(tokens, np_beam_search(decoder, SOURCE, 6, 2, alpha))


def test_length_penalty_changes_the_winner():
    model, _ = markov_model()
    results = {alpha: as_np(decoding.generate(model, SOURCE, 6, sampler=Beam(3, alpha)))
               for alpha in (0.0, 3.0)}
    lengths = {alpha: (r != 0).sum() for alpha, r in results.items()}
    assert lengths[3.0] > lengths[0.0]  # a larger alpha favours longer outputs


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_wide_beam_is_exhaustive_search(alpha):
    model, decoder = markov_model(vocab=5, max_length=3, scale=1.5, seed=3)
    tokens = as_np(decoding.generate(model, SOURCE, 3, sampler=Beam(160, alpha)))
    for b, first in enumerate(SOURCE[:, 0]):
        np.testing.assert_array_equal(tokens[b], exhaustive_best(decoder, first, 3, alpha))


def test_beam_size_one_equals_greedy_on_markov_model():
    model, _ = markov_model()
    greedy, g_att = decoding.generate(model, SOURCE, 6, return_attention_scores=True)
    beam, b_att = decoding.generate(model, SOURCE, 6, sampler=Beam(1),
                                    return_attention_scores=True)
    np.testing.assert_array_equal(as_np(beam), as_np(greedy))
    np.testing.assert_allclose(as_np(b_att), as_np(g_att), atol=1e-6)


@pytest.mark.tf_only
def test_xla_compiled_search_gives_the_same_results():
    model, _ = markov_model()
    for sampler in ("greedy", Beam(3)):
        plain = decoding.generate(model, SOURCE, 6, sampler=sampler,
                                  return_attention_scores=True)
        xla = decoding.generate(model, SOURCE, 6, sampler=sampler, return_attention_scores=True,
                                jit_compile=True)
        np.testing.assert_array_equal(as_np(xla[0]), as_np(plain[0]))
        np.testing.assert_allclose(as_np(xla[1]), as_np(plain[1]), atol=1e-6)


def test_beam_attention_is_that_of_the_returned_hypothesis():
    model, _ = markov_model()
    tokens, attention = decoding.generate(model, SOURCE, 6, sampler=Beam(3),
                                          return_attention_scores=True)
    tokens, attention = as_np(tokens), as_np(attention)
    for b in range(len(SOURCE)):
        prev = np.concatenate([[BOS], tokens[b, :-1]])
        ended = np.concatenate([[False], np.cumsum(tokens[b] == EOS)[:-1] > 0])
        weights = (1 + (np.arange(4)[None] + prev[:, None]) % 3) * (SOURCE[b] != 0)
        expected = np.where(ended[:, None], 0.0, weights / weights.sum(-1, keepdims=True))
        np.testing.assert_allclose(attention[b], expected, atol=1e-6)


# ---- the Transformer --------------------------------------------------------------------------


def varied_transformer():
    """A small pre-LN Transformer with random weights whose greedy outputs vary.

    Random Transformers tend to predict one token everywhere; tying the output projection to
    a permutation of the target embedding makes the next token depend on the current one.
    """
    model = transformer_seq2seq(15, 17, num_layers=2, hidden_dim=16, num_heads=4,
                                intermediate_dim=32, dropout=0.0, normalize_first=True)
    rng = np.random.default_rng(0)
    for var in model.weights:
        var.assign(0.2 * rng.standard_normal(var.shape) + ("gamma" in var.path))
    decoder = model.get_layer("decoder")
    table = as_np(decoder.token_embedding.embeddings)  # (V, d)
    decoder.output_dense.kernel.assign(2.0 * table[rng.permutation(len(table))].T)
    decoder.output_dense.bias.assign(np.zeros(len(table), "float32"))
    return model


T_SOURCE = np.array([[4, 5, 6, 7, 0, 0], [8, 9, 10, 11, 12, 13], [14, 4, 0, 0, 0, 0]], "int32")


def python_greedy(model, source, max_length):
    """Explicit argmax loop over the full forward pass, no cache, no early stop."""
    prefix = np.full((len(source), 1), BOS, "int32")
    for _ in range(max_length):
        logits = as_np(model([source, prefix]))[:, -1]  # (B, V)
        prefix = np.concatenate([prefix, banned(logits).argmax(-1).astype("int32")[:, None]], 1)
    return prefix[:, 1:]


def test_transformer_greedy_equals_python_argmax_loop_and_beam_size_one():
    model = varied_transformer()
    reference = python_greedy(model, T_SOURCE, 7)
    assert len(np.unique(reference)) > 4  # a real test: the outputs vary
    eos = int(reference[1, 2])  # a token the model does emit, so a row stops early
    ended = np.cumsum(np.cumsum(reference == eos, 1), 1) > 1  # (B, T): after the first eos
    assert ended.any() and not ended.all(1).any()
    tokens, attention = decoding.generate(model, T_SOURCE, 7, stop_token_ids=eos,
                                          return_attention_scores=True)
    tokens, attention = as_np(tokens), as_np(attention)
    np.testing.assert_array_equal(tokens, np.where(ended, 0, reference))
    # The attention is the full pass' cross-attention of every layer and head, zero after eos.
    prefix = np.concatenate([np.full((3, 1), BOS, "int32"), reference[:, :-1]], 1)
    decoder, encoder = model.get_layer("decoder"), model.get_layer("encoder")
    _, full = decoder(prefix, encoder(T_SOURCE), encoder_padding_mask=T_SOURCE != 0,
                      return_attention_scores=True)  # (B, L, H, T, S)
    expected = np.where(ended[:, :, None, None, None], 0.0, np.moveaxis(as_np(full), 3, 1))
    assert attention.shape == (3, 7, 2, 4, 6)
    np.testing.assert_allclose(attention, expected, atol=1e-5)
    # Beam size 1 is greedy search.
    beam, beam_attention = decoding.generate(model, T_SOURCE, 7, sampler=Beam(1),
                                             stop_token_ids=eos, return_attention_scores=True)
    np.testing.assert_array_equal(as_np(beam), tokens)
    np.testing.assert_allclose(as_np(beam_attention), attention, atol=1e-6)


def python_beam_search(model, source, max_length, beam_size, alpha, eos):
    """Textbook beam search, one full forward pass (no cache) per step, run to max_length."""
    results = []
    for b in range(len(source)):
        beams = [(0.0, [], False, 0)]  # (log P, tokens, finished, length)
        for t in range(max_length):
            alive = [beam for beam in beams if not beam[2]]
            if alive:
                prefixes = np.array([[BOS] + beam[1] for beam in alive], "int32")  # (A, t+1)
                sources = np.repeat(source[b:b + 1], len(alive), axis=0)
                logits = as_np(model([sources, prefixes]))[:, -1].astype("float64")
                step = np.stack([log_softmax(row) for row in logits])  # (A, V)
            candidates, row = [], 0
            for logp, tokens, finished, length in beams:
                if finished:
                    candidates.append((logp, tokens + [0], True, length))
                    continue
                for v in allowed(step.shape[1]):
                    candidates.append((logp + step[row, v], tokens + [v], v == eos, t + 1))
                row += 1
            score = [c[0] / ((5 + c[3]) / 6) ** alpha for c in candidates]
            order = sorted(range(len(candidates)), key=lambda i: -score[i])  # stable
            beams = [candidates[i] for i in order[:beam_size]]
        results.append(beams[0][1])
    return np.array(results, "int32")


def test_transformer_beam_search_equals_uncached_python_beam_search():
    model = varied_transformer()
    eos = int(python_greedy(model, T_SOURCE, 3)[1, 2])
    tokens = as_np(decoding.generate(model, T_SOURCE, 7, sampler=Beam(3), stop_token_ids=eos))
    np.testing.assert_array_equal(tokens, python_beam_search(model, T_SOURCE, 7, 3, 0.6, eos))
    assert np.any(tokens == eos)


@pytest.mark.tf_only
def test_beam_search_in_tf_function_with_unknown_batch():
    """Usable inside a SavedModel-style signature: batch and length None, traced once."""
    model = varied_transformer()

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def translate(source_ids):
        return decoding.generate(model, source_ids, 7, sampler=Beam(3))

    batch = as_np(translate(T_SOURCE))
    for b in range(len(T_SOURCE)):  # each sequence alone gives the same as in the batch
        alone = T_SOURCE[b:b + 1, : (T_SOURCE[b] != 0).sum()]  # and without its padding
        np.testing.assert_array_equal(as_np(translate(alone)), batch[b:b + 1])
    assert translate.experimental_get_tracing_count() == 1
    assert len(np.unique(batch)) > 3 and np.all(np.any(batch == EOS, axis=1))


# ---- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_length": 0}, "max_length"),
        ({"max_length": 3, "stop_token_ids": -1}, "stop_token_ids"),
        ({"max_length": 3, "sampler": "beam_search"}, "sampler"),
        ({"max_length": 2.5, "sampler": "beam"}, "max_length"),
        ({"max_length": 3, "bos_id": -1}, "bos_id"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    model, _ = markov_model()
    with pytest.raises(ValueError, match=f"Received: {name}="):
        decoding.generate(model, SOURCE, **kwargs)


def test_model_without_the_contract_is_refused():
    inputs = keras.Input((None,), dtype="int32")
    plain = keras.Model(inputs, keras.layers.Embedding(5, 3, name="decoder")(inputs))
    with pytest.raises(ValueError, match="init_decode_state"):
        decoding.generate(plain, SOURCE, 3)


# ---- hostile inputs --------------------------------------------------------------------------


def test_sampling_takes_tensor_settings_and_checks_their_values():
    """Sampling refused every tensor setting; now a sampler takes them (as a SavedModel input
    would be) and checks their values: eagerly a ValueError, in a compiled function a failed
    call."""
    model, _ = markov_model()
    python = {"p": 0.9, "k": 4, "temperature": 0.8, "seed": 5}
    expected = as_np(decoding.generate(model, SOURCE, 6, sampler=TopP(**python)))
    tensors = {name: keras.ops.convert_to_tensor(value) for name, value in python.items()}
    np.testing.assert_array_equal(
        as_np(decoding.generate(model, SOURCE, 6, sampler=TopP(**tensors))), expected)
    traced = call_traced(lambda p, k, t, s: decoding.generate(
        model, SOURCE, 6, sampler=TopP(p, k, t, s)), *python.values())
    np.testing.assert_array_equal(as_np(traced), expected)
    for name, value in (("temperature", float("nan")), ("temperature", -1.0),
                        ("p", float("nan")), ("k", -3), ("seed", -2)):
        tensor = keras.ops.convert_to_tensor(value)
        with pytest.raises(ValueError, match=f"argument `{name}`"):
            TopP(**{"p": 0.5, name: tensor})
        with pytest.raises(Exception, match=f"argument `{name}`"):
            call_traced(lambda v, name=name: decoding.generate(
                model, SOURCE, 6, sampler=TopP(**{"p": 0.5, name: v})), tensor)


@pytest.mark.parametrize("sampler", ["greedy", Beam(3), TopP(0.9, seed=1)])
def test_end_tokens_the_model_cannot_emit_are_refused_and_none_runs_to_max_length(sampler):
    """An end id past the vocabulary (7 tokens here) ran every sequence to max_length; say so
    with stop_token_ids=None instead."""
    model, _ = markov_model()
    for eos_id in (7, 0, BOS):
        with pytest.raises(ValueError, match="Received: stop_token_ids="):
            decoding.generate(model, SOURCE, 6, sampler=sampler, stop_token_ids=eos_id)
    tokens = as_np(decoding.generate(model, SOURCE, 6, sampler=sampler, stop_token_ids=None))
    assert tokens.shape == (4, 6) and np.all(tokens > 0) and np.any(tokens == EOS)


def test_source_ids_past_the_vocabulary_and_int32_lengths_are_refused():
    model = varied_transformer()  # source vocabulary: 15
    with pytest.raises(ValueError, match="argument `inputs`"):
        decoding.generate(model, [[4, 15, 0]], 5)
    with pytest.raises(ValueError, match="argument `inputs`"):
        decoding.generate(model, [[4, -1, 0]], 5, sampler="beam")
    with pytest.raises(Exception, match="inputs"):
        call_traced(lambda s: decoding.generate(model, s, 5), np.array([[4, 15, 0]], "int32"))
    with pytest.raises(ValueError, match="argument `max_length`"):
        decoding.generate(model, T_SOURCE, 2**31)


def test_mask_predict_refuses_source_ids_past_the_vocabulary():
    from keras_attn.models import nat_seq2seq

    model = nat_seq2seq(12, 12, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=16,
                        max_target_length=5)
    tokens, _ = decoding.mask_predict(model, [[4, 11, 0]], iterations=2)
    assert as_np(tokens).shape == (1, 5)
    for source in ([[4, 12, 0]], [[4, -3, 0]]):
        with pytest.raises(ValueError, match="argument `source_ids`"):
            decoding.mask_predict(model, source, iterations=2)
    with pytest.raises(ValueError, match="source_ids"):
        decoding.mask_predict(model, [4, 5], iterations=2)
