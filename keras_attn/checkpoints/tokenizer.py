"""A checkpoint's tokenizer, encoding and decoding as the `tokenizers` library does, in a TF graph.

`load_tokenizer(directory)` reads the tokenizer files of a Hugging Face checkpoint and returns a
`CheckpointTokenizer`, a `tf.Module` whose `encode` (strings -> ragged int32 ids) and `decode`
(ids -> strings) are TensorFlow ops, so they run inside a `tf.function`, a `tf.data` pipeline
and an exported SavedModel:

| files | kind | implemented with |
|---|---|---|
| `tokenizer.json` with a `ByteLevel` BPE (GPT-2, Llama 3, Qwen2), or `vocab.json` + `merges.txt` (GPT-2) | `"byte_level_bpe"` | `tokenizer_merges.BytePairMerger` (merges in parallel rounds), TF string ops |
| `tokenizer.model` + `tokenizer.json` (Llama 2, Mistral) | `"sentencepiece"` | tensorflow-text's `SentencepieceTokenizer`, TF string ops |
| `tokenizer.json` with `WordPiece`, or `vocab.txt` + `tokenizer_config.json` (BERT) | `"wordpiece"` | tensorflow-text's `FastWordpieceTokenizer`, TF string ops |

Every step the `tokenizers` library takes is reproduced, not approximated: added (special)
tokens split out first, then per segment the normalizer (NFC, BERT's), the pre-tokenizer (GPT-2,
Llama 3 and Qwen2 split regexes, BERT's whitespace and punctuation split, SentencePiece's
Metaspace/Prepend space handling), the model, the post-processor's template (`<s> $A`,
`[CLS] $A [SEP]`), the file's `truncation` and `padding` sections, and on the way back the
decoder (byte-level, byte fallback with one U+FFFD per invalid byte, WordPiece's `##` joining
and cleanup). A `tokenizer.json` with any other component or option is refused with a
ValueError naming it; so is a text that is not UTF-8, a nested list of texts (`tokenizers`
would read pairs) and ids that are not integers. An older `tokenizer.json` without
`model.type` is read as `tokenizers` reads it (the model its fields fit).

Serving needs TensorFlow and tensorflow-text (its ops are in the graph), nothing else.

Known limits, all outside the Unicode of everyday text (measured over every code point against
`tokenizers` 0.23, whose tables are Unicode 16): TensorFlow's RE2 and ICU tables are older, so
in the byte-level pre-tokenizers 4,924 letters and 80 digits added in Unicode 16 count as other
characters; BERT's uncased normalizer differs on 536 characters added since Unicode 13 (new
combining marks and case pairs; the cased one on none), and its pre-tokenizer on 129
punctuation marks `tokenizers` does not know as punctuation (U+2E43...).
"""

from __future__ import annotations

import os

from keras_attn.checkpoints.tokenizer_base import (
    CheckpointTokenizer,
    read_json,
    refuse_tokenizer,
)
from keras_attn.checkpoints.tokenizer_bpe import byte_level_bpe_tokenizer
from keras_attn.checkpoints.tokenizer_spm import sentencepiece_tokenizer
from keras_attn.checkpoints.tokenizer_wordpiece import wordpiece_tokenizer

__all__ = ["CheckpointTokenizer", "load_tokenizer"]


def load_tokenizer(directory: str) -> CheckpointTokenizer:
    """The tokenizer of a Hugging Face checkpoint directory, as TensorFlow ops.

    Args:
        directory: str, holding `tokenizer.json` (byte-level BPE or WordPiece), or
            `tokenizer.model` with `tokenizer.json` (SentencePiece), or `vocab.txt` with
            `tokenizer_config.json` (BERT's WordPiece), or `vocab.json` with `merges.txt`
            (GPT-2's classic layout, read as transformers' `GPT2Tokenizer`).

    Returns:
        `CheckpointTokenizer`.

    Raises:
        ValueError: no such directory, no tokenizer files, or a component or option that
            would not encode exactly as the `tokenizers` library (named in the message).

    Example:
    >>> tokenizer = load_tokenizer("path/to/Llama-3.2-1B")
    >>> tokenizer.encode(["The Time Machine"]).to_list()  # [[128000, 791, 4212, 13257]]
    """
    if not isinstance(directory, (str, os.PathLike)) or not os.path.isdir(directory):
        raise ValueError("Received an invalid value for argument `directory`, expected the path "
                         f"of an existing directory. Received: directory={directory!r}")
    directory = os.fspath(directory)

    def has(name):
        return os.path.isfile(os.path.join(directory, name))

    spec = read_json(os.path.join(directory, "tokenizer.json")) if has("tokenizer.json") \
        else None
    if spec is not None:
        model = spec.get("model")
        if not isinstance(model, dict):
            refuse_tokenizer("model", model, "expected an object")
        spec = {**spec, "model": {**model, "type": model_type(model)}}
    kind = (spec or {}).get("model", {}).get("type")
    if has("tokenizer.model"):
        return sentencepiece_tokenizer(directory, spec)
    if kind == "BPE" or (spec is None and has("vocab.json") and has("merges.txt")):
        return byte_level_bpe_tokenizer(directory, spec)
    if kind == "WordPiece" or (spec is None and has("vocab.txt")):
        return wordpiece_tokenizer(directory, spec)
    if spec is not None:
        refuse_tokenizer("model.type", kind, "expected BPE or WordPiece")
    raise ValueError(
        "Received an invalid value for argument `directory`, expected a checkpoint directory "
        "with tokenizer.json, tokenizer.model, vocab.txt or vocab.json and merges.txt. "
        f"Received: directory={directory!r} holding {sorted(os.listdir(directory))[:12]}")


def model_type(model: dict):
    """`model["type"]`, or for an older `tokenizer.json` without one the model the `tokenizers`
    library reads its fields as: it tries BPE (`vocab` and `merges`), WordPiece (`vocab`,
    `unk_token`, `continuing_subword_prefix`, `max_input_chars_per_word`), WordLevel
    (`vocab`, `unk_token`), Unigram (a list `vocab`) in turn; None when none fits."""
    if "type" in model:
        return model["type"]
    vocab = model.get("vocab")
    if isinstance(vocab, list):
        return "Unigram"
    if not isinstance(vocab, dict):
        return None
    if isinstance(model.get("merges"), list):
        return "BPE"
    if all(key in model for key in ("unk_token", "continuing_subword_prefix",
                                    "max_input_chars_per_word")):
        return "WordPiece"
    return "WordLevel" if "unk_token" in model else None
