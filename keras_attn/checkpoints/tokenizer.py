"""A checkpoint's tokenizer, encoding and decoding as the `tokenizers` library does, in a TF graph.

`load_tokenizer(directory)` reads the tokenizer files of a Hugging Face checkpoint and returns a
`CheckpointTokenizer`, a `tf.Module` whose `encode` (strings -> ragged int32 ids) and `decode`
(ids -> strings) are TensorFlow ops, so they run inside a `tf.function`, a `tf.data` pipeline
and an exported SavedModel:

| files | kind | implemented with |
|---|---|---|
| `tokenizer.json` with a `ByteLevel` BPE (GPT-2, Llama 3, Qwen2) | `"byte_level_bpe"` | keras-hub's `BytePairTokenizer` (merges), tensorflow-text's `regex_split` (pre-tokenizer), TF string ops |
| `tokenizer.model` + `tokenizer.json` (Llama 2, Mistral) | `"sentencepiece"` | tensorflow-text's `SentencepieceTokenizer`, TF string ops |
| `tokenizer.json` with `WordPiece`, or `vocab.txt` + `tokenizer_config.json` (BERT) | `"wordpiece"` | tensorflow-text's `FastWordpieceTokenizer` and `regex_split`, TF string ops |

Every step the `tokenizers` library takes is reproduced, not approximated: added (special)
tokens split out first, then per segment the normalizer (NFC, BERT's), the pre-tokenizer (GPT-2,
Llama 3 and Qwen2 split regexes, BERT's whitespace and punctuation split, SentencePiece's
Metaspace/Prepend space handling), the model, the post-processor's template (`<s> $A`,
`[CLS] $A [SEP]`), and on the way back the decoder (byte-level, byte fallback with one U+FFFD
per invalid byte, WordPiece's `##` joining and cleanup). A `tokenizer.json` with any other
component or option is refused with a ValueError naming it.

Serving needs TensorFlow and tensorflow-text (its ops are in the graph); keras-hub is needed
to build a byte-level BPE tokenizer, not to serve it.

Known limits, all outside the Unicode of everyday text (measured over every code point against
`tokenizers` 0.23, whose tables are Unicode 16): TensorFlow's RE2 and ICU tables are older, so
in the byte-level pre-tokenizers 4,924 letters and 80 digits added in Unicode 16 count as other
characters; BERT's uncased normalizer differs on 536 characters added since Unicode 13 (new
combining marks and case pairs; the cased one on none), and its pre-tokenizer on 129
punctuation marks `tokenizers` does not know as punctuation (U+2E43...) and on NUL.
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
            `tokenizer_config.json` (BERT's WordPiece).

    Returns:
        `CheckpointTokenizer`.

    Raises:
        ValueError: no tokenizer files, or a component or option that would not encode
            exactly as the `tokenizers` library (named in the message).

    Example:
    >>> tokenizer = load_tokenizer("path/to/Llama-3.2-1B")
    >>> tokenizer.encode(["The Time Machine"]).to_list()  # [[128000, 791, 4212, 13257]]
    """
    json_path = os.path.join(directory, "tokenizer.json")
    spec = read_json(json_path) if os.path.isfile(json_path) else None
    model = (spec or {}).get("model") or {}
    if os.path.isfile(os.path.join(directory, "tokenizer.model")):
        return sentencepiece_tokenizer(directory, spec)
    if model.get("type") == "BPE":
        return byte_level_bpe_tokenizer(directory, spec)
    if model.get("type") == "WordPiece" or (
            spec is None and os.path.isfile(os.path.join(directory, "vocab.txt"))):
        return wordpiece_tokenizer(directory, spec)
    if spec is not None:
        refuse_tokenizer("model.type", model.get("type"), "expected BPE or WordPiece")
    raise ValueError(
        "Received an invalid value for argument `directory`, expected a checkpoint directory "
        "with tokenizer.json, tokenizer.model or vocab.txt. Received: "
        f"directory={directory!r} holding {sorted(os.listdir(directory))[:12]}")
