"""`keras_attn.tasks.CausalLM`: a checkpoint or a keras_attn LM as one object — strings in and
out equal to the token path and to transformers, fit on text, LoRA, `.keras` round trips."""

import checkpoint_fixtures as fx
import keras
import numpy as np
import pytest

import keras_attn as ka
from keras_attn.preprocessing import CausalLMPreprocessor, CharacterTokenizer
from keras_attn.tasks import CausalLM
from keras_attn.tokens import RESERVED_TOKENS

CAUSAL = ["llama", "llama3", "mistral", "qwen2", "gpt2"]
TEXTS = ["the time traveller smiled", "it was a strange thing", "the machine was there"]


@pytest.fixture(scope="module")
def char_lm():
    """A keras_attn LM over characters with its preprocessor (random weights)."""
    vocabulary = list(RESERVED_TOKENS) + sorted(set("".join(TEXTS)))
    tokenizer = CharacterTokenizer(vocabulary, lowercase=True)
    model = ka.models.causal_lm(len(vocabulary), num_layers=1, hidden_dim=16, num_heads=2,
                                intermediate_dim=32, seed=3)
    return CausalLM(model, CausalLMPreprocessor(tokenizer, sequence_length=24))


@pytest.mark.parametrize("name", CAUSAL)
def test_greedy_tokens_equal_transformers(name):
    lm = CausalLM.from_pretrained(fx.hf_checkpoint(name), dtype="float32")
    expected = fx.expected(name)["generated"]  # greedy, 20 new tokens, the end ids banned
    tokens = lm.generate(expected[:, :5], max_length=25, stop_token_ids=None,
                         sampler="greedy")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens), expected)


def test_strings_equal_the_token_path():
    lm = CausalLM.from_pretrained(fx.hf_checkpoint("llama"), dtype="float32")
    prompts = ["The Time Traveller", "It was"]
    texts = lm.generate(prompts, max_length=20, strip_prompt=True)
    tokenizer = lm.preprocessor.tokenizer
    for prompt, text in zip(prompts, texts):
        ids = tokenizer.tokenize([prompt]).to_tensor().numpy()
        tokens = keras.ops.convert_to_numpy(lm.generate(ids, max_length=20))[0]
        stops = set(tokenizer.end_token_ids)
        new = [int(t) for t in tokens[ids.shape[1]:]]
        new = new[:next((i for i, t in enumerate(new) if t in stops), len(new))]
        assert text == tokenizer.detokenize([new]).numpy()[0].decode("utf-8")
    whole = lm.generate("The Time Traveller", max_length=20)
    assert isinstance(whole, str) and whole.startswith("The Time Traveller")
    assert whole == "The Time Traveller" + texts[0]


def test_keras_file_keeps_tokenizer_and_sampler(char_lm, tmp_path):
    char_lm.compile(sampler=ka.decoding.samplers.TopK(3, seed=5))
    before = char_lm.generate(["the time", "it"], max_length=20)
    path = str(tmp_path / "lm.keras")
    char_lm.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, CausalLM)
    assert loaded.preprocessor.tokenizer.vocabulary == char_lm.preprocessor.tokenizer.vocabulary
    assert loaded.generate(["the time", "it"], max_length=20) == before
    char_lm.compile(sampler="greedy")


def test_pretrained_keras_file_keeps_the_tokenizer_files(tmp_path):
    lm = CausalLM.from_pretrained(fx.hf_checkpoint("qwen2"), dtype="float32")
    before = lm.generate(["The Time"], max_length=16)
    path = str(tmp_path / "qwen2.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.generate(["The Time"], max_length=16) == before
    assert loaded.preprocessor.tokenizer.end_token_ids == lm.preprocessor.tokenizer.end_token_ids


def test_fit_on_text_lowers_the_loss(char_lm):
    lm = CausalLM.from_config(char_lm.get_config())
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = lm.fit(TEXTS * 8, epochs=3, batch_size=8, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] - 0.1
    # the tokenizer's table, first made inside fit's tf.data map, still serves generate
    (text,) = lm.generate(["the time"], max_length=16)
    assert isinstance(text, str) and text.startswith("the time")


def test_lora_trains_the_low_rank_weights_only(char_lm):
    lm = CausalLM.from_config(char_lm.get_config())
    lm.build({"token_ids": (None, None), "padding_mask": (None, None)})
    paths = lm.enable_lora(2)
    assert paths and all("query" in p or "value" in p for p in paths)
    frozen = [keras.ops.convert_to_numpy(v) for v in lm.non_trainable_weights]
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    lm.fit(TEXTS * 4, epochs=1, batch_size=4, verbose=0)
    after = [keras.ops.convert_to_numpy(v) for v in lm.non_trainable_weights]
    assert all(np.array_equal(a, b) for a, b in zip(frozen, after))
    assert all("lora" in w.path for w in lm.trainable_weights)


def test_preprocessor_layout(char_lm):
    preprocessor = char_lm.preprocessor
    x, y, weights = preprocessor(["the"])
    ids = x["token_ids"].numpy()[0]
    vocabulary = preprocessor.tokenizer.vocabulary
    expected = [2] + [vocabulary.index(c) for c in "the"] + [3]  # <bos> t h e <eos>
    assert list(ids[:4]) == expected[:4] and list(y.numpy()[0][:4]) == expected[1:]
    assert list(x["padding_mask"].numpy()[0][:6]) == [True] * 5 + [False]  # <eos> an input too
    assert list(weights.numpy()[0][:5]) == [1, 1, 1, 1, 0]


@pytest.mark.parametrize("bad, message", [
    (123, "inputs"),
    ([["nested"]], "string"),
])
def test_bad_prompts_are_named(char_lm, bad, message):
    with pytest.raises(ValueError, match=message):
        char_lm.generate(bad, max_length=10)


def test_what_from_pretrained_refuses():
    with pytest.raises(ValueError, match="directory"):
        CausalLM.from_pretrained(None)
    with pytest.raises(ValueError, match="TextClassifier"):
        CausalLM.from_pretrained(fx.hf_checkpoint("bert_mlm"))


def test_stop_strings_end_each_continuation_after_the_first_found(char_lm):
    char_lm.compile(sampler="greedy")
    full = char_lm.generate(["the time", "it"], max_length=20, strip_prompt=True)
    row = next(text for text in full if len(text) >= 4)
    stop = row[2:4]
    cut = char_lm.generate(["the time", "it"], max_length=20, strip_prompt=True,
                           stop_strings=[stop, "\x00never"])
    for whole, got in zip(full, cut):
        end = whole.find(stop)
        assert got == (whole if end < 0 else whole[:end + len(stop)])
    assert cut[full.index(row)] != row or row.endswith(stop)
    with pytest.raises(ValueError, match="stop_strings"):
        char_lm.generate(["it"], max_length=20, stop_strings=[""])
    with pytest.raises(ValueError, match="stop_strings"):
        char_lm.generate([[2, 5, 6]], max_length=20, stop_strings="a")
