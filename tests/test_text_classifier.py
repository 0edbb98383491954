"""`TextClassifierPreprocessor` and `TextClassifier`: the layout `tokenizers` gives (template,
truncation), BERT's outputs as `transformers` computes them on a tiny checkpoint built offline,
`fit` on text in every form, `.keras` and SavedModel round trips, and the refusals."""

import json
import os
import shutil

import checkpoint_fixtures as fx
import keras
import numpy as np
import pytest
from serving import serve
from transformers_reference import transformers_outputs

tf = pytest.importorskip("tensorflow")

from keras_attn.preprocessing import (
    CharacterTokenizer,
    PretrainedTokenizer,
    TextClassifierPreprocessor,
)
from keras_attn.recipes import tiny_bert_checkpoint
from keras_attn.tasks import TextClassifier

ENGLISH = ["The cat sleeps on the mat.", "I like green tea.", "Where is the station?",
           "We walked home in the rain.", "She reads a book every week.",
           "The weather is nice today.", "Open the window, please.", "He is my brother.",
           "They play football on Sundays.", "This soup is too hot."]
FRENCH = ["Le chat dort sur le tapis.", "J'aime le thé vert.", "Où est la gare ?",
          "Nous sommes rentrés sous la pluie.", "Elle lit un livre chaque semaine.",
          "Il fait beau aujourd'hui.", "Ouvre la fenêtre, s'il te plaît.", "C'est mon frère.",
          "Ils jouent au football le dimanche.", "Cette soupe est trop chaude."]
TEXTS = ENGLISH + FRENCH
LABELS = [0] * len(ENGLISH) + [1] * len(FRENCH)
ODD = ["", "A long sentence that the shortest lengths must cut, with many words in it.",
       "Ünïcödé café — naïve façade", "[CLS] already [SEP] inside", "  spaces  "]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return tiny_bert_checkpoint(str(tmp_path_factory.mktemp("tiny") / "bert"), TEXTS * 3,
                                seed=3, vocabulary_size=200, hidden_dim=16, num_heads=4,
                                intermediate_dim=32, max_sequence_length=64,
                                initializer_range=0.2)


def classifier(bert_dir, **kwargs):
    kwargs.setdefault("sequence_length", 24)
    return TextClassifier.from_pretrained(bert_dir, num_classes=2, **kwargs)


# ---- preprocessor --------------------------------------------------------------------------


@pytest.mark.parametrize("sequence_length", [3, 8, 32])
def test_preprocessor_layout_equals_tokenizers_template_and_truncation(bert_dir,
                                                                      sequence_length):
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(os.path.join(bert_dir, "tokenizer.json"))
    reference.enable_truncation(sequence_length)
    pad = reference.token_to_id("[PAD]")
    reference.enable_padding(length=sequence_length, pad_id=pad)
    texts = TEXTS[:3] + ODD
    expected = reference.encode_batch(texts)
    preprocessor = TextClassifierPreprocessor(PretrainedTokenizer(bert_dir), sequence_length)
    x = preprocessor(texts)
    np.testing.assert_array_equal(x["token_ids"].numpy(), [e.ids for e in expected])
    np.testing.assert_array_equal(x["padding_mask"].numpy(),
                                  np.array([e.attention_mask for e in expected], bool))
    np.testing.assert_array_equal(x["segment_ids"].numpy(), 0)
    assert x["token_ids"].dtype == tf.int32 and x["padding_mask"].dtype == tf.bool
    cls, sep = reference.token_to_id("[CLS]"), reference.token_to_id("[SEP]")
    lengths = x["padding_mask"].numpy().sum(axis=1)
    ids = x["token_ids"].numpy()
    assert (ids[:, 0] == cls).all() and (ids[np.arange(len(texts)), lengths - 1] == sep).all()


def test_preprocessor_passes_labels_and_weights_through(bert_dir):
    preprocessor = TextClassifierPreprocessor(PretrainedTokenizer(bert_dir), 8)
    x, y = preprocessor(TEXTS[:2], tf.constant([1, 0]))
    np.testing.assert_array_equal(y.numpy(), [1, 0])
    x, y, w = preprocessor(TEXTS[:2], [1, 0], [0.5, 2.0])
    assert w == [0.5, 2.0] and x["token_ids"].shape == (2, 8)


def test_preprocessor_refusals(bert_dir):
    tokenizer = PretrainedTokenizer(bert_dir)
    with pytest.raises(ValueError, match="sequence_length.*template's 2 ids"):
        TextClassifierPreprocessor(tokenizer, sequence_length=2)
    with pytest.raises(ValueError, match="tokenizer"):
        TextClassifierPreprocessor("bert-base-uncased")
    preprocessor = TextClassifierPreprocessor(tokenizer, 8)
    with pytest.raises(ValueError, match="pairs of texts"):
        preprocessor((["a premise"], ["a hypothesis"]))
    with pytest.raises(ValueError, match="`x`"):
        preprocessor([1, 2])
    with pytest.raises(ValueError, match="`x`"):
        preprocessor(tf.constant([["a", "b"]]))


def test_preprocessor_with_a_character_tokenizer():
    vocabulary = ["", "[UNK]", "<bos>", "<eos>", *"abc "]
    preprocessor = TextClassifierPreprocessor(CharacterTokenizer(vocabulary), 4)
    x = preprocessor(["abcab", "a"])
    np.testing.assert_array_equal(x["token_ids"].numpy(), [[2, 4, 5, 6], [2, 4, 0, 0]])
    np.testing.assert_array_equal(x["padding_mask"].numpy(), [[1, 1, 1, 1], [1, 1, 0, 0]])


# ---- the model ------------------------------------------------------------------------------


def test_backbone_equals_transformers_bert_model(bert_dir, tmp_path):
    texts = TEXTS[:3] + ODD[:3]
    reference = transformers_outputs(bert_dir, "BertModel", texts, str(tmp_path / "out.npz"))
    model = classifier(bert_dir, sequence_length=64)
    assert model.pooling == "pooled_output"
    x = model.preprocessor(texts)
    length = reference["ids"].shape[1]
    np.testing.assert_array_equal(x["token_ids"].numpy()[:, :length], reference["ids"])
    np.testing.assert_array_equal(x["padding_mask"].numpy()[:, :length], reference["mask"])
    outputs = model.backbone({name: value.numpy() for name, value in x.items()})
    pooled = keras.ops.convert_to_numpy(outputs["pooled_output"])
    hidden = keras.ops.convert_to_numpy(outputs["sequence_output"])[:, :length]
    np.testing.assert_allclose(pooled, reference["pooler_output"], atol=2e-5)
    mask = reference["mask"]
    np.testing.assert_allclose(hidden[mask], reference["last_hidden_state"][mask], atol=2e-5)
    assert np.abs(np.diff(pooled, axis=0)).max() > 1e-2  # the texts give different outputs
    # The head reads the pooled output: logits = pooled @ W + b.
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in model.output_dense.weights)
    np.testing.assert_allclose(model.predict(texts, verbose=0), pooled @ kernel + bias,
                               atol=1e-5)


def test_masked_lm_checkpoint_reads_the_first_position():
    model = TextClassifier.from_pretrained(fx.hf_checkpoint("bert_mlm"), num_classes=3,
                                           sequence_length=16)
    assert model.pooling == "first_token"
    assert not any("mlm" in w.path or "head" in w.path for w in model.backbone.weights)
    x = model.preprocessor(TEXTS[:2])
    hidden = keras.ops.convert_to_numpy(model.backbone(
        {name: value.numpy() for name, value in x.items()})["sequence_output"])
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in model.output_dense.weights)
    np.testing.assert_allclose(model.predict(TEXTS[:2], verbose=0),
                               hidden[:, 0] @ kernel + bias, atol=1e-5)


def test_fit_lowers_the_loss_on_a_learnable_task(bert_dir):
    model = classifier(bert_dir)
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    before = model.evaluate(TEXTS, LABELS, verbose=0)
    history = model.fit(TEXTS, LABELS, batch_size=4, epochs=15, verbose=0)
    after = model.evaluate(TEXTS, LABELS, verbose=0)
    # From chance (log 2) to a clear fit; torch's runs vary between 0.1 and 0.6 of it.
    assert after[0] < 0.7 * before[0], (before, after, history.history["loss"])
    logits = model.predict(TEXTS, verbose=0)
    assert logits.shape == (len(TEXTS), 2) and logits.dtype == np.float32
    assert (logits.argmax(axis=1) == LABELS).mean() >= 0.9 and after[1] >= 0.9


def test_every_text_form_gives_the_same_evaluation(bert_dir):
    model = classifier(bert_dir)
    model.compile()
    labels = np.array(LABELS)
    expected = model.evaluate(TEXTS, labels, batch_size=8, verbose=0)
    forms = [
        model.evaluate((TEXTS, LABELS), batch_size=8, verbose=0),
        model.evaluate(x=np.array(TEXTS, dtype=object), y=labels, batch_size=8, verbose=0),
        model.evaluate(tf.data.Dataset.from_tensor_slices((TEXTS, labels)), batch_size=8,
                       verbose=0),
        model.evaluate(tf.data.Dataset.from_tensor_slices((TEXTS, labels)).batch(5),
                       verbose=0),
    ]
    for result in forms:
        np.testing.assert_allclose(result, expected, rtol=1e-5)
    history = model.fit(tf.data.Dataset.from_tensor_slices((TEXTS, labels)).shuffle(20),
                        batch_size=8, epochs=1, verbose=0,
                        validation_data=(TEXTS[:4], LABELS[:4]))
    assert np.isfinite(history.history["val_loss"][0])


def test_compile_defaults_are_keras_hubs(bert_dir):
    model = classifier(bert_dir)
    model.compile()
    assert isinstance(model.optimizer, keras.optimizers.Adam)
    assert np.isclose(float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)), 5e-5)
    assert model.loss.get_config()["from_logits"] is True
    softmax = classifier(bert_dir, activation="softmax")
    softmax.compile()
    assert softmax.loss.get_config()["from_logits"] is False
    np.testing.assert_allclose(softmax.predict(TEXTS[:3], verbose=0).sum(axis=1), 1.0,
                               rtol=1e-5)


def test_save_and_load_give_the_same_predictions(bert_dir, tmp_path):
    model = classifier(bert_dir, dropout=0.2)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    model.fit(TEXTS, LABELS, batch_size=10, epochs=1, verbose=0)
    expected = model.predict(TEXTS, verbose=0)
    path = str(tmp_path / "classifier.keras")
    model.save(path)
    moved = str(tmp_path / "moved")
    shutil.move(bert_dir, moved)  # the tokenizer comes from the file's assets
    try:
        loaded = keras.saving.load_model(path)
    finally:
        shutil.move(moved, bert_dir)
    assert isinstance(loaded, TextClassifier)
    assert (loaded.num_classes, loaded.dropout, loaded.pooling) == (2, 0.2, "pooled_output")
    assert loaded.preprocessor.sequence_length == 24
    np.testing.assert_allclose(loaded.predict(TEXTS, verbose=0), expected, atol=1e-6)
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 2
    loaded.fit(TEXTS, LABELS, batch_size=10, epochs=1, verbose=0)  # training continues


@pytest.mark.tf_only
def test_exported_signature_equals_predict(bert_dir, tmp_path):
    model = classifier(bert_dir)
    texts = TEXTS[::3] + ODD
    expected = model.predict(texts, verbose=0)
    path = model.export(str(tmp_path / "saved_model"))
    served = serve(CLASSIFY, path, json.dumps(texts))
    assert served["imported"] == []
    assert served["dtypes"] == ["float32", "int32"]
    np.testing.assert_allclose(served["logits"], expected, atol=1e-5)
    np.testing.assert_array_equal(served["label"], expected.argmax(axis=1))
    classify = tf.saved_model.load(path).signatures["classify"]
    empty = classify(text=tf.constant([], tf.string))  # an empty batch: empty outputs
    assert (empty["logits"].shape, empty["label"].shape) == ((0, 2), (0,))


@pytest.mark.tf_only
def test_export_never_writes_over_anything(bert_dir, tmp_path):
    model = classifier(bert_dir)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "saved_model.pb").write_bytes(b"an earlier export")
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's file")
    for path in ("", str(earlier), str(mine)):
        with pytest.raises(ValueError, match="argument `filepath`"):
            model.export(path)
    assert sorted(os.listdir(earlier)) == ["saved_model.pb"]
    assert mine.read_text() == "the user's file"
    assert sorted(os.listdir(tmp_path)) == ["earlier", "notes.txt"]
    (tmp_path / "empty").mkdir()
    model.export(str(tmp_path / "empty"))  # an empty directory is written into
    assert (tmp_path / "empty" / "saved_model.pb").is_file()


# Serves `texts` (argv[2]) with the `classify` signature of the SavedModel at argv[1].
CLASSIFY = """
classify = tf.saved_model.load(sys.argv[1]).signatures["classify"]
result = classify(text=tf.constant(json.loads(sys.argv[2]), tf.string))
print(json.dumps({"logits": result["logits"].numpy().tolist(),
                  "label": result["label"].numpy().tolist(),
                  "dtypes": [result["logits"].dtype.name, result["label"].dtype.name],
                  "imported": imported()}))
"""


# ---- refusals -------------------------------------------------------------------------------


def test_bad_arguments_are_named(bert_dir):
    with pytest.raises(ValueError, match="num_classes"):
        TextClassifier.from_pretrained(bert_dir, num_classes=1)
    with pytest.raises(ValueError, match="directory.*BERT.*LlamaForCausalLM"):
        TextClassifier.from_pretrained(fx.hf_checkpoint("llama"), num_classes=2)
    with pytest.raises(ValueError, match="sequence_length.*64 positions"):
        TextClassifier.from_pretrained(bert_dir, num_classes=2, sequence_length=65)
    with pytest.raises(ValueError, match="activation"):
        classifier(bert_dir, activation="relu")
    with pytest.raises(ValueError, match="dropout"):
        classifier(bert_dir, dropout=1.0)
    model = classifier(bert_dir)
    with pytest.raises(ValueError, match="backbone"):
        TextClassifier(model.backbone.get_layer("encoder"), num_classes=2)
    with pytest.raises(ValueError, match="preprocessor"):
        TextClassifier(model.backbone, 2, preprocessor=PretrainedTokenizer(bert_dir))
    too_long = TextClassifierPreprocessor(PretrainedTokenizer(bert_dir), sequence_length=65)
    with pytest.raises(ValueError, match="sequence_length.*64 positions.*=65"):
        TextClassifier(model.backbone, 2, preprocessor=too_long)
    bare = TextClassifier(model.backbone, num_classes=2)
    with pytest.raises(ValueError, match="preprocessor"):
        bare.predict(TEXTS)
    with pytest.raises(ValueError, match="preprocessor"):
        bare.export("unused")


def test_bad_inputs_are_named(bert_dir):
    model = classifier(bert_dir)
    model.compile()
    with pytest.raises(ValueError, match="`x` must be texts"):
        model.fit([1, 2], [0, 1], verbose=0)
    with pytest.raises(ValueError, match="`x` must be texts"):
        model.predict([["nested", "list"]], verbose=0)
    with pytest.raises(ValueError, match=r"`y` must hold class ids in \[0, 2\).*y\[1\]=2"):
        model.fit(TEXTS[:2], [0, 2], verbose=0)
    with pytest.raises(ValueError, match=r"`y` must hold class ids.*y\[0\]=-1"):
        model.evaluate(TEXTS[:2], [-1, 0], verbose=0)
    with pytest.raises(ValueError, match="`y` must be integer class ids"):
        model.fit(TEXTS[:2], [0.0, 1.0], verbose=0)
    with pytest.raises(ValueError, match=r"`y` must be integer class ids, one per text: shape"):
        model.fit(TEXTS[:3], [0, 1], verbose=0)
    with pytest.raises(ValueError, match="`y` must be None"):
        model.fit(tf.data.Dataset.from_tensor_slices(TEXTS), LABELS, verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices((TEXTS[:4], [0, 1, 5, 0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`y` must hold class ids"):
        model.fit(dataset, batch_size=4, verbose=0)
