"""keras_attn.recipes.tiny_checkpoints: checkpoint directories written without torch load in
keras_attn and in transformers with the same numbers (BERT's hidden states are compared in
test_text_classifier.py), a seed gives the same weights, and bad arguments write nothing."""

import json
import os

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file
from transformers_reference import transformers_outputs

pytest.importorskip("tensorflow")

from keras_attn.checkpoints import from_pretrained
from keras_attn.recipes import tiny_bert_checkpoint, tiny_llama_checkpoint

TEXTS = [
    "The Time Traveller (for so it will be convenient to speak of him) was expounding.",
    "His grey eyes shone and twinkled, and his usually pale face was flushed and animated.",
    "Où est la gare ? Elle est à côté du café.",
    "Numbers 12345 and 3.14159; don't stop!",
] * 5


def test_llama_checkpoint_equals_transformers(tmp_path):
    directory = tiny_llama_checkpoint(str(tmp_path / "llama"), TEXTS, seed=1,
                                      vocabulary_size=300, hidden_dim=32, num_heads=4,
                                      num_key_value_heads=2, intermediate_dim=48,
                                      initializer_range=0.2)
    texts = TEXTS[:4]
    reference = transformers_outputs(directory, "AutoModelForCausalLM", texts,
                                     str(tmp_path / "out.npz"))
    model, tokenizer, spec = from_pretrained(directory)
    assert (spec.source, spec.bos_token_id, spec.eos_token_ids) == ("LlamaForCausalLM", 0, (1,))
    rows = tokenizer.encode(texts).to_list()
    assert rows == [list(row[mask]) for row, mask in zip(reference["ids"], reference["mask"])]
    assert all(row[0] == 0 for row in rows)  # the template's <|begin_of_text|>
    logits = keras.ops.convert_to_numpy(model({"token_ids": reference["ids"].astype("int32"),
                                               "padding_mask": reference["mask"]}))
    mask = reference["mask"]
    assert logits.shape[-1] == 300  # the trained vocabulary
    np.testing.assert_allclose(logits[mask], reference["logits"][mask], atol=1e-4)
    assert logits[mask].std() > 0.1  # large enough weights that a wrong layout would show
    decoded = tokenizer.decode(tokenizer.encode(texts)).numpy()
    assert [t.decode() for t in decoded] == texts


def test_bert_checkpoint_files(tmp_path):
    directory = tiny_bert_checkpoint(str(tmp_path / "bert"), TEXTS, vocabulary_size=150,
                                     hidden_dim=16, num_heads=2, intermediate_dim=24,
                                     max_sequence_length=40)
    with open(os.path.join(directory, "config.json")) as file:
        config = json.load(file)
    with open(os.path.join(directory, "vocab.txt")) as file:
        vocab = file.read().splitlines()
    assert config["vocab_size"] == len(vocab) == 150
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    weights = load_file(os.path.join(directory, "model.safetensors"))
    assert weights["encoder.layer.0.intermediate.dense.weight"].shape == (24, 16)  # (out, in)
    assert weights["embeddings.position_embeddings.weight"].shape == (40, 16)
    np.testing.assert_array_equal(weights["embeddings.word_embeddings.weight"][0], 0.0)
    model, tokenizer, spec = from_pretrained(directory)
    assert (spec.source, spec.num_heads, spec.pooler) == ("BertModel", 2, True)
    assert model.output["pooled_output"].shape == (None, 16)
    assert tokenizer.encode(["Où est la gare ?"]).to_list()[0][0] == vocab.index("[CLS]")


def test_a_seed_gives_the_same_weights(tmp_path):
    def weights(name, seed):
        directory = tiny_llama_checkpoint(str(tmp_path / name), TEXTS[:4], seed=seed,
                                          vocabulary_size=270, hidden_dim=8, num_heads=2,
                                          num_key_value_heads=1, intermediate_dim=8,
                                          num_layers=1)
        return load_file(os.path.join(directory, "model.safetensors"))

    first, again, other = weights("a", 5), weights("b", 5), weights("c", 6)
    assert sorted(first) == sorted(again) == sorted(other)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(first["lm_head.weight"], other["lm_head.weight"])


@pytest.mark.parametrize("kwargs, match", [
    ({"texts": []}, "texts"),
    ({"texts": "one string"}, "texts"),
    ({"texts": ["ok", 3]}, "texts"),
    ({"num_heads": 3}, "num_heads"),
    ({"num_heads": 8}, "num_heads.*even"),  # heads of 4: rotary pairs need an even size
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"vocabulary_size": 200}, "vocabulary_size.*258"),
    ({"hidden_dim": 0}, "hidden_dim"),
    ({"seed": -1}, "seed"),
    ({"rope_theta": 0.0}, "rope_theta"),
])
def test_llama_refusals_write_nothing(tmp_path, kwargs, match):
    arguments = {"texts": TEXTS, "hidden_dim": 24, "num_heads": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        tiny_llama_checkpoint(str(tmp_path / "new"), **arguments)
    assert not (tmp_path / "new").exists()


def test_existing_files_are_kept(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="directory.*notes.txt.*overwrite"):
        tiny_bert_checkpoint(str(tmp_path), TEXTS)
    with pytest.raises(ValueError, match="directory.*is a file"):
        tiny_bert_checkpoint(str(tmp_path / "notes.txt"), TEXTS)
    with pytest.raises(ValueError, match="num_heads.*hidden_dim"):
        tiny_bert_checkpoint(str(tmp_path / "bert"), TEXTS, hidden_dim=10, num_heads=4)
    with pytest.raises(ValueError, match="dropout"):
        tiny_bert_checkpoint(str(tmp_path / "bert"), TEXTS, dropout=1.0)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    tiny_bert_checkpoint(str(tmp_path), TEXTS, overwrite=True, vocabulary_size=100)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "model.safetensors").is_file()
