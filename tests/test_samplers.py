"""Samplers as objects: each against a NumPy reference of its distribution (the filtered logits
exactly, and seeded draws by their frequencies), min-p and the repetition penalty against
`transformers`' processors, Beam(1) = Greedy = TopK(1) = cold Random, seeds, serialization,
bad arguments, keras_attn 0.2's spellings, and cached decoding equal to full passes with every
sampler."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import as_np, call_traced, randomize

import keras_attn as ka
from keras_attn import decoding
from keras_attn.decoding import loops, samplers
from keras_attn.tokens import BOS_ID, EOS_ID

PROMPTS = np.array([[BOS_ID, 5, 6, 7], [BOS_ID, 9, 0, 0], [BOS_ID, 11, 12, 0]], "int32")
LOGITS = np.array([-9.0, 1.2, -9.0, 0.3, 2.0, 1.9, 0.5, -0.4, 1.0, -1.5], "float32")


def varied(model, seed, scale):
    """Random weights whose outputs vary: the output projection is a permutation of the
    token table (random models tend to predict one token everywhere)."""
    randomize(model, seed, scale)
    weights = {w.path: w for w in model.weights}
    table = as_np(weights["decoder/embedding/token_embedding/embeddings"])  # (V, d)
    permutation = np.random.default_rng(seed).permutation(len(table))
    weights["decoder/head/output_dense/kernel"].assign(2.0 * table[permutation].T)
    weights["decoder/head/output_dense/bias"].assign(np.zeros(len(table), "float32"))
    return model


@pytest.fixture(scope="module")
def lm():
    return varied(ka.models.causal_lm(24, num_layers=1, hidden_dim=16, num_heads=2,
                                      intermediate_dim=32, num_key_value_heads=1), 3, 0.4)


@pytest.fixture(scope="module")
def seq2seq():
    return varied(ka.models.transformer_seq2seq(15, 17, num_layers=1, hidden_dim=16,
                                                num_heads=2, intermediate_dim=32,
                                                dropout=0.0), 3, 0.2)


SOURCE = np.array([[4, 5, 6, 7, 0], [8, 9, 10, 0, 0]], "int32")


def generate(model, inputs, max_length, **kwargs):
    return as_np(decoding.generate(model, inputs, max_length, **kwargs))


# ---- the distributions against NumPy ---------------------------------------------------------


def process(sampler, logits, token_ids=None, index=0):
    logits = np.atleast_2d(logits)
    token_ids = np.zeros((len(logits), 1), "int32") if token_ids is None else token_ids
    bound = sampler.bind(sampler.tensors())
    return as_np(bound.process_logits(keras.ops.convert_to_tensor(logits),
                                      keras.ops.convert_to_tensor(token_ids), index))


def softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("sampler, reference", [
    (samplers.Random(0.7), {"temperature": 0.7}),
    (samplers.TopK(4, temperature=1.3), {"temperature": 1.3, "top_k": 4}),
    (samplers.TopP(0.8), {"top_p": 0.8}),
    (samplers.TopP(0.7, k=5, temperature=0.9), {"temperature": 0.9, "top_k": 5, "top_p": 0.7}),
    (samplers.MinP(0.3, temperature=1.2), {"temperature": 1.2, "min_p": 0.3}),
    (samplers.MinP(0.0), {}),
], ids=["random", "top_k", "top_p", "top_p_k", "min_p", "min_p_0"])
def test_filtered_logits_are_the_reference_distribution(sampler, reference):
    got = softmax(process(sampler, LOGITS).astype("float64"))[0]
    want = ref.sampling_distribution(LOGITS, **reference)
    np.testing.assert_array_equal(got > 1e-12, want > 0)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert 1 < (want > 0).sum() or not reference  # a real filter (min_p 0 keeps everything)


def test_min_p_and_the_repetition_penalty_are_transformers():
    """The same logits through `transformers`' `MinPLogitsWarper` and
    `RepetitionPenaltyLogitsProcessor` (Hugging Face's semantics: the prompt counts)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(0)
    logits = (2.0 * rng.standard_normal((3, 12))).astype("float32")
    for min_p in (0.05, 0.3, 0.9):
        warped = transformers.MinPLogitsWarper(min_p)(None, torch.tensor(logits)).numpy()
        ours = process(samplers.MinP(min_p), logits)
        np.testing.assert_array_equal(np.isfinite(warped), ours > -1e8)
        np.testing.assert_allclose(ours[ours > -1e8], warped[np.isfinite(warped)], rtol=1e-6)
    token_ids = np.array([[3, 5, 5, 0, 9], [1, 1, 1, 1, 1], [11, 2, 4, 7, 7]], "int32")
    index = 2  # positions 0..2 count; 0, 9 and 7 come later and must not
    for penalty in (1.3, 0.6):
        wrapped = samplers.RepetitionPenalty(penalty, samplers.Greedy())
        want = transformers.RepetitionPenaltyLogitsProcessor(penalty)(
            torch.tensor(token_ids[:, :index + 1], dtype=torch.long),
            torch.tensor(logits)).numpy()
        np.testing.assert_allclose(process(wrapped, logits, token_ids, index), want, rtol=1e-6)
        np.testing.assert_allclose(
            want, np.stack([ref.repetition_penalized(row, seen[:index + 1], penalty)
                            for row, seen in zip(logits, token_ids)]), rtol=1e-6)
    assert not np.allclose(want, logits)


class FixedLogits(keras.layers.Layer):
    """A 'decoder' whose next-token logits are always `LOGITS`: the distribution a sampler
    draws from is known exactly."""

    def call(self, ids):
        return keras.ops.zeros(keras.ops.shape(ids) + (len(LOGITS),)) + LOGITS

    def init_decode_state(self, batch_size, max_length):
        return {"step": keras.ops.zeros((batch_size,), "int32")}

    def decode_step(self, token_ids, index, state):
        shape = keras.ops.shape(token_ids)
        logits = keras.ops.zeros(tuple(shape) + (len(LOGITS),)) + LOGITS
        return logits, state, keras.ops.zeros((shape[0], 1))


def fixed_logits_model():
    inputs = keras.Input((None,), dtype="int32")
    return keras.Model(inputs, FixedLogits(name="decoder")(inputs))


@pytest.mark.parametrize("sampler, reference, prompt", [
    (samplers.Random(0.8, seed=3), {"temperature": 0.8}, [7]),
    (samplers.TopK(3, seed=4), {"top_k": 3}, [7]),
    (samplers.TopP(0.75, temperature=1.4, seed=5), {"temperature": 1.4, "top_p": 0.75}, [7]),
    (samplers.MinP(0.2, seed=6), {"min_p": 0.2}, [7]),
    (samplers.RepetitionPenalty(2.5, samplers.Random(seed=7)), {}, [4, 3, 9]),
], ids=["random", "top_k", "top_p", "min_p", "repetition_penalty"])
def test_draws_follow_the_reference_distribution(sampler, reference, prompt):
    """4000 draws in one batch: a chi-square test at the 1e-4 level against the NumPy
    distribution (padding and <bos> are never drawn; the penalty applies to the prompt)."""
    from scipy.stats import chi2 as chi2_distribution

    draws = 4000
    prompts = np.tile(np.array([prompt], "int32"), (draws, 1))
    tokens = generate(fixed_logits_model(), prompts, len(prompt) + 1, sampler=sampler)
    counts = np.bincount(tokens[:, -1], minlength=len(LOGITS))
    logits = LOGITS.astype("float64")
    if isinstance(sampler, samplers.RepetitionPenalty):
        logits = ref.repetition_penalized(logits, prompt, 2.5)
    logits[[0, BOS_ID]] = -np.inf
    want = ref.sampling_distribution(logits, **reference)
    assert np.all(counts[want == 0] == 0), (counts, want)
    kept = want > 0
    chi2 = float(np.sum((counts[kept] - draws * want[kept]) ** 2 / (draws * want[kept])))
    assert chi2 < chi2_distribution.ppf(1 - 1e-4, kept.sum() - 1), (chi2, counts, want)


# ---- equalities ------------------------------------------------------------------------------


def test_beam_of_one_top_k_of_one_and_cold_random_are_greedy(lm, seq2seq):
    lm_samplers = (samplers.Beam(1), samplers.TopK(1, seed=4), samplers.Random(0.0, seed=4),
                   samplers.MinP(1.0, seed=4), samplers.RepetitionPenalty(1.0))
    for model, inputs, length, kinds in ((lm, PROMPTS, 10, lm_samplers),
                                         (seq2seq, SOURCE, 7, lm_samplers[:2])):
        greedy = generate(model, inputs, length)
        assert len(np.unique(greedy)) > 4  # a real test: the outputs vary
        for sampler in kinds:
            np.testing.assert_array_equal(generate(model, inputs, length, sampler=sampler),
                                          greedy, err_msg=repr(sampler))


def test_the_beam_loop_with_one_beam_is_the_greedy_loop(lm):
    """`loops.beam_loop` itself at width 1 (`generate` runs `Beam(1)` one token at a
    time)."""
    decoder = lm.get_layer("decoder")
    step = decoder.decode_step
    tokens = keras.ops.convert_to_tensor(np.pad(PROMPTS[:, :1], ((0, 0), (0, 9))))  # <bos>
    lengths = keras.ops.ones((3,), "int32")
    ids = ((EOS_ID,), (0, BOS_ID))
    greedy, greedy_scores, _ = loops.token_loop(
        step, decoder.init_decode_state(3, 10), tokens, lengths, *ids,
        samplers.Greedy().get_next_token, alpha=0.6)
    beam, beam_scores, _ = loops.beam_loop(
        step, decoder.init_decode_state(3, 10), tokens, lengths, *ids, 1, 0.6)
    np.testing.assert_array_equal(as_np(beam), as_np(greedy))
    np.testing.assert_allclose(as_np(beam_scores), as_np(greedy_scores), rtol=1e-5)


class FullPasses(keras.layers.Layer):
    """A causal 'decoder' without a cache: its state is the token buffer, and each step runs
    the whole stack over it (the decoding contract, the reference for the cache)."""

    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner
        self.vocabulary_size = inner.vocabulary_size

    def call(self, ids):
        return self.inner(ids)

    def compute_output_spec(self, ids):
        return self.inner.compute_output_spec(ids)

    def init_decode_state(self, batch_size, max_length):
        return {"tokens": keras.ops.zeros((batch_size, max_length), "int32")}

    def decode_step(self, token_ids, index, state):
        ops = keras.ops
        block = ops.cast(token_ids if len(token_ids.shape) == 2 else token_ids[:, None],
                         "int32")  # (B, T): positions index, index + 1, ...
        width = ops.shape(block)[1]
        positions = ops.arange(ops.shape(state["tokens"])[1], dtype="int32")  # (L,)
        inside = ops.logical_and(positions >= index, positions < index + width)
        written = ops.take(block, ops.clip(positions - index, 0, width - 1), axis=1)  # (B, L)
        tokens = ops.where(inside[None, :], written, state["tokens"])
        logits = self.inner(tokens)  # (B, L, V): causal, the later positions do not count
        logits = ops.take(logits, index + ops.arange(width, dtype="int32"), axis=1)
        return (logits if len(token_ids.shape) == 2 else logits[:, 0]), {"tokens": tokens}, None


@pytest.mark.parametrize("sampler", [
    samplers.Beam(3, 0.0), samplers.TopP(0.85, k=6, temperature=1.2, seed=3),
    samplers.MinP(0.05, seed=4), samplers.RepetitionPenalty(1.6, samplers.Random(seed=5)),
    samplers.RepetitionPenalty(1.4, samplers.Beam(2))], ids=repr)
def test_cached_decoding_equals_full_passes_with_every_sampler(lm, sampler):
    """(Greedy and TopK are the same loop and draw: `test_generation.py` and above.)"""
    inputs = keras.Input((None,), dtype="int32")
    full = keras.Model(inputs, FullPasses(lm.get_layer("decoder"), name="decoder")(inputs))
    cached = generate(lm, PROMPTS, 10, sampler=sampler, stop_token_ids=None)
    assert len(np.unique(cached[:, 4:])) > 2  # a real test: the continuations vary
    np.testing.assert_array_equal(
        generate(full, PROMPTS, 10, sampler=sampler, stop_token_ids=None), cached)


def test_seeds_are_reproducible(lm):
    first = generate(lm, PROMPTS, 12, sampler=samplers.TopP(0.95, temperature=1.5, seed=11))
    again = generate(lm, PROMPTS, 12, sampler=samplers.TopP(0.95, temperature=1.5, seed=11))
    other = generate(lm, PROMPTS, 12, sampler=samplers.TopP(0.95, temperature=1.5, seed=12))
    np.testing.assert_array_equal(again, first)
    assert not np.array_equal(other, first)
    # seed=None: a new seed at each call, from NumPy's global generator.
    unseeded = samplers.Random(1.5)
    np.random.seed(0)
    runs = [generate(lm, PROMPTS, 12, sampler=unseeded) for _ in range(2)]
    np.random.seed(0)
    np.testing.assert_array_equal(generate(lm, PROMPTS, 12, sampler=unseeded), runs[0])
    assert not np.array_equal(runs[0], runs[1])


def test_numbers_as_tensors_give_what_python_numbers_give(lm):
    """A sampler made from tensors inside a traced function (a SavedModel signature): the same
    tokens; a value out of range fails the call with the argument's name."""
    python = generate(lm, PROMPTS, 10, sampler=samplers.TopP(0.9, k=5, temperature=0.7,
                                                              seed=3))
    traced = call_traced(lambda p, k, t, s: decoding.generate(
        lm, PROMPTS, 10, sampler=samplers.TopP(p, k=k, temperature=t, seed=s)),
        np.float32(0.9), np.int32(5), np.float32(0.7), np.int32(3))
    np.testing.assert_array_equal(as_np(traced), python)
    with pytest.raises(Exception, match="argument `min_p`"):
        call_traced(lambda m: decoding.generate(lm, PROMPTS, 10, sampler=samplers.MinP(m)),
                    np.float32(1.5))


# ---- serialization and arguments -------------------------------------------------------------

ALL = [samplers.Greedy(), samplers.Beam(3, 1.0), samplers.Random(0.5, seed=2),
       samplers.TopK(7, temperature=0.9), samplers.TopP(0.8, k=20, seed=1),
       samplers.MinP(0.1, temperature=1.3, seed=9),
       samplers.RepetitionPenalty(1.2, samplers.TopK(3, seed=4))]


@pytest.mark.parametrize("sampler", ALL, ids=repr)
def test_serialization_round_trips(sampler):
    config = samplers.serialize(sampler)
    assert config["registered_name"] == f"keras_attn>{type(sampler).__name__}"
    for restored in (samplers.get(config), samplers.deserialize(config),
                     keras.saving.deserialize_keras_object(config),
                     type(sampler).from_config(sampler.get_config())):
        assert type(restored) is type(sampler) and repr(restored) == repr(sampler)
        assert restored.get_config() == sampler.get_config()


def test_get_takes_names_configs_instances_and_classes():
    for name, cls in samplers.NAMES.items():
        assert type(samplers.get(name)) is cls
    sampler = samplers.TopK(9)
    assert samplers.get(sampler) is sampler
    assert repr(samplers.get(samplers.TopP)) == "TopP(p=0.1, k=None, temperature=1.0, seed=None)"
    assert repr(samplers.get({"class_name": "keras_attn>Beam", "config": {"num_beams": 2}})) \
        == "Beam(num_beams=2, length_penalty=0.6)"


@pytest.mark.parametrize("make, name", [
    (lambda: samplers.TopK(0), "k"), (lambda: samplers.TopK(2.5), "k"),
    (lambda: samplers.TopP(0.0), "p"), (lambda: samplers.TopP(1.5), "p"),
    (lambda: samplers.TopP(0.5, k=-1), "k"), (lambda: samplers.MinP(1.5), "min_p"),
    (lambda: samplers.MinP(float("nan")), "min_p"), (lambda: samplers.Random(-1.0), "temperature"),
    (lambda: samplers.Random(float("inf")), "temperature"),
    (lambda: samplers.Random(seed=-1), "seed"), (lambda: samplers.Random(seed=2**31), "seed"),
    (lambda: samplers.Random(seed=1.5), "seed"), (lambda: samplers.Beam(0), "num_beams"),
    (lambda: samplers.Beam(2.0), "num_beams"), (lambda: samplers.Beam(2, -1.0), "length_penalty"),
    (lambda: samplers.RepetitionPenalty(0.0), "penalty"),
    (lambda: samplers.RepetitionPenalty(1.2, "nucleus"), "sampler"),
    (lambda: samplers.get("nucleus"), "sampler"), (lambda: samplers.get(3), "sampler"),
    (lambda: samplers.get(None), "sampler"),
    (lambda: samplers.Random(keras.ops.convert_to_tensor(-2.0)), "temperature"),
    (lambda: samplers.Random(temperature=None), "temperature"),
    (lambda: samplers.Random(seed="1"), "seed"), (lambda: samplers.TopK(k=None), "k"),
    (lambda: samplers.MinP(min_p="0.1"), "min_p"), (lambda: samplers.TopP(p=[0.5]), "p"),
    (lambda: samplers.TopP(p=b"0.5"), "p"),
])
def test_bad_arguments_name_the_argument(make, name):
    with pytest.raises(ValueError, match=f"argument `{name}`.*Received: {name}="):
        make()


def test_generate_refuses_what_does_not_apply(lm, seq2seq):
    with pytest.raises(ValueError, match="argument `sampler`"):
        decoding.generate(lm, PROMPTS, 10, sampler="nucleus")
    with pytest.raises(ValueError, match="Argument `max_new_tokens`"):
        decoding.generate(lm, PROMPTS, 10, sampler=samplers.Beam(2), max_new_tokens=3)
    for name in ("max_new_tokens", "prompt_lengths"):
        with pytest.raises(ValueError, match=f"Argument `{name}` applies to causal"):
            decoding.generate(seq2seq, SOURCE, 5, **{name: np.array([2, 2])})
    with pytest.raises(ValueError, match="argument `stop_token_ids`"):
        decoding.generate(lm, PROMPTS, 10, stop_token_ids=(3, 24))  # past the vocabulary
    with pytest.raises(TypeError, match="positional"):
        decoding.generate(lm, PROMPTS, 10, *range(16))


def test_special_ids_are_derived_once_from_the_model(lm):
    assert decoding.special_ids(lm) == {"stop_token_ids": (EOS_ID,), "pad_id": 0, "fill_id": 0,
                                        "bos_id": BOS_ID, "suppressed_ids": (0, BOS_ID)}
    unpadded = ka.models.causal_lm(24, num_layers=1, hidden_dim=8, num_heads=2,
                                   intermediate_dim=8, pad_id=None)
    assert decoding.special_ids(unpadded, stop_token_ids=(5, 7)) == {
        "stop_token_ids": (5, 7), "pad_id": None, "fill_id": 5, "bos_id": BOS_ID,
        "suppressed_ids": ()}
    assert decoding.special_ids(None, stop_token_ids=None)["fill_id"] == 0
    with pytest.raises(ValueError, match="argument `suppressed_ids`"):
        decoding.special_ids(lm, suppressed_ids=(0, 24))
    with pytest.raises(ValueError, match="argument `stop_token_ids`"):
        decoding.special_ids(lm, stop_token_ids=0)  # padding is never generated


# ---- keras_attn 0.2's spellings (TensorFlow only: the mapping is Python, and what it maps onto
# is tested on every backend above) -------------------------------------------------------------

OLD = "keras_attn 0.3 names"


@pytest.mark.tf_only
def test_old_generate_spellings_warn_and_give_the_same_tokens(lm):
    cases = [
        ({"strategy": "sample", "temperature": 0.8, "top_k": 5, "top_p": 0.9, "seed": 3},
         {"sampler": samplers.TopP(0.9, k=5, temperature=0.8, seed=3)}),
        ({"strategy": "beam", "beam_size": 3, "length_penalty": 1.0},
         {"sampler": samplers.Beam(3, 1.0)}),
        ({"eos_id": None, "return_attention": True},
         {"stop_token_ids": None, "return_attention_scores": True}),
    ]
    for old, new in cases:
        with pytest.deprecated_call(match=OLD):
            before = decoding.generate(lm, PROMPTS, 10, **old)
        after = decoding.generate(lm, PROMPTS, 10, **new)
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (before, after))):
            np.testing.assert_allclose(as_np(a), as_np(b), atol=1e-6)
    with pytest.deprecated_call(match="keyword-only"):  # 0.2's order after max_length
        positional = decoding.generate(lm, PROMPTS, 10, None, "sample", 0.8, 5, 0.9, 3)
    np.testing.assert_array_equal(as_np(positional), generate(lm, PROMPTS, 10, sampler=cases[0][
        1]["sampler"]))
    # The scores keep 0.2's normalization (length_penalty 0.6 whatever the strategy).
    with pytest.deprecated_call(match=OLD):
        _, old_scores = decoding.generate(lm, PROMPTS, 10, eos_id=EOS_ID, return_scores=True)
    _, new_scores = decoding.generate(lm, PROMPTS, 10, sampler=samplers.Beam(1, 0.6),
                                      return_scores=True)
    np.testing.assert_allclose(as_np(old_scores), as_np(new_scores), rtol=1e-6)
    with pytest.raises(ValueError, match="given twice"), pytest.deprecated_call():
        decoding.generate(lm, PROMPTS, 10, eos_id=3, stop_token_ids=(4,))


@pytest.mark.tf_only
def test_old_sequence_to_sequence_functions_warn_and_give_the_same_tokens(seq2seq):
    pairs = [
        (lambda: decoding.greedy_search(seq2seq, SOURCE, 6, return_attention=True,
                                        return_scores=True),
         {"sampler": samplers.Beam(1, 0.6), "return_attention_scores": True,
          "return_scores": True}),
        (lambda: decoding.beam_search(seq2seq, SOURCE, 6, beam_size=3, eos_id=None),
         {"sampler": samplers.Beam(3), "stop_token_ids": None}),
        (lambda: decoding.sample(seq2seq, SOURCE, 6, temperature=1.3, top_k=4, seed=2),
         {"sampler": samplers.TopP(1.0, k=4, temperature=1.3, seed=2)}),
    ]
    for old, new in pairs:
        with pytest.deprecated_call(match=OLD):
            before = old()
        after = decoding.generate(seq2seq, SOURCE, 6, **new)
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (before, after))):
            np.testing.assert_allclose(as_np(a), as_np(b), atol=1e-6)


@pytest.mark.tf_only
def test_old_decode_step_and_mask_predict_spellings_warn(lm):
    decoder = lm.get_layer("decoder")
    state = decoder.init_decode_state(3, 8)
    _, state, _ = decoder.decode_step(PROMPTS, 0, state)
    with pytest.deprecated_call(match=OLD):
        old = decoder.decode_step(PROMPTS[:, 0], 4, state, return_attention=True)
    new = decoder.decode_step(PROMPTS[:, 0], 4, state, return_attention_scores=True)
    np.testing.assert_allclose(as_np(old[2]), as_np(new[2]), atol=1e-6)
    nat = ka.models.nat_seq2seq(12, 12, num_layers=1, hidden_dim=16, num_heads=2,
                                intermediate_dim=16, max_target_length=5)
    with pytest.deprecated_call(match="keyword-only"):
        old = decoding.mask_predict(nat, [[4, 11, 0]], 2, 2)  # iterations, length_beam
    new = decoding.mask_predict(nat, [[4, 11, 0]], iterations=2, length_beam=2)
    np.testing.assert_array_equal(as_np(old[0]), as_np(new[0]))
    with pytest.raises(TypeError, match="multiple values"):
        decoding.mask_predict(nat, [[4, 11, 0]], 2, iterations=3)
