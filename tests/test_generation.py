"""Generation with causal language models: against a Python loop over full passes, the cache
against the full pass with grouped heads and rotary positions, and sampling against the filtered
softmax it claims to draw from."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import call_traced, to_np
from layer_test_utils import run_layer_test

import keras_attn as ka
from keras_attn import decoding
from keras_attn.decoding.samplers import Beam, Random, TopK, TopP
from keras_attn.tokens import BOS_ID, EOS_ID

PROMPTS = np.array([[BOS_ID, 5, 6, 7], [BOS_ID, 9, 0, 0], [BOS_ID, 0, 0, 0]], "int32")


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    return ka.models.causal_lm(24, num_layers=2, hidden_dim=32, num_heads=4, intermediate_dim=48,
                               num_key_value_heads=2)


def python_greedy(model, prompts, max_length, pad_id=0, banned=(0, BOS_ID)):
    """Greedy continuation by full forward passes over the growing sequence (`pad_id=None`:
    every prompt position is a token)."""
    rows = []
    for prompt in prompts:
        seq = [int(t) for t in prompt if pad_id is None or t != pad_id]
        while len(seq) < max_length:
            logits = to_np(model(np.array([seq], "int32")))[0, -1].astype("float64")
            logits[list(banned)] = -np.inf  # by default padding and <bos> are never generated
            seq.append(int(np.argmax(logits)))
            if seq[-1] == EOS_ID:
                break
        rows.append(seq + [0] * (max_length - len(seq)))
    return np.array(rows)


def test_greedy_generation_equals_a_python_loop_over_full_passes(model):
    tokens = to_np(decoding.generate(model, PROMPTS, 10)).astype(int)
    np.testing.assert_array_equal(tokens, python_greedy(model, PROMPTS, 10))
    np.testing.assert_array_equal(tokens[:, :4] * (PROMPTS > 0), PROMPTS)  # prompts kept


def test_the_default_padding_is_the_models_own():
    """A `causal_lm(pad_id=None)` has no padding id: `generate` without `pad_id` bans no id and
    takes every prompt position as a token (it banned 0 and <bos> unless `pad_id` was given)."""
    keras.utils.set_random_seed(5)
    model = ka.models.causal_lm(24, num_layers=1, hidden_dim=32, num_heads=4, intermediate_dim=48,
                                pad_id=None)
    (bias,) = [w for w in model.weights if w.path == "decoder/head/output_dense/bias"]
    favoured = np.zeros(24, "float32")
    favoured[[0, BOS_ID]] = [3.0, 2.9]  # the ids keras_attn's padding default bans
    bias.assign(favoured)
    want = python_greedy(model, PROMPTS, 8, pad_id=None, banned=())
    assert np.isin(want[:, 4:], [0, BOS_ID]).mean() > 0.5  # the ban would change them
    np.testing.assert_array_equal(to_np(decoding.generate(model, PROMPTS, 8)), want)
    # An explicit padding id still right-pads the prompts and is never generated.
    np.testing.assert_array_equal(to_np(decoding.generate(model, PROMPTS, 8, pad_id=0)),
                                  python_greedy(model, PROMPTS, 8))
    # A model's own padding id other than 0 is the default.
    padded = ka.models.causal_lm(24, num_layers=1, hidden_dim=32, num_heads=4, intermediate_dim=48,
                                 pad_id=7)
    padded.set_weights(model.get_weights())
    prompts = np.where(PROMPTS == 0, 7, PROMPTS)
    np.testing.assert_array_equal(
        to_np(decoding.generate(padded, prompts, 8)),
        to_np(decoding.generate(padded, prompts, 8, pad_id=7)))


def test_beam_of_one_top_k_of_one_and_cold_sampling_are_greedy(model):
    greedy = to_np(decoding.generate(model, PROMPTS, 10))
    for sampler in (Beam(1), TopK(1, seed=4), Random(1e-6, seed=4), Random(0.0, seed=4),
                    TopP(1e-6, seed=4)):
        np.testing.assert_array_equal(to_np(decoding.generate(model, PROMPTS, 10,
                                                              sampler=sampler)),
                                      greedy, err_msg=repr(sampler))


def test_sampling_is_reproducible_by_seed_and_respects_max_new_tokens(model):
    first = to_np(decoding.generate(model, PROMPTS, 12, sampler=Random(1.5, seed=11),
                                    max_new_tokens=3))
    np.testing.assert_array_equal(to_np(decoding.generate(
        model, PROMPTS, 12, sampler=Random(1.5, seed=11), max_new_tokens=3)), first)
    assert not np.array_equal(to_np(decoding.generate(
        model, PROMPTS, 12, sampler=Random(1.5, seed=12), max_new_tokens=3)), first)
    lengths = (PROMPTS > 0).sum(1)
    generated = (first > 0).sum(1) - lengths
    assert np.all(generated <= 3) and np.all(first[:, lengths.max() + 3:] == 0)


@pytest.mark.parametrize("position_encoding", ["rope", "alibi", "learned"])
def test_cached_steps_equal_the_full_pass_with_groups(position_encoding):
    model = ka.models.causal_lm(30, num_layers=2, hidden_dim=32, num_heads=4, intermediate_dim=64,
                                num_key_value_heads=2, position_encoding=position_encoding,
                                max_sequence_length=12)
    ids = np.random.default_rng(0).integers(1, 30, (2, 9)).astype("int32")
    full = to_np(model(ids))
    decoder = model.get_layer("decoder")
    state = decoder.init_decode_state(2, 9)
    prefix, state, _ = decoder.decode_step(ids[:, :4], 0, state)  # a prompt at once
    steps = [to_np(prefix)]
    for i in range(4, 9):
        logits, state, attention = decoder.decode_step(ids[:, i], i, state,
                                                       return_attention_scores=True)
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
    tokens = to_np(decoding.generate(model, prompts, 2, sampler=TopP(
        top_p, k=top_k, temperature=temperature, seed=3)))
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
                   {"vocabulary_size": 20, "num_layers": 1, "hidden_dim": 16,
                    "block": ka.BlockConfig(
                        ka.AttentionConfig(num_heads=2, num_key_value_heads=1,
                                           position_encoding="rope"),
                        intermediate_dim=32, activation="swiglu", norm="rms",
                        normalize_first=True)},
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
    ({"max_length": 10, "sampler": "nucleus"}, "sampler"),
    ({"max_length": 10, "max_new_tokens": 0}, "max_new_tokens"),
    ({"max_length": 10, "sampler": "beam", "max_new_tokens": 3}, "max_new_tokens"),
    ({"max_length": 10, "jit_compile": "yes"}, "jit_compile"),
])
def test_bad_arguments_name_the_argument(model, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        decoding.generate(model, PROMPTS, **kwargs)


# ---- torch: each token's step compiled once (keras_attn.decoding.stepwise) -----------------

@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile of the steps")
@pytest.mark.parametrize("sampler", ["greedy", "random"])
def test_compiled_torch_steps_equal_eager_ones_and_compile_once(model, sampler):
    from keras_attn.decoding import compiled, stepwise

    def generate(prompts, jit_compile, temperature=0.7):
        chosen = sampler if sampler == "greedy" else Random(temperature=temperature, seed=4)
        return to_np(decoding.generate(model, prompts, 10, sampler=chosen,
                                       jit_compile=jit_compile))

    assert compiled.torch_mode(model, None) is None  # a CPU: eager unless asked
    assert compiled.torch_mode(model, True) == "eager"
    before = stepwise.compilations()
    first = generate(PROMPTS, True)
    count = stepwise.compilations()
    assert count > before
    np.testing.assert_array_equal(first, generate(PROMPTS, False))
    # Another prompt of the same shape, and (sampling) another temperature: nothing compiled.
    other = PROMPTS[::-1].copy()
    np.testing.assert_array_equal(generate(other, True), generate(other, False))
    if sampler == "random":
        np.testing.assert_array_equal(generate(PROMPTS, True, 1.5),
                                      generate(PROMPTS, False, 1.5))
    assert stepwise.compilations() == count


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="torch compiles each step")
def test_decoding_is_one_program_compiled_once_per_settings(model):
    """Prefill and every step in one program (`jax.jit`, a `tf.function`), the weights (JAX)
    and the sampler's numbers its arguments: a new prompt, temperature or seed reuses it."""
    from keras_attn.decoding import compiled

    def generate(prompts, temperature, seed):
        return to_np(decoding.generate(model, prompts, 10,
                                       sampler=Random(temperature=temperature, seed=seed)))

    before = compiled.compilations(model)
    generate(PROMPTS, 0.7, 1)
    programs = compiled.compilations(model)
    assert programs - before in (0, 1)  # prefill and the loop: one program (0: made before)
    generate(PROMPTS[::-1].copy(), 1.5, 2)
    assert compiled.compilations(model) == programs


# ---- hostile inputs: settings as tensors, prompts, end tokens, int32 limits -------------------

INT32_MAX = 2**31 - 1


def test_max_new_tokens_beyond_the_buffer_means_as_many_as_fit(model):
    """2**31 - 1 once overflowed `prompt length + max_new_tokens` and generated nothing."""
    full = to_np(decoding.generate(model, PROMPTS, 10))
    assert np.all((full[:, 4:] > 0).sum(1) > 0)  # a real test: something is generated
    values = [INT32_MAX, np.int64(2**40), keras.ops.convert_to_tensor(INT32_MAX)]
    if keras.backend.backend() != "jax":  # JAX has no int64 tensors (without x64)
        values.append(keras.ops.convert_to_tensor(2**40, "int64"))  # never wrapped to int32
    for value in values:
        np.testing.assert_array_equal(
            to_np(decoding.generate(model, PROMPTS, 10, max_new_tokens=value)), full)
    traced = call_traced(lambda n: decoding.generate(model, PROMPTS, 10, max_new_tokens=n),
                         np.int32(INT32_MAX))
    np.testing.assert_array_equal(to_np(traced), full)


def sampling(name, value):
    """`generate`'s keyword arguments with the setting `name` (a sampler's or
    `max_new_tokens`) at `value`."""
    if name == "max_new_tokens":
        return {"max_new_tokens": value}
    return {"sampler": TopP(**{"p": 0.9, "k": 5, "temperature": 0.7, "seed": 3, name: value})}


BAD_SETTINGS = [("temperature", float("nan")), ("temperature", -1.0),
                ("temperature", float("inf")), ("p", float("nan")), ("p", 0.0),
                ("p", 1.5), ("k", -3), ("seed", -1), ("max_new_tokens", 0)]


@pytest.mark.parametrize("name,value", BAD_SETTINGS)
def test_settings_given_as_tensors_are_checked_not_replaced(model, name, value):
    """NaN or negative temperatures and NaN top_p became greedy decoding, top_k=-3 turned
    top-k off: as eager tensors they are refused like Python values, and inside a compiled
    function (a SavedModel signature, the caller's jax.jit) the call fails with the same
    message."""
    tensor = keras.ops.convert_to_tensor(value, "int32" if isinstance(value, int) else "float32")
    with pytest.raises(ValueError, match=f"argument `{name}`"):
        decoding.generate(model, PROMPTS, 8, **sampling(name, value))
    with pytest.raises(ValueError, match=f"argument `{name}`"):
        decoding.generate(model, PROMPTS, 8, **sampling(name, tensor))
    with pytest.raises(Exception, match=f"argument `{name}`"):
        call_traced(lambda v: decoding.generate(model, PROMPTS, 8, **sampling(name, v)),
                    tensor)


def test_settings_as_tensors_give_what_python_values_give(model):
    python = {"p": 0.9, "k": 5, "temperature": 0.7, "seed": 3}
    expected = to_np(decoding.generate(model, PROMPTS, 10, sampler=TopP(**python),
                                       max_new_tokens=4))
    tensors = {name: keras.ops.convert_to_tensor(value) for name, value in python.items()}
    np.testing.assert_array_equal(to_np(decoding.generate(
        model, PROMPTS, 10, sampler=TopP(**tensors),
        max_new_tokens=keras.ops.convert_to_tensor(4))), expected)
    traced = call_traced(lambda p, k, t, s, n: decoding.generate(
        model, PROMPTS, 10, sampler=TopP(p, k, t, s), max_new_tokens=n),
        *python.values(), 4)
    np.testing.assert_array_equal(to_np(traced), expected)
    with pytest.raises(ValueError, match="`k`"):  # a float where an integer is meant
        TopP(0.9, k=keras.ops.convert_to_tensor(2.5))


@pytest.mark.parametrize("prompt", [[[0, BOS_ID, 5, 6]], [[BOS_ID, 5, 0, 6]],
                                    [[BOS_ID, 5, 6, 7], [0, 0, 0, 0]]],
                         ids=["left padding", "a 0 between tokens", "an all-padding row"])
def test_prompts_that_are_not_right_padded_are_refused(model, prompt):
    """They lost their last token or decoded garbage (torch: an unrelated error)."""
    prompt = np.array(prompt, "int32")
    with pytest.raises(ValueError, match="inputs.*right-padded"):
        decoding.generate(model, prompt, 8)
    with pytest.raises(Exception, match="inputs.*right-padded"):
        call_traced(lambda p: decoding.generate(model, p, 8), prompt)


@pytest.mark.parametrize("prompt,kwargs,arg", [
    (PROMPTS, {"stop_token_ids": 24}, "stop_token_ids"),  # the vocabulary is 0..23
    (PROMPTS, {"stop_token_ids": 0}, "stop_token_ids"),  # padding is never emitted
    (PROMPTS, {"stop_token_ids": BOS_ID}, "stop_token_ids"),  # nor is <bos>
    (PROMPTS, {"max_length": 2**31}, "max_length"),  # positions are int32
    ([[BOS_ID, 24]], {}, "inputs"),
    ([[BOS_ID, -1]], {}, "inputs"),
    ([[2.0, 5.0]], {}, "inputs"),
])
def test_out_of_range_ids_and_lengths_name_the_argument(model, prompt, kwargs, arg):
    """A token past the vocabulary and max_length=2**31 were bare "Graph execution error"s,
    an end id past the vocabulary ran every row to max_length."""
    kwargs = {"max_length": 8, **kwargs}
    with pytest.raises(ValueError, match=f"argument `{arg}`|Argument `{arg}`"):
        decoding.generate(model, prompt, **kwargs)


def test_a_prompt_id_past_the_vocabulary_fails_inside_a_graph(model):
    with pytest.raises(Exception, match="inputs"):
        call_traced(lambda p: decoding.generate(model, p, 8),
                    np.array([[BOS_ID, 30, 5]], "int32"))


def test_without_an_end_token_every_row_runs_to_its_limit(model):
    tokens = to_np(decoding.generate(model, PROMPTS, 10, stop_token_ids=None))
    assert np.all(tokens > 0)
    lengths = (PROMPTS > 0).sum(1)
    limited = to_np(decoding.generate(model, PROMPTS, 10, stop_token_ids=None,
                                      max_new_tokens=3))
    np.testing.assert_array_equal((limited > 0).sum(1), lengths + 3)
    beams = to_np(decoding.generate(model, PROMPTS, 10, stop_token_ids=None, sampler=Beam(2)))
    assert np.all(beams > 0)


def test_numpy_int64_arguments_equal_python_ints(model):
    """int64 `max_length` with `max_new_tokens` failed with a TensorFlow dtype error."""
    i64 = np.int64
    for kwargs, as_int64 in (
            ({"max_new_tokens": 3, "sampler": TopK(5, seed=4)},
             {"max_new_tokens": i64(3), "sampler": TopK(i64(5), seed=i64(4))}),
            ({"sampler": Beam(2), "stop_token_ids": EOS_ID},
             {"sampler": Beam(i64(2)), "stop_token_ids": i64(EOS_ID)})):
        np.testing.assert_array_equal(
            to_np(decoding.generate(model, PROMPTS.astype("int64"), i64(10), **as_int64)),
            to_np(decoding.generate(model, PROMPTS, 10, **kwargs)))


@pytest.mark.parametrize("int64", [np.int64, lambda i: keras.ops.convert_to_tensor(i, "int64")],
                         ids=["numpy", "tensor"])
def test_decode_step_takes_int64_positions(model, int64):
    decoder = model.get_layer("decoder")

    def last_logits(position):
        state = decoder.init_decode_state(2, 8)
        _, state, _ = decoder.decode_step(PROMPTS[:2], position(0), state)
        logits, _, _ = decoder.decode_step(PROMPTS[:2, 0], position(4), state)
        return to_np(logits)

    np.testing.assert_array_equal(last_logits(int64), last_logits(int))


def test_a_sequence_to_sequence_model_is_decoded_as_one():
    """`generate(transformer_seq2seq(...))` failed inside an autograph trace with a TypeError
    about `init_decode_state`'s arguments; now `generate` decodes it (source ids in, `max_length`
    target ids out)."""
    seq2seq = ka.models.transformer_seq2seq(12, 12, num_layers=1, hidden_dim=8, num_heads=2,
                                            intermediate_dim=8)
    tokens = to_np(decoding.generate(seq2seq, np.array([[2, 5, 6]], "int32"), 6))
    assert tokens.shape == (1, 6) and tokens[0, 0] not in (0, BOS_ID)  # never emitted
