"""`CausalLM.export(path, format="onnx" | "litert")` and `Seq2SeqLM.export(path,
format="onnx")`: the forward pass (or the encoder) and the one-token decode step over the
static cache, run by `keras_attn.export_steps.greedy` (NumPy and the format's runtime only),
give `generate`'s greedy tokens, token for token; `export.json` says what the loop needs; what
cannot be exported is a ValueError naming `format`.

One model per task and one export per format, shared by the module; the LiteRT and
sequence-to-sequence exports are `slow` (each conversion takes seconds)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_attn as ka
from keras_attn import export_steps
from keras_attn.preprocessing import CausalLMPreprocessor, CharacterTokenizer
from keras_attn.tasks import CausalLM
from keras_attn.tokens import RESERVED_TOKENS

BACKEND = keras.backend.backend()
TEXTS = ["the time traveller smiled", "it was a strange thing"]
MAX_LENGTH = 16
RUNTIME = {"onnx": ("onnxruntime", "tf2onnx"), "litert": ("ai_edge_litert",)}


def _needs(format: str) -> None:
    for package in RUNTIME[format]:
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (pip install -e '.[export]')")


@pytest.fixture(scope="module")
def lm():
    vocabulary = list(RESERVED_TOKENS) + sorted(set("".join(TEXTS)))
    model = ka.models.causal_lm(len(vocabulary), num_layers=1, hidden_dim=16, num_heads=2,
                                intermediate_dim=32, seed=3)
    tokenizer = CharacterTokenizer(vocabulary, lowercase=True)
    return CausalLM(model, CausalLMPreprocessor(tokenizer, sequence_length=MAX_LENGTH))


@pytest.fixture(scope="module")
def prompts(lm):
    """Right-padded prompts of two lengths, as the preprocessor makes them."""
    return lm.preprocessor.generate_preprocess(["the t", "it was a"], MAX_LENGTH, None)[
        "token_ids"].numpy()


@pytest.fixture(scope="module")
def exported(lm, tmp_path_factory):
    """format -> the export directory of `lm` (made on first use)."""
    folders = {}

    def get(format):
        _needs(format)
        if format not in folders:
            folders[format] = lm.export(str(tmp_path_factory.mktemp(format) / "lm"),
                                        format=format)
        return folders[format]

    return get


tf_only = pytest.mark.skipif(BACKEND != "tensorflow",
                             reason="the decode step is converted from a TensorFlow graph")


# LiteRT's converter and the sequence-to-sequence export take about 10 s each: `slow`.
FORMATS = ["onnx", pytest.param("litert", marks=pytest.mark.slow)]


@tf_only
@pytest.mark.parametrize("format", FORMATS)
def test_greedy_tokens_equal_generate(lm, prompts, exported, format):
    path = exported(format)
    loaded = export_steps.load(path)
    for new in (3, None):
        expected = keras.ops.convert_to_numpy(lm.generate(prompts, max_length=MAX_LENGTH,
                                                          max_new_tokens=new))
        np.testing.assert_array_equal(export_steps.greedy(path, prompts, new, loaded),
                                      expected)
    # A stop id the model emits: rows end at different steps and are filled after it.
    meta, runners = loaded
    stop = int(expected[1, prompts.shape[1] + 1])
    expected = keras.ops.convert_to_numpy(lm.generate(prompts, max_length=MAX_LENGTH,
                                                      stop_token_ids=stop))
    assert (expected == meta["fill_id"]).any()
    got = export_steps.greedy(path, prompts, None, ({**meta, "stop_token_ids": [stop]},
                                                    runners))
    np.testing.assert_array_equal(got, expected)


@tf_only
def test_the_onnx_text_equals_generate(lm, exported):
    prompt = "it was"
    ids = lm.preprocessor.generate_preprocess([prompt], MAX_LENGTH, None)
    tokens = export_steps.greedy(exported("onnx"), ids["token_ids"].numpy())
    lengths = ids["lengths"]
    text = lm.preprocessor.generate_postprocess(tokens, lengths, lengths + MAX_LENGTH)
    assert text.numpy()[0].decode("utf-8") == lm.generate(prompt, strip_prompt=True)


@tf_only
@pytest.mark.parametrize("format", FORMATS)
def test_the_forward_pass_equals_predict(lm, exported, format):
    path = exported(format)
    with open(os.path.join(path, "export.json")) as f:
        meta = json.load(f)
    ids = np.zeros((2, MAX_LENGTH), "int32")
    ids[0, :5], ids[1, :9] = [2, 5, 6, 7, 8], range(2, 11)
    inputs = {"token_ids": ids, "padding_mask": ids != 0}
    expected = lm.predict(inputs, verbose=0)
    forward = export_steps.Runner(os.path.join(path, meta["files"]["forward"]), format)
    np.testing.assert_allclose(forward(inputs)["logits"], expected, atol=1e-4)
    if format == "onnx":  # dynamic batch and length
        short = {name: value[:1, :7] for name, value in inputs.items()}
        np.testing.assert_allclose(forward(short)["logits"], lm.predict(short, verbose=0),
                                   atol=1e-4)


@tf_only
def test_export_json_says_what_the_loop_needs(lm, exported):
    path = exported("onnx")
    with open(os.path.join(path, "export.json")) as f:
        meta = json.load(f)
    assert sorted(os.listdir(path)) == ["decode_step.onnx", "export.json", "forward.onnx"]
    assert meta["task"] == "causal_lm" and meta["format"] == "onnx"
    assert meta["max_length"] == MAX_LENGTH
    assert meta["stop_token_ids"] == [3] and meta["pad_id"] == 0 and meta["fill_id"] == 0
    assert meta["suppressed_ids"] == [0, 2]
    assert meta["vocabulary_size"] == len(lm.preprocessor.tokenizer.vocabulary)
    block = lm.backbone.blocks[0].self_attention
    assert [s["shape"] for s in meta["state"]] == [
        [-1, block.num_key_value_heads, MAX_LENGTH, block.key_dim],
        [-1, block.num_key_value_heads, MAX_LENGTH, block.value_dim]]
    import onnxruntime

    session = onnxruntime.InferenceSession(os.path.join(path, "decode_step.onnx"),
                                           providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == meta["decode_step"]["inputs"]
    assert sorted(o.name for o in session.get_outputs()) == sorted(
        meta["decode_step"]["outputs"])


@tf_only
def test_the_loop_needs_neither_keras_nor_tensorflow(lm, prompts, exported):
    path = exported("onnx")
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('export_steps', {export_steps.__file__!r})\n"
        "steps = importlib.util.module_from_spec(spec); spec.loader.exec_module(steps)\n"
        f"print(steps.greedy({path!r}, {prompts.tolist()!r}).tolist())\n"
        "print(sorted(m for m in ('keras', 'tensorflow', 'keras_attn') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True, timeout=60)
    tokens, imported = result.stdout.strip().splitlines()[-2:]
    assert imported == "[]"
    expected = keras.ops.convert_to_numpy(lm.generate(prompts, max_length=MAX_LENGTH))
    assert tokens == str(expected.tolist())


@tf_only
@pytest.mark.slow
def test_the_seq2seq_translation_equals_translate(tmp_path):
    _needs("onnx")
    from keras_attn.data.dates import load_dates_translation
    from keras_attn.preprocessing import Seq2SeqLMPreprocessor
    from keras_attn.tasks import Seq2SeqLM

    data = load_dates_translation(num_examples=100)
    model = ka.models.transformer_seq2seq(data.source_vocab_size, data.target_vocab_size,
                                          num_layers=1, hidden_dim=16, num_heads=2,
                                          intermediate_dim=32, seed=3)
    translator = Seq2SeqLM(model, Seq2SeqLMPreprocessor.from_data(data))
    path = translator.export(str(tmp_path / "translator"), format="onnx")
    assert sorted(os.listdir(path)) == ["decode_step.onnx", "encoder.onnx", "export.json"]
    sources = ["march 3rd, 2021", "3/3/21", "the 1st of june, 1989"]
    ids = translator.preprocessor.encode_source(sources).numpy()
    tokens = export_steps.greedy(path, ids)
    np.testing.assert_array_equal(tokens, keras.ops.convert_to_numpy(translator.generate(ids)))
    texts = translator.preprocessor.decode(tokens)
    assert texts == translator.translate(sources) and len(set(texts)) > 1
    assert tokens.shape == (3, data.target_length)


@pytest.mark.parametrize("format", ["onnx", "litert"])
def test_other_backends_are_refused_by_format(lm, tmp_path, format):
    if BACKEND == "tensorflow":
        pytest.skip("TensorFlow exports these")
    with pytest.raises(ValueError, match=f"format='{format}'.*{BACKEND}"):
        lm.export(str(tmp_path / "lm"), format=format)


def test_an_unknown_format_is_refused(lm, tmp_path):
    with pytest.raises(ValueError, match="`format`.*'openvino'"):
        lm.export(str(tmp_path / "lm"), format="openvino")
    assert not os.path.exists(tmp_path / "lm")


@tf_only
def test_what_cannot_be_exported_is_named(lm, exported, tmp_path):
    bare = CausalLM(lm.backbone)
    with pytest.raises(ValueError, match="max_length"):
        bare.export(str(tmp_path / "a"), format="onnx")
    with pytest.raises(ValueError, match="path"):
        export_steps.greedy(str(tmp_path), [[2, 5]])  # no export.json
    with pytest.raises(ValueError, match="token_ids"):
        export_steps.greedy(str(tmp_path), np.zeros((2,), "int32"),
                            runners=({"max_length": 4}, {}))
    for prompts, row in (([[2, 5], [0, 0]], 1), ([[2, 0, 5]], 0)):  # all padding, not right
        with pytest.raises(ValueError, match=f"token_ids.*row {row}"):
            export_steps.greedy(exported("onnx"), np.array(prompts, "int32"))


@pytest.mark.parametrize("offset", [0, 2, 3])
def test_gathered_cache_writes_equal_the_slice_update(offset):
    from keras_attn.layers.cache import _gathered_write

    rng = np.random.default_rng(0)
    cache = rng.normal(size=(2, 2, 6, 4)).astype("float32")
    new = rng.normal(size=(2, 2, 3, 4)).astype("float32")
    expected = cache.copy()
    expected[:, :, offset:offset + 3] = new
    got = _gathered_write(keras.ops.convert_to_tensor(cache), keras.ops.convert_to_tensor(new),
                          keras.ops.convert_to_tensor(offset, "int32"))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), expected)


@tf_only
def test_what_a_seq2seq_export_cannot_take_is_named(tmp_path):
    from keras_attn.tasks import Seq2SeqLM

    translator = Seq2SeqLM(ka.models.transformer_seq2seq(20, 20, num_layers=1, hidden_dim=16,
                                                         num_heads=2, intermediate_dim=32))
    for kwargs, match in (({"format": "litert"}, "`format`.*'litert'"),
                          ({"format": "onnx"}, "max_length"),
                          ({"format": "onnx", "max_length": 8, "beam_size": 4}, "beam_size")):
        with pytest.raises(ValueError, match=match):
            translator.export(str(tmp_path / "translator"), **kwargs)
    assert not os.path.exists(tmp_path / "translator")
