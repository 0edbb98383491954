"""The task API under hostile and ordinary input (issue 50): word-level prompts, huge or
ill-typed settings, keras-hub's dict form, `fit` on strings (shuffle, validation_split, an
empty list), long prompts, huge temperatures and empty sources. Each test names the point of
the issue it holds."""

import warnings

import keras
import numpy as np
import pytest

import keras_attn as ka
from keras_attn.decoding import samplers
from keras_attn.preprocessing import CausalLMPreprocessor, CharacterTokenizer
from keras_attn.tasks import CausalLM
from keras_attn.tokens import BOS_ID, PAD_ID, RESERVED_TOKENS

WORDS = ["the", "time", "traveller", "smiled", "it", "was", "a", "strange", "thing"]
TEXTS = ["the time traveller smiled", "it was a strange thing", "the machine was there"]
SIZES = {"num_layers": 1, "hidden_dim": 16, "num_heads": 2, "intermediate_dim": 32}


def _lm(vocabulary, split="chars", sequence_length=24, seed=3):
    tokenizer = CharacterTokenizer(vocabulary, split=split, lowercase=True)
    model = ka.models.causal_lm(len(vocabulary), seed=seed, **SIZES)
    return CausalLM(model, CausalLMPreprocessor(tokenizer, sequence_length=sequence_length))


@pytest.fixture(scope="module")
def word_lm():
    """A word-level LM (`split="whitespace"`), random weights."""
    return _lm(list(RESERVED_TOKENS) + WORDS, split="whitespace", sequence_length=12)


@pytest.fixture(scope="module")
def char_lm():
    return _lm(list(RESERVED_TOKENS) + sorted(set("".join(TEXTS))))


# ---- 1. the text returned is the detokenization of the whole sequence ---------------------

def test_word_prompt_and_continuation_are_joined_as_the_tokenizer_joins(word_lm):
    tokenizer = word_lm.preprocessor.tokenizer
    text = word_lm.generate("the time", max_length=8, stop_token_ids=None)
    tokens = word_lm.generate(tokenizer.tokenize(["the time"]).to_tensor().numpy(),
                              max_length=8, stop_token_ids=None)
    expected = tokenizer.detokenize(keras.ops.convert_to_numpy(tokens)).numpy()[0].decode()
    assert text == expected and text.startswith("the time ")
    continuation = word_lm.generate("the time", max_length=8, stop_token_ids=None,
                                    strip_prompt=True)
    assert text == "the time " + continuation


def test_a_stop_string_in_the_prompt_does_not_cut_it(word_lm):
    full = word_lm.generate("the time", max_length=8, stop_token_ids=None)
    assert word_lm.generate("the time", max_length=8, stop_token_ids=None,
                            stop_strings="the") in (full, full[:full.find("the", 3) + 3])
    assert word_lm.generate("the time", max_length=8, stop_token_ids=None,
                            stop_strings="the").startswith("the time")


# ---- 2. max_new_tokens beyond int32 with a string prompt ----------------------------------

@pytest.mark.parametrize("max_new_tokens", [2**31 - 1, 2**31, 2**32 + 2, 10**20])
def test_huge_max_new_tokens_mean_as_many_as_fit(char_lm, max_new_tokens):
    expected = char_lm.generate("the time", max_length=20, stop_token_ids=None)
    got = char_lm.generate("the time", max_length=20, stop_token_ids=None,
                           max_new_tokens=max_new_tokens)
    assert got == expected and got.startswith("the time")  # 11 new tokens


# ---- 3. keras-hub's dict form: the padding mask is checked ---------------------------------

@pytest.mark.parametrize("mask", [
    [[False, True, True]],  # left-padded
    [[True, False, True]],  # a hole
    [[True, True]],  # another shape
    [[False, False, False]],  # no token
    [[1, 2, 1]],  # not booleans
])
def test_a_mask_that_is_not_a_right_padded_prefix_is_refused(char_lm, mask):
    inputs = {"token_ids": np.array([[BOS_ID, 5, 6]], "int32"),
              "padding_mask": np.array(mask)}
    with pytest.raises(ValueError, match="padding_mask"):
        char_lm.generate(inputs, max_length=10)


def test_a_right_padded_mask_gives_the_lengths(char_lm):
    ids = np.array([[BOS_ID, 5, 6], [BOS_ID, 7, PAD_ID]], "int32")
    got = char_lm.generate({"token_ids": ids, "padding_mask": ids != PAD_ID}, max_length=10)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got),
                                  keras.ops.convert_to_numpy(char_lm.generate(ids, 10)))


# ---- 4, 10, 11. fit on strings: shuffled, validation_split, an empty list ------------------

def _fit_weights(char_lm, shuffle, epochs=2):
    lm = CausalLM.from_config(char_lm.get_config())
    keras.utils.set_random_seed(1)
    lm.set_weights(char_lm.get_weights())
    lm.compile(optimizer=keras.optimizers.SGD(0.5))
    lm.fit(TEXTS * 2, epochs=epochs, batch_size=1, shuffle=shuffle, verbose=0)
    return np.concatenate([np.ravel(keras.ops.convert_to_numpy(w)) for w in lm.weights])


def test_fit_on_strings_shuffles_each_epoch_seeded(char_lm):
    ordered = _fit_weights(char_lm, shuffle=False)
    shuffled = _fit_weights(char_lm, shuffle=True)
    assert not np.allclose(ordered, shuffled)  # the order changed what SGD learned
    np.testing.assert_allclose(_fit_weights(char_lm, shuffle=True), shuffled, atol=1e-6)
    np.testing.assert_allclose(_fit_weights(char_lm, shuffle=False), ordered, atol=1e-6)


def test_fit_on_strings_takes_validation_split(char_lm):
    lm = CausalLM.from_config(char_lm.get_config())
    history = lm.fit(TEXTS * 4, epochs=1, batch_size=4, validation_split=0.25, verbose=0)
    assert np.isfinite(history.history["val_loss"][0])


@pytest.mark.parametrize("empty", [[], (), np.array([], dtype=str)])
def test_fit_on_no_text_is_refused(char_lm, empty):
    lm = CausalLM.from_config(char_lm.get_config())
    with pytest.raises(ValueError, match="`x`"):
        lm.fit(empty, epochs=1, verbose=0)


# ---- 5. a prompt that fits is kept whole; one that cannot is cut with a warning ------------

def test_a_prompt_that_fits_is_kept_whole(char_lm):
    prompt = "it was a strange thing"  # 22 letters + <bos> = 23 of 30 positions
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        text = char_lm.generate(prompt, max_length=30, stop_token_ids=None)
    assert text.startswith(prompt) and len(text) > len(prompt)


def test_a_prompt_that_cannot_fit_is_cut_with_a_warning(char_lm):
    prompt = "it was a strange thing" * 2
    with pytest.warns(UserWarning, match="max_length=30"):
        text = char_lm.generate(prompt, max_length=30, stop_token_ids=None)
    assert text.startswith(prompt[-28:])  # 28 = max_length - <bos> - one new token


# ---- 6. a huge temperature never samples the ids never emitted ------------------------------

def test_a_huge_temperature_never_samples_padding_or_bos(char_lm):
    prompts = np.array([[BOS_ID, 5, 6]] * 8, "int32")
    tokens = keras.ops.convert_to_numpy(char_lm.generate(
        prompts, max_length=24, stop_token_ids=None,
        sampler=samplers.Random(temperature=1e12, seed=0)))
    new = tokens[:, 3:]
    assert not np.isin(new, (PAD_ID, BOS_ID)).any()
    assert len(np.unique(new)) > 5  # the draw is near uniform over the real tokens


# ---- 8. generate's arguments, each a ValueError naming it ----------------------------------

@pytest.mark.parametrize("options, name", [
    ({"max_new_tokens": "3"}, "max_new_tokens"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 2.0}, "max_new_tokens"),
    ({"max_length": 10**9}, "max_length"),
    ({"strip_prompt": "yes"}, "strip_prompt"),
    ({"strip_prompt": 1}, "strip_prompt"),
    ({"stop_token_ids": "3"}, "stop_token_ids"),
    ({"stop_token_ids": [3.0]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
])
def test_bad_generate_arguments_are_named(char_lm, options, name):
    with pytest.raises(ValueError, match=name):
        char_lm.generate("the time", **{"max_length": 20, **options})


def test_a_numpy_integer_is_one_stop_id(char_lm):
    expected = char_lm.generate(["the time", "it"], max_length=20, stop_token_ids=(3,))
    for stop in (np.int64(3), np.int32(3), np.array([3])):
        assert char_lm.generate(["the time", "it"], max_length=20,
                                stop_token_ids=stop) == expected


def test_max_length_beyond_the_position_table_is_refused():
    vocabulary = list(RESERVED_TOKENS) + WORDS
    model = ka.models.causal_lm(len(vocabulary), position_encoding="learned",
                                max_sequence_length=16, **SIZES)
    lm = CausalLM(model)
    with pytest.raises(ValueError, match="max_length"):
        lm.generate(np.array([[BOS_ID, 5]], "int32"), max_length=17)
    assert keras.ops.convert_to_numpy(
        lm.generate(np.array([[BOS_ID, 5]], "int32"), max_length=16)).shape == (1, 16)


# ---- 14. a new max_length neither retraces per length nor warns ---------------------------

def test_new_max_lengths_share_one_program_and_give_the_same_prefix(char_lm, caplog):
    from keras_attn.decoding import compiled, stepwise
    from keras_attn.decoding.causal_lm import cache_length

    def compilations():
        if keras.backend.backend() == "torch":
            return stepwise.compilations()
        return compiled.compilations(char_lm)

    prompts = ["the time", "it"]
    char_lm.generate(prompts, max_length=17, stop_token_ids=None)  # the bucket 17..24
    programs = compilations()
    with caplog.at_level("WARNING", logger="tensorflow"):
        texts = {m: char_lm.generate(prompts, max_length=m, stop_token_ids=None)
                 for m in range(17, 25)}
    assert "retracing" not in caplog.text
    assert compilations() == programs
    assert {cache_length(m) for m in range(17, 25)} == {24}
    # Greedy in a longer cache: each length's text is the next one's beginning.
    for m in range(17, 24):
        assert all(texts[m + 1][i].startswith(texts[m][i]) for i in range(2))
    ids = np.array([[BOS_ID, 5, 6]], "int32")
    tokens = {m: keras.ops.convert_to_numpy(char_lm.generate(ids, max_length=m,
                                                             stop_token_ids=None))
              for m in (9, 16, 17)}
    assert [t.shape for t in tokens.values()] == [(1, 9), (1, 16), (1, 17)]
    np.testing.assert_array_equal(tokens[16][:, :9], tokens[9])
    np.testing.assert_array_equal(tokens[17][:, :16], tokens[16])
