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

import keras_attn as ka
from keras_attn.export_generator import export_generator, make_generate_fn
from keras_attn.tokens import RESERVED_TOKENS

VOCABULARY = list(RESERVED_TOKENS) + list(" abcdefghijklmnopqrstuvwxyz")

SERVE = """
import json, sys
sys.modules["keras_attn"] = None
sys.modules["keras"] = None
import tensorflow as tf
generator = tf.saved_model.load(sys.argv[1])
out = {}
for name, settings in json.loads(sys.argv[2]).items():
    result = generator.signatures["generate"](
        prompt=tf.constant(settings["prompts"]), max_new_tokens=tf.constant(settings["new"]),
        temperature=tf.constant(settings["temperature"]), top_k=tf.constant(settings["top_k"]),
        top_p=tf.constant(settings["top_p"]), seed=tf.constant(settings["seed"]))
    out[name] = {"text": [t.decode() for t in result["text"].numpy()],
                 "truncated": result["truncated"].numpy().tolist()}
print(json.dumps(out))
"""

CASES = {
    "greedy": {"prompts": ["the time ", "", "zz"], "new": 12, "temperature": 0.0, "top_k": 0,
               "top_p": 1.0, "seed": 0},
    "sampled": {"prompts": ["the time ", "a"], "new": 20, "temperature": 1.2, "top_k": 8,
                "top_p": 0.9, "seed": 5},
    "long": {"prompts": ["abcdefghij" * 5], "new": 3, "temperature": 0.0, "top_k": 0,
             "top_p": 1.0, "seed": 0},
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(2)
    model = ka.models.causal_lm(len(VOCABULARY), num_layers=1, embed_dim=16, num_heads=2,
                                ffn_dim=32, num_key_value_heads=1)
    path = str(tmp_path_factory.mktemp("generator") / "saved_model")
    export_generator(model, VOCABULARY, path, max_length=32)
    served = subprocess.run([sys.executable, "-c", SERVE, path, json.dumps(CASES)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert served.returncode == 0, served.stderr[-3000:]
    return model, json.loads(served.stdout.strip().splitlines()[-1])


def test_served_text_equals_the_same_computation_in_python(exported):
    model, served = exported
    generate = make_generate_fn(model, VOCABULARY, 32)
    for name, settings in CASES.items():
        result = generate(tf.constant(settings["prompts"]), tf.constant(settings["new"]),
                          tf.constant(settings["temperature"]), tf.constant(settings["top_k"]),
                          tf.constant(settings["top_p"]), tf.constant(settings["seed"]))
        assert served[name]["text"] == [t.decode() for t in result["text"].numpy()], name


def test_served_greedy_text_is_the_greedy_continuation(exported):
    model, served = exported
    for prompt, text in zip(CASES["greedy"]["prompts"], served["greedy"]["text"]):
        ids = [VOCABULARY.index(c) for c in prompt]
        tokens = keras.ops.convert_to_numpy(ka.decoding.generate(
            model, np.array([[2] + ids], "int32"), 32, max_new_tokens=12))[0]
        words = [VOCABULARY[t] for t in tokens[1 + len(ids):] if t >= 4]
        assert text == "".join(words)
        assert len(text) <= 12 and set(text) <= set(VOCABULARY[4:])


def test_long_prompts_are_flagged_and_sampling_follows_the_seed(exported):
    _, served = exported
    assert served["long"]["truncated"] == [True]
    assert served["greedy"]["truncated"] == [False, False, False]
    assert all(len(text) <= 20 for text in served["sampled"]["text"])


def test_bad_vocabularies_are_refused(tmp_path):
    model = ka.models.causal_lm(8, num_layers=1, embed_dim=8, num_heads=2, ffn_dim=8)
    with pytest.raises(ValueError, match="vocabulary"):
        export_generator(model, ["a", "b"], str(tmp_path / "x"), 16)
    with pytest.raises(ValueError, match="split"):
        export_generator(model, VOCABULARY, str(tmp_path / "x"), 16, split="bpe")
