"""keras_attn.checkpoints.load_tokenizer: byte-level BPE (GPT-2, Llama 3, Qwen2), SentencePiece
(Llama 2, Mistral) and WordPiece (BERT) tokenizers as TensorFlow ops encode and decode exactly
as the `tokenizers` library does, and serve from a SavedModel with TensorFlow and
tensorflow-text alone."""

import json
import os
import random
import re
import shutil
import subprocess
import sys

import checkpoint_fixtures as fx
import pytest
import tensorflow as tf
from tokenizers import Tokenizer

from keras_attn.checkpoints import load_tokenizer

# TensorFlow ops whatever the Keras backend: one run is enough.
pytestmark = pytest.mark.tf_only

SAMPLE = [
    "", " ", "  ", "   ", "\n", "\t", "\n\n", " \n \n ", "Hello, world!", "  leading spaces",
    "trailing spaces   ", "multiple   inner    spaces", "x  \n  y", "!\n\n  z",
    "line one\nline two\n\nline four\r\nwindows", "\ttab\tseparated\t",
    "naïve café façade", "e\u0301 combining vs \u00e9 composed", "日本語のテキスト、漢字。",
    "中文：你好，世界！", "emoji 😀🎉 👍🏽 family 👨\u200d👩\u200d👧",
    "nbsp\u00a0here and ideographic\u3000space", "mixed\u00a0\u00a0 \u3000 spaces\u3000",
    "don't I'm we'll THEY'RE it's", "numbers 1234567 3.14 1,000", "punctuation!!! ??? ... ---",
    "Ελληνικά ΟΔΟΣ русский", "ß Straße İstanbul", "\u200bzero width", "a" * 120,
    "<s>hello</s> <unk>", "<|endoftext|>text<|endoftext|>", "<|im_start|>user\nhi<|im_end|>",
    "[CLS] a [SEP] [MASK]", "<|begin_of_text|>Hi<|eot_id|>",
    "The Time Traveller (for so it will be convenient to speak of him) was expounding",
    "a\x00b", "\x00", "x \x00 y\x00\x00z", "<|endoftext|>\x00<s>", "[CLS]\x00 \x00[SEP]",
]
ALPHABET = list(" \n\t\r\u00a0\u3000\u2009abcXYZ019'’.,!?-_éü\u0301日本😀👍🏽\u200b<>|/sS\x00") + [
    "'s", "'T", "  ", "\n\n", "<s>", "</s>", "<|endoftext|>", "[CLS]", "<|im_end|>", "Σ"]
KINDS = ("gpt2", "llama3", "qwen2", "sentencepiece", "sentencepiece_legacy", "wordpiece",
         "wordpiece_cased")


def fuzz(count, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randrange(14)))
            for _ in range(count)]


def assert_like_the_tokenizers_library(directory, texts, random_ids=100):
    # Eagerly: the same ops as in a graph (tracing keras-hub's merge loop takes seconds);
    # the SavedModel test below runs them in graphs.
    reference = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    tokenizer = load_tokenizer(directory)
    ours = tokenizer.encode(tf.constant(texts)).to_list()
    for text, ids in zip(texts, ours):
        assert ids == reference.encode(text).ids, (directory, text)
    rng = random.Random(2)  # every id, invalid byte runs and special tokens included
    batches = [reference.encode(text).ids for text in texts] + [
        [rng.randrange(reference.get_vocab_size()) for _ in range(rng.randrange(1, 9))]
        for _ in range(random_ids)]
    for skip in (True, False):
        texts_back = tokenizer.decode(tf.ragged.constant(batches, tf.int32), skip).numpy()
        for ids, text in zip(batches, texts_back):
            expected = reference.decode(ids, skip_special_tokens=skip)
            assert text.decode("utf-8") == expected, (directory, ids, skip)
    return tokenizer


def test_every_kind_encodes_and_decodes_like_the_tokenizers_library():
    kinds = {}
    for seed, kind in enumerate(KINDS):
        tokenizer = assert_like_the_tokenizers_library(fx.tokenizer_dir(kind),
                                                       SAMPLE + fuzz(150, seed))
        kinds[kind] = tokenizer.kind
    assert kinds == {"gpt2": "byte_level_bpe", "llama3": "byte_level_bpe",
                     "qwen2": "byte_level_bpe", "sentencepiece": "sentencepiece",
                     "sentencepiece_legacy": "sentencepiece", "wordpiece": "wordpiece",
                     "wordpiece_cased": "wordpiece"}


def edited_copy(tmp_path, kind, edit):
    """A copy of tokenizer `kind`'s files with `edit(tokenizer.json dict)` applied."""
    path = tmp_path / kind
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(fx.tokenizer_dir(kind), path)
    with open(path / "tokenizer.json", encoding="utf-8") as file:
        spec = json.load(file)
    edit(spec)
    with open(path / "tokenizer.json", "w", encoding="utf-8") as file:
        json.dump(spec, file)
    return str(path)


def test_metaspace_always_and_vocab_txt_alone(tmp_path):
    def always(spec):
        spec["pre_tokenizer"]["prepend_scheme"] = "always"

    assert_like_the_tokenizers_library(edited_copy(tmp_path, "sentencepiece", always),
                                       SAMPLE + fuzz(60, 11), random_ids=0)
    bare = tmp_path / "vocab_only"
    bare.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(fx.tokenizer_dir("wordpiece"), name), bare)
    texts = SAMPLE + fuzz(60, 12)
    assert load_tokenizer(str(bare)).encode(texts).to_list() == (
        load_tokenizer(fx.tokenizer_dir("wordpiece")).encode(texts).to_list())


def test_special_tokens_and_templates():
    llama3 = load_tokenizer(fx.tokenizer_dir("llama3"))
    reference = Tokenizer.from_file(os.path.join(fx.tokenizer_dir("llama3"), "tokenizer.json"))
    bos, eos = (reference.token_to_id(t) for t in ("<|begin_of_text|>", "<|end_of_text|>"))
    assert (llama3.bos_token_id, llama3.eos_token_id) == (bos, eos)
    assert llama3.encode(["Hi"]).to_list()[0][0] == bos
    assert bos not in llama3.encode(["Hi"], add_special_tokens=False).to_list()[0]
    bert = load_tokenizer(fx.tokenizer_dir("wordpiece"))
    ids = bert.encode(["a"]).to_list()[0]
    assert ids[0] == bert.added["[CLS]"] and ids[-1] == bert.added["[SEP]"]
    assert bert.decode([ids]).numpy()[0] == b"a"
    assert bert.decode([ids], skip_special_tokens=False).numpy()[0] == b"[CLS] a [SEP]"
    assert bert.decode(tf.constant([[ids[1], 10**6, -3]])).numpy()[0] == b"a"  # unknown ids


def test_nul_characters_do_not_end_the_text(tmp_path):
    # tensorflow-text's regex_split and tf.strings.lower stop at NUL: "a\x00b" was GPT-2's [64]
    texts = ["a\x00b", "\x00", "A\x00B c\x00\x00D", "\x00\x00x\x00", "Σ\x00É"]
    for kind in ("gpt2", "llama3", "sentencepiece", "wordpiece"):
        reference = Tokenizer.from_file(os.path.join(fx.tokenizer_dir(kind), "tokenizer.json"))
        ours = load_tokenizer(fx.tokenizer_dir(kind)).encode(texts).to_list()
        assert ours == [e.ids for e in reference.encode_batch(texts)], kind

    def keep_nul(spec):  # BERT's normalizer without clean_text keeps NUL for lowercasing
        spec["normalizer"]["clean_text"] = False

    assert_like_the_tokenizers_library(edited_copy(tmp_path, "wordpiece", keep_nul),
                                       texts + SAMPLE, random_ids=0)


def test_bad_texts_and_ids_are_refused():
    tokenizer = load_tokenizer(fx.tokenizer_dir("gpt2"))
    for texts in ([["hello", "world"]], [[["a"]]], tf.ragged.constant([["a"], ["b", "c"]]),
                  [1, 2], [b"ok", b"\xff\xfe not utf-8"], ["ok", None]):
        with pytest.raises(ValueError, match="`texts`"):
            tokenizer.encode(texts)
    a = tokenizer.encode(["a"], add_special_tokens=False).to_list()[0][0]
    for ids in ([[float(a)]], tf.constant([[a + 0.7]]), [a, a], [[[a]]], [[True]], [["a"]],
                tf.constant([a])):
        with pytest.raises(ValueError, match="`ids`"):
            tokenizer.decode(ids)
    # int64 ids past int32 are outside the vocabulary (dropped), not wrapped onto `a`
    assert tokenizer.decode(tf.constant([[a, 2 ** 32 + a, -(2 ** 32) + a]], tf.int64)).numpy()[
        0] == b"a"
    assert tokenizer.decode([[]]).numpy().tolist() == [b""]
    assert tokenizer.decode([]).numpy().tolist() == []
    with pytest.raises(ValueError, match="`skip_special_tokens`"):
        tokenizer.decode([[a]], skip_special_tokens=tf.constant(True))


def test_wordpiece_without_a_decoder_joins_tokens_with_spaces(tmp_path):
    """`tokenizers` writes `"decoder": null` when none is set; it was refused."""
    directory = edited_copy(tmp_path, "wordpiece", lambda s: s.update(decoder=None))
    reference = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    tokenizer = load_tokenizer(directory)
    for text in SAMPLE:
        assert tokenizer.encode([text]).to_list()[0] == reference.encode(text).ids
    rng = random.Random(7)
    batches = [[rng.randrange(reference.get_vocab_size()) for _ in range(rng.randrange(1, 9))]
               for _ in range(200)]
    for skip in (True, False):
        decoded = [t.decode() for t in tokenizer.decode(
            batches, skip_special_tokens=skip).numpy()]
        assert decoded == reference.decode_batch(batches, skip_special_tokens=skip)


def test_a_bert_checkpoint_without_a_decoder_classifies(tmp_path):
    from keras_attn.tasks import TextClassifier

    path = tmp_path / "bert"
    shutil.copytree(fx.hf_checkpoint("bert_mlm"), path)
    with open(path / "tokenizer.json", encoding="utf-8") as file:
        spec = json.load(file)
    spec["decoder"] = None
    with open(path / "tokenizer.json", "w", encoding="utf-8") as file:
        json.dump(spec, file)
    classifier = TextClassifier.from_pretrained(str(path), num_classes=2, sequence_length=16)
    assert classifier.predict(["a b", "c"], verbose=0).shape == (2, 2)


def test_wordpiece_cleanup_of_tokens_with_spaces(tmp_path):
    # a vocabulary whose tokens hold spaces gets the decoder's cleanup pattern by pattern
    def spaced(spec):
        vocab = spec["model"]["vocab"]
        for old, new in (("##s", "##s ' x"), ("the", "do not"), ("##e", "##e ."), ("of", "of ,")):
            vocab[new] = vocab.pop(old)

    directory = edited_copy(tmp_path, "wordpiece", spaced)
    reference = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    tokenizer = load_tokenizer(directory)
    special = {reference.token_to_id(t) for t in ("##s ' x", "do not", "##e .", "of ,")}
    rng = random.Random(5)
    batches = [[rng.choice(sorted(special)) if rng.random() < 0.4 else
                rng.randrange(reference.get_vocab_size()) for _ in range(rng.randrange(1, 9))]
               for _ in range(200)]
    decoded = [t.decode() for t in tokenizer.decode(batches).numpy()]
    assert decoded == reference.decode_batch(batches)


REFUSALS = [
    ("gpt2", lambda s: s["pre_tokenizer"].update(add_prefix_space=True),
     "pre_tokenizer.add_prefix_space"),
    ("llama3", lambda s: s["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(
        Regex=r"\p{L}+|\s+"), "pre_tokenizer.Split"),
    ("qwen2", lambda s: s.update(normalizer={"type": "NFKC"}), "normalizer"),
    ("gpt2", lambda s: s["model"].update(dropout=0.1), "model.dropout"),
    ("llama3", lambda s: s["added_tokens"][0].update(lstrip=True), "lstrip"),
    ("llama3", lambda s: s.update(post_processor={"type": "RobertaProcessing2"}),
     "post_processor.type"),
    ("sentencepiece", lambda s: s["pre_tokenizer"].update(split=True), "pre_tokenizer"),
    ("sentencepiece_legacy", lambda s: s.update(decoder={"type": "Metaspace"}), "decoder"),
    ("wordpiece", lambda s: s.update(normalizer={"type": "Lowercase"}), "normalizer"),
    ("wordpiece", lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer"),
    ("gpt2", lambda s: s["model"].update(vocab=[["a", 0]]), "model.vocab"),
    ("wordpiece", lambda s: s["model"].update(vocab={"a": "0"}), "model.vocab"),
    ("gpt2", lambda s: s["model"].update(merges={"a": "b"}), "model.merges"),
    ("gpt2", lambda s: s["model"]["merges"].append(["Ġ", "not-a-token"]), "model.merges["),
    ("gpt2", lambda s: s["model"]["merges"].append("a b c"), "model.merges["),
    ("llama3", lambda s: s["added_tokens"].append({"content": "x"}), "added_tokens"),
]


def test_what_cannot_be_reproduced_is_refused(tmp_path):
    for index, (kind, edit, component) in enumerate(REFUSALS):
        with pytest.raises(ValueError, match=f"`[^`]*{re.escape(component)}[^`]*`"):
            load_tokenizer(edited_copy(tmp_path / str(index), kind, edit))


def test_missing_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="`directory`"):
        load_tokenizer(str(tmp_path))
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(os.path.join(fx.tokenizer_dir("sentencepiece"), "tokenizer.model"), lone)
    with pytest.raises(ValueError, match="`tokenizer.json`"):
        load_tokenizer(str(lone))


SERVE = """
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the tensorflow-text ops the graphs use

results = {}
for kind, path in json.loads(sys.argv[1]).items():
    model = tf.saved_model.load(path)
    out = model.signatures["encode"](texts=tf.constant(json.loads(sys.argv[2])))
    text = model.signatures["decode"](values=out["values"], row_splits=out["row_splits"])
    ids = tf.RaggedTensor.from_row_splits(out["values"], out["row_splits"])
    results[kind] = [ids.to_list(), [t.decode() for t in text["output_0"].numpy()]]
libraries = ("keras_hub", "keras_attn", "torch", "transformers", "tokenizers", "sentencepiece")
results["imported"] = sorted({m.split(".")[0] for m in sys.modules} & set(libraries))
print(json.dumps(results))
"""


class Serving(tf.Module):
    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="texts")],
                 autograph=False)
    def encode(self, texts):
        ids = self.tokenizer.encode(texts)
        return {"values": ids.flat_values, "row_splits": ids.row_splits}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32, name="values"),
                                  tf.TensorSpec([None], tf.int64, name="row_splits")],
                 autograph=False)
    def decode(self, values, row_splits):
        return self.tokenizer.decode(tf.RaggedTensor.from_row_splits(values, row_splits))


def test_savedmodels_serve_with_tensorflow_and_tensorflow_text_alone(tmp_path):
    texts = ["Hello  world\n", "日本語 😀 e\u0301", "", "<|endoftext|>x [SEP] </s>"]
    paths, expected = {}, {}
    for kind in ("gpt2", "sentencepiece", "wordpiece"):  # one of each kind
        tokenizer = load_tokenizer(fx.tokenizer_dir(kind))
        ids = tokenizer.encode(texts)  # eager calls first: their traced functions are not saved
        expected[kind] = [ids.to_list(), [t.decode() for t in tokenizer.decode(ids).numpy()]]
        module = Serving(tokenizer)
        paths[kind] = str(tmp_path / kind)
        tf.saved_model.save(module, paths[kind],
                            signatures={"encode": module.encode, "decode": module.decode})
    result = subprocess.run([sys.executable, "-c", SERVE, json.dumps(paths), json.dumps(texts)],
                            capture_output=True, text=True, timeout=300, check=False,
                            cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.splitlines()[-1])
    assert served.pop("imported") == []
    assert served == expected


def test_sentencepiece_decodes_ids_without_byte_tokens():
    tokenizer = load_tokenizer(fx.tokenizer_dir("sentencepiece"))
    ids = tokenizer.encode(["The time machine"])  # no byte-fallback piece among them
    assert all(not token.startswith("<0x") for token in
               (tokenizer.tokens[i] for i in ids.to_list()[0]))
    decoded = tf.function(tokenizer.decode)(ids)
    assert [t.decode() for t in decoded.numpy()] == ["The time machine"]
