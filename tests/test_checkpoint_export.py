"""A pretrained checkpoint's `generate` SavedModel: strings in, the checkpoint's tokenizer and
ids inside the graph, served by TensorFlow with tensorflow-text's op libraries, with neither
Keras nor keras_attn, and equal to the same generation in Python."""

import json
import subprocess
import sys

import checkpoint_fixtures as fx
import keras
import numpy as np
import pytest
from export_utils import check_never_writes_over_anything

pytestmark = pytest.mark.tf_only
tf = pytest.importorskip("tensorflow")

from keras_attn import decoding
from keras_attn.checkpoints import from_pretrained, generation_ids
from keras_attn.export_generator import (
    checkpoint_preprocessor,
    export_checkpoint_generator,
    make_generate_fn,
)

# tensorflow-text's package imports tf.keras; its op libraries alone are what the graph needs.
SERVE = """
import glob, importlib.util, json, os, sys
sys.modules["keras"] = None
sys.modules["keras_attn"] = None
import tensorflow as tf
ops = os.path.join(importlib.util.find_spec("tensorflow_text").submodule_search_locations[0],
                   "python", "ops")
for library in sorted(glob.glob(os.path.join(ops, "*.so"))):
    tf.load_op_library(library)
generator = tf.saved_model.load(sys.argv[1])
result = generator.signatures["generate"](
    prompt=tf.constant(json.loads(sys.argv[2])), max_new_tokens=tf.constant(10),
    temperature=tf.constant(0.0), top_k=tf.constant(0), top_p=tf.constant(1.0),
    seed=tf.constant(0))
print(json.dumps({"text": [t.decode() for t in result["text"].numpy()],
                  "context": [t.decode() for t in result["context"].numpy()],
                  "truncated": result["truncated"].numpy().tolist(),
                  "imported": sorted({m.split(".")[0] for m, v in sys.modules.items() if v} & {
                      "keras", "keras_attn", "keras_hub", "torch", "transformers"})}))
"""
PROMPTS = ["The Time Traveller", "", "Ünïcödé  café, 日本語"]


def python_generation(model, tokenizer, spec, prompt: str, max_new_tokens: int) -> str:
    """Greedy generation of one prompt in Python: encode, generate, cut at the end, decode."""
    ids = generation_ids(spec)
    prompt_ids = np.array(tokenizer.encode([prompt]).to_list(), "int32")  # (1, P)
    length = prompt_ids.shape[1]
    tokens = keras.ops.convert_to_numpy(decoding.generate(
        model, prompt_ids, max_length=length + max_new_tokens, **ids,
        prompt_lengths=np.array([length], "int32")))
    new = []
    for token in tokens[0, length:]:
        if token in np.atleast_1d(ids["stop_token_ids"]):
            break
        new.append(int(token))
    return tokenizer.decode([new]).numpy()[0].decode()


def test_served_checkpoint_generator_equals_python(tmp_path):
    model, tokenizer, spec = from_pretrained(fx.hf_checkpoint("llama"), dtype="float32")
    path = export_checkpoint_generator(model, tokenizer, spec, str(tmp_path / "llama"),
                                       max_length=32)
    served = subprocess.run([sys.executable, "-c", SERVE, path, json.dumps(PROMPTS)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert served.returncode == 0, served.stderr[-3000:]
    served = json.loads(served.stdout.strip().splitlines()[-1])
    assert served["imported"] == []
    assert served["truncated"] == [False] * 3
    assert served["context"] == PROMPTS  # the prompt as read, <s> dropped from the text
    expected = [python_generation(model, tokenizer, spec, p, 10) for p in PROMPTS]
    assert served["text"] == expected
    assert all(expected)  # a random model's ten tokens are never all special


def test_export_refusals(tmp_path):
    model, tokenizer, spec = from_pretrained(fx.hf_checkpoint("llama"), dtype="float32")
    with pytest.raises(ValueError, match="max_length"):
        export_checkpoint_generator(model, tokenizer, spec, str(tmp_path / "a"), max_length=3)
    bert, bert_tokenizer, bert_spec = from_pretrained(fx.hf_checkpoint("bert_mlm"))
    with pytest.raises(ValueError, match="causal language model"):
        export_checkpoint_generator(bert, bert_tokenizer, bert_spec, str(tmp_path / "b"), 32)
    with pytest.raises(ValueError, match="argument `spec`"):  # was an AttributeError
        export_checkpoint_generator(model, tokenizer, None, str(tmp_path / "c"), 32)
    for bad in (None, "tokenizer.json"):  # was an AttributeError on vocab_size
        with pytest.raises(ValueError, match=f"Argument `tokenizer`.*tokenizer={bad!r}"):
            export_checkpoint_generator(model, bad, spec, str(tmp_path / "d"), 32)
    assert not any(tmp_path.iterdir())
    check_never_writes_over_anything(
        lambda path: export_checkpoint_generator(model, tokenizer, spec, path, 32), tmp_path)


def test_an_empty_batch_of_prompts_gets_empty_outputs():
    """The exported `generate` failed in ArgMax on an empty batch."""
    model, tokenizer, spec = from_pretrained(fx.hf_checkpoint("gpt2"), dtype="float32")
    generate = tf.function(make_generate_fn(model, checkpoint_preprocessor(tokenizer, spec), 16))
    settings = (tf.constant(4), tf.constant(0.0), tf.constant(0), tf.constant(1.0),
                tf.constant(0))
    out = generate(tf.constant([], tf.string), *settings)
    assert {name: value.shape.as_list() for name, value in out.items()} == {
        "text": [0], "truncated": [0], "context": [0]}
    one = generate(tf.constant(["The Time"]), *settings)  # and a batch is as before
    assert one["text"].shape == (1,) and one["context"].numpy().tolist() == [b"The Time"]
