"""The exported `generate` signature: prompt strings in, text out, TensorFlow alone."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
if keras.backend.backend() != "tensorflow":
    pytest.skip("SavedModel export is TensorFlow's", allow_module_level=True)

from export_utils import check_never_writes_over_anything

import keras_attn as ka
from keras_attn.export_generator import export_generator, make_generate_fn
from keras_attn.preprocessing import CausalLMPreprocessor, CharacterTokenizer
from keras_attn.tokens import RESERVED_TOKENS

VOCABULARY = list(RESERVED_TOKENS) + list(" abcdefghijklmnopqrstuvwxyz")

def char_generate_fn(model, max_length, standardize=None):
    """The `generate` graph function `export_generator(model, VOCABULARY, ...)` serves."""
    tokenizer = CharacterTokenizer(VOCABULARY, standardize=standardize)
    return make_generate_fn(model, CausalLMPreprocessor(tokenizer), max_length)


SERVE = """
import json, sys
sys.modules["keras_attn"] = None
sys.modules["keras"] = None
import tensorflow as tf
generator = tf.saved_model.load(sys.argv[1])
out = {}
for name, settings in json.loads(sys.argv[2]).items():
    try:
        result = generator.signatures["generate"](
            prompt=tf.constant(settings["prompts"], tf.string),
            max_new_tokens=tf.constant(settings["new"]),
            temperature=tf.constant(settings["temperature"], tf.float32),
            top_k=tf.constant(settings["top_k"]),
            top_p=tf.constant(settings["top_p"], tf.float32), seed=tf.constant(settings["seed"]))
    except tf.errors.InvalidArgumentError as error:
        out[name] = {"error": error.message}
        continue
    out[name] = {"text": [t.decode() for t in result["text"].numpy()],
                 "truncated": result["truncated"].numpy().tolist(),
                 "context": [t.decode() for t in result["context"].numpy()]
                             if "context" in result else None}
print(json.dumps(out))
"""

CASES = {
    "greedy": {"prompts": ["the time ", "", "zz"], "new": 12, "temperature": 0.0, "top_k": 0,
               "top_p": 1.0, "seed": 0},
    "sampled": {"prompts": ["the time ", "a"], "new": 20, "temperature": 1.2, "top_k": 8,
                "top_p": 0.9, "seed": 5},
    "long": {"prompts": ["abcdefghij" * 5], "new": 3, "temperature": 0.0, "top_k": 0,
             "top_p": 1.0, "seed": 0},
    "all": {"prompts": ["the time ", "a"], "new": 2**31 - 1, "temperature": 0.0, "top_k": 0,
            "top_p": 1.0, "seed": 0},
    "empty": {"prompts": [], "new": 5, "temperature": 0.7, "top_k": 0, "top_p": 1.0,
              "seed": 0},
}
GREEDY = {"prompts": ["the time "], "new": 5, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
          "seed": 0}
# Settings a served call must refuse (the signature always passes tensors).
BAD = {"temperature": float("nan"), "top_p": float("nan"), "top_k": -3, "seed": -1, "new": 0}
BAD_CASES = {f"bad {name}": {**GREEDY, name: value} for name, value in BAD.items()}
BAD_CASES["bad negative temperature"] = {**GREEDY, "temperature": -1.0}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(2)
    model = ka.models.causal_lm(len(VOCABULARY), num_layers=1, hidden_dim=16, num_heads=2,
                                intermediate_dim=32, num_key_value_heads=1)
    path = str(tmp_path_factory.mktemp("generator") / "saved_model")
    export_generator(model, VOCABULARY, path, max_length=32)
    served = subprocess.run([sys.executable, "-c", SERVE, path,
                             json.dumps({**CASES, **BAD_CASES})],
                            capture_output=True, text=True, timeout=300, check=False)
    assert served.returncode == 0, served.stderr[-3000:]
    return model, json.loads(served.stdout.strip().splitlines()[-1])


def test_served_text_equals_the_same_computation_in_python(exported):
    model, served = exported
    generate = char_generate_fn(model, 32)
    for name, settings in CASES.items():
        result = generate(tf.constant(settings["prompts"], tf.string),
                          tf.constant(settings["new"]),
                          tf.constant(settings["temperature"]), tf.constant(settings["top_k"]),
                          tf.constant(settings["top_p"]), tf.constant(settings["seed"]))
        assert served[name]["text"] == [t.decode() for t in result["text"].numpy()], name
        assert served[name]["context"] == [t.decode() for t in result["context"].numpy()]
        assert served[name]["truncated"] == result["truncated"].numpy().tolist()


def test_served_greedy_text_is_the_greedy_continuation(exported):
    model, served = exported
    for prompt, text in zip(CASES["greedy"]["prompts"], served["greedy"]["text"]):
        ids = [VOCABULARY.index(c) for c in prompt]
        tokens = keras.ops.convert_to_numpy(ka.decoding.generate(
            model, np.array([[2] + ids], "int32"), 32, max_new_tokens=12))[0]
        assert text == new_text(tokens[1 + len(ids):])
        assert len(text.replace("[UNK]", "?")) <= 12
        assert set(text.replace("[UNK]", "")) <= set(VOCABULARY[4:])


def greedy_text(model, prompt, max_new_tokens=None):
    """The greedy continuation of `prompt` (characters of VOCABULARY) in Python."""
    ids = [2] + [VOCABULARY.index(c) for c in prompt]
    tokens = keras.ops.convert_to_numpy(ka.decoding.generate(
        model, np.array([ids], "int32"), 32, max_new_tokens=max_new_tokens))[0]
    return new_text(tokens[len(ids):])


def new_text(tokens):
    """Generated tokens as the served text: padding, <bos> and <eos> dropped, an unknown token
    shown as `[UNK]`."""
    return "".join(VOCABULARY[t] for t in tokens if t >= 4 or t == 1)


def test_long_prompts_keep_their_end_and_get_the_tokens_asked_for(exported):
    """A prompt longer than the context got exactly one new token whatever was asked; it now
    keeps its most recent characters, as many as leave room for `max_new_tokens` (at least
    half of the 32 positions), and says it was cut."""
    model, served = exported
    prompt = CASES["long"]["prompts"][0]
    kept = prompt[-(32 - 1 - 3):]  # <bos>, 28 characters, 3 new tokens
    assert served["long"]["truncated"] == [True]
    assert served["long"]["context"] == [kept]
    assert served["long"]["text"] == [greedy_text(model, kept, 3)]
    assert len(served["long"]["text"][0]) == 3  # the model emits no <eos> here
    assert served["greedy"]["truncated"] == [False, False, False]
    assert served["greedy"]["context"] == CASES["greedy"]["prompts"]
    assert all(len(text) <= 20 for text in served["sampled"]["text"])


def test_max_new_tokens_of_int32_max_is_as_many_as_fit(exported):
    """2**31 - 1 overflowed `prompt length + max_new_tokens` and generated nothing."""
    model, served = exported
    texts = [greedy_text(model, prompt) for prompt in CASES["all"]["prompts"]]
    assert served["all"]["text"] == texts and all(texts)


def test_an_empty_batch_of_prompts_gets_empty_outputs(exported):
    """It failed in the graph's ArgMax; its settings are still checked."""
    _, served = exported
    assert served["empty"] == {"text": [], "truncated": [], "context": []}
    generate = tf.function(char_generate_fn(exported[0], 32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="argument `temperature`"):
        generate(tf.constant([], tf.string), tf.constant(5), tf.constant(-1.0),
                 tf.constant(0), tf.constant(1.0), tf.constant(0))


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_served_settings_out_of_range_fail_the_call(exported, case):
    """A NaN temperature or top_p became greedy decoding, top_k=-3 turned top-k off: through
    the signature (tensors) they now fail the call, naming the setting."""
    _, served = exported
    name = {"new": "max_new_tokens"}.get(case.split()[-1], case.split()[-1])
    assert "error" in served[case], served[case]
    assert f"argument `{name}`" in served[case]["error"]


def test_prompts_are_standardized_as_the_training_text_was():
    keras.utils.set_random_seed(2)
    model = ka.models.causal_lm(len(VOCABULARY), num_layers=1, hidden_dim=16, num_heads=2,
                                intermediate_dim=32, num_key_value_heads=1)

    def letters(text):
        return tf.strings.regex_replace(tf.strings.lower(text), "[^a-z]+", " ")

    generate = char_generate_fn(model, 32, standardize=letters)
    out = generate(tf.constant(["The TIME, Traveller!", "the time traveller "]),
                   tf.constant(6), tf.constant(0.0), tf.constant(0), tf.constant(1.0),
                   tf.constant(0))
    assert [c.decode() for c in out["context"].numpy()] == ["the time traveller "] * 2
    text = [t.decode() for t in out["text"].numpy()]
    assert text[0] == text[1] == greedy_text(model, "the time traveller ", 6)


def test_bad_vocabularies_are_refused(tmp_path):
    model = ka.models.causal_lm(8, num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=8)
    with pytest.raises(ValueError, match="vocabulary"):
        export_generator(model, ["a", "b"], str(tmp_path / "x"), 16)
    with pytest.raises(ValueError, match="split"):
        export_generator(model, VOCABULARY, str(tmp_path / "x"), 16, split="bpe")


def test_nothing_is_written_over(tmp_path):
    """An existing SavedModel directory was overwritten (its variables mixed with the new
    ones) and `path=""` wrote into the working directory."""
    model = ka.models.causal_lm(len(VOCABULARY), num_layers=1, hidden_dim=8, num_heads=2,
                                intermediate_dim=8)
    check_never_writes_over_anything(
        lambda path: export_generator(model, VOCABULARY, path, 16), tmp_path)
