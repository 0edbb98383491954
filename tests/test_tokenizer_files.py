"""keras_attn.checkpoints.load_tokenizer on the tokenizer files real checkpoints carry beyond
today's `tokenizer.json`: its `truncation` and `padding` sections (applied as the `tokenizers`
library applies them), older files without `model.type`, GPT-2's classic `vocab.json` +
`merges.txt`, and what is not a tokenizer directory at all."""

import json
import os
import random
import shutil
import subprocess
import sys

import checkpoint_fixtures as fx
import pytest
import tensorflow as tf
from test_checkpoint_tokenizers import (
    SAMPLE,
    assert_like_the_tokenizers_library,
    edited_copy,
)
from tokenizers import Tokenizer

from keras_attn.checkpoints import load_tokenizer

pytestmark = pytest.mark.tf_only

TEXTS = SAMPLE + ["the time traveller " * 30, "a\x00b", "x" * 400]


def reference_of(directory):
    return Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))


# kind, truncation, padding: as real files carry them (50 tokens in a GPT-2 file; 256 and
# padding in a Llama 2 file) and the other directions and strategies
SECTIONS = [
    ("gpt2", {"direction": "Right", "max_length": 50, "strategy": "LongestFirst", "stride": 0},
     None),
    ("sentencepiece_legacy", None, {"strategy": {"Fixed": 256}, "direction": "Right",
                                    "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
                                    "pad_token": "<unk>"}),
    ("sentencepiece", {"direction": "Right", "max_length": 256, "strategy": "LongestFirst",
                       "stride": 0},
     {"strategy": "BatchLongest", "direction": "Left", "pad_to_multiple_of": None, "pad_id": 2,
      "pad_type_id": 0, "pad_token": "</s>"}),
    ("wordpiece", {"direction": "Left", "max_length": 7, "strategy": "OnlyFirst", "stride": 2},
     {"strategy": {"Fixed": 12}, "direction": "Right", "pad_to_multiple_of": 5, "pad_id": 0,
      "pad_type_id": 0, "pad_token": "[PAD]"}),
    ("llama3", {"direction": "Right", "max_length": 1, "strategy": "LongestFirst", "stride": 0},
     {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": 8, "pad_id": 5,
      "pad_type_id": 0, "pad_token": "x"}),
    ("wordpiece_cased", {"direction": "Right", "max_length": 1, "strategy": "LongestFirst",
                         "stride": 0}, None),  # below the template's 2: no truncation
]


@pytest.mark.parametrize("kind, truncation, padding", SECTIONS)
def test_truncation_and_padding_sections_apply_as_in_tokenizers(tmp_path, kind, truncation,
                                                                 padding):
    directory = edited_copy(tmp_path, kind, lambda spec: spec.update(truncation=truncation,
                                                                     padding=padding))
    reference, tokenizer = reference_of(directory), load_tokenizer(directory)
    assert (tokenizer.truncation is None) == (truncation is None)
    assert (tokenizer.padding is None) == (padding is None)
    for special in (True, False):
        ours = tokenizer.encode(TEXTS, add_special_tokens=special).to_list()
        expected = [e.ids for e in reference.encode_batch(TEXTS, add_special_tokens=special)]
        assert ours == expected, special
    reference.no_truncation()
    reference.no_padding()
    whole = tokenizer.encode(TEXTS, truncate=False, pad=False).to_list()
    assert whole == [e.ids for e in reference.encode_batch(TEXTS)]
    assert tokenizer.encode([]).to_list() == []


@pytest.mark.parametrize("section, value, key", [
    ("truncation", {"max_length": 5, "strategy": "OnlySecond"}, "truncation.strategy"),
    ("truncation", {"max_length": 5, "stride": 3}, "truncation.stride"),  # 5 - 2 specials
    ("truncation", {"max_length": -1}, "truncation.max_length"),
    ("truncation", {"max_length": 5, "direction": "Up"}, "truncation.direction"),
    ("padding", {"strategy": {"Fixed": "256"}}, "padding.strategy.Fixed"),
    ("padding", {"strategy": "Longest"}, "padding.strategy"),
    ("padding", {"pad_id": 1.5}, "padding.pad_id"),
    ("padding", [256], "padding"),
])
def test_sections_that_tokenizers_would_fail_on_are_refused(tmp_path, section, value, key):
    directory = edited_copy(tmp_path, "wordpiece", lambda spec: spec.update({section: value}))
    with pytest.raises(ValueError, match=f"`{key}`"):
        load_tokenizer(directory)


def drop_model_type(spec):
    del spec["model"]["type"]


@pytest.mark.parametrize("kind", ["gpt2", "qwen2", "sentencepiece", "wordpiece"])
def test_files_without_model_type_load_as_in_tokenizers(tmp_path, kind):
    directory = edited_copy(tmp_path, kind, drop_model_type)
    with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as file:
        assert "type" not in json.load(file)["model"]
    assert_like_the_tokenizers_library(directory, TEXTS, random_ids=20)


@pytest.mark.parametrize("model, inferred", [
    ({"vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"}, "WordLevel"),
    ({"vocab": [["a", 0.0]]}, "Unigram"),
    ({"vocab": {"a": 0}}, "None"),  # `tokenizers` cannot read it either
])
def test_files_without_model_type_that_are_not_supported_are_refused(tmp_path, model,
                                                                     inferred):
    directory = edited_copy(tmp_path, "wordpiece", lambda spec: spec.update(model=model))
    with pytest.raises(ValueError, match=f"`model.type`={inferred!r}"
                       if inferred != "None" else "`model.type`=None"):
        load_tokenizer(directory)


def classic_gpt2(tmp_path, config=None):
    """GPT-2's classic layout: `vocab.json` and `merges.txt` (and optionally a
    `tokenizer_config.json`), no `tokenizer.json`."""
    path = tmp_path / "classic"
    path.mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(fx.tokenizer_dir("gpt2"), name), path)
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    return str(path)


def test_classic_gpt2_layout_loads_as_its_tokenizer_json(tmp_path):
    # transformers' GPT2Tokenizer reads vocab.json + merges.txt as the fixture's
    # tokenizer.json: the same BPE, ByteLevel pre-tokenizer and decoder, <|endoftext|> special
    # (test_classic_gpt2_layout_matches_transformers checks it against transformers)
    reference = reference_of(fx.tokenizer_dir("gpt2"))
    tokenizer = load_tokenizer(classic_gpt2(tmp_path))
    texts = TEXTS + ["<|endoftext|>Hi<|endoftext|>"]
    assert tokenizer.encode(texts).to_list() == [e.ids for e in reference.encode_batch(texts)]
    eos = reference.token_to_id("<|endoftext|>")
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (eos, eos)
    ids = [reference.encode(text).ids + [eos] for text in texts]
    for skip in (True, False):
        decoded = [t.decode() for t in tokenizer.decode(ids, skip).numpy()]
        assert decoded == reference.decode_batch(ids, skip_special_tokens=skip)


def test_classic_gpt2_layout_options(tmp_path):
    reference = reference_of(fx.tokenizer_dir("gpt2"))
    eos = reference.token_to_id("<|endoftext|>")
    tokenizer = load_tokenizer(classic_gpt2(tmp_path, {"tokenizer_class": "GPT2Tokenizer",
                                                       "add_bos_token": True}))
    assert tokenizer.encode(["Hi"]).to_list() == [[eos] + reference.encode("Hi").ids]
    for config, key in (({"add_prefix_space": True}, "add_prefix_space"),
                        ({"tokenizer_class": "RobertaTokenizer"}, "tokenizer_class"),
                        ({"eos_token": "</s>"}, "vocab.json")):
        with pytest.raises(ValueError, match=key):
            load_tokenizer(classic_gpt2(tmp_path / key, config))
    broken = classic_gpt2(tmp_path / "broken")
    with open(os.path.join(broken, "merges.txt"), "a", encoding="utf-8") as file:
        file.write("a b c\n")
    with pytest.raises(ValueError, match="merges.txt line"):
        load_tokenizer(broken)


TRANSFORMERS = """
import json, sys
from transformers import GPT2Tokenizer
tokenizer = GPT2Tokenizer.from_pretrained(sys.argv[1])
texts = json.loads(sys.argv[2])
ids = [tokenizer(text)["input_ids"] for text in texts]
print(json.dumps([ids, [tokenizer.decode(i, skip_special_tokens=True) for i in ids]]))
"""


def test_classic_gpt2_layout_matches_transformers(tmp_path):
    directory = classic_gpt2(tmp_path)
    rng = random.Random(4)
    texts = TEXTS + ["".join(rng.choice("ab c\n日😀'sT") for _ in range(20)) for _ in range(50)]
    result = subprocess.run([sys.executable, "-c", TRANSFORMERS, directory, json.dumps(texts)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    ids, decoded = json.loads(result.stdout.splitlines()[-1])
    tokenizer = load_tokenizer(directory)
    assert tokenizer.encode(texts).to_list() == ids
    assert [t.decode() for t in tokenizer.decode(ids).numpy()] == decoded


def test_an_empty_added_token_is_skipped_as_in_tokenizers(tmp_path):
    def empty(spec):  # (an empty alternative in the added-token regex matched everywhere)
        spec["added_tokens"].append({"id": 5, "content": "", "single_word": False,
                                     "lstrip": False, "rstrip": False, "normalized": False,
                                     "special": True})

    assert_like_the_tokenizers_library(edited_copy(tmp_path, "gpt2", empty), TEXTS + ["%a"])


def test_what_is_not_a_tokenizer_directory_is_refused(tmp_path):
    for directory in (str(tmp_path / "missing"), None, 3):
        with pytest.raises(ValueError, match="`directory`"):
            load_tokenizer(directory)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match=f"directory={str(afile)!r}"):
        load_tokenizer(str(afile))
    for content, message in ((b"{not json", "not UTF-8 JSON"), (b"\xff\xfe", "not UTF-8 JSON"),
                             (b"[1, 2]", "must hold a JSON object")):
        path = tmp_path / f"bad{len(content)}"
        path.mkdir()
        (path / "tokenizer.json").write_bytes(content)
        with pytest.raises(ValueError, match=message):
            load_tokenizer(str(path))


def test_sections_and_checks_hold_inside_a_graph(tmp_path):
    directory = edited_copy(tmp_path, "gpt2", lambda spec: spec.update(truncation={
        "direction": "Left", "max_length": 3, "strategy": "LongestFirst", "stride": 0}))
    tokenizer = load_tokenizer(directory)
    encode = tf.function(tokenizer.encode, input_signature=[tf.TensorSpec([None], tf.string)])
    texts = ["Hello, world! And more.", "a\x00b"]
    assert encode(tf.constant(texts)).to_list() == [
        e.ids for e in reference_of(directory).encode_batch(texts)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="valid UTF-8"):
        encode(tf.constant([b"ok", b"\xff bad"]))
